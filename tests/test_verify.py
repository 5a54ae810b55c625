"""The verifier proves every registered algorithm, and catches broken ones.

The first test runs the verifier over every (collective, algorithm) for
nranks 1..64; the others break a correct schedule in one way each (a wrong
peer, a missing step, a double-counted reduction, a deadlock, a race, a size
mismatch, a touched input...) and check that the verifier names the fault.
"""

from __future__ import annotations

import dataclasses

import pytest

from collie import algorithms
from collie.schedule import Chunk, Copy, Read, Recv, Reduce, Schedule, Send
from collie.verify import (VerificationError, default_layouts, host_layouts, main, verify, verify_algorithm,
                           verify_all, verify_schedules)

PAIRS = [(c, a) for c, names in algorithms.table() for a in names]


@pytest.mark.parametrize("collective,algorithm", PAIRS, ids=[f"{c}-{a}" for c, a in PAIRS])
def test_every_algorithm_is_correct_up_to_64_ranks(collective, algorithm):
    assert verify_algorithm(collective, algorithm, range(1, 65), segments=(1, 2, 3)) >= 64


# ---------------------------------------------------------------------------
# Helpers to break schedules


def schedules(collective, algorithm, n, root=0, segments=1):
    return [algorithms.build(collective, algorithm, n, r, root, segments) for r in range(n)]


def with_steps(schedule: Schedule, steps) -> Schedule:
    return dataclasses.replace(schedule, steps=tuple(tuple(step) for step in steps))


def replace_op(schedule: Schedule, step: int, index: int, op) -> Schedule:
    steps = [list(s) for s in schedule.steps]
    steps[step][index] = op
    return with_steps(schedule, steps)


def hand_made(collective, n, steps_per_rank, parts=1, tmp_like=None, win_like=None, algorithm="test"):
    return [Schedule(collective, algorithm, n, r, tuple(tuple(s) for s in steps), parts=parts,
                     tmp_like=tmp_like, win_like=win_like) for r, steps in enumerate(steps_per_rank)]


def fails(schedule_list, *fragments, layouts=()):
    with pytest.raises(VerificationError) as info:
        verify_schedules(schedule_list, layouts)
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, message
    return info.value


OUT = (Chunk("out", 0, 0),)
TMP = (Chunk("tmp", 0, 0),)
WIN = (Chunk("win", 0, 0),)


# ---------------------------------------------------------------------------
# The verifier catches broken schedules


def test_wrong_peer():
    broken = schedules("all_reduce", "ring", 4)
    send = broken[1].steps[0][0]
    assert isinstance(send, Send)
    broken[1] = replace_op(broken[1], 0, 0, send._replace(peer=3))  # should be 2
    err = fails(broken, "ring all_reduce, nranks=4")
    assert err.algorithm == "ring" and err.collective == "all_reduce" and err.nranks == 4


def test_peer_out_of_range_or_self():
    broken = schedules("all_gather", "direct", 3)
    op = broken[0].steps[0][1]
    fails([replace_op(broken[0], 0, 1, op._replace(peer=7))] + broken[1:],
          "rank 0 step 0 op 1", "peer 7 is not another rank")
    fails([replace_op(broken[0], 0, 1, op._replace(peer=0))] + broken[1:], "peer 0")


def test_missing_step():
    broken = schedules("all_reduce", "ring", 4)
    broken[2] = with_steps(broken[2], broken[2].steps[:-1])
    fails(broken, "deadlock", "rank 3 at step")


def test_missing_step_that_only_loses_data():
    # Rank 1 of a direct broadcast does not receive: nothing hangs, but its
    # "out" keeps garbage.
    broken = schedules("broadcast", "direct", 3)
    broken[0] = with_steps(broken[0], [[op for op in broken[0].steps[0] if op.peer != 1]])
    broken[1] = with_steps(broken[1], [])
    fails(broken, "rank 1", "out block 0 part 0 holds", "garbage", "expected")


def test_double_counted_reduction():
    # After recursive doubling's exchange, "tmp" still holds this rank's own
    # contribution; adding it again counts it twice.
    broken = schedules("all_reduce", "recursive_doubling", 2)
    broken[0] = with_steps(broken[0], list(broken[0].steps) + [[Reduce(TMP, OUT)]])
    fails(broken, "rank 0 step 1 op 0 Reduce", "counts contributions twice", "out block 0 part 0")


