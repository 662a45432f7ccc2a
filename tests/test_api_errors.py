"""Clean errors at the API's edges: bad data given to ``tensor``, mixed-dtype products, and
the CLI's one-line stops (a diverging run without NumPy's warnings, an empty corpus)."""
from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

import minitorch_gpu as mt
from minitorch_gpu.backend.threads import run_split, set_cpu_threads

F = mt.functional


# --- tensor(): ragged and non-numeric data ---------------------------------------------------
@pytest.mark.parametrize("data, message", [
    ([[1.0, 2.0], [3.0]],
     r"tensor: expected a sequence of length 2 at dim 1 \(got 1, at data\[1\]\)"),
    ([[[1, 2], [3, 4]], [[5, 6], [7]]],
     r"tensor: expected a sequence of length 2 at dim 2 \(got 1, at data\[1\]\[1\]\)"),
    ([[1], []], r"tensor: expected a sequence of length 1 at dim 1 \(got 0, at data\[1\]\)"),
    ([[1], 2], r"tensor: expected a sequence of length 1 at dim 1 \(got int 2, at data\[1\]\)"),
    ([1, [2]], r"tensor: expected a number at data\[1\], got a list of length 1 \(the first "
               r"elements give the shape \(2,\)\)"),
    ([mt.tensor([1.0, 2.0]), mt.tensor([3.0])],
     r"tensor: expected a sequence of length 2 at dim 1 \(got 1, at data\[1\]\)"),
    ([np.ones(2), np.ones((1, 2))], r"tensor: expected a sequence of length 2 at dim 1 \(got 1"),
    ([2 ** 70], r"tensor: 1180591620717411303424 at data\[0\] does not fit in a 64-bit integer"),
    ([2 ** 63], r"tensor: 9223372036854775808 does not fit in int64"),
], ids=lambda v: None)
def test_ragged_or_overflowing_data_is_a_value_error_naming_tensor(data, message):
    with pytest.raises(ValueError, match=message):
        mt.tensor(data)


@pytest.mark.parametrize("data, message", [
    (["a"], r"tensor: expected a number \(bool, int or float\) at data\[0\], got str 'a'"),
    ([[1, 2], [3, "x"]], r"at data\[1\]\[1\], got str 'x'"),
    ([1.0, None], r"tensor: expected a number \(bool, int or float\) at data\[1\], got None"),
    ([1j], r"at data\[0\], got complex 1j"),
    (None, r"tensor: expected a number or a \(nested\) sequence of numbers, got None"),
    ("abc", r"tensor: expected a number or a \(nested\) sequence of numbers, got str 'abc'"),
    ({1: 2}, r"got dict \{1: 2\}"),
    (object(), r"got object <object object at"),
    (np.array(["a"]),
     r"tensor: expected numbers \(bool, int or float\), got dtype <U1 \(ndarray\)"),
    (np.array([1, None], dtype=object), r"got dtype object \(ndarray\)"),
], ids=lambda v: None)
def test_non_numeric_data_is_a_type_error_naming_what_and_where(data, message):
    with pytest.raises(TypeError, match=message):
        mt.tensor(data)


def test_an_explicit_dtype_does_not_let_none_or_strings_through():
    # NumPy alone would give [1, nan] and parse "1.5"
    with pytest.raises(TypeError, match=r"at data\[1\], got None"):
        mt.tensor([1, None], dtype=mt.float32)
    with pytest.raises(TypeError, match=r"at data\[0\], got str '1.5'"):
        mt.tensor(["1.5"], dtype=mt.float32)
    with pytest.raises(ValueError, match=r"tensor: 3000000000 does not fit in int32"):
        mt.tensor([1, 3_000_000_000], dtype=mt.int32)  # not wrapped around


def test_a_list_that_contains_itself_is_refused():
    data: list = [1]
    data.append(data)
    with pytest.raises(ValueError, match="tensor: "):
        mt.tensor(data)


@pytest.mark.parametrize("data, dtype, shape", [
    ([1.0, 2.0], "float32", (2,)), ([[1, 2], (3, 4)], "int64", (2, 2)), ([True, 2], "int64", (2,)),
    ([1.5, True], "float32", (2,)), ([], "float32", (0,)), ([[], []], "float32", (2, 0)),
    (2.5, "float32", ()), (True, "bool", ()), ([np.uint8(3)], "int64", (1,)),
    ([mt.tensor(1.0), mt.tensor(2.0)], "float32", (2,)), (range(3), "int64", (3,)),
    (np.float64(1.5), "float64", ()), (np.ones(2, dtype=np.int32), "int32", (2,)),
], ids=lambda v: None)
def test_good_data_keeps_pytorchs_dtypes(data, dtype, shape):
    t = mt.tensor(data)
    assert (str(t.dtype), tuple(t.shape)) == (dtype, shape)


