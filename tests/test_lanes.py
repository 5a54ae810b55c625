"""Lanes (collectives._lane): a repeated blocking call of one shape goes
straight to the compiled core. The same calls must give the same results,
the same errors and the same order as the full path: results against NumPy
over many calls, messages the core hands back (tcp, several slots, windows),
a mismatch and a dead peer met inside a lane, async calls before a blocking
one, and collie.MPI's Allreduce, Bcast and Allgather, whose hot paths are
lanes too."""

import time

import numpy as np
import pytest

from collie.objects import SLOT
from harness import run_ranks

pytestmark = pytest.mark.timeout(240)

CALLS = 12


def _data(rank: int, call: int, n: int, dtype) -> np.ndarray:
    return ((np.arange(n) * (rank + 3) + call * 7) % 97).astype(dtype)


def _repeated_body(rank, size, sizes):
    import collie
    from collie import group
    wrong = []
    for n in sizes:
        for dtype in (np.float32, np.int64):
            for call in range(CALLS):
                x = _data(rank, call, n, dtype).reshape(-1, 1) if call % 2 else _data(rank, call, n, dtype)
                collie.all_reduce(x)
                want = sum(_data(r, call, n, dtype) for r in range(size))
                if not np.array_equal(x.reshape(-1), want):
                    wrong.append(("all_reduce", n, dtype.__name__, call))
                y = _data(rank, call, n, dtype)
                collie.all_reduce(y, op=collie.ReduceOp.MAX)
                if not np.array_equal(y, np.max([_data(r, call, n, dtype) for r in range(size)], axis=0)):
                    wrong.append(("all_reduce MAX", n, dtype.__name__, call))
                out = np.empty(n * size, dtype)
                collie.all_gather_into_tensor(out, _data(rank, call, n, dtype))
                if not np.array_equal(out, np.concatenate([_data(r, call, n, dtype) for r in range(size)])):
                    wrong.append(("all_gather_into_tensor", n, dtype.__name__, call))
                rs = np.empty(n, dtype)
                collie.reduce_scatter_tensor(rs, np.concatenate([_data(rank, call + q, n, dtype) for q in range(size)]))
                if not np.array_equal(rs, sum(_data(r, call + rank, n, dtype) for r in range(size))):
                    wrong.append(("reduce_scatter_tensor", n, dtype.__name__, call))
                a2a = np.empty((size, n), dtype)
                collie.all_to_all_single(a2a, np.stack([_data(rank, call + q, n, dtype) for q in range(size)]))
                if not np.array_equal(a2a, np.stack([_data(r, call + rank, n, dtype) for r in range(size)])):
                    wrong.append(("all_to_all_single", n, dtype.__name__, call))
                src = call % size
                z = _data(rank, call, n, dtype)
                collie.broadcast(z, src=src)
                if not np.array_equal(z, _data(src, call, n, dtype)):
                    wrong.append(("broadcast", n, dtype.__name__, call))
                r = _data(rank, call, n, dtype)
                collie.reduce(r, dst=src, op=collie.ReduceOp.MIN if call % 3 == 2 else collie.ReduceOp.SUM)
                parts = [_data(q, call, n, dtype) for q in range(size)]
                want = (np.min(parts, axis=0) if call % 3 == 2 else sum(parts)) if rank == src else parts[rank]
                if not np.array_equal(r, want):  # the root gets the result, the others keep their own
                    wrong.append(("reduce", n, dtype.__name__, call))
                collie.barrier()
    lanes = group.world().group.lanes
    return wrong, sorted({key[0] for key, lane in lanes.items() if lane is not None})


@pytest.mark.parametrize("size,backend,sizes", [
    (1, "shm", (2, 300)),                   # a group of one: its programs move nothing, its lanes keep the books
    (2, "shm", (2, 300)),
    (3, "shm", (1, 1000, 70_000)),          # 70,000 x 8 bytes: several ring slots, handed back
    (4, "shm", (5, 300_000)),               # over 1 MiB: the windows of the shm algorithm
    (3, "tcp", (3, 5000)),                  # every message handed back to Python
])
def test_repeated_calls_give_numpy_results(executor, size, backend, sizes):
    for wrong, laned in run_ranks(_repeated_body, size, sizes, backend=backend, timeout=200):
        assert wrong == []
        if executor == "c":  # the calls did take lanes (a barrier of one returns at once)
            assert laned == ["all_gather", "all_reduce", "all_to_all"] + ["barrier"] * (size > 1) + \
                ["broadcast", "reduce", "reduce_scatter"]
        else:
            assert laned == []


