"""The "collie" torch.distributed backend: a ProcessGroup whose calls are collie's.

torch.distributed hands every collective of a group to its ProcessGroup's
methods (``allreduce(tensors, opts)``, ``allgather(outs, ins, opts)``...),
from Python (``dist.all_reduce``) or from C++ (DDP's reducer, functional
collectives). ``CollieProcessGroup`` implements them with collie's
collectives on a collie group of the same ranks, so the argument layouts
of c10d become collie's one call each:

- ``allgather(outs, ins)``: ``outs[0][r]`` receives rank r's ``ins[0]``;
  ``allgather_coalesced(outs, ins)``: ``outs[r][i]`` receives rank r's
  ``ins[i]`` (rank first, then tensor: the other way round).
- ``reduce_scatter(outs, ins)``: ``ins[0][r]`` is reduced into rank r's
  ``outs[0]``.
- roots (``opts.rootRank``) and peers (``dst``, ``src``) are group ranks.

Calls with ``opts.asyncOp`` false (a blocking ``dist.all_reduce``) run on
the caller's thread and return None, which torch takes as "done": no Work,
no Future, no option object beyond the two fields read. Asynchronous calls
(``async_op=True``, and every call from C++, whose options default to
asynchronous) run in call order on one thread per process and return a
``CollieWork``; a blocking call first waits for the earlier asynchronous
ones, so every rank runs a group's collectives in the order it issued them.

Errors: ``CollieWork.wait()`` raises the collective's own exception
(MismatchError, PeerError, CollieTimeout...). ``get_future()`` makes a
Future that fails in C++ (not a Future holding the exception as a value,
which C++ callers such as DDP would take for success).
"""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Optional

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import AllreduceOptions

from .. import collectives as C
from .. import group as G
from .. import p2p as P
from ..errors import CollieError, CollieTimeout
from ..ops import ReduceOp
from ._store import TorchStore

__all__ = ["CollieProcessGroup", "CollieWork", "create_collie_process_group"]

BACKEND_NAME = "collie"

_RED = dist.ReduceOp.RedOpType
# torch's reduce op codes -> collie's ops (PREMUL_SUM carries a factor: made per call)
_OPS = {_RED.SUM: ReduceOp.SUM, _RED.AVG: ReduceOp.AVG, _RED.PRODUCT: ReduceOp.PRODUCT,
        _RED.MIN: ReduceOp.MIN, _RED.MAX: ReduceOp.MAX, _RED.BAND: ReduceOp.BAND,
        _RED.BOR: ReduceOp.BOR, _RED.BXOR: ReduceOp.BXOR}
# The same by the enum's integer value: ``code.value`` and a tuple index cost
# a third of hashing the pybind enum (this is on every dist.all_reduce).
_SUM = dist.ReduceOp.SUM
_OPS_BY_VALUE = tuple(next((op for code, op in _OPS.items() if code.value == v), None)
                      for v in range(max(code.value for code in _RED.__members__.values()) + 1))


def _op(red) -> ReduceOp:
    """collie's op for a torch ``ReduceOp`` (or a bare RedOpType)."""
    code = getattr(red, "op", red)
    op = _OPS.get(code)
    if op is not None:
        return op
    if code == _RED.PREMUL_SUM:
        factor = red.__getstate__()[1]
        if isinstance(factor, torch.Tensor):
            if factor.numel() != 1:
                raise ValueError(f"PREMUL_SUM: the factor tensor must hold one element, not {factor.numel()}")
            factor = factor.item()
        return ReduceOp.PREMUL_SUM(factor)
    raise ValueError(f"collie backend: unsupported reduce op {red!r}")


def _seconds(timeout) -> Optional[float]:
    """An options or wait timeout as seconds; None for torch's "unset" (-1 ms)
    and for zero ("no timeout of its own")."""
    if timeout is None:
        return None
    seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)
    return seconds if seconds > 0 else None


# ---- running calls: on the caller's thread, or in order on one thread
# (collectives.Background, the thread collie's own async calls run on) ----

