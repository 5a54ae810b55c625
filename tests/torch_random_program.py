"""A seeded random torch.distributed program, for comparing collie with Gloo.

    collie run -n 3 torch_random_program.py gloo SEED OUT     # torch.distributed, Gloo
    collie run -n 3 torch_random_program.py collie SEED OUT   # import collie as dist

Every rank makes the same random sequence of calls, on torch CPU tensors of
several dtypes and shapes (sizes that do not divide by the group size, empty
ones, some of 10^4 elements), on the world or on groups made with new_group:
all_reduce / reduce / reduce_scatter(_tensor) with every op Gloo takes for
the dtype, broadcast, all_gather(_into_tensor), gather, scatter, all_to_all
and all_to_all_single (even and uneven splits), barrier, tagged send/recv
(any-source too) and isend/irecv, batch_isend_irecv, and the object
functions; some with async_op=True, some naming a root by group_src /
group_dst. Each rank writes one line per call it takes part in to OUT.RANK:
the call and a hash of everything it received that torch defines (not the
non-destination ranks' tensors after reduce). Both backends must write the
same lines (tests/test_torch_compat.py compares them). The data are small
integers, so every sum is exact in any order (AVG then divides it once).
Groups are made from ranks in random order (new_group sorts them).

Left out because Gloo does not do it in this torch version: int16,
PREMUL_SUM, AVG on integers, PRODUCT/MIN/MAX on complex, gather of complex,
uneven all_gather and all_to_all (lists), a stacked (2-D)
all_gather_into_tensor output or reduce_scatter_tensor input, a receive
from any source of an empty tensor, recv_object_list from any source.
Left out because torch leaves it undefined or Gloo gets it wrong:
non-contiguous tensors (Gloo ignores the strides), reduce's result off the
destination, sending to oneself, sums whose rounding depends on the order,
NaN and -0.0 in MIN/MAX; bools are hashed by value, as Gloo's SUM of bools
leaves bytes of 2 and 3. Left out because collie differs from torch there
(see tests/test_torch_compat.py): a collective called by a rank outside
the group, and complex AVG where the division is not exact.
"""

import datetime
import faulthandler
import hashlib
import signal
import sys

import numpy as np
import torch

BACKEND, SEED, OUT = sys.argv[1], int(sys.argv[2]), sys.argv[3]
faulthandler.register(signal.SIGTERM, chain=True)  # a hung rank stopped by the launcher says where it was
CALLS = 80
if BACKEND == "gloo":
    import torch.distributed as dist
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
elif BACKEND == "collie":
    import collie as dist
    dist.init_process_group(timeout=datetime.timedelta(seconds=60))
else:
    raise SystemExit(f"BACKEND must be gloo or collie, got {BACKEND!r}")

KINDS = ("all_reduce", "all_reduce", "reduce", "broadcast", "all_gather", "all_gather_into_tensor",
         "gather", "scatter", "reduce_scatter", "reduce_scatter_tensor", "all_to_all_single",
         "all_to_all", "barrier", "send_recv", "tags", "ring", "batch", "objects", "new_group")
DTYPES = {"int8": torch.int8, "uint8": torch.uint8, "int32": torch.int32, "int64": torch.int64,
          "float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32,
          "float64": torch.float64, "complex64": torch.complex64, "bool": torch.bool}
REDUCING = ("all_reduce", "reduce", "reduce_scatter", "reduce_scatter_tensor")


def ops_for(dt: str, size: int) -> list[str]:
    """The reduce ops Gloo takes for ``dt``. AVG: the sum is exact and both
    round the quotient correctly, but for complex only where the division
    is exact (a group of 1, 2 or 4): collie divides each part by the size,
    Gloo divides by a complex size, which rounds differently (7/3)."""
    avg = ["AVG"]
    if dt == "complex64":
        return ["SUM"] + (avg if size in (1, 2, 4) else [])
    if dt.startswith(("float", "bfloat")):
        return ["SUM", "PRODUCT", "MIN", "MAX"] + avg
    return ["SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR"]


