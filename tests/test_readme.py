"""The README's commands: the quick-start script runs as a user would run it, and CI
runs exactly the set-up and test commands the README gives."""
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_quickstart_trains_and_samples():
    run = subprocess.run([sys.executable, str(ROOT / "scripts" / "quickstart.py"), "--steps", "150"],
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
    setup, _, tests = block
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert setup in ci and tests in ci
    assert ci.index(setup) < ci.index(tests)
