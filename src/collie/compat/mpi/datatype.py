"""MPI datatypes: the predefined ones (each names a NumPy dtype) and the
derived ones (contiguous, vector, indexed, struct, subarray, darray,
resized...), which describe where a message's bytes lie in memory.

A Datatype object is a handle on a _Type record; copies of a handle
(``MPI.Datatype(t)``, what Get_contents returns) share the record, and
Free() empties only the handle it is called on. A record knows its size,
bounds and envelope at once, computed from its constructor's arguments; its
byte runs (typemap.py) are computed the first time data moves.
"""

from __future__ import annotations

import math
import operator
from typing import Optional

import numpy as np

from . import typemap
from .attributes import _Attributed
from .constants import (COMBINER_CONTIGUOUS, COMBINER_DARRAY, COMBINER_DUP, COMBINER_F90_COMPLEX,
                        COMBINER_F90_INTEGER, COMBINER_F90_REAL, COMBINER_HINDEXED, COMBINER_HINDEXED_BLOCK,
                        COMBINER_HVECTOR, COMBINER_INDEXED, COMBINER_INDEXED_BLOCK, COMBINER_NAMED,
                        COMBINER_RESIZED, COMBINER_STRUCT, COMBINER_SUBARRAY, COMBINER_VALUE_INDEX,
                        COMBINER_VECTOR, DISTRIBUTE_BLOCK, DISTRIBUTE_CYCLIC, DISTRIBUTE_DFLT_DARG,
                        DISTRIBUTE_NONE, ORDER_C, ORDER_F, TYPECLASS_COMPLEX, TYPECLASS_INTEGER,
                        TYPECLASS_LOGICAL, TYPECLASS_REAL)

_COMBINER_NAMES = {
    COMBINER_NAMED: "NAMED", COMBINER_DUP: "DUP", COMBINER_CONTIGUOUS: "CONTIGUOUS", COMBINER_VECTOR: "VECTOR",
    COMBINER_HVECTOR: "HVECTOR", COMBINER_INDEXED: "INDEXED", COMBINER_HINDEXED: "HINDEXED",
    COMBINER_INDEXED_BLOCK: "INDEXED_BLOCK", COMBINER_HINDEXED_BLOCK: "HINDEXED_BLOCK",
    COMBINER_STRUCT: "STRUCT", COMBINER_SUBARRAY: "SUBARRAY", COMBINER_DARRAY: "DARRAY",
    COMBINER_RESIZED: "RESIZED", COMBINER_VALUE_INDEX: "VALUE_INDEX", COMBINER_F90_INTEGER: "F90_INTEGER",
    COMBINER_F90_REAL: "F90_REAL", COMBINER_F90_COMPLEX: "F90_COMPLEX",
}
_PREDEFINED = (COMBINER_NAMED, COMBINER_VALUE_INDEX, COMBINER_F90_INTEGER, COMBINER_F90_REAL, COMBINER_F90_COMPLEX)


def _err(errclass_name: str, message: str):
    from . import exceptions
    return exceptions._error(getattr(exceptions, errclass_name), message)


# ---- the record behind a handle ----

_type_of_handle: list = [None]  # integer handle -> record (0: DATATYPE_NULL)
_handle_of: dict = {}           # record -> integer handle

class _Type:
    """One datatype: size and bounds, how it was made (combiner, ints,
    addresses, the records of its datatypes), the NumPy dtype of a predefined type, and the
    single basic dtype of its elements when they all share one."""

    __slots__ = ("label", "combiner", "ints", "addrs", "types", "size", "lb", "ub", "tlb", "tub",
                 "dtype", "basic", "align", "char", "str", "code", "runs_of", "_runs", "const", "attrs")

    def __init__(self, combiner, size, bounds, *, ints=(), addrs=(), types=(), label="", dtype=None,
                 basic=None, align=1, char=None, str_=None, code=None, runs_of=None):
        self.label, self.combiner = label, combiner
        self.ints, self.addrs, self.types = ints, addrs, types  # lists, owned by the record
        self.size = size
        self.lb, self.ub, self.tlb, self.tub = bounds
        self.dtype, self.basic, self.align = dtype, basic, align
        self.char, self.str, self.code = char, str_, code
        self.runs_of, self._runs = runs_of, None
        self.const = None  # the module's constant, for a predefined type
        self.attrs: dict = {}  # keyval -> value (Set_attr): shared by every handle of the type

    def runs(self) -> tuple:
        if self._runs is None:
            self._runs = self.runs_of()
        return self._runs


def _span(copies) -> Optional[tuple]:
    """(min, max) over groups of copies, each (dmin, dmax), or None if none."""
    copies = [c for c in copies if c is not None]
    if not copies:
        return None
    return min(c[0] for c in copies), max(c[1] for c in copies)


def _progression(n: int, step: int) -> Optional[tuple]:
    """(min, max) of 0, step, ..., (n-1)*step; None for no terms."""
    if n <= 0:
        return None
    last = (n - 1) * step
    return min(0, last), max(0, last)


def _add(a, b) -> Optional[tuple]:
    return None if a is None or b is None else (a[0] + b[0], a[1] + b[1])