def test_reduce_of_garbage():
    broken = schedules("all_reduce", "recursive_doubling", 2)
    # Drop the snapshot: "tmp" is sent before anything was written to it.
    broken = [with_steps(s, [[op for op in s.steps[0] if not isinstance(op, Copy)]]) for s in broken]
    fails(broken, "combines garbage")


def test_deadlock_both_receive_first():
    n = 2
    steps = [[[Recv(1 - r, OUT)], [Send(1 - r, OUT)]] for r in range(n)]
    err = fails(hand_made("broadcast", n, steps), "deadlock", "rank 0 at step 0 waits on op 0 Recv(from 1",
                "rank 1 at step 0 waits on op 0 Recv(from 0")
    assert err.rank is None


def test_race_within_a_step():
    # Sending "out" while receiving into it in the same step.
    steps = [[[Send(1 - r, OUT), Recv(1 - r, OUT, reduce=True)]] for r in range(2)]
    fails(hand_made("all_reduce", 2, steps), "rank 0 step 0", "race", "out block 0 part 0")


def test_two_receives_into_one_chunk_race():
    steps = [
        [[Recv(1, OUT), Recv(2, OUT, reduce=True)]],
        [[Send(0, OUT)]],
        [[Send(0, OUT)]],
    ]
    fails(hand_made("reduce", 3, steps), "race", "ops 0 and 1")


def test_reducing_receives_into_the_same_chunks_combine_in_order():
    # A combining group (collie.schedule): the root takes every contribution in one step.
    steps = [
        [[Recv(1, OUT, reduce=True), Recv(2, OUT, reduce=True)]],
        [[Send(0, OUT)]],
        [[Send(0, OUT)]],
    ]
    verify_schedules(hand_made("reduce", 3, steps))
    # ... but only into the very same chunks: overlapping ones still race.
    two = (Chunk("out", 0, 0), Chunk("out", 0, 1))
    steps = [
        [[Recv(1, two, reduce=True), Recv(2, two[:1], reduce=True)]],
        [[Send(0, two)]],
        [[Send(0, two[:1])]],
    ]
    fails(hand_made("reduce", 3, steps, parts=2), "race", "ops 0 and 1")


def test_size_mismatch():
    # Rank 0 sends its block for rank 2 to rank 1: with uneven sizes the
    # receive does not fit.
    n = 3
    broken = schedules("all_to_all", "direct", n)
    steps = [list(s) for s in broken[0].steps]
    i = next(i for i, op in enumerate(steps[0]) if isinstance(op, Send) and op.peer == 1)
    steps[0][i] = Send(1, (Chunk("in", 2, 0),))
    broken[0] = with_steps(broken[0], steps)
    sizes = [{"in": (1, 2, 3), "out": (1, 4, 7)},
             {"in": (4, 5, 6), "out": (2, 5, 8)},
             {"in": (7, 8, 9), "out": (3, 6, 9)}]
    fails(broken, "rank 1 step 0", "receives chunks of sizes [2]", "sends sizes [3]", layouts=[sizes])


def test_chunk_count_mismatch():
    steps = [[[Send(1, OUT + OUT)]], [[Recv(0, OUT)]]]
    fails(hand_made("broadcast", 2, steps), "receives 1 chunks", "has 2")


def test_copy_size_mismatch():
    broken = schedules("all_gather", "direct", 2)
    copy = broken[0].steps[0][0]
    assert isinstance(copy, Copy)
    broken[0] = replace_op(broken[0], 0, 0, Copy(copy.src, (Chunk("out", 1, 0),)))
    fails(broken, "source sizes [1] != destination sizes [2]",
          layouts=[[{"in": (1,), "out": (1, 2)}, {"in": (2,), "out": (1, 2)}]])


def test_touched_input():
    broken = schedules("all_gather", "ring", 3)
    broken[1] = with_steps(broken[1], list(broken[1].steps) + [[Copy((Chunk("out", 0, 0),),
                                                                     (Chunk("in", 0, 0),))]])
    fails(broken, "rank 1", "writes 'in'")
    # Receiving into "in" is caught too.
    steps = [[[Send(1, (Chunk("in", 0, 0),))]], [[Recv(0, (Chunk("in", 0, 0),))]]]
    fails(hand_made("all_gather", 2, steps), "rank 1 step 0 op 0", "writes 'in'")


