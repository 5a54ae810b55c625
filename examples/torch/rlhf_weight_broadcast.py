"""RLHF-style weight sync: rank 0 trains, the other ranks serve inference and
receive fresh weights over a sub-group after every step.

    collie run -n 3 examples/torch/rlhf_weight_broadcast.py

Prints "weights in sync: ok" on every rank when each worker's weights equal
the trainer's after the last broadcast.
"""

import sys

import torch
import torch.distributed as dist

import collie.torch  # noqa: F401 - registers "collie"

dist.init_process_group("collie")
rank, world = dist.get_rank(), dist.get_world_size()
sync = dist.new_group(list(range(world)))  # trainer + inference workers
torch.manual_seed(0)
policy = torch.nn.Linear(16, 4)
if rank == 0:
    opt = torch.optim.SGD(policy.parameters(), lr=0.1)
for step in range(3):
    if rank == 0:  # one training step on the trainer only
        opt.zero_grad()
        policy(torch.randn(8, 16)).pow(2).mean().backward()
        opt.step()
    with torch.no_grad():
        for p in policy.parameters():
            dist.broadcast(p, src=0, group=sync)
    if rank != 0:  # inference with the fresh weights
        policy(torch.randn(2, 16))
checksum = torch.stack([p.sum() for p in policy.parameters()]).sum().reshape(1)
every = [torch.zeros(1) for _ in range(world)]
dist.all_gather(every, checksum)
ok = all(torch.equal(every[0], c) for c in every)
sys.stdout.write(f"rank {rank}: weights in sync: {'ok' if ok else 'WRONG'}\n")
dist.destroy_process_group()