class Datatype(_Attributed):
    """An MPI datatype handle (mpi4py's MPI.Datatype)."""

    __slots__ = ("_t", "_pyname", "__weakref__")

    def __init__(self, datatype: Optional["Datatype"] = None):
        if datatype is not None and not isinstance(datatype, Datatype):
            raise TypeError(f"MPI.Datatype() takes a Datatype, got {type(datatype).__name__}")
        self._t = None if datatype is None else datatype._t
        self._pyname = None

    @classmethod
    def _of(cls, t: Optional[_Type], key: Optional[str] = None) -> "Datatype":
        d = cls.__new__(cls)
        d._t, d._pyname = t, key
        return d

    # ---- identity ----

    def __bool__(self) -> bool:
        return self._t is not None

    def __eq__(self, other) -> bool:
        if not isinstance(other, Datatype):
            return NotImplemented
        return self._t is other._t

    def __ne__(self, other) -> bool:
        if not isinstance(other, Datatype):
            return NotImplemented
        return self._t is not other._t

    __hash__ = None  # unhashable, as mpi4py's handles are

    def __reduce__(self):
        if self._pyname is not None and globals().get(self._pyname) is self:
            return self._pyname
        t = self._t
        if t is None:
            return (type(self), ())
        if t.combiner == COMBINER_NAMED:
            return (type(self), (t.const,))
        return (_recreate, self.decode())

    def __repr__(self) -> str:
        if self._t is None:
            return "<MPI.DATATYPE_NULL>"
        name = self._t.label or _COMBINER_NAMES[self._t.combiner].lower()
        return f"<MPI.Datatype {name}: size {self._t.size}, extent {self._t.ub - self._t.lb}>"

    @property
    def dtype(self) -> Optional[np.dtype]:
        """collie's addition: the NumPy dtype of a predefined type (None for others)."""
        return None if self._t is None else self._t.dtype

    def _need(self, what: str) -> _Type:
        if self._t is None:
            raise _err("ERR_TYPE", f"Datatype.{what} on MPI.DATATYPE_NULL")
        return self._t

    # ---- size and bounds ----

    def Get_size(self) -> int:
        return self._need("Get_size").size

    def Get_extent(self) -> tuple[int, int]:
        t = self._need("Get_extent")
        return t.lb, t.ub - t.lb

    def Get_true_extent(self) -> tuple[int, int]:
        t = self._need("Get_true_extent")
        return t.tlb, t.tub - t.tlb

    size = property(Get_size)
    extent = property(lambda self: self.Get_extent()[1])
    lb = property(lambda self: self.Get_extent()[0])
    ub = property(lambda self: sum(self.Get_extent()))
    true_extent = property(lambda self: self.Get_true_extent()[1])
    true_lb = property(lambda self: self.Get_true_extent()[0])
    true_ub = property(lambda self: sum(self.Get_true_extent()))

    # what typemap.py asks of a type
    def _size(self) -> int:
        return self._t.size

    def _ext(self) -> int:
        return self._t.ub - self._t.lb

    def _true_bounds(self) -> tuple:
        return self._t.tlb, self._t.tub

    def _runs(self) -> tuple:
        return self._t.runs()

    # ---- names ----

    def Get_name(self) -> str:
        return "MPI_DATATYPE_NULL" if self._t is None else self._t.label

    def Set_name(self, name: str) -> None:
        self._need("Set_name").label = str(name)

    name = property(Get_name, Set_name)

    # ---- lifetime ----

    def Commit(self) -> "Datatype":
        self._need("Commit")
        return self

    def Free(self) -> None:
        t = self._need("Free")
        if t.combiner in _PREDEFINED:
            raise _err("ERR_TYPE", f"Datatype.Free: {t.label or 'a predefined datatype'} cannot be freed")
        self._delete_attrs()
        self._t = None

    def free(self) -> None:
        """mpi4py's safe free: a named constant (MPI.INT, DATATYPE_NULL) stays
        as it is, a copy of a predefined type lets go of it, others are Free'd."""
        if self._t is None or self._pyname is not None:
            return
        if self._t.combiner in _PREDEFINED:
            self._t = None
        else:
            self.Free()

    # ---- integer handles (toint/fromint, py2f/f2py): numbered on first request, DATATYPE_NULL 0 ----

    def toint(self) -> int:
        t = self._t
        if t is None:
            return 0
        if t not in _handle_of:
            _handle_of[t] = len(_type_of_handle)
            _type_of_handle.append(t)
        return _handle_of[t]

    @classmethod
    def fromint(cls, handle: int) -> "Datatype":
        handle = operator.index(handle)
        if not 0 <= handle < len(_type_of_handle):
            raise _err("ERR_TYPE", f"Datatype.fromint: {handle} is not a datatype's handle")
        return cls._of(_type_of_handle[handle])

    py2f = toint
    f2py = fromint
    handle = property(toint, doc="The datatype's integer handle (DATATYPE_NULL: 0).")
    fromhandle = fromint

    def Dup(self) -> "Datatype":
        t = self._need("Dup")
        new = type(self)._of(_Type(COMBINER_DUP, t.size, (t.lb, t.ub, t.tlb, t.tub), types=[t], runs_of=t.runs,
                                   basic=t.basic, align=t.align, char=t.char, str_=t.str, code=t.code))
        self._copy_attrs(new)
        return new

    def _attrs(self) -> dict:
        return self._need("attributes").attrs

    Create_dup = Dup

    def _derive(self, combiner, size, bounds, **kw) -> "Datatype":
        kw["types"] = [x._t for x in kw.get("types", ())]
        return type(self)._of(_Type(combiner, size, bounds, **kw))

    # ---- constructors ----

    def Create_contiguous(self, count: int) -> "Datatype":
        t = self._need("Create_contiguous")
        count = _nonneg(count, "Create_contiguous count")
        ext = t.ub - t.lb
        return self._copies(COMBINER_CONTIGUOUS, [(count, _progression(count, ext))], ints=[count],
                            runs_of=lambda: typemap.tile(t.runs(), count, ext))

    def Create_vector(self, count: int, blocklength: int, stride: int) -> "Datatype":
        t = self._need("Create_vector")
        return self._vector(COMBINER_VECTOR, count, blocklength, stride, (t.ub - t.lb), ints_only=True)

    def Create_hvector(self, count: int, blocklength: int, stride: int) -> "Datatype":
        self._need("Create_hvector")
        return self._vector(COMBINER_HVECTOR, count, blocklength, stride, 1, ints_only=False)

    def _vector(self, combiner, count, blocklength, stride, unit, ints_only) -> "Datatype":
        t = self._t
        what = _COMBINER_NAMES[combiner].lower()
        count, blocklength = _nonneg(count, f"{what} count"), _nonneg(blocklength, f"{what} blocklength")
        stride = operator.index(stride)
        ext = t.ub - t.lb
        step = stride * unit
        group = _add(_progression(count, step), _progression(blocklength, ext))
        ints, addrs = ([count, blocklength, stride], []) if ints_only else ([count, blocklength], [stride])
        return self._copies(combiner, [(count * blocklength, group)], ints=ints, addrs=addrs,
                            runs_of=lambda: typemap.tile(typemap.tile(t.runs(), blocklength, ext), count, step))

    def Create_indexed(self, blocklengths, displacements) -> "Datatype":
        self._need("Create_indexed")
        return self._indexed(COMBINER_INDEXED, blocklengths, displacements, True)

    def Create_hindexed(self, blocklengths, displacements) -> "Datatype":
        self._need("Create_hindexed")
        return self._indexed(COMBINER_HINDEXED, blocklengths, displacements, False)

    def Create_indexed_block(self, blocklength: int, displacements) -> "Datatype":
        self._need("Create_indexed_block")
        return self._indexed(COMBINER_INDEXED_BLOCK, blocklength, displacements, True)

    def Create_hindexed_block(self, blocklength: int, displacements) -> "Datatype":
        self._need("Create_hindexed_block")
        return self._indexed(COMBINER_HINDEXED_BLOCK, blocklength, displacements, False)

    def _indexed(self, combiner, blocklengths, displacements, in_extents: bool) -> "Datatype":
        t = self._t
        what = _COMBINER_NAMES[combiner].lower()
        displs = _ints(displacements, f"{what} displacements")
        block = combiner in (COMBINER_INDEXED_BLOCK, COMBINER_HINDEXED_BLOCK)
        if block:
            bl = _nonneg(blocklengths, f"{what} blocklength")
            lens = [bl] * len(displs)
        else:
            lens = [_nonneg(b, f"{what} blocklengths") for b in _ints(blocklengths, f"{what} blocklengths")]
            if len(lens) != len(displs):
                raise ValueError(f"{what}: {len(lens)} blocklengths but {len(displs)} displacements")
        ext = t.ub - t.lb
        unit = ext if in_extents else 1
        copies = [(b, _add((d * unit, d * unit), _progression(b, ext))) for b, d in zip(lens, displs)]
        n = len(displs)
        head = [n, bl] if block else [n, *lens]
        ints, addrs = (head + displs, []) if in_extents else (head, displs)

        def runs():
            return typemap.concat([typemap.place(typemap.tile(t.runs(), b, ext), [d * unit])
                                   for b, d in zip(lens, displs)])
        return self._copies(combiner, copies, ints=ints, addrs=addrs, runs_of=runs)

    def _copies(self, combiner, copies, **kw) -> "Datatype":
        """A type made of copies of this one: copies is [(how many, (dmin, dmax) or None)]."""
        t = self._t
        n = sum(c for c, g in copies if g is not None)
        span = _span(g for c, g in copies if c)
        bounds = (0, 0, 0, 0) if span is None else (
            span[0] + t.lb, span[1] + t.ub, span[0] + t.tlb, span[1] + t.tub)
        return self._derive(combiner, n * t.size, bounds, types=[self], basic=t.basic, align=t.align, **kw)

    @classmethod
    def Create_struct(cls, blocklengths, displacements, datatypes) -> "Datatype":
        lens = [_nonneg(b, "struct blocklengths") for b in _ints(blocklengths, "struct blocklengths")]
        displs = _ints(displacements, "struct displacements")
        types = list(datatypes)
        if not len(lens) == len(displs) == len(types):
            raise ValueError(f"Create_struct: {len(lens)} blocklengths, {len(displs)} displacements and "
                             f"{len(types)} datatypes: they must be as many")
        recs = []
        for x in types:
            if not isinstance(x, Datatype):
                raise TypeError(f"Create_struct: datatypes must be MPI datatypes, got {x!r}")
            recs.append(x._need("Create_struct"))
        size, lo, hi, tlo, thi, basics, align = 0, [], [], [], [], set(), 1
        for b, d, t in zip(lens, displs, recs):
            g = _add((d, d), _progression(b, t.ub - t.lb))
            if g is None:
                continue
            size += b * t.size
            lo.append(g[0] + t.lb), hi.append(g[1] + t.ub), tlo.append(g[0] + t.tlb), thi.append(g[1] + t.tub)
            if t.size:
                basics.add(t.basic)
                align = max(align, t.align)
        if lo:
            lb, ub = min(lo), max(hi)
            ub += -(ub - lb) % align  # MPI pads a struct's extent to its alignment
            bounds = (lb, ub, min(tlo), max(thi))
        else:
            bounds = (0, 0, 0, 0)
        basic = basics.pop() if len(basics) == 1 else None

        def runs():
            return typemap.concat([typemap.place(typemap.tile(t.runs(), b, t.ub - t.lb), [d])
                                   for b, d, t in zip(lens, displs, recs)])
        return cls._of(_Type(COMBINER_STRUCT, size, bounds, ints=[len(lens), *lens], addrs=displs,
                             types=recs, basic=basic, align=align, runs_of=runs))

    def Create_subarray(self, sizes, subsizes, starts, order: int = ORDER_C) -> "Datatype":
        t = self._need("Create_subarray")
        sizes, subsizes, starts = (_ints(x, f"Create_subarray {w}") for x, w in
                                   ((sizes, "sizes"), (subsizes, "subsizes"), (starts, "starts")))
        ndim = len(sizes)
        if not ndim or len(subsizes) != ndim or len(starts) != ndim:
            raise ValueError(f"Create_subarray: sizes, subsizes and starts need one entry per dimension, "
                             f"got {len(sizes)}, {len(subsizes)}, {len(starts)}")
        for n, s, st in zip(sizes, subsizes, starts):
            if n < 1 or s < 1 or s > n or st < 0 or st + s > n:
                raise _err("ERR_ARG", f"Create_subarray: subarray of {s} from {st} does not fit in {n}")
        order = _order(order, "Create_subarray")
        ext = t.ub - t.lb
        dims = list(range(ndim)) if order == ORDER_C else list(reversed(range(ndim)))
        stride = {d: ext * math.prod(sizes[e] for e in dims[dims.index(d) + 1:]) for d in dims}
        first = sum(starts[d] * stride[d] for d in dims)
        last = sum((starts[d] + subsizes[d] - 1) * stride[d] for d in dims)
        bounds = (t.lb, t.lb + ext * math.prod(sizes), first + t.tlb, last + t.tub)

        def runs():
            r = t.runs()
            for d in reversed(dims):  # innermost (fastest) dimension first
                r = typemap.tile(r, subsizes[d], stride[d])
            return typemap.place(r, [first])
        return self._derive(COMBINER_SUBARRAY, t.size * math.prod(subsizes), bounds, types=[self],
                            ints=[ndim, *sizes, *subsizes, *starts, order], basic=t.basic, align=t.align,
                            runs_of=runs)

    def Create_darray(self, size: int, rank: int, gsizes, distribs, dargs, psizes,
                      order: int = ORDER_C) -> "Datatype":
        t = self._need("Create_darray")
        gsizes, distribs, dargs, psizes = (_ints(x, f"Create_darray {w}") for x, w in
                                           ((gsizes, "gsizes"), (distribs, "distribs"), (dargs, "dargs"),
                                            (psizes, "psizes")))
        ndim = len(gsizes)
        if not len(distribs) == len(dargs) == len(psizes) == ndim:
            raise ValueError("Create_darray: gsizes, distribs, dargs and psizes need one entry per dimension")
        if math.prod(psizes) != size or not 0 <= rank < size:
            raise _err("ERR_ARG", f"Create_darray: rank {rank} of {size} processes on a {psizes} grid")
        for g, dist, darg, p in zip(gsizes, distribs, dargs, psizes):
            if dist not in (DISTRIBUTE_BLOCK, DISTRIBUTE_CYCLIC, DISTRIBUTE_NONE):
                raise _err("ERR_ARG", f"Create_darray: unknown distribution {dist}")
            if dist == DISTRIBUTE_NONE and p != 1:
                raise _err("ERR_ARG", "Create_darray: DISTRIBUTE_NONE needs 1 process in its dimension")
            if darg != DISTRIBUTE_DFLT_DARG and (darg < 1 or (dist == DISTRIBUTE_BLOCK and darg * p < g)):
                raise _err("ERR_ARG", f"Create_darray: block size {darg} cannot spread {g} over {p}")
        order = _order(order, "Create_darray")
        ext = t.ub - t.lb
        idx = typemap.darray_indices(size, rank, gsizes, distribs, dargs, psizes, order, ORDER_C,
                                     DISTRIBUTE_BLOCK, DISTRIBUTE_CYCLIC, DISTRIBUTE_NONE, DISTRIBUTE_DFLT_DARG)
        span = (int(idx.min()) * ext, int(idx.max()) * ext) if idx.size else None
        tb = (0, 0) if span is None else (span[0] + t.tlb, span[1] + t.tub)
        bounds = (t.lb, t.lb + ext * math.prod(gsizes), *tb)
        return self._derive(COMBINER_DARRAY, t.size * idx.size, bounds, types=[self],
                            ints=[size, rank, ndim, *gsizes, *distribs, *dargs, *psizes, order],
                            basic=t.basic, align=t.align, runs_of=lambda: typemap.place(t.runs(), idx * ext))

    def Create_resized(self, lb: int, extent: int) -> "Datatype":
        t = self._need("Create_resized")
        lb, extent = operator.index(lb), operator.index(extent)
        return self._derive(COMBINER_RESIZED, t.size, (lb, lb + extent, t.tlb, t.tub), types=[self],
                            addrs=[lb, extent], basic=t.basic, align=t.align, runs_of=t.runs)

    Resized = Create_resized

    @classmethod
    def Get_value_index(cls, value: "Datatype", index: "Datatype") -> "Datatype":
        """The predefined (value, index) pair type of MINLOC/MAXLOC, or DATATYPE_NULL."""
        for x in (value, index):
            if not isinstance(x, Datatype) or x._t is None:
                raise _err("ERR_TYPE", "Get_value_index: value and index must be non-null datatypes")
        if index._t is not globals()["INT"]._t:
            return DATATYPE_NULL
        for pair, code in _PAIRS.items():
            if value._t is Datatype.fromcode(code)._t:
                return globals()[pair]
        return DATATYPE_NULL

    @classmethod
    def Create_f90_integer(cls, r: int) -> "Datatype":
        size = next((n for n, digits in ((1, 2), (2, 4), (4, 9), (8, 18)) if r <= digits), None)
        if size is None:
            raise _err("ERR_ARG", f"Create_f90_integer: no integer type has {r} decimal digits")
        return _f90(COMBINER_F90_INTEGER, [r], "i", size)

    @classmethod
    def Create_f90_real(cls, p: int, r: int) -> "Datatype":
        return _f90(COMBINER_F90_REAL, [p, r], "f", _real_size(p, r, "Create_f90_real"))

    @classmethod
    def Create_f90_complex(cls, p: int, r: int) -> "Datatype":
        return _f90(COMBINER_F90_COMPLEX, [p, r], "c", 2 * _real_size(p, r, "Create_f90_complex"))

    @classmethod
    def Match_size(cls, typeclass: int, size: int) -> "Datatype":
        names = {TYPECLASS_INTEGER: "INTEGER", TYPECLASS_REAL: "REAL", TYPECLASS_COMPLEX: "COMPLEX",
                 TYPECLASS_LOGICAL: "LOGICAL"}
        if typeclass not in names:
            raise _err("ERR_ARG", f"Match_size: unknown type class {typeclass}")
        found = globals().get(f"{names[typeclass]}{size}")
        if found is None or not found:
            raise _err("ERR_ARG", f"Match_size: no {names[typeclass].lower()} type of {size} bytes")
        return found

    # ---- decoding ----

    def Get_envelope(self) -> tuple[int, int, int, int, int]:
        t = self._need("Get_envelope")
        return len(t.ints), len(t.addrs), 0, len(t.types), t.combiner

    def Get_contents(self) -> tuple[list, list, list, list]:
        t = self._need("Get_contents")
        if t.combiner == COMBINER_NAMED:
            raise _err("ERR_TYPE", "Get_contents: a named datatype has no contents")
        return list(t.ints), list(t.addrs), [], [r.const or Datatype._of(r) for r in t.types]

    envelope = property(Get_envelope)
    contents = property(Get_contents)
    combiner = property(lambda self: self._need("combiner").combiner)
    is_named = property(lambda self: self._need("is_named").combiner == COMBINER_NAMED)
    is_predefined = property(lambda self: self._t is None or self._t.combiner in _PREDEFINED)

    def decode(self) -> tuple["Datatype", str, dict]:
        """(base type, combiner name, constructor keyword arguments), as mpi4py's decode."""
        t = self._need("decode")
        c, i, a = t.combiner, t.ints, t.addrs
        name = _COMBINER_NAMES[c]
        if c == COMBINER_NAMED:
            return self, name, {}
        types = [r.const or Datatype._of(r) for r in t.types]
        base = types[0] if len(types) == 1 else DATATYPE_NULL
        if c == COMBINER_DUP:
            p = {}
        elif c == COMBINER_CONTIGUOUS:
            p = {"count": i[0]}
        elif c == COMBINER_VECTOR:
            p = {"count": i[0], "blocklength": i[1], "stride": i[2]}
        elif c == COMBINER_HVECTOR:
            p = {"count": i[0], "blocklength": i[1], "stride": a[0]}
        elif c == COMBINER_INDEXED:
            p = {"blocklengths": i[1:1 + i[0]], "displacements": i[1 + i[0]:]}
        elif c == COMBINER_HINDEXED:
            p = {"blocklengths": i[1:], "displacements": list(a)}
        elif c == COMBINER_INDEXED_BLOCK:
            p = {"blocklength": i[1], "displacements": i[2:]}
        elif c == COMBINER_HINDEXED_BLOCK:
            p = {"blocklength": i[1], "displacements": list(a)}
        elif c == COMBINER_STRUCT:
            p = {"blocklengths": i[1:], "displacements": list(a), "datatypes": types}
        elif c == COMBINER_SUBARRAY:
            n = i[0]
            p = {"sizes": i[1:1 + n], "subsizes": i[1 + n:1 + 2 * n], "starts": i[1 + 2 * n:1 + 3 * n],
                 "order": i[1 + 3 * n]}
        elif c == COMBINER_DARRAY:
            n = i[2]
            p = {"size": i[0], "rank": i[1], "gsizes": i[3:3 + n], "distribs": i[3 + n:3 + 2 * n],
                 "dargs": i[3 + 2 * n:3 + 3 * n], "psizes": i[3 + 3 * n:3 + 4 * n], "order": i[3 + 4 * n]}
        elif c == COMBINER_RESIZED:
            p = {"lb": a[0], "extent": a[1]}
        elif c == COMBINER_F90_INTEGER:
            p = {"r": i[0]}
        else:  # F90_REAL, F90_COMPLEX
            p = {"p": i[0], "r": i[1]}
        return base, name, p

    # ---- packing ----

    def Pack_size(self, count: int, comm=None) -> int:
        return _nonneg(count, "Pack_size count") * self._need("Pack_size").size

    def Pack(self, inbuf, outbuf, position: int, comm=None) -> int:
        return self._pack(inbuf, outbuf, position, "Pack", swap=False)

    def Unpack(self, inbuf, position: int, outbuf, comm=None) -> int:
        return self._unpack(inbuf, position, outbuf, "Unpack", swap=False)

    def Pack_external_size(self, datarep: str, count: int) -> int:
        _external32(datarep)
        return self.Pack_size(count)

    def Pack_external(self, datarep: str, inbuf, outbuf, position: int) -> int:
        _external32(datarep)
        return self._pack(inbuf, outbuf, position, "Pack_external", swap=True)

    def Unpack_external(self, datarep: str, inbuf, position: int, outbuf) -> int:
        _external32(datarep)
        return self._unpack(inbuf, position, outbuf, "Unpack_external", swap=True)

    def _pack(self, inbuf, outbuf, position, what, swap) -> int:
        t = self._need(what)
        src = _bytes_of(inbuf, f"{what} inbuf", writable=False)
        dst = _bytes_of(outbuf, f"{what} outbuf", writable=True)
        ext = t.ub - t.lb
        count = src.size // ext if ext > 0 else 0
        position = _nonneg(position, f"{what} position")
        data = typemap.pack(self, count, typemap.Span(src), f"{what} inbuf")
        if position + data.size > dst.size:
            raise _err("ERR_TRUNCATE", f"{what}: {data.size} bytes at position {position} do not fit in "
                       f"{dst.size} bytes")
        dst[position:position + data.size] = _big_endian(self, data, what) if swap else data
        return position + data.size

    def _unpack(self, inbuf, position, outbuf, what, swap) -> int:
        t = self._need(what)
        src = _bytes_of(inbuf, f"{what} inbuf", writable=False)
        dst = _bytes_of(outbuf, f"{what} outbuf", writable=True)
        ext = t.ub - t.lb
        count = dst.size // ext if ext > 0 else 0
        position = _nonneg(position, f"{what} position")
        n = count * t.size
        if position + n > src.size:
            raise _err("ERR_TRUNCATE", f"{what}: {count} items need {n} bytes from position {position}, "
                       f"the buffer has {src.size}")
        data = src[position:position + n]
        if swap:
            data = _big_endian(self, data, what)
        typemap.unpack(self, count, data, typemap.Span(dst), f"{what} outbuf")
        return position + n

    # ---- type codes (mpi4py's typemap: NumPy / PEP 3118 character codes) ----

    @classmethod
    def fromcode(cls, code: str) -> "Datatype":
        """The predefined datatype of a character code or type string ('i', 'f8', 'Zd'...)."""
        name = _CODES.get(code) if isinstance(code, str) else None
        if name is None or not globals()[name]:
            raise ValueError(f"cannot map code {code!r} to MPI datatype")
        return globals()[name]

    def tocode(self) -> str:
        """The character code or type string of a predefined datatype."""
        code = None if self._t is None else self._t.code
        if code is None:
            raise ValueError("cannot map to character code or type string")
        return code

    @property
    def typechar(self) -> str:
        if self._t is None:
            return ""
        return self._t.char or "V"

    @property
    def typestr(self) -> str:
        if self._t is None:
            return ""
        return self._t.str or f"V{self._t.ub - self._t.lb}"


