"""Intercommunicators: two disjoint groups of processes that talk across.

An Intercomm's own group (``_group``) is its *local* group: Get_rank,
Get_size and Get_group are about it. Three collie groups stand behind it,
on three consecutive contexts agreed by both sides:

  pair   remote ranks then local ranks, in this side's order, for point to
         point: the remote rank r is the pair's rank r, so a destination or
         a source is a remote rank with no translation (each side orders it
         its own way; only the context is shared, and tags carry only it);
  union  the low side then the high side (the side holding the lowest world
         rank is low), the same on both sides, for agreeing on contexts
         (Dup, Split, Merge);
  local  the local group on a context of its own.

Collectives follow MPI's inter semantics: data goes from one group to the
other. They are written over point-to-point messages on an internal tag
(negative: no user receive, not even ANY_TAG, takes them); messages of one
(peer, tag) keep their order, so consecutive collectives never mix. A rooted
call names its root as MPI.ROOT (the root itself), MPI.PROC_NULL (the
others of the root's group) or the root's rank in the remote group.
"""

from __future__ import annotations

import operator
import pickle
from typing import Any, Optional

import numpy as np

from ... import group as _group
from ...arrays import byte_view
from ...group import ProcessGroup
from .alltoallw import _wspec
from .buffers import _Buf, _check_same, _count, _store, _u8
from .comm import COMM_NULL, Comm, Intracomm, _inter_of, _matcher_of, _rank_arg, _Refused, _scatter_items
from .constants import CONGRUENT, IDENT, PROC_NULL, ROOT, SIMILAR, UNDEFINED, UNEQUAL
from .exceptions import ERR_ARG, ERR_GROUP, ERR_ROOT, _error
from .group import Group
from .op import SUM, _buffer_op
from .p2p import _Matcher
from .request import Request

__all__ = ["Intercomm"]

_INTER_TAG = -2   # internal tag of intercommunicator collectives
_BRIDGE_TAG = -3  # Create_intercomm's leaders, on the peer communicator


class _Inter:
    """What an intercommunicator adds to its local group (see the module doc)."""

    __slots__ = ("pair", "union", "remote", "low")

    def __init__(self, pair: ProcessGroup, union: ProcessGroup, remote: tuple, low: bool):
        self.pair, self.union, self.remote, self.low = pair, union, remote, low


def _build(network, local: tuple, remote: tuple, context: int, timeout: float, name: str) -> ProcessGroup:
    """The three groups of an intercommunicator on contexts context..context+2;
    returns the local one (the communicator's _group)."""
    low = min(local) < min(remote)
    first, second = (local, remote) if low else (remote, local)
    w = _group.world()
    pair = ProcessGroup(network, remote + local, context, timeout, f"{name}/pair")
    union = ProcessGroup(network, first + second, context, timeout, f"{name}/union")
    mine = ProcessGroup(network, local, context + (1 if low else 2), timeout, name)
    w.groups += [pair, union, mine]
    w.next_context = max(w.next_context, context + 3)
    _inter_of[mine] = _Inter(pair, union, remote, low)
    return mine


# ---- internal messages on the pair group ----

def _send(comm: "Intercomm", data, dest: int) -> Request:
    m = comm._p2p("intercommunicator collective")
    data = memoryview(data).cast("B") if not isinstance(data, memoryview) else data
    reqs, head = m.isend(data, dest, _INTER_TAG)
    return Request(m.network, sends=reqs, keep=(data, head), timeout=m.group.timeout,
                   describe=lambda: f"collective message to remote rank {dest} of {comm._name}")


def _recv(comm: "Intercomm", dst: Optional[np.ndarray], source: int) -> Request:
    """A receive into ``dst`` (bytes), or of a pickled object when None."""
    from .p2p import _Recv
    m = comm._p2p("intercommunicator collective")
    op = _Recv(source, _INTER_TAG, None if dst is None else byte_view(dst))
    m.post(op)
    return Request(m.network, recv=op, matcher=m, timeout=m.group.timeout,
                   describe=lambda: f"collective message from remote rank {source} of {comm._name}")


def _obj(obj) -> memoryview:
    return memoryview(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))


def _waitall(reqs: list) -> list:
    Request.Waitall(reqs)
    return [r._result for r in reqs]


def _fold(op, parts: list):
    acc = parts[0].copy()
    for p in parts[1:]:
        acc = op._apply(acc, p)
    return acc


