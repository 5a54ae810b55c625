"""The collectives, with torch.distributed's names, signatures and semantics.

Each function checks its arguments (raising ValueError/TypeError before
anything is sent), lays the user's arrays out as the buffers of its
collective (schedule.COLLECTIVES), lets the tuner pick an algorithm, and
hands the schedule to the engine. src/dst are global ranks, as in torch
(group_src/group_dst are ranks within the group).

Mismatch detection: every message of a collective carries a 64-bit *meta*
word packing the collective, dtype, reduce op, root, algorithm and element
count of the sender's call, and every receive checks it against its own call
(and its size: splits that disagree). A rank that finds a difference raises
MismatchError naming both calls and tells the group's other ranks, which
raise MismatchError too, in their current call or, if they already finished
it, in their next one. A rank can finish a call without receiving anything
from a peer that called it differently (two ranks that each think they are a
broadcast's root only send): data that arrives for a call this rank has
finished is such a difference too (Network._unexpected), and a rooted call
looks for it as it ends. Ranks stuck for a second in calls that exchange
nothing tell each other what they called (Network._check_states). The checks
cost a few integer operations per call and nothing on the wire (the word
rides in the header every message has anyway).

Asynchronous calls (async_op=True) run in call order on one background
thread per process; a blocking call first waits for those to finish, so
every rank of a group runs its collectives in the order it called them.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Callable, NamedTuple, Optional, Sequence

import numpy as np

from . import algorithms, core, engine
from . import group as _group
from .arrays import _NAMES, Buffer, numpy_view
from .errors import CollieError, CollieTimeout, MismatchError, PeerError
from .group import ProcessGroup, resolve, world
from .ops import ReduceOp, as_op, average, check_op, kernel, scale
from .rendezvous import timeout_seconds
from .runtime import RUNTIME
from .schedule import COLLECTIVES
from .tuner import Tuner
from .wire import COLLECTIVE_BIT, CONTEXT_SHIFT, LEAVE_CONTEXT, MAX_TAG, pack_meta
from .work import CompletedWork, Work, wait_seconds

__all__ = ["ReduceOp", "broadcast", "all_reduce", "reduce", "all_gather", "all_gather_into_tensor",
           "gather", "scatter", "reduce_scatter", "reduce_scatter_tensor", "all_to_all",
           "all_to_all_single", "barrier"]

def tuner() -> Tuner:
    """The runtime's tuner, made on first use after each init (runtime.py)."""
    made = RUNTIME.tuner
    if made is None:
        made = RUNTIME.tuner = Tuner()
    return made


# ---- running calls in order, synchronously or on the background thread ----

class Background:
    """One thread that runs asynchronous calls in the order they were made
    (collie's async_op=True calls, and the torch backend's): every rank
    issues them in one order, so they must also run in it."""

    def __init__(self, name: str = "collie-async"):
        self.queue: "queue.SimpleQueue" = queue.SimpleQueue()
        self.pending = 0
        self.idle = threading.Condition()
        self.thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self.thread.start()

    def _loop(self):
        core.spin_briefly_on_this_thread()  # it waits beside its process's compute
        while True:
            item = self.queue.get()
            if item is None:
                return
            fn, done = item
            result = error = None
            try:
                result = fn()
            except BaseException as exc:  # noqa: BLE001 - handed to the waiter
                error = exc
            done(result, error)
            with self.idle:
                self.pending -= 1
                self.idle.notify_all()

    def submit(self, fn, done) -> None:
        """Run ``fn()`` after the calls submitted before it, then
        ``done(result, error)`` (error: what it raised, else None)."""
        with self.idle:
            self.pending += 1
        self.queue.put((fn, done))

    def drain(self) -> None:
        with self.idle:
            while self.pending:
                self.idle.wait(0.1)

    def stop(self) -> None:
        self.queue.put(None)
        self.thread.join(timeout=5)


class AsyncWork(Work):
    """A collective running on the background thread."""

    def __init__(self, timeout: float):
        super().__init__(None, (), lambda: "")
        self._event = threading.Event()
        self._timeout = timeout

    def _finish(self, result, error: Optional[BaseException]) -> None:
        self._result, self._error = result, error
        self._event.set()

    def wait(self, timeout=None) -> bool:
        # The call itself times out after the group's timeout; waiting a
        # little longer than that turns a lost thread into an error too.
        limit = wait_seconds(timeout, self._timeout + 30)
        if not self._event.wait(limit):
            raise CollieError(f"asynchronous collective did not finish within {limit:g}s")
        self._finished = True
        if self._error is not None:
            raise self._error
        return True

    def is_completed(self) -> bool:
        return self._event.is_set()

    def is_success(self) -> bool:
        return self._event.is_set() and self._error is None

    def exception(self):
        return self._error if self._event.is_set() else None


def _background() -> Background:
    w = world()
    if w.background is None:
        w.background = Background()
    return w.background


def _after_async_calls() -> None:
    """Wait for this process's earlier async calls: a blocking call runs
    after them, in the order the ranks issued them."""
    background = world().background
    if background is not None:
        background.drain()


# ---- the shared path of every collective ----

def _transport(g: ProcessGroup) -> str:
    """"shm" when every peer of the group is on this host, else "tcp": what
    the tuner's rules key on."""
    kinds = {g.network.backend_of[r] for r in g.ranks if r != g.network.rank}
    return "shm" if kinds <= {"shm"} else "tcp"


