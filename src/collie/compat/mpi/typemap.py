"""Type maps of MPI datatypes, as byte runs, and the moving of data by them.

A datatype's map is kept as *runs*: (byte offset, byte length) pairs of one
item, in the order MPI packs them, adjacent runs merged. Runs are computed
only when data moves (never when a type is built: a contiguous type of 2**31
bytes is one run, but a map of 2**31 entries would not fit in memory). Items
``i = 0..n-1`` of a message sit at ``i * extent`` from the buffer's origin.
"""

from __future__ import annotations

import ctypes
import math

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ...arrays import ReadOnlyError

__all__ = []

_EMPTY = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))


def merge(offs, lens) -> tuple:
    """Runs with the empty ones dropped and touching neighbours joined."""
    offs, lens = np.asarray(offs, dtype=np.int64), np.asarray(lens, dtype=np.int64)
    keep = lens > 0
    offs, lens = offs[keep], lens[keep]
    if offs.size < 2:
        return offs, lens
    start = np.ones(offs.size, dtype=bool)
    start[1:] = offs[1:] != offs[:-1] + lens[:-1]
    group = np.cumsum(start) - 1
    return offs[start], np.bincount(group, weights=lens).astype(np.int64)


def tile(runs: tuple, n: int, step: int) -> tuple:
    """n copies of runs at 0, step, 2*step..."""
    offs, lens = runs
    if n <= 0 or offs.size == 0:
        return _EMPTY
    if offs.size == 1 and lens[0] == step:  # copies that touch: one run
        return offs.copy(), np.array([n * step], dtype=np.int64)
    return place(runs, np.arange(n, dtype=np.int64) * step)


def place(runs: tuple, displs) -> tuple:
    """Copies of runs at the given byte displacements, in that order."""
    offs, lens = runs
    displs = np.asarray(displs, dtype=np.int64)
    if displs.size == 0 or offs.size == 0:
        return _EMPTY
    return merge((displs[:, None] + offs[None, :]).ravel(), np.broadcast_to(lens, (displs.size, lens.size)).ravel())


def concat(parts: list) -> tuple:
    parts = [p for p in parts if p[0].size]
    if not parts:
        return _EMPTY
    return merge(np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]))


def raw(addr: int, nbytes: int) -> np.ndarray:
    """The nbytes of memory at an absolute address, as a writable array."""
    if nbytes <= 0:
        return np.zeros(0, dtype=np.uint8)
    return np.frombuffer((ctypes.c_char * nbytes).from_address(addr), dtype=np.uint8)


class Span:
    """Where a message's items live: ``mem`` (bytes) holds the item origin
    at byte ``origin``; an absolute-address message (MPI.BOTTOM) has no
    array, its bytes are reached by address once their extent is known."""

    def __init__(self, mem, origin: int = 0):
        self.mem, self.origin = mem, origin

    def window(self, lo: int, hi: int, what: str) -> tuple:
        """Memory holding the bytes [lo, hi) relative to the origin, and the
        index in it of the origin (offset o is at index shift + o)."""
        if self.mem is None:  # MPI.BOTTOM: origin + offsets are addresses
            if self.origin + lo <= 0 and hi > lo:
                raise ValueError(f"{what}: address {self.origin + lo} is not a valid address")
            return raw(self.origin + lo, hi - lo), -lo
        lo_i, hi_i = self.origin + lo, self.origin + hi
        if hi > lo and (lo_i < 0 or hi_i > self.mem.size):
            raise ValueError(f"{what}: the datatype reaches bytes [{lo_i}, {hi_i}) of a "
                             f"{self.mem.size}-byte buffer")
        return self.mem, lo_i - lo if hi > lo else 0


def _views(t, n: int, span: Span, what: str) -> tuple:
    """(packed 2-D view getter): the memory of n items of t, run by run."""
    offs, lens = t._runs()
    ext = t._ext()
    if n == 0 or offs.size == 0:
        return None, offs, lens, ext, 0
    first, last = int(offs.min()), int((offs + lens).max())
    lo = first + min(0, (n - 1) * ext)
    hi = last + max(0, (n - 1) * ext)
    mem, shift = span.window(lo, hi, what)
    return mem, offs, lens, ext, shift


