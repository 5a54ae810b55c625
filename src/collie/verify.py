"""The verifier: proves that the schedules of an algorithm compute their
collective, for every rank, without deadlock, races or size mismatches.

It runs the schedules of all ranks of one call together, the way the engine
would (collie.schedule's execution semantics), on *symbols* instead of
numbers: every part of every block of every buffer holds the set of
contributions it has, initially {(rank, buffer, block, part)} for data a rank
starts with and a distinct garbage symbol for everything else (the "out" of
non-root ranks in broadcast, every "tmp", ...). Copy and a plain Recv replace
what a chunk holds, Reduce and Recv(reduce=True) take the union and fail if
either side is garbage or if the two share a contribution (it would be counted
twice). At the end every rank's result must be exactly what the collective
promises, e.g. all_reduce: part p of every "out" holds {(q, "out", 0, p) for
every rank q}; all_to_all: block q of rank r's "out" holds {(q, "in", r, p)}.

While running it also checks what symbols cannot see:

- deadlock: a send completes only when the peer has posted the matching
  receive (no buffering), and messages between two ranks match in posting
  order; if no rank can move while some are unfinished, the error lists where
  each stuck rank is and what it waits for;
- races: within a step, two sends/receives writing one chunk, or one writing
  a chunk another reads; a Copy or Reduce whose destination overlaps itself;
- bad references: a peer outside [0, n) or the rank itself, a buffer the rank
  does not have (gather's "out" off the root...), a block or part out of
  range, any write to "in" (inputs are read-only);
- sizes: with concrete block sizes (elements per block, per rank and buffer,
  cut into parts by collie.schedule.part_bounds) every message must have as
  many chunks as its receive, each of the same size, and every Copy/Reduce
  must pair chunks of equal size. The default layouts include zero-size
  blocks, sizes that parts do not divide, and (all_to_all) different sizes
  for every pair of ranks.

Run ``python -m collie.verify`` to check every registered algorithm.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import deque
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from . import algorithms
from .schedule import COLLECTIVES, Chunk, Copy, Recv, Reduce, Schedule, Send, part_bounds

__all__ = [
    "VerificationError",
    "verify",
    "verify_schedules",
    "verify_algorithm",
    "verify_all",
    "default_layouts",
    "Result",
    "main",
]

_BUFFERS = ("in", "out", "tmp")

# Collectives whose "out" holds this rank's input when the call starts.
_IN_PLACE = ("broadcast", "reduce", "all_reduce", "barrier")


class VerificationError(AssertionError):
    """A schedule is wrong. The message names the algorithm, collective,
    nranks and, where it applies, the rank, step, op and chunk at fault; the
    same facts are attributes (None where they do not apply)."""

    def __init__(self, message: str, *, collective=None, algorithm=None, nranks=None,
                 rank=None, step=None, op=None):
        super().__init__(message)
        self.collective = collective
        self.algorithm = algorithm
        self.nranks = nranks
        self.rank = rank
        self.step = step
        self.op = op


Layout = Sequence[Mapping[str, Sequence[int]]]  # per rank: buffer -> block sizes


# ----------------------------------------------------------------------------
# Concrete layouts


def default_layouts(collective: str, nranks: int, uniform: bool = False) -> tuple:
    """Block sizes to check ``collective`` with on ``nranks`` ranks: all zero,
    all 13 elements, and (unless ``uniform``) uneven sizes with zeros among
    them, different for every pair of ranks in all_to_all. Every rank gets
    sizes for both "in" and "out" whenever the collective has them anywhere,
    since "tmp" may be laid out like a buffer the rank does not have."""
    n = nranks
    if collective == "barrier":
        return (tuple({"out": (0,)} for _ in range(n)),)
    families = [(lambda i: 0, lambda q, r: 0, 0), (lambda i: 13, lambda q, r: 13, 13)]
    if not uniform:
        families.append((lambda i: (3 * i + 1) % 5,
                         lambda q, r: (3 * q + 5 * r + q * r + 1) % 7,
                         2 * n + 3))
    layouts = []
    for size, pair, whole in families:
        every = tuple(size(q) for q in range(n))
        if collective in _IN_PLACE:
            layout = [{"out": (whole,)} for r in range(n)]
        elif collective in ("gather", "all_gather"):
            layout = [{"in": (size(r),), "out": every} for r in range(n)]
        elif collective in ("scatter", "reduce_scatter"):
            layout = [{"in": every, "out": (size(r),)} for r in range(n)]
        elif collective == "all_to_all":
            layout = [{"in": tuple(pair(r, q) for q in range(n)),
                       "out": tuple(pair(q, r) for q in range(n))} for r in range(n)]
        else:
            raise ValueError(f"no default layout for collective {collective!r}")
        layouts.append(tuple(layout))
    return tuple(layouts)


def _check_layout(collective: str, nranks: int, root: int, layout) -> None:
    """ValueError unless ``layout`` is one that a real call could have."""
    spec = COLLECTIVES[collective]
    if len(layout) != nranks:
        raise ValueError(f"block_sizes has {len(layout)} ranks, expected {nranks}")
    counts = {"in": spec.in_blocks(nranks), "out": spec.out_blocks(nranks)}
    for r, bufs in enumerate(layout):
        for buf, sizes in bufs.items():
            if buf not in counts or counts[buf] == 0:
                raise ValueError(f"block_sizes of rank {r} has {buf!r}, which {collective} does not use")
            if len(sizes) != counts[buf] or any(int(s) < 0 for s in sizes):
                raise ValueError(f"block_sizes of rank {r} {buf!r} must be {counts[buf]} sizes >= 0, "
                                 f"got {tuple(sizes)}")
        for buf, count in counts.items():
            if count and buf not in bufs and _has_buffer(spec, buf, r, root):
                raise ValueError(f"block_sizes of rank {r} lacks {buf!r}")

    def get(r, buf, b):
        sizes = layout[r].get(buf)
        return None if sizes is None else int(sizes[b])

    def same(what, a, b):
        if a is not None and b is not None and a != b:
            raise ValueError(f"block_sizes are inconsistent for {collective}: {what} ({a} != {b})")

    for r in range(nranks):
        for q in range(nranks):
            if collective in _IN_PLACE:
                same(f"'out' of ranks {r} and {q}", get(r, "out", 0), get(q, "out", 0))
            elif collective in ("gather", "all_gather"):
                same(f"rank {r} 'out' block {q} vs rank {q} 'in'", get(r, "out", q), get(q, "in", 0))
            elif collective in ("scatter", "reduce_scatter"):
                same(f"rank {r} 'in' block {q} vs rank {q} 'out'", get(r, "in", q), get(q, "out", 0))
            elif collective == "all_to_all":
                same(f"rank {r} 'in' block {q} vs rank {q} 'out' block {r}", get(r, "in", q), get(q, "out", r))


def _has_buffer(spec, buf: str, rank: int, root: int) -> bool:
    blocks = spec.in_blocks if buf == "in" else spec.out_blocks
    return blocks(1) > 0 and not (spec.root_only == buf and rank != root)


# ----------------------------------------------------------------------------
# The simulation


class _Ctx(NamedTuple):
    label: str
    collective: str
    algorithm: str
    nranks: int


def _fail(ctx: _Ctx, text: str, rank=None, step=None, op=None):
    where = ""
    if rank is not None:
        where = f"rank {rank}"
        if step is not None:
            where += f" step {step}"
        if op is not None:
            where += f" op {op[0]} {_show_op(op[1])}"
        where += ": "
    raise VerificationError(f"{ctx.label}: {where}{text}", collective=ctx.collective,
                            algorithm=ctx.algorithm, nranks=ctx.nranks, rank=rank, step=step,
                            op=None if op is None else op[1])


def _show_op(op) -> str:
    def chunks(cs):
        return "[" + " ".join(f"{c.buf}[{c.block}].{c.part}" for c in cs) + "]"

    if isinstance(op, Send):
        return f"Send(to {op.peer} {chunks(op.chunks)})"
    if isinstance(op, Recv):
        return f"Recv(from {op.peer} {chunks(op.chunks)}{' reduce' if op.reduce else ''})"
    if isinstance(op, (Copy, Reduce)):
        return f"{type(op).__name__}({chunks(op.src)} -> {chunks(op.dst)})"
    return repr(op)


class _Machine:
    """All ranks of one call: their buffers (as bit sets of symbols), their
    compiled schedules, and the message queues between them."""

    def __init__(self, schedules: Sequence[Schedule], layouts, label: str | None):
        first = schedules[0]
        self.n = n = first.nranks
        self.collective = first.collective
        self.root = first.root
        self.parts = first.parts
        self.ctx = _Ctx(label or f"{first.algorithm} {first.collective}, nranks={n}, root={first.root}, "
                        f"parts={first.parts}", first.collective, first.algorithm, n)
        self._check_headers(schedules)
        spec = COLLECTIVES[self.collective]
        self.spec = spec
        parts = self.parts
        self.nblocks = {"in": spec.in_blocks(n), "out": spec.out_blocks(n)}
        # Locations of rank r: "in" parts, then "out", then "tmp".
        self.base = {"in": 0, "out": self.nblocks["in"] * parts,
                     "tmp": (self.nblocks["in"] + self.nblocks["out"]) * parts}
        self.width = (self.nblocks["in"] + self.nblocks["out"]
                      + max(self.nblocks["in"], self.nblocks["out"])) * parts
        # Symbol of location l of rank r: bit r*width + l; its garbage: that
        # bit shifted by `garbage`, so "holds garbage" is `value >> garbage`.
        self.garbage = n * self.width
        self.tmp_like = [s.tmp_like for s in schedules]
        self.has = [self._buffers(r, s) for r, s in enumerate(schedules)]
        self.value = [self._initial(r) for r in range(n)]
        self.sizes = [self._sizes(layout) for layout in layouts]
        self._tables: dict = {}
        self.steps = [self._compile(r, s) for r, s in enumerate(schedules)]
        self.barrier = self.collective == "barrier"
        self._all_ranks = None

    # -- setup ---------------------------------------------------------------

    def _check_headers(self, schedules):
        ctx = self.ctx
        if self.collective not in COLLECTIVES:
            _fail(ctx, f"unknown collective {self.collective!r}")
        if len(schedules) != self.n:
            _fail(ctx, f"{len(schedules)} schedules for nranks={self.n}")
        for r, s in enumerate(schedules):
            for field, want in (("rank", r), ("nranks", self.n), ("collective", self.collective),
                                ("algorithm", ctx.algorithm), ("root", self.root), ("parts", self.parts)):
                if getattr(s, field) != want:
                    _fail(ctx, f"schedule has {field}={getattr(s, field)!r}, expected {want!r}", rank=r)
            if s.parts < 1:
                _fail(ctx, f"parts must be >= 1, got {s.parts}", rank=r)
            if s.tmp_like not in (None, "in", "out") or (s.tmp_like and not _tmp_blocks(s, self.n)):
                _fail(ctx, f"tmp_like={s.tmp_like!r} names no buffer of {s.collective}", rank=r)

    def _buffers(self, r: int, schedule: Schedule) -> dict:
        """buffer -> number of blocks, for the buffers rank r has."""
        spec = COLLECTIVES[self.collective]
        has = {buf: count for buf, count in self.nblocks.items()
               if count and _has_buffer(spec, buf, r, self.root)}
        if schedule.tmp_like is not None:
            has["tmp"] = self.nblocks[schedule.tmp_like]
        return has

    def _initial(self, r: int) -> list:
        values = [None] * self.width
        for buf, count in self.has[r].items():
            data = buf == "in" or (buf == "out" and self.collective in _IN_PLACE
                                   and (self.collective != "broadcast" or r == self.root))
            start = self.base[buf]
            for loc in range(start, start + count * self.parts):
                bit = r * self.width + loc
                values[loc] = 1 << (bit if data else bit + self.garbage)
        return values

    def _sizes(self, layout) -> list:
        """Per rank, the size in elements of every location (None where the
        rank has no such buffer)."""
        _check_layout(self.collective, self.n, self.root, layout)
        out = []
        for r in range(self.n):
            sizes = [None] * self.width
            for buf in self.has[r]:
                source = self.tmp_like[r] if buf == "tmp" else buf
                blocks = layout[r].get(source)
                if blocks is None:
                    _fail(self.ctx, f"the layout gives no sizes for {source!r}, "
                          f"which this rank's {buf!r} is laid out like", rank=r)
                for b, count in enumerate(blocks):
                    for p in range(self.parts):
                        lo, hi = part_bounds(0, int(count), self.parts, p)
                        sizes[self.base[buf] + b * self.parts + p] = hi - lo
            out.append(sizes)
        return out

    def _table(self, r: int) -> dict:
        """Chunk -> location for every chunk rank r may name (ranks with the
        same buffers share one table)."""
        key = tuple(sorted(self.has[r].items()))
        table = self._tables.get(key)
        if table is None:
            table = {}
            for buf, count in key:
                for b in range(count):
                    for p in range(self.parts):
                        table[Chunk(buf, b, p)] = self.base[buf] + b * self.parts + p
            self._tables[key] = table
        return table

    def _loc(self, r, chunk, step, op):
        if not isinstance(chunk, Chunk):
            _fail(self.ctx, f"{chunk!r} is not a Chunk", r, step, op)
        count = self.has[r].get(chunk.buf)
        if count is None:
            _fail(self.ctx, f"uses buffer {chunk.buf!r}, which this rank does not have", r, step, op)
        if not (0 <= chunk.block < count and 0 <= chunk.part < self.parts):
            _fail(self.ctx, f"chunk {chunk.buf}[{chunk.block}].{chunk.part} is out of range "
                  f"({count} blocks of {self.parts} parts)", r, step, op)
        return self.base[chunk.buf] + chunk.block * self.parts + chunk.part

    def _compile(self, r: int, schedule: Schedule) -> list:
        """Steps as (local ops, comm ops) over location numbers, checked for
        bad references, races and mismatched local sizes."""
        compiled = []
        get = self._table(r).__getitem__
        n, first_out = self.n, self.base["out"]

        def locs_of(chunks, s, i, op):
            try:
                return tuple(map(get, chunks))
            except (KeyError, TypeError):  # name the bad chunk
                return tuple(self._loc(r, c, s, (i, op)) for c in chunks)

        for s, step in enumerate(schedule.steps):
            local, comm = [], []
            reads, writes = [], []
            for i, op in enumerate(step):
                kind = type(op)
                if kind is Send or kind is Recv:
                    peer = op.peer
                    if not (0 <= peer < n) or peer == r:
                        _fail(self.ctx, f"peer {peer} is not another rank of [0, {n})", r, s, (i, op))
                    locs = locs_of(op.chunks, s, i, op)
                    if kind is Send:
                        reads += locs
                        comm.append((True, peer, locs, False, i, op))
                    else:
                        if locs and min(locs) < first_out:
                            self._wrote_in(r, s, i, op)
                        writes += locs
                        comm.append((False, peer, locs, op.reduce, i, op))
                elif kind is Copy or kind is Reduce:
                    src = locs_of(op.src, s, i, op)
                    dst = locs_of(op.dst, s, i, op)
                    if len(src) != len(dst):
                        _fail(self.ctx, f"{len(src)} source chunks for {len(dst)} destinations", r, s, (i, op))
                    if len(set(dst)) != len(dst) or not set(src).isdisjoint(dst):
                        _fail(self.ctx, "destination chunks repeat or overlap the sources", r, s, (i, op))
                    if dst and min(dst) < first_out:
                        self._wrote_in(r, s, i, op)
                    for k, sizes in enumerate(self.sizes):
                        a, b = [sizes[r][l] for l in src], [sizes[r][l] for l in dst]
                        if a != b:
                            _fail(self.ctx, f"source sizes {a} != destination sizes {b} "
                                  f"(layout {k})", r, s, (i, op))
                    local.append((kind is Reduce, src, dst, i, op))
                else:
                    _fail(self.ctx, f"unknown op {op!r}", r, s, (i, op))
            if writes:
                written = set(writes)
                if len(written) != len(writes) or not written.isdisjoint(reads):
                    self._race(r, s, step, comm)
            compiled.append((local, comm))
        return compiled

    def _wrote_in(self, r, s, i, op):
        _fail(self.ctx, "writes 'in', which must be left unchanged", r, s, (i, op))

    def _race(self, r, s, step, comm):
        seen = {}
        for is_send, _peer, locs, _red, i, _op in comm:
            for loc in locs:
                for j, other_write in seen.get(loc, ()):
                    if other_write or not is_send:
                        _fail(self.ctx, f"race: ops {j} and {i} both touch {self._name(r, loc)} "
                              f"and at least one writes it", r, s)
                seen.setdefault(loc, []).append((i, not is_send))
        _fail(self.ctx, "race within the step", r, s)  # pragma: no cover - found above

    # -- symbols -------------------------------------------------------------

    def _name(self, r: int, loc: int) -> str:
        buf = "tmp" if loc >= self.base["tmp"] else "out" if loc >= self.base["out"] else "in"
        b, p = divmod(loc - self.base[buf], self.parts)
        return f"{buf} block {b} part {p}"

    def _describe(self, value: int | None) -> str:
        """Human-readable contents of a location: contributions grouped by
        (buffer, block, part), with the ranks they come from."""
        if value is None:
            return "nothing"
        groups: dict = {}
        garbage = []
        bit = 0
        while value:
            if value & 1:
                g = bit >= self.garbage
                r, loc = divmod(bit - self.garbage if g else bit, self.width)
                name = self._name(r, loc)
                if g:
                    garbage.append(f"garbage of rank {r} {name}")
                else:
                    groups.setdefault(name, []).append(r)
            value >>= 1
            bit += 1
        items = [f"{name} of ranks {_ranges(ranks)}" for name, ranks in groups.items()]
        return "{" + "; ".join(items + garbage) + "}" if items or garbage else "{}"

    def _combine(self, into: int, new: int, r: int, step: int, op, loc: int) -> int:
        if (into | new) >> self.garbage:
            _fail(self.ctx, f"combines garbage into {self._name(r, loc)}: "
                  f"{self._describe(new)} into {self._describe(into)}", r, step, op)
        if into & new and not self.barrier:
            _fail(self.ctx, f"counts contributions twice in {self._name(r, loc)}: "
                  f"{self._describe(into & new)}", r, step, op)
        return into | new

    # -- running -------------------------------------------------------------

    def run(self) -> None:
        n = self.n
        pc = [0] * n
        remaining = [0] * n
        sends: dict = {}  # (src, dst) -> deque of posted, unmatched (step, send)
        recvs: dict = {}  # (src, dst) -> deque of posted, unmatched (step, receive)
        ready = list(range(n))
        steps, value = self.steps, self.value
        checked = bool(self.sizes)
        garbage, barrier = self.garbage, self.barrier
        while ready:
            r = ready.pop()
            mine = steps[r]
            while pc[r] < len(mine):
                local, comm = mine[pc[r]]
                for is_reduce, src, dst, i, op in local:
                    values = value[r]
                    new = [values[l] for l in src]
                    for l, v in zip(dst, new):
                        values[l] = self._combine(values[l], v, r, pc[r], (i, op), l) if is_reduce else v
                if not comm:
                    pc[r] += 1
                    continue
                remaining[r] = len(comm)
                for entry in comm:
                    is_send, peer = entry[0], entry[1]
                    if is_send:
                        key, waiting = (r, peer), recvs.get((r, peer))
                    else:
                        key, waiting = (peer, r), sends.get((peer, r))
                    if not waiting:
                        (sends if is_send else recvs).setdefault(key, deque()).append((pc[r], entry))
                        continue
                    other_step, other = waiting.popleft()
                    if is_send:
                        src, send, dst, recv, rstep = r, entry, peer, other, other_step
                    else:
                        src, send, dst, recv, rstep = peer, other, r, entry, pc[r]
                    slocs, rlocs = send[2], recv[2]
                    if checked or len(slocs) != len(rlocs):
                        self._check_match(src, pc[r] if is_send else other_step, send, dst, rstep, recv)
                    svalues, rvalues = value[src], value[dst]
                    if recv[3]:  # reduce
                        for sl, rl in zip(slocs, rlocs):
                            into, v = rvalues[rl], svalues[sl]
                            if (into | v) >> garbage or (into & v and not barrier):
                                self._combine(into, v, dst, rstep, (recv[4], recv[5]), rl)  # raises
                            rvalues[rl] = into | v
                    else:
                        new = [svalues[sl] for sl in slocs]
                        for rl, v in zip(rlocs, new):
                            rvalues[rl] = v
                    remaining[r] -= 1
                    remaining[peer] -= 1
                    if remaining[peer] == 0:
                        pc[peer] += 1
                        ready.append(peer)
                if remaining[r]:
                    break
                pc[r] += 1
        stuck = [r for r in range(n) if pc[r] < len(steps[r])]
        if stuck:
            self._deadlock(stuck, pc, sends, recvs)
        self._check_results()

    def _check_match(self, src, src_step, send, dst, recv_step, recv) -> None:
        """A send and the receive it matched must agree on chunk count and,
        for every layout, on the size of every chunk."""
        slocs, rlocs, where = send[2], recv[2], (recv[4], recv[5])

        def sent():
            return f"rank {src} step {src_step} op {send[4]} {_show_op(send[5])}"

        if len(slocs) != len(rlocs):
            _fail(self.ctx, f"receives {len(rlocs)} chunks but the matching send, {sent()}, "
                  f"has {len(slocs)}", dst, recv_step, where)
        for k, sizes in enumerate(self.sizes):
            a, b = [sizes[src][l] for l in slocs], [sizes[dst][l] for l in rlocs]
            if a != b:
                _fail(self.ctx, f"receives chunks of sizes {b} but the matching send, {sent()}, "
                      f"sends sizes {a} (layout {k})", dst, recv_step, where)

    def _deadlock(self, stuck, pc, sends, recvs) -> None:
        waits: dict = {r: [] for r in stuck}
        for queue in (sends, recvs):
            for (src, dst), entries in queue.items():
                for step, entry in entries:
                    me, peer = (src, dst) if entry[0] else (dst, src)
                    if me in waits:
                        waits[me].append(f"op {entry[4]} {_show_op(entry[5])}")
        lines = [f"rank {r} at step {pc[r]} waits on {', '.join(waits[r]) or 'nothing'}"
                 for r in stuck[:8]]
        more = f" (and {len(stuck) - 8} more ranks)" if len(stuck) > 8 else ""
        _fail(self.ctx, "deadlock: " + "; ".join(lines) + more)

    # -- results -------------------------------------------------------------

    def _atom(self, r: int, buf: str, block: int, part: int) -> int:
        return 1 << (r * self.width + self.base[buf] + block * self.parts + part)

    def _every(self, buf: str, block: int, part: int) -> int:
        """The contributions of every rank to one location."""
        if self._all_ranks is None:
            self._all_ranks = sum(1 << (q * self.width) for q in range(self.n))
        return self._all_ranks << (self.base[buf] + block * self.parts + part)

    def _expected(self, r: int, block: int, part: int) -> int:
        """What part ``part`` of block ``block`` of rank r's "out" must hold."""
        c, atom = self.collective, self._atom
        if c == "broadcast":
            return atom(self.root, "out", 0, part)
        if c == "all_reduce" or (c == "reduce" and r == self.root):
            return self._every("out", 0, part)
        if c == "reduce":
            return atom(r, "out", 0, part)
        if c in ("gather", "all_gather"):
            return atom(block, "in", 0, part)
        if c == "scatter":
            return atom(self.root, "in", r, part)
        if c == "reduce_scatter":
            return self._every("in", r, part)
        if c == "all_to_all":
            return atom(block, "in", r, part)
        raise AssertionError(c)

    def _check_results(self) -> None:
        for r in range(self.n):
            count = self.has[r].get("out")
            if count is None:
                continue
            values = self.value[r]
            start = self.base["out"]
            if self.barrier:
                heard = 0
                for loc in range(start, start + count * self.parts):
                    heard |= values[loc]
                if heard >> self.garbage:
                    _fail(self.ctx, f"'out' ends with garbage: {self._describe(heard)}", rank=r)
                mask = (1 << self.width) - 1
                missing = [q for q in range(self.n) if not (heard >> (q * self.width)) & mask]
                if missing:
                    _fail(self.ctx, f"barrier: leaves without hearing from ranks {_ranges(missing)}", rank=r)
                continue
            for b in range(count):
                for p in range(self.parts):
                    got = values[start + b * self.parts + p]
                    want = self._expected(r, b, p)
                    if got != want:
                        _fail(self.ctx, f"out block {b} part {p} holds {self._describe(got)}, "
                              f"expected {self._describe(want)}", rank=r)


