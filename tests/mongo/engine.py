# SPDX-License-Identifier: MIT
"""Sessions, transactions, write conflicts and cursors.

Everything here runs under Engine.lock (one global lock around the store).

Transactions (snapshot isolation, "first updater wins", as MongoDB):
- at its first operation a transaction takes a snapshot: a private Store that
  shares the committed documents (Store.snapshot) and then holds its own writes;
  it holds the database of that operation, and another database when the
  transaction first uses it (as of then: relaybus's transactions use one);
- every document a statement changes is a *resource* ('d', db, coll, _id), and so
  is every unique-index key it adds or removes ('u', db, coll, index, key), and
  the creation of a collection ('c', db, coll);
- a transaction's write takes its resources (locks); it fails with WriteConflict
  (112, TransientTransactionError) when another open transaction holds one, or
  when someone committed a write to one after the transaction's snapshot;
- a write outside a transaction that meets a resource held by an open transaction
  waits until that transaction ends (MongoDB retries such writes internally), then
  runs again from scratch; DDL (drop, createIndexes, ...) waits likewise for open
  transactions that used the collection;
- commit applies the transaction's final version of each document it wrote to the
  committed store (no conflict is possible any more: they were found at write time);
  abort drops the view.  An open transaction is aborted after `lifetime` seconds
  (MongoDB's transactionLifetimeLimitSeconds, 60 by default).
"""
import os
import threading
import time

import bson
from bson.int64 import Int64
from bson.raw_bson import RawBSONDocument

from errors import CmdError, MustWait, no_such_transaction, write_conflict
from store import Store, index_keys
from wire import CODEC, MAX_BSON_SIZE

CURSOR_IDLE_SECONDS = 600


class Txn:
    def __init__(self, session, number, lifetime):
        self.session = session
        self.number = number
        self.state = 'in_progress'
        self.view = None        # the snapshot, taken at the first operation
        self.view_dbs = set()   # the databases in it (Engine.begin)
        self.snap_seq = None
        self.resources = set()  # held (locked) resources
        self.written = {}       # (db, coll) -> doc keys written
        self.created = set()    # (db, coll) created in the transaction
        self.touched = set()    # (db, coll) used in the transaction
        self.expires = time.monotonic() + lifetime
        self.read_concern_seen = False


class Session:
    def __init__(self, key):
        self.key = key
        self.txn_number = -1
        self.txn = None
        self.retry = None  # (txnNumber, reply) of the last retryable write


class Cursor:
    def __init__(self, cid, ns, docs, limit, session_key):
        self.id = cid
        self.ns = ns
        self.docs = docs
        self.pos = 0
        self.limit = limit  # 0: no limit
        self.session_key = session_key
        self.used = time.monotonic()

    def batch(self, n):
        """Up to n documents (None: no count limit), at most ~16 MiB, at least one."""
        out, size = [], 0
        if self.limit:
            left = self.limit - self.pos
            n = left if n is None else min(n, left)
        while self.pos < len(self.docs) and (n is None or len(out) < n):
            raw = RawBSONDocument(bson.encode(self.docs[self.pos], codec_options=CODEC))
            if out and size + len(raw.raw) > MAX_BSON_SIZE - 16 * 1024:
                break
            out.append(raw)
            size += len(raw.raw)
            self.pos += 1
        return out

    def exhausted(self):
        return self.pos >= len(self.docs) or (self.limit and self.pos >= self.limit)


class Ctx:
    """Where a command runs: the committed store, or a transaction's view."""

    def __init__(self, engine, store, txn, session, deadline):
        self.engine, self.store, self.txn, self.session, self.deadline = \
            engine, store, txn, session, deadline


