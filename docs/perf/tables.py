"""The tables of docs/performance.md from `collie bench --json` rows: per op
and size, collie's busbw (an 8-byte row: its time per call) and its ratio
to each peer of the run (`--vs mpi4py,gloo,python`: MPICH, Gloo, collie's
own Python executor), as the median (range) of the runs given.

    python docs/perf/tables.py docs/perf/runs/vs-n2-{1,2,3}.json

Where each run's printed output lies beside its JSON (vs-n2-1.txt), a
second table gives collie's busbw at 64 MiB as a share of the memory bound
that run printed.

A ratio is taken within one run, whose peers took turns with collie op by
op, never between rows of different runs: the machine is shared and its
speed drifts.
"""

import argparse
import json
import os
import statistics
from collections import defaultdict

from collie.bench import OPS  # the bench's ops, in its order


def load(path: str) -> dict:
    """(backend, op, bytes) -> the row (`collie bench --json` writes one per line)."""
    rows = {}
    with open(path) as f:
        for line in f:
            if line.strip():
                row = json.loads(line)
                rows[row["backend"], row["op"], row["bytes"]] = row
    return rows


def size_name(nbytes: int) -> str:
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift and nbytes % (1 << shift) == 0:
            return f"{nbytes >> shift} {unit}"
    return f"{nbytes} B"


def median_range(values: list, digits: int = 2) -> str:
    if not values:
        return "-"
    med = statistics.median(values)
    if len(values) == 1:
        return f"{med:.{digits}f}"
    return f"{med:.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def ratio(ours: dict, theirs: dict, small: bool) -> float:
    """How many times faster ours was: by time for an 8-byte row (its busbw
    rounds to nothing), else by busbw."""
    if small:
        return theirs["time_us"] / ours["time_us"]
    return ours["busbw_GBps"] / theirs["busbw_GBps"] if theirs["busbw_GBps"] else float("inf")


PEERS = {"mpi4py": "MPICH", "gloo": "Gloo", "python": "Python executor"}


def table(runs: list) -> str:
    keys = sorted({(op, nbytes) for run in runs for (backend, op, nbytes) in run if backend == "collie"},
                  key=lambda k: (list(dict.fromkeys(op for run in runs for (_, op, _) in run)).index(k[0]), k[1]))
    peers = [p for p in PEERS if any(b == p for run in runs for (b, _, _) in run)]
    head = ["op", "size", "collie busbw (GB/s)"] + [f"collie/{PEERS[p]}" for p in peers]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for op, nbytes in keys:
        small = nbytes < 1024
        ours = [run[("collie", op, nbytes)] for run in runs if ("collie", op, nbytes) in run]
        cells = [op, size_name(nbytes),
                 f"{statistics.median(r['time_us'] for r in ours):.1f} us" if small
                 else f"{statistics.median(r['busbw_GBps'] for r in ours):.2f}"]
        for peer in peers:
            cells.append(median_range([ratio(run[("collie", op, nbytes)], run[(peer, op, nbytes)], small)
                                       for run in runs
                                       if ("collie", op, nbytes) in run and (peer, op, nbytes) in run]))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def bounds(text_path: str) -> dict:
    """op -> the busbw bound (GB/s, for 64 MiB) that a run's text output
    printed above the op's table."""
    found, op = {}, None
    with open(text_path) as f:
        for line in f:
            if line.startswith("# ") and line[2:].strip() in OPS:
                op = line[2:].strip()
            elif op and "busbw <=" in line:
                found[op] = float(line.split("busbw <=")[1].split()[0])
    return found


def bound_table(runs: list, limits: list, nbytes: int = 64 << 20) -> str:
    """collie's busbw at ``nbytes`` as a share of the bound each run printed:
    median (range)."""
    lines = ["| op | bound (GB/s) | collie busbw (GB/s) | share of the bound |", "|---|---|---|---|"]
    for op in OPS:
        pairs = [(run[("collie", op, nbytes)]["busbw_GBps"], limit[op]) for run, limit in zip(runs, limits)
                 if ("collie", op, nbytes) in run and op in limit]
        if pairs:
            lines.append(f"| {op} | {median_range([b for _, b in pairs])} | {median_range([c for c, _ in pairs])} | "
                         f"{median_range([c / b for c, b in pairs])} |")
    return "\n".join(lines)


def below(runs: list, peer: str = "mpi4py", least: int = 64 << 10) -> list:
    """(op, size, median ratio) of the rows from ``least`` bytes whose median
    ratio to ``peer`` is under 1."""
    by = defaultdict(list)
    for run in runs:
        for (backend, op, nbytes), row in run.items():
            if backend == "collie" and nbytes >= least and (peer, op, nbytes) in run:
                by[op, nbytes].append(ratio(row, run[(peer, op, nbytes)], False))
    return [(op, size_name(n), statistics.median(v)) for (op, n), v in by.items() if statistics.median(v) < 1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", help="the bench's --json files, one per run")
    args = p.parse_args()
    runs = [load(path) for path in args.runs]
    print(table(runs))
    texts = [path[:-len(".json")] + ".txt" for path in args.runs]  # the run's printed output, beside it
    if all(os.path.exists(t) for t in texts):
        print("\n" + bound_table(runs, [bounds(t) for t in texts]))
    slow = below(runs)
    if slow:
        print("\nbelow MPICH (median) from 64 KiB: " + ", ".join(f"{op} {size} {r:.2f}x" for op, size, r in slow))


if __name__ == "__main__":
    main()
