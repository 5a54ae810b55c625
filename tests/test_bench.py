"""Tests of `collie bench`: the real command on 2 ranks with tiny sizes, and
its arithmetic (sizes, bus factors, the check reference) in-process.

Each command runs in its own session with a hard timeout; at the timeout the
whole session (the bench and every rank it started) is SIGKILLed.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from collie import bench
from collie.bench import JSON_KEYS, OPS, bus_factor, count_wrong, expected, layout, parse_size, pattern

pytestmark = pytest.mark.timeout(120)

COLUMNS = ["size", "count", "type", "redop", "root", "time(us)", "algbw(GB/s)", "busbw(GB/s)", "#wrong",
           "algorithm"]
TINY = ["-n", "2", "--sizes", "8,1K,64K", "--iters", "3", "--warmup", "1", "--repeats", "1"]


def _bench(*args, env=None, timeout=60) -> subprocess.CompletedProcess:
    """``python -m collie bench ARGS`` in local mode (no RANK inherited)."""
    full_env = {k: v for k, v in os.environ.items()
                if k not in ("RANK", "WORLD_SIZE", "PMI_RANK", "OMPI_COMM_WORLD_RANK")}
    full_env.update(env or {})
    proc = subprocess.Popen([sys.executable, "-m", "collie", "bench", *args], env=full_env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"collie bench {' '.join(args)} ran past {timeout}s\nstdout:\n{out}\nstderr:\n{err}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _blocks(stdout: str) -> dict:
    """{op: [row fields]} of the collie rows of each op's block."""
    blocks, op, in_collie = {}, None, False
    for line in stdout.splitlines():
        if line.startswith("# ") and line[2:].strip() in OPS:
            op, in_collie = line[2:].strip(), True
            blocks[op] = []
        elif line.startswith("# ") and " through " in line:
            in_collie = False
        elif line.startswith("#"):
            if op and "size" in line and in_collie:
                assert line.split()[1:11] == COLUMNS
        elif line.strip() and op and in_collie:
            blocks[op].append(line.split())
    return blocks


def _rows(path) -> list:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def test_every_op_checks_clean_and_writes_json(tmp_path):
    out = tmp_path / "rows.json"
    done = _bench(*TINY, "--check", "--json", str(out))
    assert done.returncode == 0, done.stderr
    assert "# nranks 2" in done.stdout and "# bound:" in done.stdout
    assert done.stdout.count("# (bound for 64 MiB buffers: moves >= ") == len(OPS)
    blocks = _blocks(done.stdout)
    assert sorted(blocks) == sorted(OPS)
    for op, rows in blocks.items():
        assert len(rows) == 3, (op, rows)
        for fields in rows:
            assert fields[8] == "0", f"{op}: #wrong in {fields}"
    rows = _rows(out)
    assert len(rows) == 3 * len(OPS)
    for r in rows:
        assert tuple(r) == JSON_KEYS
        assert r["backend"] == "collie" and r["nranks"] == 2 and r["dtype"] == "float32"
        assert r["wrong"] == 0
        assert r["busbw_GBps"] == pytest.approx(r["algbw_GBps"] * bus_factor(r["op"], 2))
        assert r["algbw_GBps"] == pytest.approx(r["bytes"] / r["time_us"] / 1e3)
    sizes = {(r["op"], r["bytes"]) for r in rows}
    assert ("all_gather", 1024) in sizes and ("all_reduce", 65536) in sizes


def test_algo_all_runs_every_all_reduce_algorithm(tmp_path):
    out = tmp_path / "rows.json"
    plot = ["--plot", str(tmp_path / "busbw.png")] if importlib.util.find_spec("matplotlib") else []
    done = _bench("-n", "2", "--op", "all_reduce", "--sizes", "4K,64K", "--iters", "2", "--warmup", "0",
                  "--repeats", "1", "--algo", "all", "--check", "--json", str(out), *plot)
    assert done.returncode == 0, done.stderr
    if plot:
        assert (tmp_path / "busbw.png").stat().st_size > 0
    algorithms = [r["algorithm"] for r in _rows(out)]
    assert len(set(algorithms)) >= 3 and "ring" in algorithms, algorithms
    assert all(r["wrong"] == 0 for r in _rows(out))