def _root(g: ProcessGroup, rank, group_rank, role: str, what: str) -> int:
    """The root's group rank, from a global rank or a group rank."""
    if rank is not None and group_rank is not None:
        raise ValueError(f"{what}: give {role} or group_{role}, not both")
    if group_rank is not None:
        g.global_rank(group_rank)
        return int(group_rank)
    if rank is None:
        raise ValueError(f"{what}: {role} is required")
    if not isinstance(rank, (int, np.integer)):
        raise TypeError(f"{what}: {role} must be an int rank, got {type(rank).__name__}")
    return g.group_rank(int(rank))


class _Prepared(NamedTuple):
    """What a call's shape alone decides: computed once, reused by every
    call of that shape on that group (the hot path of repeated calls)."""
    choice: object
    program: engine.Program   # the plan, bound to the dtype, op and group
    meta: int
    nsteps: int               # steps of the whole call, for error messages
    rooted: bool              # a rank may finish it without hearing from every peer


def excluded(g: ProcessGroup, name: str, block_sizes: Optional[dict] = None) -> dict:
    """The algorithms of collective ``name`` that cannot run on group ``g``
    (for a call with these block sizes), each with why."""
    exclude = {}
    if block_sizes and len({size for sizes in block_sizes.values() for size in sizes}) > 1:
        # e.g. bruck forwards blocks whose uneven sizes only their two ends know
        exclude = {a: "it needs equal block sizes on every rank" for a in algorithms.algorithms_for(name)
                   if algorithms.uniform_blocks_only(name, a)}
    if _transport(g) != "shm":
        exclude["shm"] = "its ranks are not all on one host"  # windows reach one host only
    return exclude


def choose(g: ProcessGroup, name: str, nbytes: int, algorithm: Optional[str] = None,
           exclude: Optional[dict] = None):
    """The tuner's choice for a call of ``name`` on ``g``: told the group's
    transport, each rank's host, the link between hosts and the cost of a
    single copy (when known)."""
    topology = g.network.topology
    return tuner().choose(name, nbytes, g.size, _transport(g), algorithm, g.rank, exclude, g.hosts,
                          topology.link if topology is not None else None,
                          topology.single_copy if topology is not None else None)


def _prepare(g: ProcessGroup, name: str, block_sizes: dict, dtype_name: str, op, root: int, count: int,
             nbytes: int, algorithm: Optional[str]) -> _Prepared:
    exclude = excluded(g, name, block_sizes)
    choice = choose(g, name, nbytes, algorithm, exclude)
    schedule = algorithms.build(name, choice.algorithm, g.size, g.rank, root, choice.segments, g.hosts)
    dtype = np.dtype(np.uint16) if dtype_name == "bfloat16" else np.dtype(dtype_name)  # bfloat16: its bits
    window = g.network.window_capacity() // dtype.itemsize if schedule.win_like is not None else 0
    plan = engine.plan(schedule, block_sizes, window)
    program = engine.bind(plan, dtype, kernel(op, dtype_name) if op is not None else None, g.ranks)
    return _Prepared(choice, program, pack_meta(name, dtype_name, op, root, count, choice.algorithm),
                     len(plan.steps) * len(plan.slices), COLLECTIVES[name].rooted)


_PREPARED_PER_GROUP = 512

# The tracer (collie.tracing) while one is on, else None: one test per call.
# COLLIE_TRACE turns one on when collie is imported (collie/__init__.py).
TRACE = None


def _run(g: ProcessGroup, name: str, arrays: dict, block_sizes: dict, *, dtype_name: str,
         op: Optional[ReduceOp] = None, root: int = 0, count: int = 0, nbytes: int = 0,
         algorithm: Optional[str] = None, async_op: bool = False, after=None, timeout=None,
         lane_key: Optional[tuple] = None, lane_takes: Optional[tuple] = None):
    """Run collective ``name`` on the laid-out ``arrays``; ``after`` runs on
    completion (copy-backs, AVG's division...). ``timeout`` (seconds)
    replaces the group's for this call. ``lane_key``: the call may take a
    lane (see _lane) from now on, found by that key, called with the arrays
    named ``lane_takes`` (default: all of ``arrays``)."""
    # The op enters as its code: a call's program and meta word depend on
    # nothing else of it (PREMUL_SUM's factor is applied before the call),
    # and an int hashes without calling Python code.
    key = (name, dtype_name, None if op is None else op.code, root, count, nbytes, algorithm,
           tuple(block_sizes.items()))
    cache = g.prepared
    prepared = cache.get(key)
    if prepared is None:
        if len(cache) >= _PREPARED_PER_GROUP:
            cache.clear()
            g.lanes.clear()
        prepared = cache[key] = _prepare(g, name, block_sizes, dtype_name, op, root, count, nbytes, algorithm)
    seq = g.seq
    g.seq += 1
    if timeout is None:
        timeout = g.timeout
    if async_op:
        work = AsyncWork(timeout)
        _background().submit(lambda: _execute(g, name, prepared, arrays, seq, after, timeout), work._finish)
        return work
    _after_async_calls()
    _execute(g, name, prepared, arrays, seq, after, timeout)
    if lane_key is not None and lane_key not in g.lanes:
        if len(g.lanes) >= _PREPARED_PER_GROUP:  # shapes of one size can be many: bounded too
            g.lanes.clear()
        g.lanes[lane_key] = _lane(g, name, prepared, tuple(sorted(arrays)) if lane_takes is None else lane_takes)
    return None


