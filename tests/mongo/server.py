#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""relaybus's MongoDB test server: the MongoDB wire protocol (OP_MSG, and the
legacy OP_QUERY handshake) over an in-memory store evaluated by mongomock, as
the primary of a one-node replica set 'rs0', with sessions, multi-document
transactions (snapshot isolation, per-document write conflicts), retryable
writes, real cursors and unique indexes.  For tests only: no auth, no TLS, no
persistence.  See README.md next to this file.

    /usr/bin/python3 tests/mongo/server.py [--port N] [--port-file F] [--pid-file F]
                                           [--txn-lifetime S] [--standalone] [--verbose]

Listens on 127.0.0.1 only (--host takes another loopback address).  --port 0
(the default) takes a free port; the port is written to --port-file once the
server listens.  SIGTERM or SIGINT stop it.
"""
import argparse
import ipaddress
import os
import signal
import socket
import sys
import threading
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.dont_write_bytecode = True

import commands  # noqa: E402
from commands import Conn, execute  # noqa: E402
from engine import Ctx, Engine  # noqa: E402
from errors import CmdError  # noqa: E402
import wire  # noqa: E402

HANDSHAKE = {'isMaster', 'ismaster', 'hello', 'ping', 'buildInfo', 'buildinfo'}
# answered without the engine's lock, as mongod answers a hello while a long
# write runs: a client's server selection (5 s in relaybus) must not wait for
# another connection's command, which here can take seconds (a batch of
# thousands of updates evaluated by mongomock)
LOCK_FREE = {'isMaster', 'ismaster', 'hello'}


def log(msg):
    sys.stderr.write('%s mongo-test-server: %s\n' % (time.strftime('%Y-%m-%dT%H:%M:%S'), msg))
    sys.stderr.flush()


class Server:
    def __init__(self, host, port, engine, verbose):
        self.engine = engine
        self.verbose = verbose
        family = socket.AF_INET6 if ':' in host else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, port))
        self.sock.listen(128)
        self.port = self.sock.getsockname()[1]
        self.me = ('[%s]:%d' if family == socket.AF_INET6 else '%s:%d') % (host, self.port)
        self.stopping = False
        self.clients = {}
        self.clients_lock = threading.Lock()
        self.next_id = 0

    def serve(self):
        while not self.stopping:
            try:
                conn, addr = self.sock.accept()
            except OSError:
                if self.stopping:
                    return
                raise
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self.clients_lock:
                self.next_id += 1
                cid = self.next_id
                self.clients[cid] = conn
            threading.Thread(target=self.connection, args=(conn, cid), daemon=True,
                             name='conn%d' % cid).start()

    def stop(self):
        self.stopping = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        with self.clients_lock:
            for conn in self.clients.values():
                try:
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def connection(self, sock, cid):
        conn = Conn(cid, self.me)
        with self.clients_lock:  # (not the engine's: a connection opens while a command runs)
            self.engine.connections += 1
            self.engine.connections_total += 1
        try:
            while True:
                header, request_id, op_code, body = wire.read_message(sock)
                if op_code == wire.OP_MSG:
                    flags, cmd = wire.parse_op_msg(header, body)
                    reply = self.run(cmd.get('$db', 'admin'), cmd, conn)
                    if flags & wire.MORE_TO_COME:
                        continue  # unacknowledged write: no answer
                    sock.sendall(self.encode(wire.op_msg, request_id, reply))
                elif op_code == wire.OP_QUERY:
                    ns, query = wire.parse_op_query(body)
                    cmd = query.get('$query', query) if isinstance(query.get('$query'), dict) else query
                    name = next(iter(cmd), '')
                    if not ns.endswith('.$cmd') or name not in HANDSHAKE:
                        reply = CmdError(352, 'Unsupported OP_QUERY command: %s. The client driver may '
                                              'require an upgrade.' % name).reply()
                    else:
                        reply = self.run(ns.split('.', 1)[0], cmd, conn)
                    sock.sendall(self.encode(wire.op_reply, request_id, reply))
                else:
                    raise wire.ProtocolError('unsupported opcode %d (compression is not offered)' % op_code)
        except EOFError:
            pass
        except wire.ProtocolError as e:
            log('connection %d: %s; closing it' % (cid, e))
        except OSError as e:
            if not self.stopping:
                log('connection %d: %s' % (cid, e))
        finally:
            with self.clients_lock:
                self.clients.pop(cid, None)
                self.engine.connections -= 1
            sock.close()

    def run(self, db, cmd, conn):
        t0 = time.monotonic()
        name = next(iter(cmd), '')
        try:
            if name in LOCK_FREE:
                with self.engine.handshakes_lock:
                    self.engine.handshakes += 1
                ctx = Ctx(self.engine, None, None, None, None)
                ctx.conn = conn
                reply = commands.hello(ctx, db, cmd, legacy=name != 'hello')
            else:
                with self.engine.lock:
                    reply = execute(self.engine, db, cmd, conn)
        except CmdError as e:
            reply = e.reply()
        except Exception as e:  # noqa: BLE001 - a bug here must not kill the connection
            log('internal error in %s: %s' % (name, traceback.format_exc()))
            reply = CmdError(1, '%s: %s' % (type(e).__name__, e)).reply()
        if self.verbose:
            log('conn%d %s.%s %.1f ms -> %s' % (conn.id, db, name, (time.monotonic() - t0) * 1000,
                                                'ok' if reply.get('ok') else 'error %s: %s'
                                                % (reply.get('code'), reply.get('errmsg'))))
        return reply

    @staticmethod
    def encode(frame, request_id, reply):
        try:
            return frame(0, request_id, reply)
        except Exception as e:  # noqa: BLE001 - e.g. a reply over 16 MiB
            log('cannot encode a reply: %s' % e)
            return frame(0, request_id, CmdError(1, 'the reply cannot be encoded: %s' % e).reply())


def main():
    ap = argparse.ArgumentParser(description='MongoDB wire-protocol test server (relaybus)')
    ap.add_argument('--host', default='127.0.0.1', help='a loopback address (default 127.0.0.1)')
    ap.add_argument('--port', type=int, default=0, help='port (default 0: a free one)')
    ap.add_argument('--port-file', help='write the port here once listening')
    ap.add_argument('--pid-file', help='write the process id here')
    ap.add_argument('--txn-lifetime', type=float, default=60.0,
                    help='seconds before an open transaction is aborted (default 60, as MongoDB)')
    ap.add_argument('--standalone', action='store_true',
                    help='answer as a standalone server, not a replica set (clients then refuse transactions)')
    ap.add_argument('--verbose', action='store_true', help='log every command')
    args = ap.parse_args()
    commands.STANDALONE = args.standalone
    try:
        if not ipaddress.ip_address(args.host).is_loopback:
            ap.error('--host %s: only loopback addresses are allowed' % args.host)
    except ValueError:
        ap.error('--host %s: not an IP address' % args.host)

    # signals are taken synchronously by the main thread (sigwait): block them
    # before any other thread exists, so that every thread inherits the mask
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    engine = Engine(lifetime=args.txn_lifetime, log=log)
    try:
        server = Server(args.host, args.port, engine, args.verbose)
    except OSError as e:
        log('cannot listen on %s:%d: %s' % (args.host, args.port, e))
        return 1
    if args.pid_file:
        with open(args.pid_file, 'w') as f:
            f.write('%d\n' % os.getpid())
    if args.port_file:
        tmp = args.port_file + '.tmp'
        with open(tmp, 'w') as f:
            f.write('%d\n' % server.port)
        os.rename(tmp, args.port_file)
    log('listening on %s (%s, pid %d)' % (server.me, 'standalone' if args.standalone else 'replica set rs0', os.getpid()))
    acceptor = threading.Thread(target=server.serve, name='accept', daemon=True)
    acceptor.start()
    sig = signal.sigwait({signal.SIGTERM, signal.SIGINT})
    log('signal %d: stopping' % sig)
    server.stop()
    acceptor.join(5)
    return 0


if __name__ == '__main__':
    sys.exit(main())
