"""An mpi4py-style API on collie: ``from collie import MPI``.

    from collie import MPI                 # instead of: from mpi4py import MPI
    comm = MPI.COMM_WORLD
    data = comm.bcast({"step": 1} if comm.rank == 0 else None, root=0)
    out = np.empty(4)
    comm.Allreduce(np.ones(4), out, op=MPI.SUM)

Names, signatures and semantics follow mpi4py: lowercase methods move
picklable Python objects, uppercase methods move buffers (NumPy arrays, torch
CPU tensors, anything with the buffer protocol) given as ``buf``,
``[buf, MPI.DOUBLE]``, ``[buf, count, MPI.DOUBLE]`` or, for the v-variants,
``[buf, (counts, displs), MPI.DOUBLE]``. Ranks, roots, sources and
destinations are ranks of the communicator. docs/mpi.md lists what is
supported and how it differs from mpi4py.

A communicator wraps a collie ProcessGroup. COMM_WORLD is collie's default
group: on first use it runs collie.init_process_group() (env://, as set by
``collie run``, torchrun, mpiexec or srun), or makes a world of one process
when no launcher set anything, as mpi4py does without mpiexec. Split and Dup
make groups with collie.group.split_group. Collectives are collie's, run on
the communicator's group; out-of-place calls first copy the input into the
receive buffer (or a scratch array) and reduce there.

Point-to-point matching
-----------------------
collie's transports match a receive to a message by exact (peer, tag), but an
MPI receive may ask for ANY_SOURCE and ANY_TAG. So every MPI message of a
communicator travels as two collie messages, on two fixed tags of the
communicator's group: a 16-byte *envelope* (MPI tag and payload size, int64)
on the envelope tag, then the *payload* on the payload tag. Messages between
two ranks with one tag never overtake each other, so the k-th envelope from a
peer describes the k-th payload from it.

Each communicator keeps, in its _Matcher:

  posted     receives not matched yet, in the order they were posted;
  unmatched  messages whose envelope came before any receive wanted them
             (their payload is then received at once, into a bytearray);
  envelopes  at most one envelope receive per peer, posted while a receive
             (or a probe) could match a message from that peer.

A new receive takes the oldest matching message of ``unmatched`` if there
is one. When an envelope arrives, the oldest matching posted receive takes
it and the payload goes straight into that receive's buffer (no extra copy);
with no taker the message joins ``unmatched``. That is MPI's non-overtaking
rule: two messages from one sender that both match a receive are matched in
the order they were sent. A message to oneself is delivered locally.

Progress: every blocking call and every Test/Wait advances the envelopes of
all communicators with receives outstanding, so an Irecv posted before a
blocking Send completes even when two ranks send to each other at once, as
MPI promises. After an ANY_SOURCE receive, envelope receives may stay posted
on other peers; they simply catch those peers' next messages.
"""

from __future__ import annotations

import functools
import operator
import os
import pickle
import socket
import sys
import threading
import time
import weakref
from typing import Any, Callable, Optional, Sequence

import numpy as np

from .. import collectives as _coll
from .. import group as _group
from .. import objects as _objects
from ..arrays import byte_view, to_numpy
from ..errors import CollieError, CollieTimeout
from ..group import MAX_TAG, ProcessGroup
from ..ops import ReduceOp

__all__ = [
    # environment
    "Init", "Init_thread", "Finalize", "Is_initialized", "Is_finalized", "Query_thread",
    "Is_thread_main", "Wtime", "Wtick", "Get_processor_name", "Get_version", "Get_library_version",
    "THREAD_SINGLE", "THREAD_FUNNELED", "THREAD_SERIALIZED", "THREAD_MULTIPLE",
    # communicators
    "Comm", "Intracomm", "COMM_WORLD", "COMM_SELF", "COMM_NULL",
    # point to point
    "Status", "Request", "REQUEST_NULL", "ANY_SOURCE", "ANY_TAG", "PROC_NULL", "UNDEFINED",
    "SUCCESS", "TAG_UB", "IN_PLACE",
    # reductions
    "Op", "SUM", "PROD", "MIN", "MAX", "LAND", "LOR", "LXOR", "BAND", "BOR", "BXOR", "MAXLOC",
    "MINLOC", "REPLACE", "NO_OP",
    # datatypes
    "Datatype", "CHAR", "WCHAR", "SIGNED_CHAR", "UNSIGNED_CHAR", "BYTE", "SHORT", "UNSIGNED_SHORT",
    "INT", "UNSIGNED", "UNSIGNED_INT", "LONG", "UNSIGNED_LONG", "LONG_LONG", "UNSIGNED_LONG_LONG",
    "INT8_T", "INT16_T", "INT32_T", "INT64_T", "UINT8_T", "UINT16_T", "UINT32_T", "UINT64_T",
    "FLOAT", "DOUBLE", "LONG_DOUBLE", "BOOL", "C_BOOL", "CXX_BOOL", "COMPLEX", "DOUBLE_COMPLEX",
    "C_COMPLEX", "C_FLOAT_COMPLEX", "C_DOUBLE_COMPLEX", "C_LONG_DOUBLE_COMPLEX", "AINT", "OFFSET",
    "COUNT", "INTEGER", "REAL", "DOUBLE_PRECISION",
    # errors
    "Exception",
]

# ---- constants (Open MPI's values, which mpi4py exposes as plain ints) ----

ANY_SOURCE = -1
ANY_TAG = -1
PROC_NULL = -2
UNDEFINED = -32766
SUCCESS = 0
TAG_UB = 0           # the key of Comm.Get_attr(TAG_UB)
_TAG_UB = 2**31 - 1  # its value: the largest tag every MPI allows (collie carries 63 bits)
THREAD_SINGLE, THREAD_FUNNELED, THREAD_SERIALIZED, THREAD_MULTIPLE = 0, 1, 2, 3

_ENVELOPE_TAG = MAX_TAG - 1  # MAX_TAG itself carries collie's send_object_list
_PAYLOAD_TAG = MAX_TAG - 2


class _InPlace:
    """MPI.IN_PLACE: the receive buffer is also the send buffer."""

    def __repr__(self) -> str:
        return "MPI.IN_PLACE"


IN_PLACE = _InPlace()


# ---- datatypes ----

class Datatype:
    """An MPI datatype. Here it names a NumPy dtype: a buffer given with a
    datatype is read as raw memory of that type, as in mpi4py."""

    __slots__ = ("name", "dtype")

    def __init__(self, name: str, dtype):
        self.name, self.dtype = name, np.dtype(dtype)

    def Get_size(self) -> int:
        return self.dtype.itemsize

    def Get_extent(self) -> tuple[int, int]:
        return 0, self.dtype.itemsize

    def Get_name(self) -> str:
        return self.name

    size = property(Get_size)
    extent = property(Get_size)

    def Commit(self) -> "Datatype":
        return self

    def Free(self) -> None:
        pass

    def __repr__(self) -> str:
        return f"<MPI.{self.name}: {self.dtype}>"


def _types() -> dict:
    ints = {np.dtype(c).itemsize: np.dtype(c) for c in "bhilq"}
    return {
        "CHAR": "S1", "WCHAR": "U1", "SIGNED_CHAR": "b", "UNSIGNED_CHAR": "B", "BYTE": "B",
        "SHORT": "h", "UNSIGNED_SHORT": "H", "INT": "i", "UNSIGNED": "I", "UNSIGNED_INT": "I",
        "LONG": "l", "UNSIGNED_LONG": "L", "LONG_LONG": "q", "UNSIGNED_LONG_LONG": "Q",
        "INT8_T": "i1", "INT16_T": "i2", "INT32_T": "i4", "INT64_T": "i8",
        "UINT8_T": "u1", "UINT16_T": "u2", "UINT32_T": "u4", "UINT64_T": "u8",
        "FLOAT": "f4", "DOUBLE": "f8", "LONG_DOUBLE": "g", "BOOL": "?", "C_BOOL": "?", "CXX_BOOL": "?",
        "COMPLEX": "c8", "DOUBLE_COMPLEX": "c16", "C_COMPLEX": "c8", "C_FLOAT_COMPLEX": "c8",
        "C_DOUBLE_COMPLEX": "c16", "C_LONG_DOUBLE_COMPLEX": "G",
        "AINT": ints[np.dtype(np.intp).itemsize], "OFFSET": "i8", "COUNT": "i8",
        "INTEGER": "i4", "REAL": "f4", "DOUBLE_PRECISION": "f8",
    }


