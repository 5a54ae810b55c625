"""The transport contract of base.py, as checks any transport can be put through.

``check_transport(pair_factory)`` runs every check on fresh pairs of
endpoints made in this process: ``pair_factory()`` returns ``(a, b, close)``
where ``a`` is rank 0 with peer 1, ``b`` rank 1 with peer 0, and
``close()`` releases both. One thread drives both ends (progress() on each,
in turn), so a transport whose requests complete only in progress() is
checked as strictly as one with threads of its own. Each check raises
AssertionError naming what broke; tests/test_transport_contract.py runs
them on the loopback, shared-memory and TCP transports, and a new transport
(the compiled core's) passes by being added there.
"""

from __future__ import annotations

import time
from typing import Callable

import numpy as np

from .base import MessageMismatch, Transport

#: Sizes that cross every threshold a transport has: a slot, single copy,
#: several fragments, and an odd tail.
SIZES = (0, 1, 7, 4096, 256 * 1024 - 1, 256 * 1024, 256 * 1024 + 1, 3 * 1024 * 1024 + 5)

PairFactory = Callable[[], "tuple[Transport, Transport, Callable[[], None]]"]


def check(condition: bool, what: str) -> None:
    if not condition:
        raise AssertionError(what)


def drive(ends, requests, seconds: float = 20.0) -> None:
    """Progress ``ends`` until every request is finished; fail at ``seconds``."""
    deadline = time.monotonic() + seconds
    while not all(r.finished for r in requests):
        moved = False
        for t in ends:
            moved |= bool(t.progress())
        if time.monotonic() > deadline:
            raise AssertionError(f"requests not finished after {seconds:g}s: "
                                 f"{[r for r in requests if not r.finished]}")
        if not moved:
            time.sleep(0.0005)  # a transport with threads of its own needs the GIL


