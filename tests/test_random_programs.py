"""Random programs of collectives, checked against NumPy, on real ranks.

Most tests run each collective on its own (test_collectives.py also has a
short random sequence of four collectives on fixed groups). Here every rank
runs the same seeded random sequence of calls: any collective or point-to-point
exchange, on the world or on one of three random sub-groups, with a random
algorithm, dtype, reduce op, size (some large enough to go single copy or
to need several slices of the shared window), buffer layout (plain,
strided, a torch tensor, in place) and uneven splits, some calls left in
flight (async_op=True) while others start. This is where bugs of
interaction live: a message taken by the wrong call, a window rewritten too
early, a cached plan reused for another shape, a slice that does not fit.
Small shared-memory slots and a small window make the rare paths common.

Every rank can compute every rank's input (small integers, exact in any
order), so each checks its own results locally. A failure names the call
(its number, collective, group and arguments): rerun the seed to replay it.
The programs are collie.soak's (``collie soak`` runs them for long).
"""

import itertools

import pytest

from harness import SMALL_SHM, run_ranks

from collie.soak import LAYOUTS, make_groups, program, run_calls

# Tests hand torch tensors too (sharing the arrays' memory), where torch is installed.
WITH_TORCH = LAYOUTS + ("torch",)
# Large calls: up to 70,000 elements of the widest dtypes (several slices of the small window).
MAX_BYTES = 280_000


def _random_program_body(rank, size, seed, steps, transport):
    """Run the program; a wrong result raises WrongResult naming the call
    (run_ranks then fails with every rank's traceback). Returns the number
    of calls this rank made."""
    import collie
    members, calls = program(seed, size, transport, MAX_BYTES, WITH_TORCH)
    groups = make_groups(collie, members)
    return run_calls(collie, itertools.islice(calls, steps), members, groups, rank)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("size,seed,transport,env", [
    (3, 11, "shm", SMALL_SHM),
    (5, 12, "shm", SMALL_SHM),
    (4, 13, "shm", {}),
    (4, 14, "tcp", {}),
    (2, 15, "auto", SMALL_SHM),
], ids=["shm-3-small", "shm-5-small", "shm-4", "tcp-4", "auto-2-small"])
def test_random_programs_match_numpy(size, seed, transport, env):
    made = run_ranks(_random_program_body, size, seed, 120, transport, backend=transport, env=env,
                     timeout=150)
    assert all(m > 0 for m in made), made
