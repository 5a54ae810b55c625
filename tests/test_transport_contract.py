"""Every transport through the contract checks of collie.transports.conformance,
in this process: the loopback transport, and shared memory and TCP with both
ends set up side by side on threads. tests/test_transports.py checks the
same contract across processes, through the Network."""

from __future__ import annotations

import threading
import uuid

import pytest

from collie.transports import conformance
from collie.transports.doorbell import Doorbell
from collie.transports.loopback import LoopbackHub

pytestmark = pytest.mark.timeout(120)


class DictStore:
    """The store calls the transports make at setup, in memory, for threads."""

    def __init__(self):
        self._data: dict[str, bytes] = {}
        self._cond = threading.Condition()

    def set(self, key, value):
        with self._cond:
            self._data[key] = value if isinstance(value, bytes) else str(value).encode()
            self._cond.notify_all()

    def get(self, key, timeout=30.0):
        with self._cond:
            if not self._cond.wait_for(lambda: key in self._data, timeout):
                raise TimeoutError(f"no key {key!r} after {timeout}s")
            return self._data[key]

    def add(self, key, amount):
        with self._cond:
            value = int(self._data.get(key, b"0")) + amount
            self._data[key] = str(value).encode()
            self._cond.notify_all()
            return value

    def check(self, keys):
        with self._cond:
            return all(k in self._data for k in keys)


def _side_by_side(make):
    """Build ranks 0 and 1 at once (each one's setup waits for the other's)."""
    made, errors = [None, None], []

    def build(rank):
        try:
            made[rank] = make(rank)
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            errors.append(exc)

    threads = [threading.Thread(target=build, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    if errors or None in made:
        for t in made:
            if t is not None:
                t.close()
        raise errors[0] if errors else AssertionError("setup did not finish")
    return made


def loopback_pair():
    hub = LoopbackHub(2)
    return hub.endpoints[0], hub.endpoints[1], hub.close


def shm_pair():
    from collie.transports.shm import ShmTransport
    store, job = DictStore(), uuid.uuid4().hex[:12]
    a, b = _side_by_side(lambda rank: ShmTransport(rank, [0, 1], store, job, 30.0))

    def close():
        a.close()
        b.close()
    return a, b, close


def tcp_pair(**options):
    from collie.transports.tcp import TcpTransport
    store, job = DictStore(), uuid.uuid4().hex[:12]
    bells = [Doorbell.private(), Doorbell.private()]
    a, b = _side_by_side(lambda rank: TcpTransport(rank, 2, store, job, bells[rank], 30.0, None,
                                                   on_peer_lost=lambda peer, error: None,
                                                   on_control=lambda peer, payload: None, **options))

    def close():
        a.close()
        b.close()
        for bell in bells:
            bell.release()
    return a, b, close


def tcp_striped_pair():
    """Three connections, and every message of 1 KiB or more striped across them."""
    return tcp_pair(streams=3, stripe_min=1024)


PAIRS = {"loopback": loopback_pair, "shm": shm_pair, "tcp": tcp_pair, "tcp-striped": tcp_striped_pair}


@pytest.mark.parametrize("check", conformance.CHECKS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("transport", list(PAIRS))
def test_contract(transport, check):
    conformance.check_transport(PAIRS[transport], checks=(check,))


def test_a_broken_transport_fails_the_checks():
    """The checks can fail: a loopback that reorders one tag's messages."""
    from collie.transports import loopback

    class Reordering(loopback.LoopbackTransport):
        def _take(self, peer, tag):
            box = self._inbox[peer]
            for i in range(len(box) - 1, -1, -1):  # the newest first
                if box[i].tag == tag:
                    msg = box[i]
                    del box[i]
                    return msg
            return None

    def pair():
        hub = LoopbackHub(2)
        hub.close()  # swapped for reordering ones
        hub.endpoints = [Reordering(hub, r, 2) for r in range(2)]
        return hub.endpoints[0], hub.endpoints[1], hub.close

    with pytest.raises(AssertionError, match="fifo_per_tag"):
        conformance.check_transport(pair, checks=(conformance.fifo_per_tag,))


def test_loopback_refuses_bad_peers():
    hub = LoopbackHub(3)
    try:
        with pytest.raises(ValueError, match="not a peer"):
            hub.endpoints[0].isend(0, 1, memoryview(b"x"))
        with pytest.raises(ValueError, match="not a peer"):
            hub.endpoints[0].irecv(3, 1, memoryview(bytearray(1)))
    finally:
        hub.close()
    with pytest.raises(ValueError, match="at least 1"):
        LoopbackHub(0)


def test_tcp_ranks_that_keep_different_numbers_of_connections_are_told():
    """COLLIE_TCP_STREAMS set differently on two ranks: setup fails at once,
    saying so, instead of waiting out its timeout for connections that never come."""
    from collie.errors import CollieError
    from collie.transports.tcp import TcpTransport
    store, job = DictStore(), uuid.uuid4().hex[:12]
    bells = [Doorbell.private(), Doorbell.private()]
    errors: dict = {}

    def build(rank):
        try:
            TcpTransport(rank, 2, store, job, bells[rank], 20.0, None, on_peer_lost=lambda *a: None,
                         on_control=lambda *a: None, streams=2 + rank).close()
        except (ValueError, CollieError) as exc:
            errors[rank] = exc

    threads = [threading.Thread(target=build, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    for bell in bells:
        bell.release()
    assert isinstance(errors.get(0), ValueError), errors
    assert "rank 1 keeps 3 TCP connection(s) with rank 0, which keeps 2" in str(errors[0])
    assert "COLLIE_TCP_STREAMS" in str(errors[0])
    assert 1 in errors and "timed out" not in str(errors[1]), errors  # the other one hears of it too
