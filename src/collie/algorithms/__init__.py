"""Every collective algorithm of collie, as schedules, and the registry of them.

An algorithm is a *builder*: a pure function ``f(nranks, rank, root,
segments) -> Schedule`` that says what one rank does (see collie.schedule).
Builders are registered per collective with ``@register(collective, name)``;
``build`` looks them up, checks the arguments, and memoizes the result
(schedules are immutable, and every rank of every call of the same shape asks
for the same one). ``segments`` >= 1 is a pipelining knob: builders registered
with ``pipelined=True`` cut each block into more parts and overlap them across
steps; for the others ``build`` passes segments=1, so that calls differing
only in segments share one schedule.

One module per algorithm family; ``table()`` says which collectives each one
implements (docs/algorithms.md gives their steps and bytes on the wire):

  direct              every collective: one hop from origin to destination
  ring                all_reduce all_gather reduce_scatter broadcast reduce barrier
  tree                broadcast reduce gather scatter all_reduce barrier (binomial)
  dbtree              all_reduce broadcast reduce (NCCL's double binary tree)
  recursive_doubling  all_reduce all_gather barrier
  rabenseifner        all_reduce reduce_scatter reduce
  bruck               all_gather all_to_all
  pairwise            all_to_all
  shm                 every collective but barrier, among ranks of one host:
                      one-sided reads from the peers' shared windows
  hier                all_reduce broadcast reduce all_gather reduce_scatter
                      barrier over several hosts: shared memory inside
                      each, the least data between them

The helpers below are shared by the builders: they write an algorithm as a
list of (time, op) events, where a send and its matching receive carry the
same time. Grouping events by time into steps then gives schedules that run in
lockstep: at time t every rank waits only for peers that are also at time t,
so they cannot deadlock, and messages between two ranks are posted in the same
order on both sides.
"""

from __future__ import annotations

import functools
import itertools
import operator
from collections.abc import Callable, Iterable
from typing import NamedTuple

from ..schedule import COLLECTIVES, Chunk, Chunks, Recv, Reduce, Schedule, Send

__all__ = [
    "ALGORITHMS",
    "register",
    "algorithms_for",
    "build",
    "table",
    "uniform_blocks_only",
    "pipelined",
    "topological",
]

Builder = Callable[[int, int, int, int], Schedule]

# collective -> algorithm name -> builder, in registration order.
ALGORITHMS: dict[str, dict[str, Builder]] = {name: {} for name in COLLECTIVES}

# (collective, algorithm) pairs whose schedules are only right when every
# block of every rank has the same size (see bruck's all_to_all), and those
# that use ``segments``.
_UNIFORM_ONLY: set[tuple[str, str]] = set()
_PIPELINED: set[tuple[str, str]] = set()
# Those whose schedules depend on which ranks share a host (hier).
_TOPOLOGY: set[tuple[str, str]] = set()


def register(collective: str, name: str, *, uniform_blocks: bool = False, pipelined: bool = False,
             topology: bool = False):
    """Decorator: register ``builder`` as algorithm ``name`` of ``collective``.

    ``uniform_blocks=True`` marks an algorithm that needs every block of every
    rank to have the same size (the tuner must not pick it otherwise);
    ``pipelined=True`` one whose schedule depends on ``segments``;
    ``topology=True`` one whose builder also takes ``hosts``, the host of
    each rank (any hashable labels).
    """
    if collective not in COLLECTIVES:
        raise ValueError(f"unknown collective {collective!r}; collectives are {sorted(COLLECTIVES)}")

    def decorate(builder: Builder) -> Builder:
        if name in ALGORITHMS[collective]:
            raise ValueError(f"{collective} already has an algorithm named {name!r}")
        ALGORITHMS[collective][name] = builder
        if uniform_blocks:
            _UNIFORM_ONLY.add((collective, name))
        if pipelined:
            _PIPELINED.add((collective, name))
        if topology:
            _TOPOLOGY.add((collective, name))
        return builder

    return decorate