class _State:
    """What the backend keeps per collie world: the thread of asynchronous
    calls, and how many groups of each torch name were made (the key a
    sub-group's members meet under in the store)."""

    def __init__(self, world):
        self.world = world
        self.executor = C.Background("collie-torch")
        self.names: dict = {}


_state: Optional[_State] = None


def _live_state() -> _State:
    if _state is None or not G.is_initialized() or G.world() is not _state.world:
        raise CollieError("the collie process group was destroyed; call init_process_group again")
    return _state


class CollieWork(dist.Work):
    """An asynchronous call of the collie backend.

    ``wait(timeout=timedelta(0))`` blocks until the call is done and raises
    its error; zero (torch's default) means the call's own timeout, as in
    torch. ``get_future()`` is a Future of the call's output tensors that
    completes (or fails) when the call does.
    """

    _Event = threading.Event  # what says the call is done (set by the thread that runs it)

    def __init__(self, result, timeout: float, what: str):
        super().__init__()
        self._result = result
        self._timeout = timeout
        self._what = what
        self._event = self._Event()
        self._error: Optional[BaseException] = None
        self._lock = threading.Lock()
        self._base = None      # the Future completed by _finish, once get_future made one
        self._future = None
        self._source = -1

    def __repr__(self) -> str:
        return f"<CollieWork {self._what} {'done' if self._event.is_set() else 'running'}>"

    def _finish(self, _result, error: Optional[BaseException]) -> None:
        self._error = error
        with self._lock:
            self._event.set()
            base, self._base = self._base, None
        if base is not None:
            base.set_result(None)

    def _unwrap(self, _fut):
        # Raising here fails the chained Future inside C++ (setError), which
        # DDP and every other C++ waiter see as the failure it is.
        if self._error is not None:
            raise self._error
        return self._result

    def wait(self, timeout: timedelta = timedelta(0)) -> bool:
        seconds = _seconds(timeout)
        limit = self._timeout + 30 if seconds is None else seconds
        if not self._event.wait(limit):
            raise CollieTimeout(f"collie backend: {self._what} did not complete within {limit:g}s "
                                f"(Work.wait)")
        if self._error is not None:
            raise self._error
        return True

    def is_completed(self) -> bool:
        return self._event.is_set()

    def is_success(self) -> bool:
        return self._event.is_set() and self._error is None

    def exception(self):
        return self._error

    def result(self):
        self.wait()
        return self._result

    def synchronize(self) -> None:
        """CPU work has no stream to order against."""

    def get_future(self):
        complete = None
        with self._lock:
            if self._future is None:
                base = torch.futures.Future()
                self._future = base.then(self._unwrap)
                if self._event.is_set():
                    complete = base
                else:
                    self._base = base
        if complete is not None:
            complete.set_result(None)
        return self._future

    def _source_rank(self) -> int:
        self.wait()
        return self._source

    def source_rank(self) -> int:
        return self._source_rank()


class _Done:
    """The done flag of a call that the waiting thread itself completes (a
    send or receive): a threading.Event without the condition variable,
    which nothing here waits on."""

    __slots__ = ("_set",)

    def __init__(self):
        self._set = False

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        self._set = True


class _P2PWork(CollieWork):
    """A send or receive: collie's Work, posted at once (no thread)."""

    _Event = _Done

    def __init__(self, work, result, g, timeout: float, what: str):
        super().__init__(result, timeout, what)
        self._work = work
        self._g = g

    def wait(self, timeout: timedelta = timedelta(0)) -> bool:
        if not self._event.is_set():
            try:
                self._work.wait(_seconds(timeout))
            except BaseException as exc:
                self._finish(None, exc)
                raise
            sender = self._work._result
            if isinstance(sender, int):  # a receive: the sender's global rank
                self._source = self._g.group_rank(sender)
            self._finish(None, None)
        if self._error is not None:
            raise self._error
        return True

    def is_completed(self) -> bool:
        if not self._event.is_set() and self._work.is_completed():
            try:
                self.wait()
            except BaseException:  # noqa: BLE001 - kept for wait() and exception()
                pass
        return self._event.is_set()

    def is_success(self) -> bool:
        return self.is_completed() and self._error is None

    def get_future(self):
        with self._lock:
            if self._future is None and not self._event.is_set():
                # Nothing else drives a message to completion: a helper
                # thread waits for it, so that the Future completes by itself.
                threading.Thread(target=self._drive, name="collie-p2p-future", daemon=True).start()
        return super().get_future()

    def _drive(self) -> None:
        try:
            self.wait()
        except BaseException:  # noqa: BLE001 - the Future carries it
            pass


