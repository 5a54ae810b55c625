"""Timeouts given by the user: every public call that takes one rejects a
negative or NaN timeout with a ValueError naming the call and the value,
before it sends anything; timedelta and seconds are both taken, None means
the default, and Work.wait(timedelta(0)) keeps torch's meaning (no timeout
of its own: it waits for the call, which has its group's)."""

import math
import time
from datetime import timedelta

import numpy as np
import pytest

from harness import free_port, run_ranks

pytestmark = pytest.mark.timeout(120)

BAD = (-1, -0.5, math.nan, timedelta(seconds=-3))


def _reason(call) -> str:
    try:
        call()
    except ValueError as exc:
        return str(exc)
    return "no error"


def test_init_process_group_rejects_a_bad_timeout_before_the_rendezvous():
    import collie
    port = free_port()
    for bad in BAD:
        start = time.monotonic()
        # world_size=2 and no rank 1: a rendezvous would wait for it
        reason = _reason(lambda: collie.init_process_group(
            backend="tcp", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=2, timeout=bad))
        assert reason.startswith("init_process_group:") and repr(bad) in reason, reason
        assert time.monotonic() - start < 5
        assert not collie.is_initialized()


# entry point -> the call its message names
ENTRY_POINTS = {"new_group": "new_group", "new_subgroups": "new_subgroups",
                "new_subgroups_by_enumeration": "new_subgroups", "barrier": "barrier",
                "barrier of one rank": "barrier", "monitored_barrier": "monitored_barrier",
                "monitored_barrier of one rank": "monitored_barrier", "Work.wait": "Work.wait",
                "async Work.wait": "Work.wait"}


def _entry_points_body(rank, size):
    import collie
    solo = [collie.new_group([r]) for r in range(size)][rank]  # every rank makes every group
    peer = 1 - rank
    got = np.zeros(1)
    recv = collie.irecv(got, src=peer)              # in flight during the checks
    summed = np.ones(1)
    async_call = collie.all_reduce(summed, async_op=True)
    reasons = {}
    for bad in BAD:
        calls = {
            "new_group": lambda: collie.new_group(timeout=bad),
            "new_subgroups": lambda: collie.new_subgroups(1, timeout=bad),
            "new_subgroups_by_enumeration": lambda: collie.new_subgroups_by_enumeration(
                [[0], [1]], timeout=bad),
            "barrier": lambda: collie.barrier(timeout=bad),
            "barrier of one rank": lambda: collie.barrier(group=solo, timeout=bad),
            "monitored_barrier": lambda: collie.monitored_barrier(timeout=bad),
            "monitored_barrier of one rank": lambda: collie.monitored_barrier(group=solo, timeout=bad),
            "Work.wait": lambda: recv.wait(bad),
            "async Work.wait": lambda: async_call.wait(timeout=bad),
        }
        for name, call in calls.items():
            reasons.setdefault(name, []).append(_reason(call))
    # timedelta(0) is torch's "no timeout of its own": rank 0 waits for a
    # message rank 1 sends half a second later, instead of timing out at once.
    if rank == 1:
        time.sleep(0.5)
    sent = collie.isend(np.array([10.0 + rank]), dst=peer)
    start = time.monotonic()
    recv_done = recv.wait(timedelta(0))
    waited = time.monotonic() - start
    sent.wait(timedelta(seconds=30))
    async_done = async_call.wait(timedelta(0))
    # Nothing was sent by the refused calls: the world still agrees.
    collie.barrier(timeout=30)
    collie.barrier(timeout=timedelta(seconds=30))
    x = np.ones(1)
    collie.all_reduce(x)
    return reasons, recv_done, got[0], waited, async_done, summed[0], x[0]


def test_every_entry_point_rejects_a_bad_timeout_before_sending():
    for rank, (reasons, recv_done, got, waited, async_done, summed, total) in enumerate(
            run_ranks(_entry_points_body, 2, backend="auto")):
        assert set(reasons) == set(ENTRY_POINTS)
        for name, texts in reasons.items():
            for bad, text in zip(BAD, texts):
                assert text.startswith(f"{ENTRY_POINTS[name]}:") and repr(bad) in text, (name, text)
        assert recv_done is True and got == 10.0 + (1 - rank)
        if rank == 0:
            assert waited >= 0.3  # it did wait for rank 1's late message
        assert async_done is True and summed == 2.0 and total == 2.0
