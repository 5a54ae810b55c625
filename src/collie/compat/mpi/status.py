"""Status: what a receive or probe matched."""

from __future__ import annotations

from typing import Optional
from .constants import ANY_SOURCE, ANY_TAG, SUCCESS, UNDEFINED
from .datatype import _as_dtype

__all__ = ["Status"]




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
