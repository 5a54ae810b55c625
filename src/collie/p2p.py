"""Point-to-point: send and receive between two ranks, blocking or not.

Names, signatures and semantics follow torch.distributed: dst/src are
global ranks (group_dst/group_src are ranks within ``group``), arrays are
filled in place, recv(src=None) receives from any rank of the group and
returns the sender's global rank. Messages from one rank to another with
the same tag (in the same group) arrive in the order they were sent.
"""

from __future__ import annotations

import pickle
from typing import Optional

import numpy as np

from . import core
from .arrays import Buffer, byte_view
from .group import ProcessGroup, resolve
from .wire import CONTEXT_SHIFT, MAX_TAG
from .work import CompletedWork, Work, wait_seconds

__all__ = ["send", "recv", "isend", "irecv", "P2POp", "batch_isend_irecv",
           "send_object_list", "recv_object_list"]

_OBJECT_TAG = MAX_TAG  # object lists travel on their own tag, apart from arrays


def _peer(g: ProcessGroup, rank: Optional[int], group_rank: Optional[int], role: str,
          what: str, allow_any: bool = False) -> Optional[int]:
    """The peer's global rank, validated for ``g``."""
    if type(rank) is int and group_rank is None and g.rank >= 0 and rank in g._index \
            and rank != g.network.rank:
        return rank  # the common case, checked at once
    g.require_member(what)
    if rank is not None and group_rank is not None:
        raise ValueError(f"{what}: give {role} or group_{role}, not both")
    if group_rank is not None:
        rank = g.global_rank(group_rank)
    if rank is None:
        if allow_any:
            return None
        raise ValueError(f"{what}: {role} is required")
    if not isinstance(rank, (int, np.integer)):
        raise TypeError(f"{what}: {role} must be an int rank, got {type(rank).__name__}")
    rank = int(rank)
    g.group_rank(rank)  # raises ValueError when not in the group
    if rank == g.network.rank:
        raise ValueError(f"{what}: rank {rank} cannot {'send to' if role == 'dst' else 'receive from'} itself")
    return rank


def _describe(g: ProcessGroup, what: str, peer, tag: int):
    g.p2p_ops += 1
    n = g.p2p_ops
    return lambda: f"{what} {'any rank' if peer is None else ('rank %d' % peer)} " \
                   f"(group {g.name}, tag {tag}, point-to-point call #{n})"


# ---- the compiled core's path ----
#
# A message that fits the ring to or from a peer on this host, in a
# contiguous array NumPy can view, goes through the compiled core
# (core.p2p_program): one call into C puts a send in its ring or takes a
# receive's message from the ring, with none of the transport's Python (a
# message of several slots whole or not at all: it never leaves one half
# moved for the full path).
# An irecv takes its message at once if it is there; else it is deferred
# until it is waited on, so that the core can wait for its message as it
# does for a collective's. Whatever the core cannot do at once (a full
# ring, a peer slower than the spin, a message not the one expected, the
# transport's Python end busy on that ring) goes the full path below, which
# handles every case. send, recv, isend and irecv are C entries
# (core.entry): a repeated call goes from C to its program, and Python sees
# it only where the core cannot.

_PROGRAMS = 512  # the most core programs kept per Network (as collectives' lanes per group)


class _CoreP2P:
    """collie.p2p's state on one Network: the core's programs by
    (peer, bytes, receiving, blocking), and the receives it deferred, in
    the order they were posted. A deferred receive is in no transport's
    books; before anything else may take a message from its peer, it is
    handed to the transport (``post``), so that a peer's messages still
    reach the receives in the order they were posted."""

    __slots__ = ("network", "programs", "deferred")

    def __init__(self, network):
        self.network, self.programs, self.deferred = network, {}, []

    def program(self, peer: int, nbytes: int, receiving: bool, blocking: bool):
        """The core's program for one such message (None: the core can't).
        A blocking one's receive spins as the Network's waits do; the
        others look once. (A one-slot send never waits: its ``blocking``
        is False.)"""
        key = (peer, nbytes, receiving, blocking and receiving)
        found = self.programs.get(key, False)
        if found is False:
            net = self.network
            if len(self.programs) >= _PROGRAMS:  # sizes can be many: bounded
                self.programs.clear()
            found = self.programs[key] = core.p2p_program(net, peer, nbytes, receiving,
                                                          net.spin_seconds if key[3] else 0.0)
        return found

    def post(self, peer: Optional[int]) -> None:
        """Hand the deferred receives from ``peer`` (None: from any) to the transport, in order."""
        with self.network.lock:
            waiting = self.deferred[:]
            self.deferred[:] = [d for d in waiting if peer is not None and not d.takes_from(peer)]
            for d in waiting:
                if peer is None or d.takes_from(peer):
                    d.post()


