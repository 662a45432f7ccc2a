"""The real compiler: NVRTC (the nvidia-cuda-nvrtc wheel, called as CuPy 14 calls it, with
CuPy's own options: backend/kernels/nvrtc.py) compiles, for sm_80 and sm_90, every source
as the launchers build it at the head sizes the tests run (17, 32, 64, 128; every storage
dtype), and for sm_75 (T4), sm_86 (A10, RTX 3090) and sm_89 (L4, RTX 4090) every kernel
once in each storage dtype (attention at head size 64), with no warning, and ptxas reports
no spill in any kernel of a build used at head sizes 32, 64 or 128. No GPU needed.
``scripts/kernel_resources.py --check`` compiles all 396 builds for sm_80 and sm_90 and
the representative set (builds.py) for the others (README's test command runs it after the
suite).
"""
from __future__ import annotations

import concurrent.futures
import os

import pytest

from minitorch_gpu.backend.kernels import architectures, loader, nvrtc
from minitorch_gpu.backend.kernels.builds import (builds_for, every_build,
                                                  representative_builds)

needs_nvrtc = pytest.mark.skipif(not nvrtc.available(), reason="NVRTC is not installed (pip "
                                 "install nvidia-cuda-nvrtc; the dev extra takes it)")

SAMPLED_HEAD_DIMS = (17, 32, 64, 128)
NO_SPILL_HEAD_DIMS = (32, 64, 128)
# the architectures checked on a representative set only: each kernel once per dtype
OTHER_ARCHITECTURES = tuple(a for a in nvrtc.ARCHITECTURES
                            if a not in nvrtc.EVERY_BUILD_ARCHITECTURES)


def head_dim(defines) -> int:
    return dict(defines).get("HEAD_DIM", 0)


def jobs():
    """(source, defines, arch): for sm_80 and sm_90 the builds at the sampled head sizes
    (and every build of the other sources); for the others each kernel once per storage
    dtype, attention at head size 64."""
    out = [(name, defines, arch) for arch in nvrtc.EVERY_BUILD_ARCHITECTURES
           for name, defines in every_build() if head_dim(defines) in (0,) + SAMPLED_HEAD_DIMS]
    return out + [(name, defines, arch) for arch in OTHER_ARCHITECTURES
                  for name, defines in representative_builds(head_dims=(64,))]


def build(job):
    """NVRTC's log of one job, or the NvrtcError."""
    name, defines, arch = job
    try:
        log, _ = nvrtc.compile_source(loader.source_text(name), name,
                                      nvrtc.ptxas_options(arch, defines))
        return log
    except nvrtc.NvrtcError as exc:
        return exc


@pytest.fixture(scope="module")
def compiled():
    """(source, defines, arch) -> NVRTC's log (or the NvrtcError), over the cores: NVRTC
    compiles one program at a time per process."""
    if not nvrtc.available():
        pytest.skip("NVRTC is not installed (pip install nvidia-cuda-nvrtc)")
    every = jobs()
    with concurrent.futures.ProcessPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        return dict(zip(every, pool.map(build, every, chunksize=2)))


def test_the_sampled_builds_compile_with_cupys_options_and_no_warning(compiled):
    builds = every_build()
    assert len(builds) == 396 and {name for name, _ in builds} == set(loader.SOURCES)
    assert len(compiled) == 2 * (4 + 3 * 4 + 2 + 6) + 3 * (4 + 3 + 2 + 6)
    failed = {f"{n} {d} sm_{a}": str(log)[:400] for (n, d, a), log in compiled.items()
              if isinstance(log, Exception) or "warning" in log.lower()}
    assert not failed, failed


def storage(name, defines):
    """A build's source and defines but the head size: one per (source, storage dtype)."""
    return name, tuple((k, v) for k, v in defines if k != "HEAD_DIM")


@pytest.mark.parametrize("arch", nvrtc.ARCHITECTURES)
def test_every_source_compiles_for_each_architecture_in_each_dtype(compiled, arch):
    """float32 and bf16 builds alike, on sm_75 too (bf16 is read and rounded on its 16
    bits, with float32 arithmetic: nothing in the kernels needs sm_80)."""
    expected = {storage(name, defines) for name, defines in every_build()}
    built = {storage(name, defines) for (name, defines, a), log in compiled.items()
             if a == arch and not isinstance(log, Exception)}
    assert built == expected, f"sm_{arch}: no build of {sorted(expected - built)}"