def _one(tensors, what: str):
    """The single tensor of torch's list-of-tensors calls."""
    if isinstance(tensors, torch.Tensor):
        return tensors
    if len(tensors) != 1:
        raise ValueError(f"collie backend: {what} takes one tensor per process (torch's several-"
                         f"device form is not supported), got {len(tensors)}")
    return tensors[0]


class CollieProcessGroup(dist.ProcessGroup):
    """A torch ``ProcessGroup`` that runs every call on a collie group.

    Made by torch (``init_process_group("collie")``, ``new_group``) through
    the creator registered by ``import collie.torch``; ``collie_group`` is
    the collie group of the same ranks.
    """

    def __init__(self, store, rank: int, size: int, collie_group):
        # (rank, size): pybind's (store, rank, size) constructor makes no Python subclass
        super().__init__(rank, size)
        self.store = store
        self.collie_group = collie_group
        self._timeout = collie_group.timeout
        self._group_name = ""
        self._group_desc = ""

    def __repr__(self) -> str:
        return f"<CollieProcessGroup rank={self.rank()} size={self.size()} {self.collie_group.name}>"

    # -- names --

    def name(self) -> str:
        return BACKEND_NAME

    def getBackendName(self) -> str:  # noqa: N802 - the C++ name pybind looks up
        return BACKEND_NAME

    # torch sets and reads a group's name and description through these C++
    # virtuals; the base class keeps them in its backends, which a Python
    # group has none of. Functional collectives, DTensor and FSDP2 find a
    # group by its name.
    def setGroupName(self, name: str) -> None:  # noqa: N802
        self._group_name = name

    def getGroupName(self) -> str:  # noqa: N802
        return self._group_name

    def setGroupDesc(self, desc: str) -> None:  # noqa: N802
        self._group_desc = desc

    def getGroupDesc(self) -> str:  # noqa: N802
        return self._group_desc

    @property
    def group_name(self) -> str:
        return self._group_name

    @property
    def group_desc(self) -> str:
        return self._group_desc

    # -- running --

    def _run(self, opts, fn, result, what: str):
        """Run ``fn`` now (blocking call: return None) or on the thread."""
        state = _live_state()
        if opts is not None and not opts.asyncOp:
            if state.executor.pending:
                state.executor.drain()
            fn()
            return None
        work = CollieWork(result, self._timeout, what)
        state.executor.submit(fn, work._finish)
        return work

    # -- collectives --

    def allreduce(self, tensors, opts=None):
        g = self.collie_group
        if opts.__class__ is AllreduceOptions and not opts.asyncOp and tensors.__class__ is list \
                and len(tensors) == 1 and not _state.executor.pending:
            # The hot path of a blocking dist.all_reduce: two option fields read, one call.
            red = opts.reduceOp
            # SUM, the common case, by one comparison (half the cost of .op.value)
            op = ReduceOp.SUM if red == _SUM else _OPS_BY_VALUE[red.op.value]
            try:
                C.all_reduce(tensors[0], op if op is not None else _op(red), g)
            except TypeError:
                if tensors[0].layout is not torch.sparse_coo:
                    raise
                _sparse_all_reduce(tensors[0], _op(red), g)
            return None
        if opts is None:
            opts = AllreduceOptions()
        elif not isinstance(opts, AllreduceOptions):  # the allreduce(tensor(s), op) overload
            red, opts = opts, AllreduceOptions()
            opts.reduceOp = red
        t = _one(tensors, "allreduce")
        op = _op(opts.reduceOp)
        if t.layout is torch.sparse_coo:
            return self._run(opts, lambda: _sparse_all_reduce(t, op, g), [t], "allreduce (sparse)")
        return self._run(opts, lambda: C.all_reduce(t, op, g), [t], "allreduce")

    def allreduce_coalesced(self, tensors, opts=None):
        opts = opts if opts is not None else dist.AllreduceCoalescedOptions()
        op = _op(opts.reduceOp)
        g = self.collie_group
        tensors = list(tensors)

        def run():
            for t in tensors:
                C.all_reduce(t, op, g)
        return self._run(opts, run, tensors, "allreduce_coalesced")

    def broadcast(self, tensors, opts=None):
        opts = opts if opts is not None else dist.BroadcastOptions()
        t = _one(tensors, "broadcast")
        root, g = opts.rootRank, self.collie_group
        return self._run(opts, lambda: C.broadcast(t, group=g, group_src=root), [t], "broadcast")

    def reduce(self, tensors, opts=None):
        opts = opts if opts is not None else dist.ReduceOptions()
        t = _one(tensors, "reduce")
        op, root, g = _op(opts.reduceOp), opts.rootRank, self.collie_group
        return self._run(opts, lambda: C.reduce(t, op=op, group=g, group_dst=root), [t], "reduce")

    def allgather(self, output_tensors, input_tensors, opts=None):
        """``output_tensors[0][r]`` receives rank r's ``input_tensors[0]``."""
        t = _one(input_tensors, "allgather")
        outs = list(_one(output_tensors, "allgather"))
        g = self.collie_group
        return self._run(opts or _AllgatherOptions(), lambda: C.all_gather(outs, t, g), [outs], "allgather")

    def allgather_coalesced(self, output_lists, input_list, opts=None):
        """``output_lists[r][i]`` receives rank r's ``input_list[i]``."""
        g = self.collie_group
        ins = list(input_list)
        outs = [list(row) for row in output_lists]
        if len(outs) != g.size or any(len(row) != len(ins) for row in outs):
            raise ValueError(f"allgather_coalesced: output_lists must be {g.size} lists (one per rank) of "
                             f"{len(ins)} tensors (one per input)")

        def run():
            for i, t in enumerate(ins):
                C.all_gather([row[i] for row in outs], t, g)
        return self._run(opts or _AllgatherOptions(), run, outs, "allgather_coalesced")

    def all_gather_single(self, output, input, opts=None):
        g = self.collie_group
        return self._run(opts or _AllgatherOptions(), lambda: C.all_gather_into_tensor(output, input, g),
                         [output], "all_gather_single")

    _allgather_base = all_gather_single  # the name torch < 2.11 calls

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        g = self.collie_group
        pairs = _pairs(outputs, inputs, "all_gather_single_coalesced")

        def run():
            for out, t in pairs:
                C.all_gather_into_tensor(out, t, g)
        return self._run(opts or _AllgatherOptions(), run, list(outputs), "all_gather_single_coalesced")

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        """``input_tensors[0][r]`` is reduced into rank r's ``output_tensors[0]``."""
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        out = _one(output_tensors, "reduce_scatter")
        ins = list(_one(input_tensors, "reduce_scatter"))
        op, g = _op(opts.reduceOp), self.collie_group
        return self._run(opts, lambda: C.reduce_scatter(out, ins, op, g), [out], "reduce_scatter")

    def reduce_scatter_single(self, output, input, opts=None):
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        op, g = _op(opts.reduceOp), self.collie_group
        return self._run(opts, lambda: C.reduce_scatter_tensor(output, input, op, g), [output],
                         "reduce_scatter_single")

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        op, g = _op(opts.reduceOp), self.collie_group
        pairs = _pairs(outputs, inputs, "reduce_scatter_single_coalesced")

        def run():
            for out, t in pairs:
                C.reduce_scatter_tensor(out, t, op, g)
        return self._run(opts, run, list(outputs), "reduce_scatter_single_coalesced")

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def alltoall(self, output_tensors, input_tensors, opts=None):
        outs, ins, g = list(output_tensors), list(input_tensors), self.collie_group
        return self._run(opts or _AllToAllOptions(), lambda: C.all_to_all(outs, ins, g), outs, "alltoall")

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        """Uneven splits count rows of dim 0; empty lists mean equal pieces."""
        outs = list(output_split_sizes) or None
        ins = list(input_split_sizes) or None
        g = self.collie_group
        return self._run(opts or _AllToAllOptions(),
                         lambda: C.all_to_all_single(output, input, outs, ins, g), [output],
                         "all_to_all_single")

    alltoall_base = all_to_all_single

    def gather(self, output_tensors, input_tensors, opts=None):
        """On the root ``output_tensors[0][r]`` receives rank r's tensor; elsewhere it is []."""
        opts = opts if opts is not None else dist.GatherOptions()
        t = _one(input_tensors, "gather")
        root, g = opts.rootRank, self.collie_group
        outs = list(_one(output_tensors, "gather")) if g.rank == root else None
        if g.rank != root and len(output_tensors):
            raise ValueError(f"gather: only the root (group rank {root}) passes output tensors")
        return self._run(opts, lambda: C.gather(t, outs, group=g, group_dst=root),
                         [outs] if outs is not None else [], "gather")

    def scatter(self, output_tensors, input_tensors, opts=None):
        """On the root ``input_tensors[0][r]`` goes to rank r; elsewhere it is []."""
        opts = opts if opts is not None else dist.ScatterOptions()
        t = _one(output_tensors, "scatter")
        root, g = opts.rootRank, self.collie_group
        ins = list(_one(input_tensors, "scatter")) if g.rank == root else None
        if g.rank != root and len(input_tensors):
            raise ValueError(f"scatter: only the root (group rank {root}) passes input tensors")
        return self._run(opts, lambda: C.scatter(t, ins, group=g, group_src=root), [t], "scatter")

    def barrier(self, opts=None):
        opts = opts if opts is not None else dist.BarrierOptions()
        seconds, g = _seconds(opts.timeout), self.collie_group
        return self._run(opts, lambda: C.barrier(g, timeout=seconds), [], "barrier")

    def monitored_barrier(self, timeout=None, wait_all_ranks: bool = False):
        """collie's monitored_barrier (torch's dist.monitored_barrier takes only
        Gloo groups; this method is there for callers of the group itself)."""
        _live_state().executor.drain()
        C.monitored_barrier(self.collie_group, _seconds(timeout), wait_all_ranks)

    # -- point to point (peers are group ranks) --

    def send(self, tensors, dst: int, tag: int = 0):
        t = _one(tensors, "send")
        g = self.collie_group
        work = P.isend(t, group=g, tag=tag, group_dst=dst)
        return _P2PWork(work, [t], g, self._timeout, f"send to group rank {dst}")

    def recv(self, tensors, src: int, tag: int = 0):
        t = _one(tensors, "recv")
        g = self.collie_group
        work = P.irecv(t, group=g, tag=tag, group_src=src)
        return _P2PWork(work, [t], g, self._timeout, f"recv from group rank {src}")

    def recv_anysource(self, tensors, tag: int = 0):
        """Receive from any rank of the group; ``work._source_rank()`` is the
        sender's group rank."""
        t = _one(tensors, "recv_anysource")
        g = self.collie_group
        work = P.irecv(t, None, group=g, tag=tag)
        return _P2PWork(work, [t], g, self._timeout, "recv from any source")

    # -- leaving --

    def shutdown(self) -> None:
        """Leave: the default group closes collie's world (every connection,
        thread and shared segment); a sub-group is forgotten. Idempotent."""
        global _state
        if not G.is_initialized():
            return
        w = G.world()
        if self.collie_group is w.group:
            state, _state = _state, None
            if state is not None:
                state.executor.drain()
                state.executor.stop()
            G.destroy_process_group()
        else:
            if _state is not None:
                _state.executor.drain()
            G.destroy_process_group(self.collie_group)

    def abort(self) -> None:
        self.shutdown()


