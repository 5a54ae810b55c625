"""The environment: Init, Finalize, COMM_WORLD and COMM_SELF."""

from __future__ import annotations

import os
import socket
import threading
import time
from .comm import Intracomm
from .constants import THREAD_MULTIPLE, THREAD_SERIALIZED

__all__ = ["Init", "Init_thread", "Query_thread", "Is_thread_main", "Finalize", "Is_initialized", "Is_finalized", "Wtime", "Wtick", "Get_processor_name", "Get_version", "Get_library_version"]


from ... import group as _group
from ...errors import CollieError
from ...group import ProcessGroup


# ---- the environment ----

_cache: dict = {}          # "world"/"self" -> communicator of the current world
_finalized = False
_LAUNCH_VARS = ("RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def Init() -> None:
    """Join the world if nobody did yet: env:// under a launcher (collie
    run, torchrun, mpiexec, srun), else a world of this process alone."""
    if _group.is_initialized():
        return
    if _finalized:
        raise CollieError("MPI.Finalize() was called: MPI cannot be initialized again")
    if any(os.environ.get(v) for v in _LAUNCH_VARS):
        _group.init_process_group()
    else:
        _group.init_process_group(init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)


def Init_thread(required: int = THREAD_MULTIPLE) -> int:
    """Init(); at most THREAD_SERIALIZED: calls from several threads must not overlap."""
    Init()
    return min(required, THREAD_SERIALIZED)


def Query_thread() -> int:
    return THREAD_SERIALIZED


def Is_thread_main() -> bool:
    return threading.current_thread() is threading.main_thread()


def Finalize() -> None:
    """Leave the world (collie.destroy_process_group)."""
    global _finalized
    _group.destroy_process_group()
    _cache.clear()
    _finalized = True


def Is_initialized() -> bool:
    return _group.is_initialized()


def Is_finalized() -> bool:
    return _finalized and not _group.is_initialized()


def Wtime() -> float:
    """Seconds since an arbitrary point in the past (a monotonic clock)."""
    return time.perf_counter()


def Wtick() -> float:
    return time.get_clock_info("perf_counter").resolution


def Get_processor_name() -> str:
    return socket.gethostname()


def Get_version() -> tuple[int, int]:
    return 3, 1


def Get_library_version() -> str:
    from .. import __version__
    return f"collie {__version__} (mpi4py-style API)"


def _comm(which: str) -> Intracomm:
    Init()
    world = _group.world().group
    comm = _cache.get(which)
    if comm is None or comm._owner is not world:
        if which == "world":
            comm = Intracomm(world, "MPI_COMM_WORLD")
        else:
            # Only this rank: nothing ever leaves the process (messages to
            # oneself are delivered locally, collectives of one rank copy).
            me = ProcessGroup(world.network, [world.network.rank], _group.SELF_CONTEXT, world.timeout,
                              "MPI_COMM_SELF")
            comm = Intracomm(me, "MPI_COMM_SELF")
        comm._owner = world
        _cache[which] = comm
    return comm
