"""Which executor runs bound programs: the compiled core, or engine.execute.

The compiled core (collie._core, C in _core.c, built by ``pip install``
when a compiler is there) runs the steps of an engine.Program, the
boundary: schedules, plan/bind, the tuner and the verifier stay Python.
It moves a step's messages to shared-memory peers straight through the
rings of transports/ring.py (a fragment of a slot, 256 KiB by default, at
a time) or single copy, with the local copies and reductions, spinning on
the rings for as long as the Network would. Whatever it cannot finish (a
tcp peer, a ring whose Python end has requests in flight, a message that
is not the one expected, a peer slower than the spin) it hands back at
that point, with the messages still under way entered in the transport's
books where they stand (_core.c's adopt_inflight, adopt_partial,
adopt_sharing): engine.run_step finishes the step through
network.exchange, so waiting, sleeping on the doorbell, timeouts,
dead peers, aborts and mismatches (the meta word) are noticed and reported
exactly as under the Python executor, which stays the reference.

COLLIE_EXECUTOR=python forces engine.execute everywhere; =c makes a missing
core an error instead of a fallback. collie.config() says which one runs.
"""

from __future__ import annotations

import ctypes
import os
import sys
import time
from operator import itemgetter
from typing import Callable, Optional

from . import engine, tuner
from . import network as network_module  # the parameter named network is a Network
from .transports import ring
from .transports.ring import LINE
from .group import ProcessGroup, _World
from .transports.shm import SHARED_READ_BYTES, ShmTransport
from .wire import CONTEXT_SHIFT
from .work import CompletedWork

try:
    from . import _core
    Lane, find_lane, p2p_target, set_context = _core.Lane, _core.find_lane, _core.p2p_target, _core.set_context
    batch_fast, set_batching = _core.batch_fast, _core.set_batching
    pack_slots, unpack_slots, slots_round = _core.pack_slots, _core.unpack_slots, _core.slots_round  # objects.py's
    Entry, forget_world = _core.Entry, _core.forget_world
    _core.set_ring_ends(ring.Out, ring.In)
    _core.set_hot_slots(ProcessGroup, network_module.Network, ShmTransport, _World)
    _WHY_NOT = ""
except ImportError:  # not built: no C compiler (or Python headers) at install time
    _core = Lane = find_lane = p2p_target = set_context = pack_slots = unpack_slots = slots_round = Entry = None
    batch_fast = set_batching = None

    def forget_world() -> None:
        """(What the compiled core's entries keep of a world: there are none.)"""
    _WHY_NOT = ("the compiled core collie._core is not built (install collie where a C compiler "
                "and Python's headers are, to get it)")

_CHOICES = ("auto", "c", "python")

# The public functions with an entry in C (_core.Entry), by name.
_ENTRIES = {"all_reduce": 0, "broadcast": 1, "reduce": 2, "all_gather_into_tensor": 3, "reduce_scatter_tensor": 4,
            "all_to_all_single": 5, "send": 6, "recv": 7, "isend": 8, "irecv": 9}


def entry(function, full: Optional[Callable] = None):
    """``function`` as its public entry: a repeated call on plain NumPy
    arrays (a collective's) or a message the core's program took before (a
    point-to-point call's) goes from C to the core; every other call to
    ``function``, which it stands for (``__wrapped__``, its name and
    docstring; pickled by name). A point-to-point entry whose move the core
    tried and could not make goes on in ``full``, ``function``'s path after
    its own try of the core. Without the compiled core, ``function`` itself."""
    if Entry is None:
        return function
    from .ops import ReduceOp
    kind = _ENTRIES[function.__name__]
    if full is None:
        return Entry(kind, function, function.__name__, ReduceOp)
    return Entry(kind, function, function.__name__, ReduceOp, full, CompletedWork, CONTEXT_SHIFT)

# Reduce ops and dtypes with a compiled kernel (codes as in _core.c).
_OPS = {"SUM": 0, "AVG": 0, "PREMUL_SUM": 0, "PRODUCT": 1, "MIN": 2, "MAX": 3, "BAND": 4, "BOR": 5, "BXOR": 6}
_DTYPES = {"float32": 0, "float64": 1, "int8": 2, "int16": 3, "int32": 4, "int64": 5, "uint8": 6,
           "uint16": 7, "uint32": 8, "uint64": 9, "float16": 10, "bfloat16": 11}
_NO_KERNEL = 6  # a program that reduces nothing: the dtype code only sets the element size


