"""``minitorch-gpu bench`` end to end, in its quick mode: real processes, no timing checks."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from minitorch_gpu.bench import CASES, GPU_CASES, format_table, torch_available
from minitorch_gpu.cli import BENCH_CASES
from minitorch_gpu.cli.bench import GPU_BENCH_CASES

RECORD_KEYS = {"case", "side", "threads", "step_ms", "train_tokens_per_s", "mfu",
               "train_memory_mb", "peak_rss_mb", "generate_tokens_per_s", "flops_per_step"}


def bench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "minitorch_gpu", "bench", "--quick", *args],
                          capture_output=True, text=True, timeout=600)


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
    by_case = {r["case"]: r for r in measured}
    for r in measured:  # the step time per parameter, what compares the architectures
        assert r["step_ns_per_param"] == pytest.approx(r["step_ms"]["median"] * 1e6 /
                                                       r["parameters"])
    # the Llama case: the baby's shape and about its parameters
    assert by_case["llama"]["arch"] == "llama" and by_case["llama"]["n_kv_head"] == 2
    assert by_case["llama"]["parameters"] == pytest.approx(by_case["baby"]["parameters"],
                                                           rel=0.01)


@pytest.mark.skipif(not torch_available(), reason="the torch comparison needs torch "
                                                  "(a development-only tool)")
def test_quick_bench_against_torch_prints_ratios():
    done = bench("--case", "baby", "--vs-torch", "--rounds", "2")
    assert done.returncode == 0, done.stderr
    lines = records(done.stdout)
    per_round = [r for r in lines if "round" in r]
    assert sorted((r["side"], r["round"]) for r in per_round) == [
        ("minitorch", 0), ("minitorch", 1), ("torch", 0), ("torch", 1)]
    ratio = [r for r in lines if r.get("side") == "minitorch/torch"][-1]
    ours = [r for r in lines if r.get("summary") and r.get("side") == "minitorch"][0]
    assert ratio["rounds"] == 2 and ratio["train_tokens_per_s"] > 0
    assert ours["rounds"] == 2 and "ratio ours/torch" in done.stdout


@pytest.mark.parametrize("args, message", [
    (["--threads", "0"], "--threads must be >= 1"),
    (["--rounds", "0"], "--rounds must be >= 1"),
    (["--warmup", "-1"], "--warmup must be >= 0"),
    (["--case", "huge"], "invalid choice"),
    (["--cprofile", "-1"], "--cprofile must be >= 0"),
    (["--vs-torch", "--bf16"], "--vs-torch compares float32 steps on the CPU"),
    (["--device", "nonsense"], "--device: unknown device"),
])
def test_bad_options_are_one_line_errors(args, message):
    done = bench(*args)
    assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr


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


def test_against_torch_the_llama_runs_our_side_alone(monkeypatch):
    """torch_reference's Llama has no KV-cached generate: the case runs without a torch side or ratio, and the
    table says so (the children are stood in for: no torch needed)."""
    import minitorch_gpu.bench as bench_module
    ran = []

    def child(what, **spec):
        if what == "peak":
            return {"case": "matmul_peak", "threads": 1, "gflop_per_s": 100.0}
        ran.append((spec["case"], spec["side"]))
        return {"case": spec["case"], "side": spec["side"], "threads": 1,
                "step_ms": {"median": 10.0, "min": 9.0, "max": 11.0},
                "train_tokens_per_s": 100.0, "flops_per_step": 1e9, "parameters": 10 ** 6,
                "step_ns_per_param": 10.0, "train_memory_mb": 1.0, "peak_rss_mb": 2.0}

    monkeypatch.setattr(bench_module, "_run_child", child)
    monkeypatch.setattr(bench_module, "torch_available", lambda: True)
    summary = bench_module.run_bench(["baby", "llama"], vs_torch=True, emit=lambda line: None)
    assert ran == [("baby", "minitorch"), ("baby", "torch"), ("llama", "minitorch")]
    sides = [(r["case"], r.get("side")) for r in summary[1:]]
    assert sides == [("baby", "minitorch"), ("baby", "torch"), ("baby", "minitorch/torch"),
                     ("llama", "minitorch")]
    assert "llama: no torch reference for this arch" in format_table(summary)


def test_table_without_torch_rows():
    row = {"case": "baby", "side": "minitorch", "step_ms": {"median": 50.0}, "mfu": 0.4,
           "train_tokens_per_s": 15000.0, "generate_tokens_per_s": 700.0,
           "train_memory_mb": 60.0}
    text = format_table([{"case": "matmul_peak", "gflop_per_s": 190.0, "threads": 2}, row])
    assert "15000" in text and "40.0%" in text and "190 GFLOP/s with 2" in text
