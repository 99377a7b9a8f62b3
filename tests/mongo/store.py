# SPDX-License-Identifier: MIT
"""The data: databases of collections held in mongomock stores, with our own
catalog (collections, indexes, unique-key maps) and statement-level writes.

mongomock evaluates filters, updates, projections, sorts and pipelines.  We
keep everything it cannot do for us: the catalog, unique indexes (hash maps,
with the server's duplicate-key error), and for each write statement the exact
set of documents it changed (before and after images), which the engine needs
for transactions.  A Store is either the committed state or a transaction's
private view; a view is a shallow copy (documents shared), so a document is
never changed in place: an update runs on copies in a scratch collection and
the results replace the originals, which stay intact for the other stores.
"""
import collections
import copy
import os

os.environ.setdefault('MONGODB', '6.0.0')  # the server version mongomock emulates

import bson  # noqa: E402
import mongomock  # noqa: E402
from bson import ObjectId  # noqa: E402
from bson.binary import Binary  # noqa: E402
from mongomock import filtering, helpers  # noqa: E402
from mongomock.store import CollectionStore, ServerStore  # noqa: E402

from errors import CmdError  # noqa: E402


def doc_key(_id):
    """The key mongomock files a document under."""
    return helpers.hashdict(_id) if isinstance(_id, dict) else _id


def _id_equal(q):
    """The _id a filter asks equality with, when it is a plain value (a
    string, a number, an ObjectId) that finds at most the document filed
    under it; else None.  The document found still goes through the whole
    filter, so the rest of it, and MongoDB's equality, decide."""
    v = q.get('_id') if isinstance(q, dict) else None
    if isinstance(v, dict) and list(v) == ['$eq']:
        v = v['$eq']
    if isinstance(v, bool) or not isinstance(v, (str, int, ObjectId)):
        return None
    return v


def norm(v):
    """A hashable value with MongoDB's equality (1 == 1.0, True != 1)."""
    if isinstance(v, bool):
        return ('$bool', v)
    if isinstance(v, dict):
        return ('$doc',) + tuple((k, norm(x)) for k, x in v.items())
    if isinstance(v, list):
        return ('$arr',) + tuple(norm(x) for x in v)
    try:
        hash(v)
        return v
    except TypeError:
        return ('$repr', repr(v))


def mongomock_error(e):
    """A mongomock/pymongo exception as the server's error."""
    if isinstance(e, CmdError):
        return e
    if isinstance(e, NotImplementedError):
        return CmdError(238, 'not supported by the test server (mongomock): %s' % e)
    msg = str(e) or type(e).__name__
    code = getattr(e, 'code', None)
    if 'immutable' in msg:
        code = 66
    return CmdError(code if isinstance(code, int) and code > 0 else 2, msg)


class CollMeta:
    """What the catalog knows about one collection."""

    def __init__(self, options=None):
        self.uuid = Binary(os.urandom(16), 4)
        self.options = dict(options or {})
        self.indexes = collections.OrderedDict(
            [('_id_', {'v': 2, 'key': {'_id': 1}, 'name': '_id_'})])
        self.uniq = {}  # unique index name -> {normalized key tuple: doc key}

    def clone(self):
        m = CollMeta.__new__(CollMeta)
        m.uuid = self.uuid
        m.options = self.options
        m.indexes = copy.deepcopy(self.indexes)
        m.uniq = {name: dict(keys) for name, keys in self.uniq.items()}
        return m

    def unique_indexes(self):
        return [(n, s) for n, s in self.indexes.items() if s.get('unique') and n != '_id_']


def _path_values(doc, path):
    """Values at a dotted path, arrays expanded as a multikey index does; [None] if missing."""
    cur = [doc]
    for part in path.split('.'):
        nxt = []
        for v in cur:
            if isinstance(v, dict):
                if part in v:
                    nxt.append(v[part])
            elif isinstance(v, list):
                if part.isdigit() and int(part) < len(v):
                    nxt.append(v[int(part)])
                nxt.extend(e[part] for e in v if isinstance(e, dict) and part in e)
        cur = nxt
    if not cur:
        return [None], False
    out = []
    for v in cur:
        if isinstance(v, list):
            out.extend(v if v else [('$undefined',)])
        else:
            out.append(v)
    return out, True