def choose(environ=os.environ) -> tuple[str, str]:
    """(executor, why): "c" or "python", from COLLIE_EXECUTOR and whether the core is built."""
    wanted = environ.get("COLLIE_EXECUTOR", "auto").strip().lower() or "auto"
    if wanted not in _CHOICES:
        raise ValueError(f"COLLIE_EXECUTOR must be one of {', '.join(_CHOICES)}, not {wanted!r}")
    if wanted == "python":
        return "python", "forced by COLLIE_EXECUTOR=python"
    if _core is None:
        if wanted == "c":
            raise ImportError(f"COLLIE_EXECUTOR=c, but {_WHY_NOT}")
        return "python", _WHY_NOT
    return "c", "the compiled core (collie._core)"


# A plain receive of at least this size in a step that only receives (a
# broadcast's, a scatter's) is left to Python's executor: it offers the
# writer half of the copy (the shared copy, shm.py), so that both ranks
# copy; the core's reader does not offer, though its writer takes such
# offers (_core.c's help_copy). Smaller ones are worth more in the core
# than the half copy saves. (The transport's own bound.)
SHARED_COPY_BYTES = SHARED_READ_BYTES


def _address(buffer) -> int:
    return ctypes.addressof(ctypes.c_char.from_buffer(buffer))


def _ring(ring) -> tuple:
    """A ring.Ring as the core takes it: head, tail, headers, payload addresses, geometry."""
    base = _address(ring.mm) + ring.headers - 2 * LINE  # the ring's start (ring.py's layout)
    return (base, base + LINE, base + 2 * LINE, base - ring.headers + 2 * LINE + ring.offsets[0],
            ring.slots, ring.slot_bytes)