def _mismatch_body(rank, size):
    import collie
    x = np.ones(4, np.float32)
    for _ in range(5):
        collie.all_reduce(x)   # a lane from the second call on
    try:
        collie.all_reduce(np.ones(5 if rank == 1 else 4, np.float32))
    except collie.MismatchError as exc:
        return str(exc)
    return "no error"


def test_a_mismatch_inside_a_lane_is_reported_on_every_rank(executor):
    for text in run_ranks(_mismatch_body, 2, timeout=60):
        assert "all_reduce" in text and "4" in text and "5" in text, text


def _roots_body(rank, size):
    import collie
    x = np.ones(16, np.float32)
    failed = []
    for i in range(45):
        try:  # 6 calls that agree, each rank the root of two (a lane each for
            # every root), then every rank thinks it is the root: each only
            # sends, in its lane, and nobody receives anything
            collie.broadcast(x, src=i % size if i < 6 else rank)
        except collie.MismatchError:
            failed.append(i)
    return failed


def _glance_body(rank, size):
    import collie
    from collie import core
    from collie.wire import COLLECTIVE_BIT, CONTEXT_SHIFT, MAX_TAG
    net = collie.group.world().network
    glance = core.glance(net, [1 - rank])

    def nothing_stale(tag):
        return glance.nothing_stale(tag, MAX_TAG)

    def tag(context, seq):
        return context << CONTEXT_SHIFT | COLLECTIVE_BIT | seq

    seen = []
    if rank == 1:  # a message nobody posted a receive for; then quiet while rank 0 looks
        net.wait([net.isend(0, tag(7, 5), memoryview(b"late"))])
        time.sleep(1.0)
    else:
        time.sleep(0.3)  # no receive posted meanwhile: the message stays at the ring's head
        seen += [nothing_stale(tag(7, 4)),   # the next call's data: nothing to sweep
                 nothing_stale(tag(7, 5)),   # data of the call just finished: stale
                 nothing_stale(tag(7, 6)),   # of an earlier call: stale
                 nothing_stale(tag(8, 4))]   # another group's: a closer look
        got = bytearray(4)
        net.wait([net.irecv(1, tag(7, 5), memoryview(got))])
        seen += [bytes(got), nothing_stale(tag(7, 5))]  # taken: the ring is empty
    collie.barrier()
    return seen


def test_a_lanes_look_at_the_rings_heads():
    from collie import core
    if core._core is None:
        pytest.skip(core._WHY_NOT)  # the look is the compiled core's
    assert run_ranks(_glance_body, 2, timeout=60)[0] == [True, False, False, False, b"late", True]


def _books_body(rank, size):
    import collie
    from collie import group
    g, net = group.world().group, group.world().network
    x = np.ones(2, np.float32)
    for _ in range(5):
        collie.all_reduce(x)
    collie.send(x, 1 - rank) if rank == 0 else collie.recv(x, 1 - rank)
    return g.seq, net.current, g.p2p_ops, "seq" in vars(g), "current" in vars(net)


def test_the_core_keeps_the_books_in_their_slots():
    """The group's sequence and point-to-point count and the network's
    current call are slots the core writes by offset: Python reads what it
    wrote (the first all_reduce and send run in Python, the rest in C)."""
    from collie import core
    if core._core is None:
        pytest.skip(core._WHY_NOT)
    for seq, current, p2p_ops, in_dict, in_net_dict in run_ranks(_books_body, 2, timeout=60):
        assert (seq, current, p2p_ops, in_dict, in_net_dict) == (5, 0, 1, False, False)


