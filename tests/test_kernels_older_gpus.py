"""The fused kernels on a GPU older than the A100: the emulated GPU made a T4 (compute
capability 7.5, ``MINITORCH_EMULATE_CUDA_ARCH=75``, read when the CuPy stand-in is
imported, so each case runs in a subprocess).

NVRTC compiles every kernel for sm_75 in float32 and in bf16 (tests/test_kernels_nvrtc.py:
bf16 is read and rounded on its 16 bits and the arithmetic is float32, so nothing needs
sm_80), so the launchers refuse nothing there: the GPU kernel tests of test_kernels.py
pass on the T4 as on the H100, float32 and bf16 builds. A build that does not compile on
the GPU at hand is refused at its first launch with an error naming the kernel, the build,
the architecture and, for a bf16 build on sm < 80, ``system.dtype: fp16``.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from minitorch_gpu.backend import emulated_cuda
from minitorch_gpu.backend.kernels import loader

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(
    emulated_cuda.unavailable_reason() is not None,
    reason=f"no emulated GPU here: {emulated_cuda.unavailable_reason()}")]

ROOT = Path(__file__).resolve().parents[1]
# test_kernels.py's kernel tests on a GPU, every source, float32 and bf16 builds (the
# slowest sizes left out: the T4 changes nothing they would add)
GPU_KERNEL_TESTS = ("test_gelu_kernel or test_layer_norm_kernel or test_cross_entropy_kernel"
                    "_matches_its_twin or test_adamw_kernel or test_attention_softmax_kernel"
                    " or test_flash_attention_kernel_reads_gpt_heads_as_stored or "
                    "test_rms_norm_kernel or test_rotary_kernel or test_swiglu_kernel")


def run_as(arch: str, args: list) -> subprocess.CompletedProcess:
    """``python args`` on the emulated GPU reporting compute capability ``arch``."""
    env = dict(os.environ, MINITORCH_EMULATE_CUDA="1", MINITORCH_EMULATE_CUDA_ARCH=arch)
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)


def test_every_kernel_runs_on_a_t4_in_float32_and_bf16():
    result = run_as("75", ["-m", "pytest", "-v", "-p", "no:cacheprovider", "-m", "cuda",
                           "tests/test_kernels.py", "-k", GPU_KERNEL_TESTS])
    tail = result.stdout[-3000:] + result.stderr[-2000:]
    assert result.returncode == 0, f"the GPU kernel tests failed on sm_75:\n{tail}"
    passed = [line for line in result.stdout.splitlines() if " PASSED" in line]
    for source in ("gelu", "layer_norm", "cross_entropy", "adamw", "attention_softmax",
                   "flash_attention", "rms_norm", "rotary", "swiglu"):
        assert any(f"test_{source}_kernel" in line for line in passed), \
            f"no {source} kernel test passed on sm_75:\n{tail}"
    assert any("bf16" in line for line in passed), f"no bf16 build ran on sm_75:\n{tail}"


REFUSAL = """
import json
from minitorch_gpu.backend import _cupy, get_backend
from minitorch_gpu.backend.kernels import loader
cupy = _cupy.cupy
like = cupy.zeros((2, 2), dtype=cupy.float32)
found = {"capability": cupy.cuda.Device(0).compute_capability,
         "backend": list(get_backend("cuda").compute_capability())}
for dtype in (1, 0):  # bf16, float32: a head size the source refuses to compile
    try:
        loader.load_kernel(like, "attention.cu", "flash_attention_forward", HEAD_DIM=129,
                           INPUT_DTYPE=dtype)
        found[str(dtype)] = None
    except loader.KernelBuildError as exc:
        found[str(dtype)] = [str(exc), type(exc.__cause__).__name__]
print(json.dumps(found))
"""


def test_a_build_that_fails_on_a_t4_is_refused_naming_kernel_arch_and_the_fix():
    result = run_as("75", ["-c", REFUSAL])
    assert result.returncode == 0, result.stderr[-3000:]
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert found["capability"] == "75" and found["backend"] == [7, 5], found
    bf16, float32 = found["1"], found["0"]
    assert bf16 is not None and float32 is not None, found
    for message, _ in (bf16, float32):
        assert "kernel flash_attention_forward of attention.cu (HEAD_DIM=129" in message
        assert "could not be built for sm_75 (compute capability 7.5)" in message
        assert "HEAD_DIM" in message.split(": ", 1)[1]  # the compiler's own line
    assert "use system.dtype: fp16 (or float32) on this GPU" in bf16[0], bf16[0]
    assert "system.dtype" not in float32[0], float32[0]


@pytest.mark.parametrize("arch, defines, hint", [
    ("75", (("INPUT_DTYPE", 1),), "use system.dtype: fp16 (or float32) on this GPU"),
    ("75", (("PROB_BF16", 1),), "use system.dtype: fp16 (or float32) on this GPU"),
    ("86", (("INPUT_DTYPE", 1),), "system.dtype: float32 runs without this bf16 build"),
    ("75", (("INPUT_DTYPE", 0),), None),
    ("70", (), "not sm_70"),
])
def test_a_build_failure_says_what_to_do(arch, defines, hint):
    message = loader.build_failure("rmsnorm.cu", defines, "rms_norm_forward", arch,
                                   RuntimeError("log\nkern.cu(3): error: no such thing"))
    assert message.startswith(f"fused kernels: kernel rms_norm_forward of rmsnorm.cu")
    assert f"for sm_{arch} (compute capability {arch[0]}.{arch[1]}): kern.cu(3): error: " \
           f"no such thing" in message, message
    if hint is None:
        assert "system.dtype" not in message, message
    else:
        assert hint in message, message