def compile(program: engine.Program, network) -> Optional[tuple]:  # noqa: A001 - the core's form of it
    """The core's form of ``program`` on ``network``, or None when the core
    cannot run any of it (a reduction without a compiled kernel): (core
    program, arrays_of(arrays) -> the call's arrays it uses in order,
    whether the call takes a scratch, whether the core uses it, the group
    ranks whose shared windows it uses, the names of the call's arrays it
    uses in that order). Steps it cannot run (messages of several pieces)
    are marked for Python."""
    kernel = program.reduce_kernel
    op = -1
    dtype = _NO_KERNEL
    if kernel is not None:
        op = _OPS.get(getattr(kernel, "op", None), -1)
        dtype = _DTYPES.get(getattr(kernel, "dtype_name", None), -1)
        if op < 0 or dtype < 0 or (op >= 4 and dtype in (0, 1, 10, 11)):
            return None
    itemsize = program.dtype.itemsize
    plan_ = program.plan
    schedule = plan_.schedule
    names: list = []
    need: list = []
    writes: list = []

    def buffer(name, nbytes: int, written: bool) -> int:
        if name == "win":
            name = schedule.rank
        if name not in names:
            names.append(name)
            need.append(0)
            writes.append(False)
        k = names.index(name)
        need[k] = max(need[k], nbytes)
        writes[k] = writes[k] or written
        return k

    shm = network.shm
    slots: dict = {}   # global peer -> its index in the core's peer table
    peers: list = []

    def peer(g: int) -> int:
        if g not in slots:
            slots[g] = len(peers)
            peers.append(_peer(network, g))
        return slots[g]

    def whole(buf: str) -> int:
        return plan_.counts[buf] * itemsize

    steps = []
    for index, local, recvs, sends in program.steps:
        python = False
        core_local = []
        for kind, g, pairs in local:
            for (sb, slo, shi), (db, dlo, dhi) in pairs:
                if kind == engine.COPY:  # bytes; hi None: to the buffer's end
                    shi = whole(sb) if shi is None else shi
                    dhi = whole(db) if dhi is None else dhi
                else:  # elements
                    slo, shi, dlo, dhi = slo * itemsize, shi * itemsize, dlo * itemsize, dhi * itemsize
                    if kind >= engine.READ:
                        sb = g  # a peer's window
                src = buffer(sb, shi, False)
                core_local.append((int(kind in (engine.REDUCE, engine.READ_REDUCE)), src, slo,
                                   buffer(db, dhi, True), dlo, dhi - dlo))
        messages = []
        for msgs, receiving in ((sends, False), (recvs, True)):
            core_msgs = []
            for g, buf, lo, hi, combine, staged in msgs:
                k = peer(g)
                ring = peers[k]
                if staged is not None and len(staged.pieces) == 1:
                    # A later receive of a combining group (engine.bind stages it for
                    # Python): the core combines it in place, after the earlier ones.
                    (buf, lo, hi), = staged.pieces
                    lo, hi, combine, staged = lo * itemsize, hi * itemsize, True, None
                if staged is not None:  # several pieces: gathered into one slot, or staged through Python
                    nbytes = staged.count * itemsize
                    if ring is None or _how(network, ring, nbytes, receiving) != "one slot":
                        python = True
                        continue
                    pieces = tuple((buffer(b, hi_ * itemsize, receiving), lo_ * itemsize, (hi_ - lo_) * itemsize)
                                   for b, lo_, hi_ in staged.pieces)
                    core_msgs.append((k, -1, 0, nbytes, int(staged.reduce), pieces))
                    continue
                hi = 0 if buf is None else whole(buf) if hi is None else hi
                nbytes = hi - lo
                if receiving and ring is not None and nbytes >= SHARED_COPY_BYTES and combine is None \
                        and not sends:
                    python = True  # one way and large: Python's, for the shared copy
                core_msgs.append((k, -1 if buf is None else buffer(buf, hi, receiving), lo, nbytes,
                                  int(combine is not None)))
            messages.append(core_msgs)
        steps.append((int(python), tuple(core_local), tuple(messages[0]), tuple(messages[1]),
                      int(_sends_may_go_first(core_local, messages[0], names))))
    if not network._crowded and sum(1 for step in steps if step[2] or step[3]) == 1:
        slow = single_copy_is_slow(network)
        steps = [_exchanges(step, slow) for step in steps]
    # Buffers in the order execute() hands them over: the call's arrays, then
    # the scratch, then the windows.
    order = sorted(range(len(names)), key=lambda k: (
        (0, names[k]) if isinstance(names[k], str) and names[k] != "tmp" else
        (1, "") if names[k] == "tmp" else (2, str(names[k]))))
    new = {old: k for k, old in enumerate(order)}

    def renumbered(msg: tuple) -> tuple:
        """A message with its buffer, and its pieces' buffers, in that order."""
        p, b, o, n, r, *pieces = msg
        return (p, new.get(b, -1), o, n, r, *(tuple((new[pb], po, pn) for pb, po, pn in ps) for ps in pieces))

    steps = [(python, tuple((r, new[s], so, new[d], do, n) for r, s, so, d, do, n in local),
              tuple(map(renumbered, sends)), tuple(map(renumbered, recvs)), sends_first)
             for python, local, sends, recvs, sends_first in steps]
    core = _core.Program(tuple(need[k] for k in order), tuple(writes[k] for k in order), tuple(steps),
                         tuple(peers), dtype, op, shm if shm is not None else None, network.spin_seconds,
                         network._crowded)
    names = [names[k] for k in order]
    windows = tuple(n for n in names if isinstance(n, int))
    tmp = "tmp" in names
    named = names[:len(names) - len(windows) - tmp]
    arrays_of = (itemgetter(*named) if len(named) > 1 else (lambda arrays, name=named[0]: (arrays[name],))
                 if named else (lambda arrays: ()))
    return core, arrays_of, schedule.tmp_like is not None, tmp, windows, tuple(named)


def _peer(network, g: int) -> Optional[tuple]:
    """Global rank ``g`` as the core's peer table takes it: its rings' ends
    and addresses, its doorbell, its process (single copy), the size from
    which our sends to it go single copy. None: not a shared-memory peer
    (the core hands its messages back)."""
    shm = network.shm
    if shm is None or network.routes[g] is not shm:
        return None
    out, inb = shm._out[g], shm._in[g]
    return (out, inb, _ring(out.ring), _ring(inb.ring), out.bell._addr, inb.pid, out.cma_bytes)


def _how(network, peer: tuple, nbytes: int, receiving: bool) -> str:
    """How the core moves a message of ``nbytes`` to or from ``peer`` (a
    _peer entry): "single copy", "one slot", or "slots" (several: a
    program's taken a fragment at a time, a program of one message's whole
    where it fits the ring)."""
    single_copy = network.shm.cma_bytes if receiving else peer[0].cma_bytes  # 0: never
    if nbytes >= single_copy > 0:
        return "single copy"
    return "one slot" if nbytes <= _ring_of(peer, receiving)[5] else "slots"


