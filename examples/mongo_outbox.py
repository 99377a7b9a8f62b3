#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""mongo_outbox: an application that pays an order and publishes "order.paid"
in one MongoDB transaction (the transactional outbox), with relaybus_mongo.

    mongo_outbox.py URL SCHEMA ORDER_ID [--key KEY] [--orders COLL] [--abort]

URL is the application's MongoDB (a replica set: transactions), with the
relaybus database in its path, as rb-publish takes it; SCHEMA is
RELAYBUS_SCHEMA.  It writes {_id: ORDER_ID, paid: true} into the collection
COLL (default "orders") and publishes the event ORDER_ID/paid (key KEY, by default the
order id) in the same transaction, then commits; with --abort it aborts
instead, and neither the order nor the event exists.  Prints the publish's
answer (a JSON line as rb-publish -o) on commit.  Exit 81 on a conflict.
"""
import argparse
import json
import os
import sys

import pymongo

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import relaybus_mongo  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("schema")
    ap.add_argument("order")
    ap.add_argument("--key")
    ap.add_argument("--orders", default="orders")
    ap.add_argument("--abort", action="store_true")
    a = ap.parse_args()
    client = pymongo.MongoClient(a.url)
    db = client.get_default_database("relaybus")
    orders = db[a.orders]
    event = {"id": a.order + "/paid", "name": "order.paid", "key": a.key or a.order,
             "payload": {"order": a.order}}
    with client.start_session() as s:
        if a.abort:
            s.start_transaction()
            orders.insert_one({"_id": a.order, "paid": True}, session=s)
            relaybus_mongo.publish(db, a.schema, s, event)
            s.abort_transaction()
            return 0
        out = {}

        def txn(s):
            # the business write and the event, both or neither (retried whole)
            orders.update_one({"_id": a.order}, {"$set": {"paid": True}}, upsert=True, session=s)
            out.update(relaybus_mongo.publish(db, a.schema, s, event))
        try:
            s.with_transaction(txn)
        except relaybus_mongo.Conflict as e:
            print("mongo_outbox: %s" % e, file=sys.stderr)
            return 81
    print(json.dumps(out, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
