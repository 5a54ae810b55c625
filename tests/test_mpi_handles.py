"""Tests of MPI handle objects as mpi4py has them (collie.compat.mpi):
integer handles, safe free(), pickling, hashing, attributes on datatypes,
the MPI version claimed and the Split_type it implies.

Message passing runs on real ranks (tests/harness.py).
"""

from __future__ import annotations

import copy
import pickle
import weakref

import numpy as np
import pytest

from harness import run_ranks

pytestmark = pytest.mark.timeout(120)


def mpi():
    from collie.compat import mpi as MPI
    return MPI


# ---- one process ----

def test_datatype_handles_round_trip_and_differ():
    MPI = mpi()
    dup = MPI.INT.Dup()
    handles = {MPI.DATATYPE_NULL.handle, MPI.INT.handle, MPI.DOUBLE.handle, dup.handle}
    assert MPI.DATATYPE_NULL.handle == 0 and len(handles) == 4
    for t in (MPI.DATATYPE_NULL, MPI.INT, dup):
        assert MPI.Datatype.fromhandle(t.handle) == t
        assert MPI.Datatype.f2py(t.py2f()) == t
    assert MPI.Datatype.fromint(dup.toint()).Get_size() == 4
    with pytest.raises(MPI.Exception):
        MPI.Datatype.fromint(10**9)
    dup.Free()


def test_status_fortran_array_has_source_tag_error_where_F_says():
    MPI = mpi()
    s = MPI.Status()
    s.source, s.tag, s.error = 3, 7, MPI.ERR_OTHER
    f = s.py2f()
    assert len(f) == MPI.F_STATUS_SIZE
    assert (f[MPI.F_SOURCE], f[MPI.F_TAG], f[MPI.F_ERROR]) == (3, 7, MPI.ERR_OTHER)
    assert MPI.Status.f2py(f) == s


def test_handles_are_unhashable_unordered_and_weakly_referable():
    MPI = mpi()
    for obj in (MPI.DATATYPE_NULL, MPI.INT, MPI.OP_NULL, MPI.SUM, MPI.REQUEST_NULL, MPI.MESSAGE_NULL, MPI.WIN_NULL):
        with pytest.raises(TypeError):
            hash(obj)
        with pytest.raises(TypeError):
            obj < obj  # noqa: B015 - the comparison must raise
        assert weakref.ref(obj)() is obj


def test_op_copies_only_ops_and_pickles():
    MPI = mpi()
    assert MPI.Op() == MPI.OP_NULL and MPI.Op(MPI.SUM) == MPI.SUM
    for bad in (1234, "SUM", MPI.INT):
        with pytest.raises(TypeError):
            MPI.Op(bad)
    assert pickle.loads(pickle.dumps(MPI.MAX)) is MPI.MAX
    copied = pickle.loads(pickle.dumps(MPI.Op(MPI.MAX)))
    assert copied == MPI.MAX and copied is not MPI.MAX
    user = MPI.Op.Create(_add_into, commute=True)
    again = pickle.loads(pickle.dumps(user))
    assert again != user and again.Is_commutative()
    a, b = np.arange(3.0), np.ones(3)
    again.Reduce_local(a, b)
    np.testing.assert_array_equal(b, np.arange(3.0) + 1)
    with pytest.raises(ValueError):  # an op from its integer handle has no function of its own, as in mpi4py
        pickle.dumps(MPI.Op.fromint(user.toint()))
    user.Free()
    again.Free()


def _add_into(a, b, datatype):
    b[:] = a + b


def test_user_op_is_given_the_datatype_of_the_buffer_spec():
    MPI = mpi()
    seen = []
    op = MPI.Op.Create(lambda a, b, dt: seen.append(dt))
    op.Reduce_local([bytearray(3), MPI.BYTE], [bytearray(3), MPI.BYTE])
    op.Reduce_local(np.zeros(2, "i4"), np.zeros(2, "i4"))
    assert seen == [MPI.BYTE, MPI.INT]
    op.Free()


def test_at_most_32_user_ops_alive():
    MPI = mpi()
    ops = [MPI.Op.Create(_add_into) for _ in range(32)]
    with pytest.raises(RuntimeError):
        MPI.Op.Create(_add_into)
    ops.pop().Free()
    ops.append(MPI.Op.Create(_add_into))  # room again
    for op in ops:
        op.Free()


def test_safe_free_keeps_constants_and_empties_copies():
    MPI = mpi()
    for const in (MPI.INT, MPI.SUM, MPI.INFO_ENV, MPI.MESSAGE_NO_PROC):
        const.free()
        assert const
        clone = type(const)(const)
        clone.free()
        assert not clone and const
    for null in (MPI.DATATYPE_NULL, MPI.OP_NULL, MPI.REQUEST_NULL, MPI.INFO_NULL, MPI.ERRHANDLER_NULL,
                 MPI.MESSAGE_NULL):
        null.free()
        assert not null
    made = MPI.Op.Create(_add_into)
    for _ in range(3):
        made.free()
        assert not made


