"""Point-to-point, as torch.distributed defines it, on real ranks."""

import os

import numpy as np
import pytest

from harness import run_ranks

pytestmark = pytest.mark.timeout(90)
BACKENDS = ["shm", "tcp"]

DTYPES = ["bool", "int8", "uint16", "int32", "int64", "float16", "float32", "float64", "complex128"]


def _dtypes_body(rank, size):
    import collie
    results = []
    for i, dtype in enumerate(DTYPES):
        shape = (3, 5, 2)
        want = (np.arange(30) % 7).astype(dtype).reshape(shape)
        if rank == 0:
            collie.send(want, dst=1, tag=i)
            # non-contiguous source: every other column of a bigger array
            big = np.zeros((3, 10, 2), dtype)
            big[:, ::2] = want
            collie.send(big[:, ::2], dst=1, tag=i)
        else:
            got = np.zeros(shape, dtype)
            collie.recv(got, src=0, tag=i)
            big = np.zeros((3, 10, 2), dtype)
            collie.recv(big[:, 1::2], src=0, tag=i)  # non-contiguous destination
            results.append(bool(np.array_equal(got, want) and np.array_equal(big[:, 1::2], want)
                                and not big[:, ::2].any()))
    return results


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_dtype_any_layout(backend):
    assert all(run_ranks(_dtypes_body, 2, backend=backend)[1])


def _nonblocking_body(rank, size, n):
    import collie
    peer = 1 - rank
    out = np.full(n, rank, np.float32)   # the send waits for its reader: both sides must progress
    into = np.zeros(n, np.float32)
    works = [collie.isend(out, peer), collie.irecv(into, peer)]
    for w in works:  # the send first: the receive must be moving meanwhile
        assert w.wait() is True
    ok = works[0].is_completed() and works[1].is_completed() and bool((into == peer).all())
    return ok, works[1].result()


SINGLE_COPY_256K = {"COLLIE_SHM_CMA_BYTES": str(256 << 10)}  # the default starts at 1-2 MiB


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("n", [1 << 17, 1 << 20])  # single copy, and larger than any ring
def test_isend_irecv_both_ways(backend, n):
    assert run_ranks(_nonblocking_body, 2, n, backend=backend, env=SINGLE_COPY_256K) == [(True, 1), (True, 0)]


def _batch_body(rank, size):
    import collie
    right, left = (rank + 1) % size, (rank - 1) % size
    got_l, got_r = np.zeros(1000), np.zeros(1000)
    ops = [collie.P2POp(collie.isend, np.full(1000, rank, float), right),
           collie.P2POp(collie.irecv, got_l, left),
           collie.P2POp(collie.irecv, got_r, right),
           collie.P2POp(collie.isend, np.full(1000, rank, float), left)]
    if rank % 2:
        ops.reverse()  # order of the ops must not matter
    for w in collie.batch_isend_irecv(ops):
        w.wait()
    return float(got_l[0]), float(got_r[0])


@pytest.mark.parametrize("backend", BACKENDS)
def test_batch_isend_irecv_any_order(backend):
    res = run_ranks(_batch_body, 3, backend=backend)
    assert res == [(2.0, 1.0), (0.0, 2.0), (1.0, 0.0)]


def _order_body(rank, size):
    import collie
    if rank == 0:
        for i in range(50):
            collie.send(np.array([i]), 1, tag=i % 3)
        return None
    got = {0: [], 1: [], 2: []}
    buf = np.zeros(1, int)
    for tag in (2, 0, 1):  # drain tags in another order than sent
        for _ in range(len(range(tag, 50, 3))):
            collie.recv(buf, 0, tag=tag)
            got[tag].append(int(buf[0]))
    return got


def test_same_tag_messages_arrive_in_order():
    got = run_ranks(_order_body, 2, backend="shm")[1]
    assert got == {t: list(range(t, 50, 3)) for t in range(3)}


