# SPDX-License-Identifier: MIT
"""The commands: execute(engine, db, cmd, conn) -> reply document (lock held).

The transaction protocol (lsid, txnNumber, autocommit, startTransaction,
commitTransaction, abortTransaction) and retryable writes are handled in
execute(); each command handler gets a Ctx telling it which store to use.
"""
import datetime
import os
import time

from bson import ObjectId
from bson.int64 import Int64
from bson.timestamp import Timestamp
from mongomock import filtering

from engine import Ctx
from errors import CmdError, no_such_transaction
from store import doc_key, duplicate_key, index_keys, mongomock_error
from wire import MAX_BSON_SIZE, MAX_MESSAGE_SIZE

VERSION = '6.0.0'
MAX_WIRE_VERSION = 17  # MongoDB 6.0
SET_NAME = 'rs0'
# --standalone: answer as a standalone server (no replica set: no transactions)
STANDALONE = False
STARTED = time.time()

# commands that may run in a multi-document transaction (MongoDB 4.4+ rules)
IN_TXN = {'find', 'getMore', 'killCursors', 'insert', 'update', 'delete', 'findAndModify',
          'aggregate', 'distinct', 'create', 'createIndexes', 'commitTransaction', 'abortTransaction'}
# informational commands: allowed in a transaction, ignore it
INFO = {'hello', 'isMaster', 'ismaster', 'buildInfo', 'buildinfo', 'ping', 'connectionStatus'}
RETRYABLE = {'insert', 'update', 'delete', 'findAndModify'}


class Conn:
    """What a command needs to know about its connection."""

    def __init__(self, conn_id, me):
        self.id, self.me = conn_id, me


def _coll_name(cmd, name):
    v = cmd[name]
    if not isinstance(v, str) or not v or '\x00' in v or v.startswith('$') or v.startswith('.'):
        raise CmdError(73, 'Invalid namespace specified: %r' % (v,))
    return v


def _doc(cmd, field, default=None):
    v = cmd.get(field, default)
    if v is not None and not isinstance(v, dict):
        raise CmdError(14, "BSON field '%s' is the wrong type, expected a document" % field)
    return v


def _nonneg(cmd, field, default=0):
    v = cmd.get(field, default)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise CmdError(14, "BSON field '%s' is the wrong type" % field)
    if v < 0:
        raise CmdError(2, '%s value must be non-negative, but received: %s' % (field, v))
    return int(v)


def _sort(spec):
    return list(spec.items()) if spec else None


# ---- handshake and information ---------------------------------------------

def hello(ctx, db, cmd, legacy=False):
    me = ctx.conn.me
    now = datetime.datetime.utcnow()
    doc = {'ismaster' if legacy else 'isWritablePrimary': True}
    if cmd.get('helloOk'):
        doc['helloOk'] = True
    doc.update({
        'hosts': [me], 'setName': SET_NAME, 'setVersion': 1, 'secondary': False,
        'primary': me, 'me': me, 'electionId': ObjectId('7fffffff0000000000000001'),
        'lastWrite': {'opTime': {'ts': Timestamp(int(STARTED), 1), 't': Int64(1)},
                      'lastWriteDate': now, 'majorityOpTime': {'ts': Timestamp(int(STARTED), 1), 't': Int64(1)},
                      'majorityWriteDate': now},
        'maxBsonObjectSize': MAX_BSON_SIZE, 'maxMessageSizeBytes': MAX_MESSAGE_SIZE,
        'maxWriteBatchSize': 100000, 'localTime': now, 'logicalSessionTimeoutMinutes': 30,
        'connectionId': ctx.conn.id, 'minWireVersion': 0, 'maxWireVersion': MAX_WIRE_VERSION,
        'readOnly': False, 'ok': 1.0})
    if STANDALONE:
        for k in ('hosts', 'setName', 'setVersion', 'secondary', 'primary', 'me', 'electionId', 'lastWrite'):
            del doc[k]
    return doc


