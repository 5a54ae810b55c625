"""Requests."""

from __future__ import annotations

import pickle
from typing import Any, Callable, Optional, Sequence
from .constants import ANY_SOURCE, ANY_TAG, UNDEFINED
from .p2p import _Recv, _progress, _wait_until
from .status import Status

__all__ = ["Request", "REQUEST_NULL", "Prequest"]


from ...errors import CollieError
from .exceptions import ERR_TRUNCATE, _as_mpi_error, _error


# ---- requests ----

class Request:
    """A non-blocking operation: Isend/Irecv, isend/irecv, Ibcast...

    Wait()/Test() follow mpi4py; wait()/test() also return the received
    object of an irecv (None for the others).
    """

    def __init__(self, network=None, *, sends=(), recv: Optional[_Recv] = None, matcher=None, work=None,
                 keep=None, after=None, timeout: float = 300.0,
                 describe: Callable[[], str] = lambda: "MPI request", status=None):
        self._network, self._sends, self._recv, self._matcher = network, tuple(sends), recv, matcher
        self._work = work
        self._keep, self._after, self._timeout, self._describe = keep, after, timeout, describe
        self._done = False
        self._error: Optional[BaseException] = None
        self._result = None
        self._status = status  # (source, tag, nbytes, cancelled) once known

    def _requests(self) -> list:
        """The transport requests this one is waiting on."""
        if self._recv is not None and self._recv.msg is not None and self._recv.msg.req is not None:
            return [self._recv.msg.req]
        return list(self._sends)

    def _ready(self) -> bool:
        if self._done:
            return True
        if self._work is not None:
            return self._work.is_completed()
        if self._recv is not None:
            return self._recv.ready()
        return all(r.finished for r in self._sends)

    def _complete(self, status: Optional[Status]) -> None:
        if not self._done:
            self._done = True
            try:
                self._finish()
            except CollieError as exc:
                self._error = _as_mpi_error(exc)
            except BaseException as exc:
                self._error = exc
            self._keep = None
        if self._error is not None:
            raise self._error
        if status is not None and self._status is not None:
            status._set(*self._status)

    def _finish(self) -> None:
        if self._work is not None:
            self._work.wait()
        elif self._sends:
            self._network.wait(self._sends, describe=self._describe)  # raises a failed send's error
        elif self._recv is not None:
            op = self._recv
            if op.error is not None:
                raise op.error
            if op.cancelled:
                self._status = (ANY_SOURCE, ANY_TAG, 0, True)
                return
            msg = op.msg
            if msg.req is not None and msg.req.error is not None:
                self._network.wait([msg.req], describe=self._describe)
            self._status = (msg.source, msg.tag, msg.nbytes, False)
            if op.dst is None:
                self._result = pickle.loads(msg.data)
            elif msg.data is not None:
                if msg.nbytes > len(op.dst):
                    raise _error(ERR_TRUNCATE, f"rank {self._network.rank}: {self._describe()}: message truncated: "
                                      f"rank {msg.source} sent {msg.nbytes} bytes (tag {msg.tag}) but the "
                                      f"receive buffer holds {len(op.dst)}")
                op.dst[:msg.nbytes] = msg.data
        if self._after is not None:
            self._after()

    def Wait(self, status: Optional[Status] = None) -> bool:
        # An asynchronous collective blocks in its own wait (in _finish).
        if self._work is None and not self._ready():
            _wait_until(self._ready, self._network, self._timeout, self._describe, self._requests)
        self._complete(status)
        return True

    def Test(self, status: Optional[Status] = None) -> bool:
        if self._network is not None and not self._done:
            _progress(self._network)
        if not self._ready():
            return False
        self._complete(status)
        return True

    def wait(self, status: Optional[Status] = None) -> Any:
        self.Wait(status)
        return self._result

    def test(self, status: Optional[Status] = None) -> tuple[bool, Any]:
        done = self.Test(status)
        return done, (self._result if done else None)

    def __bool__(self) -> bool:
        """False for MPI.REQUEST_NULL and for a request that completed (MPI
        sets a completed request's handle to MPI_REQUEST_NULL)."""
        return not (self._done and self._error is None and self._persistent is None)

    def __eq__(self, other) -> bool:
        if not isinstance(other, Request):
            return NotImplemented
        return self is other or (not self and not other)

    def __ne__(self, other) -> bool:
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    __hash__ = object.__hash__

    _persistent = None  # Prequest: how to start it again

    def Cancel(self) -> None:
        """Cancel a receive that no message has matched yet (sends cannot be)."""
        if self._recv is not None and self._matcher is not None:
            self._matcher.cancel(self._recv)

    def Free(self) -> None:
        """Let the operation complete on its own; this handle becomes REQUEST_NULL."""
        self._done = True

    cancel = Cancel
    free = Free

    def get_status(self, status: Optional[Status] = None) -> bool:
        return self.Get_status(status)

    def Get_status(self, status: Optional[Status] = None) -> bool:
        done = self._ready()
        if done:
            self._complete(status)
        return done

    # ---- on many requests ----

    @staticmethod
    def _wait_some(requests: Sequence["Request"], ready: Callable[[], bool]) -> None:
        live = [r for r in requests if r._network is not None]
        if live and not ready():
            _wait_until(ready, live[0]._network, max(r._timeout for r in live),
                        lambda: f"waiting for {len(requests)} MPI requests",
                        lambda: [q for r in live for q in r._requests()])

    @staticmethod
    def Waitall(requests: Sequence["Request"], statuses: Optional[list] = None) -> bool:
        requests = list(requests)
        Request._wait_some(requests, lambda: all(r._work is not None or r._ready() for r in requests))
        if statuses is not None and len(statuses) < len(requests):
            statuses += [Status() for _ in range(len(requests) - len(statuses))]
        for i, r in enumerate(requests):
            r._complete(statuses[i] if statuses is not None else None)
        return True

    @staticmethod
    def waitall(requests: Sequence["Request"], statuses: Optional[list] = None) -> list:
        Request.Waitall(requests, statuses)
        return [r._result for r in requests]

    @staticmethod
    def Testall(requests: Sequence["Request"], statuses: Optional[list] = None) -> bool:
        requests = list(requests)
        for r in requests:
            if r._network is not None:
                _progress(r._network)
                break
        if not all(r._ready() for r in requests):
            return False
        Request.Waitall(requests, statuses)
        return True

    @staticmethod
    def testall(requests: Sequence["Request"], statuses: Optional[list] = None) -> tuple[bool, Optional[list]]:
        done = Request.Testall(requests, statuses)
        return done, ([r._result for r in requests] if done else None)

    @staticmethod
    def Waitsome(requests: Sequence["Request"], statuses: Optional[list] = None) -> Optional[list]:
        """Indices of the requests that completed, at least one (None when
        every request is inactive)."""
        requests = list(requests)
        live = [i for i, r in enumerate(requests) if r]
        if not live:
            return None
        Request._wait_some(requests, lambda: any(requests[i]._ready() for i in live))
        return Request._take(requests, live, statuses)

    @staticmethod
    def Testsome(requests: Sequence["Request"], statuses: Optional[list] = None) -> Optional[list]:
        requests = list(requests)
        live = [i for i, r in enumerate(requests) if r]
        if not live:
            return None
        for r in requests:
            if r._network is not None:
                _progress(r._network)
                break
        return Request._take(requests, live, statuses)

    @staticmethod
    def _take(requests, live, statuses) -> list:
        done = [i for i in live if requests[i]._ready()]
        if statuses is not None and len(statuses) < len(done):
            statuses += [Status() for _ in range(len(done) - len(statuses))]
        for k, i in enumerate(done):
            requests[i]._complete(statuses[k] if statuses is not None else None)
        return done

    @staticmethod
    def waitsome(requests: Sequence["Request"], statuses: Optional[list] = None):
        done = Request.Waitsome(requests, statuses)
        return (None, None) if done is None else (done, [requests[i]._result for i in done])

    @staticmethod
    def testsome(requests: Sequence["Request"], statuses: Optional[list] = None):
        done = Request.Testsome(requests, statuses)
        return (None, None) if done is None else (done, [requests[i]._result for i in done])

    @staticmethod
    def testany(requests: Sequence["Request"], status: Optional[Status] = None):
        index, done = Request.Testany(requests, status)
        return index, done, (requests[index]._result if done and index != UNDEFINED else None)

    @staticmethod
    def Waitany(requests: Sequence["Request"], status: Optional[Status] = None) -> int:
        """Index of a request that completed (UNDEFINED for an empty list)."""
        requests = list(requests)
        if not requests:
            return UNDEFINED
        Request._wait_some(requests, lambda: any(r._ready() for r in requests))
        index = next(i for i, r in enumerate(requests) if r._ready())
        requests[index]._complete(status)
        return index

    @staticmethod
    def waitany(requests: Sequence["Request"], status: Optional[Status] = None) -> tuple[int, Any]:
        index = Request.Waitany(requests, status)
        return index, (requests[index]._result if index != UNDEFINED else None)

    @staticmethod
    def Testany(requests: Sequence["Request"], status: Optional[Status] = None) -> tuple[int, bool]:
        requests = list(requests)
        for r in requests:
            if r._network is not None:
                _progress(r._network)
                break
        for i, r in enumerate(requests):
            if r._ready():
                r._complete(status)
                return i, True
        return UNDEFINED, False