def _tmp_blocks(schedule: Schedule, n: int) -> int:
    spec = COLLECTIVES[schedule.collective]
    return (spec.in_blocks if schedule.tmp_like == "in" else spec.out_blocks)(n)


def _ranges(ranks) -> str:
    """'0-3,5' for [0, 1, 2, 3, 5]."""
    out, ranks = [], sorted(ranks)
    i = 0
    while i < len(ranks):
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
            j += 1
        out.append(str(ranks[i]) if i == j else f"{ranks[i]}-{ranks[j]}")
        i = j + 1
    return ",".join(out)


# ----------------------------------------------------------------------------
# Entry points


def verify_schedules(schedules: Sequence[Schedule], layouts=(), label: str | None = None) -> None:
    """Check the schedules of every rank of one call (schedules[r] is rank
    r's) symbolically, plus against each layout of concrete block sizes in
    ``layouts`` (each a per-rank mapping buffer -> block sizes). Raises
    VerificationError on the first problem."""
    if not schedules:
        raise VerificationError("no schedules to verify")
    machine = _Machine(schedules, layouts, label)
    machine.run()


def verify(collective: str, algorithm: str, nranks: int, root: int = 0, segments: int = 1,
           block_sizes=None) -> None:
    """Verify one call: ``algorithm`` for ``collective`` on ``nranks`` ranks.

    ``block_sizes`` is a per-rank list of {buffer: block sizes in elements};
    by default several layouts from default_layouts() are checked. Raises
    VerificationError (an AssertionError) naming what is wrong.
    """
    if not COLLECTIVES[collective].rooted:
        root = 0
    schedules = [algorithms.build(collective, algorithm, nranks, r, root, segments)
                 for r in range(nranks)]
    if block_sizes is None:
        layouts = default_layouts(collective, nranks, algorithms.uniform_blocks_only(collective, algorithm))
    else:
        layouts = (block_sizes,)
    label = f"{algorithm} {collective}, nranks={nranks}, root={root}, segments={segments}"
    verify_schedules(schedules, layouts, label)