def sleep(ctx, db, cmd):
    """mongod's test command {sleep: 1, millis: N}: holds the whole engine
    (as mongod's lock: "w") for N milliseconds (at most 60 s)."""
    ms = _nonneg(cmd, 'millis', 100)
    time.sleep(min(ms, 60000) / 1000.0)
    return {'ok': 1.0}


def build_info(ctx, db, cmd):
    return {'version': VERSION, 'gitVersion': 'relaybus-mongo-test-server', 'versionArray': [6, 0, 0, 0],
            'bits': 64, 'debug': False, 'maxBsonObjectSize': MAX_BSON_SIZE, 'modules': [],
            'storageEngines': ['mongomock'], 'ok': 1.0}


def server_status(ctx, db, cmd):
    e = ctx.engine
    up = time.time() - STARTED
    return {'host': ctx.conn.me, 'version': VERSION, 'process': 'mongod', 'pid': Int64(os.getpid()),
            'uptime': float(int(up)), 'uptimeMillis': Int64(int(up * 1000)),
            'localTime': datetime.datetime.utcnow(),
            'connections': {'current': e.connections, 'available': 1000, 'totalCreated': e.connections_total},
            'transactions': {'currentOpen': len(e.active), 'totalStarted': e.counts['started'],
                             'totalCommitted': e.counts['committed'], 'totalAborted': e.counts['aborted']},
            'opcounters': {k: Int64(v + (e.handshakes if k == 'command' else 0)) for k, v in e.opcounters.items()},
            'metrics': {'document': {k: Int64(v) for k, v in e.documents.items()}},
            'ok': 1.0}


def simple_ok(ctx, db, cmd):
    return {'ok': 1.0}


def connection_status(ctx, db, cmd):
    return {'authInfo': {'authenticatedUsers': [], 'authenticatedUserRoles': []}, 'ok': 1.0}


def end_sessions(ctx, db, cmd):
    ids = cmd['endSessions']
    if not isinstance(ids, list):
        raise CmdError(14, 'endSessions takes an array of session ids')
    ctx.engine.end_sessions(ids)
    return {'ok': 1.0}


# ---- catalog -----------------------------------------------------------------

def list_databases(ctx, db, cmd):
    st = ctx.store
    names = st.databases()
    filt = _doc(cmd, 'filter')
    dbs = []
    for n in names:
        d = {'name': n, 'sizeOnDisk': float(sum(len(st.cs(n, c)._documents) for c in st.collections(n)) * 100),
             'empty': False}
        if filt is None or filtering.filter_applies(filt, d):
            dbs.append({'name': n} if cmd.get('nameOnly') else d)
    return {'databases': dbs, 'totalSize': float(sum(d.get('sizeOnDisk', 0) for d in dbs)),
            'totalSizeMb': Int64(0), 'ok': 1.0}


def list_collections(ctx, db, cmd):
    st = ctx.store
    filt = _doc(cmd, 'filter')
    out = []
    for n in st.collections(db):
        m = st.meta[(db, n)]
        d = {'name': n, 'type': 'collection', 'options': dict(m.options),
             'info': {'readOnly': False, 'uuid': m.uuid}, 'idIndex': {'v': 2, 'key': {'_id': 1}, 'name': '_id_'}}
        if filt is None or filtering.filter_applies(filt, d):
            out.append({'name': n, 'type': 'collection'} if cmd.get('nameOnly') else d)
    cur = _doc(cmd, 'cursor') or {}
    return ctx.engine.open_cursor(db + '.$cmd.listCollections', out, _nonneg(cur, 'batchSize', 101),
                                  session=ctx.session)


_CREATE_OPTIONS = {'capped', 'size', 'max', 'validator', 'validationLevel', 'validationAction',
                   'collation', 'storageEngine', 'indexOptionDefaults', 'timeseries', 'expireAfterSeconds',
                   'clusteredIndex', 'changeStreamPreAndPostImages', 'viewOn', 'pipeline'}


