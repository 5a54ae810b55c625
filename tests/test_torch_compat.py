"""collie against torch.distributed itself: one random program, two backends.

tests/torch_random_program.py makes a seeded random sequence of 80 calls
(collectives with every reduce op Gloo takes, async_op=True, roots named by
global or group rank, uneven all_to_all_single, point-to-point with tags and
from any source, batch_isend_irecv, the object functions, groups from
new_group) on torch CPU tensors. It runs once under torch.distributed with
the Gloo backend and once under ``import collie as dist``, both started by
``collie run``; every rank must receive the same bytes in both, call by call.

Where torch leaves a result undefined, or Gloo cannot do a call, the program
does not look or does not call (its docstring lists what and why). This
comparison found three places where collie differed from torch: new_group
kept the order of the ranks given (torch sorts them; so does collie now),
AVG multiplied the sum by a rounded 1/n (collie now divides, as Gloo: 7/3
in float32 is 2.3333333, not 2.3333335), and a collective called by a rank
outside the group raises ValueError, where torch warns and does nothing
(collie keeps that: the call is a bug in the program). The program leaves
the last out, and complex AVG where the division is not exact (collie
divides each part by n; Gloo's complex division rounds differently).

The three runs use 2, 3 and 4 ranks; collie's side also runs once with
small shared-memory slots (the slicing paths) and once with COLLIE_ALGO=ring.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

from harness import SMALL_SHM, shm_leftovers

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                       reason="torch is not installed: no Gloo to compare collie with (pip install torch)"),
]

ROOT = Path(__file__).resolve().parents[1]
PROGRAM = ROOT / "tests" / "torch_random_program.py"
LAUNCH_TIMEOUT_S = 45  # one `collie run` of the program; a normal one takes 3-6 s here


def _launch(n: int, backend: str, seed: int, out: str, extra_env: dict) -> None:
    """``collie run -n N`` the program under ``backend``; fails the test with
    the ranks' output if it fails or outlives LAUNCH_TIMEOUT_S, and checks
    that it left nothing in /dev/shm."""
    job = uuid.uuid4().hex[:10]
    env = dict(os.environ, **extra_env)
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")  # Gloo would otherwise resolve the host name
    command = [sys.executable, "-m", "collie", "run", "-n", str(n), "--job-id", job, str(PROGRAM),
               backend, str(seed), out]
    launcher = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
    try:
        stdout, stderr = launcher.communicate(timeout=LAUNCH_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        # The launcher stops its ranks (SIGTERM, then SIGKILL) and cleans
        # /dev/shm; if it does not, killing it kills them (PR_SET_PDEATHSIG).
        launcher.send_signal(signal.SIGTERM)
        try:
            stdout, stderr = launcher.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            launcher.kill()
            stdout, stderr = launcher.communicate()
        pytest.fail(f"{backend} on {n} ranks (seed {seed}) still running after {LAUNCH_TIMEOUT_S}s:\n"
                    f"{stdout[-2000:]}\n{stderr[-4000:]}")
    finally:
        left = shm_leftovers(job)
    assert launcher.returncode == 0, (f"{' '.join(command)} failed (exit {launcher.returncode}):\n"
                                      f"{stdout[-2000:]}\n{stderr[-6000:]}")
    assert not left, f"{backend} left {left} in /dev/shm"


def _first_difference(gloo: list[list[str]], ours: list[list[str]]) -> str | None:
    """The earliest call (by number) at which some rank's line differs, said
    in words; None when every rank's lines are equal."""
    found = []  # (call number, rank, gloo's line, collie's line)
    for rank, (theirs, mine) in enumerate(zip(gloo, ours)):
        for k in range(max(len(theirs), len(mine))):
            a = theirs[k] if k < len(theirs) else "(no line)"
            b = mine[k] if k < len(mine) else "(no line)"
            if a != b:
                number = min(int(line.split()[0]) for line in (a, b) if line != "(no line)")
                found.append((number, rank, a, b))
                break
    if not found:
        return None
    number, rank, a, b = min(found)
    ranks = sorted(r for _, r, _, _ in found)
    return (f"first difference at call {number}, rank {rank} (ranks {ranks} differ):\n"
            f"  Gloo:   {a}\n  collie: {b}")


@pytest.mark.parametrize("n,seed,collie_env", [
    (2, 21, {}),
    (3, 12, SMALL_SHM),
    (4, 5, {"COLLIE_ALGO": "ring"}),
], ids=["2ranks", "3ranks-small-shm", "4ranks-ring"])
def test_a_random_program_gives_what_gloo_gives(n, seed, collie_env):
    with tempfile.TemporaryDirectory(prefix="collie-torch-compat-") as tmp:
        _launch(n, "gloo", seed, f"{tmp}/gloo", {})
        _launch(n, "collie", seed, f"{tmp}/collie", collie_env)
        gloo, ours = ([Path(f"{tmp}/{name}.{r}").read_text().splitlines() for r in range(n)]
                      for name in ("gloo", "collie"))
    assert all(gloo), f"a rank wrote no lines under Gloo: {[len(lines) for lines in gloo]}"
    difference = _first_difference(gloo, ours)
    if difference:
        pytest.fail(f"seed {seed} on {n} ranks, collie differs from Gloo: {difference}", pytrace=False)
