"""``collie bench``: bandwidth of every collective, in the manner of nccl-tests.

    collie bench                            # all ops, 8 B .. 64 MiB, one rank per core
    collie bench -n 4 --op all_reduce --algo all --check
    collie bench --vs mpi4py,gloo --json rows.json --plot busbw.png
    collie run -n 2 -m collie bench         # one rank of an existing world (also across hosts)

What the columns mean follows nccl-tests' doc/PERFORMANCE.md, so figures
can be set next to theirs:

- size: the per-rank buffer nccl-tests prints: the receive buffer of
  all_gather, the send buffer of reduce_scatter and all_to_all, the buffer
  of all_reduce, broadcast, reduce and sendrecv. count is that buffer's
  elements, except for all_gather, reduce_scatter and all_to_all, where it
  is the elements one rank sends to (or receives from) one peer.
- time: each rank times N back-to-back calls after a barrier and takes the
  mean; a repeat's time is the slowest rank's mean (MAX all_reduce); the
  figure is the median over repeats (the machines are shared and noisy, and
  the median shrugs off a repeat that a neighbour disturbed).
- algbw = size / time; busbw = algbw x 2(n-1)/n for all_reduce, (n-1)/n for
  all_gather, reduce_scatter and all_to_all, 1 for broadcast, reduce and
  sendrecv. busbw is comparable across ops and rank counts: it is the
  bandwidth each rank's link would need with an optimal algorithm.
- #wrong: with --check, the elements (summed over ranks) that differ from a
  NumPy reference. Every rank can generate every rank's input (see
  pattern()), so each checks its own result locally.

The same measurement loop (run()) drives collie, mpi4py (--vs mpi4py),
torch.distributed's Gloo (--vs gloo), collie under its pure-Python
executor (--vs python, beside the compiled core: see collie/core.py) and
collie's mpi4py-style layer (--vs mpi: what `from collie import MPI` adds
to a call), through a small Comm adapter each;
peers run in their own processes, and their busbw appears in the collie
table as a ratio. They take turns op by op: each op runs through every
peer and then through collie (its ranks started anew per op) before the
next op starts, so that a ratio compares runs minutes apart at most, not
a whole run apart (these machines drift). A peer that is not installed is
skipped with a hint; COLLIE_BENCH_HIDE=mpi4py,gloo pretends a peer is
missing (for tests).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib.util
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Callable, Iterable, NamedTuple, Optional, Sequence

import numpy as np

__all__ = ["main", "OPS", "bus_factor", "parse_size", "memory_bandwidth", "memory_bound"]

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all", "sendrecv")
REDOPS = ("sum", "prod", "min", "max", "avg")
PEERS = ("mpi4py", "gloo", "python", "mpi")  # python: collie run by its Python executor;
                                            # mpi: collie's own MPI layer (from collie import MPI)
JSON_KEYS = ("backend", "op", "nranks", "bytes", "dtype", "algorithm", "time_us", "algbw_GBps",
             "busbw_GBps", "wrong", "p50_us", "p99_us", "registered")
HINTS = {
    "mpi4py": "mpi4py not found: apt-get install mpich && pip install --no-binary=mpi4py mpi4py",
    "mpiexec": "mpiexec not found: apt-get install mpich (mpi4py needs an MPI launcher)",
    "gloo": "torch not found: pip install torch --index-url https://download.pytorch.org/whl/cpu",
}
_REDUCING = ("all_reduce", "reduce_scatter", "reduce")
_ROOTED = ("broadcast", "reduce")
_IN_PLACE = ("all_reduce", "broadcast", "reduce")
_UFUNCS = {"sum": np.add, "avg": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum}
_MAX_ITERS = 1_000_000
WARM_SHARE = 0.1  # of --time-budget, spent warming up before the timed calls
_SUFFIX = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def bus_factor(op: str, n: int) -> float:
    """busbw / algbw for ``op`` on ``n`` ranks (nccl-tests' PERFORMANCE.md)."""
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    return 1.0


def parse_size(text: str) -> int:
    """'64K' -> 65536 (K, M, G are powers of 1024; a trailing B is allowed)."""
    t = text.strip().upper().removesuffix("B")
    unit = t[-1:] if t[-1:] in _SUFFIX and t[-1:] else ""
    try:
        value = int(t[:len(t) - len(unit)])
    except ValueError:
        raise ValueError(f"not a size: {text!r} (examples: 8, 1K, 64M)") from None
    if value < 0:
        raise ValueError(f"size must not be negative: {text!r}")
    return value * _SUFFIX[unit]


def format_size(nbytes: int) -> str:
    for unit in ("G", "M", "K"):
        if nbytes >= _SUFFIX[unit] and nbytes % _SUFFIX[unit] == 0:
            return f"{nbytes // _SUFFIX[unit]}{unit}"
    return str(nbytes)


# ---- buffers, inputs and the reference -------------------------------------

class Layout(NamedTuple):
    """One rank's buffers for one op at one size (all counts in elements)."""

    count: int   # the count column
    send: int    # send buffer elements; 0 for the in-place ops (no send buffer)
    recv: int    # receive (or in-place) buffer elements
    nbytes: int  # the size column


def layout(op: str, nbytes: int, itemsize: int, n: int) -> Layout:
    """Buffers of ``op`` for a requested size, as nccl-tests sizes them: the
    per-peer count is rounded down so that the buffer splits evenly."""
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        c = nbytes // itemsize // n
        send, recv = {"all_gather": (c, c * n), "reduce_scatter": (c * n, c),
                      "all_to_all": (c * n, c * n)}[op]
        return Layout(c, send, recv, c * n * itemsize)
    c = nbytes // itemsize
    return Layout(c, 0 if op in _IN_PLACE else c, c, c * itemsize)


def pattern(rank: int, lo: int, hi: int, dtype: np.dtype, redop: str) -> np.ndarray:
    """Elements [lo, hi) of rank ``rank``'s check input.

    Small integers, so that sums and products are exact in every dtype and
    in any order of reduction (float16 included, up to ~150 ranks): 1..13
    for most ops; 1 or 2 (one rank in four holds a 2) for prod, so a product
    over n ranks stays below 2**ceil(n/4).
    """
    i = np.arange(lo, hi, dtype=np.int64)
    if redop == "prod":
        v = 1 + ((i + rank) % 4 == 0)
    else:
        v = (i * 7 + rank * 5) % 13 + 1
    return v.astype(dtype)


def _reduced(n: int, lo: int, hi: int, dtype: np.dtype, redop: str) -> np.ndarray:
    out = pattern(0, lo, hi, dtype, redop)
    for q in range(1, n):
        _UFUNCS[redop](out, pattern(q, lo, hi, dtype, redop), out=out)
    if redop == "avg":
        np.multiply(out, 1.0 / n, out=out, casting="unsafe")
    return out


def expected(op: str, rank: int, n: int, lay: Layout, dtype: np.dtype, redop: str) -> np.ndarray:
    """What ``rank``'s receive buffer must hold after one call with check
    inputs (send buffers filled by pattern(rank, 0, size))."""
    c = lay.count
    if op == "all_reduce":
        return _reduced(n, 0, c, dtype, redop)
    if op == "reduce":
        return _reduced(n, 0, c, dtype, redop) if rank == 0 else pattern(rank, 0, c, dtype, redop)
    if op == "broadcast":
        return pattern(0, 0, c, dtype, redop)
    if op == "all_gather":
        return np.concatenate([pattern(q, 0, c, dtype, redop) for q in range(n)])
    if op == "reduce_scatter":
        return _reduced(n, rank * c, (rank + 1) * c, dtype, redop)
    if op == "all_to_all":
        return np.concatenate([pattern(q, rank * c, (rank + 1) * c, dtype, redop) for q in range(n)])
    if op == "sendrecv":
        return pattern((rank - 1) % n, 0, c, dtype, redop)
    raise ValueError(op)


def count_wrong(got: np.ndarray, want: np.ndarray, n: int) -> int:
    """Elements that differ; floats may differ by rounding (AVG's scaling,
    the order of a reduction), so they get a relative tolerance of n ulps."""
    if got.dtype.kind in "biu":
        return int(np.count_nonzero(got != want))
    eps = {2: 2.0 ** -10, 4: 2.0 ** -23}.get(got.dtype.itemsize // (2 if got.dtype.kind == "c" else 1),
                                           2.0 ** -52)
    return int(np.count_nonzero(~np.isclose(got, want, rtol=4 * n * eps, atol=0)))


def timing_fill(op: str, redop: str) -> int:
    """The value timed buffers hold. The reducing collectives are in place,
    so N timed calls compound: a fixed point of the op (0 for sum/avg, 1
    otherwise) keeps every value finite and normal (no overflow, no slow
    denormals) without refilling the buffer inside the timed loop."""
    return 0 if op in _REDUCING and redop in ("sum", "avg") else 1


# ---- the measurement loop, shared by collie and its peers ------------------

class Unsupported(Exception):
    """A backend cannot run this op (or this dtype); raised by Comm.caller
    before anything is sent, on every rank alike."""


class Comm:
    """What run() needs from a communication library (one adapter per backend).

    Subclasses set name, rank and size and implement the methods below.
    """

    name = "?"
    rank = 0
    size = 1
    registers = False  # empty() makes registered buffers when asked

    def barrier(self) -> None:
        raise NotImplementedError

    def max(self, x: float) -> float:
        """The largest ``x`` over the ranks, on every rank."""
        raise NotImplementedError

    def total(self, x: int) -> int:
        """The sum of ``x`` over the ranks, on every rank."""
        raise NotImplementedError

    def bcast(self, x: int) -> int:
        """Rank 0's ``x``, on every rank."""
        raise NotImplementedError

    def algorithms(self, op: str, wanted: Optional[str]) -> list:
        """The algorithm names to run ``op`` with; None means the library's choice."""
        return [None]

    def empty(self, shape, dtype, registered: bool) -> np.ndarray:
        """A buffer for the calls: a plain array (``registered`` is for
        libraries that have registered buffers)."""
        return np.empty(shape, dtype)

    def label(self, op: str, lay: Layout, algorithm: Optional[str]) -> str:
        """The algorithm column."""
        return algorithm or "-"

    def caller(self, op: str, send: Optional[np.ndarray], recv: np.ndarray, redop: str,
               algorithm: Optional[str]) -> Callable[[], None]:
        """A function making one call of ``op`` on these preallocated buffers
        (or Unsupported)."""
        raise NotImplementedError


class Config(NamedTuple):
    """Everything a rank needs to run the benchmark (picklable, JSON-able)."""

    ops: list
    sizes: list
    dtype: str
    redop: str
    iters: int
    warmup: int
    repeats: int
    time_budget: Optional[float]
    algo: Optional[str]
    check: bool
    transport: str
    progress: bool
    tty: bool
    percentiles: bool = False  # time each call too: p50/p99 columns
    registered: bool = False   # collie's buffers from collie.empty (its peers' stay plain)


class Progress:
    """One line on stderr, rewritten in place on a terminal (else one line
    per step, for --progress into a file)."""

    def __init__(self, enabled: bool, tty: bool):
        self.enabled, self.tty, self.shown = enabled, tty, False

    def show(self, text: str) -> None:
        if self.enabled:
            sys.stderr.write(f"\r{text}\x1b[K" if self.tty else text + "\n")
            sys.stderr.flush()
            self.shown = True

    def clear(self) -> None:
        if self.enabled and self.tty and self.shown:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()
        self.shown = False


class Timing(NamedTuple):
    seconds: float  # the median over repeats of the slowest rank's mean per call
    iters: int      # timed calls per repeat
    p50: Optional[float] = None  # with --percentiles: the slowest rank's median call,
    p99: Optional[float] = None  # and its 99th percentile, over every timed call


def measure(comm: Comm, call: Callable[[], None], cfg: Config) -> Timing:
    """How long ``call`` takes (see Timing).

    With a time budget, rank 0 times the warmup calls and picks the iteration
    count that fills the budget; it broadcasts it, so every rank makes the
    same number of calls. Then a tenth of the budget more goes to warming
    up (WARM_SHARE): a handful of calls can leave the first row of a run
    cold (caches, code paths, a halted core). In three `--algo all` runs on
    the test machine, the first row (direct, 2 ranks, 8 bytes) came out at
    0.49-0.83 of the speed of recursive doubling measured right after it,
    which at 2 ranks is the very same schedule.
    """
    warmup = max(cfg.warmup, 1) if cfg.time_budget else cfg.warmup
    t0 = time.perf_counter()
    for _ in range(warmup):
        call()
    iters = cfg.iters
    if cfg.time_budget:
        per_call = max((time.perf_counter() - t0) / warmup, 1e-7)
        iters = comm.bcast(max(1, min(_MAX_ITERS, int(cfg.time_budget / cfg.repeats / per_call))))
        more = comm.bcast(min(_MAX_ITERS, int(WARM_SHARE * cfg.time_budget / per_call)))
        for _ in range(more):
            call()
    times = []
    # With percentiles, a clock read per call (~0.1 us), into an array made
    # first: appending to a list of floats, growing as it went, put costs of
    # its own in the tail (p99 2.3 us against 0.7 with the array, 8-byte
    # all_reduce on 2 ranks, the same calls).
    calls = np.empty(cfg.repeats * iters if cfg.percentiles else 0)
    clock = time.perf_counter
    for repeat in range(cfg.repeats):
        comm.barrier()
        t0 = clock()
        if cfg.percentiles:
            for i in range(repeat * iters, (repeat + 1) * iters):
                t = clock()
                call()
                calls[i] = clock() - t
        else:
            for _ in range(iters):
                call()
        times.append(comm.max((clock() - t0) / iters))
    if not cfg.percentiles:
        return Timing(statistics.median(times), iters)
    p50, p99 = np.percentile(calls, [50, 99])
    return Timing(statistics.median(times), iters, comm.max(float(p50)), comm.max(float(p99)))


def run(comm: Comm, cfg: Config, emit: Callable[[dict], None],
        note: Callable[[str], None] = lambda text: None, progress: Optional[Progress] = None) -> None:
    """Measure every (op, size, algorithm) of ``cfg`` on ``comm``; ``emit``
    gets each row (a dict, on every rank), ``note`` what was skipped and why.
    Whoever prints rows must clear ``progress`` first (Table does)."""
    dtype = np.dtype(cfg.dtype)
    n = comm.size
    if progress is None:
        progress = Progress(cfg.progress and comm.rank == 0, cfg.tty)
    say = note

    def note(text: str) -> None:
        progress.clear()
        say(text)

    for op in cfg.ops:
        if op == "sendrecv" and n < 2:
            note("sendrecv needs at least 2 ranks; skipped")
            continue
        algos = comm.algorithms(op, cfg.algo)
        if not algos:
            note(f"{op} has no algorithm {cfg.algo!r}; skipped")
            continue
        redop = cfg.redop if op in _REDUCING else "none"
        try:
            for k, size in enumerate(cfg.sizes):
                lay = layout(op, size, dtype.itemsize, n)
                recv = comm.empty(lay.recv, dtype, cfg.registered)
                send = None if op in _IN_PLACE else comm.empty(lay.send, dtype, cfg.registered)
                for algo in algos:
                    progress.show(f"{comm.name}: {op} {format_size(lay.nbytes)} "
                                  f"({k + 1}/{len(cfg.sizes)}){' ' + algo if algo else ''}")
                    call = comm.caller(op, send, recv, cfg.redop, algo)
                    for buf in (send, recv):
                        if buf is not None:
                            buf.fill(timing_fill(op, cfg.redop))
                    timing = measure(comm, call, cfg)
                    seconds, iters = timing.seconds, timing.iters
                    wrong = None
                    if cfg.check:
                        wrong = comm.total(check(comm, call, op, lay, send, recv, dtype, cfg.redop))
                    algbw = lay.nbytes / seconds / 1e9
                    emit({"backend": comm.name, "op": op, "nranks": n, "bytes": lay.nbytes,
                          "dtype": dtype.name, "algorithm": comm.label(op, lay, algo),
                          "time_us": seconds * 1e6, "algbw_GBps": algbw,
                          "busbw_GBps": algbw * bus_factor(op, n), "wrong": wrong,
                          "count": lay.count, "redop": redop, "root": 0 if op in _ROOTED else -1,
                          "iters": iters, "p50_us": _us(timing.p50), "p99_us": _us(timing.p99),
                          "registered": cfg.registered and comm.registers})
        except Unsupported as exc:
            note(f"{comm.name}: {op}: {exc}; skipped")
    progress.clear()


def _us(seconds: Optional[float]) -> Optional[float]:
    return None if seconds is None else seconds * 1e6


def check(comm: Comm, call, op: str, lay: Layout, send, recv, dtype, redop: str) -> int:
    """One call on the check inputs; returns this rank's wrong elements."""
    source = send if send is not None else recv
    source[:] = pattern(comm.rank, 0, source.size, dtype, redop)
    if send is not None:
        recv.fill(0)
    call()
    return count_wrong(recv, expected(op, comm.rank, comm.size, lay, dtype, redop), comm.size)


class DistComm(Comm):
    """collie, or torch.distributed (Gloo): the two share one API, so one
    adapter serves both; ``wrap`` turns a NumPy array into the library's
    tensor (torch.from_numpy shares the memory)."""

    def __init__(self, name: str, dist, wrap=lambda a: a):
        self.name, self.dist, self.wrap = name, dist, wrap
        self.rank, self.size = dist.get_rank(), dist.get_world_size()
        self._f = wrap(np.zeros(1, np.float64))
        self._i = wrap(np.zeros(1, np.int64))

    def barrier(self) -> None:
        self.dist.barrier()

    def max(self, x: float) -> float:
        self._f[0] = x
        self.dist.all_reduce(self._f, op=self.dist.ReduceOp.MAX)
        return float(self._f[0])

    def total(self, x: int) -> int:
        self._i[0] = x
        self.dist.all_reduce(self._i, op=self.dist.ReduceOp.SUM)
        return int(self._i[0])

    def bcast(self, x: int) -> int:
        self._i[0] = x
        self.dist.broadcast(self._i, src=0)
        return int(self._i[0])

    def _extra(self, algorithm: Optional[str]) -> dict:
        return {}

    @staticmethod
    def _caller_with(op, d, r, s, rop, kw: dict):
        """caller()'s call with ``kw`` (an algorithm forced) added."""
        if op == "all_reduce":
            return lambda: d.all_reduce(r, op=rop, **kw)
        if op == "broadcast":
            return lambda: d.broadcast(r, src=0, **kw)
        if op == "reduce":
            return lambda: d.reduce(r, dst=0, op=rop, **kw)
        if op == "all_gather":
            return lambda: d.all_gather_into_tensor(r, s, **kw)
        if op == "reduce_scatter":
            return lambda: d.reduce_scatter_tensor(r, s, op=rop, **kw)
        if op == "all_to_all":
            return lambda: d.all_to_all_single(r, s, **kw)
        raise ValueError(op)

    def caller(self, op, send, recv, redop, algorithm):
        d, kw = self.dist, self._extra(algorithm)
        r = self.wrap(recv)
        s = self.wrap(send) if send is not None else None
        rop = getattr(d.ReduceOp, "PRODUCT" if redop == "prod" else redop.upper())
        # Each call as a program writes it: keywords spelled out, none splatted
        # from an empty dict (that costs more per call than some whole 8-byte calls).
        if kw and op != "sendrecv":
            return self._caller_with(op, d, r, s, rop, kw)
        if op == "all_reduce":
            return lambda: d.all_reduce(r, op=rop)
        if op == "broadcast":
            return lambda: d.broadcast(r, src=0)
        if op == "reduce":
            return lambda: d.reduce(r, dst=0, op=rop)
        if op == "all_gather":
            return lambda: d.all_gather_into_tensor(r, s)
        if op == "reduce_scatter":
            return lambda: d.reduce_scatter_tensor(r, s, op=rop)
        if op == "all_to_all":
            return lambda: d.all_to_all_single(r, s)
        if op == "sendrecv":
            p2p = [d.P2POp(d.isend, s, (self.rank + 1) % self.size),
                   d.P2POp(d.irecv, r, (self.rank - 1) % self.size)]

            def sendrecv():
                for work in d.batch_isend_irecv(p2p):
                    work.wait()
            return sendrecv
        raise ValueError(op)


class CollieComm(DistComm):
    """collie itself: algorithms can be forced, the table names the one the
    tuner picked when they are not, and buffers may be registered."""

    registers = True

    def __init__(self, name: str = "collie"):
        import collie
        super().__init__(name, collie)

    def algorithms(self, op, wanted):
        if op == "sendrecv" or wanted is None:
            return [None]
        from . import algorithms, collectives
        from .group import resolve
        unavailable = collectives.excluded(resolve(None), op)  # shm across hosts
        have = [a for a in algorithms.algorithms_for(op) if a not in unavailable]
        if wanted == "all":
            return have
        return [wanted] if wanted in have else []

    def _extra(self, algorithm):
        return {"algorithm": algorithm} if algorithm else {}

    def empty(self, shape, dtype, registered: bool) -> np.ndarray:
        return self.dist.empty(shape, dtype) if registered else np.empty(shape, dtype)

    def label(self, op, lay, algorithm):
        if op == "sendrecv":
            return "p2p"
        if algorithm:
            return algorithm
        # What the tuner picks for this call; collectives pass the tuner the
        # bytes below (all_to_all_single with even splits, as here, its
        # input's), and each rank's host.
        try:
            from . import collectives
            from .group import resolve
            g = resolve(None)
            return collectives.choose(g, op, lay.nbytes).algorithm
        except Exception:  # noqa: BLE001 - only a label
            return "auto"


# ---- the machine: memory bandwidth and each collective's bound -------------

def memory_bandwidth(nbytes: int = 64 << 20, repeats: int = 5, cores: int = 1) -> tuple[float, float, float]:
    """(copy, add, read): bytes a core reads plus writes per second, best of
    ``repeats``, for np.copyto of ``nbytes`` (read S, write S), an in-place
    np.add (read 2S, write S) and a reduction that only reads (read S).
    ``cores`` processes measure at once: cores share the last-level cache
    and DRAM, and a large last-level cache may hold the whole working set,
    so these are the rates of this size on this many cores, as the
    benchmark runs it. Each repeat of each kernel starts on every core at
    once (a barrier) and counts until the slowest core is done: the best of
    repeats that merely started together may be a repeat that ran while
    the other cores did something else (a 2-core AMD EPYC VM, within a
    minute: 42-43 GB/s a core copying so, 21-23 this way; at other times,
    when both cores copy at full speed at once, the two ways agree)."""
    if cores > 1:
        return _memory_bandwidth_together(nbytes, repeats, cores)
    times = _kernel_times(nbytes, repeats)
    return _rates(nbytes, [min(t[k] for t in times) for k in range(3)])


def _memory_bandwidth_together(nbytes: int, repeats: int, cores: int) -> tuple[float, float, float]:
    import multiprocessing as mp
    ctx = mp.get_context("fork")
    start = ctx.Barrier(cores)
    out = ctx.SimpleQueue()
    procs = [ctx.Process(target=_memory_bandwidth_child, args=(nbytes, repeats, start, out), daemon=True)
             for _ in range(cores)]
    for p in procs:
        p.start()
    try:
        each = [out.get() for _ in procs]
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    return _rates(nbytes, slowest_then_best(each))


def slowest_then_best(each: list) -> list:
    """Per kernel, from each core's seconds per repeat (``each[core][repeat]``
    a (copy, add, read) row): a repeat lasts until its slowest core is done,
    and the best repeat counts."""
    return [min(max(times[i][k] for times in each) for i in range(len(each[0]))) for k in range(3)]


def _memory_bandwidth_child(nbytes: int, repeats: int, start, out) -> None:
    out.put(_kernel_times(nbytes, repeats, start))


def _kernel_times(nbytes: int, repeats: int, start=None) -> list:
    """Seconds of each repeat's (copy, add, read), each begun after
    ``start.wait()`` where a barrier is given."""
    a = np.ones(nbytes // 8)
    b = np.ones_like(a)  # ones, not empty: touch the pages before timing
    c = np.ones_like(a)
    kernels = (lambda: np.copyto(b, a),
               lambda: np.add(c, a, out=c),  # in place, as reductions are: no separate destination to fetch
               lambda: np.maximum.reduce(a))
    times = []
    for _ in range(repeats):
        row = []
        for kernel in kernels:
            if start is not None:
                start.wait(timeout=60)
            t0 = time.perf_counter()
            kernel()
            row.append(time.perf_counter() - t0)
        times.append(row)
    return times


def _rates(nbytes: int, seconds: list) -> tuple[float, float, float]:
    """Bytes read plus written per second of (copy, add, read) in ``seconds``."""
    nbytes = nbytes // 8 * 8
    return 2 * nbytes / seconds[0], 3 * nbytes / seconds[1], nbytes / seconds[2]


# Memory traffic (bytes read plus written) each collective needs at least on
# one host, in units of its nccl-tests size S, for n ranks: (single copy,
# through a shared segment). Why each, see memory_bound.
_TRAFFIC = {
    "all_reduce": (("(3n-1)S", lambda n: 3 * n - 1), ("(5n-2)S", lambda n: 5 * n - 2)),
    "reduce": (("(n+1)S", lambda n: n + 1), ("(3n-1)S", lambda n: 3 * n - 1)),
    "reduce_scatter": (("(n+1)S", lambda n: n + 1), ("(3n-1)S", lambda n: 3 * n - 1)),
    "broadcast": (("2(n-1)S", lambda n: 2 * (n - 1)), ("2nS", lambda n: 2 * n)),
    "all_gather": (("2nS", lambda n: 2 * n), ("(2n+2)S", lambda n: 2 * n + 2)),
    "all_to_all": (("2nS", lambda n: 2 * n), ("(4n-2)S", lambda n: 4 * n - 2)),
    "sendrecv": (("2nS", lambda n: 2 * n), ("4nS", lambda n: 4 * n)),
}


def traffic_factor(op: str, n: int, single_copy: bool) -> tuple[str, int]:
    """(formula, factor): the bytes ``op`` on ``n`` ranks of one host must
    move through memory, in units of S (see memory_bound)."""
    text, factor = _TRAFFIC[op][0 if single_copy else 1]
    return text, factor(n)


def memory_bound(op: str, n: int, cores: int, copy_bw: float, add_bw: float, read_bw: float = 0.0,
                 single_copy: bool = False) -> Optional[tuple[float, float]]:
    """(algbw, busbw) in bytes/s that no algorithm for ``op`` on ``n`` ranks
    of one host can beat on this machine with large buffers (None for one
    rank, which need move nothing).

    The least memory traffic (bytes read plus written) for S bytes per rank
    (S as nccl-tests counts it): every input element must be read once and
    every output element written once. A byte that goes from one rank to
    another costs nothing more if the reader can read the writer's memory
    (``single_copy``: process_vm_readv); otherwise it must first be copied
    into a shared segment (or a socket's kernel buffer), one read and one
    write more, after which any number of ranks can read it from there. So:

    - all_reduce (3n-1)S: n inputs read, n outputs written, and the n-1
      ranks that did not reduce an element read it once more. Without
      single copy (5n-2)S: each element's n-1 foreign inputs enter the
      segment, and its result is written there too;
    - reduce and reduce_scatter (n+1)S: n inputs read, one result of S
      written ((3n-1)S without: the foreign inputs enter the segment);
    - broadcast 2(n-1)S: n-1 copies of S (2nS without: the root's S enters
      once);
    - all_gather 2nS: n outputs of S, each byte read from its source
      ((2n+2)S without: each block enters once);
    - all_to_all and sendrecv 2nS: every byte read once and written once
      ((4n-2)S and 4nS without: what crosses ranks enters the segment).

    The reductions add nothing: their operands are the reads above. At most
    p = min(n, cores) cores move it, each at most at the fastest of the
    copy, add and read-only rates measured with p cores at once on buffers
    of the same size (memory_bandwidth: they share the last-level cache and
    DRAM; reads alone stream fastest), so time >= traffic / (p x rate).
    Smaller buffers, which stay in the faster inner caches, can beat it.
    """
    if n < 2:
        return None
    p = min(n, max(cores, 1))
    algbw = p * max(copy_bw, add_bw, read_bw) / traffic_factor(op, n, single_copy)[1]
    return algbw, algbw * bus_factor(op, n)


# ---- across hosts: the links' rate, and the bytes that must cross them ------

def link_bytes(op: str, hosts: Sequence, nbytes: int) -> float:
    """The bytes ``op`` of size ``nbytes`` (as the tables count it) must move
    through the busiest host's link in one direction, whatever the
    algorithm, for ranks on ``hosts`` (each rank's host; 0 on one host).

    A host's ranks share its link to the others, and what they exchange
    among themselves costs it nothing. With n ranks, m_h of them on host h
    and K hosts:

    - all_reduce 2(K-1)/K S: the hosts' sums must be all-reduced among K
      nodes, which sends and receives that much per node (Patarasuk and
      Yuan's bound; S each way for two hosts);
    - broadcast and reduce S: the buffer must enter every host but the
      root's (leave each, summed, for reduce);
    - all_gather and reduce_scatter max(m_h, n - m_h)/n S: the other hosts'
      blocks must come in and its own go out (for reduce_scatter, the
      partial sums of the blocks that other hosts own go out);
    - all_to_all m_h (n - m_h)/n S: every block from a rank of h to a rank
      elsewhere, and as much back;
    - sendrecv S per rank whose neighbour (rank + 1, rank - 1) is elsewhere.
    """
    n = len(hosts)
    ranks_on: dict = {}
    for h in hosts:
        ranks_on[h] = ranks_on.get(h, 0) + 1
    k = len(ranks_on)
    if k < 2:
        return 0.0
    if op == "all_reduce":
        return 2 * (k - 1) / k * nbytes
    if op in ("broadcast", "reduce"):
        return float(nbytes)
    if op in ("all_gather", "reduce_scatter"):
        return max(max(m, n - m) for m in ranks_on.values()) / n * nbytes
    if op == "all_to_all":
        return max(m * (n - m) for m in ranks_on.values()) / n * nbytes
    if op == "sendrecv":
        out = [sum(hosts[r] == h != hosts[(r + 1) % n] for r in range(n)) for h in ranks_on]
        into = [sum(hosts[r] == h != hosts[(r - 1) % n] for r in range(n)) for h in ranks_on]
        return max(out + into) * float(nbytes)
    raise ValueError(op)


def link_rate(seconds: float = 0.25, most: int = 8 << 20) -> Optional[tuple[float, int]]:
    """(bytes/s each way, bytes per message) of the slowest link between
    this world's hosts, measured now; None on one host. Collective: every
    rank calls it. Rank 0 and the first rank of each other host in turn
    measure it as init_process_group does (collie.topology.measure: five
    messages at once both ways, the median of three rounds), with messages
    grown until a round takes ``seconds``. A rate stated in COLLIE_TOPOLOGY
    is taken as it is (bytes per message 0)."""
    import collie
    from .topology import STATED, measure
    network = _network()
    if len(set(network.hosts)) < 2:
        return None
    if network.topology is not None and network.topology.link_source == STATED:
        return 1 / network.topology.link.beta, 0
    _, beta, nbytes = measure(network, network.timeout, leaders=None, min_round=seconds, most=most,
                              budget=None, caller="collie bench")
    found = np.array([1 / beta, nbytes] if collie.get_rank() == 0 else [0.0, 0.0])
    collie.broadcast(found, src=0)
    return float(found[0]), int(found[1])


def link_lines(hosts: Sequence, rate: float) -> dict:
    """op -> what the table says of its bound across hosts."""
    lines = {}
    unit = 64 << 20
    for op in OPS:
        crossing = link_bytes(op, hosts, unit) / unit
        if crossing:
            algbw = rate / crossing
            lines[op] = (f"across hosts: crosses >= {crossing:.2f} S on the busiest host's link, "
                         f"algbw <= {algbw / 1e9:.3f} GB/s, busbw <= "
                         f"{algbw * bus_factor(op, len(hosts)) / 1e9:.3f} GB/s, see header")
    return lines


def _network():
    """This rank's Network (the world's)."""
    from .group import resolve
    return resolve(None).network


def _single_copy(cfg: Config) -> bool:
    """Before the ranks start: whether their shared-memory peers will read
    each other's memory directly (the shm transport checks the same way, with
    a real read). Forks: call it only while this process has no threads."""
    from .transports import cma
    if cfg.transport == "tcp" or os.environ.get("COLLIE_SHM_CMA_BYTES", "").strip() == "0":
        return False
    return cma.works_between_processes()


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _memory_gib() -> float:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / (1 << 30)
    except (ValueError, OSError, AttributeError):
        return float("nan")


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


# ---- load -------------------------------------------------------------------

# Spins until its parent is gone, so that a bench killed outright leaves no hog.
_HOG = "import os\nparent = os.getppid()\nwhile os.getppid() == parent:\n    for _ in range(100000): pass\n"


@contextlib.contextmanager
def hogs(count: int):
    """``count`` CPU-bound processes for the duration (--hog): a shared
    machine, made on purpose, so that how each library holds up is measured."""
    procs = [subprocess.Popen([sys.executable, "-c", _HOG], stdin=subprocess.DEVNULL)
             for _ in range(count)]
    try:
        yield procs
    finally:
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.wait()


# ---- output -----------------------------------------------------------------

_COLUMNS = (("size", 12), ("count", 12), ("type", 10), ("redop", 6), ("root", 5), ("time(us)", 11),
            ("algbw(GB/s)", 12), ("busbw(GB/s)", 12), ("#wrong", 7))
_PERCENTILE_COLUMNS = (("p50(us)", 10), ("p99(us)", 10))


def local_start_method() -> str:
    """How the bench starts the ranks it runs here (collie's and Gloo's):
    from a forkserver that preloads collie and NumPy, so that ranks share
    those pages, as ranks forked from one parent do; fresh interpreters
    where there is no forkserver. With more ranks than cores this matters
    (docs/performance.md); ``collie run`` starts fresh interpreters."""
    import multiprocessing
    return "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"


def bound_lines(n: int, mem: Optional[tuple], single_copy: bool) -> dict:
    """op -> what the table says of its memory bound (none without a measurement)."""
    lines = {}
    for op in OPS if mem is not None else ():
        bound = memory_bound(op, n, _cores(), *mem, single_copy=single_copy)
        if bound is not None:
            text = traffic_factor(op, n, single_copy)[0]
            lines[op] = f"for 64 MiB buffers: moves >= {text}, busbw <= {bound[1] / 1e9:.2f} GB/s, see header"
    return lines


def header(argv: list, nranks: int, where: str, cfg: Config, mem: Optional[tuple],
           single_copy: bool = False, mem_cores: int = 1, hogs: int = 0,
           link: Optional[tuple] = None, hosts: Sequence = ()) -> str:
    """The lines above the tables: command, world, machine, date, method."""
    import collie
    from . import core
    cmd = " ".join(["collie bench", *argv])
    timing = (f"about {cfg.time_budget:g} s per size" if cfg.time_budget else f"{cfg.iters} calls")
    warm = f"{cfg.warmup} warmup" + (f" and {WARM_SHARE * cfg.time_budget:g} s" if cfg.time_budget else "")
    lines = [
        f"# {cmd}",
        f"# nranks {nranks} ({where})  transport {cfg.transport}  collie {collie.__version__}  "
        f"numpy {np.__version__}  python {platform.python_version()}  executor {core.EXECUTOR}",
        f"# host {platform.node()}: {_cores()} cores ({_cpu_model()}), {_memory_gib():.1f} GiB memory, "
        f"{platform.system()} {platform.release()}",
        f"# date {datetime.datetime.now().astimezone().strftime('%Y-%m-%d %H:%M:%S %Z')}",
        f"# time: the slowest rank's mean per call over {timing} (after {warm}), "
        f"median of {cfg.repeats} repeats; GB/s = 1e9 B/s; size/busbw as in nccl-tests"
        + ("; p50/p99: of every timed call, the slowest rank's" if cfg.percentiles else ""),
    ]
    if cfg.registered:
        lines.append("# buffers: collie's from collie.empty (registered: a peer on the host maps them and reads "
                     "them straight from memory); the peers' (--vs) plain NumPy arrays")
    if hogs:
        lines.append(f"# load: {hogs} CPU-bound process(es) ran beside the ranks and the peers "
                     f"throughout (--hog); the memory figures were taken before them")
    if mem is not None:
        copy_bw, add_bw, read_bw = mem
        lines.append(f"# memory: each core copies at {copy_bw / 1e9:.1f} GB/s, adds in place at "
                     f"{add_bw / 1e9:.1f} GB/s, reads at {read_bw / 1e9:.1f} GB/s (np.copyto, np.add, "
                     f"np.maximum.reduce; 64 MiB; bytes read + written; {mem_cores} core(s) at once)")
        if nranks > 1:
            how = "single copy" if single_copy else "through shared segments"
            lines.append(f"# bound: the least memory traffic of each op on one host ({how}), at the "
                         f"fastest rate above on {min(nranks, _cores())} cores; above each table for "
                         f"64 MiB buffers (see collie.bench.memory_bound)")
    if link is not None:
        rate, nbytes = link
        how = ("stated by COLLIE_TOPOLOGY" if not nbytes else "measured at start (rank 0 and each other "
               f"host's first rank sending each other 5 x {format_size(nbytes)} at once, median of 3 rounds)")
        lines.append(f"# link: {rate / 1e6:.1f} MB/s ({rate * 8 / 1e9:.3f} Gbit/s) each way on the slowest "
                     f"link between the {len(set(hosts))} hosts, {how}")
        lines.append("# bound: the bytes each op must move through the busiest host's link, at that rate; "
                     "above each table (see collie.bench.link_bytes)")
    return "\n".join(lines)


class Table:
    """Prints rows as they arrive, one block per op, with a busbw ratio
    column per peer (collie's busbw / the peer's at the same op and size,
    computed from times so that it is defined for 0-byte rows too)."""

    def __init__(self, peer_rows: list, bounds: dict, progress: Optional[Progress] = None,
                 out=sys.stdout, banner: bool = True):
        self.peer_rows, self.bounds, self.progress, self.out = peer_rows, bounds, progress, out
        self.peers = [p for p in PEERS if any(r["backend"] == p for r in peer_rows)]
        self.op: Optional[str] = None
        self.started = not banner  # the line that explains the ratio columns is printed
        self.percentiles = False   # p50/p99 columns: set by the first row that has them

    def _say(self, line: str) -> None:
        if self.progress is not None:
            self.progress.clear()  # a row must not land on the progress line
        self.out.write(line + "\n")
        self.out.flush()

    def _line(self, row: dict, ratios: Iterable[str] = ()) -> str:
        wrong = "N/A" if row["wrong"] is None else str(row["wrong"])
        cells = [f"{row['bytes']:>12}", f"{row['count']:>12}", f"{row['dtype']:>10}", f"{row['redop']:>6}",
                 f"{row['root']:>5}", f"{row['time_us']:>11.2f}", f"{row['algbw_GBps']:>12.3f}",
                 f"{row['busbw_GBps']:>12.3f}", f"{wrong:>7}"]
        if self.percentiles:
            cells += [f"{'-' if row.get(k) is None else format(row[k], '.2f'):>10}" for k in ("p50_us", "p99_us")]
        cells.append(f"  {row['algorithm']:<18}")
        return (" ".join(cells) + "".join(f"{r:>11}" for r in ratios)).rstrip()

    def start(self, op: str) -> None:
        self._finish()
        if self.peers and not self.started:
            self._say("# vs PEER: collie's busbw / the peer's at the same size (above 1: collie is faster)")
        self.started = True
        self.op = op
        columns = _COLUMNS + (_PERCENTILE_COLUMNS if self.percentiles else ())
        names = " ".join(f"{name:>{w}}" for name, w in columns)
        ratios = "".join(f"{'vs ' + p:>11}" for p in self.peers)
        self._say(f"#\n# {op}")
        if op in self.bounds:
            self._say(f"# (bound {self.bounds[op]})")
        self._say(f"#{names[1:]}   {'algorithm':<18}{ratios}".rstrip())

    def add(self, row: dict) -> None:
        self.percentiles = self.percentiles or row.get("p50_us") is not None
        if row["op"] != self.op:
            self.start(row["op"])
        ratios = []
        for p in self.peers:
            theirs = [r for r in self.peer_rows if r["backend"] == p and r["op"] == row["op"]
                      and r["bytes"] == row["bytes"]]
            ratios.append(f"{theirs[0]['time_us'] / row['time_us']:.2f}x" if theirs else "-")
        self._say(self._line(row, ratios))

    def _finish(self) -> None:
        """Close the current block with the peers' rows for its op."""
        for p in self.peers:
            rows = [r for r in self.peer_rows if r["backend"] == p and r["op"] == self.op]
            if rows:
                self._say(f"# {self.op} through {p}")
                for r in rows:
                    self._say(self._line(r))

    def close(self) -> None:
        self._finish()
        self.op = None


def write_json(path: str, rows: list) -> None:
    """One JSON object per line, per row, with JSON_KEYS."""
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps({k: r.get(k) for k in JSON_KEYS}) + "\n")


def plot_available() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def write_plot(path: str, rows: list) -> None:
    """busbw against size (log2 axis), one panel per op, one line per
    backend/algorithm."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    ops = [op for op in OPS if any(r["op"] == op for r in rows)]
    fig, axes = plt.subplots(len(ops), 1, figsize=(8, 3.2 * len(ops)), squeeze=False)
    for ax, op in zip(axes[:, 0], ops):
        mine = [r for r in rows if r["op"] == op and r["bytes"] > 0]
        # One line per backend; per backend and algorithm where a backend
        # ran several at one size (--algo all), since the tuner's choice
        # changes with the size and must not cut a backend's line apart.
        several = {r["backend"] for r in mine
                   if sum(q["backend"] == r["backend"] and q["bytes"] == r["bytes"] for q in mine) > 1}
        lines: dict = {}
        for r in mine:
            name = f"{r['backend']} {r['algorithm']}" if r["backend"] in several else r["backend"]
            lines.setdefault(name, []).append((r["bytes"], r["busbw_GBps"]))
        for name, points in lines.items():
            xs, ys = zip(*sorted(points))
            ax.plot(xs, ys, marker="o", label=name)
        ax.set_xscale("log", base=2)
        ax.set_title(op)
        ax.set_xlabel("size (bytes)")
        ax.set_ylabel("busbw (GB/s)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


# ---- running it: as one rank of a world, or starting the ranks here ------

def _hidden() -> set:
    return {p.strip() for p in os.environ.get("COLLIE_BENCH_HIDE", "").split(",") if p.strip()}


def _say(text: str) -> None:
    sys.stderr.write(f"collie bench: {text}\n")
    sys.stderr.flush()


def rank_main(cfg: Config, argv: list, where: str, mem: Optional[tuple], peer_rows: list,
              json_path: Optional[str], plot_path: Optional[str], print_header: bool,
              rows_path: Optional[str] = None, banner: bool = True) -> None:
    """One rank of the benchmark, in an initialized collie world; rank 0
    prints the tables and writes --json/--plot, or, with ``rows_path``,
    every row (collie's and the peers') for the caller to gather."""
    comm = CollieComm()
    rows: list = []
    is_root = comm.rank == 0
    network = _network()
    single_copy = bool(network.shm is not None and network.shm.single_copy_peers())  # what the transport found
    link = link_rate()
    if link is None:
        bounds = bound_lines(comm.size, mem, single_copy)
    else:  # across hosts the links bind, not one host's memory
        mem, bounds = None, link_lines(network.hosts, link[0])
    progress = Progress(cfg.progress and is_root, cfg.tty)
    table = Table(peer_rows, bounds, progress, banner=banner)
    if is_root and print_header:
        print(header(argv, comm.size, where, cfg, mem, single_copy, link=link, hosts=network.hosts), flush=True)

    def emit(row: dict) -> None:
        rows.append(row)
        if is_root:
            table.add(row)

    run(comm, cfg, emit, note=lambda text: is_root and _say(text), progress=progress)
    if is_root:
        table.close()
        everything = rows + peer_rows
        if rows_path:
            with open(rows_path, "w") as f:
                json.dump(everything, f)
        if json_path:
            write_json(json_path, everything)
        if plot_path:
            write_plot(plot_path, everything)


def _spawned_rank(rank: int, cfg: Config, argv, where, mem, peer_rows, rows_path, banner) -> None:
    """A rank started by collie bench itself: rank 0 hands every row back in
    ``rows_path`` (main() writes --json and --plot)."""
    import collie
    collie.init_process_group(backend=cfg.transport)
    try:
        rank_main(cfg, argv, where, mem, peer_rows, None, None, print_header=False,
                  rows_path=rows_path, banner=banner)
    finally:
        collie.destroy_process_group()


_RANK_VARS = ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK")


def _in_world() -> bool:
    """Started as one rank of a job (collie run, torchrun, mpiexec)?"""
    return any(v in os.environ for v in _RANK_VARS)


def peer_missing(peer: str) -> Optional[str]:
    """The hint on installing ``peer``, or None when it can run here."""
    hidden = _hidden()
    if peer == "mpi4py":
        if "mpi4py" in hidden or importlib.util.find_spec("mpi4py") is None:
            return HINTS["mpi4py"]
        if "mpiexec" in hidden or shutil.which("mpiexec") is None:
            return HINTS["mpiexec"]
    elif peer == "gloo" and ("gloo" in hidden or importlib.util.find_spec("torch") is None):
        return HINTS["gloo"]
    return None


def run_mpiexec(n: int, module: str, *args: str, timeout: Optional[float] = None) -> subprocess.CompletedProcess:
    """Run ``python -m module args`` on ``n`` ranks under mpiexec, pinned
    when collie's ranks are (COLLIE_BIND=core), in our environment without
    our own job's variables (the peers are a job of their own); its output
    captured. mpiexec dies with this process; past ``timeout`` run() kills
    it (TimeoutExpired), and its proxies then kill the ranks."""
    from . import binding
    from .launch import die_with_parent
    bind = ["-bind-to", "core"] if binding.mode() == "core" else []
    cmd = ["mpiexec", *bind, "-n", str(n), sys.executable, "-m", module, *args]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout,
                          preexec_fn=die_with_parent)


def mpiexec_failure(done: subprocess.CompletedProcess) -> str:
    """Why an mpiexec job failed: the last line it printed, or its exit code."""
    tail = (done.stderr.strip() or done.stdout.strip()).splitlines()[-1:]
    return tail[0] if tail else f"mpiexec exited with code {done.returncode}"


def run_peer(peer: str, n: int, cfg: Config) -> list:
    """Run the benchmark through ``peer`` (installed: see peer_missing) on
    ``n`` local processes; its rows (empty, after a one-line note on stderr,
    when it fails)."""
    from . import bench_peers
    with tempfile.TemporaryDirectory(prefix="collie-bench-") as tmp:
        out = os.path.join(tmp, "rows.json")
        try:
            if peer == "mpi4py":
                cfg_path = os.path.join(tmp, "config.json")
                with open(cfg_path, "w") as f:
                    json.dump(cfg._asdict(), f)
                done = run_mpiexec(n, "collie.bench_peers", "mpi4py", cfg_path, out)
                if done.returncode != 0:
                    _say(f"mpi4py run failed (mpiexec -n {n}): {mpiexec_failure(done)}")
                    return []
                if done.stderr:
                    sys.stderr.write(done.stderr)
            elif peer == "python":
                bench_peers.run_collie_python(n, cfg, out)
            elif peer == "mpi":
                bench_peers.run_collie_mpi(n, cfg, out)
            else:
                bench_peers.run_gloo(n, cfg, out)
        except Exception as exc:  # noqa: BLE001 - a failing peer must not sink the run
            _say(f"{peer} run failed: {type(exc).__name__}: {str(exc).strip().splitlines()[-1:]}")
            return []
        with open(out) as f:
            return [json.loads(line) for line in f if line.strip()]


def _parse(argv: list) -> tuple[argparse.Namespace, argparse.ArgumentParser]:
    p = argparse.ArgumentParser(
        prog="collie bench",
        description="Measure the bandwidth of every collective, like nccl-tests: time per call, "
                    "algbw = size/time, busbw = algbw x the op's factor. Starts its own ranks, "
                    "or runs as one rank under `collie run`.")
    p.add_argument("-n", "--nranks", type=int, default=None, metavar="N",
                   help="local ranks to start (default: CPU cores, at least 2); ignored under collie run")
    p.add_argument("--op", default=",".join(OPS), metavar="LIST",
                   help=f"comma list of {', '.join(OPS)} (default: all)")
    p.add_argument("-b", "--minbytes", default="8", metavar="SIZE", help="smallest size (default 8)")
    p.add_argument("-e", "--maxbytes", default="64M", metavar="SIZE", help="largest size (default 64M)")
    p.add_argument("-f", "--stepfactor", type=int, default=4, metavar="F",
                   help="multiply the size by F between rows (default 4)")
    p.add_argument("--sizes", default=None, metavar="LIST", help="explicit sizes, e.g. 8,64K,1M (overrides -b/-e/-f)")
    p.add_argument("--dtype", default="float32", help="any numeric NumPy dtype (default float32)")
    p.add_argument("--redop", default="sum", choices=REDOPS, help="reduction (default sum)")
    p.add_argument("--iters", type=int, default=20, help="timed calls per repeat (default 20)")
    p.add_argument("--warmup", type=int, default=5, help="untimed calls first (default 5)")
    p.add_argument("--repeats", type=int, default=3, help="repeats; the median is printed (default 3)")
    p.add_argument("--time-budget", type=float, default=None, metavar="S",
                   help="instead of --iters: about S seconds per size (and algorithm), "
                        "a tenth more to warm up")
    p.add_argument("--algo", default=None, metavar="NAME|all",
                   help="force an algorithm, or run each one the op has, side by side")
    p.add_argument("--check", action="store_true", help="validate every result (the #wrong column)")
    p.add_argument("--percentiles", action="store_true",
                   help="also time each call: the slowest rank's p50 and p99 per call (columns p50, p99)")
    p.add_argument("--registered", action="store_true",
                   help="collie's buffers from collie.empty, which peers on the host read straight from "
                        "memory (like nccl-tests -R); the peers' stay plain arrays")
    p.add_argument("--hog", type=int, default=0, metavar="N",
                   help="run N CPU-bound processes beside the ranks (and the peers) while measuring: "
                        "how each holds up on a shared machine")
    p.add_argument("--bind", action="store_true",
                   help="pin each rank to its own cores, every library's alike (COLLIE_BIND=core, "
                        "mpiexec -bind-to core; see collie/binding.py)")
    p.add_argument("--transport", default="auto", choices=("auto", "shm", "tcp"),
                   help="collie backend (default auto: shared memory on one host)")
    p.add_argument("--json", default=None, metavar="PATH", help="write one JSON object per row")
    p.add_argument("--plot", default=None, metavar="PATH.png", help="plot busbw against size (needs matplotlib)")
    p.add_argument("--progress", action="store_true", help="progress on stderr even when it is not a terminal")
    p.add_argument("--vs", default="", metavar="LIST",
                   help="also run the same ops through mpi4py, gloo (torch.distributed), python "
                        "(collie's Python executor) and/or mpi (collie's own `from collie import MPI`)")
    return p.parse_args(argv), p


def _config(opts: argparse.Namespace, p: argparse.ArgumentParser) -> Config:
    ops = [o.strip() for o in opts.op.split(",") if o.strip()]
    bad = [o for o in ops if o not in OPS]
    if bad or not ops:
        p.error(f"--op: unknown {', '.join(bad) or 'empty list'} (choose from {', '.join(OPS)})")
    try:
        if opts.sizes:
            sizes = [parse_size(s) for s in opts.sizes.split(",") if s.strip()]
        else:
            lo, hi = parse_size(opts.minbytes), parse_size(opts.maxbytes)
            if opts.stepfactor < 2:
                p.error("-f must be at least 2")
            sizes, s = [], max(lo, 1)
            while s <= hi:
                sizes.append(s)
                s *= opts.stepfactor
    except ValueError as exc:
        p.error(str(exc))
    if not sizes:
        p.error("no sizes to run (check -b/-e or --sizes)")
    try:
        dtype = np.dtype(opts.dtype)
    except TypeError:
        p.error(f"--dtype: not a NumPy dtype: {opts.dtype!r}")
    if dtype.kind not in "iufc":
        p.error(f"--dtype must be numeric (int, uint, float, complex), got {dtype.name}")
    if opts.redop == "avg" and dtype.kind not in "fc":
        p.error(f"--redop avg needs a floating or complex dtype, not {dtype.name}")
    if opts.redop in ("min", "max") and dtype.kind == "c":
        p.error(f"--redop {opts.redop} is undefined on complex dtype {dtype.name}")
    for name in ("iters", "repeats"):
        if getattr(opts, name) < 1:
            p.error(f"--{name} must be at least 1")
    if opts.warmup < 0:
        p.error("--warmup must not be negative")
    if opts.time_budget is not None and opts.time_budget <= 0:
        p.error("--time-budget must be positive")
    if opts.hog < 0:
        p.error("--hog must not be negative")
    tty = sys.stderr.isatty()
    return Config(ops=ops, sizes=sizes, dtype=dtype.name, redop=opts.redop, iters=opts.iters,
                  warmup=opts.warmup, repeats=opts.repeats, time_budget=opts.time_budget,
                  algo=opts.algo, check=opts.check, transport=opts.transport,
                  progress=opts.progress or tty, tty=tty, percentiles=opts.percentiles,
                  registered=opts.registered)


def main(argv: Optional[list] = None) -> int:
    """``collie bench``; returns the exit code."""
    argv = sys.argv[1:] if argv is None else list(argv)
    opts, p = _parse(argv)
    cfg = _config(opts, p)
    if opts.plot and not plot_available():
        _say("--plot needs matplotlib, which is not installed: pip install matplotlib")
        return 2
    peers = [v.strip() for v in opts.vs.split(",") if v.strip()]
    if any(v not in PEERS for v in peers):
        p.error(f"--vs takes a comma list of {', '.join(PEERS)}, got {opts.vs!r}")

    if _in_world():
        # One rank of an existing world: rank 0 measures the memory before
        # the others can disturb it (they are still in the rendezvous).
        import collie
        rank = next((os.environ[v] for v in _RANK_VARS if v in os.environ), "0")
        mem = memory_bandwidth(cores=1) if rank == "0" else None
        collie.init_process_group(backend=cfg.transport)
        try:
            if collie.get_rank() == 0 and (peers or opts.nranks is not None or opts.hog):
                _say("-n, --vs and --hog apply only when collie bench starts its own ranks; ignored")
            rank_main(cfg, argv, "ranks of an existing world", mem, [], opts.json, opts.plot,
                      print_header=True)
        finally:
            collie.destroy_process_group()
        return 0

    n = opts.nranks if opts.nranks is not None else max(2, _cores())
    if n < 1:
        p.error(f"-n must be at least 1, got {n}")
    mem = memory_bandwidth(cores=min(n, _cores()))
    start = local_start_method()
    where = f"started here, {start}"
    if opts.bind:
        os.environ["COLLIE_BIND"] = "core"  # every rank started from here, the peers' too
        where += ", each rank pinned to its own cores"
    print(header(argv, n, where, cfg, mem, _single_copy(cfg), min(n, _cores()), opts.hog), flush=True)
    hints = {peer: peer_missing(peer) for peer in peers}
    for hint in filter(None, hints.values()):
        _say(hint)
    peers = [peer for peer in peers if hints[peer] is None]
    from .launch import spawn
    try:
        # With peers, op by op: the peers, then collie's ranks, started anew
        # for each op. Rank 0 hands its rows back; --json and --plot are
        # written here, from every batch's rows.
        batches = [[op] for op in cfg.ops] if peers else [cfg.ops]
        everything: list = []
        with tempfile.TemporaryDirectory(prefix="collie-bench-") as tmp, hogs(opts.hog):
            rows_path = os.path.join(tmp, "rows.json")
            for k, ops in enumerate(batches):
                part = cfg._replace(ops=ops)
                peer_rows = [row for peer in peers for row in run_peer(peer, n, part)]
                spawn(_spawned_rank, args=(part, argv, where, mem, peer_rows, rows_path, k == 0),
                      nprocs=n, start_method=start)
                with open(rows_path) as f:
                    everything += json.load(f)
        if opts.json:
            write_json(opts.json, everything)
        if opts.plot:
            write_plot(opts.plot, everything)
    except Exception as exc:  # noqa: BLE001 - report it with the rank's own traceback
        text = getattr(exc.__cause__, "text", "")
        if text:
            sys.stderr.write(text)
        _say(f"failed: {type(exc).__name__}: {exc}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
