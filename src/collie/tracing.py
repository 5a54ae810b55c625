"""Traces of real runs, in Chrome Trace Event JSON (ui.perfetto.dev, chrome://tracing).

The module is collie.tracing; collie.trace is its context manager, trace().

    COLLIE_TRACE=/tmp/tr collie run -n 4 train.py      # every rank traces all its collectives
    with collie.trace("/tmp/tr"):                      # or part of a program (every rank of the
        collie.all_reduce(x)                           # default group enters it: see trace())
    collie trace merge /tmp/tr -o trace.json           # one file, clocks aligned
    collie draw --trace trace.json -o run.svg          # or open trace.json in ui.perfetto.dev

Each rank writes DIR/rank-R.json (R its global rank): its events, and its
clock's offset from rank 0's. Per collective call:

- a "call" span (thread 0): op, algorithm, segments, bytes, group, sequence
  number, steps;
- a "step" span (thread 1) per step that exchanges messages, with every
  message of the step in its args: peer, bytes, direction, when it was
  posted, when it completed and how long the rank waited for it;
- a flow arrow (Perfetto draws it) from each send to its receive, matched
  as the transports match them: the j-th message of the call between two
  ranks.

A traced call runs on the executor an untraced one would, lanes included.
On the compiled core, the core stamps each step's start and end itself
(two clock reads per step, in C); a step it hands to Python ends when
Python finished it. Under engine.execute, a step's messages are posted
together and waited for together (Network.exchange), so a message's
completion is when its step's wait ended. Either way the trace times
steps, and messages to the step; on the core a step's span includes its
local copies and reductions, under engine.execute they fall between steps.

Overhead: off, one test of a module global per call (collectives._execute,
and the lane of a repeated call); on, a tuple and the step times per call
while the program runs; the JSON is made and written when tracing ends (or
at exit, for COLLIE_TRACE). docs/perf/trace_overhead.py measures it end to
end: 1 MiB all_reduce on 2 ranks of the shared 2-core machine of this work
ran 3.8%, 7.5% and 9.0% slower traced, in runs whose null check (neither
arm traced) read -0.3% (docs/scale.md).

Clocks: timestamps are time.time() (microseconds since the epoch), which
ranks on one host share. trace() with a process group estimates each rank's
offset from rank 0 with a few ping-pongs (the one with the shortest round
trip, as NTP does); `merge` subtracts it. Under COLLIE_TRACE the ranks do
the same at the end of init_process_group when every rank traces (each
counts itself in the store before setup's last barrier, so all know after
it whether the others will answer); when only some do, nobody waits for the
others and ranks on different hosts are as aligned as their system clocks.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import glob
import json
import os
import sys
import threading
import time
import zlib
from typing import Optional

import numpy as np

from . import core, engine

__all__ = ["Tracer", "trace", "merge", "main"]


def _now_us() -> float:
    return time.time() * 1e6


def _described(call: dict) -> dict:
    """A traced call's fields, from what Tracer.execute kept of it."""
    name, prepared, group, seq, tag, rank = call["what"]
    plan = prepared.program.plan
    info = dict(op=name, algorithm=prepared.choice.algorithm, segments=prepared.choice.segments,
                bytes=prepared.program.dtype.itemsize * max(plan.counts.get("out", 0), plan.counts.get("in", 0)),
                group=group, seq=seq, steps=prepared.nsteps, tag=tag, rank=rank)
    if "error" in call:
        info["error"] = call["error"]
    return info


def _messages(program, step) -> tuple[list, list]:
    """A bound step's sends [(peer, bytes)] and receives [(peer, bytes,
    whether it reduces)], as _TracedNetwork records an exchange's."""
    itemsize, counts = program.dtype.itemsize, program.plan.counts

    def nbytes(m) -> int:
        if m.buf is None:
            return 0 if m.staged is None else m.staged.count * itemsize
        return (counts[m.buf] * itemsize if m.hi is None else m.hi) - m.lo
    return ([(m.peer, nbytes(m)) for m in step.sends],
            [(m.peer, nbytes(m), m.combine is not None or (m.staged is not None and m.staged.reduce))
             for m in step.recvs])


