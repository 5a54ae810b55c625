"""MPI.buffer (alias MPI.memory): raw bytes at an address, as mpi4py's.

What Alloc_mem and Win.tomemory return. It is a 1-D NumPy uint8 array, the
only way a pure-Python class offers the buffer protocol before Python 3.12,
with mpi4py's sequence rules on top: items are ints, slices are contiguous
views, ``buf[:] = 0`` fills, and it answers address, obj, readonly, format.
A buffer with no memory (``MPI.buffer()``, a window without memory) has
address 0. release() (and Free_mem) make the buffer report no memory, as
mpi4py's does; views taken from it before keep the memory alive.
"""

from __future__ import annotations

import ctypes
import operator

import numpy as np

__all__ = ["buffer", "memory"]

_MISSING = object()


class buffer(np.ndarray):
    """Bytes of memory: ``buffer(obj)`` views obj's; ``buffer()`` is none."""

    _null = False  # no memory: MPI.buffer(), or released

    def __new__(cls, obj=_MISSING):
        if obj is _MISSING:
            return cls._none()
        return cls.frombuffer(obj, readonly=_readonly(obj))

    @classmethod
    def _none(cls) -> "buffer":
        buf = np.zeros(0, np.uint8).view(cls)
        buf._null = True
        return buf

    @staticmethod
    def allocate(nbytes: int, clear: bool = False) -> "buffer":
        if not isinstance(nbytes, int) and not hasattr(nbytes, "__index__"):
            raise TypeError(f"buffer.allocate: nbytes must be an int, got {nbytes!r}")
        nbytes = operator.index(nbytes)
        if nbytes < 0:
            raise ValueError(f"buffer.allocate: nbytes must not be negative, got {nbytes}")
        mem = bytearray(nbytes)  # always zeroed: clearing costs nothing more here
        return buffer.frombuffer(mem)

    @staticmethod
    def frombuffer(obj, readonly: bool = False) -> "buffer":
        try:
            view = memoryview(obj)
        except TypeError:
            raise TypeError(f"buffer: expected an object with the buffer protocol, got {type(obj).__name__}") from None
        if not view.contiguous:
            raise ValueError("buffer: the memory must be contiguous")
        arr = np.frombuffer(view.cast("B") if view.ndim != 1 or view.format != "B" else view, np.uint8)
        buf = arr.view(buffer)
        if readonly or view.readonly:
            buf.flags.writeable = False
        return buf

    @staticmethod
    def fromaddress(address: int, nbytes: int, readonly: bool = False) -> "buffer":
        address, nbytes = operator.index(address), operator.index(nbytes)
        if nbytes < 0:
            raise ValueError(f"buffer.fromaddress: nbytes must not be negative, got {nbytes}")
        if address == 0:
            if nbytes:
                raise ValueError("buffer.fromaddress: address 0 with nonzero nbytes")
            return buffer._none()
        return buffer.frombuffer((ctypes.c_ubyte * nbytes).from_address(address), readonly)

    def release(self) -> None:
        """Forget the memory (it goes when the last view of it goes)."""
        self._null = True

    @property
    def address(self) -> int:
        return 0 if self._null else self.__array_interface__["data"][0]

    @property
    def nbytes(self) -> int:
        return 0 if self._null else np.ndarray.nbytes.__get__(self)

    def __len__(self) -> int:
        return self.nbytes

    @property
    def obj(self):
        if self._null:
            return None
        base = self.base
        while isinstance(base, np.ndarray):
            base = base.base
        return base.obj if isinstance(base, memoryview) else base

    @property
    def readonly(self) -> bool:
        return not self._null and not self.flags.writeable

    @property
    def format(self) -> str:
        return "B"

    def toreadonly(self) -> "buffer":
        view = self.view(buffer)
        view.flags.writeable = False
        return view

    def cast(self, format: str, shape=None) -> memoryview:
        view = memoryview(self)
        return view.cast(format) if shape is None else view.cast(format, shape)

    def __bool__(self) -> bool:
        return self.nbytes > 0

    def __repr__(self) -> str:
        return f"<MPI.buffer address={self.address:#x} nbytes={self.nbytes}>"

    # ---- mpi4py's sequence rules: int items, contiguous slices ----

    def _index(self, index):
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            if step != 1:
                raise IndexError("MPI.buffer slices must be contiguous (step 1)")
            return slice(start, max(start, stop))
        if index is None or isinstance(index, tuple):
            raise TypeError(f"MPI.buffer indices must be integers or slices, not {type(index).__name__}")
        i = operator.index(index)
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"MPI.buffer index {i} out of range ({n} bytes)")
        return i % n

    def __getitem__(self, index):
        at = self._index(index)
        item = np.ndarray.__getitem__(self, at)
        return int(item) if isinstance(at, int) else item

    def __setitem__(self, index, value) -> None:
        if self.readonly:
            raise TypeError("MPI.buffer is read-only")
        at = self._index(index)
        if isinstance(at, slice) and not isinstance(value, (int, np.integer)):
            value = np.frombuffer(memoryview(value).cast("B"), np.uint8)
            if value.size != at.stop - at.start:
                raise ValueError(f"MPI.buffer: cannot put {value.size} bytes into {at.stop - at.start}")
        np.ndarray.__setitem__(self, at, value)

    def __delitem__(self, index) -> None:
        raise NotImplementedError("MPI.buffer items cannot be deleted")


def _readonly(obj) -> bool:
    try:
        return memoryview(obj).readonly
    except TypeError:
        return False


memory = buffer
