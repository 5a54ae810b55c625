"""DDP training step on CPU: backend "collie" against "gloo", same run.

    python -m collie.torch.bench_ddp -n 2 4 [--steps 6] [--params 25]

An MLP of about ``--params`` million float32 parameters trains with DDP on
each rank count, once per backend, the backends alternating. Per backend
it reports (medians over the steps, rank 0):

- step: forward, backward (with DDP's bucketed all_reduce) and SGD step;
- compute: the same step under ``ddp.no_sync()`` (no communication);
- comm: step - compute, the communication DDP could not hide;
- all_reduce: one all_reduce of a buffer as large as the gradients.

Figures are from one run on a shared machine: compare the backends by
their ratio, not the absolute times.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import secrets
import socket
import statistics
import sys
import time


def _mlp(millions: float):
    import torch
    width = int(((millions * 1e6) / 1.5) ** 0.5)  # in*w + w*w + w*in with in = w/4: 1.5 w^2
    width -= width % 64
    return torch.nn.Sequential(torch.nn.Linear(width // 4, width), torch.nn.ReLU(),
                               torch.nn.Linear(width, width), torch.nn.ReLU(),
                               torch.nn.Linear(width, width // 4))


def _rank(rank: int, size: int, backend: str, port: int, steps: int, millions: float, out) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(size), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(size), GLOO_SOCKET_IFNAME="lo")
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    torch.set_num_threads(1)
    if backend == "collie":
        import collie.torch  # noqa: F401
    dist.init_process_group(backend)
    torch.manual_seed(0)
    model = _mlp(millions)
    nparams = sum(p.numel() for p in model.parameters())
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    x = torch.randn(16, model[0].in_features)

    def step():
        opt.zero_grad(set_to_none=False)
        ddp(x).pow(2).mean().backward()
        opt.step()

    def timed(fn):
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0

    step()
    full, local = [], []
    for _ in range(steps):
        full.append(timed(step))
        with ddp.no_sync():
            local.append(timed(step))
    buf = torch.zeros(nparams)
    dist.all_reduce(buf)
    reduce = [timed(lambda: dist.all_reduce(buf)) for _ in range(max(3, steps // 2))]
    if rank == 0:
        out.put({"backend": backend, "ranks": size, "params": nparams, "step": statistics.median(full),
                 "compute": statistics.median(local), "all_reduce": statistics.median(reduce)})
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(size: int, backend: str, steps: int, millions: float) -> dict:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = _free_port()
    os.environ.setdefault("COLLIE_TOKEN", secrets.token_hex(16))
    procs = [ctx.Process(target=_rank, args=(r, size, backend, port, steps, millions, out), daemon=True)
             for r in range(size)]
    for p in procs:
        p.start()
    try:
        result = out.get(timeout=600)
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
    return result


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m collie.torch.bench_ddp", description=__doc__.split("\n\n")[0])
    p.add_argument("-n", "--ranks", type=int, nargs="+", default=[2, 4])
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--params", type=float, default=25.0, help="millions of parameters (default 25)")
    opts = p.parse_args(argv)
    print(f"{'ranks':>5} {'backend':>7} {'params':>7} {'step ms':>8} {'compute':>8} {'comm ms':>8} "
          f"{'all_reduce ms':>13}")
    for size in opts.ranks:
        rows = {b: run(size, b, opts.steps, opts.params) for b in ("gloo", "collie")}
        for b, r in rows.items():
            print(f"{size:>5} {b:>7} {r['params'] / 1e6:>6.1f}M {r['step'] * 1e3:>8.0f} "
                  f"{r['compute'] * 1e3:>8.0f} {(r['step'] - r['compute']) * 1e3:>8.0f} "
                  f"{r['all_reduce'] * 1e3:>13.0f}")
        g, c = rows["gloo"], rows["collie"]
        comm_g, comm_c = g["step"] - g["compute"], c["step"] - c["compute"]
        ratio = f"{comm_g / comm_c:.1f}x" if comm_c > 0 else "n/a (collie's comm hidden)"
        print(f"      collie vs gloo at {size} ranks: step {g['step'] / c['step']:.2f}x, comm {ratio}, "
              f"all_reduce {g['all_reduce'] / c['all_reduce']:.1f}x", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
