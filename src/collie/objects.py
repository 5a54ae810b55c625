"""Collectives on picklable Python objects, as in torch.distributed.

Objects are pickled to bytes and moved as uint8 arrays by the array
collectives: first the sizes (int64, so objects over 2 GiB work), then the
bytes, padded to the largest size where a collective needs equal sizes.
broadcast_object_list and all_gather_object first send a fixed slot of
SLOT bytes, the size followed by the pickle when it fits: a small object
(the common case: a flag, a count, a small dict) costs one collective,
and only a larger one a second, whose sizes the first round carried.
Unpickling runs arbitrary code: only exchange objects with ranks you trust
(set COLLIE_TOKEN on untrusted networks).
"""

from __future__ import annotations

import pickle
import struct
from typing import Optional

import numpy as np

from .collectives import (_find_lane, _lane_key, _member, _root, _two_array_key, all_gather, all_gather_into_tensor,
                          broadcast, gather, scatter)
from .group import ProcessGroup

__all__ = ["broadcast_object_list", "all_gather_object", "gather_object", "scatter_object_list"]


def _dumps(obj) -> bytes:
    return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


def _loads(data):
    return pickle.loads(memoryview(data))


SLOT = 512   # bytes of the first round: a little-endian int64 size, then the pickle if it fits
_FITS = SLOT - 8
_SIZE = struct.Struct("<q")


def _slots(g: ProcessGroup) -> tuple:
    """``g``'s first-round buffers, made once (a small object's call is
    mostly bookkeeping, and making them each time was a third of it): this
    rank's slot and every rank's, each with its memoryview, the key of the
    all-gather lane between them, a function reading every rank's size from
    theirs, and where each rank's pickle starts there. Blocking calls on a
    group run one at a time, and every use ends within its call."""
    if g.object_slots is None:
        mine, every = np.zeros(SLOT, dtype=np.uint8), np.zeros(g.size * SLOT, dtype=np.uint8)
        sizes = struct.Struct("<" + f"q{_FITS}x" * g.size).unpack_from  # every rank's size at once
        g.object_slots = (mine, mine.data, every, every.data, _two_array_key("all_gather", every, mine, (None,)),
                          sizes, range(8, g.size * SLOT, SLOT))
    return g.object_slots


def _fill(slot: memoryview, payload: bytes) -> None:
    """Write the first round into ``slot``: ``payload``'s size, then ``payload`` if it fits."""
    n = len(payload)
    _SIZE.pack_into(slot, 0, n)
    if n <= _FITS:
        slot[8:8 + n] = payload


def _sizes(g: ProcessGroup, mine: int) -> np.ndarray:
    sizes = [np.zeros(1, dtype=np.int64) for _ in range(g.size)]
    all_gather(sizes, np.array([mine], dtype=np.int64), group=g)
    return np.concatenate(sizes)


def broadcast_pickle(g: ProcessGroup, payload: Optional[bytes], gsrc: int):
    """Rank ``gsrc``'s ``payload`` (a pickle, given there only) on every rank
    of ``g``, as a buffer: in the first round's slot when it fits, by a
    second round otherwise. The slot is reused by the group's next call."""
    slot, view = _slots(g)[:2]
    if payload is not None:
        _fill(view, payload)
    lane = _find_lane(g, _lane_key("broadcast", slot, gsrc, None, None), slot)
    if lane is None:
        broadcast(slot, src=gsrc, group=g)
    else:
        lane(slot)
    size = _SIZE.unpack_from(view)[0]
    if size <= _FITS:
        return view[8:8 + size]
    data = np.frombuffer(payload, dtype=np.uint8) if payload is not None else np.empty(size, dtype=np.uint8)
    broadcast(data, src=gsrc, group=g)  # a second round, of the whole pickle
    return data


def all_gather_pickles(g: ProcessGroup, payload: bytes) -> list:
    """Every rank's ``payload`` (a pickle), in rank order, as buffers: in the
    first round's slots when all fit, by a second round otherwise."""
    slot, mine, slots, view, key, sizes_of, starts = _slots(g)
    _fill(mine, payload)
    lane = _find_lane(g, key, slots)
    if lane is None:
        all_gather_into_tensor(slots, slot, group=g)
    else:
        lane(slot, slots)
    sizes = sizes_of(view)
    if max(sizes) <= _FITS:
        return [view[at:at + n] for at, n in zip(starts, sizes)]
    outs = [np.empty(n, dtype=np.uint8) for n in sizes]  # a second round, of every pickle at its size
    all_gather(outs, np.frombuffer(payload, dtype=np.uint8), group=g)
    return outs


