"""Connections that are not collie ranks: junk, idle, floods, a huge frame,
a process out of file descriptors. The store and a rank's setup listener
must drop them, log little, stay cheap, and go on serving the real ranks.

Every connection here goes to 127.0.0.1.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import resource
import socket
import threading
import time
import uuid

import numpy as np
import pytest
from harness import free_port, open_sockets, reap, run_ranks

from collie import auth
from collie.auth import MAGIC, Handshake, Pending, QuietLog, handshake
from collie.errors import AuthError
from collie.rendezvous import _GET, _LEN, _REQ, _SET, TCPStore, _pack_fields
from collie.transports import tcp

CTX = mp.get_context("fork")
HOST = "127.0.0.1"
TOKENS = pytest.mark.parametrize("token", [None, "s3cret"], ids=["no-token", "token"])


@pytest.fixture(autouse=True)
def no_leaks(monkeypatch):
    """No thread or socket outlives a test; COLLIE_TOKEN is the test's own."""
    monkeypatch.delenv("COLLIE_TOKEN", raising=False)
    threads, fds = set(threading.enumerate()), open_sockets()
    yield
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        extra_threads = [t for t in threading.enumerate() if t not in threads]
        extra_fds = open_sockets() - fds
        if not (extra_threads or extra_fds):
            break
        time.sleep(0.05)
    assert not extra_threads, f"threads left running: {extra_threads}"
    assert not extra_fds, f"sockets left open: {extra_fds}"


def _closed_by_peer(sock: socket.socket, within: float) -> bool:
    """True once the other end has closed ``sock`` (end of stream or reset)."""
    sock.settimeout(within)
    try:
        while sock.recv(4096):
            pass
        return True
    except ConnectionError:
        return True
    except TimeoutError:
        return False


def _still_open(sock: socket.socket) -> bool:
    sock.setblocking(False)  # with a timeout, a peek would wait for the data
    try:
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) != b""
    except BlockingIOError:
        return True
    except ConnectionError:
        return False


def _dropped(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "dropped a connection" in r.getMessage()]


