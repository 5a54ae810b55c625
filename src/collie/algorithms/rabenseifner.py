"""Rabenseifner: a reduce-scatter by recursive halving, then (for
all_reduce) an all-gather by recursive doubling, or (for reduce) a gather
of the reduced parts to the root. 2*log2(n) steps like
recursive doubling's log2(n), but each rank sends only about 2S in all
instead of S*log2(n): the usual choice for medium and large all_reduce
(Gloo's "halving-doubling", MPICH's default for long messages).

Recursive halving over p ranks: the buffer is cut into p parts. In step k the
ranks pair up across distance d = p/2^(k+1) (partner = id XOR d); of the
range of parts both still work on, each keeps one half, sends the other to
its partner and adds the partner's copy of its own half in. After log2 p
steps id a holds part a reduced over everyone. The all-gather retraces the
steps backwards, doubling the range each step.

    p=4: parts held (and reduced so far) by id
              id0      id1      id2      id3
    start     0123     0123     0123     0123
    d=2       01       01       23       23      (0<->2, 1<->3)
    d=1       0        1        2        3       (0<->1, 2<->3)
    then back: d=1 -> 01 01 23 23, d=2 -> 0123 everywhere

When n is not a power of two, the first 2e ranks (e = n - p) fold in pairs
as in recursive doubling: rank 2i sends all of its data to rank 2i+1 first
and (all_reduce) gets the result back at the end. In reduce_scatter the ids
stand for the blocks of the ranks they stand for (two for a folded pair),
and the odd rank of a pair sends its partner's finished block at the end.

n ranks, p, e as above, L = log2 p, S = bytes of "out" (reduce_scatter: of
"in"):

  collective      rounds            bytes sent per rank
  all_reduce      2L (+2 if e > 0)  2 S (p-1)/p (+S for a folded pair)
  reduce_scatter  L (+2 if e > 0)   S (p-1)/p (+S for a folded pair)
  reduce          L + 1 (+1 if e > 0)  S (p-1)/p + S/p (+S for a folded pair)

reduce is MPICH's reduce for long messages: where direct and the trees
leave every addition to the root or a chain of parents, here the p ranks
each add one part, and the root then only receives. Its partial sums live
in "tmp" on every rank but the root (whose "out" is the result; the
others' "out" stays as it was).

``segments`` is ignored: every step already sends to a different rank.
"""

from __future__ import annotations

import functools

from ..schedule import Chunk, Copy, Recv, Send
from . import block, blocks, fold, land_then_add, make_schedule, register

NAME = "rabenseifner"


def _halving(f, me: int):
    """Recursive halving among the p standing ranks: at step k, the peer and
    the ranges (of p parts) this rank keeps and gives away. Yields
    (k, peer, keep, give); the kept range halves every step and ends as
    [me, me + 1)."""
    lo, hi = 0, f.p
    for k in range(f.steps):
        d = f.p >> (k + 1)
        mid = lo + d
        if me & d:
            keep, give, lo = (mid, hi), (lo, mid), mid
        else:
            keep, give, hi = (lo, mid), (mid, hi), mid
        yield k, f.rank_of(me ^ d), keep, give


@functools.lru_cache(maxsize=1 << 16)
def _parts(lo: int, hi: int, buf: str = "out") -> tuple:
    """Parts lo..hi-1 of ``buf``, shared by every rank's schedule: the ranges
    are aligned halves of [0, p), about 2p of them in all, where building
    them per rank made n ranks' schedules cost O(n p) chunks (16 s for
    1,024 ranks; hours for 24,576, which the simulator runs)."""
    return tuple(Chunk(buf, 0, q) for q in range(lo, hi))


@register("all_reduce", NAME)
def all_reduce(nranks, rank, root, segments):
    f = fold(nranks)
    p, steps = f.p, f.steps
    me = f.active(rank)
    whole = block("out", 0, p)
    parts = _parts
    events = []
    if me is None:
        events.append((0, Send(rank + 1, whole)))
        events.append((2 * steps + 1, Recv(rank + 1, whole)))
        return make_schedule("all_reduce", NAME, nranks, rank, root, events, parts=p)
    if f.folded(rank):
        events.append((0, Recv(rank - 1, whole, reduce=True)))
        events.append((2 * steps + 1, Send(rank - 1, whole)))
    for k, peer, keep, give in _halving(f, me):  # keep the half we belong to
        events.append((1 + k, Send(peer, parts(*give))))
        events.append((1 + k, Recv(peer, parts(*keep), reduce=True)))
    lo, hi = me, me + 1
    for k in range(steps):  # recursive doubling: swap finished ranges
        d = 1 << k
        peer = f.rank_of(me ^ d)
        theirs = (me ^ d) & ~(d - 1)
        events.append((1 + steps + k, Send(peer, parts(lo, hi))))
        events.append((1 + steps + k, Recv(peer, parts(theirs, theirs + d))))
        lo, hi = min(lo, theirs), max(hi, theirs + d)
    return make_schedule("all_reduce", NAME, nranks, rank, root, events, parts=p)


