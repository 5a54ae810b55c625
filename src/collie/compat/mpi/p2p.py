"""Point-to-point matching (see the package docstring) and the progress loop."""

from __future__ import annotations

import weakref
from typing import Callable, Optional

import numpy as np

from ... import core
from ...arrays import byte_view
from ...p2p import core_program
from ...errors import CollieError
from ...group import ProcessGroup
from ...runtime import RUNTIME
from .constants import ANY_SOURCE, ANY_TAG, _ACK_TAG, _ENVELOPE_TAG, _PAYLOAD_TAG
from .exceptions import _as_mpi_error

__all__ = []


# ---- point-to-point matching (see the module docstring) ----

ENVELOPE_WORDS = 32                          # every envelope is 32 int64s (256 bytes):
_HEAD_BYTES = 24                             # MPI tag, payload size, sync id (_core.c: ENVELOPE_HEAD),
INLINE_BYTES = 8 * ENVELOPE_WORDS - _HEAD_BYTES  # then a payload of up to 232 bytes in place

class _Message:
    """A message whose envelope has arrived. ``data`` holds its payload unless
    the payload went straight into a receive's buffer; ``req`` is the payload
    receive still in flight (None once local or complete). ``matched`` turns
    True when a receive or a matched probe takes it. ``sync`` is the id its
    synchronous sender waits to see acknowledged (0: a standard send)."""

    __slots__ = ("source", "tag", "nbytes", "data", "req", "matched", "sync")

    def __init__(self, source: int, tag: int, nbytes: int, data=None, req=None, sync: int = 0):
        self.source, self.tag, self.nbytes, self.data, self.req = source, tag, nbytes, data, req
        self.matched = False
        self.sync = sync


class _SyncSend:
    """A synchronous send to another rank: ``matched`` once its receiver's ack came."""

    __slots__ = ("dest", "matched")

    def __init__(self, dest: int):
        self.dest, self.matched = dest, False


class _Recv:
    """A posted receive: ``dst`` is the caller's buffer (its bytes, or a
    bare array the compiled core posted as it is: see bytes()), or None
    for a pickled object. ``msg`` is the message it matched; ``error`` says
    why it never will (its peer is gone)."""

    __slots__ = ("source", "tag", "dst", "msg", "cancelled", "error")

    def __init__(self, source: int, tag: int, dst: Optional[memoryview]):
        self.source, self.tag, self.dst = source, tag, dst
        self.msg: Optional[_Message] = None
        self.cancelled = False
        self.error: Optional[BaseException] = None

    def bytes(self) -> memoryview:
        """dst's bytes, for Python's moves of the message (the core posts a
        bare array as it is, and receives into it without them)."""
        dst = self.dst
        return dst if dst.__class__ is memoryview else byte_view(dst)

    def matches(self, source: int, tag: int) -> bool:
        # ANY_TAG takes user tags only: negative tags are the layer's own (neighbour collectives)
        return self.source in (ANY_SOURCE, source) and (self.tag == tag or (self.tag == ANY_TAG and tag >= 0))

    def ready(self) -> bool:
        return (self.cancelled or self.error is not None
                or (self.msg is not None and (self.msg.req is None or self.msg.req.finished)))


