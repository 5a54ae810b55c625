"""MPI datatypes."""

from __future__ import annotations


import numpy as np



# ---- datatypes ----

class Datatype:
    """An MPI datatype. Here it names a NumPy dtype: a buffer given with a
    datatype is read as raw memory of that type, as in mpi4py."""

    __slots__ = ("name", "dtype")

    def __init__(self, name="DATATYPE_NULL", dtype=None):
        if isinstance(name, Datatype):  # MPI.Datatype(datatype): the same type
            name, dtype = name.name, name.dtype
        self.name, self.dtype = name, (None if dtype is None else np.dtype(dtype))

    def __bool__(self) -> bool:
        return self.dtype is not None

    def __eq__(self, other) -> bool:
        if not isinstance(other, Datatype):
            return NotImplemented
        return self.name == other.name and self.dtype == other.dtype

    def __ne__(self, other) -> bool:
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    def __hash__(self) -> int:
        return hash((self.name, self.dtype))

    def __reduce__(self):
        return self.name if globals().get(self.name) is self else (Datatype, (self.name, self.dtype))

    def _need(self, what: str) -> np.dtype:
        if self.dtype is None:
            from .exceptions import ERR_TYPE, _error
            raise _error(ERR_TYPE, f"Datatype.{what} on MPI.DATATYPE_NULL")
        return self.dtype

    def Get_size(self) -> int:
        return self._need("Get_size").itemsize

    def Get_extent(self) -> tuple[int, int]:
        return 0, self._need("Get_extent").itemsize

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


def _datatype_for(dtype) -> Datatype:
    """The named datatype of a NumPy dtype (a new one named after it when none)."""
    dtype = np.dtype(dtype)
    for name in _types():
        t = globals()[name]
        if t.dtype == dtype:
            return t
    return Datatype(str(dtype), dtype)


def _as_dtype(datatype) -> np.dtype:
    if isinstance(datatype, Datatype):
        return datatype._need("use")
    try:
        return np.dtype(datatype)
    except TypeError:
        raise TypeError(f"expected an MPI datatype (MPI.DOUBLE...) or a NumPy dtype, got {datatype!r}") from None


def _is_datatype(x) -> bool:
    return isinstance(x, (Datatype, np.dtype, str)) or (
        isinstance(x, type) and issubclass(x, (np.generic, int, float, complex)))

DATATYPE_NULL = Datatype()

__all__ = ["Datatype", "DATATYPE_NULL", *_types()]
