"""The emulated GPU (minitorch_gpu/backend/emulated_cuda) is not a toy: small probe kernels
(tests/emulated_cuda/probes.cu) show that it runs CUDA's rules and catches what a GPU would
get wrong silently: a removed barrier, a shared-memory race, a write past a buffer, a
shuffle over lanes that are not there, a launch argument of the wrong C type, a block past
__launch_bounds__, a deadlock; and that it flushes denormals as -ftz=true does. The same
mutations of the project's own kernels (one __syncthreads removed, a row loop's < made
<=) fail against their ops.
"""
from __future__ import annotations

import enum
import os
import re
from pathlib import Path

import numpy as np
import pytest

from minitorch_gpu.backend import emulated_cuda
from minitorch_gpu.backend.emulated_cuda import (EmulatedKernelError, EmulatedModule, memory,
                                                 schedules)
from minitorch_gpu.backend.emulated_cuda.build import kernels_of
from minitorch_gpu.backend.kernels import loader

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(
    emulated_cuda.unavailable_reason() is not None,
    reason=f"no emulated GPU here: {emulated_cuda.unavailable_reason()}")]

PROBES = Path(__file__).resolve().parent / "emulated_cuda" / "probes.cu"
SEEDS = (0, 1, 2)


class Flag(enum.IntEnum):  # an int subclass: CuPy refuses it as a kernel argument
    ON = 1


def probe(name: str, **defines: int):
    return EmulatedModule(PROBES, tuple(sorted(defines.items()))).get_function(name)


def device(values, dtype=np.float32):
    return memory.to_device(np.asarray(values, dtype=dtype))


def test_a_barrier_makes_a_block_sum_right_on_every_schedule():
    x = np.random.default_rng(0).standard_normal(600).astype(np.float32)
    out = memory.empty(3)
    for seed in SEEDS:
        with schedules(seed):
            probe("block_sum")((3,), (256,), (device(x), out, np.int32(600)))
        np.testing.assert_allclose(out, [x[i * 256:(i + 1) * 256].sum() for i in range(3)],
                                   rtol=1e-5)


def test_a_removed_barrier_changes_the_results():
    x = np.ones(256, np.float32)
    out = memory.empty(1)
    results = []
    for seed in SEEDS:
        with schedules(seed):
            probe("block_sum", SKIP_BARRIER=1)((1,), (256,), (device(x), out, np.int32(256)))
        results.append(float(out[0]))
    assert not all(r == 256.0 for r in results), results  # poisoned (NaN) or partial sums


def test_a_shared_memory_race_changes_the_results():
    x = np.arange(256, dtype=np.float32)
    expected = x + x[::-1]
    out = memory.empty(256)
    with schedules(0):
        probe("mirror_add")((1,), (256,), (device(x), out))
    np.testing.assert_array_equal(out, expected)
    wrong = 0
    for seed in SEEDS:
        with schedules(seed):
            probe("mirror_add", RACE=1)((1,), (256,), (device(x), out))
        wrong += not np.array_equal(out, expected)
    assert wrong == len(SEEDS)


def test_a_write_one_past_the_end_faults_naming_the_kernel_and_the_buffer():
    y = memory.empty(100)
    probe("fill_ones")((1,), (32,), (y, np.int32(100)))
    np.testing.assert_array_equal(y, 1.0)
    with pytest.raises(EmulatedKernelError,
                       match=r"fill_ones \(probes.cu -DROW_LOOP_LE=1\): block \(0, 0, 0\), "
                             r"thread \(4, 0, 0\) wrote byte 400 of parameter 0 'y', a buffer "
                             r"of 100 float32 \(400 bytes\): past its end"):
        probe("fill_ones", ROW_LOOP_LE=1)((1,), (32,), (y, np.int32(100)))


