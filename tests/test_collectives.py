"""Every collective with every algorithm, against a NumPy reference, on real ranks.

To stay quick on two cores, each test starts its ranks once and runs many
cases inside them: every (collective, algorithm, dtype, size) for one world
size and transport. Inputs are deterministic functions of (case, rank), so
every rank computes the same reference locally. Each rank returns the list
of cases it got wrong; the test shows them all.
"""

import numpy as np
import pytest

from harness import reduce_ops, reduced, run_ranks, same, small_ints

# Every test here runs under both executors (the compiled core and engine.execute).
pytestmark = pytest.mark.usefixtures("executor")

SIZES = [0, 1, 7, 1003]            # zero, one, odd, not divisible by any world size
DTYPES = ["float32", "int64", "uint8", "complex64", "bool", "float16"]


def _data(case: str, rank: int, count: int, dtype: str) -> np.ndarray:
    """Rank ``rank``'s input for ``case``: small integers, exact in any order."""
    return small_ints(f"{case}/{rank}", count, dtype)


def _run_cases(group, ranks, failures, label=""):
    """Every collective x algorithm x dtype x size on ``group`` (whose global
    ranks are ``ranks``); appends a line per wrong result to ``failures``."""
    import collie
    from collie import algorithms

    n, me = len(ranks), collie.get_rank(group)
    network = collie.group.world().network
    one_host = all(network.backend_of[r] in ("shm", "self") for r in ranks)

    def algos(collective):
        """The algorithms this group can run ("shm" needs every rank on one host)."""
        return [a for a in algorithms.algorithms_for(collective) if a != "shm" or one_host]

    def check(case, got, want):
        if not same(got, want):
            failures.append(f"{label}{case}: got {np.asarray(got).ravel()[:8]} want {np.asarray(want).ravel()[:8]}")

    for dtype in DTYPES:
        for count in SIZES:
            for root in sorted({0, n - 1, n // 2}):
                groot = ranks[root]
                for algo in algos("broadcast"):
                    case = f"broadcast/{algo}/{dtype}/{count}/root{root}"
                    x = _data(case, me, count, dtype)
                    collie.broadcast(x, src=groot, group=group, algorithm=algo)
                    check(case, x, _data(case, root, count, dtype))
                for algo in algos("reduce"):
                    for op in reduce_ops(dtype)[:3]:
                        case = f"reduce/{algo}/{dtype}/{count}/root{root}/{op!r}"
                        x = _data(case, me, count, dtype)
                        collie.reduce(x, dst=groot, op=op, group=group, algorithm=algo)
                        want = (reduced(op, [_data(case, r, count, dtype) for r in range(n)], n)
                                if me == root else _data(case, me, count, dtype))
                        check(case, x, want)
                for algo in algos("gather"):
                    case = f"gather/{algo}/{dtype}/{count}/root{root}"
                    x = _data(case, me, count, dtype)
                    outs = [np.zeros(count, dtype) for _ in range(n)] if me == root else None
                    collie.gather(x, outs, dst=groot, group=group, algorithm=algo)
                    if me == root:
                        for r in range(n):
                            check(f"{case}[{r}]", outs[r], _data(case, r, count, dtype))
                for algo in algos("scatter"):
                    case = f"scatter/{algo}/{dtype}/{count}/root{root}"
                    parts = [_data(f"{case}/{r}", root, count, dtype) for r in range(n)] if me == root else None
                    out = np.zeros(count, dtype)
                    collie.scatter(out, parts, src=groot, group=group, algorithm=algo)
                    check(case, out, _data(f"{case}/{me}", root, count, dtype))
            for algo in algos("all_reduce"):
                for op in reduce_ops(dtype):
                    case = f"all_reduce/{algo}/{dtype}/{count}/{op!r}"
                    x = _data(case, me, count, dtype)
                    collie.all_reduce(x, op=op, group=group, algorithm=algo)
                    check(case, x, reduced(op, [_data(case, r, count, dtype) for r in range(n)], n))
            for algo in algos("all_gather"):
                case = f"all_gather_into_tensor/{algo}/{dtype}/{count}"
                out = np.zeros(count * n, dtype)
                collie.all_gather_into_tensor(out, _data(case, me, count, dtype), group=group, algorithm=algo)
                check(case, out, np.concatenate([_data(case, r, count, dtype) for r in range(n)]))
                case = f"all_gather/{algo}/{dtype}/{count}/uneven"
                sizes = [count + r for r in range(n)]  # uneven list sizes
                outs = [np.zeros(s, dtype) for s in sizes]
                collie.all_gather(outs, _data(case, me, sizes[me], dtype), group=group, algorithm=algo)
                for r in range(n):
                    check(f"{case}[{r}]", outs[r], _data(case, r, sizes[r], dtype))
            for algo in algos("reduce_scatter"):
                for op in reduce_ops(dtype)[:3]:
                    case = f"reduce_scatter_tensor/{algo}/{dtype}/{count}/{op!r}"
                    out = np.zeros(count, dtype)
                    collie.reduce_scatter_tensor(out, _data(case, me, count * n, dtype), op=op, group=group,
                                                 algorithm=algo)
                    full = reduced(op, [_data(case, r, count * n, dtype) for r in range(n)], n)
                    check(case, out, full[me * count:(me + 1) * count])
                case = f"reduce_scatter/{algo}/{dtype}/{count}"
                ins = [_data(f"{case}/{q}", me, count, dtype) for q in range(n)]
                out = np.zeros(count, dtype)
                collie.reduce_scatter(out, ins, group=group, algorithm=algo)
                check(case, out, reduced(collie.ReduceOp.SUM, [_data(f"{case}/{me}", r, count, dtype)
                                                                  for r in range(n)], n))
            for algo in algos("all_to_all"):
                case = f"all_to_all_single/{algo}/{dtype}/{count}/uneven"
                # rank r sends (r + q + count) % 5 rows of width 2 to rank q: uneven, some zero
                rows = lambda r, q: (r + q + count) % 5  # noqa: E731
                send = [rows(me, q) for q in range(n)]
                recv = [rows(q, me) for q in range(n)]
                x = _data(case, me, 2 * sum(send), dtype).reshape(-1, 2)
                out = np.zeros((sum(recv), 2), dtype)
                if algorithms.uniform_blocks_only("all_to_all", algo) and n > 1:
                    try:  # bruck, shm, hier: they need block sizes every rank knows
                        collie.all_to_all_single(out, x, recv, send, group=group, algorithm=algo)
                        failures.append(f"{case}: {algo} accepted uneven splits")
                    except ValueError:
                        pass
                else:
                    collie.all_to_all_single(out, x, recv, send, group=group, algorithm=algo)
                    want = []
                    for q in range(n):
                        theirs = _data(case, q, 2 * sum(rows(q, p) for p in range(n)), dtype).reshape(-1, 2)
                        start = sum(rows(q, p) for p in range(me))
                        want.append(theirs[start:start + rows(q, me)])
                    check(case, out, np.concatenate(want))
                case = f"all_to_all/{algo}/{dtype}/{count}"
                ins = [_data(f"{case}/{q}", me, count, dtype) for q in range(n)]
                outs = [np.zeros(count, dtype) for _ in range(n)]
                collie.all_to_all(outs, ins, group=group, algorithm=algo)
                for q in range(n):
                    check(f"{case}[{q}]", outs[q], _data(f"{case}/{me}", q, count, dtype))
    for algo in algos("barrier"):
        collie.barrier(group=group, algorithm=algo)


def _all_cases_body(rank, size):
    import collie
    from collie.group import resolve
    failures = []
    _run_cases(None, list(range(size)), failures)
    collie.barrier()
    # No transport keeps an empty queue per finished tag (each call has a
    # fresh tag, so one left behind would grow with every call). Queues with
    # messages in them may exist: a faster peer may already be leaving.
    net = resolve(None).network
    if net.shm is not None and any(not q for inb in net.shm._in.values() for q in inb.posted.values()):
        failures.append("shm transport keeps receive queues of finished calls")
    if any(not q for p in net.tcp._peers if p is not None for q in (*p.posted.values(), *p.unexpected.values())):
        failures.append("tcp transport keeps receive queues of finished calls")
    return failures


# shm at every world size; tcp at a few (the engine and algorithms are the
# same code over both, the transport conformance suite covers the rest).
# "shm-1copy": every message of 64 bytes or more goes single copy.
@pytest.mark.timeout(240)
@pytest.mark.parametrize("nranks,backend", [(1, "shm"), (2, "shm"), (3, "shm"), (4, "shm"), (5, "shm"),
                                            (7, "shm"), (3, "shm-1copy"), (2, "tcp"), (3, "tcp"),
                                            (5, "tcp")])
def test_every_collective_and_algorithm(nranks, backend):
    env = None
    if backend == "shm-1copy":
        backend, env = "shm", {"COLLIE_SHM_CMA_BYTES": "64"}
    results = run_ranks(_all_cases_body, nranks, backend=backend, timeout=230, env=env)
    wrong = [f"rank {r}: {f}" for r, fails in enumerate(results) for f in fails]
    assert not wrong, "\n".join(wrong[:40])


def _subgroup_body(rank, size):
    import collie
    failures = []
    odd = collie.new_group([r for r in range(size) if r % 2])
    backwards = collie.new_group(list(reversed(range(size))), sort_ranks=False)  # group rank 0: the last
    if rank % 2:
        _run_cases(odd, collie.get_process_group_ranks(odd), failures, "odd:")
    else:
        try:
            collie.all_reduce(np.zeros(1), group=odd)
            failures.append("non-member all_reduce did not raise")
        except ValueError:
            pass
    x = np.array([float(rank)])
    collie.broadcast(x, src=size - 1, group=backwards)  # global rank, as in torch
    if x[0] != size - 1:
        failures.append(f"broadcast on reversed group gave {x}")
    y = np.zeros(size)
    collie.all_gather_into_tensor(y, np.array([float(rank)]), group=backwards)
    if y.tolist() != [float(r) for r in reversed(range(size))]:
        failures.append(f"all_gather on reversed group gave {y}")
    return failures


@pytest.mark.timeout(200)
def test_subgroups():
    results = run_ranks(_subgroup_body, 5, backend="shm", timeout=190)
    wrong = [f"rank {r}: {f}" for r, fails in enumerate(results) for f in fails]
    assert not wrong, "\n".join(wrong[:40])


def _random_sequence_body(rank, size, seed):
    """A seeded random sequence of collectives over overlapping sub-groups."""
    import collie
    rng = np.random.default_rng(seed)
    groups = [(None, list(range(size)))]
    for members in ([0, 1, 2], [1, 2, 3, 4], [0, 2, 4], [4, 3, 1]):
        groups.append((collie.new_group(members, sort_ranks=False), members))  # [4, 3, 1] in that order
    failures = []
    for i in range(60):
        g, members = groups[rng.integers(len(groups))]
        kind = rng.integers(4)
        count = int(rng.integers(0, 3000))
        root_i = int(rng.integers(len(members)))
        if rank not in members:
            continue
        me, n = members.index(rank), len(members)
        case = f"seq{i}"
        if kind == 0:
            x = _data(case, me, count, "float64")
            collie.all_reduce(x, group=g)
            want = np.sum([_data(case, r, count, "float64") for r in range(n)], axis=0)
        elif kind == 1:
            x = _data(case, me, count, "int32")
            collie.broadcast(x, src=members[root_i], group=g)
            want = _data(case, root_i, count, "int32")
        elif kind == 2:
            x = np.zeros(count * n, "int32")
            collie.all_gather_into_tensor(x, _data(case, me, count, "int32"), group=g)
            want = np.concatenate([_data(case, r, count, "int32") for r in range(n)])
        else:
            x = np.zeros(count, "float32")
            collie.reduce_scatter_tensor(x, _data(case, me, count * n, "float32"), group=g)
            want = np.sum([_data(case, r, count * n, "float32") for r in range(n)], axis=0)[me * count:(me + 1) * count]
        if not same(x, want):
            failures.append(f"step {i} kind {kind} group {members}")
    return failures


@pytest.mark.timeout(120)
@pytest.mark.parametrize("seed", [1, 2])
def test_random_sequence_over_overlapping_groups(seed):
    results = run_ranks(_random_sequence_body, 5, seed, backend="shm", timeout=110)
    assert not any(results), results


def _uneven_reduce_scatter_body(rank, size):
    import collie
    sizes = [1, 0, 3, 2][:size]
    ins = [np.full(s, float(rank + q), np.float32) for q, s in enumerate(sizes)]
    out = np.zeros(sizes[rank], np.float32)
    collie.reduce_scatter(out, ins)
    return out.tolist()


def test_reduce_scatter_list_with_uneven_sizes():
    res = run_ranks(_uneven_reduce_scatter_body, 4)
    assert res == [[6.0], [], [14.0] * 3, [18.0] * 2]


def _sliced_body(rank, size):
    """The shm algorithm with a window far smaller than the data: every call
    runs in many slices, each a full run of the schedule."""
    import collie
    n, count, failures = size, 10_003, []
    for dtype in ("float64", "int32"):
        case = f"ar/{dtype}"
        x = _data(case, rank, count, dtype)
        collie.all_reduce(x, algorithm="shm")
        if not same(x, np.sum([_data(case, r, count, dtype) for r in range(n)], axis=0).astype(dtype)):
            failures.append(case)
        case = f"ag/{dtype}"
        out = np.zeros(count * n, dtype)
        collie.all_gather_into_tensor(out, _data(case, rank, count, dtype), algorithm="shm")
        if not same(out, np.concatenate([_data(case, r, count, dtype) for r in range(n)])):
            failures.append(case)
        case = f"rs/{dtype}"
        out = np.zeros(count, dtype)
        collie.reduce_scatter_tensor(out, _data(case, rank, count * n, dtype), algorithm="shm")
        full = np.sum([_data(case, r, count * n, dtype) for r in range(n)], axis=0).astype(dtype)
        if not same(out, full[rank * count:(rank + 1) * count]):
            failures.append(case)
        case = f"bc/{dtype}"
        x = _data(case, rank, count, dtype)
        collie.broadcast(x, src=n - 1, algorithm="shm")
        if not same(x, _data(case, n - 1, count, dtype)):
            failures.append(case)
        case = f"a2a/{dtype}"
        out = np.zeros(count * n, dtype)
        collie.all_to_all_single(out, _data(case, rank, count * n, dtype), algorithm="shm")
        want = np.concatenate([_data(case, q, count * n, dtype)[rank * count:(rank + 1) * count] for q in range(n)])
        if not same(out, want):
            failures.append(case)
    return failures


@pytest.mark.timeout(120)
def test_shm_algorithm_with_a_window_smaller_than_the_data():
    results = run_ranks(_sliced_body, 3, backend="shm", env={"COLLIE_SHM_WINDOW_BYTES": "4096"})
    assert not any(results), results


def _sliced_uneven_body(rank, size):
    """Uneven blocks through the shm algorithm, sized so that ceil(total /
    window) slices are too few: 2 x 1023 + 1 + 1 elements and a window of
    1024, where two slices would each need 512 + 512 + 1 + 1."""
    import collie
    sizes, failures = [1023, 1023, 1, 1], []
    ins = [np.full(s, float(rank + 10 * q), np.float32) for q, s in enumerate(sizes)]
    out = np.zeros(sizes[rank], np.float32)
    collie.reduce_scatter(out, ins, algorithm="shm")
    if not np.array_equal(out, np.full(sizes[rank], sum(r + 10.0 * rank for r in range(size)), np.float32)):
        failures.append("reduce_scatter")
    outs = [np.zeros(s, np.float32) for s in sizes]
    collie.all_gather(outs, np.full(sizes[rank], float(rank), np.float32), algorithm="shm")
    if not all(np.array_equal(o, np.full(s, float(q), np.float32)) for q, (o, s) in enumerate(zip(outs, sizes))):
        failures.append("all_gather")
    return failures


@pytest.mark.timeout(120)
def test_shm_algorithm_slices_uneven_blocks_to_fit_the_window():
    results = run_ranks(_sliced_uneven_body, 4, backend="shm", env={"COLLIE_SHM_WINDOW_BYTES": "4096"})
    assert not any(results), results


def _torch_213_names_body(rank, size):
    from datetime import timedelta
    import time
    import collie
    x = np.arange(4.0) + 10 * rank
    gathered = np.zeros(4 * size)
    collie.all_gather_single(gathered, x)
    scattered = np.zeros(4)
    collie.reduce_scatter_single(scattered, np.arange(4.0 * size) * (rank + 1))
    if rank == size - 1:
        time.sleep(3)  # never calls the barrier below before the others give up on it
        return gathered, scattered, None
    try:
        collie.barrier(timeout=timedelta(seconds=1))
    except collie.CollieTimeout as exc:
        return gathered, scattered, exc.peers
    return gathered, scattered, "passed"


def test_torch_213_names_and_barrier_timeout():
    # The group's timeout is 40 s, the harness gives up after 30: only the
    # barrier's own 1 s timeout lets ranks 0 and 1 return in time.
    results = run_ranks(_torch_213_names_body, 3, timeout=30, init_kwargs={"timeout": 40})
    factor = sum(r + 1 for r in range(3))
    for rank, (gathered, scattered, barrier) in enumerate(results):
        assert gathered.tolist() == [float(v + 10 * r) for r in range(3) for v in range(4)]
        assert scattered.tolist() == [float(factor * v) for v in range(4 * rank, 4 * rank + 4)]
        assert barrier == (None if rank == 2 else (2,)), barrier
