"""Status: what a receive or probe matched."""

from __future__ import annotations

from typing import Optional

import numpy as np

from .constants import ANY_SOURCE, ANY_TAG, F_ERROR, F_SOURCE, F_STATUS_SIZE, F_TAG, SUCCESS, UNDEFINED
from .datatype import _as_dtype

__all__ = ["Status"]


# ---- status ----

# The fields live in one int64 array, so that tomemory() can hand out the
# status's own memory, as mpi4py does with the MPI_Status struct; their order
# is Fortran's status array (F_SOURCE, F_TAG, F_ERROR), so py2f is the array.
_COUNT, _CANCELLED, _SOURCE, _TAG, _ERROR = range(5)
assert (_SOURCE, _TAG, _ERROR) == (F_SOURCE, F_TAG, F_ERROR) and F_STATUS_SIZE == 5


class Status:
    """What a receive or probe matched: source, tag, error and size in
    bytes. ``Status(other)`` copies another status."""

    def __init__(self, status: Optional["Status"] = None):
        if status is not None and not isinstance(status, Status):
            raise TypeError(f"Status() takes a Status to copy, got {type(status).__name__}")
        if status is None:
            self._fields = np.zeros(F_STATUS_SIZE, dtype=np.int64)
            self._fields[[_SOURCE, _TAG, _ERROR]] = (ANY_SOURCE, ANY_TAG, SUCCESS)
        else:
            self._fields = status._fields.copy()

    def _set(self, source: int, tag: int, nbytes: int, cancelled: bool = False) -> None:
        self._fields[[_SOURCE, _TAG, _COUNT, _CANCELLED]] = (source, tag, nbytes, cancelled)

    def __reduce__(self):
        return _from_fields, (self._fields.tolist(), type(self))

    @property
    def source(self) -> int:
        return int(self._fields[_SOURCE])

    @source.setter
    def source(self, value: int) -> None:
        self._fields[_SOURCE] = value

    @property
    def tag(self) -> int:
        return int(self._fields[_TAG])

    @tag.setter
    def tag(self, value: int) -> None:
        self._fields[_TAG] = value

    @property
    def error(self) -> int:
        return int(self._fields[_ERROR])

    @error.setter
    def error(self, value: int) -> None:
        self._fields[_ERROR] = value

    @property
    def count(self) -> int:
        """The size of what was received, in bytes."""
        return int(self._fields[_COUNT])

    @count.setter
    def count(self, nbytes: int) -> None:
        self._fields[_COUNT] = nbytes

    @property
    def cancelled(self) -> bool:
        return bool(self._fields[_CANCELLED])

    @cancelled.setter
    def cancelled(self, flag: bool) -> None:
        self._fields[_CANCELLED] = bool(flag)

    @property
    def _nbytes(self) -> int:
        return self.count

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
        return self.count // size if self.count % size == 0 else UNDEFINED

    Get_elements = Get_count

    def Set_elements(self, datatype, count: int) -> None:
        self.count = count * (1 if datatype is None else _as_dtype(datatype).itemsize)

    def Is_cancelled(self) -> bool:
        return self.cancelled

    def Set_cancelled(self, flag: bool) -> None:
        self.cancelled = flag

    def tomemory(self) -> memoryview:
        """The status's fields as writable integers (what mpi4py gives for
        the MPI_Status struct): writing them changes the status."""
        return memoryview(self._fields)

    def py2f(self) -> list:
        """The fields as a list of integers (Fortran's status array)."""
        return self._fields.tolist()

    @classmethod
    def f2py(cls, fields) -> "Status":
        return _from_fields(list(fields))

    def __eq__(self, other) -> bool:
        if not isinstance(other, Status):
            return NotImplemented
        return bool((self._fields == other._fields).all())

    __hash__ = None

    def __repr__(self) -> str:
        return f"<MPI.Status source={self.source} tag={self.tag} count={self.count}>"


def _from_fields(fields: list, cls: type = Status) -> Status:
    status = cls()
    if len(fields) != len(status._fields):
        raise ValueError(f"a Status has {len(status._fields)} fields, got {len(fields)}")
    status._fields[:] = fields
    return status