def _ring_of(peer: tuple, receiving: bool) -> tuple:
    """The ring a message to or from ``peer`` (a _peer entry) goes through:
    (head, tail, headers, payload, slots, slot_bytes)."""
    return peer[3] if receiving else peer[2]


def p2p_program(network, peer: int, nbytes: int, receiving: bool, spin: float):
    """A core program of one message, ``nbytes`` from buffer 0 to global
    rank ``peer`` (or into it from ``peer``), run with the call's tag and
    meta 0 as collie.p2p's messages are; receives spin at most ``spin``
    seconds (0: one look). None where the core can't move it, or where it
    is not worth it: the core takes messages that fit its ring. (A lone
    single-copy send done in C would wait in Python all the same; a batch's
    waits in C with its receives: batch_program.)"""
    entry = _peer(network, peer)
    if _core is None or entry is None:
        return None
    how = _how(network, entry, nbytes, receiving)
    ring = _ring_of(entry, receiving)
    if how != "one slot" and not (how == "slots" and nbytes <= ring[4] * ring[5]):
        return None  # (several slots: moved whole or not at all, _core.c's move_whole)
    message = ((0, 0, 0, nbytes, 0),)
    step = (0, (), () if receiving else message, message if receiving else (), 0)
    return _core.Program((nbytes,), (receiving,), (step,), (entry,), _NO_KERNEL, -1, network.shm, spin,
                         network._crowded, False, True)  # (slots only: never single copy)


EXCHANGE_SINGLE_COPY_BYTES = 64 << 10  # a plain exchange's sends go single copy from here (see _exchanges)
SLOW_EXCHANGE_RING_BYTES = 4 << 20  # where single copy is slow, through the rings below this (see _exchanges)
BATCH_SINGLE_COPY_BYTES = 64 << 10  # a batch's sends go single copy from here (see batch_program)


def single_copy_is_slow(network) -> bool:
    """Whether the kernel's single copy is slow on this world's machine
    (tuner.single_copy_is_slow of topology.Topology.single_copy, the same
    on every rank): then a batch's sends go single copy only from the
    transport's threshold, as other sends do, and a plain exchange's
    through the rings below SLOW_EXCHANGE_RING_BYTES (_exchanges). (On a
    2-core AMD EPYC VM where it took 4.2-4.6x a copy's time, a 2-rank
    sendrecv of 256 KiB-1 MiB single copy took 1.3x the Python executor's
    time, whose messages of that size go through the rings.)"""
    topology = network.topology
    return topology is not None and tuner.single_copy_is_slow(topology.single_copy)


def batch_program(network, messages: tuple):
    """A core program of one step that moves a batch_isend_irecv's
    ``messages``, ((receiving, global peer, bytes), ...), message i from or
    into buffer i, run with _core's batch() (None where the core cannot:
    a peer not on shared memory, a message that could never move whole).
    Its sends go single copy from BATCH_SINGLE_COPY_BYTES where the peer can
    read this process and single copy is not slow here (else from the
    transport's threshold, 2 MiB, as other sends; single_copy_is_slow):
    a batch waits in C for its acknowledgements along with its receives,
    where a lone isend would wait in Python. (An exchange of 1 MiB through
    the slots takes two copies on each rank, one after the other; single
    copy reads the peer's bytes once, and both ranks read at once.)"""
    if _core is None or not 0 < len(messages) <= 62:  # (the done mask is one int64)
        return None
    peers, index, sends, recvs = [], {}, [], []
    slow = single_copy_is_slow(network)
    for i, (receiving, peer, nbytes) in enumerate(messages):
        if peer not in index:
            entry = _peer(network, peer)
            if entry is None:
                return None
            index[peer] = len(peers)
            peers.append(entry)
        entry = peers[index[peer]]
        threshold = network.shm.cma_bytes if receiving else entry[6]  # the transport's, this way
        readable = 0 < threshold < ring.NEVER
        single_copy = readable and nbytes >= (threshold if slow else BATCH_SINGLE_COPY_BYTES)
        head, tail, headers, payload, slots, slot_bytes = _ring_of(entry, receiving)
        if not single_copy and nbytes > slots * slot_bytes:
            return None  # (several slots, more than the ring holds: never whole)
        (recvs if receiving else sends).append((index[peer], i, 0, nbytes, int(single_copy and not receiving)))
    step = (0, (), tuple(sends), tuple(recvs), 0)
    return _core.Program(tuple(n for _, _, n in messages), tuple(r for r, _, _ in messages), (step,),
                         tuple(peers), _NO_KERNEL, -1, network.shm, network.spin_seconds, network._crowded, True)