class _TracedNetwork:
    """The network as engine.execute sees it, recording each exchange.

    Between two exchanges a rank's peers may be waiting for it (and a peer
    that waits long enough goes to sleep, which costs a wake-up), so the
    recording does the least it can: two clock reads and one tuple per
    step; events() turns them into JSON when the trace is written."""

    def __init__(self, network, raw: list, call: dict):
        self._network = network
        self._raw = raw
        self._call = call

    def __getattr__(self, name):
        return getattr(self._network, name)

    def exchange(self, recvs, sends, tag, meta, timeout, describe, step, call, inflight=()) -> None:
        posted = time.time()
        try:
            self._network.exchange(recvs, sends, tag, meta, timeout, describe, step, call, inflight)
        finally:
            self._raw.append((self._call, step, posted, time.time(),
                              [(peer, len(data)) for peer, data in sends],
                              [(peer, len(dst), combine is not None) for peer, dst, combine in recvs]))


class Tracer:
    """Collects one process's events and writes them to ``folder``."""

    def __init__(self, folder: str):
        self.folder = folder
        self.calls: list = []    # (call dict, start, end), the call dict filled in as the call ends
        self.raw: list = []      # steps Python ran: (call dict, step, posted, done, sends, recvs), times in s
        self.timed: list = []    # calls the core ran: (call dict, program, each step's start and end)
        self.rank: Optional[int] = None
        self.offset_us = 0.0   # this rank's clock minus rank 0's
        self.offset_estimated = False
        self.lock = threading.Lock()

    # -- called from collectives._execute -------------------------------------------
    def execute(self, g, name: str, seq: int, prepared, arrays: dict, network, tag: int, describe,
                timeout: float) -> None:
        call: dict = {}
        program = prepared.program
        start = time.time()
        try:
            if core.runs(program, network):  # on the core, as untraced calls run: it times the steps
                times = np.zeros(2 * len(program.steps))
                try:
                    core.execute(program, arrays, network, tag, prepared.meta, describe, timeout, times)
                finally:
                    self.timed.append((call, program, times))
            else:
                engine.execute(program, arrays, _TracedNetwork(network, self.raw, call), tag,
                               prepared.meta, describe, timeout)
        except BaseException as exc:
            call["error"] = f"{type(exc).__name__}: {exc}"
            raise
        finally:
            # The least work while the ranks run: events() makes the rest.
            call["what"] = (name, prepared, g.name, seq, tag, network.rank)
            if self.rank is None:
                self.rank = network.rank
            self.calls.append((call, start, time.time()))

    def events(self) -> list:
        """Every event so far, as Chrome Trace Event objects (times in us)."""
        with self.lock:
            calls, raw, timed = list(self.calls), list(self.raw), list(self.timed)
        for call, program, times in timed:  # the steps the core timed, with their messages
            t = times.tolist()
            raw += [(call, step.index, t[2 * k], t[2 * k + 1]) + _messages(program, step)
                    for k, step in enumerate(program.steps) if (step.sends or step.recvs) and t[2 * k + 1]]
        described = {id(call): _described(call) for call, _, _ in calls}
        events = []
        for call, start, end in calls:
            info = described[id(call)]
            args = {k: v for k, v in info.items() if k not in ("tag", "rank")}
            events.append({"ph": "X", "cat": "call", "name": info["op"], "pid": info["rank"], "tid": 0,
                           "ts": start * 1e6, "dur": (end - start) * 1e6, "args": args})
        counts: dict = {}  # (id of the call, src, dst) -> messages so far: the flows' ids
        for call, step, posted, done, sends, recvs in raw:
            call = described.get(id(call))
            if call is None:
                continue  # a call still running (in another thread) when the trace was written
            me, tag, crc = call["rank"], call["tag"], zlib.crc32(call["group"].encode())
            posted, done = posted * 1e6, done * 1e6
            messages = [{"dir": "send", "peer": peer, "bytes": nbytes, "posted": posted, "completed": done,
                         "waited": done - posted} for peer, nbytes in sends]
            messages += [{"dir": "recv", "peer": peer, "bytes": nbytes, "reduce": reduce, "posted": posted,
                          "completed": done, "waited": done - posted} for peer, nbytes, reduce in recvs]
            events.append({"ph": "X", "cat": "step", "name": f"{call['op']} step {step}", "pid": me, "tid": 1,
                           "ts": posted, "dur": done - posted,
                           "args": {"step": step, "seq": call["seq"], "messages": messages}})
            for peer, _ in sends:
                j = counts.get((id(call), me, peer), 0)
                counts[(id(call), me, peer)] = j + 1
                events.append({"ph": "s", "cat": "message", "name": "message", "pid": me, "tid": 1,
                               "ts": posted, "id": _flow_id(tag, crc, me, peer, j)})
            for peer, _, _ in recvs:
                j = counts.get((id(call), peer, me), 0)
                counts[(id(call), peer, me)] = j + 1
                events.append({"ph": "f", "bp": "e", "cat": "message", "name": "message", "pid": me, "tid": 1,
                               "ts": done, "id": _flow_id(tag, crc, peer, me, j)})
        return events

    # -- clocks and output --------------------------------------------------------------
    def estimate_offset(self, rounds: int = 5) -> None:
        """Each rank's clock offset from rank 0's, by ping-pongs over the
        default group (collective: every rank calls it)."""
        import numpy as np
        from . import group, p2p
        if not group.is_initialized():
            return
        rank, size = group.get_rank(), group.get_world_size()
        buf = np.zeros(1, np.float64)
        for peer in range(1, size):
            if rank == 0:
                for _ in range(rounds):
                    p2p.recv(buf, src=peer)
                    buf[0] = _now_us()
                    p2p.send(buf, dst=peer)
            elif rank == peer:
                best = None
                for _ in range(rounds):
                    t0 = _now_us()
                    p2p.send(buf, dst=0)
                    p2p.recv(buf, src=0)
                    t2 = _now_us()
                    if best is None or t2 - t0 < best[0]:
                        best = (t2 - t0, (t0 + t2) / 2 - buf[0])
                self.offset_us = float(best[1])
        self.offset_estimated = True

    def flush(self) -> Optional[str]:
        """Write this rank's file (nothing when it traced no call)."""
        events, rank = self.events(), self.rank
        if rank is None:
            return None
        os.makedirs(self.folder, exist_ok=True)
        path = os.path.join(self.folder, f"rank-{rank}.json")
        with open(path + ".tmp", "w") as f:
            json.dump({"rank": rank, "clock_offset_us": self.offset_us,
                       "clock_offset_estimated": self.offset_estimated, "traceEvents": events}, f)
        os.replace(path + ".tmp", path)
        return path


