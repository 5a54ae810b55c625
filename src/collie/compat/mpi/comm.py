"""Communicators."""

from __future__ import annotations

import functools
import operator
import os
import sys
import warnings
import weakref
from typing import Any, Optional, Sequence

import numpy as np

from ... import collectives as _coll
from ... import core
from ... import group as _group
from ... import objects as _objects
from ...arrays import byte_view
from .constants import (COMM_TYPE_HW_GUIDED, COMM_TYPE_HW_UNGUIDED, COMM_TYPE_RESOURCE_GUIDED, COMM_TYPE_SHARED,
                        CONGRUENT, IDENT, SIMILAR, UNEQUAL)
from .exceptions import (ERR_ARG, ERR_COMM, ERR_GROUP, ERR_KEYVAL, ERR_PROC_FAILED, ERR_ROOT, ERR_SPAWN, _error, _Handled,
                         _last_used)
from .group import Group
from .attributes import _Attributed
from .info import Info
from ...group import ProcessGroup
from .buffers import (_bare_bytes, _Buf, _check_same, _count, _only_root, _pack, _store, _u8, _unpack, _work,
                      to_numpy)
from .constants import (ANY_SOURCE, ANY_TAG, APPNUM, CART, DIST_GRAPH, GRAPH, IN_PLACE, IO, KEYVAL_INVALID,
                        LASTUSEDCODE, PROC_NULL, TAG_UB, UNDEFINED, UNIVERSE_SIZE, WTIME_IS_GLOBAL, _TAG_UB)
from .op import SUM, Op, _buffer_op, _py_op
from .p2p import (_Matcher, _Recv, _SyncSend, _progress, _unregister, _wait_until, core_exchange, core_irecv,
                  core_isend, core_recv, core_send)
from .request import Prequest, Request, _done_request, _fill, _Partitioned, _receive
from .commctx import _comm_lock
from .message import _mprobe
from .pickling import pickle as _pickle
from .status import Status

__all__ = ["Comm", "Intracomm", "COMM_NULL"]


# ---- communicators ----

def _rank_arg(value, size: int, what: str, allowed=()) -> int:
    try:
        r = operator.index(value)
    except TypeError:
        raise TypeError(f"{what} must be an int rank, got {value!r}") from None
    if r in allowed or 0 <= r < size:
        return r
    raise ValueError(f"{what} {r} is not a rank of the communicator (size {size})")


_TAG_END = 2**63  # tags are int64s
_BARRIER_KEY = ("barrier", None)  # the lane key of a plain barrier (collectives.barrier's)


def _tag_arg(value, what: str, allow_any: bool) -> int:
    try:
        t = operator.index(value)
    except TypeError:
        raise TypeError(f"{what} must be an int, got {value!r}") from None
    if (allow_any and t == ANY_TAG) or 0 <= t < _TAG_END:
        return t
    raise ValueError(f"{what} must be >= 0{' or MPI.ANY_TAG' if allow_any else ''}, got {t}")


_matcher_of: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_topo_of: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # group -> topology.py's _Topo
_handle_of: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # group -> its integer handle
_group_of_handle: dict = {}
_inter_of: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # local group -> intercomm.py's _Inter
_attrs_of: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # group -> its attributes (attributes.py)


def _by_kind(name: str):
    """Comm.<name>: the same method of the communicator's own class; on a
    plain Comm (COMM_NULL) the error of a null communicator."""
    def call(self, *args, **kwargs):
        impl = getattr(type(self), name)
        if impl is call:
            self._g(name)  # raises on COMM_NULL
            raise _error(ERR_COMM, f"{name}: {self!r} is neither an intra- nor an intercommunicator")
        return impl(self, *args, **kwargs)
    call.__name__ = call.__qualname__ = name
    call.__doc__ = f"{name} of an Intracomm or an Intercomm, whichever this communicator is."
    return call


