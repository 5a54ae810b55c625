"""Requests: nonblocking operations, persistent and generalized ones.

A request is *active* from the call that starts it until a Wait/Test (or
Free) completes it; then it is inactive and compares equal to REQUEST_NULL.
Waiting on an inactive request returns at once with an empty status. Copies
(``MPI.Request(req)``, ``fromhandle``) are the same request: they share its
state.
"""

from __future__ import annotations

import itertools
import sys
import traceback
import weakref
from typing import Any, Callable, Optional, Sequence
from .constants import ANY_SOURCE, ANY_TAG, SUCCESS, UNDEFINED
from .p2p import (_Message, _Recv, _progress, _wait_until, core_complete, core_complete_all, core_envelope,
                  core_recv)
from .pickling import pickle as _pickle
from .status import Status

__all__ = ["Request", "REQUEST_NULL", "Prequest", "Grequest"]


from ... import core
from ...errors import CollieError
from .exceptions import ERR_OTHER, ERR_REQUEST, ERR_TRUNCATE, Exception as _MPIException, _as_mpi_error, _error


_EMPTY = (ANY_SOURCE, ANY_TAG, 0, False)  # the status of an inactive request
_WAIT = object()  # Request._at_once did not complete the request: the general path does
_handles = itertools.count(1)
_by_handle: "weakref.WeakValueDictionary[int, Request]" = weakref.WeakValueDictionary()


def _fill(status: Optional[Status], fields: Optional[tuple]) -> None:
    if status is not None:
        status._set(*(fields or _EMPTY))
        status.error = SUCCESS


# ---- requests ----

class _Fields:
    """What a request starts with, where the compiled core is not built:
    its RequestFields keeps these fields in C instead, where its waits read
    them (copies then share them through _adopt; here the shared __dict__
    carries them)."""

    _network = None
    _timeout = 300.0
    _sends: tuple = ()
    _recv: Optional[_Recv] = None
    _matcher = _work = _keep = _after = None
    _sync = None  # what a synchronous send waits to see matched (a local message or a _SyncSend)
    _cancelled = False
    _pulled = False  # a wait asked the core for its receive (_at_once): the core's spin is made once
    _error: Optional[BaseException] = None
    _result = None
    _done = False  # (__init__ sets it: an inactive request is one made with nothing to do)
    _status = None  # (source, tag, nbytes, cancelled) once known

    def _adopt(self, original: "_Fields") -> None:
        pass

    # (RequestFields makes the core's first look in C, then calls these _Wait and _wait.)
    def Wait(self, status: Optional[Status] = None) -> bool:
        return self._Wait(status, None)

    def wait(self, status: Optional[Status] = None) -> Any:
        return self._wait(status, None)


_Base = core._core.RequestFields if core._core is not None else _Fields
_new = _Base.__new__


