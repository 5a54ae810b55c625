"""The handshake every collie connection starts with, and what a listener
lets a connection cost before it has finished it.

The handshake. Both ends send a magic string, whether they hold a token, and
a fresh random nonce (the client first; the server answers once it has read
the client's). With a token (COLLIE_TOKEN or token=), each end then proves it
knows it by sending HMAC-SHA256(token, role + peer's nonce + own nonce), and
tells the other whether the other's proof was right. The token itself never
crosses the wire, and a recorded exchange cannot be replayed (the nonces
differ each time). Without a token on either end, only the magic is checked,
which still turns a stray connection (a port scanner, a wrong port) into a
clear error.

It is written once, as a state machine that does no I/O (``Handshake``):
``handshake()`` runs it on a blocking socket, and a listener (the store
server, a rank's TCP setup listener) runs many at once in its poll loop, so
that a connection that sends nothing delays nobody. Each step reads exactly
the fixed-size message it expects (25, 32, then 1 byte), so a listener never
buffers more than that for a connection that has not proved itself.

Strangers. A listener keeps the connections still in the handshake in a
``Pending``: each gets ``HANDSHAKE_SECONDS`` to finish, and at most
``MAX_PENDING_PER_SOURCE`` of them from one address and ``MAX_PENDING`` in
all are kept. When a new connection would pass a bound, the oldest one of
its address (else the oldest of all) is closed, rather than the newcomer
refused: on one host every rank and every attacker share 127.0.0.1, so
refusing newcomers would let a few idle connections lock the real ranks out,
while a real rank finishes the handshake in about a millisecond, long before
a flood can push it out, and retries if it is pushed out anyway (a closed
connection is not a refusal). The server only counts a connection as
finished once the client has proved itself (or once the hellos matched, with
no token), and the client finishes after the server: so closing a pending
connection never cuts off a client that believes it is in. Out of file
descriptors, a listener closes the oldest connection still in the handshake,
and with none left stops accepting for a while (ACCEPT_PAUSE) instead of
spinning on accept().

``QuietLog`` says why connections were dropped, and that a listener ran out
of file descriptors, without letting a flood of them flood the log.
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import logging
import os
import socket
import time
from collections import Counter
from typing import Callable, Generic, Hashable, Iterator, Optional, TypeVar

from .errors import AuthError

MAGIC = b"COLLIE\x00\x01"
_NONCE = 16
HELLO_SIZE = len(MAGIC) + 1 + _NONCE
_PROOF_SIZE = 32  # SHA-256

#: Seconds a connection may take to finish the handshake on a listener.
HANDSHAKE_SECONDS = 5.0
#: Connections still in the handshake that a listener keeps, in all and
#: from one address (see the module docstring for why the oldest go first).
MAX_PENDING = 64
MAX_PENDING_PER_SOURCE = 32
#: accept() errors that mean "out of file descriptors (or memory)": the
#: listener would be ready again at once, so it pauses instead, for the first
#: of ACCEPT_PAUSE seconds, doubling up to the second while it lasts.
OUT_OF_FDS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
ACCEPT_PAUSE = (0.1, 1.0)


def next_pause(pause: float) -> float:
    """The next of the ACCEPT_PAUSE pauses after ``pause`` (0: none yet)."""
    return min(max(2 * pause, ACCEPT_PAUSE[0]), ACCEPT_PAUSE[1])


def token_from_env(token: str | bytes | None = None) -> bytes | None:
    """The token given, else $COLLIE_TOKEN, else None (no authentication)."""
    if token is None:
        token = os.environ.get("COLLIE_TOKEN") or None
    if isinstance(token, str):
        token = token.encode()
    return token or None


def recv_exact(sock: socket.socket, n: int) -> bytes:
    """Read exactly n bytes or raise ConnectionError on end of stream."""
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            raise ConnectionError("connection closed during the handshake")
        got += k
    return bytes(buf)


def _proof(token: bytes, role: bytes, first: bytes, second: bytes) -> bytes:
    return hmac.new(token, role + first + second, hashlib.sha256).digest()


class Handshake:
    """One end of the handshake, as a state machine that does no I/O.

    The driver sends what ``take()`` returns, reads exactly ``need`` bytes
    and passes them to ``feed()``, and so on until ``need`` is 0. Then the
    handshake succeeded, unless ``refused`` holds the AuthError that ended
    it: the driver raises it (or drops the connection) only after sending
    what ``take()`` returns, because some refusals must reach the peer first
    (a server answers a client without a token before refusing it, so that
    the client says why too). ``proven`` turns true once the peer has proved
    itself: its proof checked, or, without a token, its hello.

    ``what`` names the peer in error messages ("store at host:port", "rank 3"...).
    """

    def __init__(self, token: bytes | None, *, server: bool, what: str):
        self.token = token
        self.server = server
        self.what = what
        self.need = HELLO_SIZE
        self.proven = False
        self.refused: Optional[AuthError] = None
        self._nonce = os.urandom(_NONCE)
        self._peer_nonce = b""
        self._outgoing = b"" if server else self._hello()
        self._step: Callable[[bytes], None] = self._on_hello

    def take(self) -> bytes:
        """What to send to the peer now (often nothing)."""
        out, self._outgoing = self._outgoing, b""
        return out

    def feed(self, data: bytes) -> None:
        """Take the ``need`` bytes the peer sent next."""
        if len(data) != self.need:
            raise ValueError(f"the handshake wanted {self.need} bytes, got {len(data)}")
        self._step(data)

    def _hello(self) -> bytes:
        return MAGIC + (b"\x01" if self.token else b"\x00") + self._nonce

    def _refuse(self, message: str) -> None:
        self.refused = AuthError(message)
        self.need = 0

    def _on_hello(self, hello: bytes) -> None:
        if hello[:len(MAGIC)] != MAGIC:
            return self._refuse(f"{self.what} is not a collie peer (bad handshake magic)")
        if self.server:
            self._outgoing += self._hello()
        peer_has_token = hello[len(MAGIC)] == 1
        self._peer_nonce = hello[len(MAGIC) + 1:]
        if bool(self.token) != peer_has_token:
            if self.token:
                return self._refuse(f"{self.what} has no token but this process requires one "
                                    "(set the same COLLIE_TOKEN on every rank)")
            return self._refuse(f"{self.what} requires a token and this process has none "
                                "(set the same COLLIE_TOKEN on every rank)")
        if not self.token:
            self.proven = True
            self.need = 0
            return
        mine = b"S" if self.server else b"C"
        self._outgoing += _proof(self.token, mine, self._peer_nonce, self._nonce)
        self.need, self._step = _PROOF_SIZE, self._on_proof

    def _on_proof(self, proof: bytes) -> None:
        theirs = b"C" if self.server else b"S"
        self.proven = hmac.compare_digest(proof, _proof(self.token, theirs, self._nonce, self._peer_nonce))
        self._outgoing += b"\x01" if self.proven else b"\x00"
        self.need, self._step = 1, self._on_verdict

    def _on_verdict(self, verdict: bytes) -> None:
        self.need = 0
        if not self.proven:
            self._refuse(f"{self.what} did not prove it knows the token: refused "
                         "(COLLIE_TOKEN differs between ranks?)")
        elif verdict != b"\x01":
            self._refuse(f"{self.what} refused this process's token (COLLIE_TOKEN differs between ranks?)")


def handshake(sock: socket.socket, token: bytes | None, *, server: bool, what: str) -> None:
    """Run the handshake on a connected blocking socket; raise AuthError when
    the other end is refused or refuses us, ConnectionError when it hangs up
    (not a refusal: callers may retry)."""
    shake = Handshake(token, server=server, what=what)
    while True:
        out = shake.take()
        if out:
            sock.sendall(out)
        if shake.refused is not None:
            raise shake.refused
        if not shake.need:
            return
        shake.feed(recv_exact(sock, shake.need))


C = TypeVar("C", bound=Hashable)


class Pending(Generic[C]):
    """The connections a listener holds that are still in the handshake,
    oldest first, with their deadlines; bounded as the module docstring says."""

    def __init__(self, seconds: float | None = None, limit: int | None = None,
                 per_source: int | None = None):
        # Read at construction, not import, so that tests can lower them.
        self.seconds = HANDSHAKE_SECONDS if seconds is None else seconds
        self.limit = MAX_PENDING if limit is None else limit
        self.per_source = MAX_PENDING_PER_SOURCE if per_source is None else per_source
        self._conns: dict[C, tuple[str, float]] = {}  # conn -> (source, deadline), oldest first
        self._sources: Counter[str] = Counter()

    def __len__(self) -> int:
        return len(self._conns)

    def __contains__(self, conn: object) -> bool:
        return conn in self._conns

    def __iter__(self) -> Iterator[C]:
        return iter(list(self._conns))

    def add(self, conn: C, source: str) -> list[C]:
        """Hold ``conn``, from address ``source``; return the connections it
        pushes out, for the caller to close."""
        pushed: list[C] = []
        if self._sources[source] >= self.per_source:
            pushed.append(next(c for c, (s, _) in self._conns.items() if s == source))
        elif len(self._conns) >= self.limit:
            pushed.append(next(iter(self._conns)))
        for old in pushed:
            self.discard(old)
        self._conns[conn] = (source, time.monotonic() + self.seconds)
        self._sources[source] += 1
        return pushed

    def discard(self, conn: C) -> None:
        entry = self._conns.pop(conn, None)
        if entry is not None:
            self._sources[entry[0]] -= 1
            if not self._sources[entry[0]]:
                del self._sources[entry[0]]

    def oldest(self) -> Optional[C]:
        return next(iter(self._conns), None)

    def accept(self, listener: socket.socket, make_room: Callable[[C, OSError], None],
               pause: Callable[[OSError], None]) -> Iterator[tuple[socket.socket, tuple]]:
        """Accept from non-blocking ``listener`` what waits there, at most
        ``limit`` at a time (then the caller serves the others). Out of file
        descriptors, the oldest connection still in the handshake is closed
        to make room (``make_room``); with none to close, ``pause(error)``
        is called and accepting stops: the listener would be ready again at
        once, and a loop would spin on the same error."""
        for _ in range(self.limit):
            try:
                conn = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:  # it hung up while waiting in the backlog
                continue
            except OSError as exc:
                oldest = self.oldest()
                if exc.errno in OUT_OF_FDS and oldest is not None:
                    make_room(oldest, exc)
                    continue
                pause(exc)
                return
            yield conn

    def expired(self) -> list[C]:
        """The connections past their deadline (they are the oldest)."""
        now = time.monotonic()
        late = []
        for conn, (_, deadline) in self._conns.items():
            if deadline > now:
                break
            late.append(conn)
        return late

    def next_deadline(self) -> Optional[float]:
        """The earliest deadline (time.monotonic()), or None if none waits."""
        for _, deadline in self._conns.values():
            return deadline
        return None


class QuietLog:
    """A warning that a flood would repeat (a connection dropped, a listener
    out of file descriptors): the first in full, then at most one line every
    ``interval`` seconds, which counts the ones left out. So a stray
    connection costs at most one line, and a flood a few."""

    def __init__(self, logger: logging.Logger, interval: float = 10.0):
        self._logger = logger
        self._interval = interval
        self._quiet_until = float("-inf")
        self._left_out = 0

    def __call__(self, message: str) -> None:
        now = time.monotonic()
        if now < self._quiet_until:
            self._left_out += 1
            return
        if self._left_out:
            message += f" ({self._left_out} more like it since the last such line)"
        self._logger.warning("%s", message)
        self._left_out = 0
        self._quiet_until = now + self._interval