class _Matcher:
    """The MPI point-to-point state of one communicator. Its books are
    slots: the compiled core reads them at their offsets (_core.set_matcher)."""

    __slots__ = ("group", "name", "inter", "network", "lock", "rank", "size", "etag", "ptag", "atag", "posted",
                 "unmatched", "envelopes", "probes", "lost", "syncs", "next_sync", "acks_in", "acks_out",
                 "core_sends", "core_recvs", "envelope_in", "__weakref__")

    def __init__(self, group: ProcessGroup, name: str, inter: bool = False):
        """``inter``: an intercommunicator's, whose group is its two groups
        (remote ranks first): only the remote ones send it messages."""
        self.group, self.name, self.inter = group, name, inter
        self.network = group.network
        self.lock = group.network.lock
        self.rank, self.size = group.rank, group.size
        self.etag = group.p2p_tag(_ENVELOPE_TAG)
        self.ptag = group.p2p_tag(_PAYLOAD_TAG)
        self.atag = group.p2p_tag(_ACK_TAG)
        self.posted: list[_Recv] = []
        self.unmatched: list[_Message] = []
        self.envelopes: dict[int, tuple] = {}  # group rank -> (envelope array, its receive)
        self.probes: list[int] = []            # sources that a probe is waiting on
        self.lost: dict[int, BaseException] = {}  # peers whose envelope receive failed: gone
        self.syncs: dict[int, _SyncSend] = {}  # id -> synchronous send waiting for its ack
        self.next_sync = 1
        self.acks_in: dict[int, tuple] = {}    # group rank -> (ack array, its receive)
        self.acks_out: list = []               # (ack array, its send) still in flight
        # The compiled core's one-message programs for envelopes to and from
        # each group rank (False: not made yet; None: the core can't).
        self.core_sends: list = [False] * self.size
        self.core_recvs: list = [False] * self.size
        self.envelope_in = np.zeros(ENVELOPE_WORDS, dtype=np.int64)  # an envelope the core took for the matcher
        _register(self)

    # The compiled core's path (_core.c, "the MPI layer's envelopes"; the
    # module's core_send, core_recv and core_exchange, which a communicator
    # calls with its matcher (None until made) and its group, and
    # core_envelope, which a request calls with its matcher): a send of a
    # payload that rides in its envelope puts the envelope in the peer's
    # ring from C; a blocking receive from one rank (or any, on an
    # intracommunicator), while this communicator has nothing else to
    # match, takes the next envelope from the ring in C, and a waited
    # receive request is received that way where it is the only one posted,
    # or has the core take its source's next envelope for the matcher.
    # A message to this rank itself the core delivers as deliver_local
    # does, and a receive takes a message held unmatched there first, as
    # post does (_core.c, "Messages a rank sends itself").
    # Anything else (an envelope that is not the one wanted, a full ring, a
    # peer slower than the spin) goes the full path, which the envelope
    # joins as if progress had taken it in (_envelope, which the core calls).

    def _core_program(self, rank: int, receiving: bool):
        """Make the core's program for an envelope to or from group rank
        ``rank`` (None: the core can't), into core_sends or core_recvs: the
        core asks, once per peer and direction."""
        found = core_program(self.network, self.group.ranks[rank], 8 * ENVELOPE_WORDS, receiving, receiving)
        (self.core_recvs if receiving else self.core_sends)[rank] = found
        return found

    def isend(self, data: memoryview, dest: int, tag: int, sync: Optional[_SyncSend] = None) -> tuple:
        """Post a message; returns its transport requests and what they read.
        With ``sync`` (to another rank), its envelope asks the receiver for an
        ack once a receive matched it, which marks ``sync`` matched."""
        nbytes = data.nbytes
        if dest == self.rank:
            self.deliver_local(data, tag)
            return (), None
        sid = 0
        if sync is not None:
            sid, self.next_sync = self.next_sync, self.next_sync + 1
            self.syncs[sid] = sync
        head = np.empty(ENVELOPE_WORDS, dtype=np.int64)
        head[:3] = tag, nbytes, sid
        peer = self.group.ranks[dest]
        envelope = byte_view(head)
        if nbytes <= INLINE_BYTES:  # the payload rides in the envelope: one message
            envelope[_HEAD_BYTES:_HEAD_BYTES + nbytes] = data if data.format == "B" else data.cast("B")
            return (self.network.isend(peer, self.etag, envelope),), head
        reqs = (self.network.isend(peer, self.etag, envelope),
                self.network.isend(peer, self.ptag, data))
        return reqs, head

    def _matched(self, msg: _Message) -> None:
        """A receive (or a matched probe) took ``msg``: ack it to a synchronous sender."""
        msg.matched = True
        if msg.sync:
            ack = np.array([msg.sync], dtype=np.int64)
            self.acks_out.append((ack, self.network.isend(self.group.ranks[msg.source], self.atag, byte_view(ack))))

    def deliver_local(self, data: memoryview, tag: int) -> _Message:
        """A message to oneself: copied at once (a standard send is then
        complete); a synchronous send waits for it to be ``matched``."""
        msg = _Message(self.rank, tag, data.nbytes, bytearray(data))
        self._deliver(msg)
        return msg

    def post(self, op: _Recv) -> None:
        for i, msg in enumerate(self.unmatched):
            if op.matches(msg.source, msg.tag):
                del self.unmatched[i]
                self._matched(msg)
                op.msg = msg
                return
        self.posted.append(op)

    def take(self, msg: _Message) -> None:
        """A matched probe takes ``msg``: no receive but its Message's can match it."""
        self.unmatched.remove(msg)
        self._matched(msg)

    def withdraw(self, msg: _Message) -> bool:
        """Cancel a message to oneself that nothing matched yet; True if it was."""
        if msg.matched or msg not in self.unmatched:
            return False
        self.unmatched.remove(msg)
        return True

    def cancel(self, op: _Recv) -> bool:
        if op.msg is None and op in self.posted:
            self.posted.remove(op)
            op.cancelled = True
        return op.cancelled

    def find(self, source: int, tag: int) -> Optional[_Message]:
        probe = _Recv(source, tag, None)
        return next((m for m in self.unmatched if probe.matches(m.source, m.tag)), None)

    def _deliver(self, msg: _Message) -> None:
        op = next((o for o in self.posted if o.matches(msg.source, msg.tag)), None)
        if op is None:
            self.unmatched.append(msg)
        else:
            self.posted.remove(op)
            self._matched(msg)
            op.msg = msg

    def _envelope(self, source: int, head: np.ndarray) -> None:
        tag, nbytes, sync = head[:3].tolist()
        op = next((o for o in self.posted if o.matches(source, tag)), None)
        msg = _Message(source, tag, nbytes, sync=sync)
        dst = None if op is None or op.dst is None else op.bytes()
        if nbytes <= INLINE_BYTES:  # here already: copied out of the envelope
            payload = byte_view(head)[_HEAD_BYTES:_HEAD_BYTES + nbytes]
            if dst is not None and nbytes <= len(dst):
                dst[:nbytes] = payload
            else:
                msg.data = bytearray(payload)
        elif dst is not None and nbytes <= len(dst):
            msg.req = self.network.irecv(self.group.ranks[source], self.ptag, dst[:nbytes])
        else:  # an object, a message nobody wants yet, or one too big (an error on completion)
            msg.data = bytearray(nbytes)
            msg.req = self.network.irecv(self.group.ranks[source], self.ptag, memoryview(msg.data))
        if op is None:
            self.unmatched.append(msg)
        else:
            self.posted.remove(op)
            self._matched(msg)
            op.msg = msg

    def _wanted(self) -> set:
        sources = {o.source for o in self.posted}
        sources.update(self.probes)
        if ANY_SOURCE in sources:
            sources = set(range(self.group.size))
        sources.discard(self.rank)
        return sources

    def busy(self) -> bool:
        return bool(self.posted or self.envelopes or self.probes or self.syncs or self.acks_out)

    def _acks(self) -> bool:
        """Take in the acks of synchronous sends; keep one ack receive posted
        per peer that a synchronous send waits on. True if anything changed."""
        if not (self.syncs or self.acks_in or self.acks_out):
            return False
        moved = False
        self.acks_out = [(a, r) for a, r in self.acks_out if not r.finished]
        for source, (ack, req) in list(self.acks_in.items()):
            if req.finished:
                del self.acks_in[source]
                moved = True
                sync = self.syncs.pop(int(ack[0]), None) if req.error is None else None
                if sync is not None:
                    sync.matched = True
        for dest in {s.dest for s in self.syncs.values()} - set(self.acks_in):
            ack = np.zeros(1, dtype=np.int64)
            self.acks_in[dest] = (ack, self.network.irecv(self.group.ranks[dest], self.atag, byte_view(ack)))
            moved = True
        return moved

    def gone(self, source: int) -> Optional[BaseException]:
        """Why no message from ``source`` (or ANY_SOURCE: from anyone) can come."""
        if source != ANY_SOURCE:
            return self.lost.get(source)
        if self.lost and len(self.lost) >= self.group.size - 1:
            return next(iter(self.lost.values()))
        return None

    def poll(self) -> bool:
        """Take in the envelopes that arrived and post envelope receives for
        the peers a receive waits on. Never blocks; True if anything changed.

        An envelope receive fails when its peer died or left; that is an
        error only for the receives that need that peer (an envelope receive
        left over from an ANY_SOURCE receive is no one's business).
        """
        moved = self._acks()
        for source, (head, req) in list(self.envelopes.items()):
            if req.finished:
                del self.envelopes[source]
                moved = True
                if req.error is None:
                    self._envelope(source, head)
                    continue
                try:  # the error, reworded to name the operation
                    self.network.wait([req], describe=lambda: f"MPI receive from rank {source} of {self.name}")
                except (CollieError, ValueError) as exc:
                    self.lost[source] = exc
        if self.lost:
            for op in list(self.posted):
                op.error = self.gone(op.source)
                if op.error is not None:
                    self.posted.remove(op)
        for source in self._wanted():
            if source not in self.envelopes and source not in self.lost:
                head = np.empty(ENVELOPE_WORDS, dtype=np.int64)
                req = self.network.irecv(self.group.ranks[source], self.etag, byte_view(head))
                self.envelopes[source] = (head, req)
                moved = True  # a new receive: the transports must look again before we call it idle
        return moved


