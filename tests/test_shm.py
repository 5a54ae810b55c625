"""Tests of the shared-memory transport (collie.transports.shm).

Two kinds of tests:
- real processes (forked), each with a ShmTransport, talking through a tiny
  file-based store: sizes, tags, combine, deaths, /dev/shm hygiene, doorbells;
- several transports in this one process (built on threads, then driven by
  hand from one thread): the orderings that are hard to force between
  processes (a receive claiming a message that is half copied out, probes).

Every multi-process run has a deadline, joins with timeouts, kills what is
left, and checks that no collie-<job>-* entry is left in /dev/shm.
"""

from __future__ import annotations

import mmap
import multiprocessing as mp
import multiprocessing.connection
import os
import pickle
import signal
import threading
import time
import traceback
import uuid

import numpy as np

from collie.rendezvous import FileStore as _LibraryFileStore
import pytest

from collie.errors import CollieError, PeerError
from harness import reap, start_ranks
from collie.transports import ring, segment, shm
from collie.transports.base import MessageMismatch, Request
from collie.transports.doorbell import Doorbell
from collie.transports.shm import ShmTransport

pytestmark = pytest.mark.timeout(60)

CTX = mp.get_context("fork")
SMALL = dict(slots=4, slot_bytes=4096)  # many fragments from few bytes
S = shm.DEFAULT_SLOT_BYTES


# ---- helpers ----

def FileStore(root: str):
    """The library's file store, kept in directory ``root`` (the ranks are forked)."""
    os.makedirs(root, exist_ok=True)
    return _LibraryFileStore(os.path.join(root, "store"), timeout=30.0)


class DictStore:
    """The same store for threads of one process."""

    def __init__(self):
        self.data: dict[str, bytes] = {}
        self.cond = threading.Condition()

    def set(self, key, value):
        with self.cond:
            self.data[key] = value
            self.cond.notify_all()

    def get(self, key, timeout=None):
        with self.cond:
            if not self.cond.wait_for(lambda: key in self.data, 30.0 if timeout is None else timeout):
                raise TimeoutError(f"store key {key!r} did not appear")
            return self.data[key]

    def add(self, key, amount):
        with self.cond:
            value = int(self.data.get(key, b"0")) + amount
            self.data[key] = str(value).encode()
            self.cond.notify_all()
            return value


def leftovers(job: str) -> list[str]:
    return [n for n in os.listdir("/dev/shm") if n.startswith(f"collie-{job}-")]


def wait_all(t: ShmTransport, reqs, timeout: float = 20.0, on_idle=None) -> None:
    """Progress until every request finished, sleeping on the doorbell when idle."""
    deadline = time.monotonic() + timeout
    while not all(r.finished for r in reqs):
        if t.progress():
            continue
        if on_idle is not None:
            on_idle()
        if time.monotonic() > deadline:
            raise TimeoutError(f"still pending: {[r for r in reqs if not r.finished]}")
        t.doorbell.sleep(0.005, t.progress)


def check_ok(reqs) -> None:
    for r in reqs:
        if r.error is not None:
            raise r.error
        assert r.done


_BLOCK = np.random.default_rng(0).integers(0, 256, 1_000_003, dtype=np.uint8)


def payload(src: int, dst: int, size: int, salt: int = 0) -> np.ndarray:
    """Deterministic bytes, different for every (src, dst, size, salt)."""
    shift = (src * 7919 + dst * 104729 + size * 31 + salt * 13) % len(_BLOCK)
    return np.resize(np.roll(_BLOCK, -shift), size)


def _child(conn, rank, size, root, job, body, kw, before):
    out = None
    try:
        if before is not None:
            before(rank)
        t = ShmTransport(rank, list(range(size)), FileStore(root), job, 10.0, **kw)
        try:
            out = ("ok", body(t, rank, size))
        finally:
            t.close()
    except BaseException as exc:  # noqa: BLE001 - everything goes back to the test
        out = ("err", f"{type(exc).__name__}: {exc}", traceback.format_exc())
    conn.send_bytes(pickle.dumps(out))
    conn.close()
    os._exit(0)


def run_ranks(body, size: int, tmp_path, *, timeout: float = 30.0, expect_errors=(),
              before=None, **kw):
    """Run ``body(transport, rank, size)`` on ``size`` forked ranks and return
    (results, job). A rank that dies is reported to the others by the store
    key "dead/<rank>". Ranks in ``expect_errors`` may fail: their result is
    the error text, or the exit code of a rank that died."""
    job = uuid.uuid4().hex[:10]
    root = str(tmp_path / f"store-{job}")
    os.mkdir(root)
    store = FileStore(root)
    procs, conns = start_ranks(CTX, size, lambda rank, conn: (
        _child, (conn, rank, size, root, job, body, kw, before)))
    results: list = [None] * size
    pending = set(range(size))
    deadline = time.monotonic() + timeout
    try:
        while pending:
            if time.monotonic() > deadline:
                raise AssertionError(f"ranks {sorted(pending)} still running after {timeout}s")
            for conn in mp.connection.wait([conns[r] for r in pending], timeout=0.05):
                rank = conns.index(conn)
                try:
                    results[rank] = pickle.loads(conn.recv_bytes())
                except EOFError:
                    procs[rank].join(timeout=5)
                    results[rank] = ("died", procs[rank].exitcode)
                    store.set(f"dead/{rank}", b"1")
                pending.discard(rank)
    finally:
        reap(procs, conns, join_timeout=10)
    assert not any(p.is_alive() for p in procs)
    assert leftovers(job) == []
    failures = [f"--- rank {r} ---\n{res}" for r, res in enumerate(results)
                if res[0] != "ok" and r not in expect_errors]
    assert not failures, "\n".join(str(f) for f in failures)
    return [res[1] for res in results], job


