"""Rendezvous: how the ranks of a job find each other before they communicate.

Ranks meet through a key-value store (a ``Store``): each rank writes what the
others need to know (addresses, hostnames...) under agreed keys, and waits for
the keys of the others. The store knows nothing of transports or collectives.

- ``TCPStore``: rank 0 runs a small server on a background thread and every
  rank, rank 0 included, talks to it through a client connection, as with
  torch's TCPStore. Used by ``env://`` and ``tcp://host:port``.
- ``FileStore``: the ranks share one file locked with ``flock``. Used by
  ``file:///path``, when ranks share a filesystem but cannot agree on a port.

``rendezvous()`` turns an init method and the variables a launcher sets
(collie run, torchrun, Open MPI, MPICH, PMIx, Slurm) into a store plus this
rank's place in the job (a ``Rendezvous``).

Values are bytes (str is accepted and encoded as UTF-8); keys are str. A
counter made by ``add`` is stored as decimal ASCII (b"42"), as in torch.
"""

from __future__ import annotations

import abc
import contextlib
import errno
import fcntl
import hashlib
import heapq
import ipaddress
import itertools
import logging
import os
import re
import secrets
import selectors
import socket
import struct
import threading
import time
from collections import deque
from dataclasses import dataclass
from datetime import timedelta
from typing import Iterable, Iterator, Mapping, Union
from urllib.parse import parse_qs, urlsplit

from . import pmi
from .auth import (ACCEPT_PAUSE, Handshake, Pending, QuietLog, handshake, next_pause, recv_exact,
                   token_from_env)
from .errors import AuthError, CollieError, CollieTimeout, PeerError

__all__ = [
    "DEFAULT_TIMEOUT",
    "Store",
    "TCPStore",
    "FileStore",
    "Rendezvous",
    "rendezvous",
    "store_barrier",
]

log = logging.getLogger(__name__)

#: How long rendezvous and store calls wait by default (torch's default too).
DEFAULT_TIMEOUT = timedelta(minutes=5)

Timeout = Union[timedelta, float, int]
Value = Union[bytes, bytearray, memoryview, str]


def _seconds(timeout: Timeout | None, default: float | None = None) -> float:
    """A timeout given as a timedelta or seconds, as seconds (None: default)."""
    if timeout is None:
        if default is None:
            raise ValueError("a timeout is required")
        return default
    value = timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)
    if not value >= 0:  # also rejects NaN
        raise ValueError(f"a timeout must be >= 0 seconds, got {timeout!r}")
    return min(value, 1e9)  # "forever" (inf, timedelta.max) must still fit sockets' timeouts


def timeout_seconds(timeout, where: str, default: float | None = None) -> float:
    """A user's timeout (a timedelta or seconds) as seconds; None means
    ``default`` (None: collie's 5 minutes). Every public call that takes a
    timeout comes through here before it sends anything, so a negative or
    NaN one is a ValueError naming the call (``where``) and the value. The
    rule itself is the store's (_seconds): one rule for both."""
    if default is None:
        default = DEFAULT_TIMEOUT.total_seconds()
    try:
        return _seconds(timeout, default)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None


def _key(key: str) -> bytes:
    if not isinstance(key, str):
        raise TypeError(f"store keys are str, got {type(key).__name__}")
    return key.encode()


def _keys(keys: Iterable[str] | str) -> list[bytes]:
    # A lone str would otherwise be waited on character by character.
    return [_key(keys)] if isinstance(keys, str) else [_key(k) for k in keys]


def _value(value: Value) -> bytes:
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    raise TypeError(f"store values are bytes or str, got {type(value).__name__}")


def _compare_set(data: dict[bytes, bytes], key: bytes, expected: bytes, desired: bytes) -> bytes:
    """torch's compare_set on a dict; shared by both stores so they agree."""
    current = data.get(key)
    if current == expected or (current is None and expected == b""):
        data[key] = desired
    # torch answers ``expected`` for a missing key; the value now stored (none:
    # b"") is the honest answer and still never equals a non-empty desired.
    return data.get(key, b"")


def _add(data: dict[bytes, bytes], key: bytes, amount: int) -> bytes:
    try:
        total = int(data.get(key, b"0")) + amount
    except ValueError:
        raise ValueError(f"add: key {key.decode()!r} holds {data[key][:40]!r}, "
                         "not a decimal integer") from None
    data[key] = str(total).encode()
    return data[key]


class Store(abc.ABC):
    """A key-value store shared by the ranks of a job.

    ``get`` and ``wait`` block until the keys exist, so that one rank can wait
    for what another publishes; they raise CollieTimeout after ``timeout``
    seconds (None: the store's ``timeout``). Every method may be called from
    several threads at once.
    """

    #: Default seconds for get/wait and for reaching the store.
    timeout: float

    @abc.abstractmethod
    def set(self, key: str, value: Value) -> None:
        """Store ``value`` under ``key``, replacing any previous value."""

    @abc.abstractmethod
    def get(self, key: str, timeout: Timeout | None = None) -> bytes:
        """The value of ``key``, waiting until some rank sets it."""

    @abc.abstractmethod
    def wait(self, keys: Iterable[str], timeout: Timeout | None = None) -> None:
        """Return once every key exists; CollieTimeout names the missing ones."""

    @abc.abstractmethod
    def add(self, key: str, amount: int = 1) -> int:
        """Atomically add ``amount`` to the counter ``key`` (missing: 0)."""

    @abc.abstractmethod
    def compare_set(self, key: str, expected: Value, desired: Value) -> bytes:
        """Store ``desired`` if ``key`` holds ``expected`` (or is missing and
        ``expected`` is b""); return the value now stored (b"" if none)."""

    @abc.abstractmethod
    def delete(self, key: str) -> bool:
        """Remove ``key``; True if it existed."""

    @abc.abstractmethod
    def check(self, keys: Iterable[str]) -> bool:
        """True if every key exists, without waiting."""

    @abc.abstractmethod
    def num_keys(self) -> int:
        """How many keys the store holds."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release the store's sockets, threads or files. Idempotent."""

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


# ---------------------------------------------------------------------------
# TCPStore wire format (after collie.auth.handshake), all integers big-endian:
#   request   u32 length | u8 op     | f64 seconds to wait | fields
#   response  u32 length | u8 status | fields
# where the fields are (u32 length | bytes) repeated up to the frame's end.
# A client sends one request and reads its response before the next one.

_LEN = struct.Struct("!I")
_REQ = struct.Struct("!Bd")
_RESP = struct.Struct("!B")
_SET, _GET, _WAIT, _ADD, _CSET, _DELETE, _CHECK, _NUM_KEYS = range(1, 9)
_OK, _TIMEOUT, _ERROR = range(3)


def _pack_fields(fields: Iterable[bytes]) -> bytes:
    return b"".join(_LEN.pack(len(f)) + f for f in fields)


