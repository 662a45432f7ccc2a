"""The GPU check (scripts/gpu_check.py), run as its dry run on the emulated GPU, so the
script that spends a GPU machine's few minutes cannot break unnoticed; and the per-test time
limit of tests/conftest.py that the check relies on.

The whole emulated dry run takes ~100 s on two idle cores, so the tests here run a
few of its quick steps with --only (env, train, profile, memcheck: the environment record,
a training run and its metrics, profile, a GPU-only step's stand-in) and topk alone;
`bash scripts/gpu_check.sh --dry-run` runs them all.
"""
from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

import minitorch_gpu as mt

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "gpu_check.py"
STEP_NAMES = ["env", "tests", "bench", "decode", "topk", "train", "fp16", "llama",
              "profile", "memcheck", "rest", "racecheck"]
ROW = re.compile(r"^(\w+)\s+(ok|TIMEOUT|skipped|FAILED rc -?\d+|not run)\s+([\d.]+)?\s+(\d+)",
                 re.M)


def load_script():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def run_check(tmp_path: Path, *args: str, inject: str = "", timeout: float = 120):
    env = {k: v for k, v in os.environ.items() if k not in ("OUT", "MINITORCH_GPU_CHECK_INJECT")}
    if inject:
        env["MINITORCH_GPU_CHECK_INJECT"] = inject
    out = tmp_path / "out"
    command = [sys.executable, str(SCRIPT), "--dry-run", "--out", str(out),
               "--work", str(tmp_path / "work"), *args]
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout)
    rows = {}
    summary = out / "summary.txt"
    if summary.exists():
        rows = {m.group(1): (m.group(2), m.group(4)) for m in ROW.finditer(summary.read_text())}
    return done, out, rows


QUICK_STEPS = ["env", "train", "profile", "memcheck"]  # ~15 s emulated, seeding included


def test_dry_run_runs_its_steps_on_the_emulated_gpu_within_the_limits(tmp_path: Path) -> None:
    done, out, rows = run_check(tmp_path, "--only", ",".join(QUICK_STEPS))
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert {name: status for name, (status, _) in rows.items()} == \
        {name: "ok" for name in QUICK_STEPS}
    limits = [int(limit) for _, limit in rows.values()]
    assert sum(limits) <= 360 * load_script().EMULATED_LIMIT_SCALE
    total = re.search(r"^total\s+[\d.]+\s+(\d+)", (out / "summary.txt").read_text(), re.M)
    assert total and int(total.group(1)) == sum(limits)
    files = list(out.iterdir())
    assert 0 < len(files) <= 8
    assert all(f.is_file() and f.stat().st_size <= 16 << 20 for f in files)
    # the plan (each limit and the total) first, the summary table last
    assert re.search(r"^total\s+\d+\s+\(at most 360 s", done.stdout, re.M)
    assert done.stdout.rstrip().splitlines()[-1].startswith("total")
    assert "train corpus: python_stdlib" in done.stdout
    summary = (out / "summary.txt").read_text()
    for figure in ("val loss", "forward", "emulated (dry run)", "GPU-only", "passed",
                   "dry run on the emulated GPU"):
        assert figure in summary, summary
    # each step ran on the emulated GPU: the env probe saw it, the trainer ran on cuda
    assert "emulated: yes" in (out / "env.txt").read_text()
    assert "bf16 on cuda:0" in (out / "train.log").read_text()


def test_a_failed_and_a_timed_out_step_are_recorded_and_the_next_still_runs(
        tmp_path: Path) -> None:
    done, out, rows = run_check(tmp_path, "--only", "env,tests,profile",
                                inject="env=fail,tests=timeout")
    assert done.returncode == 1
    assert {name: status for name, (status, _) in rows.items()} == \
        {"env": "FAILED rc 3", "tests": "TIMEOUT", "profile": "ok"}
    assert rows["tests"][1] == "3"  # the injected hang's short limit (so it was cut there)
    assert "--only env,tests" in done.stdout  # how to rerun what failed
    # --only: only the named steps ran, only their files were written
    assert sorted(f.name for f in out.iterdir()) == \
        ["env.txt", "profile.txt", "summary.txt", "tests.log"]
    # the whole process group is gone, the child that ignored SIGINT included
    child = int(re.search(r"injected hang; child (\d+)", (out / "tests.log").read_text()).group(1))
    for _ in range(50):
        status = Path(f"/proc/{child}/status")
        if not status.exists() or "zombie" in status.read_text():
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"the hung step's child {child} outlived the step")


def test_list_and_bad_arguments(tmp_path: Path) -> None:
    listed = subprocess.run([sys.executable, str(SCRIPT), "--list"], cwd=REPO,
                            capture_output=True, text=True, timeout=30)
    assert listed.returncode == 0
    limits = dict(re.findall(r"^(\w+)\s+(\d+)\s", listed.stdout, re.M))
    assert list(limits)[:-1] == STEP_NAMES
    assert int(limits["total"]) == sum(int(limits[n]) for n in STEP_NAMES) <= 360
    for args, says in ((["--only", "bench,nosuch"], "no step nosuch"),
                       (["--limit", "bench=x"], "expected STEP=SECONDS")):
        bad = subprocess.run([sys.executable, str(SCRIPT), *args], cwd=REPO,
                             capture_output=True, text=True, timeout=30)
        assert bad.returncode == 2 and says in bad.stderr


