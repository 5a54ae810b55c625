"""The loopback transport: ranks that are endpoints in one process.

``LoopbackHub(n).endpoints`` are n transports that reach each other through
plain Python lists. They keep the whole contract of base.py (matching per
peer and tag, size and meta checks, combine, probe, the unexpected-message
hook, failing a peer), so they can stand in for shared memory or TCP
wherever a test wants several ranks without processes: the conformance
suite (conformance.py) checks them like every other transport, and engine
tests can run real programs on them from threads.

A send copies its bytes at once and is done (an eager protocol); a receive
is matched in progress(), so requests complete inside progress() as the
contract allows (``pollable``). Each endpoint has a private doorbell that a
send to it rings.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Optional

from .base import Combine, MessageMismatch, Request, Transport
from .doorbell import Doorbell


class _Message:
    __slots__ = ("tag", "meta", "data")

    def __init__(self, tag: int, meta: int, data: bytes):
        self.tag, self.meta, self.data = tag, meta, data


class _Recv(Request):
    __slots__ = ("dst", "combine", "meta")

    def __init__(self, peer: int, tag: int, dst: memoryview, combine: Optional[Combine], meta):
        super().__init__("recv", peer, tag, dst.nbytes)
        self.dst, self.combine, self.meta = dst, combine, meta


class LoopbackHub:
    """``n`` loopback endpoints that reach one another; endpoint r is rank r."""

    def __init__(self, n: int):
        if n < 1:
            raise ValueError(f"a loopback hub needs at least 1 rank, not {n}")
        self.lock = threading.Lock()  # endpoints may be driven from threads of their own
        self.endpoints = [LoopbackTransport(self, r, n) for r in range(n)]

    def close(self) -> None:
        for t in self.endpoints:
            t.close()


class LoopbackTransport(Transport):
    """One rank of a LoopbackHub."""

    name = "loopback"
    pollable = True

    def __init__(self, hub: LoopbackHub, rank: int, size: int):
        self.hub, self.rank, self.size = hub, rank, size
        self.doorbell = Doorbell.private()
        self._inbox: dict[int, deque[_Message]] = {p: deque() for p in range(size) if p != rank}
        self._posted: list[_Recv] = []  # in the order posted: earlier receives match first
        self._closed = False

    def _peer(self, peer: int) -> None:
        if self._closed:
            raise ValueError(f"loopback rank {self.rank} is closed")
        if peer not in self._inbox:
            raise ValueError(f"loopback rank {self.rank}: {peer} is not a peer (ranks 0..{self.size - 1})")

    def isend(self, peer: int, tag: int, data: memoryview, meta: int = 0) -> Request:
        self._peer(peer)
        target = self.hub.endpoints[peer]
        with self.hub.lock:
            if not target._closed:
                target._inbox[self.rank].append(_Message(tag, meta, bytes(data)))
        target.doorbell.ring()
        req = Request("send", peer, tag, data.nbytes)
        req.done = True
        return req

    def irecv(self, peer: int, tag: int, dst: memoryview, combine: Optional[Combine] = None,
              meta: Optional[int] = None) -> Request:
        self._peer(peer)
        req = _Recv(peer, tag, dst, combine, meta)
        with self.hub.lock:
            self._posted.append(req)
        self.progress()
        return req

    def probe(self, peer: int, tag: int) -> Optional[int]:
        self._peer(peer)
        with self.hub.lock:
            for msg in self._inbox[peer]:
                if msg.tag == tag:
                    return len(msg.data)
        return None

    def progress(self) -> bool:
        moved = False
        with self.hub.lock:
            for req in list(self._posted):
                msg = self._take(req.peer, req.tag)
                if msg is not None:
                    self._posted.remove(req)
                    _deliver(req, msg)
                    moved = True
            if self.unexpected is not None:
                moved |= self._drop_unexpected(self._inbox)
        return moved

    def _take(self, peer: int, tag: int) -> Optional[_Message]:
        """The earliest message from ``peer`` with ``tag``, off the inbox."""
        box = self._inbox[peer]
        for i, msg in enumerate(box):
            if msg.tag == tag:
                del box[i]
                return msg
        return None

    def _drop_unexpected(self, peers) -> bool:
        """Offer every message no posted receive takes to ``unexpected``;
        drop the ones it says nobody ever will."""
        wanted = {(r.peer, r.tag) for r in self._posted}
        dropped = False
        for peer in peers:
            box = self._inbox[peer]
            for msg in list(box):
                if (peer, msg.tag) not in wanted and self.unexpected(peer, msg.tag, msg.meta, len(msg.data)):
                    box.remove(msg)
                    dropped = True
        return dropped

    def fail_peer(self, peer: int, error: BaseException) -> None:
        with self.hub.lock:
            for req in [r for r in self._posted if r.peer == peer]:
                self._posted.remove(req)
                req.error = error

    def drop_stale(self, peers) -> None:
        if self.unexpected is not None:
            with self.hub.lock:
                self._drop_unexpected([p for p in peers if p in self._inbox])

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with self.hub.lock:
            for box in self._inbox.values():
                box.clear()
            self._posted.clear()
        self.doorbell.release()


def _deliver(req: _Recv, msg: _Message) -> None:
    """Copy or combine ``msg`` into ``req``; a message that does not fit
    fails the receive and is consumed, leaving its buffer unchanged."""
    if len(msg.data) != req.nbytes or (req.meta is not None and msg.meta != req.meta):
        req.error = MessageMismatch(req.peer, req.tag, len(msg.data), msg.meta, req.nbytes, req.meta)
        return
    src = memoryview(msg.data)
    if req.combine is None:
        req.dst[:] = src
    else:
        try:
            req.combine(req.dst, src)
        except Exception as exc:  # noqa: BLE001 - handed to the waiter through the request
            req.error = exc
            return
    req.done = True