def test_registered_buffers_check_clean_and_say_so(tmp_path):
    """--registered: collie's buffers from collie.empty, said in the header
    and in every row; the sizes past the single-copy threshold read them
    through the peer's mapping."""
    out = tmp_path / "rows.json"
    done = _bench("-n", "2", "--op", "all_reduce,broadcast,reduce_scatter,sendrecv", "--sizes", "64K,4M",
                  "--iters", "2", "--warmup", "1", "--repeats", "1", "--registered", "--check", "--json", str(out))
    assert done.returncode == 0, done.stderr
    assert "# buffers: collie's from collie.empty" in done.stdout
    rows = _rows(out)
    assert len(rows) == 8 and all(r["wrong"] == 0 and r["registered"] is True for r in rows), rows
    plain = tmp_path / "plain.json"
    assert _bench(*TINY, "--op", "all_reduce", "--json", str(plain)).returncode == 0
    assert all(r["registered"] is False for r in _rows(plain))


def test_missing_peers_give_a_hint_not_a_failure():
    done = _bench("-n", "2", "--op", "broadcast", "--sizes", "8", "--iters", "1", "--warmup", "0",
                  "--repeats", "1", "--vs", "mpi4py,gloo", env={"COLLIE_BENCH_HIDE": "mpi4py,gloo"})
    assert done.returncode == 0, done.stderr
    assert "mpi4py not found: apt-get install mpich && pip install --no-binary=mpi4py mpi4py" in done.stderr
    assert "torch not found: pip install torch" in done.stderr
    assert len(_blocks(done.stdout)["broadcast"]) == 1


@pytest.mark.skipif(importlib.util.find_spec("mpi4py") is None or shutil.which("mpiexec") is None,
                    reason="needs mpi4py and mpiexec")
def test_vs_mpi4py_adds_rows_and_a_ratio_column(tmp_path):
    out = tmp_path / "rows.json"
    done = _bench("-n", "2", "--op", "all_reduce,sendrecv", "--sizes", "1K", "--iters", "2", "--warmup", "1",
                  "--repeats", "1", "--check", "--vs", "mpi4py", "--json", str(out))
    assert done.returncode == 0, done.stderr
    assert "vs mpi4py" in done.stdout and "# all_reduce through mpi4py" in done.stdout
    rows = _rows(out)
    assert {r["backend"] for r in rows} == {"collie", "mpi4py"}
    assert all(r["wrong"] == 0 for r in rows)
    assert all(f[-1].endswith("x") for f in _blocks(done.stdout)["all_reduce"])


def test_vs_python_sets_the_python_executor_beside_the_default_one(tmp_path):
    from collie import core
    out = tmp_path / "rows.json"
    done = _bench("-n", "2", "--op", "all_reduce", "--sizes", "8,300K", "--iters", "2", "--warmup", "1",
                  "--repeats", "1", "--check", "--vs", "python", "--json", str(out))
    assert done.returncode == 0, done.stderr
    assert f"executor {core.EXECUTOR}" in done.stdout.splitlines()[1]
    assert "vs python" in done.stdout and "# all_reduce through python" in done.stdout
    rows = _rows(out)
    assert sorted(r["backend"] for r in rows) == ["collie", "collie", "python", "python"]
    assert all(r["wrong"] == 0 for r in rows)


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch")
def test_vs_gloo_checks_clean_and_takes_turns_op_by_op(tmp_path):
    out = tmp_path / "rows.json"
    done = _bench("-n", "2", "--op", "all_reduce,sendrecv", "--sizes", "1K", "--iters", "2", "--warmup", "1",
                  "--repeats", "1", "--check", "--redop", "avg", "--vs", "gloo", "--json", str(out),
                  "--progress", timeout=90)
    assert done.returncode == 0, done.stderr
    assert "# sendrecv through gloo" in done.stdout
    assert done.stdout.count("# vs PEER") == 1
    # The progress lines say who ran what, in order: each op through Gloo, then collie.
    steps = [line.split(" ")[:2] for line in done.stderr.splitlines() if line.startswith(("gloo:", "collie:"))]
    assert steps == [["gloo:", "all_reduce"], ["collie:", "all_reduce"],
                     ["gloo:", "sendrecv"], ["collie:", "sendrecv"]], done.stderr
    rows = _rows(out)
    assert sorted((r["backend"], r["op"]) for r in rows) == [
        ("collie", "all_reduce"), ("collie", "sendrecv"), ("gloo", "all_reduce"), ("gloo", "sendrecv")]
    assert all(r["wrong"] == 0 for r in rows)


