"""Tests of the mpi4py-style API (collie.compat.mpi, also ``from collie import MPI``).

Each body runs on real collie ranks (tests/harness.py) that already joined
the world, so MPI.COMM_WORLD must wrap that world; bodies check their own
results against NumPy / plain Python and raise on a difference. World sizes
1 to 4 cover the cases MPI programs hit: a lone rank, a pair, odd and even.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from functools import reduce as fold
from pathlib import Path

import numpy as np
import pytest

from harness import run_ranks

pytestmark = pytest.mark.timeout(120)

SIZES = [1, 2, 3, 4]
ROOT = Path(__file__).resolve().parents[1]


def mpi():
    from collie.compat import mpi as MPI
    return MPI


def run(body, n, **kw):
    return run_ranks(body, n, timeout=90, **kw)


# ---- environment and constants ----

def test_namespace_constants():
    MPI = mpi()
    assert issubclass(MPI.Exception, __import__("collie").CollieError)
    assert MPI.Exception(MPI.ERR_ARG).Get_error_class() == MPI.ERR_ARG
    assert MPI.DOUBLE.Get_size() == 8 and MPI.INT.dtype == np.dtype(np.intc)
    assert MPI.INT64_T.dtype == np.int64 and MPI.BOOL.dtype == np.bool_
    assert MPI.COMPLEX.dtype == np.complex64 and MPI.DOUBLE_COMPLEX.dtype == np.complex128
    assert len({MPI.ANY_SOURCE, MPI.PROC_NULL, MPI.UNDEFINED}) == 3
    assert MPI.SUM([1], [2]) == [1, 2] and MPI.MAX(3, 5) == 5 and MPI.LXOR(1, 0) is True
    assert MPI.MAXLOC((3, 1), (3, 0)) == (3, 0) and MPI.MINLOC((1, 4), (2, 0)) == (1, 4)
    assert MPI.Wtick() > 0 and MPI.Wtime() <= MPI.Wtime()
    assert isinstance(MPI.Get_processor_name(), str)


def test_single_process_without_launcher():
    """Like mpi4py without mpiexec: a world of one, made on first use."""
    code = (
        "from collie.compat import mpi as MPI\n"
        "import numpy as np\n"
        "assert not MPI.Is_initialized()\n"
        "c = MPI.COMM_WORLD\n"
        "assert MPI.Is_initialized() and c.Get_rank() == 0 and c.Get_size() == 1\n"
        "out = np.empty(3); c.Allreduce(np.arange(3.0), out); assert out.tolist() == [0, 1, 2]\n"
        "c.send('me', dest=0, tag=4); assert c.recv(source=MPI.ANY_SOURCE) == 'me'\n"
        "assert MPI.COMM_SELF.allgather(7) == [7]\n"
        "MPI.Finalize(); assert MPI.Is_finalized()\n"
        "for attr in ('rank', 'size'):  # the world is gone: an error, not the old answer\n"
        "    try: getattr(c, attr)\n"
        "    except Exception as e: assert 'destroyed' in str(e), e\n"
        "    else: raise AssertionError(attr)\n"
        "print('ok')\n")
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK",
                        "LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID")}
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "ok"


def _world_body(rank, size):
    import collie
    MPI = mpi()
    comm = MPI.COMM_WORLD
    assert comm is MPI.COMM_WORLD and comm == MPI.COMM_WORLD
    assert (comm.Get_rank(), comm.Get_size(), comm.rank, comm.size) == (rank, size, rank, size)
    assert comm._group is collie.group.world().group
    assert MPI.COMM_SELF.size == 1 and MPI.COMM_SELF.rank == 0
    assert MPI.COMM_SELF.bcast(rank) == rank
    comm.Barrier()
    comm.barrier()
    return MPI.Is_initialized()


@pytest.mark.parametrize("n", SIZES)
def test_comm_world_wraps_initialized_world(n):
    assert run(_world_body, n) == [True] * n


# ---- lowercase: Python objects ----

def _objects_body(rank, size):
    MPI = mpi()
    comm = MPI.COMM_WORLD
    root = size - 1
    mine = {"rank": rank, "sq": [rank] * rank}
    everyone = [{"rank": r, "sq": [r] * r} for r in range(size)]

    assert comm.bcast(("hello", 42) if rank == root else None, root=root) == ("hello", 42)
    assert comm.scatter([r * 10 for r in range(size)] if rank == root else None, root=root) == rank * 10
    got = comm.gather(mine, root=root)
    assert got == (everyone if rank == root else None)
    assert comm.allgather(mine) == everyone
    assert comm.alltoall([(rank, q) for q in range(size)]) == [(r, rank) for r in range(size)]

    lists = [[r] * (r + 1) for r in range(size)]
    assert comm.allreduce([rank] * (rank + 1), op=MPI.SUM) == fold(lambda a, b: a + b, lists)
    red = comm.reduce(rank + 1, op=MPI.PROD, root=0)
    assert red == (fold(lambda a, b: a * b, range(1, size + 1)) if rank == 0 else None)
    for op, ref in [(MPI.SUM, sum(range(size))), (MPI.MIN, 0), (MPI.MAX, size - 1),
                    (MPI.LAND, all(range(size))), (MPI.LOR, any(range(size))),
                    (MPI.BAND, fold(lambda a, b: a & b, range(size))),
                    (MPI.BOR, fold(lambda a, b: a | b, range(size))),
                    (MPI.BXOR, fold(lambda a, b: a ^ b, range(size)))]:
        value = comm.allreduce(rank, op=op)
        assert bool(value) == bool(ref) if op in (MPI.LAND, MPI.LOR) else value == ref, (op, value, ref)
    assert comm.allreduce((rank % 2, rank), op=MPI.MAXLOC) == (1 if size > 1 else 0, 1 if size > 1 else 0)
    assert comm.allreduce(np.arange(3) * rank, op=MPI.MAX).tolist() == (np.arange(3) * (size - 1)).tolist()
    assert comm.allreduce(rank, op=lambda a, b: a * 10 + b) == fold(lambda a, b: a * 10 + b, range(size))
    assert comm.scan(rank, op=MPI.SUM) == sum(range(rank + 1))
    assert comm.exscan(rank, op=MPI.SUM) == (None if rank == 0 else sum(range(rank)))
    return True


@pytest.mark.parametrize("n", SIZES)
def test_lowercase_collectives(n):
    assert run(_objects_body, n) == [True] * n


def _mpi_pickle_body(rank, size):
    import json
    MPI = mpi()
    comm = MPI.COMM_WORLD
    calls = []

    def dumps(obj):
        calls.append("dumps")
        return json.dumps(obj).encode()

    def loads(data):
        calls.append("loads")
        return json.loads(bytes(data))

    big = ["x" * 600] * 2  # over the first round's slot: a second round
    MPI.pickle.__init__(dumps, loads)
    try:
        got = [comm.bcast((1, 2) if rank == 0 else None, root=0),   # json makes the tuple a list
               comm.bcast(big if rank == size - 1 else None, root=size - 1),
               comm.allgather((rank,)), comm.allgather(big if rank == 0 else rank),
               comm.allreduce([rank], op=MPI.SUM)]
    finally:
        MPI.pickle.__init__()
    return got, calls.count("dumps"), calls.count("loads")


@pytest.mark.parametrize("n", [2, 3])
def test_object_collectives_pickle_with_mpi_pickle(n):
    """The object collectives use MPI.pickle's dumps and loads, as mpi4py's
    do (an application may set dill, or json, there), small or large."""
    big = ["x" * 600] * 2
    for rank, (got, dumps, loads) in enumerate(run(_mpi_pickle_body, n)):
        assert got == [(1, 2) if rank == 0 else [1, 2], big, [[r] for r in range(n)], [big] + list(range(1, n)),
                       list(range(n))]
        # a root pickles its object once; each allgather pickles once and loads every rank's
        assert (dumps, loads) == ((rank == 0) + (rank == n - 1) + 3, (rank != 0) + (rank != n - 1) + 3 * n)


# ---- uppercase: buffers ----

def _buffers_body(rank, size):
    MPI = mpi()
    comm = MPI.COMM_WORLD
    root = size // 2
    n = 5

    def data(r, dtype=np.float64, k=n):
        return (np.arange(k) + 100 * r).astype(dtype)

    # Bcast: plain, [buf, type] and [buf, count, type]
    buf = data(rank) if rank == root else np.zeros(n)
    comm.Bcast(buf, root=root)
    assert buf.tolist() == data(root).tolist()
    ints = np.arange(4, dtype=np.int32) if rank == 0 else np.zeros(4, dtype=np.int32)
    comm.Bcast([ints, MPI.INT], root=0)
    assert ints.tolist() == [0, 1, 2, 3]
    part = np.arange(6.0) if rank == 0 else np.full(6, -1.0)
    comm.Bcast([part, 3, MPI.DOUBLE], root=0)
    assert part.tolist() == ([0, 1, 2, 3, 4, 5] if rank == 0 else [0, 1, 2, -1, -1, -1])

    # Scatter / Gather / Allgather / Alltoall
    big = np.arange(size * n, dtype=np.int64) if rank == root else None
    out = np.empty(n, dtype=np.int64)
    comm.Scatter(big, out, root=root)
    assert out.tolist() == list(range(rank * n, rank * n + n))
    gathered = np.empty((size, n)) if rank == root else None
    comm.Gather(data(rank), gathered, root=root)
    if rank == root:
        assert gathered.tolist() == [data(r).tolist() for r in range(size)]
    every = np.empty(size * n, dtype=np.float32)
    comm.Allgather([data(rank, np.float32), MPI.FLOAT], [every, MPI.FLOAT])
    assert every.tolist() == np.concatenate([data(r, np.float32) for r in range(size)]).tolist()
    send = np.array([[rank * 100 + q, -q] for q in range(size)], dtype=np.int16)
    recv = np.empty_like(send)
    comm.Alltoall(send, recv)
    assert recv.tolist() == [[r * 100 + rank, -rank] for r in range(size)]

    # Reduce / Allreduce with every buffer op, against NumPy
    cases = [(MPI.SUM, np.add, np.float64), (MPI.PROD, np.multiply, np.int64), (MPI.MIN, np.minimum, np.int32),
             (MPI.MAX, np.maximum, np.float32), (MPI.BAND, np.bitwise_and, np.uint8),
             (MPI.BOR, np.bitwise_or, np.int64), (MPI.BXOR, np.bitwise_xor, np.int32),
             (MPI.LAND, np.logical_and, np.int32), (MPI.LOR, np.logical_or, np.float64),
             (MPI.LXOR, np.logical_xor, np.int64)]
    for op, ufunc, dtype in cases:
        vals = [((np.arange(n) * (r + 3)) % 4 + (r % 2)).astype(dtype) for r in range(size)]
        ref = fold(ufunc, vals)
        ref = ((ref != 0) if op in (MPI.LAND, MPI.LOR, MPI.LXOR) else ref).astype(dtype)  # logical: 0/1
        mine = vals[rank].copy()
        res = np.full(n, 77, dtype=dtype)
        comm.Allreduce(mine, res, op=op)
        assert res.tolist() == ref.tolist(), (op, res, ref)
        assert mine.tolist() == vals[rank].tolist()  # the send buffer is unchanged
        res = np.full(n, 77, dtype=dtype)
        comm.Reduce(mine, res if rank == root else None, op=op, root=root)
        if rank == root:
            assert res.tolist() == ref.tolist(), (op, res, ref)

    # non-contiguous arrays are a BufferError, as in mpi4py (a derived datatype says the layout)
    strided = np.zeros((4, 2))
    with pytest.raises(BufferError, match="not contiguous"):
        comm.Allreduce(np.arange(4.0) + rank, strided[:, 1], op=MPI.SUM)
    with pytest.raises(BufferError, match="not contiguous"):
        comm.Isend(np.arange(4.0)[::2], dest=rank, tag=4)
    column = MPI.DOUBLE.Create_vector(4, 1, 2).Commit()
    comm.Sendrecv(np.arange(4.0), rank, 4, [strided.reshape(-1)[1:], 1, column], rank, 4)
    assert strided[:, 1].tolist() == [0.0, 1.0, 2.0, 3.0] and strided[:, 0].tolist() == [0.0] * 4
    column.Free()

    # Reduce_scatter_block, Reduce_scatter, Scan, Exscan
    contrib = np.arange(size * 2, dtype=np.float64) * (rank + 1)
    total = np.arange(size * 2, dtype=np.float64) * sum(range(1, size + 1))
    block = np.empty(2)
    comm.Reduce_scatter_block(contrib, block, op=MPI.SUM)
    assert block.tolist() == total[rank * 2:rank * 2 + 2].tolist()
    counts = [r + 1 for r in range(size)]
    contrib = np.arange(sum(counts), dtype=np.int64) + rank
    mine = np.empty(counts[rank], dtype=np.int64)
    comm.Reduce_scatter(contrib, mine, recvcounts=counts, op=MPI.MAX)
    start = sum(counts[:rank])
    assert mine.tolist() == (np.arange(sum(counts)) + size - 1)[start:start + counts[rank]].tolist()
    mine2 = np.empty(counts[rank], dtype=np.int64)
    comm.Reduce_scatter(contrib, mine2, op=MPI.MAX)  # counts from every rank's recvbuf
    assert mine2.tolist() == mine.tolist()
    scan = np.empty(3, dtype=np.int64)
    comm.Scan(np.full(3, rank + 1, dtype=np.int64), scan, op=MPI.SUM)
    assert scan.tolist() == [sum(range(1, rank + 2))] * 3
    ex = np.full(3, -5, dtype=np.int64)
    comm.Exscan(np.full(3, rank + 1, dtype=np.int64), ex, op=MPI.PROD)
    assert ex.tolist() == ([-5] * 3 if rank == 0 else [fold(lambda a, b: a * b, range(1, rank + 1))] * 3)
    return True


@pytest.mark.parametrize("n", SIZES)
def test_uppercase_collectives(n):
    assert run(_buffers_body, n) == [True] * n


def _vector_body(rank, size):
    MPI = mpi()
    comm = MPI.COMM_WORLD
    root = 0
    counts = [r + 1 for r in range(size)]             # uneven blocks
    displs = [sum(counts[:r]) + 2 * r for r in range(size)]  # with gaps between them
    width = displs[-1] + counts[-1] + 1

    # Scatterv: root's (counts, displs) blocks, one per rank
    src = np.arange(width, dtype=np.float64) if rank == root else None
    out = np.empty(counts[rank])
    comm.Scatterv([src, (counts, displs), MPI.DOUBLE] if rank == root else None, out, root=root)
    assert out.tolist() == list(range(displs[rank], displs[rank] + counts[rank]))

    # Gatherv back into root's gapped layout; the gaps stay untouched
    dst = np.full(width, -1.0) if rank == root else None
    comm.Gatherv(out, [dst, (counts, displs), MPI.DOUBLE] if rank == root else None, root=root)
    if rank == root:
        ref = np.full(width, -1.0)
        for r in range(size):
            ref[displs[r]:displs[r] + counts[r]] = range(displs[r], displs[r] + counts[r])
        assert dst.tolist() == ref.tolist()

    # Allgatherv with [buf, counts] (contiguous displacements)
    every = np.empty(sum(counts), dtype=np.int32)
    comm.Allgatherv(np.full(counts[rank], rank, dtype=np.int32), [every, counts])
    assert every.tolist() == [r for r in range(size) for _ in range(counts[r])]

    # Alltoallv: rank r sends q+1 copies of (10r + q) to rank q, at gapped offsets
    scounts = [q + 1 for q in range(size)]
    sdispls = [sum(scounts[:q]) + q for q in range(size)]
    sbuf = np.full(sdispls[-1] + scounts[-1], -9, dtype=np.int64)
    for q in range(size):
        sbuf[sdispls[q]:sdispls[q] + scounts[q]] = 10 * rank + q
    rcounts = [rank + 1] * size
    rdispls = [r * (rank + 2) for r in range(size)]
    rbuf = np.full(rdispls[-1] + rcounts[-1], -1, dtype=np.int64)
    comm.Alltoallv([sbuf, (scounts, sdispls), MPI.INT64_T], [rbuf, (rcounts, rdispls), MPI.INT64_T])
    for r in range(size):
        assert rbuf[rdispls[r]:rdispls[r] + rcounts[r]].tolist() == [10 * r + rank] * (rank + 1)
        if r < size - 1:
            assert rbuf[rdispls[r] + rcounts[r]] == -1  # the gap
    return True


@pytest.mark.parametrize("n", SIZES)
def test_vector_collectives(n):
    assert run(_vector_body, n) == [True] * n


def _in_place_body(rank, size):
    MPI = mpi()
    comm = MPI.COMM_WORLD
    root = size - 1

    x = np.arange(4.0) + rank
    comm.Allreduce(MPI.IN_PLACE, x, op=MPI.SUM)
    assert x.tolist() == (np.arange(4.0) * size + sum(range(size))).tolist()

    y = np.arange(3, dtype=np.int64) * (rank + 1)
    if rank == root:
        comm.Reduce(MPI.IN_PLACE, y, op=MPI.MAX, root=root)
        assert y.tolist() == (np.arange(3) * size).tolist()
    else:
        comm.Reduce(y, None, op=MPI.MAX, root=root)

    g = np.full((size, 2), -1, dtype=np.int32)
    g[rank] = [rank, rank * rank]
    if rank == root:
        comm.Gather(MPI.IN_PLACE, g, root=root)
        assert g.tolist() == [[r, r * r] for r in range(size)]
    else:
        comm.Gather(g[rank], None, root=root)

    s = np.arange(size * 2, dtype=np.float64) if rank == root else np.empty(2)
    if rank == root:
        comm.Scatter(s, MPI.IN_PLACE, root=root)
        assert s.tolist() == list(range(size * 2))
    else:
        comm.Scatter(None, s, root=root)
        assert s.tolist() == [2 * rank, 2 * rank + 1]

    a = np.zeros(size * 2, dtype=np.int64)
    a[2 * rank:2 * rank + 2] = rank + 1
    comm.Allgather(MPI.IN_PLACE, a)
    assert a.tolist() == [r + 1 for r in range(size) for _ in range(2)]

    t = np.array([10 * rank + q for q in range(size)], dtype=np.int64)
    comm.Alltoall(MPI.IN_PLACE, t)
    assert t.tolist() == [10 * r + rank for r in range(size)]

    rs = np.arange(size * 3, dtype=np.float64) * (rank + 1)
    comm.Reduce_scatter_block(MPI.IN_PLACE, rs, op=MPI.SUM)
    k = sum(range(1, size + 1))
    assert rs[:3].tolist() == (np.arange(3 * rank, 3 * rank + 3) * k).tolist()

    sc = np.full(2, rank + 1, dtype=np.int64)
    comm.Scan(MPI.IN_PLACE, sc, op=MPI.SUM)
    assert sc.tolist() == [sum(range(1, rank + 2))] * 2

    ex = np.full(2, rank + 1, dtype=np.int64)
    comm.Exscan(MPI.IN_PLACE, ex, op=MPI.SUM)
    if rank > 0:
        assert ex.tolist() == [sum(range(1, rank + 1))] * 2

    counts = [r + 1 for r in range(size)]
    rsc = np.arange(sum(counts), dtype=np.int64) * (rank + 1)
    comm.Reduce_scatter(MPI.IN_PLACE, rsc, recvcounts=counts, op=MPI.SUM)
    start = sum(counts[:rank])
    assert rsc[:counts[rank]].tolist() == (np.arange(start, start + counts[rank]) * k).tolist()

    # v-variants: root's own block stays where it is
    displs = [sum(counts[:r]) for r in range(size)]
    v = np.full(sum(counts), -1.0)
    v[displs[rank]:displs[rank] + counts[rank]] = rank
    if rank == root:
        comm.Gatherv(MPI.IN_PLACE, [v, (counts, displs), MPI.DOUBLE], root=root)
        assert v.tolist() == [float(r) for r in range(size) for _ in range(counts[r])]
        comm.Scatterv([v * 2, (counts, displs), MPI.DOUBLE], MPI.IN_PLACE, root=root)
    else:
        comm.Gatherv(v[displs[rank]:displs[rank] + counts[rank]], None, root=root)
        mine = np.empty(counts[rank])
        comm.Scatterv(None, mine, root=root)
        assert mine.tolist() == [2.0 * rank] * counts[rank]
    w = np.full(sum(counts), -1, dtype=np.int32)
    w[displs[rank]:displs[rank] + counts[rank]] = rank
    comm.Allgatherv(MPI.IN_PLACE, [w, counts])
    assert w.tolist() == [r for r in range(size) for _ in range(counts[r])]
    av = np.array([10 * rank + q for q in range(size)], dtype=np.int64)
    comm.Alltoallv(MPI.IN_PLACE, [av, [1] * size])
    assert av.tolist() == [10 * r + rank for r in range(size)]

    # IN_PLACE as a send buffer is only for the root of rooted collectives
    if rank != root:
        for call in (lambda: comm.Reduce(MPI.IN_PLACE, y, root=root),
                     lambda: comm.Gather(MPI.IN_PLACE, g, root=root)):
            try:
                call()
            except ValueError:
                pass
            else:
                raise AssertionError("IN_PLACE at a non-root was accepted")
    return True


@pytest.mark.parametrize("n", SIZES)
def test_in_place(n):
    assert run(_in_place_body, n) == [True] * n


# ---- communicators: Split, Dup, Free ----

def _split_body(rank, size):
    MPI = mpi()
    comm = MPI.COMM_WORLD
    # two colors; keys reverse the order within each color
    sub = comm.Split(color=rank % 2, key=-rank)
    members = [r for r in range(size) if r % 2 == rank % 2]
    assert sub.Get_size() == len(members)
    assert sub.Get_rank() == sorted(members, reverse=True).index(rank)
    assert sub.allgather(rank) == sorted(members, reverse=True)
    total = np.empty(1)
    sub.Allreduce(np.array([float(rank)]), total)
    assert total[0] == sum(members)
    # a message in the sub-communicator: to sub-rank 0, ANY_SOURCE
    if sub.size > 1:
        if sub.rank == 1:
            sub.send(rank, dest=0, tag=9)
        elif sub.rank == 0:
            st = MPI.Status()
            assert sub.recv(source=MPI.ANY_SOURCE, status=st) == sorted(members, reverse=True)[1]
            assert st.Get_source() == 1 and st.Get_tag() == 9  # ranks of the sub-communicator

    # UNDEFINED: rank 0 stays out
    part = comm.Split(MPI.UNDEFINED if rank == 0 else 1, key=rank)
    if rank == 0:
        assert part == MPI.COMM_NULL and not part
    else:
        assert part.size == size - 1 and part.rank == rank - 1
        assert part.allreduce(1) == size - 1
        part.Free()
        assert part == MPI.COMM_NULL

    # Dup: same ranks, messages kept apart from the original
    dup = comm.Dup()
    assert dup != comm and (dup.rank, dup.size) == (rank, size)
    if size > 1:
        if rank == 0:
            dup.send("on dup", dest=1, tag=0)
            comm.send("on world", dest=1, tag=0)
        elif rank == 1:
            assert comm.recv(source=0, tag=0) == "on world"
            assert dup.recv(source=0, tag=0) == "on dup"
    assert dup.bcast(rank * 2 if rank == 0 else None) == 0
    dup.Free()
    sub.Free()
    comm.Barrier()
    return True


@pytest.mark.parametrize("n", SIZES)
def test_split_and_dup(n):
    assert run(_split_body, n) == [True] * n


def _create_disjoint_body(rank, size):
    """Comm.Create with disjoint groups (MPI-2.2): one communicator per group;
    Comm.Bcast called unbound runs the communicator's own Bcast."""
    MPI = mpi()
    world = MPI.COMM_WORLD
    half = (size + 1) // 2
    mine = list(range(half)) if rank < half else list(range(half, size))
    sub = world.Create(world.Get_group().Incl(mine))
    assert sub.Get_size() == len(mine) and sub.Get_rank() == mine.index(rank)
    buf = np.array([rank], dtype="i")
    MPI.Comm.Bcast(sub, [buf, MPI.INT], root=0)
    assert buf[0] == mine[0]
    with pytest.raises(MPI.Exception):
        MPI.Comm.Bcast(MPI.COMM_NULL, [buf, MPI.INT], root=0)
    sub.Free()
    return True


