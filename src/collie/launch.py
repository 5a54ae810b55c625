"""Start the ranks of a job on this host: ``collie run`` and ``collie.spawn()``.

Both follow one policy, so a job never half-dies and never hangs:

- every rank gets the env:// variables (RANK, WORLD_SIZE, LOCAL_RANK,
  LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT), COLLIE_JOB_ID, a
  short id shared by the ranks of one launch, and COLLIE_TOKEN, the job's
  secret (docs/security.md): the user's own if set, else a fresh one. It
  travels in the environment, never on a command line. Several hosts must
  share one, so ``collie run --nnodes K`` takes it from COLLIE_TOKEN or
  ``--token-file`` and makes none up;
- the first rank that fails (non-zero exit, a signal, an exception) makes the
  launcher stop the others: SIGTERM, then SIGKILL after GRACE_S seconds. A
  thread per rank waits for it, so "first" is the order in which the ranks
  exit, not the order of a polling pass, and the others' exits, caused by
  the launcher, are never blamed;
- once every rank is gone, shared-memory files named ``collie-{job}-*`` are
  removed from /dev/shm. The shm transport names its segments that way and
  unlinks them itself; this is the safety net for ranks that were SIGKILLed.

``collie run`` starts each rank in its own session (so its process group is
the rank and everything it started), forwards Ctrl-C / SIGTERM to them, and
when the job ends, however it ends, signals every rank's process group, also
of ranks that already exited: a ``sleep 300 &`` a rank left behind goes too.
A rank that exited is reaped only after that, so its pid, the group's id,
cannot be taken by an unrelated process meanwhile.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import multiprocessing
import os
import pickle
import queue
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from multiprocessing.connection import wait as wait_any
from typing import Any, Callable, Mapping, Optional, TextIO

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


def new_token() -> str:
    """A fresh secret for one job: 128 random bits, in hex."""
    return secrets.token_hex(16)


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


NO_TOKEN_HINT = ("no token: any process that can reach {where} can join this job; to protect it, "
                 "make a secret once (python3 -c 'import secrets; print(secrets.token_hex(16))') and "
                 "give it to every host as COLLIE_TOKEN, or in a file only you can read: --token-file PATH")


def _is_python(target: str) -> bool:
    """Whether TARGET names a Python interpreter (python, python3, python3.11,
    or a path to one) rather than a script."""
    import re
    import shutil
    return (re.fullmatch(r"python[0-9.]*", os.path.basename(target)) is not None
            and not target.endswith(".py") and shutil.which(target) is not None)


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
    p.add_argument("--token-file", default=None, metavar="PATH",
                   help="read the job's secret from PATH (mode 600), the same file on every host "
                        "(default: $COLLIE_TOKEN, else a fresh secret on one host, none on several)")
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
    opts.command = None
    if not opts.module and _is_python(opts.target):
        # `collie run -n 2 python x.py`: run what follows with the interpreter named
        if not opts.args:
            p.error(f"{opts.target!r} is a Python interpreter: give the script after it "
                    f"(collie run -n {opts.nproc} script.py also works, without {opts.target!r})")
        opts.command = [opts.target, *opts.args]
    elif not opts.module and not os.path.isfile(opts.target):
        p.error(f"no such script: {opts.target!r} (use -m to run a module)")
    try:
        opts.token = _job_token(opts)
    except ValueError as exc:
        p.error(str(exc))
    return opts


def read_token_file(path: str) -> str:
    """The secret in ``path``, stripped. Like ssh with a private key, refuse
    a file that group or others may read or write: the secret would not be
    one."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as exc:
        raise ValueError(f"--token-file {path}: {exc.strerror}") from None
    with open(fd, encoding="utf-8", errors="replace") as f:
        mode = os.fstat(fd).st_mode & 0o777
        token = f.read().strip()
    if mode & 0o077:
        raise ValueError(f"--token-file {path} is open to group or others (mode {mode:o}): "
                         f"chmod 600 {path}")
    if not token:
        raise ValueError(f"--token-file {path} is empty")
    return token


def _job_token(opts: argparse.Namespace) -> Optional[str]:
    """The secret the ranks get in COLLIE_TOKEN: --token-file, else
    $COLLIE_TOKEN, else on one host a fresh one. The hosts of a multi-node
    job cannot agree on a secret made up on each, so there none is made up:
    say in one line how to share one, and go on without (the ranks refuse
    to start under COLLIE_REQUIRE_TOKEN=1, so refuse here already)."""
    from .group import token_required
    if opts.token_file is not None:
        return read_token_file(opts.token_file)
    if os.environ.get("COLLIE_TOKEN"):
        return os.environ["COLLIE_TOKEN"]
    if opts.nnodes == 1:
        return new_token()
    if token_required():
        raise ValueError("COLLIE_REQUIRE_TOKEN=1 and no token: set the same COLLIE_TOKEN on "
                         "every host, or pass --token-file PATH")
    _say(NO_TOKEN_HINT.format(where=f"{opts.master_addr}:{opts.master_port}"))
    return None


