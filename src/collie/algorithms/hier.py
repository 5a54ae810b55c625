"""Hierarchical: shared memory inside each host, the network only between hosts.

all_reduce, broadcast, reduce, all_gather, reduce_scatter, all_to_all
and barrier here; each crosses the slow links with the least data a flat algorithm
would send over them (every byte once per host that needs it), and the
verifier proves each for every layout of hosts (verify.host_layouts:
uneven hosts, a host's ranks not consecutive).

A flat ring over ranks on K hosts sends 2(n-1)/n of the buffer across the
slow links; this sends each byte across them only once each way, from the
one rank per host that owns it. all_reduce, for a layout ``hosts`` (the host
of each rank; hosts may hold different numbers of ranks):

1. reduce-scatter inside each host: the buffer is cut into M parts, M the
   most ranks on one host; on a host of m ranks, part p belongs to its
   local rank p mod m (a local rank owns several parts when m < M). In
   step s (1..m-1) local rank j sends to local rank j+s the parts that rank
   owns, and adds what j-s sends it into its own: every part is reduced
   over the host at its owner, one arrival per step.
2. all_reduce across hosts: part p has exactly one owner per host; those K
   owners run a ring over K sub-parts of p (reduce-scatter, then
   all-gather: 2(K-1) steps). A rank that owns several parts runs their
   rings side by side, one message per peer per step.
3. all-gather inside each host: in step s, local rank j sends its parts to
   local rank j+s and takes those of j-s.

With ``segments`` the buffer is cut into that many pieces, each going
through 1-3, piece i a step after piece i-1: one piece's phases inside a
host overlap the others' transfers across hosts (the tuner pipelines so
only across a slow link: on cores that are the bottleneck, steps cost).

    2 hosts x 2 ranks (r0 r1 | r2 r3), parts a b, each cut in 2 sub-parts
    1.  r0 -> r1: b    r1 -> r0: a    (and r2 <-> r3)      a at r0, r2; b at r1, r3
    2.  r0 <-> r2 ring over a's sub-parts; r1 <-> r3 over b's
    3.  r0 -> r1: a    r1 -> r0: b    (and r2 <-> r3)

n ranks, m_h per host, K hosts, S bytes: per rank 2 S (m_h-1)/m_h inside its
host over 2(m_h-1) rounds, and 2 S (K-1)/(K M) times the parts it owns
across hosts over 2(K-1) rounds. One host is a direct reduce-scatter plus
all-gather; one rank per host is a ring.
"""

from __future__ import annotations

from ..schedule import Chunk, Copy, Recv, Schedule, Send
from . import block, blocks, log2_ceil, make_schedule, register

NAME = "hier"


def layout(hosts: tuple) -> list[list[int]]:
    """The ranks of each host, in rank order; hosts in order of their first rank."""
    order: dict = {}
    for rank, host in enumerate(hosts):
        order.setdefault(host, []).append(rank)
    return list(order.values())


@register("all_reduce", NAME, topology=True, pipelined=True)
def all_reduce(nranks: int, rank: int, root: int, segments: int, hosts: tuple) -> Schedule:
    members = layout(hosts)
    K, M = len(members), max(len(m) for m in members)
    h = next(i for i, m in enumerate(members) if rank in m)
    local = members[h]
    m, j = len(local), local.index(rank)
    whole = block("out", 0, segments * M * K)

    def owner(host: int, part: int) -> int:
        return members[host][part % len(members[host])]

    def parts_of(local_index: int) -> list[int]:
        return list(range(local_index, M, m))

    def chunks(piece: int, parts, subparts=range(K)) -> tuple:
        return tuple(whole[(piece * M + p) * K + q] for p in parts for q in subparts)

    mine = parts_of(j)
    nxt, prv = (h + 1) % K, (h - 1) % K
    events = []
    for piece in range(segments):  # piece i starts a step after piece i-1: phases overlap
        t = piece
        # 1. reduce-scatter inside the host
        for s in range(1, m):
            to, frm = local[(j + s) % m], local[(j - s) % m]
            events += [(t, Send(to, chunks(piece, parts_of((j + s) % m)))),
                       (t, Recv(frm, chunks(piece, mine), reduce=True))]
            t += 1
        # 2. a ring across hosts for each part this rank owns
        for phase in ("reduce", "gather"):
            for r in range(K - 1):
                send_q = (h - r) % K if phase == "reduce" else (h + 1 - r) % K
                recv_q = (h - r - 1) % K if phase == "reduce" else (h - r) % K
                sends: dict = {}
                recvs: dict = {}
                for p in mine:  # in part order on both ends of every pair
                    sends.setdefault(owner(nxt, p), []).append(p)
                    recvs.setdefault(owner(prv, p), []).append(p)
                events += [(t, Send(peer, chunks(piece, ps, (send_q,)))) for peer, ps in sends.items()]
                events += [(t, Recv(peer, chunks(piece, ps, (recv_q,)), reduce=phase == "reduce"))
                           for peer, ps in recvs.items()]
                t += 1
        # 3. all-gather inside the host
        for s in range(1, m):
            to, frm = local[(j + s) % m], local[(j - s) % m]
            events += [(t, Send(to, chunks(piece, mine))), (t, Recv(frm, chunks(piece, parts_of((j - s) % m))))]
            t += 1
    # make_schedule keeps each step's messages in piece order, on both ends of every pair
    return make_schedule("all_reduce", NAME, nranks, rank, root, events, parts=segments * M * K)