def cuda_shuffle(x: np.ndarray, kind: str, operand: int, width: int) -> np.ndarray:
    """CUDA's rules for the four shuffles, per warp of 32 lanes."""
    out = np.empty_like(x)
    for t in range(x.size):
        lane, base = t % 32, t - t % 32
        segment = lane - lane % width
        if kind == "idx":
            source = segment + operand % width
        elif kind == "up":
            source = lane - operand if lane - segment >= operand else lane
        elif kind == "down":
            source = lane + operand if lane - segment + operand < width else lane
        else:
            source = lane ^ operand if lane ^ operand < segment + width else lane
        out[t] = x[base + source]
    return out


@pytest.mark.parametrize("operand, width", [(1, 32), (5, 32), (16, 32), (3, 8), (1, 2),
                                            (7, 16), (0, 4), (9, 8)])
def test_shuffles_follow_cudas_rules_for_widths_and_edges(operand, width):
    x = np.arange(128, dtype=np.float32) * 10
    out = memory.empty(4 * 128)
    probe("shuffles")((2,), (64,), (device(x), out, np.int32(operand), np.int32(width)))
    for i, kind in enumerate(("idx", "up", "down", "xor")):
        np.testing.assert_array_equal(out[i * 128:(i + 1) * 128],
                                      cuda_shuffle(x, kind, operand, width), err_msg=kind)


@pytest.mark.parametrize("variant, words", [
    ("EXIT_EARLY", r"__shfl_xor_sync with mask 0xffffffff waits for lane 16, which has exited"),
    ("HALF_MASK", r"__shfl_xor_sync from a lane its own mask leaves out"),
    ("BARRIER_SPLIT", r"deadlock: thread \(\d+, 0, 0\) waits at __shfl_xor_sync for lane 16, "
                      r"which is waiting at __syncthreads"),
])
def test_a_shuffle_over_lanes_that_cannot_come_is_reported(variant, words):
    x, out = device(np.ones(32)), memory.empty(32)
    with pytest.raises(EmulatedKernelError, match=r"broken_warp_sum .*" + words):
        probe("broken_warp_sum", **{variant: 1})((1,), (32,), (x, out))


def test_a_shuffle_naming_lanes_past_the_block_is_reported():
    x, out = device(np.ones(48)), memory.empty(48)
    with pytest.raises(EmulatedKernelError, match="names lane 16, past the block's last "
                                                  "thread"):
        probe("broken_warp_sum")((1,), (48,), (x, out))
    out = memory.empty(64)
    probe("broken_warp_sum")((1,), (64,), (device(np.arange(64)), out))
    np.testing.assert_array_equal(out, np.repeat([np.arange(32).sum(),
                                                  np.arange(32, 64).sum()], 32))


def test_a_partial_warp_shuffles_over_the_lanes_it_has():
    x, out = np.arange(48, dtype=np.float32), memory.empty(48)
    probe("partial_warp_sums")((1,), (48,), (device(x), out))
    np.testing.assert_array_equal(out, np.repeat(x.reshape(3, 16).sum(1), 16))


def test_warps_of_a_2d_block_follow_the_linear_thread_index():
    x, out = np.arange(64, dtype=np.float32), memory.empty(64)
    probe("rotate_2d")((1,), (8, 8), (device(x), out))  # warp 0: rows 0-3, warp 1: 4-7
    np.testing.assert_array_equal(out, [(t - t % 32) + (t % 32 + 1) % 32 for t in range(64)])


def test_shuffle_operands_count_by_their_low_five_bits_as_ptx_does():
    x = np.arange(64, dtype=np.float32)
    wide, narrow = memory.empty(4 * 64), memory.empty(4 * 64)
    probe("shuffles")((1,), (64,), (device(x), wide, np.int32(33), np.int32(32)))
    probe("shuffles")((1,), (64,), (device(x), narrow, np.int32(1), np.int32(32)))
    np.testing.assert_array_equal(wide, narrow)


