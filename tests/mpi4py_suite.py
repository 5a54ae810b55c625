"""Run mpi4py's own test suite against collie's MPI, and tabulate it.

    python tests/mpi4py_suite.py -n 2 3            # every module at 2 and 3 ranks
    python tests/mpi4py_suite.py -n 2 -k test_group test_comm
    python tests/mpi4py_suite.py -n 1 2 3 4 --markdown   # the table of docs/mpi.md

What it does:

1. fetch(): downloads mpi4py's source distribution from PyPI with
   ``pip download --no-binary :all: --no-deps mpi4py==4.1.2`` into a cache
   folder under the temp dir (once), and unpacks it there.
2. make_shim(): a folder holding a package named ``mpi4py``: the sdist's
   pure-Python files (``mpi4py/__init__.py``, ``util/``, ``futures/``,
   ``run.py``...) with an ``MPI.py`` that makes ``mpi4py.MPI`` *be* collie's
   MPI module. The folder goes on the PYTHONPATH of the ranks that run the
   suite and nowhere else: nothing is installed.
3. For each test module of the sdist's ``test/`` folder (but MPI-IO, dynamic
   processes and sessions, see EXCLUDED; the GPU array backends are not
   installed, so arrayimpl leaves them out), ``collie run -n N`` starts N
   ranks of this file with ``--rank``; each loads the module with unittest,
   runs it, and writes one line per test (its id and outcome) as it goes.
   A module that runs past ``--timeout`` is stopped (its process group is
   killed) and its tests that did not report count as hung.
4. A test passes when it passed on every rank; it is skipped when mpi4py
   skipped it (on any rank); otherwise it failed (an assertion) or errored.
   A module that cannot be imported counts as one error.
5. mpi4py.futures' own tests (``demo/futures/test_futures.py``) run as
   mpi4py runs them on a world its launcher started: ``collie run -n N -m
   mpi4py.futures test_futures.py -v``, rank 0 running them and the others
   serving as its pool's workers; their outcomes come from unittest's
   verbose lines (collect_unittest).

Nothing here changes a test: the files are mpi4py's, unmodified.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

VERSION = "4.1.2"
EXCLUDED = {
    "test_file": "MPI-IO",
    "test_io": "MPI-IO",
    "test_dynproc": "dynamic processes (Connect/Accept)",
    "test_spawn": "dynamic processes (Spawn)",
}
# mpi4py.futures' own tests (demo/futures/ of the sdist), run as mpi4py's
# CI runs them on a world it started: `python -m mpi4py.futures test_futures.py`,
# rank 0 running the tests and the other ranks serving as its pool's workers.
FUTURES = "test_futures"
HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"


# ---- the sdist and the shim ----

def cache_dir() -> Path:
    return Path(os.environ.get("COLLIE_MPI4PY_CACHE") or Path(tempfile.gettempdir()) / f"collie-mpi4py-{VERSION}")


def fetch(cache: Path | None = None) -> Path:
    """The unpacked sdist (downloaded from PyPI on first use)."""
    cache = cache or cache_dir()
    root = cache / f"mpi4py-{VERSION}"
    if (root / "test" / "main.py").exists():
        return root
    cache.mkdir(parents=True, exist_ok=True)
    archive = cache / f"mpi4py-{VERSION}.tar.gz"
    if not archive.exists():
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-binary", ":all:",
                        "--no-deps", "--no-build-isolation", f"mpi4py=={VERSION}", "-d", str(cache)],
                       check=True, timeout=300)
    tmp = Path(tempfile.mkdtemp(dir=cache))
    with tarfile.open(archive) as tar:
        tar.extractall(tmp, filter="data")
    os.replace(tmp / f"mpi4py-{VERSION}", root)  # atomic: another run may be unpacking too
    shutil.rmtree(tmp, ignore_errors=True)
    return root


SHIM_MPI = '''\
"""mpi4py.MPI is collie's MPI here (made by collie's tests/mpi4py_suite.py)."""
import sys
from collie.compat import mpi as _mpi
sys.modules[__name__] = _mpi
'''


def make_shim(root: Path) -> Path:
    """A folder with the package ``mpi4py`` whose MPI is collie's (see module doc)."""
    shim = root.parent / "shim"
    pkg = shim / "mpi4py"
    if (pkg / "MPI.py").exists():
        return shim
    tmp = Path(tempfile.mkdtemp(dir=root.parent))
    shutil.copytree(root / "src" / "mpi4py", tmp / "mpi4py",
                    ignore=shutil.ignore_patterns("*.pyx", "*.pxd", "*.pxi", "*.src", "*.c", "*.h",
                                                  "include", "MPI.pyi"))
    (tmp / "mpi4py" / "MPI.py").write_text(SHIM_MPI)
    try:
        os.replace(tmp, shim)
    except OSError:  # made meanwhile by another run
        shutil.rmtree(tmp, ignore_errors=True)
    return shim


