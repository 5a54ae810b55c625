"""One unchanged program for every launcher (torchrun, collie run, mpiexec).

    <launcher> tests/torch_launch_program.py collie   # `import collie as dist`
    <launcher> tests/torch_launch_program.py torch    # torch.distributed, backend "collie"

Each rank all-reduces its rank + 1 and prints "rank R of N: sum S ok" when S
is 1 + 2 + ... + N (else "... WRONG"), then leaves.
"""

import sys

mode = sys.argv[1]
if mode == "collie":
    import numpy as np

    import collie as dist
    dist.init_process_group()
    x = np.array([dist.get_rank() + 1.0])
else:
    import torch
    import torch.distributed as dist

    import collie.torch  # noqa: F401 - registers "collie" (the entry point does too, once installed)
    dist.init_process_group("collie")
    x = torch.tensor([dist.get_rank() + 1.0])
dist.all_reduce(x)
rank, n = dist.get_rank(), dist.get_world_size()
total = float(x[0])
# one write per line: print() writes the text and the newline separately, and
# the ranks share the launcher's pipe
sys.stdout.write(f"rank {rank} of {n}: sum {total:g} {'ok' if total == n * (n + 1) / 2 else 'WRONG'}\n")
sys.stdout.flush()
dist.destroy_process_group()