for _name, _code in _types().items():
    globals()[_name] = Datatype(_name, _code)
del _name, _code


def _as_dtype(datatype) -> np.dtype:
    if isinstance(datatype, Datatype):
        return datatype.dtype
    try:
        return np.dtype(datatype)
    except TypeError:
        raise TypeError(f"expected an MPI datatype (MPI.DOUBLE...) or a NumPy dtype, got {datatype!r}") from None


def _is_datatype(x) -> bool:
    return isinstance(x, (Datatype, np.dtype, str)) or (
        isinstance(x, type) and issubclass(x, (np.generic, int, float, complex)))


# ---- reduction ops ----

class Op:
    """A reduction: applies to Python objects (lowercase methods, by calling
    it) and to buffers (uppercase methods, through collie.ReduceOp)."""

    __slots__ = ("name", "_py", "_ufunc", "_collie", "_logical")

    def __init__(self, name: str, py: Callable, ufunc=None, collie: Optional[ReduceOp] = None,
                 logical: bool = False):
        self.name, self._py, self._ufunc, self._collie, self._logical = name, py, ufunc, collie, logical

    def __call__(self, x, y):
        return self._py(x, y)

    def Is_commutative(self) -> bool:
        return True

    is_commutative = property(Is_commutative)

    def __repr__(self) -> str:
        return f"<MPI.{self.name}>"


def _either_array(x, y) -> bool:
    return isinstance(x, np.ndarray) or isinstance(y, np.ndarray)


def _min(x, y):
    return np.minimum(x, y) if _either_array(x, y) else (y if y < x else x)


def _max(x, y):
    return np.maximum(x, y) if _either_array(x, y) else (y if y > x else x)


def _maxloc(x, y):
    # (value, index) pairs: the larger value, the smaller index on ties (MPI_MAXLOC)
    return y if (y[0] > x[0] or (y[0] == x[0] and y[1] < x[1])) else x


def _minloc(x, y):
    return y if (y[0] < x[0] or (y[0] == x[0] and y[1] < x[1])) else x


# LAND/LOR/LXOR on buffers: reduce the truth values (as bool BAND/BOR/BXOR)
# and write 0/1 back in the buffer's dtype, as MPI's logical ops do.
SUM = Op("SUM", operator.add, np.add, ReduceOp.SUM)
PROD = Op("PROD", operator.mul, np.multiply, ReduceOp.PRODUCT)
MIN = Op("MIN", _min, np.minimum, ReduceOp.MIN)
MAX = Op("MAX", _max, np.maximum, ReduceOp.MAX)
LAND = Op("LAND", lambda x, y: x and y, np.logical_and, ReduceOp.BAND, logical=True)
LOR = Op("LOR", lambda x, y: x or y, np.logical_or, ReduceOp.BOR, logical=True)
LXOR = Op("LXOR", lambda x, y: (not x) != (not y), np.logical_xor, ReduceOp.BXOR, logical=True)
BAND = Op("BAND", operator.and_, np.bitwise_and, ReduceOp.BAND)
BOR = Op("BOR", operator.or_, np.bitwise_or, ReduceOp.BOR)
BXOR = Op("BXOR", operator.xor, np.bitwise_xor, ReduceOp.BXOR)
MAXLOC = Op("MAXLOC", _maxloc)
MINLOC = Op("MINLOC", _minloc)
REPLACE = Op("REPLACE", lambda x, y: y)
NO_OP = Op("NO_OP", lambda x, y: x)


def _py_op(op) -> Callable:
    if isinstance(op, Op):
        return op._py
    if callable(op):
        return op
    raise TypeError(f"op must be an MPI.Op (MPI.SUM...) or a function of two objects, got {op!r}")


def _buffer_op(op, what: str) -> Op:
    if not isinstance(op, Op):
        raise TypeError(f"{what}: op must be an MPI.Op (MPI.SUM, MPI.MAX...), got {op!r}")
    if op._collie is None:
        raise NotImplementedError(f"{what}: MPI.{op.name} works on Python objects only "
                                  "(lowercase methods); buffers take SUM, PROD, MIN, MAX, LAND, LOR, "
                                  "LXOR, BAND, BOR, BXOR")
    return op


# ---- status ----

class Status:
    """What a receive or probe matched: source, tag and size."""

    def __init__(self, status: Optional["Status"] = None):
        self.source, self.tag, self.error, self._nbytes, self._cancelled = ANY_SOURCE, ANY_TAG, SUCCESS, 0, False
        if status is not None:
            self.source, self.tag, self.error = status.source, status.tag, status.error
            self._nbytes = status._nbytes

    def _set(self, source: int, tag: int, nbytes: int, cancelled: bool = False) -> None:
        self.source, self.tag, self._nbytes, self._cancelled = source, tag, nbytes, cancelled

    def Get_source(self) -> int:
        return self.source

    def Set_source(self, source: int) -> None:
        self.source = source

    def Get_tag(self) -> int:
        return self.tag

    def Set_tag(self, tag: int) -> None:
        self.tag = tag

    def Get_error(self) -> int:
        return self.error

    def Set_error(self, error: int) -> None:
        self.error = error

    def Get_count(self, datatype=None) -> int:
        """Elements of ``datatype`` received (bytes by default); UNDEFINED when
        the message is not a whole number of them."""
        size = 1 if datatype is None else _as_dtype(datatype).itemsize
        if size == 0:
            return 0
        return self._nbytes // size if self._nbytes % size == 0 else UNDEFINED

    Get_elements = Get_count

    def Set_elements(self, datatype, count: int) -> None:
        self._nbytes = count * (1 if datatype is None else _as_dtype(datatype).itemsize)

    def Is_cancelled(self) -> bool:
        return self._cancelled

    @property
    def count(self) -> int:
        return self._nbytes

    def __repr__(self) -> str:
        return f"<MPI.Status source={self.source} tag={self.tag} count={self._nbytes}>"


# ---- buffer arguments ----

def _count(value, what: str) -> int:
    try:
        n = operator.index(value)
    except TypeError:
        raise TypeError(f"{what} must be an int, got {value!r}") from None
    if n < 0:
        raise ValueError(f"{what} must not be negative, got {n}")
    return n


def _pair(value, what: str):
    if len(value) != 2:
        raise ValueError(f"{what}: expected (count, displacement), got {value!r}")
    return value[0], value[1]


