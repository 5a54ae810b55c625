"""The torch examples (examples/torch/) run under `collie run` and check their
own results: each rank prints one line ending in "ok" (or "WRONG")."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name,n", [("rlhf_weight_broadcast", 3), ("zero_sharded_optimizer", 2),
                                    ("zero_sharded_optimizer", 3), ("moe_all_to_all", 4),
                                    ("sharded_softmax", 2)])
def test_example(name, n):
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    res = subprocess.run([sys.executable, "-m", "collie", "run", "-n", str(n), f"examples/torch/{name}.py"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=90)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-4000:]
    lines = [line for line in res.stdout.splitlines() if line.startswith("rank ")]
    assert len(lines) == n and all(line.endswith(": ok") for line in lines), res.stdout