def _full_ring_body(rank, size):
    import time
    import collie
    from collie import core
    handed, finish = [0], core._finish

    def counting(*args, **kwargs):  # the rest of a call the core handed back to Python
        handed[0] += 1
        return finish(*args, **kwargs)
    core._finish = counting
    x = np.zeros(2, np.float32)
    for _ in range(200):
        if rank == 0:  # the root takes 20 us longer a call than the leaf: the leaf's ring fills
            t = time.perf_counter()
            while time.perf_counter() - t < 20e-6:
                pass
        collie.reduce(x, dst=0)
    core._finish = finish
    return handed[0]


def test_a_send_that_finds_its_ring_full_waits_in_the_core():
    """A leaf that sends faster than its root combines fills its ring after a
    few calls; from then on each send waits for a slot in the core (as a
    receive waits for its message), where it used to hand every call back
    to Python's executor (about 190 of these 200)."""
    from collie import core
    if core._core is None:
        pytest.skip(core._WHY_NOT)
    root, leaf = run_ranks(_full_ring_body, 2, timeout=60)
    assert leaf < 20, leaf


def test_the_core_refuses_hot_attributes_that_are_not_slots():
    from collie import core
    from collie.group import ProcessGroup, _World
    from collie.network import Network
    from collie.transports.shm import ShmTransport
    if core._core is None:
        pytest.skip(core._WHY_NOT)

    class Loose:  # attributes in a __dict__: no offset to read them at
        pass
    try:
        with pytest.raises(TypeError, match="seq must be a slot"):
            core._core.set_hot_slots(Loose, Network, ShmTransport, _World)
        with pytest.raises(TypeError, match="current must be a slot"):
            core._core.set_hot_slots(ProcessGroup, Loose, ShmTransport, _World)
    finally:
        core._core.set_hot_slots(ProcessGroup, Network, ShmTransport, _World)


def test_roots_that_differ_are_found_at_a_lanes_end(executor):
    """A root in its lane only sends; the peer's data left for the same call
    is what shows the mismatch, found by the lane's look at the rings."""
    for failed in run_ranks(_roots_body, 3, timeout=60):
        assert failed and failed[0] < 20 and failed == list(range(failed[0], 45)), failed


def _death_body(rank, size):
    import os

    import collie
    x = np.ones(8, np.float64)
    for _ in range(5):
        collie.all_reduce(x)
    if rank == 1:
        os._exit(0)
    try:
        for _ in range(1000):
            collie.all_reduce(x)
    except collie.CollieError as exc:
        return type(exc).__name__, str(exc)
    return "no error", ""


def test_a_dead_peer_inside_a_lane_is_named(executor):
    from datetime import timedelta
    got = run_ranks(_death_body, 2, timeout=60, expect_errors=True,
                    init_kwargs={"timeout": timedelta(seconds=20)})
    kind, text = got[0]
    assert kind == "PeerError" and "rank 1" in text, got[0]


def _barrier_body(rank, size):
    import collie
    from collie import group
    late, left = [], []
    for i in range(3 * size):
        if i % size == rank:  # this rank comes late to barrier i
            time.sleep(0.05)
            late.append((i, time.time()))
        collie.barrier()
        left.append((i, time.time()))
    return late, left, [key for key, lane in group.world().group.lanes.items() if key[0] == "barrier" and lane]


def test_barriers_in_their_lane_wait_for_the_last_rank(executor):
    """Each rank in turn comes 50 ms late: no rank may leave that barrier
    before the late one arrived (the same clock: one host)."""
    got = run_ranks(_barrier_body, 3, timeout=60)
    arrived = dict(pair for late, _, _ in got for pair in late)
    for _, left, lanes in got:
        assert all(t >= arrived[i] for i, t in left), (left, arrived)
        assert lanes == ([("barrier", None)] if executor == "c" else [])


def _barrier_breaks_body(rank, size, how):
    import os

    import collie
    for _ in range(5):
        collie.barrier()  # a lane from the second call on
    try:
        if how == "dead" and rank == 1:
            os._exit(0)
        if how == "mismatch" and rank == 1:
            collie.all_reduce(np.ones(4, np.float32))
        else:
            collie.barrier()
    except collie.CollieError as exc:
        return type(exc).__name__, str(exc)
    return "no error", ""