def listed_limits(*args: str) -> dict:
    listed = subprocess.run([sys.executable, str(SCRIPT), "--list", *args], cwd=REPO,
                            capture_output=True, text=True, timeout=30)
    assert listed.returncode == 0, listed.stderr
    return {name: int(limit) for name, limit in
            re.findall(r"^(\w+)\s+(\d+)\s", listed.stdout, re.M)}


def test_the_dry_run_scales_every_limit_and_the_gpu_run_none(tmp_path: Path) -> None:
    """The dry run's limits and per-test timeouts are the GPU's times one scale
    (EMULATED_LIMIT_SCALE, > 1: the emulated GPU is the CPU); a GPU run's are the steps'
    own, and a --limit is taken as given in either."""
    check = load_script()
    scale = check.EMULATED_LIMIT_SCALE
    assert scale > 1
    gpu, dry = listed_limits(), listed_limits("--dry-run")
    assert gpu == {**{s.name: s.limit_s for s in check.STEPS},
                   "total": sum(s.limit_s for s in check.STEPS)}
    assert dry == {name: scale * limit for name, limit in gpu.items()}
    assert listed_limits("--dry-run", "--limit", "rest=200")["rest"] == 200
    from gpu_check_parts.running import step_env  # importable once the script is loaded
    rest = next(s for s in check.STEPS if s.name == "rest")
    for dry_run, factor in ((True, scale), (False, 1)):
        run = check.Run(dry=dry_run, out=tmp_path, work=tmp_path)
        env = step_env(run, rest)
        assert env[check.TEST_TIMEOUT_ENV] == str(rest.test_timeout_s * factor)
        assert (env.get(check.EMULATE_ENV) == "1") == dry_run


def test_the_topk_step_times_a_captured_top_k_decode_on_cuda(tmp_path: Path) -> None:
    """topk runs bench_decode.py as decode does, with top-k sampling in the captured step:
    GPT-2 124M's vocabulary on a GPU, the baby's in the dry run."""
    check = load_script()
    topk = next(s for s in check.STEPS if s.name == "topk")
    decode = next(s for s in check.STEPS if s.name == "decode")
    for dry_run, case in ((False, "gpt2"), (True, "baby")):
        run = check.Run(dry=dry_run, out=tmp_path, work=tmp_path)
        command = topk.command(run)
        assert command[:4] == [run.python, "scripts/bench_decode.py", "--device", "cuda"]
        assert command[command.index("--top-k") + 1] == str(check.TOP_K)
        assert command[command.index("--cases") + 1] == case
        assert "--top-k" not in decode.command(run)
    assert topk.figure is decode.figure and topk.file == decode.file


def test_a_decode_figure_names_the_sampling_or_the_error_that_ended_it() -> None:
    check = load_script()
    table = ("sampling: temperature 1, top_k 50\n"
             "case   eager us/tok  captured speed-up | one-token step:\n"
             "gpt2          9000      1500    6.00x | a CUDA Graph per token on cuda\n")
    assert check.decode_figure(table, None) == "top_k=50: gpt2 9000 -> 1500 us/token (6.00x)"
    plain = table.replace("top_k 50", "the whole vocabulary")
    assert check.decode_figure(plain, None) == "gpt2 9000 -> 1500 us/token (6.00x)"
    failed = ("sampling: temperature 1, top_k 50\nTraceback (most recent call last):\n"
              '  File "scripts/bench_decode.py", line 1, in <module>\n'
              "cupy.cuda.runtime.CUDARuntimeError: cudaErrorStreamCaptureUnsupported: "
              "operation not permitted when stream is capturing\n")
    assert check.decode_figure(failed, None) == (
        "error: cupy.cuda.runtime.CUDARuntimeError: cudaErrorStreamCaptureUnsupported: "
        "operation not permitted when stream is capturing")
    no_graph = table.splitlines()[0] + "\nbench_decode: gpt2's one-token step on cuda is not " \
        "a CUDA Graph: expected a _GraphCapture, got _Capture\n"
    assert check.decode_figure(no_graph, None).startswith("error: bench_decode: gpt2's")


def test_the_topk_step_captures_a_top_k_decode_on_the_emulated_gpu(tmp_path: Path) -> None:
    """The captured top-k decode on the emulated GPU, whose stand-in refuses the host
    reads CuPy's argpartition makes while a stream captures: ok, a CUDA Graph per token,
    with its per-token figure (a failure's error and traceback: the figure test above)."""
    done, out, rows = run_check(tmp_path, "--only", "topk")
    status, limit = rows["topk"]
    summary = (out / "summary.txt").read_text()
    log = (out / "bench.log").read_text()
    assert int(limit) == 10 * load_script().EMULATED_LIMIT_SCALE
    assert "--top-k 50" in log and "sampling: temperature 1, top_k 50" in log, log[-3000:]
    assert status == "ok" and done.returncode == 0, summary + log[-3000:]
    assert re.search(r"top_k=50: baby \d+ -> \d+ us/token", summary), summary
    assert "a CUDA Graph per token on cuda" in log