class Request(_Base):
    """A nonblocking operation: Isend/Irecv, isend/irecv, Ibcast...

    Wait()/Test() follow mpi4py; wait()/test() also return the received
    object of an irecv (None for the others). ``Request(req)`` is the same
    request as ``req``; ``Request()`` is an inactive one (REQUEST_NULL).
    """

    def __new__(cls, *args, **kwargs):
        # subclasses may call super().__new__(cls, request), as mpi4py allows
        return _new(cls)  # (not super(): a request is made per message)

    # What a request starts with is _Base's (the fields' defaults); __init__
    # sets only the rest (a fifth of a small irecv's time was making its request).

    def _describe(self) -> str:
        """What the request waits for, for its errors: a receive's, from its
        books (so that making one needs no description); a request made
        with ``describe`` says it instead."""
        op, m = self._recv, self._matcher
        if op is None or m is None:
            return "MPI request"
        source = "any rank" if op.source == ANY_SOURCE else f"rank {op.source}"
        tag = "any tag" if op.tag == ANY_TAG else f"tag {op.tag}"
        return f"{'recv' if op.dst is None else 'Recv'} from {source} ({tag}) of {m.name}"

    def __init__(self, network=None, *, sends=(), recv: Optional[_Recv] = None, matcher=None, work=None,
                 keep=None, after=None, timeout: float = 300.0,
                 describe: Optional[Callable[[], str]] = None, status=None, sync=None):
        if network is not None:
            if isinstance(network, Request):  # the copy constructor: the same request
                _share(self, network)
                return
            if not hasattr(network, "progress"):
                raise TypeError(f"{type(self).__name__}() takes a Request to copy, got {type(network).__name__}")
        self._network, self._timeout = network, timeout
        if describe is not None:
            self._describe = describe
        if sends:
            self._sends = tuple(sends)
        if recv is not None:
            self._recv = recv
        if matcher is not None:
            self._matcher = matcher
        if work is not None:
            self._work = work
        if keep is not None or after is not None:
            self._keep, self._after = keep, after
        if sync is not None:
            self._sync = sync
        # A request made with nothing to do is inactive (REQUEST_NULL); see _done_request.
        self._done = network is None and not sends and recv is None and work is None and status is None
        self._status = status  # (source, tag, nbytes, cancelled) once known

    # ---- the state of one request ----

    def _active(self) -> bool:
        return not self._done

    def _requests(self) -> list:
        """The transport requests this one is waiting on."""
        if self._recv is not None and self._recv.msg is not None and self._recv.msg.req is not None:
            return [self._recv.msg.req]
        return list(self._sends)

    def _ready(self) -> bool:
        if self._done or self._cancelled:
            return True
        if self._work is not None:
            return self._work.is_completed()
        if self._recv is not None:
            return self._recv.ready()
        sent = not self._sends or all(r.finished for r in self._sends)  # (no generator for a send done at once)
        return sent and (self._sync is None or self._sync.matched)

    def _fields(self) -> Optional[tuple]:
        """The status of a ready request, before completing it (Get_status)."""
        if self._cancelled:
            return (ANY_SOURCE, ANY_TAG, 0, True)
        op = self._recv
        if op is not None:
            if op.cancelled:
                return (ANY_SOURCE, ANY_TAG, 0, True)
            if op.msg is not None:
                return (op.msg.source, op.msg.tag, op.msg.nbytes, False)
        return self._status

    def _complete(self, status: Optional[Status]) -> None:
        """Finish the operation (once), fill ``status`` and make the request
        inactive; an inactive request gives an empty status."""
        if self._done:
            _fill(status, None)
            return
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
        _fill(status, self._status)

    def _finish(self) -> None:
        if self._cancelled:
            self._status = (ANY_SOURCE, ANY_TAG, 0, True)
        elif self._work is not None:
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
            if op.dst is None:  # an object; an empty message is None, as in mpi4py
                self._result = _pickle.loads(msg.data) if msg.nbytes else None
            elif msg.data is not None:
                dst = op.bytes()
                if msg.nbytes > len(dst):
                    raise _error(ERR_TRUNCATE, f"rank {self._network.rank}: {self._describe()}: message truncated: "
                                      f"rank {msg.source} sent {msg.nbytes} bytes (tag {msg.tag}) but the "
                                      f"receive buffer holds {len(dst)}")
                dst[:msg.nbytes] = msg.data
        if self._after is not None:
            self._after()

    def _take_result(self, was_active: bool) -> Any:
        return self._result if was_active else None

    # ---- one request ----

    def _at_once(self, status: Optional[Status]) -> Any:
        """The first thing a wait does, where the compiled core's first look
        (p2p.core_complete, which the waits call themselves: a frame less)
        left the request to Python. A receive still waiting for its
        message, the first time: where it is its communicator's only posted
        receive, the compiled core receives it as a blocking receive would
        (p2p.core_recv; any source only on an intracommunicator, whose every
        rank is one), else the core takes its source's next envelope for the
        matcher (p2p.core_envelope). Then a plain request (the class itself,
        nothing to run after) whose operation needs no more waiting completes
        here: a receive the core took, or a send with nothing in flight (done
        at once, or to PROC_NULL), in a few calls where the general path
        makes a dozen. Returns what wait() returns, or _WAIT where the
        general path must complete the request. The core does all of it for
        a request of the class itself."""
        if self._done:
            return _WAIT
        op = self._recv
        if op is None:
            if self._sends or self._work is not None or self._sync is not None or self.__class__ is not Request \
                    or self._after is not None:
                return _WAIT
        elif op.msg is None and op.error is None and not op.cancelled and not self._pulled \
                and self._matcher is not None:
            m = self._matcher
            got = _core_receive(op, m)
            if not got:
                self._pulled = True
                if got is False:
                    core_envelope(m, op.source)
                return _WAIT
            if self.__class__ is not Request or self._after is not None:  # in: the general path completes it
                (source, tag, nbytes, _), payload = got
                op.msg = _Message(source, tag, nbytes, payload)
                m._matched(op.msg)  # (a standard send's, the only kind the core takes: nothing to ack)
                return _WAIT
            self._status, payload = got
            if op.dst is None:  # an object; an empty message is None, as in mpi4py
                self._result = _pickle.loads(payload) if payload else None
        else:
            return _WAIT
        self._done, self._keep = True, None
        if status is not None:
            _fill(status, self._status)
        return self._result

    # Wait and wait are _Base's: the compiled core's first look (p2p.core_complete),
    # then where it did not complete the request (or a status is asked for) these.

    def _Wait(self, status: Optional[Status], done: Optional[bool]) -> bool:
        """Wait's rest, after the core's look said ``done`` (None: it did not
        look, or left the first look to _at_once; False: the general path)."""
        if done is None and status is not None:
            done = core_complete(self, _pickle.loads)
        if done or (done is None and self._at_once(status) is not _WAIT):
            if done and status is not None:
                _fill(status, self._status)
            return True
        # An asynchronous collective blocks in its own wait (in _finish).
        if not self._done and self._work is None and not self._ready():
            _wait_until(self._ready, self._network, self._timeout, self._describe, self._requests)
        self._complete(status)
        return True

    def Test(self, status: Optional[Status] = None) -> bool:
        if self._network is not None and self._active():
            _progress(self._network)
        if not self._ready():
            return False
        self._complete(status)
        return True

    def _wait(self, status: Optional[Status], done: Optional[bool]) -> Any:
        """wait's rest, as _Wait is Wait's."""
        if done is None and status is not None:
            done = core_complete(self, _pickle.loads)
        if done:
            if status is not None:
                _fill(status, self._status)
            return self._result
        got = _WAIT if done is False else self._at_once(status)
        if got is not _WAIT:
            return got
        was_active = self._active()
        self.Wait(status)  # (a subclass's own Wait, where it has one)
        return self._take_result(was_active)

    def test(self, status: Optional[Status] = None) -> tuple[bool, Any]:
        was_active = self._active()
        done = self.Test(status)
        return done, (self._take_result(was_active) if done else None)

    def Get_status(self, status: Optional[Status] = None) -> bool:
        """Whether the operation is complete, without completing it."""
        if not self._active():
            _fill(status, None)
            return True
        if self._network is not None:
            _progress(self._network)
        if not self._ready():
            return False
        _fill(status, self._fields())
        return True

    get_status = Get_status

    def Cancel(self) -> None:
        """Cancel a receive that no message has matched yet, or a synchronous
        send to oneself that no receive has taken yet."""
        if not self:
            raise _error(ERR_REQUEST, "Cancel: the request is MPI.REQUEST_NULL (or already completed)")
        if self._recv is not None and self._matcher is not None:
            self._matcher.cancel(self._recv)
        elif self._sync is not None and self._matcher is not None and not self._done:
            self._cancelled = self._matcher.withdraw(self._sync)

    def Free(self) -> None:
        """Let the operation complete on its own; this handle becomes REQUEST_NULL."""
        if not self:
            raise _error(ERR_REQUEST, "Free: the request is MPI.REQUEST_NULL (or already completed)")
        self._done = True

    def free(self) -> None:
        """mpi4py's safe free: nothing on a null (or completed) request."""
        if self:
            self.Free()

    cancel = Cancel

    # ---- handles ----

    def __bool__(self) -> bool:
        """False for MPI.REQUEST_NULL and for a request that completed (MPI
        sets a completed request's handle to MPI_REQUEST_NULL)."""
        return self._active()

    def __eq__(self, other) -> bool:
        if not isinstance(other, Request):
            return NotImplemented
        return self.__dict__ is other.__dict__ or (not self and not other)

    def __ne__(self, other) -> bool:
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    __hash__ = None  # unhashable, as mpi4py's handles are

    def __reduce__(self):
        if self:
            raise ValueError(f"cannot pickle an active {type(self).__name__}")
        return "REQUEST_NULL" if self is REQUEST_NULL else (type(self), ())

    @property
    def handle(self) -> int:
        """An integer naming this request (0 for an inactive one) in this process."""
        if not self:
            return 0
        if "_handle" not in self.__dict__:
            self._handle = next(_handles)
            _by_handle[self._handle] = self
        return self._handle

    def toint(self) -> int:
        return self.handle

    py2f = toint

    @classmethod
    def fromhandle(cls, handle: int) -> "Request":
        if handle == 0:
            return cls()
        try:
            return cls(_by_handle[handle])
        except KeyError:
            raise ValueError(f"{cls.__name__}.fromhandle: no request has handle {handle}") from None

    fromint = fromhandle
    f2py = fromhandle

    # ---- on many requests ----

    @staticmethod
    def _wait_some(requests: Sequence["Request"], ready: Callable[[], bool]) -> None:
        live = [r for r in requests if r._network is not None and r._active()]
        if live and not ready():
            _wait_until(ready, live[0]._network, max(r._timeout for r in live),
                        lambda: f"waiting for {len(requests)} MPI requests",
                        lambda: [q for r in live for q in r._requests()])

    @staticmethod
    def _progress_any(requests: Sequence["Request"]) -> None:
        for r in requests:
            if r._network is not None and r._active():
                _progress(r._network)
                return

    @staticmethod
    def _statuses(statuses, n: int):
        """The status for each of n requests (a list given too short grows, as in mpi4py)."""
        if statuses is None:
            return [None] * n
        if isinstance(statuses, list) and len(statuses) < n:
            statuses += [Status() for _ in range(n - len(statuses))]
        return [statuses[i] if i < len(statuses) else None for i in range(n)]

    @staticmethod
    def _all(requests: list, statuses: Optional[list], results: Optional[list] = None) -> None:
        """Waitall's body: each request the short way (_at_once), then the
        rest together. With ``results``, each active request's wait() result
        goes to its place there (waitall's list)."""
        n = len(requests)
        sts = [None] * n if statuses is None else Request._statuses(statuses, n)
        # The core looks first (p2p.core_complete_all): those it left, _at_once looks at;
        # waiting: the indices of those the short way could not complete.
        looks, waiting = core_complete_all(requests, _pickle.loads, results, sts, _fill)
        Request._rest(requests, sts, looks, waiting, results)

    @staticmethod
    def _rest(requests: list, sts: list, looks: list, waiting: list, results: Optional[list]) -> None:
        """What _all does after the core's look (and the core's Waitall
        and waitall, where the look left requests): those at ``looks`` the
        short way, then those at ``waiting`` (and those the short way left)
        in the general path's wait."""
        for i in looks:
            got = requests[i]._at_once(sts[i])
            if got is _WAIT:
                waiting.append(i)
            elif results is not None:
                results[i] = got
        if waiting:
            waiting.sort()  # (completed in the list's order, as a loop over it would)
            rest = [requests[i] for i in waiting]
            active = [r._active() for r in rest]
            Request._wait_some(rest, lambda: all(r._work is not None or r._ready() for r in rest))
            for i, r, was_active in zip(waiting, rest, active):
                r._complete(sts[i])  # an asynchronous collective blocks here, in its own wait
                if results is not None:
                    results[i] = r._take_result(was_active)

    @staticmethod
    def Waitall(requests: Sequence["Request"], statuses: Optional[list] = None) -> bool:
        Request._all(list(requests), statuses)
        return True

    @staticmethod
    def waitall(requests: Sequence["Request"], statuses: Optional[list] = None) -> list:
        requests = list(requests)
        results = [None] * len(requests)
        Request._all(requests, statuses, results)
        return results

    @staticmethod
    def Testall(requests: Sequence["Request"], statuses: Optional[list] = None) -> bool:
        requests = list(requests)
        Request._progress_any(requests)
        if not all(r._ready() for r in requests):
            return False
        Request.Waitall(requests, statuses)
        return True

    @staticmethod
    def testall(requests: Sequence["Request"], statuses: Optional[list] = None) -> tuple[bool, Optional[list]]:
        requests = list(requests)
        active = [r._active() for r in requests]
        done = Request.Testall(requests, statuses)
        return done, ([r._take_result(a) for r, a in zip(requests, active)] if done else None)

    @staticmethod
    def Get_status_all(requests: Sequence["Request"], statuses: Optional[list] = None) -> bool:
        requests = list(requests)
        Request._progress_any(requests)
        if not all(r._ready() for r in requests):
            return False
        for r, st in zip(requests, Request._statuses(statuses, len(requests))):
            r.Get_status(st)
        return True

    get_status_all = Get_status_all

    @staticmethod
    def Waitsome(requests: Sequence["Request"], statuses: Optional[list] = None) -> Optional[list]:
        """Indices of the requests that completed, at least one (None when
        every request is inactive)."""
        requests = list(requests)
        live = [i for i, r in enumerate(requests) if r._active()]
        if not live:
            return None
        Request._wait_some(requests, lambda: any(requests[i]._ready() for i in live))
        return Request._take(requests, live, statuses)

    @staticmethod
    def Testsome(requests: Sequence["Request"], statuses: Optional[list] = None) -> Optional[list]:
        requests = list(requests)
        live = [i for i, r in enumerate(requests) if r._active()]
        if not live:
            return None
        Request._progress_any(requests)
        return Request._take(requests, live, statuses)

    @staticmethod
    def Get_status_some(requests: Sequence["Request"], statuses: Optional[list] = None) -> Optional[list]:
        requests = list(requests)
        live = [i for i, r in enumerate(requests) if r._active()]
        if not live:
            return None
        Request._progress_any(requests)
        done = [i for i in live if requests[i]._ready()]
        for i, st in zip(done, Request._statuses(statuses, len(done))):
            requests[i].Get_status(st)
        return done

    get_status_some = Get_status_some

    @staticmethod
    def _take(requests, live, statuses) -> list:
        done = [i for i in live if requests[i]._ready()]
        for i, st in zip(done, Request._statuses(statuses, len(done))):
            requests[i]._complete(st)
        return done

    @staticmethod
    def waitsome(requests: Sequence["Request"], statuses: Optional[list] = None):
        requests = list(requests)
        done = Request.Waitsome(requests, statuses)
        return (None, None) if done is None else (done, [requests[i]._result for i in done])

    @staticmethod
    def testsome(requests: Sequence["Request"], statuses: Optional[list] = None):
        requests = list(requests)
        done = Request.Testsome(requests, statuses)
        return (None, None) if done is None else (done, [requests[i]._result for i in done])

    @staticmethod
    def Waitany(requests: Sequence["Request"], status: Optional[Status] = None) -> int:
        """Index of a request that completed (UNDEFINED when none is active)."""
        requests = list(requests)
        live = [r for r in requests if r._active()]
        if not live:
            _fill(status, None)
            return UNDEFINED
        Request._wait_some(requests, lambda: any(r._ready() for r in live))
        index = next(i for i, r in enumerate(requests) if r._active() and r._ready())
        requests[index]._complete(status)
        return index

    @staticmethod
    def waitany(requests: Sequence["Request"], status: Optional[Status] = None) -> tuple[int, Any]:
        requests = list(requests)
        index = Request.Waitany(requests, status)
        return index, (requests[index]._result if index != UNDEFINED else None)

    @staticmethod
    def _first_ready(requests, status: Optional[Status], take) -> tuple[int, bool]:
        """Testany's search: (index, True) after ``take`` on the first active
        request that is done; (UNDEFINED, True) when none is active;
        (UNDEFINED, False) when none is done yet."""
        requests = list(requests)
        if not any(r._active() for r in requests):
            _fill(status, None)
            return UNDEFINED, True
        Request._progress_any(requests)
        for i, r in enumerate(requests):
            if r._active() and r._ready():
                take(r)
                return i, True
        return UNDEFINED, False

    @staticmethod
    def Testany(requests: Sequence["Request"], status: Optional[Status] = None) -> tuple[int, bool]:
        """(index, True) for a request that completed; (UNDEFINED, True) when
        none is active; (UNDEFINED, False) when none is done yet."""
        return Request._first_ready(requests, status, lambda r: r._complete(status))

    @staticmethod
    def testany(requests: Sequence["Request"], status: Optional[Status] = None):
        requests = list(requests)
        index, done = Request.Testany(requests, status)
        return index, done, (requests[index]._result if done and index != UNDEFINED else None)

    @staticmethod
    def Get_status_any(requests: Sequence["Request"], status: Optional[Status] = None) -> tuple[int, bool]:
        return Request._first_ready(requests, status, lambda r: r.Get_status(status))

    get_status_any = Get_status_any