def modules(root: Path) -> list[str]:
    return sorted(p.stem for p in (root / "test").glob("test_*.py") if p.stem not in EXCLUDED) + [FUTURES]


# ---- on each rank ----

def rank_main(names: list[str], out: Path) -> None:
    """Run test modules on this rank, one line per test into out/RANK.jsonl."""
    import unittest

    rank = os.environ.get("RANK", "0")
    log = open(out / f"{rank}.jsonl", "a", buffering=1)

    def note(**kw):
        log.write(json.dumps(kw) + "\n")

    class Result(unittest.TestResult):
        def addSuccess(self, test):
            note(test=test.id(), outcome="pass")

        def addFailure(self, test, err):
            note(test=test.id(), outcome="fail", detail=self._exc_info_to_string(err, test)[-2000:])

        def addError(self, test, err):
            note(test=test.id(), outcome="error", detail=self._exc_info_to_string(err, test)[-2000:])

        def addSkip(self, test, reason):
            note(test=test.id(), outcome="skip", detail=reason)

        def addExpectedFailure(self, test, err):
            note(test=test.id(), outcome="pass")

        def addUnexpectedSuccess(self, test):
            note(test=test.id(), outcome="fail", detail="unexpected success")

        def addSubTest(self, test, subtest, err):
            if err is not None:
                kind = "fail" if issubclass(err[0], test.failureException) else "error"
                note(test=test.id(), outcome=kind, detail=self._exc_info_to_string(err, test)[-2000:])

    def ids(suite):
        for t in suite:
            if isinstance(t, unittest.TestSuite):
                yield from ids(t)
            else:
                yield t.id()

    # The GPU array backends are out of scope (collie moves host memory):
    # arrayimpl's fake GPU arrays (__cuda_array_interface__), CuPy, Numba.
    try:
        import arrayimpl
        arrayimpl.ArrayBackends[:] = [
            a for a in arrayimpl.ArrayBackends
            if not issubclass(a, getattr(arrayimpl, "BaseFakeGPUArray", ()))
            and not any(x in getattr(a, "backend", "") for x in ("cupy", "numba"))]
    except ImportError:
        pass
    devnull = open(os.devnull, "w")
    for name in names:
        try:
            suite = unittest.defaultTestLoader.loadTestsFromName(name)
        except BaseException as exc:  # noqa: BLE001 - an import error is a result
            note(module=name, import_error=f"{type(exc).__name__}: {exc}"[-2000:])
            continue
        note(module=name, tests=list(ids(suite)))
        saved = sys.stdout, sys.stderr
        sys.stdout = sys.stderr = devnull  # the tests' own chatter
        try:
            suite.run(Result())
        finally:
            sys.stdout, sys.stderr = saved
        note(module=name, done=True)
    log.close()


# ---- the driver ----

def run_module(name: str, size: int, root: Path, shim: Path, timeout: float, out: Path) -> dict:
    """Run one module at ``size`` ranks; returns {test id: outcome, ...} and notes."""
    out.mkdir(parents=True, exist_ok=True)
    futures = name == FUTURES
    tests = root / ("demo/futures" if futures else "test")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(shim), str(tests), str(SRC)])
    env.pop("MPI4PY_RC_INITIALIZE", None)
    # Dynamic processes are out of scope (EXCLUDED): tell mpi4py's tests so
    # with the switch mpi4py's own CI uses for an MPI that cannot spawn, so
    # that what merely touches Spawn (util.pool at one rank) skips as mpi4py
    # skips it there ("mpi-spawn").
    env["MPI4PY_TEST_SPAWN"] = "0"
    for v in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(v, None)
    if futures:  # the tests' file is the main script, as mpi4py.futures runs it on every rank
        cmd = [sys.executable, "-m", "collie", "run", "-n", str(size), "-m", "mpi4py.futures", "test_futures.py", "-v"]
    else:
        cmd = [sys.executable, "-m", "collie", "run", "-n", str(size), str(Path(__file__).resolve()),
               "--rank", "--out", str(out), name]
    start = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=tests, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, start_new_session=True)
    hung = False
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        hung = True
        os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate()
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # anything a rank left behind
        except ProcessLookupError:
            pass
    err = err.decode(errors="replace")
    if futures:
        return collect_unittest(name, size, err, hung, proc.returncode, time.monotonic() - start)
    return collect(name, size, out, hung, proc.returncode, err[-3000:], time.monotonic() - start)