class Intercomm(Comm):
    """An intercommunicator (see the module doc). Made by
    Intracomm.Create_intercomm or Intercomm.Create_from_groups."""

    @classmethod
    def _check_copy(cls, comm: Comm) -> None:
        if comm._group is not None and comm._group not in _inter_of:
            raise TypeError(f"{cls.__name__}: {comm!r} is not an intercommunicator")

    def _x(self, what: str) -> _Inter:
        return _inter_of[self._g(what)]

    # ---- the remote group ----

    def Get_remote_size(self) -> int:
        return len(self._x("Get_remote_size").remote)

    def Get_remote_group(self) -> Group:
        return Group._of(self._x("Get_remote_group").remote)

    remote_size = property(Get_remote_size)
    remote_group = property(Get_remote_group)

    def _p2p(self, what: str) -> _Matcher:
        pair = self._x(what).pair
        m = _matcher_of.get(pair)
        if m is None:
            m = _matcher_of[pair] = _Matcher(pair, self._name, inter=True)
        self._matcher = m
        return m

    def _npeers(self, m) -> int:
        return len(self._x("point to point").remote)

    # ---- making and freeing ----

    def Compare(comm1: Comm, comm2: Comm) -> int:
        """IDENT, CONGRUENT (same local and remote groups), SIMILAR, UNEQUAL."""
        if comm1 == comm2:
            return IDENT
        if comm1.Is_inter() != comm2.Is_inter():
            return UNEQUAL
        if not comm1.Is_inter():
            return Comm.Compare(comm1, comm2)
        a = (comm1._g("Compare").ranks, _inter_of[comm1._group].remote)
        b = (comm2._g("Compare").ranks, _inter_of[comm2._group].remote)
        if a == b:
            return CONGRUENT
        return SIMILAR if all(set(x) == set(y) for x, y in zip(a, b)) else UNEQUAL

    def _split(self, color: int, key: int, what: str) -> "Comm":
        """Ranks of one color on both sides make an intercommunicator (COMM_NULL
        when one side has none of that color)."""
        g, x = self._g(what), self._x(what)
        base, rows = _group._agree_context(x.union, 0, (color, key))
        colors = sorted({c for c, _ in rows if c >= 0})
        _group.world().next_context = base + 3 * len(colors)
        if color < 0:
            return COMM_NULL
        members = sorted((k, i) for i, (c, k) in enumerate(rows) if c == color)
        ranks = [x.union.ranks[i] for _, i in members]
        local = tuple(r for r in ranks if r in g.ranks)
        remote = tuple(r for r in ranks if r in x.remote)
        if not remote:
            return COMM_NULL
        new = _build(g.network, local, remote, base + 3 * colors.index(color), g.timeout, f"{self._name}/{what}")
        return Intercomm._of(new, new.name)

    def Split(self, color: int = 0, key: int = 0) -> "Comm":
        color, key = operator.index(color), operator.index(key)
        if color < 0 and color != UNDEFINED:
            raise ValueError(f"Split: color must be >= 0 or MPI.UNDEFINED, got {color}")
        return self._split(-1 if color == UNDEFINED else color, key, "split")

    def Split_type(self, split_type: int, key: int = 0, info=None) -> "Comm":
        """COMM_TYPE_SHARED and the like: the processes of this host on both
        sides; UNDEFINED: COMM_NULL."""
        if split_type == UNDEFINED:
            return self.Split(UNDEFINED, key)
        net = self._g("Split_type").network
        return self.Split(sorted(set(net.hosts)).index(net.hosts[net.rank]), key)

    def Create(self, group: Group) -> "Comm":
        """The processes of ``group`` (a subset of the local group) facing those
        of the group the remote side gave."""
        g = self._g("Create")
        members = group._r("Create")
        missing = [w for w in members if w not in g.ranks]
        if missing:
            raise _error(ERR_GROUP, f"Create: processes {missing} are not in the local group of {self._name}")
        me = g.network.rank
        return self._split(0 if me in members else -1, members.index(me) if me in members else 0, "create")

    def Dup(self, info=None) -> "Intercomm":
        g = self._g("Dup")
        dup = self._split(0, g.rank, "dup")
        new = type(self)._of(dup._group, dup._name)  # a subclass's Dup gives that subclass
        new._info = self._info
        self._copy_attrs(new)
        return new

    Clone = Dup

    def Merge(self, high: bool = False) -> Intracomm:
        """One intracommunicator of both groups: the group that gave high=False
        first (when both gave the same, the low side first)."""
        g, x = self._g("Merge"), self._x("Merge")
        base, rows = _group._agree_context(x.union, 1, (bool(high),))
        n_low = len(g.ranks) if x.low else len(x.remote)
        low_high, high_high = {r[0] for r in rows[:n_low]}, {r[0] for r in rows[n_low:]}
        if len(low_high) != 1 or len(high_high) != 1:
            raise _error(ERR_ARG, "Merge: the processes of one group gave different values of high")
        first, second = x.union.ranks[:n_low], x.union.ranks[n_low:]
        if low_high.pop() and not high_high.pop():
            first, second = second, first
        new = ProcessGroup(g.network, first + second, base, g.timeout, f"{self._name}/merge")
        _group.world().groups.append(new)
        return Intracomm(new, new.name)

    @classmethod
    def Create_from_groups(cls, local_group: Group, local_leader: int, remote_group: Group,
                           remote_leader: int, stringtag: str = "org.mpi4py", info=None,
                           errhandler=None) -> "Intercomm":
        """An intercommunicator of two disjoint groups, with no parent
        communicator: every process of both calls it."""
        from .comm import _agree_among
        from .environ import _comm
        world = _comm("world")
        wg = world._g("Create_from_groups")
        local, remote = local_group._r("Create_from_groups"), remote_group._r("Create_from_groups")
        _rank_arg(local_leader, len(local), "Create_from_groups: local_leader")
        _rank_arg(remote_leader, len(remote), "Create_from_groups: remote_leader")
        if set(local) & set(remote):
            raise _error(ERR_GROUP, "Create_from_groups: the local and remote groups overlap")
        if wg.network.rank not in local:
            raise _error(ERR_GROUP, "Create_from_groups: this process is not in local_group")
        context = _agree_among(wg, tuple(sorted(local + remote)), 0)
        new = _build(wg.network, tuple(local), tuple(remote), context, wg.timeout, "intercomm")
        _group.world().next_context = max(_group.world().next_context, context + 3)
        return cls._of(new, new.name)

    def _agree_peers(self, what: str) -> list:
        """Both sides agree: the local ranks through the local group, the remote ones through the pair."""
        return super()._agree_peers(what) + [(self._p2p(what), list(range(self.Get_remote_size())))]

    def _members(self) -> tuple:
        return self._x("Get_failed").union.ranks

    def Free(self) -> None:
        x = self._x("Free")
        for grp in (x.pair, x.union):
            _matcher_of.pop(grp, None)
            _group.destroy_process_group(grp)
        super().Free()

    def Is_inter(self) -> bool:
        return True

    def Is_intra(self) -> bool:
        return False

    is_inter = property(Is_inter)
    is_intra = property(Is_intra)

    # ---- collectives: roots ----

    def _role(self, root, what: str) -> Optional[int]:
        """ROOT -> -1 (this rank is the root), PROC_NULL -> None (its group's
        other ranks), else the root's rank in the remote group."""
        try:
            root = operator.index(root)
        except TypeError:
            raise TypeError(f"{what}: root must be an int rank, got {root!r}") from None
        if root == ROOT:
            return -1
        if root == PROC_NULL:
            return None
        if 0 <= root < self.Get_remote_size():
            return root
        raise _error(ERR_ROOT, f"{what}: root {root} is not MPI.ROOT, MPI.PROC_NULL or a rank of the "
                               f"remote group (size {self.Get_remote_size()})")

    # ---- collectives on buffers ----

    def Barrier(self) -> None:
        """Returns once every process of the remote group has entered."""
        n = self.Get_remote_size()
        empty = np.zeros(0, dtype=np.uint8)
        _waitall([_recv(self, empty, i) for i in range(n)] + [_send(self, empty, i) for i in range(n)])

    def Bcast(self, buf, root: int = 0) -> None:
        """The root's buffer into every remote process's."""
        role = self._role(root, "Bcast")
        if role == -1:
            data = _u8(np.ascontiguousarray(_Buf(buf, "Bcast buf", writable=False, empty_ok=True).section()))
            _waitall([_send(self, data, i) for i in range(self.Get_remote_size())])
        elif role is not None:
            b = _Buf(buf, "Bcast buf", writable=True, empty_ok=True)
            _waitall([_recv(self, _u8(b.section()), role)])
            b.finish()

    def _gather(self, sendbuf, recvbuf, root, what: str, vector: bool) -> None:
        role = self._role(root, what)
        if role == -1:
            n = self.Get_remote_size()
            r = _Buf(recvbuf, f"{what} recvbuf", writable=True, blocks=n, vector=vector)
            blocks = [r.vblock(i) if vector else r.block(i) for i in range(n)]
            _waitall([_recv(self, _u8(b), i) for i, b in enumerate(blocks)])
            r.finish()
        elif role is not None:
            s = _Buf(sendbuf, f"{what} sendbuf", writable=False, empty_ok=True).section()
            _waitall([_send(self, _u8(np.ascontiguousarray(s)), role)])

    def Gather(self, sendbuf, recvbuf, root: int = 0) -> None:
        """Every remote process's sendbuf into block r of the root's recvbuf."""
        self._gather(sendbuf, recvbuf, root, "Gather", vector=False)

    def Gatherv(self, sendbuf, recvbuf, root: int = 0) -> None:
        self._gather(sendbuf, recvbuf, root, "Gatherv", vector=True)

    def _scatter(self, sendbuf, recvbuf, root, what: str, vector: bool) -> None:
        role = self._role(root, what)
        if role == -1:
            n = self.Get_remote_size()
            s = _Buf(sendbuf, f"{what} sendbuf", writable=False, blocks=n, vector=vector)
            blocks = [s.vblock(i) if vector else s.block(i) for i in range(n)]
            _waitall([_send(self, _u8(np.ascontiguousarray(b)), i) for i, b in enumerate(blocks)])
        elif role is not None:
            r = _Buf(recvbuf, f"{what} recvbuf", writable=True, empty_ok=True)
            _waitall([_recv(self, _u8(r.section()), role)])
            r.finish()

    def Scatter(self, sendbuf, recvbuf, root: int = 0) -> None:
        """Block r of the root's sendbuf into remote rank r's recvbuf."""
        self._scatter(sendbuf, recvbuf, root, "Scatter", vector=False)

    def Scatterv(self, sendbuf, recvbuf, root: int = 0) -> None:
        self._scatter(sendbuf, recvbuf, root, "Scatterv", vector=True)

    def _exchange(self, sends: list, recvs: list) -> None:
        """Block i of ``sends`` to remote rank i, block i of ``recvs`` from it."""
        reqs = [_recv(self, _u8(b), i) for i, b in enumerate(recvs)]
        reqs += [_send(self, _u8(np.ascontiguousarray(b)), i) for i, b in enumerate(sends)]
        _waitall(reqs)

    def _allgather(self, sendbuf, recvbuf, what: str, vector: bool) -> None:
        n = self.Get_remote_size()
        s = _Buf(sendbuf, f"{what} sendbuf", writable=False, empty_ok=True).section()
        r = _Buf(recvbuf, f"{what} recvbuf", writable=True, blocks=n, vector=vector)
        self._exchange([s] * n, [r.vblock(i) if vector else r.block(i) for i in range(n)])
        r.finish()

    def Allgather(self, sendbuf, recvbuf) -> None:
        """Every remote process's sendbuf into block r of every recvbuf."""
        self._allgather(sendbuf, recvbuf, "Allgather", vector=False)

    def Allgatherv(self, sendbuf, recvbuf) -> None:
        self._allgather(sendbuf, recvbuf, "Allgatherv", vector=True)

    def _alltoall(self, sendbuf, recvbuf, what: str, vector: bool) -> None:
        n = self.Get_remote_size()
        s = _Buf(sendbuf, f"{what} sendbuf", writable=False, blocks=n, vector=vector)
        r = _Buf(recvbuf, f"{what} recvbuf", writable=True, blocks=n, vector=vector)
        pick = (lambda b, i: b.vblock(i)) if vector else (lambda b, i: b.block(i))
        self._exchange([pick(s, i) for i in range(n)], [pick(r, i) for i in range(n)])
        r.finish()

    def Alltoall(self, sendbuf, recvbuf) -> None:
        """Block q of sendbuf to remote rank q; block p of recvbuf from remote rank p."""
        self._alltoall(sendbuf, recvbuf, "Alltoall", vector=False)

    def Alltoallv(self, sendbuf, recvbuf) -> None:
        self._alltoall(sendbuf, recvbuf, "Alltoallv", vector=True)

    def Alltoallw(self, sendbuf, recvbuf) -> None:
        n = self.Get_remote_size()
        sends, _ = _wspec(sendbuf, n, "Alltoallw sendbuf", writable=False)
        recvs, finish = _wspec(recvbuf, n, "Alltoallw recvbuf", writable=True)
        self._exchange([np.frombuffer(b, dtype=np.uint8) for b in sends],
                       [np.frombuffer(b, dtype=np.uint8) for b in recvs])
        if finish is not None:
            finish()

    def _reduce_from(self, sources: list, like: np.ndarray, op, what: str) -> np.ndarray:
        """op folded, in remote rank order, over one array like ``like`` from each of ``sources``."""
        parts = [np.empty(like.size, dtype=like.dtype) for _ in sources]
        _waitall([_recv(self, _u8(p), i) for i, p in zip(sources, parts)])
        acc = _fold(op, [(p != 0) if op._logical else p for p in parts])
        return acc

    def Reduce(self, sendbuf, recvbuf, op=SUM, root: int = 0) -> None:
        """The remote group's sendbufs reduced into the root's recvbuf."""
        role = self._role(root, "Reduce")
        op = _buffer_op(op, "Reduce")
        if role == -1:
            r = _Buf(recvbuf, "Reduce recvbuf", writable=True)
            dst = r.section()
            _store(dst, self._reduce_from(list(range(self.Get_remote_size())), dst, op, "Reduce"))
            r.finish()
        elif role is not None:
            s = _Buf(sendbuf, "Reduce sendbuf", writable=False).section()
            _waitall([_send(self, _u8(np.ascontiguousarray(s)), role)])

    def Allreduce(self, sendbuf, recvbuf, op=SUM) -> None:
        """The remote group's sendbufs reduced into every local recvbuf."""
        op = _buffer_op(op, "Allreduce")
        n = self.Get_remote_size()
        s = _Buf(sendbuf, "Allreduce sendbuf", writable=False).section()
        r = _Buf(recvbuf, "Allreduce recvbuf", writable=True)
        dst = r.section()
        _check_same(s, dst, "Allreduce", s.size == dst.size)
        sends = [_send(self, _u8(np.ascontiguousarray(s)), i) for i in range(n)]
        acc = self._reduce_from(list(range(n)), dst, op, "Allreduce")
        _waitall(sends)
        _store(dst, acc)
        r.finish()

    def _reduce_scatter(self, s: np.ndarray, dst: np.ndarray, remote_counts: list, op) -> None:
        n = self.Get_remote_size()
        if s.size < sum(remote_counts):
            raise ValueError(f"Reduce_scatter: sendbuf has {s.size} elements, the remote group "
                             f"takes {sum(remote_counts)}")
        ends = np.cumsum(remote_counts).tolist()
        sends = [_send(self, _u8(np.ascontiguousarray(s[e - c:e])), i)
                 for i, (e, c) in enumerate(zip(ends, remote_counts))]
        acc = self._reduce_from(list(range(n)), dst, op, "Reduce_scatter")
        _waitall(sends)
        _store(dst, acc)

    def Reduce_scatter_block(self, sendbuf, recvbuf, op=SUM) -> None:
        """The remote group's sendbufs reduced; local rank r gets block r."""
        op = _buffer_op(op, "Reduce_scatter_block")
        n = self.Get_remote_size()
        s = _Buf(sendbuf, "Reduce_scatter_block sendbuf", writable=False, blocks=n)
        r = _Buf(recvbuf, "Reduce_scatter_block recvbuf", writable=True)
        self._reduce_scatter(s.section(n), r.section(), [s.count] * n, op)
        r.finish()

    def Reduce_scatter(self, sendbuf, recvbuf, recvcounts=None, op=SUM) -> None:
        """The remote group's sendbufs reduced; local rank r gets recvcounts[r]
        elements of it (recvcounts defaults to each recvbuf's size)."""
        op = _buffer_op(op, "Reduce_scatter")
        g = self._g("Reduce_scatter")
        n = self.Get_remote_size()
        r = _Buf(recvbuf, "Reduce_scatter recvbuf", writable=True)
        mine = r.count if recvcounts is None else _count(list(recvcounts)[g.rank], "Reduce_scatter recvcounts")
        counts = np.zeros(n, dtype=np.int64)
        self._exchange([np.array([mine], dtype=np.int64)] * n, list(counts.reshape(n, 1)))
        s = _Buf(sendbuf, "Reduce_scatter sendbuf", writable=False).section()
        self._reduce_scatter(s, r.section()[:mine], counts.tolist(), op)
        r.finish()

    # ---- collectives on objects ----

    def barrier(self) -> None:
        self.Barrier()

    def bcast(self, obj=None, root: int = 0) -> Any:
        """The root's object on every remote process (None in the root's group)."""
        role = self._role(root, "bcast")
        if role == -1:
            data = _obj(obj)
            _waitall([_send(self, data, i) for i in range(self.Get_remote_size())])
        elif role is not None:
            return _waitall([_recv(self, None, role)])[0]
        return None

    def gather(self, sendobj, root: int = 0) -> Optional[list]:
        """Every remote process's object, in a list at the root."""
        role = self._role(root, "gather")
        if role == -1:
            return _waitall([_recv(self, None, i) for i in range(self.Get_remote_size())])
        if role is not None:
            _waitall([_send(self, _obj(sendobj), role)])
        return None

    def scatter(self, sendobj=None, root: int = 0) -> Any:
        """Item r of the root's sequence on remote rank r."""
        role = self._role(root, "scatter")
        if role == -1:
            items = _scatter_items(sendobj, self.Get_remote_size(), "scatter")
            _waitall([_send(self, _obj(o), i) for i, o in enumerate(items)])
            _Refused.check(items[0] if items else None)
        elif role is not None:
            return _Refused.check(_waitall([_recv(self, None, role)])[0])
        return None

    def allgather(self, sendobj) -> list:
        """Every remote process's object, on every local one."""
        n = self.Get_remote_size()
        data = _obj(sendobj)
        reqs = [_recv(self, None, i) for i in range(n)] + [_send(self, data, i) for i in range(n)]
        return _waitall(reqs)[:n]

    def alltoall(self, sendobj) -> list:
        """Item q of this process's sequence to remote rank q."""
        n = self.Get_remote_size()
        items = [None] * n if sendobj is None else list(sendobj)  # None: Nones, as in mpi4py
        if len(items) != n:
            raise ValueError(f"alltoall: sendobj must be a sequence of {n} items (one per remote rank)")
        reqs = [_recv(self, None, i) for i in range(n)] + [_send(self, _obj(o), i) for i, o in enumerate(items)]
        return _waitall(reqs)[:n]