def _recreate(base: Datatype, combiner: str, params: dict) -> Datatype:
    """A datatype rebuilt from its decode() (how derived types are pickled)."""
    return getattr(base, f"Create_{combiner.lower()}")(**params).Commit()


def _nonneg(value, what: str) -> int:
    try:
        n = operator.index(value)
    except TypeError:
        raise TypeError(f"{what} must be an int, got {value!r}") from None
    if n < 0:
        raise _err("ERR_COUNT" if "count" in what else "ERR_ARG", f"{what} must not be negative, got {n}")
    return n


def _ints(values, what: str) -> list:
    try:
        return [operator.index(v) for v in values]
    except TypeError:
        raise TypeError(f"{what} must be a sequence of ints, got {values!r}") from None


def _order(order: int, what: str) -> int:
    if order not in (ORDER_C, ORDER_F):
        raise _err("ERR_ARG", f"{what}: order must be MPI.ORDER_C or MPI.ORDER_FORTRAN, got {order}")
    return order


def _real_size(p: int, r: int, what: str) -> int:
    for size, digits, exponent in ((4, 6, 37), (8, 15, 307), (16, 18, 4931)):
        if p <= digits and r <= exponent:
            return size
    raise _err("ERR_ARG", f"{what}: no real type has precision {p} and range {r}")


