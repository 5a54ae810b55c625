"""Tests of `collie run` (as a real subprocess) and collie.launch.spawn().

Every rank a test starts writes its pid to OUT/pid.RANK; the `out` fixture
SIGKILLs any of them still alive at teardown, and fails the test if one was,
so no rank outlives its test whatever went wrong.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from collie.launch import (
    ProcessExitedException,
    ProcessRaisedException,
    RemoteTraceback,
    spawn,
)

pytestmark = pytest.mark.timeout(60)

ENV_KEYS = ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
            "MASTER_ADDR", "MASTER_PORT", "COLLIE_JOB_ID", "COLLIE_TEST_EXTRA"]
HAVE_SHM = os.path.isdir("/dev/shm")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _pids(out: Path) -> dict[int, int]:
    return {int(p.name.split(".")[1]): int(p.read_text()) for p in out.glob("pid.*")}


@pytest.fixture
def out(tmp_path):
    d = tmp_path / "out"
    d.mkdir()
    yield d
    leaked = []
    for pid in _pids(d).values():
        try:  # only our ranks: their command line names this test's directory
            mine = str(tmp_path).encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            mine = _alive(pid) and sys.platform != "linux"
        if mine and _alive(pid):
            leaked.append(pid)
            os.kill(pid, signal.SIGKILL)
    for p in multiprocessing.active_children():
        leaked.append(p.pid)
        p.kill()
        p.join(5)
    assert not leaked, f"processes outlived the test: {leaked}"


def _script(tmp_path: Path, out: Path, body: str, name: str = "rank.py") -> Path:
    """A rank script that records its pid, then runs ``body``."""
    prologue = f"""\
        import json, os, signal, sys, time
        RANK = int(os.environ["RANK"])
        OUT = {str(out)!r}
        with open(os.path.join(OUT, f".pid.{{RANK}}"), "w") as f:
            f.write(str(os.getpid()))
        os.rename(os.path.join(OUT, f".pid.{{RANK}}"), os.path.join(OUT, f"pid.{{RANK}}"))
        def write(name, value):
            with open(os.path.join(OUT, f"{{name}}.{{RANK}}"), "w") as f:
                json.dump(value, f)
        """
    path = tmp_path / name
    path.write_text(textwrap.dedent(prologue) + textwrap.dedent(body))
    return path


def _collie(*args: str, cwd: Path, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "collie", "run", *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=timeout)


def _read(out: Path, name: str) -> dict[int, object]:
    return {int(p.name.split(".")[1]): json.loads(p.read_text()) for p in out.glob(f"{name}.*")}


ENV_BODY = f"write('env', {{k: os.environ.get(k) for k in {ENV_KEYS!r}}})\n"


# -- collie run ----------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 3])
def test_run_sets_env(tmp_path, out, n):
    script = _script(tmp_path, out, ENV_BODY)
    res = _collie("-n", n, script, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    env = _read(out, "env")
    assert sorted(env) == list(range(n))
    for rank, e in env.items():
        assert e["RANK"] == e["LOCAL_RANK"] == str(rank)
        assert e["WORLD_SIZE"] == e["LOCAL_WORLD_SIZE"] == str(n)
        assert e["GROUP_RANK"] == "0"
        assert e["MASTER_ADDR"] == "127.0.0.1"
        assert 0 < int(e["MASTER_PORT"]) < 65536
    assert len({e["MASTER_PORT"] for e in env.values()}) == 1
    assert len({e["COLLIE_JOB_ID"] for e in env.values()}) == 1
    assert env[0]["COLLIE_JOB_ID"]


@pytest.mark.parametrize("mode", ["script", "module"])
def test_run_passes_arguments_through(tmp_path, out, mode):
    script = _script(tmp_path, out, "write('argv', sys.argv[1:])\n", name="collie_test_mod.py")
    target = ["-m", "collie_test_mod"] if mode == "module" else [script]
    res = _collie("-n", 2, *target, "--foo", "-n", "3", "--tag-output", "x", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert _read(out, "argv") == {r: ["--foo", "-n", "3", "--tag-output", "x"] for r in (0, 1)}
    assert res.stdout == ""  # --tag-output went to the script, not the launcher


def test_run_tag_output(tmp_path, out):
    script = _script(tmp_path, out, """\
        print(f"hello {RANK}")
        print(f"oops {RANK}", file=sys.stderr)
        sys.stdout.flush()
        sys.stdout.buffer.write(b"bin\\xff\\n")
        sys.stdout.buffer.write(b"tail")
        """)
    res = _collie("-n", 2, "--tag-output", script, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    for rank in (0, 1):
        assert f"[{rank}]: hello {rank}" in lines
        assert f"[{rank}]: bin\ufffd" in lines
        assert f"[{rank}]: tail" in lines
        assert f"[{rank}]: oops {rank}" in res.stderr.splitlines()
    assert all(line.startswith(("[0]: ", "[1]: ")) for line in lines)


def test_run_failure_stops_the_others(tmp_path, out):
    script = _script(tmp_path, out, """\
        if RANK == 1:
            sys.exit(3)
        time.sleep(60)
        """)
    start = time.monotonic()
    res = _collie("-n", 2, script, cwd=tmp_path)
    assert time.monotonic() - start < 15
    assert res.returncode == 3
    assert "collie run: rank 1 exited with code 3" in res.stderr
    assert "collie run: stopped rank 0 after rank 1 failed" in res.stderr
    assert "rank 0 exited" not in res.stderr and "rank 0 was" not in res.stderr
    assert not any(_alive(pid) for pid in _pids(out).values())


def test_run_reports_signal_and_removes_shm(tmp_path, out):
    job = uuid.uuid4().hex[:12]
    script = _script(tmp_path, out, f"""\
        if RANK == 1:
            if os.path.isdir("/dev/shm"):
                open("/dev/shm/collie-{job}-leak", "w").close()
                write("made", True)
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)
        """)
    try:
        res = _collie("-n", 2, "--job-id", job, script, cwd=tmp_path)
        assert res.returncode == 128 + signal.SIGKILL
        assert "collie run: rank 1 was killed by signal SIGKILL" in res.stderr
        if HAVE_SHM:
            assert _read(out, "made") == {1: True}
            assert not os.path.exists(f"/dev/shm/collie-{job}-leak")
    finally:
        if HAVE_SHM and os.path.exists(f"/dev/shm/collie-{job}-leak"):
            os.unlink(f"/dev/shm/collie-{job}-leak")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_run_signal_stops_all_ranks(tmp_path, out, sig):
    script = _script(tmp_path, out, "time.sleep(60)\n")
    launcher = subprocess.Popen([sys.executable, "-m", "collie", "run", "-n", "2", str(script)],
                                cwd=tmp_path, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 20
        while len(_pids(out)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        pids = _pids(out)
        assert len(pids) == 2, "the ranks did not start"
        launcher.send_signal(sig)
        _, err = launcher.communicate(timeout=15)
        assert launcher.returncode == 128 + sig
        assert f"got {sig.name}, stopped ranks 0, 1" in err
        assert not any(_alive(pid) for pid in pids.values())
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.communicate(timeout=5)


def test_run_multi_node_offsets_and_job_id(tmp_path, out):
    script = _script(tmp_path, out, ENV_BODY)
    common = ["-n", 2, "--nnodes", 2, "--master-addr", "10.255.0.1", "--master-port", 29999]
    res = _collie(*common, "--node-rank", 1, script, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    res = _collie(*common, "--node-rank", 0, script, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    env = _read(out, "env")
    assert sorted(env) == [0, 1, 2, 3]
    for rank, e in env.items():
        assert e["RANK"] == str(rank)
        assert e["LOCAL_RANK"] == str(rank % 2)
        assert e["GROUP_RANK"] == str(rank // 2)
        assert e["WORLD_SIZE"] == "4" and e["LOCAL_WORLD_SIZE"] == "2"
        assert (e["MASTER_ADDR"], e["MASTER_PORT"]) == ("10.255.0.1", "29999")
    assert len({e["COLLIE_JOB_ID"] for e in env.values()}) == 1  # both nodes agree


def test_run_multi_node_needs_port(tmp_path, out):
    script = _script(tmp_path, out, ENV_BODY)
    res = _collie("-n", 1, "--nnodes", 2, "--node-rank", 1, script, cwd=tmp_path)
    assert res.returncode == 2
    assert "--master-port is required" in res.stderr
    assert not list(out.iterdir())


def test_collie_help_lists_commands(tmp_path):
    res = subprocess.run([sys.executable, "-m", "collie", "--help"], capture_output=True,
                         text=True, timeout=30)
    assert res.returncode == 0
    assert "run" in res.stdout.split("commands:")[1]


# -- spawn() -------------------------------------------------------------------
# Module-level functions, so that start_method="spawn" can pickle them.


def _record_pid(out: str, rank: int) -> None:
    Path(out, f".pid.{rank}").write_text(str(os.getpid()))
    os.rename(Path(out, f".pid.{rank}"), Path(out, f"pid.{rank}"))


def _write_env(rank: int, out: str) -> None:
    _record_pid(out, rank)
    Path(out, f"env.{rank}").write_text(json.dumps({k: os.environ.get(k) for k in ENV_KEYS}))
    if rank == 0 and HAVE_SHM:  # a segment left behind, as after a SIGKILL
        open(f"/dev/shm/collie-{os.environ['COLLIE_JOB_ID']}-leftover", "w").close()


def _fail_on_1(rank: int, out: str, how: str) -> None:
    _record_pid(out, rank)
    if rank != 1:
        time.sleep(60)
    elif how == "raise":
        raise ValueError("bad value 42")
    elif how == "unpicklable":
        raise Unpicklable("cannot travel")
    elif how == "exit":
        os._exit(5)
    elif how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)


class Unpicklable(Exception):
    def __init__(self, message):
        super().__init__(message)
        self.callback = lambda: None


def _sleep(rank: int, seconds: float) -> None:
    time.sleep(seconds)


@pytest.mark.parametrize("start_method", ["fork", "spawn", "forkserver"])
def test_spawn_sets_env_and_cleans_shm(out, start_method):
    assert spawn(_write_env, args=(str(out),), nprocs=3 if start_method == "fork" else 2,
                 start_method=start_method, env={"COLLIE_TEST_EXTRA": "x"}) is None
    if start_method == "forkserver":  # the server preloads collie and NumPy, beside what it had
        from multiprocessing import forkserver
        preload = forkserver._forkserver._preload_modules
        assert preload[0] == "__main__" and {"collie", "numpy"} <= set(preload)
    env = _read(out, "env")
    n = len(env)
    assert sorted(env) == list(range(n))
    for rank, e in env.items():
        assert e["RANK"] == e["LOCAL_RANK"] == str(rank)
        assert e["WORLD_SIZE"] == e["LOCAL_WORLD_SIZE"] == str(n)
        assert e["MASTER_ADDR"] == "127.0.0.1" and int(e["MASTER_PORT"]) > 0
        assert e["COLLIE_TEST_EXTRA"] == "x"
    jobs = {e["COLLIE_JOB_ID"] for e in env.values()}
    assert len(jobs) == 1
    if HAVE_SHM:
        assert not os.path.exists(f"/dev/shm/collie-{jobs.pop()}-leftover")


def test_spawn_reraises_with_remote_traceback(out):
    start = time.monotonic()
    with pytest.raises(ValueError, match="bad value 42") as info:
        spawn(_fail_on_1, args=(str(out), "raise"), nprocs=2, start_method="fork")
    assert time.monotonic() - start < 15
    cause = info.value.__cause__
    assert isinstance(cause, RemoteTraceback) and cause.rank == 1
    assert "Traceback" in str(cause) and "_fail_on_1" in str(cause)
    assert "ValueError: bad value 42" in str(cause)
    assert not any(_alive(pid) for pid in _pids(out).values())


def test_spawn_unpicklable_exception(out):
    with pytest.raises(ProcessRaisedException, match="rank 1") as info:
        spawn(_fail_on_1, args=(str(out), "unpicklable"), nprocs=2, start_method="fork")
    assert info.value.rank == 1
    assert "Unpicklable: cannot travel" in str(info.value)


@pytest.mark.parametrize("how, code, name", [("exit", 5, None), ("kill", -9, "SIGKILL")])
def test_spawn_child_exit(out, how, code, name):
    start = time.monotonic()
    with pytest.raises(ProcessExitedException, match="rank 1") as info:
        spawn(_fail_on_1, args=(str(out), how), nprocs=2, start_method="fork")
    assert time.monotonic() - start < 15
    assert (info.value.rank, info.value.exit_code, info.value.signal_name) == (1, code, name)
    assert ("exited with code 5" if how == "exit" else "killed by signal SIGKILL") in str(info.value)
    assert not any(_alive(pid) for pid in _pids(out).values())


class _StandIn:
    """What SpawnContext.join reads of a process. ``exit_after`` reads of
    exitcode say None, the next ones ``code``; ``sentinel`` is readable once
    the process has exited (here: at once, as a closed pipe)."""

    def __init__(self, pid: int, code, exit_after: int):
        self.pid, self._code, self._reads = pid, code, exit_after
        read, write = os.pipe()
        if code is not None:
            os.close(write)  # a sentinel at end of file: the process is gone
        else:
            self._keep = write  # never readable: the process runs on
        self.sentinel = read
        self.terminated = False

    def close(self):
        os.close(self.sentinel)
        if self._code is None:
            os.close(self._keep)

    @property
    def exitcode(self):
        if self.terminated:
            return -signal.SIGTERM
        self._reads -= 1
        return None if self._reads >= 0 or self._code is None else self._code

    def terminate(self):
        self.terminated = True

    def join(self, timeout=None):
        pass

    def kill(self):
        self.terminated = True


def test_join_sees_a_rank_that_exits_between_two_looks():
    """A rank that fails after join() looked at the exit codes, before it
    chose what to wait on, must still end the wait: join() once slept on
    the other ranks alone (caught under load, fork-started ranks)."""
    from collie.launch import SpawnContext
    sleeper, failing = _StandIn(1001, None, 0), _StandIn(1002, 3, exit_after=1)
    ctx = SpawnContext([sleeper, failing], [], "standin" + uuid.uuid4().hex[:6])
    start = time.monotonic()
    try:
        with pytest.raises(ProcessExitedException, match="rank 1 .*exited with code 3"):
            ctx.join(timeout=5)
        assert time.monotonic() - start < 2 and sleeper.terminated
    finally:
        sleeper.close()
        failing.close()


def test_spawn_join_false():
    ctx = spawn(_sleep, args=(0.5,), nprocs=2, start_method="fork", join=False)
    try:
        assert len(ctx.processes) == 2
        assert ctx.join(timeout=0.01) is False
        assert ctx.join(timeout=20) is True
        assert [p.exitcode for p in ctx.processes] == [0, 0]
    finally:
        for p in ctx.processes:
            if p.exitcode is None:
                p.kill()
                p.join(5)
