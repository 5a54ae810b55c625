"""Registered buffers: arrays the ranks of a host read from each other directly.

A plain NumPy array is private to its process: a peer on the host reaches
it by process_vm_readv (single copy), which pins and copies it a page at a
time, or the bytes go through the shared rings, two copies. An array made
by ``collie.empty`` lies in a memfd of its own instead, registered with the
compiled core (_core.c's SharedMemory). A message of 64 KiB or more from
it goes single copy: the reader maps the memfd (once: it keeps the
mapping) and reads or combines the bytes straight from it, at the speed
of the memory, one copy where the rings take two; a writer helping such
a reader (the shared copy and the shared combining of shm.py) writes
into the reader's mapping the same way. That is what NCCL's
registered buffers and MPI_Alloc_mem are for. On the test VM a 2-rank
all_reduce of 64 MiB took half the time from such arrays, a reduce of 1
MiB a quarter (docs/performance.md, "Registered buffers").

Use one as any array: views and slices of it are registered too, and
``torch.from_numpy(collie.empty(...))`` is a tensor on the same memory.
The memory goes back when the array and every view of it are gone (a peer
that mapped it keeps at most a few such mappings, _core.c's MAX_VIEWS).
Being shared memory, a process forked after it was made shares it with
its parent rather than getting a copy. Where the core is not built it is
a plain array; where a peer cannot open the memfd, messages move as they
would from any array.
"""

from __future__ import annotations

import numpy as np

from . import core


def empty(shape, dtype=np.float32) -> np.ndarray:
    """A new array of ``shape`` and ``dtype``, uninitialised like np.empty,
    whose memory peers on this host can map (see the module's docstring)."""
    dtype = np.dtype(dtype)
    shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(int(d) for d in shape)
    if any(d < 0 for d in shape):
        raise ValueError(f"collie.empty: negative dimensions are not allowed: {shape}")
    count = int(np.prod(shape, dtype=np.int64))
    if count == 0 or core._core is None:
        return np.empty(shape, dtype)  # nothing to share, or no core to share it
    memory = core._core.SharedMemory(count * dtype.itemsize)
    return np.frombuffer(memory, dtype, count).reshape(shape)
