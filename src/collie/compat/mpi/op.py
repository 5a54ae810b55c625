"""Reduction ops."""

from __future__ import annotations

import operator
from typing import Callable, Optional

import numpy as np

from ...ops import ReduceOp

__all__ = ["Op", "SUM", "PROD", "MIN", "MAX", "LAND", "LOR", "LXOR", "BAND", "BOR", "BXOR", "MAXLOC", "MINLOC", "REPLACE", "NO_OP"]


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
