"""Process topologies (Cartesian, graph, distributed graph) and neighbour
collectives.

A topology is a description attached to a communicator's collie group (in
``_topo_of``): copies of the communicator (``MPI.Cartcomm(cart)``) share it,
``Dup`` copies it. Create_cart/Create_graph make the new communicator with a
split (ranks past the topology's size get COMM_NULL); ``reorder`` is
accepted and ignored (ranks keep their order, which MPI allows).

Neighbour collectives are point-to-point messages of the communicator
itself, on internal tags (negative, so no user receive, even ANY_TAG, can
take them): block k of a Cartesian rank goes to its k-th neighbour (dimension
k // 2, direction -1 then +1) on tag ``_NGH - k``, and lands in the
receiver's slot k ^ 1 (the neighbour on the other side); on graphs the m-th
edge from p to q carries tag ``_NGH - m`` on both sides. Messages of one
(peer, tag) keep their order, so consecutive neighbour collectives never mix.
"""

from __future__ import annotations

import operator
import pickle
from typing import Optional

import numpy as np

from ... import group as _group
from ...arrays import byte_view
from .alltoallw import _wspec
from .buffers import _Buf
from .p2p import _Recv
from .comm import COMM_NULL, Intracomm, _persistent, _topo_of
from .constants import CART, DIST_GRAPH, GRAPH, IN_PLACE, PROC_NULL, UNDEFINED
from .exceptions import ERR_ARG, ERR_DIMS, _error
from .request import Request

__all__ = ["Topocomm", "Cartcomm", "Graphcomm", "Distgraphcomm", "UNWEIGHTED", "WEIGHTS_EMPTY"]

_NGH = -16  # internal tags of neighbour collectives: _NGH - k


class _Weights:
    """MPI.UNWEIGHTED / MPI.WEIGHTS_EMPTY: markers, not lists."""

    def __init__(self, name: str):
        self._name = name

    def __repr__(self) -> str:
        return f"MPI.{self._name}"

    def __reduce__(self):
        return self._name


UNWEIGHTED = _Weights("UNWEIGHTED")
WEIGHTS_EMPTY = _Weights("WEIGHTS_EMPTY")


def _ints(seq, what: str) -> list:
    try:
        return [operator.index(x) for x in seq]
    except TypeError:
        raise TypeError(f"{what} must be a sequence of ints, got {seq!r}") from None


class _Topo:
    """What a topology says about one rank: its kind, its description and
    its in/out neighbours (PROC_NULL where a Cartesian neighbour is off the
    edge)."""

    def __init__(self, kind: int, **kw):
        self.kind = kind
        self.__dict__.update(kw)

    # tags: the tag of out-edge k, and the tag that in-edge j expects
    def send_tags(self) -> list:
        if self.kind == CART:
            return [_NGH - k for k in range(len(self.outedges))]
        return _occurrences(self.outedges)

    def recv_tags(self) -> list:
        if self.kind == CART:
            return [_NGH - (j ^ 1) for j in range(len(self.inedges))]
        return _occurrences(self.inedges)


def _occurrences(peers: list) -> list:
    seen: dict = {}
    tags = []
    for p in peers:
        tags.append(_NGH - seen.get(p, 0))
        seen[p] = seen.get(p, 0) + 1
    return tags


# ---- Cartesian arithmetic ----

def _coords_of(rank: int, dims: list) -> list:
    coords = [0] * len(dims)
    for i in range(len(dims) - 1, -1, -1):
        coords[i] = rank % dims[i]
        rank //= dims[i]
    return coords


def _rank_of(coords: list, dims: list, periods: list) -> int:
    if len(coords) != len(dims):
        raise ValueError(f"Get_cart_rank: {len(coords)} coordinates for {len(dims)} dimensions")
    rank = 0
    for c, d, p in zip(coords, dims, periods):
        if p:
            c %= d
        elif not 0 <= c < d:
            raise _error(ERR_ARG, f"Get_cart_rank: coordinate {c} is outside a non-periodic dimension of {d}")
        rank = rank * d + c
    return rank