def _external32(datarep) -> None:
    if not isinstance(datarep, str) or datarep != "external32":
        raise _err("ERR_UNSUPPORTED_DATAREP", f"data representation {datarep!r}: only 'external32' is supported")


def _big_endian(datatype: Datatype, data: np.ndarray, what: str) -> np.ndarray:
    """Bytes of native elements as external32 (big-endian), or back: the same swap."""
    basic = datatype._t.basic
    if basic is None:
        if datatype._t.size:
            raise _err("ERR_TYPE", f"{what}: external32 of a datatype mixing element types is not supported")
        return data
    if np.dtype(basic).byteorder in ("=", "<") and basic.itemsize > 1:
        width = basic.itemsize // 2 if basic.kind == "c" else basic.itemsize  # complex: each part
        return data.reshape(-1, width)[:, ::-1].reshape(-1).copy() if data.size else data
    return data


def _bytes_of(buf, what: str, writable: bool) -> np.ndarray:
    """A buffer argument's memory as a 1-D uint8 array (a view)."""
    from .buffers import to_numpy
    if isinstance(buf, (list, tuple)):
        buf = buf[0]
    arr, _ = to_numpy(buf, what)
    if writable and not arr.flags.writeable:
        raise ValueError(f"{what} is read-only")
    if not (arr.flags.c_contiguous or arr.flags.f_contiguous):
        raise ValueError(f"{what} must be contiguous")
    return arr.reshape(-1, order="A").view(np.uint8) if arr.size else np.zeros(0, dtype=np.uint8)