@pytest.fixture
def local():
    """Build ShmTransports of one process (``local(n, **kw)``); closed after."""
    made: list[tuple[str, list[ShmTransport]]] = []

    def build(n: int = 2, **kw) -> list[ShmTransport]:
        job = uuid.uuid4().hex[:10]
        store, ts, errors = DictStore(), [None] * n, []

        def make(rank):
            try:
                ts[rank] = ShmTransport(rank, list(range(n)), store, job, 10.0, **kw)
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)

        threads = [threading.Thread(target=make, args=(r,)) for r in range(n)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(timeout=20)
        made.append((job, [t for t in ts if t is not None]))
        if errors:
            raise errors[0]
        return ts

    yield build
    for job, ts in made:
        for t in ts:
            t.close()
        assert leftovers(job) == []


def drive(ts, reqs, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not all(r.finished for r in reqs):
        for t in ts:
            t.progress()
        assert time.monotonic() < deadline, f"still pending: {reqs}"


def mv(a) -> memoryview:
    return memoryview(a).cast("B")


# ---- messages between processes ----

SIZES_SMALL = [0, 1, 7, 4095, 4096, 4097, 5 * 4096 + 3, 1 << 20]
SIZES_DEFAULT = [0, 1, 7, S - 1, S, S + 1, 5 * S + 3, 64 << 20]


@pytest.mark.parametrize("size, geometry, env", [
    (2, SMALL, {}),
    (3, {}, {}),
    (4, {}, {}),
    (3, SMALL, {"COLLIE_SHM_MEMFD": "0"}),  # the /dev/shm file path
], ids=["2-small", "3-default", "4-default", "3-small-file"])
def test_message_sizes(tmp_path, size, geometry, env):
    sizes = SIZES_SMALL if geometry else SIZES_DEFAULT

    def body(t, rank, n):
        assert t.memfd == (env.get("COLLIE_SHM_MEMFD") != "0")
        peers = [p for p in range(n) if p != rank]
        sends = [t.isend(p, 1, mv(payload(rank, p, nb))) for p in peers for nb in sizes]
        got = {(p, nb): np.full(nb, 0xEE, np.uint8) for p in peers for nb in sizes}
        recvs = [t.irecv(p, 1, mv(got[p, nb])) for p in peers for nb in sizes]  # FIFO on one tag
        wait_all(t, sends + recvs, timeout=60)
        check_ok(sends + recvs)
        for (p, nb), arr in got.items():
            assert np.array_equal(arr, payload(p, rank, nb)), (p, nb)
        return True

    results, _ = run_ranks(body, size, tmp_path, timeout=90, before=lambda r: os.environ.update(env),
                           **geometry)
    assert results == [True] * size


def test_both_send_64mib_before_receiving(tmp_path):
    nbytes = 64 << 20

    def body(t, rank, n):
        peer = 1 - rank
        send = t.isend(peer, 3, mv(payload(rank, peer, nbytes)))
        assert not send.finished  # it cannot fit in the ring: isend did not block
        dst = np.empty(nbytes, np.uint8)
        recv = t.irecv(peer, 3, mv(dst))
        wait_all(t, [send, recv], timeout=40)
        check_ok([send, recv])
        return bool(np.array_equal(dst, payload(peer, rank, nbytes)))

    assert run_ranks(body, 2, tmp_path)[0] == [True, True]


def test_tags_posted_in_reverse_order(tmp_path):
    tags = [11, 12, 13, 14]
    nbytes = 3 * 4096 + 5  # several fragments each, more than the ring holds in all

    def body(t, rank, n):
        if rank == 0:
            sends = [t.isend(1, tag, mv(payload(0, 1, nbytes, salt=tag * 10 + k)))
                     for k in range(2) for tag in tags]
            wait_all(t, sends)
            check_ok(sends)
            return True
        got = {(tag, k): np.zeros(nbytes, np.uint8) for tag in tags for k in range(2)}
        # The last tag first: every message before its two is copied out of
        # the way (two per tag), then the others, in reverse order of tags.
        recvs = [t.irecv(0, tags[-1], mv(got[tags[-1], k])) for k in range(2)]
        wait_all(t, recvs)
        assert len(t._in[0].unexpected) == 2 * (len(tags) - 1)
        recvs += [t.irecv(0, tag, mv(got[tag, k])) for tag in reversed(tags[:-1]) for k in range(2)]
        wait_all(t, recvs)
        check_ok(recvs)
        return all(np.array_equal(a, payload(0, 1, nbytes, salt=tag * 10 + k)) for (tag, k), a in got.items())

    assert run_ranks(body, 2, tmp_path, **SMALL)[0] == [True, True]


def test_combine_gets_aligned_pieces(tmp_path):
    count = 3 * 512 + 3  # float64: three full 4 KiB slots and a partial one

    def body(t, rank, n):
        peers = [p for p in range(n) if p != rank]
        mine = np.arange(count, dtype=np.float64) * (rank + 1)
        tens = mine * 10
        # Tag 6 first, but received last: it is copied out of the way, and its
        # combine reads the unexpected buffer; tag 5 is combined from the slots.
        sends = [t.isend(p, tag, mv(arr)) for p in peers for tag, arr in ((6, tens), (5, mine))]
        acc5, acc6 = mine.copy(), tens.copy()
        seen = []

        def adder(acc):
            def add(dst_piece, src_piece):
                d = np.frombuffer(dst_piece, np.float64)
                s = np.frombuffer(src_piece, np.float64)
                seen.append((d.ctypes.data - acc.ctypes.data, s.ctypes.data % 16))
                np.add(d, s, out=d)
            return add

        recvs = [t.irecv(p, 5, mv(acc5), combine=adder(acc5)) for p in reversed(peers)]
        wait_all(t, recvs)
        assert len(t._in[peers[0]].unexpected) == 1
        recvs += [t.irecv(p, 6, mv(acc6), combine=adder(acc6)) for p in peers]
        wait_all(t, sends + recvs)
        check_ok(sends + recvs)
        assert len(seen) > 2 * len(peers)
        assert all(offset % 16 == 0 and misalign == 0 for offset, misalign in seen), seen
        total = sum(range(1, n + 1))
        return bool(np.array_equal(acc5, np.arange(count) * total)
                    and np.array_equal(acc6, np.arange(count) * total * 10))

    assert run_ranks(body, 3, tmp_path, **SMALL)[0] == [True] * 3


def test_mismatch_consumes_message_and_spares_the_sender(tmp_path):
    def body(t, rank, n):
        big = 6 * 4096 + 1  # more than the ring holds: the sender needs the receiver to drain it
        if rank == 0:
            sends = [t.isend(1, 2, mv(payload(0, 1, 100)), meta=5),
                     t.isend(1, 2, mv(payload(0, 1, big)), meta=6),
                     t.isend(1, 2, mv(payload(0, 1, big)), meta=7),
                     t.isend(1, 2, mv(payload(0, 1, 33)), meta=8)]
            wait_all(t, sends)
            check_ok(sends)
            return True
        bufs = [np.full(99, 7, np.uint8), np.full(big, 7, np.uint8),
                np.full(big, 7, np.uint8), np.zeros(33, np.uint8)]
        recvs = [t.irecv(0, 2, mv(bufs[0]), meta=5),   # size differs
                 t.irecv(0, 2, mv(bufs[1]), meta=99),  # meta differs (several fragments)
                 t.irecv(0, 2, mv(bufs[2]), meta=None),  # meta not checked: fine
                 t.irecv(0, 2, mv(bufs[3]), meta=8)]
        wait_all(t, recvs)
        e0, e1 = recvs[0].error, recvs[1].error
        assert isinstance(e0, MessageMismatch) and (e0.nbytes, e0.expected_nbytes) == (100, 99)
        assert isinstance(e1, MessageMismatch) and (e1.meta, e1.expected_meta) == (6, 99)
        assert (bufs[0] == 7).all() and (bufs[1] == 7).all()  # left unchanged
        check_ok(recvs[2:])
        assert np.array_equal(bufs[2], payload(0, 1, big))
        assert np.array_equal(bufs[3], payload(0, 1, 33))
        return True

    assert run_ranks(body, 2, tmp_path, **SMALL)[0] == [True, True]


def test_doorbell_wakes_a_sleeping_reader_and_writer(tmp_path):
    """A reader asleep on its doorbell wakes when a message arrives; a writer
    asleep on a full ring wakes when the reader makes room. Each side says
    in the store that it sleeps from within its last look, once it counts as
    a sleeper, and finds nothing there: only the peer's wake() can wake it."""
    nbytes = 16 * 4096  # four times what the ring holds

    def asleep(store, key):
        def look():
            store.set(key, b"1")
            return False
        return look

    def body(t, rank, n):
        store = FileStore(str(tmp_path / f"store-{t.job_id}"))
        if rank == 0:
            store.get("reader-asleep")
            send = t.isend(1, 4, mv(payload(0, 1, nbytes)))
            while t.progress():
                pass
            assert not t.progress() and not send.finished  # the ring is full
            woke = t.doorbell.sleep(10, asleep(store, "writer-asleep"))
            wait_all(t, [send])
            check_ok([send])
            return woke
        dst = np.zeros(nbytes, np.uint8)
        recv = t.irecv(0, 4, mv(dst))
        t.progress()
        woke = t.doorbell.sleep(10, asleep(store, "reader-asleep"))
        store.get("writer-asleep")
        wait_all(t, [recv])
        check_ok([recv])
        assert np.array_equal(dst, payload(0, 1, nbytes))
        return woke

    assert run_ranks(body, 2, tmp_path, **SMALL)[0] == [True, True]


def test_wake_rings_only_a_sleeper():
    """wake() rings the semaphore only while the owner counts as a sleeper:
    messages sent to a rank that polls leave no rings to drain later."""
    memory = mmap.mmap(-1, Doorbell.RESERVED)
    owner = Doorbell(memory, 0, create=True)
    peer = Doorbell(memory, 0, create=False)  # how a peer attaches to the owner's doorbell
    for _ in range(1000):
        peer.wake()
    assert not owner.wait(0)  # nobody slept: nothing was counted

    looked = threading.Event()

    def look():
        looked.set()
        return False

    woken = []
    sleeper = threading.Thread(target=lambda: woken.append(owner.sleep(10, look)))
    sleeper.start()
    assert looked.wait(10)
    peer.wake()  # the owner counts as a sleeper from before its last look
    sleeper.join(10)
    assert woken == [True]
    assert owner.sleep(0.01, lambda: False) is False  # one wake, one ring: none left over
    assert owner.sleep(10, lambda: True) is True      # work found in the last look: no sleep


# ---- /dev/shm hygiene and deaths ----

def _barrier(t, rank, n, tag=99):
    """Every rank reaches this point (so every rank finished its setup)."""
    peers = [p for p in range(n) if p != rank]
    one = np.zeros(1, np.uint8)
    reqs = [t.isend(p, tag, mv(one)) for p in peers]
    reqs += [t.irecv(p, tag, mv(np.zeros(1, np.uint8))) for p in peers]
    wait_all(t, reqs)
    check_ok(reqs)


@pytest.mark.parametrize("memfd", [True, False], ids=["memfd", "file"])
def test_sigkill_of_a_rank_leaves_nothing(tmp_path, memfd):
    nbytes = 8 << 20

    def body(t, rank, n):
        _barrier(t, rank, n)
        assert leftovers(t.job_id) == []  # no name once setup is over
        if rank == 2:
            # Posted, then killed: single copy leaves it for rank 0 to read
            # out of this process's memory; the rings, partly written.
            t.isend(0, 1, mv(payload(2, 0, nbytes)))
            os.kill(os.getpid(), signal.SIGKILL)
        store = FileStore(str(tmp_path / f"store-{t.job_id}"))
        dst = np.zeros(nbytes, np.uint8)
        recv = t.irecv(2, 1, mv(dst))
        send = t.isend(2, 1, mv(payload(rank, 2, nbytes)))

        def notice_death():
            if store.check("dead/2") and not (recv.finished and send.finished):
                t.fail_peer(2, PeerError("rank 2 died", 2))

        wait_all(t, [recv, send], on_idle=notice_death)
        assert isinstance(send.error, PeerError)  # rank 2 never read it
        if rank == 0 and recv.error is None:
            # Rank 2's message was posted whole before the kill, and rank 0
            # read it from the dying process's memory first: it is intact.
            assert np.array_equal(dst, payload(2, 0, nbytes))
        else:
            assert isinstance(recv.error, PeerError)
        assert isinstance(t.irecv(2, 1, mv(dst)).error, PeerError)  # later requests fail at once
        _barrier(t, rank, 2, tag=98)  # ranks 0 and 1 still talk
        return True

    results, _ = run_ranks(body, 3, tmp_path, expect_errors=(2,), memfd=memfd)
    assert results[:2] == [True, True] and results[2] == -signal.SIGKILL


def test_exception_in_a_rank_leaves_nothing(tmp_path):
    def body(t, rank, n):
        _barrier(t, rank, n)
        if rank == 1:
            raise RuntimeError("boom")
        return True

    results, _ = run_ranks(body, 2, tmp_path, expect_errors=(1,), memfd=False)
    assert results[0] is True and "boom" in results[1]


def test_setup_failure_removes_the_file():
    job = uuid.uuid4().hex[:10]
    with pytest.raises(TimeoutError):  # rank 1 never comes
        ShmTransport(0, [0, 1], DictStore(), job, 0.3, memfd=False)
    assert leftovers(job) == []


def test_peer_that_cannot_open_a_memfd_gets_a_file(tmp_path):
    def before(rank):
        if rank == 1:
            def refuse(pid, fd):
                raise PermissionError(13, "not allowed here")
            segment.open_memfd = refuse

    def body(t, rank, n):
        _barrier(t, rank, n)
        assert leftovers(t.job_id) == []
        return t.memfd

    # Ranks 0 and 2 switch to files (rank 1 cannot open theirs); rank 1 keeps its memfd.
    assert run_ranks(body, 3, tmp_path, before=before)[0] == [False, True, False]


# ---- orderings forced by hand, in one process ----

def test_receive_claims_a_message_while_it_is_copied_out(local):
    a, b = local(2, slots=2, slot_bytes=64)
    first, second = payload(0, 1, 640), payload(0, 1, 10, salt=1)
    sends = [a.isend(1, 7, mv(first)), a.isend(1, 8, mv(second))]
    got2 = np.zeros(10, np.uint8)
    r2 = b.irecv(0, 8, mv(got2))  # tag 7 is in the way: it gets copied out
    for _ in range(3):
        a.progress()
        b.progress()
    assert b._in[0].current is not None and b._in[0].current.buf is not None  # half copied out
    got1 = np.zeros(640, np.uint8)
    r1 = b.irecv(0, 7, mv(got1))
    drive([a, b], sends + [r1, r2])
    check_ok(sends + [r1, r2])
    assert np.array_equal(got1, first) and np.array_equal(got2, second)


def test_receive_of_a_waiting_message_completes_as_it_is_posted(local):
    """The message at the head of the ring, whole in one slot, is taken by
    irecv itself (no progress pass); anything else waits for progress."""
    a, b = local(2, slots=4, slot_bytes=64)
    x = np.arange(4, dtype=np.float32)
    a.isend(1, 1, mv(x))
    a.isend(1, 2, mv(payload(0, 1, 10)))
    a.isend(1, 3, mv(payload(0, 1, 100)))  # two slots
    acc = np.ones(4, np.float32)

    def add(dst, src):
        d = np.frombuffer(dst, np.float32)
        np.add(d, np.frombuffer(src, np.float32), out=d)

    r1 = b.irecv(0, 1, mv(acc), combine=add)
    assert r1.done and np.array_equal(acc, x + 1) and b._in[0].tail == 1
    got3 = np.zeros(100, np.uint8)
    r3 = b.irecv(0, 3, mv(got3))  # tag 2 is in the way
    assert not r3.done
    got2 = np.zeros(10, np.uint8)
    r2 = b.irecv(0, 2, mv(got2))
    drive([a, b], [r2, r3])
    check_ok([r2, r3])
    assert np.array_equal(got2, payload(0, 1, 10)) and np.array_equal(got3, payload(0, 1, 100))
    a.isend(1, 4, mv(payload(0, 1, 100)))
    r4 = b.irecv(0, 4, mv(np.zeros(100, np.uint8)))  # several slots: progress reads it
    assert not r4.done
    drive([a, b], [r4])
    check_ok([r4])


def test_claimed_message_that_mismatches_is_dropped(local):
    a, b = local(2, slots=2, slot_bytes=64)
    sends = [a.isend(1, 7, mv(payload(0, 1, 640))), a.isend(1, 8, mv(payload(0, 1, 5))),
             a.isend(1, 7, mv(payload(0, 1, 3)))]
    r8 = b.irecv(0, 8, mv(np.zeros(5, np.uint8)))
    for _ in range(3):
        a.progress()
        b.progress()
    bad = np.full(640, 9, np.uint8)
    r_bad = b.irecv(0, 7, mv(bad), meta=1)  # the message has meta 0
    r_ok = b.irecv(0, 7, mv(np.zeros(3, np.uint8)))
    drive([a, b], sends + [r8, r_bad, r_ok])
    check_ok(sends + [r8, r_ok])
    assert isinstance(r_bad.error, MessageMismatch) and (bad == 9).all()


def test_probe(local):
    a, b = local(2, slots=2, slot_bytes=64)
    assert b.probe(0, 1) is None
    sends = [a.isend(1, 1, mv(payload(0, 1, 300))), a.isend(1, 2, mv(payload(0, 1, 17)))]
    assert b.probe(0, 1) == 300  # at the head of the ring
    assert b.probe(0, 3) is None
    # Tag 2 is behind tag 1: probing for it asks progress to move tag 1 aside.
    deadline = time.monotonic() + 10
    while b.probe(0, 2) is None:
        a.progress()
        b.progress()
        assert time.monotonic() < deadline
    assert b.probe(0, 2) == 17 and b.probe(0, 1) == 300  # tag 1 now waits in an unexpected buffer
    got1, got2 = np.zeros(300, np.uint8), np.zeros(17, np.uint8)
    reqs = [b.irecv(0, 2, mv(got2)), b.irecv(0, 1, mv(got1))]
    drive([a, b], sends + reqs)
    check_ok(sends + reqs)
    assert np.array_equal(got1, payload(0, 1, 300)) and np.array_equal(got2, payload(0, 1, 17))
    assert b.probe(0, 1) is None and b.probe(0, 2) is None


def test_fail_peer(local):
    a, b, c = local(3, slots=2, slot_bytes=64)
    send = a.isend(1, 1, mv(payload(0, 1, 1000)))  # more than the ring: stays queued
    recv = a.irecv(1, 1, mv(np.zeros(4, np.uint8)))
    other = a.irecv(2, 1, mv(np.zeros(4, np.uint8)))
    a.progress()
    err = PeerError("rank 1 died", 1)
    a.fail_peer(1, err)
    assert send.error is err and recv.error is err and other.error is None
    assert a.isend(1, 1, mv(b"x")).error is err and a.irecv(1, 2, mv(bytearray(1))).error is err
    assert a.probe(1, 1) is None
    c.isend(0, 1, mv(b"abcd"))
    drive([a, c], [other])
    check_ok([other])


def test_zero_peers_and_bad_arguments(local):
    (alone,) = local(1)
    assert alone.progress() is False
    with pytest.raises(ValueError):
        alone.isend(1, 0, mv(b"x"))
    a, b = local(2)
    with pytest.raises(ValueError):
        a.irecv(0, 0, mv(bytearray(1)))  # itself
    pending = a.irecv(1, 0, mv(bytearray(1)))
    a.close()
    a.close()  # idempotent
    assert isinstance(pending.error, CollieError)
    with pytest.raises(CollieError):
        a.isend(1, 0, mv(b"x"))
    with pytest.raises(ValueError):
        local(2, slot_bytes=100)


def test_geometry_from_environment(local, monkeypatch):
    monkeypatch.setenv("COLLIE_SHM_SLOTS", "3")
    monkeypatch.setenv("COLLIE_SHM_SLOT_BYTES", "128")
    a, b = local(2)
    assert (a.slots, a.slot_bytes) == (3, 128)
    data = payload(0, 1, 1000)
    got = np.zeros(1000, np.uint8)
    reqs = [a.isend(1, 0, mv(data), meta=(1 << 64) - 1), b.irecv(0, 0, mv(got), meta=-1)]
    drive([a, b], reqs)
    check_ok(reqs)
    assert np.array_equal(got, data)
    assert isinstance(reqs[0], Request)


@pytest.mark.parametrize("cma_bytes", [0, 64], ids=["ring", "single-copy"])
@pytest.mark.parametrize("seed", range(6))
def test_random_orders_of_tags_sizes_and_receives(local, seed, cma_bytes):
    """Messages of random tags and sizes; receives posted in a random order
    that keeps each tag's order, a few at a time, with probes in between.
    With cma_bytes=64, messages of 64 bytes or more go single copy."""
    rng = np.random.default_rng(seed)
    a, b = local(2, slots=int(rng.integers(1, 4)), slot_bytes=64, cma_bytes=cma_bytes)
    tags = rng.integers(1, 4, 40)
    sizes = rng.choice([0, 1, 63, 64, 65, 200, 1000], 40)
    sends = [a.isend(1, int(tag), mv(payload(0, 1, int(n), salt=i)))
             for i, (tag, n) in enumerate(zip(tags, sizes))]
    order = list(range(40))
    rng.shuffle(order)
    by_tag = {int(t): [i for i in range(40) if tags[i] == t] for t in set(tags)}
    order = [by_tag[int(tags[i])].pop(0) for i in order]  # random across tags, FIFO within a tag
    got = {i: np.zeros(int(sizes[i]), np.uint8) for i in range(40)}
    recvs = []
    while order:
        batch = order[:int(rng.integers(1, 5))]
        order = order[len(batch):]
        recvs += [b.irecv(0, int(tags[i]), mv(got[i])) for i in batch]
        for _ in range(int(rng.integers(0, 4))):
            a.progress()
            b.progress()
        b.probe(0, int(rng.integers(1, 4)))
    drive([a, b], sends + recvs)
    check_ok(sends + recvs)
    for i in range(40):
        assert np.array_equal(got[i], payload(0, 1, int(sizes[i]), salt=i)), i


@pytest.mark.parametrize("cma_bytes", [0, 64], ids=["ring", "single-copy"])
def test_combine_that_raises_fails_only_its_receive(local, cma_bytes):
    a, b = local(2, slots=2, slot_bytes=64, cma_bytes=cma_bytes)

    def broken(dst, src):
        raise TypeError("cannot combine")

    sends = [a.isend(1, 1, mv(payload(0, 1, n))) for n in (8, 300, 5)]
    r1 = b.irecv(0, 1, mv(np.zeros(8, np.uint8)), combine=broken)     # whole in one slot
    r2 = b.irecv(0, 1, mv(np.zeros(300, np.uint8)), combine=broken)   # several fragments
    got = np.zeros(5, np.uint8)
    r3 = b.irecv(0, 1, mv(got))
    drive([a, b], sends + [r1, r2, r3])
    check_ok(sends + [r3])
    assert isinstance(r1.error, TypeError) and isinstance(r2.error, TypeError)
    assert np.array_equal(got, payload(0, 1, 5))


# ---- single copy (process_vm_readv) ----

def test_address_of_writable_read_only_and_empty_buffers():
    """Where a single-copy message's bytes start, however the buffer came."""
    from collie.transports import cma
    arr = np.arange(64, dtype=np.float32)
    frozen = arr.copy()
    frozen.flags.writeable = False
    assert cma.address(mv(arr)) == arr.ctypes.data
    assert cma.address(mv(arr)[12:]) == arr.ctypes.data + 12
    assert cma.address(mv(frozen)[8:]) == frozen.ctypes.data + 8  # read-only: NumPy's way
    assert cma.address(memoryview(arr)) == arr.ctypes.data          # any format
    assert cma.address(mv(arr)[:0]) == 0



@pytest.mark.parametrize("way", ["core", "ctypes"])
def test_single_copy_reads_and_writes_and_names_what_failed(monkeypatch, way):
    """cma.read/write through the compiled core's one call, or through ctypes
    where the core is not built: the same bytes, and an OSError with the
    errno of what went wrong (ESRCH: the process is gone)."""
    import errno
    from collie.transports import cma
    if way == "core" and cma._core is None:
        pytest.skip("the compiled core is not built")
    if way == "ctypes":
        monkeypatch.setattr(cma, "_core", None)
    src, dst = np.arange(100_000, dtype=np.uint8) * 3, np.zeros(100_000, np.uint8)
    cma.read(os.getpid(), mv(dst), cma.address(mv(src)))
    assert np.array_equal(dst, src)
    back = np.zeros(5000, np.uint8)
    cma.write(os.getpid(), cma.address(mv(back)), mv(src)[:5000])
    assert np.array_equal(back, src[:5000])
    child = os.fork()
    if child == 0:
        os._exit(0)
    os.waitpid(child, 0)  # a pid that names no process now
    with pytest.raises(OSError) as info:
        cma.read(child, mv(dst), cma.address(mv(src)))
    assert info.value.errno == errno.ESRCH


def test_single_copy_between_processes(tmp_path):
    """Messages from cma_bytes up are read straight from the sender's memory:
    whole, in chunks for a combining receive, and a mismatch spares the sender."""
    count = 3 * shm._CMA_CHUNK // 8 + 5  # float64: a combine over several chunks

    def body(t, rank, n):
        peers = [p for p in range(n) if p != rank]
        assert t.single_copy_peers() == peers
        sizes = [4095, 4096, 1 << 20]  # below the threshold (the ring), at it, above it
        mine = np.arange(count, dtype=np.float64) * (rank + 1)
        sends = [t.isend(p, 1, mv(payload(rank, p, nb))) for p in peers for nb in sizes]
        sends += [t.isend(p, 2, mv(mine)) for p in peers]
        sends += [t.isend(p, 3, mv(payload(rank, p, 5000)), meta=7) for p in peers]
        got = {(p, nb): np.zeros(nb, np.uint8) for p in peers for nb in sizes}
        recvs = [t.irecv(p, 1, mv(got[p, nb])) for p in peers for nb in sizes]
        acc = mine.copy()

        def add(dst, src):
            d = np.frombuffer(dst, np.float64)
            np.add(d, np.frombuffer(src, np.float64), out=d)

        recvs += [t.irecv(p, 2, mv(acc), combine=add) for p in peers]
        untouched = np.full(5000, 9, np.uint8)
        bad = [t.irecv(p, 3, mv(untouched), meta=8) for p in peers]
        wait_all(t, sends + recvs + bad)
        check_ok(sends + recvs)
        assert all(isinstance(r.error, MessageMismatch) for r in bad) and (untouched == 9).all()
        for (p, nb), arr in got.items():
            assert np.array_equal(arr, payload(p, rank, nb)), (p, nb)
        return bool(np.array_equal(acc, np.arange(count) * sum(range(1, n + 1))))

    assert run_ranks(body, 3, tmp_path, cma_bytes=4096, **SMALL)[0] == [True] * 3


def test_single_copy_sends_in_flight_are_capped_by_the_acknowledgement_words(local):
    a, b = local(2, slots=2, slot_bytes=64, cma_bytes=1)
    n = 3 * ring.ACKS
    data = [payload(0, 1, 8, salt=i) for i in range(n)]
    sends = [a.isend(1, i, mv(data[i])) for i in range(n)]  # one tag each
    got = [np.zeros(8, np.uint8) for _ in range(n)]
    recvs = []
    for i in reversed(range(n)):  # the last first: every other one is set aside, then acknowledged out of order
        recvs.append(b.irecv(0, i, mv(got[i])))
        a.progress()
        b.progress()
        assert len(a._out[1].pending) <= ring.ACKS
    drive([a, b], sends + recvs)
    check_ok(sends + recvs)
    assert all(np.array_equal(got[i], data[i]) for i in range(n))
    assert not a._out[1].pending and not b._in[0].posted


def test_single_copy_message_already_waiting_is_read_as_the_receive_is_posted(local):
    """A receive posted after its single-copy message came reads it inside
    irecv and acknowledges it; one whose size differs fails there, and the
    sender is still released."""
    a, b = local(2, cma_bytes=64)
    data = payload(0, 1, 1000)
    first, second = a.isend(1, 1, mv(data)), a.isend(1, 2, mv(data))
    got = np.zeros(1000, np.uint8)
    ok = b.irecv(0, 1, mv(got))
    assert ok.done and np.array_equal(got, data) and not b._in[0].busy  # no pass of progress needed
    bad = b.irecv(0, 2, mv(np.zeros(999, np.uint8)))
    assert isinstance(bad.error, MessageMismatch)
    a.progress()
    assert first.done and second.done and not a._out[1].pending


def test_single_copy_send_fails_with_its_peer(local):
    a, b = local(2, cma_bytes=64)
    send = a.isend(1, 1, mv(payload(0, 1, 1000)))
    a.progress()
    assert a._out[1].pending and not send.finished  # announced, waiting for rank 1 to read it
    err = PeerError("rank 1 died", 1)
    a.fail_peer(1, err)
    assert send.error is err and not a._out[1].pending


def test_single_copy_can_be_turned_off(local, monkeypatch):
    monkeypatch.setenv("COLLIE_SHM_CMA_BYTES", "0")
    a, b = local(2)
    assert a.single_copy_peers() == [] and b.single_copy_peers() == []
    data, got = payload(0, 1, 1 << 20), np.zeros(1 << 20, np.uint8)
    reqs = [a.isend(1, 0, mv(data)), b.irecv(0, 0, mv(got))]
    drive([a, b], reqs)
    check_ok(reqs)
    assert np.array_equal(got, data)
    monkeypatch.setenv("COLLIE_SHM_CMA_BYTES", "-1")
    with pytest.raises(ValueError, match="COLLIE_SHM_CMA_BYTES"):
        local(2)


def test_single_copy_starts_lower_where_ranks_share_cores(local, monkeypatch):
    """The threshold: 2 MiB where each rank has a core, 1 MiB where ranks
    share cores (the Network says which); the variable sets both."""
    from collie.transports import shm
    monkeypatch.delenv("COLLIE_SHM_CMA_BYTES", raising=False)
    assert [t.cma_bytes for t in local(2)] == [shm.DEFAULT_CMA_BYTES] * 2 == [2 << 20] * 2
    assert [t.cma_bytes for t in local(2, crowded=True)] == [shm.CROWDED_CMA_BYTES] * 2 == [1 << 20] * 2
    monkeypatch.setenv("COLLIE_SHM_CMA_BYTES", "4096")
    assert [t.cma_bytes for t in local(2, crowded=True)] == [4096, 4096]


def test_yama_scope_one_lets_same_user_processes_read(tmp_path, monkeypatch):
    from collie.transports import cma
    calls = []

    class FakeLibc:
        def prctl(self, option, arg, *rest):
            calls.append((option, arg.value))
            return 0

    monkeypatch.setattr(cma.ctypes, "CDLL", lambda *a, **k: FakeLibc())
    scope = tmp_path / "ptrace_scope"
    for value, expect in (("0", False), ("2", False), ("1", True)):
        scope.write_text(value + "\n")
        assert cma.allow_readers(str(scope)) is expect
    assert cma.allow_readers(str(tmp_path / "absent")) is False  # no Yama
    assert calls == [(0x59616D61, (1 << 64) - 1)]  # PR_SET_PTRACER, PR_SET_PTRACER_ANY


def test_large_one_way_messages_share_the_copy_with_the_waiting_sender(tmp_path):
    """The reader offers the second half; a sender waiting on its send takes it."""
    nbytes = 3 << 20

    def body(t, rank, n):
        for k in range(20):
            if rank == 0:
                send = t.isend(1, k, mv(payload(0, 1, nbytes, salt=k)))
                wait_all(t, [send])
                check_ok([send])
            else:
                got = np.zeros(nbytes, np.uint8)
                recv = t.irecv(0, k, mv(got))
                wait_all(t, [recv])
                check_ok([recv])
                assert np.array_equal(got, payload(0, 1, nbytes, salt=k)), k
        _barrier(t, rank, n)
        return t.shared_copies

    helped, _ = run_ranks(body, 2, tmp_path, cma_bytes=256 << 10)[0], None
    assert helped[0] > 0 and helped[1] == 0, helped


@pytest.mark.parametrize("write_fails", [False, True], ids=["writer-copies", "writer-fails"])
def test_shared_copy_when_the_writer_takes_the_offer(local, monkeypatch, write_fails):
    from collie.transports import cma
    a, b = local(2, cma_bytes=64)
    data, got = payload(0, 1, 1000), np.zeros(1000, np.uint8)
    send = a.isend(1, 1, mv(data))
    read = cma.read

    def reader_while_writer_runs(pid, dst, address, registered=()):
        a.progress()  # the writer looks while the reader copies its half
        read(pid, dst, address, registered)

    monkeypatch.setattr(cma, "read", reader_while_writer_runs)
    if write_fails:
        def broken(*args):
            raise OSError(14, "Bad address")
        monkeypatch.setattr(cma, "write", broken)
    recv = b.irecv(0, 1, mv(got))  # its message waits: read at once, with an offer
    assert len(b._in[0].shared) == 1 and not recv.finished  # the writer took the second half
    drive([a, b], [send, recv])
    check_ok([send, recv])
    assert np.array_equal(got, data)
    assert a.shared_copies == (0 if write_fails else 1)


def test_no_shared_copy_offered_in_an_exchange(local):
    """Two single-copy messages crossing: each reader reads all of its own,
    since its writer is busy reading the other one (no offer is made)."""
    a, b = local(2, cma_bytes=64)
    data_a, data_b = payload(0, 1, 1000), payload(1, 0, 1000)
    got_a, got_b = np.zeros(1000, np.uint8), np.zeros(1000, np.uint8)
    reqs = [a.isend(1, 1, mv(data_a)), b.isend(0, 1, mv(data_b))]
    recv_b = b.irecv(0, 1, mv(got_b))
    b.progress()
    assert recv_b.finished and not b._in[0].shared  # read whole, at once
    assert b._in[0].ring.offer[0] == 0  # no offer was put up
    reqs += [recv_b, a.irecv(1, 1, mv(got_a))]
    drive([a, b], reqs)
    check_ok(reqs)
    assert np.array_equal(got_a, data_b) and np.array_equal(got_b, data_a)
    assert a.shared_copies == b.shared_copies == 0


def test_shared_copy_from_a_writer_that_dies_is_a_peer_error(local, monkeypatch):
    """The writer could not write its half and is gone when the reader reads
    it instead: the receive fails with PeerError naming the writer."""
    import errno
    from collie.transports import cma
    a, b = local(2, cma_bytes=64)
    send = a.isend(1, 1, mv(payload(0, 1, 1000)))
    read = cma.read
    calls = []

    def read_then_writer_dies(pid, dst, address, registered=()):
        calls.append(address)
        if len(calls) == 1:
            a.progress()  # the writer takes the offer, and fails to write
            return read(pid, dst, address, registered)
        raise OSError(errno.ESRCH, "No such process")

    def broken(*args):
        raise OSError(errno.EFAULT, "Bad address")

    monkeypatch.setattr(cma, "read", read_then_writer_dies)
    monkeypatch.setattr(cma, "write", broken)
    recv = b.irecv(0, 1, mv(np.zeros(1000, np.uint8)))
    b.progress()
    while not recv.finished:
        b.progress()
    assert isinstance(recv.error, PeerError) and recv.error.peer == 0 and "rank 0 died" in str(recv.error)
    assert len(calls) == 2


def test_shared_copy_fails_with_its_peer(local, monkeypatch):
    from collie.transports import cma
    a, b = local(2, cma_bytes=64)
    send = a.isend(1, 1, mv(payload(0, 1, 1000)))
    read = cma.read
    monkeypatch.setattr(cma, "read", lambda pid, dst, address, registered=(): (a.progress(),
                                                                                read(pid, dst, address, registered)))
    recv = b.irecv(0, 1, mv(np.zeros(1000, np.uint8)))  # read at once, with an offer
    assert len(b._in[0].shared) == 1 and not recv.finished  # waiting for the writer's half
    err = PeerError("rank 0 died", 0)
    b.fail_peer(0, err)
    assert recv.error is err and not b._in[0].shared
    assert not send.finished and a._out[1].pending  # not acknowledged: rank 1 failed it
