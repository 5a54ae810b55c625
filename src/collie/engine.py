"""The engine: runs one rank's Schedule over the Network.

It is the only code that turns schedules into messages, so every algorithm
runs through it and behaves the same way on every transport. Running a
schedule is three stages:

1. plan(): fit the schedule to concrete block sizes (in elements), turning
   every chunk into an element range and merging the ranges of a message
   that are contiguous, so that most messages are one slice of the user's
   array (sent and received in place, no staging copy). Plans are cached,
   so a collective called repeatedly with the same sizes plans once.

2. bind(): fix the plan to one call shape on one group (dtype, reduce op,
   global ranks): byte ranges, peers and the combine function of every
   message, computed once, so that a repeated call does little more than
   slice its arrays and post its messages. The caller caches the Program.

3. execute(): for each step, run the local copies, reductions and Reads
   (from a peer's shared window), post every send (first, so that a peer
   waiting on this rank gets its data soonest), then every receive, and
   wait for all of them. Receives that reduce combine the incoming bytes
   into the destination piece by piece as they arrive, straight from where
   the transport holds them (but the later ones of a combining group,
   which land in staging and are combined in order at the step's end).

A schedule with a shared window ("win", the shm algorithm) whose call needs
more window than the host's windows hold runs in slices: slice k covers part
k of every block, and each slice is a whole run of the schedule (which ends
with every reader's "done", so the next slice may rewrite the windows).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable, NamedTuple, Optional

import numpy as np

from .arrays import byte_view
from .runtime import RUNTIME
from .schedule import Copy, Read, Recv, Reduce, Schedule, Send, block_offsets, part_bounds

Piece = tuple  # (buf, lo, hi): elements [lo, hi) of buffer buf


class PlannedMessage(NamedTuple):
    peer: int          # group rank
    pieces: tuple      # merged (buf, lo, hi) pieces, in message order
    count: int         # elements in the message
    reduce: bool


# Local op kinds
COPY, REDUCE, READ, READ_REDUCE = range(4)


class PlannedStep(NamedTuple):
    local: tuple       # (kind, peer, src_pieces, dst_pieces): pairwise, unmerged; peer for reads
    recvs: tuple       # PlannedMessage
    sends: tuple       # PlannedMessage


class Plan(NamedTuple):
    """A schedule bound to sizes: ``slices`` runs of ``steps`` each (more
    than one only when the shared window is smaller than the call needs)."""
    schedule: Schedule
    slices: tuple      # tuple of steps (one tuple of PlannedStep per slice)
    tmp_count: int
    win_count: int     # elements of the window one slice uses
    counts: dict       # buffer -> elements of the array execute() gets for it

    @property
    def steps(self) -> tuple:
        return self.slices[0] if self.slices else ()


def _pieces(chunks, ranges, parts) -> list:
    out = []
    for chunk in chunks:
        start, stop = ranges[chunk.buf][chunk.block]
        lo, hi = part_bounds(start, stop, parts, chunk.part)
        out.append((chunk.buf, lo, hi))
    return out


def _merge(pieces) -> tuple:
    """Drop empty pieces and join neighbours that are contiguous in memory."""
    merged: list = []
    for buf, lo, hi in pieces:
        if hi == lo:
            continue
        if merged and merged[-1][0] == buf and merged[-1][2] == lo:
            merged[-1] = (buf, merged[-1][1], hi)
        else:
            merged.append((buf, lo, hi))
    return tuple(merged)


def _block_ranges(sizes, k: int, nslices: int) -> tuple:
    """(start, stop) of slice k of every block of a buffer of these block sizes."""
    offsets = block_offsets(sizes)
    return tuple(part_bounds(offsets[b], offsets[b + 1], nslices, k) for b in range(len(sizes)))


def _compact(ranges) -> tuple:
    """The same block sizes, laid out back to back from 0 (a slice's window)."""
    out, at = [], 0
    for start, stop in ranges:
        out.append((at, at + stop - start))
        at += stop - start
    return tuple(out)


def _plan_steps(schedule: Schedule, ranges: dict) -> tuple:
    parts = schedule.parts
    steps = []
    for step in schedule.steps:
        local, recvs, sends = [], [], []
        for op in step:
            if isinstance(op, (Copy, Reduce)):
                local.append((REDUCE if isinstance(op, Reduce) else COPY, -1,
                              tuple(_pieces(op.src, ranges, parts)), tuple(_pieces(op.dst, ranges, parts))))
            elif isinstance(op, Read):
                local.append((READ_REDUCE if op.reduce else READ, op.peer,
                              tuple(_pieces(op.src, ranges, parts)), tuple(_pieces(op.dst, ranges, parts))))
            else:
                pieces = _pieces(op.chunks, ranges, parts)
                count = sum(hi - lo for _, lo, hi in pieces)
                msg = PlannedMessage(op.peer, _merge(pieces), count, isinstance(op, Recv) and op.reduce)
                (sends if isinstance(op, Send) else recvs).append(msg)
        steps.append(PlannedStep(tuple(local), tuple(recvs), tuple(sends)))
    return tuple(steps)


def _slices_needed(sizes, window: int, algorithm: str) -> int:
    """The fewest slices of blocks of ``sizes`` elements whose largest fits
    ``window`` elements. Slice k holds part k of every block, and the first
    parts round up: with uneven blocks a slice can hold up to one element
    per block more than an even share, so ceil(total / window) slices may
    not be enough."""
    def largest(n: int) -> int:  # slice 0: every block's first part
        return sum(-(-size // n) for size in sizes)

    total, nonempty = sum(sizes), sum(1 for size in sizes if size)
    if not total:
        return 1
    if window < nonempty:
        raise ValueError(f"{algorithm}: a shared window of {window} elements cannot hold one element "
                         f"of each of {nonempty} blocks (raise COLLIE_SHM_WINDOW_BYTES)")
    lo = -(-total // window)  # no fewer: every slice holds at most window elements
    hi = max(sizes) if window == nonempty else -(-total // (window - nonempty))  # enough: see above
    while lo < hi:  # largest() only shrinks as n grows
        mid = (lo + hi) // 2
        if largest(mid) <= window:
            hi = mid
        else:
            lo = mid + 1
    return lo


_PLANS: "OrderedDict[tuple, Plan]" = RUNTIME.plans  # (emptied by destroy_process_group)
_PLAN_CACHE_SIZE = 256


def plan(schedule: Schedule, block_sizes: dict, window: int = 0) -> Plan:
    """Bind ``schedule`` to buffers whose blocks have ``block_sizes``
    (buffer name -> tuple of sizes in elements). A schedule with a shared
    window gets ``window`` elements of it, and runs in as many slices as the
    window needs (slice k covers part k of every block)."""
    key = (id(schedule), tuple(sorted(block_sizes.items())), window)
    cached = _PLANS.get(key)
    if cached is not None and cached.schedule is schedule:
        _PLANS.move_to_end(key)
        return cached
    nslices, win_count = 1, 0
    if schedule.win_like is not None:
        sizes = block_sizes[schedule.win_like]
        if window <= 0 and sum(sizes):
            raise ValueError(f"{schedule.algorithm} needs a shared window, and there is none")
        nslices = _slices_needed(sizes, window, schedule.algorithm)
    slices = []
    for k in range(nslices):
        ranges = {name: _block_ranges(sizes, k, nslices) for name, sizes in block_sizes.items()}
        if schedule.tmp_like is not None:
            ranges["tmp"] = ranges[schedule.tmp_like]
        if schedule.win_like is not None:
            ranges["win"] = _compact(ranges[schedule.win_like])
            win_count = max(win_count, ranges["win"][-1][1] if ranges["win"] else 0)
        slices.append(_plan_steps(schedule, ranges))
    tmp_count = sum(block_sizes[schedule.tmp_like]) if schedule.tmp_like is not None else 0
    counts = {name: sum(sizes) for name, sizes in block_sizes.items()}
    counts.update(tmp=tmp_count, win=win_count)
    result = Plan(schedule, tuple(slices), tmp_count, win_count, counts)
    _PLANS[key] = result
    if len(_PLANS) > _PLAN_CACHE_SIZE:
        _PLANS.popitem(last=False)
    return result


_EMPTY = memoryview(bytearray(0))

# A call's scratch ("tmp") up to this size is kept for the next call of the
# same shape instead of being allocated again (small calls are dominated by
# such fixed costs; large scratch is freed, as before).
SPARE_BYTES = 64 * 1024


class BoundMessage(NamedTuple):
    """A planned message with what execute() needs precomputed: the peer's
    global rank and, when the message is one piece, its buffer and byte
    range. ``staged`` holds a message of several pieces, which goes through
    a contiguous staging copy; ``buf`` None and ``staged`` None: empty."""
    peer: int
    buf: Optional[str]
    lo: int            # bytes
    hi: Optional[int]  # None: the whole buffer (lo is 0), which needs no slice
    combine: Optional[Callable]  # a receive that reduces: merges arriving bytes in place
    staged: Optional[PlannedMessage]


class BoundStep(NamedTuple):
    index: int         # the step's number in the whole call (for error messages)
    local: tuple       # (kind, peer, ((src piece, dst piece), ...)): pieces in bytes for
                       # COPY (as BoundMessage's), in elements for the others
    recvs: tuple       # BoundMessage
    sends: tuple       # BoundMessage


class Program(NamedTuple):
    """A Plan bound to one call shape on one group: the dtype, the reduce
    kernel and the group's global ranks. It holds everything execute()
    needs that does not depend on the arrays, so that a repeated call only
    slices its arrays and posts its messages (built once per call shape by
    the caller, which caches it)."""
    plan: Plan
    dtype: np.dtype
    reduce_kernel: Optional[Callable]
    peers: tuple       # group rank -> global rank
    steps: tuple       # BoundStep, every slice's steps in order
    viewed: tuple      # buffers that messages or copies address as bytes
    by_name: bool      # whether execute() needs arrays by name too (a reduction, a Read or a
                       # staged message), not only the byte views
    spare: list        # (array, its bytes): scratch "tmp" of earlier calls, ready for reuse
    core: list         # the compiled core's form of it, once made (see core.py)


def _combiner(reduce_kernel: Callable, dtype: np.dtype) -> Callable:
    """combine(dst, src) for the transports: both are bytes of the call's dtype."""
    ufunc = getattr(reduce_kernel, "ufunc", None)
    if ufunc is not None:  # the kernel is one ufunc call: make it here, one Python call less
        def combine(dst: memoryview, src: memoryview) -> None:
            out = np.frombuffer(dst, dtype)
            ufunc(out, np.frombuffer(src, dtype), out)  # out positionally: no keyword parsing
        return combine

    def combine(dst: memoryview, src: memoryview) -> None:
        reduce_kernel(np.frombuffer(dst, dtype), np.frombuffer(src, dtype))
    return combine


def bind(plan_: Plan, dtype: np.dtype, reduce_kernel: Optional[Callable], peers) -> Program:
    """Precompute, for ``plan_`` run on arrays of ``dtype`` by a group whose
    ranks are ``peers``, every byte range, peer and combine function."""
    itemsize = dtype.itemsize
    combine = _combiner(reduce_kernel, dtype) if reduce_kernel is not None else None
    viewed: set = set()

    def in_bytes(buf: str, lo: int, hi: int) -> tuple:
        """A piece in bytes; its end None when it is the whole buffer (the
        common case of small calls), so that execute() makes no slice of it."""
        viewed.add(buf)
        return buf, lo * itemsize, None if lo == 0 and hi == plan_.counts[buf] else hi * itemsize

    def bound(msg: PlannedMessage, staged: bool = False) -> BoundMessage:
        if len(msg.pieces) == 1 and not staged:
            return BoundMessage(peers[msg.peer], *in_bytes(*msg.pieces[0]), combine if msg.reduce else None, None)
        return BoundMessage(peers[msg.peer], None, 0, 0, None, msg if msg.pieces else None)

    def received(recvs: tuple) -> tuple:
        """A step's receives, those of a combining group (collie.schedule)
        after its first staged: they arrive in any order, and execute()
        combines them, in order, once all are in."""
        first: set = set()
        out = []
        for m in recvs:
            grouped = m.reduce and m.pieces and m.pieces in first
            if m.reduce:
                first.add(m.pieces)
            out.append(bound(m, staged=grouped))
        return tuple(out)

    steps = []
    nsteps = len(plan_.steps)
    for k, planned in enumerate(plan_.slices):
        for index, step in enumerate(planned):
            local = []
            for kind, peer, src, dst in step.local:
                if kind == COPY:  # a byte copy: the same for every dtype, and cheaper
                    pairs = tuple((in_bytes(*s), in_bytes(*d)) for s, d in zip(src, dst))
                else:
                    pairs = tuple(zip(src, dst))
                local.append((kind, peer, pairs))
            steps.append(BoundStep(k * nsteps + index, tuple(local),
                                   received(step.recvs), tuple(bound(m) for m in step.sends)))
    by_name = any(kind != COPY for step in steps for kind, _, _ in step.local) or any(
        m.staged is not None for step in steps for m in step.recvs + step.sends)
    return Program(plan_, dtype, reduce_kernel, tuple(peers), tuple(steps), tuple(sorted(viewed)),
                   by_name, [], [])


def take_spare(program: Program):
    """A call's scratch: (array, its bytes), kept from an earlier call of
    this program or made now; None when the schedule needs none."""
    plan_ = program.plan
    if plan_.schedule.tmp_like is None:
        return None
    try:
        return program.spare.pop()  # atomic: safe if two threads run this program
    except IndexError:
        tmp = np.empty(plan_.tmp_count, dtype=program.dtype)
        return tmp, byte_view(tmp)


def give_spare(program: Program, spare) -> None:
    """Keep a small scratch for the next call (every request of the call is
    done: no transport touches it any more)."""
    if spare is not None and spare[0].nbytes <= SPARE_BYTES:
        program.spare.append(spare)


class CallState(NamedTuple):
    """What the steps of one call work on: the arrays by name (tmp and win
    included), their bytes, and the shared windows by group rank."""
    arrays: dict
    views: dict
    windows: Optional[dict]


def call_state(program: Program, arrays: dict, network, spare) -> CallState:
    plan_, dtype = program.plan, program.dtype
    schedule = plan_.schedule
    if spare is not None and program.by_name:
        arrays = dict(arrays, tmp=spare[0])
    windows = None
    if schedule.win_like is not None:
        # This rank's and its peers' windows, viewed with the call's dtype.
        windows = {g: np.frombuffer(network.window(program.peers[g]), dtype=dtype, count=plan_.win_count)
                   for g in range(len(program.peers))}
        arrays = dict(arrays, win=windows[schedule.rank])
    views = {}  # buffer -> its bytes
    for buf in program.viewed:
        views[buf] = spare[1] if buf == "tmp" else memoryview(arrays[buf]).cast("B")
    return CallState(arrays, views, windows)


def run_step(program: Program, step: BoundStep, state: CallState, network, tag: int, meta: int,
             describe: Callable[[int], str], timeout: float, locals_done: bool = False, done: int = 0,
             inflight=()) -> None:
    """Run one step: its local operations (unless ``locals_done``), then
    its messages but those whose bit is set in ``done`` (bit j: send j,
    bit len(sends) + j: receive j), which another executor already ran
    or posted (``inflight``: the requests of those still under way)."""
    index, local, recvs, sends = step
    arrays, views, windows = state
    reduce_kernel, dtype = program.reduce_kernel, program.dtype
    if not locals_done:
        for kind, peer, pairs in local:
            if kind == COPY:
                for (sb, slo, shi), (db, dlo, dhi) in pairs:
                    views[db][dlo:dhi] = views[sb] if shi is None else views[sb][slo:shi]
                continue
            source = arrays if kind < READ else {"win": windows[peer]}
            for (sb, slo, shi), (db, dlo, dhi) in pairs:
                if kind == READ:
                    np.copyto(arrays[db][dlo:dhi], source[sb][slo:shi])
                else:
                    reduce_kernel(arrays[db][dlo:dhi], source[sb][slo:shi])
    if not recvs and not sends:
        return
    posted_recvs, posted_sends, unpack = [], [], None
    nsends = len(sends)
    for j, (peer, buf, lo, hi, combine, staged) in enumerate(recvs):
        if done >> (nsends + j) & 1:
            continue
        if buf is not None:
            dst = views[buf] if hi is None else views[buf][lo:hi]
        elif staged is None:
            dst = _EMPTY
        else:
            staging = np.empty(staged.count, dtype=dtype)
            dst = byte_view(staging)
            unpack = unpack or []
            unpack.append((staged, staging))
        posted_recvs.append((peer, dst, combine))
    for j, (peer, buf, lo, hi, _, staged) in enumerate(sends):
        if done >> j & 1:
            continue
        if buf is not None:
            data = views[buf] if hi is None else views[buf][lo:hi]
        elif staged is None:
            data = _EMPTY
        else:
            data = byte_view(np.concatenate([arrays[b][lo:hi] for b, lo, hi in staged.pieces]))
        posted_sends.append((peer, data))
    call = (tag, meta, program.peers, program.plan.schedule.parts)  # what a stuck rank tells its peers
    network.exchange(posted_recvs, posted_sends, tag, meta, timeout, describe, index, call, inflight)
    if unpack:
        for planned, staging in unpack:
            at = 0
            for buf, lo, hi in planned.pieces:
                piece = staging[at:at + hi - lo]
                at += hi - lo
                if planned.reduce:
                    reduce_kernel(arrays[buf][lo:hi], piece)
                else:
                    np.copyto(arrays[buf][lo:hi], piece)


def execute(program: Program, arrays: dict, network, tag: int, meta: int,
            describe: Callable[[int], str], timeout: float) -> None:
    """Run a bound plan on ``arrays`` (buffer name -> flat contiguous
    array, all of the program's dtype). ``describe(step)`` names the call
    for error messages. The reference executor (core.py has the compiled one)."""
    spare = take_spare(program)
    state = call_state(program, arrays, network, spare)
    for step in program.steps:
        run_step(program, step, state, network, tag, meta, describe, timeout)
    give_spare(program, spare)
