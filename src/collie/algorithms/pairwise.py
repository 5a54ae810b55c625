"""Pairwise exchange: all_to_all in n-1 steps; in step k rank r sends its
block for r+k and receives the block from r-k. Each step is one message each
way per rank, so no rank is flooded by n-1 senders at once (as with direct)
and every byte moves exactly once: the usual choice for large all_to_all.

    n=4, who sends to whom
    k=1: 0->1 1->2 2->3 3->0
    k=2: 0->2 1->3 2->0 3->1
    k=3: 0->3 1->0 2->1 3->2

n ranks, S = bytes of this rank's "in": n-1 steps, S (n-1)/n bytes sent per
rank for equal blocks (blocks may have any sizes). ``segments`` is ignored.
"""

from __future__ import annotations

from ..schedule import Copy, Recv, Send
from . import block, make_schedule, register

NAME = "pairwise"


@register("all_to_all", NAME)
def all_to_all(nranks, rank, root, segments):
    n = nranks
    events = [(1, Copy(block("in", rank), block("out", rank)))]
    for k in range(1, n):
        dst, src = (rank + k) % n, (rank - k) % n
        events.append((k, Send(dst, block("in", dst))))
        events.append((k, Recv(src, block("out", src))))
    return make_schedule("all_to_all", NAME, n, rank, root, events)