def _share(new: Request, old: Request) -> bool:
    """Make ``new`` the same request as ``old`` (the copy constructors); False
    when ``new`` is to be a fresh null one instead (Prequest(REQUEST_NULL))."""
    kind = Prequest if isinstance(new, Prequest) else Grequest if isinstance(new, Grequest) else Request
    if not isinstance(old, kind):
        if not old and type(old) is Request:
            return False
        raise TypeError(f"{type(new).__name__}() cannot copy a {type(old).__name__}")
    new._adopt(old)
    new.__dict__ = old.__dict__
    return True


REQUEST_NULL = Request()


class Prequest(Request):
    """A persistent request (Send_init, Recv_init...): Start() begins the
    operation again each time; Wait/Test complete the current one. It is
    active between Start() and its completion."""

    def __init__(self, start=None):
        if isinstance(start, Request):
            if _share(self, start):
                return
            start = None
        super().__init__()
        self._persistent: Optional[Callable[[], Request]] = start
        self._current: Optional[Request] = None

    def Start(self) -> None:
        if self._persistent is None:
            raise _error(ERR_OTHER, "Start: the persistent request was freed")
        self._current = self._persistent()
        self._network = self._current._network

    start = Start

    @staticmethod
    def Startall(requests: Sequence["Prequest"]) -> None:
        for r in requests:
            r.Start()

    startall = Startall

    def _active(self) -> bool:
        return self._current is not None

    def _ready(self) -> bool:
        return self._current is None or self._current._ready()

    def _requests(self) -> list:
        return [] if self._current is None else self._current._requests()

    def _fields(self):
        return None if self._current is None else self._current._fields()

    def _complete(self, status: Optional[Status]) -> None:
        cur, self._current = self._current, None
        if cur is None:
            _fill(status, None)
            return
        cur._complete(status)
        self._result = cur._result

    def Wait(self, status: Optional[Status] = None) -> bool:
        cur, self._current = self._current, None
        if cur is None:
            _fill(status, None)
        else:
            cur.Wait(status)
            self._result = cur._result
        return True

    def Test(self, status: Optional[Status] = None) -> bool:
        if self._current is not None and not self._current._ready():
            _progress(self._network)
            if not self._current._ready():
                return False
        self._complete(status)
        return True

    def Cancel(self) -> None:
        if self._current is not None:
            self._current.Cancel()

    def Free(self) -> None:
        self._persistent, self._current = None, None

    def __bool__(self) -> bool:
        return self.__dict__.get("_persistent") is not None