def create(ctx, db, cmd):
    name = _coll_name(cmd, 'create')
    if ctx.store.exists(db, name):
        raise CmdError(48, 'Collection %s.%s already exists.' % (db, name))
    if 'viewOn' in cmd or 'timeseries' in cmd:
        raise CmdError(238, 'views and time series collections are not supported by the test server')
    ctx.engine.create_collection(ctx, db, name, {k: v for k, v in cmd.items() if k in _CREATE_OPTIONS})
    return {'ok': 1.0}


def drop(ctx, db, cmd):
    name = _coll_name(cmd, 'drop')
    ctx.engine.ddl(ctx, db, [name])
    st = ctx.store
    if not st.exists(db, name):
        raise CmdError(26, 'ns not found')
    n = len(st.meta[(db, name)].indexes)
    st.drop(db, name)
    return {'nIndexesWas': n, 'ns': '%s.%s' % (db, name), 'ok': 1.0}


def drop_database(ctx, db, cmd):
    ctx.engine.ddl(ctx, db, None)
    for name in ctx.store.collections(db):
        ctx.store.drop(db, name)
    return {'dropped': db, 'ok': 1.0}


_INDEX_OPTIONS = {'unique', 'sparse', 'partialFilterExpression', 'expireAfterSeconds', 'collation',
                  'hidden', 'weights', 'default_language', 'language_override', 'textIndexVersion',
                  '2dsphereIndexVersion', 'bits', 'min', 'max', 'wildcardProjection', 'storageEngine'}


def _index_spec(raw):
    if not isinstance(raw, dict) or not isinstance(raw.get('key'), dict) or not raw['key']:
        raise CmdError(9, "an index specification needs a non-empty 'key' document")
    for field, kind in raw['key'].items():
        if isinstance(kind, str) or isinstance(kind, bool) or not isinstance(kind, (int, float)) or kind == 0:
            raise CmdError(67, 'index key %s: only ascending/descending (1/-1) indexes are supported '
                               'by the test server' % field)
    name = raw.get('name') or '_'.join('%s_%d' % (f, int(d)) for f, d in raw['key'].items())
    spec = {'v': 2, 'key': dict(raw['key']), 'name': name}
    for k, v in raw.items():
        if k in _INDEX_OPTIONS:
            if k in ('unique', 'sparse') and not v:
                continue
            spec[k] = v
        elif k not in ('key', 'name', 'v', 'background', 'ns'):
            raise CmdError(197, "The field '%s' is not valid for an index specification" % k)
    return spec


def _same_options(a, b):
    strip = ('v', 'name', 'key')
    return {k: v for k, v in a.items() if k not in strip} == {k: v for k, v in b.items() if k not in strip}


def create_indexes(ctx, db, cmd):
    name = _coll_name(cmd, 'createIndexes')
    raw = cmd.get('indexes')
    if not isinstance(raw, list) or not raw:
        raise CmdError(2, "createIndexes needs a non-empty 'indexes' array")
    specs = [_index_spec(r) for r in raw]
    st, txn = ctx.store, ctx.txn
    if txn is not None and st.exists(db, name) and (db, name) not in txn.created:
        raise CmdError(263, 'Cannot create new indexes on existing collection %s.%s in a '
                            'multi-document transaction.' % (db, name))
    ctx.engine.ddl(ctx, db, [name])
    created = not st.exists(db, name)
    if created:
        ctx.engine.create_collection(ctx, db, name)
    meta = st.meta[(db, name)]
    before = len(meta.indexes)
    docs = st.cs(db, name)._documents
    new = []
    for spec in specs:
        same_name = meta.indexes.get(spec['name'])
        if same_name is not None:
            if same_name['key'] != spec['key'] or not _same_options(same_name, spec):
                raise CmdError(85 if same_name['key'] == spec['key'] else 86,
                               'An existing index has the same name as the requested index: %s'
                               % spec['name'])
            continue
        same_key = [s for s in meta.indexes.values() if list(s['key'].items()) == list(spec['key'].items())]
        if same_key:
            if _same_options(same_key[0], spec):
                continue
            raise CmdError(85, 'Index already exists with a different name: %s' % same_key[0]['name'])
        if spec.get('unique'):
            owners = {}
            for k, d in docs.items():
                for key in index_keys(spec, d):
                    if owners.setdefault(key, k) != k:
                        raise duplicate_key('%s.%s' % (db, name), spec, d)
            meta.uniq[spec['name']] = owners
        meta.indexes[spec['name']] = spec
        new.append(spec['name'])
    reply = {'numIndexesBefore': before, 'numIndexesAfter': len(meta.indexes),
             'createdCollectionAutomatically': created, 'ok': 1.0}
    if not new:
        reply['note'] = 'all indexes already exist'
    return reply


