"""Shared test fixtures: the devices to run on (cuda is skipped cleanly without a GPU)."""
import pytest

import minitorch_gpu as mt


def _device_params():
    cuda = pytest.param(
        "cuda", marks=[pytest.mark.cuda, pytest.mark.skipif(
            not mt.cuda.is_available(),
            reason=f"no CUDA here: {mt.cuda.unavailable_reason()}")])
    return ["cpu", cuda]


DEVICES = _device_params()


@pytest.fixture(params=DEVICES)
def device(request):
    """Each device the suite runs on: "cpu" always, "cuda" where a GPU is present."""
    return request.param


@pytest.fixture(autouse=True)
def _fresh_seed_and_grad_mode():
    """Every test starts from the same seed with grad mode on."""
    mt.manual_seed(0)
    yield
    mt.set_grad_enabled(True)
