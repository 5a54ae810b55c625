"""Intercommunicators, communicator objects, error handlers, sessions and the
fault-tolerance calls of collie's MPI (collie.compat.mpi).

Bodies run on real collie ranks (tests/harness.py) and check their results
against NumPy / plain Python references, raising on a difference. The world
is split into a low group (ranks < cut) and a high group; cuts are chosen so
that both even splits and uneven ones (1 facing 3) are covered.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from harness import run_ranks

pytestmark = pytest.mark.timeout(120)

SPLITS = [(2, 1), (3, 1), (3, 2), (4, 1), (4, 2)]  # (world size, size of the low group)


def mpi():
    from collie.compat import mpi as MPI
    return MPI


def run(body, n, *args, **kw):
    return run_ranks(body, n, *args, timeout=90, **kw)


def _intercomm(MPI, cut):
    """(intercomm, local intracomm, in the low group?) for a world split at ``cut``."""
    world = MPI.COMM_WORLD
    low = world.rank < cut
    local = world.Split(0 if low else 1, key=world.rank)
    inter = local.Create_intercomm(0, world, cut if low else 0, tag=7)
    return inter, local, low


# ---- collectives across the two groups ----

def _buffers_body(rank, size, cut):
    MPI = mpi()
    inter, local, low = _intercomm(MPI, cut)
    me, n, rn = inter.rank, inter.size, inter.remote_size
    assert (n, rn) == ((cut, size - cut) if low else (size - cut, cut))
    assert inter.Is_inter() and not inter.Is_intra() and local.Is_intra()
    lo, hi = list(range(cut)), list(range(cut, size))
    mine, theirs = (lo, hi) if low else (hi, lo)
    assert inter.Get_group().Translate_ranks(None, MPI.COMM_WORLD.Get_group()) == mine
    assert inter.Get_remote_group().Translate_ranks(None, MPI.COMM_WORLD.Get_group()) == theirs

    def data(world_rank, k=4, dtype=np.float64):
        return (np.arange(k, dtype=dtype) + 10 * world_rank).astype(dtype)

    # rooted calls: the low group's rank 0 is the root, the high group receives or sends
    root_here = low and me == 0
    role = MPI.ROOT if root_here else (MPI.PROC_NULL if low else 0)
    buf = data(0) if root_here else np.zeros(4)
    inter.Bcast(buf, root=role)
    assert np.array_equal(buf, data(0) if (root_here or not low) else np.zeros(4))

    got = np.full((rn, 3), -1, dtype=np.int32)
    inter.Gather(None if low else data(rank, 3, np.int32), got if root_here else None, root=role)
    if root_here:
        assert np.array_equal(got, np.stack([data(w, 3, np.int32) for w in theirs]))

    counts = [w % 3 + 1 for w in hi]  # one per process of the high group, which sends and receives
    flat = np.full(sum(counts), -1.0)
    inter.Gatherv(None if low else data(rank, rank % 3 + 1), [flat, counts] if root_here else None, root=role)
    if root_here:
        assert np.array_equal(flat, np.concatenate([data(w, w % 3 + 1) for w in hi]))

    out = np.zeros(2)
    inter.Scatter(np.arange(2.0 * rn).reshape(rn, 2) if root_here else None, None if low else out, root=role)
    if not low:
        assert np.array_equal(out, [2.0 * me, 2.0 * me + 1])

    send = np.arange(float(sum(counts))) if root_here else None
    outv = np.zeros(rank % 3 + 1)
    inter.Scatterv([send, counts] if root_here else None, None if low else outv, root=role)
    if not low:
        start = sum(counts[:me])
        assert np.array_equal(outv, np.arange(start, start + counts[me], dtype=float))

    red = np.zeros(4)
    inter.Reduce(None if low else data(rank), red if root_here else None, op=MPI.SUM, root=role)
    if root_here:
        assert np.array_equal(red, sum(data(w) for w in theirs))

    # non-rooted calls: each group gets the other's data
    every = np.zeros((rn, 4))
    inter.Allgather(data(rank), every)
    assert np.array_equal(every, np.stack([data(w) for w in theirs]))

    sizes = [w % 2 + 1 for w in theirs]
    everyv = np.zeros(sum(sizes))
    inter.Allgatherv(data(rank, rank % 2 + 1), [everyv, sizes])
    assert np.array_equal(everyv, np.concatenate([data(w, w % 2 + 1) for w in theirs]))

    a2a = np.zeros((rn, 2))
    inter.Alltoall(np.array([[rank, q] for q in range(rn)], dtype=float), a2a)
    assert np.array_equal(a2a, np.array([[w, me] for w in theirs], dtype=float))

    for op, ref in [(MPI.SUM, np.sum), (MPI.MAX, np.max), (MPI.PROD, np.prod)]:
        acc = np.zeros(4)
        inter.Allreduce(data(rank), acc, op=op)
        assert np.array_equal(acc, ref(np.stack([data(w) for w in theirs]), axis=0)), op

    # Reduce_scatter_block: the other group's sendbufs (one block per rank here) reduced, block `me` here
    blocks = np.zeros(2)
    inter.Reduce_scatter_block(np.arange(2.0 * rn) + rank, blocks, op=MPI.SUM)
    total = sum(np.arange(2.0 * n) + w for w in theirs)
    assert np.array_equal(blocks, total[2 * me:2 * me + 2])

    mycounts = [i + 1 for i in range(n)]  # this group's split of the result
    theircounts = [i + 1 for i in range(rn)]
    if sum(mycounts) == sum(theircounts):
        part = np.zeros(me + 1)
        inter.Reduce_scatter(np.arange(float(sum(theircounts))) * (rank + 1), part, mycounts, op=MPI.SUM)
        whole = sum(np.arange(float(sum(mycounts))) * (w + 1) for w in theirs)
        assert np.array_equal(part, whole[sum(mycounts[:me]):sum(mycounts[:me + 1])])

    inter.Barrier()
    inter.Free()
    local.Free()
    assert inter == MPI.COMM_NULL
    return True


@pytest.mark.parametrize("size,cut", SPLITS)
def test_intercomm_buffer_collectives(size, cut):
    assert run(_buffers_body, size, cut) == [True] * size


def _objects_body(rank, size, cut):
    MPI = mpi()
    inter, local, low = _intercomm(MPI, cut)
    theirs = list(range(cut, size)) if low else list(range(cut))
    rn = inter.remote_size
    for root in range(inter.size if low else rn):
        if low:
            role = MPI.ROOT if inter.rank == root else MPI.PROC_NULL
            assert inter.bcast({"from": rank}, root=role) is None
            got = inter.gather(None, root=role)
            assert got == ([("x", w) for w in theirs] if role == MPI.ROOT else None)
            assert inter.scatter([q * q for q in range(rn)] if role == MPI.ROOT else None, root=role) is None
            assert inter.reduce(None, op=MPI.SUM, root=role) == (sum(theirs) if role == MPI.ROOT else None)
        else:
            assert inter.bcast(None, root=root) == {"from": root}
            assert inter.gather(("x", rank), root=root) is None
            assert inter.scatter(None, root=root) == inter.rank ** 2
            assert inter.reduce(rank, op=MPI.SUM, root=root) is None
    # the low group's rank 0 gives a wrong sequence: it and every receiver raise
    role = (MPI.ROOT if inter.rank == 0 else MPI.PROC_NULL) if low else 0
    if role == MPI.PROC_NULL:
        assert inter.scatter(None, root=role) is None
    else:
        try:
            inter.scatter(5 if role == MPI.ROOT else None, root=role)
        except ValueError as exc:
            assert "sequence of" in str(exc)
        else:
            raise AssertionError("scatter of a wrong sequence went through")
    assert inter.allgather(rank) == theirs
    assert inter.alltoall([(rank, q) for q in range(rn)]) == [(w, inter.rank) for w in theirs]
    assert inter.allreduce(rank, op=MPI.MAX) == max(theirs)
    inter.barrier()
    for bad in (-1, rn):
        try:
            inter.bcast(None, root=bad)
        except MPI.Exception as exc:
            assert exc.Get_error_class() == MPI.ERR_ROOT
        else:
            raise AssertionError(f"root {bad} was accepted")
    return True


@pytest.mark.parametrize("size,cut", SPLITS)
def test_intercomm_object_collectives(size, cut):
    assert run(_objects_body, size, cut) == [True] * size


def _p2p_body(rank, size, cut):
    MPI = mpi()
    inter, local, low = _intercomm(MPI, cut)
    rn = inter.remote_size
    # every process sends its world rank to every remote process; ranks are remote ranks
    reqs = [inter.isend(("hi", rank), dest=q, tag=q) for q in range(rn)]
    seen = []
    for _ in range(rn):
        st = MPI.Status()
        msg = inter.recv(source=MPI.ANY_SOURCE, tag=inter.rank, status=st)
        theirs = list(range(cut, size)) if low else list(range(cut))
        assert msg == ("hi", theirs[st.Get_source()]), (msg, st.Get_source())
        seen.append(st.Get_source())
    MPI.Request.Waitall(reqs)
    assert sorted(seen) == list(range(rn))
    buf = np.zeros(3)
    if inter.rank == 0:
        inter.Sendrecv(np.full(3, float(rank)), dest=0, sendtag=99, recvbuf=buf, source=0, recvtag=99)
        assert np.array_equal(buf, np.full(3, 0.0 if not low else float(cut)))
    try:
        inter.send(1, dest=rn)
    except ValueError:
        pass
    else:
        raise AssertionError("a destination past the remote group was accepted")
    return True


@pytest.mark.parametrize("size,cut", [(2, 1), (4, 1), (4, 2)])
def test_intercomm_point_to_point_names_remote_ranks(size, cut):
    assert run(_p2p_body, size, cut) == [True] * size


# ---- making intercommunicators and intracommunicators of them ----

def _making_body(rank, size, cut):
    MPI = mpi()
    world = MPI.COMM_WORLD
    inter, local, low = _intercomm(MPI, cut)
    lo, hi = list(range(cut)), list(range(cut, size))

    def members(comm):
        return comm.Get_group().Translate_ranks(None, world.Get_group())

    # Merge: high=False first; when both give the same, the group holding world rank 0 first
    for mine_high, expect in [(not low, lo + hi), (low, hi + lo), (False, lo + hi), (True, lo + hi)]:
        merged = inter.Merge(mine_high)
        assert members(merged) == expect and merged.Is_intra()
        assert merged.allgather(rank) == expect  # a working communicator, ranks in that order
        merged.Free()

    dup = inter.Dup()
    assert MPI.Comm.Compare(inter, dup) == MPI.CONGRUENT and inter.Compare(inter) == MPI.IDENT
    assert dup.allgather(rank) == (hi if low else lo)
    assert type(MPI.Comm.fromint(dup.toint())) is MPI.Intercomm
    assert MPI.Intercomm(dup) == dup
    for wrong in (lambda: MPI.Intracomm(dup), lambda: MPI.Intercomm(local)):
        try:
            wrong()
        except TypeError:
            pass
        else:
            raise AssertionError("an intercommunicator and an intracommunicator were confused")
    dup.Free()

    # Split by parity of the world rank: each color faces the same color on the other side
    part = inter.Split(rank % 2, key=-rank)
    mine_c = [w for w in (lo if low else hi) if w % 2 == rank % 2]
    theirs_c = [w for w in (hi if low else lo) if w % 2 == rank % 2]
    if theirs_c:
        assert members(part) == sorted(mine_c, reverse=True)
        assert part.Get_remote_group().Translate_ranks(None, world.Get_group()) == sorted(theirs_c, reverse=True)
        assert sorted(part.allgather(rank)) == theirs_c
        part.Free()
    else:
        assert part == MPI.COMM_NULL
    assert inter.Split(MPI.UNDEFINED) == MPI.COMM_NULL

    # Create: the local rank 0 of each side only
    first = inter.Create(inter.Get_group().Incl([0]))
    if inter.rank == 0:
        assert first.size == 1 and first.remote_size == 1 and first.allgather(rank) == [0 if not low else cut]
        first.Free()
    else:
        assert first == MPI.COMM_NULL

    # Create_from_groups: the same two groups with no parent communicator
    wg = world.Get_group()
    again = MPI.Intercomm.Create_from_groups(wg.Incl(lo if low else hi), 0, wg.Incl(hi if low else lo), 0)
    assert MPI.Comm.Compare(inter, again) == MPI.CONGRUENT
    assert again.allreduce(rank) == sum(hi if low else lo)
    again.Free()

    # the fault-tolerance calls span both groups
    assert inter.Agree(0b1110 if low else 0b0111) == 0b0110
    assert inter.Get_failed() == MPI.GROUP_EMPTY and inter.Ack_failed() == 0
    shrunk = inter.Shrink()
    assert (shrunk.size, shrunk.remote_size) == (inter.size, inter.remote_size)
    shrunk.Free()
    inter.Free()
    return True


@pytest.mark.parametrize("size,cut", [(2, 1), (3, 1), (4, 2)])
def test_intercomm_merge_split_dup_create(size, cut):
    assert run(_making_body, size, cut) == [True] * size


# ---- intracommunicators: the object model, fault tolerance ----

def _intracomm_body(rank, size):
    MPI = mpi()
    world = MPI.COMM_WORLD

    class Mine(MPI.Intracomm):
        def __new__(cls, comm=None):  # as mpi4py's docs show: a subclass may pass a clone
            return super().__new__(cls, comm.Dup() if comm else comm)

    mine = Mine(world)
    assert type(mine) is Mine and mine != world and MPI.Comm.Compare(mine, world) == MPI.CONGRUENT
    clone = mine.Clone()
    assert type(clone) is Mine and clone.allgather(rank) == list(range(size))
    clone.free()
    assert not clone
    mine.Free()

    assert pickle.loads(pickle.dumps(world)) is world
    copy = pickle.loads(pickle.dumps(MPI.Intracomm(world)))
    assert copy == world and copy is not world
    try:
        pickle.dumps(world.Dup())
    except ValueError:
        pass
    else:
        raise AssertionError("a communicator of its own was pickled")
    assert MPI.Comm.fromhandle(world.handle) == world
    parent = MPI.Comm.Get_parent()
    assert isinstance(parent, MPI.Intercomm) and parent == MPI.COMM_NULL
    for bad in (-1, size):
        try:
            world.reduce(rank, root=bad)
        except MPI.Exception as exc:
            assert exc.Get_error_class() == MPI.ERR_ROOT
        else:
            raise AssertionError(f"root {bad} was accepted")

    # Split_type sends no message: ranks that ask for UNDEFINED and the others can mix
    for root in range(size):
        got = world.Split_type(MPI.COMM_TYPE_SHARED if rank == root else MPI.UNDEFINED)
        assert (got.size == 1) if rank == root else (got == MPI.COMM_NULL)
    shared = world.Split_type(MPI.COMM_TYPE_SHARED)
    assert shared.size == size  # one host
    shared.Free()

    # Agree / Iagree: a bitwise AND; Iagree is not done before every process joined
    assert world.Agree(0b1111 if rank == 0 else 0b1011) == (0b1011 if size > 1 else 0b1111)
    flag = np.array([0b1101], dtype=np.intc)
    if size > 1 and rank == 0:
        req = world.Iagree(flag)
        assert not req.Test()  # the others call it only after the barrier below
        world.Barrier()
        req.Wait()
    else:
        flag[0] = 0b1011 if size > 1 else 0b1101
        world.Barrier()
        world.Iagree(flag).Wait()
    assert flag[0] == (0b1001 if size > 1 else 0b1101)
    for wrong, kind in ((5, TypeError), (bytearray(8), ValueError)):
        try:
            world.Iagree(wrong)
        except kind:
            pass
        else:
            raise AssertionError(f"Iagree accepted {wrong!r}")
    try:
        world.Revoke()
    except NotImplementedError:
        pass
    assert not world.Is_revoked()
    shrunk, req = world.Ishrink()
    assert req and req.Wait() and not req
    assert shrunk.allgather(rank) == list(range(size))
    shrunk.Free()

    # a root given a wrong sequence: every rank raises, and the communicator still works
    try:
        world.scatter(list(range(size + 1)) if rank == 0 else None, root=0)
    except ValueError as exc:
        assert "sequence of" in str(exc)
    else:
        raise AssertionError("scatter of a wrong sequence went through")
    assert world.scatter([r * 3 for r in range(size)] if rank == 0 else None, root=0) == rank * 3

    from_group = MPI.Intracomm.Create_from_group(world.Get_group())
    assert MPI.Comm.Compare(from_group, world) == MPI.CONGRUENT and from_group.allreduce(1) == size
    from_group.Free()
    return True


@pytest.mark.parametrize("n", [1, 2, 3])
def test_intracomm_object_model_and_agreement(n):
    assert run(_intracomm_body, n) == [True] * n


def _failed_body(rank, size):
    import time
    MPI = mpi()
    world = MPI.COMM_WORLD
    world.Barrier()
    if rank == 1:
        time.sleep(60)  # the test kills this rank meanwhile
    try:
        world.recv(source=1, tag=3)
    except MPI.Exception as exc:
        assert exc.Get_error_class() == MPI.ERR_PROC_FAILED, exc
    else:
        raise AssertionError("a receive from a dead rank completed")
    failed = world.Get_failed()
    assert failed.Translate_ranks(None, world.Get_group()) == [1], failed
    assert world.Ack_failed(0) == 0 and world.Ack_failed() == 1
    for after_death in (world.Shrink, lambda: world.Agree(1)):  # collie stops at a death
        try:
            after_death()
        except MPI.Exception as exc:
            assert exc.Get_error_class() == MPI.ERR_PROC_FAILED, exc
        else:
            raise AssertionError("a call past a failure completed")
    return True


@pytest.mark.parametrize("n", [2, 3])
def test_get_failed_names_a_dead_rank_and_later_calls_fail(n):
    out = run_ranks(_failed_body, n, timeout=90, kill={1: 3.0}, expect_errors=True)
    assert [out[r] for r in range(n) if r != 1] == [True] * (n - 1), out


# ---- error handlers, error codes, sessions ----

def _handlers_body(rank, size):
    MPI = mpi()
    for eh in (MPI.ERRORS_RETURN, MPI.ERRORS_ARE_FATAL, MPI.ERRORS_ABORT):
        assert pickle.loads(pickle.dumps(eh)) is eh
        copy = pickle.loads(pickle.dumps(MPI.Errhandler(eh)))
        assert copy == eh and copy is not eh
        assert MPI.Errhandler.fromhandle(eh.handle) == eh
    comm = MPI.COMM_SELF.Dup()
    calls = []
    made = [MPI.Comm.Create_errhandler(lambda c, code, i=i: calls.append((i, code))) for i in range(32)]
    try:
        MPI.Comm.Create_errhandler(lambda c, code: None)
    except RuntimeError:
        pass
    else:
        raise AssertionError("a 33rd user error handler was made")
    comm.Set_errhandler(made[5])
    comm.Call_errhandler(MPI.SUCCESS)
    comm.Call_errhandler(MPI.ERR_OTHER)
    assert calls == [(5, MPI.ERR_OTHER)]
    assert MPI.Errhandler.fromint(made[5].toint()) == made[5]
    for eh in made:
        eh.Free()
    MPI.Comm.Create_errhandler(lambda c, code: None).Free()  # a slot is free again
    comm.Free()

    cls = MPI.Add_error_class()
    assert MPI.COMM_WORLD.Get_attr(MPI.LASTUSEDCODE) == cls and MPI.Get_error_string(cls) == ""
    code = MPI.Add_error_code(cls)
    MPI.Add_error_string(code, "mine")
    assert MPI.Get_error_class(code) == cls and MPI.Get_error_string(code) == "mine"
    for premature in (lambda: MPI.Remove_error_code(code), lambda: MPI.Remove_error_class(cls)):
        try:
            premature()
        except MPI.Exception:
            pass
        else:
            raise AssertionError("an error code with a string (or a class with codes) was removed")
    MPI.Remove_error_string(code)
    MPI.Remove_error_code(code)
    MPI.Remove_error_class(cls)

    session = MPI.Session.Init()
    assert session and session == MPI.Session(session) and session != MPI.SESSION_NULL
    names = [session.Get_nth_pset(i) for i in range(session.Get_num_psets())]
    assert names == ["mpi://WORLD", "mpi://SELF"]
    assert session.Get_pset_info("mpi://WORLD").Get("mpi_size") == str(size)
    group = session.Create_group("mpi://WORLD")
    comm = MPI.Intracomm.Create_from_group(group)
    assert comm.allgather(rank) == list(range(size))
    comm.Free()
    assert MPI.Group.Create_from_session_pset(session, "mpi://SELF").Get_size() == 1
    session.Finalize()
    assert not session
    try:
        MPI.File.Open(MPI.COMM_SELF, "/dev/null")
    except NotImplementedError:
        pass
    else:
        raise AssertionError("MPI-IO claimed")
    return True


@pytest.mark.parametrize("n", [1, 2])
def test_errhandlers_error_codes_sessions(n):
    assert run(_handlers_body, n) == [True] * n


# ---- attributes ----

def _attributes_body(rank, size):
    MPI = mpi()
    comm = MPI.COMM_WORLD.Dup()
    deleted = []
    carried = MPI.Comm.Create_keyval(copy_fn=lambda c, k, v: v + [rank], delete_fn=lambda c, k, v: deleted.append(v))
    kept = MPI.Comm.Create_keyval(copy_fn=True)
    dropped = MPI.Comm.Create_keyval()
    for k, v in ((carried, [0]), (kept, "same"), (dropped, "gone")):
        assert comm.Get_attr(k) is None
        comm.Set_attr(k, v)
    assert MPI.Intracomm(comm).Get_attr(kept) == "same"  # copies share the handle's attributes
    dup = comm.Dup()
    assert (dup.Get_attr(carried), dup.Get_attr(kept), dup.Get_attr(dropped)) == ([0, rank], "same", None)
    dup.Free()
    assert deleted == [[0, rank]]  # Free deletes the values
    comm.Set_attr(carried, [1])  # over a value: the old one is deleted
    assert deleted[-1] == [0]
    comm.Delete_attr(carried)
    assert deleted[-1] == [1] and comm.Get_attr(carried) is None
    boom = MPI.Comm.Create_keyval(delete_fn=lambda c, k, v: 1 / 0)
    comm.Set_attr(boom, 1)
    try:
        comm.Delete_attr(boom)
    except MPI.Exception as exc:
        assert exc.Get_error_class() == MPI.ERR_OTHER
    else:
        raise AssertionError("a failing delete_fn went unnoticed")
    for k in (carried, kept, dropped, boom):
        assert MPI.Comm.Free_keyval(k) == MPI.KEYVAL_INVALID
    try:
        comm.Get_attr(MPI.KEYVAL_INVALID)
    except MPI.Exception as exc:
        assert exc.Get_error_class() == MPI.ERR_KEYVAL
    else:
        raise AssertionError("KEYVAL_INVALID was accepted")
    comm.Free()
    return True


@pytest.mark.parametrize("n", [1, 2])
def test_communicator_attributes(n):
    assert run(_attributes_body, n) == [True] * n