def _state(network) -> _CoreP2P:
    state = network.p2p
    if state is None:
        state = network.p2p = _CoreP2P(network)
    return state


def core_program(network, peer: int, nbytes: int, receiving: bool, blocking: bool):
    """The core's program for one message to or from global rank ``peer``
    on ``network`` (see _CoreP2P.program; a send's ``blocking`` is False):
    the MPI layer's envelopes take them too."""
    state = network.p2p
    if state is not None:  # the hot path: one made before
        found = state.programs.get((peer, nbytes, receiving, blocking), False)
        if found is not False:
            return found
    return _state(network).program(peer, nbytes, receiving, blocking)


def core_run(network, program, buf, tag: int) -> bool:
    """Run a one-message core program on ``buf`` with ``tag``, under the
    network's lock, where nothing broke: True once the message went into
    the peer's ring (a send) or came out of ours (a receive)."""
    if network._abort is not None or network._lost:
        return False
    with network.lock:
        return program.move(buf, tag)


def _on_core(tensor, rank, group_rank, group, tag, writable: bool):
    """(group, peer, array) for a call the core may run: the core chosen, a
    live world, a plain or viewable torch tensor that is contiguous (and
    writable, to receive into) of a dtype collie moves, a valid peer and
    tag (checked in C: core.p2p_target). Else None: the full path checks
    and explains."""
    if core.EXECUTE is not core.execute:
        return None
    return core.p2p_target(tensor, rank, group_rank, group, tag, writable)


def _core_send(g: ProcessGroup, peer: int, arr: np.ndarray, tag: int) -> bool:
    """Send through the core: True once it is in the peer's ring (a
    one-slot message is then sent), False where the core did not post it
    (the full path does)."""
    program = core_program(g.network, peer, arr.nbytes, False, False)
    if program is None or not core_run(g.network, program, arr, (g.context << CONTEXT_SHIFT) | tag):
        return False
    g.p2p_ops += 1
    return True


class _DeferredRecv(Work):
    """An irecv the core takes when it is waited on (see _CoreP2P); once
    handed to the transport (``post``), an ordinary Work."""

    def __init__(self, g: ProcessGroup, peer: int, arr: np.ndarray, tag: int, state: _CoreP2P, program):
        super().__init__(g.network, (), _describe(g, "receive from", peer, tag), keep=arr, timeout=g.timeout)
        self.peer, self._tag, self._state, self._program = peer, (g.context << CONTEXT_SHIFT) | tag, state, program
        with g.network.lock:  # the async calls' thread may be handing the list over (progress)
            state.deferred.append(self)

    def takes_from(self, peer: int) -> bool:
        return peer == self.peer

    def post(self) -> None:
        self._state = None
        try:
            self._requests = [self._network.post_recv(self.peer, self._tag, byte_view(self._keep), None, None)]
        except BaseException as exc:  # a lost peer, a closed network: what wait() raises
            self._error, self._finished, self._keep = exc, True, None
        self._on_done = lambda: self.peer

    def _take(self, blocking: bool) -> bool:
        """Whether the core took the message (then this receive is done);
        else it is handed to the transport. Only the first deferred receive
        from a peer may take that peer's next message."""
        net = self._network
        with net.lock:
            state = self._state
            if state is None:  # another thread's call handed it over meanwhile
                return False
            arr = self._keep
            program = self._program if blocking else state.program(self.peer, arr.nbytes, True, False)
            deferred = state.deferred
            first = deferred[0] is self or next(d for d in deferred if d is self or d.takes_from(self.peer)) is self
            if first and core_run(net, program, arr, self._tag):
                deferred.remove(self)
                self._state, self._finished, self._keep, self._result = None, True, None, self.peer
                return True
            state.post(self.peer)
        return False

    def wait(self, timeout=None) -> bool:
        if self._state is not None:
            wait_seconds(timeout, self._timeout)  # a bad timeout is refused before the message is taken
            if self._take(True):
                return True
        return super().wait(timeout)

    def is_completed(self) -> bool:
        if self._state is not None and self._take(False):
            return True
        return super().is_completed()


