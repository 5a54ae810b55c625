"""`collie pingpong` measures every way it lists and prints one line for each."""

import os
import re
import subprocess
import sys

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