def _cart_args(comm, dims, periods, what: str):
    size = comm._g(what).size
    dims = _ints(dims, f"{what}: dims")
    if periods is None or isinstance(periods, (bool, np.bool_)):
        periods = [bool(periods)] * len(dims)
    else:
        periods = [bool(p) for p in periods]
        if len(periods) != len(dims):
            raise ValueError(f"{what}: {len(dims)} dims but {len(periods)} periods")
    if any(d <= 0 for d in dims):
        raise _error(ERR_DIMS, f"{what}: dimensions must be positive, got {dims}")
    total = int(np.prod(dims, dtype=np.int64)) if dims else 1
    if total > size:
        raise _error(ERR_DIMS, f"{what}: a grid of {total} processes does not fit a communicator of {size}")
    return dims, periods, total


def _cart_topo(rank: int, dims: list, periods: list) -> _Topo:
    coords = _coords_of(rank, dims)
    neighbours = []
    for i in range(len(dims)):
        for d in (-1, 1):
            c = list(coords)
            c[i] += d
            neighbours.append(_rank_of(c, dims, periods) if periods[i] or 0 <= c[i] < dims[i] else PROC_NULL)
    return _Topo(CART, dims=list(dims), periods=list(periods), coords=coords,
                 inedges=list(neighbours), outedges=list(neighbours))


def _graph_args(comm, index, edges, what: str):
    size = comm._g(what).size
    index, edges = _ints(index, f"{what}: index"), _ints(edges, f"{what}: edges")
    if index and index[0] == 0 and index[-1] == len(edges):  # mpi4py: [0, ...] adjacency arrays too
        index = index[1:]
    if len(index) > size:
        raise _error(ERR_ARG, f"{what}: {len(index)} nodes do not fit a communicator of {size}")
    if any(b < a for a, b in zip([0] + index, index)) or (index and index[-1] != len(edges)):
        raise _error(ERR_ARG, f"{what}: index {index} does not describe {len(edges)} edges")
    if any(not 0 <= e < len(index) for e in edges):
        raise _error(ERR_ARG, f"{what}: edges {edges} name nodes outside 0..{len(index) - 1}")
    return index, edges


def _graph_neighbours(index: list, edges: list, rank: int) -> list:
    return edges[(index[rank - 1] if rank else 0):index[rank]]


def _weights(w, degree: int, what: str):
    """A list of weights, or None for UNWEIGHTED."""
    if w is None or w is UNWEIGHTED:
        return None
    if w is WEIGHTS_EMPTY:
        if degree:
            raise ValueError(f"{what}: MPI.WEIGHTS_EMPTY for {degree} edges")
        return []
    w = _ints(w, what)
    if len(w) != degree:
        raise ValueError(f"{what}: {len(w)} weights for {degree} edges")
    return w


# ---- making topologies ----

def _make(comm, color: int, topo: Optional[_Topo], name: str, cls):
    g = comm._g(name)
    new = _group.split_group(g, color, g.rank, name=f"{comm._name}/{name.lower()}")
    if new is None:
        return COMM_NULL
    _topo_of[new] = topo
    return cls(new, new.name)


def Create_cart(self, dims, periods=None, reorder: bool = False) -> "Cartcomm":
    """A Cartesian grid of prod(dims) ranks (row-major); the others get COMM_NULL."""
    dims, periods, total = _cart_args(self, dims, periods, "Create_cart")
    rank = self._g("Create_cart").rank
    inside = rank < total
    return _make(self, 0 if inside else -1, _cart_topo(rank, dims, periods) if inside else None,
                 "Create_cart", Cartcomm)


def Cart_map(self, dims, periods=None) -> int:
    """The rank Create_cart would give this process (UNDEFINED: none)."""
    dims, periods, total = _cart_args(self, dims, periods, "Cart_map")
    rank = self._g("Cart_map").rank
    return rank if rank < total else UNDEFINED


def Create_graph(self, index, edges, reorder: bool = False) -> "Graphcomm":
    """A graph of len(index) nodes: node i's neighbours are
    edges[index[i-1]:index[i]]; ranks past the nodes get COMM_NULL."""
    index, edges = _graph_args(self, index, edges, "Create_graph")
    rank = self._g("Create_graph").rank
    topo = None
    if rank < len(index):
        nb = _graph_neighbours(index, edges, rank)
        topo = _Topo(GRAPH, index=index, edges=edges, inedges=list(nb), outedges=list(nb))
    return _make(self, 0 if topo else -1, topo, "Create_graph", Graphcomm)


def Graph_map(self, index, edges) -> int:
    index, edges = _graph_args(self, index, edges, "Graph_map")
    rank = self._g("Graph_map").rank
    return rank if rank < len(index) else UNDEFINED


