"""What one-sided operations do to target memory, and the agent that does it
for origins on other hosts.

An origin on the target's host reaches the target's memory itself (see
win.py). An origin on another host cannot, so every rank of a window that
spans hosts runs an *agent*: a thread that serves requests from the ranks of
other hosts, sent over the network on a communicator of the window's own,
while the rank's main thread computes or waits elsewhere. One request is a
64-byte header (kind, byte offset, bytes, op, dtype, lock mode), then its
data; the agent answers with a status and, for reads, the bytes. Every
operation waits for its answer, so it is complete when its call returns, as
on one host.

Locks across hosts: the agent takes the target's lock bytes for a remote
origin with open-file-description locks (F_OFD_SETLK), one file description
per origin, on the same lock file the ranks of its host lock with POSIX
record locks; the two kinds conflict with each other, so local and remote
holders exclude each other. A lock that is busy is queued and granted
(answered) when it frees; an origin that dies loses its locks here.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import struct
import threading
import time
from typing import Optional

import numpy as np

PUT, GET, ACC, LOCK, UNLOCK, CLOSE = range(6)
OPS = ("SUM", "PROD", "MIN", "MAX", "LAND", "LOR", "LXOR", "BAND", "BOR", "BXOR", "REPLACE", "NO_OP")
_REQ, _DATA, _STATUS, _REPLY = 1, 2, 3, 4   # p2p tags of the agent's communicator
_FLOCK = "hhxxxxqqixxxx"                    # struct flock on 64-bit Linux
OK, E_RANGE = 0, 1


def combine(name: str, op, current: np.ndarray, data: np.ndarray, compare=None) -> Optional[np.ndarray]:
    """The new target value of an accumulate-like operation (None: unchanged)."""
    if compare is not None:
        return data if current[0] == compare[0] else None
    if name == "NO_OP":
        return None
    if name == "REPLACE":
        return data
    new = op._ufunc(current, data)
    if op._logical:
        new = new != 0
    return np.asarray(new).astype(current.dtype, copy=False)


def ofd_lock(fd: int, byte: int, exclusive: bool, wait: bool) -> bool:
    """Take one byte with an open-file-description lock; False if busy."""
    kind = fcntl.F_WRLCK if exclusive else fcntl.F_RDLCK
    try:
        fcntl.fcntl(fd, fcntl.F_OFD_SETLKW if wait else fcntl.F_OFD_SETLK,
                    struct.pack(_FLOCK, kind, os.SEEK_SET, byte, 1, 0))
        return True
    except OSError as e:
        if e.errno in (errno.EACCES, errno.EAGAIN):
            return False
        raise


def ofd_unlock(fd: int, byte: int) -> None:
    fcntl.fcntl(fd, fcntl.F_OFD_SETLK, struct.pack(_FLOCK, fcntl.F_UNLCK, os.SEEK_SET, byte, 1, 0))


def _u8(a: np.ndarray) -> memoryview:
    return memoryview(a.view(np.uint8)) if a.size else memoryview(bytearray(0))


class Agent:
    """Serves this rank's window memory to the window's ranks on other hosts."""

    def __init__(self, st, comm, remote: list):
        self.st, self.net = st, st.network
        g = comm._g("Win agent")
        self.comm = comm
        self.tag = {k: g.p2p_tag(k) for k in (_REQ, _DATA, _STATUS, _REPLY)}
        self.remote = list(remote)      # window ranks on other hosts
        self.fds: dict = {}             # origin -> its file description of our lock file
        self.held: dict = {}            # origin -> lock byte it holds
        self.queued: list = []          # (origin, exclusive) waiting for our epoch lock
        self.acc_fd = -1
        self.stop = False
        self.last, self.delay = 0.0, 0.0
        self.thread = threading.Thread(target=self._serve, name=f"collie-win-agent-{st.rank}", daemon=True)
        self.thread.start()

    # ---- the origin's side ----

    def request(self, t: int, kind: int, at: int, nbytes: int, payload=None, out: Optional[np.ndarray] = None,
                op: str = "SUM", dtype=np.uint8, mode: int = 0) -> int:
        """Send one request to rank t's agent and wait for its answer; the
        status (OK, E_RANGE). ``out`` receives the bytes a read (GET, or an
        ACC that fetches) answers; ``mode``: exclusive (LOCK), compare data
        follows (ACC)."""
        net, peer = self.net, self.st.global_ranks[t]
        header = np.array([kind, at, nbytes, OPS.index(op), ord(np.dtype(dtype).char), mode,
                           int(out is not None), 0], np.int64)
        status = np.zeros(1, np.int64)
        waits = [net.irecv(peer, self.tag[_STATUS], _u8(status))]
        if out is not None:
            waits.append(net.irecv(peer, self.tag[_REPLY], _u8(out)))
        waits.append(net.isend(peer, self.tag[_REQ], _u8(header)))
        if payload is not None:
            waits.append(net.isend(peer, self.tag[_DATA], _u8(payload)))
        net.wait(waits, timeout=float("inf") if kind == LOCK else None,
                 describe=lambda: f"Win request to rank {t}")
        return int(status[0])

    # ---- the target's side ----

    def _listen(self, t: int):
        header = np.zeros(8, np.int64)
        return self.net.irecv(self.st.global_ranks[t], self.tag[_REQ], _u8(header)), header

    def _serve(self) -> None:
        try:
            self._loop()
        except Exception:  # the network closed under us (the world was destroyed first)
            if not self.net._closed:
                raise

    def _loop(self) -> None:
        posted = {t: self._listen(t) for t in self.remote}
        while posted and not self.stop:
            moved = False
            for t, (req, header) in list(posted.items()):
                if req.error is not None:
                    self._forget(t)
                    del posted[t]
                elif req.done and header[0] == CLOSE:  # t freed the window: nothing more from it
                    self._forget(t)
                    del posted[t]
                elif req.done:
                    moved = True
                    try:
                        self._handle(t, header)
                        posted[t] = self._listen(t)
                    except Exception:  # the origin died mid-request: it is gone for us
                        self._forget(t)
                        del posted[t]
            if self.queued:
                moved = self._grant() or moved
            if moved:
                self.last, self.delay = time.monotonic(), 0.0
            else:
                self._pause()

    # The agent never sleeps on the rank's doorbell: a ring it took would be
    # lost for the main thread (asleep in a wait of its own), and one the main
    # thread took, for the agent. Its requests are with ranks of other hosts,
    # which TCP receiver threads complete, so it only looks at their flags,
    # pausing a little longer each time it finds nothing: 20 us at first, at
    # most 200 us within a second of its last request, then at most 10 ms.

    def _pause(self) -> None:
        idle = time.monotonic() - self.last
        self.delay = min(max(self.delay * 2, 20e-6), 200e-6 if idle < 1.0 else 10e-3)
        time.sleep(self.delay)

    def _await(self, requests) -> None:
        """Wait for this thread's own sends and receives (see _pause)."""
        self.delay = 0.0
        while not all(r.finished for r in requests):
            if self.stop:
                raise RuntimeError("window agent stopped")
            self._pause()
        for r in requests:
            if r.error is not None:
                raise r.error

    def _memory(self, at: int, nbytes: int) -> Optional[np.ndarray]:
        """Our window's bytes [at, at + nbytes), or None if they are not ours."""
        st = self.st
        if st.flavor_dynamic:
            for address, (size, _) in st.attached.items():
                if address <= at and at + nbytes <= address + size:
                    return np.ctypeslib.as_array((ctypes.c_ubyte * nbytes).from_address(at)) if nbytes else \
                        np.zeros(0, np.uint8)
            return None
        mine = np.frombuffer(st.memory, np.uint8) if len(st.memory) else np.zeros(0, np.uint8)
        return mine[at:at + nbytes] if 0 <= at and at + nbytes <= mine.size else None

    def _handle(self, t: int, header: np.ndarray) -> None:
        kind, at, nbytes, opi, code, mode = (int(x) for x in header[:6])
        net, peer, tag = self.net, self.st.global_ranks[t], self.tag
        data = None
        if kind in (PUT, ACC):
            data = np.empty(nbytes * (2 if mode else 1), np.uint8)  # mode: compare-and-swap data follows
            self._await([net.irecv(peer, tag[_DATA], _u8(data))])
        if kind == LOCK:
            if not self._try_lock(t, bool(mode)):
                self.queued.append((t, bool(mode)))
                return
            self._answer(t, OK)
            return
        if kind == UNLOCK:
            self._release(t)
            self._answer(t, OK)
            return
        mem = self._memory(at, nbytes)
        reply = np.zeros(nbytes, np.uint8) if kind == GET or (kind == ACC and header[6]) else None
        if mem is None:
            self._answer(t, E_RANGE, reply)
            return
        if kind == PUT:
            mem[:] = data
        elif kind == GET:
            reply[:] = mem
        else:
            self._accumulate(mem, data[:nbytes], OPS[opi], np.dtype(chr(code)),
                             data[nbytes:] if mode else None, reply)
        self._answer(t, OK, reply)

    def _accumulate(self, mem, data, name, dtype, compare, reply) -> None:
        from . import op as ops
        st = self.st
        if self.acc_fd < 0:
            self.acc_fd = os.open(f"/proc/self/fd/{st.lockfd}", os.O_RDWR)
        byte = 2 * st.rank + 1
        ofd_lock(self.acc_fd, byte, True, wait=True)
        try:
            old = mem.copy()
            new = combine(name, getattr(ops, name), old.view(dtype), data.view(dtype),
                          None if compare is None else compare.view(dtype))
            if new is not None:
                mem[:] = np.ascontiguousarray(new).view(np.uint8)
        finally:
            ofd_unlock(self.acc_fd, byte)
        if reply is not None:
            reply[:] = old

    def _answer(self, t: int, status: int, reply=None) -> None:
        net, peer = self.net, self.st.global_ranks[t]
        sends = [net.isend(peer, self.tag[_STATUS], _u8(np.array([status], np.int64)))]
        if reply is not None:
            sends.append(net.isend(peer, self.tag[_REPLY], _u8(reply)))
        self._await(sends)

    # ---- locks held for remote origins ----

    def _try_lock(self, t: int, exclusive: bool) -> bool:
        fd = self.fds.get(t)
        if fd is None:
            fd = self.fds[t] = os.open(f"/proc/self/fd/{self.st.lockfd}", os.O_RDWR)
        if ofd_lock(fd, 2 * self.st.rank, exclusive, wait=False):
            self.held[t] = True
            return True
        return False

    def _grant(self) -> bool:
        granted = False
        for t, exclusive in list(self.queued):
            if self._try_lock(t, exclusive):
                self.queued.remove((t, exclusive))
                self._answer(t, OK)
                granted = True
        return granted

    def _release(self, t: int) -> None:
        if self.held.pop(t, None):
            ofd_unlock(self.fds[t], 2 * self.st.rank)

    def _forget(self, t: int) -> None:
        """Origin t is gone: drop its locks and its place in the queue."""
        self.queued = [q for q in self.queued if q[0] != t]
        self.held.pop(t, None)
        fd = self.fds.pop(t, None)
        if fd is not None:
            os.close(fd)

    def close(self, orderly: bool) -> None:
        """After the window's last barrier (``orderly``): tell every remote
        agent we are done (it stops listening to us), and wait until ours has
        heard the same from every remote rank, so that no receive is left
        posted. Otherwise (the barrier failed: a peer died) just stop."""
        if not orderly:
            self.stop = True
            self.thread.join()
            return self._drop_all()
        net = self.net
        bye = np.array([CLOSE, 0, 0, 0, 0, 0, 0, 0], np.int64)
        for t in self.remote:
            try:
                net.wait([net.isend(self.st.global_ranks[t], self.tag[_REQ], _u8(bye))])
            except Exception:  # a dead peer: its agent is gone already
                pass
        self.thread.join()
        self._drop_all()

    def _drop_all(self) -> None:
        for t in list(self.fds):
            self._forget(t)
        if self.acc_fd >= 0:
            os.close(self.acc_fd)
            self.acc_fd = -1
