"""The environment: Init, Finalize, COMM_WORLD and COMM_SELF."""

from __future__ import annotations

import operator
import os
import socket
import threading
import time
from .comm import Intracomm
from .constants import SUBVERSION, THREAD_MULTIPLE, THREAD_SERIALIZED, VERSION

__all__ = ["get_vendor", "Get_abi_version", "Get_abi_info", "Get_abi_fortran_info", "Alloc_mem", "Free_mem", "Get_address", "Aint_add", "Aint_diff", "Compute_dims", "Pcontrol", "Attach_buffer", "Detach_buffer", "Flush_buffer", "Iflush_buffer", "Get_hw_resource_info", "Init", "Init_thread", "Query_thread", "Is_thread_main", "Finalize", "Is_initialized", "Is_finalized", "Wtime", "Wtick", "Get_processor_name", "Get_version", "Get_library_version"]


from ... import group as _group
from .exceptions import ERR_OTHER, _error
from ...group import ProcessGroup
from ...runtime import RUNTIME


# ---- the environment ----

_cache: dict = RUNTIME.mpi_comms  # "world"/"self" -> communicator of the current world (the runtime's)
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
        raise _error(ERR_OTHER, "MPI.Finalize() was called: MPI cannot be initialized again")
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
    """Leave the world (collie.destroy_process_group, which also forgets
    COMM_WORLD and COMM_SELF: runtime.py)."""
    global _finalized
    _group.destroy_process_group()
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
    """The MPI standard's version this module follows (see constants.VERSION)."""
    return VERSION, SUBVERSION


def Get_library_version() -> str:
    from ... import __version__
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


def get_vendor() -> tuple[str, tuple[int, int, int]]:
    """The MPI implementation under this namespace: ("collie", its version)."""
    from ... import __version__
    parts = [int(p) for p in __version__.split(".")[:3] if p.isdigit()]
    return "collie", tuple((parts + [0, 0, 0])[:3])


def Get_abi_version() -> tuple[int, int]:
    """(-1, -1): collie is no implementation of MPI's standard ABI (as mpi4py says for those)."""
    return -1, -1


def Get_abi_info():
    """The sizes of MPI_Aint, MPI_Count and MPI_Offset, as an Info object."""
    from .datatype import AINT, COUNT, OFFSET
    from .info import Info
    return Info.Create({"mpi_aint_size": str(AINT.Get_size()), "mpi_count_size": str(COUNT.Get_size()),
                        "mpi_offset_size": str(OFFSET.Get_size())})


def Get_abi_fortran_info():
    """MPI.INFO_NULL: there is no Fortran side."""
    from .info import INFO_NULL
    return INFO_NULL


def Get_hw_resource_info():
    from .info import Info
    return Info.Create()


def Alloc_mem(size: int, info=None):
    """``size`` bytes of zeroed memory, an MPI.buffer (Free_mem gives it
    back). From 64 KiB it is a registered buffer (collie.empty), which the
    other ranks of the host map and move straight from memory, as MPI
    implementations' Alloc_mem gives memory suited to communication."""
    from ...registered import empty
    from ...transports.shm import REGISTERED_SINGLE_COPY_BYTES
    from .memory import buffer
    size = operator.index(size)
    if size < 0:
        from .exceptions import ERR_ARG, Exception
        raise Exception(ERR_ARG, f"Alloc_mem: size {size} is negative")
    if size < REGISTERED_SINGLE_COPY_BYTES:  # (smaller messages move through the rings either way)
        return buffer.allocate(size, clear=True)
    memory = empty(size, "uint8")
    memory.fill(0)
    return buffer._wrap(memory, memory)


def Free_mem(mem) -> None:
    from .memory import buffer
    if isinstance(mem, (memoryview, buffer)):
        mem.release()


def Get_address(location) -> int:
    """The address of a buffer's first byte (BOTTOM and None: 0)."""
    from .constants import BOTTOM
    from .memory import buffer
    if location is BOTTOM or location is None:
        return 0
    if isinstance(location, buffer):  # MPI.buffer() (a window without memory) has address 0
        return location.address
    import numpy as np
    from .buffers import to_numpy  # DLPack producers read as mpi4py reads them
    arr, _ = to_numpy(location, "Get_address location")
    return arr.__array_interface__["data"][0] if isinstance(arr, np.ndarray) else 0


