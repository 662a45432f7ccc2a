"""The measured matmul peak and copy bandwidth: cached per machine, device, dtype and thread count in
$MINITORCH_GPU_CACHE/machine.json, and robust to that file being damaged, unwritable or
written by another process at the same time. ``_measure_matmul`` is replaced by a constant so
nothing here times a real product."""
import json
import os

import pytest

from minitorch_gpu.system import machine

PEAK = 1.25e11


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """The cache file's path; measuring is replaced by a function returning PEAK whose
    calls the returned list counts."""
    monkeypatch.setenv("MINITORCH_GPU_CACHE", str(tmp_path))
    calls = []
    monkeypatch.setattr(machine, "_measure_matmul", lambda *args: calls.append(args) or PEAK)
    return tmp_path / "machine.json", calls


def test_measured_once_then_read_from_the_cache(cache):
    path, calls = cache
    assert machine.matmul_peak_flops("cpu") == PEAK and len(calls) == 1
    assert machine.matmul_peak_flops("cpu") == PEAK and len(calls) == 1
    assert json.loads(path.read_text()) == {machine._machine_key("matmul", "cpu", "float32"): PEAK}
    assert machine.matmul_peak_flops("cpu", refresh=True) == PEAK and len(calls) == 2


@pytest.mark.parametrize("content", ["[1, 2]", "null", '"text"', "7", "{broken", "\udcff",
                                     "{KEY: 0}", "{KEY: -3.5}", "{KEY: NaN}",
                                     "{KEY: Infinity}", "{KEY: true}", '{KEY: "fast"}'])
def test_a_damaged_cache_is_measured_again_and_rewritten(cache, content):
    # JSON that was not an object crashed every run with AttributeError; a zero, negative,
    # infinite or NaN peak was trusted (MFU divided by it)
    path, calls = cache
    key = json.dumps(machine._machine_key("matmul", "cpu", "float32"))
    path.write_bytes(content.replace("KEY", key).encode("utf-8", "surrogateescape"))
    assert machine.matmul_peak_flops("cpu") == PEAK and len(calls) == 1
    assert json.loads(path.read_text())[json.loads(key)] == PEAK


def test_entries_written_by_another_process_meanwhile_are_kept(cache, monkeypatch):
    # the file was read before the seconds of measuring and written back after: another
    # run's entry written in between was lost
    path, _ = cache

    def measure_while_another_process_writes(*args):
        path.write_text(json.dumps({"other|machine|cuda:0|float32|0": 9.0e13}))
        return PEAK

    monkeypatch.setattr(machine, "_measure_matmul", measure_while_another_process_writes)
    machine.matmul_peak_flops("cpu")
    assert json.loads(path.read_text()) == {"other|machine|cuda:0|float32|0": 9.0e13,
                                             machine._machine_key("matmul", "cpu", "float32"): PEAK}


def test_an_unwritable_cache_still_gives_the_peak_and_leaves_no_temporary_file(cache,
                                                                              monkeypatch):
    # the temporary file of a failed write was left in the cache folder
    path, _ = cache

    def refuse(*args):
        raise PermissionError("read-only")

    monkeypatch.setattr(os, "replace", refuse)
    assert machine.matmul_peak_flops("cpu") == PEAK
    monkeypatch.undo()
    assert os.listdir(path.parent) == []


def test_a_file_where_the_cache_folder_should_be(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("x")
    monkeypatch.setenv("MINITORCH_GPU_CACHE", str(tmp_path / "file"))
    monkeypatch.setattr(machine, "_measure_matmul", lambda *args: PEAK)
    assert machine.matmul_peak_flops("cpu") == PEAK


def test_set_num_threads_limits_blas():
    before = machine._blas_threads()
    machine.set_num_threads(None)  # leaves the default
    assert machine._blas_threads() == before
    machine.set_num_threads(1)
    try:
        assert machine._blas_threads() == 1
    finally:
        machine.set_num_threads(before)


def test_copy_bandwidth_has_its_own_cache_entry_beside_the_matmul_peak(cache, monkeypatch):
    path, _ = cache
    copies = []
    monkeypatch.setattr(machine, "_measure_copy",
                        lambda *args: copies.append(args) or 2.0e10)
    assert machine.matmul_peak_flops("cpu") == PEAK
    assert machine.copy_bandwidth("cpu") == 2.0e10 and len(copies) == 1
    assert machine.copy_bandwidth("cpu") == 2.0e10 and len(copies) == 1
    assert json.loads(path.read_text()) == {
        machine._machine_key("matmul", "cpu", "float32"): PEAK,
        machine._machine_key("copy", "cpu", "float32"): 2.0e10}


def test_copy_bandwidth_measures_a_real_copy():
    # a small array keeps this quick; the rate is bytes read plus bytes written per second
    rate = machine._measure_copy("cpu", "float32", 1 << 20, 2)
    assert 1e8 < rate < 1e13
