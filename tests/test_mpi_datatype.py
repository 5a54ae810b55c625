"""Tests of MPI derived datatypes (collie.compat.mpi datatype.py, typemap.py).

The layouts are checked against NumPy views of the same memory (slices,
strides, structured dtypes), never against the type map code itself; data
movement runs on real ranks (tests/harness.py).
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from harness import run_ranks

pytestmark = pytest.mark.timeout(120)


def mpi():
    from collie.compat import mpi as MPI
    return MPI


# ---- sizes, bounds, decoding (one process) ----

def test_vector_and_indexed_bounds():
    MPI = mpi()
    v = MPI.DOUBLE.Create_vector(3, 2, 4)
    assert (v.size, v.lb, v.extent, v.true_lb, v.true_extent) == (48, 0, 80, 0, 80)
    h = MPI.INT.Create_hvector(2, 1, -12)  # a negative stride reaches below the origin
    assert (h.size, h.lb, h.ub) == (8, -12, 4)
    ix = MPI.INT.Create_indexed([2, 0, 1], [5, 100, 1])  # an empty block adds nothing
    assert (ix.size, ix.lb, ix.ub) == (12, 4, 28)
    r = MPI.INT.Create_resized(-4, 16)
    assert (r.lb, r.extent, r.true_lb, r.true_extent) == (-4, 16, 0, 4)
    s = MPI.Datatype.Create_struct([1, 1], [0, 8], [MPI.DOUBLE, MPI.CHAR])
    assert (s.size, s.extent, s.true_extent) == (9, 16, 9)  # padded to the double's alignment
    assert s.extent == np.dtype([("d", "f8"), ("c", "S1")], align=True).itemsize


def test_huge_types_are_not_materialised():
    MPI = mpi()
    t = MPI.BYTE.Create_contiguous(2**31 + 2**20).Create_vector(4, 1, 2)
    assert t.size == 4 * (2**31 + 2**20) and t.extent == 7 * (2**31 + 2**20)


def test_decode_recreates_and_pickles():
    MPI = mpi()
    made = [
        MPI.INT.Create_contiguous(3), MPI.INT.Create_vector(2, 3, 4), MPI.INT.Create_hvector(2, 3, 40),
        MPI.INT.Create_indexed([1, 2], [0, 5]), MPI.INT.Create_hindexed([1, 2], [0, 20]),
        MPI.INT.Create_indexed_block(2, [0, 5]), MPI.INT.Create_hindexed_block(2, [0, 20]),
        MPI.Datatype.Create_struct([1, 2], [0, 8], [MPI.INT, MPI.DOUBLE]),
        MPI.INT.Create_subarray([4, 5], [2, 3], [1, 1], MPI.ORDER_F), MPI.INT.Create_resized(0, 12),
        MPI.INT.Create_darray(4, 3, [8, 6], [MPI.DISTRIBUTE_BLOCK, MPI.DISTRIBUTE_CYCLIC],
                              [MPI.DISTRIBUTE_DFLT_DARG] * 2, [2, 2], MPI.ORDER_C),
        MPI.INT.Dup(), MPI.Datatype.Create_f90_real(6, 30),
    ]
    for t in made:
        base, name, params = t.decode()
        again = getattr(base, f"Create_{name.lower()}")(**params)
        for u in (again, pickle.loads(pickle.dumps(t))):
            assert u.combiner == t.combiner and u.decode()[1:] == (name, params)
            assert (u.size, u.lb, u.extent, u.true_lb, u.true_extent) == \
                (t.size, t.lb, t.extent, t.true_lb, t.true_extent)


def test_null_and_freed_types_fail_clearly():
    MPI = mpi()
    with pytest.raises(MPI.Exception, match="DATATYPE_NULL"):
        MPI.DATATYPE_NULL.Get_size()
    t = MPI.INT.Create_contiguous(2)
    copy = MPI.Datatype(t)
    t.Free()
    assert t == MPI.DATATYPE_NULL and copy.size == 8  # Free empties only its own handle
    with pytest.raises(MPI.Exception):
        MPI.INT.Free()
    with pytest.raises(ValueError, match="3 blocklengths"):
        MPI.Datatype.Create_struct([1, 1, 1], [0, 4], [MPI.INT, MPI.INT])


# ---- packing (one process; no communicator is made here: the ranks below are forked from it) ----

def test_pack_matches_numpy_views():
    MPI = mpi()
    a = np.arange(40, dtype=np.int32).reshape(5, 8)
    cases = [
        (MPI.INT.Create_subarray([5, 8], [2, 3], [1, 4]), a[1:3, 4:7]),
        (MPI.INT.Create_subarray([8, 5], [3, 2], [4, 1], MPI.ORDER_F), a[1:3, 4:7]),
        (MPI.INT.Create_vector(5, 2, 8), a[:, :2]),
        (MPI.INT.Create_indexed([3, 1], [10, 2]).Create_resized(0, a.nbytes), np.concatenate([a.ravel()[10:13], a.ravel()[2:3]])),
    ]
    for t, want in cases:  # each type spans the whole of a: Pack takes len(a) // extent = 1 item
        buf = bytearray(t.Pack_size(1, None) + 3)
        end = t.Pack(a, buf, 3, None)
        assert end == len(buf)
        assert np.array_equal(np.frombuffer(buf, np.int32, offset=3), np.ascontiguousarray(want).ravel())
        out = np.zeros_like(a)
        assert t.Unpack(buf, 3, out, None) == end
        mask = np.zeros(a.size, bool)
        mask[np.isin(a.ravel(), want)] = True
        assert np.array_equal(out.ravel()[mask], a.ravel()[mask]) and not out.ravel()[~mask].any()


def test_external32_is_big_endian():
    MPI = mpi()
    for code in "hidF":
        x = np.arange(1, 6).astype(code)
        t = MPI.Datatype.fromcode(code)
        buf = bytearray(t.Pack_external_size("external32", x.size))
        t.Pack_external("external32", x, buf, 0)
        assert bytes(buf) == x.astype(x.dtype.newbyteorder(">")).tobytes()
        y = np.zeros_like(x)
        t.Unpack_external("external32", buf, 0, y)
        assert np.array_equal(x, y)
    with pytest.raises(MPI.Exception):
        MPI.INT.Pack_external_size("native", 1)


# ---- data movement (real ranks) ----

def _movement_body(rank, size):
    MPI = mpi()
    comm = MPI.COMM_WORLD
    a = np.arange(48, dtype=np.float64).reshape(6, 8) + 1000 * rank
    # Bcast of a subarray: only the block moves, the rest stays
    sub = MPI.DOUBLE.Create_subarray([6, 8], [3, 2], [2, 5]).Commit()
    b = a.copy()
    comm.Bcast([b, 1, sub], root=0)
    want = a.copy()
    want[2:5, 5:7] = (np.arange(48.0).reshape(6, 8))[2:5, 5:7]
    assert np.array_equal(b, want), b
    # Gather columns: a column type resized to one element; each rank sends its column `rank % 8`
    col = MPI.DOUBLE.Create_vector(6, 1, 8).Create_resized(0, 8).Commit()
    got = np.zeros((size, 6))
    comm.Gather([a.ravel()[rank % 8:], 1, col], got, root=0)
    if rank == 0:
        for q in range(size):
            assert np.array_equal(got[q], np.arange(48.0).reshape(6, 8)[:, q % 8] + 1000 * q), got
    # Scatter into columns of the receive matrix
    into = np.zeros((6, size))
    rows = np.arange(6.0 * size).reshape(size, 6)
    col = MPI.DOUBLE.Create_vector(6, 1, size).Commit()
    comm.Scatter(rows if rank == 0 else None, [into.ravel()[rank:], 1, col], root=0)
    assert np.array_equal(into[:, rank], np.arange(6.0 * size).reshape(size, 6)[rank]), into
    # Allreduce over strided elements: a vector of one basic type reduces elementwise
    vec = MPI.DOUBLE.Create_vector(3, 1, 2).Commit()
    x = np.arange(6.0) + rank
    y = np.full(6, -1.0)
    comm.Allreduce([x, 1, vec], [y, 1, vec], op=MPI.SUM)
    base = sum(np.arange(6.0) + q for q in range(size))
    assert np.array_equal(y[::2], base[::2]) and (y[1::2] == -1).all(), y
    # point to point, a struct with padding: the padding is not sent
    rec = np.dtype({"names": ["i", "d"], "formats": ["i4", "f8"], "offsets": [0, 8], "itemsize": 16})
    st = MPI.Datatype.Create_struct([1, 1], [0, 8], [MPI.INT, MPI.DOUBLE]).Commit()
    if size > 1:
        if rank == 0:
            out = np.zeros(3, rec)
            out["i"], out["d"] = [1, 2, 3], [0.5, 1.5, 2.5]
            comm.Send([out, 3, st], dest=1)
        elif rank == 1:
            inn = np.zeros(3, rec)
            status = MPI.Status()
            comm.Recv([inn, 3, st], source=0, status=status)
            assert inn["i"].tolist() == [1, 2, 3] and inn["d"].tolist() == [0.5, 1.5, 2.5], inn
            assert status.Get_count(MPI.BYTE) == 36
    # Alltoallw at MPI.BOTTOM: absolute addresses in a struct
    send = np.arange(size, dtype=np.int32) + 10 * rank
    recv = np.zeros(size, dtype=np.int32)
    stypes = [MPI.Datatype.Create_struct([1], [MPI.Get_address(send) + 4 * q], [MPI.INT]).Commit()
              for q in range(size)]
    rtypes = [MPI.Datatype.Create_struct([1], [MPI.Get_address(recv) + 4 * q], [MPI.INT]).Commit()
              for q in range(size)]
    comm.Alltoallw([MPI.BOTTOM, [1] * size, [0] * size, stypes], [MPI.BOTTOM, [1] * size, [0] * size, rtypes])
    assert recv.tolist() == [rank + 10 * q for q in range(size)], recv
    return True


@pytest.mark.parametrize("n", [1, 2, 3])
def test_derived_types_move_data(n):
    assert run_ranks(_movement_body, n, timeout=90) == [True] * n
