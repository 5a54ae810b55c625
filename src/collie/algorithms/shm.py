"""shm: ranks on one host read straight from each other's shared windows.

Every rank has a window ("win"): memory that every rank of the host has
mapped. A rank copies what its peers need into its own window, and they
Read it from there directly — one copy out of a peer's memory instead of a
copy into a ring and another out of it, and no per-fragment handshakes. The
reads are one-sided, so zero-byte messages order them: "written" before a
peer reads, "done" before a window is written again (the verifier proves
the ordering; a race is a verification failure).

all_reduce, n ranks, the data cut into n parts, rank r owns part r:

    step 0  copy parts q != r into win          | barrier ("written")
    step 1  part r += part r of every peer's win |
            copy part r into win                 | barrier ("reduced")
    step 2  read part q from peer q's win, q!=r  | barrier ("done")

    out ─copy─> win_r ··· win_q ─read+reduce─> out[q] ─copy─> win_q ··· ─read─> out

Steps and bytes (n ranks, S = bytes of a rank's buffer; no byte goes through
a socket or a ring, every message is empty):

  collective      steps   bytes copied per rank (memory reads + writes)
  all_reduce      3       copy in (n-1)/n S, reduce S (n-1)/n, copy out (n-1)/n S
  all_gather      2       copy in S/n... (S = "out"): in -> win, n-1 blocks read
  reduce_scatter  2       copy in (n-1)/n of "in", reduce n-1 blocks
  broadcast       2       root copies S in, every other rank reads S
  reduce          2       non-roots copy S in, root reduces (n-1) S
  gather, scatter 2       one block per rank in, n-1 read by the root (or out of it)
  all_to_all      2       n-1 blocks in and n-1 out (equal blocks only: a reader
                          must know where its block sits in the writer's window)

Where it wins: large messages among ranks of one host, and more ranks than
cores (three barriers instead of the 2(n-1) handshaking steps of a ring).
``segments`` is ignored: a window too small for the call is used slice by
slice by the engine, each slice a full run of the schedule.
"""

from __future__ import annotations

from ..schedule import Chunk, Copy, Read, Recv, Schedule, Send
from . import register

NAME = "shm"


def _others(n: int, r: int) -> list:
    """Peers in the order r+1, r+2...: ranks start reading at different peers."""
    return [(r + k) % n for k in range(1, n)]


def _barrier(n: int, r: int) -> tuple:
    """Zero-byte messages to and from every peer: no rank passes until all arrive."""
    return tuple(Send(q, ()) for q in _others(n, r)) + tuple(Recv(q, ()) for q in _others(n, r))


def _star(n: int, r: int, root: int, to_root: bool) -> tuple:
    """Zero-byte messages between the root and every other rank."""
    if r == root:
        return tuple((Recv if to_root else Send)(q, ()) for q in _others(n, r))
    return ((Send if to_root else Recv)(root, ()),)


def _schedule(collective, n, r, steps, root=0, parts=1, win_like="out") -> Schedule:
    if n == 1:  # nobody reads a lone rank's window: keep only its local copies
        steps = [[op for op in step if "win" not in {c.buf for c in op.dst}] for step in steps]
        win_like = None
    return Schedule(collective, NAME, n, r, tuple(tuple(s) for s in steps if s), parts=parts, root=root,
                    win_like=win_like)


@register("all_reduce", NAME)
def all_reduce(n, r, root, segments):
    if n == 1:
        return _schedule("all_reduce", n, r, [])
    mine = Chunk("out", 0, r)
    publish = [Copy((Chunk("out", 0, q),), (Chunk("win", 0, q),)) for q in _others(n, r)]
    reduce_ = [Read(q, (Chunk("win", 0, r),), (mine,), reduce=True) for q in _others(n, r)]
    reduce_.append(Copy((mine,), (Chunk("win", 0, r),)))
    gather = [Read(q, (Chunk("win", 0, q),), (Chunk("out", 0, q),)) for q in _others(n, r)]
    steps = [publish + list(_barrier(n, r)), reduce_ + list(_barrier(n, r)), gather + list(_barrier(n, r))]
    return _schedule("all_reduce", n, r, steps, parts=n)


