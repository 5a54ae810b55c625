"""What tracing costs a collective: 2 ranks, all_reduce, traced and untraced
calls in alternating blocks (the order swapped every other pair), the median
of the paired ratios.

    PYTHONPATH=src python3 docs/perf/trace_overhead.py [--bytes 1048576] [--calls 10] [--blocks 150] [--null]

--null traces neither arm: the ratio it prints is the noise floor of this
machine (docs/scale.md and the trace section of the report quote both).
"""

import argparse
import statistics
import tempfile
import time

import numpy as np

import collie


def body(rank, nbytes, blocks, calls, folder, null):
    collie.init_process_group()
    x = np.zeros(max(1, nbytes // 4), np.float32)
    for _ in range(20):
        collie.all_reduce(x)
    off, on = [], []
    for k in range(blocks):
        for traced in (False, True) if k % 2 == 0 else (True, False):
            collie.barrier()
            if traced and not null:
                with collie.trace(folder, align_clocks=False):
                    t = time.perf_counter()
                    for _ in range(calls):
                        collie.all_reduce(x)
                    dt = time.perf_counter() - t
            else:
                t = time.perf_counter()
                for _ in range(calls):
                    collie.all_reduce(x)
                dt = time.perf_counter() - t
            (on if traced else off).append(dt / calls)
    if rank == 0:
        paired = statistics.median(y / x for x, y in zip(off, on))
        print(f"all_reduce {nbytes} bytes, 2 ranks: untraced {statistics.median(off) * 1e6:.1f} us, "
              f"traced{' (null: not really)' if null else ''} {statistics.median(on) * 1e6:.1f} us per call; "
              f"median paired ratio {paired - 1:+.1%} over {blocks} pairs of {calls}-call blocks")
    collie.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bytes", type=int, default=1 << 20)
    p.add_argument("--calls", type=int, default=10)
    p.add_argument("--blocks", type=int, default=150)
    p.add_argument("--null", action="store_true")
    opts = p.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        collie.spawn(body, args=(opts.bytes, opts.blocks, opts.calls, folder, opts.null), nprocs=2)


if __name__ == "__main__":
    main()
