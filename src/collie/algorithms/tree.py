"""Binomial tree rooted at the root: the set of ranks that have the data
doubles every step. log2(n) steps, so it wins on latency; the root sends the
whole message log2(n) times, so it loses on bandwidth.

Ranks are numbered relative to the root, v = (rank - root) mod n. The parent
of v is v minus its lowest set bit; its children are v + 2^j for every 2^j
below that bit, so the subtree of v is the contiguous range [v, v + lowbit(v)).

    n=8, broadcast (step at which each edge is used)
    0 ──2──> 1
    0 ──1──> 2 ──2──> 3
    0 ──0──> 4 ──1──> 6 ──2──> 7
             4 ──2──> 5

broadcast sends to the largest subtree first; reduce and gather run the same
edges backwards (a child with a subtree of 2^j ranks is done after j steps).
all_reduce and barrier are a reduce to rank 0 then a broadcast.

n ranks, K = ceil(log2 n), S = bytes of "out" (gather/scatter: of one
rank's block):

  collective   rounds           bytes sent per rank
  broadcast    K                root K*S; others S * children
  reduce       K                S (every rank but the root)
  gather       K                subtree(v) * S to the parent
  scatter      K                root (n-1)S; others (subtree - 1)S
  all_reduce   2K               up to K*S (rank 0, in the broadcast)
  barrier      2K               zero-byte messages

``segments`` is ignored: pipelining does not shorten a binomial tree, since
the root still sends every part to each of its K children in turn.
Interior ranks of gather and scatter keep their subtree's blocks in "tmp",
so the engine must know every rank's block size there (it does when all
ranks pass same-sized arrays, as torch.distributed requires).
"""

from __future__ import annotations

from ..schedule import Copy, Recv, Send
from . import block, blocks, log2_ceil, make_schedule, register

NAME = "tree"


def _lowbit(v: int, n: int) -> int:
    """Size bound of v's subtree: its lowest set bit (the root's is all)."""
    return v & -v if v else 1 << log2_ceil(n)


def _children(v: int, n: int):
    """(j, child) for each child v + 2^j, largest subtree first."""
    low = _lowbit(v, n)
    return [(j, v + (1 << j)) for j in reversed(range(low.bit_length() - 1)) if v + (1 << j) < n]


def _subtree(v: int, n: int) -> range:
    return range(v, min(n, v + _lowbit(v, n)))


def _reduce_events(n, v, to_rank, acc="out", first_copy=False):
    """Binomial reduce toward relative rank 0: a child with a subtree of 2^j
    ranks sends at step j. Returns (events, time after the last step)."""
    events = []
    kids = _children(v, n)
    for j, c in reversed(kids):
        if first_copy and j == kids[-1][0]:
            events.append((j, Copy(block("out", 0), block(acc, 0))))
        events.append((j, Recv(to_rank(c), block(acc, 0), reduce=True)))
    if v:
        low = v & -v
        events.append((low.bit_length() - 1, Send(to_rank(v - low), block(acc, 0))))
    return events


def _broadcast_events(n, v, to_rank, start=0):
    """Binomial broadcast from relative rank 0: the edge to a child with a
    subtree of 2^j ranks is used at step K-1-j."""
    k = log2_ceil(n)
    events = []
    if v:
        low = v & -v
        events.append((start + k - low.bit_length(), Recv(to_rank(v - low), block("out", 0))))
    for j, c in _children(v, n):
        events.append((start + k - 1 - j, Send(to_rank(c), block("out", 0))))
    return events


@register("broadcast", NAME)
def broadcast(nranks, rank, root, segments):
    v = (rank - root) % nranks
    events = _broadcast_events(nranks, v, lambda u: (u + root) % nranks)
    return make_schedule("broadcast", NAME, nranks, rank, root, events)


@register("reduce", NAME)
def reduce(nranks, rank, root, segments):
    # Ranks other than the root must leave "out" unchanged: interior ones
    # add their children's data into a copy of it in "tmp".
    v = (rank - root) % nranks
    interior = v != 0 and bool(_children(v, nranks))
    acc = "tmp" if interior else "out"
    events = _reduce_events(nranks, v, lambda u: (u + root) % nranks, acc, first_copy=interior)
    return make_schedule("reduce", NAME, nranks, rank, root, events,
                         tmp_like="out" if interior else None)


def _all_reduce(collective, nranks, rank):
    def to_rank(u):
        return u

    events = _reduce_events(nranks, rank, to_rank)
    events += _broadcast_events(nranks, rank, to_rank, start=log2_ceil(nranks))
    return make_schedule(collective, NAME, nranks, rank, 0, events)


@register("all_reduce", NAME)
def all_reduce(nranks, rank, root, segments):
    return _all_reduce("all_reduce", nranks, rank)


@register("barrier", NAME)
def barrier(nranks, rank, root, segments):
    return _all_reduce("barrier", nranks, rank)


@register("gather", NAME)
def gather(nranks, rank, root, segments):
    n = nranks
    v = (rank - root) % n

    def to_rank(u):
        return (u + root) % n

    kids = _children(v, n)
    # Where this rank keeps a block of its subtree: the root in "out", an
    # interior rank in "tmp" (laid out like the root's "out").
    keep = "out" if v == 0 else "tmp"
    events = []
    if v == 0:
        events.append((0, Copy(block("in", 0), block("out", rank))))
    for j, c in kids:
        events.append((j, Recv(to_rank(c), blocks(keep, [to_rank(u) for u in _subtree(c, n)]))))
    if v:
        low = v & -v
        rest = [to_rank(u) for u in _subtree(v, n) if u != v]
        message = block("in", 0) + blocks("tmp", rest)
        events.append((low.bit_length() - 1, Send(to_rank(v - low), message)))
    return make_schedule("gather", NAME, n, rank, root, events,
                         tmp_like="out" if v and kids else None)


@register("scatter", NAME)
def scatter(nranks, rank, root, segments):
    n = nranks
    v = (rank - root) % n
    k = log2_ceil(n)

    def to_rank(u):
        return (u + root) % n

    kids = _children(v, n)
    keep = "in" if v == 0 else "tmp"  # where this rank's subtree blocks are
    events = []
    if v == 0:
        events.append((0, Copy(block("in", rank), block("out", 0))))
    else:
        low = v & -v
        rest = [to_rank(u) for u in _subtree(v, n) if u != v]
        message = block("out", 0) + blocks("tmp", rest)
        events.append((k - low.bit_length(), Recv(to_rank(v - low), message)))
    for j, c in kids:
        events.append((k - 1 - j, Send(to_rank(c), blocks(keep, [to_rank(u) for u in _subtree(c, n)]))))
    return make_schedule("scatter", NAME, n, rank, root, events,
                         tmp_like="in" if v and kids else None)