def index_keys(spec, doc):
    """The set of keys (tuples) that `doc` puts into the index `spec`."""
    if doc is None:
        return set()
    pfe = spec.get('partialFilterExpression')
    if pfe is not None and not filtering.filter_applies(pfe, doc):
        return set()
    keys = [()]
    present = False
    for field in spec['key']:
        values, found = _path_values(doc, field)
        present = present or found
        keys = [k + (norm(v),) for k in keys for v in values]
    if spec.get('sparse') and not present:
        return set()
    return set(keys)


def _fmt(v):
    if isinstance(v, str):
        return '"%s"' % v
    if isinstance(v, dict):
        return '{ %s }' % ', '.join('%s: %s' % (k, _fmt(x)) for k, x in v.items())
    try:
        return bson.json_util.dumps(v)
    except (TypeError, ValueError):
        return repr(v)


def duplicate_key(ns, spec, doc):
    value = {}
    for field in spec['key']:
        values, _ = _path_values(doc, field)
        value[field] = values[0]
    return CmdError(11000, 'E11000 duplicate key error collection: %s index: %s dup key: %s'
                    % (ns, spec['name'], _fmt(value)),
                    extra={'keyPattern': dict(spec['key']), 'keyValue': value})


class Change:
    """One document written by a statement: before/after image (None = absent)."""
    __slots__ = ('key', 'before', 'after')

    def __init__(self, key, before, after):
        self.key, self.before, self.after = key, before, after


def _same(a, b):
    if a != b:
        return False
    enc = bson.BSON.encode
    return enc(a) == enc(b)  # catches type-only changes (1 -> 1.0)


class Pending:
    """A statement applied to a store, not yet accepted: rollback() undoes it."""

    def __init__(self, store, db, name, created):
        self.store, self.db, self.name, self.created = store, db, name, created
        self.cs = store.cs(db, name)
        self.meta = store.meta[(db, name)]
        self.saved = []      # (doc key, original object) of documents it replaced or removed
        self.inserted = []   # doc keys it added
        self.changes = []
        self.unique_touched = []  # (index name, key) added or removed
        self._new_uniq = None

    def diff(self):
        docs = self.cs._documents
        for k, old in self.saved:
            new = docs.get(k)
            if new is None or not _same(old, new):
                self.changes.append(Change(k, old, new))
        for k in self.inserted:
            self.changes.append(Change(k, None, docs[k]))
        return self.changes

    def check_unique(self):
        """Raise DuplicateKey, or remember the index maintenance for accept()."""
        plans = []
        ns = '%s.%s' % (self.db, self.name)
        for name, spec in self.meta.unique_indexes():
            owners = self.meta.uniq.setdefault(name, {})
            removed, added = [], {}
            for ch in self.changes:
                old = index_keys(spec, ch.before)
                new = index_keys(spec, ch.after)
                removed.extend((key, ch.key) for key in old - new)
                for key in new - old:
                    owner = added.get(key)
                    if owner is not None and owner != ch.key:
                        raise duplicate_key(ns, spec, ch.after)
                    added[key] = ch.key
            gone = {key for key, k in removed if owners.get(key) == k}
            for key, k in added.items():
                owner = owners.get(key)
                if owner is not None and owner != k and key not in gone:
                    doc = next(ch.after for ch in self.changes if ch.key == k)
                    raise duplicate_key(ns, spec, doc)
            plans.append((owners, gone, added))
            self.unique_touched.extend((name, key) for key in gone)
            self.unique_touched.extend((name, key) for key in added)
        self._new_uniq = plans

    def accept(self):
        for owners, gone, added in self._new_uniq or ():
            for key in gone:
                del owners[key]
            owners.update(added)

    def rollback(self):
        docs = self.cs._documents
        for k in self.inserted:
            docs.pop(k, None)
        for k, old in self.saved:
            docs[k] = old  # a deleted document comes back at the end (natural order is not defined)
        if self.created:
            self.store.drop(self.db, self.name)


