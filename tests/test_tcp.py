"""Tests of the TCP transport, on real processes over loopback.

Each test runs a body on N forked processes (``run_ranks``); every rank
builds a TcpTransport through a tiny directory store, runs the body, closes
the transport, and checks that none of its threads or sockets is left.
Bodies wait on requests the way the Network does: sleep on the doorbell.
"""

from __future__ import annotations

import functools
import multiprocessing
import os
import queue
import signal
import socket
import threading
import time
import traceback

import numpy as np

from collie.rendezvous import FileStore
import pytest
from harness import open_sockets

from collie.errors import CollieError, PeerError
from collie.transports import tcp
from collie.transports.base import MessageMismatch
from collie.transports.doorbell import Doorbell
from collie.transports.tcp import HEADER, TcpTransport

MiB = 1 << 20
#: Extra TcpTransport arguments for the ranks of the next run_ranks (the
#: ``links`` fixture sets them: striped runs cut every message from 4 KiB on).
OPTIONS: dict = {}


def DirStore(path: str):
    """The library's file store, kept in directory ``path`` (the ranks are forked)."""
    os.makedirs(path, exist_ok=True)
    return FileStore(os.path.join(path, "store"), timeout=30.0)


class Rank:
    """What a test body gets: this rank's transport and its callbacks' log."""

    def __init__(self, rank: int, size: int, store, token, timeout: float, master_addr: str):
        self.rank = rank
        self.size = size
        self.bell = Doorbell.private()
        self.lost: list = []  # (peer, error type name, message)
        self.controls: list = []  # (peer, payload)
        self.t = TcpTransport(rank, size, store, "job", self.bell, timeout, token,
                              lambda peer, exc: self.lost.append((peer, type(exc).__name__, str(exc))),
                              lambda peer, payload: self.controls.append((peer, payload)), master_addr,
                              **OPTIONS)

    def wait(self, *requests, timeout: float = 20.0) -> None:
        """Wait until every request finishes; raise the first error."""
        self.wait_for(lambda: all(r.finished for r in requests), timeout, f"{requests}")
        for r in requests:
            if r.error is not None:
                raise r.error

    def wait_for(self, condition, timeout: float = 20.0, what: str = "a condition") -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline:
                raise AssertionError(f"rank {self.rank}: timed out waiting for {what}")
            self.bell.wait(0.1)

    def send(self, peer: int, tag: int, data, meta: int = 0):
        return self.t.isend(peer, tag, memoryview(data).cast("B"), meta)

    def recv(self, peer: int, tag: int, nbytes: int, **kw):
        dst = np.zeros(nbytes, np.uint8)
        r = self.t.irecv(peer, tag, memoryview(dst), **kw)
        return r, dst

    def sync(self) -> None:
        """A barrier among all ranks, over the transport itself (tag -1)."""
        rs = [self.t.irecv(p, -1, memoryview(bytearray(0))) for p in range(self.size) if p != self.rank]
        ss = [self.t.isend(p, -1, memoryview(b"")) for p in range(self.size) if p != self.rank]
        self.wait(*rs, *ss)


def _child(rank, size, path, token, timeout, master_addr, body, args, results):
    try:
        before = open_sockets()
        r = Rank(rank, size, DirStore(path), token, timeout, master_addr)
        try:
            value = body(r, *args)
        finally:
            r.t.close()
            r.t.close()  # idempotent
        left = [t.name for t in threading.enumerate() if t.name.startswith("collie-")]
        assert not left, f"threads left after close: {left}"
        assert open_sockets() <= before, f"sockets left after close: {open_sockets() - before}"
        results.put((rank, "ok", value))
    except BaseException as exc:
        results.put((rank, type(exc).__name__, f"{exc}\n{traceback.format_exc()}"))


