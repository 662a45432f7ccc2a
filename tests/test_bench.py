"""``minitorch-gpu bench`` end to end, in its quick mode: real processes, no timing checks."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from importlib.util import find_spec

import numpy as np
import pytest

from minitorch_gpu.system.machine import BLAS_VARIABLES, describe_libraries, libraries
from minitorch_gpu.bench.runner import (CASES, GPU_CASES, TORCH_SIDES, format_table,
                                 parse_torch_sides, torch_available)
from minitorch_gpu.cli import BENCH_CASES
from minitorch_gpu.cli.bench import GPU_BENCH_CASES

RECORD_KEYS = {"case", "side", "threads", "step_ms", "train_tokens_per_s", "mfu",
               "train_memory_mb", "peak_rss_mb", "generate_tokens_per_s", "flops_per_step"}


def bench(*args: str, env: dict = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "minitorch_gpu", "bench", "--quick", *args],
                          capture_output=True, text=True, timeout=600,
                          env=None if env is None else {**os.environ, **env})

needs_torch = pytest.mark.skipif(not torch_available(), reason="the torch comparison needs "
                                 "torch (a development-only tool)")


def records(stdout: str) -> list:
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def test_quick_bench_measures_every_case():
    done = bench("--threads", "1")
    assert done.returncode == 0, done.stderr
    lines = records(done.stdout)
    peaks = [r for r in lines if r["case"] == "matmul_peak"]
    measured = [r for r in lines if r["case"] != "matmul_peak"]
    assert len(peaks) == 2 and all(p["gflop_per_s"] > 0 for p in peaks)  # before and after
    assert lines[0] in peaks and lines[-1] in peaks
    assert [r["case"] for r in measured] == list(CASES)
    for r in measured:
        assert RECORD_KEYS <= set(r) and r["side"] == "minitorch" and r["threads"] == 1
        assert r["train_tokens_per_s"] > 0 and r["generate_tokens_per_s"] > 0
        assert 0 < r["mfu"] < 2 and r["train_memory_mb"] > 0
        assert r["step_ms"]["min"] <= r["step_ms"]["median"] <= r["step_ms"]["max"]
        shape = CASES[r["case"]]
        assert all(r[k] == v for k, v in shape.items())
    table = done.stdout.split("\n", len(lines))[-1]
    assert "baby" in table and "small" in table and "llama" in table and "GFLOP/s" in table
    assert "ns/param" in table
    # every record names what ran its arithmetic: the BLAS, its kernels, its threads
    for r in lines:
        blas = [p for p in r["libraries"]["pools"] if p["user_api"] == "blas"]
        assert len(blas) == 1 and blas[0]["num_threads"] == 1 and blas[0]["version"]
        assert r["libraries"]["numpy"] == np.__version__
        assert r["libraries"]["environment"] == {
            k: os.environ[k] for k in BLAS_VARIABLES if k in os.environ}
    assert all(r["libraries"].get("numba", {}).get("kernel_threads") == 1 for r in measured) \
        == (find_spec("numba") is not None)
    ran_on = [line for line in table.splitlines() if line.startswith("ran on (")]
    assert {side for line in ran_on for side in line[8:line.index(")")].split(", ")} == \
        {"matmul peak", "minitorch"}
    kernels = [p for p in lines[0]["libraries"]["pools"] if p["user_api"] == "blas"][0]
    threads = f"({kernels['architecture']} kernels, 1 thread)" if kernels["architecture"] \
        else "(1 thread)"
    assert all(f"NumPy {np.__version__}, BLAS " in line and threads in line for line in ran_on)
    by_case = {r["case"]: r for r in measured}
    for r in measured:  # the step time per parameter, what compares the architectures
        assert r["step_ns_per_param"] == pytest.approx(r["step_ms"]["median"] * 1e6 /
                                                       r["parameters"])
    # the Llama case: the baby's shape and about its parameters
    assert by_case["llama"]["arch"] == "llama" and by_case["llama"]["n_kv_head"] == 2
    assert by_case["llama"]["parameters"] == pytest.approx(by_case["baby"]["parameters"],
                                                           rel=0.01)


@needs_torch
def test_quick_bench_against_torch_prints_ratios():
    done = bench("--case", "baby", "--vs-torch", "--rounds", "2", "--torch-sides",
                 "explicit,sdpa")
    assert done.returncode == 0, done.stderr
    lines = records(done.stdout)
    per_round = [(r["side"], r["round"]) for r in lines if "round" in r]
    assert per_round == [("minitorch", 0), ("torch", 0), ("torch-explicit", 0),
                         ("minitorch", 1), ("torch", 1), ("torch-explicit", 1)]
    ratio = [r for r in lines if r.get("side") == "minitorch/torch"][-1]
    best = [r for r in lines if r.get("side") == "minitorch/best-torch"][-1]
    summary = {r["side"]: r for r in lines if r.get("summary") and r["case"] == "baby"}
    assert ratio["rounds"] == 2 and ratio["train_tokens_per_s"] > 0
    assert summary["minitorch"]["rounds"] == 2 and summary["torch-explicit"]["rounds"] == 2
    fastest = max(summary["torch"], summary["torch-explicit"],
                  key=lambda r: r["train_tokens_per_s"])
    assert best["best_side"]["train_tokens_per_s"] == fastest["side"]
    assert best["train_tokens_per_s"] == pytest.approx(
        summary["minitorch"]["train_tokens_per_s"] / fastest["train_tokens_per_s"])
    for row in ("ratio ours/torch", "ratio ours/best", "torch-explicit"):
        assert row in done.stdout
    torch_libraries = summary["torch"]["libraries"]["torch"]
    assert torch_libraries["num_threads"] >= 1 and torch_libraries["version"]
    assert "torch" not in summary["minitorch"]["libraries"]
    assert "ran on (torch, torch-explicit): " in done.stdout


@needs_torch
def test_quick_bench_against_torch_runs_the_llama_and_torch_compile():
    """The llama case has torch sides, generation included; torch.compile's side times
    the compiled training step (generation is the eager side's), or, without a working
    C++ compiler here, is a failed row with its reason."""
    done = bench("--case", "llama", "--vs-torch", "--torch-sides", "sdpa,compile",
                 "--threads", "1")
    assert done.returncode == 0, done.stderr
    summary = {r["side"]: r for r in records(done.stdout) if r.get("summary") and "side" in r}
    assert summary["torch"]["arch"] == "llama" and summary["torch"]["generate_tokens_per_s"] > 0
    assert summary["torch"]["parameters"] == summary["minitorch"]["parameters"] == 804_224
    compiled = summary["torch-compile"]
    assert "generate_tokens_per_s" not in compiled
    if shutil.which("g++") or shutil.which(os.environ.get("CXX", "g++")):
        assert "failed" not in compiled, compiled["failed"]
        assert compiled["train_tokens_per_s"] > 0 and "ratio ours/best" in done.stdout
        assert "torch-compile: the training step under torch.compile" in done.stdout
    assert "ratio ours/torch" in done.stdout


@needs_torch
def test_a_torch_side_that_fails_is_a_row_not_a_crash():
    """torch.compile with no C++ compiler: its side is recorded as failed with its one-line
    reason, and the other sides and the ratio go on."""
    done = bench("--case", "baby", "--vs-torch", "--torch-sides", "sdpa,compile",
                 "--no-generate", "--threads", "1", env={"CXX": "/nonexistent/g++"})
    assert done.returncode == 0, done.stderr
    summary = {r["side"]: r for r in records(done.stdout) if r.get("summary") and "side" in r}
    reason = summary["torch-compile"]["failed"]
    assert "compiler" in reason.lower() and "\n" not in reason
    assert "torch-compile    failed: " in done.stdout and "ratio ours/torch" in done.stdout
    assert summary["torch"]["train_tokens_per_s"] > 0
    assert "minitorch/best-torch" not in summary  # one torch side measured: no best-of


@pytest.mark.parametrize("args, message", [
    (["--threads", "0"], "--threads must be >= 1"),
    (["--rounds", "0"], "--rounds must be >= 1"),
    (["--warmup", "-1"], "--warmup must be >= 0"),
    (["--case", "huge"], "invalid choice"),
    (["--cprofile", "-1"], "--cprofile must be >= 0"),
    (["--vs-torch", "--bf16"], "--vs-torch compares float32 steps on the CPU"),
    (["--device", "nonsense"], "--device: unknown device"),
    (["--vs-torch", "--torch-sides", "sdpa,flash"], "--torch-sides: unknown torch side "
     "'flash', expected some of sdpa,explicit,compile"),
    (["--torch-sides", "sdpa"], "--torch-sides chooses the torch sides of --vs-torch"),
])
def test_bad_options_are_one_line_errors(args, message):
    done = bench(*args)
    assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr


def test_torch_sides_are_named_in_the_order_they_run():
    assert parse_torch_sides("compile, sdpa") == ("torch", "torch-compile")
    assert parse_torch_sides("explicit") == ("torch-explicit",)
    assert parse_torch_sides(",".join(TORCH_SIDES)) == tuple(TORCH_SIDES.values())
    with pytest.raises(ValueError, match="unknown torch side ''"):
        parse_torch_sides("")


@pytest.mark.parametrize("args, cases", [
    ([], None),  # _bench reads None as every default case
    (["--case", "baby", "llama"], ["baby", "llama"]),
    (["--case", "baby", "--case", "llama"], ["baby", "llama"]),
])
def test_cases_are_one_list_or_repeated(args, cases):
    from minitorch_gpu.cli import build_parser
    assert build_parser().parse_args(["bench", *args]).case == cases


def test_the_cli_offers_the_bench_cases():
    assert tuple(CASES) == BENCH_CASES


def test_the_cli_offers_the_gpu_cases_only_by_name():
    assert tuple(GPU_CASES) == GPU_BENCH_CASES
    assert not set(GPU_CASES) & set(CASES)  # not among the default cases


def test_quick_bf16_step_reports_the_logit_difference():
    done = bench("--case", "baby", "--bf16", "--no-generate", "--threads", "1")
    assert done.returncode == 0, done.stderr
    measured = [r for r in records(done.stdout) if r["case"] == "baby"]
    assert len(measured) == 1 and measured[0]["dtype"] == "bf16"
    assert 0 < measured[0]["bf16_max_abs_logit_diff"] < 0.1 * measured[0]["max_abs_logit"]
    assert "generate_tokens_per_s" not in measured[0]
    assert "max |bf16 - fp32| logit" in done.stdout


def test_cprofile_lists_where_a_step_goes_instead_of_timing():
    done = bench("--case", "baby", "--cprofile", "2", "--threads", "1")
    assert done.returncode == 0, done.stderr
    lines = records(done.stdout)
    assert [r["case"] for r in lines] == ["baby"]  # no matmul peak: nothing is timed
    assert lines[0]["functions"] and lines[0]["total_ms_per_step"] > 0
    assert "own ms/step" in done.stdout and "total" in done.stdout


def test_the_llama_case_trains_for_a_step_or_two():
    done = bench("--case", "llama", "--no-generate", "--threads", "1", "--steps", "1")
    assert done.returncode == 0, done.stderr
    (record,) = [r for r in records(done.stdout) if r["case"] == "llama"]
    assert record["arch"] == "llama" and record["steps"] == 2  # --quick's
    assert record["parameters"] == 804_224 and record["train_tokens_per_s"] > 0
    assert "generate_tokens_per_s" not in record
    assert record["flops_per_step"] > 0 and 0 < record["mfu"] < 2


def stand_in_children(monkeypatch, speeds: dict, failing: dict = {}) -> list:
    """Stand in for bench's measuring processes (no torch needed): each side trains at
    ``speeds[side]`` tokens/s (its round number added) and uses ``1000 / speed`` MB; a
    torch-compile side has no generation; ``failing[side]`` lists the rounds that side
    fails. Returns the (case, side) of each run, in order."""
    import minitorch_gpu.bench.runner as bench_module
    ran, rounds = [], {}

    def child(what, **spec):
        if what == "peak":
            return {"case": "matmul_peak", "threads": 1, "gflop_per_s": 100.0}
        side = spec["side"]
        ran.append((spec["case"], side))
        round_ = rounds[spec["case"], side] = rounds.get((spec["case"], side), -1) + 1
        if round_ in failing.get(side, ()):
            return {"case": spec["case"], "side": side, "threads": 1,
                    "failed": "InductorError: no C++ compiler"}
        speed = speeds[side] + round_
        record = {"case": spec["case"], "side": side, "threads": 1,
                  "step_ms": {"median": 1e3 / speed, "min": 1.0, "max": 1e4},
                  "train_tokens_per_s": speed, "flops_per_step": 1e9, "parameters": 10 ** 6,
                  "step_ns_per_param": 10.0, "train_memory_mb": 1000 / speed,
                  "peak_rss_mb": 2.0}
        if side != "torch-compile":
            record["generate_tokens_per_s"] = 2 * speed
        return record

    monkeypatch.setattr(bench_module, "_run_child", child)
    monkeypatch.setattr(bench_module, "torch_available", lambda: True)
    return ran


def test_against_torch_an_arch_without_a_reference_runs_our_side_alone(monkeypatch):
    """A case whose arch torch_reference has no model of runs without a torch side or
    ratio, and the table says so (the llama has one now: TORCH_ARCHS stood in for)."""
    import minitorch_gpu.bench.runner as bench_module
    assert bench_module.TORCH_ARCHS == ("gpt2", "llama")
    monkeypatch.setattr(bench_module, "TORCH_ARCHS", ("gpt2",))
    ran = stand_in_children(monkeypatch, {"minitorch": 100, "torch": 50})
    summary = bench_module.run_bench(["baby", "llama"], vs_torch=True, torch_sides=["torch"],
                                     emit=lambda line: None)
    assert ran == [("baby", "minitorch"), ("baby", "torch"), ("llama", "minitorch")]
    sides = [(r["case"], r.get("side")) for r in summary[1:]]
    assert sides == [("baby", "minitorch"), ("baby", "torch"), ("baby", "minitorch/torch"),
                     ("llama", "minitorch")]
    assert "llama: no torch reference for this arch" in format_table(summary)


def test_against_every_torch_side_ratios_and_the_best_of_them(monkeypatch):
    """Every case (the llama too) runs ours and the three torch sides round by round;
    ours/torch is the median of paired rounds against the SDPA eager side, ours/best is
    against each column's best median (tokens/s the largest, memory the smallest) and
    names the side; a side failing in a round is left out of that round, and one failing
    in every round is a row with its reason."""
    import minitorch_gpu.bench.runner as bench_module
    ran = stand_in_children(monkeypatch, {"minitorch": 100, "torch": 50, "torch-explicit": 40,
                                          "torch-compile": 80},
                            failing={"torch-compile": [1]})
    summary = bench_module.run_bench(["baby", "llama"], vs_torch=True, rounds=3,
                                     emit=lambda line: None)
    assert ran == [(case, side) for case in ("baby", "llama") for _ in range(3)
                   for side in ("minitorch", "torch", "torch-explicit", "torch-compile")]
    baby = {r["side"]: r for r in summary if r["case"] == "baby"}
    assert list(baby) == ["minitorch", "torch", "torch-explicit", "torch-compile",
                          "minitorch/torch", "minitorch/best-torch"]
    # medians over the rounds measured: compile's rounds 0 and 2, at 80 and 82 tokens/s
    assert baby["torch-compile"]["rounds"] == 2 and baby["torch-compile"]["failed_rounds"] == 1
    assert baby["torch-compile"]["train_tokens_per_s"] == 81
    ratio = baby["minitorch/torch"]
    assert ratio["rounds"] == 3
    assert ratio["train_tokens_per_s"] == pytest.approx(101 / 51)  # the median pair
    assert ratio["generate_tokens_per_s"] == pytest.approx(101 / 51)
    assert ratio["train_memory_mb"] == pytest.approx(51 / 101)
    best = baby["minitorch/best-torch"]
    assert best["best_side"] == {"train_tokens_per_s": "torch-compile",
                                 "generate_tokens_per_s": "torch",
                                 "train_memory_mb": "torch-compile"}
    assert best["train_tokens_per_s"] == pytest.approx(101 / 81)
    assert best["generate_tokens_per_s"] == pytest.approx(202 / 102)
    assert best["train_memory_mb"] == pytest.approx((1000 / 101) / ((1000 / 80 + 1000 / 82) / 2))
    text = format_table(summary)
    for row in ("ratio ours/torch", "ratio ours/best", "torch-explicit", "torch-compile"):
        assert f"llama  {row}" in text and f"baby   {row}" in text
    assert ("baby: ours/best against the best torch side of each column: train "
            "torch-compile, gen torch, memory torch-compile") in text
    assert "generation not compiled" in text

    stand_in_children(monkeypatch, {"minitorch": 100, "torch": 50, "torch-compile": 80},
                      failing={"torch-compile": [0]})
    summary = bench_module.run_bench(["baby"], vs_torch=True, emit=lambda line: None,
                                     torch_sides=["torch", "torch-compile"])
    compiled = [r for r in summary if r.get("side") == "torch-compile"][0]
    assert compiled["failed"] == "InductorError: no C++ compiler" and "mfu" not in compiled
    assert [r["side"] for r in summary[1:]] == ["minitorch", "torch", "torch-compile",
                                                "minitorch/torch"]  # no best of one side
    assert "baby   torch-compile    failed: InductorError: no C++ compiler" in \
        format_table(summary)


@pytest.mark.parametrize("sides", [[], ["torch", "flash"]])
def test_run_bench_refuses_unknown_torch_sides(sides):
    from minitorch_gpu.bench.runner import run_bench
    with pytest.raises(ValueError, match="torch_sides must be some of"):
        run_bench(["baby"], vs_torch=True, torch_sides=sides)


def test_table_without_torch_rows():
    row = {"case": "baby", "side": "minitorch", "step_ms": {"median": 50.0}, "mfu": 0.4,
           "train_tokens_per_s": 15000.0, "generate_tokens_per_s": 700.0,
           "train_memory_mb": 60.0}
    text = format_table([{"case": "matmul_peak", "gflop_per_s": 190.0, "threads": 2}, row])
    assert "15000" in text and "40.0%" in text and "190 GFLOP/s with 2" in text


def test_the_libraries_line_names_the_kernels_and_what_pinned_them():
    found = {"numpy": "2.4.6", "split_threads": 2,
             "environment": {"OPENBLAS_CORETYPE": "Haswell", "OPENBLAS_L2_SIZE": "512"},
             "pools": [{"user_api": "blas", "internal_api": "openblas", "version": "0.3.31",
                        "architecture": "Haswell", "num_threads": 2},
                       {"user_api": "openmp", "internal_api": "openmp", "num_threads": 2}],
             "numba": {"version": "0.68.1", "kernel_threads": 2},
             "torch": {"version": "2.13.0", "blas": "mkl", "cpu_capability": "AVX512",
                       "num_threads": 2}}
    assert describe_libraries(found) == (
        "NumPy 2.4.6, BLAS openblas 0.3.31 (Haswell kernels, 2 threads), pinned by "
        "OPENBLAS_CORETYPE=Haswell OPENBLAS_L2_SIZE=512, numba 0.68.1 (kernels split over 2 "
        "threads), torch 2.13.0 (mkl BLAS, AVX512, 2 threads)")
    gpu = dict(found, cupy={"version": "14.2.0", "device": "NVIDIA H100 80GB HBM3"})
    assert describe_libraries(gpu).endswith(
        "CuPy 14.2.0 on NVIDIA H100 80GB HBM3 (products by cuBLAS)")
    row = {"case": "baby", "side": "minitorch", "step_ms": {"median": 50.0}, "mfu": 0.4,
           "train_tokens_per_s": 15000.0, "generate_tokens_per_s": 700.0,
           "train_memory_mb": 60.0, "libraries": found}
    peak = {"case": "matmul_peak", "gflop_per_s": 190.0, "threads": 2, "libraries": found}
    assert format_table([peak, row]).splitlines()[-1] == \
        "ran on (matmul peak, minitorch): " + describe_libraries(found)


def test_the_libraries_of_this_process_as_threadpoolctl_sees_them():
    from threadpoolctl import threadpool_info
    found = libraries()
    blas = [info for info in threadpool_info() if info["user_api"] == "blas"]
    assert [p["architecture"] for p in found["pools"] if p["user_api"] == "blas"] == \
        [info.get("architecture") for info in blas]
    assert found["numpy"] == np.__version__ and found["split_threads"] >= 1


def test_the_numpy_side_runs_ours_without_the_kernels_and_is_never_the_best_torch(
        monkeypatch):
    """--numpy-side times ours a second time (the CPU kernels off) right after ours; it
    is a row of its own, and ours/best looks at the torch sides only even where it is the
    fastest."""
    import minitorch_gpu.bench.runner as bench_module
    ran = stand_in_children(monkeypatch, {"minitorch": 100, "minitorch-numpy": 500,
                                          "torch": 50, "torch-explicit": 40})
    summary = bench_module.run_bench(["baby"], vs_torch=True, numpy_side=True,
                                     torch_sides=["torch", "torch-explicit"],
                                     emit=lambda line: None)
    assert ran == [("baby", "minitorch"), ("baby", "minitorch-numpy"), ("baby", "torch"),
                   ("baby", "torch-explicit")]
    rows = {r["side"]: r for r in summary[1:]}
    assert rows["minitorch/best-torch"]["best_side"]["train_tokens_per_s"] == "torch"
    assert rows["minitorch/best-torch"]["train_tokens_per_s"] == 2.0
    assert "minitorch-numpy" in format_table(summary)


def test_the_numpy_side_switches_the_kernels_off_in_its_process():
    """measure() with side minitorch-numpy runs with NumpyBackend.use_fused_kernels off."""
    import json
    import subprocess
    import sys
    code = ("import json, minitorch_gpu.bench.runner as b, minitorch_gpu as mt;"
            "r = b.measure('minitorch-numpy', 'baby', 1, 1, 0, 4, 1);"
            "print(json.dumps([r['side'], mt.get_backend('cpu').fused_kernels() is None]))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == ["minitorch-numpy", True]