def list_indexes(ctx, db, cmd):
    name = _coll_name(cmd, 'listIndexes')
    if not ctx.store.exists(db, name):
        raise CmdError(26, 'ns does not exist: %s.%s' % (db, name))
    specs = [dict(s) for s in ctx.store.meta[(db, name)].indexes.values()]
    cur = _doc(cmd, 'cursor') or {}
    return ctx.engine.open_cursor('%s.$cmd.listIndexes.%s' % (db, name), specs,
                                  _nonneg(cur, 'batchSize', 101), session=ctx.session)


def drop_indexes(ctx, db, cmd):
    name = _coll_name(cmd, 'dropIndexes')
    ctx.engine.ddl(ctx, db, [name])
    if not ctx.store.exists(db, name):
        raise CmdError(26, 'ns not found %s.%s' % (db, name))
    meta = ctx.store.meta[(db, name)]
    was = len(meta.indexes)
    which = cmd.get('index')
    if which == '*':
        names = [n for n in meta.indexes if n != '_id_']
    elif isinstance(which, str):
        names = [which]
    elif isinstance(which, list):
        names = list(which)
    elif isinstance(which, dict):
        names = [n for n, s in meta.indexes.items() if list(s['key'].items()) == list(which.items())]
        if not names:
            raise CmdError(27, "can't find index with key: %s" % (which,))
    else:
        raise CmdError(14, "dropIndexes: 'index' must be a name, a key pattern or '*'")
    for n in names:
        if n == '_id_':
            raise CmdError(72, 'cannot drop _id index')
        if n not in meta.indexes:
            raise CmdError(27, 'index not found with name [%s]' % n)
    for n in names:
        del meta.indexes[n]
        meta.uniq.pop(n, None)
    return {'nIndexesWas': was, 'ok': 1.0}


def coll_stats(ctx, db, cmd):
    name = _coll_name(cmd, 'collStats')
    st = ctx.store
    if not st.exists(db, name):
        raise CmdError(26, 'Collection [%s.%s] not found.' % (db, name))
    n = len(st.cs(db, name)._documents)
    meta = st.meta[(db, name)]
    return {'ns': '%s.%s' % (db, name), 'count': n, 'size': n * 100, 'avgObjSize': 100 if n else 0,
            'storageSize': n * 100, 'nindexes': len(meta.indexes), 'totalIndexSize': 0,
            'indexSizes': {i: 0 for i in meta.indexes}, 'capped': bool(meta.options.get('capped')), 'ok': 1.0}


def db_stats(ctx, db, cmd):
    st = ctx.store
    colls = st.collections(db)
    objects = sum(len(st.cs(db, c)._documents) for c in colls)
    return {'db': db, 'collections': len(colls), 'views': 0, 'objects': objects,
            'avgObjSize': 100.0 if objects else 0.0, 'dataSize': float(objects * 100),
            'storageSize': float(objects * 100), 'indexes': sum(len(st.meta[(db, c)].indexes) for c in colls),
            'indexSize': 0.0, 'ok': 1.0}


# ---- reads -------------------------------------------------------------------