# Each intracommunicator's matcher by its envelope tag: where the compiled
# core delivers an MPI envelope it meets at a ring's head while it runs
# another call (a collective between an Irecv and its Wait), so that the
# call goes on in C (_core.c's envelope_aside).
# (The runtime's: destroy_process_group empties it.)
_by_etag: "dict[int, weakref.ref[_Matcher]]" = RUNTIME.matchers_by_etag

if core._core is not None:
    core._core.set_matcher(_Matcher, _by_etag)
    core_send, core_recv = core._core.mpi_send, core._core.mpi_recv
    core_exchange, core_envelope = core._core.mpi_exchange, core._core.mpi_envelope
    # (their Requests, and the ones mpi_complete completes: request.py sets the types)
    core_isend, core_irecv = core._core.mpi_isend, core._core.mpi_irecv
    core_complete, core_complete_all = core._core.mpi_complete, core._core.mpi_complete_all
else:  # no compiled core: every call takes the full path
    def core_send(m: Optional[_Matcher], group, data, dest, tag) -> bool:
        return False

    def core_recv(m: Optional[_Matcher], group, dst, source, tag) -> None:
        return None

    def core_exchange(m: Optional[_Matcher], group, data, dest, sendtag, source, recvtag, dst=None) -> None:
        return None

    def core_envelope(m: _Matcher, source) -> bool:
        return False

    def core_isend(m: Optional[_Matcher], group, data, dest, tag) -> None:
        return None

    def core_irecv(m: Optional[_Matcher], group, buf, source, tag) -> None:
        return None

    def core_complete(request, loads) -> None:
        return None

    def core_complete_all(requests: list, loads, results, statuses: list, fill) -> tuple:
        return range(len(requests)), []