# ---- batches through the core
#
# A batch_isend_irecv with a message of at least 64 KiB whose messages the
# core can all move (peers on this host, arrays it can view, one tag) is
# one step of a core program (core.batch_program), as a collective's step
# is: its sends go single copy, and the peers read each other's messages
# at once. The call posts the sends and takes what receives it can; if
# anything is left, the first of its Works waited on finishes the whole
# step in C, receives and acknowledgements together. Meanwhile the batch
# is deferred as an irecv is: before Python moves messages it is handed
# over (post), and what it left under way enters the transport's books.
# It never leaves a message half moved, so other calls may use the rings
# in between. Smaller batches go call by call (the C entries are quicker
# for them).

class _Batch:
    """A batch the core started and paused: its program (out of the cache
    until the batch ends), buffers, tag, Works, and the peers it receives from."""

    __slots__ = ("network", "state", "program", "key", "bufs", "tag", "works", "sources")

    def __init__(self, state: _CoreP2P, program, key: tuple, bufs: tuple, tag: int, works: list):
        self.network, self.state, self.program, self.key = state.network, state, program, key
        self.bufs, self.tag, self.works = bufs, tag, works
        self.sources = {peer for receiving, peer, _ in key if receiving}

    def takes_from(self, peer: int) -> bool:
        return peer in self.sources

    def go_on(self, spin: float, final: bool) -> bool:
        """Go on with the batch's step in the core, under the network's
        lock: True once it ended (done, or handed back; its Works settled),
        False where it paused again. ``final``: hand back whatever is left
        after ``spin`` seconds."""
        net = self.network
        if net._abort is not None or net._lost:  # something broke: Python's checks
            final, spin = True, 0.0
        done, mask, rids = self.program.batch(self.bufs, self.tag, True, spin, final)
        if rids is None and not done:
            return False
        self.state.programs[self.key] = self.program  # free for the next such batch
        _settle(self.network, self.key, self.bufs, self.tag, self.works, mask, dict(rids or ()))
        return True

    def post(self) -> None:
        """Hand the batch over to Python (Network.progress, or a later call
        taking messages from its peers; _CoreP2P.post took it off the
        deferred list)."""
        self.go_on(0.0, True)


def _settle(net, key: tuple, bufs: tuple, tag: int, works: list, mask: int, rids: dict) -> None:
    """Complete the Works of a batch's messages that moved (``mask``, as
    _core's batch() returns it); enter the rest in the transport's books:
    the single-copy sends posted but not acknowledged (``rids``: send j's
    id), then, in order, whatever was not posted."""
    shm = net.shm
    nsend = sum(1 for receiving, _, _ in key if not receiving)
    sends = recvs = 0
    for work, (receiving, peer, _), buf in zip(works, key, bufs):
        work._batch = None
        try:
            if receiving:
                bit, recvs = nsend + recvs, recvs + 1
                if mask >> bit & 1:
                    work._finished, work._keep, work._result = True, None, peer
                else:
                    work._requests = [net.post_recv(peer, tag, byte_view(buf), None, None)]
                    work._on_done = lambda peer=peer: peer
            else:
                bit, sends = sends, sends + 1
                if bit in rids:
                    work._requests = [shm.adopt_rendezvous(shm._out[peer], shm._in[peer], rids[bit],
                                                           byte_view(buf), tag, 0)]
                elif mask >> bit & 1:
                    work._finished, work._keep = True, None
                else:
                    work._requests = [net.post_send(peer, tag, byte_view(buf), 0)]
        except BaseException as exc:  # a lost peer, a closed network: what wait() raises
            work._error, work._finished, work._keep = exc, True, None