class Engine:
    def __init__(self, lifetime=60.0, log=None):
        self.lock = threading.Lock()
        self.cond = threading.Condition(self.lock)
        self.lifetime = lifetime
        self.log = log or (lambda msg: None)
        self.base = Store()
        self.seq = 0
        self.last_commit = {}  # resource -> seq of the commit that last wrote it
        self.locks = {}        # resource -> Txn holding it
        self.active = set()    # transactions with a snapshot, still open
        self.sessions = {}
        self.cursors = {}
        self.counts = {'started': 0, 'committed': 0, 'aborted': 0}
        # serverStatus opcounters and metrics.document, counted as MongoDB does:
        # insert per document, update and delete per statement, query per
        # find, getmore per getMore, command for every other command;
        # returned: the documents of the batches of find, aggregate and
        # getMore (not of listCollections and listIndexes)
        self.opcounters = {'insert': 0, 'query': 0, 'update': 0, 'delete': 0, 'getmore': 0, 'command': 0}
        self.documents = {'inserted': 0, 'updated': 0, 'deleted': 0, 'returned': 0}
        # hellos answered without the lock (tests/mongo/server.py): counted
        # as commands, under a lock of their own
        self.handshakes = 0
        self.handshakes_lock = threading.Lock()
        self.connections = 0
        self.connections_total = 0

    # ---- sessions and transactions ----------------------------------------

    def session(self, lsid):
        if not isinstance(lsid, dict) or 'id' not in lsid:
            raise CmdError(9, 'lsid must be a document with an id')
        key = bytes(lsid['id'])
        s = self.sessions.get(key)
        if s is None:
            s = self.sessions[key] = Session(key)
        return s

    def end_sessions(self, lsids):
        for lsid in lsids:
            s = self.sessions.pop(bytes(lsid.get('id', b'')), None) if isinstance(lsid, dict) else None
            if s is None:
                continue
            if s.txn is not None and s.txn.state == 'in_progress':
                self.abort(s.txn, 'session ended')
            for cid in [c.id for c in self.cursors.values() if c.session_key == s.key]:
                del self.cursors[cid]

    def txn_for(self, session, cmd, name):
        """The transaction a command with autocommit:false belongs to (started if asked)."""
        if session is None:
            raise CmdError(72, 'a transaction needs a session id (lsid)')
        if cmd.get('autocommit') is not False:
            raise CmdError(72, 'autocommit may only be given as false')
        n = cmd.get('txnNumber')
        if not isinstance(n, int):
            raise CmdError(72, 'a transaction needs a txnNumber')
        if cmd.get('startTransaction'):
            if cmd['startTransaction'] is not True:
                raise CmdError(72, 'startTransaction may only be given as true')
            if n < session.txn_number:
                raise CmdError(225, 'Cannot start transaction %d on session because a newer '
                                    'transaction %d has already started' % (n, session.txn_number))
            if n == session.txn_number:
                raise CmdError(117, 'Cannot start a transaction at given transaction number %d: '
                                    'a transaction with the same number already started' % n)
            if session.txn is not None and session.txn.state == 'in_progress':
                self.abort(session.txn, 'a newer transaction started')
            session.txn_number = n
            session.txn = Txn(session, n, self.lifetime)
            self.counts['started'] += 1
            return session.txn
        t = session.txn
        if t is None or t.number != n:
            if n < session.txn_number:
                raise CmdError(225, 'txnNumber %d is older than the session\'s %d' % (n, session.txn_number))
            raise no_such_transaction('Given transaction number %d does not match any in-progress '
                                      'transactions. The active transaction number is %d'
                                      % (n, session.txn_number))
        if t.state == 'aborted' and name not in ('abortTransaction',):
            raise no_such_transaction('Transaction with { txnNumber: %d } has been aborted.' % n)
        if t.state == 'committed' and name not in ('commitTransaction', 'abortTransaction'):
            raise CmdError(256, 'Transaction %d has been committed.' % n)
        return t

    def begin(self, txn, db):
        """The snapshot, at the transaction's first operation: of the database
        it names; another database the transaction uses later is added to the
        view at its first operation there."""
        if txn.view is None:
            txn.view = self.base.snapshot(db)
            txn.view_dbs = {db}
            txn.snap_seq = self.seq
            self.active.add(txn)
        elif db not in txn.view_dbs:
            self.base.snapshot(db, into=txn.view)
            txn.view_dbs.add(db)

    def _end(self, txn, state):
        txn.state = state
        self.counts[state] += 1
        for r in txn.resources:
            if self.locks.get(r) is txn:
                del self.locks[r]
        txn.resources = set()
        txn.view = None
        self.active.discard(txn)
        if not self.active:
            self.last_commit.clear()
        else:
            oldest = min(t.snap_seq for t in self.active)
            for r in [r for r, s in self.last_commit.items() if s <= oldest]:
                del self.last_commit[r]
        self.cond.notify_all()

    def abort(self, txn, why='aborted'):
        if txn.state == 'in_progress':
            self.log('transaction %d aborted (%s)' % (txn.number, why))
            self._end(txn, 'aborted')

    def commit(self, txn):
        if txn.state != 'in_progress':
            return
        if txn.view is None:
            self._end(txn, 'committed')
            return
        self.seq += 1
        base, view = self.base, txn.view
        for key in txn.created:
            if not base.exists(*key) and view.exists(*key):
                base.create(*key)
                m = view.meta[key].clone()
                base.meta[key] = m
                for keys in m.uniq.values():
                    keys.clear()
        for (db, name), keys in txn.written.items():
            if not view.exists(db, name):
                continue
            if not base.exists(db, name):
                base.create(db, name)
                base.meta[(db, name)] = view.meta[(db, name)].clone()
            bdocs, vdocs = base.cs(db, name)._documents, view.cs(db, name)._documents
            meta = base.meta[(db, name)]
            uniq = meta.unique_indexes()
            for k in keys:
                old = bdocs.get(k)
                for iname, spec in uniq:
                    owners = meta.uniq.setdefault(iname, {})
                    for key in index_keys(spec, old):
                        if owners.get(key) == k:
                            del owners[key]
            for k in keys:
                new = vdocs.get(k)
                if new is None:
                    bdocs.pop(k, None)
                    continue
                bdocs[k] = new
                for iname, spec in uniq:
                    owners = meta.uniq.setdefault(iname, {})
                    for key in index_keys(spec, new):
                        owners[key] = k
        if len(self.active) > 1:
            for r in txn.resources:
                self.last_commit[r] = self.seq
        self._end(txn, 'committed')

    def reap(self):
        now = time.monotonic()
        for t in [t for t in self.active if now >= t.expires]:
            self.abort(t, 'transactionLifetimeLimitSeconds exceeded')
        for cid in [c.id for c in self.cursors.values() if now - c.used > CURSOR_IDLE_SECONDS]:
            del self.cursors[cid]

    def wait_for(self, txn, deadline):
        """Wait (lock released) until txn ends, it expires, or the command's maxTimeMS."""
        while txn.state == 'in_progress':
            now = time.monotonic()
            if now >= txn.expires:
                self.abort(txn, 'transactionLifetimeLimitSeconds exceeded')
                break
            if deadline is not None and now >= deadline:
                raise CmdError(50, 'operation exceeded time limit')
            self.cond.wait((txn.expires if deadline is None else min(deadline, txn.expires)) - now)

    # ---- writes ------------------------------------------------------------

    def write(self, ctx, db, name, statement):
        """Run one write statement, statement(store) -> (Pending or None, result),
        with unique-index and conflict checks; retried after a wait outside transactions."""
        while True:
            pending, result = statement(ctx.store)
            if pending is None:
                return result
            try:
                pending.check_unique()
                res = [('d', db, name, ch.key) for ch in pending.changes]
                res += [('u', db, name, iname, key) for iname, key in pending.unique_touched]
                if pending.created:
                    res.append(('c', db, name))
                if ctx.txn is not None:
                    self._check_txn(ctx.txn, db, name, res)
                else:
                    for r in res:
                        owner = self.locks.get(r)
                        if owner is not None:
                            raise MustWait(owner)
            except MustWait as w:
                pending.rollback()
                self.log('a write on %s.%s waits for transaction %d' % (db, name, w.txn.number))
                self.wait_for(w.txn, ctx.deadline)
                continue
            except CmdError:
                pending.rollback()
                raise
            pending.accept()
            self._record(ctx.txn, db, name, pending, res)
            return result

    def _check_txn(self, txn, db, name, res):
        if self.last_commit.get(('c', db, name), -1) > txn.snap_seq:
            raise write_conflict()  # the collection was created, dropped or re-indexed since
        for r in res:
            owner = self.locks.get(r)
            if owner is not None and owner is not txn:
                raise write_conflict()
            if self.last_commit.get(r, -1) > txn.snap_seq:
                raise write_conflict()

    def _record(self, txn, db, name, pending, res):
        if txn is not None:
            for r in res:
                self.locks[r] = txn
            txn.resources.update(res)
            txn.written.setdefault((db, name), set()).update(ch.key for ch in pending.changes)
            if pending.created:
                txn.created.add((db, name))
            return
        self.seq += 1
        if self.active:
            for r in res:
                self.last_commit[r] = self.seq

    def ddl(self, ctx, db, names):
        """Before a catalog change on (db, name) for each name (None: the whole database):
        wait for open transactions that use it, then mark it changed for the others."""
        if ctx.txn is not None:
            return
        def users():
            return [t for t in self.active
                    if any(d == db and (not names or n in names) for d, n in t.touched)]
        blockers = users()
        while blockers:
            self.wait_for(blockers[0], ctx.deadline)
            blockers = users()
        self.seq += 1
        if self.active:
            for n in names or [n for d, n in self.base.meta if d == db]:
                self.last_commit[('c', db, n)] = self.seq

    def create_collection(self, ctx, db, name, options=None):
        """Create (db, name) in the command's store, as a write of ('c', db, name)."""
        if ctx.txn is None:
            self.ddl(ctx, db, [name])
            if self.base.exists(db, name):
                raise CmdError(48, 'Collection %s.%s already exists.' % (db, name))
            return self.base.create(db, name, options)
        res = [('c', db, name)]
        self._check_txn(ctx.txn, db, name, res)
        m = ctx.store.create(db, name, options)
        self.locks[res[0]] = ctx.txn
        ctx.txn.resources.update(res)
        ctx.txn.created.add((db, name))
        return m

    # ---- cursors -----------------------------------------------------------

    def open_cursor(self, ns, docs, first, limit=0, single=False, session=None):
        """A command cursor reply; keeps a cursor when documents are left."""
        c = Cursor(0, ns, docs, limit, session.key if session else None)
        batch = c.batch(first)
        if '.$cmd.' not in ns:
            self.documents['returned'] += len(batch)
        cid = 0
        if not single and not c.exhausted():
            cid = int.from_bytes(os.urandom(8), 'little') & 0x7FFFFFFFFFFFFFFF or 1
            c.id = cid
            self.cursors[cid] = c
        return {'cursor': {'firstBatch': batch, 'id': Int64(cid), 'ns': ns}, 'ok': 1.0}

    def get_more(self, cid, ns, n):
        c = self.cursors.get(cid)
        if c is None:
            raise CmdError(43, 'cursor id %d not found' % cid)
        if c.ns != ns:
            raise CmdError(13, 'cursor %d belongs to %s, not %s' % (cid, c.ns, ns))
        c.used = time.monotonic()
        batch = c.batch(n)
        if '.$cmd.' not in ns:
            self.documents['returned'] += len(batch)
        if c.exhausted():
            del self.cursors[cid]
            cid = 0
        return {'cursor': {'nextBatch': batch, 'id': Int64(cid), 'ns': ns}, 'ok': 1.0}

    def kill_cursors(self, ns, ids):
        killed, missing = [], []
        for cid in ids:
            c = self.cursors.get(cid)
            if c is not None and c.ns == ns:
                del self.cursors[cid]
                killed.append(Int64(cid))
            else:
                missing.append(Int64(cid))
        return {'cursorsKilled': killed, 'cursorsNotFound': missing, 'cursorsAlive': [],
                'cursorsUnknown': [], 'ok': 1.0}
