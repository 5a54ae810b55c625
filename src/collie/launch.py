"""Start the ranks of a job on this host: ``collie run`` and ``collie.spawn()``.

Both follow one policy, so a job never half-dies and never hangs:

- every rank gets the env:// variables (RANK, WORLD_SIZE, LOCAL_RANK,
  LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT) and COLLIE_JOB_ID,
  a short id shared by the ranks of one launch;
- the first rank that fails (non-zero exit, a signal, an exception) makes the
  launcher stop the others: SIGTERM, then SIGKILL after GRACE_S seconds;
- once every rank is gone, shared-memory files named ``collie-{job}-*`` are
  removed from /dev/shm. The shm transport names its segments that way and
  unlinks them itself; this is the safety net for ranks that were SIGKILLed.

``collie run`` starts each rank in its own session, so that a signal reaches
the rank and anything it started, and forwards Ctrl-C / SIGTERM to them.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import multiprocessing
import os
import pickle
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from multiprocessing.connection import wait as wait_any
from typing import Any, Callable, Mapping, TextIO

__all__ = [
    "spawn",
    "SpawnContext",
    "ProcessException",
    "ProcessRaisedException",
    "ProcessExitedException",
    "main",
]

GRACE_S = 3.0
"""Seconds a rank gets between SIGTERM and SIGKILL."""

_POLL_S = 0.05


# -- shared by `collie run` and spawn() ---------------------------------------


def free_port(host: str = "") -> int:
    """A TCP port that is free now (another process may still take it before
    rank 0 binds it; the rendezvous then fails with a clear error)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def job_id_for(master_addr: str, master_port: int) -> str:
    """The job id every node of a multi-node launch derives on its own."""
    return hashlib.sha256(f"{master_addr}:{master_port}".encode()).hexdigest()[:8]


def rank_env(rank: int, world_size: int, local_rank: int, local_world_size: int,
             group_rank: int, master_addr: str, master_port: int, job_id: str) -> dict[str, str]:
    """The environment variables that env:// rendezvous reads."""
    return {
        "RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_RANK": str(local_rank),
        "LOCAL_WORLD_SIZE": str(local_world_size),
        "GROUP_RANK": str(group_rank),
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
        "COLLIE_JOB_ID": job_id,
    }


def remove_shm(job_id: str) -> list[str]:
    """Unlink /dev/shm/collie-{job_id}-*; returns the paths removed."""
    removed = []
    for path in glob.glob(f"/dev/shm/collie-{glob.escape(job_id)}-*"):
        try:
            os.unlink(path)
            removed.append(path)
        except FileNotFoundError:
            pass  # its owner unlinked it first
    return removed


def signal_name(num: int) -> str:
    """'SIGKILL' for 9; the number itself for a signal Python does not name."""
    try:
        return signal.Signals(num).name
    except ValueError:
        return str(num)


def describe_exit(code: int) -> str:
    """'exited with code 3' or 'was killed by signal SIGKILL' (Popen-style code)."""
    if code >= 0:
        return f"exited with code {code}"
    return f"was killed by signal {signal_name(-code)}"


def _ranks(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


# -- collie run ---------------------------------------------------------------


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="collie run",
        description="Start N ranks of a Python script or module on this host, "
                    "with the env:// variables set, and stop them all at the first failure.")
    p.add_argument("-n", "--nproc-per-node", dest="nproc", type=int, default=1, metavar="N",
                   help="ranks to start on this host (default 1)")
    p.add_argument("--nnodes", type=int, default=1, metavar="K", help="hosts in the job (default 1)")
    p.add_argument("--node-rank", type=int, default=0, metavar="I", help="this host's index, 0..K-1")
    p.add_argument("--master-addr", default="127.0.0.1", metavar="A",
                   help="address of the host of rank 0 (default 127.0.0.1)")
    p.add_argument("--master-port", type=int, default=None, metavar="P",
                   help="rendezvous port (default: a free port; required with --nnodes > 1)")
    p.add_argument("--job-id", default=None,
                   help="COLLIE_JOB_ID (default: random; with several hosts derived from A:P)")
    p.add_argument("--tag-output", action="store_true",
                   help="prefix each line a rank prints with '[RANK]: '")
    p.add_argument("-m", "--module", action="store_true",
                   help="run TARGET as a module, like python -m")
    p.add_argument("target", metavar="TARGET", help="script.py, or a module name with -m")
    p.add_argument("args", nargs=argparse.REMAINDER, help="passed to every rank untouched")
    opts = p.parse_args(argv)
    if opts.nproc < 1:
        p.error(f"-n must be at least 1, got {opts.nproc}")
    if opts.nnodes < 1:
        p.error(f"--nnodes must be at least 1, got {opts.nnodes}")
    if not 0 <= opts.node_rank < opts.nnodes:
        p.error(f"--node-rank must be in 0..{opts.nnodes - 1}, got {opts.node_rank}")
    if opts.nnodes > 1 and opts.master_port is None:
        p.error("--master-port is required with --nnodes > 1, so that all hosts meet on the same port")
    if opts.master_port is not None and not 0 < opts.master_port < 65536:
        p.error(f"--master-port must be in 1..65535, got {opts.master_port}")
    if opts.job_id is not None and (not opts.job_id or "-" in opts.job_id or "/" in opts.job_id):
        p.error(f"--job-id must be non-empty without '-' or '/' (it names /dev/shm files "
                f"collie-JOB-...), got {opts.job_id!r}")
    if not opts.module and not os.path.isfile(opts.target):
        p.error(f"no such script: {opts.target!r} (use -m to run a module)")
    return opts