def _roots(nranks: int) -> tuple:
    return tuple(sorted({0, nranks // 2, nranks - 1}))


def verify_algorithm(collective: str, algorithm: str, nranks=range(1, 65), segments=(1, 2, 3),
                     roots=None, concrete_max_nranks: int = 16) -> int:
    """Verify ``algorithm`` for ``collective`` for every n in ``nranks``,
    the given segments and roots (default: 0, n//2 and n-1 for rooted
    collectives). Up to ``concrete_max_nranks`` ranks every segments value is
    checked, symbolically and with concrete sizes. Above, to keep the sweep
    fast, the check is symbolic only and covers every segments value for n
    one below or at a multiple of 8 (23, 24, 31, 32, ...) and the first value
    for the other n: the schedules come from the same code at every n, and
    pipelining and size bugs show at small n already.
    Returns the number of distinct calls verified; raises VerificationError.
    """
    rooted = COLLECTIVES[collective].rooted
    uniform = algorithms.uniform_blocks_only(collective, algorithm)
    if not algorithms.pipelined(collective, algorithm):
        segments = segments[:1]  # the schedules do not depend on it
    runs = 0
    for n in nranks:
        small = n <= concrete_max_nranks
        layouts = default_layouts(collective, n, uniform) if small else ()
        some = segments if small or n % 8 in (0, 7) else segments[:1]
        for root in (roots(n) if callable(roots) else roots or _roots(n)) if rooted else (0,):
            if not 0 <= root < n:
                continue
            for s in dict.fromkeys(some):
                schedules = [algorithms.build(collective, algorithm, n, r, root, s) for r in range(n)]
                label = f"{algorithm} {collective}, nranks={n}, root={root}, segments={s}"
                verify_schedules(schedules, layouts, label)
                runs += 1
    return runs


class Result(NamedTuple):
    """One row of verify_all: how many calls were verified, in how long, and
    the error (None when all passed)."""

    collective: str
    algorithm: str
    runs: int
    seconds: float
    error: str | None


def verify_all(max_nranks: int = 64, segments=(1, 2, 3), roots=None, collectives=None,
               algorithm_names=None, concrete_max_nranks: int = 16) -> list[Result]:
    """Verify every registered (collective, algorithm), for nranks 1..max_nranks.
    Failures are reported in the results, not raised."""
    results = []
    for collective, names in algorithms.table():
        if collectives and collective not in collectives:
            continue
        for name in names:
            if algorithm_names and name not in algorithm_names:
                continue
            start = time.perf_counter()
            error, runs = None, 0
            try:
                runs = verify_algorithm(collective, name, range(1, max_nranks + 1), segments, roots,
                                        concrete_max_nranks)
            except VerificationError as exc:
                error = str(exc)
            results.append(Result(collective, name, runs, time.perf_counter() - start, error))
    return results


def main(argv=None) -> int:
    """``python -m collie.verify``: verify every algorithm, print a table,
    return 1 if anything failed."""
    parser = argparse.ArgumentParser(prog="collie verify",
                                     description="Prove every collective algorithm correct "
                                     "for nranks 1..N (symbolically, and with concrete sizes).")
    parser.add_argument("-n", "--max-nranks", type=int, default=64)
    parser.add_argument("-s", "--segments", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("-c", "--collective", action="append", help="only this collective (repeatable)")
    parser.add_argument("-a", "--algorithm", action="append", help="only this algorithm (repeatable)")
    parser.add_argument("--concrete-max-nranks", type=int, default=16,
                        help="check concrete block sizes up to this many ranks (default 16)")
    args = parser.parse_args(argv)
    results = verify_all(args.max_nranks, tuple(args.segments), None, args.collective, args.algorithm,
                         args.concrete_max_nranks)
    width = max([len(f"{r.collective} {r.algorithm}") for r in results] + [20])
    print(f"{'collective algorithm':<{width}}  {'calls':>6}  {'seconds':>7}  result")
    for r in results:
        status = "ok" if r.error is None else "FAIL"
        print(f"{r.collective + ' ' + r.algorithm:<{width}}  {r.runs:>6}  {r.seconds:>7.2f}  {status}")
    failed = [r for r in results if r.error]
    for r in failed:
        print(f"\n{r.collective} {r.algorithm}: {r.error}")
    total = sum(r.runs for r in results)
    print(f"\n{len(results) - len(failed)}/{len(results)} algorithms verified "
          f"({total} calls, nranks 1..{args.max_nranks}, segments {args.segments})")
    return 1 if failed or not results else 0


if __name__ == "__main__":
    sys.exit(main())