def Create_dist_graph_adjacent(self, sources, destinations, sourceweights=None, destweights=None,
                               info=None, reorder: bool = False) -> "Distgraphcomm":
    """A distributed graph where every rank names its own in- and
    out-neighbours (and their weights)."""
    size = self._g("Create_dist_graph_adjacent").size
    sources = [] if sources is None else _ints(sources, "Create_dist_graph_adjacent: sources")
    dests = [] if destinations is None else _ints(destinations, "Create_dist_graph_adjacent: destinations")
    for r in sources + dests:
        if not 0 <= r < size:
            raise _error(ERR_ARG, f"Create_dist_graph_adjacent: rank {r} is not in a communicator of {size}")
    sw = _weights(sourceweights, len(sources), "Create_dist_graph_adjacent: sourceweights")
    dw = _weights(destweights, len(dests), "Create_dist_graph_adjacent: destweights")
    return _dist(self, sources, dests, sw, dw, "Create_dist_graph_adjacent")


def _dist(self, sources, dests, sw, dw, name):
    weighted = sw is not None or dw is not None
    if weighted:
        sw = [1] * len(sources) if sw is None else sw
        dw = [1] * len(dests) if dw is None else dw
    topo = _Topo(DIST_GRAPH, inedges=sources, outedges=dests, weights=(sw, dw) if weighted else None)
    return _make(self, 0, topo, name, Distgraphcomm)


def Create_dist_graph(self, sources, degrees, destinations, weights=None, info=None,
                      reorder: bool = False) -> "Distgraphcomm":
    """A distributed graph where any rank may name any edges: rank
    sources[i] gets edges to the next degrees[i] destinations. The edges are
    gathered everywhere; each rank keeps its own, in the order given (by
    naming rank, then position)."""
    g = self._g("Create_dist_graph")
    sources = _ints(sources, "Create_dist_graph: sources")
    degrees = _ints(degrees, "Create_dist_graph: degrees")
    dests = _ints(destinations, "Create_dist_graph: destinations")
    if len(degrees) != len(sources) or sum(degrees) != len(dests):
        raise ValueError(f"Create_dist_graph: {len(sources)} sources, {len(degrees)} degrees summing to "
                         f"{sum(degrees)}, {len(dests)} destinations")
    for r in sources + dests:
        if not 0 <= r < g.size:
            raise _error(ERR_ARG, f"Create_dist_graph: rank {r} is not in a communicator of {g.size}")
    w = _weights(weights, len(dests), "Create_dist_graph: weights")
    edges, at = [], 0
    for s, d in zip(sources, degrees):
        for k in range(at, at + d):
            edges.append((s, dests[k], None if w is None else w[k]))
        at += d
    everyone = Intracomm.allgather(self, (w is not None, edges))
    weighted = any(x[0] for x in everyone)
    ins, insw, outs, outsw = [], [], [], []
    for _, es in everyone:
        for s, d, wt in es:
            if d == g.rank:
                ins.append(s)
                insw.append(1 if wt is None else wt)
            if s == g.rank:
                outs.append(d)
                outsw.append(1 if wt is None else wt)
    return _dist(self, ins, outs, insw if weighted else None, outsw if weighted else None, "Create_dist_graph")


for _f in (Create_cart, Cart_map, Create_graph, Graph_map, Create_dist_graph_adjacent, Create_dist_graph):
    setattr(Intracomm, _f.__name__, _f)
del _f


# ---- the communicators ----

class _Many(Request):
    """Many requests completing as one; ``after`` runs once all have."""

    def __init__(self, network, reqs: list, after=None, timeout: float = 300.0, describe=lambda: "MPI request"):
        super().__init__(network, after=after, timeout=timeout, describe=describe)
        self._parts = reqs

    def _ready(self) -> bool:
        return self._done or all(r._ready() for r in self._parts)

    def _requests(self) -> list:
        return [q for r in self._parts for q in r._requests()]

    def _finish(self) -> None:
        for r in self._parts:
            r._complete(None)
        self._result = [r._result for r in self._parts]
        if self._after is not None:
            self._after()


