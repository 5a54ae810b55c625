"""This process's connections to every other rank, and the one place it waits.

The Network routes each peer to one transport (shared memory for peers on
this host, TCP for the others, or one of them for all when forced), and owns
the waiting loop every blocking call ends in: advance the transports, spin a
little while progress is likely to come soon, then sleep on this rank's
doorbell until a peer or a transport thread rings it. While waiting it
watches for the two ways a wait can go wrong: a peer that is gone (PeerError
at once, not at the timeout) and a peer that never comes (CollieTimeout).

Every rank keeps a TCP connection to every peer even when data goes through
shared memory: the kernel closes it when a process dies however it dies, so
it is how ranks learn of each other's deaths, and it carries control
messages (such as "abort: ranks called different collectives").
"""

from __future__ import annotations

import os
import platform
import socket
import struct
import sys
import threading
import time
from typing import Callable, Iterable, Optional

import numpy as np

from .errors import AbortedError, CollieError, CollieTimeout, MismatchError, PeerError
from .transports.base import Request, Transport
from .transports.doorbell import Doorbell
from .wire import COLLECTIVE_BIT, CONTEXT_SHIFT, LEAVE_CONTEXT, MAX_TAG, meta_text

try:  # the network's lock: the compiled core takes it on every call, and its own costs it least
    from ._core import RLock
except ImportError:
    RLock = threading.RLock

BACKENDS = ("auto", "shm", "tcp")
# The shm transport relies on x86-64's memory ordering (see transports/shm.py).
_SHM_OK = platform.machine().lower() in ("x86_64", "amd64") and sys.platform.startswith("linux")

# How long a waiter keeps polling before it sleeps on the doorbell, when
# every rank of this host has a core. Polling catches a peer that answers
# within microseconds without paying for a futex sleep and wake-up. It must
# outlast such a wake-up, or two ranks in lockstep fall into taking turns
# asleep (each waits longer than its spin for the other to wake): on a VM
# whose idle cores halt, a wake-up took 50 us at the median and hundreds at
# the tail, and with a 50 us spin 2% of 8-byte all_reduce calls took 300 us.
SPIN_SECONDS = float(os.environ.get("COLLIE_SPIN_US", "1000")) * 1e-6
# Unless COLLIE_SPIN_US sets it, a waiter's spin adapts between
# SPIN_SECONDS and this: a wait that outlasted the spin but ended within
# this long after its sleep began doubles the spin, one that slept longer
# halves it. On a loaded machine (a CPU-bound process beside two ranks on
# two cores) the peer is off its core for a time slice of a few
# milliseconds at a time; a rank that sleeps then loses its own core to
# the load too, and an 8-byte all_reduce took 80-220 us where MPICH, which
# never stops polling, took 4-9 (2026-11-29). A peer that computes for
# longer between messages leaves the spin at SPIN_SECONDS.
SPIN_LIMIT_SECONDS = 20e-3
# More ranks than cores: spin at most this long, yielding, then sleep, so
# that oversubscribed ranks do not starve the peer they wait for.
CROWDED_SPIN_SECONDS = 10e-6
# A thread that runs asynchronous calls (collectives.Background) waits while
# its own process computes (DDP's backward): polling there takes a core from
# that work. Such a thread polls at most this long (spin_briefly_on_this_thread):
# DDP's exposed communication at 2 ranks on 2 cores, in three pairs of runs
# against the 1 ms spin, was 10-25% shorter with 50 us.
ASYNC_SPIN_SECONDS = 50e-6
_this_thread = threading.local()  # .spin: set on such a thread
# Longest single sleep: how often a sleeper re-checks deadlines and deaths.
SLEEP_SLICE = 0.1
# A collective stuck this long tells its group which call it is in, so that
# ranks blocked in calls that differ but exchange no message (a broadcast
# with two different roots) find out, instead of waiting for the timeout.
ANNOUNCE_AFTER = 1.0
_STATE = struct.Struct("<qqq")  # tag, meta, pipeline parts of the call a stuck rank is in
# A call that times out asks its group's ranks where they are, and waits
# this long for the answers, to name the ranks that never arrived.
QUERY_GRACE = 0.5
_QUERY = struct.Struct("<q")        # the context asked about
_ANSWER = struct.Struct("<qqq")     # context, last call finished on it (-1: none), tag of the call now running;
                                    # then the ranks the answering rank is waiting for (int32 each)
_ERRORS = {"MismatchError": MismatchError, "PeerError": PeerError, "CollieTimeout": CollieTimeout}


def spin_briefly_on_this_thread() -> None:
    """Bound this thread's polling in waits by ASYNC_SPIN_SECONDS (see there)."""
    _this_thread.spin = ASYNC_SPIN_SECONDS


def host_identity() -> str:
    """Which machine this process runs on: ranks with equal identities share
    memory. COLLIE_HOST_ID overrides it (tests use it to fake several hosts)."""
    override = os.environ.get("COLLIE_HOST_ID")
    if override:
        return override
    return f"{socket.gethostname()}/{boot_id()}"