def glance(network, peers: list):
    """A program of no steps whose peers are ``peers``, for a lane's look at
    their rings (_core.c's nothing_stale); None unless all are on shared memory."""
    entries = tuple(_peer(network, p) for p in peers)
    if _core is None or not entries or None in entries:
        return None
    return _core.Program((), (), (), entries, _NO_KERNEL, -1, network.shm, 0.0, network._crowded)


def _exchanges(step: tuple, slow: bool = False) -> tuple:
    """``step`` (compile()'s) with the sends of EXCHANGE_SINGLE_COPY_BYTES or
    more that are half of a plain exchange marked so (a receive from the same
    peer that does not combine): they go single copy, where the peer can
    read this process. compile() marks them in a program of one step of
    messages where each rank has a core of its own. Through the ring each
    rank copies its message in and then its peer's out, one after the
    other; single copy, both ranks read at once, one copy each. (2 ranks:
    all_gather, all_to_all, reduce_scatter 1.3-1.9x faster at 128 KiB-2 MiB;
    ring all_reduce, whose plain exchange is its second step, 1.3x slower,
    and 3 ranks sharing 2 cores slower too: docs/performance.md, "Batches
    in the core".)

    Where single copy is ``slow`` (single_copy_is_slow) it is the other way
    round: those under SLOW_EXCHANGE_RING_BYTES are marked to go through
    the rings (-1), where the transport would send them single copy from
    its 2 MiB (an AMD EPYC VM, 2 ranks, messages of 2 MiB: all_gather,
    all_to_all and reduce_scatter of 4 MiB in 0.73, 0.69 and 0.81 of the
    time; 4 MiB messages level)."""
    python, local, sends, recvs, sends_first = step
    partners = {m[0] for m in recvs if len(m) == 5 and not m[4]}

    def mark(nbytes: int) -> int:
        """The send's single-copy flag (0: the transport's own rule)."""
        if slow:
            return -1 if nbytes < SLOW_EXCHANGE_RING_BYTES else 0
        return 1 if nbytes >= EXCHANGE_SINGLE_COPY_BYTES else 0

    marked = []
    for m in sends:
        flag = mark(m[3]) if len(m) == 5 and m[0] in partners else 0
        marked.append(m[:4] + (flag,) if flag else m)
    return python, local, tuple(marked), recvs, sends_first


def _sends_may_go_first(local: list, sends: list, names: list) -> bool:
    """Whether a step's sends may be posted before its local operations
    (then a peer reads our message, single copy: from our memory, while we
    copy, not after): none reads what those write, none is an empty message
    (a signal, which may announce those writes), and no local writes a
    shared window (which peers read on such a signal)."""
    if not local or any(isinstance(names[d], int) for _, _, _, d, _, _ in local):
        return False
    return not any(b < 0 or (d == b and do < o + n and o < do + dn)
                   for _, _, _, d, do, dn in local for _, b, o, n, *_ in sends)


def spin_briefly_on_this_thread() -> None:
    """This thread runs asynchronous calls beside its process's own work:
    its waits poll at most network.ASYNC_SPIN_SECONDS, in the Network's
    loop and on the core alike."""
    network_module.spin_briefly_on_this_thread()
    if _core is not None:
        _core.set_thread_spin(network_module.ASYNC_SPIN_SECONDS)


def runs(program: engine.Program, network) -> bool:
    """Whether execute() runs ``program`` on the core (else engine.execute does)."""
    return EXECUTE is execute and _compiled(program, network) is not None


def _compiled(program: engine.Program, network) -> Optional[tuple]:
    """compile()'s form of ``program`` on ``network``, made on first use."""
    compiled = program.core
    if not compiled or compiled[0] is not network:
        compiled[:] = [network, compile(program, network)]
    return compiled[1]


def _buffers(program: engine.Program, compiled: tuple, arrays: dict, network, spare) -> tuple:
    """What a run of the core takes, in compile()'s order: the call's arrays,
    the scratch (where the core uses it), the peers' windows as they are now."""
    _, named, _, tmp, windows, _ = compiled
    bufs = named(arrays)
    if tmp:
        bufs += (spare[1],)
    if windows:
        bufs += tuple(network.window(program.peers[g]) for g in windows)
    return bufs


