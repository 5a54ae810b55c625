"""MPI.Session (MPI-4 sessions) and MPI.File's place.

A collie process belongs to one world, so a session is a handle on that
world: Session.Init joins it (as MPI.Init does), and its process sets are
the two every MPI has, mpi://WORLD and mpi://SELF. Create_group gives their
groups; Intracomm.Create_from_group makes communicators of them.
Finalize ends the handle, not the world (COMM_WORLD may still be in use).

MPI-IO is not part of collie: MPI.File exists so that programs naming it
import, and File.Open raises NotImplementedError, as mpi4py does for a
feature the MPI library lacks.
"""

from __future__ import annotations

import operator
import weakref

from .exceptions import ERR_ARG, ERR_FILE, ERR_SESSION, _error, _Handled
from .group import Group
from .info import Info

__all__ = ["Session", "SESSION_NULL", "File", "FILE_NULL"]

_PSETS = ("mpi://WORLD", "mpi://SELF")


class _State:
    """What copies of one session share: whether it is live, and its handle."""

    __slots__ = ("live", "handle", "__weakref__")

    def __init__(self):
        self.live, self.handle = True, len(_states) + 1
        _states[self.handle] = weakref.ref(self)


_states: dict = {}  # handle -> weakref to its _State


class Session(_Handled):
    """An MPI session (see the module doc). ``Session()`` is SESSION_NULL;
    ``Session(s)`` is the same session as ``s``."""

    def __init__(self, session: "Session | None" = None):
        if session is not None and not isinstance(session, Session):
            raise TypeError(f"Session: expected a Session, got {session!r}")
        self._state = None if session is None else session._state
        self._attached = None

    @classmethod
    def Init(cls, info=None, errhandler=None) -> "Session":
        from .environ import Init
        Init()
        s = cls()
        s._state = _State()
        if errhandler is not None:
            s.Set_errhandler(errhandler)
        return s

    def _live(self, what: str) -> None:
        if not self:
            raise _error(ERR_SESSION, f"Session.{what} on MPI.SESSION_NULL or a finalized session")

    _valid = _live

    def Finalize(self) -> None:
        self._live("Finalize")
        self._state.live = False
        self._state = None

    def free(self) -> None:
        """Finalize, safely: nothing on SESSION_NULL or a finalized session."""
        if self:
            self.Finalize()
        self._state = None

    def toint(self) -> int:
        return self._state.handle if self else 0

    @classmethod
    def fromint(cls, handle: int) -> "Session":
        handle = operator.index(handle)
        s = cls()
        if handle != 0:
            ref = _states.get(handle)
            s._state = ref() if ref is not None else None
            if not s:
                raise _error(ERR_SESSION, f"Session.fromint: {handle} is not a live session's handle")
        return s

    py2f = toint
    f2py = fromint
    handle = property(toint, doc="The session's integer handle (SESSION_NULL: 0).")
    fromhandle = fromint

    def __bool__(self) -> bool:
        return bool(self._state and self._state.live)

    def __eq__(self, other) -> bool:
        if not isinstance(other, Session):
            return NotImplemented
        return self._state is other._state

    def __ne__(self, other) -> bool:
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    __hash__ = None  # unhashable, as mpi4py's handles are

    def __repr__(self) -> str:
        return "<MPI.Session>" if self else "<MPI.SESSION_NULL>"

    def __reduce__(self):
        if self is SESSION_NULL:
            return "SESSION_NULL"
        if not self:
            return type(self), ()
        raise ValueError(f"cannot pickle {self!r}")

    def Abort(self, errorcode: int = 0) -> None:
        from .environ import _comm
        _comm("world").Abort(errorcode)

    # ---- process sets ----

    def Get_num_psets(self, info=None) -> int:
        self._live("Get_num_psets")
        return len(_PSETS)

    def Get_nth_pset(self, n: int, info=None) -> str:
        self._live("Get_nth_pset")
        n = operator.index(n)
        if not 0 <= n < len(_PSETS):
            raise _error(ERR_ARG, f"Session.Get_nth_pset: n must be in [0, {len(_PSETS)}), got {n}")
        return _PSETS[n]

    def _ranks(self, pset_name: str, what: str) -> list:
        from .environ import _comm
        self._live(what)
        world = _comm("world")._g(what)
        if pset_name == "mpi://WORLD":
            return list(world.ranks)
        if pset_name == "mpi://SELF":
            return [world.network.rank]
        raise _error(ERR_ARG, f"Session.{what}: no process set {pset_name!r} (there are {list(_PSETS)})")

    def Get_pset_info(self, pset_name: str) -> Info:
        """An Info with mpi_size, the process set's size."""
        return Info._of([("mpi_size", str(len(self._ranks(pset_name, "Get_pset_info"))))])

    def Create_group(self, pset_name: str) -> Group:
        return Group._of(self._ranks(pset_name, "Create_group"))

    def Get_info(self) -> Info:
        self._live("Get_info")
        return Info._of([("thread_level", "MPI_THREAD_SERIALIZED")])

    # ---- the buffer of buffered sends (Bsend never needs one here) ----

    def Attach_buffer(self, buf) -> None:
        self._live("Attach_buffer")
        self._attached = buf

    def Detach_buffer(self):
        self._live("Detach_buffer")
        buf, self._attached = self._attached, None
        return buf

    def Flush_buffer(self) -> None:
        self._live("Flush_buffer")

    def Iflush_buffer(self):
        from .request import _done_request
        self._live("Iflush_buffer")
        return _done_request()


SESSION_NULL = Session()


class File(_Handled):
    """MPI-IO is not part of collie (see the module doc): File() is
    FILE_NULL and File.Open raises NotImplementedError."""

    def __init__(self, file: "File | None" = None):
        if file is not None and not isinstance(file, File):
            raise TypeError(f"File: expected a File, got {file!r}")

    @classmethod
    def Open(cls, comm, filename, amode=None, info=None) -> "File":
        raise NotImplementedError("MPI.File: collie has no MPI-IO")

    def __bool__(self) -> bool:
        return False

    def __eq__(self, other) -> bool:
        return True if isinstance(other, File) else NotImplemented

    def __ne__(self, other) -> bool:
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    __hash__ = None  # unhashable, as mpi4py's handles are

    def __repr__(self) -> str:
        return "<MPI.FILE_NULL>"

    def __reduce__(self):
        return "FILE_NULL" if self is FILE_NULL else (type(self), ())

    def Close(self) -> None:
        raise _error(ERR_FILE, "File.Close on MPI.FILE_NULL")

    def free(self) -> None:
        """Nothing to free: every File here is FILE_NULL."""

    def toint(self) -> int:
        return 0

    @classmethod
    def fromint(cls, handle: int) -> "File":
        if operator.index(handle) != 0:
            raise _error(ERR_FILE, f"File.fromint: {handle} is not a file's handle (there are none)")
        return cls()

    py2f = toint
    f2py = fromint
    handle = property(toint, doc="0: every File here is FILE_NULL.")
    fromhandle = fromint


FILE_NULL = File()
