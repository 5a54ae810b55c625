"""MPI.Pickle and MPI.pickle: how the lowercase calls turn objects into bytes.

``MPI.pickle`` is the instance the object calls (send, recv, isend...) use;
an application may re-initialise it with other dumps/loads functions
(dill, marshal, json...), a protocol, or a threshold for out-of-band data.
The environment variables MPI4PY_PICKLE_PROTOCOL and MPI4PY_PICKLE_THRESHOLD
set the defaults, as in mpi4py.
"""

from __future__ import annotations

import os
import pickle as _std
from typing import Any, Callable, Iterable, Optional

from ... import core
from .memory import buffer

__all__ = ["Pickle", "pickle"]

_PROTOCOL = int(os.environ.get("MPI4PY_PICKLE_PROTOCOL", _std.HIGHEST_PROTOCOL))
_THRESHOLD = int(os.environ.get("MPI4PY_PICKLE_THRESHOLD", 1024**2 // 4))  # out-of-band from 0.25 MiB


class Pickle:
    """Serialise objects with ``dumps(obj[, protocol])`` and ``loads(data)``
    (pickle's by default)."""

    def __init__(self, dumps: Optional[Callable] = None, loads: Optional[Callable] = None,
                 protocol: Optional[int] = None, threshold: Optional[int] = None):
        self._dumps = _std.dumps if dumps is None else dumps
        self._loads = _std.loads if loads is None else loads
        self._protocol = protocol
        self.PROTOCOL = protocol
        self.THRESHOLD = threshold

    @property
    def PROTOCOL(self) -> Optional[int]:  # noqa: N802 - mpi4py's name
        """The protocol passed to dumps (None: dumps' own default)."""
        return self._protocol

    @PROTOCOL.setter
    def PROTOCOL(self, protocol: Optional[int]) -> None:  # noqa: N802
        if protocol is None and self._dumps is _std.dumps:
            protocol = _PROTOCOL
        self._protocol = protocol
        if type(self) is Pickle and self._dumps is _std.dumps and self._loads is _std.loads:
            # pickle's own functions, called from every lowercase call with
            # the protocol as a positional argument (a keyword, as a partial
            # would pass it, costs pickle.dumps more than the pickling), by
            # the compiled core's Appended where it is built (a Python
            # function around it cost a third more than the pickling)
            if core._core is not None:
                dumps = core._core.Appended(_std.dumps, protocol)
            else:
                def dumps(obj, _dumps=_std.dumps, _protocol=protocol):
                    return _dumps(obj, _protocol)
            self.dumps = dumps
            self.loads = _std.loads
        else:  # re-initialised with other functions (or a subclass): the methods
            self.__dict__.pop("dumps", None)
            self.__dict__.pop("loads", None)
        if self is globals().get("pickle"):
            _tell_core(self)

    @property
    def THRESHOLD(self) -> int:  # noqa: N802 - mpi4py's name
        """Buffers of at least this many bytes travel out of band (dumps_oob)."""
        return self._threshold

    @THRESHOLD.setter
    def THRESHOLD(self, threshold: Optional[int]) -> None:  # noqa: N802
        self._threshold = _THRESHOLD if threshold is None else threshold

    def dumps(self, obj: Any) -> bytes:
        if self._protocol is None:
            return self._dumps(obj)
        return self._dumps(obj, self._protocol)

    def loads(self, data) -> Any:
        return self._loads(data)

    def dumps_oob(self, obj: Any) -> tuple[bytes, list]:
        """Pickle data and, out of band, the large buffers it holds
        (protocol 5 at least), each an MPI.buffer."""
        protocol = max(_PROTOCOL if self._protocol is None else self._protocol, 5)
        buffers: list = []

        def take(pb: _std.PickleBuffer) -> bool:
            raw = pb.raw()
            if raw.nbytes >= self._threshold:
                buffers.append(buffer.frombuffer(raw, readonly=None))
                return False
            return True

        data = self._dumps(obj, protocol, buffer_callback=take)
        return data, buffers

    def loads_oob(self, data, buffers: Iterable) -> Any:
        return self._loads(data, buffers=buffers)


pickle = Pickle()


def _tell_core(p: Pickle) -> None:
    """Hand MPI.pickle's dumps and loads to the compiled core, which calls
    them without looking them up, where they are set on the instance (the
    plain ones; None where its methods are, which it looks up)."""
    if core._core is not None:
        core._core.set_pickle(p.__dict__.get("dumps"), p.__dict__.get("loads"))


_tell_core(pickle)