@pytest.mark.parametrize("n", [2, 3])
def test_create_with_disjoint_groups(n):
    assert run(_create_disjoint_body, n) == [True] * n


def _free_type_while_receiving_body(rank, size):
    """MPI lets a datatype be freed while a receive that uses it is pending."""
    MPI = mpi()
    comm = MPI.COMM_WORLD
    t = MPI.INT.Create_vector(3, 1, 2).Commit()
    if rank == 0:
        comm.Send([np.arange(6, dtype="i"), 1, t], dest=1)
        t.Free()
        return True
    out = np.full(6, -1, dtype="i")
    req = comm.Irecv([out, 1, t], source=0)
    t.Free()
    req.Wait()
    return out.tolist()


def test_datatype_freed_while_a_receive_is_pending():
    assert run(_free_type_while_receiving_body, 2) == [True, [0, -1, 2, -1, 4, -1]]


# ---- point to point ----

def _matching_body(rank, size):
    MPI = mpi()
    comm = MPI.COMM_WORLD
    if rank == 0:
        # receive in another tag order than sent; then ANY_TAG takes what is left, in order
        st = MPI.Status()
        assert comm.recv(source=1, tag=3, status=st) == "t3"
        assert (st.Get_source(), st.Get_tag(), st.source, st.tag) == (1, 3, 1, 3)
        assert comm.recv(source=1, tag=1) == "t1"
        assert comm.recv(source=1, tag=MPI.ANY_TAG, status=st) == "t2" and st.tag == 2
        assert comm.recv(source=1, tag=MPI.ANY_TAG) == "t2-again"  # same tag: arrival order
        # ANY_SOURCE: one message from every other rank, each tagged with its sender
        seen = set()
        for _ in range(size - 1):
            obj = comm.recv(source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG, status=st)
            assert obj == ("hi", st.source) and st.tag == 100 + st.source
            seen.add(st.source)
        assert seen == set(range(1, size))
        comm.Barrier()  # rank 1 sends its buffers only now, so the loop above cannot take them
        # buffers: a larger receive buffer, Status counts, Probe then Recv
        assert comm.Probe(source=1, tag=7, status=st)
        assert st.Get_count(MPI.DOUBLE) == 3 and st.Get_count() == 24 and st.Get_elements(MPI.DOUBLE) == 3
        got = np.full(10, -1.0)
        comm.Recv([got, MPI.DOUBLE], source=MPI.ANY_SOURCE, tag=7, status=st)
        assert got[:3].tolist() == [1.5, 2.5, 3.5] and got[3] == -1 and st.Get_count(MPI.DOUBLE) == 3
        assert st.Get_count(MPI.INT64_T) == 3 and st.Get_count(MPI.COMPLEX) == 3
        assert st.Get_count(MPI.DOUBLE_COMPLEX) == MPI.UNDEFINED
        # Iprobe: nothing pending, then the message rank 1 sends after a barrier
        assert not comm.Iprobe(source=1, tag=8)
        comm.Barrier()
        while not comm.Iprobe(source=1, tag=8, status=st):
            pass
        assert st.Get_count(MPI.INT) == 2
        ints = np.empty(2, dtype=np.intc)
        comm.Recv(ints, source=1, tag=8)
        assert ints.tolist() == [4, 5]
    elif rank == 1:
        for t, obj in [(1, "t1"), (2, "t2"), (3, "t3"), (2, "t2-again")]:
            comm.send(obj, dest=0, tag=t)
        comm.send(("hi", 1), dest=0, tag=101)
        comm.Barrier()
        comm.Send([np.array([1.5, 2.5, 3.5]), MPI.DOUBLE], dest=0, tag=7)
        comm.Barrier()
        comm.Send(np.array([4, 5], dtype=np.intc), dest=0, tag=8)
    else:
        comm.send(("hi", rank), dest=0, tag=100 + rank)
        comm.Barrier()
        comm.Barrier()
    # PROC_NULL: sends vanish, receives complete at once with an empty status
    st = MPI.Status()
    comm.send("lost", dest=MPI.PROC_NULL)
    assert comm.recv(source=MPI.PROC_NULL, status=st) is None and st.source == MPI.PROC_NULL
    comm.Recv(np.empty(2), source=MPI.PROC_NULL, status=st)
    assert st.Get_count() == 0
    return True


