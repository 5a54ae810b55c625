"""Cross Memory Attach: copy bytes straight out of another process's memory.

Linux's process_vm_readv(2) copies from a range of another process's address
space into ours in one kernel call: one copy, where a shared-memory ring
needs two (the sender into the ring, the receiver out of it). The shm
transport uses it for large messages (a rendezvous: the sender publishes
where its bytes are, the receiver reads them and says when it is done).

It needs the right to ptrace the other process, which a process of the same
user has unless Yama's ptrace_scope (or a container's seccomp policy) says
otherwise: ``works_with`` checks it on a real read before a pair relies on it.
Under Yama's default on many distributions (ptrace_scope 1: only ancestors
may read a process), ranks are siblings, so ``allow_readers`` lets other
processes of the same user read this one (PR_SET_PTRACER_ANY), as MPI
libraries' CMA transports do; scopes 2 and 3 stay closed, and those pairs
keep the shared-memory rings.
"""

from __future__ import annotations

import ctypes
import errno
import os
import threading
import time
from typing import Optional

import numpy as np

try:  # the compiled core moves the bytes in one call; ctypes where it is not built
    from .. import _core
except ImportError:  # pragma: no cover - exercised where no compiler was found
    _core = None

_functions: dict = {}


def _function(name: str):
    """process_vm_readv or _writev, called with ready-made ctypes arguments
    (no argtypes: converting six Python arguments on every call cost more
    than the system call itself for small reads)."""
    fn = _functions.get(name)
    if fn is None:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = getattr(libc, name, None)
        if fn is None:
            raise OSError(errno.ENOSYS, f"{name} is not available")
        fn.restype = ctypes.c_ssize_t
        _functions[name] = fn
    return fn


_ONE, _NO_FLAGS = ctypes.c_ulong(1), ctypes.c_ulong(0)
_IoVecPair = ctypes.c_ulong * 4  # local (base, len), then remote (base, len)


class _Vectors(threading.local):
    """Each thread's own iovec pair, made once: a transfer only fills it in."""

    def __init__(self):
        self.pair = _IoVecPair()
        at = ctypes.addressof(self.pair)
        self.local, self.remote = ctypes.c_void_p(at), ctypes.c_void_p(at + 16)


_vectors = _Vectors()


_YAMA_SCOPE = "/proc/sys/kernel/yama/ptrace_scope"
_PR_SET_PTRACER = 0x59616D61
_PR_SET_PTRACER_ANY = ctypes.c_ulong(-1).value


def allow_readers(scope_path: str = _YAMA_SCOPE) -> bool:
    """Under Yama ptrace_scope 1, let processes of our user read our memory
    (they already could without Yama). True if a call was needed and made."""
    try:
        with open(scope_path) as f:
            scope = f.read().strip()
    except OSError:
        return False  # no Yama: same-user reads are allowed
    if scope != "1":
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.prctl(_PR_SET_PTRACER, ctypes.c_ulong(_PR_SET_PTRACER_ANY), 0, 0, 0) == 0


def address(buf) -> int:
    """The address of the first byte of a contiguous buffer (read-only ones too)."""
    if not len(buf):
        return 0
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(buf))  # a tenth of NumPy's way
    except TypeError:  # read-only: ctypes will not take it
        return np.frombuffer(buf, np.uint8).__array_interface__["data"][0]


def _move(name: str, pid: int, local_at: int, remote_at: int, n: int) -> None:
    """n bytes between our address ``local_at`` and ``remote_at`` in process
    ``pid``, with process_vm_readv or _writev (which may move fewer per call)."""
    fn = _function(name)
    vectors = _vectors
    pair = vectors.pair
    done = 0
    while done < n:
        pair[0], pair[1], pair[2], pair[3] = local_at + done, n - done, remote_at + done, n - done
        got = fn(pid, vectors.local, _ONE, vectors.remote, _ONE, _NO_FLAGS)
        if got <= 0:
            err = ctypes.get_errno() if got < 0 else errno.EFAULT
            raise OSError(err, f"{name} with pid {pid}: {os.strerror(err)}")
        done += got


