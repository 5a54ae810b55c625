"""Mixture-of-experts token dispatch and combine with uneven all_to_all_single.

    collie run -n 4 examples/torch/moe_all_to_all.py

Each rank holds one expert (a different scale factor). A router sends every
token to one expert; the experts process what they received and send the
results back. Prints "dispatch/combine: ok" when every token comes back
processed by the expert it was routed to.
"""

import sys

import torch
import torch.distributed as dist

import collie.torch  # noqa: F401 - registers "collie"

dist.init_process_group("collie")
rank, world = dist.get_rank(), dist.get_world_size()
gen = torch.Generator().manual_seed(rank)
tokens = torch.randn(5 + 3 * rank, 8, generator=gen)               # a different count per rank
expert_of = torch.randint(0, world, (tokens.shape[0],), generator=gen)  # the router's choice
order = torch.argsort(expert_of, stable=True)
send = tokens[order]
send_counts = torch.bincount(expert_of, minlength=world)
recv_counts = torch.zeros(world, dtype=torch.int64)
dist.all_to_all_single(recv_counts, send_counts)                     # how many each expert gets
received = torch.zeros(int(recv_counts.sum()), 8)
dist.all_to_all_single(received, send, recv_counts.tolist(), send_counts.tolist())   # dispatch
processed = received * (rank + 1.0)                                  # expert `rank`
back = torch.zeros_like(send)
dist.all_to_all_single(back, processed, send_counts.tolist(), recv_counts.tolist())  # combine
out = torch.empty_like(tokens)
out[order] = back
ok = torch.allclose(out, tokens * (expert_of[:, None] + 1.0))
sys.stdout.write(f"rank {rank}: dispatch/combine: {'ok' if ok else 'WRONG'}\n")
dist.destroy_process_group()
