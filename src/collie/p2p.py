"""Point-to-point: send and receive between two ranks, blocking or not.

Names, signatures and semantics follow torch.distributed: dst/src are
global ranks (group_dst/group_src are ranks within ``group``), arrays are
filled in place, recv(src=None) receives from any rank of the group and
returns the sender's global rank. Messages from one rank to another with
the same tag (in the same group) arrive in the order they were sent.
"""

from __future__ import annotations

import pickle
from typing import Optional

import numpy as np

from .arrays import Buffer, byte_view
from .group import ProcessGroup, resolve
from .wire import MAX_TAG
from .work import Work

__all__ = ["send", "recv", "isend", "irecv", "P2POp", "batch_isend_irecv",
           "send_object_list", "recv_object_list"]

_OBJECT_TAG = MAX_TAG  # object lists travel on their own tag, apart from arrays


def _peer(g: ProcessGroup, rank: Optional[int], group_rank: Optional[int], role: str,
          what: str, allow_any: bool = False) -> Optional[int]:
    """The peer's global rank, validated for ``g``."""
    if type(rank) is int and group_rank is None and g.rank >= 0 and rank in g._index \
            and rank != g.network.rank:
        return rank  # the common case, checked at once
    g.require_member(what)
    if rank is not None and group_rank is not None:
        raise ValueError(f"{what}: give {role} or group_{role}, not both")
    if group_rank is not None:
        rank = g.global_rank(group_rank)
    if rank is None:
        if allow_any:
            return None
        raise ValueError(f"{what}: {role} is required")
    if not isinstance(rank, (int, np.integer)):
        raise TypeError(f"{what}: {role} must be an int rank, got {type(rank).__name__}")
    rank = int(rank)
    g.group_rank(rank)  # raises ValueError when not in the group
    if rank == g.network.rank:
        raise ValueError(f"{what}: rank {rank} cannot {'send to' if role == 'dst' else 'receive from'} itself")
    return rank


def _describe(g: ProcessGroup, what: str, peer, tag: int):
    g.p2p_ops += 1
    n = g.p2p_ops
    return lambda: f"{what} {'any rank' if peer is None else ('rank %d' % peer)} " \
                   f"(group {g.name}, tag {tag}, point-to-point call #{n})"


def _post_send(tensor, dst, group, tag, group_dst, what):
    g = resolve(group)
    peer = _peer(g, dst, group_dst, "dst", what)
    buf = Buffer(tensor, writable=False, what=f"{what} tensor")
    # _peer checked the peer: post without the Network's second check
    return g, peer, buf, g.network.post_send(peer, g.p2p_tag(tag), buf.bytes(), 0)


def _post_recv(tensor, src, group, tag, group_src, what):
    g = resolve(group)
    peer = _peer(g, src, group_src, "src", what, allow_any=True)
    buf = Buffer(tensor, writable=True, what=f"{what} tensor")
    if peer is None:  # any source: the Network resolves it
        req = g.network.irecv(None, g.p2p_tag(tag), buf.bytes(), candidates=g.ranks)
    else:
        req = g.network.post_recv(peer, g.p2p_tag(tag), buf.bytes(), None, None)
    return g, peer, buf, req


def isend(tensor, dst: Optional[int] = None, group: Optional[ProcessGroup] = None, tag: int = 0,
          group_dst: Optional[int] = None) -> Work:
    """Start sending ``tensor`` to ``dst``; the tensor must not change until
    the returned Work completes."""
    g, peer, buf, req = _post_send(tensor, dst, group, tag, group_dst, "isend")
    return Work(g.network, [req], _describe(g, "send to", peer, tag), keep=buf, timeout=g.timeout)


def irecv(tensor, src: Optional[int] = None, group: Optional[ProcessGroup] = None, tag: int = 0,
          group_src: Optional[int] = None) -> Work:
    """Start receiving into ``tensor`` from ``src`` (any rank of the group
    when None). The Work's result() is the sender's global rank."""
    g, peer, buf, req = _post_recv(tensor, src, group, tag, group_src, "irecv")

    def done():
        buf.finish()
        return req.peer

    return Work(g.network, [req], _describe(g, "receive from", peer, tag), on_done=done, keep=buf,
                timeout=g.timeout)


# The blocking calls post and wait without making a Work: the same requests
# and the same waiting loop, with less to build on the hot path.

def send(tensor, dst: Optional[int] = None, group: Optional[ProcessGroup] = None, tag: int = 0,
         group_dst: Optional[int] = None) -> None:
    """Send ``tensor`` to ``dst`` and return once it may be reused."""
    g, peer, buf, req = _post_send(tensor, dst, group, tag, group_dst, "send")
    if not req.done:
        g.network.wait((req,), timeout=g.timeout, describe=_describe(g, "send to", peer, tag))