@pytest.mark.parametrize("n", [2, 3, 4])
def test_any_source_any_tag_and_status(n):
    assert run(_matching_body, n) == [True] * n


def _peer_left_body(rank, size):
    """An ANY_SOURCE receive leaves envelope receives posted on other peers;
    those peers leaving is no error until a receive needs them."""
    import time
    MPI = mpi()
    comm = MPI.COMM_WORLD
    if rank == 1:
        comm.send("from 1", dest=0)
    if rank != 0:
        return True  # leaves the world (the harness destroys it)
    assert comm.recv(source=MPI.ANY_SOURCE) == "from 1"
    time.sleep(1.0)  # ranks 1 and 2 are gone by now
    comm.send("self", dest=0, tag=2)
    assert comm.recv(source=0, tag=2) == "self"
    for source in (2, MPI.ANY_SOURCE):
        try:
            comm.recv(source=source)
        except MPI.Exception as exc:
            assert "left" in str(exc), exc
        else:
            raise AssertionError("a receive from a rank that left did not fail")
    return True


@pytest.mark.parametrize("backend", ["shm", "tcp"])
def test_receive_from_a_rank_that_left(backend):
    assert run(_peer_left_body, 3, backend=backend) == [True] * 3


def _nonblocking_body(rank, size):
    MPI = mpi()
    comm = MPI.COMM_WORLD
    right, left = (rank + 1) % size, (rank - 1) % size

    # Irecv before a blocking Send, both ways at once, messages larger than the
    # shared-memory rings: completes only if Send's wait also drains receives.
    n = 1 << 20  # 8 MiB of float64
    out = np.full(n, float(rank))
    got = np.empty(n)
    req = comm.Irecv(got, source=left, tag=1)
    comm.Send(out, dest=right, tag=1)
    st = MPI.Status()
    req.Wait(st)
    assert got[0] == left and got[-1] == left and st.source == left and st.Get_count(MPI.DOUBLE) == n

    # Isend/Irecv + Waitall, several messages in flight per pair, posted in reverse tag order
    recvs = [np.empty(3, dtype=np.int64) for _ in range(3)]
    reqs = [comm.Irecv(recvs[t], source=left, tag=t) for t in reversed(range(3))]
    reqs += [comm.Isend(np.full(3, 10 * rank + t, dtype=np.int64), dest=right, tag=t) for t in range(3)]
    statuses = [MPI.Status() for _ in reqs]
    MPI.Request.Waitall(reqs, statuses)
    assert [r.tolist() for r in recvs] == [[10 * left + t] * 3 for t in range(3)]
    assert [s.tag for s in statuses[:3]] == [2, 1, 0]

    # objects: irecv().wait() returns the object; Test polls; waitall collects
    rq = comm.irecv(source=left, tag=5)
    sq = comm.isend({"from": rank}, dest=right, tag=5)
    while True:
        done, obj = rq.test()
        if done:
            break
    assert obj == {"from": left}
    sq.wait()
    reqs = [comm.irecv(source=MPI.ANY_SOURCE, tag=6), comm.isend(rank, dest=right, tag=6)]
    assert MPI.Request.waitall(reqs) == [left, None]
    reqs = [comm.isend(rank * 3, dest=right, tag=7), comm.irecv(source=left, tag=7)]
    seen, got = set(), {}
    while len(seen) < 2:
        index, obj = MPI.Request.waitany([r for i, r in enumerate(reqs) if i not in seen] or reqs)
        remaining = [i for i in range(2) if i not in seen]
        seen.add(remaining[index])
        got[remaining[index]] = obj
    assert got == {0: None, 1: left * 3}
    assert reqs[1].wait() is None  # completed: it is REQUEST_NULL now, as in mpi4py

    # a cancelled receive never takes a message
    cq = comm.Irecv(np.empty(1), source=left, tag=99)
    cq.Cancel()
    st = MPI.Status()
    cq.Wait(st)
    assert st.Is_cancelled()

    # non-blocking collectives
    x = np.full(2, float(rank))
    r1 = comm.Iallreduce(MPI.IN_PLACE, x, op=MPI.SUM)
    b = np.arange(3) if rank == 0 else np.zeros(3, dtype=np.int64)
    r2 = comm.Ibcast(b, root=0)
    MPI.Request.Waitall([r1, r2, comm.Ibarrier()])
    assert x.tolist() == [sum(range(size))] * 2 and b.tolist() == [0, 1, 2]
    return True