def find(ctx, db, cmd):
    name = _coll_name(cmd, 'find')
    filt = _doc(cmd, 'filter') or {}
    sort = _doc(cmd, 'sort')
    projection = _doc(cmd, 'projection')
    skip, limit = _nonneg(cmd, 'skip'), _nonneg(cmd, 'limit')
    batch = cmd.get('batchSize')
    batch = 101 if batch is None else _nonneg(cmd, 'batchSize')
    for opt in ('tailable', 'awaitData', 'returnKey', 'showRecordId', 'min', 'max'):
        if cmd.get(opt):
            raise CmdError(238, "find option '%s' is not supported by the test server" % opt)
    docs = []
    if ctx.store.exists(db, name):
        docs = list(ctx.store.coll(db, name).find(filt, projection or None, skip=skip, limit=limit,
                                                   sort=_sort(sort)))
    if limit:
        batch = min(batch, limit)
    return ctx.engine.open_cursor('%s.%s' % (db, name), docs, batch, single=bool(cmd.get('singleBatch')),
                                  session=ctx.session)


def get_more(ctx, db, cmd):
    cid = cmd['getMore']
    if not isinstance(cid, int):
        raise CmdError(14, 'getMore takes a cursor id (long)')
    coll = cmd.get('collection')
    if not isinstance(coll, str):
        raise CmdError(14, "getMore needs a 'collection' string")
    n = cmd.get('batchSize')
    return ctx.engine.get_more(int(cid), '%s.%s' % (db, coll), None if not n else _nonneg(cmd, 'batchSize'))


def kill_cursors(ctx, db, cmd):
    coll = _coll_name(cmd, 'killCursors') if not str(cmd['killCursors']).startswith('$cmd') else cmd['killCursors']
    ids = cmd.get('cursors')
    if not isinstance(ids, list):
        raise CmdError(14, "killCursors needs a 'cursors' array")
    return ctx.engine.kill_cursors('%s.%s' % (db, coll), [int(i) for i in ids])


def _check_pipeline(pipeline, in_txn):
    if not isinstance(pipeline, list):
        raise CmdError(14, "'pipeline' must be an array")
    for stage in pipeline:
        if not isinstance(stage, dict) or len(stage) != 1:
            raise CmdError(40323, 'A pipeline stage specification object must contain exactly one field.')
        op = next(iter(stage))
        if op in ('$out', '$merge'):
            if in_txn:
                raise CmdError(263, '%s cannot be used in a transaction' % op)
            raise CmdError(238, '%s is not supported by the test server' % op)
        for sub in ('$lookup', '$unionWith'):
            if op == sub and isinstance(stage[op], dict) and 'pipeline' in stage[op]:
                _check_pipeline(stage[op]['pipeline'], in_txn)


def aggregate(ctx, db, cmd):
    target = cmd['aggregate']
    if target == 1:
        raise CmdError(238, 'database-level aggregation is not supported by the test server')
    name = _coll_name(cmd, 'aggregate')
    pipeline = cmd.get('pipeline')
    _check_pipeline(pipeline, ctx.txn is not None)
    if cmd.get('explain'):
        raise CmdError(238, 'explain is not supported by the test server')
    cur = _doc(cmd, 'cursor')
    if cur is None:
        raise CmdError(9, "The 'cursor' option is required, except for aggregate with the explain argument")
    docs = []
    if ctx.store.exists(db, name):
        docs = list(ctx.store.coll(db, name).aggregate(pipeline))
    return ctx.engine.open_cursor('%s.%s' % (db, name), docs, _nonneg(cur, 'batchSize', 101),
                                  session=ctx.session)


def count(ctx, db, cmd):
    name = _coll_name(cmd, 'count')
    q = _doc(cmd, 'query') or {}
    skip, limit = _nonneg(cmd, 'skip'), abs(int(cmd.get('limit') or 0))
    if not ctx.store.exists(db, name):
        return {'n': 0, 'ok': 1.0}
    kw = {'skip': skip} if skip else {}
    if limit:
        kw['limit'] = limit
    return {'n': ctx.store.coll(db, name).count_documents(q, **kw), 'ok': 1.0}