@pytest.mark.parametrize("args, words", [
    (lambda y: (y, 100), r"parameter 1 'n' \(int\) expects int, got 100, which CuPy passes as "
                         r"int64 \(8 bytes\)"),
    (lambda y: (y, np.int64(100)), r"parameter 1 'n' \(int\) expects int, got np.int64\(100\), "
                                   r"which CuPy passes as int64"),
    (lambda y: (y, 1.0), r"parameter 1 'n' \(int\) expects int, got 1.0, which CuPy passes "
                         r"as float64"),
    (lambda y: (np.ones(100, np.float32), np.int32(100)),
     r"parameter 0 'y' \(float\*\) was given a host array"),
    (lambda y: (memory.empty(100, np.float64), np.int32(100)),
     r"parameter 0 'y' \(float\*\) expects float elements, got an array of float64"),
    (lambda y: (np.int32(100), y), r"parameter 0 'y' \(float\*\) expects a device array, got "
                                   r"int32"),
    (lambda y: (y,), r"takes 2 arguments \(y, n\), got 1"),
    (lambda y: (y, 2 ** 63), r"parameter 1 'n' \(int\) expects int, got 9223372036854775808, "
                             r"which CuPy passes as uint64"),
    (lambda y: (y, Flag.ON), r"parameter 1 'n' \(int\): unsupported type Flag"),
])
def test_a_mistyped_launch_argument_is_a_clear_error(args, words):
    with pytest.raises(EmulatedKernelError, match=r"fill_ones \(probes.cu\): " + words):
        probe("fill_ones")((1,), (32,), args(memory.empty(100)))


def test_launch_shapes_are_checked_against_the_bounds_and_cudas_limits():
    y = memory.empty(4)
    kernel = probe("fill_ones")
    with pytest.raises(EmulatedKernelError, match=r"a block of 512 threads, past "
                                                  r"__launch_bounds__ \(256\)"):
        kernel((1,), (512,), (y, np.int32(4)))
    with pytest.raises(EmulatedKernelError, match=r"a block of 2048 threads, past CUDA's 1024"):
        probe("rotate_2d")((1,), (64, 32), (y, y))
    with pytest.raises(EmulatedKernelError, match=r"grid.y is 65536, expected 1 to 65535"):
        kernel((1, 65536), (32,), (y, np.int32(4)))
    with pytest.raises(EmulatedKernelError, match=r"block must be a tuple of 1 to 3 ints"):
        kernel((1,), [32], (y, np.int32(4)))


def test_denormals_are_flushed_as_under_ftz():
    tiny = np.array([1e-40, -3e-39, 1e-30, 2.0], np.float32)  # two float32 subnormals
    out = memory.empty(4)
    probe("scaled")((1,), (256,), (device(tiny), out, np.int64(4), np.float32(1.0)))
    np.testing.assert_array_equal(out, np.float32([0.0, 0.0, 1e-30, 2.0]))
    probe("scaled")((1,), (256,), (device(tiny), out, np.int64(4), np.float32(1e-10)))
    np.testing.assert_array_equal(out, np.float32([0.0, 0.0, 0.0, 2e-10]))  # 1e-40: flushed


def test_fresh_device_memory_is_poisoned_and_guarded():
    a = memory.empty((3, 5), np.float32)
    assert np.isnan(a).all() and memory.is_device_array(a) and memory.is_device_array(a[1:, 2])
    assert not memory.is_device_array(np.ones(3))
    end = a.__array_interface__["data"][0] + a.nbytes
    assert end % memory.PAGE == 0 and memory.find_buffer(end).stop == end  # flush


def test_kernel_declarations_are_read_with_their_bounds():
    kernels = {k.name: k for k in kernels_of(loader.source_text("attention.cu"))}
    assert set(kernels) == {"flash_attention_forward", "flash_attention_backward_preprocess",
                            "flash_attention_backward_dq", "flash_attention_backward_dkdv"}
    assert kernels["flash_attention_forward"].bounds == "WARPS * WARP FWD_MIN_BLOCKS"
    assert kernels["flash_attention_forward"].parameters[:5] == ("q", "k", "v", "o", "lse")


# --- mutations of the project's own kernels ------------------------------------------------
def mutated(tmp_path: Path, name: str, old: str, new: str) -> Path:
    text = loader.source_text(name)
    assert text.count(old) >= 1, old
    path = tmp_path / name
    path.write_text(text.replace(old, new, 1), encoding="utf-8")
    return path