class _Buf:
    """One buffer argument, read as mpi4py does.

    ``flat`` is the whole buffer as a 1-D array of the message's datatype (a
    view of the caller's memory; a copy, written back by finish(), only when
    the array is not contiguous). Block variants have ``count`` elements per
    block from ``displ`` on; vector variants have ``counts``/``displs``.
    """

    __slots__ = ("flat", "count", "displ", "counts", "displs", "_finish")

    def __init__(self, spec, what: str, *, writable: bool, blocks: int = 1, vector: bool = False):
        if spec is None or spec is IN_PLACE:
            why = " (MPI.IN_PLACE is not allowed here)" if spec is IN_PLACE else ""
            raise ValueError(f"{what} is required{why}")
        count = displ = datatype = None
        obj = spec
        if isinstance(spec, (list, tuple)):
            n = len(spec)
            if n == 2:
                obj, count = spec
                if _is_datatype(count):
                    count, datatype = None, count
                elif isinstance(count, tuple) or (isinstance(count, list) and not vector):
                    count, displ = _pair(count, what)
            elif n == 3:
                obj, count, datatype = spec
                if isinstance(count, tuple) or (isinstance(count, list) and not vector):
                    count, displ = _pair(count, what)
            elif n == 4:
                obj, count, displ, datatype = spec
            else:
                raise ValueError(f"{what}: a buffer spec has 2 to 4 items ([buf, datatype], "
                                 f"[buf, count, datatype], ...), got {n}")
        arr, _ = to_numpy(obj, what)
        if writable and not arr.flags.writeable:
            raise ValueError(f"{what} is read-only, but it receives data")
        self._finish = None
        if arr.flags.c_contiguous or arr.flags.f_contiguous:
            flat = arr.ravel(order="K")  # a view, in memory order
        else:
            flat = np.ascontiguousarray(arr).reshape(-1)
            if writable:
                self._finish = lambda: np.copyto(arr, flat.reshape(arr.shape))
        if datatype is not None:
            dtype = _as_dtype(datatype)
            if dtype != flat.dtype:
                if dtype.itemsize == 0 or flat.nbytes % dtype.itemsize:
                    raise ValueError(f"{what}: {flat.nbytes} bytes are not a whole number of {datatype!r}")
                flat = flat.view(np.uint8).view(dtype)
        self.flat = flat
        total = flat.size
        self.counts = self.displs = None
        if vector:
            self._vector(count, displ, blocks, total, what)
            self.count, self.displ = None, None
            return
        self.displ = 0 if displ is None else _count(displ, f"{what} displacement")
        if self.displ > total:
            raise ValueError(f"{what}: displacement {self.displ} is past the end ({total} elements)")
        if count is None:
            left = total - self.displ
            if blocks > 1 and left % blocks:
                raise ValueError(f"{what}: {left} elements do not split into {blocks} equal blocks "
                                 "(one per rank)")
            self.count = left // max(blocks, 1)
        else:
            self.count = _count(count, f"{what} count")
            if self.displ + self.count * max(blocks, 1) > total:
                raise ValueError(f"{what}: {max(blocks, 1)} block(s) of {self.count} elements from "
                                 f"{self.displ} do not fit in {total} elements")

    def _vector(self, counts, displs, blocks: int, total: int, what: str) -> None:
        if counts is None:
            counts = [total // blocks + (total % blocks > i) for i in range(blocks)]
        elif isinstance(counts, (int, np.integer)):
            counts = [_count(counts, f"{what} count")] * blocks
        else:
            counts = [_count(c, f"{what} counts") for c in counts]
        if displs is None:
            displs = [sum(counts[:i]) for i in range(blocks)]
        elif isinstance(displs, (int, np.integer)):
            displs = [_count(displs, f"{what} displacement") * i for i in range(blocks)]
        else:
            displs = [_count(d, f"{what} displs") for d in displs]
        if len(counts) != blocks or len(displs) != blocks:
            raise ValueError(f"{what}: counts and displs need one entry per rank ({blocks}), "
                             f"got {len(counts)} and {len(displs)}")
        for c, d in zip(counts, displs):
            if c + d > total:
                raise ValueError(f"{what}: block of {c} elements at {d} is past the end ({total} elements)")
        self.counts, self.displs = counts, displs

    def section(self, blocks: int = 1) -> np.ndarray:
        return self.flat[self.displ:self.displ + self.count * blocks]

    def block(self, i: int) -> np.ndarray:
        start = self.displ + i * self.count
        return self.flat[start:start + self.count]

    def vblock(self, i: int) -> np.ndarray:
        return self.flat[self.displs[i]:self.displs[i] + self.counts[i]]

    def finish(self) -> None:
        if self._finish is not None:
            self._finish()


def _u8(a: np.ndarray) -> np.ndarray:
    """A contiguous 1-D array as its bytes: data-movement collectives move
    bytes, so every dtype works and collie checks sizes in bytes."""
    return a.view(np.uint8) if a.size else np.zeros(0, dtype=np.uint8)


def _pack(blocks: list) -> np.ndarray:
    return np.concatenate(blocks) if blocks else np.zeros(0, dtype=np.uint8)


# ---- point-to-point matching (see the module docstring) ----

class _Message:
    """A message whose envelope has arrived. ``data`` holds its payload unless
    the payload went straight into a receive's buffer; ``req`` is the payload
    receive still in flight (None once local or complete)."""

    __slots__ = ("source", "tag", "nbytes", "data", "req")

    def __init__(self, source: int, tag: int, nbytes: int, data=None, req=None):
        self.source, self.tag, self.nbytes, self.data, self.req = source, tag, nbytes, data, req


class _Recv:
    """A posted receive: ``dst`` is the bytes of the caller's buffer, or None
    for a pickled object. ``msg`` is the message it matched; ``error`` says
    why it never will (its peer is gone)."""

    __slots__ = ("source", "tag", "dst", "msg", "cancelled", "error")

    def __init__(self, source: int, tag: int, dst: Optional[memoryview]):
        self.source, self.tag, self.dst = source, tag, dst
        self.msg: Optional[_Message] = None
        self.cancelled = False
        self.error: Optional[BaseException] = None

    def matches(self, source: int, tag: int) -> bool:
        return self.source in (ANY_SOURCE, source) and self.tag in (ANY_TAG, tag)

    def ready(self) -> bool:
        return (self.cancelled or self.error is not None
                or (self.msg is not None and (self.msg.req is None or self.msg.req.finished)))


class _Matcher:
    """The MPI point-to-point state of one communicator."""

    def __init__(self, group: ProcessGroup, name: str):
        self.group, self.name = group, name
        self.network = group.network
        self.rank = group.rank
        self.etag = group.p2p_tag(_ENVELOPE_TAG)
        self.ptag = group.p2p_tag(_PAYLOAD_TAG)
        self.posted: list[_Recv] = []
        self.unmatched: list[_Message] = []
        self.envelopes: dict[int, tuple] = {}  # group rank -> (envelope array, its receive)
        self.probes: list[int] = []            # sources that a probe is waiting on
        self.lost: dict[int, BaseException] = {}  # peers whose envelope receive failed: gone
        _matchers.add(self)

    def isend(self, data: memoryview, dest: int, tag: int) -> tuple:
        """Post a message; returns its transport requests and what they read."""
        nbytes = data.nbytes
        if dest == self.rank:
            self._deliver(_Message(dest, tag, nbytes, bytearray(data)))
            return (), None
        head = np.array([tag, nbytes], dtype=np.int64)
        peer = self.group.ranks[dest]
        reqs = (self.network.isend(peer, self.etag, byte_view(head)),
                self.network.isend(peer, self.ptag, data))
        return reqs, head

    def post(self, op: _Recv) -> None:
        for i, msg in enumerate(self.unmatched):
            if op.matches(msg.source, msg.tag):
                del self.unmatched[i]
                op.msg = msg
                return
        self.posted.append(op)

    def cancel(self, op: _Recv) -> bool:
        if op.msg is None and op in self.posted:
            self.posted.remove(op)
            op.cancelled = True
        return op.cancelled

    def find(self, source: int, tag: int) -> Optional[_Message]:
        probe = _Recv(source, tag, None)
        return next((m for m in self.unmatched if probe.matches(m.source, m.tag)), None)

    def _deliver(self, msg: _Message) -> None:
        op = next((o for o in self.posted if o.matches(msg.source, msg.tag)), None)
        if op is None:
            self.unmatched.append(msg)
        else:
            self.posted.remove(op)
            op.msg = msg

    def _envelope(self, source: int, tag: int, nbytes: int) -> None:
        op = next((o for o in self.posted if o.matches(source, tag)), None)
        msg = _Message(source, tag, nbytes)
        if op is not None and op.dst is not None and nbytes <= len(op.dst):
            into = op.dst[:nbytes]
        else:  # an object, a message nobody wants yet, or one too big (an error on completion)
            msg.data = bytearray(nbytes)
            into = memoryview(msg.data)
        msg.req = self.network.irecv(self.group.ranks[source], self.ptag, into)
        if op is None:
            self.unmatched.append(msg)
        else:
            self.posted.remove(op)
            op.msg = msg

    def _wanted(self) -> set:
        sources = set()
        for s in [o.source for o in self.posted] + self.probes:
            if s == ANY_SOURCE:
                sources = set(range(self.group.size))
                break
            sources.add(s)
        sources.discard(self.rank)
        return sources

    def busy(self) -> bool:
        return bool(self.posted or self.envelopes or self.probes)

    def gone(self, source: int) -> Optional[BaseException]:
        """Why no message from ``source`` (or ANY_SOURCE: from anyone) can come."""
        if source != ANY_SOURCE:
            return self.lost.get(source)
        if self.lost and len(self.lost) >= self.group.size - 1:
            return next(iter(self.lost.values()))
        return None

    def poll(self) -> bool:
        """Take in the envelopes that arrived and post envelope receives for
        the peers a receive waits on. Never blocks; True if anything changed.

        An envelope receive fails when its peer died or left; that is an
        error only for the receives that need that peer (an envelope receive
        left over from an ANY_SOURCE receive is no one's business).
        """
        moved = False
        for source, (head, req) in list(self.envelopes.items()):
            if req.finished:
                del self.envelopes[source]
                moved = True
                if req.error is None:
                    self._envelope(source, int(head[0]), int(head[1]))
                    continue
                try:  # the error, reworded to name the operation
                    self.network.wait([req], describe=lambda: f"MPI receive from rank {source} of {self.name}")
                except (CollieError, ValueError) as exc:
                    self.lost[source] = exc
        if self.lost:
            for op in list(self.posted):
                op.error = self.gone(op.source)
                if op.error is not None:
                    self.posted.remove(op)
        for source in self._wanted():
            if source not in self.envelopes and source not in self.lost:
                head = np.zeros(2, dtype=np.int64)
                req = self.network.irecv(self.group.ranks[source], self.etag, byte_view(head))
                self.envelopes[source] = (head, req)
                moved = True  # a new receive: the transports must look again before we call it idle
        return moved


_matchers: "weakref.WeakSet[_Matcher]" = weakref.WeakSet()


def _progress(network) -> bool:
    """Advance the transports and every communicator's envelopes once."""
    moved = bool(network.progress())
    for m in list(_matchers):
        if m.network is not network:
            _matchers.discard(m)  # from a destroyed world
        elif m.busy() and m.poll():
            moved = True
    return moved


def _fail_departed(network, requests: list) -> None:
    """Once nothing moves, requests on peers that left (destroy_process_group)
    can no longer complete: fail them, as Network.wait does."""
    for m in list(_matchers):
        if m.network is network:
            requests = requests + [req for _, req in m.envelopes.values()]
    network.poll(requests)


def _wait_until(ready: Callable[[], bool], network, timeout: float, describe: Callable[[], str],
                requests: Callable[[], list] = list) -> None:
    """Make progress until ready(); when idle, poll a while as the Network's
    own waits do (see Network.polls), then sleep on the rank's doorbell.
    ``requests()`` are the transport requests ready() depends on."""
    start = time.monotonic()
    spin = network.spin_seconds if network.polls(requests()) else 0.0
    spin_until = start + spin
    while True:
        moved = _progress(network)
        if ready():
            return
        now = time.monotonic()
        if moved:
            spin_until = now + spin
            continue
        if now < spin_until:
            network.pause()
            continue
        _fail_departed(network, requests())
        if _progress(network) or ready():
            continue
        waited = time.monotonic() - start
        if waited >= timeout:
            raise CollieTimeout(f"rank {network.rank}: {describe()} timed out after {timeout:g}s")
        network.doorbell.sleep(min(0.1, timeout - waited), lambda: _progress(network) or ready())


# ---- requests ----

class Request:
    """A non-blocking operation: Isend/Irecv, isend/irecv, Ibcast...

    Wait()/Test() follow mpi4py; wait()/test() also return the received
    object of an irecv (None for the others).
    """

    def __init__(self, network=None, *, sends=(), recv: Optional[_Recv] = None, matcher=None, work=None,
                 keep=None, after=None, timeout: float = 300.0,
                 describe: Callable[[], str] = lambda: "MPI request", status=None):
        self._network, self._sends, self._recv, self._matcher = network, tuple(sends), recv, matcher
        self._work = work
        self._keep, self._after, self._timeout, self._describe = keep, after, timeout, describe
        self._done = False
        self._error: Optional[BaseException] = None
        self._result = None
        self._status = status  # (source, tag, nbytes, cancelled) once known

    def _requests(self) -> list:
        """The transport requests this one is waiting on."""
        if self._recv is not None and self._recv.msg is not None and self._recv.msg.req is not None:
            return [self._recv.msg.req]
        return list(self._sends)

    def _ready(self) -> bool:
        if self._done:
            return True
        if self._work is not None:
            return self._work.is_completed()
        if self._recv is not None:
            return self._recv.ready()
        return all(r.finished for r in self._sends)

    def _complete(self, status: Optional[Status]) -> None:
        if not self._done:
            self._done = True
            try:
                self._finish()
            except BaseException as exc:
                self._error = exc
            self._keep = None
        if self._error is not None:
            raise self._error
        if status is not None and self._status is not None:
            status._set(*self._status)

    def _finish(self) -> None:
        if self._work is not None:
            self._work.wait()
        elif self._sends:
            self._network.wait(self._sends, describe=self._describe)  # raises a failed send's error
        elif self._recv is not None:
            op = self._recv
            if op.error is not None:
                raise op.error
            if op.cancelled:
                self._status = (ANY_SOURCE, ANY_TAG, 0, True)
                return
            msg = op.msg
            if msg.req is not None and msg.req.error is not None:
                self._network.wait([msg.req], describe=self._describe)
            self._status = (msg.source, msg.tag, msg.nbytes, False)
            if op.dst is None:
                self._result = pickle.loads(msg.data)
            elif msg.data is not None:
                if msg.nbytes > len(op.dst):
                    raise CollieError(f"rank {self._network.rank}: {self._describe()}: message truncated: "
                                      f"rank {msg.source} sent {msg.nbytes} bytes (tag {msg.tag}) but the "
                                      f"receive buffer holds {len(op.dst)}")
                op.dst[:msg.nbytes] = msg.data
        if self._after is not None:
            self._after()

    def Wait(self, status: Optional[Status] = None) -> bool:
        # An asynchronous collective blocks in its own wait (in _finish).
        if self._work is None and not self._ready():
            _wait_until(self._ready, self._network, self._timeout, self._describe, self._requests)
        self._complete(status)
        return True

    def Test(self, status: Optional[Status] = None) -> bool:
        if self._network is not None and not self._done:
            _progress(self._network)
        if not self._ready():
            return False
        self._complete(status)
        return True

    def wait(self, status: Optional[Status] = None) -> Any:
        self.Wait(status)
        return self._result

    def test(self, status: Optional[Status] = None) -> tuple[bool, Any]:
        done = self.Test(status)
        return done, (self._result if done else None)

    def Cancel(self) -> None:
        """Cancel a receive that no message has matched yet (sends cannot be)."""
        if self._recv is not None and self._matcher is not None:
            self._matcher.cancel(self._recv)

    def Free(self) -> None:
        pass

    def Get_status(self, status: Optional[Status] = None) -> bool:
        done = self._ready()
        if done:
            self._complete(status)
        return done

    # ---- on many requests ----

    @staticmethod
    def _wait_some(requests: Sequence["Request"], ready: Callable[[], bool]) -> None:
        live = [r for r in requests if r._network is not None]
        if live and not ready():
            _wait_until(ready, live[0]._network, max(r._timeout for r in live),
                        lambda: f"waiting for {len(requests)} MPI requests",
                        lambda: [q for r in live for q in r._requests()])

    @staticmethod
    def Waitall(requests: Sequence["Request"], statuses: Optional[list] = None) -> bool:
        requests = list(requests)
        Request._wait_some(requests, lambda: all(r._work is not None or r._ready() for r in requests))
        for i, r in enumerate(requests):
            r._complete(statuses[i] if statuses is not None and i < len(statuses) else None)
        return True

    @staticmethod
    def waitall(requests: Sequence["Request"], statuses: Optional[list] = None) -> list:
        Request.Waitall(requests, statuses)
        return [r._result for r in requests]

    @staticmethod
    def Testall(requests: Sequence["Request"], statuses: Optional[list] = None) -> bool:
        requests = list(requests)
        for r in requests:
            if r._network is not None:
                _progress(r._network)
                break
        if not all(r._ready() for r in requests):
            return False
        Request.Waitall(requests, statuses)
        return True

    @staticmethod
    def testall(requests: Sequence["Request"], statuses: Optional[list] = None) -> tuple[bool, Optional[list]]:
        done = Request.Testall(requests, statuses)
        return done, ([r._result for r in requests] if done else None)

    @staticmethod
    def Waitany(requests: Sequence["Request"], status: Optional[Status] = None) -> int:
        """Index of a request that completed (UNDEFINED for an empty list)."""
        requests = list(requests)
        if not requests:
            return UNDEFINED
        Request._wait_some(requests, lambda: any(r._ready() for r in requests))
        index = next(i for i, r in enumerate(requests) if r._ready())
        requests[index]._complete(status)
        return index

    @staticmethod
    def waitany(requests: Sequence["Request"], status: Optional[Status] = None) -> tuple[int, Any]:
        index = Request.Waitany(requests, status)
        return index, (requests[index]._result if index != UNDEFINED else None)

    @staticmethod
    def Testany(requests: Sequence["Request"], status: Optional[Status] = None) -> tuple[int, bool]:
        requests = list(requests)
        for r in requests:
            if r._network is not None:
                _progress(r._network)
                break
        for i, r in enumerate(requests):
            if r._ready():
                r._complete(status)
                return i, True
        return UNDEFINED, False


REQUEST_NULL = Request()
REQUEST_NULL._done = True


def _done_request(status=None) -> Request:
    req = Request(status=status)
    req._done = True
    return req


# ---- communicators ----

def _rank_arg(value, size: int, what: str, allowed=()) -> int:
    try:
        r = operator.index(value)
    except TypeError:
        raise TypeError(f"{what} must be an int rank, got {value!r}") from None
    if r in allowed or 0 <= r < size:
        return r
    raise ValueError(f"{what} {r} is not a rank of the communicator (size {size})")


def _tag_arg(value, what: str, allow_any: bool) -> int:
    try:
        t = operator.index(value)
    except TypeError:
        raise TypeError(f"{what} must be an int, got {value!r}") from None
    if (allow_any and t == ANY_TAG) or 0 <= t < 2**63:
        return t
    raise ValueError(f"{what} must be >= 0{' or MPI.ANY_TAG' if allow_any else ''}, got {t}")


class Comm:
    """A communicator: an ordered group of processes and a context that
    keeps its messages apart from every other communicator's."""

    def __init__(self, group: Optional[ProcessGroup] = None, name: str = "MPI_COMM_NULL"):
        self._group = group
        self._name = name
        self._matcher: Optional[_Matcher] = None

    # ---- identity ----

    def _g(self, what: str) -> ProcessGroup:
        if self._group is None:
            raise CollieError(f"{what} called on MPI.COMM_NULL")
        return _group.resolve(self._group)  # raises once the world was destroyed

    def __eq__(self, other) -> bool:
        return isinstance(other, Comm) and self._group is other._group

    def __ne__(self, other) -> bool:
        return not self == other

    def __hash__(self) -> int:
        return id(self._group)

    def __bool__(self) -> bool:
        return self._group is not None

    def __repr__(self) -> str:
        if self._group is None:
            return "<MPI.COMM_NULL>"
        return f"<MPI.{type(self).__name__} {self._name} rank={self._group.rank} size={self._group.size}>"

    def Get_rank(self) -> int:
        return self._g("Get_rank").rank

    def Get_size(self) -> int:
        return self._g("Get_size").size

    rank = property(Get_rank)
    size = property(Get_size)

    def Get_name(self) -> str:
        return self._name

    def Set_name(self, name: str) -> None:
        self._name = name

    name = property(Get_name, Set_name)

    def Is_inter(self) -> bool:
        return False

    def Is_intra(self) -> bool:
        return True

    def Get_attr(self, keyval: int):
        return _TAG_UB if keyval == TAG_UB else None

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

    def Dup(self) -> "Comm":
        """The same ranks in a new context: its messages never meet this one's."""
        g = self._g("Dup")
        return Intracomm(_group.split_group(g, 0, g.rank, name=f"{self._name}/dup"), f"{self._name}/dup")

    Clone = Dup

    def Free(self) -> None:
        g = self._g("Free")
        if g is _group.world().group or self._name == "MPI_COMM_SELF":
            raise ValueError(f"Free: {self._name} cannot be freed")
        _group.destroy_process_group(g)
        if self._matcher is not None:
            _matchers.discard(self._matcher)
        self._group, self._matcher, self._name = None, None, "MPI_COMM_NULL"

    def Abort(self, errorcode: int = 0) -> None:
        """End this process at once with ``errorcode`` (1 when 0); ``collie
        run`` then stops every other rank, as mpiexec does."""
        sys.stdout.flush()
        sys.stderr.write(f"MPI Abort on rank {self._group.rank if self._group else '?'} "
                         f"with error code {errorcode}\n")
        sys.stderr.flush()
        os._exit(errorcode or 1)

    # ---- point to point: the shared path ----

    def _p2p(self, what: str) -> _Matcher:
        g = self._g(what)
        if self._matcher is None or self._matcher.group is not g:
            self._matcher = _Matcher(g, self._name)
        return self._matcher

    def _send(self, data: memoryview, dest, tag, what: str, keep=None) -> Request:
        m = self._p2p(what)
        dest = _rank_arg(dest, m.group.size, f"{what}: dest", (PROC_NULL,))
        tag = _tag_arg(tag, f"{what}: tag", allow_any=False)
        if dest == PROC_NULL:
            return _done_request()
        reqs, head = m.isend(data, dest, tag)
        return Request(m.network, sends=reqs, keep=(keep, data, head), timeout=m.group.timeout,
                       describe=lambda: f"{what} to rank {dest} (tag {tag}) of {self._name}")

    def _recv(self, dst: Optional[memoryview], source, tag, what: str, after=None, keep=None) -> Request:
        m = self._p2p(what)
        source = _rank_arg(source, m.group.size, f"{what}: source", (ANY_SOURCE, PROC_NULL))
        tag = _tag_arg(tag, f"{what}: tag", allow_any=True)
        if source == PROC_NULL:
            return _done_request((PROC_NULL, ANY_TAG, 0, False))
        op = _Recv(source, tag, dst)
        m.post(op)
        src = "any rank" if source == ANY_SOURCE else f"rank {source}"
        tags = "any tag" if tag == ANY_TAG else f"tag {tag}"
        return Request(m.network, recv=op, matcher=m, after=after, keep=keep, timeout=m.group.timeout,
                       describe=lambda: f"{what} from {src} ({tags}) of {self._name}")

    def _probe(self, source, tag, status: Optional[Status], block: bool, what: str) -> bool:
        m = self._p2p(what)
        source = _rank_arg(source, m.group.size, f"{what}: source", (ANY_SOURCE, PROC_NULL))
        tag = _tag_arg(tag, f"{what}: tag", allow_any=True)
        if source == PROC_NULL:
            if status is not None:
                status._set(PROC_NULL, ANY_TAG, 0)
            return True
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
        if msg is not None and status is not None:
            status._set(msg.source, msg.tag, msg.nbytes)
        return msg is not None

    # ---- point to point: buffers ----

    def Send(self, buf, dest: int, tag: int = 0) -> None:
        """Send a buffer; returns once the buffer may be reused."""
        self.Isend(buf, dest, tag).Wait()

    Ssend = Send
    Bsend = Send
    Rsend = Send

    def Isend(self, buf, dest: int, tag: int = 0) -> Request:
        if dest == PROC_NULL:
            return _done_request()
        b = _Buf(buf, "Isend buf", writable=False)
        return self._send(byte_view(b.section()), dest, tag, "Send", keep=b)

    Issend = Isend
    Ibsend = Isend
    Irsend = Isend

    def Recv(self, buf, source: int = ANY_SOURCE, tag: int = ANY_TAG, status: Optional[Status] = None) -> None:
        """Receive into a buffer at least as large as the message."""
        self.Irecv(buf, source, tag).Wait(status)

    def Irecv(self, buf, source: int = ANY_SOURCE, tag: int = ANY_TAG) -> Request:
        if source == PROC_NULL:
            return self._recv(None, source, tag, "Recv")
        b = _Buf(buf, "Recv buf", writable=True)
        return self._recv(byte_view(b.section()), source, tag, "Recv", after=b.finish, keep=b)

    def Sendrecv(self, sendbuf, dest: int, sendtag: int = 0, recvbuf=None, source: int = ANY_SOURCE,
                 recvtag: int = ANY_TAG, status: Optional[Status] = None) -> None:
        """Send and receive at once: no ordering of the two can deadlock."""
        rreq = self.Irecv(recvbuf, source, recvtag)
        sreq = self.Isend(sendbuf, dest, sendtag)
        Request.Waitall([rreq, sreq], [status, None])

    def Sendrecv_replace(self, buf, dest: int, sendtag: int = 0, source: int = ANY_SOURCE,
                         recvtag: int = ANY_TAG, status: Optional[Status] = None) -> None:
        b = _Buf(buf, "Sendrecv_replace buf", writable=True)
        self.Sendrecv(b.section().copy(), dest, sendtag, [b.section(), b.flat.dtype], source, recvtag, status)
        b.finish()

    def Probe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG, status: Optional[Status] = None) -> bool:
        """Block until a matching message can be received; Status says which."""
        return self._probe(source, tag, status, True, "Probe")

    def Iprobe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG, status: Optional[Status] = None) -> bool:
        return self._probe(source, tag, status, False, "Iprobe")

    probe = Probe
    iprobe = Iprobe

    # ---- point to point: objects ----

    def send(self, obj, dest: int, tag: int = 0) -> None:
        self.isend(obj, dest, tag).Wait()

    ssend = send
    bsend = send

    def isend(self, obj, dest: int, tag: int = 0) -> Request:
        data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        return self._send(memoryview(data), dest, tag, "send")

    issend = isend
    ibsend = isend

    def recv(self, buf=None, source: int = ANY_SOURCE, tag: int = ANY_TAG, status: Optional[Status] = None) -> Any:
        """Receive an object (``buf`` is accepted for mpi4py's signature and ignored)."""
        return self.irecv(buf, source, tag).wait(status)

    def irecv(self, buf=None, source: int = ANY_SOURCE, tag: int = ANY_TAG) -> Request:
        return self._recv(None, source, tag, "recv")

    def sendrecv(self, sendobj, dest: int, sendtag: int = 0, recvbuf=None, source: int = ANY_SOURCE,
                 recvtag: int = ANY_TAG, status: Optional[Status] = None) -> Any:
        rreq = self.irecv(recvbuf, source, recvtag)
        sreq = self.isend(sendobj, dest, sendtag)
        Request.Waitall([rreq, sreq], [status, None])
        return rreq._result

    # ---- collectives: shared helpers ----

    def _root(self, g: ProcessGroup, root, what: str) -> int:
        return _rank_arg(root, g.size, f"{what}: root")

    def Barrier(self) -> None:
        _coll.barrier(group=self._g("Barrier"))

    barrier = Barrier

    def Ibarrier(self) -> Request:
        g = self._g("Ibarrier")
        return Request(g.network, work=_coll.barrier(group=g, async_op=True), timeout=g.timeout)