class Comm(_Handled, _Attributed):
    """A communicator: an ordered group of processes and a context that
    keeps its messages apart from every other communicator's.

    ``MPI.Intracomm(comm)`` (or a subclass's constructor) refers to the same
    communicator as ``comm``, as in mpi4py; ``MPI.Comm()`` is COMM_NULL.
    Construction is in __new__, as in mpi4py, so that a subclass's __new__
    may pass another communicator than the one it was given."""

    # what the compiled core's CommMethod reads, at its offset (set_comm)
    __slots__ = ("_group", "_matcher")

    _bcast_lock = None  # bcast's lock from the lock table, once looked up

    def __new__(cls, comm=None, name: str = "MPI_COMM_NULL"):
        self = super().__new__(cls)
        group = comm
        if isinstance(comm, Comm):
            cls._check_copy(comm)
            group, name = comm._group, comm._name
        elif comm is not None and not isinstance(comm, ProcessGroup):
            raise TypeError(f"{cls.__name__}: expected a communicator, got {comm!r}")
        self._group = group
        self._name = name
        self._matcher: Optional[_Matcher] = None
        self._info = None
        self._attached = None
        return self

    @classmethod
    def _check_copy(cls, comm: "Comm") -> None:
        """Raise TypeError when ``comm`` is not of this kind (an intercommunicator for an Intracomm...)."""
        if issubclass(cls, Intracomm) and comm._group in _inter_of:
            raise TypeError(f"{cls.__name__}: {comm!r} is an intercommunicator")

    @classmethod
    def _of(cls, group: ProcessGroup, name: str) -> "Comm":
        """A new communicator of ``cls`` on ``group`` (through cls.__new__ with
        no argument, which a subclass's __new__ accepts)."""
        c = cls.__new__(cls)
        c._group, c._name = group, name
        return c

    def free(self) -> None:
        """Free, safely: nothing on COMM_NULL and on COMM_WORLD/COMM_SELF
        themselves; a copy of those only lets go of its handle."""
        from .environ import _cache
        if self._group is None or any(self is c for c in _cache.values()):
            return
        if any(self._group is c._group for c in _cache.values()):
            self._group, self._matcher, self._name = None, None, "MPI_COMM_NULL"
            return
        self.Free()

    def __reduce__(self):
        # COMM_NULL, COMM_WORLD and COMM_SELF pickle by name, as in mpi4py
        # (a copy of one comes back as an equal copy); other communicators not.
        if self is COMM_NULL:
            return "COMM_NULL"
        if self._group is None:
            return type(self), ()
        from .environ import _cache
        for which, comm in _cache.items():
            if comm._group is self._group:
                return _predefined, (which, None if self is comm else type(self))
        raise ValueError(f"cannot pickle {self!r}")

    # ---- identity ----

    def _g(self, what: str) -> ProcessGroup:
        g, w = self._group, _group._world
        if w is not None and g.__class__ is ProcessGroup and g.network is w.network:
            return g  # the common case, checked at once
        if g is None:
            raise _error(ERR_COMM, f"{what} called on MPI.COMM_NULL")
        return _group.resolve(g)  # raises once the world was destroyed

    def __eq__(self, other) -> bool:
        return isinstance(other, Comm) and self._group is other._group

    def _valid(self, what: str) -> None:
        self._g(what)

    def __ne__(self, other) -> bool:
        return not self == other

    __hash__ = None  # unhashable, as mpi4py's handles are

    def __bool__(self) -> bool:
        return self._group is not None

    def __repr__(self) -> str:
        if self._group is None:
            return "<MPI.COMM_NULL>"
        return f"<MPI.{type(self).__name__} {self._name} rank={self._group.rank} size={self._group.size}>"

    # ---- integer handles (toint/fromint, py2f/f2py) ----
    #
    # A communicator's handle is a number given to its group on first
    # request (COMM_NULL is 0); fromint gives back a communicator of that
    # group, typed by its topology (Cartcomm...) as mpi4py does.

    def toint(self) -> int:
        if self._group is None:
            return 0
        h = _handle_of.get(self._group)
        if h is None:
            h = _handle_of[self._group] = len(_group_of_handle) + 1
            _group_of_handle[h] = weakref.ref(self._group)
        return h

    @classmethod
    def fromint(cls, handle: int) -> "Comm":
        handle = operator.index(handle)
        if handle == 0:
            return COMM_NULL
        ref = _group_of_handle.get(handle)
        g = ref() if ref is not None else None
        if g is None:
            raise _error(ERR_COMM, f"Comm.fromint: {handle} is not the handle of a live communicator")
        t = _topo_of.get(g)
        if g in _inter_of:
            from .intercomm import Intercomm
            return Intercomm._of(g, g.name)
        if t is None:
            return Intracomm(g, g.name)
        from . import topology
        kind = {CART: topology.Cartcomm, GRAPH: topology.Graphcomm, DIST_GRAPH: topology.Distgraphcomm}
        return kind[t.kind](g, g.name)

    py2f = toint
    f2py = fromint
    handle = property(toint, doc="The communicator's integer handle (COMM_NULL: 0).")
    fromhandle = fromint

    def Get_rank(self) -> int:
        return self._g("Get_rank").rank

    def Get_size(self) -> int:
        return self._g("Get_size").size

    # Read all the time: the compiled core's answer where the group is live (no Python frame).
    rank = property(core._core.comm_rank if core._core is not None else Get_rank)
    size = property(core._core.comm_size if core._core is not None else Get_size)

    def Get_name(self) -> str:
        return self._name

    def Set_name(self, name: str) -> None:
        self._name = name
        if self._matcher is not None:  # (its requests' errors name the communicator: Request._describe)
            self._matcher.name = name

    name = property(Get_name, Set_name)

    def Is_inter(self) -> bool:
        return self._g("Is_inter") in _inter_of

    def Is_intra(self) -> bool:
        return not self.Is_inter()

    is_inter = property(Is_inter)
    is_intra = property(Is_intra)

    def Get_topology(self) -> int:
        """CART, GRAPH or DIST_GRAPH for a communicator with a topology, else UNDEFINED."""
        t = _topo_of.get(self._g("Get_topology"))
        return UNDEFINED if t is None else t.kind

    topology = property(Get_topology)
    is_topo = property(lambda self: self.Get_topology() != UNDEFINED)

    @property
    def group(self) -> "Group":
        return self.Get_group()

    info = property(lambda self: self.Get_info(), lambda self, info: self.Set_info(info))

    # ---- the buffer of buffered sends (Bsend never needs one here) ----

    def Attach_buffer(self, buf) -> None:
        """Kept only to be given back by Detach_buffer: collie's Bsend copies anyway."""
        self._g("Attach_buffer")
        self._attached = buf

    def Detach_buffer(self):
        self._g("Detach_buffer")
        buf, self._attached = self._attached, None
        return buf

    def Flush_buffer(self) -> None:
        """Buffered sends are complete when they return: nothing to flush."""
        self._g("Flush_buffer")

    def Iflush_buffer(self) -> Request:
        self._g("Iflush_buffer")
        return _done_request()

    @classmethod
    def Get_parent(cls) -> "Comm":
        """The parent of a spawned process; collie spawns none, so a null
        intercommunicator, as a process not started by Spawn gets."""
        from .intercomm import Intercomm
        return Intercomm()

    def Get_attr(self, keyval: int):
        """The predefined attributes: TAG_UB, LASTUSEDCODE, WTIME_IS_GLOBAL
        (False: Wtime is each host's own clock), IO (ANY_SOURCE: every process
        can do I/O), APPNUM (0: one program) and UNIVERSE_SIZE (the world's size)."""
        g = self._g("Get_attr")
        predefined = {TAG_UB: lambda: _TAG_UB, LASTUSEDCODE: _last_used, WTIME_IS_GLOBAL: lambda: False,
                      IO: lambda: ANY_SOURCE, APPNUM: lambda: 0,
                      UNIVERSE_SIZE: lambda: len(g.network.hosts)}
        if keyval == KEYVAL_INVALID:
            raise _error(ERR_KEYVAL, "Get_attr: MPI.KEYVAL_INVALID is no attribute key")
        get = predefined.get(keyval)
        return super().Get_attr(keyval) if get is None else get()

    def _attrs(self) -> dict:
        return _attrs_of.setdefault(self._g("attributes"), {})

    def Set_info(self, info) -> None:
        self._g("Set_info")
        self._info = Info._of(info.items() if info else ())

    def Get_info(self):
        self._g("Get_info")
        return Info._of(self._info.items() if self._info else ())

    # ---- groups ----

    def Get_group(self) -> Group:
        """The group of this communicator's processes, in rank order."""
        return Group._of(self._g("Get_group").ranks)

    def Compare(comm1: "Comm", comm2: "Comm") -> int:
        """IDENT (the same communicator), CONGRUENT (same processes in the
        same order, another context), SIMILAR (same processes), else UNEQUAL.
        ``MPI.Comm.Compare(a, b)`` and ``a.Compare(b)`` both work."""
        comm1._g("Compare"), comm2._g("Compare")
        if comm1 == comm2:
            return IDENT
        if comm1.Is_inter() or comm2.Is_inter():
            from .intercomm import Intercomm
            return Intercomm.Compare(comm1, comm2)
        a, b = comm1._g("Compare").ranks, comm2._g("Compare").ranks
        if a == b:
            return CONGRUENT
        return SIMILAR if set(a) == set(b) else UNEQUAL

    def Create(self, group: Group) -> "Comm":
        """A communicator of ``group``'s processes (a subset of this one's),
        in group order; the others get COMM_NULL. Every rank of this
        communicator calls it, with the same group or (MPI-2.2) with
        disjoint groups, one communicator per group."""
        g = self._g("Create")
        members = group._r("Create")
        missing = [w for w in members if w not in g.ranks]
        if missing:
            raise _error(ERR_GROUP, f"Create: processes {missing} are not in {self._name}")
        me = g.network.rank
        # disjoint groups have distinct smallest members: one split color per group
        color, key = (min(members), members.index(me)) if me in members else (-1, 0)
        new = _group.split_group(g, color, key, name=f"{self._name}/create")
        keep = isinstance(self, Intracomm) and g not in _topo_of  # a subclass of Intracomm stays one
        return COMM_NULL if new is None else type(self)._of(new, new.name) if keep else Intracomm(new, new.name)

    def Create_group(self, group: Group, tag: int = 0) -> "Comm":
        """Create, called by the members of ``group`` only. They agree on a
        context among themselves, over messages of this communicator on a
        tag of collie's own (``tag`` tells concurrent calls apart in MPI;
        here calls on one communicator must not overlap)."""
        g = self._g("Create_group")
        members = group._r("Create_group")
        me = g.network.rank
        if me not in members:
            raise _error(ERR_GROUP, f"Create_group: this process is not in the group {list(members)}")
        missing = [w for w in members if w not in g.ranks]
        if missing:
            raise _error(ERR_GROUP, f"Create_group: processes {missing} are not in {self._name}")
        context = _agree_among(g, members, operator.index(tag))
        new = ProcessGroup(g.network, members, context, g.timeout, f"{self._name}/group")
        _group.world().groups.append(new)
        return Intracomm(new, new.name)

    @classmethod
    def Create_from_group(cls, group: Group, stringtag: str = "org.mpi4py", info=None,
                          errhandler=None) -> "Intracomm":
        """A communicator of ``group``'s processes with no parent communicator
        (MPI-4): its members call it, and agree on a context among themselves."""
        from .environ import _comm
        return _comm("world").Create_group(group)

    def Split_type(self, split_type: int, key: int = 0, info=None) -> "Comm":
        """The ranks on this host (its shared memory), ordered by key, for
        COMM_TYPE_SHARED; for HW_GUIDED and RESOURCE_GUIDED when the info's
        "mpi_hw_resource_type" is "mpi_shared_memory" (the one hardware
        resource known here; any other: COMM_NULL); for HW_UNGUIDED when that
        is fewer ranks than this communicator's (else COMM_NULL), naming the
        resource in ``info``. UNDEFINED: COMM_NULL. Every rank must pass the
        same info (as MPI requires)."""
        net = self._g("Split_type").network  # every rank knows every rank's host: no message
        host = sorted(set(net.hosts)).index(net.hosts[net.rank])
        if split_type in (COMM_TYPE_HW_GUIDED, COMM_TYPE_RESOURCE_GUIDED):
            wanted = info.Get(_HW_RESOURCE_TYPE) if info else None
            return self.Split(host if wanted == _SHARED_MEMORY else UNDEFINED, key)
        if split_type == COMM_TYPE_HW_UNGUIDED:
            smaller = len(set(self._g("Split_type").hosts)) > 1  # hosts of this communicator's ranks
            if smaller and info:
                info.Set(_HW_RESOURCE_TYPE, _SHARED_MEMORY)
            return self.Split(host if smaller else UNDEFINED, key)
        if split_type not in (COMM_TYPE_SHARED, UNDEFINED):
            raise _error(ERR_ARG, f"Split_type: unknown split type {split_type}")
        return self.Split(host if split_type == COMM_TYPE_SHARED else UNDEFINED, key)

    def Idup(self, info=None):
        """Dup, done at once; the Request is complete."""
        comm = self.Dup()
        return comm, _done_request()

    def Dup_with_info(self, info) -> "Comm":
        comm = self.Dup()
        comm.Set_info(info)
        return comm

    def Idup_with_info(self, info):
        comm = self.Dup_with_info(info)
        return comm, _done_request()

    # ---- making and freeing communicators ----

    def Split(self, color: int = 0, key: int = 0) -> "Comm":
        """Ranks with the same color form a new communicator, ordered by key
        (then by rank here); color MPI.UNDEFINED gets MPI.COMM_NULL."""
        g = self._g("Split")
        color, key = operator.index(color), operator.index(key)
        if color < 0 and color != UNDEFINED:
            raise ValueError(f"Split: color must be >= 0 or MPI.UNDEFINED, got {color}")
        new = _group.split_group(g, -1 if color == UNDEFINED else color, key,
                                 name=f"{self._name}/split{color}")
        return COMM_NULL if new is None else Intracomm(new, new.name)

    def Dup(self, info=None) -> "Comm":
        """The same ranks in a new context: its messages never meet this one's."""
        g = self._g("Dup")
        group = _group.split_group(g, 0, g.rank, name=f"{self._name}/dup")
        if g in _topo_of:  # the copy keeps the topology
            _topo_of[group] = _topo_of[g]
        new = type(self)._of(group, f"{self._name}/dup")
        new._info = self._info if info is None else Info._of(info.items() if info else ())
        self._copy_attrs(new)
        return new

    Clone = Dup

    def Free(self) -> None:
        g = self._g("Free")
        if g is _group.world().group or self._name == "MPI_COMM_SELF":
            raise _error(ERR_COMM, f"Free: {self._name} cannot be freed")
        self._delete_attrs()
        _group.destroy_process_group(g)
        if self._matcher is not None:
            _unregister(self._matcher)
        self._group, self._matcher, self._name = None, None, "MPI_COMM_NULL"

    def Disconnect(self) -> None:
        """Free, once this process's messages on the communicator are done
        (collie's sends complete before they return, so that is Free)."""
        self.Free()

    def Abort(self, errorcode: int = 0) -> None:
        """End this process at once with ``errorcode`` (1 when 0); ``collie
        run`` then stops every other rank, as mpiexec does."""
        sys.stdout.flush()
        sys.stderr.write(f"MPI Abort on rank {self._group.rank if self._group else '?'} "
                         f"with error code {errorcode}\n")
        sys.stderr.flush()
        os._exit(errorcode or 1)

    # ---- fault tolerance (MPI 5's ULFM) ----
    #
    # What collie's failure detection supports: a peer that died is known
    # to the ranks that talked to it (its calls fail with ERR_PROC_FAILED).
    # Get_failed lists those, Ack_failed acknowledges them, Agree is a
    # bitwise AND over every process. collie stops the job's communication
    # once a process died, so Agree and Shrink then fail with
    # ERR_PROC_FAILED (without failures Shrink is Dup). Revoke would have to
    # interrupt the calls pending on the other processes, which collie
    # cannot: it raises NotImplementedError.

    def _agree_peers(self, what: str) -> list:
        """(matcher, ranks) pairs that reach every other process taking part in Agree."""
        m = Comm._p2p(self, what)
        return [(m, [r for r in range(m.group.size) if r != m.rank])]

    def _members(self) -> tuple:
        return self._g("Get_failed").ranks

    def Is_revoked(self) -> bool:
        """Always False: nothing can revoke a communicator here (see Revoke)."""
        self._g("Is_revoked")
        return False

    def Revoke(self) -> None:
        self._g("Revoke")
        raise NotImplementedError("Revoke: collie cannot interrupt the calls pending on the other processes "
                                  "of a communicator, so it cannot revoke one")

    def Get_failed(self) -> Group:
        """The processes of this communicator known here to have died (in rank order)."""
        net = self._g("Get_failed").network
        dead = {p for p, e in net._lost.items() if not getattr(e, "left", False)}
        return Group._of([w for w in self._members() if w in dead])

    def Ack_failed(self, num_to_ack: Optional[int] = None) -> int:
        """Acknowledge the first ``num_to_ack`` failed processes (all by
        default); returns how many are acknowledged now."""
        known = self.Get_failed().Get_size()
        num = known if num_to_ack is None else min(_count(num_to_ack, "Ack_failed: num_to_ack"), known)
        self._acked = max(getattr(self, "_acked", 0), num)
        return self._acked

    def _agreement(self, flag: int, what: str) -> Request:
        """Every process sends its flag to every other one, over point-to-point
        messages on an internal tag: not a collective, so an Iagree may be
        pending while other collectives run (ULFM agrees apart from them)."""
        from .topology import _Many, _post_recv, _post_send
        mine = np.array([flag], dtype=np.int64)
        got, parts = [], []
        for m, peers in self._agree_peers(what):
            for p in peers:
                got.append(np.zeros(1, dtype=np.int64))
                parts.append(_post_recv(self, m, byte_view(got[-1]), p, _AGREE_TAG, what))
            parts += [_post_send(self, m, byte_view(mine), p, _AGREE_TAG, what) for p in peers]
        g = self._g(what)

        def fold():
            req._result = functools.reduce(operator.and_, [int(a[0]) for a in got], flag)
        req = _Many(g.network, parts, after=fold, timeout=g.timeout, describe=lambda: f"{what} of {self._name}")
        return req

    def Agree(self, flag: int) -> int:
        """The bitwise AND of every process's ``flag``."""
        return self._agreement(operator.index(flag), "Agree").wait()

    def Iagree(self, flag) -> Request:
        """Agree, nonblocking, on ``flag``: a buffer of one C int, which
        holds the result once the Request completes."""
        if isinstance(flag, (int, np.integer)):
            raise TypeError("Iagree: flag must be a writable buffer of one C int, not an int")
        arr, _ = to_numpy(flag, "Iagree flag")
        if arr.nbytes != 4 or not arr.flags.writeable:
            raise ValueError(f"Iagree: flag must be a writable buffer of one C int (4 bytes), got {arr.nbytes} bytes")
        out = arr.reshape(-1).view(np.int32)
        req = self._agreement(int(out[0]), "Iagree")
        fold = req._after

        def store():
            fold()
            out[0] = req._result
        req._after = store
        return req

    def Shrink(self) -> "Comm":
        """A communicator of the processes not known to have failed: with
        none failed, a Dup. Once a process died, collie stops every call of
        the job (the death breaks every group), so no survivor communicator
        can be made: ERR_PROC_FAILED."""
        failed = self.Get_failed().Translate_ranks(None, self.Get_group())
        if failed:
            raise _error(ERR_PROC_FAILED, f"Shrink: processes {failed} of {self._name} failed, and collie "
                                          "cannot communicate past a failure")
        return self.Dup()

    def Ishrink(self):
        """Shrink, done at once; the Request completes on its first Wait/Test."""
        return self.Shrink(), _done_request()

    # ---- point to point: the shared path ----

    def _p2p(self, what: str) -> _Matcher:
        g = self._g(what)
        if self._matcher is None or self._matcher.group is not g:
            # one matcher per group: copies of a communicator (MPI.Intracomm(comm)) share it
            m = _matcher_of.get(g)
            if m is None:
                m = _matcher_of[g] = _Matcher(g, self._name)
            self._matcher = m
        return self._matcher

    # The object reductions fold gather's and allgather's lists, whatever
    # the communicator's kind makes them (an intercommunicator's: the remote group's).
    def reduce(self, sendobj, op=SUM, root: int = 0) -> Any:
        """op folded over the objects in rank order, at root (None elsewhere)."""
        fn = op._py if op.__class__ is Op else _py_op(op)  # MPI.SUM and the like, at once
        items = self.gather(sendobj, root)
        return None if items is None else functools.reduce(fn, items)

    def allreduce(self, sendobj, op=SUM) -> Any:
        fn = _py_op(op)
        return functools.reduce(fn, self.allgather(sendobj))

    def _npeers(self, m: _Matcher) -> int:
        """How many ranks a message can name (an intercommunicator's: the remote ones)."""
        return m.group.size

    def _send(self, data: memoryview, dest, tag, what: str, keep=None, sync: bool = False) -> Request:
        """A send; ``sync`` (Ssend) completes only once a receive took the
        message: to oneself when the local receive matches it, to another
        rank when that rank's ack comes back."""
        m = self._p2p(what)
        dest = _rank_arg(dest, self._npeers(m), f"{what}: dest", (PROC_NULL,))
        tag = _tag_arg(tag, f"{what}: tag", allow_any=False)
        if dest == PROC_NULL:
            return _done_request()
        if sync and dest == m.rank:
            return Request(m.network, sync=m.deliver_local(data, tag), matcher=m, timeout=m.group.timeout,
                           describe=lambda: f"{what} to rank {dest} (tag {tag}) of {self._name}")
        sync = _SyncSend(dest) if sync else None
        reqs, head = m.isend(data, dest, tag, sync)
        return Request(m.network, sends=reqs, keep=(keep, data, head), timeout=m.group.timeout, sync=sync,
                       describe=lambda: f"{what} to rank {dest} (tag {tag}) of {self._name}")

    def _recv(self, dst: Optional[memoryview], source, tag, what: str, after=None, keep=None,
              pulled: bool = False) -> Request:
        m, w = self._matcher, _group._world
        if not (m is not None and m.group is self._group and not m.inter and w is not None
                and m.network is w.network and source.__class__ is int and ANY_SOURCE <= source < m.size
                and tag.__class__ is int and ANY_TAG <= tag < _TAG_END):
            # (the common case passes the checks below as it is: written out, they cost an irecv a third)
            m = self._p2p(what)
            source = _rank_arg(source, self._npeers(m), f"{what}: source", (ANY_SOURCE, PROC_NULL))
            tag = _tag_arg(tag, f"{what}: tag", allow_any=True)
            if source == PROC_NULL:
                return _done_request((PROC_NULL, ANY_TAG, 0, False))
        op = _Recv(source, tag, dst)
        m.post(op)
        return _receive(m.network, op, m, m.group.timeout, after, keep, pulled)  # (Request._describe says what)

    def _envelope(self, source, tag, block: bool, what: str):
        """(matcher, source, the first message matching source and tag, or
        None) for Probe and Mprobe: waits for one when ``block`` (raising if
        its sender is gone), else looks once. For PROC_NULL nothing is looked for."""
        m = self._p2p(what)
        source = _rank_arg(source, self._npeers(m), f"{what}: source", (ANY_SOURCE, PROC_NULL))
        tag = _tag_arg(tag, f"{what}: tag", allow_any=True)
        if source == PROC_NULL:
            return m, source, None
        m.probes.append(source)
        try:
            if block:
                _wait_until(lambda: m.find(source, tag) is not None or m.gone(source) is not None,
                            m.network, m.group.timeout, lambda: f"{what} of {self._name}")
            else:
                for _ in range(2):  # once to post envelope receives, once to take them in
                    _progress(m.network)
        finally:
            m.probes.remove(source)
        msg = m.find(source, tag)
        if msg is None and block:
            raise m.gone(source)
        return m, source, msg

    def _probe(self, source, tag, status: Optional[Status], block: bool, what: str) -> bool:
        _, source, msg = self._envelope(source, tag, block, what)
        if source == PROC_NULL:
            if status is not None:
                status._set(PROC_NULL, ANY_TAG, 0)
            return True
        if msg is not None and status is not None:
            status._set(msg.source, msg.tag, msg.nbytes)
        return msg is not None

    # ---- point to point: buffers ----

    def Send(self, buf, dest: int, tag: int = 0) -> None:
        """Send a buffer; returns once the buffer may be reused."""
        if not core_send(self._matcher, self._group, buf, dest, tag):  # (a bare array the core sends at once)
            self._isend(buf, dest, tag).Wait()

    Bsend = Send
    Rsend = Send

    def Ssend(self, buf, dest: int, tag: int = 0) -> None:
        """Send a buffer; to oneself, returns once a receive took it."""
        self.Issend(buf, dest, tag).Wait()

    def Isend(self, buf, dest: int, tag: int = 0, *, _sync: bool = False) -> Request:
        # The core takes a bare array as it is (p2p.core_isend): sent already, the buffer is free.
        r = None if _sync else core_isend(self._matcher, self._group, buf, dest, tag)
        return self._isend(buf, dest, tag, _sync) if r is None else r

    def _isend(self, buf, dest: int, tag: int, sync: bool = False) -> Request:
        """Isend's general path, once the core did not send it (or may not:
        a synchronous send)."""
        if dest == PROC_NULL:
            return _done_request()
        data = _bare_bytes(buf, False)
        if data is not None:  # a bare array: no buffer spec to read
            return self._send(data, dest, tag, "Send", sync=sync)
        b = _Buf(buf, "Isend buf", writable=False, empty_ok=True)
        return self._send(byte_view(b.section()), dest, tag, "Send", keep=b, sync=sync)

    Ibsend = Isend
    Irsend = Isend

    def Issend(self, buf, dest: int, tag: int = 0) -> Request:
        return self.Isend(buf, dest, tag, _sync=True)

    def Recv(self, buf, source: int = ANY_SOURCE, tag: int = ANY_TAG, status: Optional[Status] = None) -> None:
        """Receive into a buffer at least as large as the message."""
        got = None if buf is None else core_recv(self._matcher, self._group, buf, source, tag)  # (None: an object's)
        if got is not None:  # a bare array the core received into
            _fill(status, got[0])
        else:
            self._recv_into(buf, source, tag, status)

    def _recv_into(self, buf, source, tag, status: Optional[Status]) -> None:
        """Recv's general path, once the core did not receive it: its wait
        does not ask the core again (it spins for a message that is late)."""
        dst = _bare_bytes(buf, True)
        if dst is None:  # (a buffer spec: the core was not asked)
            self.Irecv(buf, source, tag).Wait(status)
        else:
            self._recv(dst, source, tag, "Recv", pulled=True).Wait(status)

    def Irecv(self, buf, source: int = ANY_SOURCE, tag: int = ANY_TAG) -> Request:
        r = None if buf is None else core_irecv(self._matcher, self._group, buf, source, tag)  # (None: an object's)
        if r is not None:  # a bare array, posted by the core
            return r
        if source == PROC_NULL:
            return self._recv(None, source, tag, "Recv")
        dst = _bare_bytes(buf, True)
        if dst is not None:  # a bare array: no buffer spec to read, nothing to copy back
            return self._recv(dst, source, tag, "Recv")
        b = _Buf(buf, "Recv buf", writable=True, empty_ok=True)
        return self._recv(byte_view(b.section()), source, tag, "Recv", after=b.finish, keep=b)

    def Sendrecv(self, sendbuf, dest: int, sendtag: int = 0, recvbuf=None, source: int = ANY_SOURCE,
                 recvtag: int = ANY_TAG, status: Optional[Status] = None) -> None:
        """Send and receive at once: no ordering of the two can deadlock."""
        # Bare arrays the core takes as they are: both halves in one call, or the send.
        got = None if recvbuf is None else core_exchange(self._matcher, self._group, sendbuf, dest, sendtag,
                                                         source, recvtag, recvbuf)
        if got is not None and got is not False:
            _fill(status, got[0])
            return
        if got is False or (recvbuf is None and core_send(self._matcher, self._group, sendbuf, dest, sendtag)):
            self._recv_into(recvbuf, source, recvtag, status)  # sent already: the receive may block
            return
        rreq = self.Irecv(recvbuf, source, recvtag)
        sreq = _or_cancel(rreq, self.Isend, sendbuf, dest, sendtag)
        Request.Waitall([rreq, sreq], [status, None])

    def Send_init(self, buf, dest: int, tag: int = 0) -> Prequest:
        """A persistent send: each Start() sends buf's current contents."""
        return Prequest(lambda: self.Isend(buf, dest, tag))

    Bsend_init = Send_init
    Rsend_init = Send_init

    def Ssend_init(self, buf, dest: int, tag: int = 0) -> Prequest:
        return Prequest(lambda: self.Issend(buf, dest, tag))

    def Recv_init(self, buf, source: int = ANY_SOURCE, tag: int = ANY_TAG) -> Prequest:
        return Prequest(lambda: self.Irecv(buf, source, tag))

    def Psend_init(self, buf, partitions: int, dest: int, tag: int = 0, info=None) -> Prequest:
        """A partitioned send: after Start(), Pready(i) marks partition i of
        buf ready; the buffer goes once every partition is."""
        return _Partitioned(lambda: self.Isend(buf, dest, tag), partitions, sending=True)

    def Precv_init(self, buf, partitions: int, source: int = ANY_SOURCE, tag: int = ANY_TAG,
                   info=None) -> Prequest:
        """A partitioned receive: Parrived(i) says whether partition i has arrived."""
        return _Partitioned(lambda: self.Irecv(buf, source, tag), partitions, sending=False)

    def Isendrecv(self, sendbuf, dest: int, sendtag: int = 0, recvbuf=None, source: int = ANY_SOURCE,
                  recvtag: int = ANY_TAG) -> Request:
        """Sendrecv, nonblocking: the Request completes when both halves have."""
        rreq = self.Irecv(recvbuf, source, recvtag)
        sreq = _or_cancel(rreq, self.Isend, sendbuf, dest, sendtag)
        return _Both(rreq, sreq)

    def Isendrecv_replace(self, buf, dest: int, sendtag: int = 0, source: int = ANY_SOURCE,
                          recvtag: int = ANY_TAG) -> Request:
        if buf is None or (dest == PROC_NULL and source == PROC_NULL):
            return self.Isendrecv(buf, dest, sendtag, buf, source, recvtag)
        b = _Buf(buf, "Sendrecv_replace buf", writable=True, empty_ok=True)
        req = self.Isendrecv(b.section().copy(), dest, sendtag, [b.section(), b.flat.dtype], source, recvtag)
        req._after = b.finish
        return req

    def Sendrecv_replace(self, buf, dest: int, sendtag: int = 0, source: int = ANY_SOURCE,
                         recvtag: int = ANY_TAG, status: Optional[Status] = None) -> None:
        b = _Buf(buf, "Sendrecv_replace buf", writable=True, empty_ok=True)
        self.Sendrecv(b.section().copy(), dest, sendtag, [b.section(), b.flat.dtype], source, recvtag, status)
        b.finish()

    def Probe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG, status: Optional[Status] = None) -> bool:
        """Block until a matching message can be received; Status says which."""
        return self._probe(source, tag, status, True, "Probe")

    def Iprobe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG, status: Optional[Status] = None) -> bool:
        return self._probe(source, tag, status, False, "Iprobe")

    probe = Probe
    iprobe = Iprobe

    def Mprobe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG, status: Optional[Status] = None):
        """Block until a message matches, and take it: a Message that only
        Message.Recv/Irecv (or recv/irecv) can receive."""
        return _mprobe(self, source, tag, status, True, "Mprobe")

    def Improbe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG, status: Optional[Status] = None):
        """Mprobe if a matching message has arrived, else None."""
        return _mprobe(self, source, tag, status, False, "Improbe")

    mprobe = Mprobe
    improbe = Improbe

    # ---- point to point: objects ----
    #
    # send, isend, recv, irecv and sendrecv: where the compiled core is
    # built, each is a _core.CommMethod (set at the end of this module), which does
    # what the body here does up to the core's call, in C: a Python frame
    # and its argument handling were a fifth of a small exchange. Where the
    # core leaves the call, both go on in the same _..._rest method.

    def send(self, obj, dest: int, tag: int = 0) -> None:
        data = b"" if dest == PROC_NULL else _pickle.dumps(obj)
        if not core_send(self._matcher, self._group, data, dest, tag):
            self._send_rest(data, dest, tag)

    def _send_rest(self, data: bytes, dest, tag) -> None:
        self._send(memoryview(data), dest, tag, "send").Wait()

    def ssend(self, obj, dest: int, tag: int = 0) -> None:
        self.issend(obj, dest, tag).Wait()

    def isend(self, obj, dest: int, tag: int = 0) -> Request:
        """Send an object, pickled with MPI.pickle."""
        data = b"" if dest == PROC_NULL else _pickle.dumps(obj)
        r = core_isend(self._matcher, self._group, data, dest, tag)
        return self._isend_rest(data, dest, tag) if r is None else r  # (r: sent already)

    def _isend_rest(self, data: bytes, dest, tag) -> Request:
        return self._send(memoryview(data), dest, tag, "send")

    def issend(self, obj, dest: int, tag: int = 0) -> Request:
        data = b"" if dest == PROC_NULL else _pickle.dumps(obj)
        return self._send(memoryview(data), dest, tag, "send", sync=True)

    def recv(self, buf=None, source: int = ANY_SOURCE, tag: int = ANY_TAG, status: Optional[Status] = None) -> Any:
        """Receive an object. ``buf`` is deprecated in mpi4py (a warning) and
        not needed here: the message's size is known before it is received."""
        if buf is not None:
            warnings.warn("the 'buf' argument is deprecated", UserWarning, stacklevel=2)
        got = core_recv(self._matcher, self._group, None, source, tag)
        if got is not None:
            _fill(status, got[0])
            return _pickle.loads(got[1]) if got[1] else None
        return self._recv_rest(source, tag, status)

    def _recv_rest(self, source, tag, status: Optional[Status]) -> Any:
        return self._recv(None, source, tag, "recv", pulled=True).wait(status)  # (the core asked: not again)

    def irecv(self, buf=None, source: int = ANY_SOURCE, tag: int = ANY_TAG) -> Request:
        r = core_irecv(self._matcher, self._group, None, source, tag)  # posted by the core where plain
        return self._irecv_rest(source, tag) if r is None else r

    def _irecv_rest(self, source, tag) -> Request:
        return self._recv(None, source, tag, "recv")

    def sendrecv(self, sendobj, dest: int, sendtag: int = 0, recvbuf=None, source: int = ANY_SOURCE,
                 recvtag: int = ANY_TAG, status: Optional[Status] = None) -> Any:
        data = b"" if dest == PROC_NULL else _pickle.dumps(sendobj)
        got = core_exchange(self._matcher, self._group, data, dest, sendtag, source, recvtag)
        if got is False:  # sent already: the receive may block
            return self._recv_rest(source, recvtag, status)
        if got is not None:
            if status is not None:
                _fill(status, got[0])
            return _pickle.loads(got[1]) if got[1] else None
        return self._sendrecv_rest(data, dest, sendtag, recvbuf, source, recvtag, status)

    def _sendrecv_rest(self, data: bytes, dest, sendtag, recvbuf, source, recvtag, status: Optional[Status]) -> Any:
        rreq = self.irecv(recvbuf, source, recvtag)
        sreq = _or_cancel(rreq, self._send, memoryview(data), dest, sendtag, "send")
        Request.Waitall([rreq, sreq], [status, None])
        return rreq._result

    # ---- collectives: shared helpers ----

    def _root(self, g: ProcessGroup, root, what: str) -> int:
        """The root as a rank; a bad one is MPI.Exception(ERR_ROOT), as in MPI."""
        if root.__class__ is int and 0 <= root < g.size:
            return root  # the common case, at once
        try:
            r = operator.index(root)
        except TypeError:
            raise TypeError(f"{what}: root must be an int rank, got {root!r}") from None
        if not 0 <= r < g.size:
            raise _error(ERR_ROOT, f"{what}: root {r} is not a rank of the communicator (size {g.size})")
        return r

    def Barrier(self) -> None:
        g = self._group
        if g is not None:  # (None: COMM_NULL, which _g explains; find_lane would take it for the world)
            lane = _coll._find_lane(g, _BARRIER_KEY, _coll._BARRIER_TOKEN)  # collectives.barrier's first look
            if lane is not None:
                lane()
                return
        _coll.barrier(group=self._g("Barrier"))

    barrier = Barrier

    def Ibarrier(self) -> Request:
        g = self._g("Ibarrier")
        return Request(g.network, work=_coll.barrier(group=g, async_op=True), timeout=g.timeout)

    # mpi4py defines the buffer collectives on Comm, and code calls them
    # unbound (MPI.Comm.Bcast(comm, ...), as mpi4py.util.pkl5 does): these
    # run the communicator's own kind's method (Intracomm or Intercomm).
    Bcast = _by_kind("Bcast")
    Scatter = _by_kind("Scatter")
    Scatterv = _by_kind("Scatterv")
    Gather = _by_kind("Gather")
    Gatherv = _by_kind("Gatherv")
    Allgather = _by_kind("Allgather")
    Allgatherv = _by_kind("Allgatherv")
    Alltoall = _by_kind("Alltoall")
    Alltoallv = _by_kind("Alltoallv")
    Alltoallw = _by_kind("Alltoallw")
    Reduce = _by_kind("Reduce")
    Allreduce = _by_kind("Allreduce")
    Reduce_scatter_block = _by_kind("Reduce_scatter_block")
    Reduce_scatter = _by_kind("Reduce_scatter")


