"""The tuner: which algorithm, and how many pipeline segments, for one call.

Inputs: the collective, the bytes each rank contributes, the group size and
the transport between the group's ranks ("shm" when every peer is on this
host, else "tcp"). The choice is a short table of crossovers measured with
`collie bench --algo all` (docs/performance.md): small messages want the
fewest steps (latency), large ones the fewest bytes per rank (bandwidth).

Across hosts, where the link between them is known (measured at setup or
stated in COLLIE_TOPOLOGY, collie/topology.py) and slow enough to bound the
calls, a model replaces the table for the collectives that have a
hierarchical algorithm: collie.sim runs every algorithm's real schedule on an
alpha-beta model of that link (the ranks of a host sharing it) and of
shared memory inside a host, and the fastest predicted wins (``modelled``).
It is decided once per collective, power-of-two size band and layout of
hosts, at the band's lower end, and cached: every rank of a group computes
the same answer from the same inputs, and later calls pay a dictionary
look-up.

Users override it per call (algorithm="ring") or per process with
COLLIE_ALGO: "ring" forces ring on every collective that has it,
"all_reduce:ring,broadcast:tree" per collective. COLLIE_DEBUG=INFO prints
on rank 0, once per (collective, size band), what was chosen and why, as
NCCL_DEBUG_SUBSYS=TUNING does.
"""

from __future__ import annotations

import functools
import os
import sys
from typing import NamedTuple, Optional

from . import algorithms

KiB, MiB = 1 << 10, 1 << 20


class Choice(NamedTuple):
    algorithm: str
    segments: int
    reason: str


