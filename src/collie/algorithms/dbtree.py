r"""Double binary tree (NCCL 2.4): two binary trees over the same ranks, each
carrying half of the data, built so that a rank is interior in at most one of
them. A binary tree has depth log2(n), like a binomial one, but a rank
forwards to at most two children, so with pipelining each link carries about
S/2 per tree; with two trees whose interior ranks differ, every rank sends
and receives about S per direction overall: bandwidth near the ring's, with
logarithmic latency.

Tree 1 is the in-order tree over positions 1..m: the root of a range of
positions is the one with the most trailing zero bits, so every odd position
is a leaf. Tree 2 is tree 1 shifted by one position (rank r takes position
r+2 instead of r+1, wrapping): odd positions of tree 2 are even ones of tree
1, so each rank's interior role is in one tree only.

    n=7, tree 1 (rank = position-1)      tree 2 (rank = position-2 mod 7)
              4 (r3)                               4 (r2)
           /      \                             /      \
         2 (r1)    6 (r5)                     2 (r0)    6 (r4)
        /  \      /  \                       /  \      /  \
      1(r0) 3(r2) 5(r4) 7(r6)              1(r6) 3(r1) 5(r3) 7(r5)

all_reduce: half h of the buffer is reduced up tree h, then broadcast down
it; the buffer is cut into 2*s parts (s = segments) and part g of each half
moves one level per step, so segments overlap: a rank at height t above the
leaves sends part g up at step t+g. broadcast and reduce put the root above
both trees (built over the other n-1 ranks) and move half h down or up tree h.

n ranks, D = depth of the trees (about log2 n), s = segments, S = bytes of
"out":

  collective   rounds            bytes sent per rank
  all_reduce   about 2D + s      about 2S for interior ranks, S for leaves
               (up then down)    (S/2 up and S/2 down per child and parent)
  broadcast    about D + s       root S; interior ranks S (S/2 to each child)
  reduce       about 2D + s      S/2 per tree where the rank is not the root

Two children cannot combine into one place in the same step: in all_reduce
the second child's part lands in "tmp" and is combined before forwarding; in
reduce (where ranks other than the root accumulate in "tmp", as their "out"
must stay unchanged) the second child sends one step later.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

from ..schedule import Chunk, Recv, Reduce, Send
from . import land_then_add, make_schedule, register

NAME = "dbtree"


class Tree(NamedTuple):
    """A binary tree over positions 1..m (index 0 unused): parent (0 for the
    root), children, depth (root 0) and time, the step offset at which a
    position sends part 0 up (after all its children's parts 0 arrived)."""

    root: int
    parent: tuple
    children: tuple
    depth: tuple
    time: tuple


def _range_root(lo: int, hi: int) -> int:
    """The position in [lo, hi] with the most trailing zero bits."""
    x = hi
    while (x & (x - 1)) >= lo:
        x &= x - 1
    return x


@functools.lru_cache(maxsize=256)
def inorder_tree(m: int, stagger: bool = False) -> Tree:
    """The in-order binary tree over positions 1..m; with ``stagger`` a
    second child whose part would arrive in the same step as the first's is
    delayed one step, so that a rank never receives two parts into one place
    at once."""
    parent = [0] * (m + 1)
    children: list[tuple] = [()] * (m + 1)
    depth = [0] * (m + 1)
    root = _range_root(1, m)
    order = []  # preorder, so that children come after their parent
    stack = [(1, m, 0, 0)]
    while stack:
        lo, hi, up, d = stack.pop()
        x = _range_root(lo, hi)
        parent[x], depth[x] = up, d
        order.append(x)
        kids = []
        if lo < x:
            kids.append(_range_root(lo, x - 1))
            stack.append((lo, x - 1, x, d + 1))
        if x < hi:
            kids.append(_range_root(x + 1, hi))
            stack.append((x + 1, hi, x, d + 1))
        children[x] = tuple(kids)
    time = [0] * (m + 1)
    for x in reversed(order):  # children before parents
        kids = children[x]
        if len(kids) == 2 and stagger and time[kids[0]] == time[kids[1]]:
            time[kids[1]] += 1
        time[x] = 1 + max((time[c] for c in kids), default=-1)
    return Tree(root, tuple(parent), tuple(children), tuple(depth), tuple(time))


def _position(h: int, member: int, m: int) -> int:
    """Position (1..m) of member 0..m-1 in tree 1 (h=0) or tree 2 (h=1),
    which is tree 1 shifted by one position."""
    return member + 1 if h == 0 else (member + 1) % m + 1


def _member(h: int, position: int, m: int) -> int:
    """The member at ``position`` of tree h (inverse of _position)."""
    return position - 1 if h == 0 else (position - 2) % m


def _part(h: int, g: int, s: int) -> tuple:
    """Part g of half h: half h of the buffer travels through tree h."""
    return (Chunk("out", 0, h * s + g),)


@register("all_reduce", NAME, pipelined=True)
def all_reduce(nranks, rank, root, segments):
    n, s = nranks, segments
    tree = inorder_tree(n)

    def rank_at(h, p):
        return _member(h, p, n)

    events = []
    uses_tmp = False
    for h in (0, 1) if n > 1 else ():
        x = _position(h, rank, n)
        up, kids = tree.parent[x], tree.children[x]
        top = tree.time[tree.root]
        for g in range(s):
            part = _part(h, g, s)
            tmp = (Chunk("tmp", 0, h * s + g),)
            # Reduce up: the first child adds into "out", the second lands in
            # "tmp" and is added before this rank forwards the part.
            for i, c in enumerate(kids):
                dst, combine = (part, True) if i == 0 else (tmp, False)
                events.append((tree.time[c] + g, Recv(rank_at(h, c), dst, reduce=combine)))
            ready = tree.time[x] + g
            if len(kids) == 2:
                uses_tmp = True
                events.append((ready, Reduce(tmp, part)))
            if up:
                events.append((ready, Send(rank_at(h, up), part)))
            # Broadcast down from the tree's root, one level per step.
            down = top + g + tree.depth[x]
            if up:
                events.append((down - 1, Recv(rank_at(h, up), part)))
            for c in kids:
                events.append((down, Send(rank_at(h, c), part)))
    return make_schedule("all_reduce", NAME, n, rank, root, events, parts=2 * s,
                         tmp_like="out" if uses_tmp else None)


class _Rooted(NamedTuple):
    """broadcast and reduce: the trees are built over the m = n-1 ranks
    other than the root (members root+1, root+2, ...), and the root sits
    above both tree roots."""

    n: int
    root: int

    @property
    def m(self) -> int:
        return self.n - 1

    def position(self, h: int, rank: int) -> int:
        return _position(h, (rank - self.root) % self.n - 1, self.m)

    def rank_at(self, h: int, position: int) -> int:
        """The rank at a position of tree h; position 0 (above the tree's
        root) is the root of the call."""
        if position == 0:
            return self.root
        return (_member(h, position, self.m) + 1 + self.root) % self.n


@register("broadcast", NAME, pipelined=True)
def broadcast(nranks, rank, root, segments):
    s = segments
    trees = _Rooted(nranks, root)
    events = []
    if trees.m:
        tree = inorder_tree(trees.m)
        for h in (0, 1):
            for g in range(s):
                part = _part(h, g, s)
                if rank == root:
                    events.append((g, Send(trees.rank_at(h, tree.root), part)))
                    continue
                x = trees.position(h, rank)
                down = g + tree.depth[x] + 1  # the root of the tree is at depth 1
                events.append((down - 1, Recv(trees.rank_at(h, tree.parent[x]), part)))
                for c in tree.children[x]:
                    events.append((down, Send(trees.rank_at(h, c), part)))
    return make_schedule("broadcast", NAME, nranks, rank, root, events, parts=2 * s)


@register("reduce", NAME, pipelined=True)
def reduce(nranks, rank, root, segments):
    s = segments
    trees = _Rooted(nranks, root)
    events = []
    uses_tmp = False
    if trees.m:
        tree = inorder_tree(trees.m, stagger=True)
        for h in (0, 1):
            for g in range(s):
                part = _part(h, g, s)
                if rank == root:
                    top = tree.root
                    events.append((tree.time[top] + g, Recv(trees.rank_at(h, top), part, reduce=True)))
                    continue
                x = trees.position(h, rank)
                kids = tree.children[x]
                acc = part
                if kids:  # the children's parts and ours summed in "tmp"
                    uses_tmp = True
                    acc = (Chunk("tmp", 0, h * s + g),)
                    first = min(kids, key=lambda c: tree.time[c])
                    events += land_then_add(tree.time[first] + g, trees.rank_at(h, first), part, acc)
                for c in kids:
                    if c != first:
                        events.append((tree.time[c] + g, Recv(trees.rank_at(h, c), acc, reduce=True)))
                events.append((tree.time[x] + g, Send(trees.rank_at(h, tree.parent[x]), acc)))
    return make_schedule("reduce", NAME, nranks, rank, root, events, parts=2 * s,
                         tmp_like="out" if uses_tmp else None)