class Grequest(Request):
    """A generalized request: the application says when its operation is
    done (Complete); query_fn fills the status, free_fn runs when the request
    completes, cancel_fn(completed) on Cancel. An exception in a callback
    prints its traceback and is raised as an MPI.Exception (its own error
    class for an MPI.Exception, ERR_OTHER otherwise)."""

    def __init__(self, request=None):
        if isinstance(request, Request):
            if _share(self, request):
                return
            request = None
        if request is not None:
            raise TypeError(f"Grequest() takes a Grequest to copy, got {type(request).__name__}")
        super().__init__()

    @classmethod
    def Start(cls, query_fn=None, free_fn=None, cancel_fn=None, args=None, kwargs=None) -> "Grequest":
        for name, fn in (("query_fn", query_fn), ("free_fn", free_fn), ("cancel_fn", cancel_fn)):
            if fn is not None and not callable(fn):
                raise TypeError(f"Grequest.Start: {name} must be callable or None, got {type(fn).__name__}")
        req = cls()
        req._done = False
        req._completed = False
        req._callbacks = (query_fn, free_fn, cancel_fn, tuple(args or ()), dict(kwargs or {}))
        return req

    start = Start

    def Complete(self) -> None:
        """The operation is done: Wait/Test may now complete the request."""
        self._completed = True

    def complete(self, obj: Any = None) -> None:
        """Complete, with ``obj`` as what wait()/test() return."""
        self._result = obj
        self.Complete()

    def _ready(self) -> bool:
        return self._done or self._completed

    def _fields(self):
        status = Status()
        self._call(0, status)
        return (status.source, status.tag, status.count, status.cancelled)

    def _call(self, which: int, *first):
        fn = self._callbacks[which]
        if fn is None:
            return
        *_, args, kwargs = self._callbacks
        try:
            fn(*first, *args, **kwargs)
        except BaseException as exc:
            traceback.print_exc(file=sys.stderr)
            code = exc.Get_error_class() if isinstance(exc, _MPIException) else ERR_OTHER
            raise _error(code, f"generalized request: {exc!r}") from exc

    def _finish(self) -> None:
        try:
            self._status = self._fields()
        finally:
            self._call(1)

    def Cancel(self) -> None:
        if not self._done:
            self._call(2, self._completed)


