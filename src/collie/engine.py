"""The engine: runs one rank's Schedule over the Network.

It is the only code that turns schedules into messages, so every algorithm
runs through it and behaves the same way on every transport. Running a
schedule is two stages:

1. plan(): bind the schedule to concrete block sizes and item size, turning
   every chunk into an element range and merging the ranges of a message
   that are contiguous, so that most messages are one slice of the user's
   array (sent and received in place, no staging copy). Plans are cached,
   so a collective called repeatedly with the same sizes plans once.

2. execute(): for each step, run the local copies, reductions and Reads
   (from a peer's shared window), post every receive (first, so that data
   finds its destination waiting), then every send, and wait for all of
   them. Receives that reduce combine the incoming bytes into the
   destination piece by piece as they arrive, straight from where the
   transport holds them.

A schedule with a shared window ("win", the shm algorithm) whose call needs
more window than the host's windows hold runs in slices: slice k covers part
k of every block, and each slice is a whole run of the schedule (which ends
with every reader's "done", so the next slice may rewrite the windows).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable, NamedTuple, Optional

import numpy as np

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


_PLANS: "OrderedDict[tuple, Plan]" = OrderedDict()
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
        need = sum(block_sizes[schedule.win_like])
        if window <= 0 and need:
            raise ValueError(f"{schedule.algorithm} needs a shared window, and there is none")
        nslices = max(1, -(-need // window)) if need else 1
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
    result = Plan(schedule, tuple(slices), tmp_count, win_count)
    _PLANS[key] = result
    if len(_PLANS) > _PLAN_CACHE_SIZE:
        _PLANS.popitem(last=False)
    return result


_EMPTY = memoryview(bytearray(0))


def _bytes(arr: np.ndarray) -> memoryview:
    return memoryview(arr.view(np.uint8))


def execute(plan_: Plan, arrays: dict, reduce_kernel: Optional[Callable], network, peers,
            tag: int, meta: int, describe: Callable[[int], str], timeout: float) -> None:
    """Run a planned schedule on ``arrays`` (buffer name -> flat contiguous
    array, all of one dtype). ``peers`` maps group ranks to global ranks;
    ``describe(step)`` names the call for error messages."""
    dtype = next(iter(arrays.values())).dtype
    itemsize = dtype.itemsize
    if plan_.schedule.tmp_like is not None and "tmp" not in arrays:
        arrays = dict(arrays, tmp=np.empty(plan_.tmp_count, dtype=dtype))
    windows = None
    if plan_.schedule.win_like is not None:
        # This rank's and its peers' windows, viewed with the call's dtype.
        windows = {g: np.frombuffer(network.window(peers[g]), dtype=dtype, count=plan_.win_count)
                   for g in range(len(peers))}
        arrays = dict(arrays, win=windows[plan_.schedule.rank])
    views: dict = {}  # buffer -> its bytes, made on first use (slicing a memoryview is cheap)

    def span(buf: str, lo: int, hi: int) -> memoryview:
        view = views.get(buf)
        if view is None:
            view = views[buf] = memoryview(arrays[buf].view(np.uint8))
        return view[lo * itemsize:hi * itemsize]

    def combine(dst: memoryview, src: memoryview) -> None:
        reduce_kernel(np.frombuffer(dst, dtype), np.frombuffer(src, dtype))

    post_recv, post_send = network.post_recv, network.post_send
    call = (tag, meta, peers)
    nsteps = len(plan_.steps)
    for k, steps in enumerate(plan_.slices):
        for index, step in enumerate(steps):
            for kind, peer, src, dst in step.local:
                source = arrays if kind < READ else {"win": windows[peer]}
                for (sb, slo, shi), (db, dlo, dhi) in zip(src, dst):
                    if kind == COPY or kind == READ:
                        np.copyto(arrays[db][dlo:dhi], source[sb][slo:shi])
                    else:
                        reduce_kernel(arrays[db][dlo:dhi], source[sb][slo:shi])
            if not step.recvs and not step.sends:
                continue
            requests, unpack = [], []
            for msg in step.recvs:
                if not msg.pieces:
                    dst = _EMPTY
                elif len(msg.pieces) == 1:
                    dst = span(*msg.pieces[0])
                else:
                    staging = np.empty(msg.count, dtype=dtype)
                    dst = _bytes(staging)
                    unpack.append((msg, staging))
                requests.append(post_recv(peers[msg.peer], tag, dst,
                                          combine if msg.reduce and len(msg.pieces) == 1 else None, meta))
            for msg in step.sends:
                if not msg.pieces:
                    data = _EMPTY
                elif len(msg.pieces) == 1:
                    data = span(*msg.pieces[0])
                else:
                    data = _bytes(np.concatenate([arrays[b][lo:hi] for b, lo, hi in msg.pieces]))
                requests.append(post_send(peers[msg.peer], tag, data, meta))
            network.wait(requests, timeout=timeout, describe=lambda: describe(k * nsteps + index), call=call)
            for msg, staging in unpack:
                at = 0
                for buf, lo, hi in msg.pieces:
                    piece = staging[at:at + hi - lo]
                    at += hi - lo
                    if msg.reduce:
                        reduce_kernel(arrays[buf][lo:hi], piece)
                    else:
                        np.copyto(arrays[buf][lo:hi], piece)
