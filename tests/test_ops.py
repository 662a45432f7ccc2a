"""Every op checked the same way, row by row of the table in ``op_table.py``:

* forward against a NumPy float64 reference, to about 1e-10 relative;
* backward against central differences (``minitorch_gpu.testing.gradcheck``) in float64;
* on each backend: "cpu" always, "cuda" where CuPy sees a GPU (else skipped, with why);
* on each memory layout of the float inputs: contiguous, a transposed leaf, a strided slice;
* and, for a representative subset, forward in float32 to 1e-5 relative.

Test ids read ``<row>-<layout>-<backend>``, e.g. ``add-broadcast-col-row-transposed-cpu``.
"""
from __future__ import annotations

import zlib
from typing import Any

import numpy as np
import pytest

import minitorch_gpu as mt
from minitorch_gpu.testing import gradcheck
from op_table import CASES, Const, Float, OpCase, can_be_noncontiguous

BACKENDS = ("cpu", "cuda")
FLOAT32_RTOL = 1e-5
FLOAT32_ATOL = 1e-6  # floor for outputs that cancel to ~0 (a dot product, x - mean)


def params(cases: list, all_layouts: bool = True) -> list:
    return [pytest.param(c, layout, backend, id=f"{c.name}-{layout}-{backend}",
                         marks=[pytest.mark.cuda] if backend == "cuda" else [])
            for c in cases
            for layout in (c.layouts if all_layouts else ("contiguous",))
            for backend in BACKENDS]


def device_for(backend: str) -> str:
    if backend == "cuda" and not mt.cuda.is_available():
        pytest.skip(f"cuda: {mt.cuda.unavailable_reason()}")
    return backend


