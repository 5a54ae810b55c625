"""Jobs across several hosts, each host a network namespace with a hostname
of its own (collie.testbed): results against NumPy, shared memory inside a
host and TCP between hosts, a shaped link, a failing host, and nothing left
behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from collie import testbed

WHY = testbed.unavailable()
pytestmark = [pytest.mark.timeout(180), pytest.mark.skipif(WHY is not None, reason=f"no test bed: {WHY}")]

# Each rank checks every collective against NumPy and prints one JSON line.
PROGRAM = textwrap.dedent("""\
    import json, socket, sys
    import numpy as np
    import collie
    collie.init_process_group()
    r, n = collie.get_rank(), collie.get_world_size()
    count = int(sys.argv[1])
    rng = lambda k: np.random.default_rng(k).standard_normal(count)
    x = rng(r)
    everyone = np.stack([rng(k) for k in range(n)])
    ok = {}
    y = x.copy(); collie.all_reduce(y); ok["all_reduce"] = np.allclose(y, everyone.sum(0))
    y = x.copy(); collie.all_reduce(y, algorithm="hier"); ok["hier"] = np.allclose(y, everyone.sum(0))
    y = x.copy(); collie.broadcast(y, src=n - 1); ok["broadcast"] = np.array_equal(y, everyone[-1])
    out = np.empty(n * count); collie.all_gather_into_tensor(out, x)
    ok["all_gather"] = np.array_equal(out, everyone.ravel())
    blocks = np.stack([rng(100 * k + j) for k in range(n) for j in range(n)]).reshape(n, n, count)
    got = np.empty(count); collie.reduce_scatter_tensor(got, blocks[r].ravel())
    ok["reduce_scatter"] = np.allclose(got, blocks[:, r].sum(0))
    got = np.empty(n * count); collie.all_to_all_single(got, blocks[r].ravel())
    ok["all_to_all"] = np.array_equal(got, blocks[:, r].ravel())
    net = collie.group.world().network
    print(json.dumps({"rank": r, "host": socket.gethostname(), "ok": ok, "routes": net.backend_of}),
          flush=True)
    collie.destroy_process_group()
""")


@pytest.fixture
def program(tmp_path):
    path = tmp_path / "program.py"
    path.write_text(PROGRAM)
    return str(path)


def _ranks(results) -> dict:
    rows = [json.loads(line) for r in results for line in r.stdout.splitlines() if line.startswith("{")]
    return {row["rank"]: row for row in rows}


def _no_beds_left():
    left = [ns for ns in testbed._namespaces() if ns.startswith(f"{testbed.PREFIX}{os.getpid()}")]
    assert not left, f"namespaces left behind: {left}"


@pytest.mark.parametrize("hosts, per_host, count", [(2, 2, 1001), (3, 1, 70001)], ids=["2x2", "3x1"])
def test_every_collective_across_hosts(program, hosts, per_host, count):
    # 3x1: every message from 64 KiB on striped over three connections per pair
    striping = {"COLLIE_TCP_STREAMS": "3", "COLLIE_TCP_STRIPE_MIN": "65536"} if per_host == 1 else {}
    with testbed.TestBed(hosts) as bed:
        results = bed.run([program, str(count)], ranks_per_host=per_host, timeout=120,
                          env=dict(os.environ, **striping))
    _no_beds_left()
    assert all(r.returncode == 0 for r in results), [r.stderr[-2000:] for r in results]
    ranks = _ranks(results)
    assert sorted(ranks) == list(range(hosts * per_host))
    for rank, row in ranks.items():
        assert all(row["ok"].values()), row
        host = rank // per_host
        assert row["host"] == bed.names[host]  # its own hostname, so its own "machine"
        for peer, route in enumerate(row["routes"]):
            expected = "self" if peer == rank else ("shm" if peer // per_host == host else "tcp")
            assert route == expected, (rank, row["routes"])


def _check(results, hosts, per_host):
    assert all(r.returncode == 0 for r in results), [r.stderr[-2000:] for r in results]
    ranks = _ranks(results)
    assert sorted(ranks) == list(range(hosts * per_host))
    assert all(all(row["ok"].values()) for row in ranks.values()), ranks
    assert len({row["host"] for row in ranks.values()}) == hosts


def test_the_host_of_rank_0_may_start_last(program):
    with testbed.TestBed(2) as bed:
        results = bed.run([program, "101"], ranks_per_host=1, timeout=120, delays=[4.0, 0.0])
    _check(results, 2, 1)


def test_slurm_variables_alone_start_a_multi_host_job(program):
    """As srun starts tasks: no MASTER_ADDR, RANK or token; collie finds
    rank 0's host in SLURM_STEP_NODELIST and the port from the job id."""
    with testbed.TestBed(2) as bed:
        results = bed.run_slurm([program, "1001"], ranks_per_host=2, timeout=120)
    _check(results, 2, 2)
    _no_beds_left()


