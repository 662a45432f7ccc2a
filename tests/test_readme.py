"""The README's commands: the tour script runs as a user would run it, the quickstart
config trains and generates through the CLI, and CI runs exactly the set-up and test
commands the README gives."""
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_tour_trains_and_samples():
    run = subprocess.run([sys.executable, str(ROOT / "scripts" / "tour.py"), "--steps", "150"],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert run.returncode == 0, run.stderr
    losses = [float(v) for v in re.findall(r"step +\d+ +loss ([\d.]+)", run.stdout)]
    assert len(losses) == 2
    assert losses[-1] < 0.5 * losses[0]  # it learns: from ~log(45) = 3.8 to well below
    assert "x.t().view(12) -> RuntimeError" in run.stdout
    assert "sample:\nBeautiful is " in run.stdout


def test_ci_runs_the_readme_commands():
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"```bash\n(.*?)```", readme, re.S).group(1).strip().splitlines()
    setup, main_job, tests = block
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert setup in ci and tests in ci
    assert ci.index(setup) < ci.index(tests)
    assert main_job.startswith("minitorch-gpu train configs/quickstart.yaml && "
                               "minitorch-gpu generate checkpoints/quickstart")


def test_the_quickstart_recipe_trains_and_generates_through_the_cli(tmp_path):
    """configs/quickstart.yaml as the README runs it, cut short: the stdlib corpus, a BPE
    tokenizer trained on it, a few iterations, a checkpoint, then Python-shaped sampling."""
    env = {**os.environ, "MINITORCH_GPU_CACHE": str(tmp_path / "cache")}
    train = subprocess.run(
        [sys.executable, "-m", "minitorch_gpu", "train", str(ROOT / "configs" / "quickstart.yaml"),
         "--set", "train.max_iters=6", "--set", "train.warmup_iters=2", "--set", "eval.interval=3", "--set", "eval.iters=2",
         "--set", "data.max_chars=300000", "--set", "data.vocab_size=512",
         "--set", f"checkpoint.dir={tmp_path / 'ckpts'}", "--progress", "lines"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert train.returncode == 0, train.stderr
    assert "python_stdlib" in train.stdout and "bpe, vocab 512" in train.stdout
    assert "minitorch-gpu generate" in train.stdout
    gen = subprocess.run(
        [sys.executable, "-m", "minitorch_gpu", "generate", str(tmp_path / "ckpts" / "quickstart"),
         "--prompt", "def ", "--max-new-tokens", "30"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)
    assert gen.returncode == 0, gen.stderr
    assert gen.stdout.startswith("def ") and len(gen.stdout) > len("def ") + 10
