"""The two executors of bound programs (collie.core): the compiled core and
engine.execute, the reference.

- The core's combine kernels give NumPy's (and ops.py's bfloat16) results
  bit for bit, NaNs, infinities, signed zeros and subnormals included.
- Random programs of collectives on random floats (where the order of the
  reduction shows in the last bits) give the same bytes under both
  executors, call by call: on one host, with small rings (most messages
  then go back to Python mid-call), and across two fake hosts (tcp peers
  mixed with shm peers in one program). Every algorithm they use is proven
  by the verifier first.
- The extension is optional: setup.py with no working compiler still
  succeeds, and without the extension collie runs the Python executor.
"""

import hashlib
import os
import subprocess
import sys

import numpy as np
import pytest

from harness import SMALL_SHM, run_ranks

from collie import core, ops, verify
from collie.algorithms import algorithms_for

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
needs_core = pytest.mark.skipif(core._core is None, reason=core._WHY_NOT)


def _special(dtype) -> np.ndarray:
    """Values where kernels differ if they differ at all."""
    if dtype == "bfloat16":
        return np.array([0, 0x8000, 0x7fc0, 0xffc0, 0x7f80, 0xff80, 0x0001, 0x3f80, 0xbf80, 0x7f7f], np.uint16)
    info = np.finfo(dtype)
    return np.array([0.0, -0.0, np.nan, -np.nan, np.inf, -np.inf, info.tiny / 4, -info.tiny, 1.0, info.max],
                    dtype)


@needs_core
@pytest.mark.parametrize("dtype", sorted(core._DTYPES))
def test_kernels_match_numpy_bit_for_bit(dtype):
    rng = np.random.default_rng(7)
    for name in ("SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR"):
        floating = dtype in ("float16", "float32", "float64", "bfloat16")
        if floating and name.startswith("B"):
            continue
        if dtype == "bfloat16":
            a = rng.integers(0, 1 << 16, 3000).astype(np.uint16)
            b = rng.integers(0, 1 << 16, 3000).astype(np.uint16)
        elif floating:
            with np.errstate(over="ignore"):  # float16 overflows to infinity: wanted
                a = (rng.standard_normal(3000) * 10.0 ** rng.integers(-8, 8, 3000)).astype(dtype)
                b = (rng.standard_normal(3000) * 10.0 ** rng.integers(-8, 8, 3000)).astype(dtype)
        else:
            info = np.iinfo(dtype)
            a = rng.integers(info.min, info.max, 3000, dtype=dtype, endpoint=True)
            b = rng.integers(info.min, info.max, 3000, dtype=dtype, endpoint=True)
        if floating:  # every pair of special values, too
            s = _special(dtype)
            a = np.concatenate([a, np.repeat(s, len(s))])
            b = np.concatenate([b, np.tile(s, len(s))])
        expected = a.copy()
        with np.errstate(all="ignore"):
            ops.kernel(getattr(ops.ReduceOp, name), dtype)(expected, b)
        got = a.copy()
        core._core.combine(got, b, core._DTYPES[dtype], core._OPS[name])
        assert got.tobytes() == expected.tobytes(), (dtype, name)


COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "all_to_all")
DTYPES = ("float32", "float64", "float16", "int32", "int64")
COUNTS = (0, 1, 7, 100, 1000, 20000, 70000)  # elements per rank; the last ones need several ring slots


def _calls(seed: int, size: int, ncalls: int, one_host: bool = True) -> list:
    """The program: (collective, algorithm or None, dtype, op, count, root) per call
    (the shm algorithms, which need every rank on one host, only ``one_host``)."""
    rng = np.random.default_rng(seed)
    calls = []
    for _ in range(ncalls):
        name = COLLECTIVES[rng.integers(len(COLLECTIVES))]
        dtype = DTYPES[rng.integers(len(DTYPES))]
        floating = dtype.startswith("float")
        opnames = ["SUM", "PRODUCT", "MIN", "MAX"] + ([] if floating else ["BAND", "BOR", "BXOR"])
        op = opnames[rng.integers(len(opnames))]
        choices = [a for a in algorithms_for(name) if one_host or a != "shm"]
        algorithm = choices[rng.integers(len(choices))] if rng.random() < 0.6 else None
        calls.append((name, algorithm, dtype, op, int(COUNTS[rng.integers(len(COUNTS))]),
                       int(rng.integers(size))))
    return calls