def distinct(ctx, db, cmd):
    name = _coll_name(cmd, 'distinct')
    key = cmd.get('key')
    if not isinstance(key, str):
        raise CmdError(14, "distinct needs a 'key' string")
    q = _doc(cmd, 'query') or {}
    values = ctx.store.coll(db, name).distinct(key, q) if ctx.store.exists(db, name) else []
    return {'values': values, 'ok': 1.0}


# ---- writes ------------------------------------------------------------------

def _statements(cmd, field):
    v = cmd.get(field)
    if not isinstance(v, list) or not v:
        raise CmdError(9, "Write batch sizes must be between 1 and 100000. Got 0 operations."
                       if isinstance(v, list) else "BSON field '%s' is missing or not an array" % field)
    if len(v) > 100000:
        raise CmdError(9, 'Write batch sizes must be between 1 and 100000. Got %d operations.' % len(v))
    return v


def _batch(ctx, cmd, statements, run):
    """Run each statement; a failure is a writeErrors entry (ordered: the batch stops there).
    Transient errors (WriteConflict) and time-outs fail the whole command, as on the server;
    in a transaction the first error ends the batch (the transaction is aborted)."""
    ordered = cmd.get('ordered', True)
    errors = []
    for i, s in enumerate(statements):
        try:
            run(i, s)
        except CmdError as e:
            if e.labels or e.code == 50:
                raise
            errors.append(e.write_error(i))
            if ordered or ctx.txn is not None:
                break
    return errors


def insert(ctx, db, cmd):
    name = _coll_name(cmd, 'insert')
    docs = _statements(cmd, 'documents')
    n = [0]
    ctx.engine.opcounters['insert'] += len(docs)

    def run(i, doc):
        if not isinstance(doc, dict):
            raise CmdError(14, 'a document to insert must be a document')
        ctx.engine.write(ctx, db, name, lambda st: st.insert(db, name, doc))
        n[0] += 1
    errors = _batch(ctx, cmd, docs, run)
    ctx.engine.documents['inserted'] += n[0]
    reply = {'n': n[0], 'ok': 1.0}
    if errors:
        reply['writeErrors'] = errors
    return reply


def update(ctx, db, cmd):
    name = _coll_name(cmd, 'update')
    stmts = _statements(cmd, 'updates')
    tot = {'n': 0, 'nModified': 0}
    upserted = []
    ctx.engine.opcounters['update'] += len(stmts)

    def run(i, s):
        if not isinstance(s, dict) or not isinstance(s.get('q'), dict) or not isinstance(s.get('u'), (dict, list)):
            raise CmdError(9, "an update statement needs a 'q' document and a 'u' document or pipeline")
        if s.get('collation') or s.get('c'):
            raise CmdError(238, "update options 'collation' and 'c' are not supported by the test server")
        res = ctx.engine.write(ctx, db, name, lambda st: st.update(
            db, name, s['q'], s['u'], bool(s.get('upsert')), bool(s.get('multi')), s.get('arrayFilters')))
        tot['n'] += res['n']
        tot['nModified'] += res['nModified']
        if res['upserted'] is not None:
            upserted.append({'index': i, '_id': res['upserted']})
    errors = _batch(ctx, cmd, stmts, run)
    ctx.engine.documents['updated'] += tot['nModified']
    ctx.engine.documents['inserted'] += len(upserted)
    reply = {'n': tot['n'], 'nModified': tot['nModified'], 'ok': 1.0}
    if upserted:
        reply['upserted'] = upserted
    if errors:
        reply['writeErrors'] = errors
    return reply


def delete(ctx, db, cmd):
    name = _coll_name(cmd, 'delete')
    stmts = _statements(cmd, 'deletes')
    n = [0]
    ctx.engine.opcounters['delete'] += len(stmts)

    def run(i, s):
        if not isinstance(s, dict) or not isinstance(s.get('q'), dict) or s.get('limit', 0) not in (0, 1):
            raise CmdError(9, "a delete statement needs a 'q' document and a 'limit' of 0 or 1")
        res = ctx.engine.write(ctx, db, name, lambda st: st.delete(db, name, s['q'], s.get('limit', 0)))
        n[0] += res['n']
    errors = _batch(ctx, cmd, stmts, run)
    ctx.engine.documents['deleted'] += n[0]
    reply = {'n': n[0], 'ok': 1.0}
    if errors:
        reply['writeErrors'] = errors
    return reply


