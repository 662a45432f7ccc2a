"""CUDA Graphs in the CuPy stand-in (stand_in/graphs.py), as captured steps use them on a
GPU: work queued on a capturing stream is recorded, not visible until the graph is
launched; each launch reruns it on the same memory (fresh draws included); what CUDA
refuses during a capture is refused."""
import numpy as np
import pytest

from minitorch_gpu.backend.emulated_cuda import stand_in

cp = stand_in.cupy


def _host(x):
    return cp.asnumpy(x)


def test_a_launch_reruns_the_captured_work_on_the_same_memory():
    x = cp.ones((4,), dtype=np.float32)
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        assert stream.is_capturing()
        y = cp.exp(x) * 2.0  # allocated during the capture: unwritten until a launch
        graph = stream.end_capture()
    assert not stream.is_capturing()
    assert np.isnan(_host(y)).all()  # a GPU has not run the kernels yet
    graph.launch()
    np.testing.assert_allclose(_host(y), 2 * np.e, rtol=1e-6)
    x[...] = 0.0  # new values in the input's memory: the next launch reads them
    graph.launch()
    np.testing.assert_allclose(_host(y), 2.0)


def test_draws_are_fresh_at_every_launch_and_none_is_made_by_the_capture():
    rng = cp.random.default_rng(5)
    twin = cp.random.default_rng(5)
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        u = rng.random((3,), dtype=np.float32)
        graph = stream.end_capture()
    graph.launch()
    first = _host(u).copy()
    np.testing.assert_array_equal(first, _host(twin.random((3,), dtype=np.float32)))
    graph.launch()
    assert not np.array_equal(first, _host(u))
    np.testing.assert_array_equal(_host(u), _host(twin.random((3,), dtype=np.float32)))


def test_what_cuda_refuses_during_a_capture_is_refused():
    x = cp.ones((2,), dtype=np.float32)
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        with pytest.raises(stand_in.cuda.CUDARuntimeError, match="capturing"):
            float(x.sum())  # a copy to the host waits for the device
        with pytest.raises(stand_in.cuda.CUDARuntimeError, match="already capturing"):
            stream.begin_capture()
        stream.end_capture()
    with pytest.raises(stand_in.cuda.CUDARuntimeError, match="not capturing"):
        stream.end_capture()
    with pytest.raises(RuntimeError, match="default"):
        cp.cuda.Stream(null=True).begin_capture()
    assert float(x.sum()) == 2.0  # reads are allowed again
