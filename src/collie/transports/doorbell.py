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

Most of the time nobody sleeps: a waiting rank polls for a while first. So
beside the semaphore sits a *sleepers* word, the number of the owner's
threads that are asleep or about to sleep, and peers that announce a message
call wake(), which rings only when that word is not zero. That spares the
semaphore (a library call) on every message, and leaves no pile of counted
rings for the next sleep to drain. It cannot lose a wake-up, by the same
argument as Dekker's mutual exclusion:

    sleeper (sleep())                     waker (wake())
    sleepers += 1                         store what it announces (a ring head)
    full barrier                          full barrier
    look at everything (progress)         load sleepers; ring if not 0
    sleep on the semaphore

Each side stores, then loads what the other stores, with a full barrier
between: they cannot both miss each other. Either the sleeper's last look
sees the message, or the waker sees the sleeper and rings.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
import threading
import time
from typing import Callable

SEM_SIZE = 32     # sizeof(sem_t) on 64-bit Linux; the semaphore gets a cache line
_SLEEPERS_AT = 64  # the sleepers word (int64): the next cache line

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


# A full memory barrier. Acquiring an uncontended lock is an atomic
# read-modify-write, which on x86 is lock-prefixed and so a full barrier (and
# so is releasing it: CPython's locks are semaphores). The same lock keeps
# this process's threads from updating a sleepers word at the same time.
def _new_lock() -> None:
    global _lock, full_barrier
    _lock = threading.Lock()
    acquire, release = _lock.acquire, _lock.release

    def full_barrier() -> None:
        acquire()
        release()


_new_lock()
os.register_at_fork(after_in_child=_new_lock)  # a fork mid-barrier must not leave it locked


def _address(buffer, offset: int) -> int:
    return ctypes.addressof(ctypes.c_char.from_buffer(buffer, offset))


class Doorbell:
    """A counting wake-up signal on a sem_t at ``offset`` in ``buffer``.

    ``create=True`` initialises the semaphore (once, by its owner); peers that
    map the same memory attach with ``create=False``. ``sleepers=False``: a
    bare semaphore (SEM_SIZE bytes), without the sleepers word that wake()
    and sleep() use.
    """

    RESERVED = 128  # bytes a doorbell takes in a shared segment (two cache lines)

    def __init__(self, buffer, offset: int = 0, create: bool = True, sleepers: bool = True):
        self._buffer = buffer  # keeps the mapping alive while we hold its address
        self._addr = _address(buffer, offset)
        self._sleepers = None
        if sleepers:
            self._sleepers = memoryview(buffer)[offset + _SLEEPERS_AT:offset + _SLEEPERS_AT + 8].cast("q")
            if create:
                self._sleepers[0] = 0
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

    def wake(self) -> None:
        """Ring, if the owner is asleep or about to sleep. Call it after
        storing what the owner should look at (see the module's docstring)."""
        sleepers = self._sleepers
        if sleepers is None:
            self.ring()
            return
        full_barrier()
        try:
            asleep = sleepers[0]
        except ValueError:
            return  # released meanwhile (the transport is closing)
        if asleep and self._addr:
            _sem_post(self._addr)

    def sleep(self, timeout: float, look: Callable[[], bool]) -> bool:
        """Sleep until woken or ``timeout`` seconds pass, unless ``look()``,
        the caller's last check for work, finds some (returns True). It runs
        after this thread counts as a sleeper, so whatever it misses wakes us.
        True if woken (or look() was true)."""
        sleepers = self._sleepers
        with _lock:  # its release is also the full barrier before look()
            sleepers[0] += 1
        try:
            # Rings counted before now are stale: look() sees whatever they announced.
            self.drain()
            if look():
                return True
            return self.wait(timeout)
        finally:
            with _lock:
                sleepers[0] -= 1

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
        sleepers, self._sleepers = self._sleepers, None
        if sleepers is not None:
            sleepers.release()
        self._buffer = None
