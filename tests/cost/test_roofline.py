"""kernel_work counts exactly the work a kernel cannot avoid; lower_bound divides it by the device's ceilings."""

import dataclasses
import json
import math
from types import SimpleNamespace

import numpy as np
import pytest

from korch import config
from korch.cost import KernelWork, candidate_bounds, get_device, kernel_work, lower_bound
from korch.cost import devices, probe, roofline
from korch.fission.builder import Builder
from korch.ir import Graph, Op, Tensor


def _graph(*inputs):
    g = Graph(name="t")
    for name, shape in inputs:
        g.add_tensor(Tensor(name=name, shape=shape, dtype="float32"))
        g.inputs.append(name)
    return g, Builder(g, "n")


def _work(g, outputs, nodes=None, fast_convolution=True):
    """Work of the kernel of ``nodes`` (default: all) writing ``outputs``; inputs: what it reads from outside."""
    nodes = range(len(g.nodes)) if nodes is None else nodes
    made = {o for i in nodes for o in g.nodes[i].outputs}
    inputs = [x for i in nodes for x in g.nodes[i].inputs if x not in made]
    return kernel_work(g, frozenset(nodes), list(dict.fromkeys(inputs)), outputs, fast_convolution=fast_convolution)


def test_elementwise_chain_reads_and_writes_each_tensor_once():
    g, b = _graph(("x", (4, 8)))
    z = b.add(b.emit(Op.EXP, "x"), "x")
    assert _work(g, [z]) == KernelWork(bytes_read=128, bytes_written=128, vector_flops=64, matrix_flops=0)


def test_broadcast_scalar_constant_is_read_once():
    g, b = _graph(("x", (4, 8)))
    y = b.mul("x", b.scalar(2.0, like="x"))
    assert _work(g, [y]) == KernelWork(bytes_read=128 + 4, bytes_written=128, vector_flops=32, matrix_flops=0)


def test_intermediate_output_is_written_too():
    g, b = _graph(("x", (4, 8)))
    y = b.emit(Op.EXP, "x")
    z = b.emit(Op.RELU, y)
    assert _work(g, [y, z]).bytes_written == 256


def test_slice_only_reader_counts_only_what_it_reads():
    g, b = _graph(("x", (8, 16)))
    top = b.emit(Op.NEG, b.slice_axis("x", 0, 0, 4))  # rows 0..3 (negated: slices alone are views)
    low = b.emit(Op.NEG, b.slice_axis("x", 0, 2, 6))  # rows 2..7: overlaps; the larger slice is a floor on the union
    work = _work(g, [top, low])
    assert work.bytes_read == 6 * 16 * 4
    assert work.bytes_written == (4 + 6) * 16 * 4


def test_elementwise_result_only_sliced_is_computed_only_where_sliced():
    g, b = _graph(("x", (8, 16)))
    y = b.emit(Op.RELU, "x")
    z = b.slice_axis(y, 0, 0, 2)
    assert _work(g, [z]) == KernelWork(bytes_read=2 * 16 * 4, bytes_written=2 * 16 * 4, vector_flops=32,
                                       matrix_flops=0)
    # the same relu written out whole needs all of x
    assert _work(g, [y, z]).bytes_read == 8 * 16 * 4


def test_gather_reads_its_distinct_indices():
    g, b = _graph(("x", (10, 4)))
    y = b.gather("x", [1, 1, 3], axis=0)
    assert _work(g, [y]) == KernelWork(bytes_read=2 * 4 * 4 + 3 * 8, bytes_written=3 * 4 * 4, vector_flops=0,
                                       matrix_flops=0)


def test_concat_and_transpose_move_every_element():
    g, b = _graph(("x", (2, 3)), ("y", (2, 5)))
    z = b.transpose(b.concat(["x", "y"], axis=1), (1, 0))
    assert _work(g, [z]) == KernelWork(bytes_read=64, bytes_written=64, vector_flops=0, matrix_flops=0)


def test_matmul_counts_matrix_flops():
    g, b = _graph(("a", (2, 3, 4)))
    w = b.const(np.ones((4, 5), dtype=np.float32))
    y = b.emit(Op.MATMUL, "a", w)
    r = b.emit(Op.RELU, y)
    # the ReLU loop reads the product and writes the output: 30 floats each (loop_bytes, charged on CPUs)
    assert _work(g, [r]) == KernelWork(bytes_read=(24 + 20) * 4, bytes_written=30 * 4,
                                       vector_flops=30, matrix_flops=2 * 2 * 3 * 5 * 4, loop_bytes=2 * 30 * 4)