def find_and_modify(ctx, db, cmd):
    name = _coll_name(cmd, 'findAndModify')
    q = _doc(cmd, 'query') or {}
    sort = _doc(cmd, 'sort') or None
    fields = _doc(cmd, 'fields') or None
    remove, new, upsert = bool(cmd.get('remove')), bool(cmd.get('new')), bool(cmd.get('upsert'))
    upd = cmd.get('update')
    if remove and upd is not None:
        raise CmdError(9, 'Cannot specify both an update and remove=true')
    if remove and (new or upsert):
        raise CmdError(9, 'Cannot specify both new=true and remove=true; remove=true and upsert=true '
                          'are not allowed either')
    if not remove and not isinstance(upd, (dict, list)):
        raise CmdError(9, 'Either an update or remove=true must be specified')
    out = {}

    def statement(st):
        keys = st._matching(db, name, q, sort, first=True)
        target = st.cs(db, name)._documents[keys[0]] if keys else None
        before = st.project(target, fields) if target is not None else None
        if remove:
            if target is None:
                out.update(value=None, leo={'n': 0})
                return None, None
            p, _ = st.delete(db, name, None, keys=keys)
            out.update(value=before, leo={'n': 1})
            return p, None
        p, res = st.update(db, name, q, upd, upsert, False, cmd.get('arrayFilters'), sort)
        leo = {'n': res['n'], 'updatedExisting': target is not None}
        if res['upserted'] is not None:
            leo['upserted'] = res['upserted']
        _id = res['upserted'] if res['upserted'] is not None else (target['_id'] if target else None)
        after = None
        if new and _id is not None:
            after = st.project(st.cs(db, name)._documents[doc_key(_id)], fields)
        out.update(value=after if new else before, leo=leo)
        return p, None
    ctx.engine.write(ctx, db, name, statement)
    leo = out['leo']
    if remove:
        ctx.engine.documents['deleted'] += leo['n']
    elif 'upserted' in leo:
        ctx.engine.documents['inserted'] += 1
    elif leo['n']:
        ctx.engine.documents['updated'] += 1
    return {'lastErrorObject': out['leo'], 'value': out['value'], 'ok': 1.0}


COMMANDS = {
    'hello': hello,
    'isMaster': lambda ctx, db, cmd: hello(ctx, db, cmd, legacy=True),
    'ismaster': lambda ctx, db, cmd: hello(ctx, db, cmd, legacy=True),
    'ping': simple_ok,
    'sleep': sleep,
    'buildInfo': build_info,
    'buildinfo': build_info,
    'connectionStatus': connection_status,
    'serverStatus': server_status,
    'endSessions': end_sessions,
    'refreshSessions': simple_ok,
    'listDatabases': list_databases,
    'listCollections': list_collections,
    'create': create,
    'drop': drop,
    'dropDatabase': drop_database,
    'createIndexes': create_indexes,
    'listIndexes': list_indexes,
    'dropIndexes': drop_indexes,
    'collStats': coll_stats,
    'dbStats': db_stats,
    'find': find,
    'getMore': get_more,
    'killCursors': kill_cursors,
    'aggregate': aggregate,
    'count': count,
    'distinct': distinct,
    'insert': insert,
    'update': update,
    'delete': delete,
    'findAndModify': find_and_modify,
    'findandmodify': find_and_modify,
}


def _target(name, cmd):
    if name == 'getMore':
        return cmd.get('collection')
    v = cmd.get(name)
    return v if isinstance(v, str) else None


