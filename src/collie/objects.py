"""Collectives on picklable Python objects, as in torch.distributed.

Objects are pickled to bytes and moved as uint8 arrays by the array
collectives. Every object collective first moves a fixed slot of SLOT
bytes per rank (per pair of ranks, for all_to_all): the pickle's size,
then the pickle itself when it fits. A small object (the common case: a
flag, a count, a small dict) thus costs one collective of a fixed shape,
which repeated calls run through its lane to the compiled core. A pickle
too large for its slot follows in a second round whose sizes the first
carried: a broadcast or all_gather of them where every rank needs every
pickle, and otherwise point-to-point messages from the one rank that has
it to the one that needs it (a gather's to the root, a scatter's from it,
all_to_all's pair by pair) on the group's tag _LARGE_TAG, so that ranks
with only small objects take no part in it.

Unpickling runs arbitrary code: only exchange objects with ranks you trust
(set COLLIE_TOKEN on untrusted networks).
"""

from __future__ import annotations

import pickle
import struct
from typing import Callable, Optional, Sequence

import numpy as np

from . import core
from .collectives import _member, _root, all_gather, all_gather_into_tensor, all_to_all_single, broadcast, rooted_blocks
from .group import ProcessGroup
from .wire import MAX_TAG
from .work import Work

__all__ = ["broadcast_object_list", "all_gather_object", "gather_object", "scatter_object_list"]


def _dumps(obj) -> bytes:
    return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


_loads = pickle.loads

SLOT = 512   # bytes of the first round: a little-endian int64 size, then the pickle if it fits
_FITS = SLOT - 8
_SIZE = struct.Struct("<q")
# The group's point-to-point tag of the second rounds that go rank to rank
# (MAX_TAG itself is send_object_list's; collie.MPI keeps MAX_TAG - 1 to - 4).
_LARGE_TAG = MAX_TAG - 5


# ---- the slots: the compiled core's pack_slots and unpack_slots, or these ----

def _pack_slots(buffer, payloads: Sequence, slot: int) -> bool:
    """Slot i of ``buffer`` gets payloads[i]'s size, then payloads[i] if it
    fits; whether all fit."""
    view, fits = memoryview(buffer).cast("B"), True
    if slot < 8 or len(payloads) * slot > view.nbytes:
        raise ValueError(f"pack_slots: {len(payloads)} slots of {slot} bytes do not fit in {view.nbytes} bytes")
    for i, payload in enumerate(payloads):
        at, n = i * slot, len(payload)
        _SIZE.pack_into(view, at, n)
        if n <= slot - 8:
            view[at + 8:at + 8 + n] = payload
        else:
            fits = False
    return fits


def _unpack_slots(buffer, n: int, slot: int, loads: Optional[Callable]) -> tuple:
    """(items, large): items[i] is loads(slot i's pickle) (its bytes where
    ``loads`` is None), or None where it did not fit; ``large`` lists those
    as (i, size), or is None when all fit."""
    view, items, large = memoryview(buffer).cast("B"), [], []
    if n < 0 or slot < 8 or n * slot > view.nbytes:
        raise ValueError(f"unpack_slots: {n} slots of {slot} bytes are not in {view.nbytes} bytes")
    for i in range(n):
        size = _SIZE.unpack_from(view, i * slot)[0]
        if 0 <= size <= slot - 8:
            data = bytes(view[i * slot + 8:i * slot + 8 + size])
            items.append(data if loads is None else loads(data))
        else:
            items.append(None)
            large.append((i, size))
    return items, large or None


pack_slots = core.pack_slots or _pack_slots
unpack_slots = core.unpack_slots or _unpack_slots


class _Slots:
    """A group's first-round buffers, made once (a small object's call is
    mostly bookkeeping): this rank's slot, every rank's (or every pair's)
    slots, and the slots it sends to every rank (all_to_all, and a
    scatter's root). Blocking calls on a group run one at a time, and every
    use ends within its call."""

    __slots__ = ("mine", "every", "outgoing")

    def __init__(self, n: int):
        self.mine, self.every, self.outgoing = (np.zeros(SLOT, dtype=np.uint8), np.zeros(n * SLOT, dtype=np.uint8),
                                                np.zeros(n * SLOT, dtype=np.uint8))


def _slots(g: ProcessGroup) -> _Slots:
    slots = g.object_slots
    if slots is None:
        slots = g.object_slots = _Slots(g.size)
    return slots


def _large(g: ProcessGroup, sends: Sequence, recvs: Sequence, what: str) -> list:
    """The second round of pickles too large for their slots, rank to rank:
    ``sends`` [(group rank, pickle)] go out, ``recvs`` [(group rank, size)]
    come in, on the group's _LARGE_TAG; nothing else of the group takes
    part. Returns what came in, in ``recvs``' order."""
    net, tag = g.network, g.p2p_tag(_LARGE_TAG)
    state = net.p2p
    if state is not None and state.deferred:  # collie.p2p's receives posted before take their messages first
        state.post(None)
    outs = [np.empty(n, dtype=np.uint8) for _, n in recvs]
    reqs = [net.irecv(g.ranks[r], tag, memoryview(out)) for (r, _), out in zip(recvs, outs)]
    reqs += [net.isend(g.ranks[r], tag, memoryview(p)) for r, p in sends]
    peers = sorted({g.ranks[r] for r, _ in [*sends, *recvs]})
    Work(net, reqs, lambda: f"{what} on group {g.name}: the pickles too large for their slots, to or from "
                            f"rank(s) {peers}", timeout=g.timeout).wait()
    return outs