def _forward(pipe, out: TextIO, prefix: str, lock: threading.Lock) -> threading.Thread:
    """Copy a rank's pipe to ``out`` line by line with ``prefix``, on a thread.

    It keeps reading even if ``out`` fails, so a rank never blocks on a full pipe.
    """
    def loop() -> None:
        with pipe:
            for raw in iter(pipe.readline, b""):
                line = raw.decode("utf-8", errors="replace")
                if not line.endswith("\n"):
                    line += "\n"
                with lock:
                    try:
                        out.write(prefix + line)
                        out.flush()
                    except (OSError, ValueError):
                        pass
    t = threading.Thread(target=loop, name=f"collie-forward-{prefix.strip('[]: ')}", daemon=True)
    t.start()
    return t


def die_with_parent() -> None:
    """In a rank, before exec: get SIGKILL when the launcher dies, however it
    dies (even by SIGKILL, when it cannot stop its ranks itself)."""
    import ctypes
    PR_SET_PDEATHSIG = 1
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass  # not Linux: the launcher's own signal handling still applies


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def _stop(procs: Mapping[int, subprocess.Popen]) -> list[int]:
    """SIGTERM every running rank's process group, SIGKILL those still there
    after GRACE_S; returns the ranks that were still running."""
    live = {rank: p for rank, p in procs.items() if p.poll() is None}
    for p in live.values():
        _signal_group(p, signal.SIGTERM)
    deadline = time.monotonic() + GRACE_S
    for p in live.values():
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal_group(p, signal.SIGKILL)
            p.wait()
    return sorted(live)


def _say(message: str) -> None:
    sys.stderr.write(f"collie run: {message}\n")
    sys.stderr.flush()


def _supervise(procs: dict[int, subprocess.Popen], caught: list[int]) -> int:
    """Wait for every rank; at the first failure or signal, stop the others.
    Returns the launcher's exit code."""
    running = dict(procs)
    while running:
        if caught:
            name = signal_name(caught[0])
            stopped = _stop(running)
            _say(f"got {name}, stopped {_ranks(stopped)}" if stopped else f"got {name}")
            return 128 + caught[0]
        failed = []
        for rank in sorted(running):
            code = running[rank].poll()
            if code is not None:
                del running[rank]
                if code != 0:
                    failed.append((rank, code))
        if failed:
            for rank, code in failed:
                _say(f"rank {rank} {describe_exit(code)}")
            stopped = _stop(running)
            if stopped:
                _say(f"stopped {_ranks(stopped)} after rank {failed[0][0]} failed")
            code = failed[0][1]
            return code if code > 0 else 128 - code
        time.sleep(_POLL_S)
    return 0


def main(argv: list[str] | None = None) -> int:
    """``collie run``: start the ranks, supervise them, return the exit code."""
    opts = _parse_args(argv)
    n = opts.nproc
    port = opts.master_port or free_port()
    job_id = opts.job_id or (job_id_for(opts.master_addr, port) if opts.nnodes > 1
                             else secrets.token_hex(4))
    cmd = [sys.executable, *(["-m"] if opts.module else []), opts.target, *opts.args]
    pipe = subprocess.PIPE if opts.tag_output else None

    # The ranks live in their own sessions, so the terminal's Ctrl-C reaches
    # only the launcher; it records the signal and the loop stops the ranks.
    caught: list[int] = []
    handled = (signal.SIGINT, signal.SIGTERM)
    previous = {}
    if threading.current_thread() is threading.main_thread():
        previous = {s: signal.signal(s, lambda num, frame: caught.append(num)) for s in handled}

    procs: dict[int, subprocess.Popen] = {}
    threads: list[threading.Thread] = []
    lock = threading.Lock()
    try:
        for local_rank in range(n):
            rank = opts.node_rank * n + local_rank
            env = dict(os.environ)
            env.update(rank_env(rank, n * opts.nnodes, local_rank, n, opts.node_rank,
                                opts.master_addr, port, job_id))
            if opts.tag_output:
                env.setdefault("PYTHONUNBUFFERED", "1")  # a pipe would block-buffer
            procs[rank] = p = subprocess.Popen(cmd, env=env, stdout=pipe, stderr=pipe,
                                               start_new_session=True, preexec_fn=die_with_parent)
            if opts.tag_output:
                threads.append(_forward(p.stdout, sys.stdout, f"[{rank}]: ", lock))
                threads.append(_forward(p.stderr, sys.stderr, f"[{rank}]: ", lock))
        return _supervise(procs, caught)
    finally:
        _stop(procs)  # only does something if starting or supervising raised
        deadline = time.monotonic() + 2.0  # a grandchild may hold a pipe open
        for t in threads:
            t.join(timeout=max(0.0, deadline - time.monotonic()))
        remove_shm(job_id)
        for s, handler in previous.items():
            signal.signal(s, handler)