def registered(buffer) -> tuple:
    """The four words of the registered buffer that ``buffer`` (ours) lies
    in, as a rendezvous body or an offer gives them (zeros: none; see
    collie.registered)."""
    return _core.registered_words(buffer) if _core is not None else (0, 0, 0, 0)


def read(pid: int, dst, src_address: int, registered: tuple = ()) -> None:
    """Copy ``len(dst)`` bytes from ``src_address`` in process ``pid`` into
    ``dst`` (a writable contiguous buffer). Raises OSError if they cannot
    all be read (the process is gone, or we may not read it). ``registered``:
    the last four words of a rendezvous body sent from a registered buffer,
    whose mapping the core reads instead where it can (collie.registered)."""
    if _core is not None:
        _core.vm_read(pid, dst, src_address, *registered)
    else:
        _move("process_vm_readv", pid, address(dst), src_address, len(dst))


def write(pid: int, dst_address: int, src, registered: tuple = ()) -> None:
    """Copy all of ``src`` (a contiguous buffer of ours) to ``dst_address``
    in process ``pid``. Raises OSError if it cannot all be written.
    ``registered``: as for read(), the other process's buffer's four words."""
    if _core is not None:
        _core.vm_write(pid, dst_address, src, *registered)
    else:
        _move("process_vm_writev", pid, address(src), dst_address, len(src))


class Probe:
    """A few bytes this process keeps, for peers to check that they can read us."""

    def __init__(self):
        self.token = np.frombuffer(os.urandom(16), np.uint8).copy()

    def info(self) -> dict:
        return {"pid": os.getpid(), "address": address(self.token), "token": self.token.tobytes().hex()}


def works_with(info: Optional[dict]) -> bool:
    """Whether this process can read the peer that published ``info`` (a Probe's)."""
    if not info:
        return False
    got = np.zeros(16, np.uint8)
    try:
        read(info["pid"], got, info["address"])
    except OSError:
        return False
    return got.tobytes().hex() == info["token"]


def works_between_processes() -> bool:
    """Whether a child process can read this one's memory (what the shm
    transport checks per pair at setup), for tools that ask before ranks exist."""
    probe = Probe()
    pid = os.fork()
    if pid == 0:
        os._exit(0 if works_with(probe.info()) else 1)
    _, status = os.waitpid(pid, 0)
    return os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


COST_BYTES = 1 << 20  # relative_cost's read: a mid-size message, in cache on both ends


def relative_cost(nbytes: int = COST_BYTES, repeats: int = 20) -> Optional[float]:
    """How many times longer the kernel takes to read ``nbytes`` out of a
    process (this one) than a copy within the process takes, each the best
    of ``repeats``; None where the read fails.

    Single copy replaces two copies through a ring, which the writer and the
    reader make at once, with one read by the kernel, which pins the pages
    first: where that read costs several copies, pieces through the rings
    beat it. Measured: 4.6x on a 2-core AMD EPYC VM (64 against 14 us),
    about 1.7x on a 2-core Intel Xeon VM (docs/performance.md). The tuner
    uses it for the 2-rank reductions (tuner.SLOW_SINGLE_COPY)."""
    src = np.ones(nbytes, np.uint8)
    dst = np.zeros_like(src)
    pid, at = os.getpid(), address(src)
    best_read = best_copy = float("inf")
    try:
        for _ in range(repeats):
            t0 = time.perf_counter()
            read(pid, dst, at)
            t1 = time.perf_counter()
            np.copyto(dst, src)
            t2 = time.perf_counter()
            best_read, best_copy = min(best_read, t1 - t0), min(best_copy, t2 - t1)
    except OSError:
        return None
    return best_read / best_copy