def _cross_body(rank, size, seed, calls, hosts):
    """Run the program on random data; the SHA-256 of every call's output."""
    import collie
    if hosts is not None:
        os.environ["COLLIE_HOST_ID"] = f"host{hosts[rank]}"
    collie.core.select()
    collie.init_process_group()
    try:
        digests = []
        for k, (name, algorithm, dtype, opname, count, root) in enumerate(calls):
            rng = np.random.default_rng([seed, k, rank])
            if dtype.startswith("float"):
                x = (rng.standard_normal(count * size) * 1000).astype(dtype)
            else:
                x = rng.integers(-(1 << 20), 1 << 20, count * size).astype(dtype)
            op = getattr(collie.ReduceOp, opname)
            with np.errstate(all="ignore"):
                if name == "all_reduce":
                    out = x
                    collie.all_reduce(out, op=op, algorithm=algorithm)
                elif name == "reduce_scatter":
                    out = np.empty(count, dtype)
                    collie.reduce_scatter_tensor(out, x, op=op, algorithm=algorithm)
                elif name == "all_gather":
                    out = np.empty(count * size, dtype)
                    collie.all_gather_into_tensor(out, x[:count], algorithm=algorithm)
                elif name == "broadcast":
                    out = x
                    collie.broadcast(out, src=root, algorithm=algorithm)
                elif name == "reduce":
                    out = x
                    collie.reduce(out, dst=root, op=op, algorithm=algorithm)
                else:
                    out = np.empty(count * size, dtype)
                    collie.all_to_all_single(out, x, algorithm=algorithm)
            digests.append(hashlib.sha256(out.tobytes()).hexdigest())
        return collie.config()["executor"], digests
    finally:
        collie.destroy_process_group()


@needs_core
@pytest.mark.timeout(300)
@pytest.mark.parametrize("size,seed,env,hosts", [
    (2, 21, {}, None),
    (3, 22, SMALL_SHM, None),
    (4, 23, {}, (0, 0, 1, 1)),
], ids=["shm-2", "shm-3-small-rings", "two-hosts-4"])
def test_random_programs_give_the_same_bytes_under_both_executors(size, seed, env, hosts):
    calls = _calls(seed, size, 60, one_host=hosts is None)
    for name, algorithm, *_ in calls:  # a fast path is still a proven schedule
        if algorithm is not None:
            verify.verify(name, algorithm, size)
    results = {}
    for executor in ("c", "python"):
        got = run_ranks(_cross_body, size, seed, calls, hosts, init=False, timeout=240,
                        env=dict(env, COLLIE_EXECUTOR=executor))
        assert {e for e, _ in got} == {executor}
        results[executor] = [digests for _, digests in got]
    for rank in range(size):
        for k, (c, p) in enumerate(zip(results["c"][rank], results["python"][rank])):
            assert c == p, f"rank {rank}, call {k} {calls[k]}: the executors' results differ"


PIECES = (("all_gather", "recursive_doubling"), ("all_gather", "bruck"), ("reduce_scatter", "rabenseifner"),
          ("all_to_all", "bruck"))  # on 5 and 6 ranks, messages of several pieces of the arrays
PIECE_COUNTS = (1, 7, 300)


def _mine(rank, size, count, dtype):
    return (np.arange(count * size) * (rank + 1) + rank).astype(dtype)


def _pieces_body(rank, size):
    import collie
    from collie import group
    outs = []
    for name, algorithm in PIECES:
        for dtype in ("float32", "int64"):
            for count in PIECE_COUNTS:
                x = _mine(rank, size, count, dtype)
                if name == "all_gather":
                    out = np.empty(count * size, dtype)
                    collie.all_gather_into_tensor(out, x[:count], algorithm=algorithm)
                elif name == "reduce_scatter":
                    out = np.empty(count, dtype)
                    collie.reduce_scatter_tensor(out, x, algorithm=algorithm)
                else:
                    out = np.empty(count * size, dtype)
                    collie.all_to_all_single(out, x, algorithm=algorithm)
                outs.append(out)
    g = group.resolve(None)
    handed = {}  # (collective, algorithm) -> the steps of its programs left to Python
    for p in g.prepared.values():
        schedule = p.program.plan.schedule
        if (schedule.collective, schedule.algorithm) in PIECES:
            handed.setdefault((schedule.collective, schedule.algorithm), []).extend(
                core._compiled(p.program, g.network)[0].python_steps())
    return outs, handed


