"""collie: collective communication for Python processes.

The public API follows torch.distributed: names, signatures, semantics.

    import collie as dist
    dist.init_process_group()            # under `collie run -n 4 script.py`
    x = np.arange(4.0) * dist.get_rank()
    dist.all_reduce(x)                   # every rank now holds the sum

See README.md for the tour and docs/ for the details.
"""

from . import errors
from .errors import AbortedError, AuthError, CollieError, CollieTimeout, MismatchError, PeerError
from .group import (Backend, ProcessGroup, destroy_process_group, get_backend, get_global_rank,
                    get_group_rank, get_node_local_rank, get_process_group_ranks, get_rank,
                    get_topology, get_world_size, init_process_group, is_available, is_backend_available,
                    is_gloo_available, is_initialized, is_mpi_available, is_nccl_available,
                    is_torchelastic_launched, new_group, new_subgroups, new_subgroups_by_enumeration)
from . import group
from .mesh import DeviceMesh, init_device_mesh
from .p2p import (P2POp, batch_isend_irecv, irecv, isend, recv, recv_object_list, send,
                  send_object_list)
from .work import Work
from .rendezvous import FileStore, Store, TCPStore
from .ops import ReduceOp
from .collectives import (all_gather, all_gather_into_tensor, all_gather_single, all_reduce, all_to_all,
                          all_to_all_single, barrier, broadcast, gather, monitored_barrier, reduce,
                          reduce_scatter, reduce_scatter_single, reduce_scatter_tensor, scatter)
from .objects import all_gather_object, broadcast_object_list, gather_object, scatter_object_list
from .tracing import trace
from .core import config
from .registered import empty
from . import tracing as _tracing
_tracing.install(_tracing.from_environment())  # COLLIE_TRACE=DIR: trace every call

__version__ = "0.1.0"

__all__ = [
    # setup
    "init_process_group", "destroy_process_group", "is_initialized", "get_rank", "get_world_size",
    "new_group", "new_subgroups", "new_subgroups_by_enumeration", "get_process_group_ranks",
    "get_group_rank", "get_global_rank", "get_node_local_rank", "get_topology", "ProcessGroup", "group", "Backend",
    "get_backend", "is_available", "is_backend_available", "is_gloo_available", "is_nccl_available",
    "is_mpi_available", "is_torchelastic_launched", "DeviceMesh", "init_device_mesh", "spawn", "Store",
    "TCPStore", "FileStore",
    # point to point
    "send", "recv", "isend", "irecv", "P2POp", "batch_isend_irecv", "send_object_list",
    "recv_object_list", "Work",
    # collectives
    "ReduceOp", "broadcast", "all_reduce", "reduce", "all_gather", "all_gather_into_tensor",
    "all_gather_single", "gather", "scatter", "reduce_scatter", "reduce_scatter_tensor",
    "reduce_scatter_single", "all_to_all", "all_to_all_single", "barrier",
    "monitored_barrier",
    "broadcast_object_list", "all_gather_object", "gather_object", "scatter_object_list",
    # registered buffers, and tools
    "empty", "trace", "config",
    # errors
    "errors", "CollieError", "PeerError", "CollieTimeout", "MismatchError", "AuthError", "AbortedError",
]


def __getattr__(name):
    # The launcher is imported on first use: most programs never need it.
    if name in ("spawn", "ProcessRaisedException", "ProcessExitedException"):
        from . import launch
        return getattr(launch, name)
    if name == "MPI":  # from collie import MPI: the mpi4py-style API
        from .compat import mpi
        return mpi
    raise AttributeError(f"module 'collie' has no attribute {name!r}")