def _payload(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(n + seed).integers(0, 255, n, dtype=np.uint8)


def message_sizes(a: Transport, b: Transport) -> None:
    """Every size arrives whole, in both directions."""
    for src, dst, s, d in ((a, b, 1, 0), (b, a, 0, 1)):
        datas = [_payload(n) for n in SIZES]
        bufs = [np.zeros(n, np.uint8) for n in SIZES]
        reqs = [src.isend(s, 5, memoryview(x)) for x in datas] + [dst.irecv(d, 5, memoryview(x)) for x in bufs]
        drive((a, b), reqs)
        for n, x, y in zip(SIZES, datas, bufs):
            check(np.array_equal(x, y), f"{type(src).__name__}: a {n}-byte message arrived changed")


def fifo_per_tag(a: Transport, b: Transport) -> None:
    """Messages with one tag keep their order; another tag never blocks them."""
    msgs = [np.full(10, i, np.int32) for i in range(20)]
    sends = [a.isend(1, 1 + i % 2, memoryview(m).cast("B")) for i, m in enumerate(msgs)]
    odd = [np.zeros(10, np.int32) for _ in range(10)]
    even = [np.zeros(10, np.int32) for _ in range(10)]
    recvs = ([b.irecv(0, 2, memoryview(x).cast("B")) for x in odd]
             + [b.irecv(0, 1, memoryview(x).cast("B")) for x in even])
    drive((a, b), sends + recvs)
    check([int(x[0]) for x in even] == list(range(0, 20, 2)), f"tag 1 out of order: {[int(x[0]) for x in even]}")
    check([int(x[0]) for x in odd] == list(range(1, 20, 2)), f"tag 2 out of order: {[int(x[0]) for x in odd]}")


def combine_in_place(a: Transport, b: Transport) -> None:
    """A combining receive gets every byte once, in pieces that start at
    16-byte offsets and end at one or at the message's end (in any order:
    a striped message's pieces land as its connections deliver them)."""
    n = 1_000_003
    dst = np.ones(n, np.float64)
    base = dst.__array_interface__["data"][0]
    pieces = []

    def add(d, s):
        out = np.frombuffer(d, np.float64)
        pieces.append((out.__array_interface__["data"][0] - base, len(s)))
        np.add(out, np.frombuffer(s, np.float64), out=out)

    src = np.arange(n, dtype=np.float64)
    drive((a, b), [a.isend(1, 3, memoryview(src).cast("B")), b.irecv(0, 3, memoryview(dst).cast("B"), add)])
    check(np.array_equal(dst, src + 1), "a combining receive got a wrong result")
    check(sum(size for _, size in pieces) == dst.nbytes, f"combine saw {sum(s for _, s in pieces)} bytes of "
                                                          f"{dst.nbytes}")
    check(all(at % 16 == 0 and ((at + size) % 16 == 0 or at + size == dst.nbytes) for at, size in pieces),
          f"combine pieces not at 16-byte offsets (offset, bytes): {sorted(pieces)[:8]}")


def mismatch_consumes_the_message(a: Transport, b: Transport) -> None:
    """A message of the wrong size or meta fails its receive, leaves the
    buffer alone and is consumed: the next one on that tag arrives."""
    for nbytes, meta, expect_meta in ((16, 7, None), (8, 7, 9)):
        bad, good = np.full(nbytes, 1, np.uint8), np.full(8, 2, np.uint8)
        first, second = np.zeros(8, np.uint8), np.zeros(8, np.uint8)
        reqs = [a.isend(1, 4, memoryview(bad), meta), a.isend(1, 4, memoryview(good), 9),
                b.irecv(0, 4, memoryview(first), meta=expect_meta), b.irecv(0, 4, memoryview(second), meta=9)]
        deadline = time.monotonic() + 20
        while not all(r.finished for r in reqs) and time.monotonic() < deadline:
            a.progress(), b.progress()
            time.sleep(0.0005)
        check(isinstance(reqs[2].error, MessageMismatch),
              f"a {nbytes}-byte message with meta {meta} into 8 bytes expecting meta {expect_meta}: "
              f"{reqs[2].error!r}")
        check(not first.any(), "a mismatched message wrote into the buffer")
        check(reqs[3].done and (second == 2).all(), f"the message after a mismatch did not arrive: {reqs[3]!r}")


def both_ways_at_once(a: Transport, b: Transport) -> None:
    """Two large messages crossing do not deadlock."""
    n = 8 * 1024 * 1024 + 3
    xa, xb = _payload(n, 1), _payload(n, 2)
    ya, yb = np.zeros(n, np.uint8), np.zeros(n, np.uint8)
    drive((a, b), [a.isend(1, 6, memoryview(xa)), b.isend(0, 6, memoryview(xb)),
                   a.irecv(1, 6, memoryview(ya)), b.irecv(0, 6, memoryview(yb))])
    check(np.array_equal(ya, xb) and np.array_equal(yb, xa), "crossing messages arrived changed")


def probe_sees_arrivals(a: Transport, b: Transport) -> None:
    """probe says None before a message and its size once it has started to arrive."""
    check(b.probe(0, 8) is None, "probe found a message nobody sent")
    data = _payload(1000)
    send = a.isend(1, 8, memoryview(data))
    deadline = time.monotonic() + 20
    while b.probe(0, 8) is None:
        a.progress(), b.progress()
        check(time.monotonic() < deadline, "probe never saw a sent message")
        time.sleep(0.0005)
    check(b.probe(0, 8) == 1000, f"probe said {b.probe(0, 8)} bytes, not 1000")
    check(b.probe(0, 9) is None, "probe found a message of another tag")
    got = np.zeros(1000, np.uint8)
    drive((a, b), [send, b.irecv(0, 8, memoryview(got))])
    check(np.array_equal(got, data), "the probed message arrived changed")


def fail_peer_fails_pending(a: Transport, b: Transport) -> None:
    """fail_peer fails what waits on that peer, with the error given."""
    req = b.irecv(0, 10, memoryview(np.zeros(4, np.uint8)))
    error = ConnectionError("rank 0 is gone")
    b.fail_peer(0, error)
    check(req.error is error, f"a receive on a failed peer: {req!r}, error {req.error!r}")


def unexpected_messages_are_offered(a: Transport, b: Transport) -> None:
    """A message no receive takes is offered to ``unexpected``; if it says
    nobody ever will, the message is gone and later ones still arrive."""
    offered = []

    def unexpected(peer, tag, meta, nbytes):
        offered.append((peer, tag, meta, nbytes))
        return tag == 11

    b.unexpected = unexpected
    try:
        stale, later = np.full(100, 3, np.uint8), np.full(4, 5, np.uint8)
        sends = [a.isend(1, 11, memoryview(stale), 42), a.isend(1, 12, memoryview(later), 43)]
        deadline = time.monotonic() + 20
        while (0, 11, 42, 100) not in offered:
            a.progress(), b.progress()
            b.drop_stale([0])
            check(time.monotonic() < deadline, f"the unreceived message was never offered: {offered}")
            time.sleep(0.0005)
        got = np.zeros(4, np.uint8)
        drive((a, b), [*sends, b.irecv(0, 12, memoryview(got), meta=43)])
        check((got == 5).all(), "a message after a dropped one did not arrive")
        check(b.probe(0, 11) is None, "a message the hook dropped is still there")
    finally:
        b.unexpected = None


def close_is_idempotent(a: Transport, b: Transport) -> None:
    a.close()
    a.close()


CHECKS = (message_sizes, fifo_per_tag, combine_in_place, mismatch_consumes_the_message,
          both_ways_at_once, probe_sees_arrivals, fail_peer_fails_pending,
          unexpected_messages_are_offered, close_is_idempotent)


def check_transport(pair_factory: PairFactory, checks=CHECKS) -> None:
    """Run ``checks`` (all by default), each on a fresh pair."""
    for one in checks:
        a, b, close = pair_factory()
        try:
            one(a, b)
        except AssertionError as exc:
            raise AssertionError(f"{one.__name__}: {exc}") from None
        finally:
            close()
