"""What a real GPU refuses or does while a CUDA Graph captures, and the engine's answers.

The first half checks the CuPy stand-in against CuPy 14.2 and CUDA: memory freed goes back
to its pool poisoned and is handed out again; a graph reads its nodes' memory by address;
host-to-device uploads of arrays, hidden host reads inside CuPy's routines and the lazy
cuBLAS handle are refused while a stream captures. The second half is what the engine does
about each: captured top-k and sampling without replacement, factories of host data, the
deferred checks a graph reads, the cuBLAS handle, memory_stats. Each engine test failed
before its fix."""
from __future__ import annotations

import gc

import numpy as np
import pytest

import minitorch_gpu as mt
from minitorch_gpu.backend import get_backend

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(
    not mt.cuda.is_emulated(), reason="the stand-in's rules: MINITORCH_EMULATE_CUDA=1")]

if mt.cuda.is_emulated():
    from minitorch_gpu.backend.emulated_cuda import memory, stand_in
    from minitorch_gpu.backend.emulated_cuda.stand_in import cuda as stand_in_cuda
    cp = stand_in.cupy


def _capturing():
    return cp.cuda.Stream(non_blocking=True)


# --- the stand-in ---------------------------------------------------------------------------
def test_a_freed_buffer_is_poisoned_and_handed_to_the_next_allocation_of_its_size():
    a = cp.full((1000,), 3.0, dtype=np.float32)
    address = a.data.ptr
    view = memory.mapped_view(address, (1000,), (4,), np.float32)  # what a kernel reads
    del a
    gc.collect()
    assert np.isnan(view).all()  # poisoned when freed
    b = cp.zeros((1000,), dtype=np.float32)
    assert b.data.ptr == address  # the same block again, as CuPy's pool hands it out
    assert (view == 0).all()


def test_a_private_pool_keeps_its_blocks_from_the_default_pool():
    pool = cp.cuda.MemoryPool()
    with cp.cuda.using_allocator(pool.malloc):
        a = cp.ones((512,), dtype=np.float32)
    address = a.data.ptr
    used = pool.used_bytes()
    assert used >= a.nbytes and cp.get_default_memory_pool().used_bytes() >= 0
    del a
    gc.collect()
    assert pool.used_bytes() == used - 2048 and pool.free_bytes() > 0
    assert cp.ones((512,), dtype=np.float32).data.ptr != address  # the default pool's


def test_a_graph_reads_by_address_so_a_buffer_freed_after_the_capture_reads_poison():
    x = cp.full((4,), 2.0, dtype=np.float32)
    out = cp.empty((4,), dtype=np.float32)
    stream = _capturing()
    with stream:
        stream.begin_capture()
        cp.multiply(x, 3.0, out=out)
        graph = stream.end_capture()
    graph.launch()
    np.testing.assert_array_equal(cp.asnumpy(out), 6.0)
    address = x.data.ptr
    del x  # nothing keeps the graph's input alive: its block is poisoned, then reused
    gc.collect()
    graph.launch()
    assert np.isnan(cp.asnumpy(out)).all()
    other = cp.full((4,), 5.0, dtype=np.float32)  # the next array of its size takes it
    assert other.data.ptr == address
    graph.launch()
    np.testing.assert_array_equal(cp.asnumpy(out), 15.0)


@pytest.mark.parametrize("upload, words", [
    (lambda: cp.asarray(np.arange(3)), "cupy.array/asarray of host data of shape (3,)"),
    (lambda: cp.array([1.0, 2.0]), "of shape (2,)"),
    (lambda: cp.zeros((2,), np.float32).set(np.ones(2, np.float32)), "ndarray.set"),
])
def test_uploads_of_host_arrays_are_refused_while_capturing(upload, words):
    stream = _capturing()
    with stream:
        stream.begin_capture()
        try:
            with pytest.raises(stand_in_cuda.CUDARuntimeError, match="copy_from_host_async") \
                    as caught:
                upload()
            assert words in str(caught.value)
            cp.asarray(3.0)  # a 0-d value goes in as a kernel argument: allowed
        finally:
            stream.end_capture()


@pytest.mark.parametrize("call, reads", [
    (lambda: cp.argpartition(cp.arange(10), 3), 2),
    (lambda: cp.unravel_index(cp.arange(6), (2, 3)), 2),
    (lambda: cp.bincount(cp.arange(4)), 2),
    (lambda: cp.nonzero(cp.arange(4)), 1),
    (lambda: cp.unique(cp.arange(4)), 1),
    (lambda: cp.where(cp.arange(4)), 1),
    (lambda: cp.where(cp.arange(4) > 1, 1.0, 2.0), 0),
])
def test_the_host_reads_inside_cupys_routines_are_counted_and_refused_while_capturing(
        call, reads):
    before = stand_in.host_reads()
    call()
    assert stand_in.host_reads() - before == reads
    if not reads:
        return
    stream = _capturing()
    with stream:
        stream.begin_capture()
        try:
            with pytest.raises(stand_in_cuda.CUDARuntimeError, match="capturing"):
                call()
        finally:
            stream.end_capture()


def test_the_cublas_handle_made_at_the_first_gemm_is_refused_while_capturing(monkeypatch):
    monkeypatch.setattr(stand_in_cuda, "_cublas_handles", {})
    stream = _capturing()
    with stream:
        stream.begin_capture()
        try:
            with pytest.raises(stand_in_cuda.CUDARuntimeError, match="cublasCreate"):
                cp.cuda.device.get_cublas_handle()
        finally:
            stream.end_capture()
    assert cp.cuda.device.get_cublas_handle() == cp.cuda.device.get_cublas_handle()


