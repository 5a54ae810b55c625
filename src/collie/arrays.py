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
        return np.from_dlpack(obj), None
    try:
        return np.asarray(memoryview(obj)), None
    except TypeError:
        raise TypeError(f"{what} must be a NumPy array, a torch CPU tensor, or support the "
                        f"buffer protocol or __dlpack__; got {type(obj).__name__}") from None


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
            raise ValueError(f"{what} is read-only, but collie must write into it")
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
