"""Tests for collie.rendezvous: the stores, across real processes, and the
parsing of init methods and launcher environments."""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import queue
import socket
import threading
import time
import traceback
from datetime import timedelta

import pytest
from harness import open_sockets, reap

from collie.errors import AuthError, CollieTimeout, PeerError
from collie.rendezvous import (FileStore, TCPStore, _master, _place, _port_from, first_host, rendezvous,
                               store_barrier)

CTX = mp.get_context("fork")
HOST = "127.0.0.1"

# Every variable a launcher may set; cleared for the tests of env parsing.
LAUNCH_VARS = [
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
    "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_MCA_ess_base_jobid", "OMPI_MCA_orte_ess_jobid",
    "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS", "PMIX_RANK", "PMIX_SIZE",
    "PMIX_NAMESPACE", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE",
    "SLURM_TASKS_PER_NODE", "SLURM_NODEID", "SLURM_JOB_ID", "SLURM_STEP_ID", "PBS_JOBID",
    "COLLIE_JOB_ID", "COLLIE_TOKEN", "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST",
]


# -- helpers -------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def no_leaks():
    """Each test must leave no thread, socket or child process behind."""
    threads = set(threading.enumerate())
    fds = open_sockets()
    yield
    deadline = time.monotonic() + 5
    while True:
        extra_threads = [t for t in threading.enumerate() if t not in threads]
        extra_fds = open_sockets() - fds
        children = CTX.active_children()
        if not (extra_threads or extra_fds or children) or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    assert not extra_threads, f"threads left running: {extra_threads}"
    assert not extra_fds, f"sockets left open: {extra_fds}"
    assert not children, f"processes left running: {children}"


@pytest.fixture
def clean_env(monkeypatch):
    for name in LAUNCH_VARS:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def _child(results, index, fn, args):
    try:
        results.put((index, True, fn(*args)))
    except BaseException:
        results.put((index, False, traceback.format_exc()))


def run_procs(calls, timeout=20.0):
    """Run each (fn, args) in its own forked process; return their results in
    order, or fail with the first traceback. Nothing outlives the call."""
    results = CTX.Queue()
    procs = [CTX.Process(target=_child, args=(results, i, fn, args), daemon=True)
             for i, (fn, args) in enumerate(calls)]
    for p in procs:
        p.start()
    done: dict[int, object] = {}
    deadline = time.monotonic() + timeout
    ok = False
    try:
        while len(done) < len(procs):
            try:
                i, success, value = results.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                missing = sorted(set(range(len(procs))) - set(done))
                raise AssertionError(f"processes {missing} did not finish within {timeout}s") from None
            if not success:
                raise AssertionError(f"process {i} failed:\n{value}")
            done[i] = value
        ok = True
    finally:
        reap(procs, [], join_timeout=5 if ok else 0.5)
        results.close()
        results.join_thread()
    return [done[i] for i in range(len(procs))]


# -- TCPStore, in one process --------------------------------------------------------


@pytest.mark.timeout(20)
def test_tcpstore_methods():
    with TCPStore(HOST, 0, is_server=True, timeout=5) as store:
        assert store.port > 0
        store.set("a", "text")  # str is encoded
        store.set("b", b"\x00\xff" * 10)
        assert store.get("a") == b"text"
        assert store.get("b") == b"\x00\xff" * 10
        assert store.add("n") == 1  # a missing counter counts as 0
        assert store.add("n", 41) == 42
        assert store.add("n", -2) == 40
        assert store.get("n") == b"40"  # decimal ASCII, as in torch
        with pytest.raises(ValueError, match="'a'.*not a decimal integer"):
            store.add("a")
        store.wait(["a", "b"])
        store.wait([])
        assert store.check(["a", "n"]) and not store.check(["a", "zz"])
        assert store.num_keys() == 3
        assert store.delete("b") is True
        assert store.delete("b") is False
        assert not store.check(["b"])
        assert store.num_keys() == 2