class _BatchWork(Work):
    """One message of a batch the core paused: waiting on it (or asking
    whether it is done) goes on with the whole batch in the core."""

    _batch: Optional[_Batch] = None

    def _go_on(self, blocking: bool) -> None:
        batch = self._batch
        with self._network.lock:
            if batch is not None and self._batch is batch:  # (another thread may have ended it)
                if batch.go_on(self._network.spin_seconds if blocking else 0.0, blocking):
                    batch.state.deferred.remove(batch)

    def wait(self, timeout=None) -> bool:
        if self._batch is not None:
            wait_seconds(timeout, self._timeout)  # a bad timeout is refused before anything moves
            self._go_on(True)
        return super().wait(timeout)

    def is_completed(self) -> bool:
        if self._batch is not None:
            self._go_on(False)
        return super().is_completed()


# The call itself (_core.c's batch_fast) waits for its peers as long as
# moving its bytes at 1 GB/s would take (64 us for 64 KiB), then leaves the
# rest to the Works: in a lockstep exchange the peers are there by then and
# the batch ends in the call, where a receive posted well ahead of its
# message costs that much once.
_FIRST_SPIN_PER_BYTE = 1e-9


def _prepare_batch(p2p_op_list):
    """What batch_fast needs before it takes a batch: its program, made for
    the batch's shape (None cached where the core cannot move it), and the
    receives deferred before it from its peers handed over. Then batch_fast
    runs it (its result, as batch_fast gives it)."""
    key, network = [], None
    for p in p2p_op_list:  # (batch_fast found every op's target: it said False)
        receiving = p.op is irecv
        g, peer, arr = core.p2p_target(p.tensor, p.peer, p.group_peer, p.group, p.tag, receiving)
        key.append((receiving, peer, arr.nbytes))
        network = g.network
    key = tuple(key)
    state = _state(network)
    with network.lock:
        if key not in state.programs:  # none made yet, or a paused batch of this shape holds it
            if len(state.programs) >= _PROGRAMS:
                state.programs.clear()
            state.programs[key] = core.batch_program(network, key)
        if state.deferred:  # receives posted before take their messages first
            for peer in {peer for receiving, peer, _ in key if receiving}:
                state.post(peer)
        return core.batch_fast(p2p_op_list, True)


def _under_way(p2p_op_list, program, key: tuple, arrays: tuple, ons, tag: int, mask: int, rids) -> list:
    """The Works of a batch the core started and did not end: paused
    (``rids`` None), deferred until waited on, or handed back (see _settle)."""
    network = ons[0][0].network
    state = network.p2p
    works = [_BatchWork(network, (), _describe(g, "receive from" if receiving else "send to", peer, p.tag),
                        keep=arr, timeout=g.timeout)
             for (g, peer, arr), (receiving, _, _), p in zip(ons, key, p2p_op_list)]
    with network.lock:
        if rids is not None:
            _settle(network, key, arrays, tag, works, mask, dict(rids))
        else:
            batch = _Batch(state, program, key, arrays, tag, works)
            for w in works:
                w._batch = batch
            state.deferred.append(batch)
    return works


def _post_send(tensor, dst, group, tag, group_dst, what):
    g = resolve(group)
    peer = _peer(g, dst, group_dst, "dst", what)
    buf = Buffer(tensor, writable=False, what=f"{what} tensor")
    # _peer checked the peer: post without the Network's second check
    return g, peer, buf, g.network.post_send(peer, g.p2p_tag(tag), buf.bytes(), 0)


def _post_recv(tensor, src, group, tag, group_src, what):
    g = resolve(group)
    peer = _peer(g, src, group_src, "src", what, allow_any=True)
    buf = Buffer(tensor, writable=True, what=f"{what} tensor")
    state = g.network.p2p
    if state is not None and state.deferred:  # they were posted first: they take messages first
        state.post(peer)
    if peer is None:  # any source: the Network resolves it
        req = g.network.irecv(None, g.p2p_tag(tag), buf.bytes(), candidates=g.ranks)
    else:
        req = g.network.post_recv(peer, g.p2p_tag(tag), buf.bytes(), None, None)
    return g, peer, buf, req