def _flow_id(tag: int, group: int, src: int, dst: int, j: int) -> int:
    """The same number on both ranks of a message (a tuple of ints hashes
    alike in every process; ``group`` is the crc32 of the group's name)."""
    return hash((group, tag, src, dst, j)) & ((1 << 53) - 1)


def _traced_key(job_id: str) -> str:
    return f"collie/{job_id}/traced"


def count_in(store, job_id: str) -> bool:
    """At setup: whether this rank traces; if so, count it in the store."""
    from . import collectives
    if collectives.TRACE is None:
        return False
    store.add(_traced_key(job_id), 1)
    return True


def align_at_setup(store, job_id: str, world_size: int) -> None:
    """At the end of setup, on a rank that traces: estimate the clock offsets
    when every rank traces (each counted itself in before setup's last
    barrier, so the count is whole now)."""
    from . import collectives
    if store.add(_traced_key(job_id), 0) == world_size and collectives.TRACE is not None:
        collectives.TRACE.estimate_offset()


def install(tracer: Optional[Tracer]) -> Optional[Tracer]:
    """Make ``tracer`` (None: none) trace every collective call from now
    on; returns the one it replaces."""
    from . import collectives
    previous = collectives.TRACE
    collectives.TRACE = tracer
    return previous


@contextlib.contextmanager
def trace(folder: str, align_clocks: bool = True):
    """Trace every collective this process runs inside the block into
    ``folder`` (rank-R.json per rank; `collie trace merge` joins them). With
    a default process group and ``align_clocks``, every rank of it must enter
    the block (the ranks estimate their clock offsets with a few messages)."""
    tracer = Tracer(os.fspath(folder))
    from . import group
    if group.is_initialized() and align_clocks:
        tracer.estimate_offset()
    previous = install(tracer)
    try:
        yield tracer
    finally:
        install(previous)
        tracer.flush()


