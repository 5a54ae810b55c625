"""Hierarchical: shared memory inside each host, the network only between hosts.

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

from ..schedule import Recv, Schedule, Send
from . import block, register

NAME = "hier"


def layout(hosts: tuple) -> list[list[int]]:
    """The ranks of each host, in rank order; hosts in order of their first rank."""
    order: dict = {}
    for rank, host in enumerate(hosts):
        order.setdefault(host, []).append(rank)
    return list(order.values())


@register("all_reduce", NAME, topology=True)
def all_reduce(nranks: int, rank: int, root: int, segments: int, hosts: tuple) -> Schedule:
    members = layout(hosts)
    K, M = len(members), max(len(m) for m in members)
    h = next(i for i, m in enumerate(members) if rank in m)
    local = members[h]
    m, j = len(local), local.index(rank)

    def owner(host: int, part: int) -> int:
        return members[host][part % len(members[host])]

    def parts_of(local_index: int) -> list[int]:
        return list(range(local_index, M, m))

    def chunks(parts, subparts=range(K)) -> tuple:
        whole = block("out", 0, M * K)
        return tuple(whole[p * K + q] for p in parts for q in subparts)

    steps = []
    # 1. reduce-scatter inside the host
    for s in range(1, m):
        to, frm = local[(j + s) % m], local[(j - s) % m]
        steps.append((Send(to, chunks(parts_of((j + s) % m))), Recv(frm, chunks(parts_of(j)), reduce=True)))
    # 2. a ring across hosts for each part this rank owns
    mine = parts_of(j)
    nxt, prv = (h + 1) % K, (h - 1) % K
    for phase in ("reduce", "gather"):
        for t in range(K - 1):
            send_q = (h - t) % K if phase == "reduce" else (h + 1 - t) % K
            recv_q = (h - t - 1) % K if phase == "reduce" else (h - t) % K
            sends: dict = {}
            recvs: dict = {}
            for p in mine:  # in part order on both ends of every pair
                sends.setdefault(owner(nxt, p), []).append(p)
                recvs.setdefault(owner(prv, p), []).append(p)
            step = [Send(peer, chunks(ps, (send_q,))) for peer, ps in sends.items()]
            step += [Recv(peer, chunks(ps, (recv_q,)), reduce=phase == "reduce") for peer, ps in recvs.items()]
            steps.append(tuple(step))
    # 3. all-gather inside the host
    for s in range(1, m):
        to, frm = local[(j + s) % m], local[(j - s) % m]
        steps.append((Send(to, chunks(mine)), Recv(frm, chunks(parts_of((j - s) % m)))))
    return Schedule(collective="all_reduce", algorithm=NAME, nranks=nranks, rank=rank,
                    steps=tuple(steps), parts=M * K)