def _receive(network, op: _Recv, matcher, timeout: float, after=None, keep=None, pulled: bool = False) -> Request:
    """A receive's request (Comm._recv): as Request(network, recv=op, ...)
    makes it, without binding __init__'s keywords, which cost a small
    irecv a fifth of its time (the compiled core's p2p.core_irecv makes the
    same). ``pulled``: the core was asked for this receive already (a
    blocking call's own try): its wait does not ask again."""
    r = _new(Request)
    r._network, r._recv, r._matcher, r._timeout = network, op, matcher, timeout
    if after is not None or keep is not None:
        r._after, r._keep = after, keep
    if pulled:
        r._pulled = True
    return r


def _done_request(status=None) -> Request:
    """A request whose operation has nothing left to do (to or from
    PROC_NULL, or a send done at once): active until a Wait or Test
    completes it, as in MPI. (Request(status=...) without __init__'s
    keywords: a small isend makes one per call.)"""
    r = _new(Request)
    if status is not None:  # (None, the class's: an empty one)
        r._status = status
    return r


if core._core is not None:  # p2p.core_isend and core_irecv make their Requests as the two above do
    core._core.set_request_types(_Recv, Request, _Message)
    # Waitall and waitall in C: the core's look at every request without
    # their two Python frames; what it leaves is _rest's, with statuses _all's.
    core._core.set_waitall(Request._all, Request._rest, _pickle)
    Request.Waitall = staticmethod(core._core.Waitall)
    Request.waitall = staticmethod(core._core.waitall)


