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
"""

import numpy as np
import pytest

from harness import SMALL_SHM, reduce_ops, reduced, run_ranks, same, small_ints

COLLECTIVES = ("all_reduce", "reduce", "broadcast", "all_gather_into_tensor", "all_gather",
               "reduce_scatter_tensor", "reduce_scatter", "all_to_all_single", "all_to_all",
               "gather", "scatter", "barrier", "objects", "ring", "any_source")
SCHEDULE_OF = {"all_gather_into_tensor": "all_gather", "reduce_scatter_tensor": "reduce_scatter",
               "all_to_all_single": "all_to_all"}  # the schedule family a call runs
DTYPES = ("float32", "float64", "int32", "int64", "int8", "uint8", "float16", "complex64", "bool")
LAYOUTS = ("plain", "plain", "strided", "torch", "in_place")


def _pass_as(x: np.ndarray, layout: str):
    """What to hand collie for ``x``'s values, and how to read the result:
    a strided view (collie works on a copy and writes it back) or a torch
    tensor sharing x's memory."""
    if layout == "strided":
        view = np.zeros(2 * x.size, x.dtype)[::2]
        view[...] = x
        return view, lambda: np.array(view)
    if layout == "torch" and x.dtype.name not in ("uint32", "uint64"):
        try:
            import torch
        except ImportError:
            return x, lambda: x
        t = torch.from_numpy(x)
        return t, lambda: t.numpy()
    return x, lambda: x


def _program(seed: int, size: int, steps: int, transport: str):
    """The groups (member tuples, the world first) and the calls, the same on
    every rank: (number, collective, index of its group, arguments)."""
    from collie import algorithms
    from collie.schedule import COLLECTIVES as SCHEDULES
    rng = np.random.default_rng(seed)
    groups = [tuple(range(size))] + [tuple(sorted(rng.choice(size, int(rng.integers(1, size + 1)),
                                                              replace=False).tolist()))
                                     for _ in range(3)]
    calls = []
    for number in range(steps):
        group = int(rng.integers(len(groups)))
        name = str(rng.choice(COLLECTIVES))
        dtype = str(rng.choice(DTYPES))
        schedule = SCHEDULE_OF.get(name, name)
        uneven = name in ("all_gather", "reduce_scatter", "all_to_all_single", "all_to_all") \
            and bool(rng.random() < 0.5)
        algorithm = None
        if schedule in SCHEDULES and rng.random() < 0.7:
            options = [a for a in algorithms.algorithms_for(schedule)
                       if not (a == "shm" and transport == "tcp")
                       and not (uneven and algorithms.uniform_blocks_only(schedule, a))]
            algorithm = str(rng.choice(options))
        args = dict(op=str(rng.choice([op.name for op in reduce_ops(dtype)])), dtype=dtype,
                    algorithm=algorithm, uneven=uneven,
                    count=int(rng.integers(0, 70_000 if rng.random() < 0.1 else 2000)),
                    root=int(rng.integers(len(groups[group]))), layout=str(rng.choice(LAYOUTS)),
                    async_op=bool(rng.random() < 0.25), wait_now=bool(rng.random() < 0.5),
                    seed=int(rng.integers(1 << 30)))
        calls.append((number, name, group, args))
    return groups, calls