def test_plot_without_matplotlib_is_one_clear_line(tmp_path):
    # Hide matplotlib, installed or not, behind a package that fails to import.
    fake = tmp_path / "hide" / "matplotlib"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('hidden by the test')\n")
    path = os.pathsep.join([str(tmp_path / "hide"), os.environ.get("PYTHONPATH", "")])
    done = _bench("--plot", str(tmp_path / "p.png"), env={"PYTHONPATH": path}, timeout=30)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "collie bench: --plot needs matplotlib, which is not installed: pip install matplotlib"]


# ---- the arithmetic, in-process --------------------------------------------

def test_sizes_and_bus_factors():
    assert [parse_size(s) for s in ("8", "1K", "64K", "1M", "2G", "16kb")] == \
        [8, 1024, 65536, 1 << 20, 2 << 30, 16384]
    with pytest.raises(ValueError):
        parse_size("lots")
    assert bus_factor("all_reduce", 4) == 1.5
    assert bus_factor("all_gather", 4) == bus_factor("reduce_scatter", 4) == bus_factor("all_to_all", 4) == 0.75
    assert bus_factor("broadcast", 4) == bus_factor("reduce", 4) == bus_factor("sendrecv", 4) == 1.0
    # nccl-tests' size column: all_gather's receive buffer, reduce_scatter's send buffer.
    assert layout("all_gather", 4096, 4, 4) == (256, 256, 1024, 4096)
    assert layout("reduce_scatter", 4096, 4, 4) == (256, 1024, 256, 4096)
    assert layout("all_to_all", 4096, 4, 4) == (256, 1024, 1024, 4096)
    assert layout("all_reduce", 4096, 4, 4) == (1024, 0, 1024, 4096)
    assert layout("all_gather", 8, 4, 4).nbytes == 0  # rounded down, as nccl-tests does


# Every (reduce op, dtype) the collectives define: avg needs a floating or
# complex dtype, min/max an ordered one.
_DEFINED = [(redop, dtype) for dtype in ("int8", "float16", "float64", "complex64")
            for redop in ("sum", "prod", "min", "max", "avg")
            if not ((redop == "avg" and np.dtype(dtype).kind not in "fc")
                    or (redop in ("min", "max") and np.dtype(dtype).kind == "c"))]


@pytest.mark.parametrize("redop,dtype", _DEFINED)
def test_reference_matches_a_direct_computation(redop, dtype):
    """expected() against the collectives' definitions, written out for n=3."""
    dt = np.dtype(dtype)
    n, c = 3, 5
    ins = [pattern(q, 0, c * n, dt, redop) for q in range(n)]
    f = {"sum": np.add, "avg": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum}[redop]

    def reduced(lo, hi):
        out = f.reduce(np.stack([i[lo:hi] for i in ins]), axis=0).astype(dt)
        return (out / n).astype(dt) if redop == "avg" else out

    for r in range(n):
        def want(op):
            per_peer = op in ("all_gather", "reduce_scatter", "all_to_all")
            return expected(op, r, n, layout(op, c * (n if per_peer else 1) * dt.itemsize, dt.itemsize, n),
                            dt, redop)
        assert count_wrong(want("all_reduce"), reduced(0, c), n) == 0
        assert count_wrong(want("reduce_scatter"), reduced(r * c, (r + 1) * c), n) == 0
        assert np.array_equal(want("reduce"), want("all_reduce") if r == 0 else ins[r][:c])
        assert np.array_equal(want("all_gather"), np.concatenate([i[:c] for i in ins]))
        assert np.array_equal(want("all_to_all"), np.concatenate([i[r * c:(r + 1) * c] for i in ins]))
        assert np.array_equal(want("broadcast"), ins[0][:c])
        assert np.array_equal(want("sendrecv"), ins[(r - 1) % n][:c])


