"""One-sided communication: MPI.Win.

Design: the origin does the work, in the target's memory itself
----------------------------------------------------------------
A rank reaches the window memory of every rank of its host without that
rank's help, so an operation completes inside the origin's call and
passive-target epochs (Lock/Put/Unlock) work while the target computes and
never calls MPI:

* Allocate and Allocate_shared windows live in one shared-memory segment
  per host (a memfd, so nothing is ever left in /dev/shm) that the host's
  ranks map: a Put is a copy into the mapping, and Shared_query hands out
  real shared memory.
* Create (over the caller's buffer) and Create_dynamic windows stay in the
  target's own memory; the origin reads and writes them with Cross Memory
  Attach (process_vm_readv/writev, see transports/cma.py), one system call
  per contiguous piece, at the address the target published.
* Locks are POSIX record locks on a lock file per host (a memfd the host's
  ranks open): byte 2t is target t's epoch lock (LOCK_SHARED: a read lock,
  LOCK_EXCLUSIVE: a write lock, Lock_all: a read lock on every target), byte
  2t+1 its accumulate lock, held around each read-modify-write so that
  accumulate operations are atomic per element (per call, in fact) as MPI
  requires. The kernel drops the locks of a process that dies, so a lock
  never waits on a dead holder; a lock that waits on a live one keeps the
  rank's MPI progress going and raises at once when a peer has died.
* Ranks on other hosts are served by the target's agent, a thread that
  answers requests sent over the network (see rma.py): any transport, and
  the target still need not call MPI. Each operation waits for its answer.
* Because every operation is complete when its call returns, Flush,
  Flush_local, Sync and the request forms (Rput...) have nothing left to
  wait for; Fence is a barrier of the window's own communicator (a Dup of
  the caller's), and PSCW (Post/Start/Complete/Wait/Test) sends one small
  message per origin-target pair on it.

Limits: Allocate_shared needs one host (ERR_RMA_SHARED otherwise, as MPI
needs a shared-memory communicator); Create/Create_dynamic need CMA between
the ranks of a host (checked at creation; where ptrace is forbidden,
Allocate windows still work); target datatypes are basic (contiguous) ones.
"""

from __future__ import annotations

import errno
import fcntl
import itertools
import operator
import os
import time
import weakref
from typing import Optional

import numpy as np

from ...errors import CollieError
from ...transports import cma, segment
from .buffers import _Buf
from .constants import (BOTTOM, KEYVAL_INVALID, LOCK_EXCLUSIVE, LOCK_SHARED, MODE_NOCHECK, PROC_NULL, UNDEFINED,
                        WIN_BASE, WIN_CREATE_FLAVOR, WIN_DISP_UNIT, WIN_FLAVOR_ALLOCATE, WIN_FLAVOR_CREATE,
                        WIN_FLAVOR_DYNAMIC, WIN_FLAVOR_SHARED, WIN_MODEL, WIN_SIZE, WIN_UNIFIED)
from .datatype import _as_dtype
from .exceptions import (ERR_ARG, ERR_DISP, ERR_KEYVAL, ERR_LOCKTYPE, ERR_OP, ERR_OTHER, ERR_PROC_FAILED,
                         ERR_RMA_ATTACH, ERR_RMA_RANGE, ERR_RMA_SHARED, ERR_RMA_SYNC, ERR_UNSUPPORTED_OPERATION, ERR_WIN, Errhandler,
                         _as_mpi_error, _error, _Handled)
from .group import Group
from .info import Info
from .memory import buffer
from .op import REPLACE, SUM, Op
from .request import _done_request
from .rma import combine

__all__ = ["Win", "WIN_NULL"]

_POST_TAG, _COMPLETE_TAG = 1, 2     # PSCW messages on the window's own communicator


class _State:
    """What the Win objects of one window share (Win(win) is the same window)."""

    def __init__(self, comm, flavor: int, disp_unit: int):
        self.comm = comm                # the caller's communicator (Get_group)
        self.own = comm.Dup()           # the window's: Fence and PSCW traffic
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.flavor, self.disp_unit = flavor, disp_unit
        self.memory = buffer()        # this rank's window memory (tomemory)
        self.base = 0                   # its address (WIN_BASE)
        self.keep = None                # what keeps it alive (the caller's buffer, the mapping)
        self.mapping = None             # Allocate windows: every rank's memory, as uint8
        self.offsets = self.sizes = self.units = self.bases = self.pids = ()
        self.lockfd = -1
        self.locked: dict = {}          # target -> LOCK_SHARED/LOCK_EXCLUSIVE held (or None: NOCHECK)
        self.lock_all: Optional[bool] = None  # True: Lock_all holds read locks, False: NOCHECK
        self.started: list = []         # PSCW: targets of the access epoch
        self.posted: list = []          # PSCW: receives of the origins' Complete
        self.post_sends: list = []
        self.attached: dict = {}        # dynamic: address -> (bytes, the buffer, kept alive)
        self.attrs: dict = {}
        self.name = ""
        self.handle = 0                 # toint's number, 0 until asked
        self.info = Info._of(())
        self.token = np.zeros(1, np.uint8)
        self.global_ranks = tuple(comm._g("Win").ranks)
        self.hosts: tuple = ()          # each rank's host: ranks on ours are reached directly
        self.agent = None               # rma.Agent, when some rank is on another host
        self.flavor_dynamic = flavor == WIN_FLAVOR_DYNAMIC
        self.network = comm._g("Win").network


