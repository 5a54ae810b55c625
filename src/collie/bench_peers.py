"""The peers of ``collie bench --vs``: the same loop (bench.run) through
mpi4py, through torch.distributed's Gloo backend, through collie run by
its Python executor (``--vs python``), and through collie's own MPI layer
(``--vs mpi``: the uppercase calls mpi4py's peer makes, on collie.MPI).

mpi4py runs under the MPI launcher, each rank a fresh interpreter:

    mpiexec -n N python -m collie.bench_peers mpi4py CONFIG.json OUT.json

Gloo runs on N processes started by collie.spawn (run_gloo). In both, rank 0
writes one JSON row per line to OUT, which collie bench reads back. Each
peer uses the calls its users would: mpi4py's uppercase buffer API, in
place where collie is in place; torch's *_tensor / *_single calls.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Optional

import numpy as np

from . import binding
from .bench import Comm, Config, DistComm, Unsupported, run

# Datatypes the MPI library maps from NumPy. MPICH 4.0 aborts the whole
# job (an assertion, not an exception) on float16, so only these run.
_MPI_DTYPES = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
               "float32", "float64", "complex64", "complex128")
# Gloo rejects unsigned types wider than a byte ("Invalid scalar type").
_GLOO_DTYPES = ("int8", "int16", "int32", "int64", "uint8", "float16", "float32", "float64")


def _say(text: str) -> None:
    sys.stderr.write(f"collie bench: {text}\n")
    sys.stderr.flush()


def _with_avg(call, recv: np.ndarray, n: int, here: bool):
    """SUM, then divide where the result lands (``here``): AVG as collie does
    it, for libraries that have no AVG op."""
    if not here:
        return call
    factor = 1.0 / n

    def averaged():
        call()
        np.multiply(recv, factor, out=recv, casting="unsafe")
    return averaged


class MpiComm(Comm):
    """mpi4py's COMM_WORLD, or (given ``MPI``, collie's) that module's."""

    name = "mpi4py"

    def __init__(self, MPI=None):  # noqa: N803 - the module's own name
        if MPI is None:
            from mpi4py import MPI
        else:
            self.name = "mpi"
        self.MPI, self.comm = MPI, MPI.COMM_WORLD
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        self.library = MPI.Get_library_version().split()[0] if MPI.Get_library_version() else "MPI"
        self._f = np.zeros(1, np.float64)
        self._i = np.zeros(1, np.int64)

    def barrier(self) -> None:
        self.comm.Barrier()

    def max(self, x: float) -> float:
        self._f[0] = x
        self.comm.Allreduce(self.MPI.IN_PLACE, self._f, op=self.MPI.MAX)
        return float(self._f[0])

    def total(self, x: int) -> int:
        self._i[0] = x
        self.comm.Allreduce(self.MPI.IN_PLACE, self._i, op=self.MPI.SUM)
        return int(self._i[0])

    def bcast(self, x: int) -> int:
        self._i[0] = x
        self.comm.Bcast(self._i, root=0)
        return int(self._i[0])

    def label(self, op, lay, algorithm) -> str:
        return self.library

    def caller(self, op, send: Optional[np.ndarray], recv: np.ndarray, redop: str, algorithm):
        if recv.dtype.name not in _MPI_DTYPES:
            raise Unsupported(f"no MPI datatype for {recv.dtype.name} here")
        MPI, c, r, n = self.MPI, self.comm, self.rank, self.size
        mop = {"sum": MPI.SUM, "avg": MPI.SUM, "prod": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX}[redop]
        if op == "all_reduce":
            call = lambda: c.Allreduce(MPI.IN_PLACE, recv, op=mop)  # noqa: E731
        elif op == "reduce":
            if r == 0:
                call = lambda: c.Reduce(MPI.IN_PLACE, recv, op=mop, root=0)  # noqa: E731
            else:
                call = lambda: c.Reduce(recv, None, op=mop, root=0)  # noqa: E731
        elif op == "reduce_scatter":
            call = lambda: c.Reduce_scatter_block(send, recv, op=mop)  # noqa: E731
        elif op == "broadcast":
            return lambda: c.Bcast(recv, root=0)
        elif op == "all_gather":
            return lambda: c.Allgather(send, recv)
        elif op == "all_to_all":
            return lambda: c.Alltoall(send, recv)
        elif op == "sendrecv":
            dest, source = (r + 1) % n, (r - 1) % n
            return lambda: c.Sendrecv(send, dest, recvbuf=recv, source=source)
        else:
            raise ValueError(op)
        if redop == "avg":
            return _with_avg(call, recv, n, here=op != "reduce" or r == 0)
        return call


