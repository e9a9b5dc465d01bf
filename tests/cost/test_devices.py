"""The device table holds sane ceilings; the CPU probe measures once and is read back from its cache."""

import json

import pytest

from korch import config
from korch.cost import GPUS, devices, get_device, probe
from korch.errors import KorchError

FAKE = {"memory_bandwidth": 10e9, "cache_bandwidth": 40e9, "matmul_flops": 50e9, "elementwise_flops": 5e9, "tiny_op_seconds": 2e-6}


@pytest.mark.parametrize("name", sorted(GPUS))
def test_gpu_numbers_are_positive_and_consistent(name):
    d = get_device(name)
    assert d.name == name and d.kind == "gpu" and d.source
    assert d.memory_bandwidth > 0 and d.vector_flops > 0 and d.half_vector_flops >= d.vector_flops
    assert all(v > 0 for v in d.matrix_flops.values())
    assert d.matrix_peak("float16") >= d.matrix_peak("float32")
    assert 0 < d.launch_overhead <= 1e-6
    assert d.cache_bytes > 0 and d.cache_bandwidth > d.memory_bandwidth


def test_gpus_are_ordered_by_generation():
    bw = {n: get_device(n).memory_bandwidth for n in GPUS}
    assert bw["h200"] > bw["h100"] > bw["a100"] > bw["v100"]
    tf32 = {n: get_device(n).matrix_peak("float32") for n in GPUS}
    assert tf32["h200"] == tf32["h100"] > tf32["a100"] > tf32["v100"]


@pytest.mark.parametrize("name", sorted(GPUS))
def test_exact_float32_products_are_bounded_by_the_fma_peak(name):
    """Under the fp32 policy (TF32 off) a GPU multiplies float32 on its FMA units: a product's floor takes the
    vector peak, still at or above what a GPU was measured to reach (an H100: 51.7 TFLOP/s with cuBLAS)."""
    tensor, exact = get_device(name), get_device(name, exact_float32=True)
    assert exact.matrix_peak("float32") == min(tensor.vector_peak(), tensor.matrix_peak("float32"))
    assert exact.matrix_peak("float16") == tensor.matrix_peak("float16")
    if name == "h100":
        assert tensor.matrix_peak("float32") / exact.matrix_peak("float32") > 7 and exact.matrix_peak() >= 51.7e12


def test_datasheet_numbers_are_dense_not_sparse():
    h100, a100, v100 = get_device("h100"), get_device("a100"), get_device("v100")
    assert h100.memory_bandwidth == 3.35e12 and get_device("h200").memory_bandwidth == 4.8e12
    assert h100.matrix_flops == {"float32": 494.7e12, "float16": 989.4e12, "bfloat16": 989.4e12}
    assert a100.matrix_flops["float32"] == 156e12 and a100.matrix_flops["bfloat16"] == 312e12
    assert v100.matrix_flops["float32"] == 15.7e12  # no TF32 on Volta: the FP32 FMA peak
    assert v100.matrix_peak("bfloat16") == 125e12  # no bf16 on Volta: the fastest rate listed
    assert h100.vector_flops == pytest.approx(66.9e12, rel=1e-3)



@pytest.fixture(autouse=True)
def real_probe(monkeypatch):
    """These tests exercise the probe itself, not the fixed record the other tests price on (conftest)."""
    monkeypatch.delenv(probe.RECORD_ENV, raising=False)


def test_a_fixed_record_is_read_instead_of_probing(tmp_path, monkeypatch):
    record = {"cpu": "x", "cores": 2, "threads": 2, "torch": "t", "probe_version": probe.PROBE_VERSION,
              "cache_bytes": 1 << 20, "measured": dict(FAKE)}
    path = tmp_path / "record.json"
    path.write_text(json.dumps(record))
    monkeypatch.setenv(probe.RECORD_ENV, str(path))
    monkeypatch.setattr(probe, "measure", lambda cache: (_ for _ in ()).throw(AssertionError("probed")))
    assert probe.cpu_record() == record
    assert get_device("cpu").memory_bandwidth == FAKE["memory_bandwidth"] * devices.BANDWIDTH_HEADROOM
    path.write_text(json.dumps({"cpu": "x"}))
    with pytest.raises(KorchError, match="not a probe record"):
        probe.cpu_record()

def test_unknown_target_names_the_known_ones():
    with pytest.raises(KorchError, match=r"unknown target 'tpu'; known: cpu, h100, h200, a100, v100"):
        get_device("tpu")
    assert get_device("H100") is get_device("h100")