def test_count_wrong_finds_a_changed_element():
    a = pattern(0, 0, 100, np.dtype("float32"), "sum")
    b = a.copy()
    assert count_wrong(b, a, 2) == 0
    b[7] += 1
    assert count_wrong(b, a, 2) == 1
    assert count_wrong(a.astype(np.int32) + (np.arange(100) == 3), a.astype(np.int32), 2) == 1


def test_a_time_budget_warms_up_before_timing():
    """With --time-budget, a tenth of it goes to untimed calls after the
    --warmup ones (a handful leaves the first row of a run cold); every rank
    makes the calls rank 0 decides."""
    class OneRank(bench.Comm):
        def barrier(self):
            pass

        def max(self, x):
            return x

        def bcast(self, x):
            return x

    calls = []

    def call():
        calls.append(1)
        t = time.perf_counter()
        while time.perf_counter() - t < 1e-4:  # 100 us a call
            pass

    cfg = bench.Config(ops=["all_reduce"], sizes=[8], dtype="float32", redop="sum", iters=20, warmup=5,
                       repeats=3, time_budget=0.3, algo=None, check=False, transport="auto",
                       progress=False, tty=False)
    iters = bench.measure(OneRank(), call, cfg).iters
    warm = len(calls) - 3 * iters - 5
    # From the warmup calls' time per call p: iters = int(0.1 s / p), warm = int(0.03 s / p).
    assert iters <= 1000 and 0.3 * iters - 1 <= warm <= 0.3 * (iters + 1), (iters, warm)
    assert warm >= 1
    calls.clear()
    bench.measure(OneRank(), call, cfg._replace(time_budget=None))
    assert len(calls) == 5 + 3 * 20  # fixed counts: no extra warm-up


def test_memory_bound():
    # 2 ranks on 2 cores at 10 GB/s each: all_reduce moves (5n-2)S = 8S bytes at 20 GB/s -> 2.5 GB/s.
    algbw, busbw = bench.memory_bound("all_reduce", 2, 2, 10e9, 6e9)
    assert algbw == pytest.approx(2.5e9) and busbw == pytest.approx(2.5e9)
    # More ranks than cores share the cores.
    assert bench.memory_bound("all_reduce", 8, 2, 10e9, 6e9)[0] == pytest.approx(2 * 10e9 / 38)
    # Single copy: (3n-1)S = 5S bytes for 2 ranks -> algbw 4 GB/s.
    assert bench.memory_bound("all_reduce", 2, 2, 10e9, 6e9, single_copy=True)[0] == pytest.approx(4e9)
    # The fastest measured pattern sets the rate (reads alone, here).
    assert bench.memory_bound("all_reduce", 2, 2, 10e9, 6e9, 15e9, single_copy=True)[0] == pytest.approx(6e9)
    # busbw scales algbw as nccl-tests does, op by op.
    algbw, busbw = bench.memory_bound("all_gather", 4, 2, 10e9, 6e9, single_copy=True)
    assert busbw == pytest.approx(algbw * 3 / 4)
    assert bench.memory_bound("broadcast", 1, 2, 10e9, 6e9) is None  # one rank moves nothing


@pytest.mark.parametrize("op,single,shared", [
    ("all_reduce", 11, 18), ("reduce", 5, 11), ("reduce_scatter", 5, 11), ("broadcast", 6, 8),
    ("all_gather", 8, 10), ("all_to_all", 8, 14), ("sendrecv", 8, 16)])