def isend(tensor, dst: Optional[int] = None, group: Optional[ProcessGroup] = None, tag: int = 0,
          group_dst: Optional[int] = None) -> Work:
    """Start sending ``tensor`` to ``dst``; the tensor must not change until
    the returned Work completes."""
    on = _on_core(tensor, dst, group_dst, group, tag, False)
    if on is not None and _core_send(*on, tag):
        return CompletedWork()
    return _isend(tensor, dst, group, tag, group_dst)


def _isend(tensor, dst=None, group=None, tag=0, group_dst=None) -> Work:
    """isend's full path: every tensor and peer, every check."""
    g, peer, buf, req = _post_send(tensor, dst, group, tag, group_dst, "isend")
    return Work(g.network, [req], _describe(g, "send to", peer, tag), keep=buf, timeout=g.timeout)


def irecv(tensor, src: Optional[int] = None, group: Optional[ProcessGroup] = None, tag: int = 0,
          group_src: Optional[int] = None) -> Work:
    """Start receiving into ``tensor`` from ``src`` (any rank of the group
    when None). The Work's result() is the sender's global rank."""
    on = _on_core(tensor, src, group_src, group, tag, True)
    if on is not None:
        g, peer, arr = on
        program = core_program(g.network, peer, arr.nbytes, True, True)
        if program is not None:
            core_program(g.network, peer, arr.nbytes, True, False)  # the C entry's look, on the next such call
            return _DeferredRecv(g, peer, arr, tag, g.network.p2p, program)
    g, peer, buf, req = _post_recv(tensor, src, group, tag, group_src, "irecv")

    def done():
        buf.finish()
        return req.peer

    return Work(g.network, [req], _describe(g, "receive from", peer, tag), on_done=done, keep=buf,
                timeout=g.timeout)


# The blocking calls post and wait without making a Work: the same requests
# and the same waiting loop, with less to build on the hot path.

def send(tensor, dst: Optional[int] = None, group: Optional[ProcessGroup] = None, tag: int = 0,
         group_dst: Optional[int] = None) -> None:
    """Send ``tensor`` to ``dst`` and return once it may be reused."""
    on = _on_core(tensor, dst, group_dst, group, tag, False)
    if on is not None and _core_send(*on, tag):
        return
    _send(tensor, dst, group, tag, group_dst)


def _send(tensor, dst=None, group=None, tag=0, group_dst=None) -> None:
    """send's full path."""
    g, peer, buf, req = _post_send(tensor, dst, group, tag, group_dst, "send")
    if not req.done:
        g.network.wait((req,), timeout=g.timeout, describe=_describe(g, "send to", peer, tag))


def recv(tensor, src: Optional[int] = None, group: Optional[ProcessGroup] = None, tag: int = 0,
         group_src: Optional[int] = None) -> int:
    """Receive into ``tensor`` from ``src`` (any rank when None); returns the
    sender's global rank."""
    on = _on_core(tensor, src, group_src, group, tag, True)
    if on is not None:
        g, peer, arr = on
        program = core_program(g.network, peer, arr.nbytes, True, True)
        if program is not None and not any(d.takes_from(peer) for d in g.network.p2p.deferred) \
                and core_run(g.network, program, arr, (g.context << CONTEXT_SHIFT) | tag):
            g.p2p_ops += 1
            return peer
    return _recv(tensor, src, group, tag, group_src)


def _recv(tensor, src=None, group=None, tag=0, group_src=None) -> int:
    """recv's full path."""
    g, peer, buf, req = _post_recv(tensor, src, group, tag, group_src, "recv")
    g.network.wait((req,), timeout=g.timeout, describe=_describe(g, "receive from", peer, tag))
    buf.finish()
    return req.peer


# Their repeated calls go from C to the core (core.entry); an irecv whose
# message is not there yet is deferred, by irecv itself.
isend, send, recv = core.entry(isend, _isend), core.entry(send, _send), core.entry(recv, _recv)
irecv = core.entry(irecv, irecv)


class P2POp:
    """One operation of batch_isend_irecv: ``op`` is collie.isend or collie.irecv."""

    def __init__(self, op, tensor, peer: Optional[int] = None, group: Optional[ProcessGroup] = None,
                 tag: int = 0, group_peer: Optional[int] = None):
        if op not in (isend, irecv):
            raise ValueError("P2POp: op must be collie.isend or collie.irecv")
        self.op, self.tensor, self.peer, self.group, self.tag, self.group_peer = \
            op, tensor, peer, group, tag, group_peer

    def __repr__(self) -> str:
        return f"P2POp({self.op.__name__}, peer={self.peer}, tag={self.tag})"


