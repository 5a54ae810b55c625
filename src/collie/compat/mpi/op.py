"""Reduction ops."""

from __future__ import annotations

import operator
from typing import Callable, Optional

import numpy as np

from ...ops import ReduceOp

__all__ = ["Op", "SUM", "PROD", "MIN", "MAX", "LAND", "LOR", "LXOR", "BAND", "BOR", "BXOR", "MAXLOC", "MINLOC", "REPLACE", "NO_OP", "OP_NULL"]


# ---- reduction ops ----

class Op:
    """A reduction: applies to Python objects (lowercase methods, by calling
    it) and to buffers (uppercase methods, through collie.ReduceOp)."""

    __slots__ = ("name", "_py", "_ufunc", "_collie", "_logical", "_user", "_commute", "_pickles", "_lane",
                 "__weakref__")

    def __init__(self, op: Optional["Op"] = None):
        """``Op()`` is OP_NULL, ``Op(op)`` the same op as ``op``."""
        if op is None:
            op = OP_NULL
        if not isinstance(op, Op):
            raise TypeError(f"MPI.Op() takes an Op to copy, got {type(op).__name__}")
        for name in Op.__slots__[:-1]:
            setattr(self, name, getattr(op, name))

    @classmethod
    def _make(cls, name: str, py: Optional[Callable] = None, ufunc=None, collie: Optional[ReduceOp] = None,
              logical: bool = False) -> "Op":
        op = cls.__new__(cls)
        op.name, op._py, op._ufunc, op._collie, op._logical = name, py, ufunc, collie, logical
        op._user, op._commute, op._pickles = None, True, True
        # collie's op where a buffer reduction is collie's own, nothing
        # before or after (not LAND/LOR/LXOR): what Allreduce's hot path
        # passes to collie.all_reduce's lane (Intracomm.Allreduce).
        op._lane = collie if collie is not None and not logical else None
        return op

    @classmethod
    def Create(cls, function: Callable, commute: bool = False) -> "Op":
        """A user op: ``function(inbuf, inoutbuf, datatype)`` stores
        ``inbuf op inoutbuf`` into inoutbuf (buffers as NumPy arrays). Buffer
        reductions with it fold every rank's contribution in rank order."""
        if not callable(function):
            raise TypeError(f"Op.Create: expected a function (inbuf, inoutbuf, datatype), got {function!r}")
        if len(_live_user_ops) >= _MAX_USER_OPS:
            raise RuntimeError(f"Op.Create: at most {_MAX_USER_OPS} user ops can be alive at once, "
                               "as in mpi4py; Free one first")
        op = cls._make("user")
        op._user, op._commute = function, bool(commute)
        op._py = op._call_user
        _live_user_ops.add(op._py)
        return op

    def _call_user(self, x, y):
        # lowercase reductions: x op y on objects, through the user function
        # (mpi4py passes the objects themselves; the function returns the result)
        out = self._user(x, y, None)
        return y if out is None else out

    def _apply(self, a, b):
        """a op b on two arrays (a from the lower rank)."""
        if self._user is not None:
            out = np.array(b, copy=True)
            self._user(np.asarray(a), out, _datatype_of(out))
            return out
        return self._ufunc(a, b)

    def Reduce_local(self, inbuf, inoutbuf) -> None:
        """inoutbuf = inbuf op inoutbuf, locally."""
        from .buffers import _Buf, _check_same
        a = _Buf(inbuf, "Reduce_local inbuf", writable=False).section()
        r = _Buf(inoutbuf, "Reduce_local inoutbuf", writable=True)
        b = r.section()
        _check_same(a, b, "Reduce_local", a.size == b.size)
        if self._py is None:
            from .exceptions import ERR_OP, _error
            raise _error(ERR_OP, "Reduce_local with MPI.OP_NULL")
        if self._user is not None:
            self._user(a, b, _named_datatype(inoutbuf) or _datatype_of(b))
        elif self._ufunc is not None:
            res = self._ufunc(a, b)
            if self._logical:
                res = res != 0
            np.copyto(b, res, casting="unsafe")
        else:
            np.copyto(b, self._py(a, b))
        r.finish()

    def __call__(self, x, y):
        if self._py is None:
            raise ValueError("MPI.OP_NULL cannot be applied")
        return self._py(x, y)

    def Is_commutative(self) -> bool:
        return self._commute

    is_commutative = property(Is_commutative)

    def Is_predefined(self) -> bool:
        return self._user is None

    is_predefined = property(Is_predefined)

    def Free(self) -> None:
        if self._user is None:
            from .exceptions import ERR_OP, _error
            raise _error(ERR_OP, f"Op.Free: MPI.{self.name} is predefined")
        _live_user_ops.discard(self._py)
        self.name, self._py, self._user = "OP_NULL", None, None

    def free(self) -> None:
        """mpi4py's safe free: a named constant (MPI.SUM, OP_NULL) stays as it
        is, a copy of a predefined op lets go of it, a user op is Free'd."""
        if self._user is not None:
            self.Free()
        elif globals().get(self.name) is not self:
            Op.__init__(self, OP_NULL)

    def __bool__(self) -> bool:
        return self._py is not None

    def __eq__(self, other) -> bool:
        if not isinstance(other, Op):
            return NotImplemented
        return self.name == other.name and self._py is other._py

    def __ne__(self, other) -> bool:
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    __hash__ = None  # unhashable, as mpi4py's handles are

    def __reduce__(self):
        """A named op pickles as its name, a copy of one as a new copy, a
        user op as a new Op.Create of its (picklable) function."""
        if self._user is not None:
            if not self._pickles:
                raise ValueError(f"cannot pickle {self!r}: an op from Op.fromint has no Python function "
                                 "of its own (pickle the op Op.Create returned)")
            return (Op.Create, (self._user, self._commute))
        if globals().get(self.name) is self:
            return self.name
        return (type(self), (globals()[self.name],))

    def __repr__(self) -> str:
        return f"<MPI.{self.name}>"

    # integer handles: OP_NULL 0, the predefined ops, then user ops as they are asked for

    def toint(self) -> int:
        for i, name in enumerate(_PREDEFINED):
            if self == globals()[name]:
                return i
        for i, op in enumerate(_user_ops):
            if op == self:
                return len(_PREDEFINED) + i
        _user_ops.append(Op(self))
        return len(_PREDEFINED) + len(_user_ops) - 1

    @classmethod
    def fromint(cls, handle: int) -> "Op":
        handle = operator.index(handle)
        if 0 <= handle < len(_PREDEFINED):
            return cls(globals()[_PREDEFINED[handle]])
        if not 0 <= handle - len(_PREDEFINED) < len(_user_ops):
            from .exceptions import ERR_OP, _error
            raise _error(ERR_OP, f"Op.fromint: {handle} is not an op's handle")
        op = cls(_user_ops[handle - len(_PREDEFINED)])
        op._pickles = False
        return op

    py2f = toint
    f2py = fromint
    handle = property(toint, doc="The op's integer handle (OP_NULL: 0).")
    fromhandle = fromint


