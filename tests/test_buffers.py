"""Registered buffers (collie.empty): what they are, and that a peer on the
host moves a large message through the buffer's mapping, with the same
results as from plain arrays, whatever the algorithm, executor or world."""

import ctypes
import gc
import os

import numpy as np
import pytest

import collie
from collie import core
from collie.transports import cma
from harness import reduced, run_ranks, same, small_ints

BIG = 3 << 20  # bytes: past the single-copy threshold (2 MiB; 1 MiB where ranks share cores)


def _moves() -> int:
    """Moves this process made through a peer's registered buffer's mapping."""
    return core._core.registered_moves()[0]


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_empty_is_an_array_in_a_registered_buffer():
    a = collie.empty((3, 5), np.int16)
    assert a.shape == (3, 5) and a.dtype == np.int16 and a.flags.writeable and a.flags.c_contiguous
    a[:] = 7
    assert int(a.sum()) == 7 * 15
    fd, inode, start, serial = cma.registered(a)
    assert fd > 2 and inode > 0 and start == a.__array_interface__["data"][0] and serial > 0
    assert cma.registered(a[1:])[3] == serial  # a view of it lies in it too
    assert cma.registered(np.empty(15, np.int16)) == (0, 0, 0, 0)
    assert collie.empty(4).dtype == np.float32 and collie.empty(4).shape == (4,)


def test_an_empty_buffers_memory_goes_back_with_its_last_view():
    gc.collect()
    fds = _open_fds()
    a = collie.empty(1000, np.float64)
    view = a[10:20]
    del a
    gc.collect()
    assert cma.registered(view)[3] > 0 and _open_fds() == fds + 1  # the view keeps it (one fd)
    address = view.__array_interface__["data"][0]
    del view
    gc.collect()
    assert _open_fds() == fds
    gone = (ctypes.c_char * 8).from_address(address)  # (names the bytes, never reads them)
    assert core._core.registered_words(gone) == (0, 0, 0, 0)


def test_empty_takes_shapes_as_numpy_does_and_names_a_bad_one():
    assert collie.empty((0, 3)).shape == (0, 3)
    assert collie.empty(np.int64(2), "uint8").shape == (2,)
    with pytest.raises(ValueError, match="negative dimensions"):
        collie.empty((2, -1))


def _collectives_body(rank, size, registered_in, registered_out):
    """Every collective on large arrays, from (into) registered buffers or
    plain ones, against NumPy; and how many moves went through a mapping."""
    from collie import algorithms
    mk_in = collie.empty if registered_in else np.empty
    mk_out = collie.empty if registered_out else np.empty
    count = BIG // 4 * size + 3  # float32s, not a multiple of the world
    block = BIG // 4             # what every rank sends every other in all_to_all, all_gather...
    inputs = [small_ints(f"reg-{r}", count, "float32") for r in range(size)]
    before = _moves()
    wrong = []
    for algo in algorithms.algorithms_for("all_reduce"):
        x = mk_in(count, np.float32)
        x[:] = inputs[rank]
        collie.all_reduce(x, algorithm=algo)
        if not same(x, reduced(collie.ReduceOp.SUM, inputs, size)):
            wrong.append(("all_reduce", algo))
    x = mk_in(count, np.float32)
    x[:] = inputs[rank]
    collie.broadcast(x, src=size - 1)
    if not same(x, inputs[size - 1]):
        wrong.append("broadcast")
    x[:] = inputs[rank]
    collie.reduce(x, dst=0, op=collie.ReduceOp.MAX)
    if rank == 0 and not same(x, reduced(collie.ReduceOp.MAX, inputs, size)):
        wrong.append("reduce")
    part = mk_in(block, np.float32)
    part[:] = inputs[rank][:block]
    gathered = mk_out(block * size, np.float32)
    collie.all_gather_into_tensor(gathered, part)
    if not same(gathered, np.concatenate([inp[:block] for inp in inputs])):
        wrong.append("all_gather")
    whole = mk_in(block * size, np.float32)
    whole[:] = inputs[rank][:block * size]
    mine = mk_out(block, np.float32)
    collie.reduce_scatter_tensor(mine, whole)
    total = reduced(collie.ReduceOp.SUM, [inp[:block * size] for inp in inputs], size)
    if not same(mine, total[rank * block:(rank + 1) * block]):
        wrong.append("reduce_scatter")
    out = mk_out(block * size, np.float32)
    collie.all_to_all_single(out, whole)
    if not same(out, np.concatenate([inp[rank * block:(rank + 1) * block] for inp in inputs])):
        wrong.append("all_to_all")
    got = mk_out(count, np.float32)
    send = mk_in(count, np.float32)
    send[:] = inputs[rank]
    ops = [collie.P2POp(collie.isend, send, (rank + 1) % size),
           collie.P2POp(collie.irecv, got, (rank - 1) % size)]
    for work in collie.batch_isend_irecv(ops):
        work.wait()
    if not same(got, inputs[(rank - 1) % size]):
        wrong.append("sendrecv")
    return wrong, _moves() - before


@pytest.mark.parametrize("executor", ["c", "python"])
@pytest.mark.parametrize("size", [2, 3, 4])
def test_collectives_on_registered_buffers_move_through_their_mappings(size, executor):
    env = {"COLLIE_EXECUTOR": executor}
    for registered_in, registered_out in [(True, True), (True, False), (False, False)]:
        results = run_ranks(_collectives_body, size, registered_in, registered_out, backend="shm", env=env,
                            timeout=120)
        assert all(not wrong for wrong, _ in results), results
        moves = sum(m for _, m in results)
        if registered_in:
            assert moves > 0, results
        else:
            assert moves == 0, results