def batch_isend_irecv(p2p_op_list: list) -> list:
    """Start every send and receive of the list at once; returns their Works.

    The order of the ops does not matter: no transport blocks while
    posting, so no pairing of two batches can deadlock. Sends are posted
    first, so that a peer waiting on one gets it before this rank spends
    time on its receives (one whose message already waits completes as it
    is posted).
    """
    if not isinstance(p2p_op_list, (list, tuple)):
        raise TypeError("batch_isend_irecv takes a list of P2POp")
    for p in p2p_op_list:  # all checked before anything is posted
        if not isinstance(p, P2POp):
            raise TypeError("batch_isend_irecv takes a list of P2POp")
    if _batch_fast is not None:  # through the core (see _Batch)
        works = _batch_fast(p2p_op_list)
        if works is False:
            works = _prepare_batch(p2p_op_list)
        if works.__class__ is list:
            return works
        if works:
            return _under_way(p2p_op_list, *works)
    works = [None] * len(p2p_op_list)
    for i, p in enumerate(p2p_op_list):
        if p.op is isend:
            works[i] = isend(p.tensor, p.peer, p.group, p.tag, group_dst=p.group_peer)
    for i, p in enumerate(p2p_op_list):
        if p.op is irecv:
            works[i] = irecv(p.tensor, p.peer, p.group, p.tag, group_src=p.group_peer)
    return works


if core.batch_fast is not None:
    _batch_fast = core.batch_fast
    core.set_batching(P2POp, irecv, CompletedWork, core.BATCH_SINGLE_COPY_BYTES, _FIRST_SPIN_PER_BYTE, CONTEXT_SHIFT)
else:
    _batch_fast = None


def send_object_list(object_list: list, dst: Optional[int] = None, group: Optional[ProcessGroup] = None,
                     device=None, group_dst: Optional[int] = None, use_batch: bool = False) -> None:
    """Send picklable objects to ``dst``, which calls recv_object_list with a
    list of the same length. ``device`` and ``use_batch`` are torch's, and
    change nothing here (the objects travel as two messages either way)."""
    g = resolve(group)
    peer = _peer(g, dst, group_dst, "dst", "send_object_list")
    payload = pickle.dumps(list(object_list), protocol=pickle.HIGHEST_PROTOCOL)
    size = np.array([len(payload)], dtype=np.int64)
    t = g.p2p_tag(_OBJECT_TAG)
    reqs = [g.network.isend(peer, t, byte_view(size)), g.network.isend(peer, t, memoryview(payload))]
    Work(g.network, reqs, _describe(g, "send_object_list to", peer, _OBJECT_TAG), timeout=g.timeout).wait()


def recv_object_list(object_list: list, src: Optional[int] = None, group: Optional[ProcessGroup] = None,
                     device=None, group_src: Optional[int] = None, use_batch: bool = False) -> int:
    """Receive objects sent by send_object_list into ``object_list`` (in
    place); returns the sender's global rank."""
    g = resolve(group)
    peer = _peer(g, src, group_src, "src", "recv_object_list", allow_any=True)
    t = g.p2p_tag(_OBJECT_TAG)
    size = np.zeros(1, dtype=np.int64)
    describe = _describe(g, "recv_object_list from", peer, _OBJECT_TAG)
    head = g.network.irecv(peer, t, byte_view(size), candidates=g.ranks if peer is None else None)
    Work(g.network, [head], describe, timeout=g.timeout).wait()
    sender = head.peer
    payload = bytearray(int(size[0]))
    body = g.network.irecv(sender, t, memoryview(payload))
    Work(g.network, [body], describe, timeout=g.timeout).wait()
    objects = pickle.loads(payload)
    if len(objects) != len(object_list):
        raise ValueError(f"recv_object_list: rank {sender} sent {len(objects)} objects but the "
                         f"list has room for {len(object_list)}")
    object_list[:] = objects
    return sender