class Intracomm(Comm):
    """A communicator within one group of processes (all of collie's)."""

    # ---- collectives on buffers ----

    def Bcast(self, buf, root: int = 0) -> None:
        """Copy root's buffer into every rank's."""
        g = self._g("Bcast")
        root = self._root(g, root, "Bcast")
        b = _Buf(buf, "Bcast buf", writable=g.rank != root)
        data = _u8(b.section())
        if not data.flags.writeable:
            data = data.copy()
        _coll.broadcast(data, src=g.ranks[root], group=g)
        b.finish()

    def Ibcast(self, buf, root: int = 0) -> Request:
        g = self._g("Ibcast")
        root = self._root(g, root, "Ibcast")
        b = _Buf(buf, "Ibcast buf", writable=g.rank != root)
        data = _u8(b.section())
        if not data.flags.writeable:
            data = data.copy()
        work = _coll.broadcast(data, src=g.ranks[root], group=g, async_op=True)
        return Request(g.network, work=work, keep=(b, data), after=b.finish, timeout=g.timeout)

    def Scatter(self, sendbuf, recvbuf, root: int = 0) -> None:
        """Block r of root's sendbuf into rank r's recvbuf (IN_PLACE at root:
        root keeps its block where it is)."""
        g = self._g("Scatter")
        root = self._root(g, root, "Scatter")
        _only_root(recvbuf, g, root, "Scatter", "recvbuf")
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
        _coll.scatter(out, pieces, src=g.ranks[root], group=g)
        if r is not None:
            r.finish()

    def Scatterv(self, sendbuf, recvbuf, root: int = 0) -> None:
        """Scatter with a count and displacement per rank ([buf, (counts, displs), type] at root)."""
        g = self._g("Scatterv")
        root = self._root(g, root, "Scatterv")
        _only_root(recvbuf, g, root, "Scatterv", "recvbuf")
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
            r = _Buf(recvbuf, "Scatterv recvbuf", writable=True)
            out = _u8(r.section())
            out_sizes[root] = out.size
        _coll.all_to_all_single(out, _pack(in_blocks), out_sizes, [b.size for b in in_blocks], group=g)
        if r is not None:
            r.finish()

    def Gather(self, sendbuf, recvbuf, root: int = 0) -> None:
        """Every rank's sendbuf into block r of root's recvbuf (IN_PLACE at
        root: root's block is already in place)."""
        g = self._g("Gather")
        root = self._root(g, root, "Gather")
        _only_root(sendbuf, g, root, "Gather", "sendbuf")
        outs = r = None
        if g.rank == root:
            r = _Buf(recvbuf, "Gather recvbuf", writable=True, blocks=g.size)
            outs = [_u8(r.block(i)) for i in range(g.size)]
        if sendbuf is IN_PLACE:
            send = outs[root].copy()
        else:
            send = _u8(_Buf(sendbuf, "Gather sendbuf", writable=False).section())
        _coll.gather(send, outs, dst=g.ranks[root], group=g)
        if r is not None:
            r.finish()

    def Gatherv(self, sendbuf, recvbuf, root: int = 0) -> None:
        """Gather with a count and displacement per rank ([buf, (counts, displs), type] at root)."""
        g = self._g("Gatherv")
        root = self._root(g, root, "Gatherv")
        _only_root(sendbuf, g, root, "Gatherv", "sendbuf")
        send = np.zeros(0, dtype=np.uint8)
        if sendbuf is not IN_PLACE:
            send = _u8(_Buf(sendbuf, "Gatherv sendbuf", writable=False).section())
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
        _coll.all_to_all_single(out, send, out_sizes, in_sizes, group=g)
        if r is not None:
            _unpack(out, r, out_sizes, skip=root if sendbuf is IN_PLACE else None)

    def Allgather(self, sendbuf, recvbuf) -> None:
        """Every rank's sendbuf into block r of every rank's recvbuf."""
        g = self._g("Allgather")
        r = _Buf(recvbuf, "Allgather recvbuf", writable=True, blocks=g.size)
        if sendbuf is IN_PLACE:
            send = _u8(r.block(g.rank)).copy()
        else:
            send = _u8(_Buf(sendbuf, "Allgather sendbuf", writable=False).section())
        _coll.all_gather_into_tensor(_u8(r.section(g.size)), send, group=g)
        r.finish()

    def Allgatherv(self, sendbuf, recvbuf) -> None:
        g = self._g("Allgatherv")
        r = _Buf(recvbuf, "Allgatherv recvbuf", writable=True, blocks=g.size, vector=True)
        outs = [_u8(r.vblock(i)) for i in range(g.size)]
        if sendbuf is IN_PLACE:
            send = outs[g.rank].copy()
        else:
            send = _u8(_Buf(sendbuf, "Allgatherv sendbuf", writable=False).section())
        _coll.all_gather(outs, send, group=g)
        r.finish()

    def Alltoall(self, sendbuf, recvbuf) -> None:
        """Block q of rank r's sendbuf into block r of rank q's recvbuf."""
        g = self._g("Alltoall")
        r = _Buf(recvbuf, "Alltoall recvbuf", writable=True, blocks=g.size)
        out = _u8(r.section(g.size))
        if sendbuf is IN_PLACE:
            send = out.copy()
        else:
            send = _u8(_Buf(sendbuf, "Alltoall sendbuf", writable=False, blocks=g.size).section(g.size))
        _coll.all_to_all_single(out, send, group=g)
        r.finish()

    def Alltoallv(self, sendbuf, recvbuf) -> None:
        """Alltoall with counts and displacements per rank on both sides."""
        g = self._g("Alltoallv")
        r = _Buf(recvbuf, "Alltoallv recvbuf", writable=True, blocks=g.size, vector=True)
        s = r if sendbuf is IN_PLACE else _Buf(sendbuf, "Alltoallv sendbuf", writable=False, blocks=g.size,
                                               vector=True)
        in_blocks = [_u8(s.vblock(i)) for i in range(g.size)]
        send = _pack(in_blocks)  # a copy, so IN_PLACE is safe
        out_sizes = [r.vblock(i).nbytes for i in range(g.size)]
        out = np.empty(sum(out_sizes), dtype=np.uint8)
        _coll.all_to_all_single(out, send, out_sizes, [b.size for b in in_blocks], group=g)
        _unpack(out, r, out_sizes)

    # ---- reductions on buffers ----

    def Reduce(self, sendbuf, recvbuf, op: Op = SUM, root: int = 0) -> None:
        """Reduce every rank's sendbuf into root's recvbuf."""
        g = self._g("Reduce")
        root = self._root(g, root, "Reduce")
        op = _buffer_op(op, "Reduce")
        _only_root(sendbuf, g, root, "Reduce", "sendbuf")
        r = _Buf(recvbuf, "Reduce recvbuf", writable=True) if g.rank == root else None
        dst = r.section() if r is not None else None
        src = dst if sendbuf is IN_PLACE else _Buf(sendbuf, "Reduce sendbuf", writable=False).section()
        work = _work(op, src, dst, "Reduce")
        _coll.reduce(work, dst=g.ranks[root], op=op._collie, group=g)
        if r is not None:
            _store(dst, work)
            r.finish()

    def _allreduce_buffers(self, name: str, sendbuf, recvbuf, op: Op):
        """What Allreduce and Iallreduce share: the group, the checked op,
        the receive buffer, its section and the array reduced in place."""
        g = self._g(name)
        op = _buffer_op(op, name)
        r = _Buf(recvbuf, f"{name} recvbuf", writable=True)
        dst = r.section()
        src = dst if sendbuf is IN_PLACE else _Buf(sendbuf, f"{name} sendbuf", writable=False).section()
        return g, op, r, dst, _work(op, src, dst, name)

    def Allreduce(self, sendbuf, recvbuf, op: Op = SUM) -> None:
        """Reduce every rank's sendbuf into every rank's recvbuf."""
        g, op, r, dst, work = self._allreduce_buffers("Allreduce", sendbuf, recvbuf, op)
        _coll.all_reduce(work, op=op._collie, group=g)
        _store(dst, work)
        r.finish()

    def Iallreduce(self, sendbuf, recvbuf, op: Op = SUM) -> Request:
        g, op, r, dst, work = self._allreduce_buffers("Iallreduce", sendbuf, recvbuf, op)

        def after():
            _store(dst, work)
            r.finish()

        return Request(g.network, work=_coll.all_reduce(work, op=op._collie, group=g, async_op=True),
                       keep=(r, work), after=after, timeout=g.timeout)

    def Reduce_scatter_block(self, sendbuf, recvbuf, op: Op = SUM) -> None:
        """Reduce, then rank r gets block r of the result (IN_PLACE: recvbuf
        holds every block, rank r's result lands in its first block)."""
        g = self._g("Reduce_scatter_block")
        op = _buffer_op(op, "Reduce_scatter_block")
        if sendbuf is IN_PLACE:
            r = _Buf(recvbuf, "Reduce_scatter_block recvbuf", writable=True, blocks=g.size)
            src, dst = r.section(g.size), r.block(0)
        else:
            r = _Buf(recvbuf, "Reduce_scatter_block recvbuf", writable=True)
            src = _Buf(sendbuf, "Reduce_scatter_block sendbuf", writable=False, blocks=g.size).section(g.size)
            dst = r.section()
        _check_same(src, dst, "Reduce_scatter_block", src.size == dst.size * g.size)
        inp = (src != 0) if op._logical else src
        out = np.empty(dst.size, dtype=inp.dtype) if (op._logical or sendbuf is IN_PLACE) else dst
        _coll.reduce_scatter_tensor(out, inp, op=op._collie, group=g)
        _store(dst, out)
        r.finish()

    def Reduce_scatter(self, sendbuf, recvbuf, recvcounts: Optional[Sequence[int]] = None,
                       op: Op = SUM) -> None:
        """Reduce, then rank r gets the next recvcounts[r] elements of the
        result (recvcounts defaults to every rank's recvbuf size)."""
        g = self._g("Reduce_scatter")
        op = _buffer_op(op, "Reduce_scatter")
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
        if sendbuf is IN_PLACE:
            src, dst = r.flat[r.displ:r.displ + total], r.flat[r.displ:r.displ + counts[g.rank]]
        else:
            src = _Buf(sendbuf, "Reduce_scatter sendbuf", writable=False).section()
            dst = r.section()
        _check_same(src, dst, "Reduce_scatter", src.size >= total and dst.size >= counts[g.rank])
        inp = (src[:total] != 0) if op._logical else src[:total]
        # Blocks padded to the largest count, so that every rank's call looks
        # the same to collie's mismatch check; the padding lanes are dropped.
        width = max(counts)
        padded = np.zeros((g.size, width), dtype=inp.dtype)
        for i, piece in enumerate(np.split(inp, np.cumsum(counts)[:-1])):
            padded[i, :piece.size] = piece
        out = np.empty(width, dtype=inp.dtype)
        _coll.reduce_scatter_tensor(out, padded, op=op._collie, group=g)
        _store(dst[:counts[g.rank]], out[:counts[g.rank]])
        r.finish()

    def Scan(self, sendbuf, recvbuf, op: Op = SUM) -> None:
        """Rank r gets the reduction of ranks 0..r (inclusive)."""
        self._scan(sendbuf, recvbuf, op, "Scan", inclusive=True)

    def Exscan(self, sendbuf, recvbuf, op: Op = SUM) -> None:
        """Rank r gets the reduction of ranks 0..r-1; rank 0's recvbuf is left as is."""
        self._scan(sendbuf, recvbuf, op, "Exscan", inclusive=False)

    def _scan(self, sendbuf, recvbuf, op, what: str, inclusive: bool) -> None:
        # All-gather, then reduce locally in rank order: the P-fold memory is
        # the price of not having a scan schedule; fine for the sizes scans see.
        g = self._g(what)
        op = _buffer_op(op, what)
        r = _Buf(recvbuf, f"{what} recvbuf", writable=True)
        dst = r.section()
        src = dst if sendbuf is IN_PLACE else _Buf(sendbuf, f"{what} sendbuf", writable=False).section()
        _check_same(src, dst, what, src.size == dst.size)
        rows = np.empty((g.size, src.size), dtype=src.dtype)
        _coll.all_gather_into_tensor(rows, np.ascontiguousarray(src), group=g)
        upto = g.rank + 1 if inclusive else g.rank
        if upto == 0:
            return
        acc = rows[0].copy()
        for i in range(1, upto):
            acc = op._ufunc(acc, rows[i]).astype(src.dtype, copy=False)
        if op._logical:
            acc = acc != 0
        _store(dst, acc)
        r.finish()

    # ---- collectives on objects ----

    def bcast(self, obj=None, root: int = 0) -> Any:
        """root's object, on every rank."""
        g = self._g("bcast")
        root = self._root(g, root, "bcast")
        box = [obj]
        _objects.broadcast_object_list(box, src=g.ranks[root], group=g)
        return box[0]

    def scatter(self, sendobj=None, root: int = 0) -> Any:
        """Item r of root's sequence, on rank r."""
        g = self._g("scatter")
        root = self._root(g, root, "scatter")
        items = None
        if g.rank == root:
            items = list(sendobj) if sendobj is not None else None
            if items is None or len(items) != g.size:
                raise ValueError(f"scatter: root's sendobj must be a sequence of {g.size} items (one per rank)")
        box = [None]
        _objects.scatter_object_list(box, items, src=g.ranks[root], group=g)
        return box[0]

    def gather(self, sendobj, root: int = 0) -> Optional[list]:
        """Every rank's object, in a list at root (None elsewhere)."""
        g = self._g("gather")
        root = self._root(g, root, "gather")
        out = [None] * g.size if g.rank == root else None
        _objects.gather_object(sendobj, out, dst=g.ranks[root], group=g)
        return out

    def allgather(self, sendobj) -> list:
        g = self._g("allgather")
        out = [None] * g.size
        _objects.all_gather_object(out, sendobj, group=g)
        return out

    def alltoall(self, sendobj) -> list:
        """Item q of rank r's sequence becomes item r of rank q's result."""
        g = self._g("alltoall")
        items = list(sendobj)
        if len(items) != g.size:
            raise ValueError(f"alltoall: sendobj must be a sequence of {g.size} items (one per rank)")
        payloads = [pickle.dumps(o, protocol=pickle.HIGHEST_PROTOCOL) for o in items]
        sizes = np.array([len(p) for p in payloads], dtype=np.int64)
        got = np.empty(g.size, dtype=np.int64)
        _coll.all_to_all_single(got, sizes, group=g)
        out = np.empty(int(got.sum()), dtype=np.uint8)
        send = np.frombuffer(b"".join(payloads), dtype=np.uint8)
        _coll.all_to_all_single(out, send, got.tolist(), sizes.tolist(), group=g)
        ends = np.cumsum(got)
        return [pickle.loads(out[e - n:e].tobytes()) for e, n in zip(ends.tolist(), got.tolist())]

    def reduce(self, sendobj, op=SUM, root: int = 0) -> Any:
        """op folded over every rank's object in rank order, at root (None elsewhere)."""
        fn = _py_op(op)
        items = self.gather(sendobj, root)
        return None if items is None else functools.reduce(fn, items)

    def allreduce(self, sendobj, op=SUM) -> Any:
        fn = _py_op(op)
        return functools.reduce(fn, self.allgather(sendobj))

    def scan(self, sendobj, op=SUM) -> Any:
        fn = _py_op(op)
        items = self.allgather(sendobj)
        return functools.reduce(fn, items[:self.Get_rank() + 1])

    def exscan(self, sendobj, op=SUM) -> Any:
        """The fold over ranks before this one; None on rank 0."""
        fn = _py_op(op)
        items = self.allgather(sendobj)
        rank = self.Get_rank()
        return None if rank == 0 else functools.reduce(fn, items[:rank])