def _leader(st: _State) -> bool:
    """Whether this rank is the lowest of its host (it makes the host's files)."""
    return st.hosts.index(st.hosts[st.rank]) == st.rank


def _gather_locks(st: _State) -> None:
    """Open the lock file of this rank's host (a memfd of the host's lowest rank)."""
    if _leader(st):
        st.lockfd = os.memfd_create("collie-win-locks", os.MFD_CLOEXEC)
        os.ftruncate(st.lockfd, 2 * st.size)
    wheres = st.own.allgather((os.getpid(), st.lockfd) if _leader(st) else None)
    if not _leader(st):
        st.lockfd = segment.open_memfd(*wheres[st.hosts.index(st.hosts[st.rank])])




def _check_cma(st: _State, what: str) -> None:
    """Create/dynamic windows are reached with CMA: check that every pair can."""
    cma.allow_readers()
    probe = cma.Probe()
    infos = st.own.allgather(probe.info())
    bad = [r for r, info in enumerate(infos)
           if r != st.rank and st.hosts[r] == st.hosts[st.rank] and not cma.works_with(info)]
    bad = st.own.allgather(bad)
    pairs = [(r, p) for r, peers in enumerate(bad) for p in peers]
    if pairs:
        st.own.Free()
        raise _error(ERR_UNSUPPORTED_OPERATION,
                     f"{what}: rank(s) cannot read each other's memory (Cross Memory Attach refused for "
                     f"(reader, target) pairs {pairs}; ptrace is restricted here): use Win.Allocate")


def _mpi_errors(method):
    """Calls that talk to the other ranks raise what mpi4py raises: an
    MPI.Exception (ERR_PROC_FAILED for a dead peer), not collie's error."""
    import functools

    @functools.wraps(method)
    def call(*args, **kwargs):
        try:
            return method(*args, **kwargs)
        except CollieError as exc:
            raise _as_mpi_error(exc) from exc
    return call


def _int(value, what: str) -> int:
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{what} must be an int, got {value!r}") from None


def _comm_arg(comm, what: str):
    from .comm import Comm
    from .environ import _comm
    if comm is None:
        comm = _comm("self")
    if not isinstance(comm, Comm) or not comm:
        raise _error(ERR_ARG, f"{what}: comm must be a communicator, got {comm!r}")
    if comm.Is_inter():
        raise _error(ERR_ARG, f"{what}: windows need an intracommunicator")
    return comm


# ---- keyvals ----

_keyvals: dict = {}   # keyval -> (copy_fn, delete_fn)
_state_of_handle: "weakref.WeakValueDictionary" = weakref.WeakValueDictionary()
_next_handle = itertools.count(1)
_next_keyval = itertools.count(1 << 20)


