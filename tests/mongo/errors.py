# SPDX-License-Identifier: MIT
"""Server error codes (as MongoDB numbers and names them) and the error type."""

CODE_NAMES = {
    1: 'InternalError',
    2: 'BadValue',
    9: 'FailedToParse',
    13: 'Unauthorized',
    14: 'TypeMismatch',
    20: 'IllegalOperation',
    26: 'NamespaceNotFound',
    27: 'IndexNotFound',
    43: 'CursorNotFound',
    48: 'NamespaceExists',
    50: 'MaxTimeMSExpired',
    59: 'CommandNotFound',
    66: 'ImmutableField',
    67: 'CannotCreateIndex',
    72: 'InvalidOptions',
    73: 'InvalidNamespace',
    85: 'IndexOptionsConflict',
    86: 'IndexKeySpecsConflict',
    112: 'WriteConflict',
    115: 'CommandNotSupported',
    117: 'ConflictingOperationInProgress',
    197: 'InvalidIndexSpecificationOption',
    225: 'TransactionTooOld',
    238: 'NotImplemented',
    251: 'NoSuchTransaction',
    256: 'TransactionCommitted',
    263: 'OperationNotSupportedInTransaction',
    352: 'UnsupportedOpQueryCommand',
    11000: 'DuplicateKey',
    40323: 'Location40323',
}

TRANSIENT = 'TransientTransactionError'


class CmdError(Exception):
    """A command failure: becomes {ok: 0, errmsg, code, codeName[, errorLabels]}."""

    def __init__(self, code, msg, labels=None, extra=None):
        super().__init__(msg)
        self.code = code
        self.labels = list(labels or [])
        self.extra = dict(extra or {})

    @property
    def code_name(self):
        return CODE_NAMES.get(self.code, 'UnknownError')

    def reply(self):
        doc = {'ok': 0.0, 'errmsg': str(self), 'code': self.code, 'codeName': self.code_name}
        doc.update(self.extra)
        if self.labels:
            doc['errorLabels'] = self.labels
        return doc

    def write_error(self, index):
        """The same failure as a writeErrors entry of statement `index`."""
        doc = {'index': index, 'code': self.code}
        doc.update(self.extra)
        doc['errmsg'] = str(self)
        return doc


def write_conflict():
    return CmdError(112, 'WriteConflict error: this operation conflicted with another operation. '
                         'Please retry your operation or multi-document transaction.',
                    labels=[TRANSIENT])


def no_such_transaction(msg):
    return CmdError(251, msg, labels=[TRANSIENT])


class MustWait(Exception):
    """A write outside a transaction met a document (or a collection) that an open
    transaction holds: MongoDB makes such a write wait for the transaction to end."""

    def __init__(self, txn):
        super().__init__('waits for a transaction')
        self.txn = txn
