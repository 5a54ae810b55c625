"""Direct: every byte goes in one hop from the rank that has it to the rank
that needs it. Latency-optimal for small messages and few ranks.

Rooted collectives talk to the root only; the others are everyone to
everyone. Every send and receive of the call is posted in one step. The
reducing collectives (reduce, all_reduce, reduce_scatter) combine their n-1
incoming messages into one place as a combining group (collie.schedule):
in the order listed, r-1, r-2, ..., whatever order they arrive in, so that
an executor may combine them a cache-sized piece at a time.

    all_gather, n=4 (one step)           reduce_scatter, n=4 (one step)
    r0 ─┬─> r1 r2 r3                     out = block r of in; then, as a
    r1 ─┼─> r0 r2 r3                     group, out += block r of the in
    ...                                  of r-1, r-2, r-3

(reduce_scatter on 2 ranks: its one message lands in "out", and block r of
"in" is added in a second step: a plain exchange, which goes single copy,
core._exchanges.)

n ranks, S = bytes of a rank's "out" (all_gather, gather: of its "in"):

  collective       rounds           bytes sent per rank
  broadcast        1                root (n-1)S, others 0
  reduce           1                non-root S, root 0
  gather, scatter  1                non-root S, root (n-1)S received/sent
  all_gather       1                (n-1)S
  all_to_all       1                S (n-1)/n for equal blocks
  all_reduce       1                (n-1)S
  reduce_scatter   1 (n=2: 2)       S (n-1)/n  (S of "in")
  barrier          1                zero-byte messages to every rank

``segments`` is ignored: there is nothing to pipeline in one hop.
"""

from __future__ import annotations

from ..schedule import Chunk, Copy, Recv, Send
from . import block, land_then_add, make_schedule, register

NAME = "direct"


def _others(nranks: int, rank: int):
    """Peers in the order rank+1, rank+2, ...: each rank starts with a
    different peer, so no rank is everyone's first."""
    return [(rank + k) % nranks for k in range(1, nranks)]


@register("broadcast", NAME)
def broadcast(nranks, rank, root, segments):
    if rank == root:
        events = [(0, Send(q, block("out", 0))) for q in _others(nranks, rank)]
    else:
        events = [(0, Recv(root, block("out", 0)))]
    return make_schedule("broadcast", NAME, nranks, rank, root, events)


@register("reduce", NAME)
def reduce(nranks, rank, root, segments):
    if rank == root:
        # Every contribution in one step, combined into "out" in this order.
        events = [(0, Recv(q, block("out", 0), reduce=True)) for q in _others(nranks, rank)]
    else:
        events = [(0, Send(root, block("out", 0)))]
    return make_schedule("reduce", NAME, nranks, rank, root, events)


@register("all_reduce", NAME)
def all_reduce(nranks, rank, root, segments):
    # Keep the input in "tmp" so that what is sent stays this rank's own
    # contribution while "out" accumulates everyone's.
    events = [(0, Copy(block("out", 0), block("tmp", 0)))] if nranks > 1 else []
    for k in range(1, nranks):
        events.append((0, Send((rank + k) % nranks, block("tmp", 0))))
        events.append((0, Recv((rank - k) % nranks, block("out", 0), reduce=True)))
    return make_schedule("all_reduce", NAME, nranks, rank, root, events,
                         tmp_like="out" if nranks > 1 else None)


@register("gather", NAME)
def gather(nranks, rank, root, segments):
    if rank == root:
        events = [(0, Copy(block("in", 0), block("out", root)))]
        events += [(0, Recv(q, block("out", q))) for q in _others(nranks, rank)]
    else:
        events = [(0, Send(root, block("in", 0)))]
    return make_schedule("gather", NAME, nranks, rank, root, events)


@register("all_gather", NAME)
def all_gather(nranks, rank, root, segments):
    events = [(0, Copy(block("in", 0), block("out", rank)))]
    for k in range(1, nranks):
        events.append((0, Send((rank + k) % nranks, block("in", 0))))
        src = (rank - k) % nranks
        events.append((0, Recv(src, block("out", src))))
    return make_schedule("all_gather", NAME, nranks, rank, root, events)


@register("scatter", NAME)
def scatter(nranks, rank, root, segments):
    if rank == root:
        events = [(0, Copy(block("in", root), block("out", 0)))]
        events += [(0, Send(q, block("in", q))) for q in _others(nranks, rank)]
    else:
        events = [(0, Recv(root, block("out", 0)))]
    return make_schedule("scatter", NAME, nranks, rank, root, events)


@register("reduce_scatter", NAME)
def reduce_scatter(nranks, rank, root, segments):
    if nranks == 1:
        return make_schedule("reduce_scatter", NAME, nranks, rank, root,
                             [(0, Copy(block("in", 0), block("out", 0)))])
    if nranks == 2:  # one message: it lands in "out", then our block is added (land_then_add)
        peer = 1 - rank
        events = [(0, Send(peer, block("in", peer)))] + land_then_add(0, peer, block("in", rank), block("out", 0))
        return make_schedule("reduce_scatter", NAME, nranks, rank, root, events)
    # Our own block first, then every peer's combined into it, in one step.
    events = [(0, Copy(block("in", rank), block("out", 0)))]
    for k in range(1, nranks):
        dst, src = (rank + k) % nranks, (rank - k) % nranks
        events.append((0, Send(dst, block("in", dst))))
        events.append((0, Recv(src, block("out", 0), reduce=True)))
    return make_schedule("reduce_scatter", NAME, nranks, rank, root, events)


@register("all_to_all", NAME)
def all_to_all(nranks, rank, root, segments):
    events = [(0, Copy(block("in", rank), block("out", rank)))]
    for k in range(1, nranks):
        dst, src = (rank + k) % nranks, (rank - k) % nranks
        events.append((0, Send(dst, block("in", dst))))
        events.append((0, Recv(src, block("out", src))))
    return make_schedule("all_to_all", NAME, nranks, rank, root, events)


@register("barrier", NAME)
def barrier(nranks, rank, root, segments):
    # "out" has zero elements; cutting it into one part per rank gives every
    # rank its own (empty) slot to receive into, so that all the messages of
    # the barrier fit in one step without two receives sharing a chunk.
    events = []
    for k in range(1, nranks):
        events.append((0, Send((rank + k) % nranks, (Chunk("out", 0, rank),))))
        src = (rank - k) % nranks
        events.append((0, Recv(src, (Chunk("out", 0, src),))))
    return make_schedule("barrier", NAME, nranks, rank, root, events, parts=nranks)
