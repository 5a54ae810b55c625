"""`collie soak`: a long random program of collectives, every result checked.

    collie soak -n 4 --calls 10000 [--backend auto|shm|tcp] [--seed S] [--json]
    collie soak -n 4 --fault kill|stop [--runs 10] [--backend shm|tcp]

Every rank draws the same program from the seed (``program``): any
collective or point-to-point exchange, on the world or on one of three random
sub-groups, with a random dtype, reduce op, size (0 elements up to about
1 MiB, most not divisible by the group size), buffer layout, uneven splits,
an algorithm forced sometimes and some calls left in flight (async_op=True)
while others start. The inputs are small integers that every rank can make
for every rank (``small_ints``), so each rank checks its own result against
NumPy as soon as a call completes, and the first wrong one stops the soak,
naming the call (number, collective, group, arguments) and the rank: rerun
the seed to replay it. tests/test_random_programs.py runs the same programs.

A soak measures, per rank, the calls per second and what the process holds
before and after: its resident memory (RSS, see ``rss_bytes``) and its open
file descriptors, taken after a warm-up (caches filled) and at the end. It
fails on a wrong result, on any fd growth, or on RSS growth past
``--max-rss-growth`` MiB (64 by default: 10,000 calls at 4 ranks grew by
10-16 MiB of allocator fragments and shared pages touched for the first
time, levelling off; a leak of the messages of a call grows by that much in
tens of calls).

With ``--fault`` the same program runs until one rank, chosen by the seed,
is sent SIGKILL (or SIGSTOP) a random moment after the warm-up. Every other
rank must raise: PeerError naming the killed rank, or CollieTimeout naming
the stopped one after the group's timeout (``--timeout``, 2 s for stop). The
time from the signal to each survivor's exception is the figure (one
monotonic clock for all processes of the host). The command exits non-zero
if a survivor hangs or raises anything else, or if a /dev/shm file of the
job outlives it; tests/test_faults.py checks the same with ``fault()``.

The ranks are started by collie's own launcher (collie.spawn), so a soak
job is set up as every job the launcher starts, defaults included.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import itertools
import json
import os
import signal
import statistics
import sys
import tempfile
import time
import zlib
from typing import Iterable, Iterator, NamedTuple, Optional

import numpy as np

__all__ = ["small_ints", "reduce_ops", "reduced", "same", "LAYOUTS", "Call", "program", "make_groups",
           "run_calls", "WrongResult", "soak", "SoakResult", "fault", "FaultRun", "names_victim",
           "fault_problems", "main"]


# ---- the NumPy reference ----

def small_ints(seed: str, count: int, dtype: str) -> np.ndarray:
    """Deterministic small integers (1..3; 0/1 for bool; complex parts too)
    of ``dtype``, so that sums and products are exact in any order. The seed
    is hashed with crc32, not hash(), so any process computes the same data."""
    rng = np.random.default_rng(zlib.crc32(seed.encode()))
    if dtype == "bool":
        return rng.integers(0, 2, count).astype(bool)
    values = rng.integers(1, 4, count)
    if np.dtype(dtype).kind == "c":
        return (values + 1j * rng.integers(0, 3, count)).astype(dtype)
    return values.astype(dtype)


def reduce_ops(dtype: str) -> list:
    """The reduce ops collie takes for ``dtype``."""
    from .ops import ReduceOp
    kind = np.dtype(dtype).kind
    ops = [ReduceOp.SUM]
    if kind in "biu":
        ops += [ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR]
    if kind != "c":
        ops += [ReduceOp.MIN, ReduceOp.MAX]
    if kind in "fc":
        ops += [ReduceOp.AVG, ReduceOp.PREMUL_SUM(2.0), ReduceOp.PRODUCT]
    return ops


def reduced(op, arrays, n: int) -> np.ndarray:
    """NumPy's answer for reducing ``arrays`` (of ``n`` ranks) with ``op``."""
    name = op.name
    if name in ("SUM", "AVG", "PREMUL_SUM"):
        if arrays[0].dtype == bool:
            out = np.logical_or.reduce(arrays)
        else:
            factor = op.factor if name == "PREMUL_SUM" else 1
            out = np.sum([a * factor for a in arrays], axis=0).astype(arrays[0].dtype)
        if name == "AVG":
            out = (out / n).astype(arrays[0].dtype)
        return out
    ufunc = {"PRODUCT": np.multiply, "MIN": np.minimum, "MAX": np.maximum,
             "BAND": np.bitwise_and, "BOR": np.bitwise_or, "BXOR": np.bitwise_xor}[name]
    if arrays[0].dtype == bool and name == "PRODUCT":
        ufunc = np.logical_and
    return ufunc.reduce(arrays).astype(arrays[0].dtype)


