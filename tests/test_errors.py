"""Failures are part of the API: a dead peer, a missing peer, ranks that
disagree, a wrong token. Every surviving rank raises a CollieError that says
what happened, quickly, and nothing is left behind."""

import os
import time
import uuid

import numpy as np
import pytest

from harness import run_ranks, shm_leftovers

pytestmark = pytest.mark.timeout(120)


def _victim_body(rank, size, how):
    import collie
    x = np.ones(1000)
    collie.all_reduce(x)                       # call #0 works
    if rank == 1:
        time.sleep(0.5)
        if how == "exception":
            raise RuntimeError("boom")
        if how == "exit":
            os._exit(7)
        time.sleep(60)                         # "kill": the test SIGKILLs it
    start = time.monotonic()
    try:
        collie.all_reduce(x)                   # call #1 never completes
    except collie.CollieError as exc:
        return type(exc).__name__, str(exc), getattr(exc, "peer", None), time.monotonic() - start
    return "no error"


@pytest.mark.parametrize("backend", ["shm", "tcp"])
@pytest.mark.parametrize("how", ["kill", "exception", "exit"])
def test_dead_peer_raises_peer_error_on_every_rank(how, backend):
    job = uuid.uuid4().hex[:10]
    res = run_ranks(_victim_body, 4, how, backend=backend, expect_errors=True,
                    kill={1: 1.5} if how == "kill" else None, env={"COLLIE_JOB_ID": job})
    for rank in (0, 2, 3):
        name, msg, peer, elapsed = res[rank]
        assert name == "PeerError", res[rank]
        assert "rank 1" in msg and "all_reduce" in msg and "call #1" in msg, msg
        assert elapsed < 5
    assert shm_leftovers(job) == []


def _late_body(rank, size):
    from datetime import timedelta

    import collie
    # The 1 s timeout is the group's, not the world's: setting up the world
    # may itself take a second on a loaded machine.
    group = collie.new_group(timeout=timedelta(seconds=1))
    if rank == 2:
        time.sleep(3)
        return None
    start = time.monotonic()
    try:
        collie.broadcast(np.zeros(10), src=2, group=group)
    except collie.CollieTimeout as exc:
        return str(exc), list(exc.peers), time.monotonic() - start
    return "no error"


def test_missing_peer_times_out_naming_it():
    res = run_ranks(_late_body, 3, expect_errors=True)
    for rank in (0, 1):
        msg, peers, elapsed = res[rank]
        assert "broadcast" in msg and "timed out" in msg and 2 in peers, msg
        assert 0.9 <= elapsed < 2.5


def _stuck_behind_p2p_body(rank, size):
    from datetime import timedelta

    import collie
    group = collie.new_group(timeout=timedelta(seconds=1))
    pair = collie.new_group([0, 1], timeout=timedelta(seconds=1))
    if rank == 2:  # alive, but it never sends what rank 0 waits for
        time.sleep(6)
        return None
    if rank == 0:
        try:
            collie.recv(np.zeros(4), src=2, group=group)
        except collie.CollieTimeout as exc:
            stuck = list(exc.peers)
        time.sleep(4)  # failed: it never comes to rank 1's call (as a program that ends on the error)
        return stuck
    time.sleep(2)  # rank 1 comes to its call after rank 0's wait failed
    try:
        collie.all_reduce(np.zeros(4), group=pair)
    except collie.CollieTimeout as exc:
        return str(exc), list(exc.peers)
    return "no error"


def test_a_timeout_behind_a_failed_point_to_point_wait_names_its_cause():
    """A rank whose point-to-point wait timed out (which breaks no group)
    answers later queries with the rank it waited on: a peer that then
    times out waiting for it in a collective is led to that rank, not
    stopped at the rank that failed first."""
    res = run_ranks(_stuck_behind_p2p_body, 3, backend="tcp", expect_errors=True)
    assert res[0] == [2], res
    text, peers = res[1]
    assert peers == [2] and "timed out" in text, text


def _mismatch_body(rank, size, kind):
    import collie
    x = np.ones(8, np.float32)
    try:
        if kind == "collective":
            if rank == 0:
                collie.all_gather_into_tensor(np.zeros(8 * size, np.float32), x)
            else:
                collie.all_reduce(x)
        elif kind == "dtype":
            collie.all_reduce(x if rank else x.astype(np.float64))
        elif kind == "count":
            collie.all_reduce(x if rank else np.ones(9, np.float32))
        elif kind == "root":
            collie.broadcast(x, src=0 if rank else 1, algorithm="direct")
        elif kind == "op":
            collie.all_reduce(x, op=collie.ReduceOp.MAX if rank == 2 else collie.ReduceOp.SUM)
    except collie.MismatchError as exc:
        return str(exc)
    except collie.CollieError as exc:
        return f"other: {type(exc).__name__}: {exc}"
    return "no error"