@pytest.mark.parametrize("mode", ["collie", "torch"])
def test_torchrun_across_hosts(mode):
    """torchrun --nnodes 2: its agent on host 0 serves the store; collie's API
    and torch's backend "collie" both join it from both hosts."""
    pytest.importorskip("torch")
    program = os.path.join(os.path.dirname(__file__), "torch_launch_program.py")
    with testbed.TestBed(2) as bed:
        argvs = [[sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(i),
                  "--master-addr", bed.addresses[0], "--master-port", str(testbed.MASTER_PORT),
                  "--nproc-per-node", "2", program, mode] for i in range(2)]
        results = bed.run_each(argvs, timeout=150, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert all(r.returncode == 0 for r in results), [r.stderr[-3000:] for r in results]
    lines = sorted(line for r in results for line in r.stdout.splitlines() if line.startswith("rank "))
    assert lines == [f"rank {k} of 4: sum 10 ok" for k in range(4)], lines


# One mpi4py program; its import line picks MPICH's mpi4py or collie.MPI.
# Each rank writes its row to a file: mpiexec forwards output in pieces, not lines.
MPI_PROGRAM = textwrap.dedent("""\
    import json, os, socket, sys
    import numpy as np
    if sys.argv[1] == "mpi4py":
        from mpi4py import MPI
    else:
        from collie import MPI
    comm = MPI.COMM_WORLD
    r, n = comm.Get_rank(), comm.Get_size()
    x = np.arange(300001, dtype=np.float64) * (r + 1)
    y = np.empty_like(x)
    comm.Allreduce(x, y)
    ok = {"Allreduce": bool(np.array_equal(y, np.arange(300001) * (n * (n + 1) / 2))),
          "bcast": comm.bcast({"from": r} if r == n - 1 else None, root=n - 1) == {"from": n - 1}}
    row = {"rank": r, "host": socket.gethostname(), "ok": ok}
    if sys.argv[1] == "collie":
        import collie
        row["routes"] = collie.group.world().network.backend_of
    with open(os.path.join(sys.argv[2], f"rank{r}.json"), "w") as f:
        json.dump(row, f)
""")


@pytest.mark.parametrize("mpi", ["collie", "mpi4py"])
def test_mpiexec_across_hosts(tmp_path, mpi):
    """MPICH's mpiexec starts one program across the hosts, on MPICH (its
    mpi4py) and on collie.MPI, which then talks TCP between the hosts. (Two
    hosts: with three, MPICH's job hung in some starts here, three ranks
    busy-polling on two cores.)"""
    if testbed.shutil.which("mpiexec") is None:
        pytest.skip("MPICH's mpiexec is not installed")
    if mpi == "mpi4py":
        pytest.importorskip("mpi4py")
    path = tmp_path / "mpi_program.py"
    path.write_text(MPI_PROGRAM)
    with testbed.TestBed(2) as bed:
        result = bed.run_mpiexec([str(path), mpi, str(tmp_path)], timeout=120)
        assert os.path.exists(bed.launcher)
    _no_beds_left()
    assert not os.path.exists(bed.launcher)
    assert result.returncode == 0, result.stderr[-3000:]
    ranks = {rank: json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(2)}
    assert sorted(row["host"] for row in ranks.values()) == sorted(bed.names)
    for rank, row in ranks.items():
        assert all(row["ok"].values()), row
        if mpi == "collie":
            assert row["routes"] == ["self" if p == rank else "tcp" for p in range(2)], row


def test_a_shaped_link_carries_the_job(program):
    with testbed.TestBed(2, rate="50mbit") as bed:
        results = bed.run([program, "200001"], ranks_per_host=1, timeout=120)
        qdisc = bed.exec(0, ["tc", "-s", "qdisc", "show", "dev", "eth0"]).stdout
    _no_beds_left()
    assert all(r.returncode == 0 for r in results), [r.stderr[-2000:] for r in results]
    assert all(all(row["ok"].values()) for row in _ranks(results).values())
    assert "tbf" in qdisc and "rate 50Mbit" in qdisc, qdisc
    sent = int(qdisc.split("Sent ")[1].split()[0])
    assert sent > 200001 * 8, qdisc  # the job's bytes went through the shaper


def test_a_failing_host_stops_the_others_and_the_bed_is_removed(tmp_path):
    script = tmp_path / "fails.py"
    script.write_text("import sys, time, collie\ncollie.init_process_group()\n"
                      "if collie.get_rank() == 2:\n    sys.exit(3)\ntime.sleep(60)\n")
    with testbed.TestBed(3) as bed:
        results = bed.run([str(script)], timeout=90)
    assert bed.first_failure == 2, [r.stderr[-500:] for r in results]
    assert "rank 2 exited with code 3" in results[2].stderr
    _no_beds_left()


def test_an_error_inside_the_bed_still_removes_it():
    with pytest.raises(RuntimeError, match="inside"):
        with testbed.TestBed(2) as bed:
            assert bed.exec(1, ["hostname"]).stdout.strip() == bed.names[1]
            raise RuntimeError("inside")
    _no_beds_left()


def test_a_dead_owners_bed_is_swept():
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    name = f"{testbed.PREFIX}{dead.pid}h0"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        assert name in testbed.sweep()
        assert name not in testbed._namespaces()
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


def test_bad_input():
    with pytest.raises(ValueError, match="at least 1 host"):
        testbed.TestBed(0)
    with pytest.raises(ValueError, match="cannot shape"):
        testbed.TestBed(1, rate="fast")
    _no_beds_left()


def test_the_command_runs_a_module_with_dash_m():
    """`collie testbed ... -m module args` runs the module on every rank, as `collie run -m` does."""
    done = subprocess.run([sys.executable, "-m", "collie", "testbed", "--hosts", "2", "-m", "collie.bench",
                           "--op", "all_reduce", "--sizes", "8", "--iters", "2", "--warmup", "1", "--repeats", "1"],
                          capture_output=True, text=True, timeout=150)
    _no_beds_left()
    assert done.returncode == 0, done.stderr[-2000:]
    assert any(line.split()[:1] == ["8"] for line in done.stdout.splitlines()), done.stdout


def test_the_bench_measures_the_link_and_prints_each_ops_bound(tmp_path):
    """collie bench across 2 hosts: the link rate it measures at start is the
    shaper's (50 Mbit/s), and each op's table says what must cross it."""
    script = tmp_path / "bench.py"
    script.write_text("import sys\nfrom collie.bench import main\nsys.exit(main(sys.argv[1:]))\n")
    with testbed.TestBed(2, rate="50mbit") as bed:
        results = bed.run([str(script), "--op", "all_reduce,all_gather,all_to_all", "--sizes", "64K",
                           "--iters", "2", "--warmup", "1", "--repeats", "1"], ranks_per_host=1, timeout=120)
    _no_beds_left()
    assert all(r.returncode == 0 for r in results), [r.stderr[-2000:] for r in results]
    out = results[0].stdout
    link = [line for line in out.splitlines() if line.startswith("# link: ")]
    assert len(link) == 1, out
    rate = float(link[0].split()[2]) * 1e6  # "# link: 6.1 MB/s ..."
    assert 0.5 * 50e6 / 8 < rate < 1.3 * 50e6 / 8, link[0]  # tbf lets a 256 KB burst through at once
    # 2 hosts x 1 rank: S crosses for all_reduce, S/2 for all_gather and all_to_all
    for op, crossing in (("all_reduce", "1.00"), ("all_gather", "0.50"), ("all_to_all", "0.50")):
        block = out.split(f"# {op}\n")[1]
        assert block.startswith(f"# (bound across hosts: crosses >= {crossing} S on the busiest host's link"), block
    assert "# memory:" not in out  # one host's memory bound says nothing across hosts


def test_the_link_is_measured_at_setup_and_the_tuner_uses_it(tmp_path):
    """2 hosts x 2 ranks on a link shaped to 50 Mbit/s: init_process_group
    measures the link between the hosts (the shaper's rate, the same on
    every rank, said under COLLIE_DEBUG=INFO), and a 256 KiB broadcast
    takes the model's pick (a tree, which sends the buffer across once)
    over the table's (direct, which sends it twice)."""
    script = tmp_path / "link.py"
    script.write_text(textwrap.dedent("""\
        import json
        import numpy as np
        import collie
        from collie import tuner
        collie.init_process_group()
        x = np.arange(65536, dtype=np.float32) if collie.get_rank() == 3 else np.zeros(65536, np.float32)
        collie.broadcast(x, src=3)
        g = collie.group.world().group
        topo = collie.get_topology()
        link = (topo["link"]["latency_s"], 1 / topo["link"]["rate_bytes_per_s"])
        print(json.dumps({"rank": collie.get_rank(), "topology": topo,
                          "ok": x.tolist() == list(range(65536)),
                          "picked": [p.choice.algorithm for p in g.prepared.values()],
                          "model": tuner.default_choice("broadcast", x.nbytes, 4, "tcp", g.hosts, link).algorithm,
                          "table": tuner.table_choice("broadcast", x.nbytes, 4, "tcp", g.hosts).algorithm}),
              flush=True)
        collie.destroy_process_group()
    """))
    with testbed.TestBed(2, rate="50mbit") as bed:
        results = bed.run([str(script)], ranks_per_host=2, timeout=120, env=dict(os.environ, COLLIE_DEBUG="INFO"))
    _no_beds_left()
    assert all(r.returncode == 0 for r in results), [r.stderr[-2000:] for r in results]
    ranks = _ranks(results)
    topo = ranks[0]["topology"]
    assert topo["hosts"] == [[0, 1], [2, 3]] and topo["link_source"].startswith("measured at setup in ")
    assert 0.6 * 50e6 / 8 < topo["link"]["rate_bytes_per_s"] < 1.3 * 50e6 / 8, topo
    for row in ranks.values():
        assert row["topology"] == topo and row["ok"], row
        assert row["picked"] == [row["model"]] == ["tree"] and row["table"] == "direct", row
    info = [line for line in results[0].stderr.splitlines() if line.startswith("collie INFO topology:")]
    assert len(info) == 1 and "2 host(s) [0-1 | 2-3] from hostnames; between hosts" in info[0], info
