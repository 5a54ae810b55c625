"""The fault suite, signals: a rank of a running random program is SIGKILLed
or SIGSTOPped at a random moment, on shm and on tcp; every other rank must
raise, never hang, naming that rank, and nothing may be left behind.

Each case is one collie.soak.fault run: 3 or 4 local ranks run the seed's
random program (every collective, sub-groups, async calls, sizes up to
1 MiB); a random rank gets the signal a random delay after the warm-up; the
times are from the signal to each survivor's exception. A SIGKILLed rank
must give PeerError naming it (in ``.peer`` and in the message) within
5 s; a SIGSTOPped one CollieTimeout naming it in ``.peers`` within the
group's timeout (2 s) plus 4 s. Then: every survivor ended cleanly, no
process of the job is left, and no /dev/shm file of the job (the ranks
unlink theirs at setup; the check is made before the launcher's own
clean-up). Some shm cases publish files instead of memfds, so that there is
something to leave. `collie soak --fault kill|stop` runs the same for the
figures of docs/reliability.md.
"""

import os
import time

import pytest

from collie.soak import fault

pytestmark = pytest.mark.timeout(120)

FILES = {"COLLIE_SHM_MEMFD": "0"}  # shared memory as /dev/shm files, not memfds


def _gone(pid: int) -> bool:
    """No such process, or only its zombie, within a few seconds."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


def _check(run) -> None:
    assert sorted(run.survivors) == [r for r in range(len(run.pids)) if r != run.victim]
    for rank, rec in run.survivors.items():
        where = f"{run.fault} rank {run.victim} ({run.backend}, seed {run.seed}): survivor rank {rank}: {rec}"
        assert rec is not None, where  # it never raised
        if run.fault == "kill":
            assert rec["error"] == "PeerError", where
            assert rec["peer"] == run.victim and f"rank {run.victim}" in rec["message"], where
            assert rec["after"] < 5, where
        else:
            assert rec["error"] == "CollieTimeout", where
            assert run.victim in rec["peers"], where
            assert rec["after"] < run.timeout + 4, where
        assert run.exitcodes[rank] == 0, where
    assert run.shm_left == []
    assert all(_gone(pid) for pid in run.pids), run.pids
    assert not [n for n in os.listdir("/dev/shm") if n.startswith(f"collie-{run.job_id}-")]


@pytest.mark.parametrize("nranks,backend,seed,env", [
    (4, "shm", 1, {}), (3, "shm", 2, FILES), (4, "shm", 3, FILES), (4, "shm", 4, {}),
    (4, "tcp", 5, {}), (3, "tcp", 6, {}), (4, "tcp", 7, {}), (4, "tcp", 8, {}),
])
def test_a_killed_rank_is_named_by_every_survivor(nranks, backend, seed, env):
    _check(fault(nranks, "kill", backend, seed, env=env))


@pytest.mark.parametrize("nranks,backend,seed,env", [
    (4, "shm", 9, {}), (3, "shm", 10, FILES), (4, "shm", 11, {}),
    (4, "tcp", 12, {}), (3, "tcp", 13, {}), (4, "tcp", 14, {}),
])
def test_a_stopped_rank_times_out_on_every_survivor(nranks, backend, seed, env):
    _check(fault(nranks, "stop", backend, seed, timeout=2.0, env=env))