class _Refused:
    """What a root sends in place of the items it was given when they are
    wrong: every rank then raises the root's error, and the communicator
    stays usable (no rank is left waiting for the root)."""

    def __init__(self, message: str):
        self.message = message

    @staticmethod
    def check(item):
        if isinstance(item, _Refused):
            raise ValueError(item.message)
        return item


def _scatter_items(sendobj, n: int, what: str) -> Sequence:
    """The root's sequence of n items (None: n Nones, as in mpi4py), or n
    _Refused when it is not one."""
    if sendobj is None:
        return [None] * n
    if sendobj.__class__ in (list, tuple) and len(sendobj) == n:
        return sendobj  # the common case, as it is
    try:
        items = list(sendobj)
    except TypeError:
        items = None
    if items is None or len(items) != n:
        return [_Refused(f"{what}: the root's sendobj must be a sequence of {n} items (one per receiving rank), "
                         f"got {sendobj!r:.60}")] * n
    return items


def _predefined(which: str, copy_type=None) -> Comm:
    """COMM_WORLD or COMM_SELF (or a copy of it, of ``copy_type``), unpickled."""
    from .environ import _comm
    comm = _comm(which)
    return comm if copy_type is None else copy_type(comm)


def _or_cancel(rreq: Request, post, *args):
    """post(*args) (a send), or, when it raises (a bad send buffer), cancel
    the receive posted for the same call so that it takes no later message.
    (Arguments, not a lambda: a lambda would make its caller's variables
    cells, which every call pays for, the fast path too.)"""
    try:
        return post(*args)
    except BaseException:
        rreq.Cancel()
        raise


