"""The engine: runs one rank's Schedule over the Network.

It is the only code that turns schedules into messages, so every algorithm
runs through it and behaves the same way on every transport. Running a
schedule is two stages:

1. plan(): bind the schedule to concrete block sizes and item size, turning
   every chunk into an element range and merging the ranges of a message
   that are contiguous, so that most messages are one slice of the user's
   array (sent and received in place, no staging copy). Plans are cached,
   so a collective called repeatedly with the same sizes plans once.

2. execute(): for each step, run the local copies and reductions, post every
   receive (first, so that data finds its destination waiting), then every
   send, and wait for all of them. Receives that reduce combine the incoming
   bytes into the destination piece by piece as they arrive, straight from
   where the transport holds them.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable, NamedTuple, Optional

import numpy as np

from .schedule import Copy, Recv, Reduce, Schedule, Send, block_offsets, chunk_range

Piece = tuple  # (buf, lo, hi): elements [lo, hi) of buffer buf


class PlannedMessage(NamedTuple):
    peer: int          # group rank
    pieces: tuple      # merged (buf, lo, hi) pieces, in message order
    count: int         # elements in the message
    reduce: bool


class PlannedStep(NamedTuple):
    local: tuple       # (is_reduce, src_pieces, dst_pieces): pairwise, unmerged
    recvs: tuple       # PlannedMessage
    sends: tuple       # PlannedMessage


class Plan(NamedTuple):
    schedule: Schedule
    steps: tuple
    tmp_count: int


def _pieces(chunks, offsets, parts) -> list:
    out = []
    for chunk in chunks:
        lo, hi = chunk_range(offsets[chunk.buf], parts, chunk)
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


_PLANS: "OrderedDict[tuple, Plan]" = OrderedDict()
_PLAN_CACHE_SIZE = 256


def plan(schedule: Schedule, block_sizes: dict) -> Plan:
    """Bind ``schedule`` to buffers whose blocks have ``block_sizes``
    (buffer name -> tuple of sizes in elements)."""
    key = (id(schedule), tuple(sorted(block_sizes.items())))
    cached = _PLANS.get(key)
    if cached is not None and cached.schedule is schedule:
        _PLANS.move_to_end(key)
        return cached
    offsets = {name: block_offsets(sizes) for name, sizes in block_sizes.items()}
    if schedule.tmp_like is not None:
        offsets["tmp"] = offsets[schedule.tmp_like]
    parts = schedule.parts
    steps = []
    for step in schedule.steps:
        local, recvs, sends = [], [], []
        for op in step:
            if isinstance(op, (Copy, Reduce)):
                local.append((isinstance(op, Reduce), tuple(_pieces(op.src, offsets, parts)),
                              tuple(_pieces(op.dst, offsets, parts))))
            else:
                pieces = _pieces(op.chunks, offsets, parts)
                count = sum(hi - lo for _, lo, hi in pieces)
                msg = PlannedMessage(op.peer, _merge(pieces), count, isinstance(op, Recv) and op.reduce)
                (sends if isinstance(op, Send) else recvs).append(msg)
        steps.append(PlannedStep(tuple(local), tuple(recvs), tuple(sends)))
    tmp_count = offsets["tmp"][-1] if "tmp" in offsets else 0
    result = Plan(schedule, tuple(steps), tmp_count)
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
    if plan_.schedule.tmp_like is not None and "tmp" not in arrays:
        some = next(iter(arrays.values()))
        arrays = dict(arrays, tmp=np.empty(plan_.tmp_count, dtype=some.dtype))
    dtype = next(iter(arrays.values())).dtype

    def combine(dst: memoryview, src: memoryview) -> None:
        reduce_kernel(np.frombuffer(dst, dtype), np.frombuffer(src, dtype))

    for index, step in enumerate(plan_.steps):
        for is_reduce, src, dst in step.local:
            for (sb, slo, shi), (db, dlo, dhi) in zip(src, dst):
                if is_reduce:
                    reduce_kernel(arrays[db][dlo:dhi], arrays[sb][slo:shi])
                else:
                    np.copyto(arrays[db][dlo:dhi], arrays[sb][slo:shi])
        if not step.recvs and not step.sends:
            continue
        requests, unpack = [], []
        for msg in step.recvs:
            if not msg.pieces:
                dst = _EMPTY
            elif len(msg.pieces) == 1:
                buf, lo, hi = msg.pieces[0]
                dst = _bytes(arrays[buf][lo:hi])
            else:
                staging = np.empty(msg.count, dtype=dtype)
                dst = _bytes(staging)
                unpack.append((msg, staging))
            requests.append(network.irecv(peers[msg.peer], tag, dst,
                                          combine if msg.reduce and len(msg.pieces) == 1 else None, meta))
        for msg in step.sends:
            if not msg.pieces:
                data = _EMPTY
            elif len(msg.pieces) == 1:
                buf, lo, hi = msg.pieces[0]
                data = _bytes(arrays[buf][lo:hi])
            else:
                data = _bytes(np.concatenate([arrays[b][lo:hi] for b, lo, hi in msg.pieces]))
            requests.append(network.isend(peers[msg.peer], tag, data, meta))
        network.wait(requests, timeout=timeout, describe=lambda: describe(index), call=(tag, meta, peers))
        for msg, staging in unpack:
            at = 0
            for buf, lo, hi in msg.pieces:
                piece = staging[at:at + hi - lo]
                at += hi - lo
                if msg.reduce:
                    reduce_kernel(arrays[buf][lo:hi], piece)
                else:
                    np.copyto(arrays[buf][lo:hi], piece)