@needs_core
@pytest.mark.timeout(180)
@pytest.mark.parametrize("size", [5, 6])
def test_messages_of_several_pieces_run_in_the_core(size):
    """A message that gathers several pieces of the arrays (recursive
    doubling and Rabenseifner on ranks that fold, Bruck's blocks) travels in
    one ring slot from C, gathered on the way in and scattered (or
    combined) on the way out: no step of those programs is left to Python,
    and the results are NumPy's."""
    results = run_ranks(_pieces_body, size, timeout=150)
    for rank, (outs, handed) in enumerate(results):
        assert handed == {piece: [] for piece in PIECES}
        got = iter(outs)
        for name, _ in PIECES:
            for dtype in ("float32", "int64"):
                for count in PIECE_COUNTS:
                    xs = [_mine(r, size, count, dtype) for r in range(size)]
                    if name == "all_gather":
                        want = np.concatenate([x[:count] for x in xs])
                    elif name == "reduce_scatter":
                        want = sum(x[rank * count:(rank + 1) * count] for x in xs).astype(dtype)
                    else:
                        want = np.concatenate([x[rank * count:(rank + 1) * count] for x in xs])
                    np.testing.assert_array_equal(next(got), want, err_msg=f"{name} {dtype} {count}")


SINGLE_COPY_1MIB = {"COLLIE_SHM_CMA_BYTES": str(1 << 20)}  # the default is 2 MiB with a core per rank


def _single_copy_body(rank, size, spoil_pid):
    """A 1 MiB broadcast from rank 0, which posts it 50 ms before rank 1
    looks: rank 1's core finds it waiting and reads it; rank 0's core spins
    for its acknowledgement, gives up, and hands the send over to Python.
    Returns how often each side's Python took part."""
    import time

    import collie
    from collie.transports.shm import ShmTransport
    counts = {"python read": 0, "adopted": 0}
    read, adopt = ShmTransport._read_single_copy, ShmTransport.adopt_rendezvous

    def counted_read(*args):
        counts["python read"] += 1
        return read(*args)

    def counted_adopt(*args):
        counts["adopted"] += 1
        return adopt(*args)

    ShmTransport._read_single_copy, ShmTransport.adopt_rendezvous = counted_read, counted_adopt
    try:
        shm = collie.group.resolve(None).network.shm
        if spoil_pid and rank == 1:  # the core then cannot read rank 0's memory
            child = os.fork()
            if child == 0:
                os._exit(0)
            os.waitpid(child, 0)
            shm._in[0].pid = child
        x = np.arange(1 << 18, dtype=np.float32) * 3 if rank == 0 else np.zeros(1 << 18, np.float32)
        if rank == 1:
            time.sleep(0.05)
        try:
            collie.broadcast(x, src=0, algorithm="direct")
        except collie.CollieError as exc:
            return type(exc).__name__, str(exc), counts
        assert np.array_equal(x, np.arange(1 << 18, dtype=np.float32) * 3)
        return counts
    finally:
        ShmTransport._read_single_copy, ShmTransport.adopt_rendezvous = read, adopt


@needs_core
@pytest.mark.timeout(120)
def test_the_core_reads_single_copy_messages_and_hands_over_unacknowledged_sends():
    sender, receiver = run_ranks(_single_copy_body, 2, False, timeout=90, env=SINGLE_COPY_1MIB)
    assert receiver == {"python read": 0, "adopted": 0}, receiver  # all in the core
    assert sender == {"python read": 0, "adopted": 1}, sender


