"""torch's key-value stores seen as collie stores.

collie meets its peers through a ``collie.rendezvous.Store``. Under torch the
store already exists: torch made it for ``init_process_group`` (a
``PrefixStore`` around its TCPStore), or torchrun's agent serves it. This
adapter lets collie use any ``torch.distributed.Store`` without a second one.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Iterable

from ..errors import CollieError, CollieTimeout
from ..rendezvous import Store, _seconds


class TorchStore(Store):
    """A ``torch.distributed.Store`` behind collie's Store interface.

    torch raises ``DistStoreError`` (a RuntimeError) when a wait times out;
    collie's callers expect ``CollieTimeout``, which this raises instead.
    """

    def __init__(self, store, timeout: float | None = None):
        self.store = store
        try:
            own = store.timeout.total_seconds()
        except Exception:  # noqa: BLE001 - a store without a readable timeout
            own = 300.0
        self.timeout = own if timeout is None else timeout

    def __repr__(self) -> str:
        return f"TorchStore({self.store!r})"

    @property
    def host(self):
        """The host serving the store (a TCPStore's, under any PrefixStores),
        or None: where rank 0 is, so the ranks know which interface to use."""
        store = self.store
        while store is not None and not hasattr(store, "host"):
            store = getattr(store, "underlying_store", None)
        return getattr(store, "host", None)

    def _wait(self, keys: list, timeout) -> None:
        seconds = _seconds(timeout, self.timeout)
        import torch.distributed as dist
        try:
            self.store.wait(keys, timedelta(seconds=seconds))
        except dist.DistStoreError as exc:
            raise CollieTimeout(f"store: keys {keys} were not set within {seconds:g}s ({exc})") from None
        except RuntimeError as exc:  # torch's store says "timeout" in several ways
            if "timeout" in str(exc).lower() or "timed out" in str(exc).lower():
                raise CollieTimeout(f"store: keys {keys} were not set within {seconds:g}s ({exc})") from None
            raise CollieError(f"store: waiting for {keys} failed: {exc}") from None

    def set(self, key: str, value) -> None:
        self.store.set(key, bytes(value) if isinstance(value, (bytearray, memoryview)) else value)

    def get(self, key: str, timeout=None) -> bytes:
        self._wait([key], timeout)
        return bytes(self.store.get(key))

    def wait(self, keys: Iterable[str], timeout=None) -> None:
        self._wait([keys] if isinstance(keys, str) else list(keys), timeout)

    def add(self, key: str, amount: int = 1) -> int:
        return int(self.store.add(key, amount))

    def compare_set(self, key: str, expected, desired) -> bytes:
        return bytes(self.store.compare_set(key, expected, desired))

    def delete(self, key: str) -> bool:
        return bool(self.store.delete_key(key))

    def check(self, keys: Iterable[str]) -> bool:
        return bool(self.store.check([keys] if isinstance(keys, str) else list(keys)))

    def num_keys(self) -> int:
        return int(self.store.num_keys())

    def close(self) -> None:
        """torch owns its store: closing the adapter leaves it open."""


def uses_agent_store(environ=os.environ) -> bool:
    """Whether torchrun's agent serves the job's store (torch 2.x sets
    TORCHELASTIC_USE_AGENT_STORE=True for the workers it starts)."""
    return environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"


def agent_store(timeout: float, environ=os.environ) -> TorchStore:
    """A client of the store torchrun's agent serves at MASTER_ADDR:MASTER_PORT,
    through torch's own TCPStore (as torch's env:// does under torchrun).
    The keys go under a prefix of the restart attempt, so that a restarted
    job never reads what an earlier attempt left."""
    import torch.distributed as dist
    try:
        host = environ["MASTER_ADDR"]
        port = int(environ["MASTER_PORT"])
        world_size = int(environ["WORLD_SIZE"])
    except (KeyError, ValueError) as exc:
        raise ValueError(f"TORCHELASTIC_USE_AGENT_STORE is set but {exc} is missing or bad: "
                         "torchrun sets MASTER_ADDR, MASTER_PORT and WORLD_SIZE") from None
    client = dist.TCPStore(host, port, world_size, is_master=False, timeout=timedelta(seconds=timeout))
    attempt = environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return TorchStore(dist.PrefixStore(f"collie/attempt_{attempt}/", client), timeout)