def host(t: mt.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy()


# --- inputs -------------------------------------------------------------------------------
def leaf(values: np.ndarray, layout: str, device: str, dtype: Any,
         requires_grad: bool) -> mt.Tensor:
    """A leaf tensor holding ``values`` on ``device``, stored as ``layout`` says."""
    if layout == "contiguous":
        t = mt.tensor(values, dtype=dtype, device=device)
    elif layout == "transposed":
        # stored with the dims reversed and seen through .T: the strides ascend
        t = mt.tensor(values.T.copy(), dtype=dtype, device=device).T
    elif layout == "sliced":
        # every other element, in every dim, of an array twice as large; the elements in
        # between are NaN, so an op that reads outside the view's strides returns NaN
        every_other = (slice(None, None, 2),) * values.ndim
        padded = np.full(tuple(2 * n for n in values.shape), np.nan)
        padded[every_other] = values
        t = mt.tensor(padded, dtype=dtype, device=device)[every_other]
    else:
        raise ValueError(f"unknown layout {layout!r}")
    assert t.is_leaf and tuple(t.shape) == values.shape
    if can_be_noncontiguous(values.shape, layout):
        assert not t.is_contiguous(), f"{layout} leaf of shape {values.shape} is contiguous"
    np.testing.assert_array_equal(host(t), values.astype(dtype))
    return t.requires_grad_(requires_grad)


def make_inputs(case: OpCase, layout: str, device: str, dtype: Any = mt.float64) -> tuple:
    """The row's inputs as Tensors on ``device`` and as NumPy arrays for the reference.

    Float inputs are drawn in float64 and stored in ``dtype``; the reference sees the
    stored values (so in float32 it measures the op's error, not the inputs' rounding).
    """
    rng = np.random.default_rng(zlib.crc32(case.name.encode()))  # same draw every run
    tensors, arrays = [], []
    for spec in case.inputs:
        values = spec.draw(rng)
        if isinstance(spec, Float):
            stored = values.astype(dtype)
            tensors.append(leaf(stored, layout, device, dtype, spec.grad))
            arrays.append(stored.astype(np.float64))
        else:
            tensors.append(mt.tensor(values, device=device))
            arrays.append(values)
    if layout != "contiguous":
        assert any(not t.is_contiguous() for t, s in zip(tensors, case.inputs)
                   if isinstance(s, Float)), f"{case.name}: no input is {layout}"
    return tensors, arrays


# --- comparing outputs --------------------------------------------------------------------
def as_list(result: Any) -> list:
    return list(result) if isinstance(result, (tuple, list)) else [result]


def assert_matches(out: Any, expected: Any, device: str, dtype: Any, rtol: float,
                   atol: float) -> None:
    """Each output has the reference's shape, ``dtype`` (integer outputs: an integer
    dtype and equal values), lives on ``device``, and is close to the reference."""
    outs, refs = as_list(out), as_list(expected)
    assert len(outs) == len(refs), f"{len(outs)} outputs, the reference has {len(refs)}"
    for i, (o, r) in enumerate(zip(outs, refs)):
        r = np.asarray(r)
        assert isinstance(o, mt.Tensor), f"output {i} is a {type(o).__name__}"
        assert o.device == device, f"output {i} is on {o.device}, expected {device}"
        assert tuple(o.shape) == r.shape, f"output {i} has shape {o.shape}, expected {r.shape}"
        if r.dtype.kind == "f":
            assert o.dtype == dtype, f"output {i} is {o.dtype}, expected {dtype}"
            np.testing.assert_allclose(host(o).astype(np.float64), r, rtol=rtol, atol=atol,
                                       err_msg=f"output {i}")
        else:
            assert o.dtype.kind in "iu", f"output {i} is {o.dtype}, expected integers"
            np.testing.assert_array_equal(host(o), r, err_msg=f"output {i}")


# --- the tests ----------------------------------------------------------------------------
@pytest.mark.parametrize("case, layout, backend", params(CASES))
def test_forward(case: OpCase, layout: str, backend: str) -> None:
    device = device_for(backend)
    tensors, arrays = make_inputs(case, layout, device)
    out = case.fn(*tensors)
    if case.check is not None:  # a random op: check a property instead of a reference
        case.check(*[host(o) for o in as_list(out)], *arrays)
    else:
        assert_matches(out, case.ref(*arrays), device, mt.float64, case.rtol, case.atol)


@pytest.mark.parametrize("case, layout, backend", params([c for c in CASES if c.differentiable]))
def test_backward(case: OpCase, layout: str, backend: str) -> None:
    tensors, _ = make_inputs(case, layout, device_for(backend))
    assert gradcheck(case.fn, tensors)


@pytest.mark.parametrize("case, layout, backend",
                         params([c for c in CASES if c.float32], all_layouts=False))
def test_forward_float32(case: OpCase, layout: str, backend: str) -> None:
    device = device_for(backend)
    tensors, arrays = make_inputs(case, layout, device, mt.float32)
    assert_matches(case.fn(*tensors), case.ref(*arrays), device, mt.float32, FLOAT32_RTOL,
                   FLOAT32_ATOL)


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.parametrize("backend", BACKENDS)
def test_var_without_degrees_of_freedom_is_nan(backend: str) -> None:
    """Unbiased variance over one element is nan, and so is its gradient (as in PyTorch).
    Not a table row: gradcheck needs finite gradients."""
    x = mt.ones(1, 3, dtype=mt.float64, device=device_for(backend), requires_grad=True)
    y = x.var(0)
    y.sum().backward()
    assert np.isnan(host(y)).all() and np.isnan(host(x.grad)).all()


# Public ops that need no row here, and why; every other name in minitorch_gpu.ops must
# start some row's name (with "_" written "-"), so a new op can't go untested.
NOT_IN_TABLE = {
    "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_not", "any",
    "all", "argmax", "argmin",  # no gradient; argmax/argmin are checked by max/min rows
    "bitwise_and", "bitwise_or", "bitwise_not",  # no gradient; test_torch_semantics.py
    "bitwise_xor",  # no gradient; test_pytorch_fixes.py
    "index_key",  # a helper of indexing, not an op
    "to_device", "to_dtype",  # cross-device copies need two devices; casts are "to-" rows
    "isnan", "isinf", "isfinite", "isclose",  # bool results; test_elementwise_math.py
    "argsort", "nonzero", "one_hot",  # no gradient; test_reduce_shape_ops.py
    "rotary_tables",  # constants, no gradient; test_llama_ops.py
    "cached_grouped_attention",  # writes a KV cache, no backward; test_attention_gqa.py
}
ROW_PREFIX = {"getitem": "index", "scaled_dot_product_attention": "sdpa"}


def test_table_covers_every_op() -> None:
    names = [c.name for c in CASES]
    missing = [op for op in mt.ops.__all__ if op not in NOT_IN_TABLE and not any(
        n.startswith(ROW_PREFIX.get(op, op.replace("_", "-"))) for n in names)]
    assert not missing, f"ops without a row in tests/op_table.py: {missing}"
    for c in CASES:
        assert (c.ref is None) != (c.check is None), f"{c.name}: give exactly one of ref, check"
        assert all(isinstance(s, (Float, Const)) for s in c.inputs), c.name
