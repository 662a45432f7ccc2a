"""Shared test fixtures: the devices to run on (cuda is skipped cleanly without a GPU),
and a time limit per test when MINITORCH_GPU_TEST_TIMEOUT is set."""
import contextlib
import faulthandler
import os
import signal
import sys
import threading

import numpy as np
import pytest

import minitorch_gpu as mt


def _device_params():
    cuda = pytest.param(
        "cuda", marks=[pytest.mark.cuda, pytest.mark.skipif(
            not mt.cuda.is_available(),
            reason=f"no CUDA here: {mt.cuda.unavailable_reason()}")])
    return ["cpu", cuda]


DEVICES = _device_params()


def gpu_only(test):
    """A CUDA test too slow for the emulated GPU (``MINITORCH_EMULATE_CUDA=1`` runs every
    CUDA thread as a fiber on the CPU): it runs on a real GPU only, and docs/DESIGN.md
    names it ("What runs without a GPU")."""
    return pytest.mark.skipif(mt.cuda.is_emulated(), reason=(
        "GPU-only: too slow on the emulated GPU"))(test)


@pytest.fixture(params=DEVICES)
def device(request):
    """Each device the suite runs on: "cpu" always, "cuda" where a GPU is present."""
    return request.param


@pytest.fixture(autouse=True, scope="session")
def _private_cache(tmp_path_factory):
    """The suite's measurements (machine.py's matmul peak and copy bandwidth) and caches go
    to a folder of its own, never the user's ~/.cache/minitorch_gpu: a peak measured while
    the tests load the machine, or under a test's stand-in backend, must not become the
    roof that the user's next profile is judged against."""
    patch = pytest.MonkeyPatch()
    patch.setenv("MINITORCH_GPU_CACHE", str(tmp_path_factory.mktemp("cache")))
    yield
    patch.undo()


@pytest.fixture(autouse=True)
def _fresh_seed_and_grad_mode():
    """Every test starts from the same seed with grad mode on."""
    mt.manual_seed(0)
    yield
    mt.set_grad_enabled(True)


# --- what the tests that train through the CLI share -------------------------------------
def corpus_text(n_lines: int = 400) -> str:
    """A small text corpus for char-level training runs, the same on every call."""
    rng = np.random.default_rng(0)
    words = ["the", "king", "queen", "said", "and", "to", "my", "lord", "good", "night"]
    return "".join(" ".join(rng.choice(words, 8)) + ".\n" for _ in range(n_lines))


def single_thread_environment(workdir) -> dict:
    """The environment of a training process started by a test: one BLAS thread (the
    tests run processes side by side), the data cache in ``workdir``, unbuffered output."""
    threads = {name: "1" for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                                      "MKL_NUM_THREADS")}
    return {**os.environ, **threads, "MINITORCH_GPU_CACHE": str(workdir / "cache"),
            "PYTHONUNBUFFERED": "1"}


# --- a time limit per test ---------------------------------------------------------------
# MINITORCH_GPU_TEST_TIMEOUT=SECONDS fails a test whose setup, call or teardown runs longer,
# with its traceback, and the run goes on: the GPU check (scripts/gpu_check.py) sets it so a
# hung kernel cannot eat the time of every test after it. pytest-timeout does this too but
# may be absent where the check runs. SIGALRM interrupts Python code; a main thread stuck
# inside C (a kernel that never returns) does not see it, so faulthandler then prints every
# thread's stack and ends the process a little later (under pytest-xdist only that worker,
# which xdist reports and replaces).
TEST_TIMEOUT_ENV = "MINITORCH_GPU_TEST_TIMEOUT"
_stderr_copy = None  # faulthandler writes here: the real stderr, not a capture of it


def _test_timeout_s() -> float:
    raw = os.environ.get(TEST_TIMEOUT_ENV, "").strip()
    if not raw:
        return 0.0
    try:
        return max(float(raw), 0.0)
    except ValueError:
        raise pytest.UsageError(f"{TEST_TIMEOUT_ENV}: expected seconds (a number), got "
                                f"{raw!r}") from None


def pytest_configure(config):
    global _stderr_copy
    if _test_timeout_s():
        try:
            _stderr_copy = os.dup(sys.stderr.fileno())
        except (AttributeError, ValueError, OSError):  # stderr is no file (xdist's worker)
            _stderr_copy = os.dup(sys.__stderr__.fileno())


def pytest_unconfigure(config):
    global _stderr_copy
    if _stderr_copy is not None:
        os.close(_stderr_copy)
        _stderr_copy = None


@contextlib.contextmanager
def _time_limit(item, phase: str):
    seconds = _test_timeout_s()
    if (not seconds or not hasattr(signal, "SIGALRM")
            or threading.current_thread() is not threading.main_thread()):
        yield
        return

    def on_timeout(signum, frame):
        pytest.fail(f"{phase} of {item.nodeid} took longer than {seconds:g} s "
                    f"({TEST_TIMEOUT_ENV})", pytrace=True)

    previous = signal.signal(signal.SIGALRM, on_timeout)
    hard_after = seconds + min(15.0, max(1.0, seconds))
    faulthandler.dump_traceback_later(hard_after, exit=True,
                                      file=_stderr_copy if _stderr_copy is not None
                                      else sys.__stderr__)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        faulthandler.cancel_dump_traceback_later()
        signal.signal(signal.SIGALRM, previous)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    with _time_limit(item, "setup"):
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    with _time_limit(item, "call"):
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item):
    with _time_limit(item, "teardown"):
        yield


@pytest.fixture
def paths(monkeypatch):
    """The paths attention's ``_attend`` took, in order (through every op that calls it:
    the attention ops and the forms on a model's projections)."""
    from minitorch_gpu.ops import attention, attention_heads
    taken = []
    real = attention._attend

    def spy(ctx, *args, **kwargs):
        result = real(ctx, *args, **kwargs)
        taken.append(ctx.path)
        return result

    monkeypatch.setattr(attention, "_attend", spy)
    monkeypatch.setattr(attention_heads, "_attend", spy)
    return taken
