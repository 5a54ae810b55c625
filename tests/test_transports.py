"""The transport contract (collie/transports/base.py), checked the same way on
every transport: each test runs on real ranks through the Network, once per
backend. A new transport passes by being added to BACKENDS."""

import numpy as np
import pytest

from harness import run_ranks

BACKENDS = ["shm", "tcp"]
pytestmark = [pytest.mark.timeout(90), pytest.mark.parametrize("backend", BACKENDS)]


def _net():
    import collie.group
    return collie.group.world().network


def _wait(net, reqs):
    net.wait(reqs, timeout=30, describe=lambda: "test")


def _sizes_body(rank, size):
    net = _net()
    sizes = [0, 1, 7, 4096, 256 * 1024 - 1, 256 * 1024, 256 * 1024 + 1, 3 * 1024 * 1024 + 5]
    if rank == 0:
        datas = [np.random.default_rng(n).integers(0, 255, n, dtype=np.uint8) for n in sizes]
        _wait(net, [net.isend(1, 5, memoryview(d)) for d in datas])
        return True
    bufs = [np.zeros(n, dtype=np.uint8) for n in sizes]
    _wait(net, [net.irecv(0, 5, memoryview(b)) for b in bufs])
    return all(np.array_equal(b, np.random.default_rng(n).integers(0, 255, n, dtype=np.uint8))
               for n, b in zip(sizes, bufs))


def test_message_sizes(backend):
    assert all(run_ranks(_sizes_body, 2, backend=backend))


def _order_body(rank, size):
    net = _net()
    if rank == 0:
        msgs = [np.full(10, i, dtype=np.int32) for i in range(20)]
        # two tags interleaved; the receiver posts tag 2 first
        _wait(net, [net.isend(1, 1 + (i % 2), memoryview(m)) for i, m in enumerate(msgs)])
        return None
    odd = [np.zeros(10, dtype=np.int32) for _ in range(10)]
    even = [np.zeros(10, dtype=np.int32) for _ in range(10)]
    reqs = [net.irecv(0, 2, memoryview(b)) for b in odd] + [net.irecv(0, 1, memoryview(b)) for b in even]
    _wait(net, reqs)
    return [int(b[0]) for b in even], [int(b[0]) for b in odd]


def test_fifo_per_tag_and_tags_independent(backend):
    _, (even, odd) = run_ranks(_order_body, 2, backend=backend)
    assert even == list(range(0, 20, 2))
    assert odd == list(range(1, 20, 2))


def _combine_body(rank, size):
    net = _net()
    n = 1_000_003
    if rank == 0:
        _wait(net, [net.isend(1, 3, memoryview(np.arange(n, dtype=np.float64).view(np.uint8)))])
        return True
    dst = np.ones(n, dtype=np.float64)
    pieces = []

    def combine(d, s):
        pieces.append(len(s))
        np.add(np.frombuffer(d, np.float64), np.frombuffer(s, np.float64), out=np.frombuffer(d, np.float64))

    _wait(net, [net.irecv(0, 3, memoryview(dst.view(np.uint8)), combine)])
    return np.array_equal(dst, np.arange(n) + 1.0) and all(p % 16 == 0 for p in pieces[:-1])


def test_combine_reduces_in_place(backend):
    assert all(run_ranks(_combine_body, 2, backend=backend))


def _mismatch_body(rank, size):
    net = _net()
    if rank == 0:
        reqs = [net.isend(1, 4, memoryview(np.zeros(100, np.uint8)), meta=7),
                net.isend(1, 4, memoryview(np.zeros(100, np.uint8)), meta=7),
                net.isend(1, 4, memoryview(np.full(8, 9, np.uint8)), meta=7)]
        _wait(net, reqs)
        return "sent"
    small = np.zeros(50, np.uint8)
    r1 = net.irecv(0, 4, memoryview(small))
    wrong_meta = net.irecv(0, 4, memoryview(np.zeros(100, np.uint8)), meta=8)
    ok = np.zeros(8, np.uint8)
    r3 = net.irecv(0, 4, memoryview(ok), meta=7)
    errors = []
    for r in (r1, wrong_meta):
        try:
            _wait(net, [r])
        except (ValueError, Exception) as exc:
            errors.append(type(exc).__name__)
    _wait(net, [r3])
    return errors, ok.tolist(), int(small.sum())


def test_size_and_meta_mismatch_consume_the_message(backend):
    sent, (errors, ok, untouched) = run_ranks(_mismatch_body, 2, backend=backend)
    assert sent == "sent"
    assert errors == ["ValueError", "MismatchError"]
    assert ok == [9] * 8 and untouched == 0