@pytest.mark.parametrize("n", SIZES)
def test_nonblocking(n):
    assert run(_nonblocking_body, n) == [True] * n


def _ring_body(rank, size):
    MPI = mpi()
    comm = MPI.COMM_WORLD
    right, left = (rank + 1) % size, (rank - 1) % size
    # pass a token all the way round: after size steps every rank has its own back
    token = np.array([rank, rank * rank], dtype=np.int64)
    for _ in range(size):
        nxt = np.empty_like(token)
        comm.Sendrecv(token, dest=right, sendtag=11, recvbuf=nxt, source=left, recvtag=11)
        token = nxt
    assert token.tolist() == [rank, rank * rank]
    st = MPI.Status()
    assert comm.sendrecv(("obj", rank), dest=right, source=left, status=st) == ("obj", left)
    assert st.source == left
    buf = np.full(4, float(rank))
    comm.Sendrecv_replace(buf, dest=right, source=left)
    assert buf.tolist() == [float(left)] * 4
    # to oneself (always legal in MPI): delivered locally
    comm.send("self", dest=rank, tag=1)
    assert comm.recv(source=rank, tag=1) == "self"
    return True


@pytest.mark.parametrize("n", SIZES)
def test_sendrecv_ring(n):
    assert run(_ring_body, n) == [True] * n


