"""Alltoallw-style buffer specs: one count, byte displacement and datatype
per peer, ``[buf, (counts, displs), datatypes]`` or ``[buf, counts, displs,
datatypes]``; ``buf`` may be MPI.BOTTOM, the displacements then being
absolute addresses (MPI.Get_address)."""

from __future__ import annotations

import ctypes

import numpy as np

from .buffers import _count, to_numpy
from .constants import BOTTOM
from .datatype import _as_dtype

__all__ = []


def _raw(addr: int, nbytes: int) -> np.ndarray:
    if nbytes == 0:
        return np.zeros(0, dtype=np.uint8)
    return np.frombuffer((ctypes.c_char * nbytes).from_address(addr), dtype=np.uint8)


def _wspec(spec, n: int, what: str, writable: bool):
    """The n blocks of an Alltoallw spec as byte views, and what to run
    once they were received into (a copy-back when the buffer was copied)."""
    if not isinstance(spec, (list, tuple)) or len(spec) not in (3, 4):
        raise ValueError(f"{what}: expected [buf, (counts, displs), datatypes], got {spec!r}")
    if len(spec) == 3:
        buf, (counts, displs), types = spec
    else:
        buf, counts, displs, types = spec
    counts = [_count(c, f"{what} counts") for c in counts]
    displs = [int(d) for d in displs]
    types = list(types) if isinstance(types, (list, tuple)) else [types] * n
    if not len(counts) == len(displs) == len(types) == n:
        raise ValueError(f"{what}: counts, displs and datatypes need {n} entries each, got "
                         f"{len(counts)}, {len(displs)}, {len(types)}")
    sizes = [c * _as_dtype(t).itemsize if c else 0 for c, t in zip(counts, types)]
    finish = None
    if buf is BOTTOM:
        return [memoryview(_raw(d, s)) for d, s in zip(displs, sizes)], finish
    if buf is None:
        if any(sizes):
            raise ValueError(f"{what}: a None buffer cannot hold {sum(sizes)} bytes")
        return [memoryview(np.zeros(0, dtype=np.uint8))] * n, finish
    arr, _ = to_numpy(buf, what)
    if writable and not arr.flags.writeable:
        raise ValueError(f"{what} is read-only, but it receives data")
    if arr.flags.c_contiguous:
        raw = arr.reshape(-1).view(np.uint8)
    else:
        raw = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
        if writable:
            def finish():
                np.copyto(arr, raw.view(arr.dtype).reshape(arr.shape))
    out = []
    for d, s in zip(displs, sizes):
        if s and (d < 0 or d + s > raw.size):
            raise ValueError(f"{what}: {s} bytes at byte {d} are past the end ({raw.size} bytes)")
        out.append(memoryview(raw[d:d + s]))
    return out, finish