def _exchange(comm, t: _Topo, what: str, sends: list, recvs: list, after=None, objects: bool = False) -> Request:
    """Post the receives from t's in-neighbours (into ``recvs``, or pickled
    objects), then the sends to its out-neighbours; one request for all."""
    m = comm._p2p(what)
    reqs = []
    for src, tag, dst in zip(t.inedges, t.recv_tags(), recvs):
        if src != PROC_NULL:
            reqs.append(_post_recv(comm, m, None if objects else dst, src, tag, what))
        elif objects:
            reqs.append(None)
    live = [r for r in reqs if r is not None]
    for dest, tag, data in zip(t.outedges, t.send_tags(), sends):
        if dest != PROC_NULL:
            live.append(_post_send(comm, m, data, dest, tag, what))
    g = m.group
    req = _Many(g.network, live, after, g.timeout, describe=lambda: f"{what} of {comm._name}")
    if objects:
        def result():
            req._result = [None if r is None else r._result for r in reqs]
        req._after = result
    return req


def _post_send(comm, m, data: memoryview, dest: int, tag: int, what: str) -> Request:
    reqs, head = m.isend(data, dest, tag)
    return Request(m.network, sends=reqs, keep=(data, head), timeout=m.group.timeout,
                   describe=lambda: f"{what} to rank {dest} of {comm._name}")


def _post_recv(comm, m, dst, source: int, tag: int, what: str) -> Request:
    op = _Recv(source, tag, dst)
    m.post(op)
    return Request(m.network, recv=op, matcher=m, timeout=m.group.timeout,
                   describe=lambda: f"{what} from rank {source} of {comm._name}")


def _Ialltoallw(self, sendbuf, recvbuf) -> Request:
    """Alltoallw, nonblocking: block q of sendbuf (its own count, byte
    displacement and datatype) to rank q; block p of recvbuf from rank p."""
    g = self._g("Alltoallw")
    everyone = list(range(g.size))
    t = _Topo(GRAPH, inedges=everyone, outedges=everyone)
    recvs, finish = _wspec(recvbuf, g.size, "Alltoallw recvbuf", writable=True)
    if sendbuf is IN_PLACE:  # what is sent is what recvbuf holds before it receives
        sends = [memoryview(bytes(r)) for r in recvs]
    else:
        sends, _ = _wspec(sendbuf, g.size, "Alltoallw sendbuf", writable=False)
    return _exchange(self, t, "Alltoallw", sends, recvs, after=finish)


def _Alltoallw(self, sendbuf, recvbuf) -> None:
    _Ialltoallw(self, sendbuf, recvbuf).Wait()


_Ialltoallw.__name__, _Alltoallw.__name__ = "Ialltoallw", "Alltoallw"
Intracomm.Ialltoallw, Intracomm.Alltoallw = _Ialltoallw, _Alltoallw
Intracomm.Alltoallw_init = _persistent("Ialltoallw")


