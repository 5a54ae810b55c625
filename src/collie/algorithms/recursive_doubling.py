"""Recursive doubling: in step k every rank exchanges everything it has with
the rank whose id differs in bit k, so what a rank holds doubles each step.
log2(n) steps, each moving whole buffers: it wins on latency for small
messages and loses on bandwidth for large ones.

    n=8, partners by step
    k=0: 0<->1 2<->3 4<->5 6<->7
    k=1: 0<->2 1<->3 4<->6 5<->7
    k=2: 0<->4 1<->5 2<->6 3<->7

When n is not a power of two, p = 2^floor(log2 n) ranks take part and the
other e = n - p fold in first: rank 2i hands its data to rank 2i+1 (for
i < e) in an extra first step, and gets the result back in an extra last
step.

barrier is the dissemination barrier instead (any n, no folding): in step k
rank r signals r+2^k and hears from r-2^k, so after ceil(log2 n) steps each
rank has heard, directly or not, from every rank.

n ranks, p and e as above, L = log2 p, S = bytes of "out" (all_gather: of
all of "out"):

  collective   rounds                    bytes sent per rank
  all_reduce   L (+2 if e > 0)           L*S (+S for a folded pair)
  all_gather   L (+2 if e > 0)           S (n-1)/n when n = p (step k sends
                                         2^k blocks); a folded pair also
                                         sends S/n up and S (n-1)/n back
  barrier      ceil(log2 n)              zero-byte messages
"""

from __future__ import annotations

from ..schedule import Copy, Recv, Send
from . import block, blocks, fold, log2_ceil, make_schedule, register

NAME = "recursive_doubling"


@register("all_reduce", NAME)
def all_reduce(nranks, rank, root, segments):
    f = fold(nranks)
    steps = f.steps
    me = f.active(rank)
    out, tmp = block("out", 0), block("tmp", 0)
    events = []
    if me is None:  # folded: hand the data over, wait for the result
        events.append((0, Send(rank + 1, out)))
        events.append((steps + 1, Recv(rank + 1, out)))
    else:
        if f.folded(rank):
            events.append((0, Recv(rank - 1, out, reduce=True)))
            events.append((steps + 1, Send(rank - 1, out)))
        for k in range(steps):
            peer = f.rank_of(me ^ (1 << k))
            # Send what we had before the step while adding in the partner's.
            events.append((k + 1, Copy(out, tmp)))
            events.append((k + 1, Send(peer, tmp)))
            events.append((k + 1, Recv(peer, out, reduce=True)))
    return make_schedule("all_reduce", NAME, nranks, rank, root, events,
                         tmp_like="out" if me is not None and steps else None)


@register("all_gather", NAME)
def all_gather(nranks, rank, root, segments):
    n = nranks
    f = fold(n)
    steps = f.steps
    me = f.active(rank)
    # Our own block goes to "out" in the first step this rank takes part in.
    events = [(0 if f.folded(rank) else 1, Copy(block("in", 0), block("out", rank)))]
    if me is None:
        events.append((0, Send(rank + 1, block("in", 0))))
        events.append((steps + 1, Recv(rank + 1, blocks("out", [q for q in range(n) if q != rank]))))
    else:
        if f.folded(rank):
            events.append((0, Recv(rank - 1, block("out", rank - 1))))
            events.append((steps + 1, Send(rank - 1, blocks("out", [q for q in range(n) if q != rank - 1]))))
        for k in range(steps):
            size = 1 << k
            mine = me & ~(size - 1)  # the aligned group of ids we hold
            theirs = mine ^ size
            peer = f.rank_of(me ^ size)
            events.append((k + 1, Send(peer, blocks("out", f.stood_for(mine, mine + size)))))
            events.append((k + 1, Recv(peer, blocks("out", f.stood_for(theirs, theirs + size)))))
    return make_schedule("all_gather", NAME, n, rank, root, events)


@register("barrier", NAME)
def barrier(nranks, rank, root, segments):
    # Received signals are combined into "out"; what is sent is a copy taken
    # before the step, so sending and receiving never share a chunk. (Signals
    # may reach a rank by two paths; the verifier allows that for barrier,
    # whose reductions are of nothing.)
    n = nranks
    out, tmp = block("out", 0), block("tmp", 0)
    events = []
    for k in range(log2_ceil(n)):
        events.append((k, Copy(out, tmp)))
        events.append((k, Send((rank + (1 << k)) % n, tmp)))
        events.append((k, Recv((rank - (1 << k)) % n, out, reduce=True)))
    return make_schedule("barrier", NAME, n, rank, root, events,
                         tmp_like="out" if n > 1 else None)