def values(seed: int, who: int, shape: tuple, dt: str, op: str | None = None) -> torch.Tensor:
    """Rank ``who``'s data for a call: small integers for which ``op`` is
    exact in any order (a sum of 4 stays within bfloat16's 8 bits, a product
    of 4 is at most 16, and int8 does not overflow)."""
    g = np.random.default_rng([seed, who])
    n = int(np.prod(shape))
    if dt == "bool":
        return torch.from_numpy(g.integers(0, 2, n).astype(bool)).reshape(shape)
    unsigned = dt == "uint8"
    if op in ("SUM", "AVG"):
        v = g.integers(0 if unsigned else -8, 9, n)
    elif op == "PRODUCT":
        v = g.choice([1, 2] if unsigned else [-1, 1, 2], n)
    elif op in ("BAND", "BOR", "BXOR"):
        v = g.integers(0, 256, n) if unsigned else g.integers(-128, 128, n)
    else:  # MIN, MAX, or data that is only moved
        v = g.integers(0 if unsigned else -100, 101, n)
    if dt == "complex64":
        v = v + 1j * g.integers(-8, 9, n)
    return torch.from_numpy(v).to(DTYPES[dt]).reshape(shape)


def zeros(shape, dt: str) -> torch.Tensor:
    return torch.full(shape, 7, dtype=DTYPES[dt])  # 7: a received 0 must overwrite it


