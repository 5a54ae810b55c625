"""MPI.buffer: a flat, byte-addressed view of memory (what Alloc_mem gives,
what pickle's out-of-band data travels in).

Python 3.11 lets no pure-Python class export the buffer protocol, so a
buffer is a one-dimensional uint8 NumPy array: ``memoryview(buf)`` and every
collie call take it as they take any array. Indexing is a byte sequence's
(an int, or a contiguous slice); ``obj`` is the object whose memory it is.
"""

from __future__ import annotations

import ctypes
import operator

import numpy as np

from ...arrays import to_numpy

__all__ = ["buffer", "memory"]

_EMPTY = object()  # buffer() with no argument: empty memory (buffer(None) is an error)


class buffer(np.ndarray):  # noqa: N801 - mpi4py's name
    """Memory as bytes: ``buffer(obj)`` views any buffer-like object;
    ``buffer.allocate(n)``, ``buffer.frombuffer(obj)`` and
    ``buffer.fromaddress(address, n)`` make one."""

    def __new__(cls, obj=_EMPTY):
        if obj is _EMPTY:
            return cls._wrap(None, np.empty(0, dtype=np.uint8))
        return cls.frombuffer(obj, readonly=None)

    @classmethod
    def _wrap(cls, obj, arr: np.ndarray) -> "buffer":
        buf = arr.view(cls)
        buf._obj = obj
        return buf

    def __array_finalize__(self, parent) -> None:
        self._obj = getattr(parent, "_obj", None)
        self._released = False

    @classmethod
    def allocate(cls, nbytes: int, clear: bool = False) -> "buffer":
        """``nbytes`` bytes of new memory (zeroed when ``clear``)."""
        if nbytes is None:
            raise TypeError("buffer.allocate: nbytes must be an int, got None")
        nbytes = operator.index(nbytes)
        if nbytes < 0:
            raise ValueError(f"buffer.allocate: nbytes must be >= 0, got {nbytes}")
        mem = bytearray(nbytes)  # zeroed whether or not ``clear`` asks
        return cls._wrap(mem, np.frombuffer(mem, dtype=np.uint8) if nbytes else np.empty(0, np.uint8))

    @classmethod
    def frombuffer(cls, obj, readonly: bool | None = False) -> "buffer":
        """A view of ``obj``'s memory; ``readonly`` True forbids writing
        through it (None: as writable as ``obj`` is)."""
        if isinstance(obj, buffer):
            obj = obj._obj if obj._obj is not None else np.asarray(obj)
        try:
            view = memoryview(obj)
        except TypeError:
            if not (hasattr(obj, "__dlpack__") or hasattr(obj, "__cuda_array_interface__")):
                raise TypeError(f"buffer: expected an object with the buffer protocol, __dlpack__ or "
                                f"__cuda_array_interface__, got {type(obj).__name__}") from None
            # DLPack or CAI in host memory, checked as mpi4py does (contiguous: ravel is a view of it)
            view = memoryview(to_numpy(obj, "buffer")[0].ravel(order="K"))
        if not view.c_contiguous:
            raise BufferError("buffer: the memory must be contiguous")
        if readonly is False and view.readonly:
            raise BufferError(f"buffer: {type(obj).__name__} is read-only")
        arr = np.frombuffer(view.cast("B"), dtype=np.uint8) if view.nbytes else np.empty(0, np.uint8)
        if readonly and arr.flags.writeable:
            arr = arr.view()
            arr.flags.writeable = False
        return cls._wrap(obj, arr)

    @classmethod
    def fromaddress(cls, address: int, nbytes: int, readonly: bool = False) -> "buffer":
        """``nbytes`` bytes at ``address`` (the caller keeps the memory alive)."""
        address, nbytes = operator.index(address), operator.index(nbytes)
        if nbytes < 0:
            raise ValueError(f"buffer.fromaddress: nbytes must be >= 0, got {nbytes}")
        if address == 0 and nbytes > 0:
            raise ValueError("buffer.fromaddress: address 0 with a non-zero size")
        raw = (ctypes.c_ubyte * nbytes).from_address(address) if nbytes else bytearray()
        arr = np.frombuffer(raw, dtype=np.uint8) if nbytes else np.empty(0, np.uint8)
        if readonly:
            arr.flags.writeable = False
        return cls._wrap(None, arr)

    # ---- what mpi4py's buffer says about itself ----

    @property
    def obj(self):
        return self._obj

    @property
    def address(self) -> int:
        return 0 if self._released or self.size == 0 and self._obj is None else int(self.ctypes.data)

    @property
    def nbytes(self) -> int:
        return 0 if self._released else int(self.size)

    @property
    def readonly(self) -> bool:
        return not self._released and not self.flags.writeable

    @property
    def format(self) -> str:
        return "B"

    def cast(self, format: str, shape=None) -> memoryview:  # noqa: A002 - mpi4py's name
        mem = memoryview(self).cast("B")
        return mem.cast(format) if shape is None else mem.cast(format, shape)

    def toreadonly(self) -> "buffer":
        arr = np.ndarray.view(self, np.ndarray)
        ro = arr.view()
        ro.flags.writeable = False
        return type(self)._wrap(self._obj, ro)

    def tobytes(self, order=None) -> bytes:
        return np.ndarray.tobytes(self)

    def release(self) -> None:
        """Forget the memory: address and size read 0 from now on."""
        self._released = True
        self._obj = None

    # ---- a sequence of bytes ----

    def __getitem__(self, index):
        return np.ndarray.__getitem__(self, _byte_index(index, len(self)))

    def __setitem__(self, index, value) -> None:
        if not self.flags.writeable:
            raise TypeError("buffer is read-only")
        if isinstance(value, (bytes, bytearray, memoryview)):
            value = np.frombuffer(value, dtype=np.uint8)
        np.ndarray.__setitem__(self, _byte_index(index, len(self)), value)

    def __delitem__(self, index) -> None:
        raise NotImplementedError("buffer: cannot delete bytes")

    def __bool__(self) -> bool:  # as a sequence's: non-empty (an array of many bytes has no truth)
        return self.nbytes > 0

    def __repr__(self) -> str:
        return f"<MPI.buffer nbytes={self.nbytes} readonly={self.readonly}>"


def _byte_index(index, size: int):
    """An int or a contiguous slice, as a byte sequence takes."""
    if isinstance(index, slice):
        if index.step not in (None, 1):
            raise IndexError("buffer: slices must be contiguous (step 1)")
        return index
    if index is None or isinstance(index, tuple):
        raise TypeError(f"buffer indices must be integers or slices, not {type(index).__name__}")
    i = operator.index(index)
    if not -size <= i < size:
        raise IndexError(f"buffer index {i} out of range for {size} bytes")
    return i


memory = buffer  # mpi4py's older name
