"""collie.trace: per-rank Chrome traces of real runs, merged onto one clock."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from harness import run_ranks


def _traced_calls(rank, size, folder):
    import collie
    x = np.full(1000, rank + 1.0, np.float32)
    collie.all_reduce(x, algorithm="ring")           # not traced
    with collie.trace(folder):
        collie.all_reduce(x, algorithm="ring")
        collie.broadcast(x, src=0, algorithm="tree")
    collie.all_reduce(x)                             # not traced
    return float(x[0])


@pytest.mark.timeout(90)
def test_trace_context_merge_and_draw(tmp_path, executor):
    folder = str(tmp_path / "tr")
    n = 3
    results = run_ranks(_traced_calls, n, folder, timeout=60)
    assert results == [results[0]] * n  # the traced calls computed what untraced ones do
    assert sorted(os.listdir(folder)) == [f"rank-{r}.json" for r in range(n)]
    from collie.tracing import main, merge
    merged = merge(folder)
    events = merged["traceEvents"]
    calls = [e for e in events if e.get("cat") == "call"]
    assert sorted((e["pid"], e["name"], e["args"]["algorithm"]) for e in calls) == sorted(
        (r, op, a) for r in range(n) for op, a in (("all_reduce", "ring"), ("broadcast", "tree")))
    ring = [e for e in calls if e["name"] == "all_reduce"]
    assert all(e["args"]["bytes"] == 4000 and e["args"]["group"] and e["args"]["steps"] == 2 * (n - 1)
               for e in ring)
    assert len({e["args"]["seq"] for e in ring}) == 1  # one call, seen by every rank
    steps = [e for e in events if e.get("cat") == "step" and e["name"].startswith("all_reduce")]
    assert len(steps) == n * 2 * (n - 1)
    for e in steps:
        msgs = e["args"]["messages"]
        assert sorted(m["dir"] for m in msgs) == ["recv", "send"]
        assert {m["peer"] for m in msgs} == {(e["pid"] + 1) % n, (e["pid"] - 1) % n}
        assert all(m["completed"] >= m["posted"] >= 0 and m["waited"] >= 0 for m in msgs)
        assert sum(m["bytes"] for m in msgs if m["dir"] == "send") in (1336, 1332)  # 1000 floats / 3
    # every send's flow start has its receive's flow end, on the peer
    starts = {e["id"]: e for e in events if e.get("ph") == "s"}
    ends = {e["id"]: e for e in events if e.get("ph") == "f"}
    assert starts and set(starts) == set(ends)
    # calls start at 0 after the merge; each rank's clock offset was estimated
    assert min(e["ts"] for e in events if "ts" in e and e.get("ph") != "M") == 0
    for r in range(n):
        with open(os.path.join(folder, f"rank-{r}.json")) as f:
            data = json.load(f)
        assert data["clock_offset_estimated"] and abs(data["clock_offset_us"]) < 50_000  # one host
    out = tmp_path / "trace.json"
    assert main(["merge", folder, "-o", str(out)]) == 0
    from collie.draw import main as draw
    assert draw(["--trace", str(out), "-o", str(tmp_path / "run.svg")]) == 0
    assert (tmp_path / "run.svg").read_text().count("<rect") > 2 * n


def _steps_traced(rank, size, folder):
    import collie
    small = np.full(1000, rank + 1.0, np.float32)
    large = np.full(100_000, rank + 1.0)  # 800 KB: several ring slots, which the core hands to Python
    with collie.trace(folder):
        for _ in range(2):  # the second: through the lane's program, run step by step too
            collie.all_reduce(small, algorithm="recursive_doubling")
        collie.broadcast(large, src=1, algorithm="ring")
    return float(small[0]), float(large[0])


@pytest.mark.timeout(120)
def test_each_executor_traces_every_step_and_message(tmp_path, executor):
    """A traced call runs on the executor an untraced one would (the core,
    step by step, or engine.execute), and its trace says the same: every
    step with messages, each message's peer and bytes."""
    folder = str(tmp_path / "tr")
    n = 4
    assert run_ranks(_steps_traced, n, folder, timeout=90) == [(40.0, 2.0)] * n
    from collie.tracing import merge
    events = merge(folder)["traceEvents"]
    steps = [e for e in events if e.get("cat") == "step"]
    by_op: dict = {}
    for e in steps:
        by_op.setdefault((e["name"].split(" step")[0], e["pid"]), []).append(e["args"]["messages"])
    for r in range(n):
        doubling = by_op[("all_reduce", r)]
        assert len(doubling) == 2 * 2  # log2(4) exchanges per call, two calls
        for msgs in doubling:
            assert sorted((m["dir"], m["bytes"]) for m in msgs) == [("recv", 4000), ("send", 4000)]
            assert {m["peer"] for m in msgs} <= {r ^ 1, r ^ 2}
        chain = [m for msgs in by_op.get(("broadcast", r), []) for m in msgs]
        sent = sum(m["bytes"] for m in chain if m["dir"] == "send")
        got = sum(m["bytes"] for m in chain if m["dir"] == "recv")
        assert got == (0 if r == 1 else 800_000) and sent == (0 if r == 0 else 800_000), (r, chain)
        assert all(m["completed"] >= m["posted"] for m in chain)
    # every step lies inside its call, on its rank's clock, and steps follow one another
    calls = {(e["pid"], e["args"]["seq"]): e for e in events if e.get("cat") == "call"}
    last: dict = {}
    for e in sorted(steps, key=lambda e: (e["pid"], e["ts"])):
        call = calls[(e["pid"], e["args"]["seq"])]
        assert call["ts"] - 1 <= e["ts"] and e["ts"] + e["dur"] <= call["ts"] + call["dur"] + 1, (e, call)
        assert e["ts"] + 1 >= last.get(e["pid"], 0), e
        last[e["pid"]] = e["ts"] + e["dur"]


