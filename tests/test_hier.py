"""The hierarchical algorithms on real ranks placed on faked hosts
(COLLIE_HOST_ID): all_reduce, broadcast, reduce, all_gather, reduce_scatter
and barrier, on even,
uneven and interleaved layouts, against NumPy; the tuner picks them (but
barrier's) for large calls across hosts; their schedules are proved for
every layout the verifier tries."""

from __future__ import annotations

import numpy as np
import pytest

from collie import algorithms, verify
from collie.tuner import default_choice
from harness import run_ranks

pytestmark = pytest.mark.timeout(120)


def _body(rank, size, hosts, count, dtype, op, algorithm):
    import os

    import collie
    os.environ["COLLIE_HOST_ID"] = f"host{hosts[rank]}"
    collie.init_process_group()
    try:
        rng = np.random.default_rng(1234)
        everyone = [rng.integers(-50, 50, count).astype(dtype) for _ in range(size)]
        x = everyone[rank].copy()
        collie.all_reduce(x, op=getattr(collie.ReduceOp, op), algorithm=algorithm)
        g = collie.group.world().group
        chosen = {p.choice.algorithm for p in g.prepared.values()}
        routes = collie.group.world().network.backend_of
        return x, everyone, chosen, routes
    finally:
        collie.destroy_process_group()


_NUMPY = {"SUM": np.add, "MAX": np.maximum, "PRODUCT": np.multiply}


@pytest.mark.parametrize("hosts, count, dtype, op", [
    ((0, 0, 1, 1), 1001, "float64", "SUM"),
    ((0, 0, 0, 1, 1), 37, "int32", "MAX"),          # uneven hosts, fewer elements than parts x hosts
    ((0, 1, 0, 1, 2), 1000, "int64", "SUM"),        # a host's ranks need not be consecutive
    ((0, 0, 0, 1, 1, 2, 2), 20000, "float32", "SUM"),
    ((0, 1, 2), 10, "int64", "PRODUCT"),            # one rank per host: a ring across hosts
], ids=["2x2", "3+2", "interleaved", "3+2+2", "1x3"])
def test_forced_hier_is_right(hosts, count, dtype, op):
    res = run_ranks(_body, len(hosts), hosts, count, dtype, op, "hier", timeout=90,
                    env={"COLLIE_TOKEN": ""}, init=False)
    for rank, (x, everyone, chosen, routes) in enumerate(res):
        want = everyone[0].copy()
        for other in everyone[1:]:
            want = _NUMPY[op](want, other)
        np.testing.assert_allclose(x, want, rtol=1e-5)
        assert chosen == {"hier"}
        for peer, route in enumerate(routes):
            same = hosts[peer] == hosts[rank]
            assert route == ("self" if peer == rank else "shm" if same else "tcp"), routes