def _execute(g: ProcessGroup, name: str, prepared: _Prepared, arrays: dict, seq: int, after,
             timeout: float, resume: Optional[tuple] = None):
    """Run call number ``seq`` of the group, then ``after``. ``resume``: a
    lane's scratch and where its run of the compiled core stopped, for Python
    to go on from."""
    def describe(step: int) -> str:
        return (f"{name} (call #{seq} on group {g.name}, algorithm {prepared.choice.algorithm}, "
                f"step {step + 1} of {prepared.nsteps})")

    network = g.network
    tag = g.collective_tag(seq)
    network.current = tag
    try:
        if resume is not None:
            core.resume(prepared.program, arrays, network, tag, prepared.meta, describe, timeout, *resume)
        elif TRACE is None:
            core.EXECUTE(prepared.program, arrays, network, tag, prepared.meta, describe, timeout)
        else:  # collie.trace: the same run, timed step by step
            TRACE.execute(g, name, seq, prepared, arrays, network, tag, describe, timeout)
    except CollieError as exc:
        if isinstance(exc, (MismatchError, PeerError, CollieTimeout)) and g.context != LEAVE_CONTEXT:
            # Tell the group the root cause, so that ranks waiting on this one
            # report the dead peer, the mismatch or the absent rank, not "rank r left".
            network.abort(g.ranks, exc)
        network.finish(tag, prepared.meta, g.ranks, failed=True)  # what it left behind is dropped
        raise
    if prepared.rooted:
        # The root of a broadcast only sends: a peer that called it with
        # another root shows only by data left for this call (_unexpected).
        network.finish(tag, prepared.meta, g.ranks)
    else:  # network.finish(tag, meta) written out: the hot path of small calls
        network.done[g.context] = (seq, prepared.meta)
        network.current = 0
    if network._abort is not None:
        # Found while this call ran (stale data of an earlier call came
        # in ahead of this call's own): this call's data may be as wrong.
        try:
            network.check(lambda: describe(prepared.nsteps - 1), tag)
        except MismatchError as exc:
            network.abort(g.ranks, exc)
            raise
    return after() if after is not None else None


# ---- lanes: a repeated call of one shape, straight to the compiled core ----
#
# A blocking call on a plain contiguous NumPy array, with the shape, dtype,
# op and algorithm of an earlier call on the same group, needs none of the
# checks and lookups above: they came out the same last time. Its lane
# (collie._core.Lane, in C) holds everything that call worked out (the
# prepared program, compiled for the core, the tag's fixed bits) and does
# only what changes per call: the sequence number, the core's run, and the
# books of a finished call. Anything unusual (a trace, a step the core hands
# back, an abort, a lost peer) goes on in _execute exactly as a first call
# would. Lanes are for programs the compiled core runs; each has a scratch of
# its own where the schedule needs one, and a group's lanes go with its
# prepared calls. A lane takes the call's arrays by position, in the order
# of their names ("in" before "out"), of any shape.

def _lane(g: ProcessGroup, name: str, prepared: _Prepared, arrays: tuple):
    """The lane of ``prepared`` on ``g``, or None where the call can't take
    one. ``arrays``: the names of the call's arrays, as its callers pass them."""
    if core.EXECUTE is not core.execute:
        return None
    found = core.lane(prepared.program, g.network)
    # The core must take every array the callers pass, or none and nothing
    # else (a group of one: the call moves nothing, the lane keeps its books).
    if found is None or (found[1] != arrays and (found[1] or found[2] != ())):
        return None
    program, names, extra, spare = found
    network, meta, context, ranks = g.network, prepared.meta, g.context, g.ranks

    def slow(seq: int, resume: Optional[tuple], *arrays):
        """The call from where the lane stopped (None: from the start)."""
        laid_out = {n: a if a.ndim == 1 else a.reshape(-1) for n, a in zip(names, arrays)}
        if resume is not None:
            resume = (spare,) + resume
        return _execute(g, name, prepared, laid_out, seq, None, g.timeout, resume)

    end = glance = None
    if prepared.rooted:
        # A rooted call ends with a sweep for data a peer sent it by mistake
        # (network.finish); where every peer is on shared memory, a look at
        # the rings' heads (in C: the glance's peers) says first whether
        # there is anything to sweep.
        glance = core.glance(network, [p for p in ranks if p != network.rank])
        end = lambda seq, tag: network.finish(tag, meta, ranks)  # noqa: E731 - (seq, tag) as the lane calls it

    fixed = (context << CONTEXT_SHIFT) | COLLECTIVE_BIT  # as ProcessGroup.collective_tag
    return core.Lane(program, len(arrays), g, network, context, fixed, MAX_TAG, meta, extra, slow, end, glance,
                     globals())


def _lane_key(name: str, arr: np.ndarray, *shape) -> tuple:
    """What a one-array call's lane is found by: the collective, the array's
    dtype and size, and the rest of the call's shape (the MPI layer's hot
    paths look up the lanes of the calls they make with it too)."""
    return (name, arr.dtype, arr.size) + shape


def _two_array_key(name: str, out: np.ndarray, inp: np.ndarray, extra: tuple) -> tuple:
    """What a call from ``inp`` into ``out``'s lane is found by (as _lane_key)."""
    return (name, out.dtype, inp.shape, out.shape) + extra


def _no_lane(group, key: tuple, tensor: np.ndarray):
    return None


def laned(entry) -> Callable[..., bool]:
    """``entry.laned``: a call of a collective's public function, with its
    arguments, run in its lane (True), or not run at all (False: it has no
    lane yet); for the MPI layer's hot paths, which have full paths of
    their own. Without the compiled core, a function that runs nothing."""
    return getattr(entry, "laned", None) or (lambda *args, **kwargs: False)