class _Both(Request):
    """Two requests that complete as one (Isendrecv): the receive's status."""

    def __init__(self, rreq: Request, sreq: Request):
        super().__init__(rreq._network or sreq._network, timeout=max(rreq._timeout, sreq._timeout))
        self._pair = (rreq, sreq)

    def _ready(self) -> bool:
        return self._done or all(r._ready() for r in self._pair)

    def _requests(self) -> list:
        return [q for r in self._pair for q in r._requests()]

    def _finish(self) -> None:
        rreq, sreq = self._pair
        st = Status()
        rreq._complete(st)
        sreq._complete(None)
        self._status = (st.source, st.tag, st.count, st.cancelled)
        self._result = rreq._result
        if self._after is not None:
            self._after()


_HW_RESOURCE_TYPE, _SHARED_MEMORY = "mpi_hw_resource_type", "mpi_shared_memory"  # Split_type's info
_CREATE_TAG = _group.MAX_TAG - 3  # collie's p2p tag of Create_group's agreement
_AGREE_TAG = -4  # the internal MPI tag of Agree/Iagree (negative: no user receive takes it)


def _agree_among(g: ProcessGroup, members: tuple, tag: int) -> int:
    """A context unused on every one of ``members`` (world ranks, a subset of
    g): the first member gathers their next free contexts and sends back the
    largest; everyone moves past it."""
    w = _group.world()
    net = g.network
    ptag = g.p2p_tag(_CREATE_TAG)
    mine = np.array([w.next_context, tag], dtype=np.int64)
    if net.rank == members[0]:
        rows = [mine]
        for peer in members[1:]:
            got = np.empty(2, dtype=np.int64)
            net.wait([net.irecv(peer, ptag, byte_view(got))], describe=lambda: "Create_group")
            rows.append(got)
        if any(int(r[1]) != tag for r in rows):
            raise _error(ERR_ARG, f"Create_group: the members gave different tags {[int(r[1]) for r in rows]}")
        context = np.array([max(int(r[0]) for r in rows)], dtype=np.int64)
        net.wait([net.isend(peer, ptag, byte_view(context)) for peer in members[1:]],
                 describe=lambda: "Create_group")
    else:
        context = np.empty(1, dtype=np.int64)
        net.wait([net.isend(members[0], ptag, byte_view(mine))], describe=lambda: "Create_group")
        net.wait([net.irecv(members[0], ptag, byte_view(context))], describe=lambda: "Create_group")
    w.next_context = int(context[0]) + 1
    return int(context[0])


