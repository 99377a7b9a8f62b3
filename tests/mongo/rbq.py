#!/usr/bin/python3
"""rbq: what the bats suites do to a relaybus MongoDB store by hand (pymongo).

    rbq.py URL SCHEMA drop                       drop the URL's database
    rbq.py URL SCHEMA reset COLL...              delete every document of <schema>.COLL
    rbq.py URL SCHEMA count COLL [FILTER]        count documents (FILTER: JSON)
    rbq.py URL SCHEMA find COLL FILTER FIELD...  one line per document: the fields, space-separated
    rbq.py URL SCHEMA update COLL FILTER UPDATE  update_many; prints the matched count
    rbq.py URL SCHEMA insert COLL DOC...         insert JSON documents
    rbq.py URL SCHEMA load FILE                  create the indexes and insert the documents of
                                                 a fixture ({"indexes": {COLL: [{name, key,
                                                 unique}]}, "documents": {COLL: [DOC]}})
    rbq.py URL SCHEMA indexes COLL               the names of COLL's indexes, sorted

FILTER and UPDATE are JSON with {"$date": ms} for dates and {"$now": ms} for now + ms.
"""
import json
import sys
import time
import datetime

import pymongo


def conv(v):
    if isinstance(v, dict):
        if set(v) == {"$date"}:
            return datetime.datetime.fromtimestamp(v["$date"] / 1000, datetime.timezone.utc)
        if set(v) == {"$now"}:
            return datetime.datetime.fromtimestamp(time.time() + v["$now"] / 1000, datetime.timezone.utc)
        return {k: conv(x) for k, x in v.items()}
    if isinstance(v, list):
        return [conv(x) for x in v]
    return v


def show(v):
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (list, dict)):
        return json.dumps(v, separators=(",", ":"), default=str)
    return str(v)


def main(argv):
    url, schema, cmd = argv[1], argv[2], argv[3]
    client = pymongo.MongoClient(url, serverSelectionTimeoutMS=5000)
    db = client.get_default_database("relaybus")
    coll = lambda name: db[schema + "." + name]
    if cmd == "drop":
        client.drop_database(db.name)
    elif cmd == "reset":
        for name in argv[4:]:
            coll(name).delete_many({})
    elif cmd == "count":
        f = conv(json.loads(argv[5])) if len(argv) > 5 else {}
        print(coll(argv[4]).count_documents(f))
    elif cmd == "find":
        f = conv(json.loads(argv[5]))
        for d in coll(argv[4]).find(f).sort("_id", 1):
            print(" ".join(show(d.get(k)) for k in argv[6:]))
    elif cmd == "update":
        r = coll(argv[4]).update_many(conv(json.loads(argv[5])), conv(json.loads(argv[6])))
        print(r.matched_count)
    elif cmd == "insert":
        coll(argv[4]).insert_many([conv(json.loads(d)) for d in argv[5:]])
    elif cmd == "load":
        with open(argv[4]) as f:
            fx = json.load(f)
        for name, ixs in fx.get("indexes", {}).items():
            for ix in ixs:
                coll(name).create_index(list(ix["key"].items()), name=ix["name"],
                                        unique=bool(ix.get("unique")))
        for name, docs in fx.get("documents", {}).items():
            coll(name).insert_many([conv(d) for d in docs])
    elif cmd == "indexes":
        for n in sorted(ix["name"] for ix in coll(argv[4]).list_indexes()):
            print(n)
    else:
        sys.exit("rbq: unknown command " + cmd)


if __name__ == "__main__":
    main(sys.argv)