@pytest.mark.parametrize("how,error", [("mismatch", "MismatchError"), ("dead", "PeerError")])
def test_a_barrier_lane_reports_a_mismatch_or_a_dead_peer(executor, how, error):
    from datetime import timedelta
    got = run_ranks(_barrier_breaks_body, 2, how, timeout=60, expect_errors=how == "dead",
                    init_kwargs={"timeout": timedelta(seconds=20)})
    for kind, text in got[:1] if how == "dead" else got:
        assert kind == error, (kind, text)
        assert ("rank 1" in text) if how == "dead" else ("barrier" in text and "all_reduce" in text), text


def _subgroup_and_threads_body(rank, size):
    """Lanes of a sub-group (rank 1 outside it), and of two groups run at
    once from two threads of each rank."""
    import threading

    import collie
    pair = collie.new_group([0, 2])
    twin = collie.new_group(list(range(size)))
    wrong = []
    if rank != 1:
        for call in range(20):
            x = np.full(3, float(rank + call))
            collie.all_reduce(x, group=pair)
            if x.tolist() != [float(2 + 2 * call)] * 3:
                wrong.append(("all_reduce", call, x.tolist()))
            y = np.full(5, float(rank)) if call % 2 else np.full(5, -1.0)
            collie.broadcast(y, src=2 if call % 2 else 0, group=pair)
            if y.tolist() != ([2.0] * 5 if call % 2 else [-1.0] * 5):
                wrong.append(("broadcast", call, y.tolist()))
            collie.barrier(group=pair)

    def sums(group, n, out):
        for call in range(200):
            z = np.full(n, float(rank * call))
            collie.all_reduce(z, group=group)
            out.append(z[0] == sum(r * call for r in range(size)))

    ours, theirs = [], []
    other = threading.Thread(target=sums, args=(twin, 7, theirs))
    other.start()
    sums(None, 4, ours)
    other.join()
    laned = sorted(key[0] for g in (pair, twin) if g.rank >= 0 for key, lane in g.lanes.items() if lane)
    return wrong, all(ours) and all(theirs) and len(ours) == len(theirs) == 200, laned


def test_lanes_of_sub_groups_and_of_two_threads(executor):
    got = run_ranks(_subgroup_and_threads_body, 3, timeout=120)
    for rank, (wrong, sums_right, laned) in enumerate(got):
        assert wrong == [] and sums_right
        if executor == "c":
            assert laned == (["all_reduce"] if rank == 1 else ["all_reduce", "all_reduce", "barrier", "broadcast",
                                                               "broadcast"])


def _reinit_body(rank, size):
    import collie
    x = np.ones(4, np.float32)
    old = collie.new_group([0, 1])
    for _ in range(3):
        collie.all_reduce(x)
        collie.all_reduce(x, group=old)
    collie.destroy_process_group()
    try:
        collie.all_reduce(x)  # no world: the full path says so, not a lane
    except collie.CollieError as exc:
        before = type(exc).__name__
    collie.init_process_group()
    try:
        collie.all_reduce(x, group=old)  # a group of the destroyed world: its lanes are not taken
    except collie.CollieError as exc:
        stale = str(exc)
    y = np.ones(4, np.float32)
    for _ in range(3):
        collie.all_reduce(y)  # the new world's own calls, and lanes
    return before, stale, float(x[0]), float(y[0])


def test_lanes_end_with_their_world(executor):
    for before, stale, x0, y0 in run_ranks(_reinit_body, 2, timeout=60):
        assert before == "CollieError" and "destroyed" in stale
        assert (x0, y0) == (64.0, 8.0)


def _freed_body(rank, size):
    import gc
    import weakref

    import collie
    from collie.group import world
    network, whole = weakref.ref(world().network), weakref.ref(world().group)
    pair = collie.new_group([0, 1])
    x, y = np.ones(4, np.float32), np.ones(2, np.float32)
    for _ in range(3):  # lanes, a glance, core p2p programs: all refer back to the network
        collie.all_reduce(x)
        collie.broadcast(x, 0)
        collie.barrier()
        collie.all_reduce(x, group=pair)
        if rank == 0:
            collie.send(y, 1)
            collie.recv(y, 1)
        else:
            collie.recv(y, 0)
            collie.send(y, 0)
    pair = weakref.ref(pair)
    collie.destroy_process_group()
    gc.collect()
    freed = (network() is None, whole() is None, pair() is None)
    collie.init_process_group()  # the harness ends the world it started
    return freed


