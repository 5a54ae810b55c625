"""What mpi4py.util.pkl5 and mpi4py's object collectives ask of a
communicator: a lock per (communicator, purpose), and a private duplicate
with a fresh tag per collective call (so that point-to-point messages of a
collective built from Send/Recv never mix with the application's).

Both are kept per collie group, so copies of one communicator share them,
and both go when the group does.
"""

from __future__ import annotations

import threading
import weakref
from typing import Hashable

from .constants import _TAG_UB

__all__ = ["_comm_lock", "_comm_lock_table", "_commctx_intra", "_commctx_inter"]

_guard = threading.Lock()
_locks: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()     # group -> {key: Lock}
_contexts: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # group -> _Context


class _Context:
    """A communicator's private duplicate, its local communicator (for an
    intercommunicator) and the tag of the next collective call."""

    def __init__(self, dup):
        self.dup, self.local, self.low_group, self.tag = dup, None, False, 0

    def next_tag(self) -> int:
        tag = self.tag
        self.tag = 0 if tag + 1 >= _TAG_UB else tag + 1
        return tag


def _comm_lock_table(comm) -> dict:
    """The locks of ``comm``, by key (mpi4py's internal lock table)."""
    g = comm._group
    table = None if g is None else _locks.get(g)  # made once: object bcasts take this on every call
    if table is None:
        g = comm._g("_comm_lock_table")
        with _guard:
            table = _locks.setdefault(g, {})
    return table


def _comm_lock(comm, key: Hashable = None) -> threading.Lock:
    """The lock of ``comm`` for ``key``, made on first use."""
    table = _comm_lock_table(comm)
    lock = table.get(key)
    if lock is None:
        with _guard:
            lock = table.setdefault(key, threading.Lock())
    return lock


def _context(comm) -> _Context:
    g = comm._g("_commctx")
    with _comm_lock(comm, "@commctx"):
        ctx = _contexts.get(g)
        if ctx is None:
            ctx = _contexts[g] = _Context(comm.Dup())  # collective: every rank makes its context together
        return ctx


def _commctx_intra(comm) -> tuple:
    """(private duplicate of ``comm``, tag for this collective call)."""
    ctx = _context(comm)
    return ctx.dup, ctx.next_tag()


def _commctx_inter(comm) -> tuple:
    """(private duplicate, tag, local intracommunicator, whether this side is
    the low group) of an intercommunicator."""
    ctx = _context(comm)
    if ctx.local is None:
        local_size, remote_size = comm.Get_size(), comm.Get_remote_size()
        merged = comm.Merge(local_size > remote_size)
        if local_size != remote_size:
            ctx.low_group = local_size < remote_size
        else:
            ctx.low_group = merged.Get_rank() < local_size
        ctx.local = merged.Create(comm.Get_group())
        merged.Free()
    return ctx.dup, ctx.next_tag(), ctx.local, ctx.low_group