def _fd_limit_at_least(n: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < n:
        assert hard == resource.RLIM_INFINITY or hard >= n, \
            f"this test needs {n} file descriptors; the hard limit is {hard}"
        resource.setrlimit(resource.RLIMIT_NOFILE, (n, hard))


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


# -- the handshake, Pending and QuietLog, without sockets ----------------------------


def _converse(a: Handshake, b: Handshake) -> None:
    """Run two handshakes against each other in memory until neither moves."""
    inbox = {a: bytearray(), b: bytearray()}
    moved = True
    while moved:
        moved = False
        for me, other in ((a, b), (b, a)):
            inbox[other] += me.take()
        for me in (a, b):
            if me.need and len(inbox[me]) >= me.need:
                data = bytes(inbox[me][:me.need])
                del inbox[me][:me.need]
                me.feed(data)
                moved = True


@pytest.mark.parametrize("client_token, server_token, client_says, server_says", [
    (None, None, None, None),
    (b"k", b"k", None, None),
    (b"k", b"other", "did not prove it knows the token", "did not prove it knows the token"),
    (None, b"k", "requires a token and this process has none", "has no token but this process requires one"),
    (b"k", None, "has no token but this process requires one", "requires a token and this process has none"),
])
def test_handshake_state_machines(client_token, server_token, client_says, server_says):
    client = Handshake(client_token, server=False, what="the server")
    server = Handshake(server_token, server=True, what="the client")
    assert server.take() == b""  # the server speaks second
    _converse(client, server)
    assert client.need == server.need == 0
    for shake, says in ((client, client_says), (server, server_says)):
        if says is None:
            assert shake.refused is None and shake.proven
        else:
            assert isinstance(shake.refused, AuthError) and says in str(shake.refused)


def test_handshake_answers_junk_with_nothing():
    server = Handshake(b"k", server=True, what="client 1.2.3.4:5")
    server.feed(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"[:auth.HELLO_SIZE])
    assert "client 1.2.3.4:5 is not a collie peer" in str(server.refused)
    assert server.need == 0 and server.take() == b"" and not server.proven
    with pytest.raises(ValueError, match="wanted 25 bytes"):
        Handshake(None, server=True, what="x").feed(MAGIC)


def test_pending_pushes_out_the_oldest_of_a_source_then_of_all():
    pending = Pending(seconds=60, limit=3, per_source=2)
    assert pending.add("a1", "A") == [] and pending.add("a2", "A") == []
    assert pending.add("a3", "A") == ["a1"]  # A's cap: A's oldest goes
    assert pending.add("b1", "B") == []
    assert pending.add("b2", "B") == ["a2"]  # the total cap: the oldest of all
    assert pending.add("b3", "B") == ["b1"]  # B's cap: B's oldest, not the older a3
    assert list(pending) == ["a3", "b2", "b3"] and pending.oldest() == "a3"
    pending.discard("a3")
    assert pending.add("c1", "C") == [] and len(pending) == 3 and "b1" not in pending
    quick = Pending(seconds=0.05)
    quick.add("x", "X")
    assert quick.expired() == [] and quick.next_deadline() is not None
    time.sleep(0.1)
    assert quick.expired() == ["x"]


def test_refusal_log_says_a_flood_in_a_few_lines(caplog):
    caplog.set_level(logging.WARNING, logger="collie.test")
    say = QuietLog(logging.getLogger("collie.test"), interval=0.2)
    for i in range(500):
        say(f"dropped {i}")
    time.sleep(0.25)
    say("dropped late")
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["dropped 0", "dropped late (499 more like it since the last such line)"]


# -- the store -------------------------------------------------------------------------


@pytest.mark.timeout(60)
@TOKENS
def test_store_drops_junk_with_one_line_each_and_goes_on(caplog, token):
    caplog.set_level(logging.INFO, logger="collie.rendezvous")
    junk = [os.urandom(4096), b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + b"x" * 100,
            _LEN.pack(1 << 30) + b"\x01" * 1000,  # a huge frame, before any handshake
            MAGIC + b"\x07" + b"\x00" * 100]  # the magic, then nonsense
    with TCPStore(HOST, 0, is_server=True, timeout=5, token=token) as server, \
            TCPStore(HOST, server.port, timeout=5, token=token) as client:
        client.set("k", b"v")
        for payload in junk:
            caplog.clear()
            with socket.create_connection((HOST, server.port), timeout=5) as stray:
                try:
                    stray.sendall(payload)
                except ConnectionError:
                    pass
                assert _closed_by_peer(stray, within=5)
            assert client.get("k") == b"v"
            assert len(_dropped(caplog)) <= 1, _dropped(caplog)
        # One that connects and hangs up says nothing at all.
        caplog.clear()
        socket.create_connection((HOST, server.port), timeout=5).close()
        with TCPStore(HOST, server.port, timeout=5, token=token) as late:
            assert late.get("k") == b"v"
        assert _dropped(caplog) == []


def _set_request(key: bytes, value: bytes) -> bytes:
    body = _REQ.pack(_SET, 0.0) + _pack_fields([key, value])
    return _LEN.pack(len(body)) + body


@pytest.mark.timeout(30)
@pytest.mark.parametrize("claims_token", [False, True], ids=["no-token", "guessed-token"])
def test_store_takes_nothing_from_a_client_that_fails_the_handshake(caplog, claims_token):
    """A client of a store with a token sends its hello, a guessed proof and
    verdict, and a set, all at once, without waiting: the set is never read."""
    caplog.set_level(logging.WARNING, logger="collie.rendezvous")
    with TCPStore(HOST, 0, is_server=True, timeout=5, token="s3cret") as server:
        with socket.create_connection((HOST, server.port), timeout=5) as sock:
            hello = MAGIC + (b"\x01" if claims_token else b"\x00") + os.urandom(16)
            proof = os.urandom(32) + b"\x01" if claims_token else b""
            sock.sendall(hello + proof + _set_request(b"planted", b"x"))
            assert _closed_by_peer(sock, within=5)
        assert not server.check(["planted"]) and server.num_keys() == 0
        assert len(_dropped(caplog)) == 1


@pytest.mark.timeout(60)
@TOKENS
def test_store_drops_a_client_that_announces_a_huge_request(caplog, token):
    caplog.set_level(logging.WARNING, logger="collie.rendezvous")
    with TCPStore(HOST, 0, is_server=True, timeout=5, token=token) as server:
        before = _rss()
        with socket.create_connection((HOST, server.port), timeout=10) as sock:
            handshake(sock, auth.token_from_env(token), server=False, what="the store")
            sent = 0
            chunk = bytes(1 << 20)
            try:
                sock.sendall(_LEN.pack(1 << 30))
                while sent < 1 << 30:
                    sock.sendall(chunk)
                    sent += len(chunk)
            except ConnectionError:
                pass
            assert _closed_by_peer(sock, within=5)
        assert sent < 256 << 20, "the server read on after a 1 GiB request was announced"
        assert _rss() - before < 64 << 20
        assert any("announced a request of 1073741824 bytes" in m for m in _dropped(caplog))
        server.set("still", b"serving")
        assert server.get("still") == b"serving"


@pytest.mark.timeout(30)
def test_store_request_bound(monkeypatch):
    monkeypatch.setenv("COLLIE_STORE_MAX_FRAME", "65536")
    with TCPStore(HOST, 0, is_server=True, timeout=5) as store:
        store.set("fits", bytes(60000))
        with pytest.raises(ValueError, match="more than the 65536 the store takes"):
            store.set("big", bytes(70000))
        assert store.get("fits") == bytes(60000)  # refused before sending: still connected
    monkeypatch.setenv("COLLIE_STORE_MAX_FRAME", "lots")
    with pytest.raises(ValueError, match="COLLIE_STORE_MAX_FRAME='lots'"):
        TCPStore(HOST, 0, is_server=True, timeout=5)


@pytest.mark.timeout(30)
def test_store_drops_a_client_that_talks_out_of_turn(caplog):
    caplog.set_level(logging.WARNING, logger="collie.rendezvous")
    with TCPStore(HOST, 0, is_server=True, timeout=5) as server:
        with socket.create_connection((HOST, server.port), timeout=5) as sock:
            handshake(sock, None, server=False, what="the store")
            # A get that parks (the key is missing), then another request
            # without waiting for its answer: TCPStore never does that.
            get = _REQ.pack(_GET, 100.0) + _pack_fields([b"x"])
            sock.sendall(_LEN.pack(len(get)) + get)
            time.sleep(0.2)
            sock.sendall(_LEN.pack(len(get)) + get)
            assert _closed_by_peer(sock, within=5)
        assert any("before reading the answer to its last one" in m for m in _dropped(caplog))
        assert server.num_keys() == 0


@pytest.mark.timeout(90)
@TOKENS
def test_store_survives_1100_idle_connections(monkeypatch, token):
    monkeypatch.setattr(auth, "HANDSHAKE_SECONDS", 2.0)
    count = 1100
    _fd_limit_at_least(count + 500)
    with TCPStore(HOST, 0, is_server=True, timeout=10, token=token) as server, \
            TCPStore(HOST, server.port, timeout=10, token=token) as client:
        client.set("k", b"v")
        threads = threading.active_count()
        idle = []
        try:
            for _ in range(count):
                idle.append(socket.create_connection((HOST, server.port), timeout=5))
            t0 = time.monotonic()
            assert client.get("k") == b"v"
            with TCPStore(HOST, server.port, timeout=10, token=token) as newcomer:
                assert newcomer.get("k") == b"v"
            assert time.monotonic() - t0 < 5, "real clients waited behind the idle connections"
            assert threading.active_count() == threads, "a thread per connection"
            # The newcomer came after every idle one: all were accepted, and
            # at most MAX_PENDING_PER_SOURCE are still held.
            time.sleep(0.2)
            held = sum(_still_open(s) for s in idle)
            assert held <= auth.MAX_PENDING_PER_SOURCE, held
            time.sleep(auth.HANDSHAKE_SECONDS + 1)
            assert sum(_still_open(s) for s in idle) == 0, "idle connections outlived the deadline"
            assert client.get("k") == b"v"
        finally:
            for s in idle:
                s.close()


def _count_records(records: list):
    class Counter(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())
    return Counter()


def _leave_spare_fds(spare: int) -> None:
    """Lower this process's descriptor limit to what it uses plus ``spare``."""
    used = len(os.listdir("/proc/self/fd"))
    resource.setrlimit(resource.RLIMIT_NOFILE, (used + spare, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))


def _store_with_few_fds(conn, token, spare):
    """Child: a store server in a process that has only ``spare`` file
    descriptors left; sends its port, and its log lines when told to stop."""
    records: list[str] = []
    logger = logging.getLogger("collie.rendezvous")
    logger.addHandler(_count_records(records))
    logger.setLevel(logging.INFO)
    _leave_spare_fds(spare)
    store = TCPStore(HOST, 0, is_server=True, timeout=30, token=token)
    conn.send(store.port)
    conn.recv()
    store.close()
    conn.send(records)
    conn.close()


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.timeout(60)
@TOKENS
def test_store_out_of_file_descriptors(token):
    """Without a token the flood completes the handshake, holds the fds, and
    the server must pause accepting; with one, the flood stays in the
    handshake, and the server closes the oldest of it to make room."""
    here, there = CTX.Pipe()
    child = CTX.Process(target=_store_with_few_fds, args=(there, token, 24), daemon=True)
    child.start()
    there.close()
    flood: list[socket.socket] = []
    try:
        assert here.poll(10), "the store did not start"
        port = here.recv()
        with TCPStore(HOST, port, timeout=10, token=token) as real:
            real.set("k", b"v")
            hello = Handshake(None, server=False, what="").take()
            for _ in range(200):
                sock = socket.create_connection((HOST, port), timeout=5)
                if token is None:
                    sock.sendall(hello)  # admitted: it holds its fd until it hangs up
                flood.append(sock)
            time.sleep(0.5)
            cpu, start, worst = _cpu_seconds(child.pid), time.monotonic(), 0.0
            while time.monotonic() - start < 2.0:  # the siege
                t0 = time.monotonic()
                assert real.get("k") == b"v"
                worst = max(worst, time.monotonic() - t0)
                time.sleep(0.05)
            cpu = _cpu_seconds(child.pid) - cpu
            assert cpu < 0.5, f"the server used {cpu:.2f} s of CPU in 2 s of siege"
            assert worst < 5
            for sock in flood:
                sock.close()
            flood.clear()
            t0 = time.monotonic()
            with TCPStore(HOST, port, timeout=10, token=token) as late:  # served once the flood ends
                assert late.get("k") == b"v"
            assert time.monotonic() - t0 < 5
        here.send("stop")
        assert here.poll(10)
        lines = here.recv()
    finally:
        for sock in flood:
            sock.close()
        here.close()
        reap([child], [])
    paused = [m for m in lines if "cannot accept connections" in m]
    assert len(paused) <= 1 and len(lines) <= 6, lines
    if token is None:
        assert paused, lines  # the siege did run it out of descriptors


# -- a rank's TCP setup listener --------------------------------------------------------


def _slow_setup_then_all_reduce(rank, size, delay):
    """Join with backend="tcp"; the last rank starts its TCP setup ``delay``
    seconds late, so that the others wait on their listeners meanwhile."""
    import collie
    from collie.transports.tcp import TcpTransport
    if rank == size - 1:
        connect_mesh = TcpTransport._connect_mesh

        def late(self, *args):
            time.sleep(delay)
            return connect_mesh(self, *args)
        TcpTransport._connect_mesh = late
    collie.init_process_group(backend="tcp", timeout=30)
    try:
        ready = time.time()
        x = np.full(5, rank + 1.0)
        collie.all_reduce(x)
        return ready, x.tolist()
    finally:
        collie.destroy_process_group()


def _attacker(target, *args):
    """Run ``target(*args, done, report)`` in a process of its own: forking
    the ranks while a thread of the test runs could copy a lock it holds
    (the import lock, in getaddrinfo) into a rank. Returns the process, the
    event that ends the attack, and the pipe its report (a dict) comes on."""
    done = CTX.Event()
    here, there = CTX.Pipe(duplex=False)

    def run():
        report = {}
        try:
            target(*args, done, report)
        except BaseException as exc:  # noqa: BLE001 - the test reports it
            report["error"] = repr(exc)
        there.send(report)

    proc = CTX.Process(target=run, daemon=True)
    proc.start()
    there.close()
    return proc, done, here


def _attack_result(proc, done, pipe) -> dict:
    done.set()
    try:
        assert pipe.poll(15), "the attacker did not report"
        return pipe.recv()
    finally:
        reap([proc], [pipe])


def _attack_listeners(port, job, token, ranks, done, report):
    """Connect junk, idle and lying connections to the setup listeners of
    ``ranks`` (their addresses are in the store) and hold them until ``done``."""
    held = []
    try:
        with TCPStore(HOST, port, timeout=20, token=token) as store:
            addresses = [store.get(f"tcp/{job}/{r}", timeout=20).decode() for r in ranks]
        other_job = tcp._HELLO.pack(len(ranks), len(ranks) + 1, 0, 1, 5) + b"other"
        refused = 0
        for address in addresses:
            host, _, listen_port = address.rpartition(":")
            for payload in (None, os.urandom(300), b"GET / HTTP/1.1\r\n\r\n", "other job", "bad token"):
                sock = socket.create_connection((host, int(listen_port)), timeout=5)
                held.append(sock)
                try:
                    if payload == "other job":
                        handshake(sock, auth.token_from_env(token), server=False, what="a rank")
                        sock.sendall(other_job)
                    elif payload == "bad token":
                        handshake(sock, b"guess", server=False, what="a rank")
                    elif payload:
                        sock.sendall(payload)
                except AuthError:
                    refused += 1
                except ConnectionError:
                    pass
        report.update(attacked=time.time(), refused=refused)
        done.wait(60)
    finally:
        for sock in held:
            sock.close()


@pytest.mark.timeout(240)
@TOKENS
def test_setup_goes_on_through_stray_connections(token):
    size, runs = 4, 5
    env = {"COLLIE_TOKEN": token or ""}  # "": none (the harness may give one)
    for run in range(runs):
        port, job = free_port(), uuid.uuid4().hex[:10]
        attacker = _attacker(_attack_listeners, port, job, token, range(size - 1))
        try:
            results = run_ranks(_slow_setup_then_all_reduce, size, 1.5, backend="tcp", init=False,
                                timeout=60, env=dict(env, MASTER_PORT=str(port), COLLIE_JOB_ID=job))
        finally:
            report = _attack_result(*attacker)
        assert "error" not in report, report
        assert report["refused"] == size - 1  # the guessed token, on every listener
        assert report["attacked"] < min(ready for ready, _ in results), \
            f"run {run}: the stray connections came after setup"
        for _, x in results:
            assert x == [sum(range(1, size + 1))] * 5


def _out_of_fds_then_all_reduce(rank, size, delay, spare):
    """Rank 0 has only ``spare`` descriptors left when it starts."""
    lines: list[str] = []
    if rank == 0:
        logging.getLogger("collie.transports.tcp").addHandler(_count_records(lines))
        _leave_spare_fds(spare)
    ready, x = _slow_setup_then_all_reduce(rank, size, delay)
    return ready, x, lines


def _flood_listener(port, job, token, rank, count, done, report):
    held = []
    try:
        with TCPStore(HOST, port, timeout=20, token=token) as store:
            host, _, listen_port = store.get(f"tcp/{job}/{rank}", timeout=20).decode().rpartition(":")
        for _ in range(count):
            held.append(socket.create_connection((host, int(listen_port)), timeout=5))
        report["attacked"] = time.time()
        done.wait(60)
    finally:
        for sock in held:
            sock.close()


@pytest.mark.timeout(120)
def test_setup_goes_on_when_a_flood_takes_every_descriptor():
    size, token = 2, "s3cret"
    port, job = free_port(), uuid.uuid4().hex[:10]
    attacker = _attacker(_flood_listener, port, job, token, 0, 300)
    try:
        env = dict(COLLIE_TOKEN=token, MASTER_PORT=str(port), COLLIE_JOB_ID=job)
        results = run_ranks(_out_of_fds_then_all_reduce, size, 1.5, 20, backend="tcp", init=False,
                            timeout=60, env=env)
    finally:
        report = _attack_result(*attacker)
    assert "error" not in report, report
    assert report["attacked"] < min(ready for ready, _, _ in results)
    assert [x for _, x, _ in results] == [[3.0] * 5] * size
    lines = results[0][2]
    assert any("closed to free a file descriptor" in line for line in lines), lines
    assert len(lines) <= 3, lines