def test_a_destroyed_world_is_freed_lanes_and_programs_included():
    """Lanes refer to their group and the core's programs to the network's
    transport: the cycle collector must see those references (C objects
    without them kept every destroyed world alive)."""
    assert run_ranks(_freed_body, 2, timeout=60) == [(True, True, True)] * 2


def _async_then_blocking_body(rank, size):
    import collie
    x = np.full(3, rank + 1.0)
    for _ in range(3):
        collie.all_reduce(x)  # a lane for shape 3
    x[:] = rank + 1.0
    a, b = np.full(1000, float(rank)), np.full(3, rank + 1.0)
    work = collie.all_reduce(a, async_op=True)
    collie.all_reduce(b)       # by its lane, after the async call
    finished_first = work.is_completed()
    work.wait()
    return float(a[0]), float(b[0]), finished_first


def test_a_lane_runs_after_the_async_calls_before_it(executor):
    assert run_ranks(_async_then_blocking_body, 3, timeout=60) == [(3.0, 6.0, True)] * 3


def _fallbacks_body(rank, size):
    import collie
    from collie.arrays import ReadOnlyError
    x = np.ones((4, 6), np.float32)
    for _ in range(3):
        collie.all_reduce(x[:, 0].copy())  # a lane for 4 float32
    col = x[:, 0]                          # not contiguous: the full path, copied back
    collie.all_reduce(col)
    frozen = np.ones(4, np.float32)
    frozen.flags.writeable = False
    try:
        collie.all_reduce(frozen)
        error = "no error"
    except ReadOnlyError as exc:
        error = str(exc)
    return x[:, 0].tolist(), error


def test_arrays_a_lane_cannot_take_go_the_full_path(executor):
    for col, error in run_ranks(_fallbacks_body, 2, timeout=60):
        assert col == [2.0] * 4
        assert error == "all_reduce tensor is read-only, but collie must write into it"


def _trace_body(rank, size, path):
    import collie
    x = np.ones(2, np.float32)
    for _ in range(3):
        collie.all_reduce(x)
    with collie.trace(path):
        collie.all_reduce(x)
    return float(x[0])


def test_a_call_in_its_lane_is_traced(executor, tmp_path):
    assert run_ranks(_trace_body, 2, str(tmp_path), timeout=60) == [16.0, 16.0]
    for rank in (0, 1):  # the fourth call, the one traced, is in each rank's trace
        assert "all_reduce" in (tmp_path / f"rank-{rank}.json").read_text()