def _only_root(buf, g: ProcessGroup, root: int, what: str, which: str) -> None:
    if buf is IN_PLACE and g.rank != root:
        raise ValueError(f"{what}: MPI.IN_PLACE as {which} is only allowed at the root")


def _check_same(src: np.ndarray, dst: np.ndarray, what: str, sizes_ok: bool) -> None:
    if src.dtype != dst.dtype:
        raise TypeError(f"{what}: sendbuf is {src.dtype} but recvbuf is {dst.dtype}")
    if not sizes_ok:
        raise ValueError(f"{what}: sendbuf has {src.size} elements, recvbuf {dst.size}: they do not fit")


def _work(op: Op, src: np.ndarray, dst: Optional[np.ndarray], what: str) -> np.ndarray:
    """The array a reduction runs on: the receive buffer holding a copy of
    the input where there is one, else a copy; truth values for LAND/LOR/LXOR."""
    if dst is not None:
        _check_same(src, dst, what, src.size == dst.size)
    if op._logical:
        return src != 0
    if dst is None:
        return src.copy()
    if dst is not src:
        np.copyto(dst, src)
    return dst


def _store(dst: np.ndarray, result: np.ndarray) -> None:
    if result is not dst:
        np.copyto(dst, result, casting="unsafe")  # bool -> the buffer's dtype for logical ops