def test_no_kernel_spills_at_the_head_sizes_models_use(compiled):
    spills = []
    for (name, defines, arch), log in compiled.items():
        if isinstance(log, Exception) or head_dim(defines) not in (0,) + NO_SPILL_HEAD_DIMS:
            continue
        spills += [f"{name} {defines} {r.kernel} sm_{arch}: {r.spill_stores} bytes stored, "
                   f"{r.spill_loads} loaded" for r in nvrtc.resources(log) if r.spills]
    assert not spills, spills


def test_ptxas_reports_every_kernel_of_every_build(compiled):
    from minitorch_gpu.backend.emulated_cuda.build import kernels_of
    for (name, defines, arch), log in compiled.items():
        if isinstance(log, Exception):
            continue
        reported = {r.kernel for r in nvrtc.resources(log)}
        assert reported == {k.name for k in kernels_of(loader.source_text(name))}, name
        assert all(r.arch == arch and r.registers > 0 for r in nvrtc.resources(log))


def test_the_options_are_cupys():
    options = nvrtc.ptxas_options("90", (("HEAD_DIM", 64),))
    assert options == ("-std=c++17", "-DHEAD_DIM=64", "-ftz=true",
                       "--device-as-default-execution-space", "-arch=sm_90",
                       "--ptxas-options=-v")


@needs_nvrtc
def test_a_source_nvrtc_refuses_is_an_error_with_its_log():
    with pytest.raises(nvrtc.NvrtcError, match="HEAD_DIM"):
        nvrtc.compile_source(loader.source_text("attention.cu"), "attention.cu",
                             nvrtc.ptxas_options("90", (("HEAD_DIM", 129),)))


def test_occupancy_follows_registers_and_shared_memory():
    assert nvrtc.occupancy("90", 128, 124, 20608) == 0.25  # attention forward before
    assert nvrtc.occupancy("90", 256, 32, 0) == 1.0
    assert nvrtc.occupancy("80", 128, 66, 20608) == pytest.approx(7 * 4 / 64)


# (arch, threads, registers, static shared bytes, resident blocks): each SM's own limits
# (the Programming Guide's per-compute-capability table, architectures.SM_LIMITS)
OCCUPANCY_CASES = [
    ("75", 128, 124, 20608, 3),   # 64 KiB of shared memory, 256-byte units, no reserve
    ("75", 32, 16, 0, 16),        # at most 16 blocks of 32 warps
    ("75", 1024, 32, 0, 1),       # 1,024 threads fill a T4's SM
    ("75", 1024, 65, 0, 0),       # 1,024 x 72 allocated registers exceed 64 K
    ("80", 32, 16, 0, 32),
    ("86", 256, 32, 0, 6),        # 48 warps
    ("86", 32, 16, 0, 16),        # 16 blocks
    ("86", 128, 32, 102400, 0),   # past the 99 KiB one block may have
    ("89", 128, 66, 20608, 4),    # 100 KiB / (20,608 + 1 KiB reserved)
    ("89", 32, 16, 0, 24),        # 24 blocks
    ("90", 32, 16, 0, 32),
]


@pytest.mark.parametrize("arch, threads, registers, shared, blocks", OCCUPANCY_CASES)
def test_occupancy_uses_each_architectures_limits(arch, threads, registers, shared, blocks):
    warps = -(-threads // 32)
    expected = blocks * warps / architectures.SM_LIMITS[arch]["max_warps"]
    assert nvrtc.occupancy(arch, threads, registers, shared) == pytest.approx(expected)


def test_every_checked_architecture_has_limits_and_builds():
    assert set(architectures.SM_LIMITS) == set(nvrtc.ARCHITECTURES)
    assert set(nvrtc.EVERY_BUILD_ARCHITECTURES) <= set(nvrtc.ARCHITECTURES)
    assert loader.CHECKED_ARCHITECTURES == nvrtc.ARCHITECTURES
    for arch in nvrtc.ARCHITECTURES:
        builds = builds_for(arch)
        # every source in every storage dtype, whatever the set
        assert ({storage(n, d) for n, d in builds}
                == {storage(n, d) for n, d in every_build()}), arch
        assert len(builds) == (396 if arch in nvrtc.EVERY_BUILD_ARCHITECTURES else 21), arch
    with pytest.raises(ValueError, match="sm_70 is not checked"):
        builds_for("70")
    with pytest.raises(ValueError, match="no SM limits for sm_70"):
        nvrtc.occupancy("70", 128, 32, 0)
