"""MPI.Win (one-sided communication) on real ranks, against NumPy references.

Every window flavour (Create over a user buffer, Allocate, Allocate_shared,
Create_dynamic) under fence, lock and PSCW synchronisation; passive target
while the target computes and never calls MPI; atomicity of accumulates
under contention; a dead peer raising instead of hanging; bad arguments
raising MPI errors that name what is wrong; nothing left behind by Free.
"""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

from harness import run_ranks

pytestmark = pytest.mark.timeout(180)

FLAVORS = ["create", "allocate", "shared", "dynamic"]


def mpi():
    from collie.compat import mpi as MPI
    return MPI


def run(body, n, *args, **kw):
    return run_ranks(body, n, *args, timeout=120, **kw)


def _window(MPI, comm, flavor: str, n: int, dtype=np.int64):
    """A window of n elements of dtype per rank (zeroed), the array that is
    this rank's window memory, and how to address element 0 of each rank."""
    itemsize = np.dtype(dtype).itemsize
    if flavor == "create":
        local = np.zeros(n, dtype)
        win = MPI.Win.Create(local, itemsize, MPI.INFO_NULL, comm)
    elif flavor == "dynamic":
        local = np.zeros(n, dtype)
        win = MPI.Win.Create_dynamic(MPI.INFO_NULL, comm)
        win.Attach(local)
    else:
        make = MPI.Win.Allocate if flavor == "allocate" else MPI.Win.Allocate_shared
        win = make(n * itemsize, itemsize, MPI.INFO_NULL, comm)
        local = np.frombuffer(win.tomemory(), dtype)
        local[:] = 0
    if flavor == "dynamic":
        bases = comm.allgather(MPI.Get_address(local))
        at = lambda rank, i: bases[rank] + i * itemsize  # noqa: E731 - absolute addresses
    else:
        at = lambda rank, i: i  # noqa: E731 - in disp_unit (one element)
    comm.Barrier()
    return win, local, at


def _fence_body(rank, size, flavor):
    """Put, Get, Accumulate and Get_accumulate under Fence, to every rank."""
    MPI = mpi()
    comm = MPI.COMM_WORLD
    n = 4 * size
    win, local, at = _window(MPI, comm, flavor, n)
    win.Fence()
    for t in range(size):  # every rank writes its slot [4*rank, 4*rank+4) of every target
        win.Put(np.arange(4, dtype=np.int64) + 100 * rank, t, at(t, 4 * rank))
    win.Fence()
    expect = np.concatenate([np.arange(4) + 100 * r for r in range(size)])
    assert np.array_equal(local, expect), (local, expect)
    got = np.full(n + 1, -1, np.int64)
    win.Get([got, n, MPI.INT64_T], (rank + 1) % size, at((rank + 1) % size, 0))
    win.Fence()
    assert np.array_equal(got[:n], expect) and got[n] == -1
    # every rank adds rank+1 to every element of every target: one sum per element
    for t in range(size):
        win.Accumulate(np.full(n, rank + 1, np.int64), t, at(t, 0), MPI.SUM)
    win.Fence()
    expect = expect + size * (size + 1) // 2
    assert np.array_equal(local, expect)
    # Get_accumulate MAX with a target spec [disp, count, datatype]
    old = np.zeros(2, np.int64)
    win.Fence()
    if rank == 0:
        win.Get_accumulate(np.array([10**6, 0], np.int64), old, size - 1, [at(size - 1, 0), 2, MPI.INT64_T],
                           MPI.MAX)
    win.Fence()
    if rank == 0:
        assert old.tolist() == expect[:2].tolist()
    if rank == size - 1:
        assert local[:2].tolist() == [10**6, expect[1]]
    win.Fence()
    win.Free()
    return True


@pytest.mark.parametrize("flavor", FLAVORS)
@pytest.mark.parametrize("n", [1, 2, 3])
def test_fence_epochs(flavor, n):
    assert run(_fence_body, n, flavor) == [True] * n


def test_fence_epochs_over_tcp():
    assert run(_fence_body, 3, "create", backend="tcp") == [True] * 3