# _find_lane(group, key, tensor): the lane of a blocking call of shape ``key``
# on ``tensor`` (a plain NumPy array), with this process's async calls done,
# or None: the caller takes the full path. In C (every repeated call looks it
# up first); without the compiled core there are no lanes.
_find_lane = core.find_lane if core.find_lane is not None else _no_lane
if core.set_context is not None:  # where the core's look-ups find the world, and what they accept
    core.set_context(vars(_group), ProcessGroup, np.ndarray, numpy_view, _NAMES, MAX_TAG)


def _two_array_lane(name: str, group, output, input, async_op: bool, extra: Optional[tuple]):
    """(ran, key) for a call from ``input`` into ``output``: ran by its lane
    (True), or not (False), with the key its first full run registers a lane
    under (None: it can't take one). ``extra``: the rest of the call's shape
    (None: no lane for these arguments)."""
    if async_op or extra is None:
        return False, None
    out = output if output.__class__ is np.ndarray else numpy_view(output)
    inp = input if input.__class__ is np.ndarray else numpy_view(input)
    if out is None or inp is None or out.dtype != inp.dtype:
        return False, None
    key = _two_array_key(name, out, inp, extra)
    lane = _find_lane(group, key, out)
    if lane is None or not inp.flags.c_contiguous:
        return False, key
    lane(inp, out)
    return True, key


def _member(group, what: str) -> ProcessGroup:
    g = resolve(group)
    if g.rank < 0:
        g.require_member(what)  # raises
    return g


def _same_dtype(buffers: Sequence[Buffer], what: str) -> str:
    names = {b.dtype_name for b in buffers}
    if len(names) > 1:
        raise TypeError(f"{what}: all tensors must have one dtype, got {sorted(names)}")
    return buffers[0].dtype_name


_VALID_OPS: set = set()  # (op code, dtype name) pairs already checked (which ops a dtype
                         # takes depends on the op's kind alone, not on a PREMUL_SUM factor)


def _reduce_prep(buf: Buffer, op, what: str) -> ReduceOp:
    if op.__class__ is ReduceOp and (op.code, buf.dtype_name) in _VALID_OPS:
        return op
    checked = as_op(op)
    check_op(checked, buf.dtype_name)
    _VALID_OPS.add((checked.code, buf.dtype_name))
    return checked


# ---- the collectives ----

@core.entry
def broadcast(tensor, src: Optional[int] = None, group=None, async_op: bool = False,
              group_src: Optional[int] = None, algorithm: Optional[str] = None):
    """Copy ``tensor`` from rank ``src`` to every rank of the group, in place.

    >>> x = np.arange(2) + 10 * rank   # rank 0: [0, 1]   rank 1: [10, 11]
    >>> broadcast(x, src=1)
    >>> x                              # rank 0: [10, 11] rank 1: [10, 11]
    """
    arr = tensor if tensor.__class__ is np.ndarray else numpy_view(tensor)
    if arr is not None and not async_op:
        key = ("broadcast", arr.dtype, arr.size, src, group_src, algorithm)  # _lane_key's, written out
        lane = _find_lane(group, key, arr)
        if lane is not None:
            return lane(arr)
    else:
        key = None
    g = _member(group, "broadcast")
    root = _root(g, src, group_src, "src", "broadcast")
    buf = Buffer(tensor, writable=g.rank != root, what="broadcast tensor")  # the root only reads
    return _run(g, "broadcast", {"out": buf.flat}, {"out": (buf.count,)}, dtype_name=buf.dtype_name,
                root=root, count=buf.count, nbytes=buf.nbytes, algorithm=algorithm, async_op=async_op,
                after=buf.finish, lane_key=key)


@core.entry
def all_reduce(tensor, op=ReduceOp.SUM, group=None, async_op: bool = False,
               algorithm: Optional[str] = None):
    """Reduce ``tensor`` across the group; every rank gets the result, in place.

    >>> x = np.array([1, 2]) * (rank + 1)   # rank 0: [1, 2]  rank 1: [2, 4]
    >>> all_reduce(x)
    >>> x                                   # rank 0: [3, 6]  rank 1: [3, 6]
    """
    arr = tensor if tensor.__class__ is np.ndarray else numpy_view(tensor)
    if arr is not None and op.__class__ is ReduceOp and not async_op:
        key = ("all_reduce", arr.dtype, arr.size, op.code, algorithm)  # _lane_key's, written out
        lane = _find_lane(group, key, arr)
        if lane is not None:
            return lane(arr)
    else:
        key = None
    g = _member(group, "all_reduce")
    buf = Buffer(tensor, writable=True, what="all_reduce tensor")
    op = _reduce_prep(buf, op, "all_reduce")
    if op.name == "PREMUL_SUM":
        scale(buf.flat, op.factor, buf.dtype_name)

    if op.name == "AVG":
        def after():
            average(buf.flat, g.size, buf.dtype_name)
            buf.finish()
    else:
        after = buf.finish
    if op.name in ("AVG", "PREMUL_SUM"):
        key = None  # a lane does the exchange alone, with nothing before or after

    return _run(g, "all_reduce", {"out": buf.flat}, {"out": (buf.count,)}, dtype_name=buf.dtype_name,
                op=op, count=buf.count, nbytes=buf.nbytes, algorithm=algorithm, async_op=async_op,
                after=after, lane_key=key)