def _fill_in(items: list, large: list, got: list, loads: Callable) -> list:
    for (i, _), data in zip(large, got):
        items[i] = loads(data)
    return items


def broadcast_loads(g: ProcessGroup, payload: Optional[bytes], gsrc: int, loads: Callable):
    """Rank ``gsrc``'s ``payload`` (a pickle, given there only) through
    ``loads`` on every other rank of ``g`` (None on ``gsrc``): in the first
    round's slot when it fits, by a second round otherwise."""
    slot = _slots(g).mine
    fits = payload is None or pack_slots(slot, (payload,), SLOT)
    broadcast(slot, gsrc, g)  # repeated: from its C entry to its lane
    if payload is not None:
        if not fits:  # a second round, of the whole pickle
            broadcast(np.frombuffer(payload, dtype=np.uint8), src=gsrc, group=g)
        return None
    items, large = unpack_slots(slot, 1, SLOT, loads)
    if large is None:
        return items[0]
    data = np.empty(large[0][1], dtype=np.uint8)
    broadcast(data, src=gsrc, group=g)
    return loads(data)


def all_gather_loads(g: ProcessGroup, payload: bytes, loads: Callable, got=None) -> list:
    """Every rank's ``payload`` (a pickle), in rank order, each through
    ``loads``: from the first round's slots, and those that did not fit
    from a second round. ``got``: as gather_loads'."""
    s = g.object_slots or _slots(g)
    if got is None:
        got = _core_round("all_gather", g, None, s, (payload,), loads)
    if not got:
        pack_slots(s.mine, (payload,), SLOT)
        all_gather_into_tensor(s.every, s.mine, g)  # its first run makes the lane the core's round takes
        items, large = unpack_slots(s.every, g.size, SLOT, loads)
    else:
        _, items, large = got
    if large is None:
        return items
    # Every rank needs every pickle: one all_gather of those that did not fit (the others, 0 bytes).
    outs = [np.empty(0, dtype=np.uint8) for _ in range(g.size)]
    for r, n in large:
        outs[r] = np.empty(n, dtype=np.uint8)
    all_gather(outs, np.frombuffer(payload if len(payload) > _FITS else b"", dtype=np.uint8), group=g)
    return _fill_in(items, large, [outs[r] for r, _ in large], loads)


def _rooted_round(name: str, g: ProcessGroup, root: int, s: _Slots, payloads: Optional[Sequence[bytes]],
                  loads: Callable) -> tuple:
    """The first round of an object gather (``name`` "gather") or scatter
    ("scatter") on group rank ``root``: ``payloads`` (this rank's one
    pickle for a gather, the root's one per rank for a scatter, None on a
    scatter's other ranks) packed into ``s``, the rooted call, then what
    came in through ``loads``. Returns (fits, items, large): whether the
    payloads fit their slots, and, at a gather's root every rank's slot and
    on a scatter's other ranks their own, as unpack_slots gives them (else
    None, None). The compiled core's slots_round does all of it in one
    call where the call has a lane."""
    gather, mine_root = name == "gather", g.rank == root
    packed = s.mine if gather else s.outgoing
    fits = True if payloads is None else pack_slots(packed, payloads, SLOT)
    rooted_blocks(name, g, s.mine, (s.every if gather else s.outgoing) if mine_root else None, root)
    if gather == mine_root:  # a gather's root, or a scatter's other ranks: what came in
        return (fits, *unpack_slots(s.every if gather else s.mine, g.size if gather else 1, SLOT, loads))
    return fits, None, None


_core_round = core.slots_round or (lambda *args: None)  # None: no lane (or no core), the full path runs


def gather_loads(g: ProcessGroup, payload: bytes, root: int, loads: Callable, got=None) -> Optional[list]:
    """Every rank's ``payload`` (a pickle) at group rank ``root``, in rank
    order, each through ``loads``; None on the other ranks. ``got``: what
    the core's round returned where the caller ran it already (False: it
    ran none; compat/mpi's compiled gather and reduce)."""
    s = g.object_slots or _slots(g)
    if got is None:
        got = _core_round("gather", g, root, s, (payload,), loads)
    fits, items, large = got or _rooted_round("gather", g, root, s, (payload,), loads)
    if g.rank != root:
        if not fits:
            _large(g, ((root, payload),), (), "gather")
        return None
    if large is not None:
        if not fits:  # its own, at hand
            items[root] = loads(payload)
            large = [(r, n) for r, n in large if r != root]
        if large:
            _fill_in(items, large, _large(g, (), large, "gather"), loads)
    return items