def _passive_body(rank, size, flavor):
    """Rank 0 computes in pure Python without calling MPI while the others
    Lock/Put/Accumulate/Unlock into its window: passive target needs no help."""
    MPI = mpi()
    comm = MPI.COMM_WORLD
    win, local, at = _window(MPI, comm, flavor, size)
    comm.Barrier()
    expect = [1000 * (size - 1)] + list(range(1, size))
    if rank == 0:
        t0 = time.monotonic()
        while local.tolist() != expect and time.monotonic() - t0 < 60:  # no MPI call here
            time.sleep(0.001)
        seen_before_barrier = local.tolist()
        comm.Barrier()
    else:
        win.Lock(0, MPI.LOCK_EXCLUSIVE)
        win.Put(np.array([rank], np.int64), 0, at(0, rank))
        win.Unlock(0)
        win.Lock(0, MPI.LOCK_SHARED)
        win.Accumulate(np.array([1000], np.int64), 0, at(0, 0), MPI.SUM)
        win.Unlock(0)
        comm.Barrier()
    if rank == 0:
        # the others finished their epochs before this rank left its loop
        assert seen_before_barrier == expect, seen_before_barrier
    win.Free()
    return True


@pytest.mark.parametrize("flavor", FLAVORS)
def test_passive_target_while_the_target_computes(flavor):
    assert run(_passive_body, 3, flavor) == [True] * 3


def _atomic_body(rank, size, flavor, rounds):
    """Fetch_and_op under LOCK_SHARED from every rank at once: each fetched
    value is seen once (a ticket counter), the total is exact; and a mutex
    made of Compare_and_swap protects a non-atomic read-modify-write."""
    MPI = mpi()
    comm = MPI.COMM_WORLD
    win, local, at = _window(MPI, comm, flavor, 2)
    one, got = np.ones(1, np.int64), np.zeros(1, np.int64)
    tickets = []
    win.Lock_all()
    for _ in range(rounds):
        win.Fetch_and_op(one, got, 0, at(0, 0), MPI.SUM)
        tickets.append(int(got[0]))
    win.Unlock_all()
    every = sorted(sum(comm.allgather(tickets), []))
    assert every == list(range(size * rounds)), every
    # element 1 of rank 0: counter updated with Get + Put under an exclusive lock
    for _ in range(rounds):
        win.Lock(0, MPI.LOCK_EXCLUSIVE)
        win.Get(got, 0, at(0, 1))
        win.Flush(0)
        win.Put(got + 1, 0, at(0, 1))
        win.Unlock(0)
    comm.Barrier()
    if rank == 0:
        assert local.tolist() == [size * rounds, size * rounds], local
    comm.Barrier()
    # Compare_and_swap: exactly one rank wins the swap of 0 -> rank+1
    old = np.zeros(1, np.int64)
    win.Fence()
    if rank == 0:
        local[0] = 0
    win.Fence()
    win.Lock(0, MPI.LOCK_SHARED)
    win.Compare_and_swap(np.array([rank + 1], np.int64), np.zeros(1, np.int64), old, 0, at(0, 0))
    win.Unlock(0)
    winners = comm.allgather(int(old[0]) == 0)
    assert sum(winners) == 1, winners
    # REPLACE swaps in, NO_OP only reads (element 1 of this rank, nobody else's)
    before, after = np.zeros(1, np.int64), np.zeros(1, np.int64)
    win.Lock(rank, MPI.LOCK_EXCLUSIVE)
    win.Fetch_and_op(np.array([rank + 5], np.int64), before, rank, at(rank, 1), MPI.REPLACE)
    win.Fetch_and_op(np.array([99], np.int64), after, rank, at(rank, 1), MPI.NO_OP)
    win.Unlock(rank)
    assert after[0] == rank + 5 and local[1] == rank + 5, (before, after, local)
    win.Free()
    return True


@pytest.mark.parametrize("flavor", ["create", "allocate"])
@pytest.mark.parametrize("n", [2, 4])
def test_accumulates_are_atomic_under_contention(flavor, n):
    assert run(_atomic_body, n, flavor, 50) == [True] * n


def _pscw_body(rank, size):
    """Post/Start/Complete/Wait: rank 0 exposes, the others access; Test
    says False until every origin completed."""
    MPI = mpi()
    comm = MPI.COMM_WORLD
    win, local, at = _window(MPI, comm, "create", size)
    group = win.Get_group()
    if rank == 0:
        win.Post(group.Excl([0]))
        assert win.Test() is False or size == 1
        comm.Barrier()  # origins start and put
        comm.Barrier()  # origins completed
        while not win.Test():
            pass
        assert local.tolist() == [0] + [r * 7 for r in range(1, size)], local
    else:
        win.Start(group.Incl([0]))
        comm.Barrier()
        win.Put(np.array([rank * 7], np.int64), 0, at(0, rank))
        win.Complete()
        comm.Barrier()
    win.Free()
    return True


@pytest.mark.parametrize("n", [2, 3])
def test_post_start_complete_wait(n):
    assert run(_pscw_body, n) == [True] * n