def boot_id() -> str:
    """This kernel's boot id: processes that share it share the machine's
    cores, even under other hostnames (network namespaces, containers)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def _peers_of(requests) -> tuple:
    """The ranks some request of ``requests`` waits on (every candidate of
    an any-source receive still looking for its sender)."""
    peers = set()
    for r in requests:
        if r.peer >= 0:
            peers.add(r.peer)
        elif isinstance(r, AnySourceRequest):
            peers.update(r.candidates)
    return tuple(peers)


class AnySourceRequest(Request):
    """A receive from whichever peer sends a message with the tag first.
    It becomes a real receive (``inner``) once a transport has one to offer."""

    __slots__ = ("dst", "combine", "meta", "candidates", "inner")

    def __init__(self, tag: int, dst: memoryview, combine, meta, candidates):
        super().__init__("recv", -1, tag, len(dst))
        self.dst, self.combine, self.meta = dst, combine, meta
        self.candidates = candidates
        self.inner: Optional[Request] = None


class Network:
    """Routes messages to peers and waits for them. One per process."""

    # What every call of the compiled core checks or sets (the call running,
    # and whether anything broke), as slots it reads at fixed offsets
    # (_core.c's set_hot_slots); the rest in the __dict__.
    __slots__ = ("current", "_abort", "_lost", "__dict__", "__weakref__")

    def __init__(self, rank: int, size: int, store, job_id: str, *, backend: str = "auto",
                 timeout: float = 300.0, token: bytes | None = None,
                 master_addr: str = "127.0.0.1", local_world_size: int | None = None,
                 topology=None):
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(map(repr, BACKENDS))}, not {backend!r}")
        self.rank, self.size, self.timeout = rank, size, timeout
        self.lock = RLock()
        self._lost: dict[int, BaseException] = {}   # peer -> why it is gone (set by tcp threads)
        self._failed_seen: set[int] = set()
        # Why this rank's communication is broken, once it is: (the rank that
        # said so, error kind, culprit ranks, message). From then on every call raises it.
        self._abort: Optional[tuple[int, str, tuple, str]] = None
        self._told = False  # whether this rank has told its groups of _abort
        # The ranks this rank's last wait timed out on, until a wait ends well
        # (a point-to-point timeout tells no one: see the answer to a query).
        self._stuck_on: tuple = ()
        self._states: dict[int, tuple[int, int, int]] = {}   # peer -> (tag, meta, parts) it is stuck in
        self._leaving: set[int] = set()                       # peers that said they are leaving
        self._answers: dict[int, tuple] = {}  # peer -> (context, done seq, current tag, ranks it waits for)
        self._waiting: list = []  # the requests this rank's _wait waits on (answers to queries)
        #: The tag of the collective this rank is running (0: none), and per
        #: group context the (sequence, meta) of the last one it finished:
        #: what tells a stale message (see _unexpected) and answers queries.
        self.current = 0
        self.done: dict[int, tuple[int, int]] = {}
        self._failed: set[tuple[int, int]] = set()  # (context, sequence) of calls that failed here
        #: context -> (global ranks, name) of every group made on this network.
        self.groups: dict[int, tuple[tuple, str]] = {}
        self._closed = False
        self.p2p = None  # collie.p2p's state for the compiled core (p2p._CoreP2P), made on first use
        self.topology = None  # the hosts and the link between them (topology.settle, at init)

        hosts = self._exchange_hosts(store, job_id, topology)
        self.hosts = tuple(hosts)  # each rank's host: what topological algorithms group by
        local = [p for p in range(size) if p != rank and hosts[p] == hosts[rank]]
        remote = [p for p in range(size) if p != rank and hosts[p] != hosts[rank]]
        if backend == "shm" and remote:
            raise ValueError(f"backend='shm' needs every rank on one host, but ranks {remote} "
                             f"are on other hosts than rank {rank}; use backend='auto' or 'tcp'")
        if backend == "shm" and not _SHM_OK:
            raise ValueError(f"backend='shm' needs x86-64 Linux (its memory ordering), not {platform.machine()}")
        shm_peers = local if backend in ("auto", "shm") and _SHM_OK else []
        from .transports.tcp import TcpTransport, striping
        streams, stripe_min = striping(os.environ)  # a bad value fails before anything is made
        self.local_world_size = local_world_size or (len(local) + 1)
        # More ranks than cores on this machine (this host's, or more where
        # hosts share one kernel: the test bed's namespaces): spin less, and
        # yield while spinning, so that the peers we wait for get the CPU.
        # Four ranks of two "hosts" spinning 1 ms on the bed's two cores took
        # a hier all_reduce of 4 MiB from 35 ms to 45-48 (docs/multihost.md).
        self._crowded = max(self.local_world_size, self._same_kernel) > (os.cpu_count() or 1)
        self._spin = min(SPIN_SECONDS, CROWDED_SPIN_SECONDS) if self._crowded else SPIN_SECONDS
        self._adapt = not self._crowded and "COLLIE_SPIN_US" not in os.environ  # (see SPIN_LIMIT_SECONDS)

        self.shm = None
        if shm_peers:
            from .transports.shm import ShmTransport
            self.shm = ShmTransport(rank, shm_peers, store, job_id, timeout, crowded=self._crowded)
            self.doorbell = self.shm.doorbell
        else:
            self.doorbell = Doorbell.private()
        try:
            # Several connections to each rank on another host: one does not fill a fast link.
            self.tcp = TcpTransport(rank, size, store, job_id, self.doorbell, timeout, token,
                                    on_peer_lost=self._peer_lost, on_control=self._control,
                                    master_addr=master_addr, streams=streams, striped=remote,
                                    stripe_min=stripe_min)
        except BaseException:
            if self.shm is not None:
                self.shm.close()
            raise
        self.routes: list[Optional[Transport]] = [
            self.shm if p in shm_peers else (self.tcp if p != rank else None) for p in range(size)]
        self.transports: tuple[Transport, ...] = tuple(t for t in (self.shm, self.tcp) if t is not None)
        self._windows = next((t for t in self.transports if t.windows), None)
        self._control_route = next(t for t in self.transports if t.liveness)
        self._progress = tuple(t.progress for t in self.transports)  # looked up once: progress() runs often
        for t in self.transports:
            t.unexpected = self._unexpected
        self.backend_of = ["self" if p == rank else self.routes[p].name for p in range(size)]

    def _exchange_hosts(self, store, job_id: str, spec) -> list[str]:
        """Each rank's host: its machine (``machines``), or where
        COLLIE_TOPOLOGY (``spec``, parsed) puts it; and how many ranks share
        this rank's kernel (boot id), hence its cores. Every rank checks that
        all ranks were given the same COLLIE_TOPOLOGY, so that a bad one
        raises the same error on all of them (rank 0, which serves the
        store, waits for the others to be done with it: group.py)."""
        from . import topology
        text = "" if spec is None else spec.text
        boot = boot_id()
        store.set(f"host/{job_id}/{self.rank}", f"{host_identity()}\0{boot}\0{text}".encode())
        every = [store.get(f"host/{job_id}/{p}").decode().split("\0", 2) for p in range(self.size)]
        self.machines = tuple(f[0] for f in every)  # what shares memory
        self._same_kernel = sum(f[1] == boot for f in every) if boot else 1  # ranks sharing these cores
        texts = [f[2] for f in every]
        self.hosts_source = "COLLIE_HOST_ID" if os.environ.get("COLLIE_HOST_ID") else "hostnames"
        differ = next((p for p, t in enumerate(texts) if t != texts[0]), None)
        if differ is not None:
            raise ValueError(f"{topology.ENV} differs between ranks: rank 0 has {texts[0]!r}, "
                             f"rank {differ} has {texts[differ]!r}")
        if spec is None or spec.hosts is None and spec.per_host is None:
            return list(self.machines)
        stated = topology.assign(spec, self.size)
        topology.check_machines(stated, self.machines)
        self.hosts_source = topology.ENV
        return [f"host {h} of {topology.ENV}" for h in stated]

    # ---- called from transport threads: record, then wake the waiter ----

    def _peer_lost(self, peer: int, error: BaseException) -> None:
        self._lost.setdefault(peer, error)
        self.doorbell.ring()

    def _control(self, peer: int, payload: bytes) -> None:
        """A control message from ``peer`` (on its TCP receiver thread)."""
        kind, _, body = payload.partition(b":")
        if kind == b"state":
            self._states[peer] = _STATE.unpack(body)
        elif kind == b"abort":
            if self._abort is None:
                error, culprits, message = body.decode(errors="replace").split("\0", 2)
                self._abort = (peer, error, tuple(int(r) for r in culprits.split(",") if r), message)
        elif kind == b"leaving":
            self._leaving.add(peer)
        elif kind == b"query":
            (context,) = _QUERY.unpack(body)
            seq = self.done.get(context, (-1, 0))[0]
            # A rank whose call already failed waits, in effect, on whom it
            # blamed (a timed-out point-to-point wait too, which breaks no
            # group); never on itself (it may be told it is the one blamed).
            blocked = _peers_of([r for r in self._waiting if not r.finished]) or (
                self._abort[2] if self._abort is not None else self._stuck_on)
            waiting = np.array([r for r in blocked if r != self.rank], np.int32).tobytes()
            self.send_control(peer, b"answer:" + _ANSWER.pack(context, seq, self.current) + waiting)
        elif kind == b"answer":
            waiting = tuple(np.frombuffer(body, np.int32, offset=_ANSWER.size).tolist())
            self._answers[peer] = _ANSWER.unpack_from(body) + (waiting,)
        self.doorbell.ring()

    def _unexpected(self, peer: int, tag: int, meta: int, nbytes: int) -> bool:
        """A transport's hook for a message no posted receive takes: True
        if no receive ever will. That is a message of a collective call this
        rank has already finished: the sender's call needed this rank to
        receive it and this rank's did not, so the two called it differently
        (a broadcast's root of one only sends). Such a message is dropped,
        and the group told. Called on transport threads too."""
        if not tag & COLLECTIVE_BIT:
            return False  # point to point: a receive may come any time
        context, seq = tag >> CONTEXT_SHIFT, tag & MAX_TAG
        if self._abort is not None and context != LEAVE_CONTEXT:
            return True  # broken: no collective will take it
        done = self.done.get(context)
        if done is None or seq > done[0]:
            return False  # a call this rank has not run yet
        if (context, seq) in self._failed:
            return True  # a late arrival to a call that timed out or failed here: just drop it
        ranks, name = self.groups.get(context, ((peer,), f"of context {context}"))
        mine = meta_text(done[1]) if seq == done[0] else "it differently"
        self.fail(ranks, "MismatchError", (peer,),
                  f"rank {peer} called {meta_text(meta)} but rank {self.rank} called {mine} (call #{seq} "
                  f"on group {name}: rank {peer} sent data that rank {self.rank}'s call did not take)")
        return True

    def fail(self, ranks: Iterable[int], kind: str, culprits: tuple, reason: str) -> None:
        """Record that communication is broken (the first reason wins) and
        tell ``ranks`` once, so that their waits raise ``kind`` at once and
        their later calls raise it too, instead of waiting on this rank."""
        if self._abort is None:
            self._abort = (self.rank, kind, tuple(culprits), reason)
        if not self._told:
            self._told = True
            told_by, kind, culprits, reason = self._abort
            payload = f"abort:{kind}\0{','.join(map(str, culprits))}\0{reason}".encode()
            for p in ranks:
                if p != self.rank:
                    self.send_control(p, payload)
        self.doorbell.ring()

    # ---- posting ----

    def _route(self, peer: int) -> Transport:
        if not 0 <= peer < self.size or peer == self.rank:
            raise ValueError(f"rank {self.rank}: peer {peer} is not another rank of a world of {self.size}")
        if self._closed:
            raise CollieError("the process group was destroyed")
        return self.routes[peer]

    def isend(self, peer: int, tag: int, data: memoryview, meta: int = 0) -> Request:
        transport = self._route(peer)
        with self.lock:
            if peer in self._lost:
                self._fail_lost()
            return transport.isend(peer, tag, data, meta)

    def irecv(self, peer: Optional[int], tag: int, dst: memoryview, combine=None,
              meta: Optional[int] = None, candidates: Optional[Iterable[int]] = None) -> Request:
        """Post a receive; ``peer=None`` takes the first message with ``tag``
        from any of ``candidates`` (default: every peer)."""
        if peer is None:
            cands = tuple(p for p in (range(self.size) if candidates is None else candidates)
                          if p != self.rank)
            for p in cands:
                self._route(p)
            req = AnySourceRequest(tag, dst, combine, meta, cands)
            with self.lock:
                self._resolve_any(req)
            return req
        transport = self._route(peer)
        with self.lock:
            if peer in self._lost:
                self._fail_lost()
            return transport.irecv(peer, tag, dst, combine, meta)

    def probe(self, peer: int, tag: int) -> Optional[int]:
        """Size of the message a receive for (peer, tag) would take now, if
        it has started arriving; else None. Advances the transports first."""
        transport = self._route(peer)
        self.progress()
        with self.lock:
            return transport.probe(peer, tag)

    def window(self, rank: int) -> memoryview:
        """The shared window of ``rank`` (this rank or a peer on this host)."""
        if self._windows is None:
            raise ValueError(f"rank {self.rank} has no shared-memory peers, so no shared windows")
        return self._windows.window(rank)

    def window_capacity(self) -> int:
        """Bytes of every shared window the ranks of this host agree to use (0: none)."""
        return self._windows.window_capacity() if self._windows is not None else 0

    # Posting for callers that already checked the peer (the engine's peers
    # are valid by construction, p2p checks against the group): no second
    # argument check on the hot path of small calls.

    def post_send(self, peer: int, tag: int, data: memoryview, meta: int) -> Request:
        with self.lock:
            if self._lost:
                self._fail_lost()
            return self.routes[peer].isend(peer, tag, data, meta)

    def post_recv(self, peer: int, tag: int, dst: memoryview, combine, meta: int) -> Request:
        with self.lock:
            if self._lost:
                self._fail_lost()
            return self.routes[peer].irecv(peer, tag, dst, combine, meta)

    def exchange(self, recvs, sends, tag: int, meta: int, timeout: float,
                 describe: Callable[[int], str], step: int, call, inflight=()) -> None:
        """One step of a collective: post every send ``(peer, data)``, then
        every receive ``(peer, dst, combine)``, all with ``tag`` and
        ``meta``, and wait until they are all done. As post_send, post_recv
        and wait() in a row, with one lock hold for the posting and wait()'s
        fast paths (the cost of small calls is mostly such fixed costs).
        Sends go first: a peer waiting on us gets our message before we
        spend time on receives (one whose message is already here completes
        as it is posted, combine included). The verifier guarantees that no
        receive of a step writes what a send of it reads, so the order is free.
        ``describe(step)`` names the call in errors; ``call`` as for wait();
        ``inflight``: requests of the step posted already, waited on too."""
        routes = self.routes
        if self._abort is not None:
            self.check(lambda: describe(step), tag)
        with self.lock:
            if self._lost:
                self._fail_lost()
            requests = list(inflight)
            for peer, data in sends:
                requests.append(routes[peer].isend(peer, tag, data, meta))
            for peer, dst, combine in recvs:
                requests.append(routes[peer].irecv(peer, tag, dst, combine, meta))
            for req in requests:
                if not req.done:
                    break
            else:
                return
            for progress in self._progress:
                progress()
        for req in requests:
            if not req.done:
                break
        else:
            return
        self._wait(requests, timeout, lambda: describe(step), call)

    def send_control(self, peer: int, payload: bytes) -> None:
        if peer not in self._lost:
            try:
                self._control_route.send_control(peer, payload)
            except OSError:
                pass  # the peer is gone; its death is reported elsewhere

    def abort(self, peers: Iterable[int], error: CollieError) -> None:
        """A call of this rank failed with ``error``: tell ``peers`` (its
        group), whose waits then raise the same kind of error naming the
        same culprits, not "rank r left"."""
        culprits = getattr(error, "peers", ()) or (() if getattr(error, "peer", None) is None
                                                     else (error.peer,))
        if isinstance(error, (PeerError, CollieTimeout)):
            # A dead or stuck rank breaks every group it is in, and the
            # ranks blocked on it in other calls should hear the cause
            # before they hear that this rank left: tell them all.
            peers = range(self.size)
        self.fail(peers, type(error).__name__, culprits, str(error))

    def announce_leaving(self) -> None:
        """Tell every peer this rank is leaving (destroy_process_group): a
        peer still waiting for a message from it learns at once that none
        will come. Sent after everything this rank sent before (one stream
        per peer), so a peer has all of that when it reads this."""
        for p in range(self.size):
            if p != self.rank:
                self.send_control(p, b"leaving:")

    def finish(self, tag: int, meta: int, sweep=(), failed: bool = False) -> None:
        """Collective ``tag`` is over on this rank (``failed``: with an
        error): record it (a message for it from now on is stale), and drop
        the stale messages already here from the group ranks ``sweep``."""
        self.done[tag >> CONTEXT_SHIFT] = (tag & MAX_TAG, meta)
        self.current = 0
        if failed:
            self._failed.add((tag >> CONTEXT_SHIFT, tag & MAX_TAG))
        if sweep:
            with self.lock:
                for t in self.transports:
                    t.drop_stale([p for p in sweep if self.routes[p] is t])

    def check(self, describe: Callable[[], str], tag: int = 0) -> None:
        """Raise why communication is broken, if it is (but for the leave barrier)."""
        if self._abort is not None and tag >> CONTEXT_SHIFT != LEAVE_CONTEXT:
            self._raise_abort(describe)

    # ---- progress and waiting ----

    def _resolve_any(self, req: AnySourceRequest) -> None:
        if req.inner is not None:
            return
        for p in req.candidates:
            if self.routes[p].probe(p, req.tag) is not None:
                req.peer = p
                req.inner = self.routes[p].irecv(p, req.tag, req.dst, req.combine, req.meta)
                return
        # Nothing waits from a live peer: a candidate that died fails the
        # receive (the one it waits for may be that one, and a wait on
        # "anyone" must not outlive a death, as in MPI's ERR_PROC_FAILED_PENDING);
        # peers that left cleanly fail it only once all have.
        lost = [p for p in req.candidates if p in self._lost]
        died = [p for p in lost if not getattr(self._lost[p], "left", False)]
        if died or (lost and len(lost) == len(req.candidates)):
            req.error = self._lost[(died or lost)[0]]

    def _fail_lost(self) -> None:
        """Fail requests on peers that died since we last looked.

        A peer that *left* (destroy_process_group) finished its sends before
        saying so, but over shared memory the data may still wait in our
        ring: those requests fail in wait() only once progress stops."""
        for peer, error in list(self._lost.items()):
            if peer not in self._failed_seen:
                self._failed_seen.add(peer)
                if getattr(error, "left", False) and self.routes[peer].pollable:
                    continue
                for t in self.transports:
                    t.fail_peer(peer, error)

    def _fail_departed(self, requests) -> None:
        """Nothing moved: requests on peers that left can no longer complete."""
        for req in requests:
            if not req.finished and req.peer >= 0 and req.peer in self._lost:
                req.error = self._lost[req.peer]

    def progress(self) -> bool:
        with self.lock:
            if self.p2p is not None and self.p2p.deferred:
                self.p2p.post(None)  # Python moves the messages now: their receives must be in its books
            if self._lost:
                self._fail_lost()
            moved = False
            for progress in self._progress:
                if progress():
                    moved = True
            return moved

    def wait(self, requests, *, timeout: Optional[float] = None,
             describe: Callable[[], str] = lambda: "communication", call=None) -> None:
        """Block until every request is done; raise the first error.

        ``describe`` names the operation for error messages (group, op,
        sequence number); it is only called when something went wrong.
        ``call`` = (tag, meta, peers) identifies a collective: if it is stuck
        for ANNOUNCE_AFTER seconds, the peers are told which call this is.
        """
        # The fast paths of small calls: already done (a small send on shm,
        # say), or done after one pass of progress (the peer's message was
        # waiting in its ring), without setting up the waiting loop.
        for req in requests:
            if not req.done:
                break
        else:
            return
        if self.progress():
            for req in requests:
                if not req.done:
                    break
            else:
                return
        self._wait(requests, self.timeout if timeout is None else timeout, describe, call)

    def wait_until(self, ready: Callable[[], bool], requests: Callable[[], list], *, timeout: float,
                   describe: Callable[[], str], progress: Callable[[], bool],
                   departed: Optional[Callable[[], list]] = None) -> None:
        """Block until ``ready()``: how a layer above with books of its own
        (the MPI layer's requests, probes and envelopes) waits, in the loop
        collectives wait in: its spinning and sleeping, an abort raised, a
        timeout that names the ranks at fault. ``requests()``: the transport
        requests ready() depends on (their errors are the layer's to
        report); ``progress()``: a pass over the transports and the layer's
        books; ``departed()``: every request it waits on, directly or not
        (default: requests()): failed once their peer is lost, and named
        when it times out. A dead peer fails only what waits on it
        there (as MPI's fault tolerance has it: the survivors talk on); an
        abort of another kind (a mismatch, a timeout) raises, as in any wait."""
        self._wait(requests, timeout, describe, None, (ready, progress, departed or requests))

    def _wait(self, requests, timeout: float, describe: Callable[[], str], call, until=None) -> None:
        """wait()'s loop: progress, spin a little, then sleep on the doorbell."""
        self._waiting = until[2]() if until is not None else requests  # for the queries of a rank that times out
        try:
            slept = self._wait_loop(requests, timeout, describe, call, until)
            if slept is not None:
                self._adapt_spin(slept)
            self._stuck_on = ()
        finally:
            self._waiting = []

    def _wait_loop(self, requests, timeout: float, describe: Callable[[], str], call, until) -> Optional[float]:
        """The one waiting loop. ``until``: None to wait for ``requests``
        (raising the first error), or (ready, progress, departed) of wait_until.
        Returns when it first went to sleep (None: it never did)."""
        ready = progress = departed = None
        if until is not None:
            ready, progress, departed = until
            every = requests = list(requests())
        else:
            progress = self.progress
            every = requests = list(requests)
        anys = [r for r in requests if isinstance(r, AnySourceRequest)]
        start = time.monotonic()
        spin_for = min(self._spin, getattr(_this_thread, "spin", self._spin))
        spin_until = start + spin_for
        announced = call is None
        tag = call[0] if call is not None else 0
        leave = tag >> CONTEXT_SHIFT == LEAVE_CONTEXT  # the leave barrier ignores what broke
        spin = None  # decided the first time nothing moved (most waits end before)
        slept = None  # when this wait first went to sleep
        while True:
            # Taken before the progress pass: a peer's "leaving" follows all it
            # sent, so after this pass what waits on such a peer never comes.
            leaving = set(self._leaving) if self._leaving and not leave and ready is None else None
            moved = progress()
            for req in anys:
                if self._step_any(req):
                    moved = True  # a receive was just posted: give it a pass of progress
            if ready is None:
                open_ = []
                for req in requests:
                    if req.error is not None:
                        self.check(describe, tag)  # the root cause, if a peer told us one
                        error = self._explain(req, describe, call is not None)
                        if isinstance(error, PeerError) and not getattr(req.error, "left", False):
                            # A death seen in any wait (point to point too) is news for
                            # every rank, before this one leaves and they hear only that.
                            self.fail(range(self.size), "PeerError", (error.peer,), str(error))
                        raise error from req.error
                    if not req.done:
                        open_.append(req)
                if not open_:
                    return slept
                requests = open_
            elif ready():
                return slept
            if self._abort is not None and (ready is None or self._abort[1] != "PeerError"):
                self.check(describe, tag)
            if leaving:
                self._fail_left(requests, leaving, describe)
            now = time.monotonic()
            if not announced and now - start >= min(ANNOUNCE_AFTER, timeout / 2):
                announced = True
                for p in call[2]:
                    if p != self.rank:
                        self.send_control(p, b"state:" + _STATE.pack(call[0], call[1], call[3]))
            if call is not None and self._states:
                self._check_states(call, describe)
            if moved:
                spin_until = now + spin_for
                continue
            if self._lost:
                self._fail_departed(departed() if departed is not None else requests)
                if ready is not None and (progress() or ready()):
                    continue
            if now >= start + timeout:
                raise self._timed_out(departed() if ready is not None else requests, timeout, describe, call)
            if spin is None:  # a layer's wait may need no request of its own yet (an
                # MPI receive before its envelope came): what it depends on decides
                spin = self.polls(every if ready is None else departed())
            if spin and now < spin_until:
                self.pause()
                continue
            # Look once more as a sleeper: a peer that announces anything
            # from now on wakes us (see doorbell.py).
            nleaving = len(self._leaving)
            if ready is None:
                woken = (lambda: progress() or (self._abort is not None and not leave)
                         or len(self._leaving) != nleaving or any(r.finished for r in requests))
            else:
                woken = lambda: (progress() or ready()  # noqa: E731
                                 or self._abort is not None and self._abort[1] != "PeerError")
            if slept is None:
                slept = now
            self.doorbell.sleep(min(SLEEP_SLICE, start + timeout - now), woken)

    def _fail_left(self, requests, leaving: set, describe) -> None:
        """Raise PeerError if a request waits on a peer that has left."""
        for req in requests:
            if req.peer in leaving and not req.finished:
                error = PeerError(f"rank {self.rank}: {describe()} failed: rank {req.peer} left "
                                  f"(destroy_process_group) before sending or receiving what this "
                                  f"call needs from it ({req!r})", req.peer)
                error.left = True
                raise error

    def _timed_out(self, requests, timeout: float, describe, call) -> CollieTimeout:
        """The timeout error of a wait: it names the ranks at fault. A rank
        waits on its neighbours, who may wait on theirs (in this call, or
        blocked in another one), so the peers it waits for are seldom the
        culprits. This rank asks every rank where it is and whom it waits
        for (QUERY_GRACE), follows those waits from this rank, and blames
        where they end: a rank that does not answer (stopped, hung), or one
        that waits for nobody and has not reached the call."""
        pending = [r for r in requests if not r.done]
        waiting = sorted(_peers_of(pending))
        text = (f"rank {self.rank}: {describe()} timed out after {timeout:g}s waiting for "
                f"rank(s) {waiting or 'any'} (pending: {', '.join(repr(r) for r in pending)})")
        # A point-to-point wait has no call the others could be in: only
        # the waits are followed.
        tag = call[0] if call is not None else pending[0].tag if pending else 0
        members = call[2] if call is not None else ()
        context, seq = tag >> CONTEXT_SHIFT, tag & MAX_TAG
        asked = [p for p in range(self.size) if p != self.rank and p not in self._lost]
        for p in asked:
            self._answers.pop(p, None)
            self.send_control(p, b"query:" + _QUERY.pack(context))
        deadline = time.monotonic() + QUERY_GRACE
        while time.monotonic() < deadline and not all(p in self._answers for p in asked):
            self.doorbell.sleep(min(0.05, deadline - time.monotonic()),
                                lambda: all(p in self._answers for p in asked))
        answers = dict(self._answers)
        culprits, why, seen, todo = [], [], {self.rank}, list(waiting)
        while todo:  # follow who waits for whom, from this rank
            p = todo.pop(0)
            if p in seen:
                continue
            seen.add(p)
            answer = answers.get(p)
            if answer is not None and answer[3]:
                todo.extend(answer[3])  # blocked on others: not the cause
                continue
            if answer is not None and p in members and (answer[2] == tag or answer[1] >= seq):
                continue  # in this call and busy, or past it: not waiting on anyone
            culprits.append(p)
            if answer is None:
                why.append(f"rank {p} did not answer (stopped, or hung without releasing the GIL)")
            elif p not in members:
                why.append(f"rank {p} is waiting for nobody")
            elif answer[1] < 0:
                why.append(f"rank {p} has called no collective on this group yet")
            else:
                why.append(f"rank {p} has not called it (its last on this group is call #{answer[1]})")
        self._stuck_on = tuple(culprits or waiting)
        if not culprits:
            return CollieTimeout(text + "; every rank it waits on, directly or not, is waiting too",
                                 tuple(waiting))
        return CollieTimeout(f"rank {self.rank}: {describe()} timed out after {timeout:g}s: "
                             f"rank(s) {culprits} never arrived ({'; '.join(why)}); {text}",
                             tuple(culprits))

    def polls(self, requests) -> bool:
        """Whether a waiter on ``requests`` should poll for a while before it
        sleeps: only when every peer is reached through a pollable transport
        (shared memory; TCP requests complete on receiver threads, which need
        the GIL a polling thread holds)."""
        routes = self.routes
        return bool(requests) and all(r.peer >= 0 and routes[r.peer].pollable for r in requests)

    @property
    def spin_seconds(self) -> float:
        """How long a waiter that polls() keeps at it after the last progress."""
        return self._spin

    def _adapt_spin(self, slept: float) -> None:
        """A wait that went to sleep at ``slept`` just ended: spin longer if
        the sleep was short, less long if it was long (see SPIN_LIMIT_SECONDS)."""
        if not self._adapt or hasattr(_this_thread, "spin"):
            return
        if time.monotonic() - slept < SPIN_LIMIT_SECONDS:
            self._spin = min(2 * self._spin, SPIN_LIMIT_SECONDS)
        else:
            self._spin = max(self._spin / 2, SPIN_SECONDS)

    def pause(self) -> None:
        """One breath of a polling waiter: with more ranks than cores, let the
        peer we wait for run."""
        if self._crowded:
            os.sched_yield()

    def poll(self, requests) -> bool:
        """One pass of wait() that never blocks: advance the transports and
        ``requests``; True once every request has finished (done or failed)."""
        moved = self.progress()
        for req in requests:
            if isinstance(req, AnySourceRequest) and self._step_any(req):
                moved = True
        if not moved and self._lost:
            self._fail_departed(requests)
        return all(r.finished for r in requests)

    def _raise_abort(self, describe) -> None:
        """Raise why communication is broken, naming the culprits (a
        relayed error names the rank at fault, not the rank that relayed it)."""
        if self._abort is None:
            return
        told_by, kind, culprits, reason = self._abort
        if told_by == self.rank:
            text = f"rank {self.rank}: {describe()} stopped: {reason}"
        else:
            text = f"rank {self.rank}: {describe()} stopped, because rank {told_by} reported: {reason}"
        first = culprits[0] if culprits else None
        if kind == "MismatchError" and first == self.rank:
            first = told_by  # the two calls differ: for this rank, the other one is at fault
        if kind == "CollieTimeout":
            raise CollieTimeout(text, culprits)
        if kind in _ERRORS:
            raise _ERRORS[kind](text, first)
        raise AbortedError(text)

    def _check_states(self, call, describe) -> None:
        tag, meta, _, parts = call
        for peer, (their_tag, their_meta, their_parts) in list(self._states.items()):
            if their_tag == tag and (their_meta != meta or their_parts != parts):
                mine, theirs = meta_text(meta), meta_text(their_meta)
                if their_meta == meta:
                    mine, theirs = f"{mine} in {parts} segments", f"{theirs} in {their_parts} segments"
                raise MismatchError(f"rank {self.rank}: {describe()}: rank {peer} called "
                                    f"{theirs} but rank {self.rank} called {mine}", peer)

    def _step_any(self, req: AnySourceRequest) -> bool:
        """Advance an any-source receive; True if it found its peer just now."""
        found = False
        if req.inner is None:
            with self.lock:
                self._resolve_any(req)
            found = req.inner is not None
        inner = req.inner
        if inner is not None:
            if inner.error is not None:
                req.error = inner.error
            elif inner.done:
                req.done = True
        return found

    def _explain(self, req: Request, describe, collective: bool = False) -> BaseException:
        """Turn a transport's error into one that names the operation. In a
        collective a message of the wrong size is a mismatch too (uneven
        splits that disagree, another segmentation), not a bad argument."""
        from .transports.base import MessageMismatch
        err = req.error
        what = describe()
        if isinstance(err, MessageMismatch):
            if err.expected_meta is not None and err.meta != err.expected_meta:
                return MismatchError(
                    f"rank {self.rank}: {what}: rank {err.peer} called {meta_text(err.meta)} but rank "
                    f"{self.rank} called {meta_text(err.expected_meta)}", err.peer)
            if collective:
                return MismatchError(
                    f"rank {self.rank}: {what}: rank {err.peer} sent {err.nbytes} bytes where rank "
                    f"{self.rank} expected {err.expected_nbytes} (both called {meta_text(err.meta)}: their "
                    f"splits or segments differ)", err.peer)
            return ValueError(f"rank {self.rank}: {what}: the message from rank {err.peer} has "
                              f"{err.nbytes} bytes but the receive buffer has {err.expected_nbytes} bytes")
        if isinstance(err, PeerError):
            return PeerError(f"rank {self.rank}: {what} failed: {err}", err.peer)
        if isinstance(err, CollieError):
            return type(err)(f"rank {self.rank}: {what} failed: {err}")
        return CollieError(f"rank {self.rank}: {what} failed: {err!r}")

    def close(self) -> None:
        """Release every connection, thread and shared segment. Idempotent."""
        if self._closed:
            return
        self._closed = True
        # Transports with threads of their own (TCP) first: they ring the
        # doorbell, which lives in the shm segment, so they must be gone
        # before the segment is unmapped.
        for t in sorted(self.transports, key=lambda t: t.pollable):
            try:
                t.close()
            except Exception:
                pass
        if self.shm is None:
            self.doorbell.release()