def execute(engine, db, cmd, conn):
    """Run one command (engine.lock held) and return its reply document."""
    if not cmd:
        raise CmdError(9, 'empty command')
    name = next(iter(cmd))
    engine.reap()
    if name == 'find':
        engine.opcounters['query'] += 1
    elif name == 'getMore':
        engine.opcounters['getmore'] += 1
    elif name not in ('insert', 'update', 'delete'):
        engine.opcounters['command'] += 1
    if name not in COMMANDS and name not in ('commitTransaction', 'abortTransaction'):
        raise CmdError(59, "no such command: '%s'" % name)
    session = engine.session(cmd['lsid']) if 'lsid' in cmd else None
    ms = cmd.get('maxTimeMS')
    deadline = time.monotonic() + ms / 1000.0 if isinstance(ms, (int, float)) and ms > 0 else None
    in_txn = ('autocommit' in cmd or 'startTransaction' in cmd) and name not in INFO
    if in_txn:
        return _in_transaction(engine, db, cmd, name, session, deadline, conn)
    if name in ('commitTransaction', 'abortTransaction'):
        raise CmdError(72, '%s needs lsid, txnNumber and autocommit: false' % name)
    ctx = Ctx(engine, engine.base, None, session, deadline)
    ctx.conn = conn
    n = cmd.get('txnNumber')
    if n is None or name in INFO:
        return _call(ctx, db, cmd, name)
    if session is None:
        raise CmdError(72, 'txnNumber may only be given with a session id (lsid)')
    if name not in RETRYABLE:
        raise CmdError(72, "txnNumber may not be given with '%s' outside a transaction" % name)
    if n < session.txn_number:
        raise CmdError(225, 'Retryable write with txnNumber %d is prohibited on session because a newer '
                            'retryable write with txnNumber %d has already started' % (n, session.txn_number))
    if session.retry is not None and session.retry[0] == n:
        return session.retry[1]  # a retried write: the first answer, not a second execution
    if session.txn is not None and session.txn.state == 'in_progress':
        engine.abort(session.txn, 'a newer txnNumber arrived')
    session.txn_number = n
    reply = _call(ctx, db, cmd, name)
    session.retry = (n, reply)
    return reply


def _call(ctx, db, cmd, name):
    try:
        return COMMANDS[name](ctx, db, cmd)
    except CmdError:
        raise
    except Exception as e:  # noqa: BLE001 - mongomock's errors become the server's
        raise mongomock_error(e)


def _in_transaction(engine, db, cmd, name, session, deadline, conn):
    txn = engine.txn_for(session, cmd, name)
    if name == 'commitTransaction':
        if txn.state == 'aborted':
            raise no_such_transaction('Transaction with { txnNumber: %d } has been aborted.' % txn.number)
        engine.commit(txn)
        return {'ok': 1.0}
    if name == 'abortTransaction':
        if txn.state == 'committed':
            raise CmdError(256, 'Transaction %d has been committed.' % txn.number)
        if txn.state == 'aborted':
            raise no_such_transaction('Transaction with { txnNumber: %d } has been aborted.' % txn.number)
        engine.abort(txn, 'abortTransaction')
        return {'ok': 1.0}
    if name not in IN_TXN:
        raise CmdError(263, "Cannot run '%s' in a multi-document transaction." % name)
    if 'writeConcern' in cmd:
        raise CmdError(72, 'Cannot set write concern after starting a transaction.')
    if txn.view is not None and 'readConcern' in cmd:
        raise CmdError(72, 'Only the first command in a transaction may specify a readConcern')
    engine.begin(txn, db)
    target = _target(name, cmd)
    if target:
        txn.touched.add((db, target))
    ctx = Ctx(engine, txn.view, txn, session, deadline)
    ctx.conn = conn
    try:
        reply = _call(ctx, db, cmd, name)
    except CmdError:
        engine.abort(txn, 'a command failed')
        raise
    if reply.get('writeErrors'):
        engine.abort(txn, 'a write failed')
    return reply


__all__ = ['execute', 'Conn', 'doc_key']
