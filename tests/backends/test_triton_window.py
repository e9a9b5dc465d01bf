"""The window Triton class in the interpreter: max and average pools with pads, strides, dilation, fused work."""

import pytest
from onnx import helper

from korch.backends.triton.launch import TritonKernel
from korch.backends.triton.window import WINDOW
from korch.ir.ops import Op
from tests.backends.kernels import check_built, kernel
from tests.backends.triton_graphs import build


def _pool(op, x_shape, y_shape, before=True, after=True, **attrs):
    nodes = [helper.make_node("Relu", ["x"], ["r"])] if before else []
    nodes.append(helper.make_node(op, ["r" if before else "x"], ["p" if after else "y"], **attrs))
    if after:
        nodes.append(helper.make_node("Add", ["p", "b"], ["y"]))
    return kernel(nodes, {"x": x_shape, "b": (y_shape[1], 1, 1)} if after else {"x": x_shape}, {"y": y_shape})


CASES = {
    "max_pool_pads_strides_relu_add": lambda: _pool(
        "MaxPool", (1, 2, 7, 8), (1, 2, 4, 4), kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
    "max_pool_dilation": lambda: _pool(
        "MaxPool", (2, 2, 7, 6), (2, 2, 6, 4), before=False, kernel_shape=[2, 3], dilations=[2, 2], pads=[1, 1, 1, 1]),
    "avg_pool_count_include_pad": lambda: _pool(
        "AveragePool", (2, 3, 6, 7), (2, 3, 6, 4), kernel_shape=[3, 2], strides=[1, 2], pads=[1, 0, 1, 1],
        count_include_pad=1),
    "avg_pool_exclude_pad": lambda: _pool(
        "AveragePool", (2, 3, 6, 7), (2, 3, 6, 4), kernel_shape=[3, 2], strides=[1, 2], pads=[1, 0, 1, 1],
        count_include_pad=0),
    "avg_pool_dilation_no_pad": lambda: _pool(
        "AveragePool", (1, 2, 9, 9), (1, 2, 3, 3), after=False, kernel_shape=[3, 3], strides=[3, 3], dilations=[1, 1]),
    "max_pool_1d": lambda: build(
        {"x": ((2, 3, 11), "float32")},
        [(Op.MAX_POOL, ["x"], "y", {"kernel": (3,), "strides": (2,), "pads": (1, 1), "dilations": (1,)})], ["y"]),
    "avg_pool_3d_with_relu": lambda: build(
        {"x": ((1, 2, 4, 5, 3), "float32")},
        [(Op.AVG_POOL, ["x"], "p", {"kernel": (2, 2, 2), "strides": (1, 2, 1), "pads": (0, 1, 0, 1, 0, 1),
                                     "dilations": (1, 1, 1), "count_include_pad": 0}),
         (Op.RELU, ["p"], "y", {})], ["y", "p"]),
}


@pytest.mark.parametrize("name", CASES)
def test_window_kernel_matches_reference(name):
    graph = CASES[name]()
    assert WINDOW.claims(graph) is None
    check_built(TritonKernel(graph, WINDOW.generate(graph), "cpu"), graph)


def test_window_loads_each_window_position_once_per_output():
    source = WINDOW.generate(CASES["max_pool_pads_strides_relu_add"]()).source
    assert source.count("tl.load(in0") == 9 and source.count("tl.maximum(t") == 9  # relu per position


def test_window_refusals():
    no_pool = kernel([helper.make_node("Relu", ["x"], ["y"])], {"x": (3,)}, {"y": (3,)})
    assert WINDOW.claims(no_pool) == "no window op"
    huge = build({"x": ((1, 1, 12, 12), "float32")},
                 [(Op.MAX_POOL, ["x"], "y", {"kernel": (9, 9), "strides": (1, 1), "pads": (0, 0, 0, 0),
                                             "dilations": (1, 1)})], ["y"])
    assert WINDOW.claims(huge) == "pool window too large"
