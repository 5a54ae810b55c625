"""The "collie" torch.distributed backend (collie.torch), on real processes.

Every body runs on 2-4 forked ranks that call torch's own
``dist.init_process_group("collie")`` (env://, torch's TCPStore) and then
only torch APIs; results are compared with references computed locally
with torch. Covered: every c10d method torch 2.13 dispatches for CPU
tensors (every ReduceOp, PREMUL_SUM included, uneven all_to_all_single,
coalesced calls, async_op and futures, point to point from any source),
sub-groups made by their members alone, the errors collie raises reaching
the torch caller (also inside DDP's backward), DDP against a single-process
reference, DeviceMesh, functional collectives, DTensor and FSDP2.
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

import collie.torch  # noqa: E402,F401 - registers "collie"
from harness import run_ranks  # noqa: E402

pytestmark = pytest.mark.timeout(180)

ROOT = Path(__file__).resolve().parents[1]


def run(body, n, *args, timeout=90, expect_errors=False, init_timeout=None, env=None):
    """``body(rank, size, *args)`` on n ranks inside a torch job with backend
    collie; the default group is destroyed afterwards."""
    return run_ranks(_torch_body, n, body, init_timeout, *args, init=False, timeout=timeout,
                     expect_errors=expect_errors, env=env)


def _torch_body(rank, size, body, init_timeout, *args):
    kwargs = {} if init_timeout is None else {"timeout": timedelta(seconds=init_timeout)}
    dist.init_process_group("collie", **kwargs)
    try:
        return body(rank, size, *args)
    finally:
        dist.destroy_process_group()


def _close(a, b):
    return a.shape == b.shape and torch.allclose(a.double(), b.double(), rtol=1e-5, atol=1e-6)


# ---- every method ----

def _inputs(rank, dtype, n=5):
    return (torch.arange(n) % 3 + rank + 1).to(dtype)


def _methods(rank, size):
    bad = []

    def check(what, got, want):
        if not _close(got, want):
            bad.append(f"{what}: got {got.tolist()} want {want.tolist()}")

    every = [_inputs(r, torch.float64) for r in range(size)]
    stacked = torch.stack(every)
    refs = {dist.ReduceOp.SUM: stacked.sum(0), dist.ReduceOp.PRODUCT: stacked.prod(0),
            dist.ReduceOp.MIN: stacked.min(0).values, dist.ReduceOp.MAX: stacked.max(0).values,
            dist.ReduceOp.AVG: stacked.mean(0)}
    for op, want in refs.items():
        for dtype in (torch.float32, torch.float64):
            t = _inputs(rank, dtype)
            dist.all_reduce(t, op=op)
            check(f"all_reduce {op} {dtype}", t, want)
    t = _inputs(rank, torch.float32)
    dist.all_reduce(t, op=dist._make_nccl_premul_sum(0.5))
    check("all_reduce PREMUL_SUM", t, refs[dist.ReduceOp.SUM] * 0.5)
    ints = [torch.tensor([0b1100, 0b1010, 7]) + r for r in range(size)]
    for op, fn in ((dist.ReduceOp.BAND, lambda a, b: a & b), (dist.ReduceOp.BOR, lambda a, b: a | b),
                   (dist.ReduceOp.BXOR, lambda a, b: a ^ b)):
        want = ints[0]
        for x in ints[1:]:
            want = fn(want, x)
        t = ints[rank].clone()
        dist.all_reduce(t, op=op)
        check(f"all_reduce {op}", t, want)
    t = torch.tensor([1 + 2j, 3 - 1j]) * (rank + 1)
    dist.all_reduce(t)
    if not torch.equal(t, torch.tensor([1 + 2j, 3 - 1j]) * sum(range(1, size + 1))):
        bad.append(f"complex all_reduce: {t}")

    # async + future
    t = _inputs(rank, torch.float32)
    work = dist.all_reduce(t, async_op=True)
    fut = work.get_future()
    got = fut.wait()[0]
    if not work.wait(timedelta(0)) or not work.is_completed() or not work.is_success():
        bad.append("async all_reduce: work not complete after wait")
    check("async all_reduce future", got, refs[dist.ReduceOp.SUM])
    check("async all_reduce tensor", t, refs[dist.ReduceOp.SUM])

    # coalesced calls
    ts = [_inputs(rank, torch.float32, 3), _inputs(rank, torch.float32, 4)]
    dist.all_reduce_coalesced(ts)
    for i, t in enumerate(ts):
        check(f"all_reduce_coalesced[{i}]", t, sum(_inputs(r, torch.float32, 3 + i) for r in range(size)))
    with dist._coalescing_manager(async_ops=True) as cm:
        a, b = _inputs(rank, torch.float32, 2), _inputs(rank, torch.float32, 6)
        dist.all_reduce(a)
        dist.all_reduce(b)
    cm.wait()
    check("coalescing_manager all_reduce", b, sum(_inputs(r, torch.float32, 6) for r in range(size)))
    outs = [torch.zeros(2 * size), torch.zeros(3 * size)]
    with dist._coalescing_manager():
        dist.all_gather_into_tensor(outs[0], torch.full((2,), float(rank)))
        dist.all_gather_into_tensor(outs[1], torch.full((3,), float(rank)))
    check("coalescing_manager all_gather_into_tensor",
          outs[1], torch.arange(size).float().repeat_interleave(3))
    rs = [torch.zeros(2), torch.zeros(1)]
    with dist._coalescing_manager():
        dist.reduce_scatter_tensor(rs[0], torch.arange(2.0 * size) + rank)
        dist.reduce_scatter_tensor(rs[1], torch.arange(1.0 * size) * (rank + 1))
    check("coalescing_manager reduce_scatter_tensor",
          rs[0], (torch.arange(2.0 * size) * size + sum(range(size)))[2 * rank:2 * rank + 2])

    # rooted
    for root in range(size):
        t = _inputs(rank, torch.float32)
        dist.broadcast(t, src=root)
        check(f"broadcast from {root}", t, _inputs(root, torch.float32))
        t = _inputs(rank, torch.float32)
        dist.reduce(t, dst=root, op=dist.ReduceOp.MAX)
        check(f"reduce to {root}", t, refs[dist.ReduceOp.MAX].float() if rank == root
              else _inputs(rank, torch.float32))
        t = torch.full((2,), float(rank))
        outs = [torch.zeros(2) for _ in range(size)] if rank == root else None
        dist.gather(t, outs, dst=root)
        if rank == root:
            for r in range(size):
                check(f"gather to {root}[{r}]", outs[r], torch.full((2,), float(r)))
        out = torch.zeros(3)
        parts = [torch.full((3,), 10.0 * r + root) for r in range(size)] if rank == root else None
        dist.scatter(out, parts, src=root)
        check(f"scatter from {root}", out, torch.full((3,), 10.0 * rank + root))

    # gathers and scatters
    lst = [torch.zeros(2) for _ in range(size)]
    dist.all_gather(lst, torch.full((2,), float(rank)))
    for r in range(size):
        check(f"all_gather[{r}]", lst[r], torch.full((2,), float(r)))
    out = torch.zeros(size, 2)
    dist.all_gather_into_tensor(out, torch.full((2,), float(rank)))
    check("all_gather_into_tensor", out, torch.arange(size).float()[:, None].expand(size, 2))
    out = torch.zeros(2 * size)
    dist.all_gather_single(out, torch.full((2,), float(rank)))
    check("all_gather_single", out, torch.arange(size).float().repeat_interleave(2))
    out_lists = [[torch.zeros(2), torch.zeros(3)] for _ in range(size)]
    dist.all_gather_coalesced(out_lists, [torch.full((2,), float(rank)), torch.full((3,), -float(rank))])
    for r in range(size):
        check(f"all_gather_coalesced[{r}][1]", out_lists[r][1], torch.full((3,), -float(r)))
    out = torch.zeros(2)
    dist.reduce_scatter(out, [torch.full((2,), float(q + rank)) for q in range(size)])
    check("reduce_scatter", out, torch.full((2,), float(size * rank + sum(range(size)))))
    out = torch.zeros(2)
    dist.reduce_scatter_tensor(out, torch.arange(2.0 * size) * (rank + 1), op=dist.ReduceOp.AVG)
    check("reduce_scatter_tensor AVG", out,
          (torch.arange(2.0 * size) * (size + 1) / 2)[2 * rank:2 * rank + 2])
    out = torch.zeros(2)
    dist.reduce_scatter_single(out, torch.arange(2.0 * size))
    check("reduce_scatter_single", out, (torch.arange(2.0 * size) * size)[2 * rank:2 * rank + 2])

    # all to all
    outs = [torch.zeros(1) for _ in range(size)]
    dist.all_to_all(outs, [torch.tensor([10.0 * rank + q]) for q in range(size)])
    for q in range(size):
        check(f"all_to_all[{q}]", outs[q], torch.tensor([10.0 * q + rank]))
    # uneven: rank r sends (q + r) % 3 rows of width 2 to rank q
    rows = lambda r, q: (q + r) % 3  # noqa: E731
    send = torch.cat([torch.full((rows(rank, q), 2), 100.0 * rank + q) for q in range(size)])
    out = torch.zeros(sum(rows(r, rank) for r in range(size)), 2)
    dist.all_to_all_single(out, send, output_split_sizes=[rows(r, rank) for r in range(size)],
                           input_split_sizes=[rows(rank, q) for q in range(size)])
    want = torch.cat([torch.full((rows(r, rank), 2), 100.0 * r + rank) for r in range(size)])
    check("all_to_all_single uneven", out, want)
    out = torch.zeros(size)
    dist.all_to_all_single(out, torch.arange(float(size)) + 10 * rank)
    check("all_to_all_single even", out, torch.arange(float(size)) * 10 + rank)

    # point to point
    nxt, prv = (rank + 1) % size, (rank - 1) % size
    got = torch.zeros(2)
    works = dist.batch_isend_irecv([dist.P2POp(dist.irecv, got, prv), dist.P2POp(dist.isend, torch.full((2,), float(rank)), nxt)])
    for w in works:
        w.wait()
    check("batch_isend_irecv", got, torch.full((2,), float(prv)))
    if rank != 0:
        dist.send(torch.tensor([float(rank)]), dst=0, tag=3)
    else:
        senders = set()
        for _ in range(size - 1):
            x = torch.zeros(1)
            src = dist.recv(x, tag=3)
            senders.add(src)
            if x.item() != src:
                bad.append(f"recv from any: got {x.item()} from {src}")
        if senders != set(range(1, size)):
            bad.append(f"recv from any: senders {senders}")
    if rank == 0:
        x = torch.zeros(1)
        work = dist.irecv(x)  # any source
        work.wait()
        if work._source_rank() != 1 or x.item() != 42:
            bad.append(f"irecv any: source {work._source_rank()} value {x.item()}")
    elif rank == 1:
        dist.isend(torch.tensor([42.0]), dst=0).wait()
    # objects ride on all_gather / broadcast
    objs = [None] * size
    dist.all_gather_object(objs, {"rank": rank})
    if objs != [{"rank": r} for r in range(size)]:
        bad.append(f"all_gather_object: {objs}")
    lst = [f"hello {rank}"]
    dist.broadcast_object_list(lst, src=size - 1)
    if lst != [f"hello {size - 1}"]:
        bad.append(f"broadcast_object_list: {lst}")
    dist.barrier()
    w = dist.barrier(async_op=True)
    w.wait()
    return bad


@pytest.mark.parametrize("n", [2, 3])
def test_every_method_matches_reference(n):
    for rank, bad in enumerate(run(_methods, n, timeout=150)):
        assert bad == [], f"rank {rank}: {bad}"


def _names(rank, size):
    pg = dist.group.WORLD
    g = dist.new_group([0, size - 1], group_desc="ends")
    out = {"backend": dist.get_backend(), "pg": type(pg).__name__, "world_name": pg.group_name,
           "name": pg.name(), "sub_desc": g.group_desc if rank in (0, size - 1) else None}
    if rank in (0, size - 1):
        out["sub_name_resolves"] = dist.distributed_c10d._resolve_process_group(g.group_name) is g
    return out


def test_names_and_backend():
    for r in run(_names, 3):
        assert r["backend"] == "collie" and r["pg"] == "CollieProcessGroup" and r["name"] == "collie"
        assert r["world_name"] == "0"
    got = run(_names, 3)
    assert got[0]["sub_desc"] == "ends" and got[0]["sub_name_resolves"] and got[2]["sub_name_resolves"]


def test_mixed_backend_string():
    def body(rank, size):
        dist.init_process_group("cpu:collie,cuda:nccl")
        try:
            t = torch.ones(2) * (rank + 1)
            dist.all_reduce(t)
            return dist.get_backend(), type(dist.group.WORLD).__name__, t.tolist()
        finally:
            dist.destroy_process_group()
    for r in run_ranks(body, 2, init=False, timeout=60):
        assert r == ("cpu:collie,cuda:nccl", "CollieProcessGroup", [3.0, 3.0])


# ---- sub-groups ----

def _subgroups(rank, size):
    out = {}
    # made by its members alone: the other ranks never call anything
    if rank in (1, 3):
        g = dist.new_group([1, 3], use_local_synchronization=True)
        t = torch.tensor([float(rank)])
        dist.all_reduce(t, group=g)
        out["local"] = t.item()
        out["group_rank"] = dist.get_rank(g)
    even = dist.new_group([0, 2])
    odd = dist.new_group([1, 3])
    mine = even if rank % 2 == 0 else odd
    t = torch.tensor([float(rank)])
    dist.all_reduce(t, group=mine)
    out["pair"] = t.item()
    t = torch.tensor([float(rank)])
    dist.broadcast(t, src=2 if rank % 2 == 0 else 3, group=mine)  # global rank
    out["bcast"] = t.item()
    sub, _ = dist.new_subgroups(2)
    t = torch.ones(1)
    dist.all_reduce(t, group=sub)
    out["subgroups"] = t.item()
    return out


def test_subgroups_four_ranks():
    got = run(_subgroups, 4)
    assert [g["pair"] for g in got] == [2.0, 4.0, 2.0, 4.0]
    assert [g["bcast"] for g in got] == [2.0, 3.0, 2.0, 3.0]
    assert [g["subgroups"] for g in got] == [2.0] * 4
    assert got[1]["local"] == got[3]["local"] == 4.0 and got[3]["group_rank"] == 1


# ---- errors reach the torch caller ----

def _mismatch(rank, size):
    from collie.errors import MismatchError
    try:
        dist.all_reduce(torch.ones(3 if rank == 0 else 4))
    except MismatchError as exc:
        return ("MismatchError", str(exc))
    return ("none", "")


def test_mismatch_raises_mismatch_error():
    for kind, msg in run(_mismatch, 2):
        assert kind == "MismatchError" and "count=3" in msg and "count=4" in msg, msg


def _async_mismatch(rank, size):
    from collie.errors import MismatchError
    work = dist.broadcast(torch.ones(2), src=rank, async_op=True)  # each thinks it is the root
    try:
        work.wait()
        dist.barrier()
    except MismatchError as exc:
        return ("MismatchError", str(exc)[:200], work.is_completed())
    return ("none", "", work.is_completed())


def test_async_mismatch_raises_from_wait():
    for kind, msg, done in run(_async_mismatch, 2):
        assert kind == "MismatchError" and "broadcast" in msg, msg


def _peer_dies(rank, size):
    from collie.errors import PeerError
    if rank == 1:
        os._exit(3)
    try:
        dist.all_reduce(torch.ones(4))
    except PeerError as exc:
        return ("PeerError", exc.peer)
    return ("none", None)


def test_dead_peer_raises_peer_error():
    got = run(_peer_dies, 2, expect_errors=True)
    assert got[0] == ("PeerError", 1)


def _absent(rank, size):
    from collie.errors import CollieTimeout
    if rank == 1:
        time.sleep(6)
        return "slept"
    t0 = time.monotonic()
    try:
        dist.all_reduce(torch.ones(4), async_op=True).wait()
    except CollieTimeout as exc:
        return ("CollieTimeout", exc.peers, round(time.monotonic() - t0))
    return ("none",)


def test_absent_peer_raises_timeout():
    got = run(_absent, 2, init_timeout=2, expect_errors=True)
    assert got[0][0] == "CollieTimeout" and 1 in got[0][1], got


def _ddp_error(rank, size, kind):
    from torch.nn.parallel import DistributedDataParallel as DDP
    torch.manual_seed(0)
    ddp = DDP(torch.nn.Linear(8, 4))
    loss = ddp(torch.randn(4, 8)).sum()
    if rank == 1:
        if kind == "mismatch":
            try:
                dist.all_reduce(torch.ones(3))
            except Exception as exc:  # noqa: BLE001
                return type(exc).__name__
        if kind == "dies":
            os._exit(3)
        if kind == "absent":
            time.sleep(6)
        return "rank 1"
    try:
        loss.backward()
    except RuntimeError as exc:
        return str(exc)
    return "backward succeeded"


@pytest.mark.parametrize("kind,error", [("mismatch", "MismatchError"), ("dies", "PeerError"),
                                        ("absent", "CollieTimeout")])
def test_errors_inside_ddp_backward(kind, error):
    got = run(_ddp_error, 2, kind, init_timeout=2, expect_errors=True)
    assert error in got[0], got[0]


def test_bad_input_is_a_clear_error():
    def body(rank, size):
        out = []
        for call in (lambda: dist.all_reduce(torch.ones(2, dtype=torch.float32), op=dist.ReduceOp.BAND),
                     lambda: dist.all_to_all_single(torch.zeros(3), torch.zeros(3), [1, 1], [2, 2])):
            try:
                call()
                out.append("no error")
            except (TypeError, ValueError) as exc:
                out.append(type(exc).__name__)
        return out
    for r in run(body, 2):
        assert r == ["TypeError", "ValueError"], r


# ---- DDP against a single process ----

class _Skippable(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(12, 32)
        self.b = torch.nn.Linear(32, 6)
        self.unused = torch.nn.Linear(6, 6)

    def forward(self, x, skip=False):
        h = self.b(torch.relu(self.a(x)))
        return h if skip else self.unused(h)


def _ddp_plain(rank, size, variant):
    from torch.nn.parallel import DistributedDataParallel as DDP
    torch.manual_seed(0)
    model = _Skippable()
    ref = copy.deepcopy(model)
    kwargs = {"bucket_cap_mb": 0.001}  # several buckets
    if variant == "bucket_view":
        kwargs["gradient_as_bucket_view"] = True
    if variant == "unused":
        kwargs["find_unused_parameters"] = True
    ddp = DDP(model, **kwargs)
    if variant == "fp16_hook":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    skip = variant == "unused"
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    ropt = torch.optim.SGD(ref.parameters(), lr=0.05, momentum=0.9)
    gen = torch.Generator().manual_seed(1)
    per = 3
    for _ in range(4):
        x = torch.randn(size * per, 12, generator=gen)
        y = torch.randn(size * per, 6, generator=gen)
        opt.zero_grad()
        ropt.zero_grad()
        part = slice(rank * per, (rank + 1) * per)
        torch.nn.functional.mse_loss(ddp(x[part], skip=skip), y[part]).backward()
        opt.step()
        torch.nn.functional.mse_loss(ref(x, skip=skip), y).backward()
        ropt.step()
    pairs = list(zip(model.parameters(), ref.parameters()))
    grads = max((a.grad - b.grad).abs().max().item() for a, b in pairs if b.grad is not None)
    params = max((a - b).abs().max().item() for a, b in pairs)
    return grads, params


@pytest.mark.parametrize("variant,tol", [("plain", 1e-6), ("bucket_view", 1e-6), ("unused", 1e-6),
                                         ("fp16_hook", 2e-3)])
def test_ddp_equals_single_process(variant, tol):
    for grads, params in run(_ddp_plain, 2, variant):
        assert grads < tol and params < tol, (variant, grads, params)


# ---- DeviceMesh, functional collectives, DTensor, FSDP2 ----

def _mesh(rank, size):
    from torch.distributed.device_mesh import init_device_mesh
    import torch.distributed._functional_collectives as funcol
    from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    out = {"coord": list(mesh.get_coordinate()), "tp_ranks": dist.get_process_group_ranks(mesh.get_group("tp")),
           "dp_local": mesh["dp"].get_local_rank()}
    t = torch.tensor([float(rank)])
    dist.all_reduce(t, group=mesh["tp"].get_group())
    out["tp_sum"] = t.item()
    out["funcol"] = funcol.all_reduce(torch.tensor([float(rank)]), "sum", (mesh, 0)).item()
    out["funcol_ag"] = funcol.all_gather_tensor(torch.tensor([float(rank)]), 0, (mesh, 1)).tolist()
    full = torch.arange(16.0).reshape(4, 4)
    d = distribute_tensor(full, mesh["tp"], [Shard(0)])
    out["shard"] = d.to_local().tolist()
    out["replicated"] = torch.equal(d.redistribute(mesh["tp"], [Replicate()]).to_local(), full)
    d2 = distribute_tensor(full, mesh, [Shard(0), Shard(1)])
    out["2d_full"] = torch.equal(d2.full_tensor(), full)
    out["dtensor_sum"] = (DTensor.from_local(torch.ones(2), mesh["dp"], [Shard(0)]).full_tensor().tolist())
    return out


def test_device_mesh_functional_dtensor():
    got = run(_mesh, 4, timeout=150)
    for rank, r in enumerate(got):
        dp, tp = divmod(rank, 2)
        assert r["coord"] == [dp, tp] and r["tp_ranks"] == [2 * dp, 2 * dp + 1] and r["dp_local"] == dp
        assert r["tp_sum"] == 4 * dp + 1
        assert r["funcol"] == (0 + 2 if tp == 0 else 1 + 3)  # over dp: ranks tp and tp + 2
        assert r["funcol_ag"] == [2.0 * dp, 2.0 * dp + 1]
        assert r["shard"] == torch.arange(16.0).reshape(4, 4)[2 * tp:2 * tp + 2].tolist()
        assert r["replicated"] and r["2d_full"] and r["dtensor_sum"] == [1.0] * 4


def _fsdp2(rank, size):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    ref = copy.deepcopy(model)
    mesh = init_device_mesh("cpu", (size,))
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ropt = torch.optim.SGD(ref.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(2)
    for _ in range(3):
        x = torch.randn(size * 2, 8, generator=gen)
        y = torch.randn(size * 2, 4, generator=gen)
        part = slice(2 * rank, 2 * rank + 2)
        opt.zero_grad()
        ropt.zero_grad()
        torch.nn.functional.mse_loss(model(x[part]), y[part]).backward()
        opt.step()
        torch.nn.functional.mse_loss(ref(x), y).backward()
        ropt.step()
    return max((p.full_tensor() - r).abs().max().item() for p, r in zip(model.parameters(), ref.parameters()))


def test_fsdp2_fully_shard_equals_single_process():
    for diff in run(_fsdp2, 2, timeout=150):
        assert diff < 1e-5, diff


# ---- registration and the entry point ----

def _python(code: str, **env) -> subprocess.CompletedProcess:
    full = dict(os.environ, PYTHONPATH=str(ROOT / "src"), **env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=full)


def test_autoload_registers_and_honours_the_switch():
    code = ("import torch.distributed as dist\n"
            "import collie._torch_autoload as a\n"
            "dist.Backend._plugins.pop('COLLIE', None)\n"  # as if collie.torch had not run yet
            "a.autoload()\n"
            "print('COLLIE' in dist.Backend._plugins)\n")
    assert _python(code).stdout.split() == ["True"]
    assert _python(code, TORCH_DEVICE_BACKEND_AUTOLOAD="0").stdout.split() == ["False"]


def test_autoload_never_raises():
    code = ("import warnings, collie.torch as ct, collie._torch_autoload as a\n"
            "def boom(): raise RuntimeError('broken')\n"
            "ct.register = boom\n"
            "with warnings.catch_warnings(record=True) as w:\n"
            "    warnings.simplefilter('always')\n"
            "    a.autoload()\n"
            "print(any('broken' in str(x.message) for x in w))\n")
    got = _python(code)
    assert got.returncode == 0 and got.stdout.split() == ["True"], got.stderr


def test_import_collie_torch_first_is_quiet():
    """`import collie.torch` before torch (python -m collie.torch.bench_ddp
    does): torch's import runs the entry point while collie.torch is half
    imported; it must stay silent and the backend still be registered."""
    code = ("import collie.torch, torch.distributed as dist\n"
            "print('COLLIE' in dist.Backend._plugins)\n")
    got = _python(code)
    assert got.returncode == 0 and got.stdout.split() == ["True"], got.stderr[-2000:]
    assert "could not register" not in got.stderr


def test_entry_point_registers_at_import_torch(tmp_path):
    """The entry point pyproject.toml declares, installed as a dist-info on
    the path: a plain `import torch` registers "collie" with no collie import,
    and TORCH_DEVICE_BACKEND_AUTOLOAD=0 keeps it out."""
    text = (ROOT / "pyproject.toml").read_text()
    section = text.split('[project.entry-points."torch.backends"]', 1)[1]
    line = next(l for l in section.splitlines() if l.startswith("collie ="))
    info = tmp_path / "collie_entry_test-0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: collie-entry-test\nVersion: 0\n")
    (info / "entry_points.txt").write_text("[torch.backends]\n" + line.replace('"', "") + "\n")
    code = ("import sys; sys.path.insert(0, %r)\n"
            "import torch, torch.distributed as dist\n"
            "print('COLLIE' in dist.Backend._plugins, 'collie.torch' in sys.modules)\n" % str(tmp_path))
    got = _python(code)
    assert got.stdout.split() == ["True", "True"], got.stderr[-2000:]
    assert _python(code, TORCH_DEVICE_BACKEND_AUTOLOAD="0").stdout.split() == ["False", "False"]


# ---- the same program under the launchers ----

PROGRAM = ROOT / "tests" / "torch_launch_program.py"


def _launch(command, env=None, timeout=90):
    full = dict(os.environ, PYTHONPATH=str(ROOT / "src"), **(env or {}))
    try:
        got = subprocess.run(command, cwd=ROOT, env=full, capture_output=True, text=True, timeout=timeout,
                             start_new_session=True)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{' '.join(map(str, command))} still running after {timeout}s: {exc.stdout}\n{exc.stderr}")
    assert got.returncode == 0, f"exit {got.returncode}:\n{got.stdout[-2000:]}\n{got.stderr[-4000:]}"
    return got.stdout


def _oks(out: str, n: int) -> list:
    return sorted(line for line in out.splitlines() if line.startswith("rank ") and line.endswith(" ok"))


@pytest.mark.parametrize("mode", ["collie", "torch"])
def test_torchrun_standalone(mode):
    """torch 2.13's torchrun serves the store from its agent
    (TORCHELASTIC_USE_AGENT_STORE=True): collie's own API joins it through
    torch's TCPStore client, and torch's init uses it for backend collie."""
    out = _launch([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                   str(PROGRAM), mode], env={"OMP_NUM_THREADS": "1"})
    assert _oks(out, 2) == ["rank 0 of 2: sum 3 ok", "rank 1 of 2: sum 3 ok"], out


@pytest.mark.parametrize("mode", ["collie", "torch"])
def test_collie_run(mode):
    out = _launch([sys.executable, "-m", "collie", "run", "-n", "3", str(PROGRAM), mode])
    assert len(_oks(out, 3)) == 3, out


@pytest.mark.skipif(not __import__("shutil").which("mpiexec"), reason="no mpiexec on this machine")
def test_mpiexec_collie_api():
    """torch's own env:// reads RANK/WORLD_SIZE only, which mpiexec does not
    set: under mpiexec the torch mode needs init_method arguments, so only
    collie's API (which reads PMI_RANK/OMPI_COMM_WORLD_RANK) runs unchanged."""
    from harness import free_port
    out = _launch(["mpiexec", "-n", "2", sys.executable, str(PROGRAM), "collie"],
                  env={"MASTER_PORT": str(free_port()), "COLLIE_TOKEN": "t" * 32})
    assert len(_oks(out, 2)) == 2, out
