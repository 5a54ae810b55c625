"""A job without a token: init_process_group warns once, on rank 0 only,
and COLLIE_REQUIRE_TOKEN=1 refuses it on every rank before anything
listens or connects. (Jobs that collie run and collie.spawn start get a
token: tests/test_launch.py.)"""

from __future__ import annotations

import select
import socket
import warnings

import numpy as np
import pytest

from harness import free_port, run_ranks

pytestmark = pytest.mark.timeout(120)

NO_TOKEN = {"COLLIE_TOKEN": "", "COLLIE_REQUIRE_TOKEN": ""}


def _init_and_sum(rank, size, init_method, init_size):
    """Join (recording every warning), run one all_reduce, leave; returns
    the warnings, each as (message, file it points at), and the sum."""
    import collie
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # count each one, not once per place
        collie.init_process_group(init_method=init_method, rank=rank, world_size=init_size)
        x = np.ones(1)
        collie.all_reduce(x)
        collie.destroy_process_group()
    return [(str(w.message), w.filename) for w in caught if issubclass(w.category, UserWarning)], x[0]


@pytest.mark.parametrize("kind", ["env", "tcp"])
def test_no_token_warns_once_on_rank_0(kind):
    init_method = "env://" if kind == "env" else f"tcp://127.0.0.1:{free_port()}"
    res = run_ranks(_init_and_sum, 3, init_method, 3, init=False, env=NO_TOKEN)
    assert [total for _, total in res] == [3.0] * 3
    said = res[0][0]
    assert len(said) == 1, said
    message, where = said[0]
    assert where == __file__  # it points at the caller's init_process_group
    for part in ("no token", "join it as a rank", "unpickle", "run code as this user",
                 "same COLLIE_TOKEN on every rank", "collie run", "COLLIE_REQUIRE_TOKEN=1"):
        assert part in message, (part, message)
    port = init_method.rsplit(":", 1)[1] if kind == "tcp" else None
    assert "its store at 127.0.0.1:" in message and (port is None or f":{port} " in message)
    assert res[1][0] == res[2][0] == []  # rank 0 only


def test_no_warning_with_a_token_or_alone():
    res = run_ranks(_init_and_sum, 2, "env://", 2, init=False)  # the harness gives a token
    assert res == [([], 2.0)] * 2
    res = run_ranks(_init_and_sum, 1, f"tcp://127.0.0.1:{free_port()}", 1, init=False, env=NO_TOKEN)
    assert res == [([], 1.0)]  # nobody else to let in


def _refused_before_connecting(rank, size):
    """Point rank 1 of 2 at a listener of our own: the init must fail
    without connecting to it."""
    import collie
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        try:
            collie.init_process_group(init_method=f"tcp://127.0.0.1:{port}", rank=1, world_size=2)
        except collie.AuthError as exc:
            connected = bool(select.select([listener], [], [], 0.5)[0])
            return str(exc), connected
    collie.destroy_process_group()
    return "joined", None


def test_require_token_refuses_before_connecting():
    (message, connected), = run_ranks(_refused_before_connecting, 1, init=False,
                                      env=dict(NO_TOKEN, COLLIE_REQUIRE_TOKEN="1"))
    assert "COLLIE_REQUIRE_TOKEN=1 and this job has no token" in message
    assert "same COLLIE_TOKEN on every rank" in message
    assert connected is False


def test_require_token_refuses_on_every_rank():
    res = run_ranks(_init_and_sum, 3, "env://", 3, init=False, expect_errors=True, timeout=60,
                    env=dict(NO_TOKEN, COLLIE_REQUIRE_TOKEN="1"))
    for r in res:
        assert r.type_name == "AuthError" and "COLLIE_REQUIRE_TOKEN=1" in r.message, r
    res = run_ranks(_init_and_sum, 2, "env://", 2, init=False, env={"COLLIE_REQUIRE_TOKEN": "1"})
    assert res == [([], 2.0)] * 2  # with the harness's token


def test_require_token_takes_0_or_1():
    res = run_ranks(_init_and_sum, 1, "env://", 1, init=False, expect_errors=True,
                    env={"COLLIE_REQUIRE_TOKEN": "yes"})
    assert res[0].type_name == "ValueError"
    assert "COLLIE_REQUIRE_TOKEN must be 0 or 1, not 'yes'" in res[0].message