@pytest.mark.parametrize("body", [_matching_body, _nonblocking_body, _ring_body], ids=lambda b: b.__name__)
def test_point_to_point_over_tcp(body):
    """The same matching on the other transport (it buffers unexpected messages differently)."""
    assert run(body, 3, backend="tcp") == [True] * 3


def _errors_body(rank, size):
    MPI = mpi()
    comm = MPI.COMM_WORLD
    errors = []

    def expect(kind, fn):
        try:
            fn()
        except kind as exc:
            errors.append(type(exc).__name__)
        else:
            raise AssertionError(f"no {kind.__name__} from {fn}")

    expect(ValueError, lambda: comm.send(1, dest=size))
    expect(ValueError, lambda: comm.send(1, dest=0, tag=-3))
    expect(TypeError, lambda: comm.send(1, dest="0"))
    expect(ValueError, lambda: comm.Recv(b"read-only", source=0))
    expect(ValueError, lambda: comm.Split(-7))
    expect(NotImplementedError, lambda: comm.Allreduce(np.zeros(2), np.zeros(2), op=MPI.MAXLOC))
    expect(ValueError, lambda: comm.Allreduce(np.zeros(2), np.zeros(2, dtype=np.int64)))
    expect(ValueError, lambda: comm.Bcast([np.zeros(2), 5, MPI.DOUBLE]))
    expect(ValueError, lambda: comm.Scatter(None, [np.zeros(2), 3, MPI.DOUBLE]))  # every rank raises
    expect(MPI.Exception, lambda: MPI.COMM_NULL.Get_rank())
    expect(MPI.Exception, lambda: MPI.COMM_NULL.rank)  # the core's rank and size explain as Get_rank does
    expect(MPI.Exception, lambda: MPI.COMM_NULL.size)
    # a message larger than the receive buffer: MPI.Exception (truncation)
    comm.Send(np.arange(4.0), dest=rank, tag=3)
    expect(MPI.Exception, lambda: comm.Recv(np.empty(2), source=rank, tag=3))
    return errors