def _unpack_fields(buf: memoryview) -> list[bytes]:
    fields, pos = [], 0
    while pos < len(buf):
        (n,) = _LEN.unpack_from(buf, pos)
        pos += _LEN.size
        if pos + n > len(buf):
            raise ValueError("a field runs past the end of its frame")
        fields.append(bytes(buf[pos:pos + n]))
        pos += n
    return fields


def _listen(host: str, port: int) -> socket.socket:
    """A listening socket for the store server.

    ``host`` is how the other ranks reach this machine (MASTER_ADDR). A
    loopback address, or "localhost", is bound as such: a single-host job is
    never exposed to the network. Any other address is bound directly, or on
    all interfaces if this machine does not own it (NAT, or a hostname that
    resolves to loopback here, as Debian maps it to 127.0.1.1, but not on the
    other hosts).
    """
    if host == "localhost":
        candidates = [(socket.AF_INET, "127.0.0.1")]
    else:
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except socket.gaierror:
            infos = []
        candidates = [(fam, sa[0]) for fam, _, _, _, sa in infos
                      if fam in (socket.AF_INET, socket.AF_INET6)][:1]
        loopback = bool(candidates) and ipaddress.ip_address(candidates[0][1].split("%")[0]).is_loopback
        if loopback and not _is_ip(host):
            candidates, loopback = [], False
        if not loopback:
            candidates.append((socket.AF_INET, "0.0.0.0"))
    error: OSError | None = None
    for family, address in candidates:
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((address, port))
            sock.listen(socket.SOMAXCONN)
            sock.setblocking(False)
            return sock
        except OSError as exc:
            sock.close()
            error = exc
            if exc.errno == errno.EADDRINUSE:
                raise CollieError(f"cannot start the store server on {host}:{port}: port {port} is "
                                  "in use (another job on the same MASTER_PORT?)") from exc
    raise CollieError(f"cannot start the store server on {host}:{port}: {error}") from error


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host.split("%")[0])
    except ValueError:
        return False
    return True


class _Parked:
    """A get/wait whose keys are not all there yet."""

    __slots__ = ("conn", "op", "keys", "deadline", "done")

    def __init__(self, conn: _Conn, op: int, keys: list[bytes], deadline: float):
        self.conn, self.op, self.keys, self.deadline = conn, op, keys, deadline
        self.done = False


class _Conn:
    """One client; ``shake`` is its handshake, None once it is admitted."""

    __slots__ = ("sock", "peer", "shake", "inbuf", "outbuf", "events", "parked", "closed")

    def __init__(self, sock: socket.socket, peer: str, shake: Handshake):
        self.sock = sock
        self.peer = peer
        self.shake: Handshake | None = shake
        self.inbuf = bytearray()
        self.outbuf = bytearray()
        self.events = selectors.EVENT_READ
        self.parked: _Parked | None = None
        self.closed = False


#: The largest request the store takes, in bytes: $COLLIE_STORE_MAX_FRAME, else
#: this. The store only carries setup values (addresses, small tables).
MAX_FRAME = 64 << 20


def _max_frame() -> int:
    """MAX_FRAME, or $COLLIE_STORE_MAX_FRAME; ValueError if that is not usable."""
    raw = os.environ.get("COLLIE_STORE_MAX_FRAME", "").strip()
    if not raw:
        return MAX_FRAME
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"COLLIE_STORE_MAX_FRAME={raw!r} is not a number of bytes") from None
    if value < 4096:
        raise ValueError(f"COLLIE_STORE_MAX_FRAME={value} is too small for the store's own "
                         "setup values: give at least 4096 bytes")
    return value