def test_traffic_factor_for_four_ranks(op, single, shared):
    # Counted by hand for n = 4 (see memory_bound's docstring): e.g. a
    # broadcast makes 3 copies of S (6S) single copy, or 1 into the segment
    # and 3 out of it (8S); an all_to_all reads and writes each of its 4S
    # once (8S), and without single copy the 3S that cross ranks enter the
    # segment first (14S); an all_reduce without single copy: 4S read and
    # 4S written, the 3S of foreign inputs read and written once more to
    # enter the segment (6S), each result written there (1S) and read from
    # there by the 3 other ranks (3S): 18S.
    assert bench.traffic_factor(op, 4, True)[1] == single
    assert bench.traffic_factor(op, 4, False)[1] == shared
    assert set(bench.OPS) == set(bench._TRAFFIC)


def test_memory_bandwidth_measures_cores_at_once():
    rates = bench.memory_bandwidth(1 << 20, repeats=2, cores=2)
    assert len(rates) == 3 and all(r > 1e8 for r in rates)


def test_every_core_starts_each_kernel_together_and_the_slowest_sets_the_time():
    """The cores' rate at once: every repeat of every kernel starts after a
    barrier, and lasts until the slowest core is done. (The best of each
    core's own repeats is most often a repeat that ran alone: the copy rate
    of two cores at once read twice what it is on a 2-core VM.)"""
    class Barrier:
        waits = 0

        def wait(self, timeout=None):
            Barrier.waits += 1

    assert len(bench._kernel_times(1 << 16, 4, Barrier())) == 4 and Barrier.waits == 4 * 3
    # core 0 was fast while core 1 was slow and the other way round: the rate is of both at it
    each = [[(1.0, 1.0, 1.0), (2.0, 3.0, 2.0)], [(2.0, 2.5, 3.0), (1.0, 1.0, 1.0)]]
    assert bench.slowest_then_best(each) == [2.0, 2.5, 2.0]


def test_the_layers_script_of_docs_perf_runs():
    """docs/perf/layers.py reaches into collie's internals to time each layer
    of a small call (docs/performance.md quotes it): keep it working."""
    script = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "perf", "layers.py")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    done = subprocess.run([sys.executable, script, "--calls", "50", "--rounds", "1"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    rows = {line.split()[0]: line.split()[1:] for line in done.stdout.splitlines() if not line.startswith("#")}
    assert list(rows) == ["ring", "transport", "exchange", "engine", "execute", "run", "api"]
    assert all(float(cells[0]) > 0 for cells in rows.values())


def test_the_tables_script_of_docs_perf_takes_each_ratio_within_its_run(tmp_path):
    """docs/perf/tables.py makes docs/performance.md's tables from the
    bench's JSON rows: the median (range) of each run's own ratio."""
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "perf", "tables.py")
    spec = importlib.util.spec_from_file_location("perf_tables", path)
    tables = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tables)
    files = []
    # collie's busbw moves between runs; each run's peer moves with it
    for k, (ours, mpich, gloo, small_us) in enumerate([(4.0, 2.0, 1.0, 3.0), (2.0, 2.0, 0.5, 4.0),
                                                       (8.0, 2.0, 2.0, 2.0)]):
        rows = [dict(backend="collie", op="all_gather", bytes=1 << 20, busbw_GBps=ours, time_us=1.0),
                dict(backend="mpi4py", op="all_gather", bytes=1 << 20, busbw_GBps=mpich, time_us=1.0),
                dict(backend="gloo", op="all_gather", bytes=1 << 20, busbw_GBps=gloo, time_us=1.0),
                dict(backend="collie", op="all_gather", bytes=8, busbw_GBps=0.0, time_us=small_us),
                dict(backend="mpi4py", op="all_gather", bytes=8, busbw_GBps=0.0, time_us=2.0)]
        files.append(tmp_path / f"run{k}.json")
        files[-1].write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    text = tables.table([tables.load(str(f)) for f in files])
    lines = text.splitlines()
    assert lines[0] == "| op | size | collie busbw (GB/s) | collie/MPICH | collie/Gloo |"
    assert lines[2] == "| all_gather | 8 B | 3.0 us | 0.67 (0.50-1.00) | - |"  # by time: MPICH's 2 us / ours
    assert lines[3] == "| all_gather | 1 MiB | 4.00 | 2.00 (1.00-4.00) | 4.00 (4.00-4.00) |"
    assert tables.below([tables.load(str(f)) for f in files]) == []
    files[0].write_text(files[0].read_text().replace('"busbw_GBps": 4.0', '"busbw_GBps": 1.0'))
    files[2].write_text(files[2].read_text().replace('"busbw_GBps": 8.0', '"busbw_GBps": 1.5'))
    assert tables.below([tables.load(str(f)) for f in files]) == [("all_gather", "1 MiB", 0.75)]
    # the share of the bound each run printed above the op's table (its text output)
    text = tmp_path / "run.txt"
    text.write_text("# all_gather\n# (bound for 64 MiB buffers: moves >= 2nS, busbw <= 8.00 GB/s, see header)\n"
                    "# all_gather through mpi4py\n")
    assert tables.bounds(str(text)) == {"all_gather": 8.0}
    run = {("collie", "all_gather", 64 << 20): dict(busbw_GBps=6.0)}
    assert tables.bound_table([run, run], [{"all_gather": 8.0}, {"all_gather": 12.0}]).splitlines()[2] == \
        "| all_gather | 10.00 (8.00-12.00) | 6.00 (6.00-6.00) | 0.62 (0.50-0.75) |"


