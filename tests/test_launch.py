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
            "MASTER_ADDR", "MASTER_PORT", "COLLIE_JOB_ID", "COLLIE_TOKEN", "COLLIE_TEST_EXTRA"]
HAVE_SHM = os.path.isdir("/dev/shm")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _running(pid: int) -> bool:
    """Alive and not a zombie (an orphan killed here waits for init to reap it)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


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


def _collie(*args: str, cwd: Path, timeout: float = 30, env=None) -> subprocess.CompletedProcess:
    """``collie run ARGS``; ``env`` adds to (None: removes) this process's
    environment, which has no COLLIE_TOKEN nor COLLIE_REQUIRE_TOKEN unless given."""
    full = {k: v for k, v in os.environ.items() if k not in ("COLLIE_TOKEN", "COLLIE_REQUIRE_TOKEN")}
    for k, v in (env or {}).items():
        if v is None:
            full.pop(k, None)
        else:
            full[k] = v
    return subprocess.run([sys.executable, "-m", "collie", "run", *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=timeout, env=full)


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


def test_run_gives_each_job_a_fresh_token(tmp_path, out):
    script = _script(tmp_path, out, ENV_BODY + "write('cmdline', open('/proc/self/cmdline', 'rb').read().decode())\n")
    tokens = []
    for _ in range(2):
        res = _collie("-n", 2, script, cwd=tmp_path)
        assert res.returncode == 0, res.stderr
        env = _read(out, "env")
        token = env[0]["COLLIE_TOKEN"]
        assert env[1]["COLLIE_TOKEN"] == token and len(bytes.fromhex(token)) == 16
        assert token not in res.stdout + res.stderr  # never printed...
        assert all(token not in cmd for cmd in _read(out, "cmdline").values())  # ...nor on a command line
        tokens.append(token)
    assert tokens[0] != tokens[1]
    res = _collie("-n", 2, script, cwd=tmp_path, env={"COLLIE_TOKEN": "users-own"})
    assert res.returncode == 0, res.stderr
    assert {e["COLLIE_TOKEN"] for e in _read(out, "env").values()} == {"users-own"}


def test_run_token_file(tmp_path, out):
    script = _script(tmp_path, out, ENV_BODY)
    secret = tmp_path / "secret"
    secret.write_text("  from-the-file\n")
    secret.chmod(0o600)
    res = _collie("-n", 2, "--token-file", secret, script, cwd=tmp_path, env={"COLLIE_TOKEN": "env"})
    assert res.returncode == 0, res.stderr
    assert {e["COLLIE_TOKEN"] for e in _read(out, "env").values()} == {"from-the-file"}
    assert "from-the-file" not in res.stdout + res.stderr
    for f in out.glob("*"):
        f.unlink()
    secret.chmod(0o640)  # others may read it: as ssh with a key, refuse
    res = _collie("-n", 2, "--token-file", secret, script, cwd=tmp_path)
    assert res.returncode == 2
    assert f"--token-file {secret} is open to group or others (mode 640): chmod 600 {secret}" in res.stderr
    secret.write_text("\n")
    secret.chmod(0o600)
    res = _collie("-n", 2, "--token-file", secret, script, cwd=tmp_path)
    assert res.returncode == 2 and f"--token-file {secret} is empty" in res.stderr
    res = _collie("-n", 2, "--token-file", tmp_path / "nowhere", script, cwd=tmp_path)
    assert res.returncode == 2 and "No such file" in res.stderr
    assert not list(out.iterdir())  # no rank started


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


# A rank that leaves a process behind: `sleep 300` in its process group,
# deaf to SIGTERM when `deaf` (an ignored signal stays ignored across exec).
LEAVE_SLEEP = textwrap.dedent("""\
    import subprocess
    def leave_sleep(deaf=False):
        cmd = ["sh", "-c", "trap '' TERM; exec sleep 300"] if deaf else ["sleep", "300"]
        write("sleep", subprocess.Popen(cmd).pid)
    """)


def _sleeps(out: Path) -> dict[int, int]:
    return _read(out, "sleep")


def _kill_sleeps(out: Path) -> None:
    for pid in _sleeps(out).values():
        if _running(pid) and b"sleep" in Path(f"/proc/{pid}/cmdline").read_bytes():
            os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("deaf", [False, True], ids=["sleep", "deaf-sleep"])
def test_run_ends_the_process_tree_of_a_failed_rank(tmp_path, out, deaf):
    script = _script(tmp_path, out, LEAVE_SLEEP + textwrap.dedent(f"""\
        if RANK == 1:
            leave_sleep({deaf})
            sys.exit(4)
        time.sleep(60)
        """))
    try:
        res = _collie("-n", 2, script, cwd=tmp_path)
        assert res.returncode == 4, res.stderr
        sleep = _sleeps(out)[1]
        assert not _running(sleep), "the sleep a failed rank started outlived the launcher"
    finally:
        _kill_sleeps(out)


def test_run_ends_what_ranks_leave_after_a_clean_end(tmp_path, out):
    script = _script(tmp_path, out, LEAVE_SLEEP + "leave_sleep()\n")
    try:
        res = _collie("-n", 2, script, cwd=tmp_path)
        assert res.returncode == 0, res.stderr
        assert sorted(_sleeps(out)) == [0, 1]
        assert not any(_running(pid) for pid in _sleeps(out).values())
    finally:
        _kill_sleeps(out)


def test_run_interrupted_ends_the_process_trees(tmp_path, out):
    script = _script(tmp_path, out, LEAVE_SLEEP + "leave_sleep(RANK == 1)\ntime.sleep(60)\n")
    launcher = subprocess.Popen([sys.executable, "-m", "collie", "run", "-n", "2", str(script)],
                                cwd=tmp_path, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 20
        while len(_sleeps(out)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(_sleeps(out)) == 2, "the ranks did not start"
        launcher.send_signal(signal.SIGINT)
        _, err = launcher.communicate(timeout=20)
        assert launcher.returncode == 128 + signal.SIGINT, err
        assert not any(_running(pid) for pid in _sleeps(out).values())
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.communicate(timeout=5)
        _kill_sleeps(out)


# Rank 3 fails first; rank 1 fails on its own 30 ms after rank 3 is dead (it
# waits on a lock rank 3 holds), which a polling pass could see together;
# the others exit non-zero on the launcher's SIGTERM. Only rank 3 is to blame.
FIRST_FAILURE = """\
    import fcntl
    lock = open(os.path.join(OUT, "lock"), "a+")
    def started():
        return len([n for n in os.listdir(OUT) if n.startswith("pid.")])
    if RANK == 3:
        fcntl.flock(lock, fcntl.LOCK_EX)
        write("locked", True)
        while started() < 4:
            time.sleep(0.01)
        os._exit(3)
    signal.signal(signal.SIGTERM, lambda *_: os._exit(1))
    if RANK == 1:
        while not os.path.exists(os.path.join(OUT, "locked.3")):
            time.sleep(0.01)
        fcntl.flock(lock, fcntl.LOCK_EX)  # rank 3 is gone
        time.sleep(0.03)
        os._exit(1)
    time.sleep(60)
    """


def test_run_names_the_first_rank_to_fail(tmp_path, out):
    script = _script(tmp_path, out, FIRST_FAILURE)
    res = _collie("-n", 4, script, cwd=tmp_path)
    said = [line for line in res.stderr.splitlines() if line.startswith("collie run:")]
    assert res.returncode == 3, res.stderr
    assert said[0] == "collie run: rank 3 exited with code 3", res.stderr
    assert said[-1].endswith("after rank 3 failed"), res.stderr
    for rank in (0, 2):  # stopped by the launcher: not failures of their own
        assert f"rank {rank} exited" not in res.stderr
    assert not any(_alive(pid) for pid in _pids(out).values())


@pytest.mark.skipif(not HAVE_SHM, reason="no /dev/shm")
@pytest.mark.parametrize("kill_launcher", [False, True], ids=["ranks", "launcher-too"])
def test_run_killed_during_setup_leaves_no_shm_file(tmp_path, out, kill_launcher):
    """With COLLIE_SHM_MEMFD=0, rank 0 publishes a /dev/shm file and waits
    for rank 1, which stalls; then the job is SIGKILLed. The launcher
    removes the file; if the launcher is killed too, the next job's setup
    sweeps it (its owner is dead)."""
    job = uuid.uuid4().hex[:12]
    script = _script(tmp_path, out, """\
        import collie
        from collie.transports import shm
        if RANK == 1:
            shm.ShmTransport._create = lambda self, memfd: time.sleep(300)
        collie.init_process_group(backend="shm")
        """)
    env = dict(os.environ, COLLIE_SHM_MEMFD="0")
    launcher = subprocess.Popen([sys.executable, "-m", "collie", "run", "-n", "2", "--job-id", job,
                                 str(script)], cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while not (files := [f for f in os.listdir("/dev/shm") if f.startswith(f"collie-{job}-0-")]):
            assert time.monotonic() < deadline, "rank 0 made no /dev/shm file"
            time.sleep(0.05)
        if kill_launcher:
            launcher.kill()
            launcher.communicate(timeout=10)
        for pid in _pids(out).values():
            os.kill(pid, signal.SIGKILL)
        if not kill_launcher:
            _, err = launcher.communicate(timeout=20)
            assert launcher.returncode == 128 + signal.SIGKILL, err
            assert not [f for f in os.listdir("/dev/shm") if f.startswith(f"collie-{job}-")]
            return
        deadline = time.monotonic() + 10
        while any(_alive(pid) for pid in _pids(out).values()):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert os.path.exists(f"/dev/shm/{files[0]}")  # nobody left to remove it...
        next_job = _script(tmp_path, out, """\
            import collie
            collie.init_process_group(backend="shm")
            collie.destroy_process_group()
            """, name="next.py")
        res = _collie("-n", 2, next_job, cwd=tmp_path)
        assert res.returncode == 0, res.stderr
        assert not os.path.exists(f"/dev/shm/{files[0]}")  # ...but the next job
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.communicate(timeout=5)
        for f in os.listdir("/dev/shm"):
            if f.startswith(f"collie-{job}-"):
                os.unlink(f"/dev/shm/{f}")


@pytest.mark.skipif(not HAVE_SHM, reason="no /dev/shm")
def test_sweep_removes_only_files_of_dead_owners(tmp_path):
    import fcntl

    from collie.transports.segment import sweep_segments
    gone = subprocess.Popen(["true"])
    gone.wait()
    job = uuid.uuid4().hex[:12]
    stale, live, locked, link, other = (f"/dev/shm/collie-{job}-{end}" for end in (
        f"0-{gone.pid}", f"1-{os.getpid()}", f"2-{gone.pid}", f"3-{gone.pid}", "leak"))
    target = tmp_path / "target"
    target.write_text("keep")
    try:
        for path in (stale, live, locked, other):
            Path(path).write_bytes(b"x")
        os.symlink(target, link)
        with open(locked) as held:  # as an owner in another pid namespace holds it
            fcntl.flock(held, fcntl.LOCK_EX)
            removed = sweep_segments()
        assert stale in removed and not os.path.exists(stale)
        for path in (live, locked, link, other):
            assert path not in removed and os.path.lexists(path)
        assert target.read_text() == "keep"
    finally:
        for path in (stale, live, locked, link, other):
            if os.path.lexists(path):
                os.unlink(path)


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


def test_run_multi_node_token(tmp_path, out):
    """Hosts cannot agree on a secret each makes up: it comes from
    COLLIE_TOKEN or --token-file, and without one the launcher says in one
    line how to share one, then goes on (or stops, if one is required)."""
    script = _script(tmp_path, out, ENV_BODY)
    common = ["-n", 1, "--nnodes", 2, "--node-rank", 1, "--master-addr", "10.255.0.1",
              "--master-port", 29999, script]
    res = _collie(*common, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    said = [line for line in res.stderr.splitlines() if line.startswith("collie run:")]
    assert len(said) == 1 and "no token" in said[0] and "10.255.0.1:29999" in said[0]
    assert "python3 -c 'import secrets; print(secrets.token_hex(16))'" in said[0]
    assert "every host as COLLIE_TOKEN" in said[0] and "--token-file PATH" in said[0]
    assert _read(out, "env")[1]["COLLIE_TOKEN"] is None

    res = _collie(*common, cwd=tmp_path, env={"COLLIE_TOKEN": "shared"})
    assert res.returncode == 0 and "collie run:" not in res.stderr, res.stderr
    assert _read(out, "env")[1]["COLLIE_TOKEN"] == "shared"

    for f in out.glob("*"):
        f.unlink()
    res = _collie(*common, cwd=tmp_path, env={"COLLIE_REQUIRE_TOKEN": "1"})
    assert res.returncode == 2
    assert "COLLIE_REQUIRE_TOKEN=1 and no token" in res.stderr
    assert not list(out.iterdir())


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
    tokens = {e["COLLIE_TOKEN"] for e in env.values()}
    assert len(tokens) == 1 and len(bytes.fromhex(tokens.pop())) == 16
    if HAVE_SHM:
        assert not os.path.exists(f"/dev/shm/collie-{jobs.pop()}-leftover")


def test_spawn_token_is_fresh_unless_given(out, monkeypatch):
    monkeypatch.delenv("COLLIE_TOKEN", raising=False)
    tokens = []
    for _ in range(2):
        spawn(_write_env, args=(str(out),), nprocs=2, start_method="fork")
        tokens.append({e["COLLIE_TOKEN"] for e in _read(out, "env").values()})
    assert len(tokens[0]) == len(tokens[1]) == 1 and tokens[0] != tokens[1]
    monkeypatch.setenv("COLLIE_TOKEN", "users-own")
    spawn(_write_env, args=(str(out),), nprocs=2, start_method="spawn")
    assert {e["COLLIE_TOKEN"] for e in _read(out, "env").values()} == {"users-own"}
    spawn(_write_env, args=(str(out),), nprocs=2, start_method="fork", env={"COLLIE_TOKEN": "given"})
    assert {e["COLLIE_TOKEN"] for e in _read(out, "env").values()} == {"given"}


def _fail_in_order(rank: int, out: str) -> None:
    """Rank 3 raises first; rank 1 raises 30 ms after rank 3 is dead (it
    waits on a lock rank 3 holds); the others wait to be stopped."""
    import fcntl
    _record_pid(out, rank)
    lock = open(os.path.join(out, "lock"), "a+")
    if rank == 3:
        fcntl.flock(lock, fcntl.LOCK_EX)
        Path(out, "locked").touch()
        while len(_pids(Path(out))) < 4:
            time.sleep(0.01)
        raise ValueError("rank 3 failed first")
    if rank == 1:
        while not Path(out, "locked").exists():
            time.sleep(0.01)
        fcntl.flock(lock, fcntl.LOCK_EX)
        time.sleep(0.03)
        raise ValueError("rank 1 failed later")
    time.sleep(60)


@pytest.mark.parametrize("start_method", ["fork", "forkserver"])
def test_spawn_names_the_first_rank_to_fail(out, start_method):
    with pytest.raises(ValueError, match="rank 3 failed first") as info:
        spawn(_fail_in_order, args=(str(out),), nprocs=4, start_method=start_method)
    assert info.value.__cause__.rank == 3
    assert not any(_alive(pid) for pid in _pids(out).values())


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