def _mpi_body(rank, size):
    from collie import MPI
    comm = MPI.COMM_WORLD
    wrong = []
    for call in range(CALLS):
        for n in (3, 200_000):
            buf = _data(rank, call, n, np.float64)
            comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
            if not np.array_equal(buf, sum(_data(r, call, n, np.float64) for r in range(size))):
                wrong.append(("IN_PLACE", n, call))
            out = np.empty(n)
            comm.Allreduce(_data(rank, call, n, np.float64), out, op=MPI.MAX)
            if not np.array_equal(out, np.max([_data(r, call, n, np.float64) for r in range(size)], axis=0)):
                wrong.append(("MAX", n, call))
            flags = np.array([rank == call % size, True, False] * (n // 3), dtype=np.int32)
            land = np.empty_like(flags)
            comm.Allreduce(flags, land, op=MPI.LAND)   # logical: never a lane
            if land.tolist() != [0, 1, 0] * (n // 3):  # the first column is true on one rank only
                wrong.append(("LAND", n, call))
        for n in (5, 40_000):
            buf = _data(rank, call, n, np.int32).reshape(-1, 5)
            comm.Bcast(buf, root=call % size)
            if not np.array_equal(buf.reshape(-1), _data(call % size, call, n, np.int32)):
                wrong.append(("Bcast", n, call))
            out = np.empty(n * size, np.float32)
            comm.Allgather(_data(rank, call, n, np.float32), out)
            if not np.array_equal(out, np.concatenate([_data(r, call, n, np.float32) for r in range(size)])):
                wrong.append(("Allgather", n, call))
    errors = []
    dup = comm.Dup()  # a freed communicator's hot path must not fall back on the world
    x = np.ones(3)
    for _ in range(3):
        dup.Allreduce(MPI.IN_PLACE, x, op=MPI.SUM)
        dup.Bcast(x, root=0)
        dup.Allgather(x, np.empty(3 * size))
    dup.Free()
    for call in (lambda: dup.Allreduce(MPI.IN_PLACE, x, op=MPI.SUM), lambda: dup.Bcast(x, root=0),
                 lambda: dup.Allgather(x, np.empty(3 * size))):
        try:
            call()
            errors.append("no error on a freed communicator")
        except MPI.Exception as exc:
            errors.append(exc.Get_error_class() == MPI.ERR_COMM)
    try:
        comm.Bcast(np.ones(5, np.int32), root=size)
    except MPI.Exception as exc:
        errors.append(exc.Get_error_class() == MPI.ERR_ROOT)
    for send, recv in ((np.ones(3, np.float32), np.empty(3)), (np.ones(4), np.empty(3))):
        try:
            comm.Allreduce(send, recv, op=MPI.SUM)
        except ValueError as exc:
            errors.append(str(exc))
    return wrong, errors


def test_mpi_calls_on_their_hot_path(executor):
    for wrong, errors in run_ranks(_mpi_body, 3, timeout=120):
        assert wrong == []
        assert errors == [True, True, True, True, "Allreduce: sendbuf is float32 but recvbuf is float64",
                          "Allreduce: sendbuf has 4 elements, recvbuf 3: they do not fit"]


EXTRAS = (0, SLOT - 40, SLOT, 5 * SLOT, SLOT - 40, 0)


def _objects_body(rank, size):
    import collie
    got = []
    pair = collie.new_group([0, 2])  # a group of its own reuses its own first-round buffers
    # sizes around the first round's slot: all fit, one rank's does not, none
    # do; then back down, so that a small object follows a large one
    for extra in EXTRAS:
        mine = "x" * (extra if rank == 1 else 3)
        out = [None] * size
        collie.all_gather_object(out, mine)
        got.append([len(o) for o in out])
        box = [("y" * extra, rank)] if rank == 2 else [None]
        collie.broadcast_object_list(box, src=2)
        got.append((len(box[0][0]), box[0][1]))
        if rank != 1:
            two = [None, None]
            collie.all_gather_object(two, (rank, "z" * (extra // 2 if rank else 1)), group=pair)
            got.append(two)
    return got


def test_objects_around_the_first_rounds_slot():
    want = [[], [], []]
    for extra in EXTRAS:
        for rank in range(3):
            want[rank] += [[3, extra, 3], (extra, 2)]
            if rank != 1:
                want[rank].append([(0, "z"), (2, "z" * (extra // 2))])
    assert run_ranks(_objects_body, 3, timeout=60) == want


def _torch_body(rank, size):
    import torch

    import collie
    from collie import group
    wrong = []
    for call in range(CALLS):
        for dtype in (torch.float32, torch.bfloat16, torch.int32):
            t = torch.arange(6, dtype=dtype).reshape(2, 3) * (rank + call)
            collie.all_reduce(t)
            want = torch.arange(6, dtype=dtype).reshape(2, 3) * sum(r + call for r in range(size))
            if not torch.equal(t, want):
                wrong.append(("all_reduce", str(dtype), call))
        g = torch.full((3,), float(rank + call), requires_grad=True)  # numpy() refuses it: the full path
        collie.all_reduce(g)
        if g.tolist() != [float(sum(r + call for r in range(size)))] * 3:
            wrong.append(("requires_grad", call))
        out = torch.empty(2 * size)
        collie.all_gather_into_tensor(out, torch.tensor([rank, call], dtype=torch.float32))
        if out.tolist() != [float(v) for r in range(size) for v in (r, call)]:
            wrong.append(("all_gather_into_tensor", call))
    lanes = group.world().group.lanes
    return wrong, sorted(f"{key[0]} {next(k for k in key if isinstance(k, np.dtype))}"
                         for key, lane in lanes.items() if lane is not None)


def test_torch_tensors_take_lanes_through_their_numpy_view(executor):
    pytest.importorskip("torch")
    for wrong, laned in run_ranks(_torch_body, 3, timeout=120):
        assert wrong == []
        # float32 and int32 all_reduce, float32 all_gather; bfloat16 has no NumPy view
        assert laned == (["all_gather float32", "all_reduce float32", "all_reduce int32"]
                         if executor == "c" else [])


def test_the_public_entries_stand_for_their_functions():
    """all_reduce, broadcast, reduce, all_gather_into_tensor,
    reduce_scatter_tensor and all_to_all_single are C entries (core.entry)
    where the core is built: what inspect, help and pickle see is the
    Python function's."""
    import inspect
    import pickle
    import collie
    from collie import collectives, core
    for name, first in (("all_reduce", "tensor"), ("broadcast", "tensor"), ("reduce", "tensor"),
                        ("all_gather_into_tensor", "output_tensor"), ("reduce_scatter_tensor", "output"),
                        ("all_to_all_single", "output")):
        entry = getattr(collie, name)
        assert entry is getattr(collectives, name)
        assert pickle.loads(pickle.dumps(entry)) is entry
        assert entry.__name__ == name and entry.__doc__ and entry.__module__ == "collie.collectives"
        function = getattr(entry, "__wrapped__", entry)
        assert inspect.signature(entry) == inspect.signature(function)
        assert list(inspect.signature(entry).parameters)[0] == first
        if core.Entry is not None:
            assert type(entry) is core.Entry and inspect.isfunction(function)


def _entry_forms_body(rank, size):
    """The ways a program may spell a repeated call: each must give NumPy's
    result and, after its first call, never take the full path (nor, where
    the core is built, the Python function at all)."""
    import sys
    import collie
    from collie import collectives, core
    laned = core.EXECUTE is core.execute  # under the Python executor every call takes the full path
    full = []
    real_run = collectives._run
    collectives._run = lambda g, name, *a, **k: (full.append(name), real_run(g, name, *a, **k))[1]
    world = collie.group.world().group
    calls = {
        "positional op and group": lambda x: collie.all_reduce(x, collie.ReduceOp.MAX, None),
        "keywords": lambda x: collie.all_reduce(x, group=world, op=collie.ReduceOp.MIN, async_op=False),
        "broadcast by group_src": lambda x: collie.broadcast(x, group_src=size - 1),
        "reduce, dst positional": lambda x: collie.reduce(x, 0, collie.ReduceOp.SUM),
        "reduce by keywords": lambda x: collie.reduce(x, dst=size - 1, op=collie.ReduceOp.PRODUCT, algorithm=None),
    }
    entered = []  # calls into the Python functions behind the entries

    def profile(frame, event, arg):
        if event == "call" and frame.f_code.co_filename == collectives.__file__ \
                and frame.f_code.co_name in ("all_reduce", "broadcast", "reduce"):
            entered.append(frame.f_code.co_name)

    wrong, first = [], {}
    for name, call in calls.items():
        for i in range(4):
            parts = [np.arange(3, dtype=np.float64) + r + i for r in range(size)]
            x = parts[rank].copy()
            before, inside = len(full), len(entered)
            sys.setprofile(profile)
            call(x)
            sys.setprofile(None)
            if i and laned and core.Entry is not None and len(entered) != inside:
                wrong.append((name, i, "entered the Python function"))
            if i == 0:
                first[name] = len(full) - before
            elif len(full) != before and laned:
                wrong.append((name, i, "took the full path"))
            want = {"positional op and group": np.max(parts, 0), "keywords": np.min(parts, 0),
                    "broadcast by group_src": parts[size - 1],
                    "reduce, dst positional": sum(parts) if rank == 0 else parts[rank],
                    "reduce by keywords": np.prod(parts, 0) if rank == size - 1 else parts[rank]}[name]
            if not np.array_equal(x, want):
                wrong.append((name, i, x.tolist(), want.tolist()))
    # what the entries leave to the Python function: AVG, async, a list, a bad keyword
    y = np.full(2, float(rank))
    collie.all_reduce(y, op=collie.ReduceOp.AVG)
    work = collie.all_reduce(z := np.ones(2), async_op=True)
    work.wait()
    try:
        collie.all_reduce(np.ones(2), colour="red")
        bad = "no error"
    except TypeError as exc:
        bad = str(exc)
    return wrong, first, y.tolist(), z.tolist(), bad


def test_every_spelling_of_a_repeated_call_takes_its_lane(executor):
    for rank, (wrong, first, avg, summed, bad) in enumerate(run_ranks(_entry_forms_body, 3)):
        assert wrong == []
        assert set(first.values()) == {1}  # the first call of each shape took the full path
        assert avg == [1.0, 1.0] and summed == [3.0, 3.0]
        assert "colour" in bad


def _two_array_body(rank, size):
    """The calls from an input into an output: new arrays of one shape on
    every call take the lane of the first (the entry remembers it); the
    same bytes in another shape, dtype or layout, or another op, must not."""
    import collie
    wrong = []
    base = np.arange(12, dtype=np.float32).reshape(4, 3)
    for i in range(4):
        out = np.empty((4 * size, 3), np.float32)
        collie.all_gather_into_tensor(out, base + rank + i)
        if not np.array_equal(out, np.concatenate([base + r + i for r in range(size)])):
            wrong.append(("all_gather", i))
        rs = np.empty((4 // size, 3), np.float32)
        collie.reduce_scatter_tensor(rs, base * (rank + 1) + i)
        want = sum(base * (r + 1) + i for r in range(size))
        if not np.array_equal(rs, np.split(want, size)[rank]):
            wrong.append(("reduce_scatter", i))
        a2a = np.empty((4, 3), np.float32)
        collie.all_to_all_single(a2a, base + 100 * rank + i)
        if not np.array_equal(a2a, np.concatenate([np.split(base + 100 * r + i, size)[rank] for r in range(size)])):
            wrong.append(("all_to_all", i))
    errors = []
    for bad in (lambda: collie.all_to_all_single(np.empty((3, 4), np.float32), np.ones((3, 4), np.float32)),
                lambda: collie.all_gather_into_tensor(np.empty((4 * size, 3), np.float32), np.ones((4, 3), np.int32))):
        try:  # the bytes of a remembered call: rows that do not split evenly, another dtype
            bad()
            errors.append(None)
        except (ValueError, TypeError) as exc:
            errors.append(type(exc).__name__)
    strided = np.zeros((4, 6), np.float32)
    strided[:, ::2] = base + rank
    out = np.empty((4 * size, 3), np.float32)
    collie.all_gather_into_tensor(out, strided[:, ::2])  # not contiguous: the full path copies it
    if not np.array_equal(out, np.concatenate([base + r for r in range(size)])):
        wrong.append("strided")
    rs = np.empty((4 // size, 3), np.float32)
    collie.reduce_scatter_tensor(rs, base * (rank + 1), op=collie.ReduceOp.AVG)  # not SUM's lane
    if not np.allclose(rs, np.split(sum(base * (r + 1) for r in range(size)) / size, size)[rank]):
        wrong.append("avg")
    return wrong, errors


def test_calls_from_an_input_into_an_output_take_their_lane_and_only_theirs(executor):
    for wrong, errors in run_ranks(_two_array_body, 2):
        assert wrong == []
        assert errors == ["ValueError", "TypeError"]


def _laned_body(rank, size):
    import collie
    from collie import collectives
    laned = collectives.laned(collie.all_reduce)
    x = np.full(3, rank + 1.0)
    first = laned(x)  # no lane yet: nothing is done
    untouched = x.tolist()
    collie.all_reduce(x)  # the full path, which makes the lane
    y = np.full(3, rank + 1.0)
    return first, untouched, laned(y), y.tolist()


def test_laned_runs_a_call_in_its_lane_or_does_nothing(executor):
    """collectives.laned, the MPI layer's way into collie's lanes."""
    total = 1.0 + 2.0 + 3.0
    for rank, (first, untouched, second, y) in enumerate(run_ranks(_laned_body, 3)):
        assert (first, untouched) == (False, [rank + 1.0] * 3)
        assert (second, y) == ((True, [total] * 3) if executor == "c" else (False, [rank + 1.0] * 3))