def run_ranks(tmp_path, size: int, body, *args, tokens=None, timeout: float = 30.0,
              setup_timeout: float = 10.0, dies=(), errors_ok=False, master_addr="127.0.0.1") -> list:
    """Run ``body(Rank, *args)`` on ``size`` forked processes and return each
    rank's value. Ranks in ``dies`` are expected to be killed (no result).
    With errors_ok, a rank's failure is returned as (exception name, text)
    instead of failing the test, and every rank's value is (status, value),
    status being "ok" or the name of the exception."""
    _random_block()
    ctx = multiprocessing.get_context("fork")
    results = ctx.Queue()
    tokens = tokens or [None] * size
    procs = [ctx.Process(target=_child, args=(rank, size, str(tmp_path), tokens[rank], setup_timeout,
                                              master_addr, body, args, results), daemon=True)
             for rank in range(size)]
    for proc in procs:
        proc.start()
    out: dict = {}
    deadline = time.monotonic() + timeout
    try:
        while len(out) < size - len(dies):
            try:
                rank, status, value = results.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                break
            out[rank] = (status, value)
            if status != "ok" and not errors_ok:  # the others' errors may tell the cause
                deadline = min(deadline, time.monotonic() + 2)
    finally:
        for proc in procs:
            proc.join(max(1.0, deadline - time.monotonic()))
            if proc.is_alive():
                proc.kill()
                proc.join(5)
        results.close()
        results.join_thread()
    failed = [f"rank {rank}: {status}: {value}" for rank, (status, value) in sorted(out.items())
              if status != "ok"]
    if failed and not errors_ok:
        pytest.fail("\n".join(failed))
    for rank, proc in enumerate(procs):
        if rank in dies:
            assert proc.exitcode == -signal.SIGKILL, f"rank {rank} exit code {proc.exitcode}"
        else:
            assert rank in out, f"rank {rank} gave no result within {timeout} s (exit code {proc.exitcode})"
    if errors_ok:
        return [out.get(rank) for rank in range(size)]
    return [out[rank][1] if rank in out else None for rank in range(size)]


# pytest's limit for a test of run_ranks' default 30 s: above it, so that run_ranks
# kills a rank still running at its deadline and reports what is missing, rather
# than pytest stopping it inside its joins.
BACKSTOP = 45


@functools.cache
def _random_block() -> np.ndarray:
    return np.frombuffer(np.random.default_rng(7).bytes(128 * MiB + 4096), np.uint8)


def _payload(src: int, dst: int, nbytes: int, salt: int = 0) -> np.ndarray:
    """Distinct bytes for each (sender, receiver, salt): a window of one
    random block (made before the fork, so that no rank pays for it)."""
    start = ((src * 31 + dst) * 17 + salt) % 4096
    return _random_block()[start:start + nbytes]


# ---------------------------------------------------------------- bodies

SIZES = [0, 1, 1000, MiB, 64 * MiB]


def _all_sizes(r: Rank):
    peers = [p for p in range(r.size) if p != r.rank]
    sends, recvs = [], []
    for i, n in enumerate(SIZES):
        if i % 2 == 0:  # posted before the data arrives: straight into place
            recvs += [(p, n, *r.recv(p, i, n)) for p in peers]
        sends += [r.send(p, i, _payload(r.rank, p, n), meta=n) for p in peers]
    r.sync()  # the odd sizes have arrived by now and wait as unexpected messages
    for i, n in enumerate(SIZES):
        if i % 2 == 1:
            recvs += [(p, n, *r.recv(p, i, n, meta=n)) for p in peers]
    r.wait(*sends, *(req for _, _, req, _ in recvs))
    for p, n, _, dst in recvs:
        assert np.array_equal(dst, _payload(p, r.rank, n)), f"rank {r.rank}: {n} bytes from {p} differ"
    return len(recvs)


def _order(r: Rank):
    if r.rank == 0:
        r.sync()
        sends = [r.send(1, 7, np.array([i], np.int64)) for i in range(30)]
        sends += [r.send(1, tag, np.array([100 + tag], np.int64)) for tag in range(1, 6)]
        r.wait(*sends)
        r.sync()
        return None
    early = [r.recv(0, 7, 8) for _ in range(10)]  # posted before the messages come
    tags = [(tag, *r.recv(0, tag, 8)) for tag in range(5, 0, -1)]  # tags in reverse order
    r.sync()
    r.sync()
    late = [r.recv(0, 7, 8) for _ in range(20)]  # these find them queued
    r.wait(*(req for req, _ in early + late), *(req for _, req, _ in tags))
    got = [int(dst.view(np.int64)[0]) for _, dst in early + late]
    assert got == list(range(30)), got
    assert [int(dst.view(np.int64)[0]) for _, _, dst in tags] == [105, 104, 103, 102, 101]
    return got