def same(a, b) -> bool:
    """Equal, or for floating dtypes close (AVG divides)."""
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        return False
    if a.dtype.kind in "fc":
        return np.allclose(a, b, rtol=2e-3, atol=1e-3)
    return np.array_equal(a, b)


# ---- the random program ----

KINDS = ("all_reduce", "reduce", "broadcast", "all_gather_into_tensor", "all_gather",
         "reduce_scatter_tensor", "reduce_scatter", "all_to_all_single", "all_to_all",
         "gather", "scatter", "barrier", "objects", "ring", "any_source")
SCHEDULE_OF = {"all_gather_into_tensor": "all_gather", "reduce_scatter_tensor": "reduce_scatter",
               "all_to_all_single": "all_to_all"}  # the schedule family a call runs
DTYPES = ("float32", "float64", "int32", "int64", "int8", "uint8", "float16", "complex64", "bool")
# How a call's buffer is handed over; tests add "torch" (a tensor sharing
# the array's memory). The soak leaves it out: importing torch mid-soak
# would count as growth, and collie itself needs only NumPy.
LAYOUTS = ("plain", "plain", "strided", "in_place")
MAX_BYTES = 1 << 20  # the largest calls' buffers, about


class Call(NamedTuple):
    number: int
    name: str     # one of KINDS
    group: int    # index into the program's groups (0: the world)
    args: dict


def program(seed: int, size: int, transport: str, max_bytes: int = MAX_BYTES,
            layouts: tuple = LAYOUTS) -> tuple[list[tuple], Iterator[Call]]:
    """The groups (member tuples, the world first) and the endless sequence
    of calls, the same on every rank that gives the same arguments. One call
    in ten is large (up to ``max_bytes`` per buffer), the others up to 2000
    elements; ``transport`` ("tcp" or not) says whether the shm algorithms
    may be forced."""
    from . import algorithms
    from .schedule import COLLECTIVES as SCHEDULES
    rng = np.random.default_rng(seed)
    groups = [tuple(range(size))] + [tuple(sorted(rng.choice(size, int(rng.integers(1, size + 1)),
                                                              replace=False).tolist()))
                                     for _ in range(3)]

    def calls() -> Iterator[Call]:
        for number in itertools.count():
            group = int(rng.integers(len(groups)))
            name = str(rng.choice(KINDS))
            dtype = str(rng.choice(DTYPES))
            schedule = SCHEDULE_OF.get(name, name)
            uneven = name in ("all_gather", "reduce_scatter", "all_to_all_single", "all_to_all") \
                and bool(rng.random() < 0.5)
            algorithm = None
            if schedule in SCHEDULES and rng.random() < 0.7:
                options = [a for a in algorithms.algorithms_for(schedule)
                           if not (a == "shm" and transport == "tcp")
                           and not (uneven and algorithms.uniform_blocks_only(schedule, a))]
                algorithm = str(rng.choice(options))
            large = max_bytes // np.dtype(dtype).itemsize
            args = dict(op=str(rng.choice([op.name for op in reduce_ops(dtype)])), dtype=dtype,
                        algorithm=algorithm, uneven=uneven,
                        count=int(rng.integers(0, large if rng.random() < 0.1 else 2000)),
                        root=int(rng.integers(len(groups[group]))), layout=str(rng.choice(layouts)),
                        async_op=bool(rng.random() < 0.25), wait_now=bool(rng.random() < 0.5),
                        seed=int(rng.integers(1 << 30)))
            yield Call(number, name, group, args)

    return groups, calls()


def _pass_as(x: np.ndarray, layout: str):
    """What to hand collie for ``x``'s values, and how to read the result:
    a strided view (collie works on a copy and writes it back) or a torch
    tensor sharing x's memory."""
    if layout == "strided":
        view = np.zeros(2 * x.size, x.dtype)[::2]
        view[...] = x
        return view, lambda: np.array(view)
    if layout == "torch" and x.dtype.name not in ("uint32", "uint64"):
        try:
            import torch
        except ImportError:
            return x, lambda: x
        t = torch.from_numpy(x)
        return t, lambda: t.numpy()
    return x, lambda: x