SCRIPT = """
import numpy as np
import collie
collie.init_process_group()
x = np.ones(16, np.float32)
for _ in range(3):
    collie.all_reduce(x)
assert collie.collectives.TRACE is not None
collie.destroy_process_group()
"""


@pytest.mark.timeout(120)
def test_collie_trace_environment_writes_at_exit(tmp_path):
    # COLLIE_TRACE is read when collie is imported: as `collie run` starts ranks.
    script = tmp_path / "prog.py"
    script.write_text(SCRIPT)
    folder = str(tmp_path / "env")
    src = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
    env = dict(os.environ, COLLIE_TRACE=folder, PYTHONPATH=src)
    done = subprocess.run([sys.executable, "-m", "collie", "run", "-n", "2", str(script)], env=env,
                          capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stderr
    from collie.tracing import merge
    calls = [e for e in merge(folder)["traceEvents"] if e.get("cat") == "call"]
    mine = [e for e in calls if e["name"] == "all_reduce" and e["args"]["bytes"] == 64]
    assert len(mine) == 2 * 3 and {e["pid"] for e in mine} == {0, 1}
    # the rest are collie's own calls (setup and leaving), traced as well
    assert all(e["args"]["group"] != "WORLD" or e["name"] == "barrier" for e in calls if e not in mine), calls
    for rank in (0, 1):  # every rank traced: the offsets were estimated at setup
        assert json.loads((tmp_path / "env" / f"rank-{rank}.json").read_text())["clock_offset_estimated"]


SOME_SCRIPT = """
import os, sys
import numpy as np
import collie
from collie import tracing
if os.environ["RANK"] == "0":  # only rank 0 traces: nobody may wait for the others
    tracing.install(tracing.from_environment({"COLLIE_TRACE": sys.argv[1]}))
collie.init_process_group()
x = np.ones(4, np.float32)
collie.all_reduce(x)
collie.destroy_process_group()
"""


@pytest.mark.timeout(120)
def test_a_job_traced_on_some_ranks_sets_up_without_aligning(tmp_path):
    script = tmp_path / "prog.py"
    script.write_text(SOME_SCRIPT)
    folder = tmp_path / "some"
    src = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
    env = {k: v for k, v in os.environ.items() if k != "COLLIE_TRACE"}
    env["PYTHONPATH"] = src
    done = subprocess.run([sys.executable, "-m", "collie", "run", "-n", "2", str(script), str(folder)],
                          env=env, capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stderr
    assert sorted(os.listdir(folder)) == ["rank-0.json"]
    assert not json.loads((folder / "rank-0.json").read_text())["clock_offset_estimated"]


def test_off_by_default_and_merge_errors(tmp_path):
    from collie import collectives
    from collie.tracing import from_environment, main, merge
    assert "COLLIE_TRACE" in os.environ or collectives.TRACE is None
    assert from_environment({}) is None
    with pytest.raises(ValueError, match="no rank"):
        merge(str(tmp_path))
    (tmp_path / "rank-0.json").write_text("{not json")
    with pytest.raises(ValueError, match="not a collie trace"):
        merge(str(tmp_path))
    with pytest.raises(SystemExit):
        main(["merge", str(tmp_path / "nothing")])