@register("reduce_scatter", NAME)
def reduce_scatter(n, r, root, segments):
    out = (Chunk("out", 0),)
    steps = [[Copy((Chunk("in", q),), (Chunk("win", q),)) for q in _others(n, r)]
             + [Copy((Chunk("in", r),), out)] + list(_barrier(n, r) if n > 1 else ()),
             [Read(q, (Chunk("win", r),), out, reduce=True) for q in _others(n, r)]
             + list(_barrier(n, r) if n > 1 else ())]
    return _schedule("reduce_scatter", n, r, steps, win_like="in")


@register("all_gather", NAME)
def all_gather(n, r, root, segments):
    # The window is laid out like "out", so that a reader finds rank q's
    # block where its own "out" layout says block q is (sizes may differ).
    steps = [[Copy((Chunk("in", 0),), (Chunk("win", r),)), Copy((Chunk("in", 0),), (Chunk("out", r),))]
             + list(_barrier(n, r) if n > 1 else ()),
             [Read(q, (Chunk("win", q),), (Chunk("out", q),)) for q in _others(n, r)]
             + list(_barrier(n, r) if n > 1 else ())]
    return _schedule("all_gather", n, r, steps)


@register("all_to_all", NAME, uniform_blocks=True)
def all_to_all(n, r, root, segments):
    steps = [[Copy((Chunk("in", q),), (Chunk("win", q),)) for q in _others(n, r)]
             + [Copy((Chunk("in", r),), (Chunk("out", r),))] + list(_barrier(n, r) if n > 1 else ()),
             [Read(q, (Chunk("win", r),), (Chunk("out", q),)) for q in _others(n, r)]
             + list(_barrier(n, r) if n > 1 else ())]
    return _schedule("all_to_all", n, r, steps, win_like="in")


@register("broadcast", NAME)
def broadcast(n, r, root, segments):
    if n == 1:
        return _schedule("broadcast", n, r, [], root=root)
    out = (Chunk("out", 0),)
    if r == root:
        steps = [[Copy(out, (Chunk("win", 0),))] + list(_star(n, r, root, to_root=False)),
                 list(_star(n, r, root, to_root=True))]
    else:
        steps = [list(_star(n, r, root, to_root=False)),
                 [Read(root, (Chunk("win", 0),), out)] + list(_star(n, r, root, to_root=True))]
    return _schedule("broadcast", n, r, steps, root=root)


@register("reduce", NAME)
def reduce(n, r, root, segments):
    if n == 1:
        return _schedule("reduce", n, r, [], root=root)
    out = (Chunk("out", 0),)
    if r == root:
        steps = [list(_star(n, r, root, to_root=True)),
                 [Read(q, (Chunk("win", 0),), out, reduce=True) for q in _others(n, r)]
                 + list(_star(n, r, root, to_root=False))]
    else:
        steps = [[Copy(out, (Chunk("win", 0),))] + list(_star(n, r, root, to_root=True)),
                 list(_star(n, r, root, to_root=False))]
    return _schedule("reduce", n, r, steps, root=root)


@register("gather", NAME)
def gather(n, r, root, segments):
    if r == root:
        steps = [[Copy((Chunk("in", 0),), (Chunk("out", r),))] + list(_star(n, r, root, to_root=True)),
                 [Read(q, (Chunk("win", q),), (Chunk("out", q),)) for q in _others(n, r)]
                 + list(_star(n, r, root, to_root=False))]
    else:
        steps = [[Copy((Chunk("in", 0),), (Chunk("win", r),))] + list(_star(n, r, root, to_root=True)),
                 list(_star(n, r, root, to_root=False))]
    return _schedule("gather", n, r, steps, root=root)


@register("scatter", NAME)
def scatter(n, r, root, segments):
    if r == root:
        steps = [[Copy((Chunk("in", q),), (Chunk("win", q),)) for q in _others(n, r)]
                 + [Copy((Chunk("in", r),), (Chunk("out", 0),))] + list(_star(n, r, root, to_root=False)),
                 list(_star(n, r, root, to_root=True))]
    else:
        steps = [list(_star(n, r, root, to_root=False)),
                 [Read(root, (Chunk("win", r),), (Chunk("out", 0),))] + list(_star(n, r, root, to_root=True))]
    return _schedule("scatter", n, r, steps, root=root, win_like="in")