def _errors_body(rank, size):
    MPI = mpi()
    comm = MPI.COMM_WORLD
    win, local, at = _window(MPI, comm, "create", 4)
    errors = {}

    def code(f):
        try:
            f()
        except MPI.Exception as e:
            return e.Get_error_class(), str(e)
        except (ValueError, TypeError) as e:
            return type(e).__name__, str(e)
        return None, ""

    win.Lock(0)
    errors["range"] = code(lambda: win.Put(np.zeros(2, np.int64), 0, 3))
    errors["fetch_two"] = code(lambda: win.Fetch_and_op(np.zeros(2, np.int64), np.zeros(1, np.int64), 0))
    errors["types"] = code(lambda: win.Fetch_and_op(np.zeros(1, np.int32), np.zeros(1, np.int64), 0))
    errors["lock_twice"] = code(lambda: win.Lock(0))
    errors["op"] = code(lambda: win.Accumulate(np.zeros(1, np.int64), 0, 0, MPI.MAXLOC))
    errors["rank"] = code(lambda: win.Put(np.zeros(1, np.int64), size))
    win.Unlock(0)
    errors["unlock"] = code(lambda: win.Unlock(0))
    errors["flush"] = code(lambda: win.Flush(0))
    win.Free()
    assert errors["range"][0] == MPI.ERR_RMA_RANGE and "outside" in errors["range"][1]
    assert errors["fetch_two"][0] == "ValueError" and "one element" in errors["fetch_two"][1]
    assert errors["types"][0] == "ValueError"
    assert errors["lock_twice"][0] == MPI.ERR_RMA_SYNC
    assert errors["op"][0] == MPI.ERR_OP and "MAXLOC" in errors["op"][1]
    assert errors["rank"][0] == MPI.ERR_ARG and "target_rank" in errors["rank"][1]
    assert errors["unlock"][0] == MPI.ERR_RMA_SYNC and errors["flush"][0] == MPI.ERR_RMA_SYNC
    assert win == MPI.WIN_NULL
    return True


def test_bad_arguments_raise_errors_that_name_them():
    assert run(_errors_body, 2) == [True] * 2


def _free_body(rank, size, flavors=FLAVORS):
    """Free gives back the lock file, the segment and the agent thread: as
    many fds and threads as before."""
    import threading
    MPI = mpi()
    comm = MPI.COMM_WORLD
    win, local, at = _window(MPI, comm, flavors[0], 8)  # the first one may set up CMA, connections...
    win.Free()
    fds, threads = len(os.listdir("/proc/self/fd")), threading.active_count()
    for flavor in flavors:
        for _ in range(3):
            win, local, at = _window(MPI, comm, flavor, 8)
            win.Lock(0)
            win.Put(np.ones(1, np.int64), 0, at(0, rank))
            win.Unlock(0)
            del local
            win.Free()
    assert len(os.listdir("/proc/self/fd")) == fds
    assert threading.active_count() == threads
    return True


def test_free_releases_everything():
    shm_before = set(os.listdir("/dev/shm"))
    assert run(_free_body, 3) == [True] * 3
    assert not {n for n in set(os.listdir("/dev/shm")) - shm_before if "collie" in n}


def test_free_releases_everything_across_hosts():
    assert run(_two_hosts, 3, _free_body, ["create", "allocate", "dynamic"], init=False) == [True] * 3


def _dead_peer_body(rank, size, flavor):
    """Rank 1 dies holding an exclusive lock on itself: the others' Lock
    gets it (the kernel dropped it), then their operations or Fence raise."""
    MPI = mpi()
    comm = MPI.COMM_WORLD
    win, local, at = _window(MPI, comm, flavor, 4)
    if rank == 1:
        win.Lock(1, MPI.LOCK_EXCLUSIVE)
        comm.Barrier()
        os._exit(3)
    comm.Barrier()
    time.sleep(0.5)
    try:
        win.Lock(1, MPI.LOCK_EXCLUSIVE)
        win.Put(np.ones(4, np.int64), 1, at(1, 0))
        win.Unlock(1)
        win.Fence()
    except MPI.Exception as e:
        return e.Get_error_class() == MPI.ERR_PROC_FAILED or "rank 1" in str(e), str(e)
    return False, "no error"


@pytest.mark.parametrize("flavor", ["create", "allocate"])
def test_a_dead_peer_raises_instead_of_hanging(flavor):
    results = run(_dead_peer_body, 3, flavor, expect_errors=True)
    for rank in (0, 2):
        ok, why = results[rank]
        assert ok, f"rank {rank}: {why}"


