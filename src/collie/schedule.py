"""The step vocabulary of collie: what an algorithm returns and the engine runs.

An algorithm is a pure function that returns, for one rank, a Schedule: a
tuple of steps, each step a tuple of ops. Nothing here knows about sockets or
shared memory; the same Schedule is run by the engine, proven by the verifier,
costed by the simulator and drawn by the visualizer.

Buffers and chunks
------------------
A collective works on at most three flat buffers per rank:

  "in"   the input, when the collective is out of place (left unchanged)
  "out"  the output (for in-place collectives, also the input)
  "tmp"  scratch with the same layout as the buffer named by Schedule.tmp_like
  "win"  this rank's shared window, laid out like Schedule.win_like: memory
         every rank on the host can read (only the shm algorithm uses it)

Each buffer is cut by the collective into *blocks* (COLLECTIVES below says
how many: all_gather's "out" has one block per rank, all_reduce's "out" one
block). The algorithm cuts every block further into ``Schedule.parts``
balanced *parts* (the first ``count % parts`` parts get one element more). A
Chunk names one part of one block of one buffer; a message is a tuple of
chunks, concatenated in the order given.

Execution semantics (the engine implements them, the verifier proves
schedules against them, the simulator costs them)
------------------------------------------------------------------------
Steps run in order. Within a step, first the local ops (Copy, Reduce, Read)
run in the order listed; then every Send and Recv of the step is posted at once, and
the step ends when all of them have completed. A send may complete only when
the peer has posted the matching receive (the verifier assumes no buffering),
so a schedule that is deadlock-free here is deadlock-free on any transport.
Messages from one rank to another are matched in the order they are posted.
Zero-byte messages are sent like any other, so every rank takes the same
steps whatever the sizes.

Two ops of a step must not both write one chunk, with one exception: the
reducing receives of a step whose chunks are the same (a *combining
group*) all combine into them, in the order they are listed, whatever the
order their messages arrive in (so the result is the same bits every time).
A rank that combines n-1 contributions can then take them in one step, and
an executor combine them a cache-sized piece at a time, every message's
piece while the destination's is in cache, where one per step streams the
whole destination through memory n-1 times.

A Read is one-sided: it copies from a peer's "win" without the peer taking
part, so the schedule must order it with messages, typically zero-byte
ones: the peer writes its window, then sends; the reader receives, then
reads in a later step, then sends; the peer receives before it writes that
part of its window again, and before its call ends (the next call, or the
next slice of this one, writes the window again). The verifier checks that
every Read is ordered so (a race on a window is a verification failure).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple, Union


class Chunk(NamedTuple):
    """Part ``part`` (of Schedule.parts) of block ``block`` of buffer ``buf``."""

    buf: str
    block: int
    part: int = 0


Chunks = tuple  # tuple[Chunk, ...]: pieces of one message, in order


class Send(NamedTuple):
    """Send the concatenation of ``chunks`` to ``peer``."""

    peer: int
    chunks: Chunks


class Recv(NamedTuple):
    """Receive a message from ``peer`` into ``chunks``; with ``reduce`` the
    incoming values are combined (with the call's reduce op) into what the
    chunks hold, instead of overwriting them (several such receives of one
    step into the same chunks combine in the order listed: see above)."""

    peer: int
    chunks: Chunks
    reduce: bool = False


class Copy(NamedTuple):
    """Copy ``src[i]`` into ``dst[i]`` for each i (chunks of equal size)."""

    src: Chunks
    dst: Chunks


class Reduce(NamedTuple):
    """Combine ``src[i]`` into ``dst[i]`` with the call's reduce op."""

    src: Chunks
    dst: Chunks


class Read(NamedTuple):
    """Copy ``src``, chunks of ``peer``'s window "win", into this rank's
    ``dst`` chunks; with ``reduce`` combine them into what ``dst`` holds.
    A local op: ``peer`` takes no part (see the module docstring)."""

    peer: int
    src: Chunks
    dst: Chunks
    reduce: bool = False


Op = Union[Send, Recv, Copy, Reduce, Read]
Step = tuple  # tuple[Op, ...]


@dataclass(frozen=True)
class Schedule:
    """What one rank does in one collective.

    ``steps`` is a tuple of steps, each a tuple of ops (see the module
    docstring for how they run). ``parts`` cuts every block into that many
    balanced parts. ``tmp_like`` names the buffer whose layout "tmp" copies,
    or None when the schedule uses no scratch; ``win_like`` likewise for the
    shared window "win".
    """

    collective: str
    algorithm: str
    nranks: int
    rank: int
    steps: tuple
    parts: int = 1
    root: int = 0
    tmp_like: str | None = None
    win_like: str | None = None

    def ops(self):
        """Every op of every step, in order."""
        for step in self.steps:
            yield from step


@dataclass(frozen=True)
class CollectiveSpec:
    """How a collective lays out its buffers, and what it must compute.

    ``in_blocks``/``out_blocks`` give the number of blocks of "in"/"out" as a
    function of the group size ``n``, 0 when the buffer does not exist.
    ``rooted`` collectives only have the root-only buffer (``root_only``) on
    the root. ``reduces`` says whether the collective combines values.
    """

    name: str
    in_blocks: object  # Callable[[int], int]
    out_blocks: object  # Callable[[int], int]
    rooted: bool = False
    root_only: str | None = None
    reduces: bool = False
    description: str = field(default="", compare=False)


def _zero(n: int) -> int:
    return 0


def _one(n: int) -> int:
    return 1


def _per_rank(n: int) -> int:
    return n


COLLECTIVES: dict[str, CollectiveSpec] = {
    spec.name: spec
    for spec in (
        CollectiveSpec("broadcast", _zero, _one, rooted=True,
                       description="every rank's out becomes the root's out"),
        CollectiveSpec("reduce", _zero, _one, rooted=True, reduces=True,
                       description="the root's out becomes the reduction of every out; "
                       "other ranks' out is left unchanged"),
        CollectiveSpec("all_reduce", _zero, _one, reduces=True,
                       description="every out becomes the reduction of every out"),
        CollectiveSpec("gather", _one, _per_rank, rooted=True, root_only="out",
                       description="block r of the root's out becomes rank r's in"),
        CollectiveSpec("all_gather", _one, _per_rank,
                       description="block r of every out becomes rank r's in"),
        CollectiveSpec("scatter", _per_rank, _one, rooted=True, root_only="in",
                       description="rank r's out becomes block r of the root's in"),
        CollectiveSpec("reduce_scatter", _per_rank, _one, reduces=True,
                       description="rank r's out becomes the reduction of block r of every in"),
        CollectiveSpec("all_to_all", _per_rank, _per_rank,
                       description="block q of rank r's out becomes block r of rank q's in"),
        CollectiveSpec("barrier", _zero, _one,
                       description="no rank leaves before every rank has arrived "
                       "(an all_reduce of zero elements)"),
    )
}


def part_bounds(start: int, stop: int, parts: int, part: int) -> tuple[int, int]:
    """Element range [lo, hi) of part ``part`` of ``parts`` balanced parts of
    [start, stop): the first (stop - start) % parts parts get one more."""
    count = stop - start
    base, extra = divmod(count, parts)
    lo = start + part * base + min(part, extra)
    hi = lo + base + (1 if part < extra else 0)
    return lo, hi


def block_offsets(sizes) -> tuple[int, ...]:
    """Offsets (in elements) of blocks of the given sizes, plus the end."""
    offsets = [0]
    for size in sizes:
        offsets.append(offsets[-1] + int(size))
    return tuple(offsets)


def chunk_range(offsets, parts: int, chunk: Chunk) -> tuple[int, int]:
    """Element range [lo, hi) of ``chunk`` in a buffer whose blocks start at
    ``offsets`` (as returned by block_offsets)."""
    return part_bounds(offsets[chunk.block], offsets[chunk.block + 1], parts, chunk.part)


def chunks_of(buf: str, blocks, parts) -> Chunks:
    """All chunks of ``buf`` over the given block and part indices, block-major
    (so that consecutive chunks are contiguous in memory)."""
    return tuple(Chunk(buf, b, p) for b in blocks for p in parts)
