"""The figures and plots of docs/scale.md, from collie.sim.

    PYTHONPATH=src python3 docs/scale.py [--out docs/scale] [--quick]
    PYTHONPATH=src python3 docs/scale.py --pack DIR     # bench runs -> docs/scale/tuner-runs.json

Writes figures.json (every number docs/scale.md quotes), model.json (the
host model fitted to this machine's bench runs) and, with matplotlib,
latency.png, crossover.png and calibration.png. It takes several minutes
on a 2-core machine (the 24,576-rank runs are timed: the issue asks for
each under 60 s; the fit is a pattern search); --quick stops at 4,096
ranks.

--pack reads `collie bench --json` files named tuner-nN-R.json (rank count
N, run R; beside each, the bench's text output tuner-nN-R.txt and, where it
was measured, tuner-nN-R.json.quiet: the CPU other processes took while it
ran) and keeps their collective rows, time per run, in tuner-runs.json.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import statistics
import sys
import time

from collie import sim
from collie.transports import shm

HERE = os.path.dirname(os.path.abspath(__file__))
PER_HOST = 8  # ranks per host, as GPUs per node in NCCL's figures


def model() -> sim.Model:
    return sim.DEFAULT_MODEL


def run(op, algo, n, size, **kw):
    t = time.perf_counter()
    r = sim.simulate(op, algo, n, size, model=model(), hosts=max(1, n // PER_HOST), **kw)
    return r, time.perf_counter() - t


RUNS = os.path.join(HERE, "scale", "tuner-runs.json")


def pack(folder: str, out: str = RUNS) -> None:
    """Keep the collective rows of the bench runs in ``folder``: per row, its time in each run."""
    rows: dict = {}
    runs: dict = {}
    for path in sorted(glob.glob(os.path.join(folder, "tuner-n*-*.json"))):
        found = re.match(r"tuner-n(\d+)-(\w+)\.json$", os.path.basename(path))
        if not found:
            continue
        n, run = found.groups()
        info = runs.setdefault(run, {"date": {}, "foreign_share": {}})
        text = path[:-len(".json")] + ".txt"
        if os.path.exists(text):
            with open(text) as f:
                info["date"][n] = next((line[7:].strip() for line in f if line.startswith("# date ")), None)
        if os.path.exists(path + ".quiet"):
            with open(path + ".quiet") as f:
                info["foreign_share"][n] = round(json.load(f)["foreign_share"], 4)
        for r in sim.read_bench_rows(path):
            key = (r["op"], r["nranks"], r["bytes"], r["algorithm"])
            rows.setdefault(key, {})[run] = round(r["time_us"], 3)
    data = {"command": "collie bench -n N --sizes 8K,16K,64K,256K,1M,4M,16M,64M --time-budget 0.3 --json "
                       "tuner-nN-R.json (N = 2, 3, 4, 6, 8; the tuner's picks)",
            # the transport the runs measured: pack in the environment that ran them
            "single_copy": int(os.environ.get("COLLIE_SHM_CMA_BYTES", shm.DEFAULT_CMA_BYTES)),
            "runs": dict(sorted(runs.items(), key=lambda kv: int(kv[0]))),
            "rows": [{"op": k[0], "nranks": k[1], "bytes": k[2], "algorithm": k[3], "us": v}
                     for k, v in sorted(rows.items())]}
    with open(out, "w") as f:  # a row a line
        f.write('{"command": %s,\n"single_copy": %d,\n"runs": %s,\n"rows": [\n'
                % (json.dumps(data["command"]), data["single_copy"], json.dumps(data["runs"])))
        f.write(",\n".join(json.dumps(r, separators=(",", ":")) for r in data["rows"]))
        f.write("\n]}\n")


def bench_runs(path: str = RUNS) -> tuple:
    """(rows as tuner-runs.json has them, run names in order, the single-copy
    threshold the runs were made with)."""
    with open(path) as f:
        data = json.load(f)
    return data["rows"], sorted(data["runs"], key=int), data["single_copy"]


def split(names: list) -> tuple:
    """The runs the model is fitted on (every other one, from the first) and
    those it is checked against (the others): both spread over the hours
    the runs took, whatever the machine was doing."""
    return names[0::2], names[1::2]


def medians(rows: list, runs: list) -> list:
    """Bench rows whose time is the median over ``runs``."""
    out = []
    for r in rows:
        times = [r["us"][k] for k in runs if k in r["us"]]
        if times:
            out.append({"backend": "collie", "op": r["op"], "nranks": r["nranks"], "bytes": r["bytes"],
                        "dtype": "float32", "algorithm": r["algorithm"], "time_us": statistics.median(times),
                        "runs": len(times)})
    return out


def noise(rows: list, names: list, fit: list, held: list) -> dict:
    """How far the measurements themselves move: run 1 against run 2, each
    run against the median of all, and the median of the fitting runs
    against that of the held-out ones (what no model can beat)."""
    def moved(a: float, b: float) -> float:
        return max(a, b) / min(a, b) - 1

    def summary(values: list) -> dict:
        return {"rows": len(values), "median": statistics.median(values),
                "over_25": sum(v > 0.25 for v in values)}

    both = [r for r in rows if names[0] in r["us"] and names[1] in r["us"]]
    out = {"run1_vs_run2": summary([moved(r["us"][names[0]], r["us"][names[1]]) for r in both])}
    single = []
    for r in rows:
        m = statistics.median(r["us"].values())
        single += [abs(t / m - 1) for t in r["us"].values()]
    out["run_vs_median"] = summary(single)
    out["fit_vs_held_medians"] = summary([moved(x["time_us"], y["time_us"])
                                          for x, y in zip(medians(rows, fit), medians(rows, held))])
    out["per_n"] = {}
    for n in sorted({r["nranks"] for r in rows}):
        sub = [r for r in rows if r["nranks"] == n]
        pair = [moved(r["us"][names[0]], r["us"][names[1]]) for r in sub if names[0] in r["us"] and names[1] in r["us"]]
        halves = [moved(x["time_us"], y["time_us"]) for x, y in zip(medians(sub, fit), medians(sub, held))]
        out["per_n"][n] = {"run1_vs_run2": summary(pair), "fit_vs_held_medians": summary(halves)}
    return out


def accuracy(pairs: list) -> dict:
    """Median |error| and rows within 25%, in all and per (op, ranks)."""
    def summary(errors: list) -> dict:
        return {"rows": len(errors), "median": statistics.median(errors), "within_25": sum(e <= 0.25 for e in errors)}

    errs = [(r, abs(p / r["measured_us"] - 1)) for r, p in ((x, x["predicted_us"]) for x in pairs)]
    out = {"all": summary([e for _, e in errs]), "per": {}}
    for op in sorted({r["op"] for r, _ in errs}):
        for n in sorted({r["n"] for r, _ in errs}):
            sub = [e for r, e in errs if r["op"] == op and r["n"] == n]
            if sub:
                out["per"][f"{op} {n}"] = summary(sub)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=os.path.join(HERE, "scale"))
    p.add_argument("--quick", action="store_true")
    p.add_argument("--pack", default=None, metavar="DIR",
                   help="pack the bench runs in DIR into tuner-runs.json, and stop")
    opts = p.parse_args(argv)
    if opts.pack:
        pack(opts.pack)
        return 0
    os.makedirs(opts.out, exist_ok=True)
    figures: dict = {"model": model().to_json(), "ranks_per_host": PER_HOST}
    top = 4096 if opts.quick else 24576
    ranks = [n for n in (8, 64, 512, 4096, 24576) if n <= top]

    # 1. latency (8 bytes) against ranks
    latency = {}
    for algo in ("ring", "tree", "dbtree", "rabenseifner"):
        for n in ranks:
            r, wall = run("all_reduce", algo, n, 8)
            latency.setdefault(algo, []).append({"n": n, "us": r.seconds * 1e6, "wall_s": wall,
                                                 "simulated": r.simulated})
            print(f"all_reduce 8 B {algo:<13} n={n:<6} {r.seconds * 1e6:10.1f} us  "
                  f"(sim {wall:.1f} s, {r.simulated} ranks simulated)", flush=True)
    figures["latency"] = latency
    big = {a: v[-1] for a, v in latency.items()}
    figures["ratio_ring_dbtree_small"] = {"n": ranks[-1], "ratio": big["ring"]["us"] / big["dbtree"]["us"]}

    # 2. where ring overtakes dbtree, by ranks
    sizes = [1 << k for k in range(10, 31, 2)]
    crossover = []
    for n in [n for n in ranks if n <= 4096]:
        found = None
        for size in sizes:
            ring, _ = run("all_reduce", "ring", n, size)
            tree, _ = run("all_reduce", "dbtree", n, size)
            if ring.seconds < tree.seconds:
                found = size
                break
        crossover.append({"n": n, "bytes": found})
        print(f"ring beats dbtree from {found} bytes at n={n}", flush=True)
    figures["crossover"] = crossover

    # 3. predicted against measured on this machine (2 cores): the host model fitted to the
    #    medians of every other bench run of the tuner's picks, checked against the medians
    #    of the others, which the fit never saw
    rows, names, single_copy = bench_runs()
    fit_runs, held_runs = split(names)
    fit_rows, held_rows = medians(rows, fit_runs), medians(rows, held_runs)
    t = time.perf_counter()
    fitted, _ = sim.calibrate(fit_rows, cores=2, base=sim.HOST_START._replace(cores=2, single_copy=single_copy))
    print(f"calibrated in {time.perf_counter() - t:.0f} s: {fitted.describe()}", flush=True)
    with open(os.path.join(opts.out, "model.json"), "w") as f:
        json.dump(fitted.to_json(), f, indent=1)
        f.write("\n")
    calibration = {"model": fitted.to_json(), "fit_runs": fit_runs, "held_runs": held_runs}
    for name, which in (("fit", fit_rows), ("held_out", held_rows)):
        calibration[name] = [{"op": r["op"], "n": r["nranks"], "bytes": r["bytes"], "algorithm": r["algorithm"],
                              "measured_us": r["time_us"], "predicted_us": s * 1e6}
                             for r, s in zip(which, sim._predict(which, fitted))]
        calibration[name + "_accuracy"] = accuracy(calibration[name])
        print(f"{name}: {calibration[name + '_accuracy']['all']}", flush=True)
    calibration["noise"] = noise(rows, names, fit_runs, held_runs)
    figures["calibration"] = calibration
    errors = calibration["held_out"]

    with open(os.path.join(opts.out, "figures.json"), "w") as f:
        json.dump(figures, f, indent=1)
        f.write("\n")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: figures.json only")
        return 0
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for algo, points in latency.items():
        ax.plot([q["n"] for q in points], [q["us"] for q in points], marker="o", label=algo)
    ax.set(xscale="log", yscale="log", xlabel="ranks (8 per host)", ylabel="predicted time (us)",
           title="all_reduce, 8 bytes: ring grows linearly, trees logarithmically")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(opts.out, "latency.png"), dpi=100)
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    ok = [c for c in crossover if c["bytes"]]
    ax.plot([c["n"] for c in ok], [c["bytes"] for c in ok], marker="o")
    ax.set(xscale="log", yscale="log", xlabel="ranks (8 per host)", ylabel="bytes",
           title="all_reduce: smallest size where ring beats dbtree")
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(os.path.join(opts.out, "crossover.png"), dpi=100)
    fig, ax = plt.subplots(figsize=(5.2, 5.2))
    for n in sorted({e["n"] for e in errors}):
        pts = [e for e in errors if e["n"] == n]
        ax.scatter([e["measured_us"] for e in pts], [e["predicted_us"] for e in pts], s=12, label=f"{n} ranks")
    lo = min(min(e["measured_us"], e["predicted_us"]) for e in errors)
    hi = max(max(e["measured_us"], e["predicted_us"]) for e in errors)
    ax.plot([lo, hi], [lo, hi], color="black", linewidth=0.8)
    ax.plot([lo, hi], [lo * 1.25, hi * 1.25], color="grey", linewidth=0.5, linestyle="--")
    ax.plot([lo, hi], [lo / 1.25, hi / 1.25], color="grey", linewidth=0.5, linestyle="--")
    ax.set(xscale="log", yscale="log", xlabel="measured (us, collie bench: median of the held-out runs)",
           ylabel="predicted (us, collie sim)",
           title="this machine (2 cores): the tuner's picks, predicted vs measured\n(dashed: 25% either way)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(opts.out, "calibration.png"), dpi=100)
    return 0


if __name__ == "__main__":
    sys.exit(main())