def _others_body(rank, size, hosts, count):
    import os
    import time

    import collie
    os.environ["COLLIE_HOST_ID"] = f"host{hosts[rank]}"
    collie.init_process_group()
    try:
        got = {}
        for root in range(size):  # every root: leaders differ with the root's host
            x = np.arange(count, dtype=np.float64) * (rank + 1)
            collie.broadcast(x, src=root, algorithm="hier")
            got[f"broadcast {root}"] = x.tolist() == (np.arange(count) * (root + 1.0)).tolist()
            y = np.arange(count, dtype=np.int64) * (rank + 1)
            collie.reduce(y, dst=root, op=collie.ReduceOp.MAX if root % 2 else collie.ReduceOp.SUM,
                          algorithm="hier")
            factor = size if root % 2 else size * (size + 1) // 2  # the root's result; the others keep theirs
            got[f"reduce {root}"] = y.tolist() == (np.arange(count) * (factor if rank == root else rank + 1)).tolist()
        rs = np.empty(count, np.float64)
        collie.reduce_scatter_tensor(rs, np.arange(count * size, dtype=np.float64) * (rank + 1), algorithm="hier")
        got["reduce_scatter_tensor"] = rs.tolist() == (np.arange(count * size)[rank * count:(rank + 1) * count]
                                                       * (size * (size + 1) // 2)).tolist()
        mine = np.empty(rank + 2, np.int64)  # uneven blocks
        collie.reduce_scatter(mine, [np.full(q + 2, rank + q, np.int64) for q in range(size)], algorithm="hier")
        got["reduce_scatter uneven"] = mine.tolist() == [sum(r + rank for r in range(size))] * (rank + 2)
        out = np.empty(count * size, np.int32)
        collie.all_gather_into_tensor(out, np.full(count, rank, np.int32), algorithm="hier")
        got["all_gather_into_tensor"] = out.tolist() == [r for r in range(size) for _ in range(count)]
        outs = [np.empty(r + 1, np.int64) for r in range(size)]  # uneven blocks
        collie.all_gather(outs, np.full(rank + 1, 10 * rank, np.int64), algorithm="hier")
        got["all_gather uneven"] = [o.tolist() for o in outs] == [[10 * r] * (r + 1) for r in range(size)]
        a2a = np.empty(count * size, np.float64)  # item q of rank r: 1000 r + q, count elements each
        collie.all_to_all_single(a2a, np.repeat(1000.0 * rank + np.arange(size), count), algorithm="hier")
        got["all_to_all_single"] = a2a.tolist() == np.repeat(1000.0 * np.arange(size) + rank, count).tolist()
        # barrier: the last rank arrives late; nobody may leave before it
        if rank == size - 1:
            time.sleep(0.3)
        start = time.time()
        collie.barrier(algorithm="hier")
        left = time.time()
        stamps = np.array([start, left])
        every = np.empty(2 * size)
        collie.all_gather_into_tensor(every, stamps)
        got["barrier"] = every[1::2].min() >= every[0::2].max()
        chosen = {p.choice.algorithm for p in collie.group.world().group.prepared.values()}
        return got, chosen
    finally:
        collie.destroy_process_group()


@pytest.mark.parametrize("hosts", [(0, 0, 1, 1), (0, 0, 0, 1, 1), (0, 1, 0, 1, 2), (0, 1, 2)],
                         ids=["2x2", "3+2", "interleaved", "1x3"])
def test_forced_hier_broadcast_all_gather_all_to_all_and_barrier_are_right(hosts):
    res = run_ranks(_others_body, len(hosts), hosts, 1001, timeout=90, env={"COLLIE_TOKEN": ""}, init=False)
    for got, chosen in res:
        assert all(got.values()), got
        assert "hier" in chosen


def test_the_tuner_picks_hier_across_hosts_for_large_calls():
    res = run_ranks(_body, 4, (0, 0, 1, 1), (4 << 20) // 8 + 3, "float64", "SUM", None, timeout=90,
                    env={"COLLIE_TOKEN": ""}, init=False)
    for x, everyone, chosen, _ in res:
        np.testing.assert_allclose(x, np.sum(everyone, axis=0))
        assert chosen == {"hier"}
    assert default_choice("all_reduce", 1 << 20, 4, "tcp", (0, 0, 1, 1)).algorithm != "hier"  # flat wins there
    assert default_choice("all_reduce", 1 << 20, 4, "tcp", (0, 1, 2, 3)).algorithm != "hier"  # a host each
    assert default_choice("all_reduce", 1 << 20, 4, "shm", (0, 0, 0, 0)).algorithm != "hier"  # one host
    # broadcast from 4 MiB and all_gather from 16 MiB, across hosts with several ranks each
    for collective, least in (("broadcast", 4 << 20), ("reduce", 4 << 20), ("all_gather", 16 << 20),
                              ("reduce_scatter", 1 << 20)):
        assert default_choice(collective, least, 4, "tcp", (0, 0, 1, 1)).algorithm == "hier"
        assert default_choice(collective, least // 2, 4, "tcp", (0, 0, 1, 1)).algorithm != "hier"
        assert default_choice(collective, least, 4, "tcp", (0, 1, 2, 3)).algorithm != "hier"
        assert default_choice(collective, least, 4, "shm", (0, 0, 0, 0)).algorithm != "hier"


@pytest.mark.parametrize("collective", ["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "barrier"])
def test_hier_schedules_are_proved_for_every_layout(collective):
    segments = 3 if algorithms.pipelined(collective, "hier") else 1  # all_reduce's pieces: 1, 2 and 3
    assert verify.verify_algorithm(collective, "hier", nranks=range(1, 13)) == segments * sum(
        len(verify.host_layouts(n)) for n in range(1, 13))


@pytest.mark.parametrize("collective", ["broadcast", "reduce"])
def test_hier_rooted_schedules_are_proved_for_every_layout_and_root(collective):
    assert verify.verify_algorithm(collective, "hier", nranks=range(1, 13), roots=lambda n: range(n)) == sum(
        n * len(verify.host_layouts(n)) for n in range(1, 13))


def test_hier_sends_each_byte_across_hosts_once_per_host():
    # 3 hosts x 3 ranks: a flat broadcast tree crosses hosts up to 8 times
    # with the buffer; hier exactly twice (once into each other host).
    hosts = (0, 0, 0, 1, 1, 1, 2, 2, 2)
    for root in range(9):
        crossing = sum(1 for r in range(9) for step in algorithms.build("broadcast", "hier", 9, r, root,
                                                                      hosts=hosts).steps
                       for op in step if type(op).__name__ == "Send" and hosts[op.peer] != hosts[r])
        assert crossing == 2
    # all_gather: each rank's block enters each other host once
    crossing = sum(len(op.chunks) for r in range(9) for step in algorithms.build(
        "all_gather", "hier", 9, r, 0, hosts=hosts).steps
        for op in step if type(op).__name__ == "Send" and hosts[op.peer] != hosts[r])
    assert crossing == 9 * 2
    # all_to_all: each rank gets one message from each other host (pairwise: one per
    # rank of it), carrying every item of that host for it: 6 items in 2 messages
    for r in range(9):
        into = [(step_ops.peer, len(step_ops.chunks)) for other in range(9) for step in algorithms.build(
            "all_to_all", "hier", 9, other, 0, hosts=hosts).steps for step_ops in step
            if type(step_ops).__name__ == "Send" and step_ops.peer == r and hosts[other] != hosts[r]]
        assert sorted(n for _, n in into) == [3, 3], (r, into)
    # Fewer rounds than a flat ring when hosts hold several ranks.
    assert verify.rounds("all_reduce", "hier", 8, hosts=(0,) * 4 + (1,) * 4) < verify.rounds("all_reduce", "ring", 8)


def test_bad_layouts():
    with pytest.raises(ValueError, match="hosts gives 3 ranks' hosts, not 4"):
        algorithms.build("all_reduce", "hier", 4, 0, hosts=(0, 0, 1))


def _striped_body(rank, size, hosts, count):
    import os

    import collie
    os.environ["COLLIE_HOST_ID"] = f"host{hosts[rank]}"
    collie.init_process_group()
    try:
        network = collie.group.world().network
        links = {p: len(network.tcp._peers[p].links) for p in range(size) if p != rank}
        rng = np.random.default_rng(99)
        everyone = [rng.standard_normal(count).astype(np.float32) for _ in range(size)]
        got = {}
        for algorithm in ("ring", "hier", "direct" if size <= 8 else "ring"):
            x = everyone[rank].copy()
            collie.all_reduce(x, algorithm=algorithm)
            got[f"all_reduce {algorithm}"] = bool(np.allclose(x, np.sum(everyone, axis=0), rtol=1e-4, atol=1e-4))
        out = np.empty(count * size, np.float32)
        collie.all_gather_into_tensor(out, everyone[rank])
        got["all_gather"] = bool(np.array_equal(out, np.concatenate(everyone)))
        x = everyone[rank].copy() if rank == 1 else np.zeros(count, np.float32)
        collie.broadcast(x, src=1)
        got["broadcast"] = bool(np.array_equal(x, everyone[1]))
        per = count // size  # the rest of count is not sent: items of per elements
        out = np.empty(per * size, np.float32)
        collie.all_to_all_single(out, everyone[rank][:per * size])
        got["all_to_all"] = bool(np.array_equal(out, np.concatenate([e[rank * per:(rank + 1) * per]
                                                                     for e in everyone])))
        return links, got
    finally:
        collie.destroy_process_group()


@pytest.mark.parametrize("hosts", [(0, 0, 1, 1), (0, 1, 2)], ids=["2x2", "1x3"])
def test_ranks_on_other_hosts_stripe_big_messages_across_connections(hosts):
    """Three connections to each rank on another host (one to those on the
    same host, which talk through shared memory); every message from 64 KiB
    on is striped across them, and the collectives stay right."""
    env = {"COLLIE_TOKEN": "", "COLLIE_TCP_STREAMS": "3", "COLLIE_TCP_STRIPE_MIN": str(64 << 10)}
    res = run_ranks(_striped_body, len(hosts), hosts, 300_007, timeout=90, env=env, init=False)
    for rank, (links, got) in enumerate(res):
        assert links == {p: 3 if hosts[p] != hosts[rank] else 1 for p in links}, (rank, links)
        assert all(got.values()), (rank, got)