# --- the engine -----------------------------------------------------------------------------
@pytest.mark.parametrize("sample", [
    lambda x: mt.topk(x, 3).indices,
    lambda x: mt.sort(x, descending=True).indices,
    lambda x: mt.multinomial(x.softmax(-1), 3, replacement=False),
])
def test_topk_and_sampling_without_replacement_capture_as_a_cuda_graph(sample):
    logits = mt.tensor(np.random.default_rng(0).standard_normal((2, 40)), device="cuda")
    captured = mt.capture(sample)
    with mt.no_grad():
        mt.manual_seed(3)
        first = captured(logits).cpu().numpy()  # the capture: no host read refused
        mt.manual_seed(3)
        eager = sample(logits).cpu().numpy()
        assert captured.replays == 0
    np.testing.assert_array_equal(first, eager)
    assert type(next(iter(captured._captures.values()))).__name__ == "_GraphCapture"


def test_eager_topk_on_a_gpu_waits_for_no_host_read():
    logits = mt.tensor(np.random.default_rng(0).standard_normal((2, 500)), device="cuda")
    before = stand_in.host_reads()
    top = mt.topk(logits, 50)
    assert stand_in.host_reads() == before
    np.testing.assert_array_equal(
        top.indices.cpu().numpy(), np.argsort(-logits.cpu().numpy(), axis=-1)[:, :50])


def test_a_factory_of_host_data_inside_a_gpu_capture_is_refused_by_name():
    def shifted(x):
        return x + mt.tensor([1.0, 2.0, 3.0], device="cuda")

    x = mt.ones(3, device="cuda")
    with pytest.raises(mt.CaptureError, match=r"shifted .*copies host data of shape \(3,\)"):
        mt.capture(shifted)(x)
    offsets = mt.tensor([1.0, 2.0, 3.0], device="cuda")  # made before: a constant
    captured = mt.capture(lambda x: x + offsets)
    np.testing.assert_array_equal(captured(x).cpu().numpy(), [2.0, 3.0, 4.0])
    np.testing.assert_array_equal(captured(x * 2).cpu().numpy(), [3.0, 4.0, 5.0])


def test_checks_pending_at_a_capture_are_read_first_and_a_replay_is_checked_as_eagerly():
    backend = get_backend("cuda")
    table = mt.randn(12, 4, device="cuda")
    ids = mt.tensor([[1, 2]], device="cuda")
    with mt.no_grad():
        mt.embedding(ids, table)  # its range check stays pending on the device
        assert backend._deferred_checks
        captured = mt.capture(lambda i: mt.embedding(i, table))
        captured(ids)
        assert captured.captures == 1
        for _ in range(3):  # every pending array made before is gone: no bogus error
            gc.collect()
            cp.full((1,), 99, dtype=np.int64)
            out = captured(ids)
            out.cpu()
        bad = mt.tensor([[1, 15]], device="cuda")
        captured(bad)  # the replay's own check: read at the next host read
        with pytest.raises(ValueError, match="index 15 is out of range for 12"):
            out.cpu()
        assert not backend._deferred_checks


def test_the_cublas_handle_is_made_before_a_capture(monkeypatch):
    monkeypatch.setattr(stand_in_cuda, "_cublas_handles", {})
    a = mt.randn(8, 8, device="cuda")
    captured = mt.capture(lambda x: x @ x)
    with mt.no_grad():
        np.testing.assert_allclose(captured(a).cpu().numpy(),
                                   a.cpu().numpy() @ a.cpu().numpy(), rtol=1e-5)


def test_memory_stats_are_the_backends_gpu_and_count_the_graphs_pools():
    backend = get_backend("cuda:1")
    before = backend.memory_stats()
    x = mt.ones(4096, device="cuda:1")
    with stand_in_cuda.Device(0):  # another GPU current: the stats stay cuda:1's
        grown = backend.memory_stats()
    assert grown["bytes_in_use"] - before["bytes_in_use"] >= 4096 * 4
    captured = mt.capture(lambda t: (t * 2).exp())
    with mt.no_grad():
        captured(x)
    stats = backend.memory_stats()
    assert stats["bytes_in_graphs"] >= 2 * 4096 * 4
    assert stats["bytes_reserved"] >= stats["bytes_in_use"] >= stats["bytes_in_graphs"] > 0
    del captured
    gc.collect()
    assert backend.memory_stats()["bytes_in_graphs"] == 0


@pytest.mark.parametrize("dtype", [mt.float16, mt.bfloat16])
def test_a_graph_keeps_the_temporaries_its_ops_made_while_it_captured(dtype):
    """cuBLAS is given a contiguous copy of a head view and a float32 product that die
    inside the op while the graph captures: on a GPU their blocks stay the graph's, so
    every launch may read them (the stand-in's graphs hold them)."""
    rng = np.random.default_rng(0)
    a = mt.tensor(rng.standard_normal((2, 4, 3, 8)), dtype=dtype, device="cuda")
    b = mt.tensor(rng.standard_normal((2, 3, 8, 5)), dtype=dtype, device="cuda")
    product = mt.capture(lambda a, b: a.transpose(1, 2) @ b)  # (B, nh) head views
    with mt.no_grad():
        eager = (a.transpose(1, 2) @ b).float().cpu().numpy()
        for _ in range(3):
            gc.collect()
            out = product(a, b).float().cpu().numpy()
            np.testing.assert_allclose(out, eager, rtol=2e-2, atol=2e-2)
    assert product.replays == 2
