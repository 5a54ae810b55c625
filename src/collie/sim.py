"""The simulator: runs the real schedules of an algorithm on a cost model.

    collie sim all_reduce --algo all -n 24576 --size 8,64K,1M --hosts 3072
    collie sim all_reduce --tuner -n 4096 --size 8,1M,64M
    collie sim --calibrate bench.jsonl          # fit the model to `collie bench --json` rows

Every rank's schedule comes from collie.algorithms.build, exactly what a
call runs, and is sized the way engine.plan sizes it (bench's layouts, the
same part_bounds; schedules with a shared window go through engine.plan
itself). The simulation then follows collie.schedule's execution semantics,
event by event:

- a step starts when the rank's previous step has ended; its local ops run
  first, one after another on the rank's core: a Copy costs ``delta`` per
  byte, a Reduce ``gamma`` per byte, a Read (one-sided, from a peer's
  window) the host link's ``alpha + beta`` per byte, plus ``gamma`` when it
  reduces;
- then every send and receive of the step is posted. A message of m bytes
  between ranks of one host takes the ``intra`` link class, between hosts
  the ``inter`` one (alpha-beta each). The sender's port is busy for
  ``m beta`` (its sends in posting order), the head arrives ``alpha`` after
  it left, and the receiver's port takes the arriving messages first come
  first served, ``m beta`` each: contention at each rank's link. A send is
  eager (it does not wait for the receive to be posted); a receive
  completes when its message is in and it is posted, plus ``gamma`` per
  byte on the rank's core when it reduces; messages between two ranks
  match in posting order;
- the step ends when every op of it has completed; the call's time is the
  last rank's end (what `collie bench` times: the slowest rank).

Cores: the host model. With ``cores`` > 0 (per host) the simulation
follows what collie's shared-memory transport and compiled core really do
on one host (transports/shm.py, ring.py, core.py, _core.c), as CPU work
that the host's ranks share on that many cores, first come first served,
each rank's serially (a rank is one thread):

- each call first costs ``call`` on every rank (its lane, collectives.py),
  or ``slow_call`` for the collectives without a lane (gather and scatter,
  whose lists are copied: Python's whole path every time);
- a message under ``single_copy`` bytes goes through a ring slot: the
  sender's core copies it in (``alpha + m beta``), the receiver's copies it
  out, or combines it straight out of the slot (``alpha + m gamma``); the
  send is done once it is in the slot. A ring holds ``slots`` messages: a
  send that finds it full waits in the core for the receiver to free a
  slot, as a receive waits for its message (a wait past the spin hands the
  step to Python, below);
- a larger message is read once by its receiver out of the sender's memory
  (process_vm_readv: ``read.alpha + m read.beta``, plus ``m gamma`` when
  it combines), and the send is done only then. A one-way step (only
  sends, or only receives) with a message of core.SHARED_COPY_BYTES or more
  runs in Python, whose writer copies the second half meanwhile;
- a step with a message of several pieces runs in Python (``python``),
  each such message staged through a contiguous copy at each end;
- local copies and one-sided reads of a shared window cost ``delta`` per
  byte, reductions ``gamma``;
- per-byte costs grow with the bytes a call touches on the host, call
  after call (buffers, windows, and each ring's slots as far as its largest
  message): see working_set_factor;
- a rank that waited for a message (or, single copy, for its reader) when
  the host's ranks outnumber its cores must get a core back (``switch``);
  one that waited past its spin (network.py: 10 us crowded, 1 ms
  otherwise) has handed the step to Python (``python``) and slept on its
  doorbell (``wake``).

Without it (0, the default) every rank has a core of its own and alpha is
latency, as in the closed forms below. bench_seconds runs calls back to
back, as `collie bench` times them. docs/scale.md fits the host model to
this machine and says how close it comes.

Host links. By default every rank has a link of its own to the other
hosts (as GPUs with a NIC each). With ``host_nic``, the ranks of a host
share one: a message between hosts also waits for its sender's host link
to be free, and its receiver's, ``m beta`` each. That is a CPU host with
one network port, such as collie's test bed, where two ranks of a host
sending across at once each get half the link.

Without contention this model is the one of Thakur, Rabenseifner and Gropp
(2005): ring all_reduce costs 2(p-1) alpha + 2(p-1)/p S beta + (p-1)/p S
gamma, and so on; tests/test_sim.py checks each closed form of that paper
against the simulation of collie's schedules.

Scale. A full simulation keeps every rank: fine for the trees and
Rabenseifner at 24,576 ranks (their schedules have O(log n) steps), not for
ring (2(n-1) steps each, 1.2 billion ops at 24,576 ranks). Where the
schedules are symmetric, the simulator runs one representative per
*orbit*: when rank r + g does exactly what rank r does with every peer
shifted by g (g = 1 for ring, direct, Bruck, pairwise without hosts; g =
ranks per host with hosts), ranks g apart run identical timelines, so only
ranks 0..g-1 are simulated, and a message to rank p is delivered to
representative p mod g, as coming from the sender shifted by p - p mod g.
Symmetry is checked, not assumed: the schedules of sampled ranks (the
last, the middle, one past each end of the representatives, a few chosen
at random with a fixed seed) must map onto their representative's, op by
op (message sizes may differ by the one element per chunk that uneven
parts give; the time is then that of the representative). tests/test_sim.py
checks the symmetric simulation against the full one at 1,024 ranks.
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import random
import sys
import time
from collections import deque
from typing import NamedTuple, Optional

import numpy as np

from . import algorithms, engine
from .schedule import COLLECTIVES, Copy, Read, Recv, Reduce, Send
from .transports.shm import DEFAULT_CMA_BYTES, DEFAULT_SLOTS

__all__ = ["Link", "Model", "DEFAULT_MODEL", "Result", "simulate", "bench_seconds", "block_sizes", "calibrate",
           "closed_form", "main"]


class Link(NamedTuple):
    """One link class: ``alpha`` seconds per message, ``beta`` seconds per byte."""
    alpha: float
    beta: float


class Model(NamedTuple):
    """The cost model: a link class within a host and one between hosts;
    ``gamma`` seconds per byte reduced, ``delta`` per byte copied locally.
    The fields after ``cores`` describe how collie's shared-memory
    transport and compiled core really move a message on one host; they
    count only with ``cores`` > 0 (see "Cores" in the module docstring),
    and their defaults leave them out."""
    intra: Link
    inter: Link
    gamma: float
    delta: float
    cores: int = 0  # per host; 0: a core for every rank (see "Cores" in the module docstring)
    host_nic: bool = False  # the ranks of a host share one link to the others (see "Host links")
    slots: int = 0           # messages a ring between two ranks of a host holds (0: no limit)
    single_copy: int = 0     # bytes from which a message within a host is read once by its receiver
    read: Link = Link(0.0, 0.0)  # that read (process_vm_readv): fixed cost, seconds per byte
    python: float = 0.0      # a step the core hands to Python's executor
    call: float = 0.0        # a call's own cost on each rank, through its lane (collectives.py)
    slow_call: float = 0.0   # the same for a collective without a lane: Python's whole path
    switch: float = 0.0      # ranks outnumbering cores: putting a waiting rank back on a core
    wake: float = 0.0        # a rank that waited past its spin and slept runs again this long after the event
    cache: int = 0           # bytes of a call's working set the caches hold (0: all of it)
    dram: float = 1.0        # per-byte costs times this for the part beyond the cache

    def to_json(self) -> dict:
        return {"intra": self.intra._asdict(), "inter": self.inter._asdict(),
                "gamma": self.gamma, "delta": self.delta, "cores": self.cores, "host_nic": self.host_nic,
                "slots": self.slots, "single_copy": self.single_copy, "read": self.read._asdict(),
                "python": self.python, "call": self.call, "slow_call": self.slow_call, "switch": self.switch,
                "wake": self.wake, "cache": self.cache, "dram": self.dram}

    @classmethod
    def from_json(cls, data: dict) -> "Model":
        try:
            read = data.get("read", {"alpha": 0.0, "beta": 0.0})
            return cls(Link(float(data["intra"]["alpha"]), float(data["intra"]["beta"])),
                       Link(float(data["inter"]["alpha"]), float(data["inter"]["beta"])),
                       float(data["gamma"]), float(data["delta"]), int(data.get("cores", 0)),
                       bool(data.get("host_nic", False)), int(data.get("slots", 0)),
                       int(data.get("single_copy", 0)), Link(float(read["alpha"]), float(read["beta"])),
                       float(data.get("python", 0.0)), float(data.get("call", 0.0)), float(data.get("slow_call", 0.0)),
                       float(data.get("switch", 0.0)), float(data.get("wake", 0.0)), int(data.get("cache", 0)),
                       float(data.get("dram", 1.0)))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"not a model (want intra/inter alpha, beta; gamma; delta): {exc}") from None

    def describe(self) -> str:
        def link(x: Link) -> str:
            return f"alpha {x.alpha * 1e6:.3g} us, {_gbps(x.beta)} GB/s"
        text = (f"intra-host {link(self.intra)}; inter-host {link(self.inter)}; "
                f"reduce {_gbps(self.gamma)} GB/s; local copy {_gbps(self.delta)} GB/s"
                + (f"; {self.cores} cores per host" if self.cores else "")
                + ("; one link per host" if self.host_nic else ""))
        if self.cores and self.slots:
            text += f"; {self.slots} slots per ring"
        if self.cores and self.single_copy:
            text += f"; single copy from {self.single_copy >> 10} KiB: {link(self.read)}"
        if self.cores and (self.python or self.call or self.switch or self.wake):
            text += (f"; python step {self.python * 1e6:.3g} us, call {self.call * 1e6:.3g} us "
                     f"({self.slow_call * 1e6:.3g} us without a lane), "
                     f"switch {self.switch * 1e6:.3g} us, wake {self.wake * 1e6:.3g} us")
        if self.cores and self.cache:
            text += f"; cache {self.cache / (1 << 20):.3g} MiB, beyond it x{self.dram:.3g}"
        return text


def _gbps(per_byte: float) -> str:
    return "inf" if per_byte <= 0 else f"{1 / per_byte / 1e9:.3g}"


# Round numbers for a cluster of CPU hosts: shared memory within a host,
# 100 Gb/s between hosts. Calibrate for a real machine (--calibrate).
DEFAULT_MODEL = Model(intra=Link(1e-6, 1 / 10e9), inter=Link(5e-6, 1 / 12.5e9),
                      gamma=1 / 10e9, delta=1 / 20e9)


class Result(NamedTuple):
    seconds: float          # the last rank's end
    ranks: int
    simulated: int          # ranks simulated (representatives)
    orbit: int              # g: ranks g apart are symmetric (== ranks: no symmetry used)
    messages: int           # messages simulated
    algorithm: str
    segments: int


# ---- sizes ---------------------------------------------------------------------

def block_sizes(op: str, nbytes: int, itemsize: int, n: int) -> tuple[int, dict]:
    """(count column, buffer -> block sizes) of ``op`` at a bench size, laid
    out as `collie bench` lays it out (bench.layout); every rank gets both
    buffers where the collective has them (tmp may copy either)."""
    from .bench import layout
    if op == "barrier":
        return 0, {"out": (0,)}
    if op in ("gather", "scatter"):
        c = nbytes // itemsize // n
        one, every = (c,), (c,) * n
        return c, ({"in": one, "out": every} if op == "gather" else {"in": every, "out": one})
    lay = layout(op, nbytes, itemsize, n)
    c = lay.count
    if op in ("all_reduce", "broadcast", "reduce"):
        return c, {"out": (c,)}
    if op == "all_gather":
        return c, {"in": (c,), "out": (c,) * n}
    if op == "reduce_scatter":
        return c, {"in": (c,) * n, "out": (c,)}
    return c, {"in": (c,) * n, "out": (c,) * n}  # all_to_all


class _Sizer:
    """Element counts of chunk tuples, as engine.plan counts them. Chunk
    tuples are often shared between ranks (algorithms.block, Rabenseifner's
    ranges), so a count is kept per tuple object."""

    def __init__(self, sizes: dict, parts: int, tmp_like, win_like):
        self.parts = parts
        self.split = {}
        for buf, blocks in sizes.items():
            self.split[buf] = [divmod(int(b), parts) for b in blocks]
        if tmp_like is not None:
            self.split["tmp"] = self.split[tmp_like]
        if win_like is not None:
            self.split["win"] = self.split[win_like]
        self.cache: dict = {}

    def count(self, chunks) -> int:
        split = self.split
        if len(chunks) <= 4:  # most messages: cheaper to count than to look up
            total = 0
            for buf, blk, part in chunks:
                base, extra = split[buf][blk]
                total += base + (part < extra)
            return total
        hit = self.cache.get(id(chunks))
        if hit is not None and hit[0] is chunks:
            return hit[1]
        total = 0
        for buf, blk, part in chunks:
            base, extra = split[buf][blk]
            total += base + (part < extra)
        self.cache[id(chunks)] = (chunks, total)
        return total


# A rank's steps for the simulator: (local, sends, recvs) per step, with
# local = ((kind, peer, bytes), ...), sends = ((peer, bytes), ...),
# recvs = ((peer, bytes, reduce), ...).
_COPY, _REDUCE, _READ, _READ_REDUCE = engine.COPY, engine.REDUCE, engine.READ, engine.READ_REDUCE
# Local "ops" of the host model: a step run by Python, a call's own cost
# through its lane, and without one.
_PYTHON, _CALL, _SLOW_CALL = -1, -2, -3
# Collectives whose repeated calls have no lane (collectives.py passes no
# lane_key for them): every call takes Python's whole path.
_NO_LANE = frozenset(("gather", "scatter"))


def _exact_skeleton(schedule, sizes: dict, itemsize: int, window: int) -> tuple:
    """The steps as _skeleton has them, from engine.plan, marked the way the
    compiled core (core.compile) runs them: a step with a message of several
    pieces, or a one-way step with a message of SHARED_COPY_BYTES or more
    (a broadcast's: Python shares its copy), goes to Python's executor (a
    _PYTHON op), and a message of several pieces is staged through a
    contiguous copy at each end."""
    from .core import SHARED_COPY_BYTES
    out = []
    for steps in engine.plan(schedule, sizes, window).slices:
        for st in steps:
            local = [(kind, peer, itemsize * sum(hi - lo for _, lo, hi in dst)) for kind, peer, _, dst in st.local]
            python = False
            for msgs, other in ((st.sends, st.recvs), (st.recvs, st.sends)):
                for m in msgs:
                    if len(m.pieces) > 1:
                        python = True
                        local.append((_COPY, -1, itemsize * m.count))
                    elif not other and not m.reduce and itemsize * m.count >= SHARED_COPY_BYTES:
                        python = True
            if python:
                local.insert(0, (_PYTHON, -1, 0))
            out.append((tuple(local), tuple((m.peer, itemsize * m.count) for m in st.sends),
                        tuple((m.peer, itemsize * m.count, m.reduce) for m in st.recvs)))
    return tuple(out)


def _skeleton(schedule, sizes: dict, itemsize: int, window: int, sizers: dict, exact: bool = False) -> tuple:
    """The steps of ``schedule`` in bytes, for the simulation (``exact``: as
    the compiled core runs them, see _exact_skeleton)."""
    if exact:
        return _exact_skeleton(schedule, sizes, itemsize, window)
    if schedule.win_like is not None:  # windows may cut a call into slices: the engine's own plan
        plan = engine.plan(schedule, sizes, window)
        out = []
        for steps in plan.slices:
            for st in steps:
                local = tuple((kind, peer, itemsize * sum(hi - lo for _, lo, hi in dst))
                              for kind, peer, _, dst in st.local)
                out.append((local, tuple((m.peer, itemsize * m.count) for m in st.sends),
                            tuple((m.peer, itemsize * m.count, m.reduce) for m in st.recvs)))
        return tuple(out)
    key = (schedule.parts, schedule.tmp_like)
    sizer = sizers.get(key)
    if sizer is None:
        sizer = sizers[key] = _Sizer(sizes, schedule.parts, schedule.tmp_like, None)
    count = sizer.count
    out = []
    for step in schedule.steps:
        local, sends, recvs = [], [], []
        for op in step:
            t = type(op)
            if t is Send:
                sends.append((op.peer, itemsize * count(op.chunks)))
            elif t is Recv:
                recvs.append((op.peer, itemsize * count(op.chunks), op.reduce))
            elif t is Copy:
                local.append((_COPY, -1, itemsize * count(op.dst)))
            elif t is Reduce:
                local.append((_REDUCE, -1, itemsize * count(op.dst)))
            elif t is Read:
                local.append((_READ_REDUCE if op.reduce else _READ, op.peer, itemsize * count(op.dst)))
        out.append((tuple(local), tuple(sends), tuple(recvs)))
    return tuple(out)


# ---- symmetry -----------------------------------------------------------------

def _maps_onto(rank: int, mine: tuple, rep: int, theirs: tuple, n: int, slack: int) -> bool:
    """Whether ``mine`` (rank's steps) is ``theirs`` (rep's) with every peer
    shifted by rank - rep, sizes within ``slack`` bytes per op."""
    shift = rank - rep
    if len(mine) != len(theirs):
        return False
    for (l1, s1, r1), (l2, s2, r2) in zip(mine, theirs):
        if len(l1) != len(l2) or len(s1) != len(s2) or len(r1) != len(r2):
            return False
        for (k1, p1, b1), (k2, p2, b2) in zip(l1, l2):
            if k1 != k2 or abs(b1 - b2) > slack or (p1 >= 0 and (p2 + shift) % n != p1):
                return False
        for (p1, b1), (p2, b2) in zip(s1, s2):
            if (p2 + shift) % n != p1 or abs(b1 - b2) > slack:
                return False
        for (p1, b1, x1), (p2, b2, x2) in zip(r1, r2):
            if (p2 + shift) % n != p1 or abs(b1 - b2) > slack or x1 != x2:
                return False
    return True


def _sample(n: int, g: int, count: int = 2) -> list:
    """Ranks to check the symmetry of orbit g on: both ends, the middle and
    a few at random (a fixed seed: the same ranks every run)."""
    rng = random.Random(n * 7919 + g)
    picks = {g, n - 1, n // 2 // g * g + g - 1}
    picks.update(rng.randrange(g, n) for _ in range(count))
    return sorted(r for r in picks if g <= r < n)


# ---- the event simulation -------------------------------------------------------

def _run(steps_of: list, n: int, g: int, host_of, model: Model, starts: Optional[list] = None,
         per_byte: float = 1.0, crowded: bool = False) -> tuple[list, int]:
    """Simulate representatives 0..g-1 (steps_of[r] are rep r's steps; g == n:
    every rank). Returns (each rep's end time, messages simulated); with
    ``starts`` (a list per rep), appends when each step of each rep starts.
    With model.cores, ``per_byte`` scales the per-byte costs of work within a
    host (the working set's share beyond the cache) and ``crowded`` says
    that a host's ranks outnumber its cores (see "Cores")."""
    intra, inter = model.intra, model.inter
    gamma, delta = model.gamma, model.delta
    tx_free = [0.0] * g
    rx_free = [0.0] * g
    cpu_free = [0.0] * g
    cores = model.cores
    pools: dict = {}  # host -> when each of its cores is free (model.cores > 0)
    if cores:  # per-byte costs of work on a host's cores, at this call's working set
        copy_b, reduce_b, read_b = delta * per_byte, gamma * per_byte, model.read.beta * per_byte
        ring_b = intra.beta * per_byte
        single = model.single_copy or (1 << 62)
        switch = model.switch if crowded else 0.0
        from .core import SHARED_COPY_BYTES as shared_bytes
        from .network import CROWDED_SPIN_SECONDS, SPIN_SECONDS
        spin = CROWDED_SPIN_SECONDS if crowded else SPIN_SECONDS
        costs = {_COPY: copy_b, _REDUCE: reduce_b, _READ: copy_b, _READ_REDUCE: reduce_b}
    nic = model.host_nic
    nic_tx: dict = {}  # host -> when its link out is free (model.host_nic)
    nic_rx: dict = {}  # host -> when its link in is free

    def occupy(r: int, t: float, d: float) -> float:
        """Start of ``d`` seconds of CPU work that rank r asks for at t: on
        the first core of its host to be free (at t without a core limit)."""
        if not cores or d <= 0:
            return t
        pool = pools.get(host_of(r))
        if pool is None:
            pool = pools[host_of(r)] = [0.0] * cores
        t = max(t, cpu_free[r])  # a rank is one thread: its own work is serial too
        # the core free by t that was busy the latest (it leaves the others to
        # the other ranks); else the first to be free
        i, last = -1, -1.0
        for j, free in enumerate(pool):
            if last < free <= t:
                i, last = j, free
        if i < 0:
            i = pool.index(min(pool))
        start = max(t, pool[i])
        pool[i] = cpu_free[r] = start + d
        return start
    at = [0] * g                 # the step each rep is in
    left = [0] * g               # its ops not yet completed
    ends = [0.0] * g             # the latest completion of its current step
    finish = [0.0] * g
    oneway = [False] * g         # whether its current step only sends or only receives
    handed = [False] * g         # whether Python's executor has taken its current step over
    inring: dict = {}            # (receiver rep, sender as it sees it) -> messages in that ring (cores)
    blocked: dict = {}           # same key -> deque of sends waiting for a slot: (sender rep, bytes, one-way, since)
    arrived: dict = {}           # (receiver rep, sender as the receiver sees it) -> deque of rx ends
    waiting: dict = {}           # same key -> deque of (post time, bytes, reduce)
    heap: list = []
    seq = 0
    messages = 0
    for r in range(g):
        heap.append((0.0, r, 0, r))  # (time, seq, kind 0 = step start, rep)
        seq = r + 1
    heapq.heapify(heap)

    def complete(b: int, done: float) -> None:
        nonlocal seq
        if done > ends[b]:
            ends[b] = done
        left[b] -= 1
        if left[b] == 0:
            heapq.heappush(heap, (ends[b], seq, 0, b))
            seq += 1

    def receive(b: int, rx_end, posted: float, nbytes: int, reduce: bool, seen: int) -> None:
        if type(rx_end) is tuple:  # a message within a host, on the host's cores
            take(b, rx_end, posted, nbytes, reduce, seen)
            return
        done = rx_end if rx_end > posted else posted
        if reduce and nbytes:
            if cpu_free[b] > done:
                done = cpu_free[b]
            done = occupy(b, done, gamma * nbytes) + gamma * nbytes
            cpu_free[b] = done
        complete(b, done)

    def post(r: int, b: int, seen: int, nbytes: int, t: float, sender_oneway: bool) -> float:
        """Sender r puts a message for rep b into their ring at t (its core
        copies it into a slot, or writes where a single-copy one is); returns
        when it is done."""
        nonlocal seq
        rdv = nbytes >= single
        cost = intra.alpha + (0.0 if rdv else ring_b * nbytes)
        t = occupy(r, t, cost) + cost
        cpu_free[r] = t
        key = (b, seen)
        inring[key] = inring.get(key, 0) + 1
        heapq.heappush(heap, (t, seq, 1, (b, seen, nbytes, 0.0, (t, r, rdv, sender_oneway), False)))
        seq += 1
        if not rdv:
            complete(r, t)
        return t

    def woken(r: int, since: float, event: float) -> tuple:
        """When rank r, idle since ``since``, acts on an event at ``event``,
        and the CPU that costs first: a crowded rank spins yielding its core
        and must get one back (model.switch); one that waited past its spin
        has handed its step to Python's executor (model.python, once a step)
        and slept on its doorbell (model.wake)."""
        wait = event - since
        if wait <= 0:
            return event, 0.0
        if wait <= spin:
            return event, switch
        extra = switch + (0.0 if handed[r] else model.python)
        handed[r] = True
        return event + model.wake, extra

    def take(b: int, msg: tuple, posted: float, nbytes: int, reduce: bool, seen: int) -> None:
        """Receiver b takes a message within a host (see "Cores"): out of a
        ring slot, or read once from the sender's memory (single copy, whose
        send completes then); a waiting crowded rank first gets a core back.
        The slot it frees lets a send that found the ring full go (its
        sender, waiting since, may have slept)."""
        there, sender, rdv, sender_oneway = msg
        t, work = woken(b, max(posted, cpu_free[b]), there)
        if not rdv:
            work += intra.alpha + (reduce_b if reduce else ring_b) * nbytes
        elif not reduce and nbytes >= shared_bytes and oneway[b] and sender_oneway:
            # Python's shared copy: the writer copies the second half meanwhile
            half = nbytes // 2
            other = read_b * (nbytes - half)
            work += model.read.alpha + read_b * half
            helper = occupy(sender, max(t, cpu_free[sender]), other) + other
        else:
            work += model.read.alpha + (read_b + (reduce_b if reduce else 0.0)) * nbytes
        done = occupy(b, t, work) + work
        if rdv:  # the sender waited for this: it too may have slept
            if not reduce and nbytes >= shared_bytes and oneway[b] and sender_oneway:
                done = max(done, helper)
            back, extra = woken(sender, max(there, cpu_free[sender]), done)
            complete(sender, back + extra)  # (not booked on a core: that is in the future here)
        complete(b, done)
        key = (b, seen)
        inring[key] -= 1
        queue = blocked.get(key)
        if queue:
            s, size, flag, since = queue.popleft()
            back, extra = woken(s, since, done)
            post(s, b, seen, size, back + extra, flag)

    pop, push = heapq.heappop, heapq.heappush
    while heap:
        now, _, kind, data = pop(heap)
        if kind == 0:  # rep `data` starts its next step (or finishes)
            r = data
            k = at[r]
            steps = steps_of[r]
            if k == len(steps):
                finish[r] = now
                continue
            at[r] = k + 1
            if starts is not None:
                starts[r].append(now)
            local, sends, recvs = steps[k]
            oneway[r] = not sends or not recvs
            handed[r] = False
            t = now if now > cpu_free[r] else cpu_free[r]
            work = 0.0
            for lk, peer, nbytes in local:
                if cores and lk < 0:
                    work += model.python if lk == _PYTHON else model.call if lk == _CALL else model.slow_call
                elif cores and (lk < _READ or host_of(peer) == host_of(r)):
                    work += costs[lk] * nbytes
                elif lk == _COPY:
                    work += delta * nbytes
                elif lk == _REDUCE:
                    work += gamma * nbytes
                elif lk >= 0:
                    link = intra if host_of(peer) == host_of(r) else inter
                    work += link.alpha + link.beta * nbytes + (gamma * nbytes if lk == _READ_REDUCE else 0.0)
            t = occupy(r, t, work) + work
            cpu_free[r] = t
            ends[r] = t
            left[r] = len(sends) + len(recvs) + 1  # +1: this posting itself
            for peer, nbytes in sends:
                across = host_of(peer) != host_of(r)
                link = inter if across else intra
                b = peer % g
                seen = (r - (peer - b)) % n
                messages += 1
                if cores and link is intra:
                    if model.slots and inring.get((b, seen), 0) >= model.slots:
                        # the ring is full: the send waits for the receiver to free a slot
                        blocked.setdefault((b, seen), deque()).append((r, nbytes, oneway[r], t))
                    else:
                        t = post(r, b, seen, nbytes, t, oneway[r])
                    continue
                start = t if t > tx_free[r] else tx_free[r]
                shared = nic and across
                if shared:  # through the sending host's link
                    start = max(start, nic_tx.get(host_of(r), 0.0))
                    nic_tx[host_of(r)] = start + link.beta * nbytes
                tx_free[r] = start + link.beta * nbytes
                push(heap, (start + link.alpha, seq, 1, (b, seen, nbytes, link.beta, None, shared)))
                seq += 1
                complete(r, tx_free[r])
            for peer, nbytes, reduce in recvs:
                key = (r, peer)
                q = arrived.get(key)
                if q:
                    receive(r, q.popleft(), t, nbytes, reduce, peer)
                else:
                    w = waiting.get(key)
                    if w is None:
                        w = waiting[key] = deque()
                    w.append((t, nbytes, reduce))
            complete(r, t)
        else:  # a message's head reaches its receiver's port (within a host on cores: is in its ring)
            b, sender, nbytes, beta, held, shared = data
            if held is not None:
                rx_end = held
            else:
                start = now if now > rx_free[b] else rx_free[b]
                if shared:  # through the receiving host's link
                    start = max(start, nic_rx.get(host_of(b), 0.0))
                    nic_rx[host_of(b)] = start + beta * nbytes
                rx_end = rx_free[b] = start + beta * nbytes
            key = (b, sender)
            w = waiting.get(key)
            if w:
                posted, want, reduce = w.popleft()
                receive(b, rx_end, posted, want, reduce, sender)
            else:
                q = arrived.get(key)
                if q is None:
                    q = arrived[key] = deque()
                q.append(rx_end)
    stuck = [r for r in range(g) if at[r] < len(steps_of[r]) or left[r] > 0]
    if stuck:
        r = stuck[0]
        raise RuntimeError(f"simulation deadlocked: {len(stuck)} rank(s) stuck, e.g. rank {r} in step "
                           f"{at[r]} of {len(steps_of[r])} waiting on {left[r]} op(s)")
    return finish, messages


# Above this many ops in all, a full simulation is refused (it would take
# minutes to hours); symmetric schedules never get there.
MAX_FULL_OPS = 4_000_000


def simulate(op: str, algorithm: str, nranks: int, nbytes: int, *, model: Model = DEFAULT_MODEL,
             hosts=1, segments: Optional[int] = None, root: int = 0, dtype="float32",
             symmetry: str = "auto", window_bytes: int = 64 << 20, calls: int = 1) -> Result:
    """Predicted time of one call of ``op`` with ``algorithm`` on ``nranks``
    ranks (``hosts`` hosts of nranks/hosts consecutive ranks each, or a
    tuple of each rank's host, as a group's hosts are), at the
    bench size ``nbytes``. ``segments`` None: what a call forcing this
    algorithm would use (the tuner's rule). ``symmetry``: "auto" (use it
    where sampled ranks show it), "full" (never), "require" (error unless
    symmetric). ``calls``: that many calls back to back, each rank starting
    the next as soon as it is done with the last (as `collie bench` times
    them); the time is then the end of the last."""
    if op not in COLLECTIVES:
        raise ValueError(f"unknown collective {op!r}; collectives are {', '.join(COLLECTIVES)}")
    if isinstance(nranks, bool) or not isinstance(nranks, (int, np.integer)) or nranks < 1:
        raise ValueError(f"nranks must be an integer >= 1, got {nranks!r}")
    if isinstance(hosts, tuple):
        if len(hosts) != nranks:
            raise ValueError(f"hosts names the host of {len(hosts)} ranks, not of {nranks}")
        labels = hosts
        hosts = len(set(labels))
        if labels != tuple(r // (nranks // hosts) for r in range(nranks)):
            if symmetry == "require":
                raise ValueError(f"hosts {labels} are not {hosts} even blocks of consecutive ranks: not symmetric")
            symmetry = "full"  # uneven or interleaved hosts: no shift maps ranks onto ranks
    elif isinstance(hosts, bool) or not isinstance(hosts, (int, np.integer)) or hosts < 1:
        raise ValueError(f"hosts must be an integer >= 1, got {hosts!r}")
    elif nranks % hosts:
        raise ValueError(f"{nranks} ranks do not split evenly over {hosts} hosts")
    else:
        labels = tuple(r // (nranks // hosts) for r in range(nranks))  # each rank's host
    if nbytes < 0:
        raise ValueError(f"size must not be negative, got {nbytes}")
    if isinstance(calls, bool) or not isinstance(calls, (int, np.integer)) or calls < 1:
        raise ValueError(f"calls must be an integer >= 1, got {calls!r}")
    if symmetry not in ("auto", "full", "require"):
        raise ValueError(f"symmetry must be auto, full or require, not {symmetry!r}")
    if algorithm not in algorithms.algorithms_for(op):
        raise ValueError(f"{op} has no algorithm {algorithm!r}; available: "
                         f"{', '.join(algorithms.algorithms_for(op))}")
    if algorithm == "shm" and hosts > 1:
        raise ValueError("shm works among the ranks of one host; with --hosts > 1 choose another")
    n = int(nranks)
    itemsize = np.dtype(dtype).itemsize
    per_host = n // hosts
    if segments is None:
        from .tuner import Tuner
        segments = Tuner(environ={}).choose(op, 0 if op == "all_to_all" else nbytes, n,
                                            "shm" if hosts == 1 else "tcp", algorithm, hosts=labels).segments
    _, sizes = block_sizes(op, nbytes, itemsize, n)
    window = window_bytes // itemsize
    topo = labels if algorithms.topological(op, algorithm) else None

    host_of = labels.__getitem__

    sizers: dict = {}
    exact = model.cores > 0  # the host model costs what the compiled core really does

    def steps(r: int) -> tuple:
        one = _skeleton(algorithms.build(op, algorithm, n, r, root, segments, topo), sizes, itemsize, window,
                        sizers, exact)
        if exact:  # each call starts with its own cost
            first = one[0] if one else ((), (), ())
            call = _SLOW_CALL if op in _NO_LANE else _CALL
            one = ((((call, -1, 0),) + first[0],) + first[1:],) + one[1:]
        return one * calls if calls > 1 else one

    g = n
    if symmetry != "full" and n > 1 and not (model.cores and hosts == 1):  # cores: whole hosts
        orbit = per_host if hosts > 1 else 1
        reps = [steps(r) for r in range(orbit)]
        slack = itemsize * max(1, max((len(o.chunks) for o in algorithms.build(op, algorithm, n, 0, root, segments,
                                                                                topo).ops()
                                       if hasattr(o, "chunks")), default=1))
        if all(_maps_onto(r, steps(r), r % orbit, reps[r % orbit], n, slack) for r in _sample(n, orbit)):
            g = orbit
            steps_of = reps
        elif symmetry == "require":
            raise ValueError(f"{op} {algorithm} on {n} ranks is not symmetric under shifts of {orbit}")
    if g == n:
        first = steps(0)
        total = sum(len(st[0]) + len(st[1]) + len(st[2]) for st in first) * n
        if total > MAX_FULL_OPS:
            raise ValueError(f"{op} {algorithm} on {n} ranks has about {total:,} ops and is not symmetric: "
                             f"too big to simulate rank by rank (limit {MAX_FULL_OPS:,})")
        steps_of = [first] + [steps(r) for r in range(1, n)]
    per_byte, crowded = 1.0, False
    if exact:
        sch = algorithms.build(op, algorithm, n, 0, root, segments, topo)
        mine = sum(sum(blocks) for blocks in sizes.values())
        if sch.tmp_like is not None:
            mine += sum(sizes[sch.tmp_like])
        if sch.win_like is not None:
            mine += min(sum(sizes[sch.win_like]), window)
        # and the rings' slots: a ring cycles through all of them, each as
        # far as the largest message it carries (the first rank's host)
        here = [r for r in range(g) if host_of(r) == host_of(0)]
        rings = 0
        single = model.single_copy or (1 << 62)
        for r in here:
            largest: dict = {}
            for _, sends, _ in steps_of[r][:len(steps_of[r]) // calls]:
                for peer, size in sends:
                    if host_of(peer) == host_of(r) and size < single:
                        largest[peer] = max(largest.get(peer, 0), size)
            rings += max(1, model.slots) * sum(largest.values())
        per_byte = working_set_factor(model, itemsize * mine * len(here) + rings)
        crowded = len(here) > model.cores
    finish, messages = _run(steps_of, n, g, host_of, model, per_byte=per_byte, crowded=crowded)
    return Result(max(finish) if finish else 0.0, n, g, g, messages, algorithm, segments)


def working_set_factor(model: Model, nbytes: int) -> float:
    """How much more a byte costs, on average, when a call's ranks on one
    host touch ``nbytes`` in all, call after call: up to what the caches
    hold (model.cache) the bytes of the last call are still there; from
    twice that, a stream that wraps around finds none of them (least
    recently used goes first) and every byte comes from memory, model.dram
    times slower; in between, a share."""
    if not model.cache or nbytes <= model.cache:
        return 1.0
    return 1.0 + (model.dram - 1.0) * min(1.0, nbytes / model.cache - 1.0)


def bench_seconds(op: str, algorithm: str, nranks: int, nbytes: int, *, model: Model = DEFAULT_MODEL,
                  **kw) -> float:
    """What `collie bench` would report: the time per call of calls run back
    to back, once they run steadily. Each rank starts its next call when it
    is done with the last, so a rank that only sends runs ahead of its
    receivers until their rings are full (model.slots): between the end of
    k calls and of 2k, k past the fill (k = slots + 4; 2 without slots)."""
    k = model.slots + 4 if model.cores and model.slots else 2
    first = simulate(op, algorithm, nranks, nbytes, model=model, calls=k, **kw).seconds
    return (simulate(op, algorithm, nranks, nbytes, model=model, calls=2 * k, **kw).seconds - first) / k


# ---- the closed forms of Thakur, Rabenseifner and Gropp (2005) ---------------

def closed_form(op: str, algorithm: str, p: int, nbytes: int, model: Model = DEFAULT_MODEL) -> float:
    """The time the paper gives for ``algorithm`` on ``p`` ranks (a power of
    two) at the bench size ``nbytes`` (all_gather: the gathered output;
    reduce_scatter, all_to_all: one rank's input), with the intra-host link
    and gamma of ``model``: "Optimization of Collective Communication
    Operations in MPICH", IJHPCA 19(1), 2005, sections 3-4. The paper
    ignores local copies (delta). For checking the simulator, not used by it."""
    if p < 1 or p & (p - 1):
        raise ValueError(f"the closed forms here are for powers of two, not {p}")
    a, b, c = model.intra.alpha, model.intra.beta, model.gamma
    lg = p.bit_length() - 1
    n = float(nbytes)
    share = (p - 1) / p * n
    forms = {
        ("all_reduce", "ring"): 2 * (p - 1) * a + 2 * share * b + share * c,
        ("all_reduce", "recursive_doubling"): lg * (a + n * b + n * c),
        ("all_reduce", "rabenseifner"): 2 * lg * a + 2 * share * b + share * c,
        ("all_reduce", "tree"): lg * (a + n * b + n * c) + lg * (a + n * b),  # reduce, then broadcast
        ("broadcast", "tree"): lg * (a + n * b),
        ("reduce", "tree"): lg * (a + n * b + n * c),
        ("all_gather", "ring"): (p - 1) * a + share * b,
        ("all_gather", "recursive_doubling"): lg * a + share * b,
        ("all_gather", "bruck"): lg * a + share * b,
        ("reduce_scatter", "rabenseifner"): lg * a + share * (b + c),
        ("all_to_all", "bruck"): lg * a + lg * n / 2 * b,
        ("all_to_all", "pairwise"): (p - 1) * a + share * b,
    }
    if (op, algorithm) not in forms:
        raise ValueError(f"no closed form here for {op} {algorithm}; have "
                         f"{', '.join(f'{o} {x}' for o, x in forms)}")
    return forms[(op, algorithm)]


# ---- calibration ---------------------------------------------------------------

_BASIS = ("alpha", "beta", "gamma", "delta")


def _basis_model(which: str, scale: float = 1.0) -> Model:
    link = Link(scale if which == "alpha" else 0.0, scale if which == "beta" else 0.0)
    return Model(link, link, scale if which == "gamma" else 0.0, scale if which == "delta" else 0.0)


def _nnls(rows: list, targets: list) -> list:
    """Least squares with every coefficient >= 0, for a handful of unknowns:
    the best unconstrained fit over each subset of them that is feasible."""
    a = np.asarray(rows, dtype=float)
    t = np.asarray(targets, dtype=float)
    k = a.shape[1]
    best, best_err = [0.0] * k, float(np.sum(t * t))
    for mask in range(1, 1 << k):
        cols = [j for j in range(k) if mask >> j & 1]
        x, *_ = np.linalg.lstsq(a[:, cols], t, rcond=None)
        if np.all(x >= 0):
            err = float(np.sum((a[:, cols] @ x - t) ** 2))
            if err < best_err:
                best_err, best = err, [0.0] * k
                for j, v in zip(cols, x):
                    best[j] = float(v)
    return best


def read_bench_rows(path: str) -> list:
    """collie's rows of a `collie bench --json` file that name a collective
    and an algorithm this simulator knows."""
    rows = []
    with open(path) as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{number}: not a JSON line: {exc}") from None
            if not isinstance(row, dict) or not {"op", "nranks", "bytes", "algorithm", "time_us"} <= set(row):
                raise ValueError(f"{path}:{number}: not a `collie bench --json` row")
            if row.get("backend", "collie") != "collie" or row["op"] not in COLLECTIVES:
                continue
            if row["algorithm"] not in algorithms.ALGORITHMS[row["op"]] or row["time_us"] <= 0:
                continue
            rows.append(row)
    return rows


def median_rows(rows: list) -> list:
    """One row per (op, ranks, size, algorithm, dtype): the median time of
    the rows of several runs, which no model can beat when a single run's
    time moves by more than its error (docs/scale.md)."""
    groups: dict = {}
    for row in rows:
        key = (row["op"], row["nranks"], row["bytes"], row["algorithm"], row.get("dtype", "float32"))
        groups.setdefault(key, []).append(row)
    out = []
    for same in groups.values():
        row = dict(same[0])
        row["time_us"] = statistics_median([r["time_us"] for r in same])
        row["runs"] = len(same)
        out.append(row)
    return out


def _predict(rows: list, model: Model) -> list:
    """Each row's time as `collie bench` measures it (bench_seconds)."""
    return [bench_seconds(r["op"], r["algorithm"], r["nranks"], r["bytes"], model=model,
                          dtype=r.get("dtype", "float32")) for r in rows]


def _log_error(rows: list, model: Model) -> float:
    return sum(math.log(max(p, 1e-12) / (r["time_us"] * 1e-6)) ** 2 for r, p in zip(rows, _predict(rows, model)))


# The parameters a fit moves: (get, set) on a Model.
_PARAMS = {
    "alpha": (lambda m: m.intra.alpha, lambda m, v: m._replace(intra=m.intra._replace(alpha=v))),
    "beta": (lambda m: m.intra.beta, lambda m, v: m._replace(intra=m.intra._replace(beta=v))),
    "gamma": (lambda m: m.gamma, lambda m, v: m._replace(gamma=v)),
    "delta": (lambda m: m.delta, lambda m, v: m._replace(delta=v)),
    "read_alpha": (lambda m: m.read.alpha, lambda m, v: m._replace(read=m.read._replace(alpha=v))),
    "read_beta": (lambda m: m.read.beta, lambda m, v: m._replace(read=m.read._replace(beta=v))),
    "python": (lambda m: m.python, lambda m, v: m._replace(python=v)),
    "call": (lambda m: m.call, lambda m, v: m._replace(call=v)),
    "slow_call": (lambda m: m.slow_call, lambda m, v: m._replace(slow_call=v)),
    "switch": (lambda m: m.switch, lambda m, v: m._replace(switch=v)),
    "wake": (lambda m: m.wake, lambda m, v: m._replace(wake=v)),
    "cache": (lambda m: m.cache, lambda m, v: m._replace(cache=int(v))),
    "dram": (lambda m: m.dram, lambda m, v: m._replace(dram=max(1.0, v))),
}
_HOST_PARAMS = tuple(_PARAMS)

# Where a fit of the host model starts: round numbers near what the 2-core
# test machine came to (docs/scale.md), and collie's shared-memory transport
# as it is configured by default (transports.shm: 8 slots a ring, single copy
# from 2 MiB; from 1 MiB where ranks share cores, which the model does not
# tell apart; a fit to runs made otherwise says how they were made).
HOST_START = Model(Link(0.5e-6, 1 / 50e9), DEFAULT_MODEL.inter, gamma=1 / 40e9, delta=1 / 40e9, cores=1,
                   slots=DEFAULT_SLOTS, single_copy=DEFAULT_CMA_BYTES, read=Link(20e-6, 1 / 20e9),
                   python=10e-6, call=1e-6, slow_call=5e-6, switch=2e-6, wake=1e-6, cache=16 << 20, dram=2.0)


def _refine(rows: list, model: Model, names=_BASIS, rounds: int = 2000, smallest: float = 1.02) -> Model:
    """Pattern search on the squared log error, each parameter scaled up and
    down by a factor that shrinks from 2 to ``smallest``: for the models
    where the time is not linear in the parameters (cores > 0)."""
    for name in names:  # a parameter at 0 could never move by scaling
        get, put = _PARAMS[name]
        if get(model) <= 0:
            model = put(model, _PARAMS[name][0](HOST_START))
    best = _log_error(rows, model)
    factor = 2.0
    while factor > smallest and rounds > 0:
        moved = False
        for name in names:
            get, put = _PARAMS[name]
            for f in (factor, 1 / factor):
                trial = put(model, get(model) * f)
                err = _log_error(rows, trial)
                rounds -= 1
                if err < best:
                    model, best, moved = trial, err, True
                    break
        if not moved:
            factor = factor ** 0.5
    return model


def calibrate(rows: list, base: Model = DEFAULT_MODEL, cores: int = 0) -> tuple[Model, list]:
    """Fit a model to bench rows (one host: what `collie bench` measures),
    each row's time predicted as the bench measures it (bench_seconds).
    Without ``cores``: the intra-host alpha and beta, gamma and delta,
    minimising the squared relative error; the simulated time is linear in
    them when nothing contends, so the fit uses each row's time under unit
    models (one parameter 1, the others 0) as its coefficients. With
    ``cores`` (the bench machine's): the host model (see "Cores"), every
    parameter of _HOST_PARAMS, by a pattern search on the squared log error
    from HOST_START (or from ``base`` if it has cores). Returns (model,
    [(row, predicted seconds)])."""
    if not rows:
        raise ValueError("no collie rows with a known op and algorithm to calibrate from")
    if cores < 0:
        raise ValueError(f"cores must be >= 0, got {cores}")
    if cores:
        start = (base if base.cores else HOST_START)._replace(cores=cores)
        model = _refine(rows, start, _HOST_PARAMS)
        return model, list(zip(rows, _predict(rows, model)))
    coeffs, targets = [], []
    for row in rows:
        measured = row["time_us"] * 1e-6
        scale = 1e-9  # unit models with tiny values keep sizes in range; linear anyway
        line = [bench_seconds(row["op"], row["algorithm"], row["nranks"], row["bytes"],
                              model=_basis_model(w, scale), dtype=row.get("dtype", "float32")) / scale
                for w in _BASIS]
        coeffs.append([c / measured for c in line])
        targets.append(1.0)
    alpha, beta, gamma, delta = _nnls(coeffs, targets)
    model = Model(Link(alpha, beta), base.inter, gamma, delta)
    return model, list(zip(rows, _predict(rows, model)))


# ---- the command ---------------------------------------------------------------

def _model_from(opts) -> Model:
    model = DEFAULT_MODEL
    if opts.model:
        with open(opts.model) as f:
            model = Model.from_json(json.load(f))
    intra, inter = model.intra, model.inter
    if opts.alpha_intra is not None:
        intra = intra._replace(alpha=opts.alpha_intra * 1e-6)
    if opts.bw_intra is not None:
        intra = intra._replace(beta=1 / (opts.bw_intra * 1e9))
    if opts.alpha_inter is not None:
        inter = inter._replace(alpha=opts.alpha_inter * 1e-6)
    if opts.bw_inter is not None:
        inter = inter._replace(beta=1 / (opts.bw_inter * 1e9))
    gamma = model.gamma if opts.bw_reduce is None else 1 / (opts.bw_reduce * 1e9)
    delta = model.delta if opts.bw_copy is None else 1 / (opts.bw_copy * 1e9)
    return model._replace(intra=intra, inter=inter, gamma=gamma, delta=delta,
                          cores=model.cores if opts.cores is None else opts.cores,
                          host_nic=model.host_nic or opts.host_nic)


def _parse(argv: list):
    p = argparse.ArgumentParser(
        prog="collie sim",
        description="Predict collectives from their real schedules on an alpha-beta-gamma model "
                    "(module collie.sim describes the model); rows in `collie bench`'s columns.")
    p.add_argument("op", nargs="?", default=None,
                   help=f"comma list of {', '.join(COLLECTIVES)}")
    p.add_argument("--algo", default=None, metavar="NAME|all",
                   help="the algorithm, or all of the op's side by side (default: the tuner's pick)")
    p.add_argument("--tuner", action="store_true",
                   help="simulate what the tuner picks for each size, and say which algorithm the "
                        "model predicts fastest")
    p.add_argument("-n", "--nranks", type=int, default=8, metavar="N", help="ranks (default 8)")
    p.add_argument("--hosts", type=int, default=1, metavar="K",
                   help="hosts, N/K consecutive ranks each (default 1); messages between hosts "
                        "take the inter-host link")
    p.add_argument("--size", "--sizes", dest="sizes", default="8,64K,1M,16M", metavar="LIST",
                   help="sizes as the bench takes them, e.g. 8,64K,1M (default 8,64K,1M,16M)")
    p.add_argument("--segments", type=int, default=None, help="pipeline segments (default: the tuner's rule)")
    p.add_argument("--root", type=int, default=0, help="root of broadcast, reduce, gather, scatter (default 0)")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--cores", type=int, default=None, metavar="C",
                   help="cores per host: the host model, how collie's shared-memory transport and compiled "
                        "core move messages on them (module docstring; default 0: a core per rank, alpha-beta)")
    p.add_argument("--host-nic", action="store_true",
                   help="the ranks of a host share one link to the other hosts (default: one link per rank)")
    p.add_argument("--full", action="store_true", help="simulate every rank, even where schedules are symmetric")
    p.add_argument("--model", default=None, metavar="FILE.json", help="a model saved by --calibrate --save")
    p.add_argument("--alpha-intra", type=float, default=None, metavar="US", help="intra-host latency, us")
    p.add_argument("--bw-intra", type=float, default=None, metavar="GBPS", help="intra-host bandwidth, GB/s")
    p.add_argument("--alpha-inter", type=float, default=None, metavar="US", help="inter-host latency, us")
    p.add_argument("--bw-inter", type=float, default=None, metavar="GBPS", help="inter-host bandwidth, GB/s")
    p.add_argument("--bw-reduce", type=float, default=None, metavar="GBPS", help="reduction rate, GB/s")
    p.add_argument("--bw-copy", type=float, default=None, metavar="GBPS", help="local copy rate, GB/s")
    p.add_argument("--json", default=None, metavar="PATH", help="write one JSON object per row")
    p.add_argument("--calibrate", default=None, metavar="BENCH.jsonl[,...]",
                   help="fit the model to `collie bench --json` rows (a comma list of files) and show "
                        "predicted against measured (rows of several runs: their median); --cores C fits "
                        "the host model")
    p.add_argument("--save", default=None, metavar="FILE.json", help="with --calibrate: write the fitted model")
    return p.parse_args(argv), p


def _calibrate_main(opts, p) -> int:
    try:
        every = [row for path in opts.calibrate.split(",") if path.strip() for row in read_bench_rows(path.strip())]
        rows = median_rows(every)
        model, predicted = calibrate(rows, _model_from(opts), opts.cores or 0)
    except (OSError, ValueError) as exc:
        p.error(str(exc))
    print(f"# collie sim --calibrate {opts.calibrate}: {len(rows)} rows"
          + (f" (the median of {len(every)} rows of several runs)" if len(every) > len(rows) else ""))
    print(f"# fitted: {model.describe()}")
    print(f"# {'op':<15}{'n':>3} {'size':>10} {'algorithm':<19}{'measured(us)':>13}{'predicted(us)':>14}{'error':>8}")
    errors = []
    for row, seconds in predicted:
        measured = row["time_us"]
        err = seconds * 1e6 / measured - 1
        errors.append(abs(err))
        print(f"  {row['op']:<15}{row['nranks']:>3} {row['bytes']:>10} {row['algorithm']:<19}"
              f"{measured:>13.2f}{seconds * 1e6:>14.2f}{err:>+8.0%}")
    within = sum(e <= 0.25 for e in errors)
    print(f"# median |error| {statistics_median(errors):.0%}; within 25%: {within} of {len(errors)} rows")
    if opts.save:
        with open(opts.save, "w") as f:
            json.dump(model.to_json(), f, indent=1)
            f.write("\n")
        print(f"# model written to {opts.save} (use it with --model)")
    return 0


def statistics_median(values: list) -> float:
    values = sorted(values)
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


def main(argv: Optional[list] = None) -> int:
    """``collie sim``; returns the exit code."""
    from .bench import _COLUMNS, bus_factor, parse_size
    argv = sys.argv[1:] if argv is None else list(argv)
    opts, p = _parse(argv)
    for name in ("alpha_intra", "bw_intra", "alpha_inter", "bw_inter", "bw_reduce", "bw_copy"):
        value = getattr(opts, name)
        if value is not None and (value < 0 or not math.isfinite(value) or (name.startswith("bw") and value == 0)):
            p.error(f"--{name.replace('_', '-')} must be a positive number, got {value}")
    if opts.cores is not None and opts.cores < 0:
        p.error(f"--cores must be >= 0, got {opts.cores}")
    if opts.calibrate:
        return _calibrate_main(opts, p)
    if opts.op is None:
        p.error("name an op (e.g. all_reduce), or give --calibrate")
    ops = [o.strip() for o in opts.op.split(",") if o.strip()]
    bad = [o for o in ops if o not in COLLECTIVES]
    if bad or not ops:
        p.error(f"unknown op {', '.join(bad) or '(empty)'}; choose from {', '.join(COLLECTIVES)}")
    if opts.nranks < 1:
        p.error(f"-n must be at least 1, got {opts.nranks}")
    if opts.hosts < 1 or opts.nranks % opts.hosts:
        p.error(f"--hosts must be >= 1 and divide -n ({opts.nranks}), got {opts.hosts}")
    if not 0 <= opts.root < opts.nranks:
        p.error(f"--root must be in [0, {opts.nranks}), got {opts.root}")
    if opts.segments is not None and opts.segments < 1:
        p.error(f"--segments must be at least 1, got {opts.segments}")
    try:
        sizes = [parse_size(s) for s in opts.sizes.split(",") if s.strip()]
        dtype = np.dtype(opts.dtype)
        model = _model_from(opts)
    except (TypeError, ValueError, OSError) as exc:
        p.error(str(exc))
    if not sizes:
        p.error("--size: no sizes")
    if opts.algo not in (None, "all"):
        for op in ops:
            if opts.algo not in algorithms.algorithms_for(op):
                p.error(f"{op} has no algorithm {opts.algo!r}; available: "
                        f"{', '.join(algorithms.algorithms_for(op))}")
    n, transport = opts.nranks, "shm" if opts.hosts == 1 else "tcp"
    from .tuner import Tuner
    tuner = Tuner(environ={})
    print(f"# collie sim {' '.join(argv)}")
    print(f"# nranks {n} on {opts.hosts} host(s) ({n // opts.hosts} ranks each); model: {model.describe()}")
    if model.cores:
        print("# time: per call of calls run back to back, as `collie bench` times them (the host model)")
    print("# time: the last rank's end in a discrete-event simulation of every rank's real schedule "
          "(sym: ranks simulated, when symmetric schedules let one rank stand for many)")
    rows = []
    for op in ops:
        names = " ".join(f"{name:>{w}}" for name, w in _COLUMNS)
        print(f"#\n# {op}\n#{names[1:]}   {'algorithm':<18}{'sym':>7}{'wall(s)':>9}")
        for size in sizes:
            labels = tuple(r // (n // opts.hosts) for r in range(n))
            picked = tuner.choose(op, 0 if op == "all_to_all" else size, n, transport, hosts=labels)
            if opts.algo == "all" or opts.tuner:
                algos = algorithms.algorithms_for(op)
            else:
                algos = [opts.algo or picked.algorithm]
            if transport != "shm":
                algos = [a for a in algos if a != "shm"]
            results = []
            for algo in algos:
                segs = opts.segments
                if segs is None and algo == picked.algorithm:
                    segs = picked.segments
                t0 = time.perf_counter()
                try:
                    kw = dict(hosts=opts.hosts, segments=segs, root=opts.root, dtype=dtype,
                              symmetry="full" if opts.full else "auto")
                    res = simulate(op, algo, n, size, model=model, **kw)
                    seconds = bench_seconds(op, algo, n, size, model=model, **kw) if model.cores else res.seconds
                except ValueError as exc:
                    print(f"# {op} {algo} at {size} bytes: not simulated: {exc}")
                    continue
                wall = time.perf_counter() - t0
                count, _ = block_sizes(op, size, dtype.itemsize, n)
                nbytes = _bench_bytes(op, size, dtype.itemsize, n)
                algbw = nbytes / seconds / 1e9 if seconds > 0 else 0.0
                row = {"backend": "sim", "op": op, "nranks": n, "bytes": nbytes, "dtype": dtype.name,
                       "algorithm": algo, "time_us": seconds * 1e6, "algbw_GBps": algbw,
                       "busbw_GBps": algbw * bus_factor(op, n), "wrong": None, "count": count,
                       "redop": "sum" if COLLECTIVES[op].reduces else "none",
                       "root": opts.root if COLLECTIVES[op].rooted else -1, "hosts": opts.hosts,
                       "segments": res.segments, "simulated": res.simulated}
                results.append(row)
                rows.append(row)
                mark = "  <- tuner" if opts.tuner and algo == picked.algorithm else ""
                print(f"{nbytes:>12} {count:>12} {dtype.name:>10} {row['redop']:>6} {row['root']:>5} "
                      f"{row['time_us']:>11.2f} {algbw:>12.3f} {row['busbw_GBps']:>12.3f} {'N/A':>7}   "
                      f"{algo:<18}{res.simulated:>7}{wall:>9.1f}{mark}")
            if opts.tuner and results:
                best = min(results, key=lambda r: r["time_us"])
                print(f"# {size} bytes: the tuner picks {picked.algorithm} (segments {picked.segments}: "
                      f"{picked.reason}); the model predicts {best['algorithm']} fastest"
                      + ("" if best["algorithm"] == picked.algorithm else
                         f", {next((r['time_us'] for r in results if r['algorithm'] == picked.algorithm), float('nan')) / best['time_us']:.2f}x faster than the pick"))
    if opts.json:
        with open(opts.json, "w") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
    return 0


def _bench_bytes(op: str, nbytes: int, itemsize: int, n: int) -> int:
    """The size column: what the bench prints for a requested size."""
    from .bench import layout
    if op == "barrier":
        return 0
    if op in ("gather", "scatter"):
        return nbytes // itemsize // n * n * itemsize
    return layout(op, nbytes, itemsize, n).nbytes


if __name__ == "__main__":
    sys.exit(main())