class GlooComm(DistComm):
    """torch.distributed with the Gloo backend, on tensors sharing the
    NumPy buffers' memory (torch.from_numpy)."""

    def __init__(self):
        import torch
        import torch.distributed as dist
        super().__init__("gloo", dist, torch.from_numpy)

    def label(self, op, lay, algorithm) -> str:
        return "gloo"

    def caller(self, op, send, recv, redop, algorithm):
        if recv.dtype.name not in _GLOO_DTYPES:
            raise Unsupported(f"gloo has no {recv.dtype.name}")
        if redop != "avg" or op not in ("all_reduce", "reduce", "reduce_scatter"):
            return super().caller(op, send, recv, redop, algorithm)
        call = super().caller(op, send, recv, "sum", algorithm)
        return _with_avg(call, recv, self.size, here=op != "reduce" or self.rank == 0)


def _write_rows(path: str, rows: list) -> None:
    with open(path, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


def _run_and_write(comm: Comm, cfg: Config, out: str) -> None:
    rows: list = []
    run(comm, cfg, rows.append, note=lambda text: comm.rank == 0 and _say(text))
    if comm.rank == 0:
        _write_rows(out, rows)


def _gloo_rank(rank: int, cfg: Config, out: str) -> None:
    import warnings

    import torch
    import torch.distributed as dist
    # torch 2.13 deprecates the *_tensor names in favour of *_single; they
    # still work, and collie keeps torch's established names.
    warnings.filterwarnings("ignore", category=FutureWarning)
    torch.set_num_threads(1)  # one core per rank, as collie and MPI get
    if binding.mode() == "core":  # --bind: pinned as collie's ranks are
        binding.bind(rank, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    dist.init_process_group("gloo", init_method="env://")
    try:
        _run_and_write(GlooComm(), cfg, out)
    finally:
        dist.destroy_process_group()


def run_gloo(n: int, cfg: Config, out: str) -> None:
    """The loop on ``n`` Gloo ranks started here; rank 0 writes rows to ``out``."""
    from .bench import local_start_method
    from .launch import spawn
    spawn(_gloo_rank, args=(cfg, out), nprocs=n, start_method=local_start_method())  # as collie's ranks


def _collie_python_rank(rank: int, cfg: Config, out: str) -> None:
    import os

    import collie
    from .bench import CollieComm
    os.environ["COLLIE_EXECUTOR"] = "python"
    collie.core.select()
    collie.init_process_group(backend=cfg.transport)
    try:
        _run_and_write(CollieComm("python"), cfg, out)
    finally:
        collie.destroy_process_group()


def run_collie_python(n: int, cfg: Config, out: str) -> None:
    """The loop on ``n`` collie ranks run by the Python executor (engine.execute),
    to set beside the compiled core's; rank 0 writes rows to ``out``."""
    from .bench import local_start_method
    from .launch import spawn
    spawn(_collie_python_rank, args=(cfg, out), nprocs=n, start_method=local_start_method())


def _collie_mpi_rank(rank: int, cfg: Config, out: str) -> None:
    import collie
    from collie import MPI
    collie.init_process_group(backend=cfg.transport)  # MPI.COMM_WORLD is this world
    try:
        _run_and_write(MpiComm(MPI), cfg, out)
    finally:
        collie.destroy_process_group()


def run_collie_mpi(n: int, cfg: Config, out: str) -> None:
    """The loop on ``n`` collie ranks through collie.MPI's uppercase calls,
    to set beside collie's own; rank 0 writes rows to ``out``."""
    from .bench import local_start_method
    from .launch import spawn
    spawn(_collie_mpi_rank, args=(cfg, out), nprocs=n, start_method=local_start_method())


def main(argv: list) -> int:
    """Under mpiexec: ``mpi4py CONFIG.json OUT.json``."""
    if len(argv) != 3 or argv[0] != "mpi4py":
        _say("usage: mpiexec -n N python -m collie.bench_peers mpi4py CONFIG.json OUT.json")
        return 2
    with open(argv[1]) as f:
        cfg = Config(**json.load(f))
    _run_and_write(MpiComm(), cfg, argv[2])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
