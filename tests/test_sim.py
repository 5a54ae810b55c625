"""collie.sim: the real schedules on an alpha-beta-gamma model, checked
against the closed forms of Thakur, Rabenseifner and Gropp (2005), against
engine.plan's sizes, and its symmetric shortcut against the full simulation."""

import json
import os
import time

import pytest

from collie import algorithms, engine
from collie.sim import (DEFAULT_MODEL, HOST_START, Link, Model, _basis_model, _nnls, _Sizer, _skeleton,
                        bench_seconds, block_sizes, calibrate, closed_form, main, read_bench_rows, simulate)

# delta (local copies) is 0: the paper does not count them.
PAPER = Model(Link(3e-6, 1 / 8e9), Link(3e-6, 1 / 8e9), gamma=1 / 5e9, delta=0.0)

FORMS = [("all_reduce", "ring"), ("all_reduce", "recursive_doubling"), ("all_reduce", "rabenseifner"),
         ("all_reduce", "tree"), ("broadcast", "tree"), ("reduce", "tree"), ("all_gather", "ring"),
         ("all_gather", "recursive_doubling"), ("all_gather", "bruck"), ("reduce_scatter", "rabenseifner"),
         ("all_to_all", "bruck"), ("all_to_all", "pairwise")]


@pytest.mark.parametrize("op,algo", FORMS)
@pytest.mark.parametrize("p", [2, 4, 16, 64])
def test_matches_the_closed_forms(op, algo, p):
    for nbytes in (0, 8 * p, 3 * 4096 * p):  # sizes whose blocks and parts divide evenly
        got = simulate(op, algo, p, nbytes, model=PAPER, segments=1).seconds
        want = closed_form(op, algo, p, nbytes, PAPER)
        assert got == pytest.approx(want, rel=1e-9), (op, algo, p, nbytes)


def test_closed_form_terms_are_the_papers():
    # Spelled out once, so that closed_form itself cannot drift: ring all_reduce on
    # 8 ranks, 1 MB, alpha 3 us, 8 GB/s, gamma 5 GB/s.
    s = 1 << 20
    want = 14 * 3e-6 + 2 * 7 / 8 * s / 8e9 + 7 / 8 * s / 5e9
    assert closed_form("all_reduce", "ring", 8, s, PAPER) == pytest.approx(want)
    assert simulate("all_reduce", "ring", 8, s, model=PAPER).seconds == pytest.approx(want)


def test_local_copies_and_contention_cost_more_than_the_forms():
    # direct all_to_all posts n-1 messages at once: the receiver's port serialises them.
    m = PAPER
    p, s = 8, 8 << 20
    t = simulate("all_to_all", "direct", p, s, model=m).seconds
    assert t == pytest.approx(m.intra.alpha + (p - 1) / p * s * m.intra.beta, rel=1e-6)
    copying = m._replace(delta=1 / 1e9)
    assert simulate("all_gather", "direct", 6, s, model=copying).seconds > \
        simulate("all_gather", "direct", 6, s, model=m).seconds


@pytest.mark.parametrize("op", list(algorithms.ALGORITHMS))
def test_sizes_are_engine_plans_sizes(op):
    # The simulator sizes chunks itself (engine.plan is O(chunks) per rank, too slow at
    # 24,576 ranks); every message and local op must come out as engine.plan has it.
    for algo in algorithms.algorithms_for(op):
        if algo == "shm":
            continue  # sized by engine.plan itself
        for n in (1, 3, 4, 7):
            for nbytes in (0, 52, 4096 + 12):
                _, sizes = block_sizes(op, nbytes, 4, n)
                for r in range(n):
                    sch = algorithms.build(op, algo, n, r, 0, 2)
                    mine = _skeleton(sch, sizes, 4, 0, {})
                    plan = engine.plan(sch, sizes)
                    theirs = tuple((tuple((k, p, 4 * sum(hi - lo for _, lo, hi in dst)) for k, p, _, dst in st.local),
                                    tuple((m.peer, 4 * m.count) for m in st.sends),
                                    tuple((m.peer, 4 * m.count, m.reduce) for m in st.recvs))
                                   for st in plan.steps)
                    assert mine == theirs, (op, algo, n, r, nbytes)