_VERBOSE = re.compile(r"^(\w+) \(([\w.]+)\)(?: \.\.\.)? ?(.*)$")
_OUTCOMES = {"ok": "pass", "FAIL": "fail", "ERROR": "error", "expected failure": "pass",
             "unexpected success": "fail"}


def collect_unittest(name, size, err, hung, code, seconds) -> dict:
    """The outcome per test of a module that rank 0 alone runs with
    unittest's verbose output (FUTURES): each test's line ends in ok, FAIL,
    ERROR or skipped, and "Ran N tests" says how many there were."""
    res = {"module": name, "size": size, "seconds": round(seconds, 1), "hung": hung, "exit": code,
           "tests": {}, "details": {}, "import_error": None}
    pending = None  # a test whose outcome is on a later line (the test printed something)
    for line in err.splitlines():
        m = _VERBOSE.match(line)
        word = (m.group(3) if m else line).strip()
        outcome = _OUTCOMES.get(word) or ("skip" if word.startswith("skipped") else None)
        if m:
            pending = f"{m.group(2).replace('__main__.', 'test_futures.')}"
        if pending and outcome:
            res["tests"][pending] = outcome
            if outcome != "pass":
                res["details"][pending] = f"rank 0: {word}"
            pending = None
    ran = re.search(r"^Ran (\d+) tests?", err, re.M)
    missing = int(ran.group(1)) - len(res["tests"]) if ran else None
    if missing is None or missing > 0:
        res["tests"][f"{name} (unreported)"] = "hang" if hung else "error"
        res["details"][f"{name} (unreported)"] = (f"{missing} test(s) without an outcome line" if missing
                                                   else f"no 'Ran N tests' line (exit {code}): {err[-500:]}")
    return res


def collect(name, size, out, hung, code, err, seconds) -> dict:
    per_rank = []
    for r in range(size):
        lines = []
        path = out / f"{r}.jsonl"
        if path.exists():
            lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
        per_rank.append(lines)
    res = {"module": name, "size": size, "seconds": round(seconds, 1), "hung": hung, "exit": code,
           "tests": {}, "details": {}, "import_error": None}
    order: list[str] = []
    for lines in per_rank:
        for x in lines:
            if "import_error" in x:
                res["import_error"] = res["import_error"] or x["import_error"]
            elif "tests" in x and not order:
                order = x["tests"]
    # Per test, the worst outcome over its records and over the ranks.
    worst = {"pass": 0, "skip": 1, "fail": 2, "error": 3}
    outcome: dict[str, str] = {}
    seen: dict[str, set] = {}
    for r, lines in enumerate(per_rank):
        for x in lines:
            if "outcome" in x:
                t, o = x["test"], x["outcome"]
                seen.setdefault(t, set()).add(r)
                if worst[o] > worst[outcome.get(t, "pass")] or t not in outcome:
                    outcome[t] = o
                    if o != "pass":
                        res["details"][t] = f"rank {r}: {x.get('detail', '')}"
    for t in order or list(outcome):
        o = outcome.get(t)
        if o is None or (len(seen.get(t, ())) < size and o != "skip"):
            o = "hang" if hung else "error"  # a rank never reported it: it hung or died there
            res["details"].setdefault(t, "no report from every rank (hung or died)")
        res["tests"][t] = o
    if not order and not outcome and not res["import_error"]:
        res["import_error"] = f"no result (exit {code}, hung={hung}): {err[-500:]}"
    return res