def test_null_request_free_and_cancel_raise_err_request():
    MPI = mpi()
    for call in (MPI.REQUEST_NULL.Free, MPI.REQUEST_NULL.Cancel):
        with pytest.raises(MPI.Exception) as err:
            call()
        assert err.value.Get_error_class() == MPI.ERR_REQUEST


def test_subclasses_survive_copy_and_pickle():
    MPI = mpi()
    for base in (MPI.Status, MPI.Datatype, MPI.Op, MPI.Request, MPI.Message):
        cls = type(f"My{base.__name__}", (base,), {"__module__": __name__})
        globals()[cls.__name__] = cls
        try:
            for copier in (copy.copy, copy.deepcopy, lambda o: pickle.loads(pickle.dumps(o))):
                assert type(copier(cls())) is cls
        finally:
            del globals()[cls.__name__]


def test_request_subclass_may_pass_the_request_to_new():
    MPI = mpi()

    class MyPrequest(MPI.Prequest):
        def __new__(cls, request=None):
            return super().__new__(cls, request)

    null = MyPrequest(MPI.REQUEST_NULL)
    assert type(null) is MyPrequest and not null


def test_datatype_attributes():
    MPI = mpi()
    deleted = []
    key = MPI.Datatype.Create_keyval(copy_fn=True, delete_fn=lambda o, k, v: deleted.append(v))
    t = MPI.INT.Dup()
    t.Set_attr(key, "x")
    dup = t.Dup()
    assert t.Get_attr(key) == "x" and dup.Get_attr(key) == "x"
    t.Free()
    assert deleted == ["x"]
    with pytest.raises(MPI.Exception):
        MPI.INT.Get_attr(MPI.KEYVAL_INVALID)
    dup.Free()
    MPI.Datatype.Free_keyval(key)


def test_sizeof_and_handleof():
    MPI = mpi()
    s = MPI.Status()
    assert MPI._sizeof(s) == MPI._sizeof(MPI.Status) == s.tomemory().nbytes
    assert MPI._handleof(MPI.INT) == MPI.INT.handle and MPI._sizeof(MPI.Comm) == 8
    with pytest.raises(TypeError):
        MPI._sizeof(None)
    with pytest.raises(TypeError):
        MPI._handleof(None)


def test_version_is_4_1():
    MPI = mpi()
    assert MPI.Get_version() == (MPI.VERSION, MPI.SUBVERSION) == (4, 1)


# ---- real ranks ----

def _split_and_message_body(rank, size):
    from collie.compat import mpi as MPI
    comm = MPI.COMM_WORLD
    out = {}
    out["guided_no_info"] = comm.Split_type(MPI.COMM_TYPE_HW_GUIDED) == MPI.COMM_NULL
    info = MPI.Info.Create()
    info.Set("mpi_hw_resource_type", "mpi_shared_memory")
    guided = comm.Split_type(MPI.COMM_TYPE_RESOURCE_GUIDED, key=-rank, info=info)
    out["guided"] = (guided.Get_size(), guided.Get_rank())
    guided.Free()
    unguided_info = MPI.Info.Create()
    out["unguided_is_null"] = comm.Split_type(MPI.COMM_TYPE_HW_UNGUIDED, info=unguided_info) == MPI.COMM_NULL
    # a matched message found again through its integer handle
    if rank == 0:
        comm.send({"n": 5}, dest=1, tag=9)
    elif rank == 1:
        msg = comm.mprobe(source=0, tag=9)
        again = MPI.Message.fromhandle(msg.handle)
        out["message"] = (again == msg, again.recv(), bool(msg))
    comm.Barrier()
    return out


def _spawn_body(rank, size):
    from collie.compat import mpi as MPI
    try:
        MPI.COMM_SELF.Spawn("python", ["-c", "pass"], maxprocs=1)
    except MPI.Exception as exc:
        return exc.Get_error_class() == MPI.ERR_SPAWN, "collie run -n N -m mpi4py.futures" in str(exc)
    return "spawned"


def test_spawn_says_it_is_not_supported():
    """Dynamic processes are out of scope: Spawn raises MPI.Exception
    (ERR_SPAWN) naming the launcher's way, not AttributeError."""
    assert run_ranks(_spawn_body, 1, timeout=60) == [(True, True)]


def test_split_type_and_message_handles_on_two_ranks():
    got = run_ranks(_split_and_message_body, 2, timeout=90)
    for rank, out in enumerate(got):
        assert out["guided_no_info"] and out["unguided_is_null"]  # both ranks on this one host
        assert out["guided"] == (2, 1 - rank)
    assert got[1]["message"] == (True, {"n": 5}, False)
