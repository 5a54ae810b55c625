"""Softmax over a vocabulary sharded across ranks: each rank holds a slice of
the logits; an all_reduce of the max and one of the sum of exponentials give
every rank its slice of the exact softmax (as tensor-parallel LM heads do).

    collie run -n 2 examples/torch/sharded_softmax.py

Prints "sharded softmax: ok" when the gathered result equals torch.softmax
over the whole vocabulary.
"""

import sys

import torch
import torch.distributed as dist

import collie.torch  # noqa: F401 - registers "collie"

dist.init_process_group("collie")
rank, world = dist.get_rank(), dist.get_world_size()
vocab, batch = 1000 * world, 3
logits = torch.randn(batch, vocab, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 5
mine = logits.chunk(world, dim=1)[rank]                 # this rank's slice of the vocabulary
top = mine.max(dim=1).values
dist.all_reduce(top, op=dist.ReduceOp.MAX)              # the global max, for stability
exps = torch.exp(mine - top[:, None])
total = exps.sum(dim=1)
dist.all_reduce(total)                                  # the global normalizer
probs = exps / total[:, None]
pieces = [torch.zeros_like(probs) for _ in range(world)]
dist.all_gather(pieces, probs)
ok = torch.allclose(torch.cat(pieces, dim=1), torch.softmax(logits, dim=1))
sys.stdout.write(f"rank {rank}: sharded softmax: {'ok' if ok else 'WRONG'}\n")
dist.destroy_process_group()