@core.entry
def reduce(tensor, dst: Optional[int] = None, op=ReduceOp.SUM, group=None, async_op: bool = False,
           group_dst: Optional[int] = None, algorithm: Optional[str] = None):
    """Reduce ``tensor`` across the group into rank ``dst``'s tensor; the
    other ranks' tensors are left unchanged (as in NCCL and MPI).

    >>> x = np.array([1, 2]) * (rank + 1)   # rank 0: [1, 2]  rank 1: [2, 4]
    >>> reduce(x, dst=0)
    >>> x                                   # rank 0: [3, 6]  rank 1: [2, 4]
    """
    arr = tensor if tensor.__class__ is np.ndarray else numpy_view(tensor)
    if arr is not None and op.__class__ is ReduceOp and not async_op:
        key = ("reduce", arr.dtype, arr.size, dst, group_dst, op.code, algorithm)  # _lane_key's, written out
        lane = _find_lane(group, key, arr)
        if lane is not None:
            return lane(arr)
    else:
        key = None
    g = _member(group, "reduce")
    root = _root(g, dst, group_dst, "dst", "reduce")
    buf = Buffer(tensor, writable=True, what="reduce tensor")
    op = _reduce_prep(buf, op, "reduce")
    work = buf.flat
    if op.name == "PREMUL_SUM":
        if g.rank != root:
            work = buf.flat.copy()  # the input of a non-root stays unchanged
        scale(work, op.factor, buf.dtype_name)

    def after():
        if g.rank == root:
            if op.name == "AVG":
                average(buf.flat, g.size, buf.dtype_name)
            buf.finish()
    if op.name in ("AVG", "PREMUL_SUM"):
        key = None  # a lane does the exchange alone, with nothing before or after

    return _run(g, "reduce", {"out": work}, {"out": (buf.count,)}, dtype_name=buf.dtype_name, op=op,
                root=root, count=buf.count, nbytes=buf.nbytes, algorithm=algorithm, async_op=async_op,
                after=after, lane_key=key)


def _gather_out(g: ProcessGroup, tensors, what: str, expect: int) -> tuple[list, np.ndarray, tuple]:
    """Lay a list of n output tensors out as one contiguous scratch."""
    if not isinstance(tensors, (list, tuple)) or len(tensors) != g.size:
        raise ValueError(f"{what}: the list must hold one tensor per rank of the group "
                         f"({g.size}), got {len(tensors) if isinstance(tensors, (list, tuple)) else tensors!r}")
    bufs = [Buffer(t, writable=True, what=f"{what} list[{i}]") for i, t in enumerate(tensors)]
    sizes = tuple(b.count for b in bufs)
    if sizes[g.rank] != expect:
        raise ValueError(f"{what}: list[{g.rank}] has {sizes[g.rank]} elements but this rank's "
                         f"tensor has {expect}")
    scratch = np.empty(sum(sizes), dtype=bufs[0].flat.dtype)
    return bufs, scratch, sizes


def _scatter_back(bufs, scratch) -> None:
    at = 0
    for b in bufs:
        np.copyto(b.flat, scratch[at:at + b.count])
        at += b.count
        b.finish()


def all_gather(tensor_list: list, tensor, group=None, async_op: bool = False,
               algorithm: Optional[str] = None):
    """Every rank's ``tensor`` into every rank's ``tensor_list`` (slot r gets rank r's).

    >>> x = np.array([rank])                # rank 0: [0]   rank 1: [1]
    >>> out = [np.zeros(1, int), np.zeros(1, int)]
    >>> all_gather(out, x)
    >>> out                                 # every rank: [array([0]), array([1])]
    """
    g = _member(group, "all_gather")
    src = Buffer(tensor, writable=False, what="all_gather tensor")
    bufs, scratch, sizes = _gather_out(g, tensor_list, "all_gather", src.count)
    dtype_name = _same_dtype([src] + bufs, "all_gather")
    return _run(g, "all_gather", {"in": src.flat, "out": scratch}, {"in": (src.count,), "out": sizes},
                dtype_name=dtype_name, count=scratch.size, nbytes=scratch.nbytes, algorithm=algorithm,
                async_op=async_op, after=lambda: _scatter_back(bufs, scratch))


@core.entry
def all_gather_into_tensor(output_tensor, input_tensor, group=None, async_op: bool = False,
                           algorithm: Optional[str] = None):
    """Concatenate every rank's ``input_tensor`` (in rank order) into
    ``output_tensor``, which has group-size times as many elements.

    >>> x = np.array([rank, rank])          # rank 0: [0, 0]  rank 1: [1, 1]
    >>> out = np.empty(4, int)
    >>> all_gather_into_tensor(out, x)
    >>> out                                 # every rank: [0, 0, 1, 1]
    """
    ran, key = _two_array_lane("all_gather", group, output_tensor, input_tensor, async_op, (algorithm,))
    if ran:
        return None
    g = _member(group, "all_gather_into_tensor")
    src = Buffer(input_tensor, writable=False, what="all_gather_into_tensor input")
    out = Buffer(output_tensor, writable=True, what="all_gather_into_tensor output")
    dtype_name = _same_dtype([src, out], "all_gather_into_tensor")
    if out.count != src.count * g.size:
        raise ValueError(f"all_gather_into_tensor: output has {out.count} elements, but group size "
                         f"{g.size} x input {src.count} = {src.count * g.size}")
    return _run(g, "all_gather", {"in": src.flat, "out": out.flat},
                {"in": (src.count,), "out": (src.count,) * g.size}, dtype_name=dtype_name,
                count=src.count, nbytes=out.nbytes, algorithm=algorithm, async_op=async_op,
                after=out.finish, lane_key=key)


