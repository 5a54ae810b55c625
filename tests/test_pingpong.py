"""`collie pingpong` measures every way it lists and prints one line for each."""

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import time

import pytest

_MPI = importlib.util.find_spec("mpi4py") is not None and shutil.which("mpiexec") is not None


@pytest.mark.timeout(120)
def test_pingpong_prints_every_way():
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    done = subprocess.run([sys.executable, "-m", "collie", "pingpong", "--bytes", "1048576", "--iters", "50",
                           "--reps", "2"], capture_output=True, text=True, timeout=110, env=env)
    assert done.returncode == 0, done.stderr
    rows = [line for line in done.stdout.splitlines() if not line.startswith("#")]
    names = [re.split(r"\s{2,}", row.strip())[0] for row in rows]
    assert names[:4] == ["collie shm", "collie tcp", "multiprocessing.Pipe", "TCP socket pair"]
    assert len(names) == 5 and names[4].startswith("mpi4py"), names
    if _MPI:  # the MPI row is measured, and named for its library: "mpi4py (MPICH)"
        assert re.fullmatch(r"mpi4py \(\S+\)", names[4]), rows[4]
    else:
        assert "skipped: " in rows.pop(), done.stdout
    for row in rows:
        rtt, bandwidth = map(float, re.findall(r"([\d.]+) (?:us|GB/s)", row))
        assert rtt > 0 and bandwidth > 0


def _dies_on_1(rank: int, out) -> None:
    if rank == 1:
        raise SystemExit(3)
    time.sleep(60)  # waits for a peer that is gone


@pytest.mark.timeout(30)
def test_a_rank_that_dies_is_reported_at_once():
    from collie import pingpong
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="exited with code 3"):
        pingpong._pair(_dies_on_1, lambda rank: (rank,))
    assert time.monotonic() - start < 10  # not the 300 s deadline, nor the 10 s join


def test_without_mpi4py_the_row_says_why(monkeypatch, capsys):
    from collie import pingpong
    monkeypatch.setenv("COLLIE_BENCH_HIDE", "mpi4py")
    pingpong._print_row(*pingpong._mpi4py(8, 1, 1))
    assert capsys.readouterr().out.startswith("mpi4py                  skipped: mpi4py not found: ")


@pytest.mark.timeout(30)
def test_a_failing_or_hung_mpiexec_is_reported_not_raised(monkeypatch, tmp_path):
    from collie import bench, pingpong
    monkeypatch.setattr(bench, "peer_missing", lambda peer: None)  # mpi4py or not: mpiexec is fake
    fake = tmp_path / "mpiexec"
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    fake.write_text("#!/bin/sh\necho 'no hosts to run on' >&2\nexit 7\n")
    fake.chmod(0o755)
    assert pingpong._mpi4py(8, 1, 1) == ("mpi4py", "failed: no hosts to run on")
    fake.write_text("#!/bin/sh\nexec sleep 60\n")
    monkeypatch.setattr(pingpong, "DEADLINE", 1)
    start = time.monotonic()
    assert pingpong._mpi4py(8, 1, 1) == ("mpi4py", "failed: no result within 1 s")
    assert time.monotonic() - start < 10