def test_buffer_the_rank_does_not_have():
    # gather's "out" exists on the root only.
    steps = [[[Recv(1, (Chunk("out", 1, 0),)), Copy((Chunk("in", 0, 0),), (Chunk("out", 0, 0),))]],
             [[Copy((Chunk("in", 0, 0),), (Chunk("out", 1, 0),))], [Send(0, (Chunk("in", 0, 0),))]]]
    fails(hand_made("gather", 2, steps), "rank 1 step 0", "buffer 'out', which this rank does not have")
    # "tmp" without tmp_like.
    steps = [[[Copy(OUT, TMP)]], []]
    fails(hand_made("all_reduce", 2, steps), "buffer 'tmp'")


def test_chunk_out_of_range():
    steps = [[[Send(1, (Chunk("out", 0, 3),))]], [[Recv(0, OUT)]]]
    fails(hand_made("broadcast", 2, steps, parts=2), "out[0].3 is out of range")


def test_wrong_result_is_described():
    # A reduce whose root forgets one contribution.
    broken = schedules("reduce", "direct", 3)
    root = broken[0]
    broken[0] = with_steps(root, [root.steps[0][:1]])  # its one step receives from rank 1 only
    broken[2] = with_steps(broken[2], [])
    fails(broken, "rank 0", "out block 0 part 0 holds {out block 0 part 0 of ranks 0-1}",
          "expected {out block 0 part 0 of ranks 0-2}")


def test_non_root_output_must_stay_unchanged():
    # Ring reduce writes the partial sums of ranks between the head and the
    # root into "out" instead of "tmp".
    def to_out(op):
        def fix(chunks):
            return tuple(c._replace(buf="out") for c in chunks)
        if isinstance(op, (Send, Recv)):
            return op._replace(chunks=fix(op.chunks))
        return None  # drop the copies into tmp

    broken = schedules("reduce", "ring", 3)
    middle = broken[1]
    steps = [[to_out(op) for op in step if to_out(op) is not None] for step in middle.steps]
    broken[1] = dataclasses.replace(with_steps(middle, steps), tmp_like=None)
    fails(broken, "rank 1", "out block 0 part 0 holds")


def test_barrier_that_does_not_wait():
    steps = [[[Send(1, OUT)]], [[Recv(0, OUT)]], []]
    fails(hand_made("barrier", 3, steps), "leaves without hearing from ranks")


def test_inconsistent_headers():
    good = schedules("all_reduce", "ring", 3, segments=2)
    bad = list(good)
    bad[1] = dataclasses.replace(bad[1], parts=3)
    fails(bad, "rank 1", "parts=3")
    fails(good[:2], "2 schedules for nranks=3")


# ---------------------------------------------------------------------------
# Shared windows: one-sided Reads must be ordered by messages


def window_broadcast(reader_steps, root_steps=None):
    """Rank 0 publishes its "out" in its window and signals rank 1, which
    reads it (a two-rank broadcast through a window)."""
    root = root_steps or [[Copy(OUT, WIN), Send(1, ())], [Recv(1, ())]]
    return hand_made("broadcast", 2, [root, reader_steps], win_like="out")


def test_window_read_ordered_by_messages():
    verify_schedules(window_broadcast([[Recv(0, ())], [Read(0, WIN, OUT), Send(0, ())]]))


def test_window_read_before_the_write_is_known():
    # The Read is a local op of the step whose receive says "written": too early.
    fails(window_broadcast([[Read(0, WIN, OUT), Recv(0, ())], [Send(0, ())]]), "rank", "win block 0 part 0")


def test_window_rewritten_before_the_read_is_known():
    root = [[Copy(OUT, WIN), Send(1, ())], [Copy(OUT, WIN), Recv(1, ())]]
    err = fails(window_broadcast([[Recv(0, ())], [Read(0, WIN, OUT), Send(0, ())]], root),
                "win block 0 part 0", "step 1")
    # Which side reports the race depends on the order the machine runs them.
    assert "writes its win block 0 part 0 while rank 1's read" in str(err) or "before the write" in str(err)