@pytest.mark.timeout(20)
def test_tcpstore_compare_set():
    with TCPStore(HOST, 0, is_server=True, timeout=5) as store:
        # Missing key, expected b"": stored.
        assert store.compare_set("k", b"", b"first") == b"first"
        # Current value matches: swapped.
        assert store.compare_set("k", b"first", "second") == b"second"
        # Current value differs: unchanged, the current value is returned.
        assert store.compare_set("k", b"first", b"third") == b"second"
        assert store.get("k") == b"second"
        # Missing key, non-empty expected: nothing is stored.
        assert store.compare_set("m", b"x", b"y") == b""
        assert not store.check(["m"])


@pytest.mark.timeout(20)
def test_tcpstore_timeouts_are_quick_and_named():
    with TCPStore(HOST, 0, is_server=True, timeout=0.3) as store:
        where = f"{HOST}:{store.port}"
        store.set("present", b"1")
        t0 = time.monotonic()
        with pytest.raises(CollieTimeout, match=f"'absent'.*{where}.*0.3s"):
            store.get("absent")  # the store's default timeout
        with pytest.raises(CollieTimeout, match=r"\['gone', 'lost'\]"):
            store.wait(["present", "gone", "lost"], timeout=0.1)
        with pytest.raises(CollieTimeout):
            store.get("absent", timeout=timedelta(milliseconds=50))
        assert time.monotonic() - t0 < 3
        store.set("absent", b"ok")  # the connection is still usable
        assert store.get("absent") == b"ok"


@pytest.mark.timeout(20)
def test_tcpstore_client_is_thread_safe():
    with TCPStore(HOST, 0, is_server=True, timeout=5) as server, \
            TCPStore(HOST, server.port, timeout=5) as client:
        got = []
        waiter = threading.Thread(target=lambda: got.append(client.get("late")))
        waiter.start()
        adders = [threading.Thread(target=lambda: [server.add("n") for _ in range(50)])
                  for _ in range(3)]
        for t in adders:
            t.start()
        for t in adders:
            t.join(timeout=10)
        big = os.urandom(3 << 20)  # larger than the socket buffers
        server.set("late", big)
        waiter.join(timeout=10)
        assert got == [big]
        assert client.get("n") == b"150"


@pytest.mark.timeout(20)
def test_tcpstore_unreachable_times_out():
    port = free_port()
    t0 = time.monotonic()
    with pytest.raises(CollieTimeout, match=f"could not reach the store at {HOST}:{port} within 0.3s"):
        TCPStore(HOST, port, timeout=0.3)
    assert time.monotonic() - t0 < 3


@pytest.mark.timeout(20)
def test_tcpstore_argument_errors():
    with pytest.raises(ValueError, match="port"):
        TCPStore(HOST, 0, timeout=1)
    with pytest.raises(ValueError, match="timeout"):
        TCPStore(HOST, 0, is_server=True, timeout=-1)


# -- tokens --------------------------------------------------------------------------


