"""Buffer arguments, read as mpi4py reads them."""

from __future__ import annotations

import ctypes
import operator
import weakref
from typing import Optional

import numpy as np

from ...arrays import to_numpy as _arrays_to_numpy
from ...group import ProcessGroup
from .constants import IN_PLACE
from . import typemap
from .constants import BOTTOM
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


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


_Deleter = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class _DLManaged(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


class _DLManagedVersioned(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p), ("flags", ctypes.c_uint64), ("dl_tensor", _DLTensor)]


_api = ctypes.pythonapi
_api.PyCapsule_IsValid.restype = ctypes.c_int
_api.PyCapsule_IsValid.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_SetName.restype = ctypes.c_int
_api.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]
_DL_KINDS = {0: "i", 1: "u", 2: "f", 5: "c", 6: "b"}
_USED = {b"dltensor": b"used_dltensor", b"dltensor_versioned": b"used_dltensor_versioned"}


class _Memory:
    """An __array_interface__ over a DLPack tensor's memory; the tensor is
    given back (its deleter called) when the last array viewing it goes."""

    def __init__(self, interface: dict, owner):
        self.__array_interface__ = interface
        self._owner = owner


def _release(capsule, name: bytes, pointer: int, deleter: int) -> None:
    if deleter:
        _Deleter(deleter)(pointer)


def _from_dlpack(obj, what: str) -> np.ndarray:
    """A writable view of a CPU DLPack producer's tensor.

    The producer is asked with ``__dlpack__(stream=None)`` only, what mpi4py
    asks (many producers take nothing else). Unlike np.from_dlpack, the
    capsule is kept alive as long as the view (some producers free the
    tensor with the capsule) and unversioned tensors stay writable (NumPy
    imports them read-only, so that nothing could be received into them).
    """
    device = obj.__dlpack_device__() if hasattr(obj, "__dlpack_device__") else (1, 0)
    if int(device[0]) not in (1, 3):  # kDLCPU, kDLCUDAHost
        raise TypeError(f"{what} is on DLPack device {tuple(device)}; collie moves CPU memory")
    capsule = obj.__dlpack__(stream=None)
    for name, kind in ((b"dltensor_versioned", _DLManagedVersioned), (b"dltensor", _DLManaged)):
        if _api.PyCapsule_IsValid(capsule, name):
            break
    else:
        raise TypeError(f"{what}: __dlpack__ returned no DLPack capsule")
    pointer = _api.PyCapsule_GetPointer(capsule, name)
    managed = kind.from_address(pointer)
    t = managed.dl_tensor
    readonly = kind is _DLManagedVersioned and bool(managed.flags & 1)
    code, bits, lanes = t.dtype.code, t.dtype.bits, t.dtype.lanes
    if code == 2 and lanes == 2:  # complex as two float lanes (older producers)
        code, bits, lanes = 5, bits * 2, 1
    if code not in _DL_KINDS or lanes != 1 or bits % 8:
        raise TypeError(f"{what}: DLPack dtype (code {code}, {bits} bits, {lanes} lanes) is not supported")
    dtype = np.dtype("?" if code == 6 else f"{_DL_KINDS[code]}{bits // 8}")
    shape = tuple(t.shape[i] for i in range(t.ndim))
    strides = None if not t.strides or t.ndim == 0 else tuple(t.strides[i] * dtype.itemsize for i in range(t.ndim))
    data = (t.data or 0) + t.byte_offset
    _api.PyCapsule_SetName(capsule, _USED[name])  # consumed: its destructor leaves the tensor to us
    if not data:
        # an empty tensor may have no memory at all
        data = np.zeros(1, dtype=np.uint8).ctypes.data if 0 in shape else data
    mem = _Memory({"version": 3, "shape": shape, "typestr": dtype.str, "strides": strides,
                   "data": (data, readonly)}, obj)
    weakref.finalize(mem, _release, capsule, name, pointer, managed.deleter)
    return np.asarray(mem)


def to_numpy(obj, what: str):
    """collie.arrays.to_numpy, but DLPack producers other than NumPy and
    torch are read as _from_dlpack says."""
    if (obj is not None and hasattr(obj, "__dlpack__")
            and not isinstance(obj, (np.ndarray, bytes, bytearray, memoryview))
            and type(obj).__module__.split(".")[0] != "torch"):
        return _from_dlpack(obj, what), None
    return _arrays_to_numpy(obj, what)


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
            raise ValueError(f"{what} is read-only, but it receives data")
        if datatype is None and not arr.dtype.isnative:
            raise BufferError(f"{what} is {arr.dtype.str} (not this machine's byte order): give its datatype "
                              "to send its bytes as they are")
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
            self._finish = lambda: typemap.unpack(datatype, n, packed, span, what)
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
        raise ValueError(f"{what} is read-only, but it receives data")
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
