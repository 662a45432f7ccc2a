"""The fused CUDA kernels (minitorch_gpu/backend/kernels), in three parts:

1. Every .cu source compiles with nvcc for sm_80 and sm_90 (skipped without nvcc), is
   written for NVRTC (no includes, no host-only macros), and agrees with its Python
   loader on kernel names and launch shapes.
2. The NumPy twins of the tiled algorithms (``tests/kernel_twins.py``: flash attention
   forward and backward, the fused softmax + cross-entropy) against the vectorised ops,
   in float64 to 1e-10 and float32 to 1e-5, and the strides through which the attention
   kernels read q, k, v in place (bf16 too, widened exactly). This runs anywhere and is
   what shows the algorithm the .cu files implement is right.
3. On a GPU (marked ``cuda``, skipped elsewhere): each kernel, reached through the op
   that dispatches to it, against the NumPy ops on the CPU, forward and backward, on
   odd sizes (sequence lengths off the tile, vocabularies off the block, head dims 32,
   64, 128 and odd ones), ignored targets, and AdamW against the NumPy update; flash
   attention also through its launchers on GPT's packed bf16/float32/fp16 heads (no
   copies), on 8192 positions and on more (batch, head) problems than a grid's y holds.
"""
from __future__ import annotations

import concurrent.futures
import math
import os
import re
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import minitorch_gpu as mt
import minitorch_gpu.functional as F
from minitorch_gpu.backend import kernels
from minitorch_gpu.backend.kernels import loader as kernel_loader
from minitorch_gpu.ops import attention as attention_ops

import kernel_twins as reference
from conftest import gpu_only

NVCC = shutil.which("nvcc")
BF16 = mt.bfloat16
ARCHS = ("80", "90")
ATTENTION_HEAD_DIMS = (32, 64, 128, 17)  # 17: a head dim that is not a multiple of a warp
LLAMA_SOURCES = ("rmsnorm.cu", "rotary.cu", "swiglu.cu")  # INPUT_DTYPE 0 (float32), 1 (bf16)


def source(name: str) -> str:
    return kernels.source_text(name)


# --- 1. sources -----------------------------------------------------------------------------
def compile_jobs() -> list:
    """(source, extra nvcc options) for every build the loader can ask for."""
    jobs = [(name, ()) for name in kernels.SOURCES if name != "attention.cu"]
    jobs += [("attention.cu", (f"-DHEAD_DIM={d}",)) for d in ATTENTION_HEAD_DIMS]
    # the storage dtypes the attention kernels read: bf16 at every head dim, fp16 at one
    jobs += [("attention.cu", (f"-DHEAD_DIM={d}", "-DINPUT_DTYPE=1"))
             for d in ATTENTION_HEAD_DIMS]
    jobs += [("attention.cu", ("-DHEAD_DIM=64", "-DINPUT_DTYPE=2"))]
    jobs += [("attention_softmax.cu", ("-DPROB_BF16=1",))]
    jobs += [(name, ("-DINPUT_DTYPE=1",)) for name in LLAMA_SOURCES]  # bf16 storage
    return jobs


def job_id(job: tuple) -> str:
    name, options = job
    return name + "".join(o.replace("-D", "-") for o in options)