# ---- predefined datatypes ----

_INT_CHAR = {1: "b", 2: "h", 4: "i", 8: "l"}
_KIND_CHAR = {"i": _INT_CHAR, "u": {k: v.upper() for k, v in _INT_CHAR.items()}, "f": {2: "e", 4: "f", 8: "d", 16: "g"},
              "c": {8: "F", 16: "D", 32: "G"}, "b": {1: "?", 2: "h", 4: "i", 8: "l"}}


def _codes_of(dtype: np.dtype) -> tuple:
    """(char, typestr) as mpi4py derives them from a NumPy dtype."""
    k = dtype.kind
    if k == "S":
        return "c", "S1"
    if k == "U":
        return "U", "U1"
    if k == "b":
        return "?", "b1"
    return dtype.char, f"{k}{dtype.itemsize}"


def _named(label: str, dtype, code: str = "char", char: Optional[str] = None, str_: Optional[str] = None) -> _Type:
    """A predefined type of a NumPy dtype; code says what tocode() gives: its char or typestr."""
    dtype = np.dtype(dtype)
    c, s = _codes_of(dtype)
    char, s = char or c, str_ or s
    basic = dtype if dtype.fields is None else None
    return _Type(COMBINER_NAMED, dtype.itemsize, (0, dtype.itemsize, 0, dtype.itemsize), label=label, dtype=dtype,
                 basic=basic, align=dtype.alignment, char=char, str_=s, code=char if code == "char" else s,
                 runs_of=lambda: _pair_runs(dtype))


