"""The registry, and the shape of each algorithm: the steps, rounds and bytes
on the wire that its docstring (and docs/algorithms.md) claim.

Correctness is test_verify's job; these tests pin down cost, so that a change
that keeps an algorithm correct but makes it slower is noticed.
"""

from __future__ import annotations

import pytest

from collie import algorithms
from collie.algorithms import ALGORITHMS, algorithms_for, build, table
from collie.algorithms.dbtree import inorder_tree
from collie.schedule import COLLECTIVES, Send, part_bounds
from collie.verify import rounds

POW2 = (2, 4, 8, 16, 32)
ANY = (2, 3, 5, 6, 7, 12, 13, 31)


def log2(n: int) -> int:
    return n.bit_length() - 1


def sent(collective, algorithm, n, rank, sizes, root=0, segments=1) -> int:
    """Elements rank sends in one call, with block sizes ``sizes``: buffer ->
    block sizes, the same on every rank (as for all_reduce, all_to_all...)."""
    schedule = build(collective, algorithm, n, rank, root, segments)
    total = 0
    for op in schedule.ops():
        if isinstance(op, Send):
            for c in op.chunks:
                count = sizes[schedule.tmp_like if c.buf == "tmp" else c.buf][c.block]
                lo, hi = part_bounds(0, count, schedule.parts, c.part)
                total += hi - lo
    return total


def steps(collective, algorithm, n, rank=0, root=0, segments=1) -> int:
    return len(build(collective, algorithm, n, rank, root, segments).steps)


# ---------------------------------------------------------------------------
# Registry


def test_table_lists_every_family():
    mine = {
        "broadcast": ("direct", "ring", "tree", "dbtree"),
        "reduce": ("direct", "ring", "tree", "dbtree", "rabenseifner"),
        "all_reduce": ("direct", "ring", "tree", "dbtree", "recursive_doubling", "rabenseifner"),
        "gather": ("direct", "tree"),
        "all_gather": ("direct", "ring", "recursive_doubling", "bruck"),
        "scatter": ("direct", "tree"),
        "reduce_scatter": ("direct", "ring", "rabenseifner"),
        "all_to_all": ("direct", "bruck", "pairwise"),
        "barrier": ("direct", "ring", "tree", "recursive_doubling"),
    }
    listed = dict(table())
    assert list(listed) == list(COLLECTIVES)
    for collective, names in mine.items():  # other families may follow
        assert listed[collective][:len(names)] == names
        assert list(listed[collective]) == list(ALGORITHMS[collective])
    assert algorithms_for("all_to_all")[:3] == ["direct", "bruck", "pairwise"]


def test_build_is_memoized_and_normalized():
    a = build("all_reduce", "ring", 8, 3, segments=2)
    assert build("all_reduce", "ring", 8, 3, 0, 2) is a
    # No root for all_reduce; no segments for an algorithm that does not pipeline.
    assert build("all_reduce", "ring", 8, 3, root=5, segments=2) is a
    assert build("all_to_all", "pairwise", 8, 3, segments=3) is build("all_to_all", "pairwise", 8, 3)
    assert build("broadcast", "tree", 8, 3, root=5).root == 5
    assert algorithms.pipelined("all_reduce", "ring") and not algorithms.pipelined("all_reduce", "tree")
    hash(a)  # schedules are frozen


@pytest.mark.parametrize("args,match", [
    (("all_reduce", "nope", 4, 0), r"all_reduce has no algorithm 'nope'; available: direct, ring"),
    (("allreduce", "ring", 4, 0), "unknown collective 'allreduce'"),
    (("all_reduce", "ring", 0, 0), "nranks must be >= 1"),
    (("all_reduce", "ring", 4, 4), r"rank 4 is outside \[0, 4\)"),
    (("all_reduce", "ring", 4, -1), "rank -1"),
    (("broadcast", "ring", 4, 0, 4), "root 4"),
    (("all_reduce", "ring", 4, 0, 0, 0), "segments must be >= 1"),
    (("all_reduce", "ring", 4.0, 0), "nranks must be an integer"),
    (("all_reduce", "ring", True, 0), "nranks must be an integer"),
])
def test_build_rejects_bad_arguments(args, match):
    with pytest.raises(ValueError, match=match):
        build(*args)


def test_register_rejects_duplicates_and_unknown_collectives():
    with pytest.raises(ValueError, match="already has"):
        algorithms.register("all_reduce", "ring")(lambda *a: None)
    with pytest.raises(ValueError, match="unknown collective"):
        algorithms.register("allreduce", "x")


def test_one_rank_needs_no_messages():
    for collective, names in table():
        for name in names:
            s = build(collective, name, 1, 0)
            assert not any(isinstance(op, Send) for op in s.ops()), (collective, name)


# ---------------------------------------------------------------------------
# Steps, rounds and bytes, as documented


def test_ring_all_reduce():
    for n in ANY:
        S = n * 6 * 10  # divisible by every parts count used below
        for s in (1, 2, 3):
            for r in range(n):
                assert steps("all_reduce", "ring", n, r, segments=s) == 2 * (n - 1) + s - 1
                assert sent("all_reduce", "ring", n, r, {"out": [S]}, segments=s) == 2 * (n - 1) * S // n
        assert rounds("all_reduce", "ring", n) == 2 * (n - 1)