def test_reduce_of_n_to_m_needs_n_minus_m_operations():
    g, b = _graph(("x", (4, 8)))
    y = b.reduce(Op.REDUCE_SUM, "x", (1,))
    assert _work(g, [y]) == KernelWork(bytes_read=128, bytes_written=16, vector_flops=28, matrix_flops=0)


def test_neg_and_abs_are_free_modifiers():
    g, b = _graph(("x", (4, 8)))
    y = b.add(b.emit(Op.NEG, b.emit(Op.ABS, "x")), "x")
    assert _work(g, [y]).vector_flops == 32


def _conv(b, x, w_shape, stride, pad):
    w = b.const(np.ones(w_shape, dtype=np.float32))
    k = len(w_shape) - 2
    return b.emit(Op.CONV, x, w, strides=(stride,) * k, pads=(pad,) * 2 * k, dilations=(1,) * k, group=1)


def test_conv_counts_fast_algorithm_floor_where_the_device_has_one():
    g, b = _graph(("x", (1, 2, 6, 6)))
    y = _conv(b, "x", (3, 2, 3, 3), stride=1, pad=1)
    direct = 2 * (3 * 6 * 6) * (2 * 3 * 3)
    work = _work(g, [y])
    assert work.matrix_flops == direct // 9  # stride 1: one multiply-add per output and input channel
    assert work.bytes_read == (72 + 54) * 4 and work.bytes_written == 108 * 4
    assert _work(g, [y], fast_convolution=False).matrix_flops == direct
    assert get_device("h100").fast_convolution and not _cpu_of_record().fast_convolution


def test_strided_conv_keeps_its_stride_phases():
    g, b = _graph(("x", (1, 1, 8, 8)))
    y = _conv(b, "x", (1, 1, 3, 3), stride=2, pad=0)  # out 3x3; 2 phases per axis of a 3-tap kernel
    assert _work(g, [y]).matrix_flops == 2 * 9 * 9 // 9 * 4


def test_strided_1x1_conv_reads_only_the_pixels_it_samples():
    g, b = _graph(("x", (1, 2, 4, 4)))
    y = _conv(b, "x", (3, 2, 1, 1), stride=2, pad=0)
    assert _work(g, [y]).bytes_read == (2 * 2 * 2 + 6) * 4


def test_a_kernel_that_writes_nothing_costs_nothing():
    g, b = _graph(("x", (4, 8)))
    b.emit(Op.EXP, "x")
    assert _work(g, []) == KernelWork(0, 0, 0, 0)


def test_opaque_node_is_charged_its_writes_only():
    g, b = _graph(("x", (4, 8)))
    (y,) = b.opaque(["x"], [Tensor(name="y", shape=(4, 8), dtype="float32")], {"op_type": "Foo"})
    assert _work(g, [y]) == KernelWork(bytes_read=0, bytes_written=128, vector_flops=0, matrix_flops=0)


def test_lower_bound_formula_and_overlap():
    h100 = get_device("h100")
    big = 1 << 30
    work = KernelWork(bytes_read=big, bytes_written=big, vector_flops=10**9, matrix_flops=10**12)
    memory = (2 * big - 2 * h100.cache_bytes) / h100.memory_bandwidth
    compute = max(1e9 / h100.vector_flops, 1e12 / 494.7e12)
    assert lower_bound(h100, work) == pytest.approx(h100.launch_overhead + max(memory, compute))
    small = KernelWork(bytes_read=4096, bytes_written=4096, vector_flops=1024, matrix_flops=0)
    assert lower_bound(h100, small) == pytest.approx(h100.launch_overhead + 8192 / h100.cache_bandwidth)
    assert lower_bound(h100, work, "float16") < lower_bound(h100, work, "float32")


def test_a_cold_kernel_pays_device_memory_for_every_byte():
    h100 = get_device("h100")
    work = KernelWork(bytes_read=1 << 20, bytes_written=1 << 20, vector_flops=0, matrix_flops=0)
    cold = lower_bound(h100, work, warm=False)
    assert cold == pytest.approx(h100.launch_overhead + (2 << 20) / h100.memory_bandwidth)
    assert lower_bound(h100, work) < cold