class _Server:
    """The TCPStore server: one thread and one selector serve every client.

    Each client's requests are answered in order. A get/wait whose keys are
    missing is parked (other clients are served) until a set creates the keys
    or its deadline passes.

    What a stranger can cost it is bounded. A new connection runs the
    handshake in this same loop (collie.auth.Handshake), held in a
    collie.auth.Pending: a few seconds to finish, a bounded number held, the
    oldest closed first. Only the handshake's fixed-size messages are read
    from it; no request is read before it is admitted. An admitted client
    sends one request and reads the answer before the next (TCPStore does),
    so a request may declare at most ``max_frame`` bytes, and a client that
    declares more, or sends while it is owed an answer, is dropped before its
    bytes are buffered. Out of file descriptors, the server first closes the
    oldest connection still in the handshake; with none left to close it
    stops watching the listener until a connection closes or for a while
    (0.1 s, doubling up to 1 s), instead of spinning on accept, and says so
    once a minute at most. Each dropped connection costs at most one line in
    the log (collie.auth.QuietLog).
    """

    def __init__(self, host: str, port: int, token: bytes | None, max_frame: int):
        self._listener = _listen(host, port)
        bound = self._listener.getsockname()[0]
        self.port: int = self._listener.getsockname()[1]
        #: Where a client on this machine reaches the server.
        self.connect_host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(bound, bound)
        self._token = token
        self._max_frame = max_frame
        self._pending: Pending[_Conn] = Pending()
        self._log_drop = QuietLog(log)
        self._log_no_fds = QuietLog(log, interval=60.0)
        self._accept_pause = 0.0  # 0: accepting; else seconds of the current pause
        self._accept_resumes: float | None = None  # when a paused listener is watched again
        self._data: dict[bytes, bytes] = {}
        self._waiters: dict[bytes, list[_Parked]] = {}
        self._deadlines: list[tuple[float, int, _Parked]] = []
        self._tie = itertools.count()
        self._conns: set[_Conn] = set()
        self._runnable: deque[_Conn] = deque()
        # Shared with close(), on another thread: guarded by _cond.
        self._cond = threading.Condition()
        self._nclients = 0  # admitted clients
        self._stopping = False
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._listener, selectors.EVENT_READ, "accept")
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._thread = threading.Thread(target=self._run, name=f"collie-store:{self.port}", daemon=True)
        self._thread.start()

    # -- called from other threads -------------------------------------------------

    def close(self, linger: float = 0.0) -> None:
        """Stop serving and close every socket; first wait up to ``linger``
        seconds for the clients to disconnect (so that ranks still reading
        their last answer get it)."""
        with self._cond:
            if linger > 0:
                self._cond.wait_for(lambda: self._nclients == 0 or self._stopping, timeout=linger)
            self._stopping = True
            self._wake()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=10)

    def _wake(self) -> None:
        # Called with _cond held, so that _shutdown cannot close the socket
        # (and the OS reuse its descriptor) in the middle of the send.
        try:
            self._wake_w.send(b"\0")
        except OSError:  # a wake-up is already pending, or the server stopped
            pass

    # -- the server thread -----------------------------------------------------------

    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    if self._stopping:
                        break
                for key, events in self._sel.select(self._next_timeout()):
                    if key.data == "accept":
                        self._accept()
                    elif key.data == "wake":
                        with contextlib.suppress(OSError):
                            while self._wake_r.recv(4096):
                                pass
                    else:
                        conn = key.data
                        if events & selectors.EVENT_WRITE:
                            self._flush(conn)
                        if events & selectors.EVENT_READ:
                            self._read(conn)
                self._expire()
                while self._runnable:
                    self._process(self._runnable.popleft())
        except Exception:
            log.exception("collie store on port %d stopped on an unexpected error", self.port)
        finally:
            self._shutdown()

    def _shutdown(self) -> None:
        for conn in list(self._conns):
            conn.closed = True
            conn.sock.close()
        self._conns.clear()
        self._sel.close()
        self._listener.close()
        with self._cond:
            self._stopping = True
            self._nclients = 0
            self._cond.notify_all()
            self._wake_r.close()
            self._wake_w.close()

    def _next_timeout(self) -> float | None:
        if self._runnable:
            return 0
        while self._deadlines and self._deadlines[0][2].done:
            heapq.heappop(self._deadlines)
        times = [t for t in (self._deadlines[0][0] if self._deadlines else None,
                             self._pending.next_deadline(), self._accept_resumes) if t is not None]
        return max(0.0, min(times) - time.monotonic()) if times else None

    def _accept(self) -> None:
        for sock, addr in self._pending.accept(self._listener, self._make_room, self._pause_accepting):
            self._accept_pause = 0.0
            sock.setblocking(False)
            peer = f"{addr[0]}:{addr[1]}"
            conn = _Conn(sock, peer, Handshake(self._token, server=True, what=f"client {peer}"))
            self._conns.add(conn)
            self._sel.register(sock, selectors.EVENT_READ, conn)
            for old in self._pending.add(conn, addr[0]):
                self._refuse(old, f"client {old.peer} was still in the handshake when newer "
                                  f"connections came (at most {self._pending.limit} are kept, "
                                  f"{self._pending.per_source} from one address): closed, oldest first")
            self._shake(conn)  # its hello may be here already

    def _make_room(self, oldest: _Conn, exc: OSError) -> None:
        self._refuse(oldest, f"client {oldest.peer}, still in the handshake, closed to "
                             f"free a file descriptor ({exc.strerror})")

    def _pause_accepting(self, exc: OSError) -> None:
        """Stop watching the listener for a while: it would be ready again
        at once, and the loop would spin on the same error."""
        self._log_no_fds(f"collie store on port {self.port} cannot accept connections ({exc}): "
                         f"trying again every {ACCEPT_PAUSE[0]:g} to {ACCEPT_PAUSE[1]:g} s until it can")
        self._accept_pause = next_pause(self._accept_pause)
        self._sel.unregister(self._listener)
        self._accept_resumes = time.monotonic() + self._accept_pause

    def _shake(self, conn: _Conn) -> None:
        """Take the handshake of ``conn`` as far as what has arrived allows;
        admit or refuse the client at its end. Reads no more than the next
        message of the handshake."""
        shake = conn.shake
        while True:
            out = shake.take()
            if out:
                conn.outbuf += out
                self._flush(conn)
                if conn.closed:
                    return
            if shake.refused is not None:
                self._refuse(conn, str(shake.refused))
                return
            if not shake.need:
                self._pending.discard(conn)
                conn.shake = None
                conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                with self._cond:
                    self._nclients += 1
                return
            try:
                data = conn.sock.recv(shake.need - len(conn.inbuf))
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                data = b""
            if not data:  # it hung up (a port scanner, a client pushed out...): nothing to say
                self._drop(conn)
                return
            conn.inbuf += data
            if len(conn.inbuf) == shake.need:
                shake.feed(bytes(conn.inbuf))
                conn.inbuf.clear()
                if shake.proven:  # it can no longer be pushed out: it may believe it is in
                    self._pending.discard(conn)

    def _refuse(self, conn: _Conn, why: str) -> None:
        self._log_drop(f"collie store on port {self.port} dropped a connection: {why}")
        self._drop(conn)

    def _drop(self, conn: _Conn) -> None:
        if conn.closed:
            return
        conn.closed = True
        if conn.parked is not None:
            conn.parked.done = True
            conn.parked = None
        self._conns.discard(conn)
        self._sel.unregister(conn.sock)
        conn.sock.close()
        if self._accept_resumes is not None:
            self._accept_resumes = 0.0  # paused for want of a descriptor: one is free now
        if conn.shake is not None:
            self._pending.discard(conn)
            return
        with self._cond:
            self._nclients -= 1
            self._cond.notify_all()

    def _read(self, conn: _Conn) -> None:
        if conn.closed:
            return
        if conn.shake is not None:
            self._shake(conn)
            return
        try:
            data = conn.sock.recv(1 << 16)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._drop(conn)
            return
        if conn.parked is not None or conn.outbuf:
            self._refuse(conn, f"client {conn.peer} sent a request before reading the answer to its "
                               "last one (not a TCPStore client)")
            return
        conn.inbuf += data
        self._process(conn)

    def _flush(self, conn: _Conn) -> None:
        if conn.closed:
            return
        try:
            while conn.outbuf:
                del conn.outbuf[:conn.sock.send(conn.outbuf)]
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            self._drop(conn)
            return
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if conn.outbuf else 0)
        if events != conn.events:
            self._sel.modify(conn.sock, events, conn)
            conn.events = events

    def _reply(self, conn: _Conn, status: int, fields: Iterable[bytes] = ()) -> None:
        body = _RESP.pack(status) + _pack_fields(fields)
        conn.outbuf += _LEN.pack(len(body)) + body
        self._flush(conn)

    def _process(self, conn: _Conn) -> None:
        """Handle the complete requests buffered for ``conn``, in order."""
        while conn.parked is None and not conn.closed and len(conn.inbuf) >= _LEN.size:
            (n,) = _LEN.unpack_from(conn.inbuf)
            if n > self._max_frame:
                self._refuse(conn, f"client {conn.peer} announced a request of {n} bytes, more than "
                                   f"the {self._max_frame} a store request may have "
                                   "(COLLIE_STORE_MAX_FRAME)")
                return
            if len(conn.inbuf) < _LEN.size + n:
                return
            frame = bytes(conn.inbuf[_LEN.size:_LEN.size + n])
            del conn.inbuf[:_LEN.size + n]
            try:
                self._handle(conn, frame)
            except (struct.error, ValueError) as exc:
                self._refuse(conn, f"client {conn.peer} sent a malformed request: {exc}")

    def _handle(self, conn: _Conn, frame: bytes) -> None:
        op, wait_s = _REQ.unpack_from(frame)
        fields = _unpack_fields(memoryview(frame)[_REQ.size:])
        data = self._data
        if op == _SET:
            key, value = fields
            data[key] = value
            self._reply(conn, _OK)
            self._created(key)
        elif op in (_GET, _WAIT):
            if op == _GET and len(fields) != 1:
                raise ValueError(f"get takes one key, got {len(fields)}")
            if all(k in data for k in fields):
                self._answer(conn, op, fields)
            else:
                self._park(conn, op, fields, wait_s)
        elif op == _ADD:
            key, amount = fields
            existed = key in data
            try:
                self._reply(conn, _OK, [_add(data, key, int(amount))])
            except ValueError as exc:
                self._reply(conn, _ERROR, [str(exc).encode()])
            if not existed:
                self._created(key)
        elif op == _CSET:
            key, expected, desired = fields
            existed = key in data
            self._reply(conn, _OK, [_compare_set(data, key, expected, desired)])
            if not existed:
                self._created(key)
        elif op == _DELETE:
            (key,) = fields
            self._reply(conn, _OK, [b"1" if data.pop(key, None) is not None else b"0"])
        elif op == _CHECK:
            self._reply(conn, _OK, [b"1" if all(k in data for k in fields) else b"0"])
        elif op == _NUM_KEYS:
            self._reply(conn, _OK, [str(len(data)).encode()])
        else:
            raise ValueError(f"unknown operation {op}")

    def _answer(self, conn: _Conn, op: int, keys: list[bytes]) -> None:
        self._reply(conn, _OK, [self._data[keys[0]]] if op == _GET else [])

    def _park(self, conn: _Conn, op: int, keys: list[bytes], wait_s: float) -> None:
        parked = _Parked(conn, op, keys, time.monotonic() + max(0.0, wait_s))
        conn.parked = parked
        for key in keys:
            if key not in self._data:
                self._waiters.setdefault(key, []).append(parked)
        heapq.heappush(self._deadlines, (parked.deadline, next(self._tie), parked))

    def _unpark(self, parked: _Parked) -> None:
        parked.done = True
        parked.conn.parked = None
        self._runnable.append(parked.conn)  # its next requests, if any

    def _created(self, key: bytes) -> None:
        """Answer the parked requests that ``key`` completes."""
        for parked in self._waiters.pop(key, ()):
            if parked.done:
                continue
            missing = [k for k in parked.keys if k not in self._data]
            if missing:  # still waits; a key may have been deleted since it parked
                for k in missing:
                    waiting = self._waiters.setdefault(k, [])
                    if parked not in waiting:
                        waiting.append(parked)
                continue
            self._unpark(parked)
            self._answer(parked.conn, parked.op, parked.keys)

    def _expire(self) -> None:
        """Act on every deadline that has passed: parked requests, handshakes,
        a pause in accepting."""
        for conn in self._pending.expired():
            self._refuse(conn, f"client {conn.peer} did not finish the handshake within "
                               f"{self._pending.seconds:g} s")
        now = time.monotonic()
        if self._accept_resumes is not None and now >= self._accept_resumes:
            self._accept_resumes = None
            self._sel.register(self._listener, selectors.EVENT_READ, "accept")
        while self._deadlines and (self._deadlines[0][2].done or self._deadlines[0][0] <= now):
            parked = heapq.heappop(self._deadlines)[2]
            if parked.done:
                continue
            self._unpark(parked)
            missing = [k for k in parked.keys if k not in self._data]
            if not missing:
                self._answer(parked.conn, parked.op, parked.keys)
                continue
            for key in missing:
                waiting = self._waiters.get(key, [])
                if parked in waiting:
                    waiting.remove(parked)
                if not waiting:
                    self._waiters.pop(key, None)
            self._reply(parked.conn, _TIMEOUT, missing)