def create_intercomm(comm: Intracomm, local_leader: int, peer_comm: Comm, remote_leader: int,
                     tag: int = 0) -> Intercomm:
    """Intracomm.Create_intercomm (see there)."""
    g = comm._g("Create_intercomm")
    local_leader = _rank_arg(local_leader, g.size, "Create_intercomm: local_leader")
    base, _ = _group._agree_context(g, 0)  # the first context free on every local process
    if g.rank == local_leader:
        pg = peer_comm._g("Create_intercomm")
        remote_leader = _rank_arg(remote_leader, pg.size, "Create_intercomm: remote_leader")
        m = Comm._p2p(peer_comm, "Create_intercomm")
        data = memoryview(pickle.dumps((g.ranks, base, operator.index(tag))))
        reqs, head = m.isend(data, remote_leader, _BRIDGE_TAG)
        from .p2p import _Recv
        op = _Recv(remote_leader, _BRIDGE_TAG, None)
        m.post(op)
        got = Request(m.network, recv=op, matcher=m, timeout=pg.timeout,
                      describe=lambda: f"Create_intercomm from rank {remote_leader} of {peer_comm._name}")
        sent = Request(m.network, sends=reqs, keep=(data, head), timeout=pg.timeout,
                       describe=lambda: f"Create_intercomm to rank {remote_leader} of {peer_comm._name}")
        Request.Waitall([got, sent])
        remote, rbase, rtag = got._result
        if set(remote) & set(g.ranks):
            err = "Create_intercomm: the local and remote groups overlap"
        elif rtag != tag:
            err = f"Create_intercomm: the two leaders gave different tags ({tag} and {rtag})"
        else:
            err = None
        found = (err, tuple(remote), max(base, rbase))
    else:
        found = None
    err, remote, context = comm.bcast(found, root=local_leader)
    if err is not None:
        raise _error(ERR_ARG, err)
    new = _build(g.network, g.ranks, remote, context, g.timeout, f"{comm._name}/inter")
    return Intercomm._of(new, new.name)