@pytest.mark.parametrize("field", ["bytes_read", "bytes_written", "vector_flops", "matrix_flops"])
@pytest.mark.parametrize("name", ["h100", "a100", "v100"])
def test_lower_bound_is_monotone_in_work(field, name):
    device = get_device(name)
    base = KernelWork(bytes_read=1 << 26, bytes_written=1 << 26, vector_flops=1 << 28, matrix_flops=1 << 34)
    bounds = [lower_bound(device, dataclasses.replace(base, **{field: getattr(base, field) * k})) for k in (0, 1, 4, 64)]
    assert bounds == sorted(bounds) and bounds[0] >= device.launch_overhead


def test_candidate_bounds_follow_the_candidates():
    g, b = _graph(("x", (64, 64)))
    y = b.emit(Op.EXP, "x")
    z = b.add(y, "x")
    small = SimpleNamespace(nodes=frozenset({0}), inputs=("x",), outputs=(y,))
    both = SimpleNamespace(nodes=frozenset({0, 1}), inputs=("x",), outputs=(z,))
    h100 = get_device("h100")
    assert candidate_bounds(g, [small, both], h100) == [
        lower_bound(h100, kernel_work(g, c.nodes, c.inputs, c.outputs)) for c in (small, both)]


@pytest.fixture(scope="module")
def cpu(tmp_path_factory):
    """The host probed for real into a fresh cache: the device, and the record it was built from (read back)."""
    probe._record_at.cache_clear()
    cache = tmp_path_factory.mktemp("korch-cache")
    try:
        with config.patch(cache_dir=cache), pytest.MonkeyPatch.context() as patch:
            patch.delenv(probe.RECORD_ENV, raising=False)  # the probe itself, not the tests' fixed record
            device = get_device("cpu")
        (path,) = (cache / "devices").glob("cpu-*.json")
    finally:
        probe._record_at.cache_clear()
    return device, json.loads(path.read_text())


def test_cpu_probe_is_positive_and_builds_the_device_from_its_record(cpu):
    device, record = cpu
    measured = record["measured"]
    assert all(0 < measured[k] < math.inf for k in probe._MEASURED_KEYS), measured
    assert device == devices.cpu_device_from(record)  # the device is exactly its cached record, with headroom
    assert device.memory_bandwidth == measured["memory_bandwidth"] * devices.BANDWIDTH_HEADROOM
    assert device.launch_overhead == 0 and not device.fast_convolution
    assert device.matrix_flops["float32"] >= measured["matmul_flops"] * devices.FLOPS_HEADROOM > 0
    assert device.vector_flops >= device.matrix_flops["float32"]
    assert device.cache_bytes == record["cache_bytes"] == probe.cache_bytes() > 0
    assert device.cache_bandwidth == max(measured["cache_bandwidth"] * devices.BANDWIDTH_HEADROOM,
                                         device.memory_bandwidth) < math.inf


def test_cpu_bound_of_a_large_add_is_below_the_probes_own_streaming_time(cpu):
    """The bound charges the bytes past the cache at twice the probe's best bandwidth: below the time the
    probe itself took to stream as many bytes. (How it compares with a timed add is a benchmark's claim.)"""
    device, record = cpu
    n = (64 << 20) // 4
    g, b = _graph(("x", (n,)), ("y", (n,)))
    z = b.add("x", "y")
    work = _work(g, [z])
    assert (work.bytes_read, work.bytes_written, work.vector_flops) == (8 * n, 4 * n, n)
    spill = max(0, 8 * n - device.cache_bytes) + max(0, 4 * n - device.cache_bytes)
    bound = lower_bound(device, work)
    # every byte through the cache, the bytes past it through memory, the adds at the vector peak: whichever the
    # probed host makes the largest (a noisy host can measure its cache slower than its memory)
    floors = (12 * n / device.cache_bandwidth, spill / device.memory_bandwidth, n / device.vector_peak("float32"))
    assert bound == pytest.approx(device.launch_overhead + max(floors))
    assert bound < device.launch_overhead + 12 * n / record["measured"]["memory_bandwidth"]


def test_cpu_bound_of_a_large_add_on_a_known_record(monkeypatch):
    monkeypatch.setattr(probe, "peak_matrix_flops", lambda: 0.0)
    record = {"cpu": "test", "threads": 1, "torch": "x", "cache_bytes": 32 << 20,
              "measured": {"memory_bandwidth": 10e9, "cache_bandwidth": 40e9, "matmul_flops": 50e9, "elementwise_flops": 5e9,
                           "tiny_op_seconds": 2e-6}}
    device = devices.cpu_device_from(record)
    n = (64 << 20) // 4
    g, b = _graph(("x", (n,)), ("y", (n,)))
    z = b.add("x", "y")
    spill = (8 * n - (32 << 20)) + (4 * n - (32 << 20))  # 256 MiB read + 256 MiB written, 32 MiB of each cached
    assert lower_bound(device, _work(g, [z])) == pytest.approx(spill / 20e9)