def broadcast_object_list(object_list: list, src: Optional[int] = None, group=None, device=None,
                          group_src: Optional[int] = None) -> None:
    """Replace ``object_list``'s items on every rank with those of rank ``src``
    (lists must have the same length everywhere)."""
    g = _member(group, "broadcast_object_list")
    root = _root(g, src, group_src, "src", "broadcast_object_list")
    gsrc = g.ranks[root]
    if g.rank == root:
        broadcast_pickle(g, _dumps(list(object_list)), gsrc)
        return
    objects = _loads(broadcast_pickle(g, None, gsrc))
    if len(objects) != len(object_list):
        raise ValueError(f"broadcast_object_list: rank {gsrc} sent {len(objects)} objects but "
                         f"this rank's list has {len(object_list)}")
    object_list[:] = objects


def all_gather_object(object_list: list, obj, group=None) -> None:
    """``object_list[r]`` becomes rank r's ``obj`` on every rank."""
    g = _member(group, "all_gather_object")
    if not isinstance(object_list, list) or len(object_list) != g.size:
        raise ValueError(f"all_gather_object: object_list must be a list of {g.size} items (one per rank)")
    object_list[:] = map(_loads, all_gather_pickles(g, _dumps(obj)))


def gather_object(obj, object_gather_list: Optional[list] = None, dst: Optional[int] = None, group=None,
                  group_dst: Optional[int] = None) -> None:
    """``object_gather_list[r]`` on rank ``dst`` becomes rank r's ``obj``."""
    g = _member(group, "gather_object")
    root = _root(g, dst, group_dst, "dst", "gather_object")
    if g.rank == root and (not isinstance(object_gather_list, list) or len(object_gather_list) != g.size):
        raise ValueError(f"gather_object: object_gather_list on dst must be a list of {g.size} items")
    payload = _dumps(obj)
    sizes = _sizes(g, len(payload))
    width = int(sizes.max())
    padded = np.zeros(width, dtype=np.uint8)
    padded[:len(payload)] = np.frombuffer(payload, dtype=np.uint8)
    outs = [np.empty(width, dtype=np.uint8) for _ in range(g.size)] if g.rank == root else None
    gather(padded, outs, dst=g.ranks[root], group=g)
    if g.rank == root:
        object_gather_list[:] = [_loads(o[:int(s)]) for o, s in zip(outs, sizes)]


def scatter_object_list(scatter_object_output_list: list, scatter_object_input_list: Optional[list] = None,
                        src: Optional[int] = None, group=None, group_src: Optional[int] = None) -> None:
    """``scatter_object_output_list[0]`` on rank r becomes rank ``src``'s
    ``scatter_object_input_list[r]``."""
    g = _member(group, "scatter_object_list")
    root = _root(g, src, group_src, "src", "scatter_object_list")
    if not isinstance(scatter_object_output_list, list) or len(scatter_object_output_list) < 1:
        raise ValueError("scatter_object_list: scatter_object_output_list must be a list with at least one item")
    sizes = np.zeros(g.size, dtype=np.int64)
    payloads = None
    if g.rank == root:
        if not isinstance(scatter_object_input_list, (list, tuple)) or len(scatter_object_input_list) != g.size:
            raise ValueError(f"scatter_object_list: scatter_object_input_list on src must hold {g.size} objects")
        payloads = [_dumps(o) for o in scatter_object_input_list]
        sizes[:] = [len(p) for p in payloads]
    broadcast(sizes, src=g.ranks[root], group=g)
    width = int(sizes.max())
    pieces = None
    if payloads is not None:
        pieces = []
        for p in payloads:
            padded = np.zeros(width, dtype=np.uint8)
            padded[:len(p)] = np.frombuffer(p, dtype=np.uint8)
            pieces.append(padded)
    out = np.empty(width, dtype=np.uint8)
    scatter(out, pieces, src=g.ranks[root], group=g)
    scatter_object_output_list[0] = _loads(out[:int(sizes[g.rank])])
