"""Every numeric dtype with every reduce op it supports, and torch tensors in place."""

import numpy as np
import pytest

from harness import run_ranks, small_ints

# Every test here runs under both executors (the compiled core and engine.execute).
pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("executor")]

DTYPES = ["bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
          "float16", "float32", "float64", "complex64", "complex128"]
OPS = ["SUM", "PRODUCT", "MIN", "MAX", "AVG", "PREMUL_SUM", "BAND", "BOR", "BXOR"]


def _expected_error(op: str, kind: str):
    if op in ("BAND", "BOR", "BXOR") and kind not in "biu":
        return "TypeError"
    if op in ("MIN", "MAX") and kind == "c":
        return "TypeError"
    if op in ("AVG", "PREMUL_SUM") and kind not in "fc":
        return "TypeError"
    return None


def _inputs(dtype: str, rank: int, count: int = 37) -> np.ndarray:
    return small_ints(f"dtypes/{rank}", count, dtype)


def _reference(op: str, arrays, n: int):
    a = [x.copy() for x in arrays]
    if a[0].dtype == bool:
        return {"SUM": np.logical_or, "PRODUCT": np.logical_and, "MIN": np.logical_and,
                "MAX": np.logical_or, "BAND": np.logical_and, "BOR": np.logical_or,
                "BXOR": np.logical_xor}[op].reduce(a)
    if op in ("SUM", "AVG", "PREMUL_SUM"):
        factor = 0.5 if op == "PREMUL_SUM" else 1
        out = np.sum([x * factor for x in a], axis=0).astype(a[0].dtype)
        return (out / n).astype(a[0].dtype) if op == "AVG" else out
    return {"PRODUCT": np.multiply, "MIN": np.minimum, "MAX": np.maximum, "BAND": np.bitwise_and,
            "BOR": np.bitwise_or, "BXOR": np.bitwise_xor}[op].reduce(a).astype(a[0].dtype)


def _every_dtype_and_op(rank, size):
    import collie
    failures = []
    for dtype in DTYPES:
        kind = np.dtype(dtype).kind
        for name in OPS:
            op = collie.ReduceOp.PREMUL_SUM(0.5) if name == "PREMUL_SUM" else getattr(collie.ReduceOp, name)
            x = _inputs(dtype, rank)
            try:
                collie.all_reduce(x, op=op)
                got = None
            except TypeError:
                got = "TypeError"
            want_error = _expected_error(name, kind)
            if got != want_error:
                failures.append(f"{dtype} {name}: raised {got}, expected {want_error}")
                continue
            if want_error:
                continue
            want = _reference(name, [_inputs(dtype, r) for r in range(size)], size)
            close = np.allclose(x, want, rtol=1e-2) if kind in "fc" else np.array_equal(x, want)
            if not close:
                failures.append(f"{dtype} {name}: {x[:5]} != {want[:5]}")
    return failures


def test_every_dtype_with_every_reduce_op():
    results = run_ranks(_every_dtype_and_op, 3)
    wrong = [f"rank {r}: {f}" for r, fails in enumerate(results) for f in fails]
    assert not wrong, "\n".join(wrong)


def _torch_body(rank, size):
    import torch

    import collie
    out = {}
    t = torch.arange(6, dtype=torch.float32).reshape(2, 3) + rank
    collie.all_reduce(t)
    out["all_reduce"] = t.tolist()
    bf = torch.tensor([1.0, 2.5, -3.0], dtype=torch.bfloat16) * (rank + 1)
    collie.all_reduce(bf)
    out["bf16"] = bf.float().tolist()
    g = torch.zeros(2 * size, dtype=torch.int64)
    collie.all_gather_into_tensor(g, torch.tensor([rank, 10 * rank]))
    out["all_gather"] = g.tolist()
    b = torch.full((4,), float(rank))
    collie.broadcast(b, src=size - 1)
    out["broadcast"] = b.tolist()
    strided = torch.zeros(4, 6)[:, ::2]                 # non-contiguous, written in place
    strided += rank + 1
    collie.all_reduce(strided, op=collie.ReduceOp.MAX)
    out["strided"] = strided.tolist()
    rs = torch.zeros(2)
    collie.reduce_scatter_tensor(rs, torch.arange(2 * size, dtype=torch.float32))
    out["reduce_scatter"] = rs.tolist()
    return out


def test_torch_tensors_in_place():
    pytest.importorskip("torch")
    res = run_ranks(_torch_body, 3)
    for rank, out in enumerate(res):
        assert out["all_reduce"] == [[3.0, 6.0, 9.0], [12.0, 15.0, 18.0]]
        assert out["bf16"] == [6.0, 15.0, -18.0]
        assert out["all_gather"] == [0, 0, 1, 10, 2, 20]
        assert out["broadcast"] == [2.0] * 4
        assert out["strided"] == [[3.0] * 3] * 4
        assert out["reduce_scatter"] == [3.0 * (2 * rank), 3.0 * (2 * rank + 1)]


def test_torch_tensors_that_cannot_be_viewed_are_refused_by_name():
    torch = pytest.importorskip("torch")
    from collie.arrays import to_numpy
    grad = torch.ones(3, requires_grad=True)  # viewed all the same: collie reads and writes its memory
    view, logical = to_numpy(grad)
    assert logical is None and view.ctypes.data == grad.data_ptr()
    with pytest.raises(TypeError, match="x is a meta tensor; collie moves CPU tensors"):
        to_numpy(torch.empty(2, device="meta"), "x")
    with pytest.raises(TypeError, match="sparse"):
        to_numpy(torch.eye(2).to_sparse(), "x")
    with pytest.raises(TypeError, match="conjugate view"):
        to_numpy(torch.ones(2, dtype=torch.complex64).conj(), "x")
    bits, logical = to_numpy(torch.tensor([1.0], dtype=torch.bfloat16))
    assert logical == "bfloat16" and bits.dtype == np.uint16 and bits[0] == 0x3F80


def _average_of_three(rank, size):
    import collie
    import torch
    got = {}
    for dtype in ("float16", "float32", "float64", "complex64"):
        x = np.array([(1, 2, 4)[rank]], dtype)
        collie.all_reduce(x, op=collie.ReduceOp.AVG)
        got[dtype] = x[0]
    t = torch.tensor([(1.0, 2.0, 4.0)[rank]], dtype=torch.bfloat16)
    collie.all_reduce(t, op=collie.ReduceOp.AVG)
    got["bfloat16"] = float(t[0])
    return got


def test_avg_is_the_correctly_rounded_quotient():
    # 7 / 3: one rounding, as torch's division gives; multiplying by a
    # rounded 1/3 gave 2.3320 in float16 and 2.3333335 in float32.
    import torch
    for got in run_ranks(_average_of_three, 3):
        for dtype in ("float16", "float32", "float64"):
            assert got[dtype] == np.array(7, dtype) / np.array(3, dtype), (dtype, got[dtype])
        assert got["complex64"] == np.float32(7) / np.float32(3)
        assert got["bfloat16"] == float(torch.tensor(7.0 / 3, dtype=torch.bfloat16))