def _pair_runs(dtype: np.dtype) -> tuple:
    if dtype.fields is None:
        return typemap.merge([0], [dtype.itemsize])
    fields = sorted(dtype.fields.values(), key=lambda f: f[1])
    return typemap.merge([f[1] for f in fields], [f[0].itemsize for f in fields])


def _f90(combiner: int, ints: list, kind: str, size: int) -> Datatype:
    dtype = np.dtype(f"{kind}{size}")
    char, s = _KIND_CHAR[kind][size], f"{kind}{size}"
    t = _Type(combiner, size, (0, size, 0, size), ints=ints, dtype=dtype, basic=dtype, align=dtype.alignment,
              char=char, str_=s, code=s, runs_of=lambda: typemap.merge([0], [size]))
    return Datatype._of(t)


# name, MPI name, NumPy dtype, and what tocode() gives ("char" or "str")
_TABLE = [
    ("CHAR", "S1", "char"), ("WCHAR", "U1", "char"), ("SIGNED_CHAR", "b", "char"),
    ("SHORT", "h", "char"), ("INT", "i", "char"), ("LONG", "l", "char"), ("LONG_LONG", "q", "char"),
    ("UNSIGNED_CHAR", "B", "char"), ("UNSIGNED_SHORT", "H", "char"), ("UNSIGNED", "I", "char"),
    ("UNSIGNED_LONG", "L", "char"), ("UNSIGNED_LONG_LONG", "Q", "char"),
    ("FLOAT", "f", "char"), ("DOUBLE", "d", "char"), ("LONG_DOUBLE", "g", "char"),
    ("C_BOOL", "?", "str"), ("INT8_T", "i1", "str"), ("INT16_T", "i2", "str"), ("INT32_T", "i4", "str"),
    ("INT64_T", "i8", "str"), ("UINT8_T", "u1", "str"), ("UINT16_T", "u2", "str"), ("UINT32_T", "u4", "str"),
    ("UINT64_T", "u8", "str"), ("FLOAT16_T", "e", "char"),
    ("C_COMPLEX", "F", "char"), ("C_FLOAT_COMPLEX", "F", "char"), ("C_DOUBLE_COMPLEX", "D", "char"),
    ("C_LONG_DOUBLE_COMPLEX", "G", "char"), ("CXX_BOOL", "?", "char"), ("CXX_FLOAT_COMPLEX", "F", "char"),
    ("CXX_DOUBLE_COMPLEX", "D", "char"), ("CXX_LONG_DOUBLE_COMPLEX", "G", "char"),
    ("CHARACTER", "S1", "char"), ("LOGICAL", "i4", "char"), ("INTEGER", "i4", "char"), ("REAL", "f4", "char"),
    ("DOUBLE_PRECISION", "f8", "char"), ("COMPLEX", "c8", "char"), ("DOUBLE_COMPLEX", "c16", "char"),
    ("LOGICAL1", "?", "str"), ("LOGICAL2", "i2", "str"), ("LOGICAL4", "i4", "str"), ("LOGICAL8", "i8", "str"),
    ("INTEGER1", "i1", "str"), ("INTEGER2", "i2", "str"), ("INTEGER4", "i4", "str"), ("INTEGER8", "i8", "str"),
    ("REAL2", "f2", "str"), ("REAL4", "f4", "str"), ("REAL8", "f8", "str"), ("REAL16", "g", "str"),
    ("COMPLEX8", "c8", "str"), ("COMPLEX16", "c16", "str"), ("COMPLEX32", "G", "str"),
    ("PACKED", "B", "char"), ("BYTE", "B", "char"), ("AINT", "p", "char"), ("OFFSET", "p", "char"),
    ("COUNT", "p", "char"),
]
# Fortran LOGICALn hold integers (typestr "i2"...), but LOGICAL1 is a bool
_STR = {"LOGICAL2": "i2", "LOGICAL4": "i4", "LOGICAL8": "i8", "REAL16": "f16", "COMPLEX32": "c32"}
# types with no NumPy counterpart here: DATATYPE_NULL, as in an MPI built without them
_ABSENT = ["FLOAT32_T", "FLOAT64_T", "BFLOAT16_T", "LOGICAL16", "INTEGER16", "COMPLEX4"]
# (value, int) pairs of MINLOC/MAXLOC: C structs, padded as a C compiler pads them
_PAIRS = {"SHORT_INT": "h", "INT_INT": "i", "LONG_INT": "l", "FLOAT_INT": "f", "DOUBLE_INT": "d",
          "LONG_DOUBLE_INT": "g"}