def _cpu_of_record():
    """The CPU of a probe record that measured 10 GB/s from memory, 40 GB/s through a 32 MiB cache."""
    record = {"cpu": "test", "threads": 1, "torch": "x", "cache_bytes": 32 << 20,
              "measured": {"memory_bandwidth": 10e9, "cache_bandwidth": 40e9, "matmul_flops": 50e9,
                           "elementwise_flops": 5e9, "tiny_op_seconds": 2e-6}}
    return devices.cpu_device_from(record)


def _cpu(monkeypatch):
    monkeypatch.setattr(probe, "peak_matrix_flops", lambda: 0.0)
    return _cpu_of_record()


def test_cpu_bytes_within_the_cache_are_charged_at_the_cache_bandwidth(monkeypatch):
    """A kernel whose tensors all fit the cache still moves them: 12 MiB at twice the probe's 40 GB/s."""
    device = _cpu(monkeypatch)
    n = (4 << 20) // 4
    g, b = _graph(("x", (n,)), ("y", (n,)))
    z = b.add("x", "y")
    assert lower_bound(device, _work(g, [z])) == pytest.approx(12 * n / 80e9)


def test_window_axis_counts_match_brute_force():
    import random

    from korch.ir.shapes import window_output_size

    rnd = random.Random(0)
    for _ in range(500):
        n, k, s, d = rnd.randint(1, 12), rnd.randint(1, 5), rnd.randint(1, 4), rnd.randint(1, 3)
        begin, end = rnd.randint(0, k), rnd.randint(0, k)
        out = window_output_size(n, k, s, begin, end, d)
        if out > 0:
            reads = {(o * s + j * d - begin, j) for o in range(out) for j in range(k) if 0 <= o * s + j * d - begin < n}
            assert roofline._window_axis(n, out, k, s, d, begin) == (len({p for p, _ in reads}),
                                                                     len({j for _, j in reads}))
        out = s * (n - 1) + d * (k - 1) + 1 - begin - end
        if out > 0:
            writes = {(p, j) for p in range(n) for j in range(k) if 0 <= p * s + j * d - begin < out}
            assert roofline._transpose_axis(n, out, k, s, d, begin) == (len({p for p, _ in writes}),
                                                                        len({j for _, j in writes}))


def test_a_kernel_of_views_alone_moves_nothing_and_a_copy_does():
    """Reshapes, transposes, broadcasts and forward slices may be returned as views of their input (the library
    backend measured 0.8 us in place for a 786 KB reshape, under a bytes-through-the-cache floor of 4.5 us, and
    returns Segformer-B0's transposes as views, 1.5 us against an 11.6 us floor that charged a copy): a kernel
    of them alone has no work. A reversing slice, or a view with arithmetic, still moves its bytes."""
    g, b = _graph(("x", (128, 768)))
    t = b.transpose("x", (1, 0))
    views = [b.reshape("x", (1, 128, 12, 64)), t, b.reshape(t, (768, 2, 64)),
             b.emit(Op.BROADCAST, "x", shape=(3, 128, 768)),
             b.emit(Op.SLICE, "x", starts=(0, 1), steps=(1, 2), shape=(128, 384))]
    for view in views:
        producers = [i for i, n in enumerate(g.nodes) if n.output in (view, t)]
        assert _work(g, [view], producers) == KernelWork(0, 0, 0, 0)
    reversed_ = b.emit(Op.SLICE, "x", starts=(127, 0), steps=(-1, 1), shape=(128, 768))
    assert _work(g, [reversed_], [len(g.nodes) - 1]).bytes_written == 128 * 768 * 4
    doubled = b.mul(t, b.const(np.float32(2.0)))
    assert _work(g, [doubled], [1, len(g.nodes) - 1]).bytes_written == 128 * 768 * 4


