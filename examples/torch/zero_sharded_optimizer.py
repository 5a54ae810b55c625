"""A ZeRO-style sharded optimizer: reduce_scatter the gradients, step on this
rank's shard, all_gather the parameters.

    collie run -n 2 examples/torch/zero_sharded_optimizer.py

Prints "matches unsharded SGD: ok" when the parameters after a few steps equal
those of plain SGD on the whole batch in one process.
"""

import sys

import torch
import torch.distributed as dist

import collie.torch  # noqa: F401 - registers "collie"

dist.init_process_group("collie")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(10, 6), torch.nn.Tanh(), torch.nn.Linear(6, 1))
reference = torch.nn.Sequential(torch.nn.Linear(10, 6), torch.nn.Tanh(), torch.nn.Linear(6, 1))
reference.load_state_dict(model.state_dict())
params = list(model.parameters())
numel = sum(p.numel() for p in params)
padded = -(-numel // world) * world           # every shard the same size
shard = padded // world
flat = torch.zeros(padded)
flat[:numel] = torch.cat([p.detach().reshape(-1) for p in params])
my_shard = flat[rank * shard:(rank + 1) * shard].clone()   # the only copy this rank updates
lr = 0.05
gen = torch.Generator().manual_seed(1)
for _ in range(4):
    x, y = torch.randn(4 * world, 10, generator=gen), torch.randn(4 * world, 1, generator=gen)
    part = slice(4 * rank, 4 * rank + 4)
    model.zero_grad()
    torch.nn.functional.mse_loss(model(x[part]), y[part]).backward()
    grads = torch.zeros(padded)
    grads[:numel] = torch.cat([p.grad.reshape(-1) for p in params])
    grad_shard = torch.zeros(shard)
    dist.reduce_scatter_tensor(grad_shard, grads, op=dist.ReduceOp.AVG)   # 1. gradients
    my_shard -= lr * grad_shard                                            # 2. step on the shard
    dist.all_gather_into_tensor(flat, my_shard)                            # 3. parameters
    with torch.no_grad():
        at = 0
        for p in params:
            p.copy_(flat[at:at + p.numel()].view_as(p))
            at += p.numel()
    reference.zero_grad()
    torch.nn.functional.mse_loss(reference(x), y).backward()
    with torch.no_grad():
        for p in reference.parameters():
            p -= lr * p.grad
diff = max((a - b).abs().max().item() for a, b in zip(params, reference.parameters()))
sys.stdout.write(f"rank {rank}: matches unsharded SGD: {'ok' if diff < 1e-5 else f'WRONG ({diff})'}\n")
dist.destroy_process_group()