for _name, _code, _what in _TABLE:
    _d = np.dtype(_code)
    _t = _named(f"MPI_{_name}", _d, _what, str_=_STR.get(_name))
    globals()[_name] = _t.const = Datatype._of(_t, _name)
for _name, _code in _PAIRS.items():
    globals()[_name] = Datatype._of(_named(f"MPI_{_name}" if _name != "INT_INT" else "MPI_2INT",
                                           np.dtype(f"{_code},i", align=True)), _name)
    _t = globals()[_name]._t
    _t.char = _t.str = _t.code = None
    _t.const = globals()[_name]
for _name in _ABSENT:
    globals()[_name] = Datatype._of(None, _name)
TWOINT = INT_INT  # noqa: F821 - made above
BOOL = C_BOOL  # noqa: F821 - collie's name for it
UNSIGNED_INT = UNSIGNED  # noqa: F821
DATATYPE_NULL = Datatype._of(None, "DATATYPE_NULL")
del _name, _code, _what, _d, _t


_NAMES = [n for n, _, _ in _TABLE] + list(_PAIRS)

# code -> the name of its datatype (mpi4py's TypeDict, as it comes out on 64-bit Linux)
_CODES = {"?": "C_BOOL", "b": "SIGNED_CHAR", "h": "SHORT", "i": "INT", "l": "LONG", "q": "LONG_LONG",
          "B": "UNSIGNED_CHAR", "H": "UNSIGNED_SHORT", "I": "UNSIGNED", "L": "UNSIGNED_LONG",
          "Q": "UNSIGNED_LONG_LONG", "e": "FLOAT16_T", "f": "FLOAT", "d": "DOUBLE", "g": "LONG_DOUBLE",
          "F": "C_FLOAT_COMPLEX", "D": "C_DOUBLE_COMPLEX", "G": "C_LONG_DOUBLE_COMPLEX",
          "Zf": "C_FLOAT_COMPLEX", "Zd": "C_DOUBLE_COMPLEX", "Zg": "C_LONG_DOUBLE_COMPLEX",
          "i1": "INT8_T", "i2": "INT16_T", "i4": "INT32_T", "i8": "INT64_T",
          "u1": "UINT8_T", "u2": "UINT16_T", "u4": "UINT32_T", "u8": "UINT64_T",
          "f2": "FLOAT16_T", "f4": "FLOAT", "f8": "DOUBLE", "c8": "C_FLOAT_COMPLEX", "c16": "C_DOUBLE_COMPLEX",
          "b1": "C_BOOL", "n": "COUNT", "N": "UNSIGNED_LONG", "p": "AINT", "P": "UNSIGNED_LONG",
          "c": "CHAR", "a": "CHAR", "S": "CHAR", "S1": "CHAR", "s": "CHAR", "1s": "CHAR",
          "U": "WCHAR", "U1": "WCHAR", "u": "UINT16_T", "1u": "UINT16_T", "w": "WCHAR", "1w": "WCHAR",
          "M": "INT64_T", "M8": "INT64_T", "m": "INT64_T", "m8": "INT64_T"}