@needs_core
@pytest.mark.timeout(120)
def test_a_single_copy_read_that_fails_fails_both_ends():
    """The receiver's core cannot read (its peer's pid is wrong): Python reads
    again, fails, and tells the writer, whose send fails with why."""
    sender, receiver = run_ranks(_single_copy_body, 2, True, timeout=90, expect_errors=True, env=SINGLE_COPY_1MIB)
    assert receiver[0] == "PeerError" and "rank 0 died" in receiver[1], receiver
    assert receiver[2]["python read"] == 1, receiver
    # The writer hears of it from the failed acknowledgement, or first from
    # the receiver's report of the death it saw: an error either way.
    assert (sender[0] == "CollieError" and "rank 1 could not read this 1048576-byte message" in sender[1]
            or sender[0] == "PeerError" and "rank 1 reported" in sender[1] and "rank 0 died" in sender[1]), sender


def _count_calls(cls, name: str, counts: dict, key: str) -> None:
    """Count the calls of ``cls.name`` in ``counts[key]`` (in a rank's process)."""
    original = getattr(cls, name)

    def counted(self, *args):
        counts[key] += 1
        return original(self, *args)

    setattr(cls, name, counted)


def _shared_copy_body(rank, size):
    """Broadcasts of 4 MiB from rank 0: its core sends them (single copy)
    while rank 1's Python reads them, offering rank 0 half of each copy.
    Returns how many offers the writer took, how many offers there were,
    whether the data came, and how many the writer's Python took."""
    import time

    import collie
    from collie.transports.shm import ShmTransport
    taken = []
    read_shared = ShmTransport._read_shared

    def recorded(self, *args):
        taken.append(read_shared(self, *args))
        return taken[-1]

    ShmTransport._read_shared = recorded
    right = True
    for k in range(10):
        x = np.arange(1 << 20, dtype=np.float32) + k if rank == 0 else np.zeros(1 << 20, np.float32)
        if rank == 0:
            time.sleep(0.002)  # rank 1 waits for the message, and offers as soon as it comes
        collie.broadcast(x, 0, algorithm="direct")
        right &= bool(np.array_equal(x, np.arange(1 << 20, dtype=np.float32) + k))
    return sum(taken), len(taken), right, collie.group.resolve(None).network.shm.shared_copies


@needs_core
@pytest.mark.timeout(120)
def test_the_cores_writer_takes_a_python_readers_offer_of_a_shared_copy():
    """A step that only sends a large message stays in the core, whose
    writer takes the reader's offer of half the copy as shm.py's _help
    would (_core.c's help_copy); before, such a step went to Python for
    that. (Where the offer comes after the writer's core spun out, its
    Python takes it.)"""
    writer, reader = run_ranks(_shared_copy_body, 2, env={"COLLIE_EXECUTOR": "c"})
    took, offers, right, _ = reader
    assert right and offers == 10 and took >= 5, reader
    assert took - writer[3] >= took // 2, (writer, reader)  # the writer's core took most, its Python the rest


# Whether rank 0's core waits for nothing (spin 0) and so hands messages under way to Python.
HAND_BACK = pytest.mark.parametrize("hand_back", [False, True], ids=["in the core", "handed to python"])
SEVERAL_SLOTS = {"COLLIE_SHM_SLOT_BYTES": "4096", "COLLIE_SHM_SLOTS": "2", "COLLIE_SHM_CMA_BYTES": "0"}


