#!/usr/bin/python3
# bench/eo_handler.py MODE: the --pipe co-process of bench/eo-cost.  Per
# delivery line, one business row in eo_rows, committed on its own
# connection (EO_DB, search_path EO_SCHEMA), then the answer:
#   batched   INSERT, COMMIT; "ok": true (rb-dispatch completes it, in
#             groups: the dispatcher's batched completion)
#   handler   INSERT and relaybus_complete in one transaction, COMMIT;
#             "ok": true, "completed": true (effectively-once)
#   none      no database work; "ok": true (what the dispatcher alone costs)
import json
import os
import sys

mode = sys.argv[1]
if mode != "none":
    import psycopg
    conn = psycopg.connect(os.environ["EO_DB"], options=f"-c search_path={os.environ['EO_SCHEMA']}")
for line in sys.stdin:
    d = json.loads(line)
    if mode == "batched":
        with conn.transaction():
            conn.execute("INSERT INTO eo_rows (event_id) VALUES (%s)", (d["event_id"],))
        d["ok"] = True
    elif mode == "handler":
        with conn.transaction():
            conn.execute("INSERT INTO eo_rows (event_id) VALUES (%s)", (d["event_id"],))
            (r,) = conn.execute("SELECT relaybus_complete(%s, %s, %s)",
                                (d["lease"], d["event_id"], d["handler"])).fetchone()
            if r != "completed":
                raise psycopg.Rollback()
        d.update({"ok": True, "completed": True} if r == "completed" else {"ok": False, "error": "lost"})
    else:
        d["ok"] = True
    sys.stdout.write(json.dumps(d) + "\n")
    sys.stdout.flush()