if np.dtype("g").itemsize in (12, 16) and np.dtype("g") != np.dtype("d"):
    _CODES[f"f{np.dtype('g').itemsize}"] = "LONG_DOUBLE"
    _CODES[f"c{np.dtype('G').itemsize}"] = "C_LONG_DOUBLE_COMPLEX"


def _typecode(datatype: Datatype) -> Optional[str]:
    """mpi4py's MPI._typecode: the code of a predefined type (None: none)."""
    t = datatype._t
    return None if t is None else t.code


def _typealign(datatype: Datatype) -> Optional[int]:
    """mpi4py's MPI._typealign: the alignment of a predefined type."""
    t = datatype._t
    return None if t is None or t.combiner not in _PREDEFINED else t.align


def _datatype_for(dtype) -> Datatype:
    """The predefined datatype of a NumPy dtype (a new one named after it when none)."""
    dtype = np.dtype(dtype)
    for name in _NAMES:
        d = globals()[name]
        if d._t.dtype == dtype:
            return d
    return Datatype._of(_named(str(dtype), dtype))


def _as_dtype(datatype) -> np.dtype:
    """The NumPy dtype a buffer is read as: a derived type reads as opaque
    items of its size (bytes moved as they are packed)."""
    if isinstance(datatype, str):  # a type code, as mpi4py reads it
        if datatype not in _CODES or not globals()[_CODES[datatype]]:
            raise KeyError(f"cannot map {datatype!r} to MPI datatype")
        datatype = globals()[_CODES[datatype]]
    if isinstance(datatype, Datatype):
        t = datatype._need("use")
        return t.dtype if t.dtype is not None else np.dtype(f"V{t.size}")
    try:
        return np.dtype(datatype)
    except TypeError:
        raise TypeError(f"expected an MPI datatype (MPI.DOUBLE...) or a NumPy dtype, got {datatype!r}") from None


def _is_derived(datatype) -> bool:
    """Whether a buffer of this datatype must be packed to be sent (its
    bytes are not simply its items one after another)."""
    return isinstance(datatype, Datatype) and datatype._t is not None and datatype._t.dtype is None


def _is_datatype(x) -> bool:
    return isinstance(x, (Datatype, np.dtype, str)) or (
        isinstance(x, type) and issubclass(x, (np.generic, int, float, complex)))


__all__ = ["Datatype", "DATATYPE_NULL", "_typecode", "_typealign", "TWOINT", "BOOL", "UNSIGNED_INT", *_NAMES, *_ABSENT]