def recv(tensor, src: Optional[int] = None, group: Optional[ProcessGroup] = None, tag: int = 0,
         group_src: Optional[int] = None) -> int:
    """Receive into ``tensor`` from ``src`` (any rank when None); returns the
    sender's global rank."""
    g, peer, buf, req = _post_recv(tensor, src, group, tag, group_src, "recv")
    g.network.wait((req,), timeout=g.timeout, describe=_describe(g, "receive from", peer, tag))
    buf.finish()
    return req.peer


class P2POp:
    """One operation of batch_isend_irecv: ``op`` is collie.isend or collie.irecv."""

    def __init__(self, op, tensor, peer: Optional[int] = None, group: Optional[ProcessGroup] = None,
                 tag: int = 0, group_peer: Optional[int] = None):
        if op not in (isend, irecv):
            raise ValueError("P2POp: op must be collie.isend or collie.irecv")
        self.op, self.tensor, self.peer, self.group, self.tag, self.group_peer = \
            op, tensor, peer, group, tag, group_peer

    def __repr__(self) -> str:
        return f"P2POp({self.op.__name__}, peer={self.peer}, tag={self.tag})"


def batch_isend_irecv(p2p_op_list: list) -> list:
    """Start every send and receive of the list at once; returns their Works.

    The order of the ops does not matter: no transport blocks while
    posting, so no pairing of two batches can deadlock. Sends are posted
    first, so that a peer waiting on one gets it before this rank spends
    time on its receives (one whose message already waits completes as it
    is posted).
    """
    if not isinstance(p2p_op_list, (list, tuple)):
        raise TypeError("batch_isend_irecv takes a list of P2POp")
    for p in p2p_op_list:  # all checked before anything is posted
        if not isinstance(p, P2POp):
            raise TypeError("batch_isend_irecv takes a list of P2POp")
    works: list = [None] * len(p2p_op_list)
    for i, p in enumerate(p2p_op_list):
        if p.op is isend:
            works[i] = isend(p.tensor, p.peer, p.group, p.tag, group_dst=p.group_peer)
    for i, p in enumerate(p2p_op_list):
        if p.op is irecv:
            works[i] = irecv(p.tensor, p.peer, p.group, p.tag, group_src=p.group_peer)
    return works


def send_object_list(object_list: list, dst: Optional[int] = None, group: Optional[ProcessGroup] = None,
                     device=None, group_dst: Optional[int] = None, use_batch: bool = False) -> None:
    """Send picklable objects to ``dst``, which calls recv_object_list with a
    list of the same length. ``device`` and ``use_batch`` are torch's, and
    change nothing here (the objects travel as two messages either way)."""
    g = resolve(group)
    peer = _peer(g, dst, group_dst, "dst", "send_object_list")
    payload = pickle.dumps(list(object_list), protocol=pickle.HIGHEST_PROTOCOL)
    size = np.array([len(payload)], dtype=np.int64)
    t = g.p2p_tag(_OBJECT_TAG)
    reqs = [g.network.isend(peer, t, byte_view(size)), g.network.isend(peer, t, memoryview(payload))]
    Work(g.network, reqs, _describe(g, "send_object_list to", peer, _OBJECT_TAG), timeout=g.timeout).wait()


def recv_object_list(object_list: list, src: Optional[int] = None, group: Optional[ProcessGroup] = None,
                     device=None, group_src: Optional[int] = None, use_batch: bool = False) -> int:
    """Receive objects sent by send_object_list into ``object_list`` (in
    place); returns the sender's global rank."""
    g = resolve(group)
    peer = _peer(g, src, group_src, "src", "recv_object_list", allow_any=True)
    t = g.p2p_tag(_OBJECT_TAG)
    size = np.zeros(1, dtype=np.int64)
    describe = _describe(g, "recv_object_list from", peer, _OBJECT_TAG)
    head = g.network.irecv(peer, t, byte_view(size), candidates=g.ranks if peer is None else None)
    Work(g.network, [head], describe, timeout=g.timeout).wait()
    sender = head.peer
    payload = bytearray(int(size[0]))
    body = g.network.irecv(sender, t, memoryview(payload))
    Work(g.network, [body], describe, timeout=g.timeout).wait()
    objects = pickle.loads(payload)
    if len(objects) != len(object_list):
        raise ValueError(f"recv_object_list: rank {sender} sent {len(objects)} objects but the "
                         f"list has room for {len(object_list)}")
    object_list[:] = objects
    return sender