def _several_slots_body(rank, size, hand_back):
    """Collectives whose messages take 2 to 60 slots of 4 KiB in rings of
    two: each writer waits for room between fragments, each reader for the
    next fragment. With ``hand_back`` rank 0's core waits for nothing (its
    spin is 0), so it hands messages it has half written or half taken to
    Python again and again. Returns the cases that went wrong and how
    often each side's books adopted a message where it stood."""
    import collie
    from collie.transports.shm import ShmTransport
    counts = {"send": 0, "recv": 0, "wrong": []}
    _count_calls(ShmTransport, "adopt_partial_send", counts, "send")
    _count_calls(ShmTransport, "adopt_partial_recv", counts, "recv")
    collie.init_process_group()
    try:
        if hand_back and rank == 0:
            core._core.set_thread_spin(0.0)
        rng = np.random.default_rng(5)
        for k in range(12):
            dtype = ("float64", "int32", "float32")[k % 3]
            count = int(rng.integers(2 * 4096, 60 * 4096) // np.dtype(dtype).itemsize) + k  # not whole slots
            xs = [np.arange(count, dtype=dtype) * (r + 1) + k for r in range(size)]
            x = xs[rank].copy()
            collie.all_reduce(x, op=collie.ReduceOp.MAX if k % 4 == 3 else collie.ReduceOp.SUM,
                              algorithm=("ring", "direct", "dbtree", "rabenseifner")[k % 4])
            want = np.maximum.reduce(xs) if k % 4 == 3 else sum(xs[1:], xs[0].copy())
            if not np.array_equal(x, want):
                counts["wrong"].append(("all_reduce", k))
            y = xs[rank].copy()
            collie.broadcast(y, src=k % size, algorithm=("direct", "dbtree")[k % 2])
            if not np.array_equal(y, xs[k % size]):
                counts["wrong"].append(("broadcast", k))
            out = np.empty(count * size, dtype)
            collie.all_gather_into_tensor(out, xs[rank])
            if not np.array_equal(out, np.concatenate(xs)):
                counts["wrong"].append(("all_gather", k))
        return counts
    finally:
        collie.destroy_process_group()


@needs_core
@pytest.mark.timeout(180)
@HAND_BACK
def test_messages_of_several_slots_run_in_the_core(hand_back):
    """The core writes a message of several slots as the ring makes room
    and takes it a fragment at a time (in order, combining as it goes);
    where it hands back mid-message, the transport's books take the message
    over where it stands (adopt_partial_send, adopt_partial_recv). The
    results are NumPy's on 2 and 3 ranks either way."""
    for size in (2, 3):
        counts = run_ranks(_several_slots_body, size, hand_back, init=False, timeout=150,
                           env=dict(SEVERAL_SLOTS, COLLIE_EXECUTOR="c"))
        assert all(c["wrong"] == [] for c in counts), counts
        if hand_back:
            assert counts[0]["send"] > 0 and counts[0]["recv"] > 0, counts


SHARED_CASES = [(dtype, op) for dtype in ("float32", "float64", "float16", "int64", "uint8")
                for op in ("SUM", "MIN", "MAX", "PRODUCT", "BXOR")
                if (op == "BXOR") == (dtype in ("int64", "uint8")) or op == "SUM"]


def _values(dtype, count, seed):
    """Random values of ``dtype`` with every special float value among them."""
    rng = np.random.default_rng(seed)
    if dtype.startswith("float"):
        x = (rng.standard_normal(count) * 4).astype(dtype)
    else:
        x = rng.integers(0, 200, count).astype(dtype)
    if dtype.startswith("float"):
        special = _special(dtype)
        x[rng.integers(0, count, 50 * len(special))] = np.tile(special, 50)
    return x


def _sharing_body(rank, size, hand_back):
    """Reduces to rank 0 of messages that go single copy, for every case;
    with ``hand_back`` the root waits for nothing in the core (its spin is
    0), so it hands its wait for the writer's chunks to Python."""
    import time

    import collie
    from collie.transports.shm import ShmTransport
    counts = {"adopted": 0, "wrong": []}
    _count_calls(ShmTransport, "adopt_sharing", counts, "adopted")
    collie.init_process_group()
    try:
        if hand_back and rank == 0:
            core._core.set_thread_spin(0.0)
        for k, (dtype, op) in enumerate(SHARED_CASES * 2):
            count = (1 << 20) // 2 + 7 * k  # 9-17 chunks of 64 KiB; the last one short
            mine = _values(dtype, count, 100 * k + rank)
            x = mine.copy()
            if rank == 0:
                time.sleep(0.0005)  # the writer is waiting (in its core) when the offer goes up
            collie.reduce(x, 0, op=getattr(collie.ReduceOp, op), algorithm="direct")
            want = mine
            if rank == 0:
                want = mine.copy()
                with np.errstate(all="ignore"):
                    ops.kernel(getattr(ops.ReduceOp, op), dtype)(want, _values(dtype, count, 100 * k + 1))
            if x.tobytes() != want.tobytes():
                counts["wrong"].append((dtype, op))
        counts["chunks"] = core._core.shared_chunks()
        return counts
    finally:
        collie.destroy_process_group()


@needs_core
@pytest.mark.timeout(180)
@HAND_BACK
def test_a_combining_single_copy_read_is_shared_with_its_writer(hand_back):
    """The root of a 2-rank reduce offers the writer chunks of each large
    combining read (_core.c's read_shared), which the writer takes in its
    core or, asleep there, in Python (shm.py's _help): the results are
    NumPy's bit for bit (the root's value first, NaNs and signed zeros
    included), whether the root waits for the writer's last chunks in the
    core or hands that wait to Python (adopt_sharing)."""
    root, writer = run_ranks(_sharing_body, 2, hand_back, init=False, timeout=150,
                             env={"COLLIE_EXECUTOR": "c", "COLLIE_SHM_CMA_BYTES": str(256 << 10)})
    assert root["wrong"] == [] and writer["wrong"] == [], (root, writer)
    assert writer["chunks"] > 0 and root["chunks"] == 0, (root, writer)  # the writer did its share
    if hand_back:
        assert root["adopted"] > 0, root


def _halves_body(rank, size, calls):
    import time

    import collie
    collie.core.select()
    collie.init_process_group()
    try:
        wrong = 0
        for k in range(calls):
            x = np.arange(326, dtype=np.int32) + 1000 * k if rank == 0 else np.zeros(326, np.int32)
            if rank == 0:
                time.sleep(0.0002)  # the receiver is already polling for both halves (in the core: < its spin)
            collie.broadcast(x, src=0, algorithm="dbtree")
            wrong += not np.array_equal(x, np.arange(326, dtype=np.int32) + 1000 * k)
        return wrong
    finally:
        collie.destroy_process_group()


@pytest.mark.timeout(120)
def test_two_messages_of_one_size_from_one_peer_land_in_order(executor):
    # dbtree's broadcast on 2 ranks: one step receives both halves (same tag,
    # meta word and size) from the root. The core once let the second
    # receive take the first half when it arrived between the two looks.
    assert run_ranks(_halves_body, 2, 1000, init=False, env={"COLLIE_EXECUTOR": executor}) == [0, 0]


def test_setup_succeeds_without_a_compiler(tmp_path):
    """The extension is optional: a compiler that fails leaves a warning, not a failed install."""
    env = dict(os.environ, CC="false", LDSHARED="false")
    done = subprocess.run([sys.executable, "setup.py", "build_ext", "--build-lib", str(tmp_path / "lib"),
                           "--build-temp", str(tmp_path / "tmp")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert 'building extension "collie._core" failed' in done.stdout + done.stderr
    assert not list(tmp_path.rglob("_core*.so"))


def _python(code: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], env=dict(os.environ, **env), capture_output=True,
                          text=True, timeout=60)


def test_the_executor_in_use_is_reported_and_can_be_forced():
    show = "import collie; print(collie.config()['executor'])"
    forced = _python(show, COLLIE_EXECUTOR="python", COLLIE_DEBUG="INFO")
    assert forced.stdout.strip() == "python"
    assert "collie INFO executor: python (forced by COLLIE_EXECUTOR=python)" in forced.stderr
    # Without the extension (as where it could not build): the Python executor, and why.
    missing = "import sys; sys.modules['collie._core'] = None; " + show
    assert _python(missing).stdout.strip() == "python"
    refused = _python(missing, COLLIE_EXECUTOR="c")
    assert refused.returncode != 0 and "collie._core is not built" in refused.stderr
    bad = _python(show, COLLIE_EXECUTOR="fast")
    assert bad.returncode != 0 and "COLLIE_EXECUTOR must be one of auto, c, python" in bad.stderr
    if core._core is not None:
        assert _python(show, COLLIE_EXECUTOR="auto").stdout.strip() == "c"


def _without_core_body(rank, size):
    import collie
    collie.core._core = None  # as if it had not built
    collie.core.select()
    collie.init_process_group()
    try:
        x = np.full(5, rank + 1.0)
        collie.all_reduce(x)
        return collie.config()["executor"], x
    finally:
        collie.destroy_process_group()


def test_collectives_run_without_the_extension():
    results = run_ranks(_without_core_body, 2, init=False, env={"COLLIE_EXECUTOR": "auto"})
    for executor, x in results:
        assert executor == "python" and (x == 3.0).all()


def test_the_thread_of_asynchronous_calls_polls_briefly():
    """The background thread of async calls (DDP's buckets) waits beside its
    process's compute: its waits poll at most network.ASYNC_SPIN_SECONDS,
    in the Network's loop and on the core; other threads keep theirs."""
    import queue as queue_module

    from collie import collectives, network

    def bounds():
        python = getattr(network._this_thread, "spin", None)
        if core._core is None:
            return python, None
        before = core._core.set_thread_spin(-1.0)
        core._core.set_thread_spin(before)  # put back
        return python, before

    got = queue_module.SimpleQueue()
    background = collectives.Background("test-async")
    try:
        background.submit(bounds, lambda result, error: got.put((result, error)))
        result, error = got.get(timeout=10)
    finally:
        background.stop()
    assert error is None
    assert result == (network.ASYNC_SPIN_SECONDS, network.ASYNC_SPIN_SECONDS if core._core is not None else None)
    assert bounds() == (None, -1.0 if core._core is not None else None)  # this thread: untouched


@needs_core
def test_the_networks_lock_behaves_as_threading_rlock():
    """_core.RLock, the Network's lock where the core is built: re-entrant,
    owned by one thread, with acquire's blocking and timeout, and it lets
    a waiting thread go on the moment it is free."""
    import threading
    import time

    from collie._core import RLock
    from collie.network import RLock as used
    assert used is RLock
    lock = RLock()
    assert lock.acquire() and lock.acquire(blocking=False) and lock._is_owned()
    with lock:
        pass
    seen = {}

    def other():
        seen["try"] = lock.acquire(blocking=False)
        t = time.monotonic()
        seen["timeout"] = lock.acquire(timeout=0.05)
        seen["waited"] = time.monotonic() - t
        seen["owned"] = lock._is_owned()
        seen["then"] = lock.acquire()  # blocks until the main thread lets go
        lock.release()

    thread = threading.Thread(target=other)
    thread.start()
    time.sleep(0.2)
    lock.release()
    assert lock._is_owned()  # acquired twice, released once
    lock.release()
    thread.join(5)
    assert not thread.is_alive()
    assert (seen["try"], seen["timeout"], seen["owned"], seen["then"]) == (False, False, False, True)
    assert seen["waited"] >= 0.04
    with pytest.raises(RuntimeError):
        lock.release()
    with pytest.raises(ValueError):
        lock.acquire(blocking=False, timeout=1)
    assert lock.acquire(timeout=0) and not lock.release()


def _exchange_body(rank, size, nbytes):
    """How many single-copy sends (rendezvous ids) each call posted to the
    peer, and whether its result is NumPy's: 2 ranks, inputs of ``nbytes``
    (all_gather's message is the input, all_to_all's and ring's halves)."""
    import collie
    from collie.group import resolve
    out = resolve(None).network.shm._out[1 - rank]
    count = nbytes // 4
    xs = [np.arange(count, dtype=np.float32) * (r + 1) for r in range(size)]
    posted = {}
    for name, call, want in (
            ("all_gather", lambda: collie.all_gather_into_tensor(np.empty(count * size, np.float32), xs[rank]),
             None),
            ("all_to_all", lambda: collie.all_to_all_single(got := np.empty(count, np.float32), xs[rank],
                                                             algorithm="pairwise") or got,
             np.concatenate([x[rank * count // 2:(rank + 1) * count // 2] for x in xs])),
            ("ring all_reduce", lambda: collie.all_reduce(y := xs[rank].copy(), algorithm="ring") or y,
             xs[0] + xs[1])):
        before = out.next_id
        result = call()
        posted[name] = (out.next_id - before, want is None or bool(np.array_equal(result, want)))
    return posted


@needs_core
@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="two ranks would share one core: no exchange goes single copy")
@pytest.mark.parametrize("nbytes,env,single_copies", [
    (512 << 10, {"COLLIE_TOPOLOGY": "single_copy=1.5"}, (1, 1)),
    (512 << 10, {"COLLIE_SHM_CMA_BYTES": "0"}, (0, 0)),           # single copy off
    (512 << 10, {"COLLIE_TOPOLOGY": "single_copy=4"}, (0, 0)),     # slow (tuner.SLOW_SINGLE_COPY): the rings
    (4 << 20, {"COLLIE_TOPOLOGY": "single_copy=4"}, (1, 0)),       # slow: single copy from 4 MiB only
    (4 << 20, {"COLLIE_TOPOLOGY": "single_copy=1.5"}, (1, 1)),
], ids=["fast", "off", "slow", "slow-4MiB", "fast-4MiB"])
def test_a_plain_exchange_goes_single_copy(nbytes, env, single_copies):
    """Two ranks, each with a core: the sends of a program's one step that
    exchanges plain messages with a peer go single copy from 64 KiB
    (core._exchanges), where that peer can read this process and single
    copy is not slow, and through the rings below 4 MiB where it is (even
    from the transport's 2 MiB); not a ring all_reduce's (two steps, its
    messages under 2 MiB), nor anything where single copy is off."""
    env = dict(env, COLLIE_EXECUTOR="c")
    for posted in run_ranks(_exchange_body, 2, nbytes, backend="shm", env=env):
        assert all(ok for _, ok in posted.values()), posted
        assert {name: n for name, (n, _) in posted.items()} == \
            {"all_gather": single_copies[0], "all_to_all": single_copies[1], "ring all_reduce": 0}, posted


def _group_body(rank, size, count, registered, dtype):
    """Three direct reduce_scatters (a combining group: every peer's block
    combined into "out" in one step); the outputs and the executor."""
    import collie
    collie.core.select()
    collie.init_process_group()
    try:
        x = _group_input(rank, size, count, dtype)
        inp = collie.empty(x.shape, x.dtype) if registered else np.empty_like(x)
        out = collie.empty(count, x.dtype) if registered else np.empty(count, x.dtype)
        inp[:] = x
        outs = []
        for _ in range(3):
            collie.reduce_scatter_tensor(out, inp, algorithm="direct")
            outs.append(out.copy())
        return collie.config()["executor"], outs
    finally:
        collie.destroy_process_group()


def _group_input(rank, size, count, dtype):
    rng = np.random.default_rng([5, rank])
    if dtype.startswith("int"):  # near the top of the range: the sums wrap
        return rng.integers(np.iinfo(dtype).max // 2, np.iinfo(dtype).max, count * size, dtype=dtype)
    return (rng.standard_normal(count * size) * 1000).astype(dtype)


@needs_core
@pytest.mark.timeout(240)
@pytest.mark.parametrize("size,count,registered,dtype,env", [
    (4, 655363, False, "float32", {}),     # blocks of 2.5 MiB: single copy, combined a chunk at a time
                                           # (64 or, where ranks share cores, 256 KiB; the last one short)
    (4, 655360, True, "float32", {}),      # the same from registered buffers, through their mappings
    (5, 100000, True, "int64", {}),        # four messages (three in one loop, then one), wrapping
    (3, 30000, False, "float64", SMALL_SHM),  # single copy from 8 KiB, tiny rings: Python takes steps over
], ids=["plain", "registered", "registered-int64-5", "small-rings"])
def test_a_combining_group_adds_in_its_order_under_both_executors(size, count, registered, dtype, env):
    """Rank r's result is its own block plus those of r-1, r-2, ... in that
    order (float32 shows the order in its last bits), bit for bit, whatever
    order the messages arrive in and whichever executor runs the step."""
    inputs = [_group_input(r, size, count, dtype) for r in range(size)]
    for executor in ("c", "python"):
        got = run_ranks(_group_body, size, count, registered, dtype, init=False, timeout=200,
                        env=dict(env, COLLIE_EXECUTOR=executor))
        for rank, (used, outs) in enumerate(got):
            assert used == executor
            want = inputs[rank][rank * count:(rank + 1) * count].copy()
            for k in range(1, size):
                np.add(want, inputs[(rank - k) % size][rank * count:(rank + 1) * count], out=want)
            for out in outs:
                assert out.tobytes() == want.tobytes(), (executor, rank)
