"""clamp and clamp_ with one bound, on bf16: what CuPy 14.2's clip refuses.

CuPy's ``ndarray.clip`` (``_ndarray_clip``, cupy/_core/_routines_math.pyx) fills in a
bound of None only for dtype kinds 'f', 'i' and 'u'; bf16 (ml_dtypes, kind 'V') reaches
the ufunc with the None, which raises TypeError. NumPy's clip takes it, so the CPU never
showed it. Here the backend's ``xp.clip`` is made to refuse a None bound as CuPy's does,
on every device, and one-sided clamps must still give NumPy's values (NaN kept), dtype
and gradient. The op table checks clamp's values and gradients in float64, and its
one-sided bf16 rows run on a GPU without the stand-in.
"""
from __future__ import annotations

import numpy as np
import pytest

import minitorch_gpu as mt
from minitorch_gpu.backend import get_backend

VALUES = [-2.0, -0.5, np.nan, -0.0, 0.0, 0.25, 3.0, np.inf, -np.inf]
BOUND = 0.3  # rounds to 0.30078125 in bf16, as NumPy rounds it against a bf16 array


def host(t: mt.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy()


@pytest.fixture
def cupy_like_clip(device, monkeypatch):
    """The device's ``xp.clip`` refusing a None bound for a dtype kind other than 'f', 'i',
    'u', as CuPy's does; other calls go to the real clip."""
    xp = get_backend(device).xp
    real_clip = xp.clip

    def clip(a, a_min, a_max, out=None):
        if (a_min is None or a_max is None) and a.dtype.kind not in "fiu":
            raise TypeError(f"Wrong type ({a.dtype}, None) of arguments for cupy_clip")
        return real_clip(a, a_min, a_max, out=out)

    monkeypatch.setattr(xp, "clip", clip)
    return xp


def test_the_stand_in_refuses_as_cupy_does(cupy_like_clip):
    bf16 = np.array([1.0, -1.0], dtype=mt.bfloat16)
    with pytest.raises(TypeError, match="cupy_clip"):
        cupy_like_clip.clip(cupy_like_clip.asarray(bf16), 0.0, None)


@pytest.mark.parametrize("low, high, clamp", [
    (BOUND, None, lambda t: t.clamp(min=BOUND)),
    (None, BOUND, lambda t: mt.clamp(t, max=BOUND)),
    (BOUND, None, lambda t: t.clamp_min(BOUND)),
    (None, BOUND, lambda t: t.clamp_max(BOUND)),
    (BOUND, None, lambda t: t.clamp_(min=BOUND)),
    (None, BOUND, lambda t: t.clamp_(None, BOUND)),
], ids=["min", "max", "clamp_min", "clamp_max", "inplace-min", "inplace-max"])
@pytest.mark.parametrize("dtype", [mt.bfloat16, mt.float32])
def test_one_sided_clamp_keeps_dtype_values_and_nan(device, cupy_like_clip, low, high, clamp,
                                                   dtype):
    x = mt.tensor(VALUES, dtype=dtype, device=device)
    stored = host(x)
    out = clamp(x)
    expected = np.maximum(stored, low) if high is None else np.minimum(stored, high)
    assert out.dtype == dtype and out.device == device
    np.testing.assert_array_equal(host(out).astype(np.float64), expected.astype(np.float64))


def test_one_sided_clamp_of_bf16_passes_the_gradient_inside_the_bound(device,
                                                                      cupy_like_clip):
    x = mt.tensor(VALUES, dtype=mt.bfloat16, device=device, requires_grad=True)
    for low, high in ((BOUND, None), (None, BOUND)):
        x.grad = None
        x.clamp(low, high).sum().backward()
        stored = host(x).astype(np.float64)
        inside = stored >= np.float64(np.float32(BOUND).astype(mt.bfloat16)) if high is None \
            else stored <= np.float64(np.float32(BOUND).astype(mt.bfloat16))
        assert x.grad.dtype == mt.bfloat16  # NaN is inside no bound: gradient 0 there
        np.testing.assert_array_equal(host(x.grad).astype(np.float64), inside.astype(float))


def test_two_sided_and_integer_clamps_are_unchanged(device, cupy_like_clip):
    x = mt.tensor(VALUES, dtype=mt.bfloat16, device=device)
    np.testing.assert_array_equal(host(x.clamp(-1.0, 1.0)).astype(np.float64),
                                  np.clip(host(x), -1.0, 1.0).astype(np.float64))
    ints = mt.tensor([-3, 0, 5], device=device)
    assert host(ints.clamp(min=0)).tolist() == [0, 0, 5] and ints.clamp(min=0).dtype == mt.int64
    assert ints.clamp(max=0.5).dtype == mt.float32  # a float bound makes it float32
    assert host(ints.clamp(max=0.5)).tolist() == [-3.0, 0.0, 0.5]


def test_clamp_without_a_bound_is_an_error(device):
    x = mt.ones(3, device=device)
    with pytest.raises(ValueError, match="clamp: at least one of min and max must be given"):
        x.clamp()
    with pytest.raises(ValueError, match="clamp_: at least one of min and max must be given"):
        x.clamp_()