def _wait_for_log(caplog, text, timeout=3.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(text in r.getMessage() for r in caplog.records):
            return True
        time.sleep(0.02)
    return False


@pytest.mark.timeout(20)
def test_tokens(caplog, clean_env):
    caplog.set_level(logging.WARNING, logger="collie.rendezvous")
    with TCPStore(HOST, 0, is_server=True, timeout=3, token="s3cret") as server:
        port = server.port
        with TCPStore(HOST, port, timeout=3, token=b"s3cret") as good:
            good.set("k", b"v")
            with pytest.raises(AuthError, match="token"):
                TCPStore(HOST, port, timeout=3, token="wrong")
            with pytest.raises(AuthError, match="token"):
                TCPStore(HOST, port, timeout=3)  # no token on this side
            with socket.create_connection((HOST, port), timeout=3) as stray:
                stray.sendall(b"GET / HTTP/1.0\r\n\r\n" + b"x" * 32)
            assert _wait_for_log(caplog, "dropped a connection: client")
            # The server goes on serving the clients it has and new ones.
            assert good.get("k") == b"v"
            clean_env.setenv("COLLIE_TOKEN", "s3cret")  # the token from the environment
            with TCPStore(HOST, port, timeout=3) as again:
                assert again.get("k") == b"v"
            clean_env.delenv("COLLIE_TOKEN")
    # A token on the client only.
    with TCPStore(HOST, 0, is_server=True, timeout=3) as server:
        with pytest.raises(AuthError, match="no token"):
            TCPStore(HOST, server.port, timeout=3, token="s3cret")
        server.set("still", b"serving")
        assert server.get("still") == b"serving"


# -- TCPStore across processes -------------------------------------------------------


def _methods_server(port):
    with TCPStore(HOST, port, world_size=3, is_server=True, timeout=10) as store:
        store.set("from0", "zero")
        value = store.get("from1")  # blocks until rank 1 sets it, later
        got_at = time.time()
        store_barrier(store, "end", 3, timeout=10)
        store.close(linger=5)
    return value, got_at


def _methods_rank1(port):
    with TCPStore(HOST, port, timeout=10) as store:
        assert store.get("from0") == b"zero"
        time.sleep(0.3)
        set_at = time.time()
        store.set("from1", b"one")
        store.wait(["x", "y"])  # set by rank 2
        assert store.check(["x", "y", "from0"])
        value = store.get("y")
        store_barrier(store, "end", 3, timeout=10)
    return value, set_at


def _methods_rank2(port):
    with TCPStore(HOST, port, timeout=10) as store:
        store.get("from0")
        time.sleep(0.2)
        store.set("x", b"")
        store.set("y", bytes(range(256)) * 4096)
        store_barrier(store, "end", 3, timeout=10)
    return True


@pytest.mark.timeout(30)
def test_tcpstore_across_processes():
    port = free_port()
    calls = [(_methods_server, (port,)), (_methods_rank1, (port,)), (_methods_rank2, (port,))]
    (value, got_at), (y, set_at), _ = run_procs(calls)
    assert value == b"one"
    assert got_at >= set_at  # the get really blocked until the later set
    assert y == bytes(range(256)) * 4096


def _add_server(port, nclients):
    with TCPStore(HOST, port, is_server=True, timeout=10) as store:
        store_barrier(store, "end", nclients + 1, timeout=15)
        final = store.get("counter")
        store.close(linger=5)
    return final


def _add_client(port, nclients, count):
    with TCPStore(HOST, port, timeout=10) as store:
        store_barrier(store, "start", nclients, timeout=10)  # all race at once
        seen = [store.add("counter") for _ in range(count)]
        store_barrier(store, "end", nclients + 1, timeout=15)
    return seen


@pytest.mark.timeout(30)
def test_add_races_from_four_processes():
    port, n, count = free_port(), 4, 200
    final, *seen = run_procs([(_add_server, (port, n))] + [(_add_client, (port, n, count))] * n)
    assert final == str(n * count).encode()
    # Atomic: every value from 1 to n*count was handed out exactly once.
    assert sorted(v for values in seen for v in values) == list(range(1, n * count + 1))


def _late_server(port, client_started):
    assert client_started.wait(10)
    time.sleep(0.3)  # the client is retrying meanwhile
    started_at = time.time()
    with TCPStore(HOST, port, is_server=True, timeout=10) as store:
        value = store.get("hello")
        store_barrier(store, "end", 2, timeout=10)
        store.close(linger=5)
    return value, started_at


def _early_client(port, client_started):
    client_started.set()
    with TCPStore(HOST, port, timeout=10) as store:
        connected_at = time.time()
        store.set("hello", b"world")
        store_barrier(store, "end", 2, timeout=10)
    return connected_at


@pytest.mark.timeout(30)
def test_client_started_before_server():
    port, client_started = free_port(), CTX.Event()
    (value, started_at), connected_at = run_procs([(_late_server, (port, client_started)),
                                                   (_early_client, (port, client_started))])
    assert value == b"world"
    assert connected_at >= started_at  # it retried until the server came up


def _doomed_server(port, ready):
    store = TCPStore(HOST, port, is_server=True, timeout=10)
    ready.set()
    time.sleep(30)  # killed by the test long before
    store.close()


@pytest.mark.timeout(30)
def test_server_death_raises_instead_of_hanging():
    port = free_port()
    ready = CTX.Event()
    server = CTX.Process(target=_doomed_server, args=(port, ready), daemon=True)
    server.start()
    killer = None
    try:
        assert ready.wait(10)
        client = TCPStore(HOST, port, timeout=10)
        try:
            client.set("k", b"v")
            killer = threading.Timer(0.3, server.kill)
            killer.start()
            t0 = time.monotonic()
            with pytest.raises(PeerError, match=f"store at {HOST}:{port} .*rank 0 died"):
                client.get("never", timeout=20)
            assert time.monotonic() - t0 < 5
            with pytest.raises(PeerError):
                client.set("k", b"again")
        finally:
            client.close()
    finally:
        if killer:
            killer.join(timeout=5)
        server.kill()
        server.join(timeout=5)


# -- FileStore -----------------------------------------------------------------------


def _file_rank(path, rank, world_size):
    with FileStore(path, world_size=world_size, timeout=10) as store:
        store.set(f"k{rank}", str(rank))
        store.wait([f"k{r}" for r in range(world_size)])
        values = [store.get(f"k{r}") for r in range(world_size)]
        counts = [store.add("n") for _ in range(20)]
        winner = store.compare_set("leader", b"", str(rank))
        late = None
        if rank == 0:
            late = store.get("late")  # released by rank 2's later set
        if rank == 2:
            time.sleep(0.3)
            store.set("late", b"finally")
        store_barrier(store, "end", world_size, timeout=10)
        assert store.check(["leader", "late"])
    return values, counts, winner, late


@pytest.mark.timeout(30)
def test_filestore_across_processes(tmp_path):
    path = str(tmp_path / "store")
    results = run_procs([(_file_rank, (path, r, 3)) for r in range(3)])
    for values, _, _, _ in results:
        assert values == [b"0", b"1", b"2"]
    assert sorted(c for _, counts, _, _ in results for c in counts) == list(range(1, 61))
    assert len({winner for _, _, winner, _ in results}) == 1  # one leader, seen by all
    assert results[0][3] == b"finally"
    assert not os.path.exists(path)  # the last of the 3 ranks to close removed it


@pytest.mark.timeout(20)
def test_filestore_single_process(tmp_path):
    path = tmp_path / "store"
    store = FileStore(path, timeout=0.2)
    store.set("a", "1")
    assert store.add("a", 2) == 3
    assert store.compare_set("b", b"", b"x") == b"x"
    assert store.compare_set("b", b"no", b"y") == b"x"
    assert store.compare_set("c", b"no", b"y") == b""
    assert store.num_keys() == 2 and store.check(["a", "b"]) and not store.check(["c"])
    assert store.delete("a") and not store.delete("a")
    t0 = time.monotonic()
    with pytest.raises(CollieTimeout, match=f"'missing'.*{path}"):
        store.get("missing")
    with pytest.raises(CollieTimeout, match=r"\['m1', 'm2'\]"):
        store.wait(["b", "m1", "m2"], timeout=0.1)
    assert time.monotonic() - t0 < 3
    store.close()
    store.close()
    assert path.exists()  # no world_size: the file stays
    again = FileStore(path, world_size=1, timeout=1)
    assert again.get("b") == b"x"
    again.close()
    assert not path.exists()


# -- launcher environments (no processes) --------------------------------------------


@pytest.mark.parametrize("env, expected", [
    ({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"},
     (3, 8, 1, 2, "collie run, torchrun")),
    ({"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "6",
      "OMPI_COMM_WORLD_LOCAL_RANK": "2", "OMPI_COMM_WORLD_LOCAL_SIZE": "3"},
     (5, 6, 2, 3, "Open MPI")),
    ({"PMI_RANK": "1", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"},
     (1, 4, 1, 2, "MPICH, Intel MPI")),
    ({"PMIX_RANK": "2", "PMIX_SIZE": "3"}, (2, 3, None, None, "PMIx")),
    ({"PMIX_RANK": "2", "SLURM_NTASKS": "3", "SLURM_LOCALID": "0", "SLURM_TASKS_PER_NODE": "1(x3)"},
     (2, 3, 0, 1, "PMIx")),
    ({"SLURM_PROCID": "6", "SLURM_NTASKS": "8", "SLURM_LOCALID": "2", "SLURM_TASKS_PER_NODE": "4(x2)"},
     (6, 8, 2, 4, "Slurm")),
    ({"SLURM_PROCID": "8", "SLURM_NTASKS": "10", "SLURM_LOCALID": "0", "SLURM_NODEID": "2",
      "SLURM_TASKS_PER_NODE": "4(x2),2"}, (8, 10, 0, 2, "Slurm")),
    ({"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_LOCALID": "1", "SLURM_NTASKS_PER_NODE": "2",
      "SLURM_TASKS_PER_NODE": "9"}, (1, 2, 1, 2, "Slurm")),
    # mpirun inside a Slurm allocation: the MPI variables win over SLURM_PROCID.
    ({"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4", "SLURM_PROCID": "0",
      "SLURM_NTASKS": "1", "LOCAL_RANK": "7", "LOCAL_WORLD_SIZE": "9"},
     (3, 4, 7, 9, "Open MPI")),
])
def test_launcher_variables(env, expected):
    place = _place(env, None, None, "env")
    launcher = place.launcher.name if place.launcher else None
    assert (place.rank, place.world_size, place.local_rank, place.local_world_size, launcher) == expected


def test_explicit_arguments_override_the_environment():
    env = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}
    place = _place(env, 3, 4, "env")
    assert (place.rank, place.world_size) == (3, 4)
    # The launcher's local numbering no longer applies: the store finds it.
    assert (place.local_rank, place.local_world_size) == (None, None)
    assert _place({}, 0, 1, "tcp").rank == 0
    assert _place({"WORLD_SIZE": "1"}, None, None, "env").rank == 0  # a lone process


@pytest.mark.parametrize("env, args, message", [
    ({}, (None, None),
     r"env:// needs the rank: set RANK \(collie run, torchrun\), OMPI_COMM_WORLD_RANK .*PMI_RANK"
     r".*SLURM_PROCID.*or pass rank="),
    ({"WORLD_SIZE": "4"}, (None, None), "needs the rank"),
    ({"PMIX_RANK": "0"}, (None, None), "found the rank in PMIX_RANK .*PMIX_SIZE or SLURM_NTASKS"),
    ({}, (0, None), "needs the world size: set WORLD_SIZE .*OMPI_COMM_WORLD_SIZE.*pass world_size="),
    ({"RANK": "x", "WORLD_SIZE": "2"}, (None, None), "RANK='x' is not an integer"),
    ({}, (4, 4), r"rank must be in 0..3"),
    ({}, (-1, 4), r"rank must be in 0..3"),
    ({}, (0, 0), "world_size must be >= 1"),
    ({"LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "2"}, (0, 2), "local rank 2 of 2"),
])
def test_environment_errors(env, args, message):
    with pytest.raises(ValueError, match=message):
        _place(env, *args, "env")


def test_master_address_and_port():
    place = _place({"RANK": "1", "WORLD_SIZE": "2"}, None, None, "env")
    assert _master({"MASTER_PORT": "29500"}, place) == ("127.0.0.1", 29500)
    assert _master({"MASTER_ADDR": "10.1.2.3", "MASTER_PORT": "1234"}, place) == ("10.1.2.3", 1234)
    with pytest.raises(ValueError, match="needs MASTER_PORT when world_size > 1"):
        _master({}, place)
    with pytest.raises(ValueError, match="MASTER_PORT=70000"):
        _master({"MASTER_PORT": "70000"}, place)
    assert _master({}, _place({}, 0, 1, "env")) == ("127.0.0.1", 0)  # alone: any port


@pytest.mark.parametrize("nodelist, first", [
    ("node[07-09,12],gpu1", "node07"), ("n1", "n1"), ("n1,n2", "n1"), ("a[001-3]x", "a001x"),
    ("rack2-node[3-4]", "rack2-node3")])
def test_the_first_host_of_a_slurm_node_list(nodelist, first):
    assert first_host(nodelist) == first


def test_under_slurm_the_master_is_the_first_host_of_the_step():
    env = {"SLURM_PROCID": "1", "SLURM_NTASKS": "4", "SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0",
           "SLURM_STEP_NODELIST": "cn[12-13]", "SLURM_JOB_NODELIST": "cn[10-13]"}
    place = _place(env, None, None, "env")
    assert _master(env, place)[0] == "cn12"
    assert _master(dict(env, MASTER_ADDR="10.0.0.9"), place)[0] == "10.0.0.9"  # MASTER_ADDR wins
    mpi = {"PMI_RANK": "1", "PMI_SIZE": "4", "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "cn[10-13]"}
    assert _master(mpi, _place(mpi, None, None, "env"))[0] == "127.0.0.1"  # mpiexec places rank 0 itself


@pytest.mark.parametrize("env", [
    {"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0"},
    {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_MCA_ess_base_jobid": "31337"},
    {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2", "PMIX_NAMESPACE": "prterun-h-1@1"},
    {"PMI_RANK": "0", "PMI_SIZE": "2", "SLURM_JOB_ID": "4242"},
    {"PMI_RANK": "0", "PMI_SIZE": "2", "COLLIE_JOB_ID": "my-job"},
])
def test_port_derived_from_the_job_under_mpi_and_slurm(env):
    place = _place(env, None, None, "env")
    addr, port = _master(env, place)
    assert addr == "127.0.0.1" and 20000 <= port < 60000
    # Every rank derives the same port; another job gets another one.
    other_rank = dict(env, **{place.launcher.rank: "1"})
    assert _master(other_rank, _place(other_rank, None, None, "env")) == (addr, port)
    changed = {k: (v + "9" if k in ("SLURM_JOB_ID", "OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE",
                                    "COLLIE_JOB_ID") else v) for k, v in env.items()}
    assert _master(changed, place)[1] != port


def test_slurm_port_depends_on_the_step():
    env = {"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0"}
    place = _place(env, None, None, "env")
    assert _master(env, place) != _master(dict(env, SLURM_STEP_ID="1"), place)
    assert _port_from("x") == _port_from("x")


def test_mpich_without_a_job_identifier_needs_master_port():
    env = {"PMI_RANK": "0", "PMI_SIZE": "2"}
    message = "under MPICH, Intel MPI .*none is set .*COLLIE_JOB_ID.*set MASTER_PORT"
    with pytest.raises(ValueError, match=message):
        _master(env, _place(env, None, None, "env"))


@pytest.mark.parametrize("init_method, message", [
    ("foo://x", "unsupported init_method 'foo://x': use one of env://, tcp://host:port, file:///path"),
    ("tcp://127.0.0.1", "tcp:// init wants host:port"),
    ("tcp://127.0.0.1:99999", "bad port"),
    ("file://", "absolute path"),
    ("env", "unsupported init_method"),
])
def test_rendezvous_rejects_bad_init_methods(init_method, message, clean_env):
    with pytest.raises(ValueError, match=message):
        rendezvous(init_method, rank=0, world_size=2, timeout=1)


@pytest.mark.timeout(20)
def test_rendezvous_validates_before_connecting(clean_env):
    port = free_port()
    with pytest.raises(ValueError, match="rank must be in 0..1"):
        rendezvous(f"tcp://{HOST}:{port}", rank=2, world_size=2, timeout=30)
    with pytest.raises(ValueError, match="env:// needs the rank"):
        rendezvous(timeout=30)
    clean_env.setenv("RANK", "1")
    clean_env.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match="MASTER_PORT"):
        rendezvous("env://", timeout=30)


@pytest.mark.timeout(20)
def test_rendezvous_alone(clean_env):
    clean_env.setenv("WORLD_SIZE", "1")
    clean_env.setenv("COLLIE_JOB_ID", "solo")
    rdzv = rendezvous(timeout=5)
    try:
        assert (rdzv.rank, rdzv.world_size, rdzv.local_rank, rdzv.local_world_size) == (0, 1, 0, 1)
        assert rdzv.master_addr == "127.0.0.1" and rdzv.master_port > 0
        assert rdzv.job_id == "solo"
        rdzv.store.set("x", b"1")
    finally:
        rdzv.store.close()


# -- init methods end to end, 3 processes --------------------------------------------


def _rdzv_rank(init_method, rank, world_size, env):
    os.environ.update(env)  # this forked child only
    rdzv = rendezvous(init_method, rank=rank, world_size=world_size, timeout=10)
    store = rdzv.store
    store.set(f"addr/{rdzv.rank}", f"address of {rdzv.rank}")
    seen = [store.get(f"addr/{r}") for r in range(rdzv.world_size)]
    store_barrier(store, "end", rdzv.world_size, timeout=10)
    if isinstance(store, TCPStore):
        store.close(linger=5 if rdzv.rank == 0 else 0)
    else:
        store.close()
    return (rdzv.rank, rdzv.world_size, rdzv.local_rank, rdzv.local_world_size,
            rdzv.master_addr, rdzv.master_port, rdzv.job_id, seen)


def _check_e2e(results, world_size, addr, port):
    expected_seen = [f"address of {r}".encode() for r in range(world_size)]
    for rank, result in enumerate(results):
        # The launcher gave no local numbering: every rank is on this host.
        assert result[:6] == (rank, world_size, rank, world_size, addr, port)
        assert result[7] == expected_seen
    assert len({r[6] for r in results}) == 1  # one job id, agreed by all


@pytest.mark.timeout(30)
def test_tcp_init_three_processes(clean_env):
    port = free_port()
    url = f"tcp://{HOST}:{port}"
    results = run_procs([(_rdzv_rank, (url, r, 3, {})) for r in range(3)])
    _check_e2e(results, 3, HOST, port)


@pytest.mark.timeout(30)
def test_env_init_three_processes(clean_env):
    port = free_port()
    env = {"WORLD_SIZE": "3", "MASTER_ADDR": "localhost", "MASTER_PORT": str(port)}
    results = run_procs([(_rdzv_rank, (None, None, None, dict(env, RANK=str(r)))) for r in range(3)])
    _check_e2e(results, 3, "localhost", port)


@pytest.mark.timeout(30)
def test_file_init_three_processes(tmp_path, clean_env):
    path = tmp_path / "rdzv"
    results = run_procs([(_rdzv_rank, (f"file://{path}?world_size=3", r, None, {}))
                         for r in range(3)])
    _check_e2e(results, 3, None, None)
    assert not path.exists()  # removed by the last rank to close


@pytest.mark.timeout(20)
def test_rendezvous_timeout_names_the_arrivals(clean_env):
    port = free_port()
    t0 = time.monotonic()
    with pytest.raises(CollieTimeout, match=r"rank 0: .*only 1 of 2 ranks arrived within 0.5s"):
        rendezvous(f"tcp://{HOST}:{port}", rank=0, world_size=2, timeout=0.5)
    assert time.monotonic() - t0 < 5