# -- spawn() ------------------------------------------------------------------


class ProcessException(Exception):
    """A rank started by spawn() failed. ``rank`` and ``pid`` say which."""

    def __init__(self, message: str, rank: int, pid: int | None):
        super().__init__(message)
        self.rank = rank
        self.pid = pid


class ProcessRaisedException(ProcessException):
    """A rank raised an exception that could not be sent back to the parent
    (it did not pickle); the message holds the rank's traceback."""


class ProcessExitedException(ProcessException):
    """A rank exited with a non-zero code or died by a signal without raising."""

    def __init__(self, message: str, rank: int, pid: int | None,
                 exit_code: int, signal_name: str | None = None):
        super().__init__(message, rank, pid)
        self.exit_code = exit_code
        self.signal_name = signal_name


class RemoteTraceback(Exception):
    """Attached as ``__cause__`` of an exception re-raised from a rank, so the
    rank's own traceback is shown (as concurrent.futures does)."""

    def __init__(self, rank: int, text: str):
        super().__init__(rank, text)
        self.rank = rank
        self.text = text

    def __str__(self) -> str:
        return f'\n"""\nrank {self.rank}: {self.text}"""'


def _run_rank(fn: Callable[..., Any], rank: int, args: tuple, env: dict[str, str], conn) -> None:
    """The body of a spawned rank: set the env, run fn, report an exception."""
    os.environ.update(env)
    try:
        fn(rank, *args)
    except Exception as exc:
        text = traceback.format_exc()
        try:
            payload = pickle.dumps(exc)
        except Exception:
            payload = None
        conn.send((payload, text))
        conn.close()
        sys.exit(1)
    conn.close()


class SpawnContext:
    """The ranks of one spawn(); ``processes[i]`` is rank i."""

    def __init__(self, processes: list, readers: list, job_id: str):
        self.processes = processes
        self._readers = dict(enumerate(readers))
        self._errors: dict[int, tuple[bytes | None, str]] = {}
        self.job_id = job_id

    def join(self, timeout: float | None = None) -> bool:
        """Wait up to ``timeout`` seconds (None: forever) for the ranks.

        Returns True when all ranks exited cleanly, False if some still run
        at the timeout. At the first failed rank, stops the others and
        raises that rank's exception (see spawn()).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while True:
                self._read_errors()
                # One look at the exit codes per pass: a rank that exits
                # after it must still be waited on below, or join() would
                # sleep on the other ranks alone (a rank that closed its
                # report pipe and exited between two looks hung it so).
                codes = [p.exitcode for p in self.processes]
                # A rank that reported an exception has failed, before its
                # exit status is in.
                failed = [i for i, code in enumerate(codes) if i in self._errors or code not in (None, 0)]
                if failed:
                    self._finish()
                    raise self._error(failed[0])
                if all(code == 0 for code in codes):
                    self._finish()
                    return True
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                waitables = [p.sentinel for p, code in zip(self.processes, codes) if code is None]
                wait_any(waitables + list(self._readers.values()), timeout=left)
        except BaseException:
            self._finish()  # also on KeyboardInterrupt in the parent: no orphans
            raise

    def _read_errors(self) -> None:
        """Collect the reports ranks sent. Reading while they run matters: a
        large report would otherwise block its rank on a full pipe."""
        for rank, conn in list(self._readers.items()):
            try:
                while conn.poll():
                    self._errors[rank] = conn.recv()
            except (EOFError, OSError):
                conn.close()
                del self._readers[rank]

    def _finish(self) -> None:
        """Stop the ranks still running (SIGTERM, SIGKILL after GRACE_S), then
        release the pipes and the job's shared memory."""
        live = [p for p in self.processes if p.exitcode is None]
        for p in live:
            p.terminate()
        deadline = time.monotonic() + GRACE_S
        for p in live:
            p.join(max(0.0, deadline - time.monotonic()))
            if p.exitcode is None:
                p.kill()
                p.join()
        self._read_errors()
        for conn in self._readers.values():
            conn.close()
        self._readers.clear()
        remove_shm(self.job_id)

    def _error(self, rank: int) -> BaseException:
        proc = self.processes[rank]
        if rank in self._errors:
            payload, text = self._errors[rank]
            try:
                exc = pickle.loads(payload) if payload is not None else None
            except Exception:
                exc = None
            if isinstance(exc, BaseException):
                exc.__cause__ = RemoteTraceback(rank, text)
                return exc
            return ProcessRaisedException(
                f"rank {rank} (pid {proc.pid}) raised an exception that could not be "
                f"sent back:\n{text}", rank, proc.pid)
        code = proc.exitcode
        name = signal_name(-code) if code < 0 else None
        return ProcessExitedException(f"rank {rank} (pid {proc.pid}) {describe_exit(code)}",
                                      rank, proc.pid, code, name)


