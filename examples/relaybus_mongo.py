# SPDX-License-Identifier: MIT
"""relaybus_mongo: publish a relaybus event inside your own MongoDB transaction.

An implementation of relaybus(7) "MONGODB DOCUMENTS" (schema version 1) in
Python with pymongo (Debian: python3-pymongo), checked against the test
vectors tests/fixtures/mongo-documents.json like rb-publish itself
(tests/outbox_mongo.bats).  Copy it into your application:

    with client.start_session() as s:
        def txn(s):
            db.orders.insert_one({"_id": 42, "paid": True}, session=s)
            relaybus_mongo.publish(db, "public", s,
                {"id": "order-42-paid", "name": "order.paid", "key": "order-42",
                 "payload": {"order": 42}})
        s.with_transaction(txn)      # retried whole on a write conflict

publish() raises Conflict when the event id exists with another name, key or
payload; the caller aborts (with_transaction does when the exception leaves
txn).
"""
import datetime
import re
import uuid

from bson.int64 import Int64
from pymongo import ReturnDocument

SCHEMA_VERSION = 1
LANES = 256


class Conflict(Exception):
    """the event id exists with another name, key or payload (rb-publish exit 81)"""


class NotSetUp(Exception):
    """the schema is not set up at this version (rb-setup; rb-publish exit 78/76/79)"""


def fnv1a32(data: bytes) -> int:
    h = 2166136261
    for b in data:
        h ^= b
        h = (h * 16777619) & 0xFFFFFFFF
    return h


def lane_of(key, event_id) -> int:
    """laneId: FNV-1a 32 of the UTF-8 bytes of the key, else of the event id, mod 256"""
    return fnv1a32((key if key is not None else event_id).encode("utf-8")) % LANES


def _glob(pattern: str, name: str) -> bool:
    # '*' any run of characters, '?' one; nothing else is special
    rx = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.fullmatch(rx, name, re.DOTALL) is not None


def _same(a, b):
    """JSON values equal as jsonb (and rb-publish) compares them: objects
    whatever their key order, numbers by value (1 == 1.0), booleans only
    with booleans"""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return type(a) == type(b) and a == b


def _now():
    return datetime.datetime.now(datetime.timezone.utc)


def publish(db, schema, session, event, check_version=True):
    """Publish event (a dict as rb-publish reads it) in session's transaction.

    Returns {"event_id", "deliveries", "duplicate", "handlers"} as rb-publish -o."""
    coll = lambda name: db[schema + "." + name]
    if check_version and coll("schema_version").find_one({"_id": SCHEMA_VERSION}, session=session) is None:
        raise NotSetUp("schema %s is not set up at version %d: run rb-setup" % (schema, SCHEMA_VERSION))
    eid, name, key = event.get("id") or event.get("event_id") or str(uuid.uuid4()), event["name"], event.get("key")
    payload = event["payload"]
    headers = event.get("headers") or {}
    now = _now()
    if event.get("available_at") is not None:
        at = datetime.datetime.fromisoformat(event["available_at"].replace("Z", "+00:00"))
    else:
        at = now + datetime.timedelta(milliseconds=event.get("delay_ms") or 0)
    # routing: the subscriptions, read inside the transaction
    subs = [(s["handler"], s["pattern"]) for s in coll("subscriptions").find({}, session=session)]
    if event.get("handlers") is not None:
        routed = sorted(set(event["handlers"]))
    else:
        routed = sorted({h for h, p in subs if _glob(p, name)})
    stored = coll("events").find_one({"_id": eid}, session=session)
    if stored is None:
        new = routed
        coll("events").insert_one({"_id": eid, "name": name, "key": key, "payload": payload,
                                   "headers": headers, "handlers": new, "createdAt": now},
                                  session=session)
        duplicate = False
    else:
        if stored.get("name") != name or stored.get("key") != key or not _same(stored.get("payload"), payload):
            raise Conflict('event id "%s" exists with another name, key or payload' % eid)
        duplicate = True
        had = set(stored.get("handlers") or [])
        new = [h for h in routed if h not in had and any(sh == h and _glob(p, name) for sh, p in subs)]
        if new:
            coll("events").update_one({"_id": eid}, {"$push": {"handlers": {"$each": new}}}, session=session)
    seq = None
    if new and key is not None:
        k = coll("keys").find_one_and_update({"_id": key}, {"$inc": {"seq": Int64(1)}}, upsert=True,
                                             return_document=ReturnDocument.AFTER, session=session)
        seq = Int64(k["seq"])
    if new:
        # delivery ids: reserved outside the transaction (no session), gaps are harmless
        c = coll("counters").find_one_and_update({"_id": "deliveries"}, {"$inc": {"n": Int64(len(new))}},
                                                 upsert=True, return_document=ReturnDocument.AFTER)
        first = int(c["n"]) - len(new) + 1
        coll("deliveries").insert_many([{
            "_id": Int64(first + i), "eventId": eid, "handler": h, "laneId": lane_of(key, eid),
            "key": key, "seq": seq, "status": "pending", "availableAt": at, "attempts": 0,
            "claims": Int64(0), "lastError": None, "createdAt": now, "updatedAt": now, "lane": "ready",
        } for i, h in enumerate(new)], session=session)
    return {"event_id": eid, "deliveries": len(new), "duplicate": duplicate, "handlers": list(new)}