def _core_receive(op: _Recv, m) -> Any:
    """Have the compiled core receive ``op`` as a blocking receive would
    (p2p.core_recv) where it is its communicator's only posted receive (of
    any source only on an intracommunicator, whose every rank is one):
    ((source, tag, nbytes, cancelled), payload), None if the core could
    not (``op`` stays posted: an envelope the core left with the matcher
    meets it as progress would), False where it may not try."""
    posted = m.posted
    if len(posted) != 1 or posted[0] is not op or (op.source < 0 and m.inter):
        return False
    posted.pop()
    got = None
    try:
        got = core_recv(m, m.group, op.dst, op.source, op.tag)
    finally:
        if got is None:
            m.post(op)
    return got


# ---- partitioned point to point (Psend_init / Precv_init) ----

class _Partitioned(Prequest):
    """A partitioned send or receive. The whole buffer travels as one
    message: a send posts it once every partition is marked ready (Pready);
    a receive's partitions all arrive when that message has. MPI allows this
    (a transfer may wait for the last partition); it forgoes the overlap
    that sending partitions early would give."""

    def __init__(self, post: Callable[[], Request], partitions: int, sending: bool):
        import operator
        partitions = operator.index(partitions)
        if partitions < 1:
            raise ValueError(f"partitions must be >= 1, got {partitions}")
        super().__init__(self._begin if sending else post)
        self._post, self._partitions, self._sending = post, partitions, sending
        self._marked: set = set()

    def _begin(self) -> Request:
        self._marked = set()
        waiting = Grequest.Start()  # completes when the application has marked every partition
        return waiting

    def _partition(self, i, what: str) -> int:
        import operator
        i = operator.index(i)
        if not 0 <= i < self._partitions:
            raise _error(ERR_OTHER, f"{what}: partition {i} is not in [0, {self._partitions})")
        if self._current is None:
            raise _error(ERR_OTHER, f"{what}: the request is not started")
        return i

    def Pready(self, partition: int) -> None:
        """Partition ``partition`` of the send buffer may be sent."""
        self.Pready_list([partition])

    def Pready_range(self, partition_low: int, partition_high: int) -> None:
        self.Pready_list(range(partition_low, partition_high + 1))

    def Pready_list(self, partitions) -> None:
        if not self._sending:
            raise _error(ERR_OTHER, "Pready: the request is a partitioned receive")
        self._marked.update(self._partition(i, "Pready") for i in partitions)
        if len(self._marked) == self._partitions and isinstance(self._current, Grequest):
            self._current = self._post()
            self._network = self._current._network

    def Parrived(self, partition: int) -> bool:
        """Whether partition ``partition`` of the receive buffer has arrived."""
        if self._sending:
            raise _error(ERR_OTHER, "Parrived: the request is a partitioned send")
        if self._current is None:
            return True
        self._partition(partition, "Parrived")
        if self._network is not None:
            _progress(self._network)
        return self._current._ready()

    def Wait(self, status: Optional[Status] = None) -> bool:
        if isinstance(self._current, Grequest):
            raise _error(ERR_OTHER, f"Wait: partitions {sorted(set(range(self._partitions)) - self._marked)} "
                                    "of the partitioned send were never marked ready (Pready)")
        return super().Wait(status)

    def Test(self, status: Optional[Status] = None) -> bool:
        if isinstance(self._current, Grequest):
            return False
        return super().Test(status)