def test_bf16_arrays_and_explicit_dtypes_still_convert():
    assert mt.tensor([1.7], dtype="bf16").tolist() == [1.703125]
    assert mt.tensor(mt.zeros(2, dtype="bf16").numpy()).dtype == mt.bfloat16
    assert mt.tensor([300], dtype="int32").tolist() == [300]


@pytest.mark.parametrize("call, error, message", [
    (lambda: mt.randn(2, 3) + [[1, 2, 3], [4, 5]], ValueError,
     r"add: expected a sequence of length 3 at dim 1 \(got 2, at data\[1\]\)"),
    (lambda: mt.randn(3) * ["a", "b", "c"], TypeError, r"mul: expected a number .* got str 'a'"),
    (lambda: mt.randn(1) - np.array(["a"]), TypeError, r"sub: expected numbers .* dtype <U1"),
    (lambda: mt.full((2,), None), TypeError, "full: fill_value must be a number .* got None"),
    (lambda: mt.full((2,), "a"), TypeError, "full: fill_value must be a number .* got str 'a'"),
    (lambda: mt.full_like([1.0], 2.0), TypeError, "full_like: expected a Tensor, got list"),
    (lambda: mt.zeros_like([1.0]), TypeError, "zeros_like: expected a Tensor, got list"),
    (lambda: mt.from_numpy(np.array([None])), TypeError,
     r"from_numpy: expected numbers .* dtype object"),
], ids=lambda v: None)
def test_other_paths_from_data_name_their_op(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_the_ragged_check_matches_pytorchs_wording():
    torch = pytest.importorskip("torch")
    for data in ([[1.0, 2.0], [3.0]], [[[1, 2], [3, 4]], [[5, 6], [7]]], [[1], []]):
        with pytest.raises(ValueError) as theirs:
            torch.tensor(data)
        with pytest.raises(ValueError) as ours:
            mt.tensor(data)
        # "expected sequence of length 2 at dim 1 (got 1)" in both, ours naming tensor and where
        expected = str(theirs.value).replace("expected sequence", "expected a sequence")
        assert str(ours.value).startswith("tensor: " + expected[:-1] + ", at data")


# --- one promotion rule for products and elementwise ops ------------------------------------
@pytest.mark.parametrize("a_dtype, b_dtype", [
    ("float32", "int64"), ("int64", "float32"), ("float32", "int32"), ("int32", "int64"),
    ("float32", "float64"), ("bfloat16", "float32"), ("bfloat16", "int64"), ("float64", "bool"),
])
def test_matmul_promotes_as_add_does(a_dtype, b_dtype, device):
    a = mt.tensor(np.arange(6).reshape(2, 3) % 3, dtype=a_dtype, device=device)
    b = mt.tensor(np.arange(12).reshape(3, 4) % 2, dtype=b_dtype, device=device)
    product = a @ b
    assert product.dtype == (a[:, :1] + b[:1]).dtype  # (2, 1) + (1, 4): the same pair
    expected = np.asarray(a.tolist(), np.float64) @ np.asarray(b.tolist(), np.float64)
    np.testing.assert_allclose(np.asarray(product.float().tolist()), expected)


def test_the_issues_mixed_product_is_float32_with_a_float32_gradient():
    a = mt.randn(2, 3, requires_grad=True)
    b = mt.tensor([[1], [2], [3]])
    out = a @ b
    assert out.dtype == (a + b.T).dtype == mt.float32
    out.sum().backward()
    assert a.grad.dtype == mt.float32
    np.testing.assert_allclose(a.grad.numpy(), np.tile([1.0, 2.0, 3.0], (2, 1)))
    assert (b.T @ a.detach().T).dtype == mt.float32  # either side
    assert (a.detach() @ [[1], [2], [3]]).dtype == mt.float32  # a list of ints too


def test_matmul_and_linear_follow_torch_result_type():
    torch = pytest.importorskip("torch")
    pairs = [("float32", "int64"), ("int32", "int64"), ("float32", "float64"),
             ("bfloat16", "float32"), ("bfloat16", "int64"), ("uint8", "int32")]
    for da, db in pairs:
        ta = torch.zeros(2, 3, dtype=getattr(torch, da))
        tb = torch.zeros(3, 2, dtype=getattr(torch, db))
        expected = str(torch.result_type(ta, tb)).replace("torch.", "")
        assert str((mt.zeros(2, 3, dtype=da) @ mt.zeros(3, 2, dtype=db)).dtype) == expected
    x, w = mt.randn(2, 3), mt.randn(4, 3, dtype="float64")
    assert F.linear(x, w).dtype == mt.float64  # floats of two widths: the wider
    assert F.linear(x.to("bf16"), w.float(), mt.zeros(4, dtype="bf16")).dtype == mt.float32
    with pytest.raises(TypeError, match="linear: expected a floating-point input, got int64"):
        F.linear(mt.tensor([[1, 2, 3]]), w)  # layers take floats only, as in PyTorch


def test_matmul_under_autocast_lowers_floats_and_promotes_integers(device):
    a, b = mt.randn(2, 3, device=device), mt.tensor([[1], [2], [3]], device=device)
    with mt.autocast("bf16"):
        assert (a @ b).dtype == mt.bfloat16


# --- NumPy's floating-point warnings ----------------------------------------------------------
def test_split_work_runs_under_the_callers_errstate():
    x = np.full((4, 8), 3e38, np.float32)

    def double(rows):
        x[rows] *= 2  # overflows to inf

    set_cpu_threads(2)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with np.errstate(over="ignore"):
                run_split(double, [slice(0, 2), slice(2, 4)])  # the worker's half too
        assert np.isinf(x).all()
        x[:] = 3e38
        with pytest.raises(FloatingPointError):
            with np.errstate(over="raise"):
                run_split(double, [slice(0, 2), slice(2, 4)])
    finally:
        set_cpu_threads(None)


# --- the CLI: one line, no NumPy warnings -----------------------------------------------------
CONFIG = """\
model: {{n_layer: 1, n_head: 2, n_embd: 16, block_size: 16, dropout: 0.0}}
data: {{source: text_files, path: {corpus}, tokenizer: char, cache_dir: {cache}}}
train: {{batch_size: 4, max_iters: 12, warmup_iters: 2, lr: 3.0e-3, log_interval: 4}}
eval: {{interval: 6, iters: 2}}
checkpoint: {{dir: {ckpts}}}
system: {{seed: 7}}
"""


@pytest.fixture
def workdir(tmp_path):
    rng = np.random.default_rng(0)
    words = ["the", "king", "queen", "said", "and", "to", "my", "lord"]
    (tmp_path / "corpus.txt").write_text(
        "".join(" ".join(rng.choice(words, 8)) + ".\n" for _ in range(300)))
    (tmp_path / "run.yaml").write_text(CONFIG.format(
        corpus=tmp_path / "corpus.txt", cache=tmp_path / "cache", ckpts=tmp_path / "ckpts"))
    return tmp_path


def train(workdir: Path, *overrides: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "MINITORCH_GPU_CACHE": str(workdir / "cache"), "PYTHONUNBUFFERED": "1"}
    env.pop("PYTHONWARNINGS", None)  # NumPy's warnings as a user sees them
    args = [a for o in overrides for a in ("--set", o)]
    return subprocess.run([sys.executable, "-m", "minitorch_gpu", "train", "run.yaml", *args],
                          cwd=workdir, capture_output=True, text=True, timeout=240, env=env)


@pytest.mark.parametrize("overrides", [
    ("train.lr=1e6",),
    ("train.lr=1e4", "train.grad_clip=0"),
    ("train.lr=1e8", "eval.interval=2", "train.log_interval=8"),
], ids=["huge-lr", "no-clipping", "nan-at-evaluation"])
def test_a_diverging_run_stops_with_one_line_and_no_numpy_warnings(workdir, overrides):
    run = train(workdir, *overrides)
    assert run.returncode == 1, run.stderr
    assert "Warning" not in run.stderr and "Traceback" not in run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "became nan at iteration" in lines[0], run.stderr


@pytest.mark.parametrize("text, expected", [
    ("", "the corpus is empty: text_files '{path}' holds no text"),
    (" \n\t\n", "the corpus is empty: text_files '{path}' holds only whitespace (4 characters)"),
    ("ab", "the corpus is too small: text_files '{path}' gave 3 characters, 3 tokens, split "
           "into 3 train and 0 val tokens (data.val_fraction=0.1: an empty val split)"),
    ("abcdefghijklmnopqrstuvwxyz" * 4, "the corpus is too short for one window: text_files "
                                       "'{path}': the val split has 10 tokens, fewer than "
                                       "model.block_size + 1 = 17"),
], ids=["empty", "whitespace", "empty-val-split", "shorter-than-a-window"])
def test_an_empty_or_too_short_corpus_is_one_line_naming_source_and_sizes(workdir, text,
                                                                         expected):
    path = workdir / "small.txt"
    path.write_text(text)
    run = train(workdir, f"data.path={path}")
    assert run.returncode == 2, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in run.stderr, run.stderr
    assert expected.format(path=path) in lines[0]
    assert "1 characters give 1 tokens" not in run.stdout + run.stderr
