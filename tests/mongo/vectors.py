#!/usr/bin/python3
"""vectors: check a publisher against tests/fixtures/mongo-documents.json
(relaybus(7) MONGODB DOCUMENTS).

    vectors.py FIXTURE URL SCHEMA rb-publish    each event through `rb-publish -o`
    vectors.py FIXTURE URL SCHEMA python        through examples/relaybus_mongo.py,
                                                in a transaction of this process

The schema must be set up (rb-setup).  For each case: the collections events,
deliveries, keys and subscriptions emptied, the case's subscriptions written,
its events published one transaction each, each answer compared, then the
documents.  One line per case, "ok NAME" or "not ok NAME: what differs";
exit 1 when any case fails.
"""
import datetime
import json
import os
import subprocess
import sys
import time

import pymongo

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "..", "examples"))
import relaybus_mongo  # noqa: E402


def plain(v):
    """BSON read back as JSON values (Int64 -> int; dicts compared unordered)"""
    if isinstance(v, dict):
        return {k: plain(x) for k, x in v.items()}
    if isinstance(v, list):
        return [plain(x) for x in v]
    if isinstance(v, bool) or v is None or isinstance(v, (str, float)):
        return v
    if isinstance(v, int):
        return int(v)
    return v


def publish_rb(url, schema, ev):
    env = dict(os.environ, RELAYBUS_URL=url, RELAYBUS_SCHEMA=schema)
    p = subprocess.run(["rb-publish", "-o"], input=json.dumps(ev) + "\n", capture_output=True, text=True, env=env)
    if p.returncode == 81:
        return {"error": "conflict"}
    if p.returncode != 0:
        return {"error": "exit %d: %s" % (p.returncode, p.stderr.strip())}
    r = json.loads(p.stdout)
    r.pop("line", None)
    return r


def publish_py(client, db, schema, ev):
    with client.start_session() as s:
        out = {}
        try:
            s.with_transaction(lambda s: out.update(relaybus_mongo.publish(db, schema, s, ev)))
        except relaybus_mongo.Conflict:
            return {"error": "conflict"}
        return out


def check_case(case, client, db, url, schema, how):
    coll = lambda n: db[schema + "." + n]
    for n in ("events", "deliveries", "keys", "subscriptions"):
        coll(n).delete_many({})
    now = datetime.datetime.now(datetime.timezone.utc)
    for h, p in case["subscriptions"]:
        coll("subscriptions").insert_one({"handler": h, "pattern": p, "createdAt": now})
    bad = []
    for i, step in enumerate(case["publish"]):
        t0 = time.time()
        got = publish_rb(url, schema, step["event"]) if how == "rb-publish" else \
            publish_py(client, db, schema, step["event"])
        if got != step["result"]:
            bad.append("publish %d: %s, want %s" % (i + 1, json.dumps(got), json.dumps(step["result"])))
        step["t"] = (t0, time.time())
    want = case["documents"]
    evs = [plain(d) for d in coll("events").find({}).sort("_id", 1)]
    for d in evs:
        if not isinstance(d.pop("createdAt", None), datetime.datetime):
            bad.append("event %s: createdAt is not a date" % d["_id"])
    if evs != want["events"]:
        bad.append("events: %s, want %s" % (json.dumps(evs, ensure_ascii=False), json.dumps(want["events"], ensure_ascii=False)))
    ds = sorted((plain(d) for d in coll("deliveries").find({})), key=lambda d: (d["eventId"], d["handler"]))
    ids = [d["_id"] for d in ds]
    if len(set(ids)) != len(ids) or not all(isinstance(i, int) for i in ids):
        bad.append("delivery _id: not unique integers: %s" % ids)
    got_d = []
    for d in ds:
        for f in ("createdAt", "updatedAt", "availableAt"):
            if not isinstance(d.get(f), datetime.datetime):
                bad.append("delivery %s/%s: %s is not a date" % (d["eventId"], d["handler"], f))
        w = next((x for x in want["deliveries"] if (x["eventId"], x["handler"]) == (d["eventId"], d["handler"])), {})
        delay = w.get("delayMs", 0) / 1000.0
        at = d["availableAt"].replace(tzinfo=datetime.timezone.utc).timestamp() if isinstance(d.get("availableAt"), datetime.datetime) else 0
        # publish time + delay_ms (the clock of the publisher; 5 s of slack)
        if not (time.time() - 60 + delay <= at <= time.time() + 5 + delay):
            bad.append("delivery %s/%s: availableAt %s is not now + %d ms" % (d["eventId"], d["handler"], d.get("availableAt"), delay * 1000))
        if d.get("delayMs") is None and w.get("delayMs") is not None:
            d["delayMs"] = w["delayMs"]
        for f in ("_id", "createdAt", "updatedAt", "availableAt"):
            d.pop(f, None)
        got_d.append(d)
    if got_d != want["deliveries"]:
        bad.append("deliveries: %s, want %s" % (json.dumps(got_d, ensure_ascii=False), json.dumps(want["deliveries"], ensure_ascii=False)))
    ks = [plain(d) for d in coll("keys").find({}).sort("_id", 1)]
    if ks != want["keys"]:
        bad.append("keys: %s, want %s" % (json.dumps(ks, ensure_ascii=False), json.dumps(want["keys"], ensure_ascii=False)))
    return bad


def main(argv):
    fixture, url, schema, how = argv[1:5]
    with open(fixture, encoding="utf-8") as f:
        fx = json.load(f)
    client = pymongo.MongoClient(url, serverSelectionTimeoutMS=5000)
    db = client.get_default_database("relaybus")
    subs = db[schema + ".subscriptions"]
    kept = list(subs.find({}))
    failed = 0
    for lv in fx["lanes"]:
        h = relaybus_mongo.fnv1a32(lv["text"].encode("utf-8"))
        if (h, h % 256) != (lv["fnv1a32"], lv["laneId"]):
            print("not ok lane %r: %d %d" % (lv["text"], h, h % 256))
            failed += 1
    for case in fx["cases"]:
        bad = check_case(case, client, db, url, schema, how)
        if bad:
            failed += 1
            print("not ok %s:\n  %s" % (case["name"], "\n  ".join(bad)))
        else:
            print("ok %s" % case["name"])
    # the schema's own subscriptions back
    subs.delete_many({})
    if kept:
        subs.insert_many(kept)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