def gather(tensor, gather_list: Optional[list] = None, dst: Optional[int] = None, group=None,
           async_op: bool = False, group_dst: Optional[int] = None, algorithm: Optional[str] = None):
    """Every rank's ``tensor`` into ``gather_list`` on rank ``dst`` (slot r gets rank r's).

    >>> x = np.array([rank])                 # rank 0: [0]   rank 1: [1]
    >>> out = [np.zeros(1, int), np.zeros(1, int)] if rank == 0 else None
    >>> gather(x, out, dst=0)
    >>> out                                  # rank 0: [array([0]), array([1])]  rank 1: None
    """
    g = _member(group, "gather")
    root = _root(g, dst, group_dst, "dst", "gather")
    src = Buffer(tensor, writable=False, what="gather tensor")
    # Every rank knows the layout of the root's "out" (tree algorithms
    # stage their subtree's blocks in scratch laid out like it).
    arrays, sizes = {"in": src.flat}, {"in": (src.count,), "out": (src.count,) * g.size}
    after = None
    if g.rank == root:
        bufs, scratch, out_sizes = _gather_out(g, gather_list if gather_list is not None else [],
                                               "gather", src.count)
        _same_dtype([src] + bufs, "gather")
        if len(set(out_sizes)) > 1:
            raise ValueError(f"gather: every tensor of gather_list must have {src.count} elements, "
                             f"got {list(out_sizes)}")
        arrays["out"] = scratch
        after = lambda: _scatter_back(bufs, scratch)  # noqa: E731
    elif gather_list:
        raise ValueError(f"gather: gather_list must be None on ranks other than dst (rank {g.ranks[root]})")
    return _run(g, "gather", arrays, sizes, dtype_name=src.dtype_name, root=root, count=src.count,
                nbytes=src.nbytes, algorithm=algorithm, async_op=async_op, after=after)


def scatter(tensor, scatter_list: Optional[list] = None, src: Optional[int] = None, group=None,
            async_op: bool = False, group_src: Optional[int] = None, algorithm: Optional[str] = None):
    """Rank ``src``'s ``scatter_list[r]`` into rank r's ``tensor``.

    >>> out = np.zeros(1)
    >>> parts = [np.array([5.]), np.array([7.])] if rank == 0 else None
    >>> scatter(out, parts, src=0)
    >>> out                                  # rank 0: [5.]  rank 1: [7.]
    """
    g = _member(group, "scatter")
    root = _root(g, src, group_src, "src", "scatter")
    out = Buffer(tensor, writable=True, what="scatter tensor")
    arrays, sizes = {"out": out.flat}, {"out": (out.count,), "in": (out.count,) * g.size}
    if g.rank == root:
        if not isinstance(scatter_list, (list, tuple)) or len(scatter_list) != g.size:
            raise ValueError(f"scatter: scatter_list on the source must hold one tensor per rank "
                             f"({g.size})")
        ins = [Buffer(t, writable=False, what=f"scatter list[{i}]") for i, t in enumerate(scatter_list)]
        _same_dtype([out] + ins, "scatter")
        if any(b.count != out.count for b in ins):
            raise ValueError(f"scatter: every tensor of scatter_list must have {out.count} elements, "
                             f"got {[b.count for b in ins]}")
        arrays["in"] = np.concatenate([b.flat for b in ins])
    elif scatter_list:
        raise ValueError(f"scatter: scatter_list must be None on ranks other than src (rank {g.ranks[root]})")
    return _run(g, "scatter", arrays, sizes, dtype_name=out.dtype_name, root=root, count=out.count,
                nbytes=out.nbytes, algorithm=algorithm, async_op=async_op, after=out.finish)


def rooted_blocks(name: str, g: ProcessGroup, mine: np.ndarray, every: Optional[np.ndarray], root: int) -> None:
    """A gather (``name`` "gather") of every rank's ``mine`` into the root's
    ``every``, or a scatter of the root's ``every`` into every rank's
    ``mine``: one contiguous array of the group's blocks at group rank
    ``root`` (None elsewhere), equal blocks. What the object collectives'
    first rounds run (objects.py): unlike gather and scatter, with no list
    to copy to or from, so that a repeated call takes its lane."""
    key = (name, mine.dtype, mine.size, root)
    lane = _find_lane(g, key, mine)
    if lane is not None:  # its arrays in sorted order: "in", then "out"
        if every is None:
            lane(mine)
        elif name == "gather":
            lane(mine, every)
        else:
            lane(every, mine)
        return
    mine_is, every_is = ("in", "out") if name == "gather" else ("out", "in")
    arrays = {mine_is: mine} if every is None else {mine_is: mine, every_is: every}
    _run(g, name, arrays, {mine_is: (mine.size,), every_is: (mine.size,) * g.size}, dtype_name=_NAMES[mine.dtype],
         root=root, count=mine.size, nbytes=mine.nbytes, lane_key=key)


def reduce_scatter(output, input_list: list, op=ReduceOp.SUM, group=None, async_op: bool = False,
                   algorithm: Optional[str] = None):
    """Reduce ``input_list[r]`` across the group into rank r's ``output``.

    >>> ins = [np.array([1.]), np.array([2.])]   # the same on both ranks
    >>> out = np.zeros(1)
    >>> reduce_scatter(out, ins)
    >>> out                                      # rank 0: [2.]  rank 1: [4.]
    """
    g = _member(group, "reduce_scatter")
    out = Buffer(output, writable=True, what="reduce_scatter output")
    if not isinstance(input_list, (list, tuple)) or len(input_list) != g.size:
        raise ValueError(f"reduce_scatter: input_list must hold one tensor per rank ({g.size})")
    ins = [Buffer(t, writable=False, what=f"reduce_scatter input_list[{i}]") for i, t in enumerate(input_list)]
    dtype_name = _same_dtype([out] + ins, "reduce_scatter")
    sizes = tuple(b.count for b in ins)
    if sizes[g.rank] != out.count:
        raise ValueError(f"reduce_scatter: input_list[{g.rank}] has {sizes[g.rank]} elements but "
                         f"output has {out.count}")
    joined = np.concatenate([b.flat for b in ins])
    return _reduce_scatter(g, out, joined, sizes, op, dtype_name, algorithm, async_op)