def _forward(pipe, out: TextIO, prefix: str, lock: threading.Lock, rank: int = 0) -> threading.Thread:
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
    t = threading.Thread(target=loop, name=f"collie-forward-{rank}", daemon=True)
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


def _watch(rank: int, proc: subprocess.Popen, events: queue.SimpleQueue) -> None:
    """On a thread: wait for the rank to exit and queue (rank, exit code),
    Popen-style. WNOWAIT leaves it unreaped (see _stop)."""
    try:
        info = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)
    except ChildProcessError:
        return  # reaped already: the job is over
    code = info.si_status if info.si_code == os.CLD_EXITED else -info.si_status
    events.put((rank, code))


def _signal_groups(procs: Mapping[int, subprocess.Popen], sig: int) -> None:
    """Send ``sig`` to the process group of every rank not yet reaped: an
    unreaped rank's pid (a zombie's, if it exited) is still its group's id,
    and no other process can have it."""
    for p in procs.values():
        if p.returncode is None:
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                pass


def _exited(proc: subprocess.Popen) -> bool:
    """Whether the rank has exited (reaped or not), without reaping it."""
    if proc.returncode is not None:
        return True
    try:
        return os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT | os.WNOHANG) is not None
    except ChildProcessError:
        return True


def _stop(procs: Mapping[int, subprocess.Popen], events: queue.SimpleQueue) -> list[int]:
    """End the job: SIGTERM every rank's process group, wait up to GRACE_S
    for the ranks still running (another signal to the launcher cuts that
    short), SIGKILL the groups (what is left of them: ranks that did not
    stop, what the ranks started), then reap the ranks. Idempotent.
    Returns the ranks that were still running."""
    running = sorted(r for r, p in procs.items() if not _exited(p))
    _signal_groups(procs, signal.SIGTERM)
    deadline = time.monotonic() + GRACE_S
    while not all(_exited(procs[r]) for r in running):
        try:
            rank, _ = events.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            break
        if rank is None:
            break  # Ctrl-C again: no more grace
    _signal_groups(procs, signal.SIGKILL)
    for p in procs.values():
        if p.returncode is None:
            try:
                os.kill(p.pid, signal.SIGKILL)  # in case it left its group
            except ProcessLookupError:
                pass
        p.wait()
    return running


def _say(message: str) -> None:
    sys.stderr.write(f"collie run: {message}\n")
    sys.stderr.flush()


def _supervise(procs: dict[int, subprocess.Popen], events: queue.SimpleQueue) -> int:
    """Wait for every rank; at the first failure or signal, stop the others.
    ``events`` holds (rank, exit code) as the ranks exit, and (None, signal)
    when the launcher gets one. Returns the launcher's exit code."""
    running = set(procs)
    while running:
        rank, code = events.get()
        if rank is None:
            stopped = _stop(procs, events)
            name = signal_name(code)
            _say(f"got {name}, stopped {_ranks(stopped)}" if stopped else f"got {name}")
            return 128 + code
        running.discard(rank)
        if code != 0:
            _say(f"rank {rank} {describe_exit(code)}")
            while True:  # those that failed on their own too, before the launcher stepped in
                try:
                    other, other_code = events.get_nowait()
                except queue.Empty:
                    break
                if other is not None and other_code != 0:
                    _say(f"rank {other} {describe_exit(other_code)}")
            stopped = _stop(procs, events)
            if stopped:
                _say(f"stopped {_ranks(stopped)} after rank {rank} failed")
            return code if code > 0 else 128 - code
    return 0