def _place(hosts: tuple, rank: int) -> tuple[list[list[int]], int, list[int]]:
    """(every host's ranks, this rank's host, this host's ranks)."""
    members = layout(hosts)
    h = next(i for i, m in enumerate(members) if rank in m)
    return members, h, members[h]


def _leaders(members: list, root: int) -> tuple[int, list[int]]:
    """(the root's host, each host's leader: the root on its own host, the
    first rank elsewhere), for the rooted collectives' trees across hosts."""
    first = next(i for i, m in enumerate(members) if root in m)
    return first, [root if i == first else m[0] for i, m in enumerate(members)]


def _counterpart(members: list, host: int, b: int) -> int:
    """The rank of ``host`` at rank b's local index (modulo the host's size):
    where block b enters that host (all_gather), or is summed there before
    it leaves (reduce_scatter)."""
    there = members[host]
    return there[next(m.index(b) for m in members if b in m) % len(there)]


@register("broadcast", NAME, topology=True)
def broadcast(nranks: int, rank: int, root: int, segments: int, hosts: tuple) -> Schedule:
    """A binomial tree across hosts among one leader each (the root on its
    own host, the first rank elsewhere), then each leader to its host's
    other ranks: the buffer enters every other host once.

        hosts A(r0 r1) B(r2 r3) C(r4), root r0
        0.  r0 -> r2                 (hosts 0 -> 1 of the tree)
        1.  r0 -> r4                 (0 -> 2)
        2.  r0 -> r1, r2 -> r3       (inside the hosts)
    """
    members, h, local = _place(hosts, rank)
    K = len(members)
    first, leaders = _leaders(members, root)
    rounds = log2_ceil(K)
    whole = block("out", 0)
    events = []
    if rank == leaders[h]:
        v = (h - first) % K  # this host's place in the tree, the root's host at 0
        for t in range(rounds):
            if v < 1 << t and v + (1 << t) < K:
                events.append((t, Send(leaders[(first + v + (1 << t)) % K], whole)))
            elif 1 << t <= v < 2 << t:
                events.append((t, Recv(leaders[(first + v - (1 << t)) % K], whole)))
        events += [(rounds, Send(q, whole)) for q in local if q != rank]
    else:
        events.append((rounds, Recv(leaders[h], whole)))
    return make_schedule("broadcast", NAME, nranks, rank, root, events)