def _both_ways_body(rank, size):
    net = _net()
    n = 48 << 20
    out = np.full(n, rank + 1, np.uint8)
    into = np.zeros(n, np.uint8)
    s = net.isend(1 - rank, 6, memoryview(out))  # both send first, then receive
    r = net.irecv(1 - rank, 6, memoryview(into))
    _wait(net, [s, r])
    return bool((into == 2 - rank).all())


def test_big_messages_both_ways_at_once(backend):
    assert all(run_ranks(_both_ways_body, 2, backend=backend, timeout=120))


def _any_source_body(rank, size):
    net = _net()
    if rank == 0:
        got = []
        for _ in range(size - 1):
            buf = np.zeros(4, np.int64)
            r = net.irecv(None, 9, memoryview(buf.view(np.uint8)))
            _wait(net, [r])
            got.append((r.peer, int(buf[0])))
        return sorted(got)
    _wait(net, [net.isend(0, 9, memoryview(np.full(4, rank * 10, np.int64).view(np.uint8)))])
    return None


def test_receive_from_any_source(backend):
    assert run_ranks(_any_source_body, 4, backend=backend)[0] == [(1, 10), (2, 20), (3, 30)]


def _probe_body(rank, size):
    import time
    net = _net()
    if rank == 1:
        _wait(net, [net.isend(0, 11, memoryview(np.zeros(12345, np.uint8)))])
        return None
    deadline = time.monotonic() + 10
    while net.probe(1, 11) is None and time.monotonic() < deadline:
        time.sleep(0.001)
    n = net.probe(1, 11)
    buf = np.zeros(n, np.uint8)
    _wait(net, [net.irecv(1, 11, memoryview(buf))])
    return n, net.probe(1, 11)


def test_probe(backend):
    assert run_ranks(_probe_body, 2, backend=backend)[0] == (12345, None)


def _dead_peer_body(rank, size):
    import os
    import time
    net = _net()
    if rank == 1:
        time.sleep(0.3)
        os._exit(3)
    buf = np.zeros(10, np.uint8)
    start = time.monotonic()
    try:
        _wait(net, [net.irecv(1, 1, memoryview(buf))])
    except Exception as exc:
        return type(exc).__name__, getattr(exc, "peer", None), time.monotonic() - start
    return "no error", None, 0


def test_dead_peer_fails_pending_receives_quickly(backend):
    res = run_ranks(_dead_peer_body, 2, backend=backend, expect_errors=True)
    name, peer, elapsed = res[0]
    assert name == "PeerError" and peer == 1
    assert elapsed < 5


def _timeout_body(rank, size):
    import time
    net = _net()
    if rank == 1:
        time.sleep(2.0)
        return None
    start = time.monotonic()
    try:
        net.wait([net.irecv(1, 1, memoryview(np.zeros(1, np.uint8)))], timeout=0.5, describe=lambda: "probe")
    except Exception as exc:
        return type(exc).__name__, list(getattr(exc, "peers", ())), round(time.monotonic() - start, 1)


def test_timeout_names_the_peer(backend):
    name, peers, elapsed = run_ranks(_timeout_body, 2, backend=backend)[0]
    assert name == "CollieTimeout" and peers == [1] and 0.4 <= elapsed < 2.0


def _polling_body(rank, size):
    import os
    from collie import network
    net = _net()
    peer = 1 - rank
    req = net.irecv(peer, 9, memoryview(np.zeros(1, np.uint8)))
    polls = net.polls([req])
    crowded = size > (os.cpu_count() or 1)
    want = min(network.SPIN_SECONDS, network.CROWDED_SPIN_SECONDS) if crowded else network.SPIN_SECONDS
    spin_ok = net.spin_seconds == want  # (before a wait that may adapt it)
    _wait(net, [req, net.isend(peer, 9, memoryview(np.ones(1, np.uint8)))])
    from collie.transports import shm
    single_copy = net.shm is None or net.shm.cma_bytes == (shm.CROWDED_CMA_BYTES if crowded else shm.DEFAULT_CMA_BYTES)
    return polls, net.polls([]), spin_ok, single_copy


def test_waiters_poll_only_on_shared_memory(backend):
    """A waiter polls before it sleeps only when shared memory will bring
    its messages (TCP's receiver threads need the GIL a poller holds), for
    1 ms by default with a core per rank, long enough to outlast a wake-up;
    crowding lowers the single-copy threshold as it shortens the spin."""
    for polls, polls_nothing, spin_ok, single_copy_ok in run_ranks(_polling_body, 2, backend=backend):
        assert polls == (backend == "shm") and not polls_nothing and spin_ok and single_copy_ok