@pytest.mark.parametrize("op,algo,n,hosts,nbytes", [
    ("all_gather", "bruck", 1024, 1, 1 << 20),
    ("all_gather", "bruck", 1024, 128, 1000003),
    ("barrier", "recursive_doubling", 1024, 64, 0),
    ("all_reduce", "ring", 96, 12, 1000003),      # uneven parts: sizes differ by an element
    ("all_reduce", "ring", 96, 1, 3 << 20),
    ("all_to_all", "pairwise", 40, 5, 1 << 16),
])
def test_symmetric_simulation_is_the_full_one(op, algo, n, hosts, nbytes):
    sym = simulate(op, algo, n, nbytes, hosts=hosts, model=DEFAULT_MODEL)
    full = simulate(op, algo, n, nbytes, hosts=hosts, model=DEFAULT_MODEL, symmetry="full")
    assert sym.simulated == (n // hosts if hosts > 1 else 1) < full.simulated == n
    # Exact where parts divide evenly; uneven parts make symmetric ranks' messages
    # differ by an element per chunk, and the representative's time stands for all.
    assert sym.seconds == pytest.approx(full.seconds, rel=1e-9 if nbytes % (4 * n) == 0 else 1e-3)


def test_asymmetric_schedules_are_simulated_in_full():
    r = simulate("all_reduce", "tree", 64, 1 << 10)
    assert r.simulated == 64
    with pytest.raises(ValueError, match="not symmetric"):
        simulate("all_reduce", "tree", 64, 1 << 10, symmetry="require")


def test_all_reduce_at_24576_ranks():
    # The scale, for the cheapest two here (ring by symmetry, tree in full);
    # docs/scale.md times all four.
    n = 24576
    t0 = time.perf_counter()
    ring = simulate("all_reduce", "ring", n, 8)
    tree = simulate("all_reduce", "tree", n, 8)
    assert time.perf_counter() - t0 < 60
    a = DEFAULT_MODEL.intra.alpha
    assert ring.simulated == 1 and ring.seconds == pytest.approx(2 * (n - 1) * a, rel=0.01)
    assert tree.simulated == n and tree.seconds < 2 * 16 * (a + 1e-6)


def test_hosts_make_inter_host_hops_cost_more():
    one = simulate("all_reduce", "tree", 16, 8)
    four = simulate("all_reduce", "tree", 16, 8, hosts=4)
    assert four.seconds > one.seconds


@pytest.mark.parametrize("kwargs,match", [
    (dict(op="all_reduce", algorithm="nope", nranks=4, nbytes=8), "no algorithm"),
    (dict(op="allreduce", algorithm="ring", nranks=4, nbytes=8), "unknown collective"),
    (dict(op="all_reduce", algorithm="ring", nranks=0, nbytes=8), "nranks"),
    (dict(op="all_reduce", algorithm="ring", nranks=6, nbytes=8, hosts=4), "evenly"),
    (dict(op="all_reduce", algorithm="ring", nranks=4, nbytes=-1), "negative"),
    (dict(op="all_reduce", algorithm="shm", nranks=4, nbytes=8, hosts=2), "one host"),
])
def test_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        simulate(**kwargs)


def test_too_big_and_asymmetric_is_refused():
    with pytest.raises(ValueError, match="too big"):
        simulate("all_to_all", "direct", 4096, 8, symmetry="full")


def test_nnls_keeps_coefficients_non_negative():
    rows = [[1, 1], [1, 2], [1, 3]]
    assert _nnls(rows, [3, 5, 7]) == pytest.approx([1, 2])
    x = _nnls(rows, [3, 2, 1])  # the unconstrained slope would be negative
    assert min(x) >= 0


def test_calibrate_recovers_a_model(tmp_path):
    truth = Model(Link(20e-6, 1 / 3e9), DEFAULT_MODEL.inter, gamma=1 / 6e9, delta=1 / 12e9)
    path = tmp_path / "bench.jsonl"
    with open(path, "w") as f:
        for op, algo in [("all_reduce", "ring"), ("all_reduce", "tree"), ("all_gather", "direct"),
                         ("reduce_scatter", "rabenseifner"), ("broadcast", "direct")]:
            for n in (2, 4):
                for size in (8, 1 << 16, 1 << 22):
                    t = bench_seconds(op, algo, n, size, model=truth)  # back to back, as the bench times
                    f.write(json.dumps({"backend": "collie", "op": op, "nranks": n, "bytes": size,
                                        "dtype": "float32", "algorithm": algo, "time_us": t * 1e6}) + "\n")
        f.write(json.dumps({"backend": "mpi4py", "op": "all_reduce", "nranks": 2, "bytes": 8,
                            "algorithm": "mpi", "time_us": 1.0}) + "\n")
    rows = read_bench_rows(str(path))
    assert len(rows) == 30
    model, predicted = calibrate(rows)
    # Not exact: the fit takes the simulation as linear in the parameters, which
    # holds only where no two paths compete for the critical one.
    assert model.intra.alpha == pytest.approx(truth.intra.alpha, rel=0.02)
    assert model.intra.beta == pytest.approx(truth.intra.beta, rel=0.02)
    assert model.gamma == pytest.approx(truth.gamma, rel=0.05)
    for row, seconds in predicted:
        assert seconds * 1e6 == pytest.approx(row["time_us"], rel=0.02)
    assert main(["--calibrate", str(path), "--save", str(tmp_path / "m.json")]) == 0
    assert Model.from_json(json.loads((tmp_path / "m.json").read_text())) == model


def test_cli_rows(capsys):
    assert main(["all_reduce", "--algo", "all", "-n", "8", "--size", "8,64K"]) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line and not line.startswith("#")]
    assert len(rows) == 2 * len(algorithms.algorithms_for("all_reduce"))
    assert {r[0] for r in rows} == {"8", "65536"} and {r[9] for r in rows} == set(algorithms.algorithms_for("all_reduce"))
    assert main(["all_reduce", "--tuner", "-n", "64", "--hosts", "8", "--size", "1M"]) == 0
    assert "the tuner picks" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [["allreduce"], ["all_reduce", "--algo", "nope"], ["all_reduce", "-n", "0"],
                                  ["all_reduce", "--size", "12Q"], ["all_reduce", "-n", "6", "--hosts", "4"],
                                  ["broadcast", "-n", "4", "--root", "4"], ["all_reduce", "--bw-intra", "0"],
                                  []])