@register("reduce", NAME, topology=True)
def reduce(nranks: int, rank: int, root: int, segments: int, hosts: tuple) -> Schedule:
    """broadcast's mirror: each host's ranks send to their leader, which adds
    them up (in a copy of its buffer unless it is the root: the others'
    buffers stay as they were), then a binomial reduce across hosts among
    the leaders toward the root: each host's sum leaves it once."""
    members, h, local = _place(hosts, rank)
    K = len(members)
    first, leaders = _leaders(members, root)
    if rank != leaders[h]:
        return make_schedule("reduce", NAME, nranks, rank, root, [(0, Send(leaders[h], block("out", 0)))])
    acc = "out" if rank == root else "tmp"
    events = [] if acc == "out" else [(0, Copy(block("out", 0), block("tmp", 0)))]
    others = [q for q in local if q != rank]
    events += [(i, Recv(q, block(acc, 0), reduce=True)) for i, q in enumerate(others)]  # one a step
    v = (h - first) % K  # this host's place in the tree, the root's host at 0
    for t in range(log2_ceil(K)):
        step = 1 << t
        if v % (2 * step) == step:
            events.append((len(others) + t, Send(leaders[(first + v - step) % K], block(acc, 0))))
            break
        if v % (2 * step) == 0 and v + step < K:
            events.append((len(others) + t, Recv(leaders[(first + v + step) % K], block(acc, 0), reduce=True)))
    return make_schedule("reduce", NAME, nranks, rank, root, events, tmp_like="out" if acc == "tmp" else None)


@register("all_gather", NAME, topology=True)
def all_gather(nranks: int, rank: int, root: int, segments: int, hosts: tuple) -> Schedule:
    """Inside each host, then across, then inside again: every rank's block
    crosses to each other host once, to the rank there at its local index
    (modulo that host's size), which passes it on inside its host.

        hosts A(r0 r1) B(r2 r3)
        0.  r0 <-> r1, r2 <-> r3     (each host's blocks on all its ranks)
        1.  r0 <-> r2, r1 <-> r3     (each rank's own block to its counterpart)
        2.  r0 <-> r1, r2 <-> r3     (what came from the other host)
    """
    members, h, local = _place(hosts, rank)

    def entering(q: int) -> list[int]:  # the blocks rank q (of host h) takes from other hosts
        return [b for g, m in enumerate(members) if g != h for b in m if _counterpart(members, h, b) == q]

    events = [(0, Copy(block("in", 0), block("out", rank)))]
    for q in local:  # 0: this host's blocks
        if q != rank:
            events += [(0, Send(q, block("in", 0))), (0, Recv(q, block("out", q)))]
    for g, m in enumerate(members):  # 1: across hosts, each block to its counterpart
        if g != h:
            events.append((1, Send(_counterpart(members, g, rank), block("in", 0))))
    events += [(1, Recv(b, block("out", b))) for b in entering(rank)]
    mine = entering(rank)  # 2: passed on inside the host
    for q in local:
        if q != rank:
            if mine:
                events.append((2, Send(q, blocks("out", mine))))
            theirs = entering(q)
            if theirs:
                events.append((2, Recv(q, blocks("out", theirs))))
    return make_schedule("all_gather", NAME, nranks, rank, root, events)


@register("reduce_scatter", NAME, topology=True)
def reduce_scatter(nranks: int, rank: int, root: int, segments: int, hosts: tuple) -> Schedule:
    """all_gather's mirror: inside each host the ranks sum every block at
    the rank that will send it on (a block of this host at its own rank, a
    block of another host at its counterpart here), then each such sum
    crosses once to the block's rank, which adds the other hosts' in.

        hosts A(r0 r1) B(r2 r3)
        1.  r0 <-> r1, r2 <-> r3     (r0 gets r1's blocks 0 and 2...)
        2.  r0 <-> r2, r1 <-> r3     (host A's sum of block 2 to r2...)

    Round 2 has K-1 steps: in step i each host sends to host h+i.
    """
    members, h, local = _place(hosts, rank)
    m, j = len(local), local.index(rank)

    def foreign(q: int) -> list[int]:  # the other hosts' blocks rank q (of this host) sums
        return [b for g, ms in enumerate(members) if g != h for b in ms if _counterpart(members, h, b) == q]

    mine = foreign(rank)
    events = [(0, Copy(block("in", rank), block("out", 0)))]
    events += [(0, Copy(block("in", b), block("tmp", b))) for b in mine]
    for s in range(1, m):  # 1: inside the host, one peer a step (as hier all_reduce)
        to, frm = local[(j + s) % m], local[(j - s) % m]
        events.append((s, Send(to, block("in", to) + blocks("in", foreign(to)))))
        events.append((s, Recv(frm, block("out", 0) + blocks("tmp", mine), reduce=True)))
    # 2: each sum to its block's rank, host h to host h+i in round i, so
    # that every rank adds one message a round into its block
    K = len(members)
    for i in range(1, K):
        events += [(m + i, Send(b, block("tmp", b))) for b in mine if b in members[(h + i) % K]]
        events.append((m + i, Recv(_counterpart(members, (h - i) % K, rank), block("out", 0), reduce=True)))
    return make_schedule("reduce_scatter", NAME, nranks, rank, root, events,
                         tmp_like="in" if mine else None)


