"""`collie pingpong` measures every way it lists and prints one line for each."""

import os
import re
import subprocess
import sys
import time

import pytest


@pytest.mark.timeout(120)
def test_pingpong_prints_every_way():
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    done = subprocess.run([sys.executable, "-m", "collie", "pingpong", "--bytes", "1048576", "--iters", "50",
                           "--reps", "2"], capture_output=True, text=True, timeout=110, env=env)
    assert done.returncode == 0, done.stderr
    rows = [line for line in done.stdout.splitlines() if not line.startswith("#")]
    names = [re.split(r"\s{2,}", row.strip())[0] for row in rows]
    assert names == ["collie shm", "collie tcp", "multiprocessing.Pipe", "TCP socket pair"]
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