def _combine(r: Rank):
    counts = [1000, (3 * tcp.PIECE + 8) // 8, 2 * tcp.PIECE // 8]
    if r.rank == 0:
        r.sync()
        r.wait(*[r.send(1, i, np.arange(n, dtype=np.float64)) for i, n in enumerate(counts)])
        r.wait(r.send(1, 9, np.full(counts[1], 2.0)))
        r.sync()
        return None
    pieces = []

    def add(dst: memoryview, src: memoryview) -> None:
        pieces.append((np.frombuffer(dst, np.uint8).__array_interface__["data"][0],
                       np.frombuffer(src, np.uint8).__array_interface__["data"][0], len(dst)))
        d = np.frombuffer(dst, np.float64)
        np.add(d, np.frombuffer(src, np.float64), out=d)

    dsts = [np.ones(n) for n in counts]
    reqs = [r.t.irecv(0, i, memoryview(d).cast("B"), combine=add) for i, d in enumerate(dsts)]
    r.sync()
    r.wait(*reqs)
    for d, n in zip(dsts, counts):
        assert np.array_equal(d, np.arange(n) + 1.0)
    for i, d in enumerate(dsts):
        mine = [p for p in pieces if d.ctypes.data <= p[0] < d.ctypes.data + d.nbytes]
        assert sum(p[2] for p in mine) == d.nbytes
        assert len(mine) >= -(-d.nbytes // tcp.PIECE)  # big ones came in pieces
        for dst_addr, src_addr, n in mine:
            assert (dst_addr - d.ctypes.data) % 16 == 0 and src_addr % 16 == 0 and n <= tcp.PIECE
    r.sync()  # message 9 has arrived unexpected: combine then gets it whole
    d = np.ones(counts[1])
    r.wait(r.t.irecv(0, 9, memoryview(d).cast("B"), combine=add))
    assert np.array_equal(d, np.full(counts[1], 3.0))
    return len(pieces)


def _combine_raises(r: Rank):
    if r.rank == 0:
        r.sync()
        r.wait(r.send(1, 1, np.ones(3 * MiB // 8)), r.send(1, 1, np.ones(100)), r.send(1, 1, b"fine"))
        r.sync()
        return None

    def broken(dst: memoryview, src: memoryview) -> None:
        raise ZeroDivisionError("combine is broken")

    posted = r.t.irecv(0, 1, memoryview(bytearray(3 * MiB)), combine=broken)
    r.sync()
    r.sync()  # the second message waits, unexpected
    queued = r.t.irecv(0, 1, memoryview(bytearray(800)), combine=broken)
    req, dst = r.recv(0, 1, 4)
    r.wait_for(lambda: posted.finished and queued.finished)
    assert isinstance(posted.error, ZeroDivisionError) and isinstance(queued.error, ZeroDivisionError)
    r.wait(req)  # the connection is fine
    died = [lost for lost in r.lost if "left" not in lost[2]]  # rank 0 may have left by now
    assert bytes(dst) == b"fine" and not died
    return True


def _mismatch(r: Rank, posted: bool):
    sizes = [100, 100, 3 * MiB, 3 * MiB, 100, 5]
    if r.rank == 0:
        if posted:
            r.sync()  # rank 1 has posted its receives
        r.wait(*[r.send(1, 4, _payload(0, 1, n, i), meta=i) for i, n in enumerate(sizes)])
        r.sync()
        if not posted:
            r.sync()
        return None
    expected = [(50, None), (100, None), (3 * MiB, 0), (3 * MiB, 3), (100, 99), (5, 5)]
    if not posted:
        r.sync()  # every message has arrived and waits, unexpected
        assert r.t.probe(0, 4) == 100
    reqs = [r.recv(0, 4, n, meta=meta) for n, meta in expected]
    r.sync()
    if posted:
        r.sync()  # every message has arrived
    r.wait_for(lambda: all(req.finished for req, _ in reqs))
    outcome = []
    for i, (req, dst) in enumerate(reqs):
        if isinstance(req.error, MessageMismatch):
            assert not dst.any(), "a failed receive must leave its destination unchanged"
            outcome.append("mismatch")
        else:
            assert req.error is None, req.error
            assert np.array_equal(dst, _payload(0, 1, sizes[i], i))
            outcome.append("ok")
    assert r.t.probe(0, 4) is None
    return outcome


def _probe(r: Rank):
    if r.rank == 0:
        r.sync()
        r.wait(r.send(1, 5, _payload(0, 1, 1234)))
        r.sync()
        return None
    assert r.t.probe(0, 5) is None
    r.sync()
    r.wait_for(lambda: r.t.probe(0, 5) is not None, what="probe")
    assert r.t.probe(0, 5) == 1234 and r.t.probe(0, 6) is None
    req, dst = r.recv(0, 5, 1234)
    r.wait(req)
    assert np.array_equal(dst, _payload(0, 1, 1234)) and r.t.probe(0, 5) is None
    r.sync()
    return True


def _both_ways(r: Rank, nbytes: int):
    other = 1 - r.rank
    data = _payload(r.rank, other, nbytes)
    start = time.monotonic()
    send = r.send(other, 1, data)
    isend_s = time.monotonic() - start
    time.sleep(0.3)  # both sends are under way, no receive posted
    req, dst = r.recv(other, 1, nbytes)
    r.wait(send, req, timeout=60)
    assert np.array_equal(dst, _payload(other, r.rank, nbytes))
    return isend_s


def _take_while_arriving(r: Rank):
    if r.rank == 0:
        r.sync()
        r.wait(r.send(1, 1, _payload(0, 1, 64 * MiB)))
        r.sync()
        return None
    r.sync()
    r.wait_for(lambda: r.t.probe(0, 1) is not None, what="the message to start arriving")
    req, dst = r.recv(0, 1, 64 * MiB)  # most likely while it arrives: the thread delivers it
    arriving = not req.finished
    r.wait(req)
    assert np.array_equal(dst, _payload(0, 1, 64 * MiB))
    r.sync()
    return arriving


def _control(r: Rank):
    if r.rank == 0:
        # Control frames from another thread while this one sends data: no
        # frame may interleave with another.
        def controls():
            for i in range(200):
                r.t.send_control(1, b"ctl %d" % i)

        thread = threading.Thread(target=controls)
        thread.start()
        sends = [r.send(1, 2, _payload(0, 1, n, i)) for i, n in enumerate([8, 3 * MiB, 100] * 10)]
        thread.join(30)
        r.wait(*sends)
        r.t.send_control(2, b"")
        r.sync()
        return None
    if r.rank == 1:
        reqs = [r.recv(0, 2, n) for n in [8, 3 * MiB, 100] * 10]
        r.wait(*(req for req, _ in reqs))
        for i, (_, dst) in enumerate(reqs):
            assert np.array_equal(dst, _payload(0, 1, len(dst), i))
        r.wait_for(lambda: len(r.controls) == 200, what="200 control messages")
        assert r.controls == [(0, b"ctl %d" % i) for i in range(200)]
    else:
        r.wait_for(lambda: r.controls == [(0, b"")], what="an empty control message")
    r.sync()
    return True


def _killed(r: Rank):
    if r.rank == 1:
        r.sync()
        r.wait(r.send(0, 3, b"bye"), r.send(2, 3, b"bye"))
        time.sleep(0.2)
        os.kill(os.getpid(), signal.SIGKILL)
    pending, _ = r.recv(1, 8, 10)  # rank 1 never sends this
    r.sync()
    note, _ = r.recv(1, 3, 3)
    r.wait(note)
    start = time.monotonic()
    r.wait_for(lambda: pending.finished, what="the receive from the dead rank to fail")
    latency = time.monotonic() - start
    assert isinstance(pending.error, PeerError) and pending.error.peer == 1
    assert "rank 1 died (connection lost" in str(pending.error), pending.error
    r.wait_for(lambda: r.lost, what="on_peer_lost")
    assert r.lost[0][:2] == (1, "PeerError") and "rank 1 died" in r.lost[0][2]
    later = r.send(1, 1, b"x")
    assert isinstance(later.error, PeerError)
    # The survivors still talk to each other.
    other = 2 - r.rank
    req, dst = r.recv(other, 4, 4)
    r.wait(r.send(other, 4, b"live"), req)
    assert bytes(dst) == b"live"
    return latency


def _clean_leave(r: Rank):
    if r.rank == 1:
        r.wait(r.send(0, 6, _payload(1, 0, 5 * MiB)))
        r.sync()
        r.t.close()
        assert not r.lost
        return None
    pending, _ = r.recv(1, 8, 10)  # rank 1 never sends this
    r.sync()
    r.wait_for(lambda: pending.finished, what="the receive from the leaving rank to fail")
    assert isinstance(pending.error, PeerError), pending.error
    assert "rank 1 left (destroy_process_group)" in str(pending.error) and pending.error.left
    r.wait_for(lambda: r.lost, what="on_peer_lost")
    assert r.lost == [(1, "PeerError", str(pending.error))]
    req, dst = r.recv(1, 6, 5 * MiB)  # what it sent before leaving is still there
    r.wait(req)
    assert np.array_equal(dst, _payload(1, 0, 5 * MiB))
    after, _ = r.recv(1, 6, 5)
    assert isinstance(after.error, PeerError)
    return True


def _fail_peer(r: Rank):
    if r.rank == 1:
        r.sync()
        r.wait_for(lambda: r.lost, what="rank 0 to hang up")
        return r.lost[0][2]
    pending, _ = r.recv(1, 8, 10)
    r.sync()
    r.t.fail_peer(1, PeerError("told so", 1))
    r.wait_for(lambda: pending.finished)
    assert str(pending.error) == "told so"
    assert str(r.send(1, 1, b"x").error) == "told so"
    time.sleep(0.2)
    assert not r.lost  # the Network already knows
    return True


def _exchange(r: Rank):
    r.sync()
    return r.rank


def _huge(r: Rank, nbytes: int):
    marks = np.arange(0, nbytes - 1000, 16 * MiB)  # sparse: huge pages would make touched ones real
    if r.rank == 0:
        data = np.zeros(nbytes, np.uint8)  # untouched pages cost no memory
        data[marks] = (marks // MiB) % 251 + 1
        data[-1000:] = _payload(0, 1, 1000)
        data[(1 << 32) + 5] = 77
        r.wait(r.send(1, 1, data), timeout=120)
        r.sync()
        return None
    dst = np.zeros(nbytes, np.uint8)
    req = r.t.irecv(0, 1, memoryview(dst))
    r.wait(req, timeout=120)
    assert np.array_equal(dst[marks], (marks // MiB) % 251 + 1)
    assert np.array_equal(dst[-1000:], _payload(0, 1, 1000)) and dst[(1 << 32) + 5] == 77
    r.sync()
    return True


def _leave_right_after_sending(r: Rank):
    """Rank 1 sends and closes at once: close() lets the message go out (on
    every connection) before it hangs up, and rank 0 receives it after the
    leave."""
    if r.rank == 1:
        r.sync()
        r.send(0, 6, _payload(1, 0, 24 * MiB + 5))
        r.t.close()
        return None
    r.sync()
    r.wait_for(lambda: r.lost, what="on_peer_lost")
    assert "left (destroy_process_group)" in r.lost[0][2], r.lost
    req, dst = r.recv(1, 6, 24 * MiB + 5)
    r.wait(req)
    assert np.array_equal(dst, _payload(1, 0, 24 * MiB + 5))
    return True


def _control_after_data(r: Rank):
    """A control message sent after a big message reaches on_control only
    once that message is whole (the Network's "leaving" counts on it)."""
    if r.rank == 1:
        r.sync()
        r.send(0, 3, _payload(1, 0, 64 * MiB))
        r.t.send_control(0, b"after")
        r.sync()
        return None
    req, dst = r.recv(1, 3, 64 * MiB)
    r.sync()
    r.wait_for(lambda: r.controls, what="the control message")
    assert req.done, "on_control ran before the message sent ahead of it was whole"
    assert np.array_equal(dst, _payload(1, 0, 64 * MiB))
    r.sync()
    return True


def _killed_while_sending(r: Rank):
    """Rank 1 dies with a big message to rank 0 on the way: rank 0's receive
    fails (its stripes never all come), and nothing of rank 0 is left waiting."""
    if r.rank == 1:
        real_sendall, real_sendmsg = socket.socket.sendall, socket.socket.sendmsg

        # The message's payload, whichever call carries it (isend's sendmsg
        # without waiting, which can take all of it when the reader keeps
        # up, or the sender thread's sendall): 1 MiB of it, then death.
        def sendall(sock, data, *flags):
            view = memoryview(data)
            if view.nbytes > MiB:
                real_sendall(sock, view[:MiB], *flags)
                os.kill(os.getpid(), signal.SIGKILL)
            return real_sendall(sock, data, *flags)

        def sendmsg(sock, buffers, *rest):
            views = [memoryview(b).cast("B") for b in buffers]
            if sum(v.nbytes for v in views) > MiB:
                left = MiB  # the header, then the payload's first bytes
                for v in views:
                    real_sendall(sock, v[:left])
                    left -= min(left, v.nbytes)
                os.kill(os.getpid(), signal.SIGKILL)
            return real_sendmsg(sock, buffers, *rest)

        socket.socket.sendall, socket.socket.sendmsg = sendall, sendmsg  # in this rank's process only
        data = _payload(1, 0, 128 * MiB)
        r.sync()
        r.send(0, 2, data)
        time.sleep(30)
    req, dst = r.recv(1, 2, 128 * MiB)
    r.sync()
    r.wait_for(lambda: req.finished, what="the receive from the dead rank to finish")
    if req.error is None:  # it all came before the death: allowed, and whole
        assert np.array_equal(dst, _payload(1, 0, 128 * MiB))
        return "whole"
    assert isinstance(req.error, PeerError) and "rank 1 died" in str(req.error), req.error
    return "failed"


# ----------------------------------------------------------------- tests

@pytest.fixture(params=["one", "striped"])
def links(request):
    """One connection per pair, or three with every message from 4 KiB on
    striped across them."""
    OPTIONS.update({"one": {}, "striped": {"streams": 3, "stripe_min": 4096}}[request.param])
    yield request.param
    OPTIONS.clear()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("size", [2, 3, 4])
def test_message_sizes(tmp_path, links, size):
    assert run_ranks(tmp_path, size, _all_sizes) == [len(SIZES) * (size - 1)] * size


@pytest.mark.timeout(BACKSTOP)
def test_fifo_per_tag_and_tags_in_any_order(tmp_path, links):
    run_ranks(tmp_path, 2, _order)


@pytest.mark.timeout(BACKSTOP)
def test_combine_gets_aligned_pieces(tmp_path, links):
    run_ranks(tmp_path, 2, _combine)


@pytest.mark.timeout(BACKSTOP)
def test_combine_that_raises_fails_only_its_receive(tmp_path, links):
    run_ranks(tmp_path, 2, _combine_raises)


@pytest.mark.timeout(BACKSTOP)
@pytest.mark.parametrize("posted", [True, False], ids=["posted", "unexpected"])
def test_mismatch_consumes_the_message(tmp_path, links, posted):
    _, outcome = run_ranks(tmp_path, 2, _mismatch, posted)
    assert outcome == ["mismatch", "ok", "mismatch", "ok", "mismatch", "ok"]


@pytest.mark.timeout(BACKSTOP)
def test_probe(tmp_path, links):
    run_ranks(tmp_path, 2, _probe)


@pytest.mark.timeout(60)
def test_big_sends_both_ways_before_receives(tmp_path, links):
    isend_seconds = run_ranks(tmp_path, 2, _both_ways, 128 * MiB, timeout=60)
    assert max(isend_seconds) < 1.0  # isend hands big messages to a thread


@pytest.mark.timeout(BACKSTOP)
def test_receive_posted_while_the_message_arrives(tmp_path, links):
    run_ranks(tmp_path, 2, _take_while_arriving)


@pytest.mark.timeout(BACKSTOP)
def test_control_messages_between_data(tmp_path, links):
    run_ranks(tmp_path, 3, _control)


@pytest.mark.timeout(BACKSTOP)
def test_killed_peer_fails_pending_requests(tmp_path, links):
    latencies = run_ranks(tmp_path, 3, _killed, dies=(1,))
    assert max(latencies[0], latencies[2]) < 1.0


@pytest.mark.timeout(BACKSTOP)
def test_clean_leave_reports_destroy(tmp_path, links):
    run_ranks(tmp_path, 2, _clean_leave)


@pytest.mark.timeout(BACKSTOP)
def test_leaving_right_after_a_send_delivers_it(tmp_path, links):
    run_ranks(tmp_path, 2, _leave_right_after_sending)


@pytest.mark.timeout(BACKSTOP)
def test_control_follows_the_data_sent_before_it(tmp_path, links):
    run_ranks(tmp_path, 2, _control_after_data)


@pytest.mark.timeout(BACKSTOP)
def test_a_sender_killed_mid_message_fails_the_receive(tmp_path, links):
    outcome, _ = run_ranks(tmp_path, 2, _killed_while_sending, dies=(1,))
    assert outcome == "failed"  # the sender dies after 1 MiB of its payload, whichever call sends it


@pytest.mark.timeout(BACKSTOP)
def test_fail_peer(tmp_path):
    _, seen_by_1 = run_ranks(tmp_path, 2, _fail_peer)
    assert "rank 0 died (connection lost" in seen_by_1


@pytest.mark.timeout(BACKSTOP)
def test_same_token_connects(tmp_path):
    assert run_ranks(tmp_path, 3, _exchange, tokens=[b"s3cret"] * 3) == [0, 1, 2]


@pytest.mark.timeout(BACKSTOP)
@pytest.mark.parametrize("tokens", [[b"a", b"b"], [b"a", None], [None, b"b"]])
def test_wrong_token_is_refused(tmp_path, tokens):
    results = run_ranks(tmp_path, 2, _exchange, tokens=tokens, errors_ok=True)
    for status, text in results:
        assert status == "AuthError", text


@pytest.mark.timeout(BACKSTOP)
def test_one_bad_token_fails_every_rank_quickly(tmp_path):
    start = time.monotonic()
    results = run_ranks(tmp_path, 3, _exchange, tokens=[b"a", b"a", b"b"], errors_ok=True,
                        setup_timeout=20)
    assert time.monotonic() - start < 10  # well before the setup timeout
    assert results[0][0] == results[2][0] == "AuthError"
    assert results[1][0] in ("AuthError", "PeerError"), results[1]


@pytest.mark.timeout(BACKSTOP)
def test_missing_peer_times_out(tmp_path):
    bell = Doorbell.private()
    with pytest.raises(CollieError, match=r"rank\(s\) \[1\] to connect"):
        TcpTransport(0, 2, DirStore(tmp_path), "job", bell, 0.5, None, print, print)
    assert not [t for t in threading.enumerate() if t.name.startswith("collie-")]


def test_size_one_has_no_connections(tmp_path):
    before = open_sockets()
    t = TcpTransport(0, 1, DirStore(tmp_path), "job", Doorbell.private(), 1.0, None, print, print)
    with pytest.raises(ValueError, match="no TCP connection to rank 0"):
        t.isend(0, 1, memoryview(b"x"))
    assert t.progress() is False
    t.close()
    t.close()
    assert open_sockets() == before


def test_listens_on_loopback_for_a_loopback_master():
    assert tcp._listen_address("127.0.0.1") == (socket.AF_INET, "127.0.0.1")
    assert tcp._listen_address("127.0.0.9") == (socket.AF_INET, "127.0.0.1")
    assert tcp._listen_address("localhost")[1] in ("127.0.0.1", "::1")
    assert tcp._format_address("::1", 80) == "[::1]:80"


def _ipv6_works() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.timeout(BACKSTOP)
@pytest.mark.skipif(not _ipv6_works(), reason="no IPv6 loopback")
def test_ipv6_loopback(tmp_path):
    assert run_ranks(tmp_path, 3, _exchange, master_addr="::1") == [0, 1, 2]


def test_header_holds_64_bit_sizes():
    frame = HEADER.pack(tcp.DATA, -(1 << 63), (1 << 63) - 1, (5 << 30) + 7)
    assert HEADER.size == 25
    assert HEADER.unpack(frame) == (tcp.DATA, -(1 << 63), (1 << 63) - 1, (5 << 30) + 7)


def _mem_available() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


@pytest.mark.timeout(180)
@pytest.mark.skipif(_mem_available() < 12 << 30, reason="needs about 4.5 GiB of free memory, with margin")
def test_message_over_4_gib(tmp_path):
    # The sender's buffer is mostly untouched zero pages, so only the
    # receiver's 4.5 GiB are real memory.
    run_ranks(tmp_path, 2, _huge, (4 << 30) + (512 << 20) + 13, timeout=170)


def test_striping_settings_come_from_the_environment():
    assert tcp.striping({}) == (tcp.STREAMS, tcp.STRIPE_MIN)
    assert tcp.striping({"COLLIE_TCP_STREAMS": "4", "COLLIE_TCP_STRIPE_MIN": "65536"}) == (4, 65536)
    for name, bad in (("COLLIE_TCP_STREAMS", "0"), ("COLLIE_TCP_STRIPE_MIN", "1M")):
        with pytest.raises(ValueError, match=f"{name}='{bad}' must be a whole number"):
            tcp.striping({name: bad})