def _connect(host: str, port: int, token: bytes | None, timeout: float, where: str) -> socket.socket:
    """Connect and authenticate, retrying until ``timeout``: the server may
    start after its clients (rank 0 may be the last process to come up)."""
    deadline = time.monotonic() + timeout
    delay = 0.01
    while True:
        sock = None
        try:
            sock = socket.create_connection((host, port), timeout=max(0.05, deadline - time.monotonic()))
            handshake(sock, token, server=False, what=f"the store at {where}")
            sock.settimeout(None)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return sock
        except AuthError:
            if sock is not None:
                sock.close()
            raise
        except OSError as exc:
            if sock is not None:
                sock.close()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise CollieTimeout(f"could not reach the store at {where} within "
                                    f"{timeout:g}s: {exc}") from exc
            time.sleep(min(delay, remaining))
            delay = min(2 * delay, 0.5)


class TCPStore(Store):
    """A store served over TCP by one process (rank 0), like torch's TCPStore.

    With ``is_server=True`` this process starts the server on a daemon thread
    (``port=0`` picks a free port, see ``.port``) and connects to it like any
    other client, so every rank uses the same API. Clients retry until
    ``timeout`` if the server is not up yet. Every connection is checked with
    collie.auth.handshake (``token``, else $COLLIE_TOKEN): a client with the
    wrong token gets AuthError, and the server goes on serving the others.
    What strangers can cost the server is bounded (see _Server); a request
    may hold at most MAX_FRAME bytes (64 MiB, or $COLLIE_STORE_MAX_FRAME):
    a larger value raises ValueError.

    If the server's process dies, calls raise PeerError instead of hanging.
    The object is safe to share between threads (one request at a time), but
    not across fork(): create it in the process that uses it.

    ``world_size`` is informational (as in torch, where it lets the server
    wait for its clients; here rendezvous() runs a barrier instead).
    """

    def __init__(self, host: str, port: int, world_size: int | None = None, is_server: bool = False,
                 timeout: Timeout = DEFAULT_TIMEOUT, token: str | bytes | None = None):
        if not 0 <= port <= 65535:
            raise ValueError(f"TCPStore port must be in 0..65535, got {port}")
        if port == 0 and not is_server:
            raise ValueError("a TCPStore client needs the server's port (port=0 picks a free "
                             "port only for is_server=True)")
        self.host = host
        self.world_size = world_size
        self.is_server = is_server
        self.timeout = _seconds(timeout)
        token = token_from_env(token)
        self._max_frame = _max_frame()
        self._server = _Server(host, port, token, self._max_frame) if is_server else None
        #: The port the server listens on (the one chosen when port=0 was asked).
        self.port: int = self._server.port if self._server else port
        self._where = f"{host}:{self.port}"
        self._lock = threading.Lock()
        self._broken: str | None = None
        self._closed = False
        try:
            connect_host = self._server.connect_host if self._server else host
            self._sock = _connect(connect_host, self.port, token, self.timeout, self._where)
        except BaseException:
            if self._server:
                self._server.close()
            raise

    def __repr__(self) -> str:
        return f"TCPStore({self._where!r}, {'server' if self.is_server else 'client'})"

    def _request(self, op: int, fields: list[bytes], wait_s: float = 0.0) -> list[bytes]:
        body = _REQ.pack(op, wait_s) + _pack_fields(fields)
        if len(body) > self._max_frame:
            raise ValueError(f"a store request of {len(body)} bytes is more than the {self._max_frame} "
                             "the store takes (it carries setup values; COLLIE_STORE_MAX_FRAME "
                             "raises the bound, on every rank)")
        # The server answers a get/wait by its deadline at the latest; the
        # margin beyond it only catches a server that stopped answering.
        limit = wait_s + max(self.timeout, 1.0)
        with self._lock:
            if self._closed:
                raise CollieError(f"{self!r} is closed")
            if self._broken:
                raise PeerError(self._broken, peer=0)
            try:
                self._sock.settimeout(limit)
                self._sock.sendall(_LEN.pack(len(body)) + body)
                (n,) = _LEN.unpack(recv_exact(self._sock, _LEN.size))
                response = recv_exact(self._sock, n)
            except socket.timeout as exc:
                self._broken = f"the store at {self._where} stopped answering (nothing within {limit:g}s)"
                raise CollieTimeout(self._broken) from exc
            except OSError as exc:  # ConnectionError included
                self._broken = f"lost the connection to the store at {self._where} (rank 0 died?): {exc}"
                raise PeerError(self._broken, peer=0) from exc
        (status,) = _RESP.unpack_from(response)
        answer = _unpack_fields(memoryview(response)[_RESP.size:])
        if status == _ERROR:
            raise ValueError(answer[0].decode())
        if status == _TIMEOUT:
            missing = [k.decode() for k in answer]
            what = f"key {missing[0]!r}" if op == _GET else f"keys {missing}"
            raise CollieTimeout(f"{what} did not appear in the store at {self._where} "
                                f"within {wait_s:g}s")
        return answer

    def set(self, key: str, value: Value) -> None:
        self._request(_SET, [_key(key), _value(value)])

    def get(self, key: str, timeout: Timeout | None = None) -> bytes:
        return self._request(_GET, [_key(key)], _seconds(timeout, self.timeout))[0]

    def wait(self, keys: Iterable[str], timeout: Timeout | None = None) -> None:
        keys = _keys(keys)
        if keys:
            self._request(_WAIT, keys, _seconds(timeout, self.timeout))

    def add(self, key: str, amount: int = 1) -> int:
        return int(self._request(_ADD, [_key(key), str(int(amount)).encode()])[0])

    def compare_set(self, key: str, expected: Value, desired: Value) -> bytes:
        return self._request(_CSET, [_key(key), _value(expected), _value(desired)])[0]

    def delete(self, key: str) -> bool:
        return self._request(_DELETE, [_key(key)])[0] == b"1"

    def check(self, keys: Iterable[str]) -> bool:
        return self._request(_CHECK, _keys(keys))[0] == b"1"

    def num_keys(self) -> int:
        return int(self._request(_NUM_KEYS, [])[0])

    def close(self, linger: Timeout = 0.0) -> None:
        """Close the connection; on the server, also stop the server.

        ``linger`` (server only): first wait up to that long for the other
        clients to disconnect, so that a rank still reading the answer to its
        last request (e.g. the final barrier) is not cut off.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._sock.close()
        if self._server:
            self._server.close(_seconds(linger))


class FileStore(Store):
    """A store in one file shared by the ranks (file:// init).

    Each operation locks the file with ``flock`` and reads, and if needed
    rewrites, the whole table; get/wait poll it with a short backoff. Every
    process must open the file itself (an fd inherited through fork shares
    its lock with the parent).

    Cleanup: with ``world_size`` given, each close() is counted in the file
    and the last of the ``world_size`` ranks to close deletes it, so the path
    can be used again by the next job. Without ``world_size`` the file stays.
    A file left behind by a crashed job still holds that job's keys: delete it
    before reusing the path.
    """

    _MAGIC = b"collie-filestore-1\n"
    _CLOSED = struct.Struct("!Q")

    def __init__(self, path: str | os.PathLike[str], world_size: int | None = None,
                 timeout: Timeout = DEFAULT_TIMEOUT):
        self.path = os.path.abspath(os.fspath(path))
        self.world_size = world_size
        self.timeout = _seconds(timeout)
        self._lock = threading.Lock()  # flock does not exclude threads sharing the fd
        self._closed = False
        try:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise CollieError(f"cannot open the store file {self.path}: {exc}") from exc

    def __repr__(self) -> str:
        return f"FileStore({self.path!r})"

    @contextlib.contextmanager
    def _locked(self, exclusive: bool) -> Iterator[None]:
        with self._lock:
            if self._closed:
                raise CollieError(f"{self!r} is closed")
            fcntl.flock(self._fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            try:
                yield
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _load(self) -> tuple[int, dict[bytes, bytes]]:
        size = os.fstat(self._fd).st_size
        blob = os.pread(self._fd, size, 0)
        if not blob:
            return 0, {}
        head = len(self._MAGIC) + self._CLOSED.size
        if not blob.startswith(self._MAGIC) or len(blob) < head:
            raise CollieError(f"{self.path} is not a collie FileStore file")
        (closed,) = self._CLOSED.unpack_from(blob, len(self._MAGIC))
        fields = _unpack_fields(memoryview(blob)[head:])
        return closed, dict(zip(fields[0::2], fields[1::2]))

    def _save(self, closed: int, data: dict[bytes, bytes]) -> None:
        blob = (self._MAGIC + self._CLOSED.pack(closed)
                + _pack_fields(itertools.chain.from_iterable(data.items())))
        os.pwrite(self._fd, blob, 0)
        os.ftruncate(self._fd, len(blob))

    def _read(self) -> dict[bytes, bytes]:
        with self._locked(exclusive=False):
            return self._load()[1]

    @contextlib.contextmanager
    def _update(self) -> Iterator[dict[bytes, bytes]]:
        with self._locked(exclusive=True):
            closed, data = self._load()
            before = dict(data)
            yield data
            if data != before:
                self._save(closed, data)

    def _wait_for(self, keys: list[bytes], timeout: Timeout | None) -> dict[bytes, bytes]:
        wait_s = _seconds(timeout, self.timeout)
        deadline = time.monotonic() + wait_s
        delay = 0.001
        while True:
            data = self._read()
            missing = [k.decode() for k in keys if k not in data]
            if not missing:
                return data
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                what = f"key {missing[0]!r}" if len(keys) == 1 else f"keys {missing}"
                raise CollieTimeout(f"{what} did not appear in the store file {self.path} "
                                    f"within {wait_s:g}s")
            time.sleep(min(delay, remaining))
            delay = min(2 * delay, 0.05)

    def set(self, key: str, value: Value) -> None:
        key_b, value_b = _key(key), _value(value)
        with self._update() as data:
            data[key_b] = value_b

    def get(self, key: str, timeout: Timeout | None = None) -> bytes:
        key_b = _key(key)
        return self._wait_for([key_b], timeout)[key_b]

    def wait(self, keys: Iterable[str], timeout: Timeout | None = None) -> None:
        keys = _keys(keys)
        if keys:
            self._wait_for(keys, timeout)

    def add(self, key: str, amount: int = 1) -> int:
        key_b = _key(key)
        with self._update() as data:
            return int(_add(data, key_b, int(amount)))

    def compare_set(self, key: str, expected: Value, desired: Value) -> bytes:
        key_b, expected_b, desired_b = _key(key), _value(expected), _value(desired)
        with self._update() as data:
            return _compare_set(data, key_b, expected_b, desired_b)

    def delete(self, key: str) -> bool:
        key_b = _key(key)
        with self._update() as data:
            return data.pop(key_b, None) is not None

    def check(self, keys: Iterable[str]) -> bool:
        keys = _keys(keys)
        data = self._read()
        return all(k in data for k in keys)

    def num_keys(self) -> int:
        return len(self._read())

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                if self.world_size:
                    fcntl.flock(self._fd, fcntl.LOCK_EX)
                    closed, data = self._load()
                    if closed + 1 >= self.world_size:
                        with contextlib.suppress(FileNotFoundError):
                            os.unlink(self.path)
                    else:
                        self._save(closed + 1, data)
            finally:
                os.close(self._fd)  # also releases the lock


def store_barrier(store: Store, key: str, world_size: int, timeout: Timeout | None = None) -> None:
    """Return once ``world_size`` ranks have called this with the same key.

    Each rank adds 1 to the counter ``key``; the last one to arrive sets
    ``key + "/done"``, which the others wait for. Each key serves one barrier.
    Raises CollieTimeout saying how many ranks arrived.
    """
    arrived = store.add(key, 1)
    if arrived > world_size:
        raise CollieError(f"barrier {key!r}: {arrived} ranks arrived but world_size is "
                          f"{world_size} (was the key used for two barriers?)")
    if arrived == world_size:
        store.set(f"{key}/done", b"1")
        return
    try:
        store.wait([f"{key}/done"], timeout)
    except CollieTimeout as exc:
        wait_s = _seconds(timeout, store.timeout)
        raise CollieTimeout(f"barrier {key!r}: only {store.add(key, 0)} of {world_size} ranks "
                            f"arrived within {wait_s:g}s") from exc


# ---------------------------------------------------------------------------
# Init methods.


@dataclass(frozen=True)
class Rendezvous:
    """What rendezvous() found: the store the ranks met through, and this
    rank's place in the job. ``master_addr``/``master_port`` are None for
    file://. ``job_id`` is the same on every rank of the job and differs
    between jobs (COLLIE_JOB_ID, else derived from the store's address), for
    naming things the job creates, such as shared-memory segments."""

    store: Store
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str | None
    master_port: int | None
    job_id: str
    #: The job secret the ranks agreed on through the launcher's PMI (when
    #: none was given): every later connection proves it. None otherwise.
    token: bytes | None = None


@dataclass(frozen=True)
class _Launcher:
    """The variables one kind of launcher sets for each process it starts."""

    name: str
    rank: str
    sizes: tuple[str, ...]
    local_ranks: tuple[str, ...]
    local_sizes: tuple[str, ...]
    #: Variables identical on all ranks of one job and different between
    #: jobs, to derive MASTER_PORT from (each a tuple joined); () means none.
    job_ids: tuple[tuple[str, ...], ...]


_SLURM_LOCAL_SIZES = ("SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE")

# In order of precedence. The MPI launchers come before Slurm because mpirun
# and mpiexec start their daemons through srun inside an allocation, so the
# ranks also see SLURM_PROCID, but it counts daemons, not ranks.
_LAUNCHERS = (
    _Launcher("collie run, torchrun", "RANK", ("WORLD_SIZE",), (), (), ()),
    _Launcher("Open MPI", "OMPI_COMM_WORLD_RANK", ("OMPI_COMM_WORLD_SIZE",),
              ("OMPI_COMM_WORLD_LOCAL_RANK",), ("OMPI_COMM_WORLD_LOCAL_SIZE",),
              # PMIx namespace (Open MPI >= 4), ORTE job id (2.x-4.x, then 1.x).
              (("PMIX_NAMESPACE",), ("OMPI_MCA_ess_base_jobid",), ("OMPI_MCA_orte_ess_jobid",))),
    # MPICH's Hydra exports no job identifier at all (PMI_FD and PMI_PORT are
    # per process or per host); only the batch system's, inherited from mpiexec.
    _Launcher("MPICH, Intel MPI", "PMI_RANK", ("PMI_SIZE",), ("MPI_LOCALRANKID",), ("MPI_LOCALNRANKS",),
              (("SLURM_JOB_ID",), ("PBS_JOBID",))),
    # srun --mpi=pmix sets PMIX_RANK and PMIX_NAMESPACE but no PMIX_SIZE.
    _Launcher("PMIx", "PMIX_RANK", ("PMIX_SIZE", "SLURM_NTASKS"), ("SLURM_LOCALID",), _SLURM_LOCAL_SIZES,
              (("PMIX_NAMESPACE",),)),
    _Launcher("Slurm", "SLURM_PROCID", ("SLURM_NTASKS",), ("SLURM_LOCALID",), _SLURM_LOCAL_SIZES,
              (("SLURM_JOB_ID", "SLURM_STEP_ID"),)),
)

_SCHEMES = ("env://", "tcp://host:port", "file:///path")


def _slurm_tasks_here(value: str, environ: Mapping[str, str]) -> int:
    """This node's entry of SLURM_TASKS_PER_NODE, e.g. "4(x2),3" -> 4,4,3."""
    counts: list[int] = []
    for part in value.split(","):
        match = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if not match:
            raise ValueError(f"SLURM_TASKS_PER_NODE={value!r} is not like '4(x2),3'")
        counts += [int(match[1])] * int(match[2] or 1)
    node = environ.get("SLURM_NODEID", "0")
    return counts[int(node)] if node.isdigit() and int(node) < len(counts) else counts[0]


def _env_int(environ: Mapping[str, str], name: str) -> int | None:
    raw = environ.get(name, "").strip()
    if not raw:
        return None
    if name == "SLURM_TASKS_PER_NODE":
        return _slurm_tasks_here(raw, environ)
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not an integer") from None


def _first_int(environ: Mapping[str, str], names: Iterable[str]) -> int | None:
    for name in names:
        value = _env_int(environ, name)
        if value is not None:
            return value
    return None


@dataclass(frozen=True)
class _Placement:
    rank: int
    world_size: int
    local_rank: int | None  # None: not said by the launcher
    local_world_size: int | None
    launcher: _Launcher | None


def _as_count(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    return value


def _place(environ: Mapping[str, str], rank: int | None, world_size: int | None,
           scheme: str) -> _Placement:
    """Rank, world size and local rank/size: arguments first, then the first
    launcher (in _LAUNCHERS order) whose rank variable is set."""
    launcher = next((l for l in _LAUNCHERS if _env_int(environ, l.rank) is not None), None)
    env_rank = _env_int(environ, launcher.rank) if launcher else None
    if world_size is None:
        sizes = launcher.sizes if launcher else tuple(s for l in _LAUNCHERS for s in l.sizes)
        world_size = _first_int(environ, sizes)
    if rank is None:
        rank = env_rank if env_rank is not None else 0 if world_size == 1 else None
    if rank is None:
        raise ValueError(f"{scheme}:// needs the rank: set RANK (collie run, torchrun), "
                         "OMPI_COMM_WORLD_RANK (Open MPI), PMI_RANK (MPICH), PMIX_RANK (PMIx) "
                         "or SLURM_PROCID (Slurm), or pass rank=")
    if world_size is None:
        if launcher:
            raise ValueError(f"{scheme}:// found the rank in {launcher.rank} ({launcher.name}) but "
                             f"not the world size: set {' or '.join(launcher.sizes)}, "
                             "or pass world_size=")
        raise ValueError(f"{scheme}:// needs the world size: set WORLD_SIZE (collie run, torchrun), "
                         "OMPI_COMM_WORLD_SIZE (Open MPI), PMI_SIZE (MPICH), PMIX_SIZE (PMIx) "
                         "or SLURM_NTASKS (Slurm), or pass world_size=")
    rank, world_size = _as_count("rank", rank), _as_count("world_size", world_size)
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in 0..{world_size - 1} (world_size={world_size}), got {rank}")
    local_rank = local_size = None
    # A rank passed explicitly that the launcher disagrees with makes the
    # launcher's local numbering meaningless: then the store finds it.
    if env_rank is None or env_rank == rank:
        extra = launcher or _Launcher("", "", (), (), (), ())
        local_rank = _first_int(environ, ("LOCAL_RANK",) + extra.local_ranks)
        local_size = _first_int(environ, ("LOCAL_WORLD_SIZE",) + extra.local_sizes)
        if local_rank is not None and local_size is not None and not 0 <= local_rank < local_size:
            raise ValueError(f"the launcher says local rank {local_rank} of {local_size} "
                             "(LOCAL_RANK/LOCAL_WORLD_SIZE or the launcher's own variables)")
    return _Placement(rank, world_size, local_rank, local_size, launcher)


def _port_from(seed: str) -> int:
    return 20000 + int.from_bytes(hashlib.sha256(seed.encode()).digest()[:8], "big") % 40000


_SLURM_NODELISTS = ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")


def first_host(nodelist: str) -> str:
    """The first host of a Slurm host list: "node[07-09,12],gpu1" -> "node07"."""
    head = re.match(r"([^,\[]*)(?:\[([^\]]*)\])?([^,]*)", nodelist.strip())
    prefix, ranges, suffix = head.group(1), head.group(2), head.group(3)
    if not prefix and not ranges:
        raise ValueError(f"cannot read a host from the Slurm node list {nodelist!r}")
    first = ranges.split(",")[0].split("-")[0] if ranges else ""
    return prefix + first + suffix


def _master(environ: Mapping[str, str], place: _Placement) -> tuple[str, int]:
    """MASTER_ADDR (under Slurm, by default the first host of the step's
    node list; else 127.0.0.1) and MASTER_PORT, see rendezvous()."""
    addr = environ.get("MASTER_ADDR", "").strip()
    if not addr and place.launcher is not None and place.launcher.name in ("Slurm", "PMIx"):
        nodelist = next((environ[v] for v in _SLURM_NODELISTS if environ.get(v, "").strip()), "")
        addr = first_host(nodelist) if nodelist else ""
    addr = addr or "127.0.0.1"
    port = _env_int(environ, "MASTER_PORT")
    if port is not None:
        if not 0 <= port <= 65535 or (port == 0 and place.world_size > 1):
            raise ValueError(f"MASTER_PORT={port} is not a usable port (1..65535)")
        return addr, port
    if place.world_size == 1:
        return addr, 0  # nobody else needs to find it
    launcher = place.launcher
    if launcher is None or not launcher.job_ids:
        raise ValueError("env:// needs MASTER_PORT when world_size > 1 (the port rank 0's store "
                         "listens on; collie run and torchrun set it): set MASTER_PORT")
    sources = (("COLLIE_JOB_ID",),) + launcher.job_ids
    for names in sources:
        if environ.get(names[0]):
            return addr, _port_from("|".join(f"{n}={environ.get(n, '')}" for n in names))
    looked = ", ".join("+".join(names) for names in sources)
    raise ValueError(f"env:// needs MASTER_PORT: under {launcher.name} it is derived from a job "
                     f"identifier shared by all ranks, but none is set (looked for {looked}); "
                     "set MASTER_PORT to a free port, the same on every rank")


def _job_id(environ: Mapping[str, str], where: str) -> str:
    return environ.get("COLLIE_JOB_ID") or hashlib.sha256(where.encode()).hexdigest()[:16]


def _query_int(query: dict[str, list[str]], name: str, init_method: str) -> int | None:
    if name not in query:
        return None
    try:
        return int(query[name][-1])
    except ValueError:
        raise ValueError(f"{name}= in {init_method!r} is not an integer") from None


_RDZV = "collie/rdzv"


def rendezvous(init_method: str | None = None, rank: int | None = None, world_size: int | None = None,
               timeout: Timeout = DEFAULT_TIMEOUT, token: str | bytes | None = None) -> Rendezvous:
    """Meet the other ranks of the job; return the store and this rank's place.

    Init methods (None means "env://"):

    - ``env://``: rank 0 serves a TCPStore at MASTER_ADDR:MASTER_PORT.
    - ``tcp://host:port``: the same at the address given.
    - ``file:///path``: a FileStore at that path (a shared filesystem).

    rank and world size come from the arguments, else from the ``?rank=`` and
    ``?world_size=`` of the URL, else from the first launcher found: RANK /
    WORLD_SIZE (collie run, torchrun), OMPI_COMM_WORLD_RANK / _SIZE (Open MPI),
    PMI_RANK / PMI_SIZE (MPICH, Intel MPI), PMIX_RANK / PMIX_SIZE (PMIx),
    SLURM_PROCID / SLURM_NTASKS (Slurm). The local rank and size come from
    LOCAL_RANK / LOCAL_WORLD_SIZE, else the launcher's own variables, else
    from the hostnames the ranks publish in the store.

    MASTER_ADDR defaults, under Slurm, to the first host of the node list
    (SLURM_STEP_NODELIST, SLURM_JOB_NODELIST), else to 127.0.0.1; the
    Slurm task with rank 0 is on that host. MASTER_PORT is required when
    world_size > 1, except under Open MPI, MPICH, PMIx or Slurm: then, if it
    is missing, every rank derives the same port, hashed into 20000..59999,
    from a job identifier all ranks share: COLLIE_JOB_ID, else PMIX_NAMESPACE
    or OMPI_MCA_ess_base_jobid (Open MPI), SLURM_JOB_ID + SLURM_STEP_ID
    (srun), SLURM_JOB_ID or PBS_JOBID inherited by MPICH's mpiexec (Hydra
    exports no job identifier of its own). Two jobs of one allocation running
    at once can then collide: set MASTER_PORT for those. Under MPICH's
    mpiexec and srun --mpi=pmi2 (PMI_FD or PMI_PORT set) without
    MASTER_PORT, the ranks meet through the launcher's PMI instead: rank 0
    serves on a free port and publishes its address, and a fresh token
    unless one is given, in the job's PMI key-value space (collie/pmi.py);
    the token is then the Rendezvous's ``token``.

    Before returning, every rank has joined (a store barrier), so a missing
    rank shows up here as CollieTimeout. Bad arguments raise ValueError
    before anything connects. The caller owns ``store`` and closes it; rank 0
    should close last (``TCPStore.close(linger=...)``), since it serves it.

    Args:
        init_method: "env://" (default), "tcp://host:port" or "file:///path".
        rank, world_size: override the launcher's variables.
        timeout: how long to wait for the store and the other ranks
            (timedelta or seconds); also the store's default timeout.
        token: the shared secret checked on every TCPStore connection (else
            $COLLIE_TOKEN; unused by file://).

    Returns:
        A Rendezvous; its store is connected and every rank has joined.
    """
    init_method = init_method or "env://"
    url = urlsplit(init_method)
    scheme = url.scheme
    if scheme not in ("env", "tcp", "file") or not init_method.startswith(f"{scheme}://"):
        raise ValueError(f"unsupported init_method {init_method!r}: use one of {', '.join(_SCHEMES)}")
    seconds = _seconds(timeout)
    query = parse_qs(url.query)
    if rank is None:
        rank = _query_int(query, "rank", init_method)
    if world_size is None:
        world_size = _query_int(query, "world_size", init_method)
    environ = os.environ
    place = _place(environ, rank, world_size, scheme)

    store: Store
    if scheme == "file":
        if url.netloc not in ("", "localhost") or not url.path:
            raise ValueError(f"file:// init wants an absolute path, like file:///tmp/job, "
                             f"got {init_method!r}")
        addr, port = None, None
        store = FileStore(url.path, place.world_size, seconds)
        where = f"file:{store.path}"
    else:
        if scheme == "env" and _use_pmi(environ, place):
            store, addr, token = _pmi_store(environ, place, seconds, token_from_env(token))
            port = None  # marks the store as made
        elif scheme == "env":
            addr, port = _master(environ, place)
        else:
            try:
                addr, port = url.hostname, url.port
            except ValueError as exc:
                raise ValueError(f"bad port in {init_method!r}: {exc}") from None
            if not addr or not port:
                raise ValueError(f"tcp:// init wants host:port, like tcp://10.0.0.1:29500, "
                                 f"got {init_method!r}")
        if port is not None:  # not met through PMI
            store = TCPStore(addr, port, place.world_size, is_server=place.rank == 0,
                             timeout=seconds, token=token)
        port = store.port
        where = f"{addr}:{port}"
    try:
        hostname = socket.gethostname()
        store.set(f"{_RDZV}/host/{place.rank}", hostname)
        try:
            store_barrier(store, f"{_RDZV}/joined", place.world_size, seconds)
        except CollieTimeout as exc:
            raise CollieTimeout(f"rank {place.rank}: rendezvous through {init_method}: {exc}") from exc
        local_rank, local_size = place.local_rank, place.local_world_size
        if local_rank is None or local_size is None:
            hosts = [store.get(f"{_RDZV}/host/{r}").decode() for r in range(place.world_size)]
            local_rank = hosts[:place.rank].count(hostname)
            local_size = hosts.count(hostname)
    except BaseException:
        store.close()
        raise
    return Rendezvous(store, place.rank, place.world_size, local_rank, local_size,
                      addr, port, _job_id(environ, where), token_from_env(token))


def meets_through_pmi(init_method: str | None, environ: Mapping[str, str] = os.environ) -> bool:
    """Whether rendezvous(init_method) will meet through the launcher's PMI
    (and so agree on a job secret there, if none is given)."""
    if (init_method or "env://") != "env://":
        return False
    try:
        place = _place(environ, None, None, "env")
    except ValueError:
        return False
    return _use_pmi(environ, place)


def _use_pmi(environ: Mapping[str, str], place: _Placement) -> bool:
    """Meet through the launcher's PMI: under mpiexec (Hydra) or srun
    --mpi=pmi2 when MASTER_PORT is not set (it still wins when it is)."""
    return (place.world_size > 1 and not environ.get("MASTER_PORT", "").strip()
            and place.launcher is not None and place.launcher.rank == "PMI_RANK" and pmi.available(environ))


def _pmi_store(environ: Mapping[str, str], place: _Placement, seconds: float,
               token: bytes | None) -> tuple[TCPStore, str, bytes]:
    """Rank 0 serves the store on a free port and publishes its address and,
    unless COLLIE_TOKEN gave one, a fresh job secret in the launcher's
    key-value space, which only the job's processes can read; the others
    read both after a fence. Returns the store, its host and the token."""
    client = pmi.connect(seconds, environ)
    try:
        store = None
        if place.rank == 0:
            addr = environ.get("MASTER_ADDR", "").strip()
            if not addr:
                local = _first_int(environ, ("LOCAL_WORLD_SIZE",) + place.launcher.local_sizes)
                addr = "127.0.0.1" if local == place.world_size else socket.gethostname()
            published = token is None
            token = token or secrets.token_hex(32).encode()
            store = TCPStore(addr, 0, place.world_size, is_server=True, timeout=seconds, token=token)
            client.put("collie-store", f"{addr}:{store.port}")
            if published:
                client.put("collie-token", token.decode())
        try:
            client.fence()
            if store is None:
                addr, _, port = client.get("collie-store").rpartition(":")
                if token is None:
                    token = client.get("collie-token").encode()
                store = TCPStore(addr, int(port), place.world_size, timeout=seconds, token=token)
        except BaseException:
            if store is not None:
                store.close()
            raise
    finally:
        client.close()
    return store, addr, token
