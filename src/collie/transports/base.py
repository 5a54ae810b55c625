"""The transport contract: how bytes move between this rank and its peers.

A transport moves *messages* (a tag, a 64-bit meta word, and 0 or more bytes)
from this rank to peers and back. It knows nothing of collectives, dtypes or
groups: the Network routes each peer to one transport, and the engine builds
collectives out of messages. conformance.py holds the contract as checks
(check_transport) that every transport passes in one process
(tests/test_transport_contract.py, with loopback.py, an in-process
transport, among them); tests/test_transports.py checks it again across
processes, through the Network.

The contract
------------
isend(peer, tag, data, meta) -> Request
    Posts a send of ``data``, a contiguous read-only byte memoryview that the
    caller keeps alive and unchanged until the request is done. It never
    blocks for long (it may copy part of the data at once).

irecv(peer, tag, dst, combine=None, meta=None) -> Request
    Posts a receive of exactly ``len(dst)`` bytes into ``dst`` (a contiguous
    writable byte memoryview). ``combine(dst_piece, src_piece)``, when given,
    merges each arriving piece into the destination instead of copying it
    (pieces start at offsets that are multiples of 16 bytes into the message,
    so they hold whole elements of any dtype); transports pass it pieces
    straight from where the bytes arrived (a shared-memory slot, a socket
    buffer) to spare a copy. If ``meta`` is not None and the message's meta
    differs, or if the message's size differs from ``len(dst)``, the request
    fails with MessageMismatch: the message is consumed (so neither side stays
    blocked on it) and ``dst`` is left unchanged.

Matching: a receive takes the earliest message from ``peer`` with ``tag``
that no earlier receive took (messages between two ranks with one tag never
overtake each other). Messages with other tags never block it.

probe(peer, tag) -> nbytes or None
    The size of the message a receive for (peer, tag) would take, if it has
    started arriving, else None. Used for receive-from-any-source.

progress() -> bool
    Advances every posted request as far as it can without blocking (copies
    into free slots, out of full ones...). Returns True if anything moved.
    A transport that moves data on threads of its own may do nothing here.

fail_peer(peer, error)
    Fails every pending request with ``peer`` with ``error`` (the Network
    calls it when it learns that the peer died).

drop_stale(peers) -> None
    Looks at the messages from ``peers`` that no receive has taken (set
    aside, or still waiting in a ring) and offers each to ``unexpected``.

unexpected(peer, tag, meta, nbytes) -> bool
    Set by the Network (None: never called). A transport calls it for a
    message that no posted receive takes; True means nobody ever will (it
    belongs to a collective this rank has finished: the ranks disagreed
    about that call), and the transport consumes and drops the message, so
    that neither its bytes nor a writer waiting on it are left behind. It may
    be called more than once for one message, and from a transport thread.

close()
    Releases everything the transport holds. Idempotent.

Capabilities (class attributes, see Transport): ``windows``, ``pollable``
and ``liveness`` say what else a transport offers; the Network asks them
instead of knowing transports by name.

Requests complete (``done`` set True) or fail (``error`` set) only inside
progress() or on the transport's own threads; after either, the transport no
longer touches the request's buffer. Whenever a transport's own thread (or a
peer, through shared memory) completes or fails a request or delivers a
message, it rings the doorbell of the rank that owns the request, so that a
rank asleep in Network.wait wakes up.

Threads: isend, irecv, probe, progress and fail_peer are called by one thread
at a time (the Network holds its lock around them).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Callable, Optional

Combine = Callable[[memoryview, memoryview], None]


class MessageMismatch(Exception):
    """A message did not fit the receive that matched it (size or meta).
    The Network turns this into MismatchError or ValueError with context."""

    def __init__(self, peer: int, tag: int, nbytes: int, meta: int, expected_nbytes: int, expected_meta):
        super().__init__(
            f"message from rank {peer} (tag {tag}) has {nbytes} bytes and meta {meta:#x}; "
            f"the receive expected {expected_nbytes} bytes"
            + ("" if expected_meta is None else f" and meta {expected_meta:#x}")
        )
        self.peer = peer
        self.tag = tag
        self.nbytes = nbytes
        self.meta = meta
        self.expected_nbytes = expected_nbytes
        self.expected_meta = expected_meta


class Request:
    """A posted send or receive. The transport sets ``done`` or ``error``."""

    __slots__ = ("peer", "tag", "nbytes", "done", "error", "kind")

    def __init__(self, kind: str, peer: int, tag: int, nbytes: int):
        self.kind = kind  # "send" or "recv"
        self.peer = peer
        self.tag = tag
        self.nbytes = nbytes
        self.done = False
        self.error: Optional[BaseException] = None

    @property
    def finished(self) -> bool:
        return self.done or self.error is not None

    def __repr__(self) -> str:
        state = "done" if self.done else ("failed" if self.error else "pending")
        return f"<{self.kind} peer={self.peer} tag={self.tag:#x} nbytes={self.nbytes} {state}>"


class Transport(ABC):
    """Moves tagged messages between this rank and a set of peers."""

    name = "transport"
    unexpected: Optional[Callable[[int, int, int, int], bool]] = None

    # What the Network may count on, declared by each transport:
    #: window(rank) and window_capacity() give memory of peers that this
    #: rank reads directly (the shm algorithm's one-sided reads).
    windows = False
    #: Requests complete inside progress(), so a waiter may poll it, and what
    #: a peer sent before it left still waits to be taken there. False: they
    #: complete on the transport's own threads, which need the GIL a polling
    #: waiter would hold.
    pollable = False
    #: It notices on its own that a peer is gone (on_peer_lost), and carries
    #: control messages (send_control) that reach a peer however busy it is.
    liveness = False

    @abstractmethod
    def isend(self, peer: int, tag: int, data: memoryview, meta: int = 0) -> Request: ...

    @abstractmethod
    def irecv(self, peer: int, tag: int, dst: memoryview, combine: Optional[Combine] = None,
              meta: Optional[int] = None) -> Request: ...

    @abstractmethod
    def probe(self, peer: int, tag: int) -> Optional[int]: ...

    @abstractmethod
    def progress(self) -> bool: ...

    @abstractmethod
    def fail_peer(self, peer: int, error: BaseException) -> None: ...

    @abstractmethod
    def drop_stale(self, peers) -> None: ...

    @abstractmethod
    def close(self) -> None: ...
