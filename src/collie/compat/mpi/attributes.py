"""Attribute caching: keyvals, and values attached to objects under them.

``Create_keyval(copy_fn, delete_fn)`` makes a key. ``copy_fn`` says what a
Dup of the object carries: None/False nothing, True the same value, a
function ``copy_fn(obj, keyval, value)`` its result (NotImplemented: nothing).
``delete_fn(obj, keyval, value)`` runs when the value goes: Delete_attr, a
Set_attr over it, the object's Free. An exception in a callback is printed
to stderr and raised as MPI.Exception(ERR_OTHER), as MPI reports an error
of a callback. The store is per handle, so copies of an object
(``MPI.Intracomm(comm)``) see the same attributes.
"""

from __future__ import annotations

import operator
import sys
import traceback

from .constants import KEYVAL_INVALID
from .exceptions import ERR_KEYVAL, ERR_OTHER, _error

__all__ = []

_keyvals: dict = {}  # keyval -> (copy_fn, delete_fn)
_FIRST = 100         # keyvals below are the predefined attributes (TAG_UB...)


def _callback(fn, *args):
    try:
        return fn(*args)
    except Exception:
        traceback.print_exc(file=sys.stderr)
        raise _error(ERR_OTHER, f"attribute callback {getattr(fn, '__name__', fn)!r} raised") from None


class _Attributed:
    """Create_keyval, Free_keyval, Set_attr, Get_attr, Delete_attr; a class
    using it gives ``_attrs()``, its object's store (a dict)."""

    __slots__ = ()

    def _attrs(self) -> dict:
        raise NotImplementedError

    @classmethod
    def Create_keyval(cls, copy_fn=None, delete_fn=None, nopython: bool = False) -> int:
        """A new attribute key (see the module doc; ``nopython`` changes nothing here)."""
        if copy_fn not in (None, False, True) and not callable(copy_fn):
            raise TypeError(f"Create_keyval: copy_fn must be a function, True, False or None, got {copy_fn!r}")
        if delete_fn is not None and not callable(delete_fn):
            raise TypeError(f"Create_keyval: delete_fn must be a function or None, got {delete_fn!r}")
        keyval = max(_keyvals, default=_FIRST - 1) + 1
        _keyvals[keyval] = (copy_fn, delete_fn)
        return keyval

    @classmethod
    def Free_keyval(cls, keyval: int) -> int:
        """Forget a key (values already attached stay until deleted); returns KEYVAL_INVALID."""
        if _keyvals.pop(operator.index(keyval), None) is None:
            raise _error(ERR_KEYVAL, f"Free_keyval: {keyval} is not a key of Create_keyval")
        return KEYVAL_INVALID

    def _key(self, keyval, what: str) -> int:
        keyval = operator.index(keyval)
        if keyval not in _keyvals and keyval not in self._attrs():
            raise _error(ERR_KEYVAL, f"{what}: {keyval} is not a key of Create_keyval")
        return keyval

    def Set_attr(self, keyval: int, attrval) -> None:
        store = self._attrs()
        keyval = self._key(keyval, "Set_attr")
        if keyval in store:
            self.Delete_attr(keyval)
        store[keyval] = attrval

    def Get_attr(self, keyval: int):
        """The value under ``keyval``, None when there is none."""
        if keyval == KEYVAL_INVALID:
            raise _error(ERR_KEYVAL, "Get_attr: MPI.KEYVAL_INVALID is no attribute key")
        return self._attrs().get(operator.index(keyval))

    def Delete_attr(self, keyval: int) -> None:
        store = self._attrs()
        keyval = self._key(keyval, "Delete_attr")
        if keyval not in store:
            return
        value = store.pop(keyval)
        delete_fn = _keyvals.get(keyval, (None, None))[1]
        if delete_fn:
            _callback(delete_fn, self, keyval, value)

    def _copy_attrs(self, new: "_Attributed") -> None:
        """What a Dup carries over (each key's copy_fn decides)."""
        for keyval, value in list(self._attrs().items()):
            copy_fn = _keyvals.get(keyval, (None, None))[0]
            if copy_fn is True:
                new._attrs()[keyval] = value
            elif copy_fn:
                got = _callback(copy_fn, self, keyval, value)
                if got is not NotImplemented:
                    new._attrs()[keyval] = got

    def _delete_attrs(self) -> None:
        """Every value goes (the object is freed)."""
        for keyval in list(self._attrs()):
            self.Delete_attr(keyval)