def _in_place(buf):
    """None in a send slot is MPI.IN_PLACE, as in mpi4py."""
    return IN_PLACE if buf is None else buf


def _user_reduce(g, nb, op, src, dst, what: str):
    """A reduction with a user op (Op.Create): all-gather every rank's
    buffer, then fold them in rank order into dst (None: not wanted here)."""
    if dst is not None:
        _check_same(src, dst, what, src.size == dst.size)
    rows = np.empty((g.size, src.size), dtype=src.dtype)
    yield _coll.all_gather_into_tensor(rows, np.ascontiguousarray(src), group=g, async_op=nb)
    if dst is not None:
        acc = rows[0].copy()
        for i in range(1, g.size):
            acc = op._apply(acc, rows[i])
        _store(dst, acc)


# The hot paths' way into the lanes of collie's own calls (collectives.laned).
_all_reduce_laned, _broadcast_laned, _all_gather_laned = (
    _coll.laned(_coll.all_reduce), _coll.laned(_coll.broadcast), _coll.laned(_coll.all_gather_into_tensor))


def _flat_bytes(arr: np.ndarray):
    """A non-empty C-contiguous array's bytes, flat (what the data-moving
    collectives move), or None."""
    if not arr.flags.c_contiguous or not arr.size:
        return None
    return (arr if arr.ndim == 1 else arr.reshape(-1)).view(np.uint8)