class LeaseLost(Exception):
    """the delivery's lease does not hold: taken over, or completed already (abort)"""


def complete(db, schema, session, delivery):
    """Complete a delivery (the line the handler was given) in session's transaction.

    The same transaction as rb-complete's and rb_mongo_complete's
    (relaybus(7) MONGODB DOCUMENTS, "Completing in the handler's
    transaction"): the lease checked against the lane and the delivery,
    the delivery deleted, the next parked ones of its key made ready when it
    is a parking's marker, a history document when the schema keeps them.
    Raises LeaseLost (abort; answer "ok": false).  After the commit, answer
    {"ok": true, "completed": true}."""
    coll = lambda name: db[schema + "." + name]
    lane, epoch, claims = (int(x) for x in delivery["lease"].split(":"))
    handler, eid = delivery["handler"], delivery["event_id"]
    ld = coll("lanes").find_one({"_id": "%s/%d" % (handler, lane)}, session=session)
    d = coll("deliveries").find_one({"eventId": eid, "handler": handler}, session=session)
    want = delivery.get("delivery_id")
    if (ld is None or d is None or ld.get("epoch") != epoch or d.get("claims") != claims
            or d.get("laneId") != lane or d.get("status") != "pending" or d["_id"] not in (ld.get("inFlight") or [])
            or (want is not None and int(want) != d["_id"])):
        raise LeaseLost("the lease %s of %s of %s does not hold" % (delivery["lease"], eid, handler))
    # the document a takeover's charge updates: of the two, one commits
    if coll("deliveries").delete_one({"_id": d["_id"]}, session=session).deleted_count != 1:
        raise LeaseLost("the delivery of %s of %s is gone" % (eid, handler))
    k = d.get("parkNext") or 0
    if k > 0 and d.get("key") is not None:
        parked = list(coll("deliveries").find(
            {"handler": handler, "laneId": lane, "status": "pending", "lane": "parked", "key": d["key"]},
            {"_id": 1}, session=session).sort("seq", 1).limit(k + 1))
        for i, p in enumerate(parked[:k]):
            if i + 1 == k and len(parked) > k:
                u = {"$set": {"lane": "ready", "parkNext": Int64(k)}}
            else:
                u = {"$set": {"lane": "ready"}, "$unset": {"parkNext": ""}}
            coll("deliveries").update_one({"_id": p["_id"]}, u, session=session)
    sv = coll("schema_version").find_one({"_id": SCHEMA_VERSION}, session=session)
    if sv is not None and sv.get("completionHistory"):
        coll("completed_deliveries").insert_one({
            "eventId": eid, "handler": handler, "deliveryId": Int64(d["_id"]),
            "attempts": int(d.get("attempts") or 0) + 1, "completedAt": _now()}, session=session)
