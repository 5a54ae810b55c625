"""Bruck: log-step dissemination, for any n. ceil(log2 n) steps, so it wins on
latency for small messages, at the price of sending each byte several times
(all_to_all) or of uneven steps.

all_gather: in step k rank r sends the blocks it has (r, r+1, ..., at most
2^k of them) to r-2^k, and receives as many from r+2^k, so after step k it
holds blocks r .. r+2^(k+1)-1. Blocks keep their place in "out" (a message
just lists them), so no final rotation is needed and blocks may differ in
size.

    n=5, blocks held by rank 0 after each step
    start  {0}
    k=0    {0,1}        from rank 1
    k=1    {0,1,2,3}    from rank 2
    k=2    {0,...,4}    from rank 4 (only the one block missing)

all_to_all: the item from rank o to rank d = o + delta travels along the set
bits of delta, lowest first: in step k every rank forwards, in one message to
r+2^k, every item it holds whose delta has bit k set. An item that has not
arrived yet waits in "tmp" or in the "out" block it will end in, alternating
so that a step never sends from and receives into one chunk. Items of other
ranks sit in this rank's buffers, so every block must have one size: this
algorithm is registered with uniform_blocks=True.

n ranks, K = ceil(log2 n), S = bytes of "out" (all_gather: of all of it;
all_to_all: of this rank's "out"):

  collective   rounds  bytes sent per rank
  all_gather   K       S (n-1)/n
  all_to_all   K       about S/2 * K (each block moves once per set bit of delta)

``segments`` is ignored.
"""

from __future__ import annotations

from ..schedule import Chunk, Copy, Recv, Send
from . import block, blocks, log2_ceil, make_schedule, register

NAME = "bruck"


@register("all_gather", NAME)
def all_gather(nranks, rank, root, segments):
    n = nranks
    events = [(0, Copy(block("in", 0), block("out", rank)))]
    for k in range(log2_ceil(n)):
        d = 1 << k
        count = min(d, n - d)  # the last step may need fewer than 2^k blocks
        events.append((k, Send((rank - d) % n, blocks("out", [(rank + j) % n for j in range(count)]))))
        events.append((k, Recv((rank + d) % n, blocks("out", [(rank + d + j) % n for j in range(count)]))))
    return make_schedule("all_gather", NAME, n, rank, root, events)


@register("all_to_all", NAME, uniform_blocks=True)
def all_to_all(nranks, rank, root, segments):
    n = nranks

    def where(r: int, delta: int, hops: int) -> Chunk:
        """Where rank r keeps the item of offset delta after it made ``hops``
        of its popcount(delta) hops: its "in" block at first, its final "out"
        block after the last hop, and before that "tmp" and that same "out"
        block in turn."""
        if hops == 0:
            return Chunk("in", (r + delta) % n, 0)
        if (bin(delta).count("1") - hops) % 2 == 0:
            return Chunk("out", (r - delta) % n, 0)
        return Chunk("tmp", delta, 0)

    events = [(0, Copy(block("in", rank), block("out", rank)))]
    for k in range(log2_ceil(n)):
        bit = 1 << k
        moving = [delta for delta in range(1, n) if delta & bit]
        done = [bin(delta & (bit - 1)).count("1") for delta in moving]  # hops so far
        events.append((k, Send((rank + bit) % n,
                               tuple(where(rank, d, h) for d, h in zip(moving, done)))))
        events.append((k, Recv((rank - bit) % n,
                               tuple(where(rank, d, h + 1) for d, h in zip(moving, done)))))
    return make_schedule("all_to_all", NAME, n, rank, root, events,
                         tmp_like="in" if n > 3 else None)