@register("all_to_all", NAME, uniform_blocks=True, topology=True)
def all_to_all(nranks: int, rank: int, root: int, segments: int, hosts: tuple) -> Schedule:
    """Aggregated per host pair: every item for a rank d on another host
    first gathers, inside its sender's host, at that host's gateway to d,
    which sends d all of its host's items for it in one message. Across
    hosts, rank d gets one message per other host (instead of one per rank
    of it); inside a host, items for the host's own ranks go straight, in
    the same messages. The gateways of a host to the rest are its ranks in
    turn, so each handles about (n - m)/m destinations.

        hosts A(r0 r1) B(r2 r3)      gateways of A: r0 for r2, r1 for r3
        0.  r0 -> r1: item for r1 + item for r3;   r1 -> r0: item for r0 + item for r2
        1.  r0 -> r2: r0's and r1's items for r2;  r1 -> r3: r0's and r1's for r3

    Items of other ranks wait in "tmp" (a block each, as "in"): every block
    must have one size (uniform_blocks). n ranks, m on this host: 2 rounds;
    inside the host (m - 1) messages per rank, across n - m items in
    (n - m)/m messages per rank.
    """
    members, h, local = _place(hosts, rank)
    outside = [[q for q in range(nranks) if q not in m] for m in members]  # each host's others, in order

    def gateway(host: int, d: int) -> int:  # the rank of ``host`` that sends d its host's items
        there = members[host]
        return there[outside[host].index(d) % len(there)]

    def handled(q: int) -> list[int]:  # the destinations elsewhere local rank q is the gateway to
        return [d for d in range(nranks) if d not in local and gateway(h, d) == q]

    mine = handled(rank)
    others = [q for q in local if q != rank]
    slot = {(q, d): k for k, (q, d) in enumerate((q, d) for d in mine for q in others)}  # their items, in tmp

    events = [(0, Copy(block("in", rank), block("out", rank)))]
    for q in others:  # 0: inside the host, items for q and for q's destinations elsewhere
        events.append((0, Send(q, block("in", q) + blocks("in", handled(q)))))
        events.append((0, Recv(q, block("out", q) + tuple(Chunk("tmp", slot[(q, d)], 0) for d in mine))))
    for d in mine:  # 1: to each destination elsewhere, every item of this host for it
        events.append((1, Send(d, tuple(block("in", d)[0] if s == rank else Chunk("tmp", slot[(s, d)], 0)
                                        for s in local))))
    for g, ms in enumerate(members):  # 1: from each other host, all its items for this rank
        if g != h:
            events.append((1, Recv(gateway(g, rank), blocks("out", ms))))
    return make_schedule("all_to_all", NAME, nranks, rank, root, events,
                         tmp_like="in" if slot else None)


@register("barrier", NAME, topology=True)
def barrier(nranks: int, rank: int, root: int, segments: int, hosts: tuple) -> Schedule:
    """Each host's ranks check in with their leader (its first rank), the
    leaders with each other, then each leader lets its host go: one message
    per leader pair across hosts, not per rank pair. "out" has no elements;
    a part per rank is each rank's (empty) mark, and a message carries every
    mark its sender holds, so that the verifier can see who heard from whom."""
    members, h, local = _place(hosts, rank)
    leader = local[0]

    def marks(ranks) -> tuple:
        return tuple(Chunk("out", 0, q) for q in ranks)

    events = []
    if rank == leader:
        events += [(0, Recv(q, marks([q]))) for q in local[1:]]
        for m in members:
            if m[0] != rank:
                events += [(1, Send(m[0], marks(local))), (1, Recv(m[0], marks(m)))]
        events += [(2, Send(q, marks(p for p in range(nranks) if p != q))) for q in local[1:]]
    else:
        events += [(0, Send(leader, marks([rank]))),
                   (2, Recv(leader, marks(p for p in range(nranks) if p != rank)))]
    return make_schedule("barrier", NAME, nranks, rank, root, events, parts=nranks)