def _any_source_body(rank, size):
    import collie
    if rank == 0:
        senders = []
        buf = np.zeros(2)
        for _ in range(size - 1):
            src = collie.recv(buf)
            senders.append((src, buf[0]))
        return sorted(senders)
    collie.send(np.array([rank * 1.5, 0]), 0)
    return None


@pytest.mark.parametrize("backend", BACKENDS)
def test_recv_from_any_source_returns_the_sender(backend):
    assert run_ranks(_any_source_body, 4, backend=backend)[0] == [(1, 1.5), (2, 3.0), (3, 4.5)]


def _objects_body(rank, size):
    import collie
    if rank == 0:
        collie.send_object_list([{"a": 1}, "text", np.arange(3), None], dst=1)
        return None
    objs = [None] * 4
    src = collie.recv_object_list(objs)
    return src, objs[0], objs[1], objs[2].tolist(), objs[3]


def test_object_lists():
    assert run_ranks(_objects_body, 2)[1] == (0, {"a": 1}, "text", [0, 1, 2], None)


def _torch_body(rank, size):
    import torch

    import collie
    t = torch.arange(6, dtype=torch.float32).reshape(2, 3) * (rank + 1)
    b = torch.zeros(4, dtype=torch.bfloat16)
    if rank == 0:
        collie.send(t, 1)
        collie.send(torch.tensor([1.5, -2.0, 3.25, 0.0], dtype=torch.bfloat16), 1)
        return None
    got = torch.zeros(2, 3)
    collie.recv(got, 0)
    collie.recv(b, 0)
    return got.tolist(), b.float().tolist()


def test_torch_tensors_in_place():
    pytest.importorskip("torch")
    got, bf = run_ranks(_torch_body, 2)[1]
    assert got == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
    assert bf == [1.5, -2.0, 3.25, 0.0]


def _size_mismatch_body(rank, size):
    import collie
    if rank == 0:
        collie.send(np.zeros(10, np.float32), 1)
        collie.send(np.arange(3, dtype=np.float32), 1)  # the sender is not left blocked
        return "sent"
    try:
        collie.recv(np.zeros(7, np.float32), 0)
    except ValueError as exc:
        msg = str(exc)
    after = np.zeros(3, np.float32)
    collie.recv(after, 0)  # the bad message was consumed
    return msg, after.tolist()


@pytest.mark.parametrize("backend", BACKENDS)
def test_receive_buffer_of_the_wrong_size(backend):
    sent, (msg, after) = run_ranks(_size_mismatch_body, 2, backend=backend)
    assert sent == "sent"
    assert "40 bytes" in msg and "28 bytes" in msg and "rank 0" in msg
    assert after == [0.0, 1.0, 2.0]


def _bad_args_body(rank, size):
    import collie
    errors = []
    for call in (lambda: collie.send(np.zeros(1), rank),
                 lambda: collie.send(np.zeros(1), size),
                 lambda: collie.recv(np.zeros(1), -1),
                 lambda: collie.send(np.zeros(1), 1 - rank, tag=-1),
                 lambda: collie.send([1, 2], 1 - rank),
                 lambda: collie.recv(np.frombuffer(b"abcd", np.uint8), 1 - rank),
                 lambda: collie.send(np.array(["a"], dtype=object), 1 - rank)):
        try:
            call()
            errors.append(None)
        except (ValueError, TypeError) as exc:  # the kind, not the subclass (a read-only buffer: ReadOnlyError)
            errors.append("ValueError" if isinstance(exc, ValueError) else "TypeError")
    return errors


def test_bad_arguments_raise_before_sending():
    for errors in run_ranks(_bad_args_body, 2):
        assert errors == ["ValueError", "ValueError", "ValueError", "ValueError", "TypeError",
                          "ValueError", "TypeError"]