def _gather_index(offs, lens, ext: int, n: int, shift: int) -> np.ndarray:
    """Byte indices of n items, in pack order."""
    total = int(lens.sum())
    starts = np.repeat(offs - np.concatenate(([0], np.cumsum(lens)[:-1])), lens)
    one = starts + np.arange(total, dtype=np.int64)
    return ((np.arange(n, dtype=np.int64) * ext + shift)[:, None] + one[None, :]).ravel()


_FEW_RUNS = 32


def pack(t, n: int, span: Span, what: str) -> np.ndarray:
    """n items of datatype t from span, as contiguous bytes."""
    size = t._size()
    out = np.empty(n * size, dtype=np.uint8)
    mem, offs, lens, ext, shift = _views(t, n, span, what)
    if mem is None:
        return out
    if offs.size == 1 and lens[0] == ext:  # items that touch: one slice
        start = shift + int(offs[0])
        out[:] = mem[start:start + n * size]
    elif offs.size <= _FEW_RUNS:
        out2 = out.reshape(n, size)
        at = 0
        for o, ln in zip(offs.tolist(), lens.tolist()):
            src = as_strided(mem[shift + o:], shape=(n, ln), strides=(ext, 1), writeable=False)
            out2[:, at:at + ln] = src
            at += ln
    else:
        out[:] = mem[_gather_index(offs, lens, ext, n, shift)]
    return out


def unpack(t, n: int, data: np.ndarray, span: Span, what: str) -> None:
    """Write n items of datatype t from contiguous bytes ``data`` into span."""
    size = t._size()
    mem, offs, lens, ext, shift = _views(t, n, span, what)
    if mem is None:
        return
    if not mem.flags.writeable:
        raise ReadOnlyError(f"{what} is read-only, but it receives data")
    if offs.size == 1 and lens[0] == ext:  # items that touch: one slice
        start = shift + int(offs[0])
        mem[start:start + n * size] = data[:n * size]
    elif offs.size <= _FEW_RUNS:
        data2 = data[:n * size].reshape(n, size)
        at = 0
        for o, ln in zip(offs.tolist(), lens.tolist()):
            dst = as_strided(mem[shift + o:], shape=(n, ln), strides=(ext, 1))
            dst[...] = data2[:, at:at + ln]
            at += ln
    else:
        mem[_gather_index(offs, lens, ext, n, shift)] = data[:n * size]


def fit(t, nbytes: int) -> int:
    """How many items of t a buffer of nbytes holds, from its start."""
    size, ext = t._size(), t._ext()
    tlb, tub = t._true_bounds()
    if size == 0:
        return 0
    if tlb < 0 or tub > nbytes:
        return 0
    if ext > 0:
        return (nbytes - tub) // ext + 1
    if ext < 0:
        return tlb // (-ext) + 1
    return 1


def darray_indices(size: int, rank: int, gsizes, distribs, dargs, psizes, order: int, order_c: int,
                   block: int, cyclic: int, none: int, dflt: int) -> np.ndarray:
    """The element indices (in the global array, in memory order) that
    process ``rank`` of a ``psizes`` grid owns under MPI_Type_create_darray."""
    coords, r = [], rank
    for p in reversed(psizes):
        coords.append(r % p)
        r //= p
    coords.reverse()
    owned = []
    for g, dist, darg, p, c in zip(gsizes, distribs, dargs, psizes, coords):
        idx = np.arange(g, dtype=np.int64)
        if dist == none:
            owned.append(idx)
        elif dist == block:
            b = -(-g // p) if darg == dflt else darg
            owned.append(idx[(idx // b) == c])
        else:  # cyclic
            b = 1 if darg == dflt else darg
            owned.append(idx[(idx // b) % p == c])
    ndim = len(gsizes)
    if order == order_c:
        strides = [math.prod(gsizes[i + 1:]) for i in range(ndim)]
    else:
        strides = [math.prod(gsizes[:i]) for i in range(ndim)]
    disp = np.zeros((1,) * ndim, dtype=np.int64)
    for i in range(ndim):
        shape = [1] * ndim
        shape[i] = -1
        disp = disp + owned[i].reshape(shape) * strides[i]
    return disp.ravel(order="C" if order == order_c else "F")  # memory order