def main(argv: list[str] | None = None) -> int:
    """``collie run``: start the ranks, supervise them, return the exit code."""
    opts = _parse_args(argv)
    n = opts.nproc
    port = opts.master_port or free_port()
    job_id = opts.job_id or (job_id_for(opts.master_addr, port) if opts.nnodes > 1
                             else secrets.token_hex(4))
    cmd = opts.command or [sys.executable, *(["-m"] if opts.module else []), opts.target, *opts.args]
    # Every rank's output goes through a pipe that the launcher copies line by
    # line (as mpiexec does), so that lines of several ranks never mix
    # mid-line, whatever the ranks' buffering (PYTHONUNBUFFERED=1 writes a
    # print's text and its newline apart).
    pipe = subprocess.PIPE
    prefix = "[{rank}]: " if opts.tag_output else ""

    # The ranks live in their own sessions, so the terminal's Ctrl-C reaches
    # only the launcher; it queues the signal and _supervise stops the ranks.
    # (SimpleQueue.put may be called from a signal handler.)
    events: queue.SimpleQueue = queue.SimpleQueue()
    handled = (signal.SIGINT, signal.SIGTERM)
    previous = {}
    if threading.current_thread() is threading.main_thread():
        previous = {s: signal.signal(s, lambda num, frame: events.put((None, num))) for s in handled}

    procs: dict[int, subprocess.Popen] = {}
    threads: list[threading.Thread] = []
    lock = threading.Lock()
    try:
        for local_rank in range(n):
            rank = opts.node_rank * n + local_rank
            env = dict(os.environ)
            env.update(rank_env(rank, n * opts.nnodes, local_rank, n, opts.node_rank,
                                opts.master_addr, port, job_id))
            if opts.token:
                env["COLLIE_TOKEN"] = opts.token
            env.setdefault("PYTHONUNBUFFERED", "1")  # a pipe would block-buffer
            procs[rank] = p = subprocess.Popen(cmd, env=env, stdout=pipe, stderr=pipe,
                                               start_new_session=True, preexec_fn=die_with_parent)
            threading.Thread(target=_watch, args=(rank, p, events), name=f"collie-watch-{rank}",
                             daemon=True).start()
            threads.append(_forward(p.stdout, sys.stdout, prefix.format(rank=rank), lock, rank))
            threads.append(_forward(p.stderr, sys.stderr, prefix.format(rank=rank), lock, rank))
        return _supervise(procs, events)
    finally:
        # After a failure or a signal the ranks are gone already; after a
        # clean end this ends what they left running. Then reap them.
        _stop(procs, events)
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
    """The ranks of one spawn(); ``processes[i]`` is rank i.

    A thread per rank reads what the rank reports and waits for it to exit,
    and queues each as it happens (rank, True: it raised; rank, None: it
    ended), so join() raises for the first rank to fail, not for the
    lowest-numbered one of those it finds failed when it looks.
    """

    def __init__(self, processes: list, readers: list, job_id: str):
        self.processes = processes
        self.job_id = job_id
        self._errors: dict[int, tuple[bytes | None, str]] = {}
        self._events: queue.SimpleQueue = queue.SimpleQueue()
        self._done: set[int] = set()  # ranks that exited cleanly
        for conn in readers[len(processes):]:  # of a rank that did not start
            conn.close()
        self._watchers = [threading.Thread(target=self._watch, args=(rank, proc, readers[rank]),
                                           name=f"collie-watch-{rank}", daemon=True)
                          for rank, proc in enumerate(processes)]
        for t in self._watchers:
            t.start()

    def _watch(self, rank: int, proc, reader) -> None:
        """On a thread: read the rank's report while it runs (a large one
        would block it on a full pipe), and queue its end as soon as its
        sentinel shows it. It never reaps the process: that stays with the
        caller's thread (join(), or the caller's own look at
        ``processes``), since two threads reaping one process race."""
        with reader:
            while True:
                ready = wait_any([reader, proc.sentinel])
                if reader not in ready:
                    break  # it exited; a report it sent first would have been ready too
                try:
                    self._errors[rank] = reader.recv()
                except (EOFError, OSError):
                    break  # it closed the pipe: no (more) report
                self._events.put((rank, True))
        wait_any([proc.sentinel])
        self._events.put((rank, None))  # ended: join() reads how

    def join(self, timeout: float | None = None) -> bool:
        """Wait up to ``timeout`` seconds (None: forever) for the ranks.

        Returns True when all ranks exited cleanly, False if some still run
        at the timeout. At the first failed rank, stops the others and
        raises that rank's exception (see spawn()).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while len(self._done) < len(self.processes):
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                try:
                    rank, failed = self._events.get(timeout=left)
                except queue.Empty:
                    return False
                if failed is None:  # it ended: how?
                    self.processes[rank].join()
                    failed = self.processes[rank].exitcode != 0
                if failed:  # an exception reported, or a bad exit
                    self._finish()
                    raise self._error(rank)
                self._done.add(rank)
            self._finish()
            return True
        except BaseException:
            self._finish()  # also on KeyboardInterrupt in the parent: no orphans
            raise

    def _finish(self) -> None:
        """Stop the ranks still running (SIGTERM, SIGKILL after GRACE_S), reap
        them, and release the job's shared memory."""
        live = [(p, t) for p, t in zip(self.processes, self._watchers) if t.is_alive()]
        for p, _ in live:
            p.terminate()
        deadline = time.monotonic() + GRACE_S
        for p, t in live:
            t.join(max(0.0, deadline - time.monotonic()))
            if t.is_alive():
                p.kill()
                t.join()
        for p in self.processes:
            p.join()
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
    GROUP_RANK, MASTER_ADDR (127.0.0.1), MASTER_PORT (a free port),
    COLLIE_JOB_ID and COLLIE_TOKEN (the caller's, else a fresh secret) in
    its environment, so ``collie.init_process_group()`` works in ``fn``;
    ``env`` adds to or overrides them.

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
        At the first rank to fail, after stopping the others: the exception
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
    token = os.environ.get("COLLIE_TOKEN") or new_token()
    port = free_port("127.0.0.1")
    processes, readers = [], []
    try:
        for rank in range(nprocs):
            # The child sets its env itself: with forkserver, the server's
            # environment is fixed when it starts, not when a child is made.
            child_env = rank_env(rank, nprocs, rank, nprocs, 0, "127.0.0.1", port, job_id)
            child_env["COLLIE_TOKEN"] = token
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
