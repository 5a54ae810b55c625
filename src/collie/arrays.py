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


def _contiguous(shape: tuple, strides) -> bool:
    """Whether strides (in items) lay shape out C- or Fortran-contiguously
    (axes of length 1 may have any stride)."""
    if strides is None:
        return True
    for order in (reversed(range(len(shape))), range(len(shape))):
        step = 1
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
    if device[0] not in (1, 3):  # kDLCPU, kDLCUDAHost
        raise TypeError(f"{what} is on DLPack device {device}; collie moves CPU memory")
    capsule = obj.__dlpack__(stream=None)
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
    if not data:
        # an empty tensor may have no memory at all
        data = np.zeros(1, dtype=np.uint8).ctypes.data if 0 in shape else data
    mem = _Memory({"version": 3, "shape": shape, "typestr": dtype.str, "strides": strides,
                   "data": (data, readonly)}, (obj, capsule))
    return np.asarray(mem)


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