def test_probe_writes_its_file_then_reads_it(tmp_path, monkeypatch):
    probe._record_at.cache_clear()
    monkeypatch.setattr(probe, "measure", lambda cache: dict(FAKE))
    monkeypatch.setattr(probe, "peak_matrix_flops", lambda: 0.0)
    with config.patch(cache_dir=tmp_path):
        first = get_device("cpu")
        (path,) = (tmp_path / "devices").glob("cpu-*.json")
        assert json.loads(path.read_text())["measured"] == FAKE

        def fail():
            raise AssertionError("the cached probe must not measure again")

        monkeypatch.setattr(probe, "measure", fail)
        probe._record_at.cache_clear()
        again = get_device("cpu")
    probe._record_at.cache_clear()
    assert again == first
    assert first.kind == "cpu" and first.memory_bandwidth == 10e9 * devices.BANDWIDTH_HEADROOM
    assert first.matrix_flops == {"float32": 50e9 * devices.FLOPS_HEADROOM}
    assert first.vector_flops == first.matrix_flops["float32"]
    assert first.launch_overhead == 0.0


def test_the_matrix_ceiling_is_never_below_the_fma_peak(tmp_path, monkeypatch):
    probe._record_at.cache_clear()
    monkeypatch.setattr(probe, "measure", lambda cache: dict(FAKE))
    monkeypatch.setattr(probe, "peak_matrix_flops", lambda: 1e12)
    with config.patch(cache_dir=tmp_path):
        device = get_device("cpu")
    probe._record_at.cache_clear()
    assert device.matrix_flops == {"float32": 1e12}


def test_fma_peak_is_read_from_cpuinfo():
    assert probe.peak_matrix_flops() >= 16 * 1e9  # at least one core, 16 FLOP/cycle, 1 GHz on any Linux host


def test_probe_remeasures_a_corrupt_file(tmp_path, monkeypatch):
    probe._record_at.cache_clear()
    monkeypatch.setattr(probe, "measure", lambda cache: dict(FAKE))
    with config.patch(cache_dir=tmp_path):
        path = probe._cache_path()
        path.parent.mkdir(parents=True)
        path.write_text("{not json")
        assert get_device("cpu").memory_bandwidth == 10e9 * devices.BANDWIDTH_HEADROOM
        assert json.loads(path.read_text())["measured"] == FAKE
    probe._record_at.cache_clear()


def _cache(sysfs, cpu, index, kind, level, size, shared):
    d = sysfs / f"cpu{cpu}" / "cache" / f"index{index}"
    d.mkdir(parents=True)
    for name, value in {"type": kind, "level": level, "size": size, "shared_cpu_list": shared}.items():
        (d / name).write_text(value + "\n")


def test_cache_bytes_counts_each_data_cache_once(tmp_path):
    for cpu in (0, 1):  # private L1d, L1i and L2; one L3 shared by both cores
        _cache(tmp_path, cpu, 0, "Data", "1", "32K", str(cpu))
        _cache(tmp_path, cpu, 1, "Instruction", "1", "32K", str(cpu))
        _cache(tmp_path, cpu, 2, "Unified", "2", "1024K", str(cpu))
        _cache(tmp_path, cpu, 3, "Unified", "3", "32M", "0-1")
    assert probe.cache_bytes(tmp_path) == 2 * (32 << 10) + 2 * (1 << 20) + (32 << 20)


def test_cache_bytes_falls_back_when_sysfs_says_nothing(tmp_path):
    assert probe.cache_bytes(tmp_path) == probe.FALLBACK_CACHE_BYTES


def test_inner_cache_bytes_are_one_cores_caches_below_the_last_level(tmp_path):
    for cpu in (0, 1):
        _cache(tmp_path, cpu, 0, "Data", "1", "48K", str(cpu))
        _cache(tmp_path, cpu, 1, "Instruction", "1", "32K", str(cpu))
        _cache(tmp_path, cpu, 2, "Unified", "2", "1024K", str(cpu))
        _cache(tmp_path, cpu, 3, "Unified", "3", "32M", "0-1")
    assert probe.inner_cache_bytes(tmp_path) == (48 << 10) + (1 << 20)


def test_inner_cache_bytes_fall_back_when_sysfs_says_nothing_below_the_last_level(tmp_path):
    assert probe.inner_cache_bytes(tmp_path) == probe.FALLBACK_INNER_CACHE_BYTES
    _cache(tmp_path, 0, 0, "Unified", "1", "64K", "0")  # one level only: it is the last
    assert probe.inner_cache_bytes(tmp_path) == probe.FALLBACK_INNER_CACHE_BYTES