class Topocomm(Intracomm):
    """A communicator with a topology. ``MPI.Cartcomm(comm)`` (and the
    others) refer to ``comm`` when it has that topology; else TypeError."""

    _kind: Optional[int] = None

    def __init__(self, comm=None, name: str = "MPI_COMM_NULL"):
        super().__init__(comm, name)
        if self._group is not None:
            t = _topo_of.get(self._group)
            if t is None or (self._kind is not None and t.kind != self._kind):
                raise TypeError(f"MPI.{type(self).__name__}: {comm!r} has "
                                f"{'no' if t is None else 'another'} topology")

    def _t(self, what: str) -> _Topo:
        return _topo_of[self._g(what)]

    # ---- neighbours ----

    @property
    def degrees(self) -> tuple:
        t = self._t("degrees")
        return len(t.inedges), len(t.outedges)

    @property
    def indegree(self) -> int:
        return len(self._t("indegree").inedges)

    @property
    def outdegree(self) -> int:
        return len(self._t("outdegree").outedges)

    @property
    def inedges(self) -> list:
        return list(self._t("inedges").inedges)

    @property
    def outedges(self) -> list:
        return list(self._t("outedges").outedges)

    @property
    def inoutedges(self) -> tuple:
        t = self._t("inoutedges")
        return list(t.inedges), list(t.outedges)

    # ---- neighbour collectives ----
    #
    # Each posts its receives, then its sends (internal tags, see the module
    # docstring), and returns one request for all of them.

    def _ngh(self, what: str, sendbuf, recvbuf, send_blocks: bool, vector: bool) -> Request:
        t = self._t(what)
        indeg, outdeg = len(t.inedges), len(t.outedges)
        s = _Buf(sendbuf, f"{what} sendbuf", writable=False, empty_ok=True,
                 blocks=outdeg if send_blocks else 1, vector=vector and send_blocks)
        r = _Buf(recvbuf, f"{what} recvbuf", writable=True, empty_ok=True, blocks=indeg, vector=vector)
        if not send_blocks:
            sends = [byte_view(s.section())] * outdeg
        elif vector:
            sends = [byte_view(s.vblock(k)) for k in range(outdeg)]
        else:
            sends = [byte_view(s.block(k)) for k in range(outdeg)]
        recvs = [byte_view(r.vblock(j) if vector else r.block(j)) for j in range(indeg)]
        req = _exchange(self, t, what, sends, recvs, after=r.finish)
        req._keep = (s, r)
        return req

    def Ineighbor_allgather(self, sendbuf, recvbuf) -> Request:
        """sendbuf to every out-neighbour; block j of recvbuf from in-neighbour j."""
        return self._ngh("Neighbor_allgather", sendbuf, recvbuf, False, False)

    def Ineighbor_allgatherv(self, sendbuf, recvbuf) -> Request:
        return self._ngh("Neighbor_allgatherv", sendbuf, recvbuf, False, True)

    def Ineighbor_alltoall(self, sendbuf, recvbuf) -> Request:
        """Block k of sendbuf to out-neighbour k; block j of recvbuf from in-neighbour j."""
        return self._ngh("Neighbor_alltoall", sendbuf, recvbuf, True, False)

    def Ineighbor_alltoallv(self, sendbuf, recvbuf) -> Request:
        return self._ngh("Neighbor_alltoallv", sendbuf, recvbuf, True, True)

    def Ineighbor_alltoallw(self, sendbuf, recvbuf) -> Request:
        t = self._t("Neighbor_alltoallw")
        sends, _ = _wspec(sendbuf, len(t.outedges), "Neighbor_alltoallw sendbuf", writable=False)
        recvs, finish = _wspec(recvbuf, len(t.inedges), "Neighbor_alltoallw recvbuf", writable=True)
        return _exchange(self, t, "Neighbor_alltoallw", sends, recvs, after=finish)

    def Neighbor_allgather(self, sendbuf, recvbuf) -> None:
        self.Ineighbor_allgather(sendbuf, recvbuf).Wait()

    def Neighbor_allgatherv(self, sendbuf, recvbuf) -> None:
        self.Ineighbor_allgatherv(sendbuf, recvbuf).Wait()

    def Neighbor_alltoall(self, sendbuf, recvbuf) -> None:
        self.Ineighbor_alltoall(sendbuf, recvbuf).Wait()

    def Neighbor_alltoallv(self, sendbuf, recvbuf) -> None:
        self.Ineighbor_alltoallv(sendbuf, recvbuf).Wait()

    def Neighbor_alltoallw(self, sendbuf, recvbuf) -> None:
        self.Ineighbor_alltoallw(sendbuf, recvbuf).Wait()

    Neighbor_allgather_init = _persistent("Ineighbor_allgather")
    Neighbor_allgatherv_init = _persistent("Ineighbor_allgatherv")
    Neighbor_alltoall_init = _persistent("Ineighbor_alltoall")
    Neighbor_alltoallv_init = _persistent("Ineighbor_alltoallv")
    Neighbor_alltoallw_init = _persistent("Ineighbor_alltoallw")

    def neighbor_allgather(self, sendobj) -> list:
        """sendobj from every in-neighbour, in order (None for PROC_NULL)."""
        t = self._t("neighbor_allgather")
        data = memoryview(pickle.dumps(sendobj, protocol=pickle.HIGHEST_PROTOCOL))
        req = _exchange(self, t, "neighbor_allgather", [data] * len(t.outedges), [None] * len(t.inedges),
                             objects=True)
        return req.wait()

    def neighbor_alltoall(self, sendobj) -> list:
        """Item k of sendobj to out-neighbour k; item j of the result from in-neighbour j."""
        t = self._t("neighbor_alltoall")
        items = list(sendobj)
        if len(items) != len(t.outedges):
            raise ValueError(f"neighbor_alltoall: {len(items)} items for {len(t.outedges)} out-neighbours")
        sends = [memoryview(pickle.dumps(o, protocol=pickle.HIGHEST_PROTOCOL)) for o in items]
        req = _exchange(self, t, "neighbor_alltoall", sends, [None] * len(t.inedges), objects=True)
        return req.wait()


