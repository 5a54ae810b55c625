"""Ring: every rank talks only to its two neighbours, so every link carries
the same load at every step. Bandwidth-optimal for large messages; latency
grows with n.

all_reduce is a reduce-scatter then an all-gather over the n chunks of the
buffer. In reduce-scatter step t, rank r sends chunk r-t to r+1 and adds
chunk r-t-1 from r-1 into its own; after n-1 steps rank r holds chunk r+1
reduced over all ranks. In all-gather step t it forwards the finished chunk
it got last (r+1-t) and receives chunk r-t.

    n=4, reduce-scatter (chunk sent by each rank; it travels right)
    step 0:  r0:c0  r1:c1  r2:c2  r3:c3
    step 1:  r0:c3  r1:c0  r2:c1  r3:c2
    step 2:  r0:c2  r1:c3  r2:c0  r3:c1   -> r0 has c1, r1 c2, r2 c3, r3 c0

With ``segments`` = s the buffer is cut into s*n parts: segment g is its own
ring over parts g*n .. g*n+n-1 and starts one step after segment g-1. A step
sends one message holding a part of every segment in flight (two while some
segments reduce and others gather), which the engine can combine part by part
as it arrives. all_gather and reduce_scatter pipeline the same way over s
parts per block.

broadcast and reduce are a chain from (to) the root, pipelined over s parts:
the rank at distance i from the root handles part g at step g+i, so the last
rank has everything after n-2+s steps instead of (n-1)*s.

    broadcast, n=4, s=3 (part sent on each link at each step)
    step:      0    1    2    3    4
    r0->r1    p0   p1   p2
    r1->r2         p0   p1   p2
    r2->r3              p0   p1   p2

n ranks, S = bytes of "out" (all_gather: of all of "out"; reduce_scatter: of
"in"), s = segments:

  collective       rounds              bytes sent per rank
  all_reduce       2(n-1) + s-1        2 S (n-1)/n
  all_gather       n-1 + s-1           S (n-1)/n
  reduce_scatter   n-1 + s-1           S (n-1)/n
  broadcast        n-2 + s (last rank) S (every rank but the last)
  reduce           n-2 + s (root)      S (every rank but the root)
  barrier          n-1                 zero-byte messages to the next rank
"""

from __future__ import annotations

from ..schedule import Chunk, Copy, Recv, Schedule, Send
from . import block, land_then_add, make_schedule, register

NAME = "ring"


def _in_flight(s: int, time: int, first: int, last: int) -> range:
    """Segments whose ring step at ``time`` is in [first, last): segment g
    takes ring step t at time g + t."""
    return range(max(0, time - last + 1), min(s, time - first + 1))


@register("all_reduce", NAME, pipelined=True)
def all_reduce(nranks, rank, root, segments):
    n, s = nranks, segments
    nxt, prv = (rank + 1) % n, (rank - 1) % n
    # Chunk c of segment g is out part g*n + c: each segment is a contiguous
    # slice of the buffer, cut into n chunks. At time T segment g is at ring
    # step t = T - g.
    part = [Chunk("out", 0, q) for q in range(n * s)]
    steps = []
    for time in range(2 * (n - 1) + s - 1 if n > 1 else 0):
        step = []
        # Reduce-scatter step t: send chunk r-t, add chunk r-t-1 from the left.
        scatter = _in_flight(s, time, 0, n - 1)
        if scatter:
            step.append(Send(nxt, tuple([part[g * n + (rank - time + g) % n] for g in scatter])))
            step.append(Recv(prv, tuple([part[g * n + (rank - time + g - 1) % n] for g in scatter]),
                             reduce=True))
        # All-gather step u = t-(n-1): forward finished chunk r+1-u, receive r-u.
        gather = _in_flight(s, time, n - 1, 2 * (n - 1))
        if gather:
            step.append(Send(nxt, tuple([part[g * n + (rank + n - time + g) % n] for g in gather])))
            step.append(Recv(prv, tuple([part[g * n + (rank + n - 1 - time + g) % n] for g in gather])))
        steps.append(tuple(step))
    return Schedule("all_reduce", NAME, n, rank, tuple(steps), parts=n * s, root=root)


