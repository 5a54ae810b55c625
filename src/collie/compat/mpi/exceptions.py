"""MPI.Exception, error classes and codes, and error handlers.

An MPI error is an int: a *class* (MPI.ERR_ARG...) or a *code* that a
program added (Add_error_code) and that belongs to a class. MPI.Exception
carries one; it is a collie.CollieError, so ``except CollieError`` also
catches the errors of MPI calls.

Error handlers: MPI.ERRORS_ARE_FATAL and MPI.ERRORS_ABORT stop the job on
an error, MPI.ERRORS_RETURN makes the call raise MPI.Exception (what mpi4py
does by default on its objects, and what collie always does: an error of a
collie call raises on the rank that saw it, and the program decides).
"""

from __future__ import annotations

import operator

from ...errors import CollieError
from .constants import SUCCESS

_CLASSES = [
    "ERR_BUFFER", "ERR_COUNT", "ERR_TYPE", "ERR_TAG", "ERR_COMM", "ERR_RANK", "ERR_ROOT", "ERR_GROUP",
    "ERR_OP", "ERR_TOPOLOGY", "ERR_DIMS", "ERR_ARG", "ERR_UNKNOWN", "ERR_TRUNCATE", "ERR_OTHER",
    "ERR_INTERN", "ERR_IN_STATUS", "ERR_PENDING", "ERR_REQUEST", "ERR_ACCESS", "ERR_AMODE",
    "ERR_BAD_FILE", "ERR_CONVERSION", "ERR_DUP_DATAREP", "ERR_FILE_EXISTS", "ERR_FILE_IN_USE",
    "ERR_FILE", "ERR_INFO", "ERR_INFO_KEY", "ERR_INFO_VALUE", "ERR_INFO_NOKEY", "ERR_IO", "ERR_NAME",
    "ERR_NO_MEM", "ERR_NOT_SAME", "ERR_NO_SPACE", "ERR_NO_SUCH_FILE", "ERR_PORT", "ERR_QUOTA",
    "ERR_READ_ONLY", "ERR_SERVICE", "ERR_SPAWN", "ERR_UNSUPPORTED_DATAREP", "ERR_UNSUPPORTED_OPERATION",
    "ERR_WIN", "ERR_BASE", "ERR_LOCKTYPE", "ERR_KEYVAL", "ERR_RMA_CONFLICT", "ERR_RMA_SYNC", "ERR_SIZE",
    "ERR_DISP", "ERR_ASSERT", "ERR_RMA_RANGE", "ERR_RMA_ATTACH", "ERR_RMA_SHARED", "ERR_RMA_FLAVOR",
    "ERR_SESSION", "ERR_PROC_ABORTED", "ERR_VALUE_TOO_LARGE", "ERR_ERRHANDLER", "ERR_PROC_FAILED",
    "ERR_PROC_FAILED_PENDING", "ERR_REVOKED", "ERR_ABI",
]
for _i, _n in enumerate(_CLASSES, start=1):
    globals()[_n] = _i
ERR_LASTCODE = 100  # error codes a program adds are above it
_STRINGS = {SUCCESS: "MPI_SUCCESS: no errors"}
_STRINGS.update({i: f"MPI_{n}: {n[4:].lower().replace('_', ' ')} error" for i, n in enumerate(_CLASSES, start=1)})
_user_class: dict[int, int] = {}   # added code -> its class (added classes map to themselves)
_next_code = ERR_LASTCODE + 1


def _code(ierr) -> int:
    return operator.index(ierr)


def Get_error_class(errorcode: int) -> int:
    """The error class of an error code."""
    code = _code(errorcode)
    if 0 <= code <= len(_CLASSES) or code == ERR_LASTCODE:
        return code
    if code in _user_class:
        return _user_class[code]
    return ERR_UNKNOWN  # noqa: F821 - bound in the loop above


def _last_used() -> int:
    """MPI.LASTUSEDCODE: the last error code or class added (ERR_LASTCODE before any)."""
    return _next_code - 1


def Get_error_string(errorcode: int) -> str:
    """The string of an error code ("" for an added code given none yet)."""
    code = _code(errorcode)
    if code in _STRINGS:
        return _STRINGS[code]
    if code in _user_class:
        return ""
    if code == ERR_LASTCODE:
        return "MPI_ERR_LASTCODE: last error code"
    return f"MPI error code {code}: unknown"


def Add_error_class() -> int:
    """A new error class (and code), above ERR_LASTCODE."""
    global _next_code
    code, _next_code = _next_code, _next_code + 1
    _user_class[code] = code
    return code


def Add_error_code(errorclass: int) -> int:
    """A new error code of ``errorclass``."""
    global _next_code
    errorclass = _code(errorclass)
    if not (0 < errorclass <= len(_CLASSES) or _user_class.get(errorclass) == errorclass):
        raise Exception(ERR_ARG)  # noqa: F821
    code, _next_code = _next_code, _next_code + 1
    _user_class[code] = errorclass
    return code


def Add_error_string(errorcode: int, string: str) -> None:
    code = _code(errorcode)
    if code not in _user_class:
        raise Exception(ERR_ARG)  # noqa: F821 - predefined codes keep their strings
    _STRINGS[code] = str(string)