def _blocking(gen, doc: str):
    def call(self, *args, **kwargs):
        for _ in gen(self, False, *args, **kwargs):
            pass
    call.__name__, call.__doc__ = gen.__name__[1:], doc
    return call


def _nonblocking(gen):
    def call(self, *args, **kwargs) -> Request:
        steps = gen(self, True, *args, **kwargs)
        work = next(steps)  # checks the arguments and posts the collective
        g = self._g(call.__name__)

        def rest():
            for _ in steps:
                pass

        return Request(g.network, work=work, keep=steps, after=rest, timeout=g.timeout,
                       describe=lambda: f"{call.__name__} of {self._name}")
    call.__name__ = "I" + gen.__name__[1:]
    call.__doc__ = f"The nonblocking {gen.__name__[1:]}: returns a Request."
    return call


def _persistent(iname: str):
    """X_init: a persistent request whose Start() runs the nonblocking IX
    on the arguments given here."""
    name = iname[1:] + "_init"

    def call(self, *args, **kwargs) -> Prequest:
        self._g(name)
        start = getattr(self, iname)
        return Prequest(lambda: start(*args, **kwargs))
    call.__name__ = name
    call.__doc__ = f"The persistent {iname[1:]}: a Prequest; each Start() runs {iname} again."
    return call