def _call(collie, name: str, g, members: tuple, rank: int, a: dict):
    """Make one call; returns (work or None, check) where check() says
    whether this rank's result is right once the call completed."""
    n, me = len(members), members.index(rank)
    dtype, count, root = a["dtype"], a["count"], members[a["root"]]
    op = collie.ReduceOp.PREMUL_SUM(2.0) if a["op"] == "PREMUL_SUM" else getattr(collie.ReduceOp, a["op"])
    common = dict(group=g, async_op=a["async_op"], algorithm=a["algorithm"])

    def data(who, length=count):
        return small_ints(f"{a['seed']}/{who}", length, dtype)

    def splits(length):  # uneven: per member, may be 0; even: length each
        if not a["uneven"]:
            return [length] * n
        return [int(v) for v in np.random.default_rng(a["seed"]).integers(0, length + 1, n)]

    if name == "all_reduce":
        obj, result = _pass_as(data(rank), a["layout"])
        want = reduced(op, [data(r) for r in members], n)
        return collie.all_reduce(obj, op=op, **common), lambda: same(result(), want)
    if name == "reduce":
        obj, result = _pass_as(data(rank), a["layout"])
        want = reduced(op, [data(r) for r in members], n)
        return (collie.reduce(obj, dst=root, op=op, **common),
                lambda: rank != root or same(result(), want))
    if name == "broadcast":
        obj, result = _pass_as(data(rank), a["layout"])
        return collie.broadcast(obj, src=root, **common), lambda: same(result(), data(root))
    if name == "all_gather_into_tensor":
        out = np.zeros(count * n, dtype)
        x = data(rank)
        if a["layout"] == "in_place":  # the input is this rank's block of the output
            out[me * count:(me + 1) * count] = x
            x = out[me * count:(me + 1) * count]
        want = np.concatenate([data(r) for r in members])
        return collie.all_gather_into_tensor(out, x, **common), lambda: same(out, want)
    if name == "all_gather":
        sizes = splits(count)
        outs = [np.zeros(s, dtype) for s in sizes]
        return (collie.all_gather(outs, data(rank, sizes[me]), **common),
                lambda: all(same(o, data(r, s)) for o, r, s in zip(outs, members, sizes)))
    if name in ("reduce_scatter_tensor", "reduce_scatter"):
        sizes = splits(count) if name == "reduce_scatter" else [count] * n
        total, start = sum(sizes), sum(sizes[:me])
        want = reduced(op, [data(r, total) for r in members], n)[start:start + sizes[me]]
        out, x = np.zeros(sizes[me], dtype), data(rank, total)
        if name == "reduce_scatter_tensor":
            work = collie.reduce_scatter_tensor(out, x, op=op, **common)
        else:
            bounds = np.cumsum([0] + sizes)
            work = collie.reduce_scatter(out, [x[bounds[j]:bounds[j + 1]] for j in range(n)], op=op, **common)
        return work, lambda: same(out, want)
    if name in ("all_to_all_single", "all_to_all"):
        # sent[i][j]: elements member i sends member j
        sent = np.random.default_rng(a["seed"]).integers(0, count // n + 2, (n, n)) if a["uneven"] \
            else np.full((n, n), count // n)
        inputs = {r: data(r, int(sent[i].sum())) for i, r in enumerate(members)}
        pieces = [inputs[r][int(sent[i, :me].sum()):int(sent[i, :me + 1].sum())] for i, r in enumerate(members)]
        want = np.concatenate(pieces)
        out = np.zeros(int(sent[:, me].sum()), dtype)
        if name == "all_to_all_single":
            work = collie.all_to_all_single(out, inputs[rank], [int(v) for v in sent[:, me]],
                                            [int(v) for v in sent[me]], **common)
            return work, lambda: same(out, want)
        send_at, recv_at = np.cumsum([0] + list(sent[me])), np.cumsum([0] + list(sent[:, me]))
        outs = [out[recv_at[j]:recv_at[j + 1]] for j in range(n)]
        work = collie.all_to_all(outs, [inputs[rank][send_at[j]:send_at[j + 1]] for j in range(n)], **common)
        return work, lambda: same(out, want)
    if name == "gather":
        outs = [np.zeros(count, dtype) for _ in members] if rank == root else None
        return (collie.gather(data(rank), outs, dst=root, **common),
                lambda: rank != root or all(same(o, data(r)) for o, r in zip(outs, members)))
    if name == "scatter":
        out = np.zeros(count, dtype)
        ins = [data(f"to{r}") for r in members] if rank == root else None
        return collie.scatter(out, ins, src=root, **common), lambda: same(out, data(f"to{rank}"))
    if name == "barrier":
        return collie.barrier(group=g, async_op=a["async_op"], algorithm=a["algorithm"]), lambda: True
    if name == "objects":  # pickled objects travel over byte collectives
        got, mine = [None] * n, {"rank": rank, "text": "x" * (count % 3000)}
        collie.all_gather_object(got, mine, group=g)
        box = [mine if rank == root else None]
        collie.broadcast_object_list(box, src=root, group=g)
        return None, lambda: got == [{"rank": r, "text": mine["text"]} for r in members] \
            and box[0] == {"rank": root, "text": mine["text"]}
    if name == "ring":  # each member sends to the next one, receives from the previous
        right, left = members[(me + 1) % n], members[(me - 1) % n]
        got = np.zeros(count, dtype)
        for req in collie.batch_isend_irecv([collie.P2POp(collie.isend, data(rank), right, g),
                                             collie.P2POp(collie.irecv, got, left, g)]):
            req.wait()
        return None, lambda: same(got, data(left))
    if name == "any_source":  # the receive names no source; recv says who sent
        right, left = members[(me + 1) % n], members[(me - 1) % n]
        got = np.zeros(count, dtype)
        req = collie.isend(data(rank), right, group=g, tag=5)
        sender = collie.recv(got, group=g, tag=5)
        req.wait()
        return None, lambda: sender == left and same(got, data(left))
    raise ValueError(name)


def _random_program_body(rank, size, seed, steps, transport):
    import collie
    group_members, calls = _program(seed, size, steps, transport)
    groups = [None] + [collie.new_group(list(m)) for m in group_members[1:]]  # every rank makes every group
    wrong, in_flight = [], []

    def settle():
        for work, check, what in in_flight:
            work.wait()
            if not check():
                wrong.append(what)
        in_flight.clear()

    for number, name, group, args in calls:
        members = group_members[group]
        if rank not in members or (name in ("ring", "any_source") and len(members) == 1):
            continue
        what = f"call {number}: {name} on ranks {list(members)} {args}"
        work, check = _call(collie, name, groups[group], members, rank, args)
        if work is not None:
            in_flight.append((work, check, what))
            if args["wait_now"] or len(in_flight) > 3:
                settle()
        else:
            settle()  # a blocking call: everything before it has finished too
            if not check():
                wrong.append(what)
    settle()
    return wrong


@pytest.mark.timeout(180)
@pytest.mark.parametrize("size,seed,transport,env", [
    (3, 11, "shm", SMALL_SHM),
    (5, 12, "shm", SMALL_SHM),
    (4, 13, "shm", {}),
    (4, 14, "tcp", {}),
    (2, 15, "auto", SMALL_SHM),
], ids=["shm-3-small", "shm-5-small", "shm-4", "tcp-4", "auto-2-small"])
def test_random_programs_match_numpy(size, seed, transport, env):
    results = run_ranks(_random_program_body, size, seed, 120, transport, backend=transport, env=env,
                        timeout=150)
    assert not any(results), "\n".join(w for r in results for w in r)