def _gelu_after_product(split: bool):
    """x @ w then exact GELU; ``split``: the kernel ends at GELU's two factors, 0.5 y and erf(y / sqrt 2)."""
    g, b = _graph(("x", (64, 256)))
    y = b.emit(Op.MATMUL, "x", b.const(np.ones((256, 1024), dtype=np.float32)))
    half = b.mul(y, b.const(np.float32(0.5)))
    erf = b.emit(Op.ERF, b.mul(y, b.const(np.float32(0.7071))))
    if split:
        return g, [half, erf]
    return g, [b.mul(half, b.add(erf, b.const(np.float32(1.0))))]


def test_on_a_cpu_loops_around_a_product_add_to_its_compute_time(monkeypatch):
    """A CPU runs a product as a library call and the loops around it after it: their floor adds to the
    product's compute time; a GPU's kernel overlaps them. Ending a kernel at two factors of GELU writes one
    tensor more than ending it at GELU, and on a CPU costs more."""
    device, h100 = _cpu(monkeypatch), get_device("h100")
    g, outputs = _gelu_after_product(split=False)
    work = _work(g, outputs)
    assert work.loop_bytes == 2 * 64 * 1024 * 4 + 3 * 4  # the product read once, GELU written once, 3 scalars
    loops = max(work.vector_flops / device.vector_peak(), work.loop_bytes / device.cache_bandwidth)
    assert lower_bound(device, work) >= device.launch_overhead + work.matrix_flops / device.matrix_peak() + loops
    no_loops = dataclasses.replace(work, loop_bytes=0)
    assert lower_bound(h100, work) == lower_bound(h100, no_loops)
    split_g, split_outputs = _gelu_after_product(split=True)
    assert lower_bound(device, _work(split_g, split_outputs)) > lower_bound(device, work)


def test_a_product_seen_through_a_reshape_is_the_product():
    """A reshape between a product and a loop is a view: the loop still touches the product once, and a
    kernel of a product and reshapes alone has no loops."""
    g, b = _graph(("x", (4, 8)))
    y = b.emit(Op.MATMUL, "x", b.const(np.ones((8, 6), dtype=np.float32)))
    view = b.emit(Op.RESHAPE, y, shape=(2, 2, 6))
    assert _work(g, [view]).loop_bytes == 0
    r = b.emit(Op.RELU, view)
    assert _work(g, [r]).loop_bytes == 2 * 24 * 4


def test_a_cpu_convolution_pays_for_the_loops_before_it_not_those_after_it(monkeypatch):
    """oneDNN applies a convolution's bias, activation and sums inside its call (post-ops); nothing fuses a
    loop into a convolution's input on a CPU, so a SiLU before it is written and read back. YOLOX-Nano's
    roofline plan had put a SiLU before a convolution in 67 of its 128 kernels, where the floors were blind."""
    device, h100 = _cpu(monkeypatch), get_device("h100")
    g, b = _graph(("x", (1, 8, 16, 16)))
    first = _conv(b, "x", (8, 8, 3, 3), stride=1, pad=1)
    silu = b.emit(Op.MUL, first, b.emit(Op.SIGMOID, first))
    second = _conv(b, silu, (8, 8, 3, 3), stride=1, pad=1)
    conv1, sigmoid, mul, conv2 = range(4)
    before = _work(g, [second], nodes=[sigmoid, mul, conv2])   # SiLU, then the convolution: a prologue
    after = _work(g, [silu], nodes=[conv1, sigmoid, mul])      # the convolution, then its SiLU: post-ops
    image = 8 * 16 * 16 * 4
    assert after.loop_bytes == 0
    assert before.loop_bytes == image + image  # the SiLU reads the first convolution's result, writes its own
    loops = max(before.vector_flops / device.vector_peak(), before.loop_bytes / device.cache_bandwidth)
    assert lower_bound(device, before) >= device.launch_overhead + before.matrix_flops / device.matrix_peak() + loops
    assert lower_bound(device, before) > lower_bound(device, after)
    assert lower_bound(h100, before) == lower_bound(h100, dataclasses.replace(before, loop_bytes=0))  # Triton fuses


def test_probe_times_every_product_path_korch_calls_and_each_computes_the_product():
    import torch

    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(64, 48, generator=gen), torch.randn(48, 32, generator=gen)
    paths = probe.matmul_paths(a, b)
    # the packed oneDNN product is the fast path on AMD CPUs, where ATen's matmul runs MKL's generic code
    assert set(paths) == ({"matmul", "oneDNN packed"} if torch.backends.mkldnn.is_available() else {"matmul"})
    for name, product in paths.items():
        torch.testing.assert_close(product(), a @ b, rtol=1e-4, atol=1e-4, msg=name)
