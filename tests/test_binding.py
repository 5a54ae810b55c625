"""COLLIE_BIND=core: each rank of a host pinned to its own share of the cores."""

import os

import pytest

from harness import run_ranks
from collie import binding

pytestmark = pytest.mark.timeout(120)


def test_each_rank_gets_an_equal_disjoint_slice():
    assert binding.share(0, 2, [0, 1]) == [0]
    assert binding.share(1, 2, [1, 0]) == [1]
    assert binding.share(1, 2, [0, 1, 2, 3]) == [2, 3]
    assert [binding.share(i, 3, [4, 5, 6, 7]) for i in range(3)] == [[4], [5], [6]]  # one left over
    assert binding.share(0, 3, [0, 1]) is None  # more ranks than cores: nobody is pinned


def test_a_bad_value_is_named():
    assert binding.mode({}) == "none"
    assert binding.mode({"COLLIE_BIND": " Core "}) == "core"
    with pytest.raises(ValueError, match="COLLIE_BIND must be one of none, core, not 'socket'"):
        binding.mode({"COLLIE_BIND": "socket"})


def _affinity_body(rank, size):
    import threading

    import collie
    from collie.group import world
    started = threading.Event()
    stop = threading.Event()

    def idle():
        started.set()
        stop.wait()

    before = threading.Thread(target=idle)  # made before init: pinned too
    before.start()
    started.wait()
    collie.init_process_group()
    try:
        mine = sorted(os.sched_getaffinity(0))
        other = sorted(os.sched_getaffinity(before.native_id))
        hosts = world().network.hosts
    finally:
        stop.set()
        before.join()
        collie.destroy_process_group()
    return mine, other, len(hosts)


@pytest.mark.parametrize("size", [2, 3])
def test_ranks_are_pinned_to_their_share(size):
    cores = sorted(os.sched_getaffinity(0))
    got = run_ranks(_affinity_body, size, init=False, env={"COLLIE_BIND": "core"})
    for rank, (mine, other, nhosts) in enumerate(got):
        want = binding.share(rank, size, cores)
        assert mine == other == (cores if want is None else want)
    if binding.share(0, size, cores) is not None:
        assert len({c for mine, _, _ in got for c in mine}) == sum(len(m) for m, _, _ in got)  # disjoint


def _unpinned_body(rank, size):
    return sorted(os.sched_getaffinity(0))


def test_unset_leaves_ranks_where_they_are():
    cores = sorted(os.sched_getaffinity(0))
    assert run_ranks(_unpinned_body, 2, env={"COLLIE_BIND": ""}) == [cores, cores]


def _bad_body(rank, size):
    from datetime import timedelta

    import collie
    try:  # a world of 2 of which only this rank starts
        collie.init_process_group(world_size=2, rank=0, timeout=timedelta(seconds=10))
    except ValueError as exc:
        return str(exc)
    collie.destroy_process_group()
    return "no error"


def test_init_refuses_a_bad_value_before_the_rendezvous():
    # Only rank 0 of 2 starts: a check made after the rendezvous would time out first.
    assert run_ranks(_bad_body, 1, init=False, env={"COLLIE_BIND": "numa"},
                     timeout=30) == ["COLLIE_BIND must be one of none, core, not 'numa'"]