# Weak references to every communicator's _Matcher: a plain list, since
# _progress goes over it on every pass of every wait (a WeakSet's iteration
# costs more than the rest of the pass); _progress drops the dead ones.
_matchers: "list[weakref.ref[_Matcher]]" = RUNTIME.matchers  # (the runtime's, as _by_etag)


def _register(m: _Matcher) -> None:
    _matchers.append(weakref.ref(m))
    if not m.inter:
        _by_etag[m.etag] = weakref.ref(m)


def _unregister(m: _Matcher) -> None:
    """Forget a freed communicator's matcher."""
    if _by_etag.get(m.etag, lambda: None)() is m:
        del _by_etag[m.etag]
    for ref in _matchers:
        if ref() is m:
            _matchers.remove(ref)
            return


def _progress(network) -> bool:
    """Advance the transports and every communicator's envelopes once."""
    moved = bool(network.progress())
    stale = False
    for ref in _matchers:
        m = ref()
        if m is None or m.network is not network:
            stale = True  # freed, or from a destroyed world
        elif m.busy() and m.poll():
            moved = True
    if stale:
        _matchers[:] = [r for r in _matchers if r() is not None and r().network is network]
    return moved


def _departed(network, requests: list) -> list:
    """What fails once a peer is lost: ``requests``, and every
    communicator's envelope receives on ``network``."""
    for ref in list(_matchers):
        m = ref()
        if m is not None and m.network is network:
            requests = requests + [req for _, req in m.envelopes.values()]
    return requests


def _wait_until(ready: Callable[[], bool], network, timeout: float, describe: Callable[[], str],
                requests: Callable[[], list] = list) -> None:
    """Wait until ready(), in the Network's one waiting loop (its spinning
    and sleeping, aborts, lost peers and timeouts), with a progress pass
    that moves the communicators' envelopes too. ``requests()`` are the
    transport requests ready() depends on. Its errors (a timeout, an
    abort) are MPI.Exceptions, as the requests' own are."""
    try:
        network.wait_until(ready, requests, timeout=timeout, describe=describe,
                           progress=lambda: _progress(network), departed=lambda: _departed(network, requests()))
    except CollieError as exc:
        error = _as_mpi_error(exc)  # collie's error as its cause; an MPI.Exception as it is
        if error is exc:
            raise
        raise error
