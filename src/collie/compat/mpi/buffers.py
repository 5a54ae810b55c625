"""Buffer arguments, read as mpi4py reads them."""

from __future__ import annotations

import operator
from typing import Optional

import numpy as np

from ...arrays import ReadOnlyError, byte_view, to_numpy  # DLPack producers are read as mpi4py reads them
from ...group import ProcessGroup
from . import typemap
from .constants import BOTTOM, IN_PLACE
from .datatype import Datatype, _as_dtype, _is_datatype, _is_derived
from .op import Op

__all__ = []


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


def _bare_bytes(buf, writable: bool) -> Optional[memoryview]:
    """The bytes of ``buf`` where it is a bare NumPy array that _Buf would
    take whole as it is (its first branch, with _plain's checks passing):
    C-contiguous, in this machine's byte order, no objects (and writable,
    to receive into). What the compiled core's path sends or receives into;
    else None: buffer specs and the rest go through _Buf, which also
    explains what is wrong."""
    if buf.__class__ is not np.ndarray:
        return None
    flags, dtype = buf.flags, buf.dtype
    if not flags.c_contiguous or (writable and not flags.writeable) or dtype.hasobject or not dtype.isnative:
        return None
    return byte_view(buf)


class _Buf:
    """One buffer argument, read as mpi4py does.

    ``flat`` is the whole buffer as a 1-D array of the message's datatype (a
    view of the caller's memory; a copy, written back by finish(), only when
    the array is not contiguous). Block variants have ``count`` elements per
    block from ``displ`` on; vector variants have ``counts``/``displs``.
    """

    __slots__ = ("flat", "count", "displ", "counts", "displs", "_finish")

    def __init__(self, spec, what: str, *, writable: bool, blocks: int = 1, vector: bool = False,
                 empty_ok: bool = False):
        if spec.__class__ is np.ndarray and blocks == 1 and not vector:  # a bare array: all of it
            self.flat = self._plain(spec, None, None, False, 1, writable, what)
            self.count, self.displ, self.counts, self.displs, self._finish = self.flat.size, 0, None, None, None
            return
        if spec is None and empty_ok:
            spec = [None, 0, "B"]  # no buffer: an empty message
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
        self._finish = None
        if isinstance(datatype, Datatype) and not datatype:
            if count or displ or (count is None and obj is not None and obj is not BOTTOM):
                raise ValueError(f"{what}: the datatype is MPI.DATATYPE_NULL")
            obj, datatype = None, None
        if obj is BOTTOM and not _is_derived(datatype):
            if count or (isinstance(count, (list, tuple)) and any(count)):
                raise ValueError(f"{what}: data at MPI.BOTTOM needs a derived datatype of absolute addresses")
            obj = None
        if _is_derived(datatype) and obj is not None:
            flat, k, count, displ = self._packed(obj, datatype, count, displ, blocks, vector, writable, what)
            count, displ = _scaled(count, k), _scaled(displ, k)
        else:
            flat = self._plain(obj, count, datatype, vector, blocks, writable, what)
            if obj is None:
                count = [0] * blocks if vector else None
                displ = [0] * blocks if vector else None
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

    def _plain(self, obj, count, datatype, vector: bool, blocks: int, writable: bool, what: str) -> np.ndarray:
        """The buffer as a 1-D array of its datatype (a view of the caller's memory when it can be)."""
        if obj is None:  # [None, datatype], [None, 0, datatype]: an empty buffer, as in mpi4py
            if not (isinstance(count, (list, tuple)) and not any(count) or not count):
                raise ValueError(f"{what}: a None buffer cannot hold {count} elements")
            return np.zeros(0, dtype=np.uint8 if datatype is None else _as_dtype(datatype))
        arr, _ = to_numpy(obj, what)
        if writable and not arr.flags.writeable:
            raise ReadOnlyError(f"{what} is read-only, but it receives data")
        if datatype is None and not arr.dtype.isnative:
            raise BufferError(f"{what} is {arr.dtype.str} (not this machine's byte order): give its datatype "
                              "to send its bytes as they are")
        if not (arr.flags.c_contiguous or arr.flags.f_contiguous):
            # as mpi4py: a strided array's layout is said with a derived datatype, not guessed
            raise BufferError(f"{what} is not contiguous (shape {arr.shape}, strides {arr.strides}); "
                              "pass a contiguous array, or describe the layout with a derived datatype")
        flat = arr.ravel(order="K")  # a view, in memory order
        if datatype is not None:
            dtype = _as_dtype(datatype)
            if dtype != flat.dtype:
                if dtype.itemsize == 0 or flat.nbytes % dtype.itemsize:
                    raise ValueError(f"{what}: {flat.nbytes} bytes are not a whole number of {datatype!r}")
                flat = flat.view(np.uint8).view(dtype)
        return flat

    def _packed(self, obj, datatype, count, displ, blocks: int, vector: bool, writable: bool, what: str):
        """A derived datatype's items packed into a contiguous copy (unpacked
        back into the caller's memory by finish() when it receives), as
        elements of the type's one basic dtype (k per item), or as opaque
        items (k = 1) when it mixes several.

        Counts and displacements are read as mpi4py reads them (displacements
        in extents; a count left out is the buffer's length over the
        extent). Returns (flat, k, count, displ), count and displ in items of
        flat's origin.
        """
        t = datatype._t
        ext = t.ub - t.lb
        if obj is BOTTOM:  # the type's displacements are absolute addresses
            span, length = typemap.Span(None), 0
        else:
            mem = _bytes(obj, what, writable)
            span, length = typemap.Span(mem), mem.size
        if vector:
            if count is None:
                total = _inferred(length, ext, what) if length else 0
                self._vector(None, displ, blocks, total, what)
            else:
                self._vector(count, displ, blocks, None, what)
            count, displ = self.counts, self.displs
            n = max((c + d for c, d in zip(count, displ) if c), default=0)
        else:
            d = 0 if displ is None else _count(displ, f"{what} displacement")
            if d:
                if ext <= 0:
                    raise ValueError(f"{what}: cannot take a displacement with a datatype of extent {ext}")
                if d * ext > length:
                    raise ValueError(f"{what}: displacement {d} is past the end ({length // ext} items)")
                span = typemap.Span(span.mem, d * ext)
            if count is None:
                left = _inferred(length - d * ext, ext, what) if length - d * ext else 0
                if left % max(blocks, 1):
                    raise ValueError(f"{what}: {left} items do not split into {blocks} equal blocks (one per rank)")
                count = left // max(blocks, 1)
            count, displ = _count(count, f"{what} count"), 0
            n = count * max(blocks, 1)
        packed = typemap.pack(datatype, n, span, what)
        if writable:
            # MPI lets the datatype be freed while the receive is pending: hold its type map
            held = type(datatype)._of(t)
            self._finish = lambda: typemap.unpack(held, n, packed, span, what)
        size, basic = t.size, t.basic
        if size == 0:
            return packed, 0, count, displ
        if basic is not None and size % basic.itemsize == 0:
            return packed.view(basic), size // basic.itemsize, count, displ
        return packed.view(f"V{size}"), 1, count, displ

    def _vector(self, counts, displs, blocks: int, total: Optional[int], what: str) -> None:
        if counts is None:
            counts = [total // blocks + (total % blocks > i) for i in range(blocks)]
        elif _is_index(counts):
            counts = [_count(counts, f"{what} count")] * blocks
        else:
            counts = [_count(c, f"{what} counts") for c in counts]
        if displs is None:
            displs = [sum(counts[:i]) for i in range(blocks)]
        elif _is_index(displs):
            displs = [_count(displs, f"{what} displacement") * i for i in range(blocks)]
        else:
            displs = [_count(d, f"{what} displs") for d in displs]
        if len(counts) != blocks or len(displs) != blocks:
            raise ValueError(f"{what}: counts and displs need one entry per rank ({blocks}), "
                             f"got {len(counts)} and {len(displs)}")
        for c, d in zip(counts, displs):
            if total is not None and c + d > total:
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


def _is_index(x) -> bool:
    """Whether x is one integer (an int, a NumPy integer or a 0-d integer array)."""
    if isinstance(x, (list, tuple)):
        return False
    try:
        operator.index(x)
    except TypeError:
        return False
    return True


def _scaled(x, k: int):
    """A count, displacement or list of them, in items, as elements (k per item)."""
    if x is None:
        return None
    if _is_index(x):
        return operator.index(x) * k
    return [operator.index(v) * k for v in x]


def _inferred(length: int, ext: int, what: str) -> int:
    """The count of items a buffer of ``length`` bytes holds, as mpi4py infers it."""
    if ext <= 0:
        raise ValueError(f"{what}: cannot infer the count with a datatype of extent {ext}")
    if length % ext:
        raise ValueError(f"{what}: cannot infer the count, the buffer's {length} bytes are not a "
                         f"multiple of the datatype's extent {ext}")
    return length // ext


def _bytes(obj, what: str, writable: bool) -> np.ndarray:
    """A buffer's memory as 1-D bytes (a view; a derived datatype addresses it by byte)."""
    arr, _ = to_numpy(obj, what)
    if writable and not arr.flags.writeable:
        raise ReadOnlyError(f"{what} is read-only, but it receives data")
    if not (arr.flags.c_contiguous or arr.flags.f_contiguous):
        raise ValueError(f"{what}: a buffer with a derived datatype must be contiguous")
    return arr.reshape(-1, order="A").view(np.uint8) if arr.size else np.zeros(0, dtype=np.uint8)


def _u8(a: np.ndarray) -> np.ndarray:
    """A contiguous 1-D array as its bytes: data-movement collectives move
    bytes, so every dtype works and collie checks sizes in bytes."""
    return a.view(np.uint8) if a.size else np.zeros(0, dtype=np.uint8)


def _pack(blocks: list) -> np.ndarray:
    return np.concatenate(blocks) if blocks else np.zeros(0, dtype=np.uint8)


def _only_root(buf, g: ProcessGroup, root: int, what: str, which: str) -> None:
    if buf is IN_PLACE and g.rank != root:
        raise ValueError(f"{what}: MPI.IN_PLACE as {which} is only allowed at the root")


def _check_same(src: np.ndarray, dst: np.ndarray, what: str, sizes_ok: bool) -> None:
    if src.dtype != dst.dtype:
        raise ValueError(f"{what}: sendbuf is {src.dtype} but recvbuf is {dst.dtype}")
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
