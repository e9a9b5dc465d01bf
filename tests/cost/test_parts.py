"""Floors from products and convolutions timed alone (``cost/parts.py``): which columns are parts, which times
count, and what a kernel holding one is bounded by."""

import dataclasses
import math
from types import SimpleNamespace

import numpy as np
import pytest

from korch.cost import candidate_bounds, get_device, kernel_work, lower_bound, part_columns, part_times
from korch.cost.parts import PART_SHARE, part_floor_s
from korch.fission.builder import Builder
from korch.ir import Graph, Op, Tensor


def _conv_relu_slice():
    """x -> 1x1 conv (0) -> relu (1) -> the first 4 of 8 channels (2); a second conv (3) on x beside it."""
    g = Graph(name="t")
    g.add_tensor(Tensor(name="x", shape=(1, 8, 16, 16), dtype="float32"))
    g.inputs.append("x")
    b = Builder(g, "n")
    w = b.const(np.ones((8, 8, 1, 1), dtype=np.float32))
    conv = b.emit(Op.CONV, "x", w, strides=(1, 1), pads=(0,) * 4, dilations=(1, 1), group=1)
    relu = b.emit(Op.RELU, conv)
    half = b.slice_axis(relu, 1, 0, 4)
    other = b.emit(Op.CONV, "x", w, strides=(1, 1), pads=(0,) * 4, dilations=(1, 1), group=1)
    return g, conv, relu, half, other


def _kernel(g, nodes, outputs):
    made = {o for i in nodes for o in g.nodes[i].outputs}
    inputs = [x for i in sorted(nodes) for x in g.nodes[i].inputs if x not in made]
    return SimpleNamespace(nodes=frozenset(nodes), inputs=tuple(dict.fromkeys(inputs)), outputs=tuple(outputs))


def test_part_columns_are_the_products_and_convolutions_alone_in_every_layout():
    g, conv, relu, _, other = _conv_relu_slice()
    candidates = [_kernel(g, {0}, [conv]), _kernel(g, {1}, [relu]), _kernel(g, {0, 1}, [relu]),
                  _kernel(g, {0}, [conv]),  # the conv's channels-last column: the same nodes
                  _kernel(g, {3}, [other])]
    assert part_columns(g, candidates) == {0: [0, 3], 3: [4]}


def test_a_part_counts_only_where_every_column_was_measured_and_built():
    columns = {0: [0, 3], 3: [4], 5: [6]}
    times = part_times(columns, {0: 2e-3, 3: 1e-3, 4: 5e-3, 6: math.inf})
    assert times == {0: 1e-3, 3: 5e-3}  # the least column; node 5 failed alone: no floor from it
    assert part_times({0: [0, 3]}, {0: 2e-3}) == {}  # one column unmeasured


def test_a_kernel_holding_a_part_takes_most_of_its_time_alone_or_its_share_of_it():
    g, conv, relu, half, other = _conv_relu_slice()
    device = dataclasses.replace(get_device("h100"), launch_overhead=0.0)  # the bound's terms alone
    alone = {0: 1e-3, 3: 4e-3}
    fused = _kernel(g, {0, 1}, [relu])
    sliced = _kernel(g, {0, 1, 2}, [half])
    loops = _kernel(g, {1}, [relu])
    plain, with_parts = (candidate_bounds(g, [fused, sliced, loops], device, parts=p) for p in (None, alone))
    assert with_parts[0] == pytest.approx(max(plain[0], PART_SHARE * 1e-3))
    assert with_parts[0] > plain[0]  # a microsecond of a tiny conv is far above its roofline
    assert with_parts[1] == pytest.approx(max(plain[1], PART_SHARE * 1e-3 / 2))  # half the channels needed
    assert with_parts[2] == plain[2]  # no part in it
    both = _kernel(g, {0, 1, 3}, [relu, other])
    work = kernel_work(g, both.nodes, both.inputs, both.outputs, parts=alone)
    assert work.part_s == pytest.approx(part_floor_s(4e-3))  # the largest part, not the sum
    assert lower_bound(device, work) >= part_floor_s(4e-3)


def test_on_a_cpu_the_loops_before_a_product_add_to_its_part(monkeypatch):
    """A CPU runs a product as a library call and the loops feeding it before: the measured part replaces the
    product's FLOPs at the peak in that sum."""
    from korch.cost import probe
    from korch.cost.devices import cpu_device_from

    monkeypatch.setattr(probe, "peak_matrix_flops", lambda: 0.0)
    cpu = cpu_device_from({"cpu": "test", "threads": 1, "torch": "x", "cache_bytes": 32 << 20,
                           "measured": {"memory_bandwidth": 10e9, "cache_bandwidth": 40e9, "matmul_flops": 50e9,
                                        "elementwise_flops": 5e9, "tiny_op_seconds": 2e-6}})
    g = Graph(name="t")
    g.add_tensor(Tensor(name="a", shape=(64, 64), dtype="float32"))
    g.inputs.append("a")
    b = Builder(g, "n")
    product = b.emit(Op.MATMUL, b.emit(Op.EXP, "a"), b.const(np.ones((64, 64), dtype=np.float32)))
    kernel = _kernel(g, {0, 1}, [product])
    work = kernel_work(g, kernel.nodes, kernel.inputs, kernel.outputs, parts={1: 1e-3})
    assert work.loop_bytes > 0
    loops = max(work.vector_flops / cpu.vector_peak(), work.loop_bytes / cpu.cache_bandwidth)
    assert lower_bound(cpu, work) == pytest.approx(part_floor_s(1e-3) + loops)


def test_a_grouped_convolution_is_not_a_part():
    """A depthwise convolution's time is mostly traffic, which a kernel fusing it may save: no floor from it."""
    g = Graph(name="t")
    g.add_tensor(Tensor(name="x", shape=(1, 8, 16, 16), dtype="float32"))
    g.inputs.append("x")
    b = Builder(g, "n")
    depthwise = b.emit(Op.CONV, "x", b.const(np.ones((8, 1, 3, 3), dtype=np.float32)), strides=(1, 1),
                       pads=(1,) * 4, dilations=(1, 1), group=8)
    dense = b.emit(Op.CONV, depthwise, b.const(np.ones((8, 8, 1, 1), dtype=np.float32)), strides=(1, 1),
                   pads=(0,) * 4, dilations=(1, 1), group=1)
    assert part_columns(g, [_kernel(g, {0}, [depthwise]), _kernel(g, {1}, [dense])]) == {1: [1]}