@register("reduce_scatter", NAME)
def reduce_scatter(nranks, rank, root, segments):
    n = nranks
    f = fold(n)
    steps = f.steps
    me = f.active(rank)

    # Where the partial sum of each block is: "in" until this rank first
    # adds something to it, then "tmp", its own block too (copied to "out"
    # at the end): a message then lands in one contiguous range of "tmp",
    # where a range ending in "out" would be two pieces, staged through
    # Python's executor (four ranks, 16 bytes: 55-60 us against ring's 7).
    # On two ranks the one block kept is this rank's own: straight to "out".
    where = {b: Chunk("in", b, 0) for b in range(n)}

    def home(b):
        return Chunk("out", 0, 0) if b == rank and n == 2 else Chunk("tmp", b, 0)

    def add_into(time, peer, block_ids):
        """Receive the partner's partial sums of these blocks into their
        home and add ours (the first time, ours is added after it lands)."""
        if all(where[b] != home(b) for b in block_ids):
            events.extend(land_then_add(time, peer, tuple(where[b] for b in block_ids),
                                        tuple(home(b) for b in block_ids)))
            for b in block_ids:
                where[b] = home(b)
            return
        dst = []
        for b in block_ids:
            if where[b] != home(b):
                events.append((time, Copy((where[b],), (home(b),))))
                where[b] = home(b)
            dst.append(home(b))
        events.append((time, Recv(peer, tuple(dst), reduce=True)))

    events = []
    if n == 1:
        events.append((0, Copy(block("in", 0), block("out", 0))))
    if me is None:
        events.append((0, Send(rank + 1, blocks("in", range(n)))))
        events.append((steps + 1, Recv(rank + 1, block("out", 0))))
        return make_schedule("reduce_scatter", NAME, n, rank, root, events)
    if f.folded(rank):
        add_into(0, rank - 1, range(n))
        events.append((steps + 1, Send(rank - 1, (where[rank - 1],))))
    for k, peer, keep, give in _halving(f, me):
        events.append((1 + k, Send(peer, tuple(where[b] for b in f.stood_for(*give)))))
        add_into(1 + k, peer, f.stood_for(*keep))
    if n > 2:  # its own block, summed in "tmp" (after the last step's add, if it lands then)
        events.append((steps + 1, Copy((where[rank],), block("out", 0))))
    return make_schedule("reduce_scatter", NAME, n, rank, root, events,
                         tmp_like="in" if n > 2 else None)


@register("reduce", NAME)
def reduce(nranks, rank, root, segments):
    f = fold(nranks)
    p, steps = f.p, f.steps
    me = f.active(rank)
    home = "out" if rank == root else "tmp"
    where = ["out"] * p  # where this rank's partial sum of each part is

    def add_into(time, peer, lo, hi):
        """The partner's partial sums of parts lo..hi-1 added into their home
        (the first time, for a rank other than the root: landed there, ours
        added after)."""
        if where[lo] != home:
            events.extend(land_then_add(time, peer, _parts(lo, hi), _parts(lo, hi, home)))
            where[lo:hi] = [home] * (hi - lo)
        else:
            events.append((time, Recv(peer, _parts(lo, hi, home), reduce=True)))

    events = []
    if me is None:  # a folded rank: its data goes to its partner; the root's result comes back at the end
        events.append((0, Send(rank + 1, _parts(0, p))))
    else:
        if f.folded(rank):
            add_into(0, rank - 1, 0, p)
        for k, peer, keep, give in _halving(f, me):
            events.append((1 + k, Send(peer, _parts(*give, where[give[0]]))))
            add_into(1 + k, peer, *keep)
        if rank != root:  # its finished part, to the root
            events.append((1 + steps, Send(root, _parts(me, me + 1, where[me]))))
    if rank == root:
        for a in range(p):
            if a != me:
                events.append((1 + steps, Recv(f.rank_of(a), _parts(a, a + 1))))
    return make_schedule("reduce", NAME, nranks, rank, root, events, parts=p,
                         tmp_like="out" if rank != root and me is not None else None)
