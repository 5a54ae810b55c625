"""``collie draw``: pictures of schedules and of recorded runs.

    collie draw all_reduce --algo ring -n 4 -o ring.svg
    collie draw broadcast --algo tree -n 8 --hosts 2 -o tree.png     # PNG needs matplotlib
    collie draw --trace trace.json -o run.svg                          # a `collie trace merge` file

A schedule is drawn the way textbooks draw it: one row per rank, one column
per round, an arrow per message from the sender's round to the receiver's,
labelled with its chunks. A receive that reduces is red and its label starts
with "+"; a one-sided Read is a dashed arrow from the window's owner ("read",
"+read" when it reduces); local copies and reductions are written in the
rank's cell ("copy", "+="). With ``--hosts`` the rows of each host share a
band. Rounds are what collie.verify.rounds counts: the simulator
(collie.sim) runs every rank's schedule with every message taking one time
unit and nothing else any, and a step's column is the time it starts.

Everything is drawn as a short list of primitives (rectangles, lines, text)
rendered to SVG here, with no dependency, or to PNG through matplotlib. The
output depends only on the schedules, so docs/gallery.py can regenerate the
gallery of docs/algorithms.md and a test can check it has not drifted.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict, deque
from typing import NamedTuple, Optional
from xml.sax.saxutils import escape

from . import algorithms
from .schedule import COLLECTIVES, Copy, Read, Recv, Reduce, Send
from .verify import ranges_text

__all__ = ["schedule_figure", "trace_figure", "to_svg", "save", "main"]


class Figure(NamedTuple):
    width: float
    height: float
    items: list  # ("rect", x, y, w, h, fill) | ("line", x1, y1, x2, y2, color, dashed, arrow) | ("text", x, y, s, size, anchor, color)


_RED, _BLUE, _GREY, _INK = "#c0392b", "#2c6fbb", "#888888", "#222222"


def chunk_label(chunks, nblocks: dict, parts: int) -> str:
    """A message's chunks, short: "p0-3" (parts of a one-block buffer), "b2"
    (blocks), "b1[p0-1]"; buffers other than "out" are named ("in:b2")."""
    by_buf: dict = defaultdict(list)
    for c in chunks:
        by_buf[c.buf].append(c)
    texts = []
    for buf, cs in by_buf.items():
        prefix = "" if buf == "out" else f"{buf}:"
        blocks = sorted({c.block for c in cs})
        if nblocks.get(buf, 1) <= 1:
            if parts == 1 or len(cs) == parts:
                texts.append(buf if prefix == "" else buf)
            else:
                texts.append(prefix + "p" + ranges_text(c.part for c in cs))
        elif parts == 1:
            texts.append(prefix + "b" + ranges_text(blocks))
        else:
            per = defaultdict(list)
            for c in cs:
                per[c.block].append(c.part)
            texts.append(prefix + " ".join(
                f"b{b}" if len(ps) == parts else f"b{b}[p{ranges_text(ps)}]" for b, ps in sorted(per.items())))
    return " ".join(texts)


def _rounds(schedules: list) -> list:
    """When each step of each rank starts, with every message one time unit."""
    from . import sim
    unit = sim.Model(sim.Link(1.0, 0.0), sim.Link(1.0, 0.0), 0.0, 0.0)
    n = len(schedules)
    # Sizes do not matter here (beta = 0): one element per part of every block.
    steps_of = []
    for s in schedules:
        steps_of.append(tuple((tuple((0, getattr(op, "peer", -1), 0) if type(op) is Read else (0, -1, 0)
                                     for op in step if type(op) in (Copy, Reduce, Read)),
                               tuple((op.peer, 0) for op in step if type(op) is Send),
                               tuple((op.peer, 0, op.reduce) for op in step if type(op) is Recv))
                              for step in s.steps))
    starts = [[] for _ in range(n)]
    sim._run(steps_of, n, n, lambda r: 0, unit, starts)
    return [[int(round(t)) for t in st] for st in starts]


def schedule_figure(op: str, algorithm: str, n: int, root: int = 0, segments: int = 1,
                    hosts: int = 1) -> Figure:
    """The schedules of every rank of one call, drawn (see the module docstring)."""
    if op not in COLLECTIVES:
        raise ValueError(f"unknown collective {op!r}; collectives are {', '.join(COLLECTIVES)}")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be an integer >= 1, got {n!r}")
    if n > 64:
        raise ValueError(f"{n} ranks is too many rows to draw; at most 64")
    if hosts < 1 or n % hosts:
        raise ValueError(f"hosts must be >= 1 and divide n ({n}), got {hosts}")
    labels = tuple(r // (n // hosts) for r in range(n)) if algorithms.topological(op, algorithm) else None
    schedules = [algorithms.build(op, algorithm, n, r, root, segments, labels) for r in range(n)]
    starts = _rounds(schedules)
    spec = COLLECTIVES[op]
    nblocks = {"in": spec.in_blocks(n), "out": spec.out_blocks(n)}
    s0 = schedules[0]
    if s0.tmp_like:
        nblocks["tmp"] = nblocks[s0.tmp_like]
    if s0.win_like:
        nblocks["win"] = nblocks[s0.win_like]
    parts = s0.parts
    ncols = max([t + 1 for st in starts for t in st] + [1])

    left, top, colw, rowh = 60.0, 46.0, 150.0, 56.0
    width, height = left + ncols * colw + 20, top + n * rowh + 30
    items: list = []
    per_host = n // hosts
    for h in range(hosts):
        if hosts > 1:
            items.append(("rect", 4, top + h * per_host * rowh, width - 8, per_host * rowh,
                          "#eef3fa" if h % 2 == 0 else "#f7f7f7"))
            items.append(("text", width - 10, top + h * per_host * rowh + 12, f"host {h}", 10, "end", _GREY))
    title = f"{op} {algorithm}, {n} ranks" + (f", root {root}" if spec.rooted else "") + \
        (f", {segments} segments" if algorithms.pipelined(op, algorithm) and segments > 1 else "") + \
        (f", {hosts} hosts" if hosts > 1 else "")
    items.append(("text", left, 18, title, 14, "start", _INK))
    for k in range(ncols):
        items.append(("text", left + k * colw + colw / 2, top - 10, f"round {k}", 10, "middle", _GREY))
        items.append(("line", left + k * colw, top - 4, left + k * colw, top + n * rowh, "#dddddd", False, False))
    for r in range(n):
        y = top + r * rowh + rowh / 2
        items.append(("text", left - 10, y + 4, f"r{r}", 12, "end", _INK))
        items.append(("line", left, y, left + ncols * colw, y, "#cccccc", False, False))

    def cell(r: int, k: int, frac: float) -> tuple:
        return left + k * colw + frac * colw, top + r * rowh + rowh / 2

    pending: dict = defaultdict(deque)  # (src, dst) -> sends not yet matched: (column, chunks)
    recvs: dict = defaultdict(deque)
    for r, s in enumerate(schedules):
        for k, step in enumerate(s.steps):
            col = starts[r][k]
            notes, nread = [], 0
            for op_ in step:
                t = type(op_)
                if t is Send:
                    pending[(r, op_.peer)].append((col, op_.chunks))
                elif t is Recv:
                    recvs[(op_.peer, r)].append((col, op_.reduce))
                elif t is Copy:
                    notes.append("copy " + chunk_label(op_.dst, nblocks, parts))
                elif t is Reduce:
                    notes.append("+= " + chunk_label(op_.dst, nblocks, parts))
                elif t is Read:
                    frac = 0.1 + 0.05 * (r % 4) + 0.02 * nread  # rows apart, so that reads do not overlap
                    nread += 1
                    x1, y1 = cell(op_.peer, col, frac)
                    x2, y2 = cell(r, col, frac)
                    label = ("+read " if op_.reduce else "read ") + chunk_label(op_.src, nblocks, parts)
                    items.append(("line", x1, y1, x2, y2 - (8 if y2 > y1 else -8), _RED if op_.reduce else _BLUE,
                                  True, True))
                    items.append(("text", x1 + 4, (y1 + y2) / 2, label, 9, "start",
                                  _RED if op_.reduce else _BLUE))
            if notes:  # stacked above the rank's line, a few to a line
                x, y = cell(r, col, 0.04)
                lines = ["; ".join(notes[i:i + 2]) for i in range(0, len(notes), 2)]
                for i, text in enumerate(reversed(lines[:3])):
                    items.append(("text", x, y - 6 - 10 * i, text if i or len(lines) <= 3 else text + " ...",
                                  8, "start", "#6b4f00"))
    for key in sorted(pending):
        for (scol, chunks), (rcol, reduce) in zip(pending[key], recvs[key]):
            src, dst = key
            x1, y1 = cell(src, scol, 0.35)
            x2, y2 = cell(dst, max(rcol, scol), 0.9)  # a receive posted early waits for the send
            y2 += -8 if y2 > y1 else 8
            color = _RED if reduce else _INK
            items.append(("line", x1, y1, x2, y2, color, False, True))
            label = ("+" if reduce else "") + chunk_label(chunks, nblocks, parts)
            items.append(("text", x1 + (x2 - x1) * 0.3 + 3, y1 + (y2 - y1) * 0.3, label, 9, "start", color))
    return Figure(width, height, items)


def trace_figure(events: list) -> Figure:
    """A merged trace (Chrome Trace Event "X" events, as `collie trace merge`
    writes them) as a per-rank timeline: calls on top, their steps below."""
    spans = [e for e in events if e.get("ph") == "X"]
    if not spans:
        raise ValueError("the trace has no complete ('X') events to draw")
    ranks = sorted({int(e["pid"]) for e in spans})
    t0 = min(e["ts"] for e in spans)
    t1 = max(e["ts"] + e["dur"] for e in spans)
    left, top, rowh, plot_w = 60.0, 46.0, 44.0, 900.0
    scale = plot_w / max(t1 - t0, 1e-9)
    width, height = left + plot_w + 20, top + len(ranks) * rowh + 30
    items: list = [("text", left, 18, f"trace: {len(ranks)} ranks, {t1 - t0:.0f} us", 14, "start", _INK)]
    row = {r: i for i, r in enumerate(ranks)}
    for r in ranks:
        items.append(("text", left - 10, top + row[r] * rowh + rowh / 2 + 4, f"r{r}", 12, "end", _INK))
    palette = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#9c755f"]
    colors: dict = {}
    for e in spans:
        y = top + row[int(e["pid"])] * rowh
        x = left + (e["ts"] - t0) * scale
        w = max(e["dur"] * scale, 0.5)
        if e.get("cat") == "call":
            color = colors.setdefault(e["name"], palette[len(colors) % len(palette)])
            items.append(("rect", x, y + 4, w, rowh / 2 - 6, color))
            if w > 40:
                items.append(("text", x + 2, y + rowh / 4 + 3, e["name"], 9, "start", "#ffffff"))
        elif e.get("cat") == "step":
            items.append(("rect", x, y + rowh / 2, w, rowh / 2 - 6, "#bbbbbb" if int(e["args"].get("step", 0)) % 2
                          else "#999999"))
    for k in range(5):
        t = t0 + (t1 - t0) * k / 4
        items.append(("text", left + (t - t0) * scale, height - 10, f"{t - t0:.0f} us", 10, "middle", _GREY))
    return Figure(width, height, items)


def _num(x: float) -> str:
    return f"{x:.1f}".rstrip("0").rstrip(".")


def to_svg(fig: Figure) -> str:
    """The figure as an SVG document (deterministic: same figure, same bytes)."""
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{_num(fig.width)}" height="{_num(fig.height)}" '
           f'viewBox="0 0 {_num(fig.width)} {_num(fig.height)}" font-family="sans-serif">',
           '<defs><marker id="a" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" '
           'orient="auto-start-reverse"><path d="M0,0L10,5L0,10z" fill="context-stroke"/></marker></defs>',
           f'<rect width="{_num(fig.width)}" height="{_num(fig.height)}" fill="#ffffff"/>']
    for item in fig.items:
        kind = item[0]
        if kind == "rect":
            _, x, y, w, h, fill = item
            out.append(f'<rect x="{_num(x)}" y="{_num(y)}" width="{_num(w)}" height="{_num(h)}" fill="{fill}"/>')
        elif kind == "line":
            _, x1, y1, x2, y2, color, dashed, arrow = item
            out.append(f'<line x1="{_num(x1)}" y1="{_num(y1)}" x2="{_num(x2)}" y2="{_num(y2)}" stroke="{color}"'
                       + (' stroke-dasharray="4 3"' if dashed else "")
                       + (' stroke-width="1.4" marker-end="url(#a)"' if arrow else "") + "/>")
        else:
            _, x, y, text, size, anchor, color = item
            out.append(f'<text x="{_num(x)}" y="{_num(y)}" font-size="{size}" text-anchor="{anchor}" '
                       f'fill="{color}">{escape(text)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _to_png(fig: Figure, path: str) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import FancyArrowPatch, Rectangle
    except ImportError:
        raise RuntimeError("PNG output needs matplotlib (pip install 'collie[plot]'); SVG needs nothing") from None
    dpi = 100
    f = plt.figure(figsize=(fig.width / dpi, fig.height / dpi), dpi=dpi)
    ax = f.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, fig.width)
    ax.set_ylim(fig.height, 0)
    ax.axis("off")
    for item in fig.items:
        kind = item[0]
        if kind == "rect":
            _, x, y, w, h, fill = item
            ax.add_patch(Rectangle((x, y), w, h, facecolor=fill, edgecolor="none"))
        elif kind == "line":
            _, x1, y1, x2, y2, color, dashed, arrow = item
            ax.add_patch(FancyArrowPatch((x1, y1), (x2, y2), arrowstyle="-|>" if arrow else "-",
                                         mutation_scale=9, color=color, linestyle="--" if dashed else "-",
                                         linewidth=1.2 if arrow else 0.8))
        else:
            _, x, y, text, size, anchor, color = item
            ax.text(x, y, text, fontsize=size * 0.75, ha={"start": "left", "middle": "center", "end": "right"}[anchor],
                    va="baseline", color=color)
    f.savefig(path, dpi=dpi)
    plt.close(f)


def save(fig: Figure, path: str) -> None:
    """Write ``fig`` to ``path``: .svg (no dependency) or .png (matplotlib)."""
    if path.endswith(".svg"):
        with open(path, "w") as f:
            f.write(to_svg(fig))
    elif path.endswith(".png"):
        _to_png(fig, path)
    else:
        raise ValueError(f"{path}: write .svg or .png")


def main(argv: Optional[list] = None) -> int:
    """``collie draw``; returns the exit code."""
    argv = sys.argv[1:] if argv is None else list(argv)
    p = argparse.ArgumentParser(prog="collie draw",
                                description="Draw an algorithm's schedules (ranks as rows, rounds as "
                                            "columns, an arrow per message), or a recorded trace.")
    p.add_argument("op", nargs="?", default=None, help=f"one of {', '.join(COLLECTIVES)}")
    p.add_argument("--algo", default=None, help="the algorithm to draw")
    p.add_argument("-n", "--nranks", type=int, default=4)
    p.add_argument("--root", type=int, default=0)
    p.add_argument("--segments", type=int, default=1)
    p.add_argument("--hosts", type=int, default=1, help="group the ranks into this many hosts")
    p.add_argument("--trace", default=None, metavar="TRACE.json", help="draw a `collie trace merge` file instead")
    p.add_argument("-o", "--output", default=None, metavar="OUT.svg|png", help="default: SVG on stdout")
    opts = p.parse_args(argv)
    try:
        if opts.trace:
            with open(opts.trace) as f:
                data = json.load(f)
            fig = trace_figure(data["traceEvents"] if isinstance(data, dict) else data)
        else:
            if opts.op is None or opts.algo is None:
                p.error("name an op and --algo (or give --trace)")
            if opts.op not in COLLECTIVES:
                p.error(f"unknown op {opts.op!r}; choose from {', '.join(COLLECTIVES)}")
            if opts.algo not in algorithms.algorithms_for(opts.op):
                p.error(f"{opts.op} has no algorithm {opts.algo!r}; available: "
                        f"{', '.join(algorithms.algorithms_for(opts.op))}")
            fig = schedule_figure(opts.op, opts.algo, opts.nranks, opts.root, opts.segments, opts.hosts)
        if opts.output:
            save(fig, opts.output)
        else:
            sys.stdout.write(to_svg(fig))
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        p.error(str(exc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
