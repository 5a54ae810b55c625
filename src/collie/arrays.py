"""Adapters: every kind of array a user passes becomes one NumPy array.

collie works in place on the caller's memory, as torch.distributed does: a
torch CPU tensor, a NumPy array, anything with the buffer protocol or
__dlpack__ is viewed (not copied) as a NumPy array. Only a non-contiguous
array is copied, into a contiguous scratch array that is written back when
the call completes (``Buffer.finish``).

torch.bfloat16 has no NumPy dtype: it is viewed as uint16 bits with the
logical dtype kept as "bfloat16", and reductions widen it to float32.
"""

from __future__ import annotations

import ctypes
import sys

import numpy as np

BFLOAT16 = "bfloat16"


def numpy_view(obj) -> np.ndarray | None:
    """A torch tensor's NumPy view where numpy() gives one (dense, on the CPU,
    not bfloat16, needing no grad...): how tensors reach the lanes and the
    core's point to point. Else None, and to_numpy deals with it on the
    full path."""
    torch = sys.modules.get("torch")  # never imported here: only a program that has it passes tensors
    if torch is None or obj.__class__ is not torch.Tensor:
        return None
    try:
        return obj.numpy()
    except (TypeError, RuntimeError):
        return None


def to_numpy(obj, what: str = "array") -> tuple[np.ndarray, str | None]:
    """A NumPy view sharing obj's memory, and the logical dtype name when it
    differs from the view's (only "bfloat16")."""
    if isinstance(obj, np.ndarray):
        return obj, None
    torch = sys.modules.get("torch")  # never import torch ourselves: it takes seconds
    if torch is not None and isinstance(obj, torch.Tensor):
        # Each check is the cheapest torch offers (this runs on every call;
        # obj.device.type and detach() cost a microsecond each).
        if not obj.is_cpu:
            raise TypeError(f"{what} is a {obj.device.type} tensor; collie moves CPU tensors "
                            "(use tensor.cpu())")
        if obj.is_sparse:
            raise TypeError(f"{what} is a sparse tensor; collie moves dense tensors")
        t = obj.detach() if obj.requires_grad else obj  # numpy() refuses a tensor that needs grad
        if t.dtype is torch.bfloat16:
            return t.view(torch.int16).numpy().view(np.uint16), BFLOAT16
        if t.is_conj():
            raise TypeError(f"{what} is a conjugate view; call tensor.resolve_conj() first")
        return t.numpy(), None
    if hasattr(obj, "__dlpack__") and not isinstance(obj, (bytes, bytearray, memoryview)):
        return _from_dlpack(obj, what), None
    if hasattr(obj, "__cuda_array_interface__"):
        return _from_cai(obj, what), None
    try:
        return np.asarray(memoryview(obj)), None
    except TypeError:
        raise TypeError(f"{what} must be a NumPy array, a torch CPU tensor, or support the "
                        f"buffer protocol or __dlpack__; got {type(obj).__name__}") from None


# ---- DLPack producers other than NumPy and torch ----

class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _DLManaged(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


class _DLManagedVersioned(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p), ("flags", ctypes.c_uint64), ("dl_tensor", _DLTensor)]


_api = ctypes.pythonapi
_api.PyCapsule_IsValid.restype = ctypes.c_int
_api.PyCapsule_IsValid.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_DL_KINDS = {0: "i", 1: "u", 2: "f", 5: "c", 6: "b"}


class _Memory:
    """An __array_interface__ over a DLPack tensor's memory; it holds the
    capsule, whose destructor gives the tensor back, as long as an array views it."""

    def __init__(self, interface: dict, owner):
        self.__array_interface__ = interface
        self._owner = owner


class ReadOnlyError(ValueError, BufferError):
    """A read-only buffer asked to receive: a ValueError to collie's callers,
    the BufferError that Python (and mpi4py) give for it."""