def cross_entropy_losses(path: Path, logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    rows, classes = logits.shape
    kernel = EmulatedModule(path).get_function("cross_entropy_forward")
    loss, lse = memory.empty(rows), memory.empty(rows)
    kernel((rows,), (256,), (device(logits), device(targets, np.int64), loss, lse,
                             np.int32(classes), np.int64(-100), np.float32(0.0)))
    return np.array(loss)


def test_one_removed_barrier_in_a_project_kernel_fails(tmp_path):
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((3, 700)).astype(np.float32)
    targets = rng.integers(0, 700, 3)
    shifted = logits - logits.max(1, keepdims=True)
    expected = np.log(np.exp(shifted).sum(1)) - shifted[np.arange(3), targets]
    source = loader.SOURCE_DIR / "cross_entropy.cu"
    np.testing.assert_allclose(cross_entropy_losses(source, logits, targets), expected,
                               rtol=1e-5)
    broken = mutated(tmp_path, "cross_entropy.cu", "__syncthreads();", "")
    results = []
    for seed in SEEDS:
        with schedules(seed):
            results.append(cross_entropy_losses(broken, logits, targets))
    assert not all(np.allclose(r, expected, rtol=1e-5) for r in results)


def test_a_row_loop_made_to_run_one_past_its_end_fails(tmp_path):
    """gelu.cu's grid-stride loop with ``i <= n``: one element past x and y."""
    text = loader.source_text("gelu.cu")
    loops = re.findall(r"i < n;", text)
    assert loops
    broken = mutated(tmp_path, "gelu.cu", "i < n;", "i <= n;")
    kernel = EmulatedModule(broken).get_function("gelu_forward")
    x, y = device(np.linspace(-2, 2, 256)), memory.empty(256)
    with pytest.raises(EmulatedKernelError, match=r"gelu_forward .* read byte 1024 of "
                                                  r"parameter 0 'x', a buffer of 256 float32"):
        kernel((1,), (256,), (x, y, np.int64(256), np.int32(1)))


def test_an_integer_division_by_zero_is_reported_not_fatal():
    d, out = device([5, 4, 0, 1], np.int32), memory.empty(4, np.int32)
    with pytest.raises(EmulatedKernelError, match=r"divide .* thread \(2, 0, 0\) divided an "
                                                  r"integer by zero"):
        probe("divide")((1,), (4,), (d, out))
    probe("divide")((1,), (4,), (device([5, 4, 3, 1], np.int32), out))  # the next launch runs
    np.testing.assert_array_equal(out, [20, 25, 33, 100])


def test_an_index_past_a_local_array_is_reported():
    x, out = device(np.arange(64)), memory.empty(16)
    probe("local_sum")((1,), (16,), (x, out, np.int32(4)))
    np.testing.assert_array_equal(out, np.arange(64).reshape(16, 4).sum(1))
    with pytest.raises(EmulatedKernelError, match=r"local_sum .* indexed a local or "
                                                  r"__shared__ array past its bounds"):
        probe("local_sum", OFF_BY_ONE=1)((1,), (16,), (x, out, np.int32(4)))


def test_blocks_run_in_a_shuffled_order():
    """A block that writes its neighbour's output: in order, the neighbour overwrites it
    afterwards; in a shuffled order some seed runs the neighbour first."""
    out = memory.empty(16)
    probe("own_and_neighbour")((16,), (32,), (out,))
    np.testing.assert_array_equal(out, np.arange(16))
    wrong = 0
    for seed in SEEDS:
        with schedules(seed):
            probe("own_and_neighbour", SPILL=1)((16,), (32,), (out,))
        wrong += not np.array_equal(out, np.arange(16))
    assert wrong >= 1


def test_a_module_given_a_relative_path_compiles(monkeypatch):
    monkeypatch.chdir(PROBES.parent)
    assert EmulatedModule(Path(PROBES.name)).get_function("fill_ones").parameters == ("y", "n")