def _poll_any_body(rank, size):
    import time

    import collie
    if rank == 1:
        time.sleep(0.2)
        collie.send(np.array([7.0]), 0)
        return None
    buf = np.zeros(1)
    work = collie.irecv(buf)              # from any source, completed by polling alone
    deadline = time.monotonic() + 10
    while not work.is_completed() and time.monotonic() < deadline:
        time.sleep(0.001)
    return work.is_completed(), work.result(), buf[0]


def test_polling_an_any_source_receive_completes_it():
    assert run_ranks(_poll_any_body, 2)[0] == (True, 1, 7.0)


def _posting_order_body(rank, size):
    import collie
    from collie.group import world
    big = 1 << 17  # 512 KiB of float32: single copy
    if rank == 0:
        for i in range(10):
            collie.send(np.array([i], np.int64), 1)
        collie.all_reduce(np.ones(4))
        collie.send(np.array([10], np.int64), 1)
        work = collie.isend(np.arange(big, dtype=np.float32), 1)  # waits for its reader
        work.wait()
        return None
    bufs = [np.zeros(1, np.int64) for _ in range(12)]
    first = [collie.irecv(bufs[i], 0) for i in range(4)]
    state = world().network.p2p
    deferred = state is not None and state.deferred == first  # in no transport's books yet
    for w in reversed(first):  # waited last to first: still filled first to last
        w.wait()
    later = collie.irecv(bufs[4], 0)
    strided = np.zeros((1, 2), np.int64)
    collie.recv(strided[:, 1], 0)  # the full path: the receive posted before it comes first
    later.wait()
    before_any = collie.irecv(bufs[6], 0)
    src = collie.recv(bufs[7])  # from any source
    before_any.wait()
    never_waited = collie.irecv(bufs[8], 0)
    collie.recv(bufs[9], 0)
    during = collie.irecv(bufs[10], 0)
    collie.all_reduce(np.ones(4))  # its message waits in the ring behind ours, or ours behind it
    during.wait()
    into = np.zeros(big, np.float32)
    whole = collie.irecv(into, 0)
    while not whole.is_completed():
        pass
    got = [int(b[0]) for b in bufs[:5]] + [int(strided[0, 1])] + [int(b[0]) for b in bufs[6:11]]
    return (deferred, got, src, never_waited.is_completed(), whole.result(),
            bool(np.array_equal(into, np.arange(big, dtype=np.float32))))


@pytest.mark.parametrize("executor", ["c", "python"])
def test_receives_take_messages_in_the_order_they_were_posted(executor):
    """The compiled core defers a receive until it is waited on; whatever
    else may take a message from that peer first hands it to the
    transport, so a peer's messages fill the receives in posting order,
    whichever is waited on first."""
    from collie import core
    if executor == "c" and core.choose({"COLLIE_EXECUTOR": "auto"})[0] != "c":
        pytest.skip("the compiled core is not built here")
    deferred, got, src, never_waited, sender, whole = run_ranks(
        _posting_order_body, 2, backend="shm", env={"COLLIE_EXECUTOR": executor, **SINGLE_COPY_256K})[1]
    assert got == list(range(11))
    assert (src, never_waited, sender, whole) == (0, True, 0, True)
    assert deferred == (executor == "c")


def _several_slots_body(rank, size):
    """Messages of 2-8 slots of 4 KiB in rings of 8 (and one of 9, more
    than the ring holds), sent with send/isend and received with
    recv/irecv/batch_isend_irecv; the receiver is late half the time.
    Returns what arrived, and how many messages each rank's transport saw
    (the Python path's)."""
    import time

    import collie
    from collie.transports.shm import ShmTransport
    seen = {"isend": 0, "irecv": 0}
    for name in seen:
        original = getattr(ShmTransport, name)

        def counted(self, *args, name=name, original=original, **kwargs):
            seen[name] += 1
            return original(self, *args, **kwargs)

        setattr(ShmTransport, name, counted)
    sizes = [4096 * 2, 4096 * 3 + 4, 4096 * 8, 4096 * 5 + 100, 4096 * 9]
    ok = []
    for k, nbytes in enumerate(sizes * 2):
        count = nbytes // 4
        if rank == 0:
            x = np.arange(count, dtype=np.int32) + k
            if k % 3 == 0:
                collie.send(x, 1, tag=k)
            else:
                collie.isend(x, 1, tag=k).wait()
        else:
            if k % 2:
                time.sleep(0.01)  # the message is all there before the receive looks
            y = np.zeros(count, np.int32)
            if k % 3 == 0:
                collie.recv(y, 0, tag=k)
            elif k % 3 == 1:
                collie.irecv(y, 0, tag=k).wait()
            else:
                for work in collie.batch_isend_irecv([collie.P2POp(collie.irecv, y, 0, tag=k)]):
                    work.wait()
            ok.append(bool(np.array_equal(y, np.arange(count, dtype=np.int32) + k)))
    return ok, seen