def digest(*got) -> str:
    """A hash of tensors (dtype, shape, bytes) and other values (repr), in lists too."""
    h = hashlib.sha1()

    def put(v):
        if isinstance(v, torch.Tensor):
            h.update(f"{v.dtype}{tuple(v.shape)}".encode())
            if v.dtype == torch.bool:  # Gloo's SUM of bools leaves bytes of 2 (True all the same)
                v = v.contiguous().view(torch.uint8) != 0
            if v.numel():  # (an empty tensor cannot be viewed as bytes)
                h.update(v.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
        elif isinstance(v, (list, tuple)):
            h.update(f"{type(v).__name__}{len(v)}(".encode())
            for x in v:
                put(x)
            h.update(b")")
        elif isinstance(v, dict):
            h.update(b"{")
            for k in sorted(v):
                put(k)
                put(v[k])
            h.update(b"}")
        else:
            h.update(repr(v).encode())

    for v in got:
        put(v)
    return h.hexdigest()[:12]


def done(work, async_op: bool):
    """Wait for an async call; torch's Work.wait() returns True."""
    if async_op:
        assert work is not None, "async_op=True returned no work"
        return work.wait()
    assert work is None, f"a blocking call returned {work!r}"
    return None


def peer(members: list[int], rank: int, by_group_rank: bool, name: str) -> dict:
    """The keyword naming global rank ``rank`` as ``name`` (src, dst): by its
    global rank, or by its rank in the group (group_src, group_dst)."""
    return {f"group_{name}": members.index(rank)} if by_group_rank else {name: rank}


def call(g, members: list[int], kind: str, dt: str, op: str, shape: tuple, s: int, pick: int,
         async_op: bool, by_group_rank: bool, tag: int):
    """Make one call on group ``g`` (global ranks ``members``); returns what
    this rank received, or None where torch defines nothing."""
    me = dist.get_rank()
    r, p = members.index(me), len(members)
    root = members[pick % p]  # a global rank, as torch's src/dst are
    at_root = {name: peer(members, root, by_group_rank, name) for name in ("src", "dst")}
    x = values(s, me, shape, dt, op if kind in REDUCING else None)
    reduce_op = getattr(dist.ReduceOp, op)
    n = shape[0]
    rest = shape[1:]
    counts = np.random.default_rng([s, 99]).integers(0, 5, size=(p, p))  # uneven splits, some 0

    if kind == "all_reduce":
        w = dist.all_reduce(x, op=reduce_op, group=g, async_op=async_op)
        return x, done(w, async_op)
    if kind == "reduce":
        w = dist.reduce(x, op=reduce_op, group=g, async_op=async_op, **at_root["dst"])
        waited = done(w, async_op)
        return (x, waited) if me == root else None  # the others' tensors are undefined
    if kind == "broadcast":
        w = dist.broadcast(x, group=g, async_op=async_op, **at_root["src"])
        return x, done(w, async_op)
    if kind == "all_gather":
        out = [zeros(shape, dt) for _ in range(p)]
        w = dist.all_gather(out, x, group=g, async_op=async_op)
        return out, done(w, async_op)
    if kind == "all_gather_into_tensor":
        out = zeros((p * n, *rest), dt)
        w = dist.all_gather_into_tensor(out, x, group=g, async_op=async_op)
        return out, done(w, async_op)
    if kind == "gather":
        out = [zeros(shape, dt) for _ in range(p)] if me == root else None
        w = dist.gather(x, out, group=g, async_op=async_op, **at_root["dst"])
        return out, done(w, async_op)
    if kind == "scatter":
        out = zeros(shape, dt)
        parts = [values(s, 1000 + q, shape, dt) for q in range(p)] if me == root else None
        w = dist.scatter(out, parts, group=g, async_op=async_op, **at_root["src"])
        return out, done(w, async_op)
    if kind == "reduce_scatter":
        out = zeros(shape, dt)
        parts = [values(s, 100 * me + q, shape, dt, op) for q in range(p)]
        w = dist.reduce_scatter(out, parts, op=reduce_op, group=g, async_op=async_op)
        return out, done(w, async_op)
    if kind == "reduce_scatter_tensor":
        out = zeros(shape, dt)
        w = dist.reduce_scatter_tensor(out, values(s, me, (p * n, *rest), dt, op), op=reduce_op,
                                       group=g, async_op=async_op)
        return out, done(w, async_op)
    if kind == "all_to_all_single":
        if pick % 2:  # even: n rows to each rank
            out = zeros((p * n, *rest), dt)
            w = dist.all_to_all_single(out, values(s, me, (p * n, *rest), dt), group=g, async_op=async_op)
        else:  # uneven: counts[a][b] rows from a to b
            send, recv = [int(c) for c in counts[r]], [int(counts[q][r]) for q in range(p)]
            out = zeros((sum(recv), *rest), dt)
            w = dist.all_to_all_single(out, values(s, me, (sum(send), *rest), dt), recv, send,
                                       group=g, async_op=async_op)
        return out, done(w, async_op)
    if kind == "all_to_all":
        out = [zeros(shape, dt) for _ in range(p)]
        w = dist.all_to_all(out, [values(s, 100 * me + q, shape, dt) for q in range(p)], group=g,
                            async_op=async_op)
        return out, done(w, async_op)
    if kind == "barrier":
        return "barrier", done(dist.barrier(group=g, async_op=async_op), async_op)
    if p < 2:
        return None  # point-to-point needs a peer other than oneself
    if kind == "send_recv":  # one sender, one receiver, maybe from any source
        sender, receiver = members[pick % p], members[(pick + 1 + pick // p % (p - 1)) % p]
        if me == sender:
            dist.send(x, group=g, tag=tag, **peer(members, receiver, by_group_rank, "dst"))
            return "sent"
        if me == receiver:
            got = zeros(shape, dt)
            any_source = tag % 3 == 0 and x.numel() > 0  # Gloo fails on an empty one
            src = {} if any_source else peer(members, sender, by_group_rank, "src")
            return got, dist.recv(got, group=g, tag=tag, **src)  # recv returns the global sender
        return None
    if kind == "tags":  # two messages to the right, received in the other order
        right, left = members[(r + 1) % p], members[(r - 1) % p]
        second = values(s, me + 100, (n + 1, *rest), dt)
        sends = [dist.isend(x, right, group=g, tag=tag), dist.isend(second, right, group=g, tag=tag + 1)]
        got1, got2 = zeros(shape, dt), zeros((n + 1, *rest), dt)
        dist.recv(got2, left, group=g, tag=tag + 1)
        waited = dist.irecv(got1, left, group=g, tag=tag).wait()
        return got1, got2, waited, [w.wait() for w in sends]
    if kind == "ring":  # isend right, irecv left
        right, left = members[(r + 1) % p], members[(r - 1) % p]
        got = zeros(shape, dt)
        works = [dist.irecv(got, left, group=g, tag=tag), dist.isend(x, right, group=g, tag=tag)]
        return got, [w.wait() for w in works]
    if kind == "batch":  # both directions at once, one call
        right, left = members[(r + 1) % p], members[(r - 1) % p]
        to_left = values(s, me + 200, (n + 2, *rest), dt)
        from_left, from_right = zeros(shape, dt), zeros((n + 2, *rest), dt)
        ops = [dist.P2POp(dist.isend, x, right, g, tag), dist.P2POp(dist.irecv, from_left, left, g, tag),
               dist.P2POp(dist.irecv, from_right, right, g, tag + 1),
               dist.P2POp(dist.isend, to_left, left, g, tag + 1)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        return from_left, from_right
    raise ValueError(kind)


def objects(g, members: list[int], s: int, pick: int, by_group_rank: bool) -> tuple:
    """The object functions, with objects holding tensors, on group ``g``."""
    me = dist.get_rank()
    r, p = members.index(me), len(members)
    root = members[pick % p]
    at_root = {name: peer(members, root, by_group_rank, name) for name in ("src", "dst")}
    mine = {"rank": me, "t": values(s, me, (3,), "int64"), "text": "x" * (s % 50), "tuple": (me, None, 1.5)}
    bcast = [mine, s % 7, "str"] if me == root else [None, None, None]
    dist.broadcast_object_list(bcast, group=g, **at_root["src"])
    everyone = [None] * p
    dist.all_gather_object(everyone, mine, group=g)
    gathered = [None] * p if me == root else None
    dist.gather_object(mine, gathered, group=g, **at_root["dst"])
    scattered = [None]
    dist.scatter_object_list(scattered, [{"to": q, "t": torch.arange(q + 1)} for q in range(p)]
                             if me == root else None, group=g, **at_root["src"])
    sent = None
    if p > 1:
        other = members[(pick + 1) % p]
        if me == root:
            dist.send_object_list([mine, "second"], other, group=g)
        elif me == other:
            got = [None, None]
            sent = (got, dist.recv_object_list(got, root, group=g))
    return bcast, everyone, gathered, scattered, sent


def main() -> None:
    me, size = dist.get_rank(), dist.get_world_size()
    rng = np.random.default_rng(SEED)
    groups = [(None, list(range(size)))]  # (group, its global ranks), the same list on every rank
    lines = []
    for i in range(CALLS):
        g, members = groups[int(rng.integers(len(groups)))]
        kind = str(rng.choice(KINDS))
        dt = str(rng.choice(list(DTYPES)))
        if kind == "gather" and dt == "complex64":
            dt = "float64"  # Gloo's gather refuses complex ("Invalid scalar type")
        op = str(rng.choice(ops_for(dt, len(members))))
        big = rng.random() < 0.1
        n = int(rng.integers(1000, 12_000)) if big else int(rng.integers(0, 40))
        shape = (n,) if big or rng.random() < 0.7 else (n // 4, int(rng.integers(1, 5)))
        s, pick, tag = int(rng.integers(1 << 30)), int(rng.integers(1 << 20)), int(rng.integers(0, 100))
        async_op, by_group_rank = bool(rng.random() < 0.3), bool(rng.random() < 0.3)
        world_by_name = bool(rng.random() < 0.5)  # the world as group=dist.group.WORLD, not None
        if kind == "new_group":
            if len(groups) < 5:
                k = int(rng.integers(1, size + 1))
                chosen = [int(q) for q in rng.choice(size, k, replace=False)]  # in any order:
                ranks = sorted(chosen)                                          # new_group sorts
                groups.append((dist.new_group(chosen), ranks))  # every rank calls new_group
                if me in ranks:
                    got = (dist.get_rank(groups[-1][0]), dist.get_world_size(groups[-1][0]),
                           dist.get_process_group_ranks(groups[-1][0]))
                    lines.append(f"{i} new_group {ranks} {digest(got)} {got}")
            continue
        if me not in members:
            continue
        if g is None and world_by_name:
            g = dist.group.WORLD
        what = f"{i} {kind} ranks={members}"
        if kind == "objects":
            got = objects(g, members, s, pick, by_group_rank)
        else:
            got = call(g, members, kind, dt, op, shape, s, pick, async_op, by_group_rank, tag)
            what += f" {dt}{' ' + op if kind in REDUCING else ''} shape={shape} async={async_op}"
        if got is not None:
            lines.append(f"{what} {digest(got)}")
    dist.barrier()
    with open(f"{OUT}.{me}", "w") as f:
        f.write("\n".join(lines) + "\n")
    dist.destroy_process_group()


main()