@pytest.mark.parametrize("n", [1, 2])
def test_errors(n):
    for errors in run(_errors_body, n):
        assert errors.count("Exception") == 4


# ---- the example programs under `collie run` ----

EXAMPLES = ROOT / "examples" / "mpi"


def _launch(script: str, n: int = 3) -> str:
    res = subprocess.run([sys.executable, "-m", "collie", "run", "-n", str(n), str(EXAMPLES / script)],
                         capture_output=True, text=True, timeout=90, cwd=ROOT)
    assert res.returncode == 0, f"{script} failed:\n{res.stdout}\n{res.stderr}"
    return res.stdout


def test_from_collie_import_MPI():
    """The examples' import line: collie/__init__.py exposes this module as MPI."""
    from collie import MPI
    assert MPI is mpi()


def test_examples_run_under_collie_run():
    assert sorted(p.name for p in EXAMPLES.glob("*.py")) == [
        "bcast_scatter_gather.py", "compute_pi.py", "helloworld.py", "p2p_numpy.py", "p2p_objects.py",
        "ring.py"]
    out = _launch("helloworld.py")
    for r in range(3):
        assert f"Hello, World! I am process {r} of 3 on" in out
    out = _launch("p2p_objects.py")
    assert "rank 1 received {'a': 7, 'b': 3.14} from rank 0" in out
    out = _launch("p2p_numpy.py")
    assert "rank 1 received [0 1 2 3 4 5 6 7 8 9]" in out
    assert "rank 1 received [0. 1. 2. 3. 4. 5. 6. 7. 8. 9.]" in out
    out = _launch("bcast_scatter_gather.py")
    assert "bcast: rank 2 has {'key1': [7, 2.72, (2+3j)], 'key2': ('abc', 'xyz')}" in out
    assert "scatter: rank 2 has 9" in out
    assert "gather: rank 0 has [1, 4, 9]" in out
    out = _launch("compute_pi.py")
    assert "pi is approximately 3.1415926" in out and "error" in out
    out = _launch("ring.py")
    assert "rank 0 got the token back after 3 hops: 3" in out


