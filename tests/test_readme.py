"""The README's commands: the tour script runs as a user would run it, the quickstart
config trains and generates through the CLI, and CI runs exactly the set-up and test
commands the README gives. The README stays short (the reference lives in docs/), and
every docs page, config and in-page anchor it or a docs page links to exists."""
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


README_MAX_LINES = 250   # a newcomer's five minutes; the reference goes to docs/
LINK = re.compile(r"\]\(([^)\s]+)\)")     # the target of a markdown link: [text](target)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(page: Path) -> set:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)   # no headings in code
    return {_slug(m.group(1)) for m in re.finditer(r"^#+ (.*)$", text, re.M)}


def _doc_pages() -> list:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_the_readme_is_short():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md: expected at most {README_MAX_LINES} lines, got {len(lines)}: "
        "move reference material to a page in docs/ and link it")


def test_every_docs_page_is_linked_from_the_readme():
    linked = {t.split("#")[0] for t in LINK.findall((ROOT / "README.md").read_text())}
    pages = {f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")}
    assert pages - linked == set(), "docs pages the README does not link"
    missing = {t for t in linked if t.startswith("docs/") and t.endswith(".md")} - pages
    assert missing == set(), "README links to docs pages that do not exist"


def test_links_between_the_pages_resolve():
    """Every relative link of the README and the docs pages names a file that exists and,
    where it has one, an anchor that is one of that page's headings."""
    broken = []
    for page in _doc_pages():
        for target in LINK.findall(page.read_text()):
            if re.match(r"[a-z]+:", target):   # https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert broken == []


def test_the_configs_the_pages_name_exist():
    named = set()
    for page in _doc_pages():
        named |= set(re.findall(r"\bconfigs/[\w.-]+\.yaml\b", page.read_text()))
    assert named, "the pages name no config"
    assert {c for c in named if not (ROOT / c).exists()} == set()


def test_every_code_block_is_closed():
    """An unclosed ``` swallows the rest of a page, headings and links included."""
    unclosed = [p.name for p in _doc_pages() if len(re.findall(r"^ *```", p.read_text(), re.M)) % 2]
    assert unclosed == []