@core.entry
def reduce_scatter_tensor(output, input, op=ReduceOp.SUM, group=None, async_op: bool = False,
                          algorithm: Optional[str] = None):
    """Reduce ``input`` across the group; rank r gets block r of the result.

    >>> x = np.array([1., 2.])          # the same on both ranks
    >>> out = np.zeros(1)
    >>> reduce_scatter_tensor(out, x)
    >>> out                             # rank 0: [2.]  rank 1: [4.]
    """
    plain = op.__class__ is ReduceOp and op.name not in ("AVG", "PREMUL_SUM")  # nothing before or after
    ran, key = _two_array_lane("reduce_scatter", group, output, input, async_op,
                               (op.code, algorithm) if plain else None)
    if ran:
        return None
    g = _member(group, "reduce_scatter_tensor")
    out = Buffer(output, writable=True, what="reduce_scatter_tensor output")
    src = Buffer(input, writable=False, what="reduce_scatter_tensor input")
    dtype_name = _same_dtype([out, src], "reduce_scatter_tensor")
    if src.count != out.count * g.size:
        raise ValueError(f"reduce_scatter_tensor: input has {src.count} elements, but group size "
                         f"{g.size} x output {out.count} = {out.count * g.size}")
    return _reduce_scatter(g, out, src.flat, (out.count,) * g.size, op, dtype_name, algorithm, async_op, key)


def _reduce_scatter(g, out: Buffer, joined: np.ndarray, sizes, op, dtype_name, algorithm, async_op,
                    lane_key=None):
    op = as_op(op)
    check_op(op, dtype_name)
    if op.name == "PREMUL_SUM":
        joined = joined.copy()
        scale(joined, op.factor, dtype_name)

    def after():
        if op.name == "AVG":
            average(out.flat, g.size, dtype_name)
        out.finish()

    # The meta word's count is the whole input, which every rank agrees on
    # (the output sizes of an uneven reduce_scatter differ by rank).
    return _run(g, "reduce_scatter", {"in": joined, "out": out.flat}, {"in": sizes, "out": (out.count,)},
                dtype_name=dtype_name, op=op, count=joined.size, nbytes=joined.nbytes, algorithm=algorithm,
                async_op=async_op, after=after, lane_key=lane_key)


def all_to_all(output_tensor_list: list, input_tensor_list: list, group=None, async_op: bool = False,
               algorithm: Optional[str] = None):
    """Rank r's ``input_tensor_list[q]`` into rank q's ``output_tensor_list[r]``.

    >>> ins = [np.array([10 * rank + q]) for q in range(2)]   # rank 0: [0], [1]  rank 1: [10], [11]
    >>> outs = [np.zeros(1, int) for _ in range(2)]
    >>> all_to_all(outs, ins)
    >>> outs                                 # rank 0: [array([0]), array([10])]  rank 1: [array([1]), array([11])]
    """
    g = _member(group, "all_to_all")
    for name, lst in (("output_tensor_list", output_tensor_list), ("input_tensor_list", input_tensor_list)):
        if not isinstance(lst, (list, tuple)) or len(lst) != g.size:
            raise ValueError(f"all_to_all: {name} must hold one tensor per rank ({g.size})")
    ins = [Buffer(t, writable=False, what=f"all_to_all input[{i}]") for i, t in enumerate(input_tensor_list)]
    outs = [Buffer(t, writable=True, what=f"all_to_all output[{i}]") for i, t in enumerate(output_tensor_list)]
    dtype_name = _same_dtype(ins + outs, "all_to_all")
    joined = np.concatenate([b.flat for b in ins])
    scratch = np.empty(sum(b.count for b in outs), dtype=outs[0].flat.dtype)
    return _run(g, "all_to_all", {"in": joined, "out": scratch},
                {"in": tuple(b.count for b in ins), "out": tuple(b.count for b in outs)},
                dtype_name=dtype_name, nbytes=0, algorithm=algorithm, async_op=async_op,
                after=lambda: _scatter_back(outs, scratch))


@core.entry
def all_to_all_single(output, input, output_split_sizes: Optional[list] = None,
                      input_split_sizes: Optional[list] = None, group=None, async_op: bool = False,
                      algorithm: Optional[str] = None):
    """Split ``input`` along dim 0 and send piece q to rank q; receive rank
    q's piece for this rank into ``output``'s q-th piece. Split sizes count
    rows of dim 0 (equal pieces when None) and may be uneven or zero.

    >>> x = np.array([2 * rank, 2 * rank + 1])   # rank 0: [0, 1]  rank 1: [2, 3]
    >>> out = np.empty(2, int)
    >>> all_to_all_single(out, x)
    >>> out                                      # rank 0: [0, 2]  rank 1: [1, 3]
    """
    even = not output_split_sizes and not input_split_sizes  # else the splits are part of the shape
    ran, key = _two_array_lane("all_to_all", group, output, input, async_op, (algorithm,) if even else None)
    if ran:
        return None
    g = _member(group, "all_to_all_single")
    src = Buffer(input, writable=False, what="all_to_all_single input")
    out = Buffer(output, writable=True, what="all_to_all_single output")
    dtype_name = _same_dtype([src, out], "all_to_all_single")
    in_sizes = _splits(src, input_split_sizes, g.size, "input")
    out_sizes = _splits(out, output_split_sizes, g.size, "output")
    # Even splits: every rank has the same size, so the tuner may use it;
    # uneven ones give each rank another, and all must choose alike.
    return _run(g, "all_to_all", {"in": src.flat, "out": out.flat}, {"in": in_sizes, "out": out_sizes},
                dtype_name=dtype_name, nbytes=src.nbytes if even else 0, algorithm=algorithm,
                async_op=async_op, after=out.finish, lane_key=key)


