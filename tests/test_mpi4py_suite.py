"""mpi4py's own test suite against collie's MPI, at 2 and 3 ranks.

tests/mpi4py_suite.py downloads mpi4py 4.1.2's source distribution from PyPI
(cached in the temp dir), runs its test/ modules under ``collie run`` and
tabulates them. The goal of issue #17 is 95% of the tests that run; this
test holds the floor that collie has reached (PASS_FLOOR, raised as gaps
close), so that a change that breaks what passes fails CI.

A module that runs past its time limit counts its unreported tests as hung.
The whole run is bounded by TIMEOUT seconds per module and size.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
PASS_FLOOR = {2: 0.97, 3: 0.97}   # 99.0% measured at both sizes, see docs/mpi.md; the target is 0.95
TIMEOUT = 150.0  # test_util_dtlib makes tens of thousands of datatype calls: 50-100 s on a loaded machine


def _suite():
    spec = importlib.util.spec_from_file_location("mpi4py_suite", HERE / "mpi4py_suite.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def suite():
    mod = _suite()
    try:
        mod.fetch()
    except (subprocess.SubprocessError, OSError) as exc:  # no network to PyPI: say so, do not pass
        pytest.skip(f"cannot download mpi4py's sdist from PyPI: {exc}")
    return mod


@pytest.mark.timeout(1500)  # 5 to 10 minutes a size (measured 300-600 s on a loaded 2-core machine); modules are bounded by TIMEOUT each
@pytest.mark.parametrize("size", [2, 3])
def test_mpi4py_suite(suite, size):
    results = suite.run_suite([size], timeout=TIMEOUT)
    table = suite.table(results, markdown=False)
    rate = suite.pass_rate(results, size)
    print(table)
    assert len(results) == len(suite.modules(suite.fetch()))
    assert rate >= PASS_FLOOR[size], f"{rate:.1%} of mpi4py's tests pass at {size} ranks\n{table}"


def test_harness_counts_outcomes(suite, tmp_path):
    """collect() merges ranks: the worst outcome wins, a test a rank never
    reported is an error (or hung), and an import error counts as one."""
    import json
    out = tmp_path / "m"
    out.mkdir()
    rows = {0: [{"module": "m", "tests": ["a", "b", "c", "d"]},
                {"test": "a", "outcome": "pass"}, {"test": "b", "outcome": "pass"},
                {"test": "c", "outcome": "skip", "detail": "why"}, {"test": "d", "outcome": "pass"}],
            1: [{"module": "m", "tests": ["a", "b", "c", "d"]},
                {"test": "a", "outcome": "pass"}, {"test": "b", "outcome": "fail", "detail": "x"},
                {"test": "c", "outcome": "skip", "detail": "why"}]}
    for r, lines in rows.items():
        (out / f"{r}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    res = suite.collect("m", 2, out, True, -9, "", 1.0)
    assert res["tests"] == {"a": "pass", "b": "fail", "c": "skip", "d": "hang"}
    assert suite.counts(res) == {"pass": 1, "fail": 1, "error": 0, "skip": 1, "hang": 1}
    (out / "0.jsonl").write_text(json.dumps({"module": "m", "import_error": "ImportError: x"}) + "\n")
    (out / "1.jsonl").unlink()
    res = suite.collect("m", 2, out, False, 1, "", 1.0)
    assert suite.counts(res)["error"] == 1 and suite.pass_rate([res], 2) == 0.0


def test_harness_reads_unittest_verbose_output(suite):
    """collect_unittest() (mpi4py.futures' tests, run by rank 0 alone):
    every test's outcome from its line, one that printed before its
    outcome too, and a run that stopped early is an error."""
    err = "\n".join([
        "test_a (__main__.T.test_a) ... ok",
        "test_b (__main__.T.test_b) ... FAIL",
        "test_c (__main__.T.test_c) ... worker says hello",
        "ERROR",
        "test_d (__main__.U.test_d) ... skipped 'shared-pool'",
        "----------------------------------------------------------------------",
        "Ran 4 tests in 0.1s", "", "FAILED (failures=1, errors=1)"])
    res = suite.collect_unittest("test_futures", 2, err, False, 1, 1.0)
    assert res["tests"] == {"test_futures.T.test_a": "pass", "test_futures.T.test_b": "fail",
                            "test_futures.T.test_c": "error", "test_futures.U.test_d": "skip"}
    cut = suite.collect_unittest("test_futures", 2, err.split("test_d")[0], True, -9, 1.0)
    assert suite.counts(cut) == {"pass": 1, "fail": 1, "error": 1, "skip": 0, "hang": 1}


def test_no_leftovers():
    """No rank of the suite outlives it (each module's process group is killed)."""
    if shutil.which("pgrep") is None:
        pytest.skip("no pgrep")
    found = subprocess.run(["pgrep", "-f", "mpi4py_suite.py --rank"], capture_output=True, text=True).stdout
    assert found.strip() == "", found
    assert sys.executable
