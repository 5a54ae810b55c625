"""The verifier: proves that the schedules of an algorithm compute their
collective, for every rank, without deadlock, races or size mismatches.

It runs the schedules of all ranks of one call together, the way the engine
would (collie.schedule's execution semantics), on *symbols* instead of
numbers: every part of every block of every buffer holds the set of
contributions it has, initially {(rank, buffer, block, part)} for data a rank
starts with and a distinct garbage symbol for everything else (the "out" of
non-root ranks in broadcast, every "tmp" and "win"...). Copy, Read and a
plain Recv replace what a chunk holds; Reduce and the reducing Recv and Read
take the union, and fail if either side is garbage or if the two share a
contribution (it would be counted twice). At the end every rank's result must be exactly what the collective
promises, e.g. all_reduce: part p of every "out" holds {(q, "out", 0, p) for
every rank q}; all_to_all: block q of rank r's "out" holds {(q, "in", r, p)}.

While running it also checks what symbols cannot see:

- deadlock: a send completes only when the peer has posted the matching
  receive (no buffering), and messages between two ranks match in posting
  order; if no rank can move while some are unfinished, the error lists where
  each stuck rank is and what it waits for;
- races: within a step, two sends/receives writing one chunk (but reducing
  receives into the very same chunks: a combining group, see
  collie.schedule), or one writing a chunk another reads; a Copy or Reduce
  whose destination overlaps itself;
- bad references: a peer outside [0, n) or the rank itself, a buffer the rank
  does not have (gather's "out" off the root...), a block or part out of
  range, any write to "in" (inputs are read-only);
- windows: a Read of a peer's "win" must be ordered after the peer's write
  of it and before the peer writes it again or finishes, by chains of
  messages (sender to receiver only: a transport may buffer sends);
- sizes: with concrete block sizes (elements per block, per rank and buffer,
  cut into parts by collie.schedule.part_bounds) every message must have as
  many chunks as its receive, each of the same size, and every Copy/Reduce/
  Read must pair chunks of equal size. The default layouts include zero-size
  blocks, sizes that parts do not divide, and (all_to_all) different sizes
  for every pair of ranks.

Run ``python -m collie.verify`` to check every registered algorithm.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import sys
import time
from collections import deque
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from . import algorithms
from .schedule import COLLECTIVES, Chunk, Copy, Read, Recv, Reduce, Schedule, Send, part_bounds

__all__ = [
    "VerificationError",
    "verify",
    "verify_schedules",
    "rounds",
    "verify_algorithm",
    "verify_all",
    "default_layouts",
    "Result",
    "main",
]

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

    def sizes(r, buf):
        found = layout[r].get(buf)
        return None if found is None else [int(x) for x in found]

    def same(what, a, b):
        if a is not None and b is not None and a != b:
            raise ValueError(f"block_sizes are inconsistent for {collective}: {what} ({a} != {b})")

    n = nranks
    ins = [sizes(r, "in") for r in range(n)]
    outs = [sizes(r, "out") for r in range(n)]
    for r in range(n):
        if collective in _IN_PLACE:
            same(f"'out' of ranks 0 and {r}", outs[0], outs[r])
        elif collective in ("gather", "all_gather"):
            same(f"rank {r} 'out' vs the ranks' 'in'",
                 outs[r], None if None in ins else [x[0] for x in ins])
        elif collective in ("scatter", "reduce_scatter"):
            same(f"rank {r} 'in' vs the ranks' 'out'",
                 ins[r], None if None in outs else [x[0] for x in outs])
        elif collective == "all_to_all":
            column = None if None in ins else [ins[q][r] for q in range(n)]
            same(f"rank {r} 'out' vs block {r} of the ranks' 'in'", outs[r], column)


def _has_buffer(spec, buf: str, rank: int, root: int) -> bool:
    blocks = spec.in_blocks if buf == "in" else spec.out_blocks
    return blocks(1) > 0 and not (spec.root_only == buf and rank != root)


# ----------------------------------------------------------------------------
# The simulation

_COPY, _REDUCE, _READ = 0, 1, 2  # kinds of local ops


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
    if isinstance(op, Read):
        return f"Read(rank {op.peer}'s {chunks(op.src)} -> {chunks(op.dst)}{' reduce' if op.reduce else ''})"
    return repr(op)


class _Machine:
    """All ranks of one call: their buffers (as bit sets of symbols), their
    compiled schedules, and the message queues between them.

    Windows: when a schedule has one, the machine also keeps a vector clock
    per rank (what it knows of every rank's progress, through messages only:
    sender to receiver, never the other way, since a transport may buffer
    sends) and, per window chunk, its last write and the reads since. A Read
    must know of the write it reads, and the owner must know of every Read
    of a chunk before it writes the chunk again or finishes the call (the
    window is reused by the next call).
    """

    def __init__(self, schedules: Sequence[Schedule], layouts, label: str | None):
        first = schedules[0]
        self.n = n = first.nranks
        self.collective = first.collective
        self.root = first.root
        self.parts = parts = first.parts
        self.ctx = _Ctx(label or f"{first.algorithm} {first.collective}, nranks={n}, root={first.root}, "
                        f"parts={first.parts}", first.collective, first.algorithm, n)
        self._check_headers(schedules)
        spec = COLLECTIVES[self.collective]
        nin, nout = spec.in_blocks(n), spec.out_blocks(n)
        self.nblocks = {"in": nin, "out": nout}
        # Locations of a rank: "in" parts, then "out", "tmp" and "win".
        scratch = max(nin, nout) * parts
        self.base = {"in": 0, "out": nin * parts, "tmp": (nin + nout) * parts,
                     "win": (nin + nout) * parts + scratch}
        self.width = (nin + nout) * parts + 2 * scratch
        # Symbol of location l of rank r: bit r*width + l; its garbage: that
        # bit shifted by `garbage`, so "holds garbage" is `value >> garbage`.
        self.garbage = n * self.width
        self.like = [{"tmp": s.tmp_like, "win": s.win_like} for s in schedules]
        self.has = [self._buffers(r) for r in range(n)]
        self.value = [self._initial(r) for r in range(n)]
        self.sizes = [self._sizes(layout) for layout in layouts]
        self._tables: dict = {}
        self._getters = [self._table(r).__getitem__ for r in range(n)]
        self.steps = [self._compile(r, s) for r, s in enumerate(schedules)]
        self.barrier = self.collective == "barrier"
        self.windows = any(s.win_like is not None for s in schedules)
        self._all_ranks = None

    # -- setup ---------------------------------------------------------------

    def _check_headers(self, schedules):
        ctx = self.ctx
        if self.collective not in COLLECTIVES:
            _fail(ctx, f"unknown collective {self.collective!r}")
        if len(schedules) != self.n:
            _fail(ctx, f"{len(schedules)} schedules for nranks={self.n}")
        spec = COLLECTIVES[self.collective]
        for r, s in enumerate(schedules):
            for field, want in (("rank", r), ("nranks", self.n), ("collective", self.collective),
                                ("algorithm", ctx.algorithm), ("root", self.root), ("parts", self.parts)):
                if getattr(s, field) != want:
                    _fail(ctx, f"schedule has {field}={getattr(s, field)!r}, expected {want!r}", rank=r)
            if s.parts < 1:
                _fail(ctx, f"parts must be >= 1, got {s.parts}", rank=r)
            for name in ("tmp_like", "win_like"):
                like = getattr(s, name)
                if like is not None and (like not in ("in", "out") or
                                         not (spec.in_blocks if like == "in" else spec.out_blocks)(self.n)):
                    _fail(ctx, f"{name}={like!r} names no buffer of {s.collective}", rank=r)

    def _buffers(self, r: int) -> dict:
        """buffer -> number of blocks, for the buffers rank r has."""
        spec = COLLECTIVES[self.collective]
        has = {buf: count for buf, count in self.nblocks.items()
               if count and _has_buffer(spec, buf, r, self.root)}
        for buf, like in self.like[r].items():
            if like is not None:
                has[buf] = self.nblocks[like]
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
                source = self.like[r].get(buf) or buf
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

    def _loc(self, r, chunk, step, op, whose=None):
        if not isinstance(chunk, Chunk):
            _fail(self.ctx, f"{chunk!r} is not a Chunk", r, step, op)
        owner = r if whose is None else whose
        count = self.has[owner].get(chunk.buf)
        if count is None:
            who = "this rank" if whose is None else f"rank {whose}"
            _fail(self.ctx, f"uses buffer {chunk.buf!r}, which {who} does not have", r, step, op)
        if not (0 <= chunk.block < count and 0 <= chunk.part < self.parts):
            _fail(self.ctx, f"chunk {chunk.buf}[{chunk.block}].{chunk.part} is out of range "
                  f"({count} blocks of {self.parts} parts)", r, step, op)
        return self.base[chunk.buf] + chunk.block * self.parts + chunk.part

    def _compile(self, r: int, schedule: Schedule) -> list:
        """Steps as (local ops, comm ops) over location numbers, checked for
        bad references, races and mismatched local sizes. (The loop is the
        verifier's hot spot, hence the inlined happy paths.)"""
        compiled = []
        get = self._getters[r]
        n, first_out, first_win = self.n, self.base["out"], self.base["win"]

        def bad_chunks(chunks, s, i, op, whose=None):
            return tuple(self._loc(r, c, s, (i, op), whose) for c in chunks)

        def bad_peer(peer, s, i, op):
            _fail(self.ctx, f"peer {peer} is not another rank of [0, {n})", r, s, (i, op))

        for s, step in enumerate(schedule.steps):
            local, comm = [], []
            reads, writes = [], []
            for i, op in enumerate(step):
                kind = type(op)
                if kind is Send or kind is Recv:
                    peer = op.peer
                    if peer == r or not 0 <= peer < n or type(peer) is not int:
                        bad_peer(peer, s, i, op)
                    try:
                        locs = tuple(map(get, op.chunks))
                    except (KeyError, TypeError):
                        locs = bad_chunks(op.chunks, s, i, op)
                    if kind is Send:
                        reads += locs
                        comm.append((True, peer, locs, False, i, op, r * n + peer))
                    else:
                        if locs and min(locs) < first_out:
                            self._wrote_in(r, s, i, op)
                        writes += locs
                        comm.append((False, peer, locs, op.reduce, i, op, peer * n + r))
                elif kind is Copy or kind is Reduce or kind is Read:
                    peer = r
                    if kind is Read:
                        peer = op.peer
                        if peer == r or not 0 <= peer < n or type(peer) is not int:
                            bad_peer(peer, s, i, op)
                        if "win" not in self.has[peer]:
                            _fail(self.ctx, f"reads the window of rank {peer}, which has none", r, s, (i, op))
                        try:
                            src = tuple(map(self._getters[peer], op.src))
                        except (KeyError, TypeError):
                            src = bad_chunks(op.src, s, i, op, whose=peer)
                        if src and min(src) < first_win:
                            _fail(self.ctx, f"reads rank {peer}'s {self._name(min(src))}: only "
                                  f"its window can be read", r, s, (i, op))
                    else:
                        try:
                            src = tuple(map(get, op.src))
                        except (KeyError, TypeError):
                            src = bad_chunks(op.src, s, i, op)
                    try:
                        dst = tuple(map(get, op.dst))
                    except (KeyError, TypeError):
                        dst = bad_chunks(op.dst, s, i, op)
                    if len(src) != len(dst):
                        _fail(self.ctx, f"{len(src)} source chunks for {len(dst)} destinations", r, s, (i, op))
                    if len(set(dst)) != len(dst) or (kind is not Read and not set(src).isdisjoint(dst)):
                        _fail(self.ctx, "destination chunks repeat or overlap the sources", r, s, (i, op))
                    if dst and min(dst) < first_out:
                        self._wrote_in(r, s, i, op)
                    for k, sizes in enumerate(self.sizes):
                        a, b = [sizes[peer][l] for l in src], [sizes[r][l] for l in dst]
                        if a != b:
                            _fail(self.ctx, f"source sizes {a} != destination sizes {b} "
                                  f"(layout {k})", r, s, (i, op))
                    code = _READ if kind is Read else _REDUCE if kind is Reduce else _COPY
                    combine = op.reduce if kind is Read else kind is Reduce
                    local.append((code, src, dst, i, op, peer, combine))
                else:
                    _fail(self.ctx, f"unknown op {op!r}", r, s, (i, op))
            if writes:
                written = set(writes)
                if len(written) != len(writes) or not written.isdisjoint(reads):
                    self._race(r, s, comm)
            compiled.append((local, comm))
        return compiled

    def _wrote_in(self, r, s, i, op):
        _fail(self.ctx, "writes 'in', which must be left unchanged", r, s, (i, op))

    def _race(self, r, s, comm):
        seen: dict = {}
        for is_send, _peer, locs, reduce, i, _op, _key in comm:
            group = locs if reduce else None  # reducing receives into the same chunks combine in order
            for loc in locs:
                for j, other_write, other_group in seen.get(loc, ()):
                    if (other_write or not is_send) and (group is None or group != other_group):
                        _fail(self.ctx, f"race: ops {j} and {i} both touch {self._name(loc)} "
                              f"and at least one writes it", r, s)
                seen.setdefault(loc, []).append((i, not is_send, group))

    # -- symbols -------------------------------------------------------------

    def _name(self, loc: int) -> str:
        for buf in ("win", "tmp", "out", "in"):
            if loc >= self.base[buf]:
                b, p = divmod(loc - self.base[buf], self.parts)
                return f"{buf} block {b} part {p}"
        raise AssertionError(loc)

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
                if g:
                    garbage.append(f"garbage of rank {r} {self._name(loc)}")
                else:
                    groups.setdefault(self._name(loc), []).append(r)
            value >>= 1
            bit += 1
        items = [f"{name} of rank{'s' if len(ranks) > 1 else ''} {ranges_text(ranks)}"
                 for name, ranks in groups.items()]
        return "{" + "; ".join(items + garbage) + "}"

    def _combine(self, into: int, new: int, r: int, step: int, op, loc: int) -> int:
        if (into | new) >> self.garbage:
            _fail(self.ctx, f"combines garbage into {self._name(loc)}: "
                  f"{self._describe(new)} into {self._describe(into)}", r, step, op)
        if into & new and not self.barrier:
            _fail(self.ctx, f"counts contributions twice in {self._name(loc)}: "
                  f"{self._describe(into & new)}", r, step, op)
        return into | new

    # -- windows -------------------------------------------------------------

    def _start_windows(self) -> None:
        n = self.n
        self.vc = [[0] * n for _ in range(n)]  # vc[r][q]: the latest tick of q that r knows of
        self.tick = [0] * n  # three ticks a step: local ops, posting, end
        self.inbox = [[] for _ in range(n)]  # clocks of the messages received this step
        self.last_write = [{} for _ in range(n)]  # window location -> (tick, step)
        self.readers = [{} for _ in range(n)]  # window location -> [(reader, tick, step, op)]

    def _advance(self, r: int) -> None:
        self.tick[r] += 1
        self.vc[r][r] = self.tick[r]

    def _end_step(self, r: int) -> None:
        if self.inbox[r]:
            self.vc[r] = list(map(max, self.vc[r], *self.inbox[r]))
            self.inbox[r] = []
        self._advance(r)

    def _read(self, r: int, step: int, where, owner: int, locs) -> None:
        """Rank r reads locations of ``owner``'s window: it must know of the
        writes it reads; remember the read for the owner's next write."""
        known = self.vc[r][owner]
        for loc in locs:
            written = self.last_write[owner].get(loc)
            if written is not None and written[0] > known:
                _fail(self.ctx, f"reads rank {owner}'s {self._name(loc)}, which rank {owner} writes at "
                      f"its step {written[1]}, but no message rank {owner} sent after that write "
                      f"has reached this rank: the read may see the window before the write",
                      r, step, where)
            self.readers[owner].setdefault(loc, []).append((r, self.tick[r], step, where))

    def _write(self, r: int, step: int, where, locs, tick: int) -> None:
        """Rank r writes locations of its own window: every earlier Read of
        them must be known to have happened."""
        first = self.base["win"]
        for loc in locs:
            if loc < first:
                continue
            for reader, when, rstep, rwhere in self.readers[r].pop(loc, ()):
                if self.vc[r][reader] < when:
                    _fail(self.ctx, f"writes its {self._name(loc)} while rank {reader}'s read of it "
                          f"(its step {rstep} op {rwhere[0]}) may not have happened yet: no message "
                          f"rank {reader} sent after that read has reached this rank", r, step, where)
            self.last_write[r][loc] = (tick, step)

    def _check_reads_done(self) -> None:
        for owner in range(self.n):
            for loc, reads in self.readers[owner].items():
                for reader, when, rstep, rwhere in reads:
                    if self.vc[owner][reader] < when:
                        _fail(self.ctx, f"reads rank {owner}'s {self._name(loc)}, but rank {owner} can "
                              f"finish before it learns that the read is done, and the next call "
                              f"writes its window again", reader, rstep, rwhere)

    # -- running -------------------------------------------------------------

    def run(self) -> int:
        n = self.n
        pc = [0] * n
        remaining = [0] * n
        # src*n + dst -> deque of posted, unmatched (step, op entry, round, clock)
        sends: dict = {}
        recvs: dict = {}
        # Rounds: a step's messages are posted at its start, a message moves
        # in the round both sides have posted it, and a step ends one round
        # after its last message (local ops are free).
        clock = [0] * n
        ends = [0] * n
        ready = list(range(n))
        steps, value = self.steps, self.value
        checked = bool(self.sizes)
        garbage, barrier = self.garbage, self.barrier
        windows, first_win = self.windows, self.base["win"]
        if windows:
            self._start_windows()
        while ready:
            r = ready.pop()
            mine = steps[r]
            while pc[r] < len(mine):
                local, comm = mine[pc[r]]
                if windows:
                    self._advance(r)
                values = value[r]
                for code, src, dst, i, op, peer, combine in local:
                    if code == _READ:
                        self._read(r, pc[r], (i, op), peer, src)
                    source = value[peer]
                    new = [source[l] for l in src]
                    if windows and dst and max(dst) >= first_win:
                        self._write(r, pc[r], (i, op), dst, self.tick[r])
                    for l, v in zip(dst, new):
                        values[l] = self._combine(values[l], v, r, pc[r], (i, op), l) if combine else v
                if not comm:
                    if windows:
                        self._advance(r)
                        self._advance(r)
                    pc[r] += 1
                    continue
                mark = None
                if windows:
                    self._advance(r)
                    mark = tuple(self.vc[r])
                remaining[r] = len(comm)
                for entry in comm:
                    is_send, peer, key = entry[0], entry[1], entry[6]
                    waiting = (recvs if is_send else sends).get(key)
                    if not waiting:
                        posted_here = sends if is_send else recvs
                        queue = posted_here.get(key)
                        if queue is None:
                            queue = posted_here[key] = deque()
                        queue.append((pc[r], entry, clock[r], mark))
                        continue
                    other_step, other, posted, other_mark = waiting.popleft()
                    moved = max(posted, clock[r]) + 1
                    if moved > ends[r]:
                        ends[r] = moved
                    if moved > ends[peer]:
                        ends[peer] = moved
                    if is_send:
                        src, send, dst, recv, rstep, smark = r, entry, peer, other, other_step, mark
                    else:
                        src, send, dst, recv, rstep, smark = peer, other, r, entry, pc[r], other_mark
                    slocs, rlocs = send[2], recv[2]
                    if checked or len(slocs) != len(rlocs):
                        self._check_match(src, pc[r] if is_send else other_step, send, dst, rstep, recv)
                    if windows:
                        self.inbox[dst].append(smark)
                        if rlocs and max(rlocs) >= first_win:
                            self._write(dst, rstep, (recv[4], recv[5]), rlocs, self.tick[dst] + 1)
                    svalues, rvalues = value[src], value[dst]
                    if not rlocs:
                        pass  # a zero-chunk message only orders things
                    elif recv[3]:  # reduce
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
                        clock[peer] = ends[peer]
                        if windows:
                            self._end_step(peer)
                        ready.append(peer)
                if remaining[r]:
                    break
                pc[r] += 1
                clock[r] = ends[r]
                if windows:
                    self._end_step(r)
        stuck = [r for r in range(n) if pc[r] < len(steps[r])]
        if stuck:
            self._deadlock(stuck, pc, sends, recvs)
        if windows:
            self._check_reads_done()
        self._check_results()
        return max(clock, default=0)

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
            for key, entries in queue.items():
                src, dst = divmod(key, self.n)
                for _step, entry, _round, _mark in entries:
                    me = src if entry[0] else dst
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
        shared = None
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
                    _fail(self.ctx, f"barrier: leaves without hearing from ranks {ranges_text(missing)}", rank=r)
                continue
            # What every rank must hold is the same where the collective's
            # result does not depend on the rank: compute it once.
            same = self.collective in ("broadcast", "all_reduce", "gather", "all_gather")
            if not same or shared is None:
                wanted = [self._expected(r, b, p) for b in range(count) for p in range(self.parts)]
                shared = wanted if same else None
            got = values[start:start + count * self.parts]
            if got != wanted:
                k = next(k for k, (a, w) in enumerate(zip(got, wanted)) if a != w)
                b, p = divmod(k, self.parts)
                _fail(self.ctx, f"out block {b} part {p} holds {self._describe(got[k])}, "
                      f"expected {self._describe(wanted[k])}", rank=r)


def ranges_text(ranks) -> str:
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


@contextlib.contextmanager
def _gc_paused():
    """Pause the cyclic garbage collector: the verifier allocates millions
    of small objects, none in cycles, and each collection would rescan every
    live object (all memoized schedules) for nothing, doubling a sweep's time."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def verify_schedules(schedules: Sequence[Schedule], layouts: Sequence[Layout] = (),
                     label: str | None = None) -> int:
    """Check the schedules of every rank of one call (schedules[r] is rank
    r's) symbolically, plus against each layout of concrete block sizes in
    ``layouts`` (each a per-rank mapping buffer -> block sizes). Raises
    VerificationError on the first problem.

    Returns the call's length in rounds: with every message taking one round
    (moving in the first round both its send and its receive are posted)
    and local ops none, the round in which the last rank finishes."""
    if not schedules:
        raise VerificationError("no schedules to verify")
    with _gc_paused():
        return _Machine(schedules, layouts, label).run()


def host_layouts(nranks: int) -> list[tuple]:
    """Ways to place ``nranks`` ranks on hosts, for the algorithms whose
    schedules depend on it: one host, a host each, two and three hosts
    taking turns (a host's ranks need not be consecutive), two halves, and
    uneven ones (one rank alone; hosts of 1, 2, 3... ranks)."""
    n = nranks
    uneven, host, left = [], 0, n
    while left:
        take = min(host + 1, left)
        uneven += [host] * take
        host, left = host + 1, left - take
    candidates = [(0,) * n, tuple(range(n)), tuple(r % 2 for r in range(n)), tuple(r % 3 for r in range(n)),
                  tuple(int(r >= n // 2) for r in range(n)), tuple(int(r > 0) for r in range(n)),
                  tuple(uneven)]
    return list(dict.fromkeys(candidates))


def _layouts_of(collective: str, algorithm: str, nranks: int) -> list:
    return host_layouts(nranks) if algorithms.topological(collective, algorithm) else [None]


def rounds(collective: str, algorithm: str, nranks: int, root: int = 0, segments: int = 1,
           hosts=None) -> int:
    """Length of one call in rounds (see verify_schedules), verified
    symbolically on the way: the latency term of an algorithm, in messages."""
    schedules = [algorithms.build(collective, algorithm, nranks, r, root, segments, hosts)
                 for r in range(nranks)]
    return verify_schedules(schedules)


def verify(collective: str, algorithm: str, nranks: int, root: int = 0, segments: int = 1,
           block_sizes=None, hosts=None) -> None:
    """Verify one call: ``algorithm`` for ``collective`` on ``nranks`` ranks
    (placed on ``hosts``, for an algorithm that cares).

    ``block_sizes`` is a per-rank list of {buffer: block sizes in elements};
    by default several layouts from default_layouts() are checked. Raises
    VerificationError (an AssertionError) naming what is wrong.
    """
    if not COLLECTIVES[collective].rooted:
        root = 0
    schedules = [algorithms.build(collective, algorithm, nranks, r, root, segments, hosts)
                 for r in range(nranks)]
    if block_sizes is None:
        layouts = default_layouts(collective, nranks, algorithms.uniform_blocks_only(collective, algorithm))
    else:
        layouts = (block_sizes,)
    label = f"{algorithm} {collective}, nranks={nranks}, root={root}, segments={segments}" + (
        f", hosts={hosts}" if hosts is not None else "")
    verify_schedules(schedules, layouts, label)


def _roots(nranks: int) -> tuple:
    return tuple(sorted({0, nranks // 2, nranks - 1}))


def verify_algorithm(collective: str, algorithm: str, nranks=range(1, 65), segments=(1, 2, 3),
                     roots=None, concrete_max_nranks: int = 16) -> int:
    """Verify ``algorithm`` for ``collective`` for every n in ``nranks``,
    the given segments and roots (default: 0, n//2 and n-1 for rooted
    collectives). Returns the number of distinct calls verified; raises
    VerificationError.

    To keep a sweep to 64 ranks fast, it checks concrete sizes up to
    ``concrete_max_nranks`` ranks, every segments value up to twice that,
    and above only the first segments value (symbolically): the schedules
    come from the same code at every n, and size and pipelining bugs show at
    small n already.
    """
    rooted = COLLECTIVES[collective].rooted
    uniform = algorithms.uniform_blocks_only(collective, algorithm)
    if not algorithms.pipelined(collective, algorithm):
        segments = segments[:1]  # the schedules do not depend on it
    runs = 0
    with _gc_paused():
        for n in nranks:
            layouts = default_layouts(collective, n, uniform) if n <= concrete_max_nranks else ()
            some = segments if n <= 2 * concrete_max_nranks else segments[:1]
            chosen = roots(n) if callable(roots) else roots or _roots(n)
            for root in [q for q in chosen if 0 <= q < n] if rooted else [0]:
                for s in some:
                    for hosts in _layouts_of(collective, algorithm, n):
                        schedules = [algorithms.build(collective, algorithm, n, r, root, s, hosts)
                                     for r in range(n)]
                        label = f"{algorithm} {collective}, nranks={n}, root={root}, segments={s}" + (
                            f", hosts={hosts}" if hosts is not None else "")
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
    """Verify every registered (collective, algorithm), for nranks 1..max_nranks
    (see verify_algorithm for what is sampled). Failures, including builders
    that raise, are reported in the results, not raised."""
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
            except Exception as exc:  # a builder that crashes fails too, with its error
                error = f"{type(exc).__name__}: {exc}"
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