def _sparse_all_reduce(t, op, g) -> None:
    """all_reduce of a sparse COO tensor, as Gloo's: every rank's indices and
    values are gathered (padded to the largest count), summed into one
    coalesced tensor, and copied into ``t`` (which may change its nnz)."""
    if op is not ReduceOp.SUM:
        raise ValueError(f"collie backend: sparse all_reduce supports ReduceOp.SUM only, not {op}")
    local = t.coalesce()
    indices, values = local.indices(), local.values()
    counts = [torch.empty(1, dtype=torch.int64) for _ in range(g.size)]
    C.all_gather(counts, torch.tensor([indices.shape[1]], dtype=torch.int64), g)
    counts = [int(c) for c in counts]
    most = max(counts)
    padded_i = indices.new_zeros((indices.shape[0], most))
    padded_i[:, :indices.shape[1]] = indices
    padded_v = values.new_zeros((most,) + tuple(values.shape[1:]))
    padded_v[:values.shape[0]] = values
    all_i = [torch.empty_like(padded_i) for _ in range(g.size)]
    all_v = [torch.empty_like(padded_v) for _ in range(g.size)]
    C.all_gather(all_i, padded_i, g)
    C.all_gather(all_v, padded_v, g)
    total = torch.sparse_coo_tensor(torch.cat([i[:, :n] for i, n in zip(all_i, counts)], dim=1),
                                    torch.cat([v[:n] for v, n in zip(all_v, counts)]), t.shape)
    t.copy_(total.coalesce())