def from_environment(environ=os.environ) -> Optional[Tracer]:
    """The tracer COLLIE_TRACE=DIR asks for (written at exit), or None."""
    folder = environ.get("COLLIE_TRACE")
    if not folder:
        return None
    tracer = Tracer(folder)
    atexit.register(tracer.flush)
    return tracer


# ---- merging -----------------------------------------------------------------------

def merge(folder: str) -> dict:
    """Every rank's trace in ``folder`` as one Chrome Trace Event object,
    each rank's timestamps moved onto rank 0's clock and the whole shifted
    to start at 0."""
    paths = sorted(glob.glob(os.path.join(folder, "rank-*.json")))
    if not paths:
        raise ValueError(f"{folder}: no rank-*.json traces (run with COLLIE_TRACE={folder} or collie.trace())")
    events, ranks = [], []
    for path in paths:
        try:
            with open(path) as f:
                data = json.load(f)
            rank, offset = int(data["rank"]), float(data.get("clock_offset_us", 0.0))
            mine = data["traceEvents"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{path}: not a collie trace: {exc}") from None
        ranks.append(rank)
        for e in mine:
            e = dict(e)
            e["ts"] = e["ts"] - offset
            if e.get("cat") == "step":
                e["args"] = dict(e["args"], messages=[dict(m, posted=m["posted"] - offset,
                                                           completed=m["completed"] - offset)
                                                      for m in e["args"]["messages"]])
            events.append(e)
    if not events:
        raise ValueError(f"{folder}: the traces hold no events")
    t0 = min(e["ts"] for e in events)
    for e in events:
        e["ts"] = round(e["ts"] - t0, 3)
        if e.get("cat") == "step":
            for m in e["args"]["messages"]:
                m["posted"], m["completed"] = round(m["posted"] - t0, 3), round(m["completed"] - t0, 3)
    meta = [{"ph": "M", "name": "process_name", "pid": r, "args": {"name": f"rank {r}"}} for r in ranks]
    meta += [{"ph": "M", "name": "thread_name", "pid": r, "tid": t, "args": {"name": name}}
             for r in ranks for t, name in ((0, "calls"), (1, "steps"))]
    events.sort(key=lambda e: (e["ts"], e["pid"]))
    return {"traceEvents": meta + events, "displayTimeUnit": "ns",
            "otherData": {"collie": "trace merge", "ranks": sorted(ranks)}}


def main(argv: Optional[list] = None) -> int:
    """``collie trace merge DIR -o trace.json``."""
    argv = sys.argv[1:] if argv is None else list(argv)
    p = argparse.ArgumentParser(prog="collie trace",
                                description="Work with the per-rank traces COLLIE_TRACE=DIR writes.")
    sub = p.add_subparsers(dest="what", required=True)
    m = sub.add_parser("merge", help="join DIR/rank-*.json into one file, clocks aligned")
    m.add_argument("folder")
    m.add_argument("-o", "--output", default="trace.json")
    opts = p.parse_args(argv)
    try:
        merged = merge(opts.folder)
        with open(opts.output, "w") as f:
            json.dump(merged, f)
    except (OSError, ValueError) as exc:
        p.error(str(exc))
    calls = sum(1 for e in merged["traceEvents"] if e.get("cat") == "call")
    print(f"{opts.output}: {calls} calls of {len(merged['otherData']['ranks'])} ranks "
          f"(open in ui.perfetto.dev or chrome://tracing; collie draw --trace {opts.output})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
