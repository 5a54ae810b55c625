"""torch's own distributed test suite, run on backend "collie".

    PYTHONPATH=src python tests/torch_suite.py                 # the whole suite, 2 ranks
    PYTHONPATH=src python tests/torch_suite.py --as gloo       # with the tests torch enables for Gloo
    PYTHONPATH=src python tests/torch_suite.py --as mpi -k all_to_all
    PYTHONPATH=src python tests/torch_suite.py -k barrier -k all_reduce
    PYTHONPATH=src python tests/torch_suite.py --ci --as gloo  # the fixed CI selection
    PYTHONPATH=src python tests/torch_suite.py --list          # names only

This is torch's ``test/distributed/test_distributed_spawn.py`` for a backend
torch does not know: the tests are those of the INSTALLED torch
(``torch.testing._internal.distributed.distributed_test.DistributedTest._DistTestBase``,
with ``TestDistBackend`` starting one process per rank for each test), never a
copy. Before torch's module is imported, "collie" is added to the suite's
backend-feature sets for what collie supports (``ddp``, ``subgroup``,
``plugin``), since the suite's skip decorators read them at import.

Prints one line per test and a summary ``passed N skipped N failed N``;
``--json FILE`` writes every test's outcome (and, for a failure, its error).
Exit status 0 when every failure is one of KNOWN_FAILURES (tests that cannot
pass on a backend other than Gloo, each with its reason) and none of those
passed; 1 otherwise.

``--as gloo`` decides the suite's import-time gates as for Gloo: torch enables
many CPU tests for Gloo by name only (``require_backend_is_available({"gloo"})``,
the "gpu" backend set, which Gloo runs on CPU), and these then run on collie.
``--as mpi -k all_to_all`` does the same for the CPU all_to_all tests torch
enables for MPI only. ``--backend gloo`` runs the same selection on Gloo for
reference.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
import tempfile
import time
import unittest

WORLD_SIZE = int(os.environ.get("WORLD_SIZE", "2"))

# The environment torch's suite reads at import (test_distributed_spawn.py's
# contract). Children are spawned, re-import this file, and inherit it.
# COLLIE_SUITE_AS=gloo (--as gloo): the suite's import-time gates (skip
# decorators naming backends) see this name instead of "collie", while every
# process group is still made with backend collie; see --as below.
GATE_AS = os.environ.get("COLLIE_SUITE_AS", "")
# COLLIE_SUITE_BACKEND=gloo (--backend gloo): the same run on torch's Gloo, for reference.
RUN_BACKEND = os.environ.get("COLLIE_SUITE_BACKEND", "collie")
os.environ["BACKEND"] = GATE_AS or RUN_BACKEND
os.environ["WORLD_SIZE"] = str(WORLD_SIZE)
os.environ.setdefault("INIT_METHOD", "env://")
if "TEMP_DIR" not in os.environ:  # replaced per test by TestDistBackend.setUp
    os.environ["TEMP_DIR"] = tempfile.gettempdir()
# torch's per-test limit (default 300 s) for the parent joining the ranks
os.environ.setdefault("DISTRIBUTED_TESTS_DEFAULT_TIMEOUT", "120")
# One token for the ranks of every test, as `collie run` would make.
os.environ.setdefault("COLLIE_TOKEN", secrets.token_hex(16))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import collie.torch  # noqa: E402,F401 - registers "collie" (also done by the entry point)
from torch.testing._internal import common_distributed  # noqa: E402

# What collie supports, in the suite's own terms. Not "gpu"/"cuda": collie
# serves CPU tensors only.
for _feature in ("ddp", "subgroup", "plugin"):
    common_distributed.DistTestCases.backend_feature[_feature].add("collie")

from torch.testing._internal.distributed import distributed_test  # noqa: E402
from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    DistributedTest,
    TestDistBackend,
)

if GATE_AS:
    # The gates are decided; from here on (init_process_group, the checks
    # tests make as they run) the backend is collie.
    distributed_test.BACKEND = RUN_BACKEND
    os.environ["BACKEND"] = RUN_BACKEND


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    """torch's TestDistBackendWithSpawn, on backend collie.

    The ranks of each test are forked from this process (which has imported
    torch already) unless COLLIE_SUITE_SPAWN=1: spawning, as torch's
    test_distributed_spawn.py does, re-imports torch in every rank of every
    test, 8-15 s each on this shared 2-core machine. torch ran the same suite
    forked for Gloo until 2.0 (test_distributed_fork.py)."""

    def setUp(self):
        super().setUp()
        if os.environ.get("COLLIE_SUITE_SPAWN") == "1":
            self._spawn_processes()
        else:
            self._start_processes(torch.multiprocessing.get_context("fork").Process)


# The CI selection (--ci, with --as gloo): a fixed list, not a pattern, so
# that a torch upgrade adding tests does not silently change what CI runs.
# One or two tests of every collective, sub-groups, point to point, object
# collectives, futures, the profilers, DDP. The whole suite runs locally in
# about 3 minutes (docs/torch.md); these in about 40 s.
CI_TESTS = [
    "test_Backend_enum_class", "test_get_backend", "test_get_rank_size_group", "test_destroy_group",
    "test_all_reduce_max", "test_all_reduce_full_group_sum", "test_all_reduce_sum_async",
    "test_all_reduce_sum_complex", "test_all_reduce_complex_unsupported_ops",
    "test_all_reduce_coalesced_product", "test_sparse_all_reduce_sum", "test_broadcast",
    "test_reduce_full_group_min", "test_reduce_sum_twice", "test_all_gather",
    "test_all_gather_coalesced_with_empty", "test_all_gather_object_subgroup", "test_gather_checks",
    "test_scatter_checks", "test_scatter_object_list", "test_barrier_full_group", "test_send_recv_with_tag",
    "test_send_recv_any_source", "test_isend", "test_irecv", "test_send_recv_torch_profiler",
    "test_batch_isend_irecv_gloo_tags", "test_get_future", "test_DistributedDataParallelCPU",
    "test_DistributedDataParallel_requires_grad", "test_ddp_create_graph", "test_static_graph_api_cpu",
    "test_grads_same_across_ranks_with_no_sync",
]

# Tests that run on collie (with --as gloo) and cannot pass, and why; listed
# in docs/torch.md. The run fails if one of them passes (the list must not
# go stale) or if a test not listed here fails.
KNOWN_FAILURES = {
    "test_monitored_barrier_gloo":
        "torch's dist.monitored_barrier raises ValueError for any backend but Gloo, by name",
    "test_monitored_barrier_gloo_subgroup":
        "torch's dist.monitored_barrier raises ValueError for any backend but Gloo, by name",
    "test_monitored_barrier_gloo_rank_0_timeout":
        "expects Gloo's message 'Rank 0 timed out in monitoredBarrier' for a zero timeout; collie "
        "takes timedelta(0) as 'no timeout of its own' and reports the peer that left",
    "test_barrier_timeout_full_group":
        "matches Gloo's wording ' (Timed out|closed|timeout) '; collie raises CollieTimeout "
        "('... timed out after 1s: rank(s) [1] never arrived') at the 1 s timeout the test checks",
    "test_accumulate_gradients_no_sync":
        "the test builds its model only when BACKEND is 'mpi', 'gloo' or 'nccl' (UnboundLocalError)",
    "test_accumulate_gradients_no_sync_allreduce_hook":
        "the test builds its model only when BACKEND is 'mpi', 'gloo' or 'nccl' (UnboundLocalError)",
    "test_accumulate_gradients_no_sync_allreduce_with_then_hook":
        "the test builds its model only when BACKEND is 'mpi', 'gloo' or 'nccl' (UnboundLocalError)",
    "test_accumulate_gradients_no_sync_grad_is_view":
        "the test builds its model only when BACKEND is 'mpi', 'gloo' or 'nccl' (UnboundLocalError)",
}


def _names() -> list[str]:
    loader = unittest.TestLoader()
    return list(loader.getTestCaseNames(TestDistBackendWithSpawn))


class _Result(unittest.TestResult):
    """Records each test's outcome and prints a line as each one ends."""

    def __init__(self, stream, verbose: bool):
        super().__init__()
        self.stream = stream
        self.verbose = verbose
        self.outcomes: dict[str, dict] = {}
        self._start = 0.0

    def startTest(self, test):  # noqa: N802
        super().startTest(test)
        self._start = time.monotonic()

    def _record(self, test, outcome: str, detail: str = "") -> None:
        name = test.id().split(".")[-1]
        seconds = time.monotonic() - self._start
        self.outcomes[name] = {"outcome": outcome, "seconds": round(seconds, 2), "detail": detail}
        line = f"{outcome:7s} {seconds:6.1f}s {name}"
        if outcome == "skipped" and detail:
            line += f"  ({detail})"
        print(line, file=self.stream, flush=True)
        if outcome in ("failed", "error") and self.verbose:
            print(detail, file=self.stream, flush=True)

    def addSuccess(self, test):  # noqa: N802
        super().addSuccess(test)
        self._record(test, "passed")

    def addSkip(self, test, reason):  # noqa: N802
        super().addSkip(test, reason)
        self._record(test, "skipped", str(reason))

    def addFailure(self, test, err):  # noqa: N802
        super().addFailure(test, err)
        self._record(test, "failed", self._exc_info_to_string(err, test))

    def addError(self, test, err):  # noqa: N802
        super().addError(test, err)
        self._record(test, "error", self._exc_info_to_string(err, test))

    def addExpectedFailure(self, test, err):  # noqa: N802
        super().addExpectedFailure(test, err)
        self._record(test, "passed")  # torch's own expectedFailure marks

    def addUnexpectedSuccess(self, test):  # noqa: N802
        super().addUnexpectedSuccess(test)
        self._record(test, "failed", "unexpected success")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-k", action="append", default=[], help="run the tests whose name contains this "
                    "(repeatable; any matches)")
    ap.add_argument("--ci", action="store_true", help="run the fixed CI selection")
    ap.add_argument("--as", dest="gate_as", metavar="BACKEND", help="decide the suite's import-time "
                    "gates as for this backend (e.g. gloo: run the tests torch enables for Gloo only, "
                    "or for its 'gpu' backend set, which Gloo runs on CPU), still on backend collie")
    ap.add_argument("--backend", default="collie", choices=["collie", "gloo"],
                    help="run on this backend (gloo: torch's own, for reference)")
    ap.add_argument("--list", action="store_true", help="print the selected tests' names and exit")
    ap.add_argument("--json", help="write every test's outcome to this file")
    ap.add_argument("-v", "--verbose", action="store_true", help="print each failure's error as it happens")
    args = ap.parse_args(argv)
    if (args.gate_as or "") != GATE_AS or args.backend != RUN_BACKEND:
        # the gates are fixed at import: start again with them
        env = dict(os.environ, COLLIE_SUITE_AS=args.gate_as or "", COLLIE_SUITE_BACKEND=args.backend)
        env.pop("BACKEND", None)
        os.execve(sys.executable, [sys.executable, os.path.abspath(__file__)] + list(argv or sys.argv[1:]), env)

    names = _names()
    if args.ci:
        missing = sorted(set(CI_TESTS) - set(names))
        if missing:
            print(f"the CI selection names tests this torch does not have: {missing}", file=sys.stderr)
            return 2
        names = [n for n in names if n in CI_TESTS]
    if args.k:
        names = [n for n in names if any(k in n for k in args.k)]
    if args.list:
        print("\n".join(names))
        return 0

    suite = unittest.TestSuite(TestDistBackendWithSpawn(n) for n in names)
    result = _Result(sys.stdout, args.verbose)
    t0 = time.monotonic()
    suite.run(result)
    counts = {k: 0 for k in ("passed", "skipped", "failed", "error")}
    for o in result.outcomes.values():
        counts[o["outcome"]] += 1
    failed = sorted(n for n, o in result.outcomes.items() if o["outcome"] in ("failed", "error"))
    unlisted = [n for n in failed if n not in KNOWN_FAILURES]
    stale = sorted(n for n, o in result.outcomes.items() if o["outcome"] == "passed" and n in KNOWN_FAILURES)
    if RUN_BACKEND != "collie":
        unlisted, stale = failed, []
    gates = f" (gates as for {GATE_AS})" if GATE_AS else ""
    summary = (f"torch {torch.__version__} distributed suite, backend {RUN_BACKEND}{gates}, {WORLD_SIZE} ranks, "
               f"{len(names)} tests in {time.monotonic() - t0:.0f}s: passed {counts['passed']} "
               f"skipped {counts['skipped']} failed {counts['failed'] + counts['error']} "
               f"({len(failed) - len(unlisted)} of them listed in KNOWN_FAILURES)")
    for n in failed:
        print(f"  failed: {n}: {KNOWN_FAILURES.get(n, 'NOT LISTED') if RUN_BACKEND == 'collie' else ''}")
    for n in stale:
        print(f"  passed but listed in KNOWN_FAILURES (remove it there and in docs/torch.md): {n}")
    print(summary, flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"summary": summary, "counts": counts, "unlisted_failures": unlisted, "stale": stale,
                       "tests": result.outcomes}, f, indent=1)
    return 0 if not unlisted and not stale else 1


if __name__ == "__main__":
    sys.exit(main())