def test_the_fp16_step_trains_with_loss_scaling_on_the_emulated_gpu(tmp_path: Path) -> None:
    """fp16 trains the GPU config with dynamic loss scaling; its figure names the scale
    and the steps skipped, read from the run's metrics."""
    done, out, rows = run_check(tmp_path, "--only", "fp16")
    summary = (out / "summary.txt").read_text()
    log = (out / "train.log").read_text()
    assert rows["fp16"][0] == "ok" and done.returncode == 0, summary + log[-3000:]
    assert "--set system.dtype=fp16" in log and "fp16 on cuda:0" in log, log[-3000:]
    assert re.search(r"loss scale \d+, \d+ steps skipped", summary), summary


def test_logs_are_cut_to_their_head_and_end() -> None:
    check = load_script()
    data = b"".join(b"line %d\n" % i for i in range(200_000))
    cut = check.trim(data, cap=10_000, head=2_000)
    assert len(cut) <= 10_000
    assert cut.startswith(b"line 0\n") and cut.endswith(b"line 199999\n")
    assert b"bytes cut" in cut
    assert check.trim(b"short\n", cap=10_000, head=2_000) == b"short\n"


def test_pytest_counts_are_read_whole_or_cut_short() -> None:
    check = load_script()
    final = "collected 5\n==== 3 passed, 1 failed, 1 skipped in 2.50s ====\n"
    assert check.pytest_figure(final, None) == "3 passed, 1 failed, 1 skipped"
    cut = ("[gw0] [ 10%] PASSED tests/a.py::x\n[gw1] [ 20%] FAILED tests/a.py::y\n"
           "tests/b.py::z PASSED                                 [ 30%]\n")
    assert check.pytest_figure(cut, None) == "so far: 2 passed, 1 failed"


def write_timeout_tests(folder: Path) -> Path:
    path = folder / "test_slow.py"
    path.write_text(
        "import signal, time\n"
        "def test_quick(): pass\n"
        "def test_sleeps(): time.sleep(30)\n"
        "def test_after(): pass\n"
        "def test_stuck():  # the alarm can no longer interrupt it: faulthandler ends it\n"
        "    signal.signal(signal.SIGALRM, lambda *args: None)\n"
        "    time.sleep(30)\n")
    return path


def test_conftest_fails_a_test_past_its_time_limit_and_goes_on(tmp_path: Path) -> None:
    tests = write_timeout_tests(tmp_path)
    env = dict(os.environ, MINITORCH_GPU_TEST_TIMEOUT="1",
               PYTHONPATH=os.pathsep.join([str(REPO / "tests"), str(REPO)]))
    base = [sys.executable, "-m", "pytest", "-p", "conftest", "-p", "no:cacheprovider",
            "-p", "no:hypothesispytest", "-v",
            "--tb=short", "-rf", "--rootdir", str(tmp_path), str(tests)]
    runs = [subprocess.Popen(base + ["-k", k], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True) for k in ("not stuck", "stuck")]
    (soft, soft_err), (hard, hard_err) = [run.communicate(timeout=60) for run in runs]
    assert "1 failed, 2 passed" in soft, soft[-3000:] + soft_err[-2000:]
    assert "call of test_slow.py::test_sleeps took longer than 1 s" in soft
    assert runs[1].returncode != 0
    assert "Timeout" in hard_err and "test_stuck" in hard_err, hard[-2000:] + hard_err[-2000:]

@pytest.mark.cuda
@pytest.mark.skipif(not mt.cuda.is_available(),
                    reason=f"no CUDA here: {mt.cuda.unavailable_reason()}")
def test_gpu_is_usable() -> None:
    """A sum on the GPU (or the emulated one), the check's quickest sign of life."""
    x = mt.ones((4, 5), device="cuda")
    assert float(x.sum().item()) == 20.0


def test_sanitizer_selections_name_existing_cuda_tests() -> None:
    """memcheck and racecheck run chosen kernel tests by name: every term of their -k
    expressions (a name, or a parenthesised 'and' of names) must still pick a cuda test of
    tests/test_kernels.py, or a rename would leave a kernel unchecked without a word."""
    check = load_script()
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "cuda",
                           "-p", "no:cacheprovider", "tests/test_kernels.py"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    ids = [line.split("::", 1)[1] for line in done.stdout.splitlines() if "::" in line]
    assert len(ids) > 50, done.stdout[-2000:]
    for selection in (check.MEMCHECK_SELECTION, check.RACECHECK_SELECTION):
        for term in selection.split(" or "):
            words = [w for w in term.strip("() ").split(" and ")]
            assert any(all(w in test_id for w in words) for test_id in ids), term