def _hog_pids() -> set:
    pids = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"os.getppid() == parent" in f.read():
                    pids.add(pid)
        except OSError:
            pass
    return pids


def test_percentiles_and_a_hog(tmp_path):
    """--percentiles adds p50/p99 per call (the slowest rank's); --hog runs
    CPU-bound processes throughout, says so, and leaves none behind."""
    out = tmp_path / "rows.json"
    before = _hog_pids()
    done = _bench("-n", "2", "--op", "all_reduce", "--sizes", "8,1K", "--iters", "50", "--warmup", "1",
                  "--repeats", "2", "--percentiles", "--hog", "1", "--json", str(out))
    assert done.returncode == 0, done.stderr
    assert "# load: 1 CPU-bound process(es)" in done.stdout
    header = next(line for line in done.stdout.splitlines() if "time(us)" in line and "size" in line)
    assert header.split()[10:12] == ["p50(us)", "p99(us)"], header
    rows = _rows(out)
    assert len(rows) == 2
    for r in rows:
        assert 0 < r["p50_us"] <= r["p99_us"], r
    assert _hog_pids() <= before, "a hog outlived the bench"


def test_hog_must_not_be_negative():
    done = _bench("-n", "2", "--hog", "-1")
    assert done.returncode == 2 and "--hog must not be negative" in done.stderr


@pytest.mark.parametrize("hosts,op,crossing", [
    # 2 hosts x 2 ranks: an all_reduce's two host sums cross once each way
    # (S); all_gather brings the other host's 2 blocks of S/4 in (S/2); an
    # all_to_all's 2 ranks send 2 blocks of S/4 each across (S).
    ("aabb", "all_reduce", 1.0), ("aabb", "all_gather", 0.5), ("aabb", "reduce_scatter", 0.5),
    ("aabb", "all_to_all", 1.0), ("aabb", "broadcast", 1.0), ("aabb", "reduce", 1.0),
    ("aabb", "sendrecv", 1.0),
    # 3 hosts x 1 rank: 2(K-1)/K = 4/3 for all_reduce; 2 of 3 blocks come in.
    ("abc", "all_reduce", 4 / 3), ("abc", "all_gather", 2 / 3), ("abc", "all_to_all", 2 / 3),
    # Uneven, 3 + 1 ranks: host a's 3 blocks go out (3S/4); 3 x 1 blocks of
    # S/4 cross in all_to_all; ranks interleaved over the hosts: every
    # sendrecv neighbour is elsewhere, 2 per host each way.
    ("aaab", "all_gather", 0.75), ("aaab", "all_to_all", 0.75), ("abab", "sendrecv", 2.0),
    ("aaaa", "all_reduce", 0.0), ("a", "broadcast", 0.0),
])
def test_link_bytes(hosts, op, crossing):
    assert bench.link_bytes(op, tuple(hosts), 1 << 20) == pytest.approx(crossing * (1 << 20))
