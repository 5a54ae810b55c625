"""COLLIE_TOPOLOGY and the link measured at setup (collie/topology.py), and
the tuner's model of that link (collie/tuner.py): the format and its
errors, real ranks on one machine told they are on two hosts (the routes,
every rank's view, the tuner's pick and the results against NumPy), bad
values raising the same error on every rank, and the model's picks."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from collie import sim, topology, tuner
from harness import run_ranks

pytestmark = pytest.mark.timeout(120)
MiB = 1 << 20


# ---- the format ---------------------------------------------------------------

def test_the_forms_of_collie_topology(tmp_path):
    spec = topology.parse("hosts=0-1,4/2-3; rate=1gbit; latency=80us")
    assert spec.hosts == ((0, 1, 4), (2, 3)) and spec.per_host is None
    assert spec.rate == pytest.approx(125e6) and spec.latency == pytest.approx(80e-6)
    assert topology.parse('{"per_host": 4, "rate": "1.2GB/s"}')[1:] == (None, 4, 1.2e9, None, None)
    assert topology.parse('{"hosts": [[0, 2], [1, 3]], "rate": 5e8, "latency": 1e-5}')[1:] == (
        ((0, 2), (1, 3)), None, 5e8, 1e-5, None)
    assert topology.parse("single_copy=4.5").single_copy == 4.5
    assert topology.parse('{"single_copy": 2}').single_copy == topology.parse("single_copy=2x").single_copy == 2
    path = tmp_path / "topo.json"
    path.write_text(json.dumps({"hosts": "0-3/4-7", "rate": "100mbit"}))
    assert topology.parse(str(path)).hosts == (tuple(range(4)), tuple(range(4, 8)))
    assert topology.from_environ({}) is None and topology.from_environ({"COLLIE_TOPOLOGY": " "}) is None
    assert topology.assign(topology.parse("per_host=3"), 7) == [0, 0, 0, 1, 1, 1, 2]
    assert topology.assign(topology.parse("hosts=0,2/1,3"), 4) == [0, 1, 0, 1]


@pytest.mark.parametrize("text, message", [
    ("hosts=0-1/2-3; rte=1gbit", "unknown key 'rte'"),
    ("hosts=0-1/1-3", "rank 1 is on two hosts"),
    ("hosts=0-1//2", "has an empty host"),
    ("hosts=0-x", "'0-x' is not a rank or a range"),
    ("hosts=3-1", "'3-1' is not a rank or a range"),
    ("rate=fast", "'fast' is not a number with a unit"),
    ("rate=10gbps", "'10gbps' has no known unit"),
    ("rate=0gbit", "rate must be above 0"),
    ("single_copy=0", "single_copy must be above 0"),
    ("single_copy=slow", "single_copy 'slow' is not a number"),
    ("latency=5us", "latency needs a rate"),
    ("hosts=0/1; per_host=1", "hosts or per_host, not both"),
    ("per_host=0", "per_host must be a whole number"),
    ("per_host=1.5", "per_host must be a whole number"),
    ('{"hosts": [[0, true]]}', "hosts must hold ranks"),
    ('{"hosts": 3}', "hosts must be a string"),
    ("{nope", "not valid JSON"),
    ("/no/such/topology.json", "neither key=value pairs nor a readable JSON file"),
    ("hosts", "neither key=value pairs nor a readable JSON file"),
    ("[1, 2]", "neither key=value pairs nor a readable JSON file"),
])
def test_bad_values_say_what_is_wrong(text, message):
    with pytest.raises(ValueError, match="COLLIE_TOPOLOGY") as err:
        topology.parse(text)
    assert message in str(err.value)


def test_stated_hosts_must_cover_the_world_and_not_join_machines():
    with pytest.raises(ValueError, match=r"puts rank\(s\) 3-4 on no host"):
        topology.assign(topology.parse("hosts=0-1/2"), 5)
    with pytest.raises(ValueError, match="places rank 4, but the world has 4 ranks"):
        topology.assign(topology.parse("hosts=0-1/2-4"), 4)
    with pytest.raises(ValueError, match="puts ranks 0 and 2 on one host, but they run on different machines"):
        topology.check_machines([0, 0, 0], ["a/1", "a/1", "b/1"])
    topology.check_machines([0, 1, 2], ["a/1", "a/1", "a/1"])  # splitting a machine is fine
    with pytest.raises(ValueError, match="COLLIE_LINK_PROBE must be 0 or 1"):
        topology.probing({"COLLIE_LINK_PROBE": "no"})


# ---- real ranks ---------------------------------------------------------------

def _two_hosts_body(rank, size, count):
    import collie
    from collie import collectives, tuner as tn
    collie.init_process_group()
    try:
        x = np.arange(count, dtype=np.float64) * (rank + 1)
        collie.all_reduce(x)
        g = collie.group.world().group
        picked = {p.choice.algorithm for p in g.prepared.values()}
        sub = collie.new_group([0, 1, 2])  # spans both hosts: (0, 0, 1)
        y = np.full(count, rank + 1.0)
        if rank < 3:
            collie.all_reduce(y, group=sub)
        sub_pick = {p.choice.algorithm for p in sub.prepared.values()} if rank < 3 else set()
        hits = tn.modelled.cache_info().hits
        again = collectives.choose(g, "all_reduce", x.nbytes, exclude=collectives.excluded(g, "all_reduce"))
        return (collie.get_topology(), collie.group.world().network.backend_of, x, picked, y, sub_pick,
                again.algorithm, tn.modelled.cache_info().hits - hits)
    finally:
        collie.destroy_process_group()


@pytest.mark.parametrize("stated", [False, True], ids=["measured", "stated"])
def test_collie_topology_makes_two_hosts_of_one_machine(stated):
    count = 4 * MiB // 8
    value = "hosts=0,1/2,3" + ("; rate=1gbit" if stated else "")
    res = run_ranks(_two_hosts_body, 4, count, timeout=90, init=False,
                    env={"COLLIE_TOPOLOGY": value, "COLLIE_TOKEN": ""})
    want = np.arange(count, dtype=np.float64) * 10
    topo = res[0][0]
    assert topo["hosts"] == [[0, 1], [2, 3]] and topo["source"] == "COLLIE_TOPOLOGY"
    assert topo["link_source"] == ("stated by COLLIE_TOPOLOGY" if stated else topo["link_source"])
    assert stated or topo["link_source"].startswith("measured at setup in ")
    link = (topo["link"]["latency_s"], 1 / topo["link"]["rate_bytes_per_s"])
    pick = tuner.default_choice("all_reduce", 4 * MiB, 4, "tcp", (0, 0, 1, 1), link).algorithm
    sub_pick_want = tuner.default_choice("all_reduce", 4 * MiB, 3, "tcp", (0, 0, 1), link).algorithm
    if stated:  # 1 Gbit/s: the model decides, and sends each byte across once
        assert pick == "hier"
    for rank, (topo_r, routes, x, picked, y, sub_pick, again, hits) in enumerate(res):
        assert topo_r == topo  # rank 0 measured, every rank holds its numbers
        assert routes == ["self" if p == rank else "shm" if p // 2 == rank // 2 else "tcp" for p in range(4)]
        np.testing.assert_array_equal(x, want)
        assert picked == {pick}, (picked, pick)
        assert again == pick
        assert hits == (1 if stated else hits)  # the model's pick comes from its cache
        if rank < 3:
            np.testing.assert_array_equal(y, np.full(count, 6.0))
            assert sub_pick == {sub_pick_want}


def _pick_body(rank, size, nbytes):
    import collie
    from collie import collectives
    collie.init_process_group()
    try:
        g = collie.group.world().group
        x = np.zeros(nbytes // 4, np.float32)
        collie.all_reduce(x)
        return (collie.get_topology(), collectives.choose(g, "all_reduce", nbytes).reason,
                {p.choice.algorithm for p in g.prepared.values()})
    finally:
        collie.destroy_process_group()


def test_a_stated_link_is_not_measured_and_the_model_uses_it():
    # 1 Gbit/s between the two hosts: the model sends each byte across once (hier)
    res = run_ranks(_pick_body, 4, 16 * MiB, timeout=90, init=False,
                    env={"COLLIE_TOPOLOGY": "per_host=2; rate=1gbit; latency=100us", "COLLIE_TOKEN": ""})
    for topo, reason, picked in res:
        assert topo["link"] == {"rate_bytes_per_s": pytest.approx(125e6), "latency_s": pytest.approx(1e-4)}
        assert topo["link_source"] == "stated by COLLIE_TOPOLOGY"
        assert picked == {"hier"} and "125 MB/s, 100 us" in reason


def test_without_the_probe_the_table_decides():
    res = run_ranks(_pick_body, 4, 1 * MiB, timeout=90, init=False,
                    env={"COLLIE_TOPOLOGY": "per_host=2", "COLLIE_LINK_PROBE": "0", "COLLIE_TOKEN": ""})
    table = tuner.table_choice("all_reduce", 1 * MiB, 4, "tcp", (0, 0, 1, 1))
    for topo, reason, picked in res:
        assert topo["link"] is None and topo["link_source"] == "not measured (COLLIE_LINK_PROBE=0)"
        assert picked == {table.algorithm} and reason == table.reason


def test_one_host_measures_no_link_and_every_rank_holds_rank_0s_single_copy_cost(capfd):
    res = run_ranks(_pick_body, 2, 1024, timeout=60, init=False, env={"COLLIE_TOKEN": "", "COLLIE_DEBUG": "INFO"})
    cost = res[0][0]["single_copy"]
    assert cost is None or cost > 0  # None where this machine's processes may not read each other
    for topo, _, _ in res:
        assert topo == {"hosts": [[0, 1]], "source": "hostnames", "link": None,
                        "link_source": "one host: no link between hosts", "single_copy": cost}
    err = capfd.readouterr().err
    assert "collie INFO topology: 1 host(s) [0-1] from hostnames (one host: no link between hosts)" in err
    assert cost is None or f"a single copy of 1 MiB takes {cost:.1f}x a copy's time on rank 0's host" in err


@pytest.mark.parametrize("cost,algorithm", [(4.0, "ring"), (1.5, "rabenseifner")])
def test_a_stated_single_copy_cost_reaches_every_ranks_tuner(cost, algorithm):
    """COLLIE_TOPOLOGY's single_copy replaces rank 0's timing: every rank
    holds it, and the 2-rank all_reduce of 4 MiB goes through the rings
    where single copy is slow (tuner.SLOW_SINGLE_COPY) and single copy
    where it is not."""
    res = run_ranks(_pick_body, 2, 4 * MiB, timeout=60, init=False,
                    env={"COLLIE_TOPOLOGY": f"single_copy={cost}", "COLLIE_TOKEN": ""})
    for topo, _, picked in res:
        assert topo["single_copy"] == cost and picked == {algorithm}


def test_the_info_line_says_what_was_measured(capfd):
    run_ranks(_pick_body, 4, 1024, timeout=60, init=False,
              env={"COLLIE_TOPOLOGY": "hosts=0-1/2-3", "COLLIE_TOKEN": "", "COLLIE_DEBUG": "INFO"})
    err = capfd.readouterr().err
    line = next(x for x in err.splitlines() if x.startswith("collie INFO topology:"))
    assert "2 host(s) [0-1 | 2-3] from COLLIE_TOPOLOGY; between hosts" in line
    assert "MB/s each way" in line and "(measured at setup in" in line
    assert err.count("collie INFO topology:") == 1  # rank 0 only


def _init_only(rank, size, values):
    import os

    import collie
    if values is not None:
        os.environ["COLLIE_TOPOLOGY"] = values[rank]
    collie.init_process_group()
    collie.destroy_process_group()


@pytest.mark.parametrize("env, values, message", [
    ({"COLLIE_TOPOLOGY": "hosts=0-1; rat=1gbit"}, None, "unknown key 'rat'"),           # before the rendezvous
    ({"COLLIE_TOPOLOGY": "hosts=0-1/2"}, None, r"puts rank\(s\) 3 on no host"),
    ({}, ["per_host=2", "per_host=2", "per_host=1", "per_host=2"], "differs between ranks: rank 0 has "
                                                                    "'per_host=2', rank 2 has 'per_host=1'"),
    ({}, ["per_host=2", "", "per_host=2", "per_host=2"], "rank 1 has ''"),
])
def test_a_bad_topology_raises_on_every_rank(env, values, message):
    res = run_ranks(_init_only, 4, values, timeout=60, init=False, expect_errors=True,
                    env=dict(env, COLLIE_TOKEN=""))
    for r in res:
        assert r.type_name == "ValueError" and "COLLIE_TOPOLOGY" in r.message, r
        assert re.search(message, r.message), r.message


def _machines_body(rank, size):
    import os

    import collie
    os.environ["COLLIE_HOST_ID"] = f"machine-{rank % 2}"  # ranks 0, 2 on one machine, 1, 3 on another
    collie.init_process_group()
    collie.destroy_process_group()


def test_a_stated_host_cannot_join_two_machines():
    res = run_ranks(_machines_body, 4, timeout=60, init=False, expect_errors=True,
                    env={"COLLIE_TOPOLOGY": "hosts=0-1/2-3", "COLLIE_TOKEN": ""})
    for r in res:
        assert r.type_name == "ValueError", r
        assert "puts ranks 0 and 1 on one host, but they run on different machines ('machine-0' and " \
               "'machine-1')" in r.message


# ---- the model ----------------------------------------------------------------

def test_the_model_picks_once_per_band_and_the_same_everywhere():
    link = (50e-6, 1 / 119e6)  # the test bed's 1 Gbit/s: 4 MiB take 35 ms to cross
    tuner.modelled.cache_clear()
    first = tuner.default_choice("all_reduce", 4 * MiB, 4, "tcp", (0, 0, 1, 1), link)
    for nbytes in (4 * MiB + 4, 6 * MiB, 8 * MiB - 1):  # the same band: no new simulation
        assert tuner.default_choice("all_reduce", nbytes, 4, "tcp", (0, 0, 1, 1), link).algorithm == first.algorithm
    info = tuner.modelled.cache_info()
    assert info.misses == 1 and info.hits == 3
    assert first.algorithm == "hier" and first.segments == 8 and "119 MB/s, 50 us" in first.reason
    # not across hosts, no link, or a collective the model leaves alone (no size): the table
    for args in (("all_reduce", 4 * MiB, 4, "shm", (0, 0, 0, 0), link),
                 ("all_reduce", 4 * MiB, 4, "tcp", (0, 0, 1, 1), None),
                 ("all_to_all", 0, 4, "tcp", (0, 0, 1, 1), link),
                 ("barrier", 0, 4, "tcp", (0, 0, 1, 1), link)):
        assert tuner.default_choice(*args) == tuner.table_choice(*args[:5])
    # an excluded algorithm is never picked
    assert tuner.default_choice("all_reduce", 4 * MiB, 4, "tcp", (0, 0, 1, 1), link,
                                exclude={"hier": "test"}).algorithm != "hier"
    # nor on links faster than 150 MB/s, for groups of more than 32 ranks, or all_reduce under 128 KiB
    for args in (("all_reduce", 16 * MiB, 4, "tcp", (0, 0, 1, 1), (50e-6, 1 / 160e6)),
                 ("all_reduce", 64 << 10, 4, "tcp", (0, 0, 1, 1), link),
                 ("all_reduce", 16 * MiB, 34, "tcp", tuple(r // 17 for r in range(34)), link)):
        assert tuner.default_choice(*args) == tuner.table_choice(*args[:5])


def test_the_model_sees_a_slow_link_and_a_fast_one_differently():
    slow, fast = (50e-6, 1 / 119e6), (20e-6, 1 / 10e9)
    # each byte across once pays on a slow link; on one faster than shared memory, a flat ring
    modelled = lambda link: tuner.modelled("all_reduce", (64 * MiB).bit_length(), (0, 0, 1, 1), link, frozenset())
    assert modelled(slow)[0] == "hier" and modelled(fast)[0] == "ring"
    # and a broadcast on the slow link goes down a tree, which sends the buffer across once;
    # the table's direct (for 4 ranks) sends it across twice (2x slower on the test bed)
    for nbytes in (64 << 10, MiB):
        assert tuner.default_choice("broadcast", nbytes, 4, "tcp", (0, 0, 1, 1), slow).algorithm == "tree"
        assert tuner.table_choice("broadcast", nbytes, 4, "tcp", (0, 0, 1, 1)).algorithm == "direct"


def test_a_host_link_shared_by_its_ranks_costs_them_its_rate():
    """sim's host_nic: two ranks of a host sending across at once share the
    link; hier all_reduce's phase across hosts takes twice as long."""
    base = sim.Model(sim.Link(1e-6, 1e-11), sim.Link(0.0, 1 / 100e6), 0.0, 0.0)
    n = 64 * MiB
    apart = sim.simulate("all_reduce", "hier", 4, n, model=base, hosts=2, segments=1).seconds
    shared = sim.simulate("all_reduce", "hier", 4, n, model=base._replace(host_nic=True), hosts=2,
                          segments=1).seconds
    assert apart == pytest.approx(n / 2 / 100e6, rel=0.02)   # each rank's half of S across, at its own rate
    assert shared == pytest.approx(n / 100e6, rel=0.02)      # S through the host's one link
    # one rank per host: nothing shared, nothing changes
    assert sim.simulate("all_reduce", "ring", 3, n, model=base, hosts=3).seconds == pytest.approx(
        sim.simulate("all_reduce", "ring", 3, n, model=base._replace(host_nic=True), hosts=3).seconds)


def test_sim_takes_a_groups_layout_of_hosts():
    m = sim.DEFAULT_MODEL._replace(host_nic=True)
    even = sim.simulate("all_reduce", "ring", 8, MiB, model=m, hosts=2)
    labels = sim.simulate("all_reduce", "ring", 8, MiB, model=m, hosts=(0, 0, 0, 0, 1, 1, 1, 1))
    assert labels.seconds == pytest.approx(even.seconds) and labels.simulated == even.simulated == 4
    odd = sim.simulate("all_reduce", "hier", 5, MiB, model=m, hosts=(0, 1, 0, 1, 1), segments=2)
    assert odd.simulated == 5 and odd.seconds > 0  # interleaved: every rank simulated
    with pytest.raises(ValueError, match="host of 3 ranks, not of 4"):
        sim.simulate("all_reduce", "ring", 4, MiB, hosts=(0, 0, 1))
    with pytest.raises(ValueError, match="not symmetric"):
        sim.simulate("all_reduce", "ring", 5, MiB, hosts=(0, 1, 0, 1, 1), symmetry="require")