class Store:
    """A set of databases and collections."""

    def __init__(self):
        self.server = ServerStore()
        self.client = mongomock.MongoClient(_store=self.server)
        self.meta = {}  # (db, collection) -> CollMeta
        self._scratch_coll = None

    def exists(self, db, name):
        return (db, name) in self.meta

    def cs(self, db, name):
        return self.server[db][name]

    def coll(self, db, name):
        return self.client[db][name]

    def create(self, db, name, options=None):
        self.cs(db, name).create()
        m = self.meta[(db, name)] = CollMeta(options)
        return m

    def drop(self, db, name):
        self.server[db]._collections.pop(name, None)
        self.meta.pop((db, name), None)

    def databases(self):
        return sorted({db for db, _ in self.meta})

    def collections(self, db):
        return sorted(name for d, name in self.meta if d == db)

    def snapshot(self, db, into=None):
        """A private copy of database db for a transaction (into: the view it
        adds to, else a new one): documents shared until written.  Only the
        databases a transaction uses: a copy of the whole server made each
        transaction cost what every other test's data weighs (4 ms a
        transaction, 66 ms beside 100,000 documents in another database)."""
        s = Store() if into is None else into
        for (d, name), m in self.meta.items():
            if d != db:
                continue
            cs = CollectionStore(name)
            cs._documents = collections.OrderedDict(self.cs(d, name)._documents)
            cs._is_force_created = True
            s.server[d]._collections[name] = cs
            s.meta[(d, name)] = m.clone()
        return s

    # ---- statements (each returns (Pending, result)) ----------------------

    def _begin(self, db, name):
        created = not self.exists(db, name)
        if created:
            self.create(db, name)
        return Pending(self, db, name, created)

    def _matching(self, db, name, q, sort=None, first=False):
        """Keys of the documents matching q, in sort (or natural) order; first: at most one."""
        if not self.exists(db, name):
            return []
        q = q or {}
        filtering.filter_applies(q, {})  # a bad filter fails even on an empty collection
        if sort:
            keys = [doc_key(d['_id']) for d in self.coll(db, name).find(q, {'_id': 1}, sort=list(sort.items()))]
            return keys[:1] if first else keys
        ident = _id_equal(q)
        if ident is not None:
            # (a filter that names one _id: that document or none, not a scan
            # of the collection: a batch of updates by _id was quadratic, 2.3 s
            # for 2,500 of them, all that time holding the engine)
            k = doc_key(ident)
            d = self.cs(db, name)._documents.get(k)
            return [k] if d is not None and filtering.filter_applies(q, d) else []
        keys = []
        for k, d in self.cs(db, name)._documents.items():
            if filtering.filter_applies(q, d):
                keys.append(k)
                if first:
                    break
        return keys

    def _scratch(self, docs):
        """A mongomock collection holding just copies of `docs`: updates run there, so the
        store's own documents are never changed in place (views share them)."""
        if self._scratch_coll is None:
            self._scratch_coll = mongomock.MongoClient()['scratch']['docs']
        cs = self._scratch_coll._store
        cs._documents = collections.OrderedDict((k, copy.deepcopy(d)) for k, d in docs)
        cs._is_force_created = True
        return self._scratch_coll, cs._documents

    def project(self, doc, fields):
        """A copy of doc with a find projection applied."""
        if not fields:
            return copy.deepcopy(doc)
        scratch, _ = self._scratch([(doc_key(doc['_id']), doc)])
        return scratch.find_one({}, fields)

    def insert(self, db, name, doc):
        if '_id' not in doc:
            doc = dict([('_id', ObjectId())] + list(doc.items()))
        if isinstance(doc['_id'], (list, bson.regex.Regex)):
            raise CmdError(2, "can't use an array or a regex for _id")
        p = self._begin(db, name)
        k = doc_key(doc['_id'])
        if k in p.cs._documents:
            spec = p.meta.indexes['_id_']
            p.rollback()
            raise duplicate_key('%s.%s' % (db, name), spec, doc)
        try:
            self.coll(db, name).insert_one(doc)
        except Exception as e:  # noqa: BLE001 - mongomock raises many kinds
            p.rollback()
            raise mongomock_error(e)
        p.inserted.append(k)
        p.diff()
        return p, {'n': 1, '_id': doc['_id']}

    def update(self, db, name, q, u, upsert=False, multi=False, array_filters=None, sort=None):
        """Update (or replace) the first (by sort, else natural order) or all documents
        matching q.  Result: n, nModified, upserted (the new _id or None)."""
        if not self.exists(db, name) and not upsert:
            return None, {'n': 0, 'nModified': 0, 'upserted': None}
        keys = self._matching(db, name, q, sort, first=not multi)
        p = self._begin(db, name)
        docs = p.cs._documents
        scratch, sdocs = self._scratch((k, docs[k]) for k in keys)
        spec = q or {}
        upserted = None
        try:
            if isinstance(u, list):
                upserted = self._pipeline_update(sdocs, keys, spec, u, upsert)
            elif u and all(k.startswith('$') for k in u):
                kw = {'upsert': upsert}
                if array_filters:
                    kw['array_filters'] = array_filters
                res = (scratch.update_many if multi else scratch.update_one)(spec, u, **kw)
                upserted = res.upserted_id
            elif any(k.startswith('$') for k in u):
                raise CmdError(9, 'an update document mixes operators and fields')
            else:
                if multi:
                    raise CmdError(9, 'multi update is not supported for replacement-style update')
                if '_id' in u and keys and norm(u['_id']) != norm(docs[keys[0]]['_id']):
                    raise CmdError(66, "After applying the update, the (immutable) field '_id' "
                                       "was found to have been altered")
                upserted = scratch.replace_one(spec, u, upsert=upsert).upserted_id
            if upserted is not None and doc_key(upserted) in docs:
                raise duplicate_key('%s.%s' % (db, name), p.meta.indexes['_id_'], {'_id': upserted})
        except Exception as e:  # noqa: BLE001
            p.rollback()
            raise mongomock_error(e)
        for k in keys:
            p.saved.append((k, docs[k]))
            docs[k] = sdocs[k]  # same key: the document keeps its place
        if upserted is not None:
            k = doc_key(upserted)
            docs[k] = sdocs[k]
            p.inserted.append(k)
        p.diff()
        n_mod = sum(1 for c in p.changes if c.before is not None)
        return p, {'n': len(keys) or (1 if upserted is not None else 0), 'nModified': n_mod,
                   'upserted': upserted}

    @staticmethod
    def _pipeline_update(sdocs, keys, spec, pipeline, upsert):
        if not keys:
            if not upsert:
                return None
            seed = {k: v for k, v in spec.items()
                    if not k.startswith('$') and not (isinstance(v, dict) and any(x.startswith('$') for x in v))}
            seed.setdefault('_id', ObjectId())
            new = _run_pipeline(seed, pipeline)
            new.setdefault('_id', seed['_id'])
            sdocs[doc_key(new['_id'])] = new
            return new['_id']
        for k in keys:
            new = _run_pipeline(sdocs[k], pipeline)
            if norm(new.get('_id')) != norm(sdocs[k]['_id']):
                raise CmdError(66, "After applying the update, the (immutable) field '_id' "
                                   "was found to have been altered")
            sdocs[k] = new
        return None

    def delete(self, db, name, q, limit=0, sort=None, keys=None):
        if keys is None:
            keys = self._matching(db, name, q, sort, first=bool(limit))
        if not keys:
            return None, {'n': 0}
        p = self._begin(db, name)
        docs = p.cs._documents
        for k in keys:
            p.saved.append((k, docs.pop(k)))
        p.diff()
        return p, {'n': len(keys)}


_PIPELINE_STAGES = {'$addFields', '$set', '$project', '$unset', '$replaceRoot', '$replaceWith'}


def _run_pipeline(doc, pipeline):
    """An update pipeline on one document (the stages MongoDB allows there)."""
    for stage in pipeline:
        if not isinstance(stage, dict) or len(stage) != 1 or next(iter(stage)) not in _PIPELINE_STAGES:
            raise CmdError(72, 'an update pipeline may only use $addFields, $set, $project, $unset, '
                               '$replaceRoot and $replaceWith')
    scratch = mongomock.MongoClient()['scratch']['doc']
    scratch.insert_one(copy.deepcopy(doc))
    stages = []
    for stage in pipeline:
        op, arg = next(iter(stage.items()))
        if op == '$set':
            op = '$addFields'
        elif op == '$unset':
            op, arg = '$project', {f: 0 for f in ([arg] if isinstance(arg, str) else arg)}
        elif op == '$replaceWith':
            op, arg = '$replaceRoot', {'newRoot': arg}
        stages.append({op: arg})
    out = list(scratch.aggregate(stages))
    if len(out) != 1:
        raise CmdError(2, 'the update pipeline did not produce one document')
    return out[0]