def _datatype_of(arr):
    from .datatype import _datatype_for
    return _datatype_for(arr.dtype)


def _named_datatype(spec):
    """The datatype a buffer spec names ([buf, MPI.BYTE], [buf, n, MPI.INT]...), None if none."""
    if isinstance(spec, (list, tuple)) and len(spec) >= 2:
        from .datatype import Datatype
        last = spec[-1]
        return last if isinstance(last, Datatype) else None
    return None


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
SUM = Op._make("SUM", operator.add, np.add, ReduceOp.SUM)
PROD = Op._make("PROD", operator.mul, np.multiply, ReduceOp.PRODUCT)
MIN = Op._make("MIN", _min, np.minimum, ReduceOp.MIN)
MAX = Op._make("MAX", _max, np.maximum, ReduceOp.MAX)
LAND = Op._make("LAND", lambda x, y: x and y, np.logical_and, ReduceOp.BAND, logical=True)
LOR = Op._make("LOR", lambda x, y: x or y, np.logical_or, ReduceOp.BOR, logical=True)
LXOR = Op._make("LXOR", lambda x, y: (not x) != (not y), np.logical_xor, ReduceOp.BXOR, logical=True)
BAND = Op._make("BAND", operator.and_, np.bitwise_and, ReduceOp.BAND)
BOR = Op._make("BOR", operator.or_, np.bitwise_or, ReduceOp.BOR)
BXOR = Op._make("BXOR", operator.xor, np.bitwise_xor, ReduceOp.BXOR)
MAXLOC = Op._make("MAXLOC", _maxloc)
MINLOC = Op._make("MINLOC", _minloc)
REPLACE = Op._make("REPLACE", lambda x, y: y)
NO_OP = Op._make("NO_OP", lambda x, y: x)
OP_NULL = Op._make("OP_NULL")
_PREDEFINED = ("OP_NULL", "MAX", "MIN", "SUM", "PROD", "LAND", "BAND", "LOR", "BOR", "LXOR", "BXOR", "MAXLOC",
               "MINLOC", "REPLACE", "NO_OP")
_user_ops: list = []  # user ops that were given a handle (toint)
_MAX_USER_OPS = 32    # mpi4py's limit on user ops alive at once
_live_user_ops: set = set()  # the function (_py) of each live user op


def _py_op(op) -> Callable:
    if isinstance(op, Op):
        return op._py
    if callable(op):
        return op
    raise TypeError(f"op must be an MPI.Op (MPI.SUM...) or a function of two objects, got {op!r}")


def _buffer_op(op, what: str) -> Op:
    if not isinstance(op, Op):
        raise TypeError(f"{what}: op must be an MPI.Op (MPI.SUM, MPI.MAX...), got {op!r}")
    if op._py is None:
        from .exceptions import ERR_OP, _error
        raise _error(ERR_OP, f"{what}: MPI.OP_NULL is no reduction")
    if op._collie is None and op._user is None:
        raise NotImplementedError(f"{what}: MPI.{op.name} works on Python objects only "
                                  "(lowercase methods); buffers take SUM, PROD, MIN, MAX, LAND, LOR, "
                                  "LXOR, BAND, BOR, BXOR")
    return op