# ---- against MPICH itself ----

@pytest.mark.parametrize("n,seed", [(2, 23), (3, 21), (4, 24), (5, 25)])
def test_a_random_program_gives_what_mpich_gives(n, seed, tmp_path):
    """tests/mpi_random_program.py, a seeded random sequence of 100 calls
    (collectives with in-place and v-variants, scans, any-source receives,
    exchanges over every rank with itself included, object methods, Split),
    under mpi4py on MPICH and under collie.MPI: every
    rank must receive the same bytes in both, call by call. (The seeds are
    ones MPICH runs: some others crash it, a segfault in UCX, such as during
    an in-place Reduce of 23,265 int64 on 4 ranks.)"""
    pytest.importorskip("mpi4py")
    if not shutil.which("mpiexec"):
        pytest.skip("mpiexec not found (apt-get install mpich)")
    program = str(ROOT / "tests" / "mpi_random_program.py")
    for command in (["mpiexec", "-n", str(n), sys.executable, program, "mpi4py"],
                    [sys.executable, "-m", "collie", "run", "-n", str(n), program, "collie"]):
        res = subprocess.run(command + [str(seed), "100", str(tmp_path)], capture_output=True, text=True,
                             timeout=100, cwd=ROOT)
        assert res.returncode == 0, f"{' '.join(command)} failed:\n{res.stdout}\n{res.stderr}"
    for rank in range(n):
        mpich = (tmp_path / f"mpi4py.{rank}").read_text().splitlines()
        ours = (tmp_path / f"collie.{rank}").read_text().splitlines()
        assert len(mpich) == len(ours) > 0
        for theirs, mine in zip(mpich, ours):
            assert mine == theirs, f"rank {rank}: MPICH received {theirs!r}, collie {mine!r}"


# ---- persistent collectives, topologies, neighbour collectives, Alltoallw ----

def _persistent_body(rank, size):
    MPI = mpi()
    comm = MPI.COMM_WORLD
    x = np.zeros(3)
    out = np.empty(3)
    req = comm.Allreduce_init(x, out, op=MPI.SUM)
    for step in range(3):  # each Start reads the buffer as it is then
        x[:] = rank + step
        req.Start()
        req.Wait()
        assert out.tolist() == [sum(range(size)) + step * size] * 3
    req.Free()
    assert not req
    b = np.arange(4) if rank == size - 1 else np.zeros(4, dtype=np.int64)
    bq = comm.Bcast_init(b, root=size - 1)
    MPI.Prequest.Startall([bq, comm.Barrier_init()])
    bq.Wait()
    assert b.tolist() == [0, 1, 2, 3]
    return True


@pytest.mark.parametrize("n", [1, 2, 3])
def test_persistent_collectives(n):
    assert run(_persistent_body, n) == [True] * n