@pytest.mark.parametrize("kind", ["collective", "dtype", "count", "root", "op"])
def test_mismatched_calls_raise_mismatch_error(kind):
    res = run_ranks(_mismatch_body, 3, kind, expect_errors=True)
    raised = [r for r in res if isinstance(r, str) and not r.startswith(("no error", "other"))]
    # the ranks that can see the difference say what differs; the others are told
    assert len(raised) >= 2, res
    text = " ".join(raised)
    want = {"collective": "all_gather", "dtype": "float64", "count": "count=9", "root": "root=",
            "op": "op=MAX"}[kind]
    assert want in text, res


def _bad_args_body(rank, size):
    import collie
    errors = []
    calls = [
        lambda: collie.all_reduce(np.ones(2), op=collie.ReduceOp.BAND),          # bitwise on float
        lambda: collie.all_reduce(np.ones(2, complex), op=collie.ReduceOp.MAX),  # max on complex
        lambda: collie.all_reduce(np.ones(2, int), op=collie.ReduceOp.AVG),      # avg on int
        lambda: collie.all_reduce(np.ones(2), op="median"),
        lambda: collie.broadcast(np.ones(2), src=size),
        lambda: collie.all_gather([np.ones(1)], np.ones(1)),                     # wrong list length
        lambda: collie.all_gather_into_tensor(np.ones(3), np.ones(2)),
        lambda: collie.reduce_scatter_tensor(np.ones(2), np.ones(3)),
        lambda: collie.all_to_all_single(np.ones(3), np.ones(3), [1, 2], [1, 1, 1]),
        lambda: collie.all_reduce(np.ones(2), algorithm="nope"),
        lambda: collie.all_gather_into_tensor(np.ones(2 * size, np.float32), np.ones(2)),  # dtypes differ
    ]
    for call in calls:
        try:
            call()
            errors.append("no error")
        except (TypeError, ValueError) as exc:
            errors.append(type(exc).__name__)
    x = np.array([1.0])
    collie.all_reduce(x)  # nothing was sent by the bad calls: the group still works
    return errors, x[0]


def test_bad_arguments_raise_before_anything_is_sent():
    for errors, total in run_ranks(_bad_args_body, 3):
        assert errors == ["TypeError"] * 4 + ["ValueError"] * 6 + ["TypeError"], errors
        assert total == 3.0


def _token_body(rank, size):
    import collie
    x = np.array([1.0])
    collie.all_reduce(x)
    return x[0]


def test_same_token_works():
    assert run_ranks(_token_body, 3, env={"COLLIE_TOKEN": "s3cret"}) == [3.0] * 3


def _wrong_token_child(rank, size):
    import collie
    os.environ["COLLIE_TOKEN"] = "right" if rank != 1 else "wrong"
    try:
        collie.init_process_group(timeout=5)
    except collie.CollieError as exc:
        return type(exc).__name__, str(exc)
    collie.destroy_process_group()
    return "joined"


def test_wrong_token_is_refused_with_a_clear_error():
    res = run_ranks(_wrong_token_child, 3, init=False, expect_errors=True, timeout=60)
    name, msg = res[1]
    assert name == "AuthError" and "token" in msg.lower()
    for r in (0, 2):  # the others fail too (the refused rank never joins), not hang
        assert res[r] != "joined"


def _async_body(rank, size):
    import collie
    a, b = np.full(1000, float(rank)), np.full(10, 1.0)
    w1 = collie.all_reduce(a, async_op=True)
    w2 = collie.all_reduce(b, async_op=True)
    c = np.array([2.0])
    collie.all_reduce(c)                  # a blocking call runs after the queued ones
    w2.wait()
    w1.wait()
    return a[0], b[0], c[0], w1.is_completed(), w1.is_success()


def test_async_collectives_complete_in_call_order():
    res = run_ranks(_async_body, 3)
    assert res == [(3.0, 3.0, 6.0, True, True)] * 3


def _file_init_body(rank, size, path):
    import collie
    collie.init_process_group(init_method=f"file://{path}", rank=rank, world_size=size, timeout=30)
    try:
        x = np.array([float(rank)])
        collie.all_reduce(x)
        return x[0]
    finally:
        collie.destroy_process_group()


def test_file_init_joins_ranks_that_share_a_file(tmp_path):
    # file:// names no address for the ranks' own connections: they use loopback here
    assert run_ranks(_file_init_body, 3, str(tmp_path / "store"), init=False) == [3.0] * 3
