"""The doorbell: the one thing a rank sleeps on while it waits for peers.

A doorbell is a POSIX semaphore (sem_t) placed in shared memory, so that a
peer on the same host can ring it by writing to memory it has mapped, and a
thread of this process (the TCP receiver) can ring it too. Ringing costs an
atomic increment when nobody sleeps (no system call), and a futex wake when
somebody does: far cheaper than a pipe or a socket.

Every ring is counted, so a ring is never lost: a rank that checks its
conditions, finds nothing, and then sleeps, wakes at once if anything rang in
between. Extra rings only cause an extra look (a spurious wake-up), which is
why callers always re-check their conditions after waking.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
import time

SEM_SIZE = 32  # sizeof(sem_t) on 64-bit Linux; we reserve 64 bytes for alignment

_LIBC_NAME = ctypes.util.find_library("c") or "libc.so.6"
_libc = ctypes.CDLL(_LIBC_NAME, use_errno=True)
# sem_post and sem_trywait never block: call them without releasing the GIL
# (PyDLL), which saves a quarter of the cost of a ring, the most frequent call.
_libc_nogil = ctypes.PyDLL(_LIBC_NAME)
_sem_init = _libc.sem_init
_sem_init.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint]
_sem_post = _libc_nogil.sem_post
_sem_post.argtypes = [ctypes.c_void_p]
_sem_trywait = _libc_nogil.sem_trywait
_sem_trywait.argtypes = [ctypes.c_void_p]
_sem_timedwait = _libc.sem_timedwait
_sem_destroy = _libc.sem_destroy
_sem_destroy.argtypes = [ctypes.c_void_p]


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


_sem_timedwait.argtypes = [ctypes.c_void_p, ctypes.POINTER(_Timespec)]


def _address(buffer, offset: int) -> int:
    return ctypes.addressof(ctypes.c_char.from_buffer(buffer, offset))


class Doorbell:
    """A counting wake-up signal on a sem_t at ``offset`` in ``buffer``.

    ``create=True`` initialises the semaphore (once, by its owner); peers that
    map the same memory attach with ``create=False``.
    """

    RESERVED = 64  # bytes a doorbell takes in a shared segment

    def __init__(self, buffer, offset: int = 0, create: bool = True):
        self._buffer = buffer  # keeps the mapping alive while we hold its address
        self._addr = _address(buffer, offset)
        if create and _sem_init(self._addr, 1, 0) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"sem_init failed: {os.strerror(err)}")

    @classmethod
    def private(cls) -> "Doorbell":
        """A doorbell for this process alone (rung by its own threads)."""
        return cls(mmap.mmap(-1, cls.RESERVED), 0, create=True)

    def ring(self) -> None:
        """Wake the sleeper, or make its next sleep return at once."""
        if self._addr:  # 0 once released: ringing then must not touch memory
            _sem_post(self._addr)

    def wait(self, timeout: float) -> bool:
        """Sleep until rung or ``timeout`` seconds pass; True if rung."""
        if _sem_trywait(self._addr) == 0:
            return True
        if timeout <= 0:
            return False
        deadline = time.clock_gettime(time.CLOCK_REALTIME) + timeout
        sec = int(deadline)
        ts = _Timespec(sec, int((deadline - sec) * 1e9))
        while True:
            if _sem_timedwait(self._addr, ctypes.byref(ts)) == 0:
                return True
            err = ctypes.get_errno()
            if err != 4:  # EINTR: a signal arrived, sleep again
                return False

    def drain(self) -> None:
        """Forget rings that are already counted (they are stale once the
        caller has looked at everything they could announce)."""
        while _sem_trywait(self._addr) == 0:
            pass

    def release(self) -> None:
        """Drop our reference to the memory (the owner's mapping outlives us)."""
        self._addr = 0
        self._buffer = None
