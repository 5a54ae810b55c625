"""Reduce ops and the kernels that apply them to NumPy arrays.

ReduceOp.SUM, PRODUCT, MIN, MAX, AVG, BAND, BOR, BXOR and
ReduceOp.PREMUL_SUM(factor), as in torch.distributed. A kernel combines an
incoming array into a destination array in place (dst = dst op src), which
is all an algorithm ever needs: AVG is a SUM divided by the group size at the
end, PREMUL_SUM a SUM of inputs first multiplied by the factor.

Which dtypes an op accepts is checked before anything is sent: bitwise ops
need integers or bool, MIN/MAX are undefined on complex numbers, AVG and
PREMUL_SUM need floating or complex numbers.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from .arrays import BFLOAT16

__all__ = ["ReduceOp", "kernel", "check_op"]


class ReduceOp:
    """A reduction. Compare with ReduceOp.SUM etc.; PREMUL_SUM(f) makes one."""

    __slots__ = ("name", "code", "factor", "_hash")

    SUM: "ReduceOp"
    PRODUCT: "ReduceOp"
    MIN: "ReduceOp"
    MAX: "ReduceOp"
    AVG: "ReduceOp"
    BAND: "ReduceOp"
    BOR: "ReduceOp"
    BXOR: "ReduceOp"

    def __init__(self, name: str, code: int, factor=None):
        self.name, self.code, self.factor = name, code, factor
        self._hash = hash((code, factor))  # ops key the per-call caches: hash once

    @staticmethod
    def PREMUL_SUM(factor) -> "ReduceOp":  # noqa: N802 - torch's spelling
        """SUM of every input multiplied by ``factor`` first."""
        try:
            value = complex(factor) if np.iscomplexobj(factor) else float(factor)
        except (TypeError, ValueError):
            raise TypeError(f"PREMUL_SUM factor must be a number, got {type(factor).__name__}") from None
        return ReduceOp("PREMUL_SUM", 8, value)

    def __eq__(self, other) -> bool:
        return isinstance(other, ReduceOp) and (self.code, self.factor) == (other.code, other.factor)

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        return f"ReduceOp.{self.name}" + (f"({self.factor})" if self.name == "PREMUL_SUM" else "")


for _code, _name in enumerate(("SUM", "PRODUCT", "MIN", "MAX", "AVG", "BAND", "BOR", "BXOR")):
    setattr(ReduceOp, _name, ReduceOp(_name, _code))

_UFUNC = {"SUM": np.add, "AVG": np.add, "PREMUL_SUM": np.add, "PRODUCT": np.multiply,
          "MIN": np.minimum, "MAX": np.maximum, "BAND": np.bitwise_and, "BOR": np.bitwise_or,
          "BXOR": np.bitwise_xor}
_BITWISE = ("BAND", "BOR", "BXOR")


def as_op(op) -> ReduceOp:
    """Accept a ReduceOp, or its name as a string ("sum", "max"...)."""
    if isinstance(op, ReduceOp):
        return op
    if isinstance(op, str) and op.upper() in _UFUNC and op.upper() != "PREMUL_SUM":
        return getattr(ReduceOp, op.upper())
    raise TypeError(f"op must be a collie.ReduceOp (SUM, PRODUCT, MIN, MAX, AVG, BAND, BOR, BXOR, "
                    f"PREMUL_SUM(factor)), got {op!r}")


def check_op(op: ReduceOp, dtype_name: str) -> None:
    """Raise TypeError when ``op`` is undefined on ``dtype_name``."""
    kind = "f" if dtype_name == BFLOAT16 else np.dtype(dtype_name).kind
    if op.name in _BITWISE and kind not in "biu":
        raise TypeError(f"{op!r} needs an integer or bool dtype, not {dtype_name}")
    if op.name in ("MIN", "MAX") and kind == "c":
        raise TypeError(f"{op!r} is undefined on complex dtype {dtype_name}")
    if op.name in ("AVG", "PREMUL_SUM") and kind not in "fc":
        raise TypeError(f"{op!r} needs a floating or complex dtype, not {dtype_name}")


def _bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def _f32_to_bf16(values: np.ndarray, out: np.ndarray) -> None:
    bits = values.view(np.uint32)
    rounded = bits + (((bits >> 16) & 1) + 0x7FFF)  # round to nearest, ties to even
    np.right_shift(rounded, 16, out=rounded)
    np.copyto(out, rounded, casting="unsafe")


def kernel(op: ReduceOp, dtype_name: str) -> Callable[[np.ndarray, np.ndarray], None]:
    """``f(dst, src)``: dst = dst op src, elementwise, in place. When that is
    one ufunc call, ``f.ufunc`` is the ufunc. ``f.op`` and ``f.dtype_name``
    say what it computes (the compiled core picks its own kernel by them)."""
    f = _kernel(op, dtype_name)
    f.op, f.dtype_name = op.name, dtype_name
    return f


def _kernel(op: ReduceOp, dtype_name: str) -> Callable[[np.ndarray, np.ndarray], None]:
    ufunc = _UFUNC[op.name]
    if dtype_name == BFLOAT16:
        def bf16(dst, src):
            wide = _bf16_to_f32(dst)
            ufunc(wide, _bf16_to_f32(src), out=wide)
            _f32_to_bf16(wide, dst)
        return bf16
    if dtype_name == "bool" and op.name in ("SUM", "AVG", "PREMUL_SUM"):
        return lambda dst, src: np.logical_or(dst, src, out=dst)
    if dtype_name == "bool" and op.name == "PRODUCT":
        return lambda dst, src: np.logical_and(dst, src, out=dst)

    def plain(dst, src):
        ufunc(dst, src, out=dst)
    plain.ufunc = ufunc  # callers on a hot path (the engine's combine) may call it directly
    return plain


def scale(arr: np.ndarray, factor, dtype_name: str) -> None:
    """arr *= factor in place (PREMUL_SUM's premultiply)."""
    if dtype_name == BFLOAT16:
        wide = _bf16_to_f32(arr) * np.float32(factor)
        _f32_to_bf16(wide, arr)
    else:
        np.multiply(arr, factor, out=arr, casting="unsafe")


def average(arr: np.ndarray, n: int, dtype_name: str) -> None:
    """arr /= n in place: AVG's last step. A division, not a multiplication
    by 1/n, so that the result is the correctly rounded quotient (as
    torch's): 7/3 in float32 is 2.3333333, where 7 * float32(1/3) gives
    2.3333335."""
    if dtype_name == BFLOAT16:
        _f32_to_bf16(_bf16_to_f32(arr) / np.float32(n), arr)
        return
    if arr.dtype.kind == "c":  # each part by n (NumPy's complex division rounds worse)
        arr = arr.view(arr.real.dtype)
    np.divide(arr, n, out=arr, casting="unsafe")