def counts(res: dict) -> dict:
    c = {"pass": 0, "fail": 0, "error": 0, "skip": 0, "hang": 0}
    if res["import_error"]:
        c["error"] += 1
    for o in res["tests"].values():
        c[o] += 1
    return c


def table(results: list[dict], markdown: bool) -> str:
    sizes = sorted({r["size"] for r in results})
    mods = sorted({r["module"] for r in results})
    by = {(r["module"], r["size"]): counts(r) for r in results}
    lines = []
    if markdown:
        lines.append("| module | " + " | ".join(f"{n} rank{'s' * (n > 1)}: pass/fail/error/skip" for n in sizes)
                     + " |")
        lines.append("| --- |" + " --- |" * len(sizes))
    for m in mods:
        cells = []
        for n in sizes:
            c = by.get((m, n))
            cells.append("" if c is None else
                         f"{c['pass']}/{c['fail']}/{c['error'] + c['hang']}/{c['skip']}" + (" H" if c["hang"] else ""))
        lines.append(f"| {m} | " + " | ".join(cells) + " |" if markdown else
                     f"{m:24s} " + "  ".join(f"{x:>16s}" for x in cells))
    tot = []
    for n in sizes:
        t = {"pass": 0, "fail": 0, "error": 0, "skip": 0, "hang": 0}
        for m in mods:
            for k, v in by.get((m, n), {}).items():
                t[k] += v
        ran = t["pass"] + t["fail"] + t["error"] + t["hang"]
        tot.append((n, t, ran))
    for n, t, ran in tot:
        rate = 100.0 * t["pass"] / ran if ran else 0.0
        lines.append(f"{'**' if markdown else ''}{n} rank(s): {t['pass']} of {ran} run pass ({rate:.1f}%), "
                     f"{t['fail']} fail, {t['error']} error, {t['hang']} hung, {t['skip']} skipped"
                     f"{'**' if markdown else ''}" + ("  " if markdown else ""))
    return "\n".join(lines)


def pass_rate(results: list[dict], size: int) -> float:
    t = {"pass": 0, "fail": 0, "error": 0, "skip": 0, "hang": 0}
    for r in results:
        if r["size"] == size:
            for k, v in counts(r).items():
                t[k] += v
    ran = t["pass"] + t["fail"] + t["error"] + t["hang"]
    return t["pass"] / ran if ran else 0.0


def run_suite(sizes, names=None, timeout: float = 120.0, workdir: Path | None = None, log=None) -> list[dict]:
    root = fetch()
    shim = make_shim(root)
    names = names or modules(root)
    own = workdir is None
    workdir = workdir or Path(tempfile.mkdtemp(prefix="collie-mpi4py-run-"))
    results = []
    try:
        for n in sizes:
            for name in names:
                res = run_module(name, n, root, shim, timeout, workdir / f"{name}-{n}")
                results.append(res)
                if log:
                    c = counts(res)
                    log(f"{name} n={n}: {c} {res['seconds']}s"
                        + (f" IMPORT: {res['import_error'][:200]}" if res["import_error"] else ""))
    finally:
        if own:
            shutil.rmtree(workdir, ignore_errors=True)
    return results


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    p.add_argument("-n", type=int, nargs="+", default=[2], help="rank counts (default 2)")
    p.add_argument("-k", nargs="+", help="only these modules (test_comm ...)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per module and size")
    p.add_argument("--markdown", action="store_true", help="print the table in Markdown")
    p.add_argument("--json", help="write every test's outcome here")
    p.add_argument("--failures", action="store_true", help="print why each test failed")
    p.add_argument("names", nargs="*")
    a = p.parse_args(argv)
    if a.rank:
        rank_main(a.names, Path(a.out))
        return 0
    results = run_suite(a.n, a.k, a.timeout, log=lambda s: print(s, file=sys.stderr, flush=True))
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))
    if a.failures:
        for r in results:
            if r["import_error"]:
                print(f"== {r['module']} n={r['size']}: import: {r['import_error']}")
            for t, o in r["tests"].items():
                if o not in ("pass", "skip"):
                    print(f"== {t} n={r['size']}: {o}\n{r['details'].get(t, '')}")
    print(table(results, a.markdown))
    return 0


if __name__ == "__main__":
    sys.exit(main())
