"""The real compiler: NVRTC (the nvidia-cuda-nvrtc wheel, called as CuPy 14 calls it, with
CuPy's own options: backend/kernels/nvrtc.py) compiles, for sm_80 and sm_90, every source
as the launchers build it at the head sizes the tests run (17, 32, 64, 128; every storage
dtype), with no warning, and ptxas reports no spill in any kernel of a build used at head
sizes 32, 64 or 128. No GPU needed. All 396 builds at every head size take NVRTC about
eight minutes of one core: ``scripts/kernel_resources.py --check`` compiles those (README's
test command runs it after the suite).
"""
from __future__ import annotations

import pytest

from minitorch_gpu.backend.kernels import loader, nvrtc
from minitorch_gpu.backend.kernels.builds import every_build

pytestmark = pytest.mark.skipif(not nvrtc.available(), reason="NVRTC is not installed (pip "
                                "install nvidia-cuda-nvrtc; the dev extra takes it)")

SAMPLED_HEAD_DIMS = (17, 32, 64, 128)
NO_SPILL_HEAD_DIMS = (32, 64, 128)


def head_dim(defines) -> int:
    return dict(defines).get("HEAD_DIM", 0)


def jobs():
    """(source, defines, arch): the builds at the sampled head sizes (and every build of
    the other sources), for both architectures."""
    return [(name, defines, arch) for name, defines in every_build()
            if head_dim(defines) in (0,) + SAMPLED_HEAD_DIMS for arch in nvrtc.ARCHITECTURES]


@pytest.fixture(scope="module")
def compiled():
    """(source, defines, arch) -> NVRTC's log (or the NvrtcError)."""
    def build(job):
        name, defines, arch = job
        try:
            log, _ = nvrtc.compile_source(loader.source_text(name), name,
                                          nvrtc.ptxas_options(arch, defines))
            return log
        except nvrtc.NvrtcError as exc:
            return exc
    return {job: build(job) for job in jobs()}


def test_the_sampled_builds_compile_with_cupys_options_and_no_warning(compiled):
    builds = every_build()
    assert len(builds) == 396 and {name for name, _ in builds} == set(loader.SOURCES)
    assert len(compiled) == 2 * (4 + 3 * 4 + 2 + 6)
    failed = {f"{n} {d} sm_{a}": str(log)[:400] for (n, d, a), log in compiled.items()
              if isinstance(log, Exception) or "warning" in log.lower()}
    assert not failed, failed


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


def test_a_source_nvrtc_refuses_is_an_error_with_its_log():
    with pytest.raises(nvrtc.NvrtcError, match="HEAD_DIM"):
        nvrtc.compile_source(loader.source_text("attention.cu"), "attention.cu",
                             nvrtc.ptxas_options("90", (("HEAD_DIM", 129),)))


def test_occupancy_follows_registers_and_shared_memory():
    assert nvrtc.occupancy("90", 128, 124, 20608) == 0.25  # attention forward before
    assert nvrtc.occupancy("90", 256, 32, 0) == 1.0
    assert nvrtc.occupancy("80", 128, 66, 20608) == pytest.approx(7 * 4 / 64)
