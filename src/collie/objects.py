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
from typing import Optional

import numpy as np

from .collectives import _member, _root, all_gather, all_gather_into_tensor, broadcast, gather, scatter
from .group import ProcessGroup

__all__ = ["broadcast_object_list", "all_gather_object", "gather_object", "scatter_object_list"]


def _dumps(obj) -> np.ndarray:
    return np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), dtype=np.uint8)


def _loads(arr: np.ndarray):
    return pickle.loads(memoryview(arr))


SLOT = 512   # bytes of the first round: an int64 size, then the pickle if it fits
_FITS = SLOT - 8


def _slot(payload: Optional[np.ndarray]) -> np.ndarray:
    """The first round's bytes: ``payload``'s size, then ``payload`` if it fits."""
    slot = np.zeros(SLOT, dtype=np.uint8)
    if payload is not None:
        slot[:8].view(np.int64)[0] = payload.size
        if payload.size <= _FITS:
            slot[8:8 + payload.size] = payload
    return slot


def _slot_size(slot: np.ndarray) -> int:
    return int(slot[:8].view(np.int64)[0])


def _sizes(g: ProcessGroup, mine: int) -> np.ndarray:
    sizes = [np.zeros(1, dtype=np.int64) for _ in range(g.size)]
    all_gather(sizes, np.array([mine], dtype=np.int64), group=g)
    return np.concatenate(sizes)


def broadcast_object_list(object_list: list, src: Optional[int] = None, group=None, device=None,
                          group_src: Optional[int] = None) -> None:
    """Replace ``object_list``'s items on every rank with those of rank ``src``
    (lists must have the same length everywhere)."""
    g = _member(group, "broadcast_object_list")
    root = _root(g, src, group_src, "src", "broadcast_object_list")
    gsrc = g.ranks[root]
    payload = _dumps(list(object_list)) if g.rank == root else None
    slot = _slot(payload)
    broadcast(slot, src=gsrc, group=g)
    size = _slot_size(slot)
    if size > _FITS:  # a second round, of the whole pickle
        data = payload if payload is not None else np.empty(size, dtype=np.uint8)
        broadcast(data, src=gsrc, group=g)
    else:
        data = slot[8:8 + size]
    if g.rank != root:
        objects = _loads(data)
        if len(objects) != len(object_list):
            raise ValueError(f"broadcast_object_list: rank {gsrc} sent {len(objects)} objects but "
                             f"this rank's list has {len(object_list)}")
        object_list[:] = objects


def all_gather_object(object_list: list, obj, group=None) -> None:
    """``object_list[r]`` becomes rank r's ``obj`` on every rank."""
    g = _member(group, "all_gather_object")
    if not isinstance(object_list, list) or len(object_list) != g.size:
        raise ValueError(f"all_gather_object: object_list must be a list of {g.size} items (one per rank)")
    payload = _dumps(obj)
    slots = np.empty((g.size, SLOT), dtype=np.uint8)
    all_gather_into_tensor(slots.reshape(-1), _slot(payload), group=g)
    sizes = [_slot_size(row) for row in slots]
    if max(sizes) > _FITS:  # a second round, of every pickle at its size
        outs = [np.empty(s, dtype=np.uint8) for s in sizes]
        all_gather(outs, payload, group=g)
    else:
        outs = [row[8:8 + s] for row, s in zip(slots, sizes)]
    object_list[:] = [_loads(o) for o in outs]


def gather_object(obj, object_gather_list: Optional[list] = None, dst: Optional[int] = None, group=None,
                  group_dst: Optional[int] = None) -> None:
    """``object_gather_list[r]`` on rank ``dst`` becomes rank r's ``obj``."""
    g = _member(group, "gather_object")
    root = _root(g, dst, group_dst, "dst", "gather_object")
    if g.rank == root and (not isinstance(object_gather_list, list) or len(object_gather_list) != g.size):
        raise ValueError(f"gather_object: object_gather_list on dst must be a list of {g.size} items")
    payload = _dumps(obj)
    sizes = _sizes(g, payload.size)
    width = int(sizes.max())
    padded = np.zeros(width, dtype=np.uint8)
    padded[:payload.size] = payload
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
        sizes[:] = [p.size for p in payloads]
    broadcast(sizes, src=g.ranks[root], group=g)
    width = int(sizes.max())
    pieces = None
    if payloads is not None:
        pieces = []
        for p in payloads:
            padded = np.zeros(width, dtype=np.uint8)
            padded[:p.size] = p
            pieces.append(padded)
    out = np.empty(width, dtype=np.uint8)
    scatter(out, pieces, src=g.ranks[root], group=g)
    scatter_object_output_list[0] = _loads(out[:int(sizes[g.rank])])