def Remove_error_string(errorcode: int) -> None:
    code = _code(errorcode)
    if code not in _user_class:
        raise Exception(ERR_ARG)  # noqa: F821
    _STRINGS.pop(code, None)


def Remove_error_code(errorcode: int) -> None:
    """Forget an added error code; its string must have been removed first (MPI 4.1)."""
    code = _code(errorcode)
    if code not in _user_class or _user_class[code] == code or code in _STRINGS:
        raise Exception(ERR_ARG)  # noqa: F821
    del _user_class[code]


def Remove_error_class(errorclass: int) -> None:
    """Forget an added error class: its codes and its string must be gone first."""
    code = _code(errorclass)
    if (_user_class.get(code) != code or code in _STRINGS
            or any(c != code and k == code for c, k in _user_class.items())):
        raise Exception(ERR_ARG)  # noqa: F821 - not an added class, or it is still in use
    del _user_class[code]


class Exception(CollieError):  # noqa: A001 - mpi4py's name
    """An error of an MPI call, carrying its error code (an int)."""

    def __init__(self, ierr: int = SUCCESS, message: str | None = None):
        code = _code(ierr)
        if code < SUCCESS:
            code = ERR_UNKNOWN  # noqa: F821
        self.ierr = code
        self._message = message
        super().__init__(message or Get_error_string(code))

    def __int__(self) -> int:
        return self.ierr

    def __index__(self) -> int:
        return self.ierr

    def __bool__(self) -> bool:
        return self.ierr != SUCCESS

    def __hash__(self) -> int:
        return hash(self.ierr)

    def __eq__(self, other) -> bool:
        try:
            return self.ierr == _code(other)
        except TypeError:
            return NotImplemented

    def __ne__(self, other) -> bool:
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    def __lt__(self, other) -> bool:
        return self.ierr < _code(other)

    def __le__(self, other) -> bool:
        return self.ierr <= _code(other)

    def __gt__(self, other) -> bool:
        return self.ierr > _code(other)

    def __ge__(self, other) -> bool:
        return self.ierr >= _code(other)

    def __repr__(self) -> str:
        return f"MPI.Exception({self.ierr})"

    def __str__(self) -> str:
        return self._message or Get_error_string(self.ierr)

    def Get_error_code(self) -> int:
        return self.ierr

    def Get_error_class(self) -> int:
        return Get_error_class(self.ierr)

    def Get_error_string(self) -> str:
        return Get_error_string(self.ierr)

    error_code = property(Get_error_code)
    error_class = property(Get_error_class)
    error_string = property(Get_error_string)


def _error(errclass: int, message: str) -> Exception:
    """An MPI.Exception of ``errclass`` with collie's message."""
    return Exception(errclass, message)


def _as_mpi_error(exc: CollieError) -> Exception:
    """A collie error of an MPI call, as the MPI.Exception mpi4py would raise
    (ERR_PROC_FAILED for a peer that died or left, ERR_OTHER otherwise);
    collie's error is its __cause__."""
    if isinstance(exc, Exception):
        return exc
    from ...errors import PeerError
    new = Exception(ERR_PROC_FAILED if isinstance(exc, PeerError) else ERR_OTHER, str(exc))  # noqa: F821
    new.__cause__ = exc
    return new


# ---- error handlers ----

_MAX_USER = 32   # user error handlers alive at once, per class (mpi4py's own limit)
_user_alive: dict[str, int] = {}  # class name -> how many
_handles: dict[int, "Errhandler"] = {}  # toint() -> the handler (for fromint)


