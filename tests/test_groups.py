"""Process groups, rank translation and device meshes."""

import numpy as np
import pytest

from harness import run_ranks

pytestmark = pytest.mark.timeout(90)


def _group_body(rank, size):
    import collie
    evens = collie.new_group([0, 2, 4])
    tail = collie.new_group([4, 3], sort_ranks=False)  # group rank 0 is global rank 4
    sorted_ = collie.new_group([4, 3])        # as torch: sorted, group rank 0 is global rank 3
    out = {
        "world": (collie.get_rank(), collie.get_world_size(), collie.is_initialized()),
        "evens": (collie.get_rank(evens), collie.get_world_size(evens), collie.get_process_group_ranks(evens)),
        "tail": collie.get_rank(tail),
        "sorted": (collie.get_rank(sorted_), collie.get_process_group_ranks(sorted_)),
        "WORLD": collie.group.WORLD is not None and collie.get_world_size(collie.group.WORLD),
    }
    if rank in (3, 4):
        out["translate"] = (collie.get_group_rank(tail, 4), collie.get_global_rank(tail, 1))
        # point-to-point inside a group uses global ranks
        peer = 3 if rank == 4 else 4
        x = np.array([rank])
        w = collie.isend(x, peer, group=tail)
        got = np.zeros(1, int)
        collie.recv(got, peer, group=tail)
        w.wait()
        out["p2p"] = int(got[0])
    errors = []
    for bad in (lambda: collie.get_group_rank(evens, 1), lambda: collie.get_global_rank(evens, 3),
                lambda: collie.new_group([0, 0]), lambda: collie.new_group([size])):
        try:
            bad()
        except ValueError:
            errors.append("ValueError")
    out["errors"] = errors
    if rank not in (0, 2, 4):
        try:
            collie.broadcast(np.zeros(1), src=0, group=evens)
        except ValueError as exc:
            out["outsider"] = "not a member" in str(exc)
    return out