def _AllgatherOptions():  # noqa: N802 - torch's class, not exported by torch.distributed
    return torch._C._distributed_c10d.AllgatherOptions()


def _AllToAllOptions():  # noqa: N802
    return torch._C._distributed_c10d.AllToAllOptions()


def _pairs(outputs, inputs, what: str) -> list:
    outputs, inputs = list(outputs), list(inputs)
    if len(outputs) != len(inputs):
        raise ValueError(f"{what}: {len(outputs)} outputs for {len(inputs)} inputs")
    return list(zip(outputs, inputs))


def create_collie_process_group(opts, pg_options=None) -> CollieProcessGroup:
    """torch's creator for backend "collie" (extended API): ``opts`` is a
    ``_DistributedBackendOptions`` (store, group_rank, group_size, timeout,
    group_id, global_ranks_in_group).

    The first group made (torch's default group) initializes collie's world
    on torch's store; later ones are collie groups of their global ranks,
    formed by their members alone through the store (torch calls the
    creator on members only)."""
    global _state
    if pg_options is not None:
        raise ValueError(f"the collie backend takes no pg_options, got {pg_options!r}")
    store, rank, size = opts.store, opts.group_rank, opts.group_size
    seconds = opts.timeout.total_seconds()
    ranks = list(opts.global_ranks_in_group)
    name = opts.group_id
    if not ranks:  # the default group
        if G.is_initialized():
            raise CollieError("collie is already initialized (collie.init_process_group was called): "
                              "use torch.distributed with backend 'collie' or collie's own API, not both")
        G.init_process_group("auto", store=TorchStore(store, seconds), rank=rank, world_size=size,
                             timeout=seconds)
        group = G.world().group
        _state = _State(G.world())
    else:
        state = _live_state()
        count = state.names.get(name, 0)
        state.names[name] = count + 1
        group = G.new_group_from_store(ranks, f"collie/torch/group/{name}/{count}", timeout=seconds,
                                       name=f"{name}")
    return CollieProcessGroup(store, rank, size, group)
