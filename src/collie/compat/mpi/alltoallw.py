"""Alltoallw-style buffer specs: one count, byte displacement and datatype
per peer, ``[buf, (counts, displs), datatypes]`` or ``[buf, counts, displs,
datatypes]``; ``buf`` may be MPI.BOTTOM, the displacements then being
absolute addresses (MPI.Get_address)."""

from __future__ import annotations

import numpy as np

from ...arrays import ReadOnlyError
from .buffers import _count, to_numpy
from .constants import BOTTOM
from . import typemap
from .datatype import _as_dtype, _is_derived

__all__ = []


def _wspec(spec, n: int, what: str, writable: bool):
    """The n blocks of an Alltoallw spec as byte views, and what to run
    once they were received into (a copy-back when the buffer was copied,
    the unpacking of derived datatypes)."""
    if not isinstance(spec, (list, tuple)) or len(spec) not in (2, 3, 4):
        raise ValueError(f"{what}: expected [buf, (counts, displs), datatypes], got {spec!r}")
    if len(spec) == 2:
        (buf, types), counts, displs = spec, None, None
    elif len(spec) == 3:
        buf, (counts, displs), types = spec
    else:
        buf, counts, displs, types = spec
    if buf is BOTTOM and (counts is None or displs is None):
        raise ValueError(f"{what}: a buffer at MPI.BOTTOM needs counts and displacements")
    if counts is None and displs is None:  # one item per peer, at the buffer's start (mpi4py's default)
        counts, displs = [1] * n, [0] * n
    elif counts is None or displs is None:
        raise ValueError(f"{what}: give both counts and displacements, or neither")
    counts = [_count(c, f"{what} counts") for c in counts]
    displs = [int(d) for d in displs]
    types = list(types) if isinstance(types, (list, tuple)) else [types] * n
    if not len(counts) == len(displs) == len(types) == n:
        raise ValueError(f"{what}: counts, displs and datatypes need {n} entries each, got "
                         f"{len(counts)}, {len(displs)}, {len(types)}")
    sizes = [c * _as_dtype(t).itemsize if c else 0 for c, t in zip(counts, types)]
    if buf is None:
        if any(sizes):
            raise ValueError(f"{what}: a None buffer cannot hold {sum(sizes)} bytes")
        return [memoryview(np.zeros(0, dtype=np.uint8))] * n, None
    copy_back = raw = None
    if buf is not BOTTOM:
        arr, _ = to_numpy(buf, what)
        if writable and not arr.flags.writeable:
            raise ReadOnlyError(f"{what} is read-only, but it receives data")
        if arr.flags.c_contiguous:
            raw = arr.reshape(-1).view(np.uint8) if arr.size else np.zeros(0, dtype=np.uint8)
        else:
            raw = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
            if writable:
                def copy_back():
                    np.copyto(arr, raw.view(arr.dtype).reshape(arr.shape))
    out, unpacks = [], []
    for c, d, s, t in zip(counts, displs, sizes, types):
        if _is_derived(t) and c:
            span = typemap.Span(raw, d)
            packed = typemap.pack(t, c, span, what)
            out.append(memoryview(packed))
            if writable:
                unpacks.append(lambda t=t, c=c, packed=packed, span=span: typemap.unpack(t, c, packed, span, what))
        elif raw is None:
            if s and d <= 0:
                raise ValueError(f"{what}: {s} bytes at address {d}: not an address")
            out.append(memoryview(typemap.raw(d, s)))
        else:
            if s and (d < 0 or d + s > raw.size):
                raise ValueError(f"{what}: {s} bytes at byte {d} are past the end ({raw.size} bytes)")
            out.append(memoryview(raw[d:d + s]))
    if not unpacks:
        return out, copy_back

    def finish():
        for unpack in unpacks:
            unpack()
        if copy_back is not None:
            copy_back()
    return out, finish
