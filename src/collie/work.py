"""Work: the handle an asynchronous call returns (isend, irecv, async_op=True)."""

from __future__ import annotations

from typing import Callable, Optional

from .rendezvous import timeout_seconds


class Work:
    """A call in flight. ``wait()`` blocks until it completes and raises its
    error if it failed; ``is_completed()`` never blocks.

    ``requests`` are the transport requests the call posted; ``on_done`` runs
    once after they all complete (to copy results back, unpickle objects...);
    ``keep`` holds buffers alive while the transports may still touch them.
    """

    def __init__(self, network, requests, describe: Callable[[], str],
                 on_done: Optional[Callable[[], object]] = None, keep=None, timeout: Optional[float] = None):
        self._network = network
        self._requests = list(requests)
        self._describe = describe
        self._on_done = on_done
        self._keep = keep
        self._timeout = timeout
        self._finished = False
        self._error: Optional[BaseException] = None
        self._result = None

    def wait(self, timeout=None) -> bool:
        """Block until complete; True on success, raises on failure.
        ``timeout`` (a timedelta or seconds) bounds this wait; None, or
        zero as torch's default ``timedelta(0)``, leaves the call's own."""
        timeout = wait_seconds(timeout, self._timeout)  # a bad one is refused even once it is done
        if not self._finished:
            try:
                self._network.wait(self._requests, timeout=timeout, describe=self._describe)
                if self._on_done is not None:
                    self._result = self._on_done()
            except BaseException as exc:
                self._error = exc
                self._finished = True
                self._keep = None
                raise
            self._finished = True
            self._keep = None
        if self._error is not None:
            raise self._error
        return True

    def is_completed(self) -> bool:
        """True once the call has finished (successfully or not). Advances
        the transports a little, so that polling alone makes progress."""
        if self._finished:
            return True
        if self._network.poll(self._requests):
            try:
                self.wait()
            except BaseException:
                pass
            return True
        return False

    def is_success(self) -> bool:
        return self._finished and self._error is None

    def exception(self) -> Optional[BaseException]:
        return self._error

    def result(self):
        """What the call produced (a recv's source rank, for instance)."""
        self.wait()
        return self._result


class CompletedWork(Work):
    """A call that finished before it returned (nothing to communicate)."""

    # Made on the hot path of calls that finish at once: the state is the
    # class's (the compiled core's entries make them without __init__).
    _network, _requests, _on_done, _keep, _timeout, _finished, _error, _result = \
        None, (), None, None, None, True, None, None

    def __init__(self, result=None):
        self._result = result

    def wait(self, timeout=None) -> bool:
        if timeout is not None:
            wait_seconds(timeout, None)  # a bad one is refused, as Work.wait does
        return True

    def _describe(self) -> str:
        return "a completed call"


def wait_seconds(timeout, own: Optional[float]) -> Optional[float]:
    """How long a Work.wait(timeout) waits: the given timeout, or the call's
    ``own`` for None and for zero, which torch's Work.wait means as "no
    timeout of its own" (its default is timedelta(0))."""
    if timeout is None:
        return own
    seconds = timeout_seconds(timeout, "Work.wait")
    return own if seconds == 0 else seconds