def test_groups_and_rank_translation():
    res = run_ranks(_group_body, 5)
    for r, out in enumerate(res):
        assert out["world"] == (r, 5, True)
        assert out["evens"] == ((r // 2, 3, [0, 2, 4]) if r % 2 == 0 else (-1, -1, [0, 2, 4]))
        assert out["tail"] == {4: 0, 3: 1}.get(r, -1)
        assert out["sorted"] == ({3: 0, 4: 1}.get(r, -1), [3, 4])
        assert out["WORLD"] == 5
        assert out["errors"] == ["ValueError"] * 4
        if r % 2:
            assert out["outsider"] is True
    assert res[3]["translate"] == (0, 3) and res[4]["p2p"] == 3 and res[3]["p2p"] == 4


def _mesh_body(rank, size):
    import collie
    mesh = collie.init_device_mesh("cpu", (2, 3), mesh_dim_names=("dp", "tp"))
    tp, dp = mesh.get_group("tp"), mesh.get_group("dp")
    x = np.array([float(rank)])
    collie.all_reduce(x, group=tp)
    y = np.array([float(rank)])
    collie.all_reduce(y, group=dp)
    sub = mesh["tp"]
    return {
        "tp_ranks": collie.get_process_group_ranks(tp), "dp_ranks": collie.get_process_group_ranks(dp),
        "local": (mesh.get_local_rank("dp"), mesh.get_local_rank("tp")),
        "sizes": (mesh.size(), mesh.size("tp"), mesh.size(0)),
        "sums": (x[0], y[0]),
        "sub": (sub.mesh.tolist(), sub.get_local_rank(), sub.get_group() is tp, sub.mesh_dim_names),
        "coord": mesh.get_coordinate(),
    }


def test_device_mesh():
    res = run_ranks(_mesh_body, 6)
    for r, out in enumerate(res):
        row, col = divmod(r, 3)
        assert out["tp_ranks"] == [3 * row, 3 * row + 1, 3 * row + 2]
        assert out["dp_ranks"] == [col, col + 3]
        assert out["local"] == (row, col) and out["coord"] == [row, col]
        assert out["sizes"] == (6, 3, 2)
        assert out["sums"] == (sum(range(3 * row, 3 * row + 3)), col + col + 3)
        assert out["sub"] == ([3 * row, 3 * row + 1, 3 * row + 2], col, True, ("tp",))


def _mesh_errors_body(rank, size):
    import collie
    errors = []
    for bad in (lambda: collie.init_device_mesh("cpu", (3, 3)),
                lambda: collie.init_device_mesh("cuda", (2, 2)),
                lambda: collie.init_device_mesh("cpu", (2, 2), mesh_dim_names=("a",))):
        try:
            bad()
        except ValueError:
            errors.append("ValueError")
    return errors


def test_device_mesh_bad_shapes():
    assert run_ranks(_mesh_errors_body, 4) == [["ValueError"] * 3] * 4


def _split_body(rank, size):
    import collie
    from collie.group import split_group
    half = split_group(None, color=rank % 2, key=-rank)   # reversed order inside each color
    none = split_group(None, color=-1 if rank == 0 else 0)
    x = np.array([1.0])
    collie.all_reduce(x, group=half)
    return collie.get_process_group_ranks(half), x[0], none is None


def test_split_group_only_members_call():
    res = run_ranks(_split_body, 5)
    assert res[0] == ([4, 2, 0], 3.0, True)
    assert res[1] == ([3, 1], 2.0, False)


def _lifecycle_body(rank, size):
    import collie
    collie.destroy_process_group()
    collie.destroy_process_group()          # idempotent
    first = collie.is_initialized()
    collie.init_process_group()             # and again, in the same process
    x = np.array([1.0])
    collie.all_reduce(x)
    return first, x[0]


def test_destroy_is_idempotent_and_init_works_again():
    port_env = {}
    res = run_ranks(_lifecycle_body, 3, env=port_env)
    assert res == [(False, 3.0)] * 3


def _runtime_body(rank, size):
    """One world, then another after destroy_process_group with COLLIE_ALGO
    set in between: what the runtime held of the first is gone, and the
    second world's tuner reads the environment anew."""
    import os

    import collie
    from collie import MPI
    from collie.runtime import RUNTIME
    g = collie.group.world().group
    x = np.ones(1 << 18, np.float32)  # 1 MiB
    collie.all_reduce(x)
    first = {p.choice.algorithm for p in g.prepared.values()}
    comm = MPI.COMM_WORLD
    comm.send(rank, dest=(rank + 1) % size)          # MPI point-to-point: the world's matcher
    got = comm.recv(source=(rank - 1) % size)
    held = (RUNTIME.tuner is not None, len(RUNTIME.plans) > 0, len(RUNTIME.matchers), sorted(RUNTIME.mpi_comms))
    collie.destroy_process_group()
    emptied = (RUNTIME.tuner, len(RUNTIME.plans), len(RUNTIME.matchers), len(RUNTIME.matchers_by_etag),
               len(RUNTIME.mpi_comms))
    os.environ["COLLIE_ALGO"] = "all_reduce:ring" if "ring" not in first else "all_reduce:direct"
    collie.init_process_group()
    g = collie.group.world().group
    y = np.ones(1 << 18, np.float32)
    collie.all_reduce(y)
    second = {p.choice.algorithm for p in g.prepared.values()}
    again = MPI.COMM_WORLD.allreduce(rank)            # a communicator of the new world
    return first, got, held, emptied, second, os.environ["COLLIE_ALGO"], float(x[0]), float(y[0]), again


def test_destroy_resets_the_runtime_and_the_next_world_tunes_anew():
    res = run_ranks(_runtime_body, 3)
    for rank, (first, got, held, emptied, second, forced, x, y, again) in enumerate(res):
        assert got == (rank - 1) % 3
        assert held == (True, True, 1, ["world"])
        assert emptied == (None, 0, 0, 0, 0)
        assert second == {forced.partition(":")[2]} and second != first
        assert x == y == 3.0 and again == 3


def _two_hosts_body(rank, size, backend):
    import os

    import collie
    os.environ["COLLIE_HOST_ID"] = "host-a" if rank < 2 else "host-b"
    try:
        collie.init_process_group(backend=backend)
    except ValueError as exc:
        return str(exc)
    try:
        routes = collie.group.world().network.backend_of
        x = np.full(1000, float(rank))
        collie.all_reduce(x)
        y = np.zeros(3)
        collie.recv(y, src=(rank + 2) % size) if rank >= 2 else collie.send(np.full(3, rank * 1.0), (rank + 2) % size)
        return routes, x[0]
    finally:
        collie.destroy_process_group()


def test_auto_uses_shm_on_the_host_and_tcp_across():
    res = run_ranks(_two_hosts_body, 4, "auto", init=False)
    assert res[0] == (["self", "shm", "tcp", "tcp"], 6.0)
    assert res[3] == (["tcp", "tcp", "shm", "self"], 6.0)


def test_shm_backend_refuses_ranks_on_other_hosts():
    res = run_ranks(_two_hosts_body, 4, "shm", init=False, expect_errors=True)
    assert "backend='shm' needs every rank on one host" in res[0]


# ---- torch.distributed's other setup calls ----------------------------------

def _torch_setup_body(rank, size):
    import collie
    subgroup, subgroups = collie.new_subgroups(2)
    mine, listed = collie.new_subgroups_by_enumeration([[3, 0], [1]])
    x = np.array([rank + 1])
    collie.all_reduce(x, group=subgroup)
    out = {"backend": collie.get_backend(), "sub": collie.get_process_group_ranks(subgroup),
           "subs": [collie.get_process_group_ranks(g) for g in subgroups], "sum": int(x[0]),
           "mine": None if mine is None else collie.get_process_group_ranks(mine),
           "listed": [collie.get_process_group_ranks(g) for g in listed],
           "local": collie.get_node_local_rank()}
    errors = []
    for bad in (lambda: collie.new_subgroups(3), lambda: collie.new_subgroups(0),
                lambda: collie.new_subgroups_by_enumeration([[0, 1], [1]]),
                lambda: collie.new_subgroups_by_enumeration([])):
        try:
            bad()
        except ValueError as exc:
            errors.append(str(exc).split(":")[0])
    out["errors"] = errors
    collie.monitored_barrier(wait_all_ranks=True)
    collie.monitored_barrier(group=subgroup, timeout=5)
    return out


def test_torch_setup_calls_gloo_subgroups_and_monitored_barrier():
    res = run_ranks(_torch_setup_body, 4, backend="gloo")
    for r, out in enumerate(res):
        assert out["backend"] == "gloo"
        assert out["subs"] == [[0, 1], [2, 3]] and out["sub"] == [[0, 1], [2, 3]][r // 2]
        assert out["sum"] == {0: 3, 1: 3, 2: 7, 3: 7}[r]
        assert out["mine"] == {0: [0, 3], 1: [1], 3: [0, 3]}.get(r)  # sorted, as new_group's
        assert out["listed"] == [[0, 3], [1]] and out["local"] == r
        assert out["errors"] == ["new_subgroups"] * 2 + ["new_subgroups_by_enumeration"] * 2


def _late_rank_body(rank, size):
    import time
    import collie
    if rank == 2:
        time.sleep(3)  # comes too late for rank 0's timeout
    try:
        collie.monitored_barrier(timeout=1, wait_all_ranks=True)
    except collie.CollieError as exc:
        return type(exc).__name__, str(exc), getattr(exc, "peers", ())
    return "passed", "", ()


def test_monitored_barrier_names_the_ranks_that_did_not_come():
    res = run_ranks(_late_rank_body, 4, timeout=60, init_kwargs={"timeout": 10})
    kind, text, peers = res[0]
    assert kind == "CollieTimeout" and peers == (2,), text
    assert "rank 2 did not reach it within 1s" in text, text
    # rank 0 never answered the others: they time out, or see it leave
    assert all(r[0] in ("CollieTimeout", "PeerError") for r in res[1:]), res


def test_backend_names_follow_torch():
    import collie
    from collie.group import _transports_for
    assert collie.Backend("GLOO") == collie.Backend.GLOO == "gloo" and collie.Backend("tcp") == "tcp"
    with pytest.raises(ValueError, match="Invalid backend"):
        collie.Backend("carrier-pigeon")
    assert [_transports_for(b) for b in (None, "gloo", "cpu:gloo,cuda:nccl", "SHM", "tcp")] == \
        ["auto", "auto", "auto", "shm", "tcp"]
    for bad in ("nccl", "cuda:nccl", "mpi"):
        with pytest.raises(ValueError, match="'nccl' and other GPU backends do not apply"):
            _transports_for(bad)
    assert collie.is_available() and collie.is_gloo_available() and not collie.is_nccl_available()
    assert collie.is_backend_available("gloo") and not collie.is_backend_available("nccl")