def _unpack(packed: np.ndarray, r: _Buf, sizes: list, skip: Optional[int] = None) -> None:
    """Copy consecutive byte blocks of ``packed`` to r's (counts, displs) blocks."""
    at = 0
    for i, n in enumerate(sizes):
        if i != skip and n:
            _u8(r.vblock(i))[:] = packed[at:at + n]
        at += n
    r.finish()


COMM_NULL = Comm(None)


# ---- the environment ----

_cache: dict = {}          # "world"/"self" -> communicator of the current world
_finalized = False
_LAUNCH_VARS = ("RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def Init() -> None:
    """Join the world if nobody did yet: env:// under a launcher (collie
    run, torchrun, mpiexec, srun), else a world of this process alone."""
    if _group.is_initialized():
        return
    if _finalized:
        raise CollieError("MPI.Finalize() was called: MPI cannot be initialized again")
    if any(os.environ.get(v) for v in _LAUNCH_VARS):
        _group.init_process_group()
    else:
        _group.init_process_group(init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)


def Init_thread(required: int = THREAD_MULTIPLE) -> int:
    """Init(); at most THREAD_SERIALIZED: calls from several threads must not overlap."""
    Init()
    return min(required, THREAD_SERIALIZED)


def Query_thread() -> int:
    return THREAD_SERIALIZED


def Is_thread_main() -> bool:
    return threading.current_thread() is threading.main_thread()


def Finalize() -> None:
    """Leave the world (collie.destroy_process_group)."""
    global _finalized
    _group.destroy_process_group()
    _cache.clear()
    _finalized = True


def Is_initialized() -> bool:
    return _group.is_initialized()


def Is_finalized() -> bool:
    return _finalized and not _group.is_initialized()


def Wtime() -> float:
    """Seconds since an arbitrary point in the past (a monotonic clock)."""
    return time.perf_counter()


def Wtick() -> float:
    return time.get_clock_info("perf_counter").resolution


def Get_processor_name() -> str:
    return socket.gethostname()


def Get_version() -> tuple[int, int]:
    return 3, 1


def Get_library_version() -> str:
    from .. import __version__
    return f"collie {__version__} (mpi4py-style API)"


def _comm(which: str) -> Intracomm:
    Init()
    world = _group.world().group
    comm = _cache.get(which)
    if comm is None or comm._owner is not world:
        if which == "world":
            comm = Intracomm(world, "MPI_COMM_WORLD")
        else:
            # Only this rank: nothing ever leaves the process (messages to
            # oneself are delivered locally, collectives of one rank copy).
            me = ProcessGroup(world.network, [world.network.rank], _group.SELF_CONTEXT, world.timeout,
                              "MPI_COMM_SELF")
            comm = Intracomm(me, "MPI_COMM_SELF")
        comm._owner = world
        _cache[which] = comm
    return comm


def __getattr__(name: str):
    # COMM_WORLD and COMM_SELF are made on first use, for the world of the
    # moment: importing this module initializes nothing.
    if name == "COMM_WORLD":
        return _comm("world")
    if name == "COMM_SELF":
        return _comm("self")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | {"COMM_WORLD", "COMM_SELF"})


# mpi4py raises MPI.Exception for errors of MPI calls; collie's errors are
# CollieError. Bound last: from here on, "Exception" in this module is it.
Exception = CollieError  # noqa: A001