def execute(program: engine.Program, arrays: dict, network, tag: int, meta: int,
            describe: Callable[[int], str], timeout: float, times=None) -> None:
    """engine.execute's contract, run by the compiled core where it can.
    ``times`` (a float64 array of 2 x len(program.steps), for a trace, and
    only where runs() says the core runs the program): each step's start
    and end, as time.time(), whichever executor ran the step."""
    compiled = _compiled(program, network)
    if compiled is None:
        return engine.execute(program, arrays, network, tag, meta, describe, timeout)
    core = compiled[0]
    spare = engine.take_spare(program) if compiled[2] else None
    bufs = _buffers(program, compiled, arrays, network, spare)
    if times is not None:
        times[0] = time.time()  # the core's clock replaces it if the core starts the step
    if network._abort is None and not network._lost:
        with network.lock:
            step, locals_done, done, inflight = core.run(bufs, 0, tag, meta, times)
    else:  # something broke: Python's checks, step by step
        step, locals_done, done, inflight = 0, 0, 0, ()
    if step < len(program.steps):
        _finish(program, core, bufs, arrays, network, tag, meta, describe, timeout, spare, step, locals_done, done,
                inflight, times)
    if spare is not None:
        engine.give_spare(program, spare)


def lane(program: engine.Program, network):
    """(core program, names, extra, spare) for a program the core runs on
    ``network``, else None: a lane (collectives._lane) hands the core the
    call's arrays in the order of ``names``, then ``extra``: the buffers
    after them (the scratch, where the core uses one), a tuple, or for a
    program that reads peers' shared windows a function giving them as they
    are now. ``spare`` is a scratch of the lane's own (None if the schedule
    needs none)."""
    compiled = _compiled(program, network)
    if compiled is None:
        return None
    core, _, needs_spare, tmp, windows, names = compiled
    spare = engine.take_spare(program) if needs_spare else None
    scratch = (spare[1],) if tmp else ()
    if not windows:
        return core, names, scratch, spare
    peers = tuple(program.peers[g] for g in windows)
    return core, names, lambda: scratch + tuple(network.window(p) for p in peers), spare


def resume(program: engine.Program, arrays: dict, network, tag: int, meta: int,
           describe: Callable[[int], str], timeout: float, spare, step: int, locals_done: int,
           done: int, inflight=()) -> None:
    """The rest of a lane's call, from where the core stopped (``step``;
    0, 0, 0: from the start, step by step in Python)."""
    if step < len(program.steps):
        compiled = program.core[1]
        _finish(program, compiled[0], _buffers(program, compiled, arrays, network, spare), arrays, network,
                tag, meta, describe, timeout, spare, step, locals_done, done, inflight)


def _finish(program, core, bufs, arrays, network, tag, meta, describe, timeout, spare,
            step: int, locals_done: int, done: int, inflight=(), times=None) -> None:
    """The rest of a call the core handed back at ``step``: Python finishes
    that step (``inflight``: the requests of its sends the core posted but
    saw no end of), the core runs on from the next, until the last."""
    steps = program.steps
    state = engine.call_state(program, arrays, network, spare)
    while True:
        engine.run_step(program, steps[step], state, network, tag, meta, describe, timeout, locals_done, done,
                        inflight)
        start = step + 1
        if times is not None:  # this step's end, and the next one's start (the core restamps it)
            now = time.time()
            times[2 * step + 1] = now
            if start < len(steps):
                times[2 * start] = now
        if start == len(steps):
            return
        if network._abort is None and not network._lost:
            with network.lock:
                step, locals_done, done, inflight = core.run(bufs, start, tag, meta, times)
            if step == len(steps):
                return
        else:  # something broke: Python's checks, step by step
            step, locals_done, done, inflight = start, 0, 0, ()


def select(environ=os.environ) -> None:
    """Pick the executor from ``environ`` (at import, and again in a process
    forked from one that had already imported collie, with another setting)."""
    global EXECUTOR, WHY, EXECUTE
    EXECUTOR, WHY = choose(environ)
    EXECUTE = execute if EXECUTOR == "c" else engine.execute
    if _core is not None:
        _core.set_executor(EXECUTOR == "c")  # for the point-to-point entries
    if environ.get("COLLIE_DEBUG", "").upper() in ("INFO", "TRACE"):
        print(f"collie INFO executor: {EXECUTOR} ({WHY})", file=sys.stderr, flush=True)


EXECUTOR = WHY = EXECUTE = None
select()


def config() -> dict:
    """What runs this process's collectives: {"executor": "c" or "python", "why": ...}."""
    return {"executor": EXECUTOR, "why": WHY}
