"""Collectives on picklable objects, including objects over 2 GiB."""

import numpy as np
import pytest

from harness import run_ranks

pytestmark = pytest.mark.timeout(120)


def _objects_body(rank, size):
    import collie
    out = {}
    objs = [{"from": 0}, [1, 2, 3], None] if rank == 0 else [None, None, None]
    collie.broadcast_object_list(objs, src=0)
    out["broadcast"] = objs
    got = [None] * size
    collie.all_gather_object(got, ("rank", rank, "x" * rank * 1000))
    out["all_gather"] = [(g[0], g[1], len(g[2])) for g in got]
    gathered = [None] * size if rank == size - 1 else None
    collie.gather_object({"r": rank}, gathered, dst=size - 1)
    out["gather"] = gathered
    mine = [None]
    collie.scatter_object_list(mine, [f"for {r}" * (r + 1) for r in range(size)] if rank == 1 else None, src=1)
    out["scatter"] = mine[0]
    return out


def test_object_collectives():
    res = run_ranks(_objects_body, 3)
    for rank, out in enumerate(res):
        assert out["broadcast"] == [{"from": 0}, [1, 2, 3], None]
        assert out["all_gather"] == [("rank", r, r * 1000) for r in range(3)]
        assert out["gather"] == ([{"r": r} for r in range(3)] if rank == 2 else None)
        assert out["scatter"] == f"for {rank}" * (rank + 1)


def _huge_body(rank, size):
    import collie
    n = (2 << 30) + 12345                       # over 2 GiB: past every 32-bit count
    objs = [np.full(n, 7, dtype=np.uint8)] if rank == 0 else [None]
    collie.broadcast_object_list(objs, src=0)
    arr = objs[0]
    return arr.nbytes, int(arr[0]), int(arr[-1]), int(arr[n // 2])


def test_broadcast_object_over_2_gib():
    import os
    if os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") < 14 << 30:
        pytest.fail("needs 14 GiB of free memory for two ranks each holding a 2 GiB object twice")
    n = (2 << 30) + 12345
    assert run_ranks(_huge_body, 2, backend="shm", timeout=110) == [(n, 7, 7, 7)] * 2