def parse_forced(spec: str) -> tuple[Optional[str], dict]:
    """COLLIE_ALGO -> (algorithm for every collective, {collective: algorithm})."""
    everywhere, per = None, {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        if ":" in item:
            coll, _, name = item.partition(":")
            if coll.strip() not in algorithms.ALGORITHMS:
                raise ValueError(f"COLLIE_ALGO names unknown collective {coll.strip()!r} "
                                 f"(known: {', '.join(sorted(algorithms.ALGORITHMS))})")
            per[coll.strip()] = name.strip()
        else:
            everywhere = item
    return everywhere, per


def _segments(nbytes: int, pieces: int, target: int) -> int:
    """Pipeline segments so that each message is about ``target`` bytes."""
    return max(1, min(64, nbytes // max(1, pieces * target)))


def _hier_segments(nbytes: int) -> int:
    """Across a slow link, hier all_reduce pipelines pieces of 512 KiB, up
    to 8: each piece's phases inside the hosts then overlap other pieces'
    transfers between them. On the test bed (2 hosts x 2 ranks, 1 Gbit/s,
    docs/multihost.md) 4 MiB took 35.1 ms so (the link's bound) against
    36.3-36.4 unpipelined, 16 MiB 141.9-144.3 against 154.3-154.4. Not on
    the unshaped bed, where the cores bound the call and every step costs
    them: there 8 pieces made 4 MiB 2.2x slower (15.6-17.6 ms against
    6.9-7.8), so the table and forced calls keep the general rule."""
    return max(1, min(8, nbytes // (512 * KiB)))


def _hierarchical(hosts) -> bool:
    """Several hosts, and some host with several ranks: where hier pays."""
    return hosts is not None and len(set(hosts)) > 1 and len(set(hosts)) < len(hosts)


# What the model (modelled) assumes inside a host: shared memory, at about
# half the rates docs/scale.md fitted for this 2-core machine (13 GB/s, 11
# GB/s reduce, 24 GB/s copy, 17 us a message), for ranks that share its
# cores with their TCP threads. The picks across a slow link did not move
# with these (the same with 10 us or 17 us a message).
INTRA = (17e-6, 1 / 6e9)           # alpha (s), beta (s/byte)
REDUCE_RATE, COPY_RATE = 5e9, 10e9  # bytes/s
MODELLED = ("all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter")
# Above this many ranks in the group, the table: a first call's simulations
# took up to 66 ms at 32 ranks (3 hosts taking turns: every rank simulated),
# 50 ms at 64 in even hosts but 1.1 s at 256.
MODEL_MAX_RANKS = 32
# Where the model decides, from the test bed's side-by-side runs of its picks
# and the table's (docs/multihost.md): on links of 1 Gbit/s (97-127 MB/s
# measured at setup) it picked as well as the table or better at every size
# from 64 KiB (tree broadcast and reduce 2x direct, direct reduce_scatter
# 2.5x rabenseifner on 3 hosts); on the unshaped bed (0.2-1 GB/s measured)
# TCP is bound by the cores, which parallel connections scale past, not by
# a link, and it lost to the table in many cells (0.37-0.95x), most of 3
# hosts x 1 rank's: faster links than MODEL_MAX_RATE keep the table.
MODEL_MAX_RATE = 150e6      # bytes/s
# The one place on that bed where the model picked worse: all_reduce of 64
# KiB, its hier 0.81-0.85 ms against the table's tree 0.54-0.64 (--algo all,
# two runs; 0.84x and 1.08x interleaved). The tree sends 128 KiB across in
# turn, 1.1 ms at the link's rate: a call that small slips through the
# shaper's 256 KB burst, which the model does not see. Below these sizes
# the table stays.
MODEL_FROM = {"all_reduce": 128 * KiB}


def default_choice(collective: str, nbytes: int, nranks: int, transport: str, hosts=None,
                   link=None, exclude=(), single_copy=None) -> Choice:
    """The tuned default for one call: the model's pick where a ``link``
    between hosts (topology.Link) is known and the group spans hosts, else
    the table's. ``exclude``: algorithms that cannot run this call.
    ``single_copy``: topology.Topology.single_copy, when measured."""
    if (link is not None and collective in MODELLED and hosts is not None and len(set(hosts)) > 1
            and nranks <= MODEL_MAX_RANKS and 1 / link[1] <= MODEL_MAX_RATE
            and nbytes >= MODEL_FROM.get(collective, 0)):
        name, reason = modelled(collective, max(nbytes, 1).bit_length(), tuple(hosts), tuple(link),
                                frozenset(exclude) - {"shm"})  # shm never runs across hosts
        return Choice(name, _segments_for(name, nbytes, nranks), reason)
    return table_choice(collective, nbytes, nranks, transport, hosts, single_copy)


def _segments_for(algorithm: str, nbytes: int, nranks: int) -> int:
    """Segments of an algorithm over TCP where the model picked it."""
    return _hier_segments(nbytes) if algorithm == "hier" else _segments(nbytes, nranks, 4 * MiB)


@functools.lru_cache(maxsize=1024)
def modelled(collective: str, band: int, hosts: tuple, link: tuple, exclude: frozenset) -> tuple[str, str]:
    """(algorithm, why): the one collie.sim predicts fastest for sizes of
    ``band`` (bit length: 2**(band-1) to 2**band - 1 bytes), simulated at
    the band's lower end on ``hosts`` (each rank's host) joined by ``link``
    ((alpha, beta) of the link between hosts, shared by a host's ranks)."""
    from . import sim
    size = 1 << (band - 1)
    n = len(hosts)
    model = sim.Model(sim.Link(*INTRA), sim.Link(*link), 1 / REDUCE_RATE, 1 / COPY_RATE, host_nic=True)
    times = {}
    for name in algorithms.algorithms_for(collective):
        if name == "shm" or name in exclude:
            continue
        times[name] = sim.simulate(collective, name, n, size, model=model, hosts=hosts,
                                   segments=_segments_for(name, size, n)).seconds
    ranked = sorted(times, key=times.get)
    best = ranked[0]
    runner = f", then {ranked[1]} {times[ranked[1]] * 1e3:.3g} ms" if len(ranked) > 1 else ""
    return best, (f"fastest in a model of the link between hosts ({1 / link[1] / 1e6:.0f} MB/s, "
                  f"{link[0] * 1e6:.0f} us): {times[best] * 1e3:.3g} ms at {size} bytes{runner}")


# Where the kernel's single copy of 1 MiB takes this many times a copy's time
# or more (topology.Topology.single_copy), the large 2-rank reductions go in
# pieces through the rings instead (see table_choice), and so do the core's
# batches and plain exchanges below the transport's threshold (core.py).
SLOW_SINGLE_COPY = 3.0


def single_copy_is_slow(cost: Optional[float]) -> bool:
    """Whether a measured single-copy ``cost`` (topology.Topology.single_copy,
    None: not measured) is SLOW_SINGLE_COPY or more."""
    return cost is not None and cost >= SLOW_SINGLE_COPY


def table_choice(collective: str, nbytes: int, nranks: int, transport: str, hosts=None,
                 single_copy=None) -> Choice:
    """The measured table's choice for one call.

    Crossovers measured with `collie bench --algo all` on a 2-core machine
    (docs/performance.md). Over shared memory, messages from 1-2 MiB go
    single copy (the reader copies straight out of the sender's memory), so
    the plain algorithms (direct, rabenseifner) win most large cases; the shm
    algorithm's windows still pay off where many ranks share few cores and
    each rank would otherwise wait on several hand-offs. Where single copy
    is slow (``single_copy`` >= SLOW_SINGLE_COPY), the 2-rank all_reduce
    from 4 MiB and reduce from 2 MiB take pipelined pieces through the rings
    instead.
    """
    if nranks == 1:
        return Choice("direct", 1, "one rank: local copies only")
    shm = transport == "shm"
    few = nranks <= 2
    # 5-8 ranks of one host (2026-11-28: 6 and 8 ranks on 2 cores, medians
    # of three `--algo all` runs, docs/performance.md): all_reduce by
    # recursive doubling under 64 KiB (8 B, six alternating runs: 25 and 31
    # us on 5 and 6 ranks against the tree's 44 and 71, level on 7), then
    # the shared windows (8 ranks: 75 against the tree's 136 at 64 KiB, 125
    # against dbtree's 238 at 256 KiB); broadcast through the windows at
    # 1-8 MiB (8 ranks: 197 against the tree's 525 at 1 MiB, 748 against
    # 1608 at 4 MiB), then direct (16 MiB: 3217 and 4738 us on 6 and 8
    # ranks against 3945 and 6125); reduce by dbtree from 1 MiB (386, 1583
    # and 6115 us on 6 ranks at 1, 4 and 16 MiB against the tree's 715,
    # 1976 and 8211; the windows won some sizes and lost others in a
    # second run).
    many = shm and 4 < nranks <= 8
    segs = _segments(nbytes, nranks, 1 * MiB if shm else 4 * MiB)
    # 2026-11-29, a 2-core AMD EPYC VM where single copy took 4.2-4.6x a
    # copy's time (plain arrays, two `--algo all` runs, us): all_reduce at
    # 4/16/64 MiB by ring in 1 MiB pieces 144-179/1016-1163/4617 against
    # single-copy rabenseifner's 650-714/2292-2403/6585-8348; reduce at
    # 2/4/16/64 MiB by dbtree 50-61/95-124/486-506/3473-3487 against single-copy
    # direct's 144-158/223-236/890-999/3998-4046. Registered buffers go single
    # copy either way (ring 4695-4944 us at 64 MiB against 5400-5800).
    rings = few and shm and single_copy_is_slow(single_copy)
    if rings and collective == "all_reduce" and nbytes >= 4 * MiB:
        return Choice("ring", segs, f"two ranks, large message, single copy slow here "
                                    f"({single_copy:.1f}x a copy): pieces through the rings")
    if rings and collective == "reduce" and nbytes >= 2 * MiB:
        return Choice("dbtree", segs, f"two ranks, large message, single copy slow here "
                                      f"({single_copy:.1f}x a copy): two halves in pieces through the rings")
    if collective == "barrier":
        if nranks <= 4:
            return Choice("direct", 1, "few ranks: one step of zero-byte messages")
        return Choice("recursive_doubling", 1, "dissemination: log2(n) steps")
    if collective == "all_reduce":
        if _hierarchical(hosts) and nbytes >= 4 * MiB:
            # On the test bed (2 hosts x 2 ranks, docs/multihost.md) hier won
            # from 4 MiB, shaped to 1 Gbit/s or not, and lost at 1 MiB.
            return Choice("hier", 1, "several hosts with several ranks each: shared memory inside "
                                     "hosts, each byte across the network once each way")
        if few:
            if nbytes < 128 * KiB:
                return Choice("direct", 1, "small message, two ranks: one exchange")
            if nbytes < 1 * MiB:
                return Choice("ring", 1, "two ranks, mid size: halves both ways, two steps")
            if shm and nbytes < 2 * MiB:
                return Choice("shm", 1, "two ranks on one host: one-sided reads of the halves")
            if shm and nbytes < 4 * MiB:
                # 2026-11-27 (docs/performance.md, "The tuner after the
                # threshold"): at 2 MiB the shared windows took 83-89 us in
                # two runs and 312-369 in the seven others (dbtree 107-164).
                # 2026-11-29, two alternating pairs: 569-587 against
                # rabenseifner's 600-651.
                return Choice("dbtree", segs, "two ranks, 2-4 MiB: two pipelined halves")
            # From 4 MiB, since the combining single-copy reads are shared
            # with their writers (_core.c's read_shared), two alternating
            # pairs of 15-20 calls each (2026-11-29): 4 MiB 783-823 us
            # against dbtree's 1100-1183, 8 MiB 1093-1332 against 2151-2420,
            # 16 MiB 2162-2576 against 3762-4841, 64 MiB 17.7-20.0 ms against
            # 22.7-23.4 (tree 16.1-18.6). (On 2026-11-27, before the sharing
            # and on another VM, dbtree took 0.7-0.8x rabenseifner's time.)
            return Choice("rabenseifner", 1, "large message: reduce-scatter then all-gather, single copy")
        if shm and nbytes < 64 * KiB and nranks & (nranks - 1) == 0:
            return Choice("recursive_doubling", 1, "small message, 2^k ranks: log2(n) exchanges, each rank busy in every one")
        if many and nbytes < 64 * KiB:
            return Choice("recursive_doubling", 1, "small message, 5-8 ranks of one host: log2(n) exchanges")
        if many and nbytes < 16 * MiB:
            return Choice("shm", 1, "5-8 ranks of one host, 64 KiB-16 MiB: one-sided reads, three barriers")
        if nbytes < 256 * KiB or not shm and nbytes < 2 * MiB:
            # Over TCP (test bed, 3 hosts x 1 rank, four runs): at 1 MiB the
            # tree took 2.4-3.5 ms and ring 3.7-4.6 (on 2 hosts x 2 ranks
            # 4.0-4.8 and 3.8-5.1); from 2 MiB ring caught up.
            return Choice("tree", segs, "small message, ranks sharing cores: fewest hand-offs")
        if shm and nranks > 4 and nbytes < 512 * KiB:
            # Measured on 4 ranks when a whole buffer went single copy from
            # 256 KiB and dbtree's halves stayed in the rings; on 3-4 ranks,
            # since, shm from 256 KiB (three runs, 2026-11-27: 35-37 us
            # against dbtree's 40-80). Not re-measured on more ranks.
            return Choice("dbtree", 1, "ranks sharing cores, 256-512 KiB: halves that stay in the rings")
        if shm and nbytes < 16 * MiB:
            return Choice("shm", 1, "mid size on one host: one-sided reads, three barriers")
        if shm:
            return Choice("rabenseifner", 1, "large message: halving then doubling, log2(n) steps")
        if nbytes // nranks < 64 * KiB:
            # Ring's 2(n-1) steps each move S/n bytes: with many ranks they are
            # too small to pay a step's latency (collie sim: 24,576 ranks,
            # 1 MiB, ring 100x rabenseifner's time).
            return Choice("rabenseifner", 1, "many ranks: ring's 2(n-1) steps of S/n bytes are latency-bound; "
                                             "halving then doubling moves as little in log2(n) steps")
        return Choice("ring", segs, "large message: ring moves 2(n-1)/n of the data per rank, the least")
    # Broadcast and reduce over shm, re-measured 2026-11-27 (`--algo all`,
    # three runs on 2 and 4 ranks, docs/performance.md, "The tuner after the
    # threshold"). Two ranks: dbtree's halves, one copied in while the other
    # is copied out (broadcast 256 KiB-4 MiB: 512 KiB 8 against direct's 19
    # us, 2 MiB 59 against 93; reduce from 256 KiB: 2 MiB 64-88 against
    # tree's 231-238, 64 MiB 3.2-3.5 ms against 7.3), but at 1 MiB, where
    # one whole message took 0.9x dbtree's time in four sets of runs (the
    # whole buffer and its halves both go through the rings there; from 2
    # MiB the whole one would go single copy). Three or four ranks:
    # dbtree at 512 KiB-1 MiB (broadcast 42-54 against direct's 79-94),
    # then the shared windows (broadcast 1-4 MiB 99 and 184 against 221 and
    # 464 at 1 and 2 MiB; reduce 1-8 MiB, 262 against 742 at 2 MiB), then
    # reduce's dbtree again from 8 MiB (2.0-2.1 ms against direct's 2.5-2.7).
    mid = shm and 2 < nranks <= 4
    # Across hosts (test bed, 2 hosts x 2 ranks, docs/multihost.md): hier
    # broadcast and reduce matched the best flat ones from 4 MiB at 1 Gbit/s
    # (and beat direct, the default for 4 ranks, 2x) and unshaped; hier
    # all_gather won from 16 MiB on both (1.3x, 1.2x) but lost unshaped at
    # 4 MiB.
    if collective in ("broadcast", "reduce") and _hierarchical(hosts) and nbytes >= 4 * MiB:
        return Choice("hier", 1, "several hosts with several ranks each: the buffer crosses into "
                                 "(or out of) each host once")
    if collective == "all_gather" and _hierarchical(hosts) and nbytes >= 16 * MiB:
        return Choice("hier", 1, "several hosts with several ranks each: each block enters each host once")
    if collective == "reduce_scatter" and _hierarchical(hosts) and nbytes >= 1 * MiB:
        # 1.2-1.3x the best flat one from 1 MiB at 1 Gbit/s; unshaped 1.1x
        # and 1.3x at 1 and 16 MiB, 0.88x at 4 MiB.
        return Choice("hier", 1, "several hosts with several ranks each: each host's sum of a block "
                                 "leaves it once")
    if collective == "broadcast":
        if few and shm and (256 * KiB <= nbytes < 1 * MiB or 2 * MiB <= nbytes < 4 * MiB):
            return Choice("dbtree", 1, "two ranks, 256 KiB-4 MiB but 1 MiB: two halves, one copied in "
                                       "while the other is copied out")
        if mid and 512 * KiB <= nbytes < 1 * MiB:
            return Choice("dbtree", 1, "three or four ranks, 512 KiB-1 MiB: two half-size trees")
        if mid and 1 * MiB <= nbytes < 4 * MiB:
            return Choice("shm", 1, "three or four ranks, 1-4 MiB: one-sided reads of the root's window")
        if many and 1 * MiB <= nbytes < 8 * MiB:
            return Choice("shm", 1, "5-8 ranks, 1-8 MiB: one-sided reads of the root's window")
        if many and nbytes >= 8 * MiB:
            return Choice("direct", 1, "5-8 ranks from 8 MiB: the root's sends at once, single copy")
        if nranks <= 4 or nbytes < 64 * KiB:
            return Choice("direct" if nranks <= 4 else "tree", 1, "few ranks or small message: fewest steps")
        return Choice("tree", segs, "pipelined binomial tree")
    if collective == "reduce":
        # Two ranks from 2 MiB (2026-11-29, three alternating pairs of 20
        # calls): direct's messages of 2 MiB go single copy, whose
        # combining the root shares with the sender (_core.c's
        # read_shared): 4 MiB 0.50-0.52 ms against dbtree's 0.64-0.80, 16
        # MiB 1.76-1.93 against 2.22-3.02, 64 MiB 11.2-12.6 against
        # 11.5-14.4.
        if few and shm and nbytes >= 2 * MiB:
            return Choice("direct", segs, "two ranks from 2 MiB: single copy, the combining shared "
                                          "with the sender")
        if few and shm and 256 * KiB <= nbytes < 1 * MiB:
            return Choice("dbtree", segs, "two ranks, 256 KiB-1 MiB: two halves, one copied in "
                                          "while the other is combined")
        if mid and 512 * KiB <= nbytes < 1 * MiB:
            return Choice("dbtree", 1, "three or four ranks, 512 KiB-1 MiB: two half-size trees")
        if mid and 1 * MiB <= nbytes < 8 * MiB:
            return Choice("shm", 1, "three or four ranks, 1-8 MiB: one-sided reads, the work shared")
        if mid and nbytes >= 8 * MiB:
            return Choice("dbtree", segs, "three or four ranks from 8 MiB: two pipelined trees")
        if many and nbytes >= 1 * MiB:
            return Choice("dbtree", segs, "5-8 ranks from 1 MiB: two pipelined trees share the inner ranks' work")
        if few and nbytes < 1 * MiB or nbytes < 64 * KiB:
            return Choice("tree", 1, "small message: the root combines as contributions arrive")
        if few:
            return Choice("tree", segs, "two ranks, large message: pipelined segments, single copy each")
        if nranks <= 4 and nbytes < 32 * MiB:
            return Choice("direct", 1, "few ranks: the root combines every contribution as it arrives")
        if shm and nbytes >= 32 * MiB:
            return Choice("dbtree", segs, "large message: two pipelined trees share the work of the inner ranks")
        return Choice("tree", segs, "pipelined binomial tree")
    if collective in ("all_gather", "reduce_scatter"):
        total = nbytes  # all_gather: the whole output; reduce_scatter: the whole input
        if collective == "all_gather" and few and total >= 32 * MiB:
            return Choice("bruck", 1, "two ranks, large message: one exchange, then one local rotation")
        # Re-measured 2026-11-27 (three runs on 2 and 4 ranks): the shared
        # windows at 1-8 MiB on 3-4 ranks (2 MiB: all_gather 107 us against
        # direct's 356, reduce_scatter 160 against 402), direct from 8 MiB;
        # on 2 ranks only at 1-2 MiB (all_gather 29-43 against 43-59,
        # reduce_scatter 30-46 against 45-58): from 2 MiB one run in three
        # took 3x its time (190 against 60 us), and so did the tuner's own
        # runs. On 4 ranks under 1 MiB, reduce_scatter's direct took 26-49
        # us where rabenseifner took 60-119 (256-512 KiB). On 2 ranks since
        # 2026-11-29 (Intel VM, two `--algo all` runs each way): direct's one
        # exchange goes single copy (core._exchanges), 97-109 us at 1 MiB
        # against the windows' 140-155 (all_gather), 86-99 against 178-193
        # (reduce_scatter).
        # reduce_scatter's direct combines its messages as a group since
        # 2026-11-29 (night, two --algo all runs each on 3 and 4 ranks): 4
        # MiB 1.04-1.31 ms against the windows' 1.37-1.59, 8 MiB 1.91-2.17
        # against 2.61-3.40; level at 1-2 MiB (1 MiB on 4 ranks: 473-607 us
        # against 432-436).
        top = 4 * MiB if collective == "reduce_scatter" else 8 * MiB
        if shm and 2 < nranks <= 4 and 1 * MiB <= total < top:
            return Choice("shm", 1, "mid size on one host: one-sided reads of the windows")
        # all_gather on 6 ranks (2026-11-28, one run): 1 MiB 91 us against
        # ring's 202, 4 MiB 498 against 1144, 8 MiB 1528 against 2000, then
        # 16 MiB 3898 against 4479 (within the spread of ring's own runs)
        # and 32 MiB even; on 8 ranks 1 MiB 127 against 204, 4 MiB 718
        # against 2135.
        if shm and nranks > 4 and 1 * MiB <= total < (16 if collective == "reduce_scatter" else 8) * MiB:
            return Choice("shm", 1, "mid size, ranks sharing cores: one-sided reads")
        # reduce_scatter on 5-7 ranks of one host (2026-11-28, 6 ranks,
        # medians of six alternating runs): the windows from the smallest
        # size, 28.8 us at 8 B and 36.2 at 64 KiB against Rabenseifner's
        # 54.5 and 60.5 (its ranks fold in pairs first) and direct's 37.7
        # and 52.3; on 8 ranks Rabenseifner stays (33 against 48 at 8 B,
        # even at 64 KiB).
        if collective == "reduce_scatter" and many and nranks < 8 and total < 16 * MiB:
            return Choice("shm", 1, "one host, 5-7 ranks: one-sided reads, no folding")
        if collective == "reduce_scatter" and not few and total < (256 * KiB if shm and nranks <= 4 else 1 * MiB):
            return Choice("rabenseifner", 1, "small message: recursive halving, log2(n) steps")
        if nranks <= 4:
            return Choice("direct", 1, "one step, no forwarding")
        # all_gather on 5-8 ranks of one host (2 cores, 2026-11-28, --algo
        # all): direct took 7-34 us from 1 KiB to 192 KiB where recursive
        # doubling took 12-155 and Bruck 13-158 (8 ranks, 64 KiB: 27 against
        # 63 and 37; 256 KiB: 72 against ring's 183); fewer steps do not pay
        # where every step waits on ranks that share cores.
        if collective == "all_gather" and many and total < 1 * MiB:
            return Choice("direct", 1, "one host, up to 8 ranks: one step, no forwarding")
        if total < 256 * KiB:
            return Choice("recursive_doubling" if collective == "all_gather" else "rabenseifner", 1,
                          "small message: log2(n) steps")
        return Choice("ring", 1, "large message: ring moves (n-1)/n of the data per rank")
    if collective == "all_to_all":
        # Two ranks: pairwise's one exchange goes single copy from 64 KiB
        # (core._exchanges; 2026-11-29, Intel VM: 95-103 us at 1 MiB against
        # the shared windows' 163-188, which the tuner took at 1-2 MiB before).
        if 2 < nranks <= 8:
            return Choice("direct", 1, "everyone sends to everyone in one step")
        return Choice("pairwise", 1, "one peer per step keeps every link busy")
    if collective in ("gather", "scatter"):
        if nranks <= 8 or nbytes >= 64 * KiB:
            return Choice("direct", 1, "root exchanges with every rank at once")
        return Choice("tree", 1, "small message, many ranks: log2(n) steps")
    return Choice("direct", 1, "the default")


class Tuner:
    """Per-process choices: forced ones from COLLIE_ALGO, else the table."""

    def __init__(self, environ=os.environ):
        self.everywhere, self.per = parse_forced(environ.get("COLLIE_ALGO", ""))
        self.debug = environ.get("COLLIE_DEBUG", "").upper() in ("INFO", "TRACE")
        self._said: set = set()

    def choose(self, collective: str, nbytes: int, nranks: int, transport: str,
               algorithm: Optional[str] = None, rank: int = 0, exclude: Optional[dict] = None,
               hosts=None, link=None, single_copy=None) -> Choice:
        """``exclude`` maps algorithms that cannot run this call to why (bruck
        on an all_to_all with uneven splits): forcing one per call is an
        error, forcing it with COLLIE_ALGO leaves the call to the tuner.
        ``hosts``: each rank's host; ``link``: the link between hosts, when
        known; ``single_copy``: its cost, when measured (see default_choice)."""
        exclude = exclude or {}
        have = {name: f for name, f in algorithms.ALGORITHMS[collective].items() if name not in exclude}
        if algorithm in exclude:
            raise ValueError(f"{collective} cannot use algorithm {algorithm!r} for this call "
                             f"({exclude[algorithm]}); choose one of {', '.join(sorted(have))}")
        default = default_choice(collective, nbytes, nranks, transport, hosts, link, exclude, single_copy)
        if default.algorithm not in have:  # excluded for this call (uneven blocks...)
            default = Choice("direct", 1, f"{default.algorithm} cannot run this call; direct can")
        if algorithm is not None:
            if algorithm not in have:
                raise ValueError(f"{collective} has no algorithm {algorithm!r}; "
                                 f"choose one of {', '.join(sorted(have))}")
            choice = Choice(algorithm, default.segments if algorithm == default.algorithm else
                            _segments(nbytes, nranks, MiB), "forced by algorithm=")
        elif collective in self.per:
            name = self.per[collective]
            if name not in have:
                raise ValueError(f"COLLIE_ALGO forces {collective}:{name}, but {collective} has "
                                 f"only {', '.join(sorted(have))}")
            choice = Choice(name, _segments(nbytes, nranks, MiB), f"forced by COLLIE_ALGO={collective}:{name}")
        elif self.everywhere in have:
            choice = Choice(self.everywhere, _segments(nbytes, nranks, MiB),
                            f"forced by COLLIE_ALGO={self.everywhere}")
        else:
            choice = default
        if self.debug and rank == 0:
            band = (collective, nranks, transport, max(nbytes, 1).bit_length())
            if band not in self._said:
                self._said.add(band)
                print(f"collie INFO tuner: {collective} {nbytes} bytes on {nranks} ranks over "
                      f"{transport}: {choice.algorithm} (segments={choice.segments}): {choice.reason}",
                      file=sys.stderr, flush=True)
        return choice
