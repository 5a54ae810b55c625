"""Run a function on N real collie ranks and collect what each returns.

    results = run_ranks(body, 4, backend="shm")   # body(rank, size, *args)

Each rank is a forked process that joins a fresh world (env://, a free port,
its own job id and token), runs ``body``, and sends back its return value or its
exception. The call fails with every rank's traceback if any rank raised,
and kills every rank still running after ``timeout`` seconds, so a hang
becomes a test failure rather than a stuck suite. ``expect_errors=True``
returns exceptions (re-created from their type name and message) in place
of results instead of failing.

Bodies check results against NumPy with collie.soak's reference, imported
here: small_ints (inputs exact in any order), reduce_ops (the ops a dtype
takes), reduced (the reference) and same.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import secrets
import signal
import socket
import time
import traceback
import uuid

from collie.soak import reduce_ops, reduced, same, small_ints  # noqa: F401 - for the tests

_ctx = mp.get_context("fork")


# Small shared-memory slots, single-copy threshold and window, for runs
# whose larger calls should take the transport's multi-slot and slicing paths.
SMALL_SHM = {"COLLIE_SHM_SLOT_BYTES": "4096", "COLLIE_SHM_SLOTS": "2", "COLLIE_SHM_CMA_BYTES": "8192",
             "COLLIE_SHM_WINDOW_BYTES": "16384"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RankError(Exception):
    """What a rank raised, carried back to the test process."""

    def __init__(self, rank: int, type_name: str, message: str, tb: str):
        super().__init__(f"rank {rank}: {type_name}: {message}")
        self.rank, self.type_name, self.message, self.tb = rank, type_name, message, tb


def _child(conn, rank, size, env, body, args, backend, init, init_kwargs):
    os.environ.update(env)
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(size), LOCAL_RANK=str(rank),
                      LOCAL_WORLD_SIZE=str(size))
    out = None
    try:
        import collie
        collie.core.select()  # the parent may have imported collie with another COLLIE_EXECUTOR
        if init:
            collie.init_process_group(backend=backend, **init_kwargs)
        try:
            out = ("ok", body(rank, size, *args))
        finally:
            if init:
                collie.destroy_process_group()
    except BaseException as exc:  # noqa: BLE001 - everything goes back to the test
        out = ("err", type(exc).__name__, str(exc), traceback.format_exc())
    try:
        conn.send_bytes(pickle.dumps(out))
    except Exception as exc:  # an unpicklable result
        conn.send_bytes(pickle.dumps(("err", type(exc).__name__, str(exc), traceback.format_exc())))
    conn.close()
    os._exit(0)


def start_ranks(ctx, size: int, target_of) -> tuple[list, list]:
    """Start ``size`` processes, rank r running ``target(*args)`` where
    ``(target, args) = target_of(r, conn)`` and ``conn`` is the write end of
    its result pipe; returns the processes and the read ends."""
    procs, conns = [], []
    for rank in range(size):
        parent, child = ctx.Pipe(duplex=False)
        target, args = target_of(rank, child)
        p = ctx.Process(target=target, args=args, daemon=True)
        p.start()
        child.close()
        procs.append(p)
        conns.append(parent)
    return procs, conns


def reap(procs, conns, join_timeout: float = 5.0) -> None:
    """Join every process, killing those still alive after ``join_timeout``,
    and close their result pipes: no test leaves a process behind."""
    for p in procs:
        p.join(timeout=join_timeout)
        if p.is_alive():
            p.kill()
            p.join(timeout=5)
    for c in conns:
        c.close()


def run_ranks(body, size: int, *args, backend: str = "auto", timeout: float = 60.0, env=None,
              init: bool = True, expect_errors: bool = False, init_kwargs=None, kill=None):
    """Run ``body(rank, size, *args)`` on ``size`` fresh ranks; see module doc.

    ``kill`` maps rank -> seconds after start at which the test SIGKILLs it.
    """
    job = uuid.uuid4().hex[:10]
    base_env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "COLLIE_JOB_ID": job,
                "COLLIE_TOKEN": secrets.token_hex(16)}  # env={"COLLIE_TOKEN": ""}: none
    base_env.update(env or {})
    procs, conns = start_ranks(_ctx, size, lambda rank, conn: (
        _child, (conn, rank, size, dict(base_env), body, args, backend, init, dict(init_kwargs or {}))))
    results: list = [None] * size
    pending = set(range(size))
    start = time.monotonic()
    deadline = start + timeout
    kills = dict(kill or {})
    try:
        while pending:
            now = time.monotonic()
            for rank, at in list(kills.items()):
                if now - start >= at:
                    os.kill(procs[rank].pid, signal.SIGKILL)
                    del kills[rank]
                    results[rank] = RankError(rank, "Killed", "SIGKILL by the test", "")
                    pending.discard(rank)
            if now > deadline:
                raise TimeoutError(f"ranks {sorted(pending)} still running after {timeout}s "
                                   f"(job {job}); results so far: {results}")
            ready = mp.connection.wait([conns[r] for r in pending], timeout=0.05)
            for conn in ready:
                rank = conns.index(conn)
                try:
                    msg = pickle.loads(conn.recv_bytes())
                except EOFError:
                    msg = ("err", "ProcessDied", f"exit code {procs[rank].exitcode}", "")
                results[rank] = msg[1] if msg[0] == "ok" else RankError(rank, *msg[1:])
                pending.discard(rank)
    finally:
        reap(procs, conns)
    errors = [r for r in results if isinstance(r, RankError) and r.type_name != "Killed"]
    if errors and not expect_errors:
        raise AssertionError("\n".join(f"--- rank {e.rank} ---\n{e.tb or e}" for e in errors))
    return results


def open_sockets() -> set[tuple[str, str]]:
    """This process's open sockets, as (fd, "socket:[inode]"): what a test
    compares before and after to find the ones it leaked (empty off Linux)."""
    fds: set[tuple[str, str]] = set()
    if not os.path.isdir("/proc/self/fd"):
        return fds
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:"):
            fds.add((fd, link))
    return fds


def shm_leftovers(job: str | None = None) -> list[str]:
    """collie's names in /dev/shm (of one job, or all)."""
    prefix = "collie-" + (f"{job}-" if job else "")
    try:
        return [n for n in os.listdir("/dev/shm") if n.startswith(prefix)]
    except FileNotFoundError:
        return []
