"""The hierarchical all_reduce on real ranks placed on faked hosts
(COLLIE_HOST_ID): even, uneven and interleaved layouts, against NumPy; the
tuner picks it for large calls across hosts; its schedules are proved for
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


def test_the_tuner_picks_hier_across_hosts_for_large_calls():
    res = run_ranks(_body, 4, (0, 0, 1, 1), (4 << 20) // 8 + 3, "float64", "SUM", None, timeout=90,
                    env={"COLLIE_TOKEN": ""}, init=False)
    for x, everyone, chosen, _ in res:
        np.testing.assert_allclose(x, np.sum(everyone, axis=0))
        assert chosen == {"hier"}
    assert default_choice("all_reduce", 1 << 20, 4, "tcp", (0, 0, 1, 1)).algorithm != "hier"  # flat wins there
    assert default_choice("all_reduce", 1 << 20, 4, "tcp", (0, 1, 2, 3)).algorithm != "hier"  # a host each
    assert default_choice("all_reduce", 1 << 20, 4, "shm", (0, 0, 0, 0)).algorithm != "hier"  # one host


def test_hier_schedules_are_proved_for_every_layout():
    assert verify.verify_algorithm("all_reduce", "hier", nranks=range(1, 13)) == sum(
        len(verify.host_layouts(n)) for n in range(1, 13))
    # Fewer rounds than a flat ring when hosts hold several ranks.
    assert verify.rounds("all_reduce", "hier", 8, hosts=(0,) * 4 + (1,) * 4) < verify.rounds("all_reduce", "ring", 8)


def test_bad_layouts():
    with pytest.raises(ValueError, match="hosts gives 3 ranks' hosts, not 4"):
        algorithms.build("all_reduce", "hier", 4, 0, hosts=(0, 0, 1))