@register("all_gather", NAME, pipelined=True)
def all_gather(nranks, rank, root, segments):
    n, s = nranks, segments
    nxt, prv = (rank + 1) % n, (rank - 1) % n
    steps = []
    for time in range(n - 1 + s - 1 if n > 1 else 0):
        flight = _in_flight(s, time, 0, n - 1)
        # The first hop sends straight from "in"; later hops forward what
        # the previous step received (block r-t at ring step t = time-g).
        sent = tuple([Chunk("in", 0, g) if time == g else Chunk("out", (rank - time + g) % n, g)
                      for g in flight])
        got = tuple([Chunk("out", (rank - time + g - 1) % n, g) for g in flight])
        steps.append((Send(nxt, sent), Recv(prv, got)))
    # Our own block goes to "out" as a local op of the first step.
    copy = (Copy(block("in", 0, s), block("out", rank, s)),)
    steps[:1] = [copy + (steps[0] if steps else ())]
    return Schedule("all_gather", NAME, n, rank, tuple(steps), parts=s, root=root)


@register("reduce_scatter", NAME, pipelined=True)
def reduce_scatter(nranks, rank, root, segments):
    # Block b's partial sum starts at rank b+1 and travels n-1 hops to rank b,
    # each rank adding its own "in" block b on the way. Partial sums wait in
    # "tmp" (laid out like "in"), except the last, which lands in "out".
    n, s = nranks, segments
    nxt, prv = (rank + 1) % n, (rank - 1) % n
    if n == 1:
        return Schedule("reduce_scatter", NAME, n, rank, ((Copy(block("in", 0, s), block("out", 0, s)),),),
                        parts=s, root=root)
    events = []
    for time in range(n - 1 + s - 1):
        flight = _in_flight(s, time, 0, n - 1)
        sent = tuple([Chunk("in" if time == g else "tmp", (rank - time + g - 1) % n, g) for g in flight])
        # Our own "in" block is added to each arriving partial sum (block
        # r-t-2) before it is forwarded.
        got = [((rank - time + g - 2) % n, g) for g in flight]
        into = tuple([Chunk("out", 0, g) if b == rank else Chunk("tmp", b, g) for b, g in got])
        events.append((time, Send(nxt, sent)))
        events += land_then_add(time, prv, tuple([Chunk("in", b, g) for b, g in got]), into)
    return make_schedule("reduce_scatter", NAME, n, rank, root, events, parts=s,
                         tmp_like="in" if n > 2 else None)


@register("broadcast", NAME, pipelined=True)
def broadcast(nranks, rank, root, segments):
    n, s = nranks, segments
    i = (rank - root) % n  # position in the chain root -> root+1 -> ...
    events = []
    for g in range(s):
        if i > 0:
            events.append((g + i - 1, Recv((rank - 1) % n, (Chunk("out", 0, g),))))
        if i < n - 1:
            events.append((g + i, Send((rank + 1) % n, (Chunk("out", 0, g),))))
    return make_schedule("broadcast", NAME, n, rank, root, events, parts=s)


@register("reduce", NAME, pipelined=True)
def reduce(nranks, rank, root, segments):
    # The chain runs root-1 -> root-2 -> ... -> root. Ranks between the head
    # and the root must leave their "out" as it was, so they add into "tmp".
    n, s = nranks, segments
    i = (rank - root) % n
    head = i == n - 1
    middle = 0 < i < n - 1
    acc = "tmp" if middle else "out"
    events = []
    for g in range(s):
        if not head:  # receive from the rank one further from the root
            time = g + (n - 2 - i)
            if middle:
                events.append((time, Copy((Chunk("out", 0, g),), (Chunk("tmp", 0, g),))))
            events.append((time, Recv((rank + 1) % n, (Chunk(acc, 0, g),), reduce=True)))
        if i > 0:
            events.append((g + (n - 1 - i), Send((rank - 1) % n, (Chunk(acc, 0, g),))))
    return make_schedule("reduce", NAME, n, rank, root, events, parts=s,
                         tmp_like="out" if middle else None)


@register("barrier", NAME)
def barrier(nranks, rank, root, segments):
    # An all-gather of zero-byte parts, one per rank: after n-1 steps every
    # rank has heard, through the ring, from every other.
    n = nranks
    events = []
    for t in range(n - 1):
        events.append((t, Send((rank + 1) % n, (Chunk("out", 0, (rank - t) % n),))))
        events.append((t, Recv((rank - 1) % n, (Chunk("out", 0, (rank - t - 1) % n),))))
    return make_schedule("barrier", NAME, n, rank, root, events, parts=n)