class Errhandler:
    """An error handler. The predefined ones are ERRORS_ARE_FATAL,
    ERRORS_ABORT and ERRORS_RETURN; Comm/Win.Create_errhandler(fn) makes a
    handler that calls ``fn(obj, errorcode)``. ``Errhandler(e)`` is the same
    handler as ``e``; freeing the one Create_errhandler made frees its slot."""

    __slots__ = ("_name", "_fn", "_owner", "__weakref__")

    def __init__(self, errhandler: "Errhandler | None" = None):
        if errhandler is not None and not isinstance(errhandler, Errhandler):
            raise TypeError(f"Errhandler: expected an Errhandler, got {errhandler!r}")
        self._name, self._fn = (None, None) if errhandler is None else (errhandler._name, errhandler._fn)
        self._owner = False

    def __bool__(self) -> bool:
        return self._name is not None

    def __eq__(self, other) -> bool:
        if not isinstance(other, Errhandler):
            return NotImplemented
        return self._name == other._name and self._fn is other._fn

    def __ne__(self, other) -> bool:
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    __hash__ = None  # unhashable, as mpi4py's handles are

    def __repr__(self) -> str:
        return f"<MPI.Errhandler {self._name or 'NULL'}>"

    def __reduce__(self):
        # the predefined handlers pickle by name (a copy of one as an equal copy); user ones not
        for name in _PREDEFINED:
            if self is globals()[name]:
                return name
            if self == globals()[name]:
                return type(self), (globals()[name],)
        raise ValueError(f"cannot pickle {self!r}")

    def toint(self) -> int:
        """0 for ERRHANDLER_NULL, then the predefined ones, then user handlers."""
        for i, name in enumerate(_PREDEFINED):
            if self == globals()[name]:
                return i
        h = next((k for k, e in _handles.items() if e == self), None)
        if h is None:
            h = max(_handles, default=len(_PREDEFINED) - 1) + 1
            _handles[h] = Errhandler(self)
        return h

    @classmethod
    def fromint(cls, handle: int) -> "Errhandler":
        handle = operator.index(handle)
        if 0 <= handle < len(_PREDEFINED):
            return cls(globals()[_PREDEFINED[handle]])
        if handle not in _handles:
            raise Exception(ERR_ARG, f"Errhandler.fromint: {handle} is not an error handler's handle")  # noqa: F821
        return cls(_handles[handle])

    py2f = toint
    f2py = fromint
    handle = property(toint, doc="The handler's integer handle (ERRHANDLER_NULL: 0).")
    fromhandle = fromint

    def Free(self) -> None:
        if not self:
            raise Exception(ERR_ERRHANDLER, "Free: MPI.ERRHANDLER_NULL")  # noqa: F821
        for name in _PREDEFINED[1:]:
            if self is globals()[name]:
                raise Exception(ERR_ARG, "Free: a predefined error handler cannot be freed")  # noqa: F821
        if self._owner:
            kind = self._name[len("user:"):]
            _user_alive[kind] -= 1
            for h in [k for k, e in _handles.items() if e == self]:
                del _handles[h]
            self._owner = False
        self._name, self._fn = None, None

    def free(self) -> None:
        """Free, safely: nothing on ERRHANDLER_NULL and the predefined handlers themselves."""
        if self and not any(self is globals()[name] for name in _PREDEFINED):
            self.Free()

    @classmethod
    def _make(cls, name, fn=None) -> "Errhandler":
        e = cls()
        e._name, e._fn = name, fn
        return e


_PREDEFINED = ("ERRHANDLER_NULL", "ERRORS_ARE_FATAL", "ERRORS_RETURN", "ERRORS_ABORT")


ERRHANDLER_NULL = Errhandler()
ERRORS_ARE_FATAL = Errhandler._make("ERRORS_ARE_FATAL")
ERRORS_RETURN = Errhandler._make("ERRORS_RETURN")
ERRORS_ABORT = Errhandler._make("ERRORS_ABORT")


class _Handled:
    """The error-handler methods of Comm and Win."""

    _errhandler: Errhandler = ERRORS_RETURN

    def _valid(self, what: str) -> None:
        """Raise the MPI.Exception of a null object (a Comm's ERR_COMM...)."""

    def Get_errhandler(self) -> Errhandler:
        """A new handle on this object's error handler (the caller may Free it)."""
        self._valid("Get_errhandler")
        return Errhandler(self.__dict__.get("_errhandler", ERRORS_RETURN))

    def Set_errhandler(self, errhandler: Errhandler) -> None:
        self._valid("Set_errhandler")
        if not isinstance(errhandler, Errhandler) or not errhandler:
            raise Exception(ERR_ERRHANDLER, "Set_errhandler: not an error handler")  # noqa: F821
        self.__dict__["_errhandler"] = Errhandler(errhandler)  # the caller may Free its handle

    def Call_errhandler(self, errorcode: int) -> None:
        """Run this object's error handler on ``errorcode`` (nothing for SUCCESS)."""
        self._valid("Call_errhandler")
        code = _code(errorcode)
        if code == SUCCESS:
            return
        h = self.__dict__.get("_errhandler", ERRORS_RETURN)
        if h._fn is not None:
            h._fn(self, code)
        elif h._name in ("ERRORS_ARE_FATAL", "ERRORS_ABORT"):
            self.Abort(code) if hasattr(self, "Abort") else None
        # ERRORS_RETURN: the error code is the caller's

    @classmethod
    def Create_errhandler(cls, errhandler_fn) -> Errhandler:
        """A handler calling ``errhandler_fn(obj, errorcode)``; at most 32 of
        one class alive at once, as in mpi4py (RuntimeError past that)."""
        if not callable(errhandler_fn):
            raise TypeError("Create_errhandler: expected a function (obj, errorcode)")
        kind = cls.__name__
        if _user_alive.get(kind, 0) >= _MAX_USER:
            raise RuntimeError(f"Create_errhandler: at most {_MAX_USER} user error handlers of {kind} "
                               "can be alive at once; Free one first")
        _user_alive[kind] = _user_alive.get(kind, 0) + 1
        e = Errhandler._make(f"user:{kind}", errhandler_fn)
        e._owner = True
        return e


__all__ = ["Exception", "Errhandler", "ERRHANDLER_NULL", "ERRORS_ARE_FATAL", "ERRORS_RETURN", "ERRORS_ABORT",
           "ERR_LASTCODE", "Get_error_class", "Get_error_string", "Add_error_class", "Add_error_code",
           "Add_error_string", "Remove_error_string", "Remove_error_code", "Remove_error_class", *_CLASSES]