def _mid_body(rank, size):
    """Messages of 64 KiB to 2 MiB from registered buffers go single copy
    (through the mapping) where plain ones go through the rings."""
    count = (256 << 10) // 4 + 5
    inputs = [small_ints(f"mid-{r}", count, "float32") for r in range(size)]
    before = _moves()
    wrong = []
    x = collie.empty(count, np.float32)
    x[:] = inputs[rank]
    collie.broadcast(x, src=0)
    if not same(x, inputs[0]):
        wrong.append("broadcast")
    x[:] = inputs[rank]
    collie.reduce(x, dst=size - 1)
    if rank == size - 1 and not same(x, reduced(collie.ReduceOp.SUM, inputs, size)):
        wrong.append("reduce")
    x[:] = inputs[rank]
    if rank == 0:
        collie.send(x, 1)
        collie.isend(x, 1).wait()
    elif rank == 1:
        for _ in range(2):
            got = collie.empty(count, np.float32)
            collie.recv(got, 0)
            if not same(got, inputs[0]):
                wrong.append("recv")
    return wrong, _moves() - before


@pytest.mark.parametrize("executor", ["c", "python"])
def test_mid_size_messages_from_registered_buffers_go_single_copy(executor):
    results = run_ranks(_mid_body, 3, backend="shm", env={"COLLIE_EXECUTOR": executor})
    assert all(not wrong for wrong, _ in results), results
    assert sum(moves for _, moves in results) >= 2, results  # the broadcast's and the reduce's at least


def _torch_body(rank, size):
    import torch
    t = torch.from_numpy(collie.empty(4 * BIG // 4, np.float32))  # halves of 6 MiB: single copy
    t.fill_(rank + 1)
    before = _moves()
    collie.all_reduce(t)
    return float(t[0]), float(t[-1]), _moves() - before


def test_a_torch_tensor_on_a_registered_buffer():
    pytest.importorskip("torch")
    results = run_ranks(_torch_body, 2, backend="shm")
    assert [r[:2] for r in results] == [(3.0, 3.0)] * 2
    assert sum(r[2] for r in results) > 0


def _rounds_body(rank, size, rounds):
    """Buffers made and dropped round after round (more than a reader keeps
    mappings of), the root's fd numbers and addresses coming round again:
    every round's data arrives, never an earlier buffer's; and how many
    mappings this rank holds then, and after destroy_process_group."""
    wrong = []
    for k in range(rounds):
        x = collie.empty(2 * BIG // 4 + k, np.float32)
        x.fill(k if rank == 0 else -1)
        collie.broadcast(x, src=0)
        if not (x == k).all():
            wrong.append(k)
        y = collie.empty(4 * BIG // 4, np.float32)  # sums into a fresh buffer too: the writer combines into it
        y.fill(rank + k)
        collie.all_reduce(y)
        if not (y == sum(r + k for r in range(size))).all():
            wrong.append(("all_reduce", k))
        del x, y
        gc.collect()
    mapped = core._core.registered_moves()[1]
    collie.destroy_process_group()
    return wrong, _moves(), mapped, core._core.registered_moves()[1]


def test_buffers_made_and_dropped_never_read_stale():
    results = run_ranks(_rounds_body, 2, 40, backend="shm", timeout=120)
    assert not any(wrong for wrong, *_ in results) and sum(moves for _, moves, *_ in results) >= 40, results
    # A peer's freed buffer's mapping goes when its fd comes back in a new
    # one (not after 16), and every mapping with the world.
    assert all(mapped <= 4 and after == 0 for *_, mapped, after in results), results


def _fallback_body(rank, size):
    """A read whose registered words do not match a mapping this rank can
    make (another inode, an fd not open) falls back to process_vm_readv."""
    x = collie.empty(1 << 16, np.uint8)
    x[:] = np.arange(1 << 16) % 251
    me = np.array([os.getpid(), x.__array_interface__["data"][0], *cma.registered(x)], np.int64)
    peers = np.zeros(2 * len(me), np.int64)
    collie.all_gather_into_tensor(peers, me)
    pid, address, *words = peers.reshape(2, -1)[1 - rank].tolist()
    out = []
    for bad in ([words[0], words[1] + 1, *words[2:]], [1 << 20, *words[1:]], words):
        got = np.zeros(1 << 16, np.uint8)
        before = _moves()
        cma.read(pid, got, address, tuple(bad))
        out.append((bool((got == np.arange(1 << 16) % 251).all()), _moves() - before))
    collie.barrier()
    return out


def test_a_read_with_words_that_do_not_match_falls_back():
    for out in run_ranks(_fallback_body, 2, backend="shm"):
        assert out == [(True, 0), (True, 0), (True, 1)], out


def _alloc_mem_body(rank, size):
    """collie.MPI's Alloc_mem gives registered memory from 64 KiB, zeroed,
    an MPI.buffer as before; smaller ones stay plain."""
    from collie.compat import mpi as MPI
    comm = MPI.COMM_WORLD
    mem = MPI.Alloc_mem(4 << 20)
    small = MPI.Alloc_mem(100)
    assert type(mem) is MPI.buffer and len(mem) == 4 << 20 and mem.address and not mem.readonly
    assert cma.registered(mem)[3] and not cma.registered(small)[3] and len(small) == 100
    a = np.frombuffer(mem, np.float32)
    assert not a.any()
    before = _moves()
    if rank == 0:
        a[:] = np.arange(a.size)
        comm.Send(mem, dest=1)
    else:
        comm.Recv(mem, source=0)
    ok = bool((a == np.arange(a.size)).all())
    MPI.Free_mem(mem)
    return ok, _moves() - before


def test_mpi_alloc_mem_is_registered():
    results = run_ranks(_alloc_mem_body, 2, backend="shm")
    assert results[0][0] and results[1][0] and results[1][1] > 0, results