def Aint_add(base: int, disp: int) -> int:
    return operator.index(base) + operator.index(disp)


def Aint_diff(addr1: int, addr2: int) -> int:
    return operator.index(addr1) - operator.index(addr2)


def Compute_dims(nnodes: int, dims) -> list[int]:
    """A balanced grid of ``nnodes`` in ``len(dims)`` dimensions (an int:
    that many dimensions); nonzero entries of ``dims`` are kept as given.
    Dimensions come out in non-increasing order, as MPI_Dims_create's."""
    from .exceptions import ERR_DIMS, Exception
    nnodes = operator.index(nnodes)
    dims = [0] * operator.index(dims) if not hasattr(dims, "__len__") else [operator.index(d) for d in dims]
    if nnodes < 0 or any(d < 0 for d in dims):
        raise Exception(ERR_DIMS, f"Compute_dims: negative sizes in {nnodes}, {dims}")
    fixed = 1
    for d in dims:
        fixed *= d or 1
    free = [i for i, d in enumerate(dims) if d == 0]
    if (fixed == 0 and nnodes) or (fixed and nnodes % fixed):
        raise Exception(ERR_DIMS, f"Compute_dims: {nnodes} nodes do not fit dims {dims}")
    if not free:
        if fixed != nnodes:
            raise Exception(ERR_DIMS, f"Compute_dims: dims {dims} hold {fixed} nodes, not {nnodes}")
        return dims
    left = nnodes // fixed if fixed else 0
    # prime factors, largest first, each into the currently smallest free dimension
    factors, n, p = [], left, 2
    while n > 1 and p * p <= n:
        while n % p == 0:
            factors.append(p)
            n //= p
        p += 1
    if n > 1:
        factors.append(n)
    sizes = [1] * len(free)
    for f in sorted(factors, reverse=True):
        sizes[sizes.index(min(sizes))] *= f
    sizes.sort(reverse=True)
    if left == 0:
        sizes = [0] * len(free)
    for i, s in zip(free, sizes):
        dims[i] = s
    return dims


def Pcontrol(level: int) -> None:
    """Profiling control: accepted, and nothing to do."""
    operator.index(level)


_attached = None


def Attach_buffer(buf) -> None:
    """The buffer of buffered sends. collie's Bsend never needs one (the
    transport copies), so it is only kept, to give back on Detach_buffer."""
    global _attached
    from ...arrays import to_numpy
    from .constants import BUFFER_AUTOMATIC
    if buf is not BUFFER_AUTOMATIC and not to_numpy(buf, "Attach_buffer buf")[0].flags.writeable:
        raise BufferError("Attach_buffer: the buffer is read-only (MPI writes into it)")
    _attached = buf


def Detach_buffer():
    global _attached
    buf, _attached = _attached, None
    return buf


def Flush_buffer() -> None:
    """Buffered sends are complete when they return: nothing to flush."""


def Iflush_buffer():
    from .request import _done_request
    return _done_request()


# ---- handles as C sees them (mpi4py's _sizeof, _handleof) ----
#
# A handle here is an integer (toint), held in 8 bytes; a Status is its
# own array of fields (tomemory), so its "handle" is that array's address.

def _handled(obj, what: str):
    """The object or class asked about, checked to be an MPI handle type."""
    from .status import Status
    cls = obj if isinstance(obj, type) else type(obj)
    if issubclass(cls, Status) or hasattr(cls, "fromhandle"):
        return cls
    raise TypeError(f"{what}: expected an MPI handle object or type (MPI.Comm, MPI.Status...), got {obj!r}")


def _sizeof(obj) -> int:
    """Bytes of the handle of ``obj`` (an MPI object or class)."""
    from .status import Status
    cls = _handled(obj, "_sizeof")
    return Status()._fields.nbytes if issubclass(cls, Status) else 8


def _handleof(obj) -> int:
    """The handle of ``obj``: its integer handle; a Status's fields' address."""
    from .status import Status
    if isinstance(obj, type):
        raise TypeError(f"_handleof: expected an MPI object, got the class {obj.__name__}")
    _handled(obj, "_handleof")
    return obj._fields.ctypes.data if isinstance(obj, Status) else obj.handle


__all__ += ["_sizeof", "_handleof"]
