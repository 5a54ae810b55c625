"""The TCP transport: a connection between every pair of ranks, and
several between ranks on different hosts.

Every rank keeps this mesh, even with peers whose data goes over shared
memory, because the Network also uses it for liveness (a dead process closes
its sockets, so its peers learn of the death at once) and control messages.

Setup. Each rank listens on an ephemeral port (127.0.0.1 when MASTER_ADDR is a
loopback address, else the local address that routes toward MASTER_ADDR),
publishes "host:port" in the store under ``tcp/{job_id}/{rank}``, connects to
every lower rank and accepts a connection from every higher one (``streams``
of them with each peer in ``striped``). Each connection starts with
collie.auth.handshake, then the connecting rank says who it is (rank, world
size, which of its connections to this peer, job id). The listener runs the
handshakes of all incoming connections side by side and drops any that fails,
claims a rank it should not, or stays silent, so a stray connection (a port
scanner, junk, a stranger) never stops setup. While a rank waits for
connections it also watches those it already has, so one rank's failure during
setup (a crash) spreads to the others in moments instead of a timeout; a rank
refused for a wrong token says so in the store, which ends the others' wait
too.

Wire format. A frame is a 25-byte header, ``HEADER`` = (kind u8, tag i64,
meta i64, nbytes u64), then nbytes of payload. Kinds: DATA (a message),
CONTROL (a payload for the Network's on_control callback), BYE (the sender
is closing cleanly; it shuts its side down right after), and STRIPED and
STRIPE below.

Striping. One connection does not fill a fast link: its bytes are copied by
one core on each side (between two network namespaces here, plain sockets
moved 0.7-0.9 GB/s over one connection and 1.6-1.7 GB/s over two). So ranks on
different hosts keep ``streams`` connections (COLLIE_TCP_STREAMS, default 2),
and a message of ``stripe_min`` bytes or more (COLLIE_TCP_STRIPE_MIN, default
4 MiB; below it the second thread costs more than it gains) is cut into one
stripe per connection (_stripes: equal parts at 64-byte offsets), each written
by its connection's own thread. The first connection carries the head, STRIPED
(tag, meta and size of the whole message), with the first stripe; every other
frame but later stripes goes there too, so matching and order stay that
connection's. Each later connection carries STRIPE frames (the message's
number among the striped ones to this peer, the stripe's offset and length),
in the same order. Its receiver waits until the first connection's receiver
has read that message's head and decided where it goes (a posted receive, an
unexpected buffer, or nowhere), then reads its stripe straight there; the last
stripe in completes the receive. The send completes when every stripe is
written. A CONTROL frame reaches on_control only once every striped message
before it is whole: control still follows the data sent before it (the
Network's "leaving" notice relies on that). BYE goes on every connection,
after what was queued there, and the first connection's receiver, at the end
of a clean leave, lets the others read what they still carry before it fails
what waits.

Receiving. One daemon thread per connection reads frames. A DATA message goes
straight into the destination of the receive posted for its tag (recv_into, no
copy), or through a reusable aligned bounce buffer, one PIECE at a time, when
the receive has a combine function. A message that nobody waits for yet is
read into a fresh buffer and queued as "unexpected"; irecv looks there first.
So the socket is always drained, which is what lets two ranks send each other
huge messages before either posts a receive without deadlocking.

Sending: why inline first, then a thread. isend first writes what the socket
buffer accepts at once (sendmsg with MSG_DONTWAIT, header and payload in one
system call). A small message is then done before isend returns, with no
thread hand-off: on loopback (2 busy cores), sending every message from a
thread made the 8-byte round trip 2-3 times slower (250-300 us instead of
90-150 us; a bare socket pair takes about 20 us). What does not fit (a large
message, or any message while earlier ones still wait) goes to a
per-connection sender thread, started on first use, which writes it with
blocking sendall. isend therefore returns at once whatever the size, and
frames never interleave: a per-connection lock guards the socket's write side
and the queue, and nothing is written inline while the queue is not empty.

Failure. When a connection ends, the receiver thread fails every pending
request with that peer with PeerError: "rank P died (connection lost: ...)",
or "rank P left (destroy_process_group) ..." if the peer said BYE first
(that error has ``left = True``: the Network knows the peer's earlier sends
are complete); then it calls on_peer_lost(peer, error) (unless this rank is closing or was
told of the failure through fail_peer) and rings the doorbell. Messages that
arrived in full before the end can still be received.

Closing. close() sends BYE on every connection (after what is queued there,
waiting at most LINGER seconds), shuts its write side, waits (same bound) for
each peer to close its side, which a peer's receiver does as soon as it reads
BYE and end of stream, so nothing unread is ever reset away, then closes
everything and joins every thread.

Threads and the GIL: the receiver threads need the GIL for a few
microseconds per frame. A main thread that spins in Python instead of sleeping
on the doorbell can delay them by up to sys.getswitchinterval(). The receiver
thread is also why a small message costs about three times what it costs on
a bare socket: the kernel wakes the receiver, which wakes the waiting thread.

``collie pingpong`` measures it against a plain pair of sockets.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import selectors
import socket
import struct
import threading
import time
from collections import deque
from typing import Callable, Collection, Optional

import numpy as np

from ..auth import ACCEPT_PAUSE, Handshake, Pending, QuietLog, handshake, next_pause
from ..errors import AuthError, CollieError, CollieTimeout, PeerError
from .base import Combine, MessageMismatch, Request, Transport

__all__ = ["TcpTransport", "HEADER", "DATA", "CONTROL", "BYE"]

_log = logging.getLogger(__name__)

DATA, CONTROL, BYE, STRIPED, STRIPE = 1, 2, 3, 4, 5
HEADER = struct.Struct("<BqqQ")  # kind, tag, meta, nbytes
# rank, world size, connection index, connections it keeps with this peer, length of the job id that follows
_HELLO = struct.Struct("<qqHHH")

PIECE = 2 << 20  # bytes per combine call: a multiple of 16 (256 KiB..4 MiB measured alike)
LINGER = 5.0  # seconds close() waits for queued sends and for peers to hang up
LOOK = 0.5  # seconds between looks in the store for a rank refused during setup
_READ_BUFFER = 1 << 16  # headers and small payloads are read through this buffer
_SMALL_COPY = 1 << 16  # larger copies go through NumPy, which releases the GIL
STRIPE_ALIGN = 64  # stripes start at multiples of this: whole elements of any dtype, for combine
#: Connections per pair of ranks on different hosts, and the size from which
#: a message to such a peer is striped across them: $COLLIE_TCP_STREAMS and
#: $COLLIE_TCP_STRIPE_MIN (bytes) override them (see striping()).
STREAMS = 2
STRIPE_MIN = 4 << 20
_NOSIGNAL = getattr(socket, "MSG_NOSIGNAL", 0)
_DONTWAIT = getattr(socket, "MSG_DONTWAIT", 0)


class _EndOfStream(Exception):
    """The peer closed its side of the connection."""


class _Recv(Request):
    __slots__ = ("dst", "combine", "meta")

    def __init__(self, peer: int, tag: int, dst: memoryview, combine: Optional[Combine], meta: Optional[int]):
        super().__init__("recv", peer, tag, len(dst))
        self.dst = dst
        self.combine = combine
        self.meta = meta


class _Send(Request):
    __slots__ = ("views", "whole")

    def __init__(self, kind: str, peer: int, tag: int, nbytes: int, whole: Optional["_Striping"] = None):
        super().__init__(kind, peer, tag, nbytes)
        self.views: list = []  # what is left to write
        self.whole = whole  # for one stripe of a striped message: that message's send

    def settle(self, error: Optional[BaseException] = None) -> None:
        """Done, or failed with ``error``; a stripe also counts down its message."""
        if error is None:
            self.done = True
        else:
            self.error = error
        if self.whole is not None:
            self.whole.stripe_settled(error)


class _Striping(Request):
    """The send of a striped message: done once every stripe is sent. It
    fails only then too (with the first stripe's error), since until then
    a connection may still be reading the caller's buffer."""

    __slots__ = ("left", "failure", "lock")

    def __init__(self, peer: int, tag: int, nbytes: int, stripes: int):
        super().__init__("send", peer, tag, nbytes)
        self.left = stripes
        self.failure: Optional[BaseException] = None
        self.lock = threading.Lock()

    def stripe_settled(self, error: Optional[BaseException]) -> None:
        with self.lock:
            self.left -= 1
            if error is not None and self.failure is None:
                self.failure = error
            if self.left:
                return
        if self.failure is None:
            self.done = True
        else:
            self.error = self.failure


class _Message:
    """An unexpected message: queued before any receive asked for it."""

    __slots__ = ("nbytes", "meta", "data", "taker")

    def __init__(self, nbytes: int, meta: int):
        self.nbytes = nbytes
        self.meta = meta
        self.data: Optional[memoryview] = None  # set once it has fully arrived
        self.taker: Optional[_Recv] = None  # a receive that took it while it was arriving


class _Arrival:
    """A striped message on its way in: where its stripes go (None: read and
    dropped), and how many are still to come. Guarded by its peer's lock."""

    __slots__ = ("dst", "combine", "request", "message", "left", "error")

    def __init__(self, stripes: int):
        self.dst: Optional[memoryview] = None
        self.combine: Optional[Combine] = None
        self.request: Optional[_Recv] = None  # the posted receive it fills
        self.message: Optional[_Message] = None  # or the unexpected message it becomes
        self.left = stripes
        self.error: Optional[BaseException] = None


class _Link:
    """One TCP connection with a peer, and its write side: ``send_cv``
    guards the socket's writes and the send queue."""

    def __init__(self, sock: socket.socket, index: int):
        self.sock = sock
        self.index = index  # 0: the first connection, which carries all but later stripes
        self.send_cv = threading.Condition(threading.Lock())
        self.send_queue: deque[_Send] = deque()
        self.sending: Optional[_Send] = None  # taken off the queue by the sender thread
        self.stop_sender = False
        self.receiver: Optional[threading.Thread] = None
        self.sender: Optional[threading.Thread] = None
        self.bye = False  # the peer said BYE on this connection
        self.bounce: Optional[memoryview] = None  # for combine and skipping; receiver thread only


class _Peer:
    """Everything about the connections with one peer.

    ``lock`` guards the receive side (posted, unexpected, arriving, active,
    arrivals, error). ``links`` are the connections: the first carries
    every frame but the later stripes of a striped message, which go one
    per further connection.
    """

    def __init__(self, rank: int, nlinks: int):
        self.rank = rank
        self.links: list[Optional[_Link]] = [None] * nlinks
        self.lock = threading.Lock()
        self.posted: dict[int, deque[_Recv]] = {}
        self.unexpected: dict[int, deque[_Message]] = {}
        self.arriving: Optional[_Message] = None  # unexpected message being read now
        self.active: Optional[_Recv] = None  # receive the receiver thread is filling now
        self.error: Optional[BaseException] = None  # set once the peer is gone
        self.bye = False
        self.striped_out = 0  # striped messages sent (isend's caller only)
        self.striped_in = 0  # striped messages whose head arrived (first receiver only)
        self.arrivals: dict[int, _Arrival] = {}  # by number, until their last stripe is in
        self.arrived = threading.Condition(self.lock)  # arrivals gained or lost an entry, or an error

    @property
    def first(self) -> _Link:
        return self.links[0]

    def connections(self) -> list[_Link]:
        return [link for link in self.links if link is not None]


class _Incoming:
    """A connection to the setup listener until it has said which rank it
    is: the handshake, then _HELLO and the job id, read as they arrive, each
    message exactly (nothing beyond it is buffered)."""

    __slots__ = ("sock", "origin", "shake", "buf", "hello")

    def __init__(self, sock: socket.socket, origin: str, token: Optional[bytes]):
        self.sock = sock
        self.origin = origin
        self.shake = Handshake(token, server=True, what=f"the connection from {origin}")
        self.buf = bytearray()
        self.hello: Optional[tuple] = None  # (rank, world size, job id length) once read

    def advance(self) -> Optional[tuple]:
        """Read what has arrived, without blocking; return (rank, connection
        index, connections, world size, job id) once all of it is here, else None. Raises AuthError if the
        handshake fails, ConnectionError if the other end hangs up."""
        try:
            while True:
                out = self.shake.take()
                if out:
                    self.sock.sendall(out)  # a few bytes into an empty buffer
                if self.shake.refused is not None:
                    raise self.shake.refused
                need = self.shake.need or (self.hello[4] if self.hello else _HELLO.size)
                while len(self.buf) < need:
                    data = self.sock.recv(need - len(self.buf))
                    if not data:
                        raise ConnectionError("it hung up before saying which rank it is")
                    self.buf += data
                message, self.buf = bytes(self.buf), bytearray()
                if self.shake.need:
                    self.shake.feed(message)
                elif self.hello is None:
                    self.hello = _HELLO.unpack(message)
                else:
                    rank, size, index, count, _ = self.hello
                    return rank, index, count, size, message.decode(errors="replace")
        except (BlockingIOError, InterruptedError):
            return None


class _Listener:
    """A rank's setup listener while it waits for the higher ranks.

    It takes connections as they come and runs their handshakes side by side
    (each an _Incoming, read as its bytes arrive), so that no stray
    connection holds up the ranks: one that fails the handshake, claims a
    rank that is not expected, or is silent past collie.auth.HANDSHAKE_SECONDS
    is dropped, logged once at most (collie.auth.QuietLog), and setup goes
    on. Connections still in the handshake are bounded as collie.auth.Pending
    says. Out of file descriptors, it first closes the oldest of them, and
    with none left stops watching the listener for 0.1 s to 1 s instead of
    spinning on accept. It also watches the connections already made (see
    ``watch``), so that a waiting rank learns at once of one that ends.
    """

    def __init__(self, sock: socket.socket, rank: int, size: int, job_id: str, token: Optional[bytes]):
        self.sock = sock
        self.rank, self.size, self.job_id, self.token = rank, size, job_id, token
        self.sel = selectors.DefaultSelector()
        self.sel.register(sock, selectors.EVENT_READ)
        self.pending: Pending[_Incoming] = Pending()
        self.log_drop, self.log_no_fds = QuietLog(_log), QuietLog(_log, interval=60.0)
        self.pause = 0.0  # seconds accepting pauses for, when out of file descriptors
        self.resume_at: Optional[float] = None

    def watch(self, p: _Peer) -> None:
        self.sel.register(p.first.sock, selectors.EVENT_READ, p)

    def wait(self, timeout: float, expected: set) -> tuple[list, list]:
        """Wait up to ``timeout`` seconds (less if a handshake's deadline
        comes first) and handle what happened. Returns the connections that
        said who they are, as (rank, connection index, connections it
        keeps, socket), which it takes out of ``expected`` ((rank, index)
        pairs), and the watched peers whose connection ended."""
        joined: list[tuple[int, int, int, socket.socket]] = []
        lost: list[_Peer] = []
        times = [t for t in (self.pending.next_deadline(), self.resume_at) if t is not None]
        timeout = max(0.0, min([time.monotonic() + timeout] + times) - time.monotonic())
        for key, _ in self.sel.select(timeout):
            if key.fileobj is self.sock:
                for inc in self._accept():
                    self._advance(inc, expected, joined)
            elif isinstance(key.data, _Incoming):
                self._advance(key.data, expected, joined)
            else:  # a connection made before: it has either ended or already sends data
                p = key.data
                self.sel.unregister(p.first.sock)
                try:
                    alive = p.first.sock.recv(1, socket.MSG_PEEK | _DONTWAIT) != b""
                except BlockingIOError:
                    alive = True
                except OSError:
                    alive = False
                if not alive:
                    lost.append(p)
        for inc in self.pending.expired():
            self._drop(inc, f"did not finish the handshake within {self.pending.seconds:g} s")
        if self.resume_at is not None and time.monotonic() >= self.resume_at:
            self.resume_at = None
            self.sel.register(self.sock, selectors.EVENT_READ)
        return joined, lost

    def _accept(self) -> list[_Incoming]:
        accepted = []
        for sock, addr in self.pending.accept(self.sock, self._make_room, self._pause):
            self.pause = 0.0
            sock.setblocking(False)
            inc = _Incoming(sock, f"{addr[0]}:{addr[1]}", self.token)
            self.sel.register(sock, selectors.EVENT_READ, inc)
            for old in self.pending.add(inc, addr[0]):
                self._drop(old, "still in the handshake when newer connections came (the oldest go first)")
            accepted.append(inc)
        return accepted

    def _make_room(self, oldest: _Incoming, exc: OSError) -> None:
        self._drop(oldest, f"closed to free a file descriptor ({exc.strerror})")

    def _pause(self, exc: OSError) -> None:
        self.log_no_fds(f"rank {self.rank} cannot accept connections during TCP setup "
                        f"({exc}): trying again every {ACCEPT_PAUSE[0]:g} to {ACCEPT_PAUSE[1]:g} s")
        self.pause = next_pause(self.pause)
        self.resume_at = time.monotonic() + self.pause
        self.sel.unregister(self.sock)

    def _advance(self, inc: _Incoming, expected: set, joined: list) -> None:
        if inc.sock.fileno() < 0:  # dropped earlier in this round
            return
        try:
            said = inc.advance()
        except OSError as exc:  # AuthError is not one
            self._drop(inc, f"it hung up during the handshake ({exc})")
            return
        except AuthError as exc:
            self._drop(inc, str(exc))
            return
        if inc.shake.proven:  # it may believe it is in: no longer pushed out or timed out
            self.pending.discard(inc)
        if said is None:
            return
        peer, index, count, size, job = said
        if job != self.job_id or size != self.size or (peer, index) not in expected:
            self._drop(inc, f"it claims to be rank {peer} (connection {index}) of {size} in job {job!r}; "
                            f"rank {self.rank} expects one of ranks {_ranks_in(expected)} of {self.size} "
                            f"in job {self.job_id!r}")
            return
        self.sel.unregister(inc.sock)
        expected.discard((peer, index))  # at once: a second claim to the same connection is a lie
        joined.append((peer, index, count, inc.sock))

    def _drop(self, inc: _Incoming, why: str) -> None:
        self.log_drop(f"rank {self.rank} dropped a connection from {inc.origin} during TCP setup: {why}")
        self.pending.discard(inc)
        self.sel.unregister(inc.sock)
        inc.sock.close()

    def close(self) -> None:
        """Close the connections that never said who they are."""
        for key in list(self.sel.get_map().values()):
            if isinstance(key.data, _Incoming):
                key.data.sock.close()
        self.sel.close()

def striping(environ) -> tuple[int, int]:
    """(streams, stripe_min) from ``environ``; ValueError naming a bad value."""
    values = []
    for name, default in (("COLLIE_TCP_STREAMS", STREAMS), ("COLLIE_TCP_STRIPE_MIN", STRIPE_MIN)):
        raw = environ.get(name, "").strip()
        try:
            value = int(raw) if raw else default
        except ValueError:
            value = 0
        if value < 1:
            raise ValueError(f"{name}={raw!r} must be a whole number of at least 1")
        values.append(value)
    return values[0], values[1]


def _ranks_in(expected: set) -> list[int]:
    """The ranks in a set of (rank, connection index) pairs."""
    return sorted({rank for rank, _ in expected})


def _stripes(nbytes: int, count: int) -> list[tuple[int, int]]:
    """(start, end) of each stripe of an ``nbytes`` message cut for
    ``count`` connections: equal parts, each starting at a multiple of
    STRIPE_ALIGN. Sender and receiver both cut by this."""
    step = -(-nbytes // count)
    step += -step % STRIPE_ALIGN
    return [(start, min(start + step, nbytes)) for start in range(0, nbytes, step)]


def _byte_view(buffer) -> memoryview:
    """A flat unsigned-byte view, so that slicing and lengths count bytes."""
    view = memoryview(buffer)
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


def _copy(dst: memoryview, src: memoryview) -> None:
    if len(src) < _SMALL_COPY:
        dst[:] = src
    else:
        np.copyto(np.frombuffer(dst, np.uint8), np.frombuffer(src, np.uint8))


def _skip_views(views: list, n: int) -> list:
    """The views left after the first ``n`` bytes were written."""
    left = []
    for view in views:
        if n >= len(view):
            n -= len(view)
        else:
            left.append(view[n:] if n else view)
            n = 0
    return left


def _aligned_empty(nbytes: int, align: int = 64) -> memoryview:
    """Uninitialised bytes at an aligned address (np.empty does not write
    the pages, unlike bytearray); small ones come from the allocator, which
    aligns to 16."""
    if nbytes < _SMALL_COPY:
        return memoryview(bytearray(nbytes))
    raw = np.empty(nbytes + align, np.uint8)
    start = -raw.__array_interface__["data"][0] % align
    return memoryview(raw[start:start + nbytes])


class _Reader:
    """Reads frames from a socket: headers and small payloads through a
    buffer (one system call often brings several frames), large payloads
    straight into their destination."""

    def __init__(self, sock: socket.socket, ring: Callable[[], None]):
        self.sock = sock
        self.ring = ring
        self.ring_due = False
        self.buf = bytearray(_READ_BUFFER)
        self.view = memoryview(self.buf)
        self.start = 0
        self.end = 0

    def recv_into(self, view: memoryview) -> int:
        """One read from the socket, ringing the doorbell first if a ring is
        due. Ringing just before the thread may block, rather than at once,
        rings once for a burst of frames, and lets the woken thread take the
        GIL without waiting for this one to let go of it."""
        if self.ring_due:
            self.ring_due = False
            self.ring()
        n = self.sock.recv_into(view)
        if n == 0:
            raise _EndOfStream
        return n

    def _fill(self) -> None:
        """Read at least one more byte into the buffer."""
        if self.start == self.end:
            self.start = self.end = 0
        elif self.end == len(self.buf):
            kept = self.end - self.start
            self.view[:kept] = self.view[self.start:self.end]
            self.start, self.end = 0, kept
        self.end += self.recv_into(self.view[self.end:])

    def header(self) -> tuple:
        while self.end - self.start < HEADER.size:
            self._fill()
        fields = HEADER.unpack_from(self.buf, self.start)
        self.start += HEADER.size
        return fields

    def read_into(self, dst: memoryview) -> None:
        n = len(dst)
        got = min(n, self.end - self.start)
        if got:
            dst[:got] = self.view[self.start:self.start + got]
            self.start += got
        while got < n:
            if n - got >= len(self.buf):
                got += self.recv_into(dst[got:])
            else:
                self._fill()
                k = min(n - got, self.end - self.start)
                dst[got:got + k] = self.view[self.start:self.start + k]
                self.start += k
                got += k

    def skip(self, n: int, scratch: memoryview) -> None:
        while n:
            k = min(n, len(scratch))
            self.read_into(scratch[:k])
            n -= k


class TcpTransport(Transport):
    """The TCP transport; see the module docstring for how it works.

    Args:
        rank, size: this rank and the number of ranks.
        store: key-value store (set, get(key, timeout)) to exchange addresses.
        job_id: separates the keys of concurrent jobs sharing a store.
        doorbell: rung whenever a thread of this transport completes or fails
            a request, or queues a message.
        timeout: seconds allowed for the whole setup.
        token: shared secret for collie.auth.handshake, or None.
        on_peer_lost(peer, error): called on a receiver thread when a
            connection ends without this rank having asked for it.
        on_control(peer, payload): called on the receiver thread of ``peer``
            for each CONTROL frame; keep it short (it delays that peer's data).
        master_addr: where rank 0's host is reached; picks the interface.
        streams: connections to each peer in ``striped`` (the others get
            one); a message of ``stripe_min`` bytes or more to such a peer
            is cut into one stripe per connection, sent and received side
            by side. Every rank must be given the same values.
        striped: the peers that get ``streams`` connections (None: all).

    Raises (from the constructor): AuthError if a rank's handshake fails,
    CollieTimeout if peers do not show up in time, PeerError if a peer
    fails during setup.
    """

    name = "tcp"
    liveness = True

    def __init__(self, rank: int, size: int, store, job_id: str, doorbell, timeout: float,
                 token: Optional[bytes], on_peer_lost: Callable[[int, BaseException], None],
                 on_control: Callable[[int, bytes], None], master_addr: str = "127.0.0.1",
                 streams: int = 1, striped: Optional[Collection[int]] = None, stripe_min: int = STRIPE_MIN):
        if not 0 <= rank < size:
            raise ValueError(f"rank {rank} is outside the world of {size} ranks")
        if streams < 1 or stripe_min < 1:
            raise ValueError(f"streams ({streams}) and stripe_min ({stripe_min}) must be at least 1")
        self._streams = streams
        self._striped = set(range(size)) if striped is None else set(striped)
        self.stripe_min = stripe_min
        self.rank = rank
        self.size = size
        self.timeout = timeout
        self._doorbell = doorbell
        self._on_peer_lost = on_peer_lost
        self._on_control = on_control
        self._peers: list[Optional[_Peer]] = [None] * size
        self._close_lock = threading.Lock()
        self._closing = False
        self._closed = False
        if size == 1:
            return
        try:
            self._connect_mesh(store, job_id, token, master_addr)
        except BaseException:
            for p in self._peers:
                if p is not None:
                    for link in p.connections():
                        link.sock.close()
            self._peers = [None] * size
            self._closed = True
            raise
        for p in self._peers:
            if p is not None:
                for link in p.links:
                    link.sock.settimeout(None)
                    loop = self._receive_loop if link.index == 0 else self._stripe_loop
                    link.receiver = threading.Thread(target=loop, args=(p, link), daemon=True,
                                                     name=f"collie-tcp-recv-{rank}<-{p.rank}.{link.index}")
                    link.receiver.start()

    def _links_to(self, peer: int) -> int:
        """How many connections this rank keeps with ``peer``."""
        return self._streams if peer in self._striped else 1

    # ----------------------------------------------------------------- setup

    def _connect_mesh(self, store, job_id: str, token: Optional[bytes], master_addr: str) -> None:
        family, host = _listen_address(master_addr)
        deadline = time.monotonic() + self.timeout
        with socket.socket(family, socket.SOCK_STREAM) as listener:
            _tune(listener)
            listener.bind((host, 0))
            listener.listen(socket.SOMAXCONN)  # stray connections must not fill the queue ahead of the ranks
            listener.setblocking(False)
            port = listener.getsockname()[1]
            store.set(f"tcp/{job_id}/{self.rank}", _format_address(host, port).encode())
            for peer in range(self.rank):
                for index in range(self._links_to(peer)):
                    hello = _HELLO.pack(self.rank, self.size, index, self._links_to(peer),
                                        len(job_id.encode())) + job_id.encode()
                    self._connect_to(peer, index, store, job_id, token, hello, deadline)
            self._accept_higher(listener, store, job_id, token, deadline)

    def _remaining(self, deadline: float, waiting_for: str, peers: tuple) -> float:
        left = deadline - time.monotonic()
        if left <= 0:
            raise CollieTimeout(f"rank {self.rank}: timed out after {self.timeout:g} s waiting for "
                                f"{waiting_for} (TCP transport setup)", peers)
        return left

    def _connect_to(self, peer: int, index: int, store, job_id: str, token, hello: bytes,
                    deadline: float) -> None:
        what = f"rank {peer} to publish its address"
        try:
            address = store.get(f"tcp/{job_id}/{peer}",
                                timeout=self._remaining(deadline, what, (peer,))).decode()
        except TimeoutError as exc:
            raise CollieTimeout(f"rank {self.rank}: timed out after {self.timeout:g} s waiting for "
                                f"{what} (TCP transport setup)", (peer,)) from exc
        host, _, port = address.rpartition(":")
        family, _, _, _, sockaddr = socket.getaddrinfo(host.strip("[]"), int(port),
                                                       type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        if index == 0:
            self._peers[peer] = _Peer(peer, self._links_to(peer))
        self._peers[peer].links[index] = _Link(sock, index)  # from here on, a failure closes it
        _tune(sock)
        sock.settimeout(self._remaining(deadline, f"the connection to rank {peer}", (peer,)))
        try:
            sock.connect(sockaddr)
        except TimeoutError as exc:
            raise CollieTimeout(f"rank {self.rank}: connecting to rank {peer} at {address} timed out",
                                (peer,)) from exc
        except OSError as exc:
            raise PeerError(f"rank {self.rank} could not connect to rank {peer} at {address}: {exc} "
                            f"(rank {peer} failed during setup?)", peer) from exc
        try:
            handshake(sock, token, server=False, what=f"rank {peer}")
            sock.sendall(hello)
        except AuthError as exc:
            # The listener drops a refused connection without a word (it
            # cannot tell a rank from a stranger): say it where the ranks look.
            with contextlib.suppress(Exception):
                store.set(f"tcp/{job_id}/refused", f"rank {self.rank} could not authenticate with "
                                                   f"rank {peer}: {exc}".encode())
            raise
        except TimeoutError as exc:
            raise CollieTimeout(f"rank {self.rank}: rank {peer} did not finish the handshake in time",
                                (peer,)) from exc
        except OSError as exc:  # reset or closed: it gave up on setup (another rank's bad token...)
            raise PeerError(f"rank {peer} hung up on rank {self.rank} during the handshake: {exc} "
                            f"(rank {peer} failed during setup?)", peer) from exc

    def _accept_higher(self, sock: socket.socket, store, job_id: str, token, deadline: float) -> None:
        """Take a connection from every higher rank, through _Listener (which
        drops stray connections), while watching the connections already
        made: one that ends means that rank failed, and waiting for the
        others is pointless. A real rank with a wrong token learns it from
        its own handshake and says so in the store, which this loop reads
        every LOOK seconds, so that the wait ends with AuthError here too."""
        expected = {(peer, index) for peer in range(self.rank + 1, self.size)
                    for index in range(self._links_to(peer))}
        listener = _Listener(sock, self.rank, self.size, job_id, token)
        try:
            for p in self._peers:
                if p is not None:
                    listener.watch(p)
            look_at = time.monotonic() + LOOK
            while expected:
                left = self._remaining(deadline, f"rank(s) {_ranks_in(expected)} to connect",
                                       tuple(_ranks_in(expected)))
                joined, lost = listener.wait(min(left, max(0.0, look_at - time.monotonic())), expected)
                for p in lost:
                    raise PeerError(f"rank {p.rank} closed its connection to rank {self.rank} "
                                    f"during setup (it failed, e.g. a bad token or a crash)", p.rank)
                differ = [(peer, count) for peer, _, count, _ in joined if count != self._links_to(peer)]
                if differ:
                    for *_, conn in joined:
                        conn.close()
                    peer, count = differ[0]
                    raise ValueError(f"rank {peer} keeps {count} TCP connection(s) with rank {self.rank}, "
                                     f"which keeps {self._links_to(peer)}: set COLLIE_TCP_STREAMS alike "
                                     f"on every rank")
                for peer, index, count, conn in joined:
                    _tune(conn)
                    if self._peers[peer] is None:
                        self._peers[peer] = _Peer(peer, self._links_to(peer))
                    self._peers[peer].links[index] = _Link(conn, index)
                    if index == 0:
                        listener.watch(self._peers[peer])
                if expected and time.monotonic() >= look_at:
                    look_at = time.monotonic() + LOOK
                    if store.check([f"tcp/{job_id}/refused"]):
                        why = store.get(f"tcp/{job_id}/refused").decode(errors="replace")
                        raise AuthError(f"rank {self.rank}: TCP setup failed: {why}")
        finally:
            listener.close()

    # ------------------------------------------------------------- receiving

    def _receive_loop(self, p: _Peer, link: _Link) -> None:
        """The first connection's receiver: every frame but later stripes."""
        reader = _Reader(link.sock, self._doorbell.ring)
        why = "end of stream"
        try:
            while True:
                kind, tag, meta, nbytes = reader.header()
                if kind == DATA:
                    self._receive_data(p, link, reader, tag, meta, nbytes)
                elif kind == STRIPED:
                    self._receive_striped(p, link, reader, tag, meta, nbytes)
                elif kind == CONTROL:
                    payload = bytearray(nbytes)
                    reader.read_into(memoryview(payload))
                    if p.arrivals:  # it follows what was sent before it, stripes included
                        with p.lock:
                            while p.arrivals and p.error is None:
                                p.arrived.wait()
                    try:
                        self._on_control(p.rank, bytes(payload))
                    except Exception:
                        _log.exception("rank %d: on_control failed for a message from rank %d",
                                       self.rank, p.rank)
                elif kind == BYE:
                    p.bye = True
                else:
                    why = f"unknown frame kind {kind} (not a collie peer, or a corrupted stream)"
                    break
        except _EndOfStream:
            if p.bye:  # it said BYE on every connection after its last stripe: let them read theirs
                for other in p.links[1:]:
                    other.receiver.join(LINGER)
        except Exception as exc:  # socket errors, or no memory for a huge message
            why = f"{type(exc).__name__}: {exc}"
        self._connection_lost(p, why)  # rings

    def _stripe_loop(self, p: _Peer, link: _Link) -> None:
        """A further connection's receiver: the later stripes of striped
        messages, each into where the first connection's receiver decided
        that message goes (it waits for that decision)."""
        reader = _Reader(link.sock, self._doorbell.ring)
        why = "end of stream"
        try:
            while True:
                kind, number, start, nbytes = reader.header()
                if kind == STRIPE:
                    with p.lock:
                        while number not in p.arrivals and p.error is None:
                            p.arrived.wait()
                        arrival = p.arrivals.get(number)
                    if arrival is None:
                        return  # the peer is gone; the first connection's receiver said so
                    self._read_stripe(p, link, reader, arrival, number, start, start + nbytes)
                elif kind == BYE:
                    link.bye = True
                else:
                    why = f"unknown frame kind {kind} on connection {link.index} (a corrupted stream)"
                    break
        except _EndOfStream:
            if link.bye:
                return  # a clean leave: the first connection's receiver reports it
        except Exception as exc:
            why = f"{type(exc).__name__}: {exc}"
        self._connection_lost(p, f"{why}, on connection {link.index}")

    def _match(self, p: _Peer, tag: int, meta: int, nbytes: int) -> tuple:
        """Where an arriving message goes, decided under ``p.lock``: (the
        posted receive it fills, None) or (None, the unexpected message it
        is queued as), or (None, None) if it is stale (read and dropped).
        Checked under the lock that drop_stale takes: a message either is
        found stale here or is queued before drop_stale looks."""
        queue = p.posted.get(tag)
        if queue:
            r = queue.popleft()
            if not queue:
                del p.posted[tag]  # tags are mostly used once: keep the dict small
            return r, None
        if self.unexpected is not None and self.unexpected(p.rank, tag, meta, nbytes):
            return None, None
        msg = _Message(nbytes, meta)
        p.unexpected.setdefault(tag, deque()).append(msg)
        return None, msg

    def _receive_striped(self, p: _Peer, link: _Link, reader: _Reader, tag: int, meta: int,
                         nbytes: int) -> None:
        """The head of a striped message: match it as _receive_data does, say
        where its stripes go (the other receivers wait for that), then read
        the first stripe."""
        stripes = _stripes(nbytes, len(p.links))
        arrival = _Arrival(len(stripes))
        with p.lock:
            r, msg = self._match(p, tag, meta, nbytes)
            if msg is not None:
                arrival.message, arrival.dst = msg, _aligned_empty(nbytes)
                reader.ring_due = True  # probe can now see it
            elif r is not None:  # (neither: stale, dst stays None, its stripes are dropped)
                arrival.request = r
                arrival.error = _mismatch(p.rank, tag, nbytes, meta, r)
                if arrival.error is None:
                    arrival.dst, arrival.combine = r.dst, r.combine
            number = p.striped_in
            p.striped_in += 1
            p.arrivals[number] = arrival
            p.arrived.notify_all()
        self._read_stripe(p, link, reader, arrival, number, *stripes[0])

    def _read_stripe(self, p: _Peer, link: _Link, reader: _Reader, arrival: _Arrival, number: int,
                     start: int, end: int) -> None:
        """Read one stripe into its message (or drop it), and settle the
        message once this was its last."""
        failure = None
        if arrival.dst is None:
            reader.skip(end - start, self._scratch(link))
        elif arrival.combine is None:
            reader.read_into(arrival.dst[start:end])
        else:
            failure = self._read_combining(link, reader, arrival.dst, arrival.combine, start, end)
        reader.ring_due = True
        with p.lock:
            if failure is not None and arrival.error is None:
                arrival.error = failure
            arrival.left -= 1
            if arrival.left:
                return
            r, msg = arrival.request, arrival.message
            if msg is not None:
                r = msg.taker
                if r is None:
                    msg.data = arrival.dst  # whole now: irecv may take it
        if r is not None and not r.finished:  # (a lost connection may have failed it meanwhile)
            if msg is not None:
                _deliver(r, arrival.dst)  # irecv took it while it was arriving
            elif arrival.error is not None:
                r.error = arrival.error
            if r.error is None:
                r.done = True
        with p.lock:  # settled first: a CONTROL frame waiting for this sees it finished
            del p.arrivals[number]
            p.arrived.notify_all()

    def _receive_data(self, p: _Peer, link: _Link, reader: _Reader, tag: int, meta: int,
                      nbytes: int) -> None:
        with p.lock:
            r, msg = self._match(p, tag, meta, nbytes)
            if msg is not None:
                p.arriving = msg
            elif r is not None:
                p.active = r
        if r is None and msg is None:  # stale: never buffered, its bytes are read and dropped
            reader.skip(nbytes, self._scratch(link))
            reader.ring_due = True
            return
        if r is None:
            reader.ring_due = True  # probe can now see it
            data = _aligned_empty(nbytes)
            reader.read_into(data)
            with p.lock:
                p.arriving = None
                r = msg.taker
                if r is None:
                    msg.data = data
                    return
                p.active = r  # irecv took it meanwhile; it waits for us to deliver
            _deliver(r, data)
        else:
            failure = _mismatch(p.rank, tag, nbytes, meta, r)  # set once the bytes are read
            if failure is not None:
                reader.skip(nbytes, self._scratch(link))
            elif r.combine is None:
                reader.read_into(r.dst)
            else:
                failure = self._read_combining(link, reader, r.dst, r.combine, 0, nbytes)
            r.error = failure
        with p.lock:
            p.active = None
            if r.error is None:
                r.done = True
        reader.ring_due = True

    def _read_combining(self, link: _Link, reader: _Reader, dst: memoryview, combine: Combine,
                        start: int, end: int) -> Optional[Exception]:
        """Read bytes ``start:end`` of a message through the connection's
        bounce buffer, combining each piece into ``dst`` as it lands; the
        first failure of combine (the rest is still read, so the stream
        stays whole), else None."""
        bounce = self._scratch(link)
        failure = None
        for at in range(start, end, len(bounce)):
            piece = bounce[:min(len(bounce), end - at)]
            reader.read_into(piece)
            if failure is None:
                try:
                    combine(dst[at:at + len(piece)], piece)
                except Exception as exc:  # fails this receive, not the connection
                    failure = exc
        return failure

    def _scratch(self, link: _Link) -> memoryview:
        """The connection's bounce buffer, allocated on first use (its receiver thread only)."""
        if link.bounce is None:
            link.bounce = _aligned_empty(PIECE)
        return link.bounce

    def _connection_lost(self, p: _Peer, why: str) -> None:
        with p.lock:
            known = p.error is not None
            active, p.active = p.active, None
        if self._closing or known:
            error = p.error or CollieError(f"rank {self.rank}'s TCP transport is closed")
        elif p.bye:
            error = PeerError(f"rank {p.rank} left (destroy_process_group) before rank {self.rank} "
                              f"received everything it expected from it", p.rank)
            error.left = True  # a clean leave: what it sent before leaving is still good
        else:
            error = PeerError(f"rank {p.rank} died (connection lost: {why})", p.rank)
        if active is not None and not active.finished:
            active.error = error
        self._fail(p, error)
        if not (self._closing or known):
            try:
                self._on_peer_lost(p.rank, error)
            except Exception:
                _log.exception("rank %d: on_peer_lost failed for rank %d", self.rank, p.rank)

    def _fail(self, p: _Peer, error: BaseException) -> None:
        """Fail what waits on ``p`` and hang up. Requests a thread is using
        right now (p.active, link.sending) are failed by that thread, which
        the shutdown wakes at once."""
        with p.lock:
            if p.error is None:
                p.error = error
            error = p.error
            victims: list[Request] = [r for q in p.posted.values() for r in q]
            p.posted.clear()
            halves = [a.message for a in p.arrivals.values() if a.message is not None]
            victims += [a.request for a in p.arrivals.values() if a.request is not None]
            if p.arriving is not None:
                halves.append(p.arriving)
            p.arriving = None
            for msg in halves:  # half a message is no message: forget it
                if msg.taker is not None:
                    victims.append(msg.taker)
                for q in p.unexpected.values():
                    if msg in q:
                        q.remove(msg)
            p.arrived.notify_all()  # stripe receivers waiting for a head that will not come
        sends: list[_Send] = []
        for link in p.connections():
            with link.send_cv:
                sends.extend(link.send_queue)
                link.send_queue.clear()
                link.send_cv.notify_all()
        for r in victims:
            if not r.finished:
                r.error = error
        for r in sends:
            if not r.finished:
                r.settle(error)
        for link in p.connections():
            try:
                link.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._ring()

    def _ring(self) -> None:
        self._doorbell.ring()

    # ------------------------------------------------------------------- API

    def _peer(self, peer: int) -> _Peer:
        p = self._peers[peer] if 0 <= peer < self.size else None
        if p is None:
            if self._closed:
                raise CollieError(f"rank {self.rank}'s TCP transport is closed")
            raise ValueError(f"rank {self.rank} has no TCP connection to rank {peer} "
                             f"(world of {self.size} ranks)")
        return p

    def irecv(self, peer: int, tag: int, dst: memoryview, combine: Optional[Combine] = None,
              meta: Optional[int] = None) -> Request:
        p = self._peer(peer)
        r = _Recv(peer, tag, _byte_view(dst), combine, meta)
        with p.lock:
            queue = p.unexpected.get(tag)
            msg = queue.popleft() if queue else None
            if queue is not None and not queue:
                del p.unexpected[tag]
            if msg is None:
                if p.error is not None:
                    r.error = p.error
                else:
                    p.posted.setdefault(tag, deque()).append(r)
                return r
            r.error = _mismatch(peer, tag, msg.nbytes, msg.meta, r)
            if r.error is not None:
                return r  # the message is consumed; if still arriving, it is dropped on arrival
            if msg.data is None:
                msg.taker = r  # still arriving: the receiver thread delivers it
                return r
        _deliver(r, msg.data)
        if r.error is None:
            r.done = True
        return r

    def isend(self, peer: int, tag: int, data: memoryview, meta: int = 0) -> Request:
        p = self._peer(peer)
        data = _byte_view(data)
        nbytes = len(data)
        striped = nbytes >= self.stripe_min and len(p.links) > 1
        try:
            header = HEADER.pack(STRIPED if striped else DATA, tag, meta, nbytes)
        except struct.error as exc:
            raise ValueError(f"tag {tag} and meta {meta} must fit in signed 64 bits") from exc
        if striped:
            return self._isend_striped(p, tag, header, data)
        r = _Send("send", peer, tag, nbytes)
        self._post(p, p.first, r, [header, data] if nbytes else [header])
        return r

    def _isend_striped(self, p: _Peer, tag: int, header: bytes, data: memoryview) -> Request:
        """One stripe per connection, each written by its own connection's
        thread: the head (and the message's tag, meta and size) goes with the
        first stripe, the others carry the message's number among the
        striped ones to this peer, which orders them the same way on every
        connection (isend has one caller at a time: the contract)."""
        stripes = _stripes(len(data), len(p.links))
        whole = _Striping(p.rank, tag, len(data), len(stripes))
        number = p.striped_out
        p.striped_out += 1
        for link, (start, end) in zip(p.links, stripes):
            head = header if link.index == 0 else HEADER.pack(STRIPE, number, start, end - start)
            self._post(p, link, _Send("send", p.rank, tag, end - start, whole), [head, data[start:end]])
        return whole

    def send_control(self, peer: int, payload: bytes) -> Request:
        """Send a CONTROL frame (from any thread); the peer's on_control gets
        ``payload``. It follows the data already queued for that peer."""
        p = self._peer(peer)
        r = _Send("control", peer, 0, len(payload))
        self._post(p, p.first, r, [HEADER.pack(CONTROL, 0, 0, len(payload)), payload])
        return r

    def _post(self, p: _Peer, link: _Link, r: _Send, views: list) -> None:
        with link.send_cv:
            if p.error is not None:
                r.settle(p.error)
                return
            if not link.send_queue and link.sending is None:
                try:
                    sent = link.sock.sendmsg(views, (), _DONTWAIT | _NOSIGNAL)
                except BlockingIOError:
                    sent = 0
                except OSError as exc:
                    r.settle(PeerError(f"rank {p.rank} died (connection lost while rank {self.rank} "
                                       f"was sending: {exc})", p.rank))
                    return
                views = _skip_views(views, sent)
                if not views:
                    r.settle()
                    return
            r.views = views
            link.send_queue.append(r)
            if link.sender is None:
                link.sender = threading.Thread(target=self._send_loop, args=(p, link), daemon=True,
                                               name=f"collie-tcp-send-{self.rank}->{p.rank}.{link.index}")
                link.sender.start()
            link.send_cv.notify_all()

    def _send_loop(self, p: _Peer, link: _Link) -> None:
        while True:
            with link.send_cv:
                while not link.send_queue:
                    if link.stop_sender:
                        return
                    link.send_cv.wait()
                r = link.sending = link.send_queue.popleft()
            error = None
            try:
                for view in r.views:
                    link.sock.sendall(view, _NOSIGNAL)
            except OSError as exc:
                error = exc
            r.views = []
            with link.send_cv:
                link.sending = None
                link.send_cv.notify_all()  # close() waits for the queue to drain
            if error is None:
                r.settle()
            else:
                r.settle(p.error or PeerError(f"rank {p.rank} died (connection lost while rank "
                                              f"{self.rank} was sending: {error})", p.rank))
            self._ring()

    def probe(self, peer: int, tag: int) -> Optional[int]:
        p = self._peer(peer)
        with p.lock:
            queue = p.unexpected.get(tag)
            return queue[0].nbytes if queue else None

    def progress(self) -> bool:
        return False  # the receiver and sender threads move everything

    def fail_peer(self, peer: int, error: BaseException) -> None:
        self._fail(self._peer(peer), error)

    def drop_stale(self, peers) -> None:
        if self.unexpected is None:
            return
        for peer in peers:
            p = self._peers[peer] if 0 <= peer < self.size else None
            if p is None or not p.unexpected:
                continue
            with p.lock:
                for tag, queue in list(p.unexpected.items()):
                    for msg in list(queue):
                        if msg.taker is None and self.unexpected(peer, tag, msg.meta, msg.nbytes):
                            queue.remove(msg)  # one still arriving is forgotten once read
                    if not queue:
                        del p.unexpected[tag]

    def close(self) -> None:
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
            self._closing = True
        peers = [p for p in self._peers if p is not None]
        links = [(p, link) for p in peers for link in p.connections()]
        deadline = time.monotonic() + LINGER
        for p, link in links:  # BYE on every connection, after the stripes queued there
            self._post(p, link, _Send("bye", p.rank, 0, 0), [HEADER.pack(BYE, 0, 0, 0)])
        for p, link in links:  # let queued sends and the BYE go out, then hang up our side
            with link.send_cv:
                while (link.send_queue or link.sending) and time.monotonic() < deadline:
                    link.send_cv.wait(max(0.0, deadline - time.monotonic()))
            try:
                link.sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass
        me = threading.current_thread()
        for p, link in links:  # each peer hangs up once it has read everything we sent
            if link.receiver is not None and link.receiver is not me:
                link.receiver.join(max(0.0, deadline - time.monotonic()))
        closed = CollieError(f"rank {self.rank}'s TCP transport is closed")
        for p in peers:
            self._fail(p, closed)
        for p, link in links:
            with link.send_cv:
                link.stop_sender = True
                link.send_cv.notify_all()
        for p, link in links:
            for thread in (link.receiver, link.sender):
                if thread is not None and thread is not me:
                    thread.join(LINGER)
            link.sock.close()


def _mismatch(peer: int, tag: int, nbytes: int, meta: int, r: _Recv) -> Optional[MessageMismatch]:
    """Why a message of ``nbytes`` and ``meta`` does not fit receive ``r``, or None."""
    if nbytes != len(r.dst) or (r.meta is not None and r.meta != meta):
        return MessageMismatch(peer, tag, nbytes, meta, len(r.dst), r.meta)
    return None


def _deliver(r: _Recv, data: memoryview) -> None:
    """Move a fully arrived unexpected message into the receive that took
    it; a combine that raises fails that receive (and nothing else)."""
    try:
        if r.combine is None:
            _copy(r.dst, data)
        else:
            r.combine(r.dst, data)
    except Exception as exc:
        r.error = exc


def _tune(sock: socket.socket) -> None:
    """No Nagle delay (small messages go out at once) and keepalive (a
    vanished host is noticed).

    SO_SNDBUF/SO_RCVBUF are left alone on purpose: on Linux, setting them
    turns off buffer autotuning, which grows them up to net.ipv4.tcp_rmem /
    tcp_wmem's maximum (4-32 MiB) as a connection needs; fixed sizes of 1, 4
    and 16 MiB measured no faster on loopback, and would cap the window
    between hosts."""
    if sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)


def _listen_address(master_addr: str) -> tuple:
    """(family, host) to listen on so that peers can reach this rank."""
    try:
        family, _, _, _, sockaddr = socket.getaddrinfo(master_addr, None, type=socket.SOCK_DGRAM)[0]
    except socket.gaierror as exc:
        raise ValueError(f"cannot resolve master address {master_addr!r}: {exc}") from exc
    if ipaddress.ip_address(sockaddr[0]).is_loopback:
        return family, sockaddr[0] if family == socket.AF_INET6 else "127.0.0.1"
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        probe.connect((sockaddr[0], 9))  # UDP: picks a route, sends nothing
        return family, probe.getsockname()[0]


def _format_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
