"""COLLIE_BIND=core: each rank of a host keeps to its own share of the
host's cores.

Why: ranks that wait sleep (after a short spin), and when the kernel wakes
a sleeper it may place it on the core of the rank that woke it, which then
holds two ranks while another core idles, until load balancing moves one
(tens of milliseconds). On a machine shared with other work (the bench's
--hog) that turned runs of 8-byte all_reduces from 5 us into 0.4-2 ms per
call; pinned ranks stay where they are. It is off by default, as in MPICH:
a rank pinned to one core also confines its compute threads (torch's,
NumPy's BLAS) to it, so each rank gets an equal slice of the cores this
process may use (os.sched_getaffinity), and with more ranks than cores
nobody is pinned.
"""

from __future__ import annotations

import os
from typing import Optional, Sequence

MODES = ("none", "core")


def mode(environ=os.environ) -> str:
    """COLLIE_BIND's value, checked ("none" when unset)."""
    value = environ.get("COLLIE_BIND", "").strip().lower() or "none"
    if value not in MODES:
        raise ValueError(f"COLLIE_BIND must be one of {', '.join(MODES)}, not {environ.get('COLLIE_BIND')!r}")
    return value


def share(index: int, count: int, cores: Sequence[int]) -> Optional[list]:
    """The cores of local rank ``index`` of ``count``: an equal, disjoint
    slice of ``cores`` (None when there are fewer cores than ranks)."""
    cores = sorted(cores)
    per = len(cores) // count if count else 0
    if per < 1:
        return None
    return cores[index * per:(index + 1) * per]


def bind(index: int, count: int) -> Optional[list]:
    """Pin every thread of this process to its share (see share); the cores,
    or None when it stays unpinned."""
    mine = share(index, count, os.sched_getaffinity(0))
    if mine is None:
        return None
    for tid in os.listdir("/proc/self/task"):  # threads made before now too
        try:
            os.sched_setaffinity(int(tid), mine)
        except (ProcessLookupError, PermissionError):
            pass  # a thread that ended meanwhile
    return mine


def bind_rank(rank: int, hosts: Sequence[str]) -> Optional[list]:
    """Under COLLIE_BIND=core, pin this rank among the ranks of its host."""
    if mode() != "core":
        return None
    local = [r for r in range(len(hosts)) if hosts[r] == hosts[rank]]
    return bind(local.index(rank), len(local))
