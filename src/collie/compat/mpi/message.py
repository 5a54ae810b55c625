"""Matched probes: Mprobe/Improbe take a message out of matching, and only
the Message they return can receive it (so that two threads probing one
source cannot receive each other's message).

MESSAGE_NO_PROC is what a matched probe of PROC_NULL gives: receiving it
completes at once with an empty status from PROC_NULL.
"""

from __future__ import annotations

import operator
from typing import Any, Optional

from .constants import ANY_SOURCE, ANY_TAG, PROC_NULL
from .exceptions import ERR_REQUEST, _error
from .p2p import _Message, _Recv
from .request import Request, _done_request
from .status import Status

__all__ = ["Message", "MESSAGE_NULL", "MESSAGE_NO_PROC"]

_matched_states: list = []  # the states of matched messages given a handle (toint)


class Message:
    """A message taken by a matched probe, to be received by Recv/Irecv
    (buffers) or recv/irecv (objects). ``Message(m)`` is the same message."""

    def __init__(self, message: Optional["Message"] = None):
        if message is not None and not isinstance(message, Message):
            raise TypeError(f"Message() takes a Message to copy, got {type(message).__name__}")
        if message is None:
            self._state = {"msg": None, "noproc": False, "comm": None}
        else:  # a matched message is shared (only one receive can take it); a PROC_NULL one is copied
            self._state = message._state if message._state["msg"] is not None else dict(message._state)

    @classmethod
    def _of(cls, comm, msg: Optional[_Message], noproc: bool = False) -> "Message":
        m = cls()
        m._state.update(msg=msg, noproc=noproc, comm=comm)
        return m

    def __bool__(self) -> bool:
        return self._state["msg"] is not None or self._state["noproc"]

    def __eq__(self, other) -> bool:
        if not isinstance(other, Message):
            return NotImplemented
        s, o = self._state, other._state
        return s is o or (s["msg"] is None and o["msg"] is None and s["noproc"] == o["noproc"])

    def __ne__(self, other) -> bool:
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    __hash__ = None  # unhashable, as mpi4py's handles are

    # integer handles: MESSAGE_NULL 0, MESSAGE_NO_PROC 1, matched messages numbered on first request

    def toint(self) -> int:
        state = self._state
        if state["msg"] is None:
            return 1 if state["noproc"] else 0
        for i, known in enumerate(_matched_states):
            if known is state:
                return 2 + i
        _matched_states.append(state)
        return 1 + len(_matched_states)

    @classmethod
    def fromint(cls, handle: int) -> "Message":
        handle = operator.index(handle)
        if handle in (0, 1):
            return cls(MESSAGE_NO_PROC if handle else None)
        if not 0 <= handle - 2 < len(_matched_states):
            raise _error(ERR_REQUEST, f"Message.fromint: {handle} is not a message's handle")
        m = cls()
        m._state = _matched_states[handle - 2]
        return m

    py2f = toint
    f2py = fromint
    handle = property(toint, doc="The message's integer handle (MESSAGE_NULL: 0).")
    fromhandle = fromint

    def __reduce__(self):
        if self is MESSAGE_NULL:
            return "MESSAGE_NULL"
        if self is MESSAGE_NO_PROC:
            return "MESSAGE_NO_PROC"
        if self._state["msg"] is not None:
            raise ValueError("cannot pickle a matched Message")
        return (type(self), (MESSAGE_NO_PROC if self._state["noproc"] else None,))

    def free(self) -> None:
        """mpi4py's safe free: MESSAGE_NULL and MESSAGE_NO_PROC themselves stay;
        any other handle becomes MESSAGE_NULL (MPI has no Message_free)."""
        if self is not MESSAGE_NULL and self is not MESSAGE_NO_PROC:
            self._state = {"msg": None, "noproc": False, "comm": None}

    # ---- probing ----

    @classmethod
    def Probe(cls, comm, source: int = ANY_SOURCE, tag: int = ANY_TAG, status: Optional[Status] = None) -> "Message":
        """Block until a message matches; take it."""
        return _mprobe(comm, source, tag, status, True, "Mprobe")

    @classmethod
    def Iprobe(cls, comm, source: int = ANY_SOURCE, tag: int = ANY_TAG,
               status: Optional[Status] = None) -> Optional["Message"]:
        """Take a matching message if one has arrived, else None."""
        return _mprobe(comm, source, tag, status, False, "Improbe")

    probe = Probe
    iprobe = Iprobe

    # ---- receiving ----

    def _take(self, dst, what: str, after=None, keep=None) -> Request:
        """The receive of this message; the handle becomes MESSAGE_NULL."""
        state = self._state
        msg, comm = state["msg"], state["comm"]
        if state["noproc"]:
            if self is not MESSAGE_NO_PROC:
                state["noproc"] = False
            return _done_request((PROC_NULL, ANY_TAG, 0, False))
        if msg is None:
            raise _error(ERR_REQUEST, f"Message.{what}: the message is MESSAGE_NULL (already received?)")
        state["msg"] = None
        m = comm._p2p(f"Message.{what}")
        op = _Recv(msg.source, msg.tag, dst)
        op.msg = msg
        return Request(m.network, recv=op, matcher=m, after=after, keep=keep, timeout=m.group.timeout,
                       describe=lambda: f"Message.{what} from rank {msg.source} (tag {msg.tag}) of {comm._name}")

    def Irecv(self, buf) -> Request:
        if self._state["noproc"] or buf is None:
            return self._take(None, "Irecv")
        from .buffers import _Buf
        from ...arrays import byte_view
        b = _Buf(buf, "Message.Irecv buf", writable=True, empty_ok=True)
        return self._take(byte_view(b.section()), "Irecv", after=b.finish, keep=b)

    def Recv(self, buf, status: Optional[Status] = None) -> None:
        self.Irecv(buf).Wait(status)

    def irecv(self) -> Request:
        return self._take(None, "irecv")

    def recv(self, status: Optional[Status] = None) -> Any:
        return self.irecv().wait(status)


def _mprobe(comm, source, tag, status: Optional[Status], block: bool, what: str) -> Optional[Message]:
    """Comm.Mprobe/Improbe: find a matching message and take it out of matching."""
    m, source, msg = comm._envelope(source, tag, block, what)
    if source == PROC_NULL:
        if status is not None:
            status._set(PROC_NULL, ANY_TAG, 0)
        return Message(MESSAGE_NO_PROC)  # a copy: receiving it makes it MESSAGE_NULL
    if msg is None:
        return None
    m.take(msg)
    if status is not None:
        status._set(msg.source, msg.tag, msg.nbytes)
    return Message._of(comm, msg)


MESSAGE_NULL = Message()
MESSAGE_NO_PROC = Message._of(None, None, noproc=True)
