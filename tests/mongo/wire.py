# SPDX-License-Identifier: MIT
"""MongoDB wire protocol framing: OP_MSG (and the legacy OP_QUERY/OP_REPLY pair
that drivers still use for the first handshake).

Message header (all little-endian int32): messageLength, requestID, responseTo,
opCode.  OP_MSG body: uint32 flagBits, then sections (kind 0: one BSON body
document; kind 1: int32 size, cstring identifier, BSON documents), then an
optional CRC-32C of everything before it when flagBits bit 0 (checksumPresent)
is set.  Bits 0-15 of flagBits are "required": an unknown one is an error.
"""
import struct

import bson
from bson.binary import UuidRepresentation
from bson.codec_options import CodecOptions

OP_REPLY = 1
OP_QUERY = 2004
OP_COMPRESSED = 2012
OP_MSG = 2013

CHECKSUM_PRESENT = 1 << 0
MORE_TO_COME = 1 << 1
EXHAUST_ALLOWED = 1 << 16
KNOWN_REQUIRED_FLAGS = CHECKSUM_PRESENT | MORE_TO_COME

MAX_BSON_SIZE = 16 * 1024 * 1024
MAX_MESSAGE_SIZE = 48000000

# Binary values come back exactly as they came in (subtype kept), int64 stays Int64.
CODEC = CodecOptions(document_class=dict, tz_aware=False,
                     uuid_representation=UuidRepresentation.UNSPECIFIED)

_HEADER = struct.Struct('<iiii')


class ProtocolError(Exception):
    """A malformed message: the connection is closed after it is logged."""


def _crc32c_table():
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_CRC_TABLE = _crc32c_table()


def crc32c(data):
    crc = 0xFFFFFFFF
    table = _CRC_TABLE
    for b in data:
        crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _recv_exact(sock, n):
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            if buf:
                raise ProtocolError('connection closed in the middle of a message')
            raise EOFError
        buf += chunk
    return bytes(buf)


def read_message(sock):
    """One message: (header bytes, request_id, op_code, body). EOFError at a clean end."""
    header = _recv_exact(sock, 16)
    length, request_id, _response_to, op_code = _HEADER.unpack(header)
    if length < 16 or length > MAX_MESSAGE_SIZE:
        raise ProtocolError('message length %d out of range' % length)
    body = _recv_exact(sock, length - 16) if length > 16 else b''
    return header, request_id, op_code, body


def _cstring(buf, pos):
    end = buf.find(b'\x00', pos)
    if end < 0:
        raise ProtocolError('unterminated cstring')
    return buf[pos:end].decode('utf-8'), end + 1


def _doc_at(buf, pos, limit):
    if pos + 4 > limit:
        raise ProtocolError('truncated BSON document')
    size = struct.unpack_from('<i', buf, pos)[0]
    if size < 5 or pos + size > limit:
        raise ProtocolError('BSON document size %d out of range' % size)
    return bson.decode(buf[pos:pos + size], CODEC), pos + size


def parse_op_msg(header, body):
    """(flags, command document); kind-1 sequences become array fields of the body."""
    if len(body) < 5:
        raise ProtocolError('OP_MSG too short')
    flags = struct.unpack_from('<I', body, 0)[0]
    unknown = flags & 0xFFFF & ~KNOWN_REQUIRED_FLAGS
    if unknown:
        raise ProtocolError('unknown required OP_MSG flag bits 0x%x' % unknown)
    end = len(body)
    if flags & CHECKSUM_PRESENT:
        if end < 9:
            raise ProtocolError('OP_MSG too short for its checksum')
        end -= 4
        want = struct.unpack_from('<I', body, end)[0]
        if crc32c(header + body[:end]) != want:
            raise ProtocolError('OP_MSG checksum mismatch')
    pos, doc, sequences = 4, None, {}
    while pos < end:
        kind = body[pos]
        pos += 1
        if kind == 0:
            if doc is not None:
                raise ProtocolError('OP_MSG with more than one body section')
            doc, pos = _doc_at(body, pos, end)
        elif kind == 1:
            if pos + 4 > end:
                raise ProtocolError('truncated document sequence')
            size = struct.unpack_from('<i', body, pos)[0]
            stop = pos + size
            if size < 5 or stop > end:
                raise ProtocolError('document sequence size %d out of range' % size)
            ident, p = _cstring(body, pos + 4)
            if ident in sequences:
                raise ProtocolError('duplicate document sequence %r' % ident)
            docs = []
            while p < stop:
                d, p = _doc_at(body, p, stop)
                docs.append(d)
            sequences[ident] = docs
            pos = stop
        else:
            raise ProtocolError('unknown OP_MSG section kind %d' % kind)
    if doc is None:
        raise ProtocolError('OP_MSG without a body section')
    for ident, docs in sequences.items():
        if ident in doc:
            raise ProtocolError('document sequence %r duplicates a body field' % ident)
        doc[ident] = docs
    return flags, doc


def parse_op_query(body):
    """(full collection name, query document) of a legacy OP_QUERY."""
    if len(body) < 4:
        raise ProtocolError('OP_QUERY too short')
    name, pos = _cstring(body, 4)
    pos += 8  # numberToSkip, numberToReturn
    doc, _ = _doc_at(body, pos, len(body))
    return name, doc


def encode_doc(doc):
    return bson.encode(doc, codec_options=CODEC)


def op_msg(request_id, response_to, doc):
    payload = struct.pack('<IB', 0, 0) + encode_doc(doc)
    return _HEADER.pack(16 + len(payload), request_id, response_to, OP_MSG) + payload


def op_reply(request_id, response_to, doc):
    payload = struct.pack('<iqii', 0, 0, 0, 1) + encode_doc(doc)
    return _HEADER.pack(16 + len(payload), request_id, response_to, OP_REPLY) + payload