def _make_call(collie, name: str, g, members: tuple, rank: int, a: dict):
    """Make one call; returns (work or None, check) where check() says
    whether this rank's result is right once the call completed."""
    n, me = len(members), members.index(rank)
    dtype, count, root = a["dtype"], a["count"], members[a["root"]]
    op = collie.ReduceOp.PREMUL_SUM(2.0) if a["op"] == "PREMUL_SUM" else getattr(collie.ReduceOp, a["op"])
    common = dict(group=g, async_op=a["async_op"], algorithm=a["algorithm"])

    def data(who, length=count):
        return small_ints(f"{a['seed']}/{who}", length, dtype)

    def splits(length):  # uneven: per member, may be 0; even: length each
        if not a["uneven"]:
            return [length] * n
        return [int(v) for v in np.random.default_rng(a["seed"]).integers(0, length + 1, n)]

    if name == "all_reduce":
        obj, result = _pass_as(data(rank), a["layout"])
        want = reduced(op, [data(r) for r in members], n)
        return collie.all_reduce(obj, op=op, **common), lambda: same(result(), want)
    if name == "reduce":
        obj, result = _pass_as(data(rank), a["layout"])
        want = reduced(op, [data(r) for r in members], n)
        return (collie.reduce(obj, dst=root, op=op, **common),
                lambda: rank != root or same(result(), want))
    if name == "broadcast":
        obj, result = _pass_as(data(rank), a["layout"])
        return collie.broadcast(obj, src=root, **common), lambda: same(result(), data(root))
    if name == "all_gather_into_tensor":
        out = np.zeros(count * n, dtype)
        x = data(rank)
        if a["layout"] == "in_place":  # the input is this rank's block of the output
            out[me * count:(me + 1) * count] = x
            x = out[me * count:(me + 1) * count]
        want = np.concatenate([data(r) for r in members])
        return collie.all_gather_into_tensor(out, x, **common), lambda: same(out, want)
    if name == "all_gather":
        sizes = splits(count)
        outs = [np.zeros(s, dtype) for s in sizes]
        return (collie.all_gather(outs, data(rank, sizes[me]), **common),
                lambda: all(same(o, data(r, s)) for o, r, s in zip(outs, members, sizes)))
    if name in ("reduce_scatter_tensor", "reduce_scatter"):
        sizes = splits(count) if name == "reduce_scatter" else [count] * n
        total, start = sum(sizes), sum(sizes[:me])
        want = reduced(op, [data(r, total) for r in members], n)[start:start + sizes[me]]
        out, x = np.zeros(sizes[me], dtype), data(rank, total)
        if name == "reduce_scatter_tensor":
            work = collie.reduce_scatter_tensor(out, x, op=op, **common)
        else:
            bounds = np.cumsum([0] + sizes)
            work = collie.reduce_scatter(out, [x[bounds[j]:bounds[j + 1]] for j in range(n)], op=op, **common)
        return work, lambda: same(out, want)
    if name in ("all_to_all_single", "all_to_all"):
        # sent[i][j]: elements member i sends member j
        sent = np.random.default_rng(a["seed"]).integers(0, count // n + 2, (n, n)) if a["uneven"] \
            else np.full((n, n), count // n)
        inputs = {r: data(r, int(sent[i].sum())) for i, r in enumerate(members)}
        pieces = [inputs[r][int(sent[i, :me].sum()):int(sent[i, :me + 1].sum())] for i, r in enumerate(members)]
        want = np.concatenate(pieces)
        out = np.zeros(int(sent[:, me].sum()), dtype)
        if name == "all_to_all_single":
            work = collie.all_to_all_single(out, inputs[rank], [int(v) for v in sent[:, me]],
                                            [int(v) for v in sent[me]], **common)
            return work, lambda: same(out, want)
        send_at, recv_at = np.cumsum([0] + list(sent[me])), np.cumsum([0] + list(sent[:, me]))
        outs = [out[recv_at[j]:recv_at[j + 1]] for j in range(n)]
        work = collie.all_to_all(outs, [inputs[rank][send_at[j]:send_at[j + 1]] for j in range(n)], **common)
        return work, lambda: same(out, want)
    if name == "gather":
        outs = [np.zeros(count, dtype) for _ in members] if rank == root else None
        return (collie.gather(data(rank), outs, dst=root, **common),
                lambda: rank != root or all(same(o, data(r)) for o, r in zip(outs, members)))
    if name == "scatter":
        out = np.zeros(count, dtype)
        ins = [data(f"to{r}") for r in members] if rank == root else None
        return collie.scatter(out, ins, src=root, **common), lambda: same(out, data(f"to{rank}"))
    if name == "barrier":
        return collie.barrier(group=g, async_op=a["async_op"], algorithm=a["algorithm"]), lambda: True
    if name == "objects":  # pickled objects travel over byte collectives
        text = "x" * (count % 3000)

        def obj(r):
            return {"rank": r, "text": text}

        got = [None] * n
        collie.all_gather_object(got, obj(rank), group=g)
        box = [obj(rank) if rank == root else None]
        collie.broadcast_object_list(box, src=root, group=g)
        gathered = [None] * n if rank == root else None
        collie.gather_object(obj(rank), gathered, dst=root, group=g)
        scattered = [None]
        collie.scatter_object_list(scattered, [obj(f"to{r}") for r in members] if rank == root else None,
                                   src=root, group=g)
        return None, lambda: got == [obj(r) for r in members] and box[0] == obj(root) \
            and (rank != root or gathered == [obj(r) for r in members]) and scattered[0] == obj(f"to{rank}")
    if name == "ring":  # each member sends to the next one, receives from the previous
        right, left = members[(me + 1) % n], members[(me - 1) % n]
        got = np.zeros(count, dtype)
        for req in collie.batch_isend_irecv([collie.P2POp(collie.isend, data(rank), right, g),
                                             collie.P2POp(collie.irecv, got, left, g)]):
            req.wait()
        return None, lambda: same(got, data(left))
    if name == "any_source":  # the receive names no source; recv says who sent
        right, left = members[(me + 1) % n], members[(me - 1) % n]
        got = np.zeros(count, dtype)
        req = collie.isend(data(rank), right, group=g, tag=5)
        sender = collie.recv(got, group=g, tag=5)
        req.wait()
        return None, lambda: sender == left and same(got, data(left))
    raise ValueError(name)


class WrongResult(AssertionError):
    """A call completed with a result NumPy disagrees with."""


def make_groups(collie, members: list[tuple], timeout=None) -> list:
    """The program's groups, made on every rank (as new_group requires);
    the world is made anew too when ``timeout`` differs from its own."""
    made = [collie.new_group(list(m), timeout=timeout) for m in members[1:]]
    return [None if timeout is None else collie.new_group(list(members[0]), timeout=timeout)] + made


def run_calls(collie, calls: Iterable[Call], members: list[tuple], groups: list, rank: int,
              on_call=None) -> int:
    """Make ``calls`` this rank takes part in, checking each result once the
    call completed; raises WrongResult at the first wrong one. At most four
    calls are in flight; all have completed when this returns. ``on_call``
    (the Call) runs before each call this rank makes. Returns how many it made."""
    in_flight: list = []
    made = 0

    def settle():
        for work, check, what in in_flight:
            work.wait()
            if not check():
                raise WrongResult(what)
        in_flight.clear()

    for call in calls:
        number, name, group, args = call
        mine = members[group]
        if rank not in mine or (name in ("ring", "any_source") and len(mine) == 1):
            continue
        if on_call is not None:
            on_call(call)
        what = f"rank {rank}: wrong result of call {number}: {name} on ranks {list(mine)} {args}"
        work, check = _make_call(collie, name, groups[group], mine, rank, args)
        made += 1
        if work is not None:
            in_flight.append((work, check, what))
            if args["wait_now"] or len(in_flight) > 3:
                settle()
        else:
            settle()  # a blocking call: everything before it has finished too
            if not check():
                raise WrongResult(what)
    settle()
    return made


# ---- one rank ----

class Config(NamedTuple):
    """What every rank of a soak or fault run is given."""
    backend: str
    seed: int
    calls: int               # measured calls (0 for a fault run: until the fault)
    warmup: int
    max_bytes: int
    timeout: Optional[float]  # the program's groups' timeout (None: the world's)
    outdir: str


def _glibc():
    """The C library, where it has malloc_trim (glibc); else None."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.malloc_trim
        return libc
    except (OSError, AttributeError):
        return None


_libc = _glibc()


def rss_bytes() -> int:
    """This process's resident memory (/proc/self/statm) once garbage is
    collected and, with glibc, freed heap memory given back (malloc_trim):
    what the process holds, not what the allocator kept of the last large
    buffers. Untrimmed, a rank's RSS swung by 30 MiB from one moment to the
    next in a soak whose trimmed RSS held steady."""
    gc.collect()
    if _libc is not None:
        _libc.malloc_trim(0)
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def fd_count() -> int:
    return len(os.listdir("/proc/self/fd"))


def _write(cfg: Config, name: str, record: dict) -> None:
    path = os.path.join(cfg.outdir, name)
    with open(path + ".tmp", "w") as f:
        json.dump(record, f)
    os.replace(path + ".tmp", path)  # the parent never reads half a file


def _rank(rank: int, cfg: Config) -> None:
    """One rank: join, warm up, then run the measured calls (a soak) or run
    until an error (a fault run), and write what it saw to cfg.outdir."""
    import collie
    collie.init_process_group(backend=cfg.backend)
    try:
        size = collie.get_world_size()
        transport = "tcp" if cfg.backend == "tcp" else "shm"
        members, calls = program(cfg.seed, size, transport, cfg.max_bytes)
        groups = make_groups(collie, members, cfg.timeout)
        run_calls(collie, itertools.islice(calls, cfg.warmup), members, groups, rank)
        collie.barrier()
        if cfg.calls:
            _soak_rank(collie, rank, cfg, calls, members, groups)
        else:
            _fault_rank(collie, rank, cfg, calls, members, groups)
    finally:
        collie.destroy_process_group()


def _soak_rank(collie, rank: int, cfg: Config, calls, members, groups) -> None:
    rss, fds, start = rss_bytes(), fd_count(), time.monotonic()
    record = dict(rank=rank, rss_start=rss, fds_start=fds, wrong=None)
    try:
        record["made"] = run_calls(collie, itertools.islice(calls, cfg.calls), members, groups, rank)
    except WrongResult as exc:
        record["wrong"] = str(exc)
        _write(cfg, f"rank{rank}.json", record)
        raise
    collie.barrier()
    seconds = time.monotonic() - start
    record.update(seconds=seconds, calls_per_s=cfg.calls / seconds, rss_end=rss_bytes(), fds_end=fd_count())
    _write(cfg, f"rank{rank}.json", record)


def _fault_rank(collie, rank: int, cfg: Config, calls, members, groups) -> None:
    """Run the program until it raises; record the error and its moment. The
    parent signals the victim once every rank has written its ready file."""
    call = None

    def starting(this: Call) -> None:
        nonlocal call
        call = this

    _write(cfg, f"ready{rank}", {})
    try:
        run_calls(collie, calls, members, groups, rank, on_call=starting)
    except Exception as exc:  # noqa: BLE001 - whatever it is, it is the finding
        at = time.monotonic()
        _write(cfg, f"rank{rank}.json", dict(
            rank=rank, at=at, error=type(exc).__name__, message=str(exc), peer=getattr(exc, "peer", None),
            peers=list(getattr(exc, "peers", ()) or ()), call=None if call is None else call.number,
            collective=None if call is None else call.name))


# ---- a soak ----

class SoakResult(NamedTuple):
    nranks: int
    backend: str
    seed: int
    calls: int
    warmup: int
    ranks: list          # per rank: a dict (see _soak_rank)
    wrong: Optional[str]  # the first wrong result, if any
    error: Optional[str]  # what else stopped the soak, if anything

    @property
    def rss_growth(self) -> int:
        return max((r["rss_end"] - r["rss_start"] for r in self.ranks if "rss_end" in r), default=0)

    @property
    def fd_growth(self) -> int:
        return max((r["fds_end"] - r["fds_start"] for r in self.ranks if "fds_end" in r), default=0)


def soak(nranks: int = 4, calls: int = 10_000, backend: str = "auto", seed: int = 0,
         warmup: Optional[int] = None, max_bytes: int = MAX_BYTES, env=None) -> SoakResult:
    """Run ``calls`` calls of the seed's program on ``nranks`` local ranks
    after ``warmup`` (default: a tenth, 20 to 1000) and return what each
    rank measured. A wrong result is in ``.wrong``; any other failure of a
    rank in ``.error``."""
    from .bench import local_start_method
    from .launch import spawn
    if not isinstance(nranks, int) or nranks < 1:
        raise ValueError(f"soak: nranks must be a positive int, got {nranks!r}")
    if not isinstance(calls, int) or calls < 1:
        raise ValueError(f"soak: calls must be a positive int, got {calls!r}")
    warmup = min(1000, max(20, calls // 10)) if warmup is None else warmup
    with tempfile.TemporaryDirectory(prefix="collie-soak-") as outdir:
        cfg = Config(backend, seed, calls, warmup, max_bytes, None, outdir)
        error = None
        try:
            spawn(_rank, args=(cfg,), nprocs=nranks, start_method=local_start_method(), env=env)
        except Exception as exc:  # noqa: BLE001 - reported with the ranks' records
            error = f"{type(exc).__name__}: {exc}"
        ranks = [_read(outdir, f"rank{r}.json") or {"rank": r} for r in range(nranks)]
    wrong = next((r["wrong"] for r in ranks if r.get("wrong")), None)
    return SoakResult(nranks, backend, seed, calls, warmup, ranks, wrong, None if wrong else error)


def _read(outdir: str, name: str) -> Optional[dict]:
    try:
        with open(os.path.join(outdir, name)) as f:
            return json.load(f)
    except FileNotFoundError:
        return None


# ---- a fault run ----

FAULTS = {"kill": signal.SIGKILL, "stop": signal.SIGSTOP}


class FaultRun(NamedTuple):
    fault: str            # "kill" or "stop"
    backend: str
    seed: int
    timeout: float        # the groups' timeout
    victim: int
    delay: float          # seconds from every rank being ready to the signal
    survivors: dict       # rank -> its record (see _fault_rank), or None: it never raised
    exitcodes: list       # every rank's; a survivor's is 0 unless something else failed
    job_id: str
    pids: list            # every rank's process id
    shm_left: list        # /dev/shm files of the job once the survivors were gone


def fault(nranks: int = 4, kind: str = "kill", backend: str = "auto", seed: int = 0,
          timeout: Optional[float] = None, max_delay: float = 0.5, warmup: int = 20,
          max_bytes: int = MAX_BYTES, env=None, grace: float = 10.0) -> FaultRun:
    """Run the seed's program on ``nranks`` local ranks and, a random delay
    (up to ``max_delay`` s) after the warm-up, send SIGKILL or SIGSTOP to a
    random rank; wait for the others to raise and leave (``grace`` s past
    the signal, plus the timeout for a stop), then kill what is left.
    ``timeout`` is the program's groups' (default: 2 s for a stop, 60 s
    for a kill, which must be noticed long before)."""
    from .bench import local_start_method
    from .launch import spawn
    if kind not in FAULTS:
        raise ValueError(f"fault: kind must be one of {', '.join(FAULTS)}, got {kind!r}")
    if not isinstance(nranks, int) or nranks < 2:
        raise ValueError(f"fault: nranks must be an int of at least 2, got {nranks!r}")
    if timeout is None:
        timeout = 2.0 if kind == "stop" else 60.0
    rng = np.random.default_rng(seed)
    victim, delay = int(rng.integers(nranks)), float(rng.uniform(0, max_delay))
    with tempfile.TemporaryDirectory(prefix="collie-fault-") as outdir:
        cfg = Config(backend, seed, 0, warmup, max_bytes, timeout, outdir)
        ctx = spawn(_rank, args=(cfg,), nprocs=nranks, join=False, start_method=local_start_method(),
                    env=env)
        procs = ctx.processes
        try:
            _wait_ready(ctx, outdir, seed)
            time.sleep(delay)
            sent = time.monotonic()
            os.kill(procs[victim].pid, FAULTS[kind])
            others = [r for r in range(nranks) if r != victim]
            deadline = sent + grace + (timeout if kind == "stop" else 0)
            while time.monotonic() < deadline and not all(
                    os.path.exists(os.path.join(outdir, f"rank{r}.json")) or procs[r].exitcode is not None
                    for r in others):
                time.sleep(0.01)
            # Every survivor has raised: a stopped victim is killed now, so
            # that they leave at once rather than wait for it to hang up.
            _kill(procs[victim])
            for r in others:
                procs[r].join(max(0.0, deadline - time.monotonic()) + grace)
            shm_left = _shm_files(ctx.job_id)  # before the launcher's own clean-up
        finally:
            _kill(procs[victim])  # a stopped rank is only gone once killed
            try:
                ctx.join()  # stops the ranks still running, cleans up, raises the first failure
            except Exception:  # noqa: BLE001 - the victim's death at least; the exit codes tell
                pass
        survivors = {}
        for r in range(nranks):
            if r != victim:
                record = _read(outdir, f"rank{r}.json")
                if record is not None:
                    record["after"] = record["at"] - sent
                survivors[r] = record
    return FaultRun(kind, backend, seed, timeout, victim, delay, survivors, [p.exitcode for p in procs],
                    ctx.job_id, [p.pid for p in procs], shm_left)


def _kill(proc) -> None:
    if proc.exitcode is None:
        try:
            os.kill(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass  # it died just now


def _wait_ready(ctx, outdir: str, seed: int, limit: float = 120.0) -> None:
    """Until every rank has warmed up (written its ready file)."""
    deadline = time.monotonic() + limit
    while not all(os.path.exists(os.path.join(outdir, f"ready{r}")) for r in range(len(ctx.processes))):
        if time.monotonic() > deadline or any(p.exitcode is not None for p in ctx.processes):
            ctx.join(0)  # raises what a rank raised, if one failed
            raise RuntimeError(f"fault: the ranks did not all get ready (seed {seed})")
        time.sleep(0.01)


def _shm_files(job_id: str) -> list[str]:
    try:
        return sorted(n for n in os.listdir("/dev/shm") if n.startswith(f"collie-{job_id}-"))
    except FileNotFoundError:
        return []


_WANT = {"kill": "PeerError", "stop": "CollieTimeout"}


def names_victim(run: FaultRun, rec: dict) -> bool:
    """Whether a survivor raised the error its fault calls for, naming the
    victim: PeerError with the killed rank in ``.peer`` and the message, or
    CollieTimeout with the stopped rank among ``.peers`` (those that never came)."""
    if rec["error"] != _WANT[run.fault]:
        return False
    if run.fault == "kill":
        return rec["peer"] == run.victim and f"rank {run.victim}" in rec["message"]
    return run.victim in rec["peers"]


def fault_problems(run: FaultRun, bound: float = 5.0) -> list[str]:
    """What a fault run did wrong: a survivor that did not raise the error
    the fault calls for, naming the victim, within ``bound`` seconds of the
    signal (plus the timeout, for a stop); /dev/shm files left behind."""
    problems = []
    limit = bound + (run.timeout if run.fault == "stop" else 0)
    for rank, rec in run.survivors.items():
        if rec is None:
            problems.append(f"rank {rank} never raised (hung)")
            continue
        if not names_victim(run, rec):
            problems.append(f"rank {rank} raised {rec['error']} (peer={rec['peer']}, peers={rec['peers']}), "
                            f"not a {_WANT[run.fault]} naming rank {run.victim}: {rec['message']}")
        if not rec["after"] < limit:
            problems.append(f"rank {rank} raised {rec['after']:.2f}s after the signal, past {limit:g}s")
        if run.exitcodes[rank] != 0:
            problems.append(f"rank {rank} ended with exit code {run.exitcodes[rank]}")
    if run.shm_left:
        problems.append(f"/dev/shm files left: {run.shm_left}")
    return problems


# ---- the command ----

def _mib(nbytes: int) -> str:
    return f"{nbytes / (1 << 20):.1f}"


def _parse(argv: Optional[list]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="collie soak",
        description="Run a long seeded random program of collectives on local ranks, every result "
                    "checked against NumPy; report calls/s, RSS and open fds per rank. With --fault, "
                    "SIGKILL or SIGSTOP one rank at a random moment and time every other rank's error.")
    p.add_argument("-n", "--nranks", type=int, default=4, metavar="N", help="ranks (default 4)")
    p.add_argument("--calls", type=int, default=10_000, help="calls measured (default 10000)")
    p.add_argument("--warmup", type=int, default=None,
                   help="calls before measuring (default: a tenth of --calls, 20 to 1000)")
    p.add_argument("--backend", choices=("auto", "shm", "tcp"), default="auto")
    p.add_argument("--seed", type=int, default=0, help="the program (and, with --fault, victim and moment)")
    p.add_argument("--max-bytes", type=int, default=MAX_BYTES, help="largest buffers, about (default 1 MiB)")
    p.add_argument("--max-rss-growth", type=float, default=64.0, metavar="MIB",
                   help="fail when a rank's RSS grew more than this from the warm-up to the end (default 64)")
    p.add_argument("--fault", choices=tuple(FAULTS), default=None,
                   help="SIGKILL or SIGSTOP one rank a random moment after the warm-up")
    p.add_argument("--runs", type=int, default=10, help="with --fault: runs, seeds SEED.. (default 10)")
    p.add_argument("--timeout", type=float, default=None,
                   help="with --fault: the groups' timeout (default 2 s for stop, 60 s for kill)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    opts = p.parse_args(argv)
    if opts.nranks < (2 if opts.fault else 1):
        p.error(f"-n must be at least {2 if opts.fault else 1}, got {opts.nranks}")
    if opts.calls < 1 or opts.runs < 1 or (opts.warmup is not None and opts.warmup < 0):
        p.error("--calls and --runs must be positive, --warmup not negative")
    if opts.timeout is not None and not opts.timeout > 0:
        p.error(f"--timeout must be a positive number of seconds, got {opts.timeout}")
    return opts


def _soak_main(opts) -> int:
    res = soak(opts.nranks, opts.calls, opts.backend, opts.seed, opts.warmup, opts.max_bytes)
    limit = int(opts.max_rss_growth * (1 << 20))
    failed = res.wrong or res.error or res.rss_growth > limit or res.fd_growth > 0
    if opts.json:
        print(json.dumps(dict(res._asdict(), rss_growth=res.rss_growth, fd_growth=res.fd_growth,
                              max_rss_growth=limit, ok=not failed), indent=1))
    else:
        print(f"collie soak: {res.nranks} ranks, backend {res.backend}, seed {res.seed}: {res.calls} "
              f"calls after {res.warmup} warm-up, each checked against NumPy")
        print(f"{'rank':>4} {'calls/s':>8} {'made':>6} {'RSS start':>10} {'RSS end':>8} {'growth':>7} "
              f"{'fds start':>9} {'fds end':>7} {'growth':>6}   (RSS in MiB)")
        for r in res.ranks:
            if "rss_end" not in r:
                print(f"{r['rank']:>4}  (did not finish)")
                continue
            print(f"{r['rank']:>4} {r['calls_per_s']:>8.0f} {r['made']:>6} {_mib(r['rss_start']):>10} "
                  f"{_mib(r['rss_end']):>8} {'+' + _mib(r['rss_end'] - r['rss_start']):>7} "
                  f"{r['fds_start']:>9} {r['fds_end']:>7} {r['fds_end'] - r['fds_start']:>+6}")
    if res.wrong:
        _say(res.wrong)
    elif res.error:
        _say(f"failed: {res.error}")
    elif failed:
        _say(f"growth past the limits: RSS +{_mib(res.rss_growth)} MiB (limit {opts.max_rss_growth:g}), "
             f"fds {res.fd_growth:+d} (limit 0)")
    elif not opts.json:
        print(f"no wrong result; RSS growth at most +{_mib(res.rss_growth)} MiB (limit "
              f"{opts.max_rss_growth:g}), fd growth at most {res.fd_growth:+d} (limit 0)")
    return 1 if failed else 0


def _fault_main(opts) -> int:
    runs = []
    for k in range(opts.runs):
        runs.append(fault(opts.nranks, opts.fault, opts.backend, opts.seed + k, opts.timeout,
                          max_bytes=opts.max_bytes))
        if not opts.json:
            run = runs[-1]
            named = "peer" if opts.fault == "kill" else "peers"
            errors = ", ".join(f"rank {r} {rec['error']} {named}={rec[named]} {rec['after'] * 1e3:.0f} ms"
                               if rec else f"rank {r} hung" for r, rec in run.survivors.items())
            print(f"seed {run.seed}: {opts.fault} rank {run.victim} {run.delay:.2f}s after warm-up: {errors}",
                  flush=True)
    raised = [(run, rec) for run in runs for rec in run.survivors.values() if rec]
    times = sorted(rec["after"] for _, rec in raised)
    problems = [f"seed {run.seed}: {p}" for run in runs for p in fault_problems(run)]
    if opts.json:
        print(json.dumps(dict(runs=[run._asdict() for run in runs], problems=problems), indent=1))
    elif times:
        print(f"time to error after {opts.fault}, {opts.backend}, {opts.nranks} ranks, {len(runs)} runs: "
              f"{len(times)} of {sum(map(len, (run.survivors for run in runs)))} survivors raised, "
              f"{sum(names_victim(run, rec) for run, rec in raised)} a {_WANT[opts.fault]} naming the "
              f"victim; min {times[0] * 1e3:.0f} ms, median {statistics.median(times) * 1e3:.0f} ms, "
              f"max {times[-1] * 1e3:.0f} ms")
    for p in problems:
        _say(p)
    return 1 if problems else 0


def _say(text: str) -> None:
    sys.stderr.write(f"collie soak: {text}\n")
    sys.stderr.flush()


def main(argv: Optional[list] = None) -> int:
    """``collie soak``; returns the exit code."""
    opts = _parse(sys.argv[1:] if argv is None else list(argv))
    return _fault_main(opts) if opts.fault else _soak_main(opts)


if __name__ == "__main__":
    sys.exit(main())