def test_messages_of_several_slots_go_through_the_core_whole_or_not_at_all():
    """A point-to-point message of several slots that fits the ring is
    written whole where the ring has room, and taken whole once all of it
    has come (_core.c's move_whole); a larger one, or one that finds no
    room, goes the transport's way, and every message arrives as sent."""
    from collie import core
    if core.choose({"COLLIE_EXECUTOR": "auto"})[0] != "c":
        pytest.skip("the compiled core is not built here")
    env = {"COLLIE_SHM_SLOT_BYTES": "4096", "COLLIE_SHM_SLOTS": "8", "COLLIE_SHM_CMA_BYTES": "0"}
    (_, sender), (ok, receiver) = run_ranks(_several_slots_body, 2, backend="shm", env=env)
    assert ok == [True] * 10
    # The 9-slot messages (two) go the transport's way, and those that find
    # the ring still holding the one before; most others the core's (all
    # ten went the transport's way before).
    assert 2 <= sender["isend"] <= 7 and 2 <= receiver["irecv"] <= 7, (sender, receiver)


def _core_batches_body(rank, size):
    """Rounds of batches on a ring of ranks, each sending to both
    neighbours and receiving from both: messages of 8 bytes to 3 MiB (more
    than a ring holds) in one batch, in an order that depends on the rank.
    In each round one rank comes late: not at all, by less than the spin,
    by far more (then its peers' batches pause, and hand their messages
    over to Python on the first wait); and the Works are waited on in
    order, in reverse, or polled. Returns, per round, whether every
    message arrived and what kinds of Work the batch gave."""
    import time

    import collie
    right, left = (rank + 1) % size, (rank - 1) % size
    sizes = [(1 << 16) // 8, 200_000 // 8, (1 << 20) // 8, (3 << 20) // 8]
    lateness = [0, 0.0003, 0.03]
    rounds = []
    for k in range(12):
        n = sizes[k % len(sizes)]
        sent = [np.arange(n, dtype=np.float64) + 1000 * rank + k + side for side in (0, 1)]
        small = np.full(3, rank * 10 + k, np.int16)
        got = [np.zeros(n), np.zeros(n)]
        got_small = np.zeros(3, np.int16)
        ops = [collie.P2POp(collie.isend, sent[0], right, tag=5),
               collie.P2POp(collie.irecv, got[0], left, tag=5),
               collie.P2POp(collie.isend, small, right, tag=5),
               collie.P2POp(collie.irecv, got_small, left, tag=5),
               collie.P2POp(collie.irecv, got[1], right, tag=5),
               collie.P2POp(collie.isend, sent[1], left, tag=5)]
        if rank % 2:  # receives first: the order of the ops does not matter, that of a peer's messages does
            ops = [op for op in ops if op.op is collie.irecv] + [op for op in ops if op.op is collie.isend]
        if rank == k % size:
            time.sleep(lateness[k // size % len(lateness)])
        works = collie.batch_isend_irecv(ops)
        kinds = sorted({type(w).__name__ for w in works})
        if k % 3 == 0:
            for w in works:
                w.wait()
        elif k % 3 == 1:
            for w in reversed(works):
                w.wait()
        else:
            while not all(w.is_completed() for w in works):
                pass
            for w in works:
                w.wait()
        ok = (np.array_equal(got[0], np.arange(n, dtype=np.float64) + 1000 * left + k + 0)
              and np.array_equal(got[1], np.arange(n, dtype=np.float64) + 1000 * right + k + 1)
              and (got_small == left * 10 + k).all())
        receives = [w.result() for w, op in zip(works, ops) if op.op is collie.irecv]
        rounds.append((bool(ok), kinds, sorted(set(receives)) == sorted({left, right}), n * 8))
    return rounds


@pytest.mark.parametrize("single_copy,env", [
    (True, {"COLLIE_TOPOLOGY": "single_copy=1.5"}),
    (True, {"COLLIE_TOPOLOGY": "single_copy=4"}),  # slow: single copy from the transport's threshold only
    (False, {"COLLIE_SHM_CMA_BYTES": "0"}),
], ids=["fast", "slow", "off"])
def test_batches_through_the_core(executor, single_copy, env):
    """batch_isend_irecv with a message of 64 KiB or more is one step of a
    core program (_core.c's batch()): its Works are the core's, whether
    the batch ended in the call, paused until a wait, or was handed over
    to Python; every message arrives as sent, whoever comes late. Without
    single copy its messages of several slots move whole (put_whole,
    take_whole), and one larger than the ring goes call by call."""
    for rank in run_ranks(_core_batches_body, 3, backend="shm", env=env):
        for ok, kinds, sources, nbytes in rank:
            assert ok and sources
            if executor == "python":
                assert kinds == ["Work"], kinds
            elif single_copy or nbytes <= 2 << 20:
                assert set(kinds) <= {"CompletedWork", "_BatchWork"}, kinds
            else:  # call by call: the isends and irecvs' own Works
                assert "_BatchWork" not in kinds and "Work" in kinds, kinds


def _batch_order_body(rank, size):
    """A batch's receive and an irecv or recv from the same peer, posted in
    either order: each takes the message meant for it (the one posted
    first, the first message), and a paused batch lets a collective
    through. Returns what each received."""
    import time

    import collie
    big = 1 << 15  # float64s: 256 KiB, single copy in a batch
    out = []
    if rank == 0:
        time.sleep(0.02)  # rank 1's batch pauses
        collie.send(np.full(4, 1.0), 1)
        collie.send(np.full(big, 2.0), 1)
        collie.send(np.full(big, 3.0), 1)
        collie.send(np.full(4, 4.0), 1)
        for w in collie.batch_isend_irecv([collie.P2POp(collie.isend, np.full(big, 5.0), 1),
                                           collie.P2POp(collie.irecv, np.zeros(big), 1)]):
            w.wait()
        x = np.ones(2)
        collie.all_reduce(x)
        out.append(float(x[0]))
        return out
    first = np.zeros(4)
    early = collie.irecv(first, 0)  # deferred: it takes the first message
    second = np.zeros(big)
    batch = collie.batch_isend_irecv([collie.P2POp(collie.irecv, second, 0)])
    batch[0].wait()
    early.wait()
    out.append((float(first[0]), float(second[0])))
    third = np.zeros(big)
    batch = collie.batch_isend_irecv([collie.P2POp(collie.irecv, third, 0)])  # paused or done
    fourth = np.zeros(4)
    collie.recv(fourth, 0)  # after the batch's receive, whatever the batch did
    batch[0].wait()
    out.append((float(third[0]), float(fourth[0])))
    got = np.zeros(big)
    works = collie.batch_isend_irecv([collie.P2POp(collie.irecv, got, 0),
                                      collie.P2POp(collie.isend, np.full(big, 6.0), 0)])
    x = np.ones(2)
    collie.all_reduce(x)  # with the batch perhaps still paused
    for w in works:
        w.wait()
    out.append((float(got[0]), float(x[0])))
    return out


def test_a_batch_takes_its_peers_messages_in_posting_order(executor):
    assert run_ranks(_batch_order_body, 2, backend="shm")[1] == [(1.0, 2.0), (3.0, 4.0), (5.0, 2.0)]


def _dead_sender_body(rank, size, how, dead=0):
    import os
    import time

    import collie
    collie.barrier()
    if rank == dead:
        time.sleep(0.5)
        os._exit(7)
    buf = np.zeros(4)
    start = time.monotonic()
    try:
        if how == "irecv":
            collie.irecv(buf, dead).wait()  # deferred: the core waits for it, then Python
        elif how == "batch":  # the core's batch: it pauses, then hands its receive over
            buf = np.zeros(1 << 15)
            collie.batch_isend_irecv([collie.P2POp(collie.irecv, buf, dead)])[0].wait()
        elif how == "recv":
            collie.recv(buf, dead)
        else:  # from any source: the others are alive but send nothing
            collie.recv(buf, None)
    except collie.CollieError as exc:
        return type(exc).__name__, getattr(exc, "peer", None), str(exc), time.monotonic() - start
    return "no error"


@pytest.mark.parametrize("how", ["irecv", "recv", "batch"])
def test_a_receive_from_a_dead_peer_raises_peer_error(how):
    name, _, msg, elapsed = run_ranks(_dead_sender_body, 2, how, backend="shm", expect_errors=True)[1]
    assert name == "PeerError" and "rank 0" in msg, msg
    assert elapsed < 10


@pytest.mark.parametrize("backend", ["shm", "tcp"])
def test_a_receive_from_any_source_fails_once_a_candidate_dies(backend):
    """Receives from any source on ranks 0 and 2, and rank 1 dies: each
    could only have been matched by the dead rank, or by the other survivor
    that is itself stuck waiting. Both raise PeerError naming rank 1 (as an
    MPI ANY_SOURCE receive gets ERR_PROC_FAILED_PENDING), long before the
    group's timeout; a live candidate is not enough to keep waiting."""
    results = run_ranks(_dead_sender_body, 3, "any", 1, backend=backend, expect_errors=True, timeout=60)
    for rank in (0, 2):
        name, peer, msg, elapsed = results[rank]
        assert (name, peer) == ("PeerError", 1) and "rank 1" in msg, msg
        assert elapsed < 10


def _repeated_body(rank, size):
    """Repeated calls of a few shapes (the core's entries keep a route for
    each), with what must still leave them: a message of another tag in
    the way, a sender slower than the receive's spin, a receive posted
    before, a read-only array to receive into, a new world."""
    import time

    import collie
    peer, out = 1 - rank, []
    f32, i32, late = np.zeros(4, np.float32), np.zeros(4, np.int32), np.zeros(4, np.float32)
    for i in range(40):
        if rank == 0:
            collie.send(np.full(4, i, np.float32), peer)
            collie.send(np.full(4, -i, np.int32), peer, tag=3)  # the same size: another dtype, another tag
            collie.isend(np.full(4, 2 * i, np.float32), dst=peer, tag=5).wait()
            if i % 10 == 9:
                time.sleep(0.02)  # longer than any receive spins: it finishes in Python
                collie.send(np.full(4, i, np.float32), peer, tag=7)
        else:
            collie.recv(i32, peer, tag=3)  # a tag-0 message is in the ring before it
            got = [int(i32[0])]
            got.append(int(f32[0]) if collie.recv(f32, peer) == peer else None)
            got.append(int(f32[0]) if collie.recv(f32, src=peer, tag=5) == peer else None)
            if i % 10 == 9:
                got.append(int(late[0]) if collie.recv(late, group_src=peer, tag=7) == peer else None)
            out.append(got == [-i, i, 2 * i] + ([i] if i % 10 == 9 else []))
    if rank == 0:
        for i in range(5):
            collie.send(np.full(4, 300 + i, np.float32), peer, tag=9)
    else:
        time.sleep(0.05)  # they are all there: each irecv takes its message as it is posted
        works = [collie.irecv(buf, peer, tag=9) for buf in (f32, i32.view(np.float32), late, f32, late)]
        waited = [(w.is_completed(), w.result()) for w in works]
        out.append(waited == [(True, peer)] * 5 and (f32[0], late[0]) == (303, 304))
    if rank == 0:
        try:  # the size of a route's array, of a dtype collie does not move
            collie.send(np.array([None, None], dtype=object), peer)
            out.append("an object array sent")
        except TypeError as exc:
            out.append("object" in str(exc))
        for i in range(3):
            collie.send(np.full(4, 100 + i, np.float32), peer)
    else:
        first = collie.irecv(f32, peer)  # deferred: it takes the next message
        second = np.zeros(4, np.float32)
        collie.recv(second, peer)
        first.wait()
        out.append((int(f32[0]), int(second[0])) == (100, 101))
        frozen = np.zeros(4, np.float32)
        frozen.flags.writeable = False
        try:
            collie.recv(frozen, peer)
            out.append("a read-only array received")
        except ValueError as exc:  # collie.ReadOnlyError
            out.append("read-only" in str(exc))
        collie.recv(f32, peer)
        out.append(int(f32[0]) == 102)
    collie.destroy_process_group()
    collie.init_process_group()  # the routes led into the old world: they go with it
    if rank == 0:
        collie.send(np.full(4, 200, np.float32), peer)
    else:
        out.append(collie.recv(f32, peer) == peer and int(f32[0]) == 200)
    return out


def test_repeated_calls_and_what_leaves_their_route(executor):
    sender, receiver = run_ranks(_repeated_body, 2, backend="shm")
    assert (sender, receiver) == ([True], [True] * 45)


def test_point_to_point_entries_look_like_their_functions():
    """send, recv and isend are the core's entries where it is built:
    what help(), inspect and pickle see is the Python function's."""
    import inspect
    import pickle

    import collie
    for f in (collie.send, collie.recv, collie.isend):
        wrapped = getattr(f, "__wrapped__", f)
        assert inspect.signature(f) == inspect.signature(wrapped)
        assert f.__name__ == wrapped.__name__ and f.__doc__ == wrapped.__doc__
        assert pickle.loads(pickle.dumps(f)) is f


def _adaptive_spin_body(rank, size):
    """Rank 1 sends after 6 ms (a peer off its core for a time slice), then
    after 60 ms (a peer at work); rank 0 receives, and says how long it
    spins after each phase. (Its core spins 1 ms first, then the Network
    its own spin: 6 ms outlasts both until that is 8 ms.)"""
    import time

    import collie
    from collie.group import resolve
    buf = np.zeros(1)
    spins = []
    for pause, count in ((0.006, 12), (0.06, 8)):
        for _ in range(count):
            if rank == 1:
                time.sleep(pause)
                collie.send(buf, 0)
            else:
                collie.recv(buf, 1)
        spins.append(resolve(None).network.spin_seconds)
    return spins


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="two ranks would share one core (no adapting there)")
@pytest.mark.parametrize("fixed", [False, True])
def test_a_waiters_spin_adapts_to_waits_that_outlast_it(fixed):
    """With a core per rank, waits that outlast the spin and end within
    network.SPIN_LIMIT_SECONDS of the sleep double it (up to that limit),
    longer ones halve it (down to network.SPIN_SECONDS); COLLIE_SPIN_US
    fixes it."""
    from collie import network
    env = {"COLLIE_SPIN_US": "1000"} if fixed else {}
    short, long = run_ranks(_adaptive_spin_body, 2, backend="shm", env=env)[0]
    if fixed:
        assert short == long == 1e-3
    else:
        assert 4e-3 <= short <= network.SPIN_LIMIT_SECONDS and long == network.SPIN_SECONDS, (short, long)
