"""torch's own distributed test suite on backend collie, 2 ranks (tests/torch_suite.py).

CI runs the fixed selection ``CI_TESTS`` (every collective, sub-groups, point
to point, object collectives, futures, DDP) with the suite's gates as for
Gloo, and torch's CPU all_to_all tests with the gates as for MPI. The whole
suite (about 3 minutes) is run by hand; its figures are in docs/torch.md.
"""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("expecttest")  # torch.testing._internal needs it

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(os.path.dirname(HERE), "src")


def _suite(tmp_path, *args, timeout):
    out = tmp_path / "suite.json"
    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""),
               DISTRIBUTED_TESTS_DEFAULT_TIMEOUT="60")
    env.pop("BACKEND", None)
    proc = subprocess.run([sys.executable, os.path.join(HERE, "torch_suite.py"), *args, "--json", str(out)],
                          env=env, capture_output=True, text=True, timeout=timeout, cwd=str(tmp_path))
    assert out.exists(), proc.stdout[-4000:] + proc.stderr[-4000:]
    report = json.loads(out.read_text())
    failures = {n: o["detail"][-1500:] for n, o in report["tests"].items()
                if o["outcome"] in ("failed", "error")}
    assert proc.returncode == 0, (report["summary"], failures, report["stale"])
    return report


@pytest.mark.timeout(300)
def test_torch_suite_ci_selection(tmp_path):
    report = _suite(tmp_path, "--ci", "--as", "gloo", timeout=280)
    tests = report["tests"]
    # Every test of the selection ran (none skipped on this CPU machine) and passed.
    assert report["counts"]["passed"] == len(tests) and len(tests) >= 30, report["summary"]


@pytest.mark.timeout(120)
def test_torch_suite_cpu_all_to_all(tmp_path):
    report = _suite(tmp_path, "--as", "mpi", "-k", "test_all_to_all_single_unequal_split",
                    "-k", "test_all_to_all_complex", timeout=100)
    passed = sorted(n for n, o in report["tests"].items() if o["outcome"] == "passed")
    assert passed == ["test_all_to_all_complex", "test_all_to_all_single_unequal_split",
                      "test_all_to_all_single_unequal_split_complex",
                      "test_all_to_all_single_unequal_split_full_group"], report["summary"]