def test_ring_all_gather_and_reduce_scatter():
    for n in ANY:
        m = 7
        for r in range(n):
            assert steps("all_gather", "ring", n, r) == n - 1
            assert sent("all_gather", "ring", n, r, {"in": [m], "out": [m] * n}) == (n - 1) * m
        assert rounds("reduce_scatter", "ring", n) == n - 1  # and a last step adding our own block
        for r in range(n):
            assert sent("reduce_scatter", "ring", n, r, {"in": [m] * n, "out": [m]}) == (n - 1) * m


def test_ring_chains_pipeline():
    for n in ANY:
        for s in (1, 2, 4):
            assert rounds("broadcast", "ring", n, root=n // 2, segments=s) == n - 2 + s
            assert rounds("reduce", "ring", n, root=n - 1, segments=s) == n - 2 + s
            S = 4 * 9
            for r in range(n):
                last = (r - n // 2) % n == n - 1
                assert sent("broadcast", "ring", n, r, {"out": [S]}, root=n // 2, segments=s) == (0 if last else S)


def test_recursive_doubling_and_rabenseifner():
    for n in POW2:
        S = 8 * n
        for r in range(n):
            assert steps("all_reduce", "recursive_doubling", n, r) == log2(n)
            assert sent("all_reduce", "recursive_doubling", n, r, {"out": [S]}) == log2(n) * S
            assert steps("all_gather", "recursive_doubling", n, r) == log2(n)
            assert sent("all_gather", "recursive_doubling", n, r, {"in": [5], "out": [5] * n}) == 5 * (n - 1)
            assert steps("all_reduce", "rabenseifner", n, r) == 2 * log2(n)
            assert sent("all_reduce", "rabenseifner", n, r, {"out": [S]}) == 2 * (n - 1) * S // n
            assert sent("reduce_scatter", "rabenseifner", n, r, {"in": [5] * n, "out": [5]}) == 5 * (n - 1)
            # reduce: the halving's S (n-1)/n, then each part but the root's to the root
            assert sent("reduce", "rabenseifner", n, r, {"out": [S]}) == (n - 1) * S // n + (S // n if r else 0)
        assert rounds("reduce_scatter", "rabenseifner", n) == log2(n)
        assert rounds("reduce", "rabenseifner", n) == log2(n) + (n > 1)
    for n in ANY:  # folding adds a first and a last step
        p = 1 << log2(n)
        extra = 2 if p != n else 0
        assert rounds("all_reduce", "recursive_doubling", n) == log2(p) + extra
        assert rounds("all_reduce", "rabenseifner", n) == 2 * log2(p) + extra
        assert rounds("reduce", "rabenseifner", n, root=n - 1) == log2(p) + 1 + extra // 2
        assert rounds("barrier", "recursive_doubling", n) == (n - 1).bit_length()


def test_logarithmic_algorithms():
    for n in ANY + POW2:
        k = (n - 1).bit_length()
        for collective, name in [("broadcast", "tree"), ("reduce", "tree"), ("gather", "tree"),
                                 ("scatter", "tree"), ("all_gather", "bruck"), ("all_to_all", "bruck")]:
            assert rounds(collective, name, n, root=n - 1) == k, (collective, name, n)
        assert rounds("all_reduce", "tree", n) == 2 * k
        assert steps("all_gather", "bruck", n) == k
        assert sent("all_gather", "bruck", n, 0, {"in": [3], "out": [3] * n}) == 3 * (n - 1)
        # The root of a binomial tree sends the whole buffer once per child.
        assert sent("broadcast", "tree", n, 0, {"out": [10]}) == 10 * k


def test_pairwise_and_direct():
    for n in ANY:
        sizes = {"in": [4] * n, "out": [4] * n}
        for r in range(n):
            assert steps("all_to_all", "pairwise", n, r) == n - 1
            assert sent("all_to_all", "pairwise", n, r, sizes) == 4 * (n - 1)
            assert steps("all_to_all", "direct", n, r) == 1
            assert sent("all_to_all", "direct", n, r, sizes) == 4 * (n - 1)
            assert steps("all_gather", "direct", n, r) == 1
            assert steps("barrier", "direct", n, r) == 1
            assert steps("all_reduce", "direct", n, r) == min(n - 1, 1)  # a combining group
            assert sent("all_reduce", "direct", n, r, {"out": [10]}) == 10 * (n - 1)
            assert steps("reduce_scatter", "direct", n, r) == (2 if n == 2 else 1)  # a group from 3 ranks
            assert steps("reduce", "direct", n, r) == min(n - 1, 1)
        assert rounds("broadcast", "direct", n) == 1
        assert sent("broadcast", "direct", n, 0, {"out": [10]}) == 10 * (n - 1)


def test_double_binary_tree_shape():
    for n in range(2, 200):
        tree = inorder_tree(n)
        interior = [{p - 1 for p in range(1, n + 1) if tree.children[p]},
                    {(p - 2) % n for p in range(1, n + 1) if tree.children[p]}]
        assert not interior[0] & interior[1], n  # interior in at most one tree
        assert all(len(c) <= 2 for c in tree.children)
        assert max(tree.depth) <= n.bit_length()  # depth about log2 n


def test_double_binary_tree_costs():
    for n in (4, 8, 16, 31, 64):
        d = n.bit_length()
        S = 2 * 3 * 10
        for s in (1, 3):
            assert rounds("all_reduce", "dbtree", n, segments=s) <= 2 * d + s
            assert rounds("broadcast", "dbtree", n, segments=s) <= d + s
        # Each half goes up and down one tree: at most 2S per rank, and the
        # leaves of both trees send S.
        per_rank = [sent("all_reduce", "dbtree", n, r, {"out": [S]}) for r in range(n)]
        assert max(per_rank) <= 2 * S and min(per_rank) == S
