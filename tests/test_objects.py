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


def _value(kind: str, rank: int, root: int, call: int):
    """A rank's object of kind ``kind``: "small" fits the first round's
    slot, "large" never does, "mixed" fits on even ranks only."""
    small = {"rank": rank, "root": root, "call": call}
    large = (rank, root, call, "x" * (600 + 37 * rank))
    return {"small": small, "large": large, "mixed": large if rank % 2 else small}[kind]


def _every_shape_body(rank, size):
    """Each object collective, every root, objects that fit the slot, that
    don't and a mix, three calls each (the later ones take the lanes), in
    the torch-style API and collie.MPI's lowercase calls."""
    import collie
    from collie import MPI
    comm = MPI.COMM_WORLD
    for call in range(3):
        for kind in ("small", "large", "mixed"):
            for root in range(size):
                mine = _value(kind, rank, root, call)
                every = [_value(kind, r, root, call) for r in range(size)]
                got = [None] * size if rank == root else None
                collie.gather_object(mine, got, dst=root)
                assert got == (every if rank == root else None)
                box = [None]
                collie.scatter_object_list(box, every if rank == root else None, src=root)
                assert box[0] == mine
                got = [None] * size
                collie.all_gather_object(got, mine)
                assert got == every
                objs = [_value(kind, root, root, call)] if rank == root else [None]
                collie.broadcast_object_list(objs, src=root)
                assert objs == [_value(kind, root, root, call)]

                assert comm.gather(mine, root=root) == (every if rank == root else None)
                assert comm.scatter(every if rank == root else None, root=root) == mine
                assert comm.allgather(mine) == every
                assert comm.bcast(mine, root=root) == _value(kind, root, root, call)
                # item q from rank r: what q gets from r, shaped by both
                sent = [(rank, q, _value(kind, (rank + q) % size, root, call)) for q in range(size)]
                assert comm.alltoall(sent) == [(r, rank, _value(kind, (r + rank) % size, root, call))
                                               for r in range(size)]
                assert comm.reduce([rank], root=root) == (list(range(size)) if rank == root else None)
            assert comm.allreduce(rank + call) == sum(range(size)) + size * call
    return True


@pytest.mark.parametrize("size", [1, 2, 3, 5])
def test_object_collectives_of_every_size_and_root(size, executor):
    assert run_ranks(_every_shape_body, size, timeout=110) == [True] * size


def test_object_collectives_over_tcp():
    assert run_ranks(_every_shape_body, 3, backend="tcp", timeout=110) == [True] * 3


def _python_slots_body(rank, size):
    from collie import objects
    objects.pack_slots, objects.unpack_slots = objects._pack_slots, objects._unpack_slots
    objects._core_round = lambda *args: None  # no compiled slots_round either
    return _every_shape_body(rank, size)


def test_object_collectives_with_the_python_slot_codec():
    """Where the compiled core is not built, objects.py packs and reads the slots itself."""
    assert run_ranks(_python_slots_body, 3, timeout=110) == [True] * 3


def _rounds_body(rank, size):
    from collie import MPI, core, objects
    comm = MPI.COMM_WORLD
    python_rounds = []
    full_paths = {name: getattr(objects, name) for name in ("_rooted_round", "all_gather_into_tensor",
                                                             "all_to_all_single")}

    def counted(name, fn):
        def run(*args, **kwargs):
            python_rounds.append(args[0] if name == "_rooted_round" else name)
            return fn(*args, **kwargs)
        return run
    for call in range(6):
        if call == 2:  # each shape has run once: its lane is made
            for name, fn in full_paths.items():
                setattr(objects, name, counted(name, fn))
        for root in range(size):
            assert comm.gather(rank * call, root=root) == ([r * call for r in range(size)] if rank == root else None)
            assert comm.scatter([(r, call) for r in range(size)] if rank == root else None, root=root) == (rank, call)
            assert comm.reduce(rank + call, root=root) == (sum(range(size)) + size * call if rank == root else None)
        assert comm.allgather((rank, call)) == [(r, call) for r in range(size)]
        assert comm.alltoall([(rank, q, call) for q in range(size)]) == [(r, rank, call) for r in range(size)]
    for name, fn in full_paths.items():
        setattr(objects, name, fn)
    return core.EXECUTOR, sorted(python_rounds)


@pytest.mark.parametrize("size", [2, 3])
def test_a_repeated_object_collective_is_one_call_into_the_core(size):
    """Once an object call's shape has a lane, its first round (pack, the
    lane, unpack) is the core's slots_round, one call, for gather, scatter,
    reduce, allgather and alltoall; the Python rounds are for the first
    calls and the Python executor."""
    for executor, python_rounds in run_ranks(_rounds_body, size):
        assert python_rounds == ([] if executor == "c" else
                                 sorted(["gather", "scatter", "gather"] * size * 4
                                        + ["all_gather_into_tensor", "all_to_all_single"] * 4))


def test_the_slot_codecs_agree():
    import pickle
    from collie import core, objects
    payloads = [b"", b"a", b"x" * 7, b"y" * 8, b"z" * 9, pickle.dumps({"k": 1}), b"w" * 100]
    codecs = [(objects._pack_slots, objects._unpack_slots)]
    if core._core is not None:
        codecs.append((core.pack_slots, core.unpack_slots))
    results = []
    for pack, unpack in codecs:
        buf = np.zeros(len(payloads) * 16, dtype=np.uint8)
        fits = pack(buf, payloads, 16)
        results.append((fits, buf.tobytes(), unpack(buf, len(payloads), 16, None)))
        assert pack(buf, payloads[:4], 16) is True
        assert unpack(buf, 4, 16, None) == ([b"", b"a", b"x" * 7, b"y" * 8], None)
        pack(buf, [pickle.dumps(1), pickle.dumps("not in 8 bytes")], 16)
        assert unpack(buf, 2, 16, pickle.loads) == ([1, None], [(1, len(pickle.dumps("not in 8 bytes")))])
        with pytest.raises(ValueError):
            pack(buf, [b""] * 100, 16)  # more slots than the buffer holds
    fits, raw, (items, large) = results[0]
    assert fits is False and large == [(4, 9), (5, len(payloads[5])), (6, 100)]
    assert items == [b"", b"a", b"x" * 7, b"y" * 8, None, None, None]
    assert raw[:8] == (0).to_bytes(8, "little") and raw[16:24] == (1).to_bytes(8, "little")
    assert all(r == results[0] for r in results)


def _large_from_a_dead_rank_body(rank, size):
    """Rank 1's pickle needs the second round, and rank 1 dies before it: the root raises PeerError."""
    import os
    import collie
    from collie import MPI, objects
    comm = MPI.COMM_WORLD
    if rank == 1:
        real = objects._large
        objects._large = lambda *a: os._exit(3)  # dies right after the first round
    try:
        comm.gather("x" * 2000 if rank == 1 else 0, root=0)
    except collie.PeerError as exc:
        return "PeerError", exc.peer
    except MPI.Exception as exc:
        return "MPI.Exception", str(exc)
    return "no error"


def test_a_second_round_from_a_rank_that_died_is_a_peer_error():
    res = run_ranks(_large_from_a_dead_rank_body, 2, expect_errors=True, timeout=60)
    assert res[0] == ("PeerError", 1), res