def scatter_loads(g: ProcessGroup, payloads: Optional[Sequence[bytes]], root: int, loads: Callable, got=None):
    """Item r of the root's ``payloads`` (pickles, one per rank, given at
    the root only) through ``loads`` on group rank r. ``got``: as gather_loads'."""
    s = g.object_slots or _slots(g)
    if got is None:
        got = _core_round("scatter", g, root, s, payloads, loads)
    fits, items, large = got or _rooted_round("scatter", g, root, s, payloads, loads)
    if g.rank != root:
        return items[0] if large is None else loads(_large(g, (), ((root, large[0][1]),), "scatter")[0])
    large = [] if fits else [(r, p) for r, p in enumerate(payloads) if len(p) > _FITS and r != root]
    if large:
        _large(g, large, (), "scatter")
    return loads(payloads[root])


def all_to_all_loads(g: ProcessGroup, payloads: Sequence[bytes], loads: Callable) -> list:
    """``payloads[q]`` of every rank r (pickles, one per rank) becomes item
    r of rank q's list, through ``loads``."""
    s = g.object_slots or _slots(g)
    got = _core_round("all_to_all", g, None, s, payloads, loads)
    if got is None:
        fits = pack_slots(s.outgoing, payloads, SLOT)
        all_to_all_single(s.every, s.outgoing, group=g)  # its first run makes the lane the core's round takes
        items, large = unpack_slots(s.every, g.size, SLOT, loads)
    else:
        fits, items, large = got
    if fits and large is None:
        return items
    me = g.rank
    sends = [] if fits else [(r, p) for r, p in enumerate(payloads) if len(p) > _FITS and r != me]
    if len(payloads[me]) > _FITS:  # its own, at hand
        items[me] = loads(payloads[me])
    recvs = [(r, n) for r, n in large or () if r != me]
    if sends or recvs:
        _fill_in(items, recvs, _large(g, sends, recvs, "all_to_all"), loads)
    return items


def broadcast_object_list(object_list: list, src: Optional[int] = None, group=None, device=None,
                          group_src: Optional[int] = None) -> None:
    """Replace ``object_list``'s items on every rank with those of rank ``src``
    (lists must have the same length everywhere)."""
    g = _member(group, "broadcast_object_list")
    root = _root(g, src, group_src, "src", "broadcast_object_list")
    gsrc = g.ranks[root]
    if g.rank == root:
        broadcast_loads(g, _dumps(list(object_list)), gsrc, _loads)
        return
    objects = broadcast_loads(g, None, gsrc, _loads)
    if len(objects) != len(object_list):
        raise ValueError(f"broadcast_object_list: rank {gsrc} sent {len(objects)} objects but "
                         f"this rank's list has {len(object_list)}")
    object_list[:] = objects


def all_gather_object(object_list: list, obj, group=None) -> None:
    """``object_list[r]`` becomes rank r's ``obj`` on every rank."""
    g = _member(group, "all_gather_object")
    if not isinstance(object_list, list) or len(object_list) != g.size:
        raise ValueError(f"all_gather_object: object_list must be a list of {g.size} items (one per rank)")
    object_list[:] = all_gather_loads(g, _dumps(obj), _loads)


def gather_object(obj, object_gather_list: Optional[list] = None, dst: Optional[int] = None, group=None,
                  group_dst: Optional[int] = None) -> None:
    """``object_gather_list[r]`` on rank ``dst`` becomes rank r's ``obj``."""
    g = _member(group, "gather_object")
    root = _root(g, dst, group_dst, "dst", "gather_object")
    if g.rank == root and (not isinstance(object_gather_list, list) or len(object_gather_list) != g.size):
        raise ValueError(f"gather_object: object_gather_list on dst must be a list of {g.size} items")
    got = gather_loads(g, _dumps(obj), root, _loads)
    if got is not None:
        object_gather_list[:] = got


def scatter_object_list(scatter_object_output_list: list, scatter_object_input_list: Optional[list] = None,
                        src: Optional[int] = None, group=None, group_src: Optional[int] = None) -> None:
    """``scatter_object_output_list[0]`` on rank r becomes rank ``src``'s
    ``scatter_object_input_list[r]``."""
    g = _member(group, "scatter_object_list")
    root = _root(g, src, group_src, "src", "scatter_object_list")
    if not isinstance(scatter_object_output_list, list) or len(scatter_object_output_list) < 1:
        raise ValueError("scatter_object_list: scatter_object_output_list must be a list with at least one item")
    payloads = None
    if g.rank == root:
        if not isinstance(scatter_object_input_list, (list, tuple)) or len(scatter_object_input_list) != g.size:
            raise ValueError(f"scatter_object_list: scatter_object_input_list on src must hold {g.size} objects")
        payloads = [_dumps(o) for o in scatter_object_input_list]
    scatter_object_output_list[0] = scatter_loads(g, payloads, root, _loads)