def _device(obj, what: str) -> tuple:
    """(device type, device id) from __dlpack_device__, checked as mpi4py does."""
    if not hasattr(obj, "__dlpack_device__"):
        return 1, 0
    device = obj.__dlpack_device__()
    if not isinstance(device, tuple):
        raise TypeError(f"{what}: __dlpack_device__() must return a tuple, got {device!r}")
    if len(device) != 2:
        raise ValueError(f"{what}: __dlpack_device__() must return (device type, device id), got {device!r}")
    if not all(isinstance(x, int) for x in device):
        raise TypeError(f"{what}: __dlpack_device__() must return two ints, got {device!r}")
    return device


def _contiguous(shape: tuple, strides, unit: int = 1) -> bool:
    """Whether strides (in units: 1 for items, the itemsize for bytes) lay
    shape out C- or Fortran-contiguously (axes of length 1 may have any stride)."""
    if strides is None:
        return True
    for order in (reversed(range(len(shape))), range(len(shape))):
        step = unit
        for i in order:
            if shape[i] != 1 and strides[i] != step:
                break
            step *= shape[i]
        else:
            return True
    return False


def _from_dlpack(obj, what: str) -> np.ndarray:
    """A writable view of a CPU DLPack producer's contiguous tensor.

    The producer is asked with ``__dlpack__(stream=None)`` only, what mpi4py
    asks (many producers take nothing else). Unlike np.from_dlpack, the
    capsule is not consumed but kept alive as long as the view (the tensor
    goes with it), and unversioned tensors stay writable (NumPy imports them
    read-only, so that nothing could be received into them). A malformed
    tensor is a BufferError, as in mpi4py; a dtype NumPy has no name for
    (an opaque handle, several lanes) is viewed as its bytes.
    """
    device = _device(obj, what)
    # as mpi4py: no stream on the CPU; elsewhere -1, no synchronization asked for
    capsule = obj.__dlpack__(stream=None if device[0] in (1, 3) else -1)
    for name, kind in ((b"dltensor_versioned", _DLManagedVersioned), (b"dltensor", _DLManaged)):
        if _api.PyCapsule_IsValid(capsule, name):
            break
    else:
        raise BufferError(f"{what}: __dlpack__ returned no unused DLPack capsule, got {type(capsule).__name__}")
    managed = kind.from_address(_api.PyCapsule_GetPointer(capsule, name))
    if kind is _DLManagedVersioned and managed.major != 1:
        raise BufferError(f"{what}: DLPack version {managed.major}.{managed.minor} is not supported (1.x is)")
    t = managed.dl_tensor
    readonly = kind is _DLManagedVersioned and bool(managed.flags & 1)
    if t.ndim < 0:
        raise BufferError(f"{what}: DLPack tensor has ndim {t.ndim}")
    if t.ndim and not t.shape:
        raise BufferError(f"{what}: DLPack tensor of ndim {t.ndim} has no shape")
    shape = tuple(t.shape[i] for i in range(t.ndim))
    if any(n < 0 for n in shape):
        raise BufferError(f"{what}: DLPack tensor has a negative shape {shape}")
    strides = tuple(t.strides[i] for i in range(t.ndim)) if t.strides and t.ndim else None
    if strides is not None and any(st < 0 for st in strides):
        raise BufferError(f"{what}: DLPack tensor has negative strides {strides}")
    if not _contiguous(shape, strides):
        raise BufferError(f"{what}: DLPack tensor is not contiguous (shape {shape}, strides {strides})")
    code, bits, lanes = t.dtype.code, t.dtype.bits, t.dtype.lanes
    if code == 2 and lanes == 2:  # complex as two float lanes (older producers)
        code, bits, lanes = 5, bits * 2, 1
    if (bits * lanes) % 8:
        raise BufferError(f"{what}: DLPack dtype of {bits} bits x {lanes} lanes is not a whole number of bytes")
    if code in _DL_KINDS and lanes == 1:
        dtype = np.dtype("?" if code == 6 else f"{_DL_KINDS[code]}{bits // 8}")
    else:
        dtype = np.dtype(np.uint8)  # the bytes of a type NumPy cannot name
        shape, strides = (int(np.prod(shape, dtype=np.int64)) * bits * lanes // 8,), None
    if strides is not None:
        strides = tuple(st * dtype.itemsize for st in strides)
    data = (t.data or 0) + t.byte_offset
    if device[0] not in (1, 3):  # not kDLCPU, kDLCUDAHost: only memory this CPU can reach moves
        readonly = _host_memory(data, int(np.prod(shape, dtype=np.int64)) * dtype.itemsize,
                                f"{what} (on DLPack device {device})") or readonly
    if not data:
        # an empty tensor may have no memory at all
        data = np.zeros(1, dtype=np.uint8).ctypes.data if 0 in shape else data
    mem = _Memory({"version": 3, "shape": shape, "typestr": dtype.str, "strides": strides,
                   "data": (data, readonly)}, (obj, capsule))
    return np.asarray(mem)


_maps: list = []  # (start, end, read-only) of this process's readable non-device mappings, last read


def _read_maps() -> list:
    try:
        with open("/proc/self/maps") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        fields = line.split(maxsplit=5)
        if "r" in fields[1] and not (len(fields) > 5 and fields[5].startswith("/dev/")):
            lo, hi = (int(x, 16) for x in fields[0].split("-"))
            out.append((lo, hi, "w" not in fields[1]))
    return out


def _covered(maps: list, at: int, end: int):
    """Whether [at, end) lies in consecutive mappings of ``maps``: None if
    not, else whether any of them is read-only."""
    readonly = False
    for lo, hi, ro in maps:
        if hi <= at:
            continue
        if lo > at:
            return None
        readonly, at = readonly or ro, hi
        if at >= end:
            return readonly
    return None


def _host_memory(address: int, nbytes: int, what: str) -> bool:
    """Check that [address, address + nbytes) is this process's ordinary
    memory (mapped readable, not a device file), per /proc/self/maps: a
    device pointer can then be read without faulting (a fake or host-mapped
    one; real GPU memory is refused). Returns True when some of it is
    read-only. The maps are read again only when the last reading does not
    cover the range (memory unmapped since is a dangling pointer, the
    caller's error as with any pointer)."""
    global _maps
    if nbytes == 0:
        return False
    readonly = _covered(_maps, address, address + nbytes)
    if readonly is None:
        _maps = _read_maps()
        readonly = _covered(_maps, address, address + nbytes)
    if readonly is None:
        raise TypeError(f"{what} is device memory at {address:#x}; collie moves CPU memory")
    return readonly


def _typestr(typestr, what: str) -> np.dtype:
    """The dtype of an array interface's typestr ("<i4", "|u1"...), in this machine's byte order only."""
    if not isinstance(typestr, str):
        raise TypeError(f"{what}: __cuda_array_interface__ 'typestr' must be a str, got {typestr!r}")
    order, code, size = typestr[:1], typestr[1:2], typestr[2:]
    if not size.isdigit():
        raise ValueError(f"{what}: __cuda_array_interface__ 'typestr' {typestr!r} has no item size")
    if order not in ("|", "=", "<" if sys.byteorder == "little" else ">") and int(size) > 1:
        raise BufferError(f"{what}: __cuda_array_interface__ 'typestr' {typestr!r} is not in this "
                          "machine's byte order")
    try:
        return np.dtype(code + size)
    except TypeError:
        raise ValueError(f"{what}: __cuda_array_interface__ 'typestr' {typestr!r} is not understood") from None


def _from_cai(obj, what: str) -> np.ndarray:
    """A view of a __cuda_array_interface__ buffer, checked as mpi4py checks
    it; its memory must be host memory (see _host_memory)."""
    cai = obj.__cuda_array_interface__
    if not isinstance(cai, dict):
        raise TypeError(f"{what}: __cuda_array_interface__ must be a dict, got {type(cai).__name__}")
    data = cai["data"]
    if not isinstance(data, tuple):
        raise TypeError(f"{what}: __cuda_array_interface__ 'data' must be (pointer, read-only), got {data!r}")
    if len(data) != 2:
        raise ValueError(f"{what}: __cuda_array_interface__ 'data' must be (pointer, read-only), got {data!r}")
    address, readonly = int(data[0]), bool(data[1])
    shape, dtype, strides = tuple(cai["shape"]), _typestr(cai["typestr"], what), cai.get("strides")
    if any(n < 0 for n in shape):
        raise BufferError(f"{what}: __cuda_array_interface__ has a negative shape {shape}")
    descr = cai.get("descr")
    if descr is not None and not isinstance(descr, list):
        raise TypeError(f"{what}: __cuda_array_interface__ 'descr' must be a list, got {descr!r}")
    if cai.get("mask") is not None:
        raise BufferError(f"{what}: __cuda_array_interface__ with a mask is not supported")
    if strides is not None:
        strides = tuple(strides)
        if not _contiguous(shape, strides, dtype.itemsize):
            raise BufferError(f"{what} is not contiguous (shape {shape}, strides {strides})")
        # axes of length 1 may carry any stride: drop them for NumPy
        strides = tuple(st if n != 1 else dtype.itemsize for n, st in zip(shape, strides))
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    readonly = _host_memory(address, nbytes, what) or readonly
    if not address:
        address = np.zeros(1, dtype=np.uint8).ctypes.data if nbytes == 0 else address
    return np.asarray(_Memory({"version": 3, "shape": shape, "typestr": dtype.str, "strides": strides,
                               "data": (address, readonly)}, obj))


# dtype -> its name, for the dtypes collie moves (a dict lookup is far
# cheaper than dtype.name, and this runs on every call).
_NAMES = {np.dtype(name): name for name in (
    "bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
    "float16", "float32", "float64", "longdouble", "complex64", "complex128", "clongdouble")}


class Buffer:
    """A flat contiguous view of a user's array for the duration of one call.

    ``flat`` is the 1-D contiguous array collie reads and writes; when the
    user's array was not contiguous it is a copy, and ``finish()`` writes it
    back (only for arrays collie writes to).
    """

    __slots__ = ("original", "flat", "dtype_name", "count", "nbytes", "_writeback")

    def __init__(self, obj, *, writable: bool, what: str = "tensor"):
        arr, logical = (obj, None) if type(obj) is np.ndarray else to_numpy(obj, what)
        name = logical or _NAMES.get(arr.dtype)
        if name is None:
            raise TypeError(f"{what} has dtype {arr.dtype}; collie moves numeric and bool arrays "
                            "(use the *_object functions for Python objects)")
        flags = arr.flags
        if writable and not flags.writeable:
            raise ReadOnlyError(f"{what} is read-only, but collie must write into it")
        self.original = arr
        self.dtype_name = name
        self._writeback = False
        if not flags.c_contiguous:
            self.flat = np.ascontiguousarray(arr).reshape(-1)
            self._writeback = writable
        elif arr.ndim == 1:
            self.flat = arr  # already flat: no view to make (the common case of small calls)
        else:
            self.flat = arr.reshape(-1)
        self.count = self.flat.size    # elements
        self.nbytes = self.flat.nbytes

    def bytes(self) -> memoryview:
        """The whole buffer as a flat, writable-if-possible byte view."""
        return memoryview(self.flat).cast("B")

    def finish(self) -> None:
        """Copy results back into a non-contiguous original."""
        if self._writeback:
            np.copyto(self.original, self.flat.reshape(self.original.shape))


def byte_view(arr: np.ndarray) -> memoryview:
    """A flat byte memoryview of a C-contiguous array (empty arrays included)."""
    return memoryview(arr).cast("B")
