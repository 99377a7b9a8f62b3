#!/usr/bin/python3
"""race.py: a completion and a takeover of the same lane, in a chosen order.

    race.py URL SCHEMA HANDLER LEASE before|after COMMAND...

Completes the delivery of LEASE as store_mongo_complete.c does (one
transaction: read the lane and the delivery, check epoch, claims and the
lane's inFlight list, delete the delivery), with COMMAND (an rb-claim that
takes the lane over) run in between:
  before: the transaction has deleted the delivery when COMMAND starts;
          it commits while COMMAND waits for it
  after:  the transaction has read (its snapshot) when COMMAND runs to the
          end; then it deletes
Prints what happened: "completion committed; takeover charged nothing" or
"completion conflicted; takeover charged N" (N: the delivery's attempts).
"""
import subprocess
import sys
import time

import pymongo
from pymongo.errors import OperationFailure


def main(argv):
    url, schema, handler, lease, mode = argv[1:6]
    cmd = argv[6:]
    lane, epoch, claims = (int(x) for x in lease.split(':'))
    client = pymongo.MongoClient(url, serverSelectionTimeoutMS=5000)
    db = client.get_default_database()
    lanes, dels = db[schema + '.lanes'], db[schema + '.deliveries']
    with client.start_session() as s:
        s.start_transaction()
        ld = lanes.find_one({'_id': '%s/%d' % (handler, lane)}, session=s)
        d = dels.find_one({'handler': handler, 'laneId': lane, 'claims': claims}, session=s)
        if ld is None or d is None or ld['epoch'] != epoch or d['_id'] not in ld['inFlight']:
            sys.exit('race.py: the lease does not hold before the race')
        if mode == 'before':
            dels.delete_one({'_id': d['_id']}, session=s)
            p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(1.5)
            if p.poll() is not None:
                sys.exit('race.py: the takeover did not wait for the open completion')
            s.commit_transaction()
            p.wait(60)
            left = dels.find_one({'_id': d['_id']})
            print('completion committed; takeover charged nothing' if left is None
                  else 'completion committed; but the delivery is still there: %r' % left)
            return
        subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60)
        try:
            dels.delete_one({'_id': d['_id']}, session=s)
            s.commit_transaction()
            print('completion committed after a takeover: both won')
        except OperationFailure as e:
            if e.code != 112:
                raise
            if s.in_transaction:
                s.abort_transaction()
            print('completion conflicted; takeover charged %d' % dels.find_one({'_id': d['_id']})['attempts'])


if __name__ == '__main__':
    main(sys.argv)
