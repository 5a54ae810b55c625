"""MPI.buffer (alias MPI.memory): raw bytes at an address, as mpi4py's.

What Alloc_mem and Win.tomemory return. It is a 1-D NumPy uint8 array (so
it is a buffer, slices are views, and ``buf[:] = 0`` clears it) that also
answers mpi4py's questions: address, obj, readonly, format. The one buffer
with no memory at all (``MPI.buffer()``, a window without memory) has
address 0, as in mpi4py.
"""

from __future__ import annotations

import ctypes
import operator

import numpy as np

__all__ = ["buffer", "memory"]

_MISSING = object()


class buffer(np.ndarray):
    """Bytes of memory: ``buffer(obj)`` views obj's; ``buffer()`` is none."""

    _null = False

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

    @property
    def address(self) -> int:
        return 0 if self._null else self.__array_interface__["data"][0]

    @property
    def obj(self):
        base = self.base
        while isinstance(base, np.ndarray):
            base = base.base
        return base.obj if isinstance(base, memoryview) else base

    @property
    def readonly(self) -> bool:
        return not self.flags.writeable

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


def _readonly(obj) -> bool:
    try:
        return memoryview(obj).readonly
    except TypeError:
        return False


memory = buffer