class Intracomm(Comm):
    """A communicator within one group of processes (all of collie's)."""

    def Create_intercomm(self, local_leader: int, peer_comm: Comm, remote_leader: int, tag: int = 0):
        """An intercommunicator of this group and another, disjoint one: the
        two leaders (local_leader here, remote_leader of peer_comm there)
        meet over peer_comm. Every process of both groups calls it."""
        from .intercomm import create_intercomm
        return create_intercomm(self, local_leader, peer_comm, remote_leader, tag)

    def Spawn(self, command, args=None, maxprocs: int = 1, info=None, root: int = 0, errcodes=None):
        """Dynamic processes are not supported: an MPI.Exception (ERR_SPAWN)
        that says so, where mpi4py's programs (an MPIPoolExecutor started by
        a plain ``python script.py``) would start new processes."""
        raise _error(ERR_SPAWN, "Spawn: collie does not start processes into a running job; start them all "
                                "with the launcher (e.g. collie run -n N -m mpi4py.futures script.py)")

    def Spawn_multiple(self, command, args=None, maxprocs=None, info=None, root: int = 0, errcodes=None):
        """As Spawn: not supported (ERR_SPAWN)."""
        return self.Spawn(command, args, maxprocs, info, root, errcodes)

    # ---- collectives on buffers ----
    #
    # Each collective is written once, as a generator _X(nb, ...): it checks
    # its arguments, runs collie's collective (async_op=nb), yields the
    # returned Work (None when blocking), then finishes (unpacks, copies the
    # result out). X runs it to the end; IX (nonblocking) runs it up to its
    # yield and returns a Request whose completion runs the rest. A
    # collective made of several collie calls runs all but the last at once.
    # A send buffer of None means MPI.IN_PLACE, as in mpi4py.

    def _Bcast(self, nb, buf, root=0):
        g = self._g("Bcast")
        root = self._root(g, root, "Bcast")
        b = _Buf(buf, "Bcast buf", writable=g.rank != root, empty_ok=True)
        data = _u8(b.section())
        if not data.flags.writeable:
            data = data.copy()
        yield _coll.broadcast(data, src=g.ranks[root], group=g, async_op=nb)
        b.finish()

    def _Scatter(self, nb, sendbuf, recvbuf, root=0):
        g = self._g("Scatter")
        root = self._root(g, root, "Scatter")
        recvbuf = _in_place(recvbuf) if g.rank == root else recvbuf
        pieces = None
        if g.rank == root:
            s = _Buf(sendbuf, "Scatter sendbuf", writable=False, blocks=g.size)
            pieces = [_u8(s.block(i)) for i in range(g.size)]
        r = None
        if recvbuf is IN_PLACE:
            out = pieces[root].copy()
        else:
            r = _Buf(recvbuf, "Scatter recvbuf", writable=True)
            out = _u8(r.section())
        yield _coll.scatter(out, pieces, src=g.ranks[root], group=g, async_op=nb)
        if r is not None:
            r.finish()

    def _Scatterv(self, nb, sendbuf, recvbuf, root=0):
        g = self._g("Scatterv")
        root = self._root(g, root, "Scatterv")
        recvbuf = _in_place(recvbuf) if g.rank == root else recvbuf
        in_blocks = [np.zeros(0, dtype=np.uint8)] * g.size
        if g.rank == root:
            s = _Buf(sendbuf, "Scatterv sendbuf", writable=False, blocks=g.size, vector=True)
            in_blocks = [_u8(s.vblock(i)) for i in range(g.size)]
            if recvbuf is IN_PLACE:
                in_blocks[root] = np.zeros(0, dtype=np.uint8)
        out_sizes = [0] * g.size
        r = None
        out = np.zeros(0, dtype=np.uint8)
        if recvbuf is not IN_PLACE:
            r = _Buf(recvbuf, "Scatterv recvbuf", writable=True, empty_ok=True)
            out = _u8(r.section())
            out_sizes[root] = out.size
        send = _pack(in_blocks)
        yield _coll.all_to_all_single(out, send, out_sizes, [b.size for b in in_blocks], group=g, async_op=nb)
        if r is not None:
            r.finish()

    def _Gather(self, nb, sendbuf, recvbuf, root=0):
        g = self._g("Gather")
        root = self._root(g, root, "Gather")
        sendbuf = _in_place(sendbuf) if g.rank == root else sendbuf
        _only_root(sendbuf, g, root, "Gather", "sendbuf")
        outs = r = None
        if g.rank == root:
            r = _Buf(recvbuf, "Gather recvbuf", writable=True, blocks=g.size)
            outs = [_u8(r.block(i)) for i in range(g.size)]
        if sendbuf is IN_PLACE:
            send = outs[root].copy()
        else:
            send = _u8(_Buf(sendbuf, "Gather sendbuf", writable=False).section())
        yield _coll.gather(send, outs, dst=g.ranks[root], group=g, async_op=nb)
        if r is not None:
            r.finish()

    def _Gatherv(self, nb, sendbuf, recvbuf, root=0):
        g = self._g("Gatherv")
        root = self._root(g, root, "Gatherv")
        sendbuf = _in_place(sendbuf) if g.rank == root else sendbuf
        _only_root(sendbuf, g, root, "Gatherv", "sendbuf")
        send = np.zeros(0, dtype=np.uint8)
        if sendbuf is not IN_PLACE:
            send = _u8(_Buf(sendbuf, "Gatherv sendbuf", writable=False, empty_ok=True).section())
        in_sizes = [0] * g.size
        in_sizes[root] = send.size
        out_sizes = [0] * g.size
        r = None
        out = np.zeros(0, dtype=np.uint8)
        if g.rank == root:
            r = _Buf(recvbuf, "Gatherv recvbuf", writable=True, blocks=g.size, vector=True)
            out_sizes = [r.vblock(i).nbytes for i in range(g.size)]
            if sendbuf is IN_PLACE:
                out_sizes[root] = 0
            out = np.empty(sum(out_sizes), dtype=np.uint8)
        yield _coll.all_to_all_single(out, send, out_sizes, in_sizes, group=g, async_op=nb)
        if r is not None:
            _unpack(out, r, out_sizes, skip=root if sendbuf is IN_PLACE else None)

    def _Allgather(self, nb, sendbuf, recvbuf):
        g = self._g("Allgather")
        sendbuf = _in_place(sendbuf)
        r = _Buf(recvbuf, "Allgather recvbuf", writable=True, blocks=g.size)
        if sendbuf is IN_PLACE:
            send = _u8(r.block(g.rank)).copy()
        else:
            send = _u8(_Buf(sendbuf, "Allgather sendbuf", writable=False).section())
        yield _coll.all_gather_into_tensor(_u8(r.section(g.size)), send, group=g, async_op=nb)
        r.finish()

    def _Allgatherv(self, nb, sendbuf, recvbuf):
        g = self._g("Allgatherv")
        sendbuf = _in_place(sendbuf)
        r = _Buf(recvbuf, "Allgatherv recvbuf", writable=True, blocks=g.size, vector=True)
        outs = [_u8(r.vblock(i)) for i in range(g.size)]
        if sendbuf is IN_PLACE:
            send = outs[g.rank].copy()
        else:
            send = _u8(_Buf(sendbuf, "Allgatherv sendbuf", writable=False, empty_ok=True).section())
        yield _coll.all_gather(outs, send, group=g, async_op=nb)
        r.finish()

    def _Alltoall(self, nb, sendbuf, recvbuf):
        g = self._g("Alltoall")
        sendbuf = _in_place(sendbuf)
        r = _Buf(recvbuf, "Alltoall recvbuf", writable=True, blocks=g.size)
        out = _u8(r.section(g.size))
        if sendbuf is IN_PLACE:
            send = out.copy()
        else:
            send = _u8(_Buf(sendbuf, "Alltoall sendbuf", writable=False, blocks=g.size).section(g.size))
        yield _coll.all_to_all_single(out, send, group=g, async_op=nb)
        r.finish()

    def _Alltoallv(self, nb, sendbuf, recvbuf):
        g = self._g("Alltoallv")
        sendbuf = _in_place(sendbuf)
        r = _Buf(recvbuf, "Alltoallv recvbuf", writable=True, blocks=g.size, vector=True)
        s = r if sendbuf is IN_PLACE else _Buf(sendbuf, "Alltoallv sendbuf", writable=False, blocks=g.size,
                                               vector=True)
        in_blocks = [_u8(s.vblock(i)) for i in range(g.size)]
        send = _pack(in_blocks)  # a copy, so IN_PLACE is safe
        out_sizes = [r.vblock(i).nbytes for i in range(g.size)]
        out = np.empty(sum(out_sizes), dtype=np.uint8)
        yield _coll.all_to_all_single(out, send, out_sizes, [b.size for b in in_blocks], group=g, async_op=nb)
        _unpack(out, r, out_sizes)

    # ---- reductions on buffers ----

    def _Reduce(self, nb, sendbuf, recvbuf, op=SUM, root=0):
        g = self._g("Reduce")
        root = self._root(g, root, "Reduce")
        op = _buffer_op(op, "Reduce")
        sendbuf = _in_place(sendbuf) if g.rank == root else sendbuf
        _only_root(sendbuf, g, root, "Reduce", "sendbuf")
        r = _Buf(recvbuf, "Reduce recvbuf", writable=True) if g.rank == root else None
        dst = r.section() if r is not None else None
        src = dst if sendbuf is IN_PLACE else _Buf(sendbuf, "Reduce sendbuf", writable=False).section()
        if op._user is not None:
            yield from _user_reduce(g, nb, op, src, dst, "Reduce")
            if r is not None:
                r.finish()
            return
        work = _work(op, src, dst, "Reduce")
        yield _coll.reduce(work, dst=g.ranks[root], op=op._collie, group=g, async_op=nb)
        if r is not None:
            _store(dst, work)
            r.finish()

    def _Allreduce(self, nb, sendbuf, recvbuf, op=SUM):
        g = self._g("Allreduce")
        op = _buffer_op(op, "Allreduce")
        sendbuf = _in_place(sendbuf)
        r = _Buf(recvbuf, "Allreduce recvbuf", writable=True)
        dst = r.section()
        src = dst if sendbuf is IN_PLACE else _Buf(sendbuf, "Allreduce sendbuf", writable=False).section()
        if op._user is not None:
            yield from _user_reduce(g, nb, op, src, dst, "Allreduce")
            r.finish()
            return
        work = _work(op, src, dst, "Allreduce")
        yield _coll.all_reduce(work, op=op._collie, group=g, async_op=nb)
        _store(dst, work)
        r.finish()

    def _Reduce_scatter_block(self, nb, sendbuf, recvbuf, op=SUM):
        g = self._g("Reduce_scatter_block")
        op = _buffer_op(op, "Reduce_scatter_block")
        sendbuf = _in_place(sendbuf)
        if sendbuf is IN_PLACE:
            r = _Buf(recvbuf, "Reduce_scatter_block recvbuf", writable=True, blocks=g.size)
            src, dst = r.section(g.size), r.block(0)
        else:
            r = _Buf(recvbuf, "Reduce_scatter_block recvbuf", writable=True)
            src = _Buf(sendbuf, "Reduce_scatter_block sendbuf", writable=False, blocks=g.size).section(g.size)
            dst = r.section()
        _check_same(src, dst, "Reduce_scatter_block", src.size == dst.size * g.size)
        inp = (src != 0) if op._logical else src
        if sendbuf is IN_PLACE and not op._logical:
            inp = inp.copy()
        out = np.empty(dst.size, dtype=inp.dtype) if (op._logical or sendbuf is IN_PLACE) else dst
        yield _coll.reduce_scatter_tensor(out, inp, op=op._collie, group=g, async_op=nb)
        _store(dst, out)
        r.finish()

    def _Reduce_scatter(self, nb, sendbuf, recvbuf, recvcounts=None, op=SUM):
        g = self._g("Reduce_scatter")
        op = _buffer_op(op, "Reduce_scatter")
        sendbuf = _in_place(sendbuf)
        r = _Buf(recvbuf, "Reduce_scatter recvbuf", writable=True)
        if recvcounts is None:
            mine = np.array([r.count], dtype=np.int64)
            every = np.empty(g.size, dtype=np.int64)
            _coll.all_gather_into_tensor(every, mine, group=g)
            recvcounts = every.tolist()
        counts = [_count(c, "Reduce_scatter recvcounts") for c in recvcounts]
        if len(counts) != g.size:
            raise ValueError(f"Reduce_scatter: recvcounts needs one count per rank ({g.size}), got {len(counts)}")
        total = sum(counts)
        # as mpi4py: the send buffer holds sum(recvcounts) elements and the
        # receive buffer recvcounts[rank]; IN_PLACE, the receive buffer holds them all
        if sendbuf is IN_PLACE:
            src, dst = r.flat[r.displ:r.displ + total], r.flat[r.displ:r.displ + counts[g.rank]]
            fits = r.section().size >= total
        else:
            src = _Buf(sendbuf, "Reduce_scatter sendbuf", writable=False).section()
            dst = r.section()
            fits = src.size == total and dst.size == counts[g.rank]
        _check_same(src, dst, f"Reduce_scatter (recvcounts {counts})", fits)
        inp = (src[:total] != 0) if op._logical else src[:total]
        # Blocks padded to the largest count, so that every rank's call looks
        # the same to collie's mismatch check; the padding lanes are dropped.
        width = max(counts) if counts else 0
        padded = np.zeros((g.size, width), dtype=inp.dtype)
        for i, piece in enumerate(np.split(inp, np.cumsum(counts)[:-1])):
            padded[i, :piece.size] = piece
        out = np.empty(width, dtype=inp.dtype)
        yield _coll.reduce_scatter_tensor(out, padded, op=op._collie, group=g, async_op=nb)
        _store(dst[:counts[g.rank]], out[:counts[g.rank]])
        r.finish()

    def _scan(self, nb, sendbuf, recvbuf, op, what: str, inclusive: bool):
        # All-gather, then reduce locally in rank order: the P-fold memory is
        # the price of not having a scan schedule; fine for the sizes scans see.
        g = self._g(what)
        op = _buffer_op(op, what)
        sendbuf = _in_place(sendbuf)
        r = _Buf(recvbuf, f"{what} recvbuf", writable=True)
        dst = r.section()
        src = dst if sendbuf is IN_PLACE else _Buf(sendbuf, f"{what} sendbuf", writable=False).section()
        _check_same(src, dst, what, src.size == dst.size)
        rows = np.empty((g.size, src.size), dtype=src.dtype)
        yield _coll.all_gather_into_tensor(rows, np.ascontiguousarray(src), group=g, async_op=nb)
        upto = g.rank + 1 if inclusive else g.rank
        if upto == 0:
            return
        acc = rows[0].copy()
        for i in range(1, upto):
            acc = op._apply(acc, rows[i]).astype(src.dtype, copy=False)
        if op._logical:
            acc = acc != 0
        _store(dst, acc)
        r.finish()

    def _Scan(self, nb, sendbuf, recvbuf, op=SUM):
        return self._scan(nb, sendbuf, recvbuf, op, "Scan", inclusive=True)

    def _Exscan(self, nb, sendbuf, recvbuf, op=SUM):
        return self._scan(nb, sendbuf, recvbuf, op, "Exscan", inclusive=False)

    _Bcast_any = _blocking(_Bcast, "")

    def Bcast(self, buf, root=0) -> None:
        """Copy root's buffer into every rank's."""
        # The hot path of repeated calls (as Allreduce's): a plain array, moved
        # as its bytes by the lane of the broadcast _Bcast makes.
        group = self._group
        if buf.__class__ is np.ndarray and group is not None and root.__class__ is int and 0 <= root < group.size:
            data = _flat_bytes(buf)
            if data is not None and _broadcast_laned(data, group.ranks[root], group):
                return
        self._Bcast_any(buf, root)

    Ibcast = _nonblocking(_Bcast)
    Scatter = _blocking(_Scatter, "Block r of root's sendbuf into rank r's recvbuf (IN_PLACE at root: "
                                  "root keeps its block where it is).")
    Iscatter = _nonblocking(_Scatter)
    Scatterv = _blocking(_Scatterv, "Scatter with a count and displacement per rank "
                                    "([buf, (counts, displs), type] at root).")
    Iscatterv = _nonblocking(_Scatterv)
    Gather = _blocking(_Gather, "Every rank's sendbuf into block r of root's recvbuf (IN_PLACE at "
                                "root: root's block is already in place).")
    Igather = _nonblocking(_Gather)
    Gatherv = _blocking(_Gatherv, "Gather with a count and displacement per rank "
                                  "([buf, (counts, displs), type] at root).")
    Igatherv = _nonblocking(_Gatherv)
    _Allgather_any = _blocking(_Allgather, "")

    def Allgather(self, sendbuf, recvbuf) -> None:
        """Every rank's sendbuf into block r of every rank's recvbuf."""
        group = self._group  # the hot path, as Bcast's
        if (recvbuf.__class__ is np.ndarray and sendbuf.__class__ is np.ndarray and group is not None
                and sendbuf.dtype == recvbuf.dtype and recvbuf.size == sendbuf.size * group.size):
            out, inp = _flat_bytes(recvbuf), _flat_bytes(sendbuf)
            if out is not None and inp is not None and _all_gather_laned(out, inp, group):
                return
        self._Allgather_any(sendbuf, recvbuf)

    Iallgather = _nonblocking(_Allgather)
    Allgatherv = _blocking(_Allgatherv, "Allgather with a count and displacement per rank.")
    Iallgatherv = _nonblocking(_Allgatherv)
    Alltoall = _blocking(_Alltoall, "Block q of rank r's sendbuf into block r of rank q's recvbuf.")
    Ialltoall = _nonblocking(_Alltoall)
    Alltoallv = _blocking(_Alltoallv, "Alltoall with counts and displacements per rank on both sides.")
    Ialltoallv = _nonblocking(_Alltoallv)
    Reduce = _blocking(_Reduce, "Reduce every rank's sendbuf into root's recvbuf.")
    Ireduce = _nonblocking(_Reduce)
    _Allreduce_any = _blocking(_Allreduce, "")

    def Allreduce(self, sendbuf, recvbuf, op=SUM) -> None:
        """Reduce every rank's sendbuf into every rank's recvbuf."""
        # The hot path of repeated calls: plain NumPy arrays, a predefined op,
        # a shape this communicator ran before: the lane of collie.all_reduce
        # (collectives._lane), after copying sendbuf in unless IN_PLACE.
        group = self._group  # None once freed: the full path says so
        if recvbuf.__class__ is np.ndarray and op.__class__ is Op and op._lane is not None and group is not None:
            if sendbuf is IN_PLACE or sendbuf is None:
                if _all_reduce_laned(recvbuf, op._lane, group):
                    return
            elif sendbuf.__class__ is np.ndarray and sendbuf.dtype == recvbuf.dtype and sendbuf.size == recvbuf.size:
                if sendbuf.shape == recvbuf.shape:  # (the full path overwrites it all the same)
                    recvbuf[...] = sendbuf  # a tenth of copyto's time on a small array
                else:
                    np.copyto(recvbuf.reshape(-1), sendbuf.reshape(-1))
                if _all_reduce_laned(recvbuf, op._lane, group):
                    return
        self._Allreduce_any(sendbuf, recvbuf, op)

    Iallreduce = _nonblocking(_Allreduce)
    Reduce_scatter_block = _blocking(_Reduce_scatter_block, "Reduce, then rank r gets block r of the "
                                     "result (IN_PLACE: recvbuf holds every block, rank r's result "
                                     "lands in its first block).")
    Ireduce_scatter_block = _nonblocking(_Reduce_scatter_block)
    Reduce_scatter = _blocking(_Reduce_scatter, "Reduce, then rank r gets the next recvcounts[r] "
                               "elements of the result (recvcounts defaults to every rank's recvbuf size).")
    Ireduce_scatter = _nonblocking(_Reduce_scatter)
    Scan = _blocking(_Scan, "Rank r gets the reduction of ranks 0..r (inclusive).")
    Iscan = _nonblocking(_Scan)
    Exscan = _blocking(_Exscan, "Rank r gets the reduction of ranks 0..r-1; rank 0's recvbuf is left as is.")
    Iexscan = _nonblocking(_Exscan)

    # ---- persistent collectives (MPI-4) ----
    #
    # X_init binds its arguments; each Start() runs IX on them again (the
    # buffers are read and written at each Start, as MPI does).

    Barrier_init = _persistent("Ibarrier")
    Bcast_init = _persistent("Ibcast")
    Scatter_init = _persistent("Iscatter")
    Scatterv_init = _persistent("Iscatterv")
    Gather_init = _persistent("Igather")
    Gatherv_init = _persistent("Igatherv")
    Allgather_init = _persistent("Iallgather")
    Allgatherv_init = _persistent("Iallgatherv")
    Alltoall_init = _persistent("Ialltoall")
    Alltoallv_init = _persistent("Ialltoallv")
    Reduce_init = _persistent("Ireduce")
    Allreduce_init = _persistent("Iallreduce")
    Reduce_scatter_block_init = _persistent("Ireduce_scatter_block")
    Reduce_scatter_init = _persistent("Ireduce_scatter")
    Scan_init = _persistent("Iscan")
    Exscan_init = _persistent("Iexscan")

    # ---- collectives on objects ----

    def bcast(self, obj=None, root: int = 0) -> Any:
        """root's object, on every rank (MPI.pickle turns it into bytes)."""
        g = self._g("bcast")
        if root.__class__ is not int or not 0 <= root < g.size:
            root = self._root(g, root, "bcast")  # raises, or makes it an int
        lock = self._bcast_lock
        if lock is None:  # as mpi4py: one object bcast at a time per communicator (and its copies)
            lock = self._bcast_lock = _comm_lock(self, "bcast")
        with lock:
            if g.rank == root:
                _objects.broadcast_loads(g, _pickle.dumps(obj), g.ranks[root], _pickle.loads)
                return obj
            return _objects.broadcast_loads(g, None, g.ranks[root], _pickle.loads)

    def scatter(self, sendobj=None, root: int = 0) -> Any:
        """Item r of root's sequence, on rank r."""
        g = self._g("scatter")
        if root.__class__ is not int or not 0 <= root < g.size:
            root = self._root(g, root, "scatter")  # raises, or makes it an int
        payloads = None
        if g.rank == root:
            items = sendobj if sendobj.__class__ in (list, tuple) and len(sendobj) == g.size else \
                _scatter_items(sendobj, g.size, "scatter")  # (the common case as it is, written out)
            payloads = list(map(_pickle.dumps, items))
        return self._scatter_rest(g, payloads, root, None)

    def _scatter_rest(self, g: ProcessGroup, payloads: Optional[list], root: int, got) -> Any:
        """scatter_loads after the core's round (``got``: as _gather_rest's), the root's refusal raised."""
        got = _objects.scatter_loads(g, payloads, root, _pickle.loads, got)
        return _Refused.check(got) if got.__class__ is _Refused else got

    # gather, reduce, scatter, scan and exscan: where the compiled core is
    # built, CommMethods too (see "point to point: objects"), which run the
    # core's round (objects.gather_loads' first, or scatter_loads',
    # all_gather_loads') in C, and leave the rest to their _..._rest.

    def gather(self, sendobj, root: int = 0) -> Optional[list]:
        """Every rank's object, in a list at root (None elsewhere)."""
        g = self._g("gather")
        if root.__class__ is not int or not 0 <= root < g.size:
            root = self._root(g, root, "gather")  # raises, or makes it an int
        return _objects.gather_loads(g, _pickle.dumps(sendobj), root, _pickle.loads)

    def _gather_rest(self, g: ProcessGroup, payload: bytes, root: int, got) -> Optional[list]:
        """gather_loads after the core's round (``got``: what it returned; False: it ran none)."""
        return _objects.gather_loads(g, payload, root, _pickle.loads, got)

    def reduce(self, sendobj, op=SUM, root: int = 0) -> Any:
        """op folded over the objects in rank order, at root (None elsewhere):
        gather's round, folded (Comm.reduce's, without a call to gather)."""
        fn = op._py if op.__class__ is Op else _py_op(op)  # MPI.SUM and the like, at once
        g = self._g("reduce")
        if root.__class__ is not int or not 0 <= root < g.size:
            root = self._root(g, root, "reduce")  # raises, or makes it an int
        return self._reduce_rest(g, _pickle.dumps(sendobj), root, None, fn)

    def _reduce_rest(self, g: ProcessGroup, payload: bytes, root: int, got, fn) -> Any:
        items = _objects.gather_loads(g, payload, root, _pickle.loads, got)
        return None if items is None else functools.reduce(fn, items)

    def allgather(self, sendobj) -> list:
        """Every rank's object, in rank order (MPI.pickle turns them into bytes)."""
        g = self._g("allgather")
        return _objects.all_gather_loads(g, _pickle.dumps(sendobj), _pickle.loads)

    def alltoall(self, sendobj) -> list:
        """Item q of rank r's sequence becomes item r of rank q's result."""
        g = self._g("alltoall")
        items = [None] * g.size if sendobj is None else list(sendobj)  # None: Nones, as in mpi4py
        if len(items) != g.size:
            raise ValueError(f"alltoall: sendobj must be a sequence of {g.size} items (one per rank)")
        return _objects.all_to_all_loads(g, list(map(_pickle.dumps, items)), _pickle.loads)

    def scan(self, sendobj, op=SUM) -> Any:
        fn = _py_op(op)
        g = self._g("scan")
        return self._scan_rest(g, _pickle.dumps(sendobj), None, fn)

    def _scan_rest(self, g: ProcessGroup, payload: bytes, got, fn) -> Any:
        """allgather's round (after the core's: ``got`` as _gather_rest's), folded up to this rank."""
        items = _objects.all_gather_loads(g, payload, _pickle.loads, got)
        return functools.reduce(fn, items[:g.rank + 1])

    def exscan(self, sendobj, op=SUM) -> Any:
        """The fold over ranks before this one; None on rank 0."""
        fn = _py_op(op)
        g = self._g("exscan")
        return self._exscan_rest(g, _pickle.dumps(sendobj), None, fn)

    def _exscan_rest(self, g: ProcessGroup, payload: bytes, got, fn) -> Any:
        items = _objects.all_gather_loads(g, payload, _pickle.loads, got)
        return None if g.rank == 0 else functools.reduce(fn, items[:g.rank])


if core._core is not None:  # the object calls in C: see "point to point: objects" and Intracomm.gather
    core._core.set_comm(Comm, _fill, _Refused)
    core._core.set_ops(Op, SUM)
    for _cls, _names in ((Comm, ("send", "isend", "recv", "irecv", "sendrecv")),
                         (Intracomm, ("gather", "reduce", "scatter", "scan", "exscan"))):
        for _name in _names:
            setattr(_cls, _name, core._core.CommMethod(_name, _cls.__dict__[_name], getattr(_cls, f"_{_name}_rest")))
Comm.bsend, Comm.ibsend = Comm.send, Comm.isend  # (buffered sends need no buffer here; the compiled ones where built)


COMM_NULL = Comm(None)