def _topology_body(rank, size):
    MPI = mpi()
    comm = MPI.COMM_WORLD
    # a periodic ring and a non-periodic line, row-major ranks
    ring = comm.Create_cart([size], periods=[True])
    assert ring.topology == MPI.CART and ring.coords == [rank] and ring.Get_coords(rank) == [rank]
    assert ring.Shift(0, 1) == ((rank - 1) % size, (rank + 1) % size)
    line = comm.Create_cart([size], periods=False)
    src, dst = line.Shift(0, 1)
    assert src == (rank - 1 if rank > 0 else MPI.PROC_NULL) and dst == (rank + 1 if rank < size - 1 else MPI.PROC_NULL)
    # neighbour collectives agree with NumPy: in-neighbour j is (rank -/+ 1), slot order -1, +1
    send = np.array([10 * rank, 10 * rank + 1], dtype=np.int64)  # block 0 to rank-1, block 1 to rank+1
    got = np.full(2, -1, dtype=np.int64)
    ring.Neighbor_alltoall(send, got)
    left, right = (rank - 1) % size, (rank + 1) % size
    assert got.tolist() == [10 * left + 1, 10 * right], got  # what left sent right, what right sent left
    got = np.full(2, -1, dtype=np.int64)
    line.Ineighbor_allgather(np.array([rank], dtype=np.int64), got).Wait()
    assert got.tolist() == [rank - 1 if rank > 0 else -1, rank + 1 if rank < size - 1 else -1]
    assert line.neighbor_allgather(rank) == [rank - 1 if rank > 0 else None, rank + 1 if rank < size - 1 else None]
    # a 2-D grid when the size allows, and its rows
    if size % 2 == 0 and size > 2:
        grid = comm.Create_cart([2, size // 2], periods=[False, True])
        r, c = divmod(rank, size // 2)
        assert grid.coords == [r, c] and grid.Get_cart_rank([r, c + 1]) == r * (size // 2) + (c + 1) % (size // 2)
        row = grid.Sub([False, True])
        assert row.Get_size() == size // 2 and row.coords == [c]
    # cartesian grids larger than the communicator fail on every rank
    try:
        comm.Create_cart([size + 1])
    except MPI.Exception as exc:
        assert exc.Get_error_class() == MPI.ERR_DIMS
    else:
        raise AssertionError("Create_cart of size + 1 ranks")
    # a distributed graph: every rank sends to the next two
    dg = comm.Create_dist_graph_adjacent([(rank - 1) % size, (rank - 2) % size],
                                         [(rank + 1) % size, (rank + 2) % size], [1, 2], [3, 4])
    assert dg.Get_dist_neighbors() == ([(rank - 1) % size, (rank - 2) % size],
                                       [(rank + 1) % size, (rank + 2) % size], ([1, 2], [3, 4]))
    got = dg.neighbor_alltoall([("to", (rank + 1) % size), ("to", (rank + 2) % size)])
    assert got == [("to", rank), ("to", rank)]
    # the same graph from Create_dist_graph (each rank names its own out-edges)
    dg2 = comm.Create_dist_graph([rank], [2], [(rank + 1) % size, (rank + 2) % size])
    ins, outs, w = dg2.Get_dist_neighbors()
    assert sorted(ins) == sorted([(rank - 1) % size, (rank - 2) % size]) and w is None
    # a graph given whole, and copies keep the topology
    index = [2 * (i + 1) for i in range(size)]
    edges = [e for i in range(size) for e in ((i - 1) % size, (i + 1) % size)]
    g = comm.Create_graph(index, edges)
    assert g.neighbors == [(rank - 1) % size, (rank + 1) % size]
    assert type(g.Dup()) is MPI.Graphcomm and type(MPI.Comm.fromint(g.toint())) is MPI.Graphcomm
    try:
        MPI.Cartcomm(g)
    except TypeError:
        pass
    else:
        raise AssertionError("Cartcomm of a graph")
    # an ANY_TAG receive never takes a neighbour collective's message
    if size > 1:
        if rank == 0:
            ring.Send(np.array([7], dtype=np.int64), dest=1, tag=3)
        got = np.full(2, -1, dtype=np.int64)
        ring.Neighbor_allgather(np.array([rank], dtype=np.int64), got)
        if rank == 1:
            box = np.zeros(1, dtype=np.int64)
            st = MPI.Status()
            ring.Recv(box, source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG, status=st)
            assert box[0] == 7 and st.tag == 3
    for c in (ring, line, dg, dg2, g):
        c.Free()
    return True


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_topologies_and_neighbour_collectives(n):
    assert run(_topology_body, n) == [True] * n


def _alltoallw_body(rank, size):
    MPI = mpi()
    comm = MPI.COMM_WORLD
    # rank r sends r + q + 1 int32 to q, at byte displacements with gaps, and
    # receives float64 (raw bytes of the same values viewed as int32 pairs)
    counts = [rank + q + 1 for q in range(size)]
    sdispls = [sum(c * 4 + 8 for c in counts[:q]) for q in range(size)]
    send = np.zeros(sum(counts) + 2 * size, dtype=np.int32)
    for q in range(size):
        send.view(np.uint8)[sdispls[q]:sdispls[q] + 4 * counts[q]].view(np.int32)[:] = 100 * rank + q
    rcounts = [p + rank + 1 for p in range(size)]
    rdispls = [4 * sum(rcounts[:p]) for p in range(size)]
    recv = np.full(sum(rcounts), -1, dtype=np.int32)
    comm.Alltoallw([send, (counts, sdispls), [MPI.INT] * size], [recv, (rcounts, rdispls), [MPI.INT] * size])
    want = np.concatenate([np.full(rcounts[p], 100 * p + rank, dtype=np.int32) for p in range(size)])
    assert np.array_equal(recv, want), (recv, want)
    return True


@pytest.mark.parametrize("n", [1, 2, 3])
def test_alltoallw(n):
    assert run(_alltoallw_body, n) == [True] * n


def test_datatype_codes():
    MPI = mpi()
    for code in "bhilqBHILQfdgFDG":
        t = MPI.Datatype.fromcode(code)
        assert t.dtype == np.dtype(code) and MPI.Datatype.fromcode(t.tocode()) == t
    assert MPI.Datatype.fromcode("i4") == MPI.INT32_T and MPI.Datatype.fromcode("Zd") == MPI.C_DOUBLE_COMPLEX
    with pytest.raises(ValueError):
        MPI.Datatype.fromcode("abc@xyz")


def _sendrecv_bad_buffer_body(rank, size):
    MPI = mpi()
    comm = MPI.COMM_SELF
    try:  # the send buffer is bad: the receive posted for it must not linger
        comm.Sendrecv([np.zeros(1, dtype=np.int32), 5, "i"], 0, 0, [None, 0, "B"], 0, 0)
    except ValueError:
        pass
    else:
        raise AssertionError("a count past the buffer's end")
    got = np.zeros(1, dtype=np.int32)
    comm.Sendrecv(np.array([4], dtype=np.int32), 0, 0, got, 0, 0)
    assert got[0] == 4
    return True


def test_sendrecv_with_a_bad_send_buffer():
    assert run(_sendrecv_bad_buffer_body, 1) == [True]