class Win(_Handled, np.ndarray):
    """An RMA window: memory of every rank of a communicator that the others
    read and write with Put, Get, Accumulate... (see the module docstring
    for how). ``MPI.Win()`` is WIN_NULL; ``MPI.Win(win)`` is the same window."""

    _s: Optional[_State] = None

    def __new__(cls, win: "Optional[Win]" = None):
        if win is not None and not isinstance(win, Win):
            raise TypeError(f"MPI.Win() takes a window, got {type(win).__name__}")
        return cls._of(None if win is None else win._s)

    @classmethod
    def _of(cls, st: Optional[_State]) -> "Win":
        # A Win is a uint8 array over this rank's window memory: that is how
        # it offers the buffer protocol, as mpi4py's Win does (memoryview(win)).
        win = np.asarray(st.memory if st is not None else np.zeros(0, np.uint8)).view(cls)
        win._s = st
        return win

    def __array_finalize__(self, obj) -> None:
        self._s = getattr(obj, "_s", None)

    def __eq__(self, other) -> bool:
        return isinstance(other, Win) and self._s is other._s

    def __ne__(self, other) -> bool:
        return not self == other

    __hash__ = None  # unhashable, as mpi4py's handles are

    def _unordered(self, other):
        raise TypeError("MPI.Win handles have no order")

    __lt__ = __le__ = __gt__ = __ge__ = _unordered

    def __bool__(self) -> bool:
        return self._s is not None

    def __repr__(self) -> str:
        return "<MPI.WIN_NULL>" if self._s is None else f"<MPI.Win {self._s.name!r} rank={self._s.rank}>"

    def __reduce__(self):
        if self is WIN_NULL:
            return "WIN_NULL"
        if self._s is None:
            return (type(self), ())
        raise ValueError(f"cannot pickle {self!r}")

    def __copy__(self):
        # copy.copy would copy the array; a handle copies as it pickles
        how = self.__reduce__()
        return globals()[how] if isinstance(how, str) else how[0](*how[1])

    def __deepcopy__(self, memo):
        return self.__copy__()

    # ---- integer handles: a window's number is given on first request (WIN_NULL: 0) ----

    def toint(self) -> int:
        if self._s is None:
            return 0
        if self._s.handle == 0:
            self._s.handle = next(_next_handle)
            _state_of_handle[self._s.handle] = self._s
        return self._s.handle

    @classmethod
    def fromint(cls, handle: int) -> "Win":
        handle = _int(handle, "Win.fromint handle")
        st = _state_of_handle.get(handle) if handle else None
        if handle and (st is None or st.lockfd < 0):
            raise _error(ERR_WIN, f"Win.fromint: {handle} is not the handle of a live window")
        return cls._of(st)

    py2f = toint
    f2py = fromint
    handle = property(toint)
    fromhandle = fromint

    def _st(self, what: str) -> _State:
        if self._s is None:
            raise _error(ERR_WIN, f"Win.{what} on MPI.WIN_NULL")
        return self._s

    def _valid(self, what: str) -> None:
        self._st(what)

    # ---- creation ----

    @classmethod
    def _new(cls, comm, flavor: int, disp_unit, what: str, info) -> _State:
        comm = _comm_arg(comm, what)
        disp_unit = _int(disp_unit, f"{what} disp_unit")
        if disp_unit <= 0:
            raise _error(ERR_DISP, f"{what}: disp_unit must be positive, got {disp_unit}")
        from ...network import host_identity
        st = _State(comm, flavor, disp_unit)
        st.info = Info._of(info.items() if info else ())
        st.hosts = tuple(st.own.allgather(host_identity()))
        if flavor == WIN_FLAVOR_SHARED and len(set(st.hosts)) > 1:
            st.own.Free()
            raise _error(ERR_RMA_SHARED, f"{what}: shared memory needs every rank on one host (split the "
                                         f"communicator with COMM_TYPE_SHARED), but they are on "
                                         f"{sorted(set(st.hosts))}")
        return st

    @staticmethod
    def _publish(st: _State) -> None:
        """Tell every rank where everyone's memory is, and open the locks."""
        rows = st.own.allgather((os.getpid(), st.base, len(st.memory), st.disp_unit))
        st.pids, st.bases, st.sizes, st.units = (tuple(c) for c in zip(*rows))
        _gather_locks(st)
        if len(set(st.hosts)) > 1:
            from .rma import Agent
            st.agent = Agent(st, st.comm.Dup(), [r for r in range(st.size) if st.hosts[r] != st.hosts[st.rank]])

    @classmethod
    @_mpi_errors
    def Create(cls, memory, disp_unit: int = 1, info=None, comm=None) -> "Win":
        """A window over ``memory`` (a writable buffer, or BOTTOM/None: none)."""
        u8 = np.zeros(0, np.uint8)
        if memory is not None and memory is not BOTTOM:
            buf = _Buf(memory, "Win.Create memory", writable=True)
            if buf._finish is not None:
                raise ValueError("Win.Create memory must be contiguous")
            u8 = buf.flat.view(np.uint8) if buf.flat.size else u8
        st = cls._new(comm, WIN_FLAVOR_CREATE, disp_unit, "Win.Create", info)
        if u8.size:
            st.memory, st.keep = buffer.frombuffer(u8), memory
            st.base = cma.address(u8)
        if st.size > 1:
            _check_cma(st, "Win.Create")
        cls._publish(st)
        return cls._of(st)

    @classmethod
    @_mpi_errors
    def Allocate(cls, size: int, disp_unit: int = 1, info=None, comm=None) -> "Win":
        """A window over ``size`` new bytes of every rank (in one shared segment)."""
        return cls._allocate(size, disp_unit, info, comm, WIN_FLAVOR_ALLOCATE, "Win.Allocate")

    @classmethod
    @_mpi_errors
    def Allocate_shared(cls, size: int, disp_unit: int = 1, info=None, comm=None) -> "Win":
        """As Allocate; Shared_query gives every rank's part of the memory."""
        return cls._allocate(size, disp_unit, info, comm, WIN_FLAVOR_SHARED, "Win.Allocate_shared")

    @classmethod
    def _allocate(cls, size, disp_unit, info, comm, flavor: int, what: str) -> "Win":
        size = _int(size, f"{what} size")
        if size < 0:
            raise _error(ERR_ARG, f"{what}: size must not be negative, got {size}")
        st = cls._new(comm, flavor, disp_unit, what, info)
        sizes = st.own.allgather(size)
        offsets, end = [0] * st.size, 0
        for r, n in enumerate(sizes):  # the parts of this host's ranks, each 16-byte aligned
            if st.hosts[r] == st.hosts[st.rank]:
                offsets[r], end = end, end + (n + 15) // 16 * 16
        seg = segment.Segment(max(end, 16), True, "collie-win") if _leader(st) else None
        wheres = st.own.allgather(seg.info() if seg else None)
        mm = seg.mm if seg else segment.map_peer(wheres[st.hosts.index(st.hosts[st.rank])])
        st.own.Barrier()  # every rank has mapped its host's segment: its name can go
        if seg:
            seg.release_name()
        st.keep = mm
        st.mapping = np.frombuffer(mm, np.uint8)
        st.offsets = tuple(offsets)
        mine = st.mapping[offsets[st.rank]:offsets[st.rank] + size]
        st.memory = buffer.frombuffer(mine) if size else buffer()
        st.base = cma.address(mine) if size else 0
        cls._publish(st)
        return cls._of(st)

    @classmethod
    @_mpi_errors
    def Create_dynamic(cls, info=None, comm=None) -> "Win":
        """A window with no memory yet: Attach adds some; targets are addressed
        by absolute address (Get_address) with disp_unit 1."""
        st = cls._new(comm, WIN_FLAVOR_DYNAMIC, 1, "Win.Create_dynamic", info)
        if st.size > 1:
            _check_cma(st, "Win.Create_dynamic")
        cls._publish(st)
        return cls._of(st)

    def Attach(self, memory) -> None:
        st = self._st("Attach")
        if st.flavor != WIN_FLAVOR_DYNAMIC:
            raise _error(ERR_RMA_ATTACH, "Win.Attach: only a Create_dynamic window takes memory")
        buf = _Buf(memory, "Win.Attach memory", writable=True)
        u8 = buf.flat.view(np.uint8) if buf.flat.size else np.zeros(0, np.uint8)
        st.attached[cma.address(u8) if u8.size else 0] = (u8.size, memory)

    def Detach(self, memory) -> None:
        st = self._st("Detach")
        buf = _Buf(memory, "Win.Detach memory", writable=True)
        at = cma.address(buf.flat.view(np.uint8)) if buf.flat.size else 0
        if st.attached.get(at, (0, None))[1] is not memory:
            raise _error(ERR_RMA_ATTACH, "Win.Detach: this memory is not attached to the window")
        del st.attached[at]

    @_mpi_errors
    def Free(self) -> None:
        """Collective: after every rank is done with the window, release its
        memory, locks and communicator."""
        st = self._st("Free")
        for keyval in list(st.attrs):
            self.Delete_attr(keyval)
        orderly = False
        try:
            st.own.Barrier()  # nobody reads or writes our memory any more
            orderly = True
        finally:  # a dead peer raises above, but this rank's part is released anyway
            if st.agent is not None:
                st.agent.close(orderly)
            if st.lockfd >= 0:
                os.close(st.lockfd)  # drops every lock we held
                st.lockfd = -1
            st.mapping = None
            st.memory = buffer()
            if st.flavor in (WIN_FLAVOR_ALLOCATE, WIN_FLAVOR_SHARED):
                segment.close_mapping(st.keep)  # unmapped now, or when the last view of it goes
            st.keep = None
            st.attached.clear()
            self._s = None
        st.own.Free()
        if st.agent is not None:
            st.agent.comm.Free()
            st.agent = None

    def free(self) -> None:
        """Free the window unless it is WIN_NULL (mpi4py's lowercase free)."""
        if self._s is not None:
            self.Free()

    # ---- queries ----

    def tomemory(self) -> buffer:
        """This rank's window memory (bytes)."""
        return self._st("tomemory").memory

    def Shared_query(self, rank: int) -> tuple:
        """(memory of ``rank``'s part, its disp_unit). Allocate_shared windows
        give any rank's; other windows only this rank's own (else no memory)."""
        st = self._st("Shared_query")
        rank = _int(rank, "Shared_query rank")
        if rank == PROC_NULL:
            rank = next((r for r in range(st.size) if st.sizes[r]), 0)
        elif not 0 <= rank < st.size:
            raise _error(ERR_ARG, f"Win.Shared_query: rank {rank} is not in the window (size {st.size})")
        if st.flavor == WIN_FLAVOR_SHARED and st.sizes[rank]:
            at = st.offsets[rank]
            return buffer.frombuffer(st.mapping[at:at + st.sizes[rank]]), st.units[rank]
        if rank == st.rank:
            return st.memory, st.disp_unit
        return buffer(), st.units[rank]

    def Get_group(self) -> Group:
        return self._st("Get_group").comm.Get_group()

    def Get_attr(self, keyval: int):
        st = self._st("Get_attr")
        predefined = {WIN_BASE: st.base, WIN_SIZE: len(st.memory), WIN_DISP_UNIT: st.disp_unit,
                      WIN_CREATE_FLAVOR: st.flavor, WIN_MODEL: WIN_UNIFIED}
        if keyval in predefined:
            return predefined[keyval]
        if keyval == KEYVAL_INVALID:
            raise _error(ERR_KEYVAL, "Win.Get_attr: MPI.KEYVAL_INVALID is no attribute key")
        return st.attrs.get(keyval)

    def Set_attr(self, keyval: int, attrval) -> None:
        st = self._st("Set_attr")
        if keyval not in _keyvals:
            raise _error(ERR_KEYVAL, f"Win.Set_attr: {keyval} is not a keyval of Win.Create_keyval")
        if keyval in st.attrs:
            self.Delete_attr(keyval)
        st.attrs[keyval] = attrval

    def Delete_attr(self, keyval: int) -> None:
        st = self._st("Delete_attr")
        if keyval not in st.attrs:
            raise _error(ERR_KEYVAL, f"Win.Delete_attr: the window has no attribute {keyval}")
        value = st.attrs.pop(keyval)
        delete_fn = _keyvals.get(keyval, (None, None))[1]
        if delete_fn is not None:
            try:
                delete_fn(self, keyval, value)
            except BaseException as exc:  # as MPI reports a failed callback: printed, then ERR_OTHER
                import traceback
                traceback.print_exc()
                raise _error(ERR_OTHER, f"Win.Delete_attr: the delete function of keyval {keyval} "
                                        f"raised {type(exc).__name__}: {exc}") from exc

    @classmethod
    def Create_keyval(cls, copy_fn=None, delete_fn=None, nopython: bool = False) -> int:
        """A key for Set_attr (windows are never copied, so copy_fn is kept unused)."""
        keyval = next(_next_keyval)
        _keyvals[keyval] = (copy_fn, delete_fn)
        return keyval

    @classmethod
    def Free_keyval(cls, keyval: int) -> int:
        if _keyvals.pop(keyval, None) is None:
            raise _error(ERR_KEYVAL, f"Win.Free_keyval: {keyval} is not a keyval of Win.Create_keyval")
        return KEYVAL_INVALID

    def Get_info(self) -> Info:
        return Info._of(self._st("Get_info").info.items())

    def Set_info(self, info) -> None:
        self._st("Set_info").info = Info._of(info.items() if info else ())

    def Set_errhandler(self, errhandler) -> None:
        # keep a copy: the caller may Free its handle, the window keeps its handler
        super().Set_errhandler(errhandler if not isinstance(errhandler, Errhandler) else Errhandler(errhandler))

    def Get_name(self) -> str:
        return "MPI_WIN_NULL" if self._s is None else self._s.name

    def Set_name(self, name: str) -> None:
        if not isinstance(name, str):
            raise TypeError(f"Win.Set_name: name must be a str, got {name!r}")
        self._st("Set_name").name = name

    name = property(Get_name, Set_name)
    info = property(Get_info, Set_info)
    group = property(Get_group)
    group_size = property(lambda self: self._st("group_size").size)
    group_rank = property(lambda self: self._st("group_rank").rank)
    attrs = property(lambda self: (self.Get_attr(WIN_BASE), self.Get_attr(WIN_SIZE), self.Get_attr(WIN_DISP_UNIT)))
    flavor = property(lambda self: self.Get_attr(WIN_CREATE_FLAVOR))
    model = property(lambda self: self.Get_attr(WIN_MODEL))

    # ---- where a target's bytes are ----

    def _target(self, st: _State, what: str, rank, target, count: int, dtype: np.dtype) -> tuple:
        """(rank, byte offset or absolute address, nbytes, target dtype) of a
        target spec: None, disp, or [disp, count, datatype] as mpi4py reads it."""
        disp, tcount, tdtype = 0, None, dtype
        if target is not None:
            if isinstance(target, (list, tuple)):
                if not 1 <= len(target) <= 3:
                    raise ValueError(f"Win.{what}: target must be [disp, count, datatype], got {target!r}")
                disp = target[0]
                if len(target) > 1:
                    tcount = target[1]
                if len(target) > 2:
                    tdtype = _as_dtype(target[2])
            elif isinstance(target, int) or hasattr(target, "__index__"):
                disp = target
            else:  # as mpi4py: not a target spec at all
                raise ValueError(f"Win.{what}: target must be None, a displacement or "
                                 f"[disp, count, datatype], got {target!r}")
        disp = _int(disp, f"Win.{what} target displacement")
        nbytes = count * dtype.itemsize
        if tcount is None:
            if tdtype.itemsize == 0 or nbytes % tdtype.itemsize:
                raise ValueError(f"Win.{what}: {nbytes} origin bytes are not a whole number of {tdtype}")
            tcount = nbytes // tdtype.itemsize
        tcount = _int(tcount, f"Win.{what} target count")
        if tcount * tdtype.itemsize != nbytes:
            raise ValueError(f"Win.{what}: the target has {tcount} x {tdtype} ({tcount * tdtype.itemsize} bytes) "
                             f"but the origin buffer {count} x {dtype} ({nbytes} bytes)")
        if disp < 0:
            raise _error(ERR_DISP, f"Win.{what}: target displacement {disp} is negative")
        if st.flavor == WIN_FLAVOR_DYNAMIC:
            return rank, disp, nbytes, tdtype
        at = disp * st.units[rank]
        if at + nbytes > st.sizes[rank] and nbytes:
            raise _error(ERR_RMA_RANGE, f"Win.{what}: bytes [{at}, {at + nbytes}) are outside the "
                                        f"{st.sizes[rank]} bytes of rank {rank}'s window memory")
        return rank, at, nbytes, tdtype

    def _rank(self, st: _State, rank, what: str) -> int:
        rank = _int(rank, f"Win.{what} target_rank")
        if rank != PROC_NULL and not 0 <= rank < st.size:
            raise _error(ERR_ARG, f"Win.{what}: target_rank {rank} is not in the window (size {st.size})")
        return rank

    def _local(self, st: _State, rank: int, at: int, nbytes: int) -> Optional[np.ndarray]:
        """The target bytes as an array of ours, when we map them."""
        if st.mapping is not None and st.hosts[rank] == st.hosts[st.rank]:
            at += st.offsets[rank]
            return st.mapping[at:at + nbytes]
        if rank == st.rank and st.flavor == WIN_FLAVOR_CREATE:
            return np.frombuffer(st.memory, np.uint8)[at:at + nbytes]
        return None

    def _address(self, st: _State, rank: int, at: int) -> int:
        return at if st.flavor == WIN_FLAVOR_DYNAMIC else st.bases[rank] + at

    def _cma(self, st: _State, move, rank: int, at: int, data: np.ndarray, what: str) -> None:
        try:
            if data.size:
                move(st.pids[rank], *((self._address(st, rank, at), data) if move is cma.write
                                      else (data, self._address(st, rank, at))))
        except OSError as e:
            if e.errno == errno.ESRCH:
                raise _error(ERR_PROC_FAILED, f"rank {st.rank}: Win.{what}: rank {rank} of the window "
                                              f"(pid {st.pids[rank]}) is gone") from e
            raise _error(ERR_RMA_RANGE, f"rank {st.rank}: Win.{what}: cannot reach {data.size} bytes at "
                                        f"{self._address(st, rank, at):#x} of rank {rank}: {e}") from e

    def _ask(self, st: _State, rank: int, what: str, *args, **kwargs) -> None:
        """One request to the agent of ``rank`` (on another host), its errors as MPI's."""
        from .rma import OK
        try:
            status = st.agent.request(rank, *args, **kwargs)
        except CollieError as exc:
            raise _as_mpi_error(exc) from exc
        if status != OK:
            raise _error(ERR_RMA_RANGE, f"rank {st.rank}: Win.{what}: rank {rank} has no window memory at "
                                        f"{args[1]:#x} ({args[2]} bytes)")

    def _remote(self, st: _State, rank: int) -> bool:
        return st.hosts[rank] != st.hosts[st.rank]

    def _read(self, st: _State, rank: int, at: int, out: np.ndarray, what: str) -> None:
        """Copy target bytes into ``out`` (uint8, contiguous)."""
        if not out.size:
            return
        if self._remote(st, rank):
            from .rma import GET
            return self._ask(st, rank, what, GET, at, out.size, out=out)
        local = self._local(st, rank, at, out.size)
        if local is not None:
            out[:] = local
        else:
            self._cma(st, cma.read, rank, at, out, what)

    def _write(self, st: _State, rank: int, at: int, data: np.ndarray, what: str) -> None:
        if not data.size:
            return
        if self._remote(st, rank):
            from .rma import PUT
            return self._ask(st, rank, what, PUT, at, data.size, payload=np.ascontiguousarray(data))
        local = self._local(st, rank, at, data.size)
        if local is not None:
            local[:] = data
        else:
            self._cma(st, cma.write, rank, at, np.ascontiguousarray(data), what)

    # ---- data movement ----

    @_mpi_errors
    def Put(self, origin, target_rank: int, target=None) -> None:
        """Write the origin buffer into target_rank's window memory."""
        st = self._st("Put")
        buf = _Buf(origin, "Win.Put origin", writable=False, empty_ok=True)
        rank = self._rank(st, target_rank, "Put")
        if rank == PROC_NULL:
            return
        data = buf.section()
        rank, at, nbytes, _ = self._target(st, "Put", rank, target, data.size, data.dtype)
        self._write(st, rank, at, data.view(np.uint8) if nbytes else np.zeros(0, np.uint8), "Put")

    @_mpi_errors
    def Get(self, origin, target_rank: int, target=None) -> None:
        """Read target_rank's window memory into the origin buffer."""
        st = self._st("Get")
        buf = _Buf(origin, "Win.Get origin", writable=True, empty_ok=True)
        rank = self._rank(st, target_rank, "Get")
        if rank == PROC_NULL:
            return
        data = buf.section()
        rank, at, nbytes, _ = self._target(st, "Get", rank, target, data.size, data.dtype)
        if nbytes:
            self._read(st, rank, at, data.view(np.uint8), "Get")
        buf.finish()

    def _op(self, op, what: str) -> str:
        """The op's name, REPLACE and NO_OP included; the others need a ufunc."""
        if not isinstance(op, Op):
            raise TypeError(f"Win.{what}: op must be an MPI.Op (MPI.SUM, MPI.REPLACE...), got {op!r}")
        if op._user is not None or (op._ufunc is None and op.name not in ("REPLACE", "NO_OP")):
            raise _error(ERR_OP, f"Win.{what}: MPI.{op.name} cannot accumulate (predefined ops only, "
                                 f"and not MINLOC/MAXLOC)")
        return op.name

    def _lock_byte(self, st: _State, byte: int, exclusive: bool, what: str) -> None:
        """Take one byte of the lock file, keeping MPI progress going while
        we wait, and raising if a peer of the window dies meanwhile."""
        kind = (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB
        delay = 0.0
        while True:
            try:
                fcntl.lockf(st.lockfd, kind, 1, byte)
                return
            except OSError as e:
                if e.errno not in (errno.EACCES, errno.EAGAIN):
                    raise
            self._check_peers(st, what)
            time.sleep(delay)
            delay = min(delay * 2 or 20e-6, 1e-3)

    def _take(self, st: _State, rank: int, exclusive: bool, what: str) -> None:
        """Rank's epoch lock: its byte of our host's lock file, or its agent's."""
        if self._remote(st, rank):
            from .rma import LOCK
            self._ask(st, rank, what, LOCK, 0, 0, mode=int(exclusive))
        else:
            self._lock_byte(st, 2 * rank, exclusive, what)

    def _give(self, st: _State, rank: int, what: str) -> None:
        if self._remote(st, rank):
            from .rma import UNLOCK
            self._ask(st, rank, what, UNLOCK, 0, 0)
        else:
            self._unlock_byte(st, 2 * rank)

    def _unlock_byte(self, st: _State, byte: int) -> None:
        fcntl.lockf(st.lockfd, fcntl.LOCK_UN, 1, byte)

    def _check_peers(self, st: _State, what: str) -> None:
        from .p2p import _progress
        _progress(st.network)
        lost = [r for r, g in enumerate(st.global_ranks) if g in st.network._lost]
        if lost:
            raise _error(ERR_PROC_FAILED, f"rank {st.rank}: Win.{what}: rank(s) {lost} of the window died")

    @_mpi_errors
    def _accumulate(self, st: _State, what: str, origin, result, target_rank, target, op,
                    compare=None, single: bool = False) -> None:
        """The one read-modify-write of Accumulate, Get_accumulate,
        Fetch_and_op and Compare_and_swap, under the target's accumulate lock."""
        fetch = result is not None
        name = self._op(op, what)
        obuf = _Buf(origin, f"Win.{what} origin", writable=False, empty_ok=True)
        rbuf = _Buf(result, f"Win.{what} result", writable=True, empty_ok=True) if fetch else None
        cbuf = _Buf(compare, f"Win.{what} compare", writable=False) if compare is not None else None
        rank = self._rank(st, target_rank, what)
        data = obuf.section()
        if single:
            for which, b in (("origin", obuf), ("compare", cbuf), ("result", rbuf)):
                if b is not None and (b.count != 1 or b.flat.dtype != data.dtype):
                    raise ValueError(f"Win.{what}: the {which} buffer must hold one element of the "
                                     f"origin's type ({data.dtype}), got {b.count} x {b.flat.dtype}")
        if rank == PROC_NULL:
            return
        got = rbuf.section() if fetch else None
        if fetch and name == "NO_OP" and not single and data.size == 0:
            data = np.zeros(got.size, got.dtype)  # Get_accumulate with NO_OP may pass no origin data
        if fetch and not single and (got.size, got.dtype) != (data.size, data.dtype):
            raise ValueError(f"Win.{what}: origin is {data.size} x {data.dtype} but result is "
                             f"{got.size} x {got.dtype}")
        rank, at, nbytes, tdtype = self._target(st, what, rank, target, data.size, data.dtype)
        if name not in ("REPLACE", "NO_OP") and tdtype != data.dtype:
            raise ValueError(f"Win.{what}: origin type {data.dtype} differs from the target type {tdtype}")
        if nbytes == 0:
            return
        old = np.empty(nbytes, np.uint8)
        if self._remote(st, rank):
            from .rma import ACC
            payload = data.view(np.uint8) if compare is None else np.concatenate(
                [data.view(np.uint8), cbuf.section().view(np.uint8)])
            self._ask(st, rank, what, ACC, at, nbytes, payload=np.ascontiguousarray(payload),
                      out=old if fetch else None, op=name, dtype=tdtype, mode=int(compare is not None))
            if fetch:
                got.view(np.uint8)[:] = old
                rbuf.finish()
            return
        byte = 2 * rank + 1
        self._lock_byte(st, byte, True, what)
        try:
            self._read(st, rank, at, old, what)
            new = combine(name, op, old.view(tdtype), data.view(tdtype),
                          None if compare is None else cbuf.section().view(tdtype))
            if new is not None:
                self._write(st, rank, at, np.ascontiguousarray(new).view(np.uint8), what)
        finally:
            self._unlock_byte(st, byte)
        if fetch:
            got.view(np.uint8)[:] = old
            rbuf.finish()

    def Accumulate(self, origin, target_rank: int, target=None, op=SUM) -> None:
        """target = target op origin, element by element, atomically."""
        self._accumulate(self._st("Accumulate"), "Accumulate", origin, None, target_rank, target, op)

    def Get_accumulate(self, origin, result, target_rank: int, target=None, op=SUM) -> None:
        """result = target; target = target op origin (atomically)."""
        self._accumulate(self._st("Get_accumulate"), "Get_accumulate", origin, result, target_rank, target,
                         op)

    def Fetch_and_op(self, origin, result, target_rank: int, target_disp: int = 0, op=SUM) -> None:
        """Get_accumulate of one element at target_disp."""
        self._accumulate(self._st("Fetch_and_op"), "Fetch_and_op", origin, result, target_rank,
                         target_disp, op, single=True)

    def Compare_and_swap(self, origin, compare, result, target_rank: int, target_disp: int = 0) -> None:
        """result = target; target = origin if target == compare (one element, atomically)."""
        self._accumulate(self._st("Compare_and_swap"), "Compare_and_swap", origin, result, target_rank,
                         target_disp, REPLACE, compare=compare, single=True)

    # Request forms: the operation is complete when the call returns.

    def Rput(self, origin, target_rank: int, target=None):
        self.Put(origin, target_rank, target)
        return _done_request()

    def Rget(self, origin, target_rank: int, target=None):
        self.Get(origin, target_rank, target)
        return _done_request()

    def Raccumulate(self, origin, target_rank: int, target=None, op=SUM):
        self.Accumulate(origin, target_rank, target, op)
        return _done_request()

    def Rget_accumulate(self, origin, result, target_rank: int, target=None, op=SUM):
        self.Get_accumulate(origin, result, target_rank, target, op)
        return _done_request()

    # ---- synchronization ----

    @_mpi_errors
    def Fence(self, assertion: int = 0) -> None:
        """End one access/exposure epoch and start the next: a barrier (the
        operations before it are complete already)."""
        st = self._st("Fence")
        _int(assertion, "Win.Fence assertion")
        st.own.Barrier()

    @_mpi_errors
    def Lock(self, rank: int, lock_type: int = LOCK_EXCLUSIVE, assertion: int = 0) -> None:
        st = self._st("Lock")
        rank = self._rank(st, rank, "Lock")
        if lock_type not in (LOCK_EXCLUSIVE, LOCK_SHARED):
            raise _error(ERR_LOCKTYPE, f"Win.Lock: lock_type must be LOCK_EXCLUSIVE or LOCK_SHARED, "
                                       f"got {lock_type!r}")
        if rank == PROC_NULL:
            return
        if rank in st.locked or st.lock_all is not None:
            raise _error(ERR_RMA_SYNC, f"Win.Lock: rank {st.rank} already holds a lock on rank {rank}")
        if not _int(assertion, "Win.Lock assertion") & MODE_NOCHECK:
            self._take(st, rank, lock_type == LOCK_EXCLUSIVE, "Lock")
            st.locked[rank] = lock_type
        else:
            st.locked[rank] = None

    @_mpi_errors
    def Unlock(self, rank: int) -> None:
        st = self._st("Unlock")
        rank = self._rank(st, rank, "Unlock")
        if rank == PROC_NULL:
            return
        if rank not in st.locked:
            raise _error(ERR_RMA_SYNC, f"Win.Unlock: rank {st.rank} holds no lock on rank {rank}")
        if st.locked.pop(rank) is not None:
            self._give(st, rank, "Unlock")

    @_mpi_errors
    def Lock_all(self, assertion: int = 0) -> None:
        st = self._st("Lock_all")
        if st.locked or st.lock_all is not None:
            raise _error(ERR_RMA_SYNC, f"Win.Lock_all: rank {st.rank} already holds locks")
        if _int(assertion, "Win.Lock_all assertion") & MODE_NOCHECK:
            st.lock_all = False
            return
        taken = []
        try:
            for r in range(st.size):
                self._take(st, r, False, "Lock_all")
                taken.append(r)
        except BaseException:
            for r in taken:
                self._give(st, r, "Lock_all")
            raise
        st.lock_all = True

    @_mpi_errors
    def Unlock_all(self) -> None:
        st = self._st("Unlock_all")
        if st.lock_all is None:
            raise _error(ERR_RMA_SYNC, f"Win.Unlock_all: rank {st.rank} did not call Lock_all")
        if st.lock_all:
            for r in range(st.size):
                self._give(st, r, "Unlock_all")
        st.lock_all = None

    def _epoch(self, rank, what: str) -> None:
        st = self._st(what)
        if rank is not None:
            rank = self._rank(st, rank, what)
            if rank != PROC_NULL and rank not in st.locked and st.lock_all is None:
                raise _error(ERR_RMA_SYNC, f"Win.{what}: rank {st.rank} holds no lock on rank {rank}")
        elif not st.locked and st.lock_all is None:
            raise _error(ERR_RMA_SYNC, f"Win.{what}: rank {st.rank} is in no passive-target epoch")

    def Flush(self, rank: int) -> None:
        """Every operation to ``rank`` is complete (they are, on return)."""
        self._epoch(rank, "Flush")

    def Flush_all(self) -> None:
        self._epoch(None, "Flush_all")

    def Flush_local(self, rank: int) -> None:
        self._epoch(rank, "Flush_local")

    def Flush_local_all(self) -> None:
        self._epoch(None, "Flush_local_all")

    def Sync(self) -> None:
        """Public and private copies agree: collie's windows have one copy
        (WIN_UNIFIED), and every access went through the kernel or the mapping."""
        self._st("Sync")

    # ---- PSCW (general active target) ----

    def _ranks_of(self, st: _State, group, what: str) -> list:
        if not isinstance(group, Group):
            raise TypeError(f"Win.{what}: expected an MPI.Group, got {group!r}")
        ranks = [r for r in Group.Translate_ranks(group, None, st.comm.Get_group())]
        if UNDEFINED in ranks:
            raise _error(ERR_ARG, f"Win.{what}: the group has processes outside the window")
        return ranks

    @_mpi_errors
    def Post(self, group, assertion: int = 0) -> None:
        """Start an exposure epoch to the origins of ``group``."""
        st = self._st("Post")
        if st.posted:
            raise _error(ERR_RMA_SYNC, "Win.Post: an exposure epoch is already open (call Wait)")
        origins = self._ranks_of(st, group, "Post")
        st.post_sends = [st.own.Isend(st.token, o, _POST_TAG) for o in origins]
        st.posted = [st.own.Irecv(np.zeros(1, np.uint8), o, _COMPLETE_TAG) for o in origins] or [_done_request()]

    @_mpi_errors
    def Start(self, group, assertion: int = 0) -> None:
        """Start an access epoch to the targets of ``group``: waits for their Post."""
        st = self._st("Start")
        if st.started:
            raise _error(ERR_RMA_SYNC, "Win.Start: an access epoch is already open (call Complete)")
        targets = self._ranks_of(st, group, "Start")
        for t in targets:
            st.own.Recv(np.zeros(1, np.uint8), t, _POST_TAG)
        st.started = targets or [None]

    @_mpi_errors
    def Complete(self) -> None:
        """End the access epoch: tell each target that we are done."""
        st = self._st("Complete")
        if not st.started:
            raise _error(ERR_RMA_SYNC, "Win.Complete without Win.Start")
        for t in st.started:
            if t is not None:
                st.own.Send(st.token, t, _COMPLETE_TAG)
        st.started = []

    @_mpi_errors
    def Wait(self) -> None:
        """End the exposure epoch once every origin has called Complete."""
        st = self._st("Wait")
        if not st.posted:
            raise _error(ERR_RMA_SYNC, "Win.Wait without Win.Post")
        from .request import Request
        Request.Waitall(st.posted + st.post_sends)
        st.posted, st.post_sends = [], []

    @_mpi_errors
    def Test(self) -> bool:
        """Wait, if it would not block: True once the exposure epoch ended."""
        st = self._st("Test")
        if not st.posted:
            raise _error(ERR_RMA_SYNC, "Win.Test without Win.Post")
        from .p2p import _progress
        from .request import Request
        while _progress(st.network):  # everything that has arrived, not one step of it
            pass
        if not Request.Testall(st.posted + st.post_sends):
            return False
        st.posted, st.post_sends = [], []
        return True


WIN_NULL = Win()