class Cartcomm(Topocomm):
    """A Cartesian grid (row-major ranks)."""

    _kind = CART

    def Get_dim(self) -> int:
        return len(self._t("Get_dim").dims)

    dim = ndim = property(Get_dim)

    def Get_topo(self) -> tuple:
        t = self._t("Get_topo")
        return list(t.dims), list(t.periods), list(t.coords)

    topo = property(Get_topo)
    dims = property(lambda self: self.Get_topo()[0])
    periods = property(lambda self: self.Get_topo()[1])
    coords = property(lambda self: self.Get_topo()[2])

    def Get_cart_rank(self, coords) -> int:
        t = self._t("Get_cart_rank")
        return _rank_of(_ints(coords, "Get_cart_rank: coords"), t.dims, t.periods)

    def Get_coords(self, rank: int) -> list:
        t = self._t("Get_coords")
        rank = operator.index(rank)
        if not 0 <= rank < self._g("Get_coords").size:
            raise _error(ERR_ARG, f"Get_coords: rank {rank} is not in the grid")
        return _coords_of(rank, t.dims)

    def Shift(self, direction: int, disp: int) -> tuple:
        """(source, dest): the ranks ``disp`` steps back and forward along
        ``direction`` (PROC_NULL off a non-periodic edge)."""
        t = self._t("Shift")
        direction, disp = operator.index(direction), operator.index(disp)
        if not 0 <= direction < len(t.dims):
            raise _error(ERR_ARG, f"Shift: direction {direction} of a {len(t.dims)}-dimensional grid")

        def at(step):
            c = list(t.coords)
            c[direction] += step
            if not t.periods[direction] and not 0 <= c[direction] < t.dims[direction]:
                return PROC_NULL
            return _rank_of(c, t.dims, t.periods)
        return at(-disp), at(disp)

    def Sub(self, remain_dims) -> "Cartcomm":
        """The sub-grids keeping the dimensions where remain_dims is true."""
        t = self._t("Sub")
        keep = [bool(x) for x in remain_dims]
        if len(keep) != len(t.dims):
            raise ValueError(f"Sub: {len(keep)} flags for {len(t.dims)} dimensions")
        color = 0
        for c, d, k in zip(t.coords, t.dims, keep):
            if not k:
                color = color * d + c
        dims = [d for d, k in zip(t.dims, keep) if k]
        periods = [p for p, k in zip(t.periods, keep) if k]
        coords = [c for c, k in zip(t.coords, keep) if k]
        sub = _cart_topo(_rank_of(coords, dims, periods) if dims else 0, dims, periods)
        g = self._g("Sub")
        new = _group.split_group(g, color, g.rank, name=f"{self._name}/sub")
        _topo_of[new] = sub
        return Cartcomm(new, new.name)


class Graphcomm(Topocomm):
    """A graph given whole on every rank (Create_graph)."""

    _kind = GRAPH

    def Get_dims(self) -> tuple:
        t = self._t("Get_dims")
        return len(t.index), len(t.edges)

    dims = property(Get_dims)
    nnodes = property(lambda self: self.Get_dims()[0])
    nedges = property(lambda self: self.Get_dims()[1])

    def Get_topo(self) -> tuple:
        t = self._t("Get_topo")
        return list(t.index), list(t.edges)

    topo = property(Get_topo)
    index = property(lambda self: self.Get_topo()[0])
    edges = property(lambda self: self.Get_topo()[1])

    def Get_neighbors_count(self, rank: int) -> int:
        return len(self.Get_neighbors(rank))

    def Get_neighbors(self, rank: int) -> list:
        t = self._t("Get_neighbors")
        rank = operator.index(rank)
        if not 0 <= rank < len(t.index):
            raise _error(ERR_ARG, f"Get_neighbors: rank {rank} is not a node of the graph")
        return list(_graph_neighbours(t.index, t.edges, rank))

    nneighbors = property(lambda self: self.Get_neighbors_count(self.Get_rank()))
    neighbors = property(lambda self: self.Get_neighbors(self.Get_rank()))


class Distgraphcomm(Topocomm):
    """A distributed graph: each rank knows its own in- and out-edges."""

    _kind = DIST_GRAPH

    def Get_dist_neighbors_count(self) -> tuple:
        t = self._t("Get_dist_neighbors_count")
        return len(t.inedges), len(t.outedges), t.weights is not None

    def Get_dist_neighbors(self) -> tuple:
        t = self._t("Get_dist_neighbors")
        w = None if t.weights is None else (list(t.weights[0]), list(t.weights[1]))
        return list(t.inedges), list(t.outedges), w
