"""MPI.Info: an ordered set of (key, value) strings, passed as hints.

As in mpi4py, an Info object refers to a handle: ``MPI.Info(info)`` refers
to the same one (and compares equal), ``Dup()`` and pickling make a new one.
INFO_NULL is the null handle; INFO_ENV holds what this process was started
with (command, argv, maxprocs, wdir, thread_level...).
"""

from __future__ import annotations

import operator
import os
import sys
import weakref

from .constants import MAX_INFO_KEY, MAX_INFO_VAL


class _Items(dict):
    """An Info handle: its items (dicts keep insertion order, as MPI's nth key does)."""


class Info:
    """An MPI info object (see the module doc)."""

    def __new__(cls, info: "Info | None" = None):
        # built in __new__, as in mpi4py, so that a subclass's __new__ can pass it on
        if info is not None and not isinstance(info, Info):
            raise TypeError(f"Info: expected an Info, got {info!r}")
        self = super().__new__(cls)
        self._h = None if info is None else info._h
        return self

    @classmethod
    def _of(cls, items) -> "Info":
        info = cls()
        info._h = _Items(items)
        return info

    # ---- integer handles: INFO_NULL 0, INFO_ENV 1, then each info object as it is asked for ----

    def toint(self) -> int:
        if self._h is None:
            return 0
        if self._h is INFO_ENV._h:
            return 1
        for i, ref in enumerate(_handles):
            if ref() is self._h:
                return i + 2
        _handles.append(weakref.ref(self._h))
        return len(_handles) + 1

    @classmethod
    def fromint(cls, handle: int) -> "Info":
        handle = operator.index(handle)
        info = cls()
        if handle == 1:
            info._h = INFO_ENV._h
        elif handle != 0:
            items = _handles[handle - 2]() if 0 <= handle - 2 < len(_handles) else None
            if items is None:
                from .exceptions import ERR_INFO, Exception
                raise Exception(ERR_INFO, f"Info.fromint: {handle} is not a live info object's handle")
            info._h = items
        return info

    py2f = toint
    f2py = fromint
    handle = property(toint, doc="The info object's integer handle (INFO_NULL: 0).")
    fromhandle = fromint

    # ---- MPI's methods ----

    @classmethod
    def Create(cls, items=None) -> "Info":
        """A new info object, holding ``items`` (a mapping or (key, value) pairs)."""
        info = cls._of(())
        if items is not None:
            if not isinstance(items, dict) and not isinstance(items, (list, tuple)):
                raise TypeError(f"Info.Create: items must be a mapping or a sequence of pairs, got {items!r}")
            info.update(items)
        return info

    @classmethod
    def Create_env(cls, args=None) -> "Info":
        """What a process started with ``args`` (default: this one's argv) would find in INFO_ENV."""
        info = cls._of(_env_items())
        if args is not None:
            argv = [args] if isinstance(args, str) else list(args)
            if argv:
                info._h["command"] = argv[0]
                info._h["argv"] = " ".join(argv[1:])
        return info

    def Free(self) -> None:
        if self._h is None or self is INFO_ENV:
            from .exceptions import ERR_INFO, Exception
            raise Exception(ERR_INFO, "Info.Free: a null or predefined info object cannot be freed")
        self._h = None

    def free(self) -> None:
        """mpi4py's safe free: INFO_NULL and INFO_ENV themselves stay as they
        are; any other handle lets go of its info object."""
        if self is not INFO_ENV:
            self._h = None

    def Dup(self) -> "Info":
        self._need("Dup")
        return type(self)._of(self._h)

    def Get(self, key: str) -> "str | None":
        """The value of ``key``, None when absent."""
        self._need("Get")
        return self._h.get(self._key(key))

    def Set(self, key: str, value: str) -> None:
        self._need("Set")
        value = str(value)
        if len(value) > MAX_INFO_VAL:
            from .exceptions import ERR_INFO_VALUE, Exception
            raise Exception(ERR_INFO_VALUE, f"Info.Set: value longer than {MAX_INFO_VAL}")
        self._h[self._key(key)] = value

    def Delete(self, key: str) -> None:
        self._need("Delete")
        key = self._key(key)
        if key not in self._h:
            from .exceptions import ERR_INFO_NOKEY, Exception
            raise Exception(ERR_INFO_NOKEY, f"Info.Delete: no key {key!r}")
        del self._h[key]

    def Get_nkeys(self) -> int:
        self._need("Get_nkeys")
        return len(self._h)

    def Get_nthkey(self, n: int) -> str:
        self._need("Get_nthkey")
        keys = list(self._h)
        if not 0 <= n < len(keys):
            from .exceptions import ERR_ARG, Exception
            raise Exception(ERR_ARG, f"Info.Get_nthkey: {n} is not in [0, {len(keys)})")
        return keys[n]

    def _need(self, what: str) -> None:
        if self._h is None:
            from .exceptions import ERR_INFO, Exception
            raise Exception(ERR_INFO, f"Info.{what} on MPI.INFO_NULL")

    @staticmethod
    def _key(key) -> str:
        key = str(key)
        if not key or len(key) > MAX_INFO_KEY:
            from .exceptions import ERR_INFO_KEY, Exception
            raise Exception(ERR_INFO_KEY, f"invalid info key {key!r}")
        return key

    # ---- Python's mapping protocol (mpi4py's) ----

    def __bool__(self) -> bool:
        return self._h is not None

    def __eq__(self, other) -> bool:
        return isinstance(other, Info) and self._h is other._h

    def __ne__(self, other) -> bool:
        return not self == other

    __hash__ = None

    def __reduce__(self):
        if self is INFO_NULL:
            return "INFO_NULL"
        if self is INFO_ENV:
            return "INFO_ENV"
        if self._h is None or self._h is INFO_ENV._h:
            return (_unpickle, (None if self._h is None else "INFO_ENV", type(self)))
        return (_unpickle, (list(self._h.items()), type(self)))

    def __len__(self) -> int:
        return 0 if self._h is None else len(self._h)

    def __contains__(self, key) -> bool:
        return self._h is not None and key in self._h

    def __iter__(self):
        return iter(list(self._h or ()))

    def __getitem__(self, key: str) -> str:
        if self._h is None or key not in self._h:
            raise KeyError(key)
        return self._h[key]

    def __setitem__(self, key: str, value: str) -> None:
        if self._h is None:
            raise KeyError(key)
        self.Set(key, value)

    def __delitem__(self, key: str) -> None:
        if self._h is None or key not in self._h:
            raise KeyError(key)
        del self._h[key]

    def get(self, key: str, default=None):
        return default if self._h is None else self._h.get(key, default)

    def keys(self) -> list:
        return list(self._h or ())

    def values(self) -> list:
        return list((self._h or {}).values())

    def items(self) -> list:
        return list((self._h or {}).items())

    def update(self, items=(), **kwds) -> None:
        if self._h is None:
            raise KeyError("update on MPI.INFO_NULL")
        pairs = items.items() if hasattr(items, "items") else items
        for k, v in list(pairs) + list(kwds.items()):
            self.Set(k, v)

    def pop(self, key: str, *default):
        if self._h is not None and key in self._h:
            return self._h.pop(key)
        if default:
            return default[0]
        raise KeyError(key)

    def popitem(self) -> tuple:
        if not self._h:
            raise KeyError("popitem: the info object is empty")
        return self._h.popitem()

    def copy(self) -> "Info":
        return type(self)() if self._h is None else self.Dup()

    def clear(self) -> None:
        if self._h is not None:
            self._h.clear()

    def __repr__(self) -> str:
        return "<MPI.INFO_NULL>" if self._h is None else f"<MPI.Info {dict(self._h)}>"


def _env_items() -> dict:
    from .constants import THREAD_SERIALIZED
    names = {0: "MPI_THREAD_SINGLE", 1: "MPI_THREAD_FUNNELED", 2: "MPI_THREAD_SERIALIZED"}
    items = {"command": sys.executable, "argv": " ".join(sys.argv), "wdir": os.getcwd(),
             "thread_level": names[THREAD_SERIALIZED]}
    size = os.environ.get("WORLD_SIZE")
    if size:
        items["maxprocs"] = size
    return items


def _unpickle(items, cls=None):
    cls = cls or Info
    if items is None:
        return cls()
    if items == "INFO_ENV":
        return cls(INFO_ENV)
    return cls._of(items)


_handles: list = []  # weakrefs to the items of info objects that were given a handle
INFO_NULL = Info()
INFO_ENV = Info._of(_env_items())

__all__ = ["Info", "INFO_NULL", "INFO_ENV"]