# What a forkserver imports once, before it forks ranks. Ranks forked from
# one parent share the physical pages of that code and data, so a core that
# switches between ranks (more ranks than cores) finds them still in its
# caches: 4 ranks on 2 cores ran an 8-byte all_reduce in 82-110 us forked
# that way against 115-160 us as fresh interpreters (docs/performance.md).
FORKSERVER_PRELOAD = ("collie", "numpy")


def _preload_in_forkserver(ctx) -> None:
    """Add FORKSERVER_PRELOAD to what the forkserver preloads (it takes
    effect when the server starts; a running server keeps its modules)."""
    from multiprocessing import forkserver
    current = list(getattr(getattr(forkserver, "_forkserver", None), "_preload_modules", None) or [])
    ctx.set_forkserver_preload(current + [m for m in FORKSERVER_PRELOAD if m not in current])


def spawn(fn: Callable[..., Any], args: tuple = (), nprocs: int = 1, join: bool = True,
          start_method: str = "spawn", env: Mapping[str, str] | None = None) -> SpawnContext | None:
    """Run ``fn(rank, *args)`` in ``nprocs`` processes, like
    torch.multiprocessing.spawn.

    Each process gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
    GROUP_RANK, MASTER_ADDR (127.0.0.1), MASTER_PORT (a free port) and
    COLLIE_JOB_ID in its environment, so ``collie.init_process_group()``
    works in ``fn``; ``env`` adds to or overrides them.

    Args:
        fn: a picklable function (module level) unless start_method is "fork".
        args: passed after the rank.
        nprocs: number of processes (ranks).
        join: wait for them; else return the SpawnContext at once.
        start_method: "spawn", "fork" or "forkserver" (whose server
            preloads collie and NumPy, see FORKSERVER_PRELOAD).
        env: extra environment variables for every rank.

    Returns:
        None when ``join`` is True, else a SpawnContext.

    Raises:
        At the first failed rank, after stopping the others: the exception
        that rank raised, with ``__cause__`` a RemoteTraceback holding its
        traceback text; ProcessRaisedException if it did not pickle;
        ProcessExitedException if the rank exited non-zero or by a signal.
    """
    if not isinstance(nprocs, int) or nprocs < 1:
        raise ValueError(f"spawn: nprocs must be a positive int, got {nprocs!r}")
    ctx = multiprocessing.get_context(start_method)
    if start_method == "forkserver":
        _preload_in_forkserver(ctx)
    extra = {k: str(v) for k, v in (env or {}).items()}
    job_id = extra.get("COLLIE_JOB_ID") or secrets.token_hex(4)
    port = free_port("127.0.0.1")
    processes, readers = [], []
    try:
        for rank in range(nprocs):
            # The child sets its env itself: with forkserver, the server's
            # environment is fixed when it starts, not when a child is made.
            child_env = rank_env(rank, nprocs, rank, nprocs, 0, "127.0.0.1", port, job_id)
            child_env.update(extra)
            reader, writer = ctx.Pipe(duplex=False)
            readers.append(reader)
            proc = ctx.Process(target=_run_rank, args=(fn, rank, tuple(args), child_env, writer),
                               name=f"collie-rank-{rank}")
            try:
                proc.start()
            finally:
                writer.close()  # so later ranks do not inherit it
            processes.append(proc)
    except BaseException:
        SpawnContext(processes, readers, job_id)._finish()
        raise
    context = SpawnContext(processes, readers, job_id)
    if join:
        context.join()
        return None
    return context