def algorithms_for(collective: str) -> list[str]:
    """Names of the algorithms registered for ``collective``."""
    if collective not in ALGORITHMS:
        raise ValueError(f"unknown collective {collective!r}; collectives are {sorted(ALGORITHMS)}")
    return list(ALGORITHMS[collective])


def table() -> tuple[tuple[str, tuple[str, ...]], ...]:
    """(collective, algorithm names) for every collective, in COLLECTIVES order."""
    return tuple((c, tuple(ALGORITHMS[c])) for c in COLLECTIVES)


def uniform_blocks_only(collective: str, algorithm: str) -> bool:
    """Whether the algorithm is only right when all blocks have one size."""
    return (collective, algorithm) in _UNIFORM_ONLY


def pipelined(collective: str, algorithm: str) -> bool:
    """Whether the algorithm's schedules depend on ``segments``."""
    return (collective, algorithm) in _PIPELINED


def topological(collective: str, algorithm: str) -> bool:
    """Whether the algorithm's schedules depend on which ranks share a host."""
    return (collective, algorithm) in _TOPOLOGY


def _index(name: str, value) -> int:
    if isinstance(value, bool):
        raise ValueError(f"{name} must be an integer, not {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise ValueError(f"{name} must be an integer, not {value!r}") from None


def build(collective: str, algorithm: str, nranks: int, rank: int, root: int = 0,
          segments: int = 1, hosts=None) -> Schedule:
    """The schedule of ``rank`` for one call of ``collective`` with ``algorithm``.

    ``hosts`` (a label per rank; None: all on one host) matters only to
    topological algorithms. Raises ValueError for an unknown collective or
    algorithm (listing those available) and for a bad nranks, rank, root,
    segments or hosts. The root of a collective that has none is taken as 0,
    and segments as 1 for an algorithm that does not pipeline, so equal
    calls share one schedule.
    """
    if collective not in ALGORITHMS:
        raise ValueError(f"unknown collective {collective!r}; collectives are {sorted(ALGORITHMS)}")
    if algorithm not in ALGORITHMS[collective]:
        raise ValueError(f"{collective} has no algorithm {algorithm!r}; "
                         f"available: {', '.join(ALGORITHMS[collective])}")
    nranks = _index("nranks", nranks)
    rank = _index("rank", rank)
    root = _index("root", root)
    segments = _index("segments", segments)
    if nranks < 1:
        raise ValueError(f"nranks must be >= 1, got {nranks}")
    if not 0 <= rank < nranks:
        raise ValueError(f"rank {rank} is outside [0, {nranks})")
    if not 0 <= root < nranks:
        raise ValueError(f"root {root} is outside [0, {nranks})")
    if segments < 1:
        raise ValueError(f"segments must be >= 1, got {segments}")
    if not COLLECTIVES[collective].rooted:
        root = 0
    if (collective, algorithm) not in _PIPELINED:
        segments = 1
    if (collective, algorithm) in _TOPOLOGY:
        hosts = (0,) * nranks if hosts is None else tuple(hosts)
        if len(hosts) != nranks:
            raise ValueError(f"hosts gives {len(hosts)} ranks' hosts, not {nranks}")
        return _build_on(collective, algorithm, nranks, rank, root, segments, hosts)
    return _build(collective, algorithm, nranks, rank, root, segments)


# A process runs few call shapes; a sweep over many (the verifier, the
# simulator) should not keep them all.
@functools.lru_cache(maxsize=1024)
def _build(collective, algorithm, nranks, rank, root, segments):
    return ALGORITHMS[collective][algorithm](nranks, rank, root, segments)


@functools.lru_cache(maxsize=1024)
def _build_on(collective, algorithm, nranks, rank, root, segments, hosts):
    return ALGORITHMS[collective][algorithm](nranks, rank, root, segments, hosts)


# ----------------------------------------------------------------------------
# Helpers shared by the builders.

Event = tuple  # (time, op)


def make_schedule(collective: str, algorithm: str, nranks: int, rank: int, root: int,
                  events: Iterable[Event], parts: int = 1,
                  tmp_like: str | None = None) -> Schedule:
    """A Schedule whose steps are ``events`` grouped by time.

    Within a step, local ops (Copy, Reduce, Read) come first, then sends and
    receives, each in the order they were given: a builder that emits the
    messages of one time in a canonical order (the same on the sending and the
    receiving side) gets matching messages in posting order. Times with no
    op make no step.
    """
    by_time: dict = {}  # time -> (local ops, sends and receives)
    for time, op in events:
        ops = by_time.get(time)
        if ops is None:
            ops = by_time[time] = ([], [])
        ops[type(op) is Send or type(op) is Recv].append(op)
    steps = tuple(tuple(local + comm) for _, (local, comm) in sorted(by_time.items()))
    return Schedule(collective=collective, algorithm=algorithm, nranks=nranks, rank=rank,
                    steps=steps, parts=parts, root=root, tmp_like=tmp_like)


def land_then_add(time: int, peer: int, mine: Chunks, dst: Chunks) -> list:
    """Events that sum a message from ``peer`` and this rank's ``mine`` into
    ``dst``: the message lands in ``dst`` as it is at ``time``, and ``mine``
    is added at ``time + 1`` (a local Reduce, which runs before anything that
    step sends or combines). One pass over the data, where copying ``mine``
    in first and combining the message into it would take two; and a
    single-copy message is read straight into ``dst``, not through scratch."""
    return [(time, Recv(peer, dst)), (time + 1, Reduce(mine, dst))]


@functools.lru_cache(maxsize=1 << 16)
def block(buf: str, index: int, parts: int = 1) -> tuple[Chunk, ...]:
    """Every part of block ``index`` of ``buf``, in memory order (shared:
    schedules of many ranks name the same chunks)."""
    return tuple(Chunk(buf, index, p) for p in range(parts))


def blocks(buf: str, indices: Iterable[int], parts: int = 1) -> tuple[Chunk, ...]:
    """Every part of the given blocks of ``buf``, block by block."""
    if parts == 1:
        return tuple([block(buf, b)[0] for b in indices])
    return tuple(itertools.chain.from_iterable(block(buf, b, parts) for b in indices))


def log2_ceil(n: int) -> int:
    """Rounds needed for a set that doubles each round to cover n ranks."""
    return (n - 1).bit_length()


class Fold(NamedTuple):
    """``nranks`` folded onto ``p``, the largest power of two <= nranks, as
    recursive doubling and Rabenseifner do for any number of ranks: the first
    2*extra ranks pair up, the even one of each pair handing its data to the
    odd one, which stands for both among the p *active* ranks."""

    p: int
    extra: int

    @property
    def steps(self) -> int:
        """log2(p): the steps of a halving or doubling over the active ranks."""
        return self.p.bit_length() - 1

    def folded(self, rank: int) -> bool:
        """Whether rank is one of the pairs (odd: stands for both, even: waits)."""
        return rank < 2 * self.extra

    def active(self, rank: int) -> int | None:
        """The rank's id among the p active ranks (None for a waiting one)."""
        if rank < 2 * self.extra:
            return rank // 2 if rank % 2 else None
        return rank - self.extra

    def rank_of(self, ident: int) -> int:
        """The rank with active id ``ident``."""
        return 2 * ident + 1 if ident < self.extra else ident + self.extra

    def stood_for(self, lo: int, hi: int) -> range:
        """The ranks that active ids lo..hi-1 stand for: a contiguous range."""
        first = self.rank_of(lo) - (1 if lo < self.extra else 0)
        return range(first, self.rank_of(hi - 1) + 1)


def fold(nranks: int) -> Fold:
    """Fold ``nranks`` onto the largest power of two <= nranks (see Fold)."""
    p = 1 << (nranks.bit_length() - 1)
    return Fold(p, nranks - p)


# Importing the families registers them (the order is the listing order).
from . import direct, ring, tree, dbtree, recursive_doubling, rabenseifner, bruck, pairwise, shm, hier  # noqa: E402,F401