def test_cli_bad_input(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2


def test_cores_shared_by_a_hosts_ranks():
    m = DEFAULT_MODEL
    s = 4 << 20
    own = simulate("all_reduce", "ring", 4, s, model=m).seconds
    assert simulate("all_reduce", "ring", 4, s, model=m._replace(cores=4)).seconds >= own
    two = simulate("all_reduce", "ring", 4, s, model=m._replace(cores=2)).seconds
    one = simulate("all_reduce", "ring", 4, s, model=m._replace(cores=1)).seconds
    assert own < two < one
    # a chain has one rank busy at a time: fewer cores cost it little
    # (each hop one copy, as a single-copy message is: read by its receiver)
    chain = simulate("broadcast", "ring", 4, s, model=m, segments=1).seconds
    host = m._replace(cores=2, single_copy=256 << 10, read=Link(0.0, m.intra.beta))
    assert simulate("broadcast", "ring", 4, s, model=host, segments=1).seconds < 1.5 * chain
    # with hosts, a host's ranks are its representatives: symmetric still, and equal to the full run
    sym = simulate("all_reduce", "ring", 32, s, hosts=4, model=m._replace(cores=2))
    full = simulate("all_reduce", "ring", 32, s, hosts=4, model=m._replace(cores=2), symmetry="full")
    assert sym.simulated == 8 and sym.seconds == pytest.approx(full.seconds, rel=1e-9)


# A host model with round numbers, to check its mechanisms one by one.
HOST = Model(Link(0.5e-6, 1 / 20e9), DEFAULT_MODEL.inter, gamma=1 / 10e9, delta=1 / 20e9, cores=2, slots=8,
             single_copy=256 << 10, read=Link(2e-6, 1 / 10e9), python=20e-6, call=1e-6, slow_call=5e-6)


def test_a_small_message_is_copied_into_a_slot_and_out():
    # broadcast, 2 ranks, 8 KiB: the root copies it into a ring slot, the other
    # rank copies it out; each first pays the call (its lane)
    m, s = HOST, 8192
    one = m.intra.alpha + s * m.intra.beta
    assert simulate("broadcast", "direct", 2, s, model=m).seconds == pytest.approx(m.call + 2 * one)
    # back to back, the root runs ahead: a call costs what the busier rank does
    assert bench_seconds("broadcast", "direct", 2, s, model=m) == pytest.approx(m.call + one)


def test_a_large_message_is_read_once_by_its_receiver():
    # from single_copy bytes the root only says where the bytes are, and the
    # receiver reads them out of its memory (process_vm_readv): one copy
    m, s = HOST, 1 << 20
    want = m.call + m.intra.alpha + m.read.alpha + s * m.read.beta
    assert simulate("broadcast", "direct", 2, s, model=m).seconds == pytest.approx(want)
    # and the send is done only when it is read: the root cannot run ahead
    assert bench_seconds("broadcast", "direct", 2, s, model=m) == pytest.approx(want)
    # from SHARED_COPY_BYTES, a one-way step is Python's, which shares the copy with the writer
    from collie.core import SHARED_COPY_BYTES
    big = 4 * SHARED_COPY_BYTES
    t = simulate("broadcast", "direct", 2, big, model=m).seconds
    assert t == pytest.approx(m.call + m.python + m.intra.alpha + m.read.alpha + big / 2 * m.read.beta)


def test_calls_without_a_lane_take_pythons_whole_path():
    m, s = HOST, 8192
    assert bench_seconds("reduce", "direct", 2, s, model=m) == pytest.approx(
        m.call + m.intra.alpha + s * m.gamma)  # the root: its call (a lane), then a combine out of the slot
    # gather has no lane (its list is copied out): the same exchange, after Python's whole path
    laned = bench_seconds("gather", "direct", 2, s, model=m._replace(slow_call=m.call))
    assert bench_seconds("gather", "direct", 2, s, model=m) == pytest.approx(laned + m.slow_call - m.call)


def test_a_full_ring_makes_the_send_wait_and_a_long_wait_hands_it_to_python():
    # reduce: the leaf sends faster than the root combines. With eight slots it
    # runs eight calls ahead, then finds the ring full: its send waits in the
    # core for a free slot, as a receive waits for its message, costing the
    # root nothing however slow Python's executor is (model.python).
    from collie.network import SPIN_SECONDS
    m = HOST._replace(python=200e-6, gamma=1 / 2e9)
    s = 8192
    root = m.call + m.intra.alpha + s * m.gamma
    unbounded = bench_seconds("reduce", "direct", 2, s, model=m._replace(slots=0))
    assert unbounded == pytest.approx(root)  # no limit: the root's pace
    assert bench_seconds("reduce", "direct", 2, s, model=m) == pytest.approx(root)
    # A root slower than the spin: the leaf's wait outlasts it, and the step
    # goes to Python's executor, which here costs more than the root takes to
    # empty the whole ring (the leaf then posts as many as it can at once).
    slow_root = 2 * SPIN_SECONDS
    slow = m._replace(gamma=(slow_root - m.call - m.intra.alpha) / s, python=40 * slow_root)
    assert bench_seconds("reduce", "direct", 2, s, model=slow._replace(slots=0)) == pytest.approx(slow_root)
    assert bench_seconds("reduce", "direct", 2, s, model=slow) > 1.5 * slow_root


def test_steps_with_messages_of_several_pieces_run_in_python():
    # Bruck's all_to_all on 4 ranks forwards non-contiguous blocks: those
    # steps are staged through Python (core.compile); ring's never are, nor
    # (since its partial sums all wait in "tmp") Rabenseifner's reduce_scatter's
    from collie.sim import _PYTHON, _exact_skeleton

    def python_steps(op, algorithm, n):
        _, sizes = block_sizes(op, 8192, 4, n)
        skeleton = _exact_skeleton(algorithms.build(op, algorithm, n, 1, 0, 1), sizes, 4, 0)
        return any(kind == _PYTHON for local, _, _ in skeleton for kind, _, _ in local)
    assert python_steps("all_to_all", "bruck", 4)
    assert not python_steps("all_reduce", "ring", 3)
    assert not any(python_steps("reduce_scatter", "rabenseifner", n) for n in (3, 4, 5, 8))
    assert simulate("all_to_all", "bruck", 4, 8192, model=HOST).seconds > HOST.python


def test_bytes_beyond_the_cache_cost_more():
    from collie.sim import working_set_factor
    m = HOST._replace(cache=8 << 20, dram=3.0)
    assert working_set_factor(m, 4 << 20) == 1.0
    assert working_set_factor(m, 12 << 20) == pytest.approx(2.0)  # half way to twice the cache
    assert working_set_factor(m, 64 << 20) == pytest.approx(3.0)
    assert working_set_factor(HOST, 1 << 40) == 1.0  # no cache given: no effect
    small = simulate("all_gather", "direct", 2, 1 << 20, model=m).seconds
    large = simulate("all_gather", "direct", 2, 64 << 20, model=m).seconds
    assert large > 64 * small


def test_crowded_ranks_pay_to_get_a_core_back():
    m = HOST._replace(switch=3e-6)
    # 4 ranks on 2 cores wait on each other in every step of recursive doubling
    assert simulate("all_reduce", "recursive_doubling", 4, 8192, model=m).seconds > \
        simulate("all_reduce", "recursive_doubling", 4, 8192, model=m._replace(switch=0.0)).seconds
    # 2 ranks on 2 cores spin on their own: no switch
    assert simulate("all_reduce", "recursive_doubling", 2, 8192, model=m).seconds == \
        simulate("all_reduce", "recursive_doubling", 2, 8192, model=m._replace(switch=0.0)).seconds


def test_host_model_round_trips_through_json():
    m = HOST._replace(switch=1e-6, wake=2e-6, cache=1 << 20, dram=2.5)
    assert Model.from_json(json.loads(json.dumps(m.to_json()))) == m


DOCS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "scale")