def test_window_rewritten_while_a_read_may_be_running():
    # Rank 1 says "done" before it reads, not after.
    root = [[Copy(OUT, WIN), Send(1, ())], [Recv(1, ())], [Copy(OUT, WIN)]]
    err = fails(window_broadcast([[Recv(0, ())], [Send(0, ())], [Read(0, WIN, OUT)]], root),
                "win block 0 part 0")
    assert "rank 0 step 2 op 0 Copy" in str(err) or "rank 1 step 2 op 0 Read" in str(err)


def test_window_owner_finishes_before_the_read_is_known():
    # Without the final "done" message, the next call could overwrite the
    # window while rank 1 still reads it.
    root = [[Copy(OUT, WIN), Send(1, ())]]
    fails(window_broadcast([[Recv(0, ())], [Read(0, WIN, OUT)]], root),
          "rank 1 step 1 op 0 Read", "rank 0 can finish before it learns that the read is done")


def test_window_reads_only_windows_of_ranks_that_have_one():
    fails(window_broadcast([[Recv(0, ())], [Read(0, OUT, OUT), Send(0, ())]]), "only its window can be read")
    steps = [[[Send(1, ())]], [[Recv(0, ())], [Read(0, WIN, OUT)]]]
    fails(hand_made("broadcast", 2, steps), "reads the window of rank 0, which has none")


def test_uneven_blocks_break_bruck_all_to_all():
    # bruck's all_to_all parks other ranks' blocks in its own buffers, so it
    # is registered as uniform-only; with uneven sizes the verifier objects.
    assert algorithms.uniform_blocks_only("all_to_all", "bruck")
    uneven = default_layouts("all_to_all", 4)[-1]
    with pytest.raises(VerificationError, match="sizes"):
        verify("all_to_all", "bruck", 4, block_sizes=uneven)
    verify("all_to_all", "pairwise", 4, block_sizes=uneven)


def test_verify_with_explicit_block_sizes():
    sizes = [{"in": (r + 1,), "out": (1, 2, 3)} for r in range(3)]
    verify("all_gather", "bruck", 3, block_sizes=sizes)
    verify("gather", "tree", 3, root=2, block_sizes=sizes)
    with pytest.raises(ValueError, match="inconsistent"):
        verify("all_gather", "bruck", 3, block_sizes=[{"in": (5,), "out": (1, 2, 3)}] * 3)


def test_default_layouts_are_consistent_and_have_zeros():
    for collective in ("all_gather", "scatter", "reduce_scatter", "all_to_all", "all_reduce"):
        layouts = default_layouts(collective, 6)
        assert len(layouts) == 3
        sizes = [s for layout in layouts for bufs in layout for v in bufs.values() for s in v]
        assert 0 in sizes and 13 in sizes
    pairs = default_layouts("all_to_all", 5)[-1]
    assert len({pairs[q]["in"][r] for q in range(5) for r in range(5)}) > 3


def test_verify_all_and_main(capsys):
    results = verify_all(max_nranks=5, collectives=["all_to_all"])
    assert [r.algorithm for r in results] == algorithms.algorithms_for("all_to_all")
    layouts = sum(len(host_layouts(n)) for n in range(1, 6))  # hier: every layout of each size
    assert all(r.error is None and r.runs == (layouts if r.algorithm == "hier" else 5) for r in results), results
    assert main(["-n", "4", "-c", "barrier"]) == 0
    out = capsys.readouterr().out
    assert "barrier ring" in out and "barrier hier" in out and "5/5 algorithms verified" in out


def test_main_reports_failure(monkeypatch, capsys):
    def broken(nranks, rank, root, segments):
        good = algorithms.build("broadcast", "direct", nranks, rank, root)
        steps = good.steps if rank != nranks - 1 else ()
        return dataclasses.replace(good, algorithm="broken", steps=steps)

    monkeypatch.setitem(algorithms.ALGORITHMS["broadcast"], "broken", broken)
    assert main(["-n", "3", "-c", "broadcast", "-a", "broken"]) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and "broken broadcast, nranks=2" in out
