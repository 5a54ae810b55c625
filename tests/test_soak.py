"""`collie soak`: a short soak on shm and tcp finds no wrong result and
reports its figures (calls/s, RSS and open fds per rank); a wrong result
stops the program with a report naming the call and the rank."""

import json
import subprocess
import sys

import pytest

from harness import run_ranks

pytestmark = pytest.mark.timeout(120)


def _soak(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "collie", "soak", *args], capture_output=True,
                          text=True, timeout=110)


@pytest.mark.parametrize("nranks,backend,seed", [(2, "shm", 1), (3, "tcp", 2), (3, "shm", 3)])
def test_a_short_soak_finds_no_wrong_result_and_reports_its_figures(nranks, backend, seed):
    proc = _soak("-n", str(nranks), "--calls", "300", "--backend", backend, "--seed", str(seed), "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    res = json.loads(proc.stdout)
    assert res["ok"] and res["wrong"] is None and res["error"] is None
    assert (res["nranks"], res["backend"], res["seed"], res["calls"]) == (nranks, backend, seed, 300)
    assert [r["rank"] for r in res["ranks"]] == list(range(nranks))
    for r in res["ranks"]:
        assert r["calls_per_s"] > 0 and 0 < r["made"] <= 300
        assert r["rss_start"] > 1 << 20 and r["rss_end"] > 1 << 20
        assert r["fds_start"] > 3 and r["fds_end"] == r["fds_start"]
    assert res["rss_growth"] == max(r["rss_end"] - r["rss_start"] for r in res["ranks"])
    assert res["rss_growth"] <= res["max_rss_growth"] and res["fd_growth"] == 0


def test_the_table_names_every_figure():
    proc = _soak("-n", "2", "--calls", "100", "--backend", "shm")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    header, columns, *rows, verdict = proc.stdout.strip().splitlines()
    assert "2 ranks" in header and "100 calls" in header and "NumPy" in header
    for name in ("calls/s", "RSS start", "RSS end", "growth", "fds start", "fds end"):
        assert name in columns
    assert [row.split()[0] for row in rows] == ["0", "1"]
    assert verdict.startswith("no wrong result") and "RSS growth" in verdict and "fd growth" in verdict


def test_a_fault_run_reports_each_survivor_and_the_times():
    proc = _soak("-n", "3", "--fault", "kill", "--runs", "2", "--backend", "tcp", "--seed", "5")
    run1, run2, summary = proc.stdout.strip().splitlines()
    assert run1.startswith("seed 5: kill rank ") and run2.startswith("seed 6: kill rank "), proc.stdout
    assert run1.count(" ms") == 2 and "PeerError" in run1, run1
    assert summary.startswith("time to error after kill, tcp, 3 ranks, 2 runs: 4 of 4 survivors raised, ")
    assert "min " in summary and "median " in summary and "max " in summary, summary
    # the exit status is the verdict: 1 exactly when a survivor did not name the dead rank
    named = int(summary.split("survivors raised, ")[1].split()[0])
    assert proc.returncode == (0 if named == 4 else 1), proc.stderr
    assert proc.stderr.count("collie soak: seed ") == 4 - named, proc.stderr


def test_bad_arguments_exit_2():
    for args in (["-n", "0"], ["--calls", "0"], ["--fault", "burn"], ["-n", "1", "--fault", "kill"],
                 ["--fault", "stop", "--timeout", "-1"], ["--fault", "stop", "--timeout", "nan"]):
        proc = _soak(*args)
        assert proc.returncode == 2 and "collie soak" in proc.stderr, (args, proc.stderr)


def _wrong_body(rank, size, async_op):
    import collie
    from collie import soak
    args = dict(op="SUM", dtype="int32", algorithm="ring", uneven=False, count=10, root=0, layout="plain",
                async_op=async_op, wait_now=False, seed=1)
    calls = [soak.Call(0, "all_reduce", 0, args), soak.Call(1, "all_reduce", 0, args)]
    members, groups = [tuple(range(size))], [None]
    soak.run_calls(collie, calls[:1], members, groups, rank)  # right
    soak.same = lambda a, b: False                            # now the reference disagrees
    try:
        soak.run_calls(collie, calls[1:], members, groups, rank)
    except soak.WrongResult as exc:
        return str(exc)
    return "no error"


@pytest.mark.parametrize("async_op", [False, True])
def test_a_wrong_result_names_the_call_and_the_rank(async_op):
    for rank, text in enumerate(run_ranks(_wrong_body, 3, async_op, backend="shm")):
        assert text.startswith(f"rank {rank}: wrong result of call 1: all_reduce on ranks [0, 1, 2] "), text
        assert "'dtype': 'int32'" in text and "'algorithm': 'ring'" in text and "'seed': 1" in text, text