def test_the_fitted_model_is_the_measured_transports():
    # docs/scale/model.json, fitted by docs/scale.py: its fixed facts are
    # those of the transport the runs measured (their single-copy threshold,
    # recorded beside them; the default's slots) and this machine's cores,
    # not fitted numbers
    from collie.transports import shm
    with open(os.path.join(DOCS, "model.json")) as f:
        model = Model.from_json(json.load(f))
    with open(os.path.join(DOCS, "tuner-runs.json")) as f:
        measured = json.load(f)["single_copy"]
    assert (model.cores, model.slots, model.single_copy) == (2, shm.DEFAULT_SLOTS, measured)
    assert HOST_START.single_copy == shm.DEFAULT_CMA_BYTES  # a fit to new runs starts from today's transport


def test_predicts_this_machines_bench():
    # docs/scale.md, "Predicted against measured on this machine": the model docs/scale.py
    # fitted (docs/scale/model.json) on the median of every other bench run of the tuner's
    # picks (docs/scale/tuner-runs.json), against the median of the other runs, which it
    # never saw. Nothing is timed here; the figures are the ones the page states.
    import statistics
    with open(os.path.join(DOCS, "model.json")) as f:
        model = Model.from_json(json.load(f))
    with open(os.path.join(DOCS, "tuner-runs.json")) as f:
        data = json.load(f)
    held = sorted(data["runs"], key=int)[1::2]
    errors = []
    for r in data["rows"]:
        measured = statistics.median([r["us"][k] for k in held if k in r["us"]])
        predicted = bench_seconds(r["op"], r["algorithm"], r["nranks"], r["bytes"], model=model) * 1e6
        errors.append(abs(predicted / measured - 1))
    assert len(errors) == 240  # 6 collectives x 8 sizes (8 KiB - 64 MiB) x 5 rank counts (2-8)
    assert statistics.median(errors) <= 0.178       # "median error 18%" (17.8%)
    assert sum(e <= 0.25 for e in errors) >= 164   # "164 of 240 rows within 25%"


def test_cli_keeps_a_saved_host_model(tmp_path, capsys):
    # --model with a host model: every field counts, and rows are per call back to back
    path = tmp_path / "host.json"
    path.write_text(json.dumps(HOST.to_json()))
    assert main(["reduce", "--model", str(path), "-n", "2", "--size", "8K", "--algo", "direct"]) == 0
    row = [line.split() for line in capsys.readouterr().out.splitlines() if line and not line.startswith("#")][0]
    assert float(row[5]) == pytest.approx(bench_seconds("reduce", "direct", 2, 8192, model=HOST) * 1e6, abs=0.01)