def _two_hosts(rank, size, body, *args):
    """Run ``body`` with the ranks on two fake hosts (COLLIE_HOST_ID): the
    even ranks on one, the odd on the other, so windows need their agents."""
    import collie
    os.environ["COLLIE_HOST_ID"] = f"fake-host-{rank % 2}"
    collie.init_process_group()
    try:
        return body(rank, size, *args)
    finally:
        collie.destroy_process_group()


@pytest.mark.parametrize("flavor", ["create", "allocate", "dynamic"])
@pytest.mark.parametrize("body", [_fence_body, _passive_body], ids=["fence", "passive"])
def test_windows_across_hosts(body, flavor):
    assert run(_two_hosts, 3, body, flavor, init=False) == [True] * 3


@pytest.mark.parametrize("flavor", ["create", "allocate"])
def test_accumulates_are_atomic_across_hosts(flavor):
    assert run(_two_hosts, 4, _atomic_body, flavor, 30, init=False) == [True] * 4


def _shared_across_hosts_body(rank, size):
    MPI = mpi()
    try:
        MPI.Win.Allocate_shared(8, 1, MPI.INFO_NULL, MPI.COMM_WORLD)
    except MPI.Exception as e:
        return e.Get_error_class() == MPI.ERR_RMA_SHARED and "COMM_TYPE_SHARED" in str(e)
    return False


def test_allocate_shared_across_hosts_says_why_not():
    assert run(_two_hosts, 2, _shared_across_hosts_body, init=False) == [True] * 2


def test_a_dead_peer_on_another_host_raises_instead_of_hanging():
    results = run(_two_hosts, 3, _dead_peer_body, "create", init=False, expect_errors=True)
    for rank in (0, 2):
        ok, why = results[rank]
        assert ok, f"rank {rank}: {why}"


def _dtypes_body(rank, size, flavor):
    """Counts 0..4 of many dtypes, to every target: Put then Get back the
    slot this rank wrote; Accumulate SUM from every rank; Get_accumulate
    REPLACE fetches what was there (NumPy is the reference)."""
    MPI = mpi()
    comm = MPI.COMM_WORLD
    n = 4 * size * 16  # bytes: every rank's slot of 4 complex128 in every target
    win, local, at = _window(MPI, comm, flavor, n, np.uint8)
    for code in ("i1", "u2", "i4", "i8", "f4", "f8", "c16", "?"):
        dtype = np.dtype(code)
        for count in range(5):
            slot = 4 * rank  # in elements of dtype
            mine = (np.arange(count) + 10 * rank).astype(dtype)
            win.Fence()
            for t in range(size):
                win.Put(mine, t, [at(t, slot * dtype.itemsize), count * dtype.itemsize, MPI.BYTE])
            win.Fence()
            for t in range(size):
                got = np.full(count + 1, 7, dtype)
                win.Get([got, count, MPI.Datatype.fromcode(code) if code != "?" else MPI.C_BOOL], t,
                        [at(t, slot * dtype.itemsize), count * dtype.itemsize, MPI.BYTE])
                assert np.array_equal(got[:count], mine) and got[count] == np.array(7).astype(dtype), (code, count, t)
            if code == "?":
                continue
            win.Fence()
            if rank == 0:
                for t in range(size):
                    win.Put(np.zeros(count, dtype), t, [at(t, 0), count * dtype.itemsize, MPI.BYTE])
            win.Fence()
            for t in range(size):
                win.Accumulate(np.arange(count).astype(dtype), t, [at(t, 0), count, MPI.Datatype.fromcode(code)],
                               MPI.SUM)
            win.Fence()
            mem = np.frombuffer(local, np.uint8)[:count * dtype.itemsize].view(dtype)
            assert np.array_equal(mem, (np.arange(count) * size).astype(dtype)), (code, count, mem)
            win.Fence()
            if rank == size - 1:
                old = np.zeros(count, dtype)
                win.Get_accumulate(np.ones(count, dtype), old, 0, [at(0, 0), count, MPI.Datatype.fromcode(code)],
                                   MPI.REPLACE)
                assert np.array_equal(old, (np.arange(count) * size).astype(dtype)), (code, count, old)
            win.Fence()
            if rank == 0:
                assert np.array_equal(mem, np.ones(count, dtype)), (code, count, mem)
    win.Fence()
    win.Free()
    return True


@pytest.mark.parametrize("flavor", ["create", "allocate", "dynamic"])
def test_many_dtypes_and_counts(flavor):
    assert run(_dtypes_body, 3, flavor) == [True] * 3


@pytest.mark.parametrize("flavor", ["create", "allocate", "dynamic"])
def test_many_dtypes_and_counts_across_hosts(flavor):
    assert run(_two_hosts, 3, _dtypes_body, flavor, init=False) == [True] * 3
