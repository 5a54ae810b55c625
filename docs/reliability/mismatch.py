"""Time to MismatchError on every rank, for each way ranks can call one
collective differently (the cases of tests/test_mismatch.py), on shm and tcp.

    python docs/reliability/mismatch.py [--runs 5] [--ranks 3] [--count 16]

Prints, per case and transport, the slowest rank's time from entering the
bad call to its MismatchError (min / median / max over the runs), and in
which call the last rank found out ("the call" or "the next call": a rank
that finishes the bad call without hearing from the others, such as a
broadcast root, raises in its next one).
"""

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests"))

from harness import run_ranks  # noqa: E402
from test_mismatch import _KINDS, _mismatch_body  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--ranks", type=int, default=3)
    parser.add_argument("--count", type=int, default=16, help="float32 elements per rank")
    args = parser.parse_args()
    print(f"{'case':<16} {'transport':<9} {'min ms':>7} {'median':>7} {'max ms':>7}  last rank found out in")
    for kind in sorted(_KINDS):
        for backend in ("shm", "tcp"):
            worst, where = [], set()
            for _ in range(args.runs):
                res = run_ranks(_mismatch_body, args.ranks, kind, args.count, backend=backend,
                                timeout=60, init_kwargs={"timeout": 20})
                assert all(r[0] == "MismatchError" for r in res), res
                slowest = max(res, key=lambda r: r[4])
                worst.append(slowest[4] * 1e3)
                where.add(slowest[1])
            print(f"{kind:<16} {backend:<9} {min(worst):7.1f} {statistics.median(worst):7.1f} "
                  f"{max(worst):7.1f}  {' or '.join(sorted(where))}", flush=True)


if __name__ == "__main__":
    main()