@pytest.fixture(scope="module")
def nvcc_results(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Every compile of compile_jobs(), run in parallel once: job id -> CompletedProcess.
    One nvcc call builds both architectures (a fatbin of sm_80 and sm_90 cubins)."""
    if NVCC is None:
        pytest.skip("nvcc is not on PATH")
    out_dir = tmp_path_factory.mktemp("cubins")
    gencode = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in ARCHS]

    def build(job: tuple) -> subprocess.CompletedProcess:
        name, options = job
        command = [NVCC, "-std=c++17", "-fatbin", *gencode, "-Werror", "all-warnings",
                   *options, "-o", str(out_dir / f"{job_id(job)}.fatbin"),
                   str(kernels.SOURCE_DIR / name)]
        return subprocess.run(command, capture_output=True, text=True, timeout=300)

    jobs = compile_jobs()
    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        return dict(zip(map(job_id, jobs), pool.map(build, jobs)))


@pytest.mark.parametrize("job", compile_jobs(), ids=job_id)
def test_source_compiles_for_sm80_and_sm90(nvcc_results: dict, job: tuple) -> None:
    result = nvcc_results[job_id(job)]
    assert result.returncode == 0, f"nvcc failed on {job_id(job)}:\n{result.stderr}"


def test_attention_source_refuses_a_missing_or_too_large_head_dim(tmp_path: Path) -> None:
    if NVCC is None:
        pytest.skip("nvcc is not on PATH")
    for options, macro in (((), "HEAD_DIM"), (("-DHEAD_DIM=129",), "HEAD_DIM"),
                           (("-DHEAD_DIM=64", "-DINPUT_DTYPE=3"), "INPUT_DTYPE")):
        result = subprocess.run(
            [NVCC, "-std=c++17", "--cubin", "-arch=sm_80", *options, "-o",
             str(tmp_path / "a.cubin"), str(kernels.SOURCE_DIR / "attention.cu")],
            capture_output=True, text=True, timeout=300)
        assert result.returncode != 0 and macro in result.stderr, options


@pytest.mark.parametrize("name", LLAMA_SOURCES)
def test_llama_sources_refuse_an_unknown_input_dtype(name: str, tmp_path: Path) -> None:
    if NVCC is None:
        pytest.skip("nvcc is not on PATH")
    result = subprocess.run(
        [NVCC, "-std=c++17", "--cubin", "-arch=sm_80", "-DINPUT_DTYPE=2", "-o",
         str(tmp_path / "a.cubin"), str(kernels.SOURCE_DIR / name)],
        capture_output=True, text=True, timeout=300)
    assert result.returncode != 0 and "INPUT_DTYPE" in result.stderr


@pytest.mark.parametrize("name", kernels.SOURCES)
def test_source_is_written_for_nvrtc(name: str) -> None:
    """cupy.RawModule compiles with NVRTC, which has no host headers: nvcc alone would
    accept an #include <cmath> or INFINITY that NVRTC rejects."""
    text = source(name)
    code = re.sub(r"//[^\n]*", "", text)  # comments may mention anything
    assert "#include" not in code, f"{name}: NVRTC sources here take no includes"
    for host_only in ("INFINITY", "NAN", "std::", "printf", "malloc", "FLT_MAX"):
        assert not re.search(rf"\b{re.escape(host_only)}\b", code), f"{name}: {host_only}"
    assert re.search(r'extern "C" __global__', code), f"{name}: no extern \"C\" kernel"


def defined(name: str, macro: str) -> str:
    """The text of ``#define macro ...`` in source ``name`` (up to a comment)."""
    match = re.search(rf"^#define {macro}\s+(.+?)\s*(//.*)?$", source(name), re.MULTILINE)
    assert match, f"{name}: no #define {macro}"
    return match.group(1)


def test_loader_launch_shapes_match_the_sources() -> None:
    """The kernels index threads by these #defines; the loader launches by its constants."""
    assert int(defined("layernorm.cu", "WARPS_PER_BLOCK")) == kernels.LAYERNORM_WARPS_PER_BLOCK
    assert int(defined("layernorm.cu", "COLUMN_THREADS")) == kernels.LAYERNORM_COLUMN_THREADS
    assert int(defined("gelu.cu", "GELU_THREADS")) == kernels.ELEMENTWISE_THREADS
    assert int(defined("adamw.cu", "ADAMW_THREADS")) == kernels.ELEMENTWISE_THREADS
    assert int(defined("cross_entropy.cu", "CE_THREADS")) == kernels.CROSS_ENTROPY_THREADS
    assert int(defined("cross_entropy.cu", "CE_THREADS")) == reference.CE_THREADS
    assert int(defined("attention.cu", "WARPS")) == kernels.ATTENTION_WARPS == reference.WARPS
    assert int(defined("attention.cu", "TILE")) == reference.TILE
    assert int(defined("attention.cu", "FWD_ROWS")) == kernels.ATTENTION_FORWARD_ROWS \
        == reference.FWD_ROWS
    assert defined("attention.cu", "BWD_ROWS") == "(HEAD_DIM > 64 ? 2 : 4)"
    # INPUT_DTYPE's values: the C type each one reads, and the dtype the loader maps to it
    storage = dict(re.findall(r"^#(?:el)?if INPUT_DTYPE == (\d)\ntypedef (\w+) input_t;",
                              source("attention.cu"), re.MULTILINE))
    assert storage == {"0": "float", "1": "bf16_bits", "2": "fp16_bits"}
    assert kernels.ATTENTION_INPUT_DTYPES == {"float32": 0, "bfloat16": 1, "float16": 2}
    for dtype, code in ((np.float32, 0), (BF16, 1), (np.float16, 2), (np.float64, None)):
        assert kernels.attention_input_code(dtype) == code
    assert int(defined("attention_softmax.cu", "SOFTMAX_THREADS")) == kernels.SOFTMAX_THREADS
    for head_dim in (1, 64, 65, 128):
        expected = 2 if head_dim > 64 else 4
        assert kernels.attention_backward_rows(head_dim) == reference.bwd_rows(head_dim) \
            == expected
    # Llama's kernels
    assert int(defined("rmsnorm.cu", "WARPS_PER_BLOCK")) == kernels.RMS_NORM_WARPS_PER_BLOCK \
        == reference.RMS_WARPS_PER_BLOCK
    assert int(defined("rmsnorm.cu", "COLUMN_THREADS")) == kernels.RMS_NORM_COLUMN_THREADS \
        == reference.RMS_COLUMN_THREADS
    assert int(defined("rotary.cu", "ROTARY_THREADS")) == kernels.ELEMENTWISE_THREADS
    assert int(defined("swiglu.cu", "SWIGLU_THREADS")) == kernels.ELEMENTWISE_THREADS
    assert kernels.INPUT_DTYPES == {"float32": 0, "bfloat16": 1}
    for name in LLAMA_SOURCES:
        storage = dict(re.findall(r"^#(?:el)?if INPUT_DTYPE == (\d)\ntypedef (\w+) input_t;",
                                  source(name), re.MULTILINE))
        assert storage == {"0": "float", "1": "bf16_bits"}, name
    assert kernels.rms_norm_chunks(100) == (64, 2)
    assert kernels.rms_norm_chunks(64 * 65535 + 1) == (65, 64527)  # grid.y <= 65535


def test_every_kernel_the_loader_launches_is_in_its_source() -> None:
    loader = "".join(path.read_text(encoding="utf-8")
                     for path in sorted(kernels.SOURCE_DIR.glob("*.py")))
    launches = re.findall(r'_kernel\(\w+, "(\w+\.cu)", "(\w+)"', loader)
    assert len(launches) >= 10
    for filename, kernel in launches:
        declaration = rf'extern "C" __global__ void (__launch_bounds__\([^)]*\)\s+)?{kernel}\('
        assert re.search(declaration, source(filename)), f"{filename} has no kernel {kernel}"


C_SCALARS = {"float": np.float32, "int": np.int32, "long long": np.int64,
             "unsigned int": np.uint32, "unsigned long long": np.uint64}


def c_parameters(filename: str, kernel: str) -> list:
    """The parameter declarations of ``kernel`` in ``filename``, e.g. "const float* x"."""
    match = re.search(rf"\b{kernel}\(([^)]*)\)\s*\{{", source(filename))
    assert match, f"{filename}: no definition of {kernel}"
    return [p.strip() for p in match.group(1).split(",")]


def kernels_input_dtype(code: int) -> np.dtype:
    """The dtype attention.cu's INPUT_DTYPE ``code`` reads."""
    return np.dtype({0: np.float32, 1: BF16, 2: np.float16}[code])


def assert_strides_read(array: np.ndarray, args: dict, name: str) -> None:
    """The kernels read element (b, h, i, d) of input ``name`` at b * name_batch + h *
    name_head + i * name_row + d (heads = args["heads"]), and of q and dO, which have a
    group stride, element (b, h, g, i, d) at that + g * name_group (g < args["group"]):
    that must be array's element (..., i, d) at flat batch index (b * heads + h) * G + g."""
    n, E = array.shape[-2:]
    heads = int(args["heads"])
    group = int(args["group"]) if f"{name}_group" in args else 1
    parts = ("batch", "head", "group", "row") if f"{name}_group" in args else \
        ("batch", "head", "row")
    strides = [int(args[f"{name}_{part}"]) for part in parts]
    if len(strides) == 3:
        strides.insert(2, 0)
    problems = array.size // (n * E)
    assert problems % (heads * group) == 0, (name, problems, heads, group)
    read = np.lib.stride_tricks.as_strided(
        array, (problems // (heads * group), heads, group, n, E),
        tuple(s * array.itemsize for s in (*strides, 1)), writeable=False)
    np.testing.assert_array_equal(read.reshape(array.shape), array, err_msg=name)


def assert_rotary_strides_read(array: np.ndarray, args: dict, name: str) -> None:
    """rotary.cu reads element (b, t, h, d) of ``name`` at b * name_batch + t * name_time +
    h * name_head + d: that must be array's own element."""
    strides = [int(args[f"{name}_{part}"]) for part in ("batch", "time", "head")]
    read = np.lib.stride_tricks.as_strided(
        array, array.shape, tuple(s * array.itemsize for s in (*strides, 1)), writeable=False)
    np.testing.assert_array_equal(read, array, err_msg=name)


def test_launchers_pass_each_kernel_its_c_signature(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every launcher, with NumPy standing in for CuPy and a stub for each kernel that
    checks the launch against the kernel's C parameters: count, pointers as contiguous
    arrays of the pointee's type (attention's inputs as arrays whose last dim is contiguous,
    which its x_batch, x_head and x_row strides read exactly), scalars as the NumPy type of
    the C type, a sane grid."""
    launched, launches = [], []

    def stub_kernel(like, filename, name, **defines):
        params = c_parameters(filename, name)

        def launch(grid, block, args):
            assert len(args) == len(params), f"{name}: {len(args)} args, {len(params)} params"
            by_name = {param.rsplit(" ", 1)[1]: arg for param, arg in zip(params, args)}
            for param, arg in zip(params, args):
                declared = param.rsplit(" ", 1)[0].replace("const", "").replace(
                    "__restrict__", "").strip()
                if declared.endswith("*") and declared[:-1].strip() == "input_t":
                    # float, bf16's or fp16's bits: attention.cu's read through (batch,
                    # head, row) strides, rotary.cu's x through (batch, time, head)
                    assert isinstance(arg, np.ndarray), param
                    assert arg.dtype == kernels_input_dtype(defines["INPUT_DTYPE"]), param
                    pointer = param.rsplit(" ", 1)[1]
                    if filename == "attention.cu":
                        assert_strides_read(arg, by_name, pointer)
                    elif f"{pointer}_time" in by_name:
                        assert_rotary_strides_read(arg, by_name, pointer)
                    else:
                        assert arg.flags.c_contiguous, param
                elif declared.endswith("*"):
                    assert isinstance(arg, np.ndarray) and arg.flags.c_contiguous, param
                    pointee = declared[:-1].strip()
                    if pointee == "prob_t":  # attention_softmax.cu: float, or bf16's bits
                        pointee = "bf16" if defines["PROB_BF16"] else "float"
                    assert arg.dtype == {**C_SCALARS, "bf16": BF16}[pointee], (name, param)
                else:
                    assert type(arg) is C_SCALARS[declared], (name, param, type(arg))
            assert 1 <= len(grid) <= 2 and min(grid) >= 1 and grid[1:] <= (65535,), grid
            assert block[0] % 32 == 0, block
            launched.append(name)
            launches.append((name, args))
        return launch

    # NumPy standing in for CuPy, its empty arrays zeros: no kernel runs to fill them, and
    # garbage in them would make the launchers' own host-side sums warn at random
    numpy_zeroed = SimpleNamespace(**{name: getattr(np, name) for name in dir(np)
                                      if not name.startswith("_")})
    numpy_zeroed.empty, numpy_zeroed.empty_like = np.zeros, np.zeros_like
    monkeypatch.setattr(kernel_loader, "require_cupy", lambda: numpy_zeroed)
    monkeypatch.setattr(kernel_loader, "load_kernel", stub_kernel)
    f32 = np.float32
    x = np.random.default_rng(0).standard_normal((3, 5, 33)).astype(f32)
    for dims in (1, 2):
        y, mean, rstd = kernels.layer_norm_forward(x, None, None, 1e-5, dims)
        assert y.shape == x.shape and mean.shape == rstd.shape == x.shape[:3 - dims]
        _, dw, db = kernels.layer_norm_backward(x, x, None, mean, rstd, dims)
        assert dw.shape == db.shape == x.shape[3 - dims:]
    kernels.gelu_forward(x.transpose(2, 0, 1), "tanh")
    kernels.gelu_backward(x, x, "none")
    logits, ids = x.reshape(15, 33), np.arange(15, dtype=np.int32)
    loss, lse = kernels.cross_entropy_forward(logits, ids, -100, 0.1)
    for dloss in (f32(0.5), np.ones(15, f32)):
        kernels.cross_entropy_backward(logits, ids, lse, dloss, -100, 0.1)
    p = np.zeros(10, f32)
    kernels.adamw_update(p, p, p.copy(), p.copy(), lr=0.1, beta1=0.9, beta2=0.99, eps=1e-8,
                         weight_decay=0.1, step=3)
    # Llama's kernels, float32 and bf16; rotary on (B, T, H, D) views of a fused projection
    # (read in place) and on a transposed one (last dim strided: copied)
    for dtype in (f32, BF16):
        xs = x.astype(dtype)
        for n, weight in ((33, np.ones(33, f32)), (99, None)):
            out, rstd = kernels.rms_norm_forward(xs.transpose(1, 0, 2).copy(), weight, 1e-5,
                                                 n)
            assert out.shape == (5, 3, 33) and out.dtype == dtype
            assert rstd.shape == (5 * 3 * 33 // n,)
            grad_x, grad_w = kernels.rms_norm_backward(out.astype(f32), out, weight, rstd, n)
            assert grad_x.dtype == f32 and grad_x.shape == out.shape
            assert (grad_w is None) == (weight is None)
            assert weight is None or (grad_w.shape == (33,) and grad_w.dtype == f32)
        fused = np.zeros((2, 7, (4 + 2 * 2) * 16), dtype)  # (B, T, (H + 2 Hkv) D)
        q = fused[..., :64].reshape(2, 7, 4, 16)
        k = fused[..., 64:96].reshape(2, 7, 2, 16)
        table = np.zeros((7, 8), f32)
        bhtd = np.zeros((2, 4, 7, 16), dtype).transpose(0, 2, 1, 3)
        strided = np.zeros((2, 7, 4, 32), dtype)[..., ::2]
        for heads, inverse in ((q, False), (k, True), (bhtd, False), (strided, True)):
            copied = []
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(kernel_loader, "contiguous", lambda a: a if a.flags.c_contiguous
                              else copied.append(a) or np.ascontiguousarray(a))
                out = kernels.rotary_forward(heads, table, table, inverse)
            assert out.shape == heads.shape and out.dtype == dtype and out.flags.c_contiguous
            assert [a is heads for a in copied] == ([True] if heads is strided else [])
        gate, up = fused[..., :64], fused[..., 64:128]  # strided halves: copied
        out = kernels.swiglu_forward(gate, up)
        assert out.shape == gate.shape and out.dtype == dtype
        grads = kernels.swiglu_backward(out, gate, up)
        assert [(g.shape, g.dtype) for g in grads] == [(gate.shape, f32)] * 2
    q = np.zeros((2, 3, 64, 45), f32).transpose(0, 1, 3, 2)  # a non-contiguous view
    o, lse = kernels.flash_attention_forward(q, q, q, True, 0.1)
    assert o.shape == q.shape and lse.shape == (2, 3, 45)
    grads = kernels.flash_attention_backward(q, q, q, o, o, lse, True, 0.1)
    assert [g.shape for g in grads] == [q.shape] * 3
    # GPT's heads in bf16, (B, nh, T, hs) views of (B, T, 3C): read in place, never copied
    qkv = np.random.default_rng(1).standard_normal((2, 45, 3, 3, 16)).astype(BF16)
    heads = [qkv[:, :, i].transpose(0, 2, 1, 3) for i in range(3)]
    do = np.random.default_rng(2).standard_normal((2, 45, 3, 16)).astype(BF16)
    do = do.transpose(0, 2, 1, 3)  # a head view of the (B, T, C) gradient

    def no_copy(a):
        assert a.flags.c_contiguous, f"copied an array of strides {a.strides}"
        return a
    monkeypatch.setattr(kernel_loader, "contiguous", no_copy)
    for causal in (True, False):
        del launches[:]
        o, lse = kernels.flash_attention_forward(*heads, causal, 0.25)
        assert o.dtype == lse.dtype == f32 and o.shape == (2, 3, 45, 16)
        assert o.flags.c_contiguous
        grads = kernels.flash_attention_backward(*heads, o, do, lse, causal, 0.25)
        assert [(g.shape, g.dtype) for g in grads] == [((2, 3, 45, 16), f32)] * 3
        for name, args in launches:
            inputs = [a for a in args if isinstance(a, np.ndarray) and a.dtype == BF16]
            assert inputs and all(any(a is b for b in (*heads, do)) for a in inputs), name
    # grouped-query attention: q (B, Hkv, G, T, hs) views of a fused (B, T, (Hq + 2 Hkv) hs)
    # projection, k and v (B, Hkv, 1, T, hs) views of it; dk, dv in k's shape
    B, T, Hkv, G, hs = 2, 45, 2, 3, 16
    fused = np.random.default_rng(3).standard_normal((B, T, Hkv * (G + 2), hs)).astype(BF16)
    q = fused[:, :, :Hkv * G].reshape(B, T, Hkv, G, hs).transpose(0, 2, 3, 1, 4)
    k, v = (fused[:, :, Hkv * (G + i):Hkv * (G + i + 1)].transpose(0, 2, 1, 3)[:, :, None]
            for i in (0, 1))
    do = np.zeros((B, T, Hkv, G, hs), BF16).transpose(0, 2, 3, 1, 4)
    assert kernels.attention_group(q, k, v) == G
    for causal in (True, False):
        del launches[:]
        o, lse = kernels.flash_attention_forward(q, k, v, causal, 0.25)
        assert o.shape == q.shape and lse.shape == q.shape[:-1]
        grads = kernels.flash_attention_backward(q, k, v, o, do, lse, causal, 0.25)
        assert [g.shape for g in grads] == [q.shape, k.shape, v.shape]
        for name, args in launches:
            inputs = [a for a in args if isinstance(a, np.ndarray) and a.dtype == BF16]
            assert inputs and all(any(a is b for b in (q, k, v, do)) for a in inputs), name
    scores = np.zeros((2, 3, 45, 50), f32)
    seed = np.ones(1, np.uint64)
    for dtype, dropout_p in ((f32, 0.0), (BF16, 0.1)):
        probs, attended = kernels.attention_softmax_forward(scores, True, 0.1, dropout_p, seed,
                                                            dtype)
        assert probs.shape == attended.shape == scores.shape and probs.dtype == dtype
        assert (attended is probs) == (dropout_p == 0.0)
        d_scores = kernels.attention_softmax_backward(scores, probs, 0.1, dropout_p, seed)
        assert d_scores.shape == scores.shape and d_scores.dtype == dtype
    kernel_names = re.findall(r'extern "C" __global__ void (?:__launch_bounds__\([^)]*\)\s+)?'
                              r"(\w+)\(", "".join(map(source, kernels.SOURCES)))
    assert sorted(set(launched)) == sorted(kernel_names)


def test_the_cuda_kernels_are_absent_on_the_cpu() -> None:
    """The CPU offers its own kernels (backend/cpu_kernels, where numba is installed), never
    these; switched off, none."""
    cpu = mt.get_backend("cpu")
    assert cpu.fused_kernels() is not kernels
    cpu.use_fused_kernels = False
    try:
        assert cpu.fused_kernels() is None
    finally:
        cpu.use_fused_kernels = True


def test_dispatch_rules() -> None:
    """What each op hands to a kernel (checked on NumPy arrays: the rules need no GPU)."""
    f32, f64 = np.zeros((3, 5), np.float32), np.zeros((3, 5))
    assert kernels.supports_layer_norm(f32, None, np.zeros(5, np.float32))
    assert not kernels.supports_layer_norm(f64, None, None)
    assert not kernels.supports_layer_norm(np.zeros((0, 5), np.float32), None, None)
    assert kernels.supports_gelu(f32.T) and not kernels.supports_gelu(f64)
    ids = np.zeros(3, np.int64)
    assert kernels.supports_cross_entropy(f32, ids)
    assert not kernels.supports_cross_entropy(f64, ids)
    assert not kernels.supports_cross_entropy(f32, ids.astype(np.float32))
    assert kernels.supports_adamw(f32, f32.T.copy().T, f32, f32)
    assert not kernels.supports_adamw(f32.T, f32.T, f32.T, f32.T)  # updated in place
    q = np.zeros((2, 3, 7, 64), np.float32)
    assert kernels.supports_flash_attention(q, q, q, None, 0.0)
    assert kernels.supports_flash_attention(q, q[..., :5, :], q[..., :5, :], None, 0.0)
    assert not kernels.supports_flash_attention(q, q, q, np.ones((7, 7), bool), 0.0)
    assert not kernels.supports_flash_attention(q, q, q, None, 0.1)
    assert not kernels.supports_flash_attention(q, q[:1], q[:1], None, 0.0)  # broadcast
    assert not kernels.supports_flash_attention(q, q, q[..., :32], None, 0.0)  # Ev != E
    big = np.zeros((1, 7, 129), np.float32)
    assert not kernels.supports_flash_attention(big, big, big, None, 0.0)
    assert not kernels.supports_flash_attention(q.astype(np.float64), q, q, None, 0.0)
    # read as stored: bf16 and fp16 of one dtype; strided heads (GPT's packed views) too
    for narrow in (q.astype(BF16), q.astype(np.float16)):
        assert kernels.supports_flash_attention(narrow, narrow, narrow, None, 0.0)
    assert not kernels.supports_flash_attention(q.astype(BF16), q, q, None, 0.0)
    qkv = np.zeros((2, 7, 3, 3, 64), BF16)  # (B, T, 3, nh, hs)
    heads = [qkv[:, :, i].transpose(0, 2, 1, 3) for i in range(3)]
    assert kernels.supports_flash_attention(*heads, None, 0.0)
    # the grid is one flat row of up to 2^31 - 1 blocks: past 65535 problems is fine, and
    # so is a long sequence; positions stop at MAX_SEQUENCE (zero-stride arrays: no memory)
    many = np.broadcast_to(np.zeros(64, np.float32), (70000, 3, 64))
    assert kernels.supports_flash_attention(many, many, many, None, 0.0)
    long = np.broadcast_to(np.zeros(64, BF16), (1, 12, 2 ** 20, 64))
    assert kernels.supports_flash_attention(long, long, long, None, 0.0)
    too_long = np.broadcast_to(np.zeros(1, np.float32), (kernels.MAX_SEQUENCE + 1, 1))
    assert not kernels.supports_flash_attention(too_long, too_long, too_long, None, 0.0)
    too_many = np.broadcast_to(np.zeros(1, np.float32), (2 ** 27, 1024, 1))  # 2^33 blocks
    assert not kernels.supports_flash_attention(too_many, too_many, too_many, None, 0.0)
    # grouped-query attention: q (..., Hkv, G, L, E) over k, v (..., Hkv, 1, S, E)
    gq, gk = np.zeros((2, 3, 4, 7, 64), np.float32), np.zeros((2, 3, 1, 9, 64), np.float32)
    assert kernels.supports_flash_attention(gq, gk, gk, None, 0.0)
    assert kernels.attention_group(gq, gk, gk) == 4 and kernels.attention_group(q, q, q) == 1
    assert not kernels.supports_flash_attention(gq, gk[:1], gk[:1], None, 0.0)
    assert not kernels.supports_flash_attention(gq, gk, gq[..., :9, :], None, 0.0)
    assert kernels.supports_flash_attention(gq[0], gk[0], gk[0], None, 0.0)  # (Hkv, G, L, E)
    assert not kernels.supports_flash_attention(gq[0, 0], gk[0, 0], gk[0, 0], None, 0.0)  # no Hkv


def test_launchers_name_bad_arguments() -> None:
    """The checks run before CuPy is touched, so they are testable here."""
    q = np.zeros((2, 7, 64), np.float32)
    with pytest.raises(TypeError, match="flash_attention_forward: q must be float32, "
                                        "bfloat16 or float16, got float64"):
        kernels.flash_attention_forward(q.astype(np.float64), q, q, True, 0.1)
    with pytest.raises(TypeError, match="flash_attention_forward: q, k, v must share one "
                                        "dtype, got v bfloat16 with q float32"):
        kernels.flash_attention_forward(q, q, q.astype(BF16), True, 0.1)
    with pytest.raises(TypeError, match="flash_attention_backward: do must be float64, "
                                        "float32, bfloat16 or float16, got int64"):
        o, lse = np.zeros(q.shape, np.float32), np.zeros(q.shape[:-1], np.float32)
        kernels.flash_attention_backward(q, q, q, o, o.astype(np.int64), lse, True, 0.1)
    with pytest.raises(ValueError, match=r"needs 1 to 1073741824 queries and keys, got "
                                         r"L=1073741825, S=1"):
        long = np.broadcast_to(np.zeros(1, np.float32), (kernels.MAX_SEQUENCE + 1, 1))
        kernels.flash_attention_forward(long, long[:1], long[:1], True, 0.1)
    with pytest.raises(ValueError, match=r"head_dim must be in \[1, 128\], got 200"):
        big = np.zeros((2, 7, 200), np.float32)
        kernels.flash_attention_forward(big, big, big, True, 0.1)
    with pytest.raises(ValueError, match="share their batch dims"):
        kernels.flash_attention_forward(q, q[:1], q[:1], True, 0.1)
    with pytest.raises(ValueError, match=r"targets has shape \(2,\), expected \(3,\)"):
        kernels.cross_entropy_forward(np.zeros((3, 5), np.float32), np.zeros(2, np.int64))
    with pytest.raises(TypeError, match="targets must hold integer class ids"):
        kernels.cross_entropy_forward(np.zeros((3, 5), np.float32), np.zeros(3))
    with pytest.raises(ValueError, match="approximate must be 'tanh' or 'none'"):
        kernels.gelu_forward(np.zeros(3, np.float32), "erf")
    p = np.zeros(4, np.float32)
    with pytest.raises(ValueError, match=r"exp_avg has shape \(3,\), expected \(4,\)"):
        kernels.adamw_update(p, p, p[:3], p, lr=0.1, beta1=0.9, beta2=0.99, eps=1e-8,
                             weight_decay=0.0, step=1)


def test_llama_dispatch_rules() -> None:
    """What rms_norm, rotary and swiglu take: float32 or bf16, read as stored."""
    f32, f64 = np.zeros((3, 5), np.float32), np.zeros((3, 5))
    w = np.ones(5, np.float32)
    for x in (f32, f32.astype(BF16), f32.T.copy().T):
        assert kernels.supports_rms_norm(x, w) and kernels.supports_rms_norm(x, None)
    assert not kernels.supports_rms_norm(f64, None)
    assert not kernels.supports_rms_norm(f32.astype(np.float16), None)
    assert not kernels.supports_rms_norm(f32, w.astype(BF16))  # weight float32 only
    assert not kernels.supports_rms_norm(f32, np.ones(4, np.float32))
    assert not kernels.supports_rms_norm(np.zeros((0, 5), np.float32), None)
    fused = np.zeros((2, 7, 128), np.float32)
    q, table = fused[..., :64].reshape(2, 7, 4, 16), np.zeros((7, 8), np.float32)
    assert kernels.supports_rotary(q, table, table)
    assert kernels.supports_rotary(q.astype(BF16), table, table)
    assert not kernels.supports_rotary(q.astype(np.float64), table, table)
    assert not kernels.supports_rotary(q, table.astype(np.float64), table)
    assert not kernels.supports_rotary(q, table[:6], table[:6])  # T = 7
    assert not kernels.supports_rotary(q[..., :15], table, table)  # D odd
    assert not kernels.supports_rotary(q.reshape(14, 4, 16), table, table)  # not 4-D
    gate, up = fused[..., :64], fused[..., 64:]
    assert kernels.supports_swiglu(gate, up) and kernels.supports_swiglu(gate.astype(BF16),
                                                                         up.astype(BF16))
    assert not kernels.supports_swiglu(gate, up.astype(BF16))
    assert not kernels.supports_swiglu(gate, up[..., :32])
    assert not kernels.supports_swiglu(gate.astype(np.float64), up.astype(np.float64))
    assert not kernels.supports_swiglu(gate[:0], up[:0])


def test_llama_launchers_name_bad_arguments() -> None:
    x, w = np.zeros((3, 8), np.float32), np.ones(8, np.float32)
    with pytest.raises(TypeError, match="rms_norm_forward: x must be float32 or bfloat16, "
                                        "got float64"):
        kernels.rms_norm_forward(x.astype(np.float64), w, 1e-5, 8)
    with pytest.raises(ValueError, match=r"rms_norm_forward: n must be the size of x's "
                                         r"trailing dims .* got n=5"):
        kernels.rms_norm_forward(x, w, 1e-5, 5)
    with pytest.raises(TypeError, match="rms_norm_forward: weight must be float32"):
        kernels.rms_norm_forward(x, w.astype(BF16), 1e-5, 8)
    with pytest.raises(ValueError, match=r"rms_norm_backward: grad has shape \(3, 7\)"):
        kernels.rms_norm_backward(x[:, :7], x, w, np.ones(3, np.float32), 8)
    with pytest.raises(ValueError, match=r"rms_norm_backward: rstd has shape \(2,\), "
                                         r"expected \(3,\)"):
        kernels.rms_norm_backward(x, x, w, np.ones(2, np.float32), 8)
    with pytest.raises(TypeError, match="rms_norm_backward: grad must be a float array"):
        kernels.rms_norm_backward(x.astype(np.int32), x, w, np.ones(3, np.float32), 8)
    q, table = np.zeros((2, 7, 4, 16), np.float32), np.zeros((7, 8), np.float32)
    with pytest.raises(ValueError, match=r"rotary_forward: x must be \(B, T, H, D\) with D "
                                         r"even, got shape \(2, 7, 4, 15\)"):
        kernels.rotary_forward(q[..., :15], table, table, False)
    with pytest.raises(ValueError, match=r"rotary_forward: sin has shape \(6, 8\), "
                                         r"expected \(7, 8\)"):
        kernels.rotary_forward(q, table, table[:6], False)
    with pytest.raises(TypeError, match="rotary_forward: cos must be float32"):
        kernels.rotary_forward(q, table.astype(np.float64), table, False)
    with pytest.raises(TypeError, match="rotary_forward: x must be float32 or bfloat16, got "
                                        "float16"):
        kernels.rotary_forward(q.astype(np.float16), table, table, False)
    with pytest.raises(TypeError, match="swiglu_forward: up must have gate's dtype float32, "
                                        "got bfloat16"):
        kernels.swiglu_forward(x, x.astype(BF16))
    with pytest.raises(ValueError, match=r"swiglu_backward: grad has shape \(3, 7\), "
                                         r"expected \(3, 8\)"):
        kernels.swiglu_backward(x[:, :7], x, x)


# --- 2. the NumPy twins of the tiled algorithms -------------------------------------------
def assert_close(actual: np.ndarray, expected: np.ndarray, rtol: float, what: str) -> None:
    """Elementwise within rtol, with an absolute floor of rtol times the array's largest
    magnitude or 1, the inputs' scale (gradients that cancel to ~0, or are exactly 0 as
    dq with one key, carry the rounding of their larger terms)."""
    expected = np.asarray(expected)
    assert actual.shape == expected.shape, f"{what}: {actual.shape} vs {expected.shape}"
    atol = rtol * max(float(np.abs(expected).max()) if expected.size else 0.0, 1.0)
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol, err_msg=what)


TWIN_RTOL = {np.float64: 1e-10, np.float32: 1e-5}
# (batch dims, L, S, head dim, causal): L and S off the 32-key tile and the 16- or 8-row
# blocks, L < S and L > S (top-left causal), head dims below, at and above a warp
ATTENTION_CASES = [
    ((2, 3), 45, 45, 32, True),
    ((2, 3), 45, 45, 32, False),
    ((1, 2), 70, 33, 64, True),
    ((1, 2), 33, 70, 64, False),
    ((1,), 20, 77, 128, True),
    ((2,), 1, 1, 128, True),
    ((1, 1), 37, 37, 17, True),
    ((), 5, 9, 3, False),
]


def attention_inputs(batch: tuple, L: int, S: int, E: int, dtype: type, seed: int = 0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((*batch, L, E)).astype(dtype)
    k = rng.standard_normal((*batch, S, E)).astype(dtype)
    v = rng.standard_normal((*batch, S, E)).astype(dtype)
    do = rng.standard_normal((*batch, L, E)).astype(dtype)
    return q, k, v, do


def op_attention(q, k, v, do, causal: bool, scale: float, device: str = "cpu"):
    """The vectorised op (or, on cuda, what it dispatches to): output and gradients."""
    qkv = [mt.tensor(a, device=device, requires_grad=True) for a in (q, k, v)]
    out = F.scaled_dot_product_attention(*qkv, is_causal=causal, scale=scale)
    out.backward(mt.tensor(do, device=device))
    return [t.detach().cpu().numpy() for t in (out, *[x.grad for x in qkv])]


def case_id(case: tuple) -> str:
    batch, L, S, E, causal = case
    return f"b{'x'.join(map(str, batch)) or '0'}-L{L}-S{S}-E{E}-{'causal' if causal else 'full'}"


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("case", ATTENTION_CASES, ids=case_id)
def test_flash_attention_twin_matches_the_op(case: tuple, dtype: type) -> None:
    batch, L, S, E, causal = case
    q, k, v, do = attention_inputs(batch, L, S, E, dtype)
    scale = 1.0 / math.sqrt(E)
    expected = op_attention(q, k, v, do, causal, scale)
    o, lse = reference.flash_attention_forward(q, k, v, causal, scale)
    grads = reference.flash_attention_backward(q, k, v, o, do, lse, causal, scale)
    rtol = TWIN_RTOL[dtype]
    for name, actual, ref in zip(("o", "dq", "dk", "dv"), (o, *grads), expected):
        assert actual.dtype == dtype, name
        assert_close(actual, ref, rtol, name)
    # lse is the log-sum-exp of each query's visible scores
    scores = (q @ np.swapaxes(k, -1, -2)) * scale
    if causal:
        scores = np.where(np.tril(np.ones((L, S), bool)), scores, -np.inf)
    top = scores.max(axis=-1, keepdims=True)
    assert_close(lse, (top + np.log(np.exp(scores - top).sum(-1, keepdims=True)))[..., 0],
                 rtol, "lse")


def test_flash_attention_twin_keys_no_query_sees_get_zero_gradients() -> None:
    """Causal with S > L: keys after the last query are seen by none (dk = dv = 0)."""
    q, k, v, do = attention_inputs((1,), 3, 40, 8, np.float64)
    o, lse = reference.flash_attention_forward(q, k, v, True, 0.5)
    _, dk, dv = reference.flash_attention_backward(q, k, v, o, do, lse, True, 0.5)
    assert not dk[:, 3:].any() and not dv[:, 3:].any() and dk[:, :3].any()


def gpt_projection(B: int, T: int, nh: int, hs: int, dtype: type, seed: int = 0):
    """A (B, T, 3C) projection as c_attn writes it, shaped (B, T, 3, nh, hs)."""
    return np.random.default_rng(seed).standard_normal((B, T, 3, nh, hs)).astype(dtype)


def heads_of(qkv) -> list:
    """q, k, v as GPT reads them: (B, nh, T, hs) views of the projection (any array type)."""
    return [qkv[:, :, i].transpose(0, 2, 1, 3) for i in range(3)]


def gpt_heads(B: int, T: int, nh: int, hs: int, dtype: type, seed: int = 0) -> list:
    return heads_of(gpt_projection(B, T, nh, hs, dtype, seed))


def output_gradient(B: int, T: int, nh: int, hs: int, dtype: type, seed: int = 1):
    """The gradient of attention's (B, T, C) output, shaped (B, T, nh, hs); GPT's backward
    hands the kernels its (B, nh, T, hs) view, ``.transpose(0, 2, 1, 3)``."""
    return np.random.default_rng(seed).standard_normal((B, T, nh, hs)).astype(dtype)


def gradient_heads(B: int, T: int, nh: int, hs: int, dtype: type, seed: int = 1):
    return output_gradient(B, T, nh, hs, dtype, seed).transpose(0, 2, 1, 3)


def random(*shape: int) -> np.ndarray:
    return np.random.default_rng(len(shape)).standard_normal(shape).astype(np.float32)


def _cache_heads() -> list:
    """A generation step's layout: queries from the packed projection, keys and values the
    first 6 positions of (B, nh, capacity, hs) KV-cache buffers."""
    q = gpt_heads(2, 6, 3, 8, np.float32)[0]
    cache = random(2, 2, 3, 10, 8)  # keys, values
    return [q, cache[0, :, :, :6], cache[1, :, :, :6]]


# name: (arrays, expected split, expected copies, expected (batch, head, row) strides)
HEAD_LAYOUTS = {
    "contiguous": (lambda: [random(2, 3, 7, 16)] * 3, 0, (False,) * 3, [(0, 112, 16)] * 3),
    "no-batch-dims": (lambda: [random(7, 16)] * 3, 0, (False,) * 3, [(0, 0, 16)] * 3),
    "gpt-packed": (lambda: gpt_heads(2, 5, 4, 8, np.float32),
                   1, (False,) * 3, [(480, 8, 96)] * 3),
    "gpt-packed-with-gradient": (lambda: gpt_heads(2, 5, 4, 8, BF16)
                                 + [gradient_heads(2, 5, 4, 8, BF16)],
                                 1, (False,) * 4, [(480, 8, 96)] * 3 + [(160, 8, 32)]),
    "kv-cache": (_cache_heads, 1, (False,) * 3, [(432, 8, 72)] + [(240, 80, 8)] * 2),
    "size-one-dims": (lambda: [a[:, None] for a in gpt_heads(2, 5, 4, 8, np.float32)],
                      2, (False,) * 3, [(480, 8, 96)] * 3),
    "keys-shared-by-heads": (lambda: [random(2, 3, 7, 16)]
                             + [np.broadcast_to(random(2, 1, 9, 16), (2, 3, 9, 16))] * 2,
                             1, (False,) * 3, [(336, 112, 16)] + [(144, 0, 16)] * 2),
    "three-strides-copied": (lambda: [random(2, 3, 4, 7, 16).transpose(0, 2, 1, 3, 4)]
                             + [random(2, 4, 3, 7, 16)] * 2,
                             0, (True, False, False), [(0, 112, 16)] * 3),
    "strided-last-dim-copied": (lambda: [random(2, 7, 32)[..., ::2]] + [random(2, 7, 16)] * 2,
                                0, (True, False, False), [(0, 112, 16)] * 3),
}


@pytest.mark.parametrize("layout", HEAD_LAYOUTS)
def test_attention_head_split_reads_strided_heads_in_place(layout: str) -> None:
    """How the launcher hands q, k, v (and dO) to the kernels: batch dims flattened into a
    (batch, head) pair with one stride each per array, copies only where no such pair
    exists; every strided read lands on the array's own elements."""
    make, split, copy, strides = HEAD_LAYOUTS[layout]
    arrays = make()
    assert kernels.attention_head_split(arrays) == (split, copy)
    arrays = [np.ascontiguousarray(a) if c else a for a, c in zip(arrays, copy)]
    assert [kernels.attention_strides(a, split) for a in arrays] == strides
    heads = math.prod(arrays[0].shape[split:-2])
    for a in arrays:
        args = dict(zip(("heads", "x_batch", "x_head", "x_row"),
                        (heads, *kernels.attention_strides(a, split))))
        assert_strides_read(a, args, "x")


@pytest.mark.parametrize("dtype", [np.float32, BF16, np.float16],
                         ids=["float32", "bf16", "fp16"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_flash_attention_twin_reads_stored_dtypes_and_strided_heads(dtype: type,
                                                                    causal: bool) -> None:
    """The twin reads what the kernels read: GPT's packed heads (and dO's head view) in
    place, bf16/fp16 widened exactly to float32. Its results on them are, bit for bit, its
    results on contiguous float32 copies of the same values."""
    B, T, nh, hs = 2, 37, 3, 16
    heads, do = gpt_heads(B, T, nh, hs, dtype), gradient_heads(B, T, nh, hs, dtype)
    o, lse = reference.flash_attention_forward(*heads, causal, 0.25)
    grads = reference.flash_attention_backward(*heads, o, do, lse, causal, 0.25)
    wide = [np.ascontiguousarray(a, dtype=np.float32) for a in (*heads, do)]
    ref_o, ref_lse = reference.flash_attention_forward(*wide[:3], causal, 0.25)
    ref_grads = reference.flash_attention_backward(*wide[:3], ref_o, wide[3], ref_lse, causal,
                                                   0.25)
    for name, got, ref in zip(("o", "lse", "dq", "dk", "dv"), (o, lse, *grads),
                              (ref_o, ref_lse, *ref_grads)):
        assert got.dtype == np.float32 and got.shape == ref.shape, name
        np.testing.assert_array_equal(got, ref, err_msg=name)


def gqa_inputs(B: int, Hkv: int, G: int, L: int, S: int, E: int, dtype: type,
               seed: int = 0) -> list:
    """query (B, Hkv * G, L, E), key and value (B, Hkv, S, E), and the output gradient."""
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape).astype(dtype) for shape in
            ((B, Hkv * G, L, E), (B, Hkv, S, E), (B, Hkv, S, E), (B, Hkv * G, L, E))]


def op_gqa(q, k, v, do, causal: bool, scale: float, device: str = "cpu") -> list:
    """scaled_dot_product_attention(enable_gqa=True): output and gradients, as NumPy."""
    qkv = [mt.tensor(a, device=device, requires_grad=True) for a in (q, k, v)]
    out = attention_ops.scaled_dot_product_attention(*qkv, is_causal=causal, scale=scale,
                                                     enable_gqa=True)
    out.backward(mt.tensor(do, device=device))
    return [t.detach().cpu().numpy() for t in (out, *[x.grad for x in qkv])]


def grouped(q, k, v, do) -> list:
    """The grouped form the op builds: q, do (B, Hkv, G, L, E), k, v (B, Hkv, 1, S, E)."""
    B, Hq, L, E = q.shape
    Hkv = k.shape[1]
    return [q.reshape(B, Hkv, Hq // Hkv, L, E), k[:, :, None], v[:, :, None],
            do.reshape(B, Hkv, Hq // Hkv, L, E)]


# (B, Hkv, G, L, S, E): L, S off the tiles, L < S and L > S, head dims at and off a warp
GQA_CASES = [(2, 2, 1, 45, 45, 32), (1, 2, 2, 37, 50, 64), (2, 1, 4, 33, 20, 17),
             (1, 3, 4, 70, 70, 128)]


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("case", GQA_CASES, ids=lambda c: "B{}-Hkv{}-G{}-L{}-S{}-E{}".format(*c))
def test_flash_attention_twin_grouped_query(case: tuple, dtype: type, causal: bool) -> None:
    """Grouped-query attention in the kernels' grouped form (k, v never repeated) against
    the op's enable_gqa=True on the CPU: o, lse, dq, and dk, dv in k's and v's own shape,
    summed over each group's G query heads."""
    B, Hkv, G, L, S, E = case
    q, k, v, do = gqa_inputs(B, Hkv, G, L, S, E, dtype)
    scale = 1.0 / math.sqrt(E)
    gq, gk, gv, gdo = grouped(q, k, v, do)
    assert kernels.supports_flash_attention(*(a.astype(np.float32) for a in (gq, gk, gv)),
                                            None, 0.0)
    o, lse = reference.flash_attention_forward(gq, gk, gv, causal, scale)
    dq, dk, dv = reference.flash_attention_backward(gq, gk, gv, o, gdo, lse, causal, scale)
    assert dk.shape == gk.shape and dv.shape == gv.shape
    got = [o.reshape(q.shape), dq.reshape(q.shape), dk[:, :, 0], dv[:, :, 0]]
    rtol = TWIN_RTOL[dtype]
    for name, actual, ref in zip(("o", "dq", "dk", "dv"), got,
                                 op_gqa(q, k, v, do, causal, scale)):
        assert actual.dtype == dtype, name
        assert_close(actual, ref, rtol, name)
    # lse: each query head's, as ungrouped attention over the repeated keys computes it
    _, ref_lse = reference.flash_attention_forward(q, np.repeat(k, G, axis=1),
                                                   np.repeat(v, G, axis=1), causal, scale)
    assert_close(lse.reshape(ref_lse.shape), ref_lse, rtol, "lse")


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_flash_attention_twin_grouped_query_reads_a_fused_projection(causal: bool) -> None:
    """Llama's layout: q, k, v strided views of one (B, T, (Hq + 2 Hkv) hs) projection, q
    as (B, Hkv, G, T, hs), k, v as (B, Hkv, 1, T, hs), dO a view of (B, T, Hq hs), bf16:
    read in place (no copies), and the same bits as on contiguous float32 copies."""
    B, T, Hkv, G, hs = 2, 37, 2, 2, 16
    fused = np.random.default_rng(6).standard_normal((B, T, Hkv * (G + 2), hs)).astype(BF16)
    q = fused[:, :, :Hkv * G].reshape(B, T, Hkv, G, hs).transpose(0, 2, 3, 1, 4)
    k, v = (fused[:, :, Hkv * (G + i):Hkv * (G + i + 1)].transpose(0, 2, 1, 3)[:, :, None]
            for i in (0, 1))
    do = np.random.default_rng(7).standard_normal((B, T, Hkv, G, hs)).astype(BF16)
    do = do.transpose(0, 2, 3, 1, 4)
    assert kernels.attention_layout([q, k, v, do], G)[0][0] is q  # no copy of q
    assert not any(kernels.attention_head_split([a[..., 0, :, :] for a in (q, k, v, do)])[1])
    o, lse = reference.flash_attention_forward(q, k, v, causal, 0.25)
    grads = reference.flash_attention_backward(q, k, v, o, do, lse, causal, 0.25)
    wide = [np.ascontiguousarray(a, dtype=np.float32) for a in (q, k, v, do)]
    ref_o, ref_lse = reference.flash_attention_forward(*wide[:3], causal, 0.25)
    ref_grads = reference.flash_attention_backward(*wide[:3], ref_o, wide[3], ref_lse, causal,
                                                   0.25)
    for name, got, ref in zip(("o", "lse", "dq", "dk", "dv"), (o, lse, *grads),
                              (ref_o, ref_lse, *ref_grads)):
        assert got.dtype == np.float32 and got.shape == ref.shape, name
        np.testing.assert_array_equal(got, ref, err_msg=name)


# (rows M, classes C, ignore_index, label_smoothing): C below, at, off and above the
# 256-thread block; ignored rows (ignore_index inside the class range too)
CROSS_ENTROPY_CASES = [
    (7, 5, -100, 0.0),
    (9, 256, -100, 0.0),
    (6, 300, 3, 0.0),
    (5, 1031, -100, 0.1),
    (4, 4099, 7, 0.25),
]


def cross_entropy_inputs(M: int, C: int, ignore_index: int, dtype: type, seed: int = 0):
    rng = np.random.default_rng(seed)
    logits = (3 * rng.standard_normal((M, C))).astype(dtype)
    targets = rng.integers(0, C, M)
    targets[::3] = ignore_index  # every third row ignored
    dloss = rng.standard_normal(M).astype(dtype)
    return logits, targets, dloss


def op_cross_entropy(logits, targets, dloss, ignore_index, smoothing, device="cpu"):
    x = mt.tensor(logits, device=device, requires_grad=True)
    loss = F.cross_entropy(x, mt.tensor(targets, device=device), ignore_index=ignore_index,
                           reduction="none", label_smoothing=smoothing)
    loss.backward(mt.tensor(dloss, device=device))
    return loss.detach().cpu().numpy(), x.grad.cpu().numpy()


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("case", CROSS_ENTROPY_CASES,
                         ids=lambda c: f"M{c[0]}-C{c[1]}-ignore{c[2]}-smooth{c[3]}")
def test_cross_entropy_twin_matches_the_op(case: tuple, dtype: type) -> None:
    M, C, ignore_index, smoothing = case
    logits, targets, dloss = cross_entropy_inputs(M, C, ignore_index, dtype)
    expected_loss, expected_grad = op_cross_entropy(logits, targets, dloss, ignore_index,
                                                    smoothing)
    loss, lse = reference.cross_entropy_forward(logits, targets, ignore_index, smoothing)
    grad = reference.cross_entropy_backward(logits, targets, lse, dloss, ignore_index,
                                            smoothing)
    rtol = TWIN_RTOL[dtype]
    assert loss.dtype == lse.dtype == grad.dtype == dtype
    assert_close(loss, expected_loss, rtol, "loss")
    assert_close(grad, expected_grad, rtol, "dlogits")
    top = logits.max(axis=1)
    assert_close(lse, top + np.log(np.exp(logits - top[:, None]).sum(axis=1)), rtol, "lse")
    assert not grad[targets == ignore_index].any() and not loss[targets == ignore_index].any()


def test_cross_entropy_twin_gives_nan_for_a_target_outside_the_row() -> None:
    """On a GPU the op's range check is read later: until then the kernel must not read
    outside the row, and the loss says something is wrong."""
    logits = np.zeros((3, 10), np.float32)
    loss, _ = reference.cross_entropy_forward(logits, np.array([2, 10, -7]), ignore_index=-100)
    assert loss[0] == pytest.approx(math.log(10)) and np.isnan(loss[1:]).all()
    assert "target < 0 || target >= C" in source("cross_entropy.cu")


def test_cross_entropy_twin_with_minus_inf_logits() -> None:
    """-inf logits (a masked vocabulary) merge as zero terms: no nan."""
    logits, targets, dloss = cross_entropy_inputs(4, 600, -100, np.float32)
    logits[:, 100:500] = -np.inf
    logits[1, :256] = -np.inf  # a whole thread's first column, and more
    targets[:] = 50
    targets[1] = 520
    loss, lse = reference.cross_entropy_forward(logits, targets)
    expected, _ = op_cross_entropy(logits, targets, dloss, -100, 0.0)
    assert np.isfinite(loss).all()
    assert_close(loss, expected, 1e-5, "loss")


# --- Llama's kernels: rmsnorm.cu, rotary.cu, swiglu.cu ------------------------------------
# (shape, n): one or two normalized dims, n below, at and off a warp, rows over one
# 64-row dweight chunk (130 rows: three chunks)
RMS_NORM_CASES = [((4, 768), 768), ((3, 5, 33), 33), ((2, 3, 4, 5), 20), ((1, 1), 1),
                  ((7, 2049), 2049), ((130, 16), 16)]


def rms_norm_inputs(shape: tuple, n: int, dtype: type, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * 3 + 1).astype(dtype)
    w = rng.standard_normal(n).astype(dtype)
    dy = rng.standard_normal(shape).astype(dtype)
    return x, w, dy


def op_rms_norm(x, w, dy, n: int, eps: float, device: str = "cpu") -> list:
    """out, dx, dw (None without w) of the op ``F.rms_norm`` over x's trailing dims of n."""
    dims, size = 0, 1
    while size < n:
        dims += 1
        size *= x.shape[-dims]
    leaves = [mt.tensor(a, device=device, requires_grad=True) if a is not None else None
              for a in (x, None if w is None else w.reshape(x.shape[-dims:]))]
    out = F.rms_norm(leaves[0], x.shape[-dims:], leaves[1], eps)
    out.backward(mt.tensor(dy, device=device))
    return [out.detach().cpu().numpy(), leaves[0].grad.cpu().numpy(),
            None if w is None else leaves[1].grad.cpu().numpy().reshape(n)]


@pytest.mark.parametrize("affine", [True, False], ids=["weight", "none"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("case", RMS_NORM_CASES, ids=lambda c: f"{c[0]}-n{c[1]}")
def test_rms_norm_twin_matches_the_op(case: tuple, dtype: type, affine: bool) -> None:
    shape, n = case
    x, w, dy = rms_norm_inputs(shape, n, dtype)
    w = w if affine else None
    out, rstd = reference.rms_norm_forward(x, w, 1e-5, n)
    dx, dw = reference.rms_norm_backward(dy, x, w, rstd, n)
    rtol = TWIN_RTOL[dtype]
    rows = x.reshape(-1, n)
    assert_close(rstd, 1 / np.sqrt((rows * rows).mean(axis=1) + 1e-5), rtol, "rstd")
    for name, got, ref in zip(("out", "dx", "dw"), (out, dx, dw),
                              op_rms_norm(x, w, dy, n, 1e-5)):
        if ref is None:
            assert got is None, name
            continue
        assert got.dtype == dtype and got.shape == ref.shape, name
        assert_close(got, ref, rtol, name)


def test_rms_norm_twin_reads_bf16_as_stored() -> None:
    """bf16 x and dy are widened exactly: the statistics and gradients are the float32
    twin's on the same values bit for bit, and out is its output rounded once to bf16."""
    x, w, dy = rms_norm_inputs((9, 70), 70, BF16)
    w = w.astype(np.float32)
    out, rstd = reference.rms_norm_forward(x, w, 1e-6, 70)
    grads = reference.rms_norm_backward(dy, x, w, rstd, 70)
    wide = [a.astype(np.float32) for a in (x, dy)]
    ref_out, ref_rstd = reference.rms_norm_forward(wide[0], w, 1e-6, 70)
    ref_grads = reference.rms_norm_backward(wide[1], wide[0], w, ref_rstd, 70)
    assert out.dtype == BF16
    np.testing.assert_array_equal(out, ref_out.astype(BF16))
    for name, got, ref in zip(("rstd", "dx", "dw"), (rstd, *grads), (ref_rstd, *ref_grads)):
        assert got.dtype == np.float32, name
        np.testing.assert_array_equal(got, ref, err_msg=name)


def rotary_tables(T: int, D: int, dtype: type = np.float32, base: float = 10000.0):
    """Llama's cos, sin (T, D / 2): angle t * base^(-2i / D) of position t, pair i."""
    inv_freq = base ** (-np.arange(0, D, 2, dtype=np.float64) / D)
    angles = np.arange(T, dtype=np.float64)[:, None] * inv_freq[None, :]
    return np.cos(angles).astype(dtype), np.sin(angles).astype(dtype)


def rotary_formula(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Hugging Face's form: x * cos + rotate_half(x) * sin, with rotate_half(x) =
    (-x2, x1) and the tables repeated over both halves."""
    half = x.shape[-1] // 2
    c = np.concatenate([cos, cos], axis=-1)[None, :, None, :]
    s = np.concatenate([sin, sin], axis=-1)[None, :, None, :]
    rotated = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * c + rotated * s


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("shape", [(2, 7, 4, 16), (1, 33, 3, 128), (3, 1, 1, 2)])
def test_rotary_twin_matches_the_formula(shape: tuple, dtype: type) -> None:
    """Forward against the formula; inverse undoes it and is its transpose (the backward:
    <rotate(x), y> = <x, inverse(y)>)."""
    B, T, H, D = shape
    rng = np.random.default_rng(1)
    x, y = (rng.standard_normal(shape).astype(dtype) for _ in range(2))
    cos, sin = rotary_tables(T, D, dtype)
    rtol = TWIN_RTOL[dtype]
    out = reference.rotary_forward(x, cos, sin, False)
    assert out.dtype == dtype
    assert_close(out, rotary_formula(x, cos, sin), rtol, "out")
    assert_close(reference.rotary_forward(out, cos, sin, True), x, rtol, "inverse")
    back = reference.rotary_forward(y, cos, sin, True)
    assert_close(np.array((out * y).sum()), np.array((x * back).sum()), rtol * 10, "adjoint")


def test_rotary_twin_reads_bf16_as_stored() -> None:
    x = np.random.default_rng(2).standard_normal((2, 5, 3, 8)).astype(BF16)
    cos, sin = rotary_tables(5, 8)
    out = reference.rotary_forward(x, cos, sin, False)
    assert out.dtype == BF16
    np.testing.assert_array_equal(
        out, reference.rotary_forward(x.astype(np.float32), cos, sin, False).astype(BF16))


def swiglu_inputs(shape: tuple, dtype: type, seed: int = 0):
    rng = np.random.default_rng(seed)
    gate = (rng.standard_normal(shape) * 4).astype(dtype)
    gate.flat[:4] = [-100.0, -20.0, 20.0, 100.0]  # the sigmoid's tails: no overflow, no nan
    return gate, rng.standard_normal(shape).astype(dtype), rng.standard_normal(shape).astype(dtype)


def op_swiglu(gate, up, dy, device: str = "cpu") -> list:
    """silu(gate) * up by the ops, and its gradients."""
    g, u = (mt.tensor(a, device=device, requires_grad=True) for a in (gate, up))
    out = F.silu(g) * u
    out.backward(mt.tensor(dy, device=device))
    return [out.detach().cpu().numpy(), g.grad.cpu().numpy(), u.grad.cpu().numpy()]


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("shape", [(1000,), (3, 5, 257)])
def test_swiglu_twin_matches_the_op(shape: tuple, dtype: type) -> None:
    gate, up, dy = swiglu_inputs(shape, dtype)
    out = reference.swiglu_forward(gate, up)
    grads = reference.swiglu_backward(dy, gate, up)
    for name, got, ref in zip(("out", "dgate", "dup"), (out, *grads), op_swiglu(gate, up, dy)):
        assert got.dtype == dtype and np.isfinite(got).all(), name
        assert_close(got, ref, TWIN_RTOL[dtype], name)


def test_swiglu_twin_reads_bf16_as_stored() -> None:
    gate, up, dy = swiglu_inputs((4, 33), BF16)
    wide = [a.astype(np.float32) for a in (gate, up, dy)]
    out = reference.swiglu_forward(gate, up)
    assert out.dtype == BF16
    np.testing.assert_array_equal(out, reference.swiglu_forward(*wide[:2]).astype(BF16))
    for got, ref in zip(reference.swiglu_backward(dy, gate, up),
                        reference.swiglu_backward(wide[2], *wide[:2])):
        assert got.dtype == np.float32
        np.testing.assert_array_equal(got, ref)


# --- 3. the kernels on a GPU ----------------------------------------------------------------
def needs_cuda(test):
    """Marked ``cuda`` and skipped, saying why, where CuPy sees no GPU (as conftest's)."""
    skip = pytest.mark.skipif(not mt.cuda.is_available(),
                              reason=f"no CUDA here: {mt.cuda.unavailable_reason()}")
    return pytest.mark.cuda(skip(test))


GPU_RTOL = 1e-4  # float32 kernels against a float64 reference, relative to the largest value


def as_float64(*arrays: np.ndarray) -> list:
    return [a.astype(np.float64) for a in arrays]


@pytest.mark.parametrize("shape, normalized", [((4, 768), 1), ((3, 5, 33), 1),
                                               ((2, 3, 4, 5), 2), ((1, 1), 1), ((7, 2049), 1)])
@pytest.mark.parametrize("affine", ["both", "weight", "none"])
@needs_cuda
def test_layer_norm_kernel(shape: tuple, normalized: int, affine: str) -> None:
    rng = np.random.default_rng(1)
    norm_shape = shape[len(shape) - normalized:]
    x = (rng.standard_normal(shape) * 3 + 1).astype(np.float32)
    w = rng.standard_normal(norm_shape).astype(np.float32)
    b = rng.standard_normal(norm_shape).astype(np.float32)
    dy = rng.standard_normal(shape).astype(np.float32)
    params = {"both": (w, b), "weight": (w, None), "none": (None, None)}[affine]

    def run(device: str, dtype: type) -> list:
        leaves = [mt.tensor(a.astype(dtype), device=device, requires_grad=True)
                  if a is not None else None for a in (x, *params)]
        y = F.layer_norm(leaves[0], norm_shape, leaves[1], leaves[2])
        y.backward(mt.tensor(dy.astype(dtype), device=device))
        return [y.detach().cpu().numpy()] + [t.grad.cpu().numpy() for t in leaves
                                             if t is not None]

    assert kernels.supports_layer_norm(x, *params)
    for name, got, ref in zip(("y", "dx", "dw", "db"), run("cuda", np.float32),
                              run("cpu", np.float64)):
        assert got.dtype == np.float32, name
        assert_close(got.astype(np.float64), ref, GPU_RTOL, name)


@pytest.mark.parametrize("approximate", ["tanh", "none"])
@pytest.mark.parametrize("shape", [(1,), (3, 1000), (2, 3, 257), (70001,)])
@needs_cuda
def test_gelu_kernel(approximate: str, shape: tuple) -> None:
    rng = np.random.default_rng(2)
    x = (rng.standard_normal(shape) * 3).astype(np.float32)
    dy = rng.standard_normal(shape).astype(np.float32)

    def run(device: str, dtype: type) -> list:
        t = mt.tensor(x.astype(dtype), device=device, requires_grad=True)
        y = F.gelu(t, approximate=approximate)
        y.backward(mt.tensor(dy.astype(dtype), device=device))
        return [y.detach().cpu().numpy(), t.grad.cpu().numpy()]

    for name, got, ref in zip(("y", "dx"), run("cuda", np.float32), run("cpu", np.float64)):
        assert_close(got.astype(np.float64), ref, GPU_RTOL, name)


@pytest.mark.parametrize("case", CROSS_ENTROPY_CASES + [(64, 50257, -100, 0.0),
                                                        (3, 1, -100, 0.0)],
                         ids=lambda c: f"M{c[0]}-C{c[1]}-ignore{c[2]}-smooth{c[3]}")
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@needs_cuda
def test_cross_entropy_kernel(case: tuple, reduction: str) -> None:
    M, C, ignore_index, smoothing = case
    logits, targets, dloss = cross_entropy_inputs(M, C, ignore_index, np.float32)
    if C == 1:
        targets[:] = 0
    options = dict(ignore_index=ignore_index, reduction=reduction, label_smoothing=smoothing)

    def run(device: str, dtype: type) -> list:
        x = mt.tensor(logits.astype(dtype), device=device, requires_grad=True)
        loss = F.cross_entropy(x, mt.tensor(targets, device=device), **options)
        upstream = dloss.astype(dtype) if reduction == "none" else np.asarray(0.7, dtype)
        loss.backward(mt.tensor(upstream, device=device))
        return [loss.detach().cpu().numpy(), x.grad.cpu().numpy()]

    assert kernels.supports_cross_entropy(logits, targets)
    for name, got, ref in zip(("loss", "dlogits"), run("cuda", np.float32),
                              run("cpu", np.float64)):
        assert got.dtype == np.float32, name
        assert_close(got.astype(np.float64), ref, GPU_RTOL, name)


@needs_cuda
def test_cross_entropy_kernel_matches_its_twin() -> None:
    """The kernel's own outputs (lse too) against the NumPy twin of its algorithm."""
    from minitorch_gpu.backend._cupy import cupy  # CuPy, or the emulated GPU's stand-in
    logits, targets, dloss = cross_entropy_inputs(33, 1031, 2, np.float32)
    loss, lse = kernels.cross_entropy_forward(cupy.asarray(logits), cupy.asarray(targets),
                                              2, 0.1)
    grad = kernels.cross_entropy_backward(cupy.asarray(logits), cupy.asarray(targets), lse,
                                          cupy.asarray(dloss), 2, 0.1)
    ref_loss, ref_lse = reference.cross_entropy_forward(logits, targets, 2, 0.1)
    ref_grad = reference.cross_entropy_backward(logits, targets, ref_lse, dloss, 2, 0.1)
    for name, got, ref in (("loss", loss, ref_loss), ("lse", lse, ref_lse),
                           ("dlogits", grad, ref_grad)):
        assert_close(cupy.asnumpy(got), ref, 1e-5, name)


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
@needs_cuda
def test_adamw_kernel_matches_the_numpy_update(weight_decay: float) -> None:
    rng = np.random.default_rng(3)
    shapes = [(5, 7), (1000,), (3, 4, 129), (1,)]
    start = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    grads = [[rng.standard_normal(s).astype(np.float32) for s in shapes] for _ in range(4)]

    def run(device: str) -> list:
        params = [mt.tensor(a, device=device, requires_grad=True) for a in start]
        opt = mt.optim.AdamW(params, lr=1e-2, betas=(0.9, 0.95), eps=1e-8,
                             weight_decay=weight_decay)
        for step_grads in grads:
            for p, g in zip(params, step_grads):
                p.grad = mt.tensor(g, device=device)
            opt.step()
        return [a.cpu().numpy() for p in params for a in
                (p.detach(), opt.state[p]["exp_avg"], opt.state[p]["exp_avg_sq"])]

    param = mt.tensor(start[0], device="cuda")
    assert kernels.supports_adamw(param.data, param.data, param.data, param.data)
    for got, ref in zip(run("cuda"), run("cpu")):  # four steps in float32, in two orders:
        # a parameter that crosses zero keeps its O(1) terms' rounding (ulp 2.4e-7 at 2)
        np.testing.assert_allclose(got, ref, rtol=2e-6, atol=5e-7)


GPU_ATTENTION_CASES = [
    ((2, 3), 100, 100, 64, True),
    ((1, 2), 33, 33, 128, True),
    ((1, 2), 31, 31, 32, True),
    ((2,), 1, 1, 64, True),
    ((1, 4), 257, 257, 64, True),
    ((1, 2), 50, 77, 128, False),
    ((1, 2), 77, 50, 32, True),
    ((1, 1), 40, 40, 80, True),
    ((1, 1), 19, 23, 7, False),
]


@pytest.mark.parametrize("case", GPU_ATTENTION_CASES, ids=case_id)
@needs_cuda
def test_flash_attention_kernel(case: tuple, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(attention_ops, "DENSE_MAX_BYTES", 0)  # past the dense path's budget
    batch, L, S, E, causal = case
    q, k, v, do = attention_inputs(batch, L, S, E, np.float32, seed=4)
    scale = 1.0 / math.sqrt(E)
    assert kernels.supports_flash_attention(q, k, v, None, 0.0)
    got = op_attention(q, k, v, do, causal, scale, device="cuda")
    expected = op_attention(*as_float64(q, k, v, do), causal, scale)
    for name, g, ref in zip(("o", "dq", "dk", "dv"), got, expected):
        assert g.dtype == np.float32, name
        assert_close(g.astype(np.float64), ref, GPU_RTOL, name)


@needs_cuda
def test_flash_attention_kernel_on_gpt_head_views() -> None:
    """The GPT hands the op transposed views (B, nh, T, hs) of (B, T, nh, hs): the kernels
    read them in place, and their lse matches the twin's."""
    from minitorch_gpu.backend._cupy import cupy  # CuPy, or the emulated GPU's stand-in
    B, T, nh, hs = 2, 45, 3, 64
    rng = np.random.default_rng(5)
    qkv = [rng.standard_normal((B, T, nh, hs)).astype(np.float32) for _ in range(3)]
    views = [cupy.asarray(a).transpose(0, 2, 1, 3) for a in qkv]
    assert not views[0].flags.c_contiguous
    o, lse = kernels.flash_attention_forward(*views, True, 0.125)
    ref_o, ref_lse = reference.flash_attention_forward(
        *[a.transpose(0, 2, 1, 3).copy() for a in qkv], True, 0.125)
    assert_close(cupy.asnumpy(o), ref_o, 1e-5, "o")
    assert_close(cupy.asnumpy(lse), ref_lse, 1e-5, "lse")


def refuse_copies(array):
    """Stands in for the launchers' ``loader.contiguous``: passes contiguous arrays (o,
    lse) and fails on any other, so a test proves the inputs were read in place."""
    assert array.flags.c_contiguous, f"an input of strides {array.strides} was copied"
    return array


def dense_attention(q, k, v, do, causal: bool, scale: float, device: str = "cpu") -> list:
    """o, lse, dq, dk, dv of softmax(q k^T scale [causal]) v by the textbook formulas, with
    the whole (L, S) matrix, computed on ``device`` in the inputs' dtype and returned on the
    host: the reference where the op on the CPU would be slow (a long sequence in float64),
    itself checked against the op (test_dense_attention_reference_matches_the_op)."""
    backend = mt.get_backend(device)
    xp = backend.xp
    q, k, v, do = (backend.asarray(a) for a in (q, k, v, do))
    scores = (q @ xp.swapaxes(k, -1, -2)) * scale  # (..., L, S)
    if causal:
        scores = xp.where(xp.tril(xp.ones(scores.shape[-2:], bool)), scores, -xp.inf)
    top = scores.max(axis=-1, keepdims=True)
    p = xp.exp(scores - top)
    del scores
    total = p.sum(axis=-1, keepdims=True)
    lse = (top + xp.log(total))[..., 0]
    p /= total
    o = p @ v
    dv = xp.swapaxes(p, -1, -2) @ do
    ds = do @ xp.swapaxes(v, -1, -2)  # dP
    ds -= (do * o).sum(axis=-1, keepdims=True)
    ds *= p
    ds *= scale
    dq, dk = ds @ k, xp.swapaxes(ds, -1, -2) @ q
    return [backend.to_numpy(a) for a in (o, lse, dq, dk, dv)]


@pytest.mark.parametrize("case", ATTENTION_CASES, ids=case_id)
def test_dense_attention_reference_matches_the_op(case: tuple) -> None:
    batch, L, S, E, causal = case
    q, k, v, do = attention_inputs(batch, L, S, E, np.float64)
    o, lse, *grads = dense_attention(q, k, v, do, causal, 0.3)
    for name, got, ref in zip(("o", "dq", "dk", "dv"), (o, *grads),
                              op_attention(q, k, v, do, causal, 0.3)):
        assert_close(got, ref, TWIN_RTOL[np.float64], name)
    _, ref_lse = reference.flash_attention_forward(q, k, v, causal, 0.3)
    assert_close(lse, ref_lse, TWIN_RTOL[np.float64], "lse")


def flash_on_gpt_heads(B: int, T: int, nh: int, hs: int, causal: bool, dtype: type,
                       reference_device: str = "cpu") -> None:
    """The launchers on GPT's heads in ``dtype`` (views of (B, T, 3C), dO a view of
    (B, T, C)), none of them copied, against float64 attention of the same values (bf16 and
    fp16 widen exactly) on ``reference_device``: o, lse, dq, dk, dv, float32, to GPU_RTOL.
    """
    from minitorch_gpu.backend._cupy import cupy  # CuPy, or the emulated GPU's stand-in
    qkv = gpt_projection(B, T, nh, hs, dtype, seed=8)
    grad = output_gradient(B, T, nh, hs, dtype, seed=9)
    gpu_qkv, gpu_grad = (mt.tensor(a, device="cuda").data for a in (qkv, grad))
    assert gpu_qkv.dtype == gpu_grad.dtype == dtype
    scale = 1.0 / math.sqrt(hs)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(kernel_loader, "contiguous", refuse_copies)
        o, lse = kernels.flash_attention_forward(*heads_of(gpu_qkv), causal, scale)
        grads = kernels.flash_attention_backward(*heads_of(gpu_qkv), o,
                                                 gpu_grad.transpose(0, 2, 1, 3), lse, causal,
                                                 scale)
    wide = [np.ascontiguousarray(a).astype(np.float64)
            for a in (*heads_of(qkv), grad.transpose(0, 2, 1, 3))]
    expected = dense_attention(*wide, causal, scale, device=reference_device)
    for name, got, ref in zip(("o", "lse", "dq", "dk", "dv"), (o, lse, *grads), expected):
        got = cupy.asnumpy(got)
        assert got.dtype == np.float32 and got.flags.c_contiguous, name
        assert_close(got.astype(np.float64), ref, GPU_RTOL, name)


# (B, T, nh, hs, causal, dtype): GPT's packed heads; lengths off the 32-key tile and the
# 16- or 8-row blocks, one position, head dims at, above and off a warp; fp16 once
GPU_PACKED_CASES = [
    (2, 77, 3, 64, True, "bf16"),
    (2, 77, 3, 64, False, "bf16"),
    (1, 45, 2, 128, True, "bf16"),
    (3, 1, 2, 64, True, "bf16"),
    (1, 37, 2, 17, False, "bf16"),
    (2, 77, 3, 64, True, "float32"),
    (1, 45, 2, 128, False, "float32"),
    (1, 50, 2, 64, True, "fp16"),
]
STORED = {"float32": np.float32, "bf16": BF16, "fp16": np.float16}


@pytest.mark.parametrize("case", GPU_PACKED_CASES,
                         ids=lambda c: f"B{c[0]}-T{c[1]}-nh{c[2]}-hs{c[3]}-"
                                       f"{'causal' if c[4] else 'full'}-{c[5]}")
@needs_cuda
def test_flash_attention_kernel_reads_gpt_heads_as_stored(case: tuple) -> None:
    """bf16 (and float32, fp16) q, k, v read in place from the (B, T, 3C) projection and dO
    from the (B, T, C) gradient, no widened or contiguous copies, match float64."""
    B, T, nh, hs, causal, dtype = case
    flash_on_gpt_heads(B, T, nh, hs, causal, STORED[dtype])


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@gpu_only
@needs_cuda
def test_flash_attention_kernel_on_a_long_sequence(causal: bool) -> None:
    """8192 positions of bf16 GPT heads (one head's float32 scores alone would be 256 MiB):
    against float64 attention computed on the GPU (2 GiB of (L, S) matrices there)."""
    flash_on_gpt_heads(1, 8192, 2, 64, causal, BF16, reference_device="cuda")


@gpu_only
@needs_cuda
def test_flash_attention_kernel_past_65535_problems() -> None:
    """70,000 (batch, head) problems: more than a grid's y dim holds (65,535), where the
    kernels once put them; their blocks are one flat row now."""
    from minitorch_gpu.backend._cupy import cupy  # CuPy, or the emulated GPU's stand-in
    q, k, v, do = attention_inputs((2, 35000), 3, 5, 32, np.float32, seed=10)
    scale = 1.0 / math.sqrt(32)
    o, lse = kernels.flash_attention_forward(*map(cupy.asarray, (q, k, v)), True, scale)
    grads = kernels.flash_attention_backward(*map(cupy.asarray, (q, k, v)), o,
                                             cupy.asarray(do), lse, True, scale)
    expected = op_attention(*as_float64(q, k, v, do), True, scale)
    for name, got, ref in zip(("o", "dq", "dk", "dv"), (o, *grads), expected):
        assert_close(cupy.asnumpy(got).astype(np.float64), ref, GPU_RTOL, name)


@needs_cuda
def test_unsupported_cases_fall_back_on_the_gpu() -> None:
    """A mask, dropout or float64 takes the vectorised path, and still matches the CPU."""
    q, k, v, do = attention_inputs((1, 2), 9, 9, 16, np.float64, seed=6)
    mask = np.tril(np.ones((9, 9), bool))
    out = {}
    for device in ("cuda", "cpu"):
        t = [mt.tensor(a, device=device) for a in (q, k, v)]
        out[device] = F.scaled_dot_product_attention(
            *t, attn_mask=mt.tensor(mask, device=device)).cpu().numpy()
    assert_close(out["cuda"], out["cpu"], 1e-10, "masked attention")


# --- attention on tensor cores: cuBLAS products around attention_softmax.cu ----------------
def test_attention_softmax_takes_no_values_that_widen_the_batch() -> None:
    """P is saved with the scores' batch (q's and k's); values with more batch dims would
    make backward's dA = dO V^T larger than P, which the backward launcher refuses."""
    q, k = np.zeros((1, 5, 8), np.float32), np.zeros((1, 6, 8), np.float32)
    assert kernels.supports_attention_softmax(q, k, np.zeros((1, 6, 8), np.float32), None)
    assert kernels.supports_attention_softmax(q, k, np.zeros((6, 8), np.float32), None)
    assert not kernels.supports_attention_softmax(q, k, np.zeros((3, 6, 8), np.float32),
                                                  None)


@pytest.mark.parametrize("dtype", [np.float32, BF16], ids=["float32", "bf16"])
@pytest.mark.parametrize("dropout_p", [0.0, 0.2])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("shape", [(2, 3, 37, 41), (1, 1, 1, 1), (1, 2, 5, 1030)])
@needs_cuda
def test_attention_softmax_kernel_matches_its_twin(shape, causal, dropout_p, dtype) -> None:
    """Forward and backward against the NumPy twin: the same probabilities (to float32
    rounding, then bf16's), the same dropout mask bit for bit (the hash of the seed)."""
    from minitorch_gpu.backend._cupy import cupy  # CuPy, or the emulated GPU's stand-in
    rng = np.random.default_rng(7)
    scores = (rng.standard_normal(shape) * 4).astype(np.float32)
    d_attended = rng.standard_normal(shape).astype(np.float32)
    seed = np.array([0x1234_5678_9ABC], np.uint64)
    L = shape[-2]
    causal = causal and L <= shape[-1]
    probs, attended = kernels.attention_softmax_forward(
        cupy.asarray(scores), causal, 0.3, dropout_p, cupy.asarray(seed), dtype)
    ref_probs, ref_attended = reference.attention_softmax_forward(scores, causal, 0.3,
                                                                  dropout_p, seed, dtype)
    rtol = 1e-5 if dtype == np.float32 else 1e-2
    assert probs.dtype == dtype and attended.dtype == dtype
    assert_close(cupy.asnumpy(probs).astype(np.float64), ref_probs.astype(np.float64), rtol,
                 "P")
    got_attended = cupy.asnumpy(attended).astype(np.float64)
    assert ((got_attended == 0) == (ref_attended.astype(np.float64) == 0)).all(), "mask"
    assert_close(got_attended, ref_attended.astype(np.float64), rtol, "A")
    d_scores = kernels.attention_softmax_backward(cupy.asarray(d_attended), probs, 0.3,
                                                  dropout_p, cupy.asarray(seed))
    ref = reference.attention_softmax_backward(d_attended, cupy.asnumpy(probs), 0.3,
                                               dropout_p, seed)
    assert_close(cupy.asnumpy(d_scores).astype(np.float64), ref.astype(np.float64),
                 rtol * 10, "dS")


@pytest.mark.parametrize("case", GPU_ATTENTION_CASES, ids=case_id)
@needs_cuda
def test_dense_attention_on_the_gpu(case: tuple) -> None:
    """float32 attention through the dense path (cuBLAS, the softmax kernel) against the
    float64 op, forward and backward."""
    batch, L, S, E, causal = case
    q, k, v, do = attention_inputs(batch, L, S, E, np.float32, seed=8)
    scale = 1.0 / math.sqrt(E)
    assert kernels.supports_attention_softmax(q, k, v, None)
    got = op_attention(q, k, v, do, causal, scale, device="cuda")
    expected = op_attention(*as_float64(q, k, v, do), causal, scale)
    for name, g, ref in zip(("o", "dq", "dk", "dv"), got, expected):
        assert g.dtype == np.float32, name
        assert_close(g.astype(np.float64), ref, GPU_RTOL, name)


@pytest.mark.parametrize("path", ["dense", "flash"])
@needs_cuda
def test_gpt_attention_in_bf16_on_the_gpu_matches_the_cpu(path: str,
                                                          monkeypatch: pytest.MonkeyPatch):
    """GPT's packed attention under autocast on each CUDA path against the CPU's emulated
    bf16 (the same roundings at the same places, up to bf16's last bit)."""
    if path == "flash":
        monkeypatch.setattr(attention_ops, "DENSE_MAX_BYTES", 0)
    rng = np.random.default_rng(9)
    qkv = rng.standard_normal((2, 67, 3 * 128)).astype(np.float32)
    grad = rng.standard_normal((2, 67, 128)).astype(np.float32)
    out = {}
    for device in ("cuda", "cpu"):
        x = mt.tensor(qkv, device=device, requires_grad=True)
        with mt.autocast("bf16"):
            y = F.packed_causal_attention(x, 4)
        y.float().backward(mt.tensor(grad, device=device))
        out[device] = (y.float().detach().cpu().numpy(), x.grad.cpu().numpy())
    for what, got, ref in zip(("y", "grad"), out["cuda"], out["cpu"]):
        assert_close(got.astype(np.float64), ref.astype(np.float64), 3e-2, what)


@pytest.mark.parametrize("layout", ["2d", "weight.T", "batched", "heads", "vector"])
@needs_cuda
def test_bf16_products_through_cublas(layout: str) -> None:
    """The backend's own cuBLAS call on each layout it plans, against float64: bf16 in,
    float32 out, and a bf16 out rounded once."""
    from minitorch_gpu.backend._cupy import cupy  # CuPy, or the emulated GPU's stand-in
    backend = mt.get_backend("cuda")
    rng = np.random.default_rng(10)
    bf = lambda *shape: cupy.asarray(rng.standard_normal(shape).astype(BF16))
    qkv = bf(2, 33, 3, 4, 16)  # views of it are taken on the device: strides kept
    a, b = {
        "2d": (bf(65, 40), bf(40, 24)),
        "weight.T": (bf(65, 40), bf(24, 40).T),
        "batched": (bf(3, 65, 40), bf(3, 40, 24)),
        "heads": (qkv[:, :, 0].transpose(0, 2, 1, 3), qkv[:, :, 1].transpose(0, 2, 3, 1)),
        "vector": (cupy.ones(65, BF16), bf(65, 24)),
    }[layout]
    a_host, b_host = cupy.asnumpy(a), cupy.asnumpy(b)
    expected = a_host.astype(np.float64) @ b_host.astype(np.float64)
    got = backend.matmul(a, b)
    assert got.dtype == np.float32
    assert_close(cupy.asnumpy(got).astype(np.float64), expected, 1e-5, layout)
    if layout != "vector":
        out = cupy.zeros(expected.shape, BF16)
        assert backend.matmul(a, b, out=out) is out
        rounded = cupy.asnumpy(got).astype(BF16)  # float32 sums, then one rounding
        mismatch = (cupy.asnumpy(out).view(np.uint16) != rounded.view(np.uint16)).mean()
        assert mismatch < 0.01, mismatch  # a sum order may differ: a last bit at most


# --- Llama's kernels on a GPU ---------------------------------------------------------------
LLAMA_STORED = {"float32": np.float32, "bf16": BF16}


@pytest.mark.parametrize("dtype", ["float32", "bf16"])
@pytest.mark.parametrize("affine", [True, False], ids=["weight", "none"])
@pytest.mark.parametrize("case", RMS_NORM_CASES + [pytest.param(
    ((64 * 65535 + 100, 1), 1), marks=pytest.mark.skipif(
        mt.cuda.is_emulated(), reason="GPU-only: too slow on the emulated GPU"))],
                         ids=lambda c: f"{c[0]}-n{c[1]}")  # the last: 65535 chunks of 65 rows
@needs_cuda
def test_rms_norm_kernel_matches_its_twin(case: tuple, affine: bool, dtype: str) -> None:
    """out and rstd, dx and dw against the twin (float32 sums in another order: to 1e-5;
    bf16's out to its last bit), and against float64 ops."""
    from minitorch_gpu.backend._cupy import cupy  # CuPy, or the emulated GPU's stand-in
    shape, n = case
    x, w, dy = rms_norm_inputs(shape, n, np.float32, seed=3)
    x, dy = x.astype(LLAMA_STORED[dtype]), dy.astype(LLAMA_STORED[dtype])
    w = w if affine else None
    assert kernels.supports_rms_norm(x.reshape(-1, n), w)
    out, rstd = kernels.rms_norm_forward(cupy.asarray(x), None if w is None else cupy.asarray(w),
                                         1e-5, n)
    dx, dw = kernels.rms_norm_backward(cupy.asarray(dy), cupy.asarray(x),
                                       None if w is None else cupy.asarray(w), rstd, n)
    ref_out, ref_rstd = reference.rms_norm_forward(x, w, 1e-5, n)
    ref_dx, ref_dw = reference.rms_norm_backward(dy, x, w, ref_rstd, n)
    assert out.dtype == x.dtype and rstd.dtype == dx.dtype == np.float32
    assert (dw is None) == (w is None)
    rtol = 1e-5 if dtype == "float32" else 1e-2
    assert_close(cupy.asnumpy(out).astype(np.float64), ref_out.astype(np.float64), rtol, "out")
    for name, got, ref in (("rstd", rstd, ref_rstd), ("dx", dx, ref_dx), ("dw", dw, ref_dw)):
        if ref is not None:
            assert_close(cupy.asnumpy(got), ref, 1e-4, name)
    if n == 1:  # dx = w dy rstd eps / (x^2 + eps): 1 - x^2 rstd^2 cancels in float32, in
        return  # the kernel as in its twin (compared above); float64 gets the rest
    wide = [None if a is None else a.astype(np.float64) for a in (x, w, dy)]
    for name, got, ref in zip(("dx", "dw"), (dx, dw), op_rms_norm(*wide, n, 1e-5)[1:]):
        if ref is not None:
            assert_close(cupy.asnumpy(got).astype(np.float64), ref, GPU_RTOL, name)


@pytest.mark.parametrize("dtype", ["float32", "bf16"])
@pytest.mark.parametrize("inverse", [False, True], ids=["forward", "inverse"])
@pytest.mark.parametrize("layout", ["contiguous", "fused-projection", "bhtd", "strided-dim"])
@needs_cuda
def test_rotary_kernel_matches_its_twin(layout: str, inverse: bool, dtype: str) -> None:
    """Strided q and k views of a fused (B, T, (H + 2 Hkv) D) projection read in place;
    a strided last dim copied; against the twin (float32: to rounding; bf16: a last bit)."""
    from minitorch_gpu.backend._cupy import cupy  # CuPy, or the emulated GPU's stand-in
    B, T, H, D = 2, 37, 4, 64
    rng = np.random.default_rng(4)
    base = rng.standard_normal((B, T, (H + 4) * D)).astype(LLAMA_STORED[dtype])
    gpu = cupy.asarray(base)
    views = {
        "contiguous": lambda a: a[..., :H * D].copy().reshape(B, T, H, D),
        "fused-projection": lambda a: a[..., H * D:(H + 2) * D].reshape(B, T, 2, D),
        "bhtd": lambda a: a[..., :H * D].reshape(B, T, H, D).transpose(0, 2, 1, 3).copy()
        .transpose(0, 2, 1, 3),
        "strided-dim": lambda a: a.reshape(B, T, H, 2 * D)[..., ::2],
    }
    x, x_gpu = views[layout](base), views[layout](gpu)
    cos, sin = rotary_tables(T, x.shape[-1])
    assert kernels.supports_rotary(x_gpu, cupy.asarray(cos), cupy.asarray(sin))
    out = kernels.rotary_forward(x_gpu, cupy.asarray(cos), cupy.asarray(sin), inverse)
    assert out.dtype == x.dtype and out.flags.c_contiguous
    ref = reference.rotary_forward(x, cos, sin, inverse)
    rtol = 1e-6 if dtype == "float32" else 1e-2
    assert_close(cupy.asnumpy(out).astype(np.float64), ref.astype(np.float64), rtol, "out")


@pytest.mark.parametrize("dtype", ["float32", "bf16"])
@pytest.mark.parametrize("shape", [(1,), (3, 1000), (2, 3, 257), (70001,)])
@needs_cuda
def test_swiglu_kernel_matches_its_twin(shape: tuple, dtype: str) -> None:
    from minitorch_gpu.backend._cupy import cupy  # CuPy, or the emulated GPU's stand-in
    gate, up, dy = (a.astype(LLAMA_STORED[dtype]) for a in swiglu_inputs(shape, np.float32, 5))
    out = kernels.swiglu_forward(cupy.asarray(gate), cupy.asarray(up))
    grads = kernels.swiglu_backward(*map(cupy.asarray, (dy, gate, up)))
    assert out.dtype == gate.dtype and all(g.dtype == np.float32 for g in grads)
    rtol = 1e-5 if dtype == "float32" else 1e-2
    ref = reference.swiglu_forward(gate, up)
    assert_close(cupy.asnumpy(out).astype(np.float64), ref.astype(np.float64), rtol, "out")
    for name, got, ref in zip(("dgate", "dup"), grads, reference.swiglu_backward(dy, gate, up)):
        assert np.isfinite(cupy.asnumpy(got)).all(), name
        assert_close(cupy.asnumpy(got), ref, 1e-5, name)
    # strided halves of a fused (.., 2F) gate/up projection: copied once, same results
    fused = cupy.asarray(np.concatenate([gate, up], axis=-1))
    half = gate.shape[-1]
    out_fused = kernels.swiglu_forward(fused[..., :half], fused[..., half:])
    np.testing.assert_array_equal(cupy.asnumpy(out_fused), cupy.asnumpy(out))


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("case", GQA_CASES, ids=lambda c: "B{}-Hkv{}-G{}-L{}-S{}-E{}".format(*c))
@needs_cuda
def test_flash_attention_kernel_grouped_query(case: tuple, causal: bool,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """GQA through the op on CUDA, past the dense budget: the flash kernels on the grouped
    form (k, v not repeated), against float64 enable_gqa attention on the CPU; and the
    launchers' own outputs (lse, dk and dv in k's shape) against the twin."""
    from minitorch_gpu.backend._cupy import cupy  # CuPy, or the emulated GPU's stand-in
    monkeypatch.setattr(attention_ops, "DENSE_MAX_BYTES", 0)
    B, Hkv, G, L, S, E = case
    q, k, v, do = gqa_inputs(B, Hkv, G, L, S, E, np.float32, seed=11)
    scale = 1.0 / math.sqrt(E)
    got = op_gqa(q, k, v, do, causal, scale, device="cuda")
    expected = op_gqa(*as_float64(q, k, v, do), causal, scale)
    for name, g, ref in zip(("o", "dq", "dk", "dv"), got, expected):
        assert g.dtype == np.float32, name
        assert_close(g.astype(np.float64), ref, GPU_RTOL, name)
    gq, gk, gv, gdo = grouped(q, k, v, do)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(kernel_loader, "contiguous", refuse_copies)
        o, lse = kernels.flash_attention_forward(*map(cupy.asarray, (gq, gk, gv)), causal,
                                                 scale)
        grads = kernels.flash_attention_backward(*map(cupy.asarray, (gq, gk, gv)), o,
                                                 cupy.asarray(gdo), lse, causal, scale)
    ref_o, ref_lse = reference.flash_attention_forward(gq, gk, gv, causal, scale)
    ref_grads = reference.flash_attention_backward(gq, gk, gv, ref_o, gdo, ref_lse, causal,
                                                   scale)
    for name, g, ref in zip(("o", "lse", "dq", "dk", "dv"), (o, lse, *grads),
                            (ref_o, ref_lse, *ref_grads)):
        assert_close(cupy.asnumpy(g), ref, 1e-4, name)