REQUEST_NULL = Request()
REQUEST_NULL._done = True


class Prequest(Request):
    """A persistent request (Send_init, Recv_init...): Start() begins the
    operation again each time; Wait/Test complete the current one."""

    def __init__(self, start: Callable[[], Request]):
        super().__init__()
        self._persistent = start
        self._done = True
        self._current: Optional[Request] = None

    def Start(self) -> None:
        self._current = self._persistent()
        self._network = self._current._network

    @staticmethod
    def Startall(requests: Sequence["Prequest"]) -> None:
        for r in requests:
            r.Start()

    def _ready(self) -> bool:
        return self._current is None or self._current._ready()

    def _requests(self) -> list:
        return [] if self._current is None else self._current._requests()

    def _complete(self, status: Optional[Status]) -> None:
        cur, self._current = self._current, None
        if cur is None:
            if status is not None:
                status._set(ANY_SOURCE, ANY_TAG, 0)
            return
        cur._complete(status)
        self._result = cur._result

    def Wait(self, status: Optional[Status] = None) -> bool:
        if self._current is not None:
            self._current.Wait(status)
            self._current = None
        return True

    def Test(self, status: Optional[Status] = None) -> bool:
        if self._current is not None and not self._current.Test(status):
            return False
        self._current = None
        return True

    def Cancel(self) -> None:
        if self._current is not None:
            self._current.Cancel()

    def Free(self) -> None:
        self._persistent, self._current = None, None

    def __bool__(self) -> bool:
        return self._persistent is not None


def _done_request(status=None) -> Request:
    req = Request(status=status)
    req._done = True
    return req