def _splits(buf: Buffer, split_sizes, n: int, which: str) -> tuple:
    """Block sizes in elements from torch-style split sizes (rows of dim 0)."""
    shape = buf.original.shape
    rows = shape[0] if shape else 1
    row = buf.count // rows if rows else 0
    if split_sizes is None or len(split_sizes) == 0:
        if rows % n:
            raise ValueError(f"all_to_all_single: {which} has {rows} rows, which do not split evenly "
                             f"over {n} ranks; give {which}_split_sizes")
        return (rows // n * row,) * n
    splits = [int(s) for s in split_sizes]
    if len(splits) != n or any(s < 0 for s in splits):
        raise ValueError(f"all_to_all_single: {which}_split_sizes must be {n} non-negative sizes, "
                         f"got {list(split_sizes)}")
    if sum(splits) != rows:
        raise ValueError(f"all_to_all_single: {which}_split_sizes sum to {sum(splits)} but {which} "
                         f"has {rows} rows")
    return tuple(s * row for s in splits)


_BARRIER_TOKEN = np.zeros(0, dtype=np.uint8)


def barrier(group=None, async_op: bool = False, device_ids=None, timeout=None,
            algorithm: Optional[str] = None):
    """Return only once every rank of the group has called barrier;
    ``timeout`` (a timedelta or seconds) replaces the group's for this call."""
    key = None
    if not async_op and timeout is None:
        key = ("barrier", algorithm)
        lane = _find_lane(group, key, _BARRIER_TOKEN)
        if lane is not None:
            return lane()  # its messages are empty: it takes no arrays
    g = _member(group, "barrier")
    seconds = timeout_seconds(timeout, "barrier", default=g.timeout)
    if g.size == 1:
        return CompletedWork() if async_op else None
    return _run(g, "barrier", {"out": _BARRIER_TOKEN}, {"out": (0,)}, dtype_name="uint8",
                algorithm=algorithm, async_op=async_op, timeout=seconds, lane_key=key, lane_takes=())


def monitored_barrier(group=None, timeout=None, wait_all_ranks: bool = False) -> None:
    """A barrier that says who is missing, as torch.distributed's: the
    group's first rank waits up to ``timeout`` (default: the group's) for
    every other rank, and raises CollieTimeout naming the first one that
    did not come (every one, with ``wait_all_ranks``); the others wait for
    its answer. For debugging hangs: it costs 2(n-1) messages through one rank."""
    g = _member(group, "monitored_barrier")
    seconds = timeout_seconds(timeout, "monitored_barrier", default=g.timeout)
    if g.size == 1:
        return
    _after_async_calls()
    seq = g.seq  # a collective's number and tag: no user message can match it
    g.seq += 1
    tag, net, first = g.collective_tag(seq), g.network, g.ranks[0]

    def describe() -> str:
        return f"monitored_barrier (call #{seq} on group {g.name})"

    try:
        _monitored(g, net, tag, first, seconds, wait_all_ranks, describe)
    except CollieError:
        net.finish(tag, 0, failed=True)  # late arrivals are dropped
        raise
    net.finish(tag, 0)


def _monitored(g: ProcessGroup, net, tag: int, first: int, seconds: float, wait_all_ranks: bool,
               describe) -> None:
    empty = memoryview(bytearray(0))
    if net.rank != first:
        net.wait([net.isend(first, tag, empty)], timeout=seconds, describe=describe)
        net.wait([net.irecv(first, tag, empty, meta=0)], timeout=seconds, describe=describe)
        return
    deadline = time.monotonic() + seconds
    missing = []
    for peer in g.ranks[1:]:
        try:
            net.wait([net.irecv(peer, tag, empty, meta=0)], timeout=max(0.0, deadline - time.monotonic()),
                     describe=describe)
        except CollieTimeout:
            missing.append(peer)
            if not wait_all_ranks:
                break
    if missing:
        raise CollieTimeout(f"monitored_barrier on group {g.name}: rank{'s' if len(missing) > 1 else ''} "
                            f"{', '.join(map(str, missing))} did not reach it within {seconds:g}s",
                            tuple(missing))
    net.wait([net.isend(peer, tag, empty) for peer in g.ranks[1:]], timeout=seconds, describe=describe)


def all_gather_single(output_tensor, input_tensor, group=None, async_op: bool = False,
                      algorithm: Optional[str] = None):
    """all_gather_into_tensor under torch 2.13's name for it."""
    return all_gather_into_tensor(output_tensor, input_tensor, group, async_op, algorithm)


def reduce_scatter_single(output, input, op=ReduceOp.SUM, group=None, async_op: bool = False,
                          algorithm: Optional[str] = None):
    """reduce_scatter_tensor under torch 2.13's name for it."""
    return reduce_scatter_tensor(output, input, op, group, async_op, algorithm)
