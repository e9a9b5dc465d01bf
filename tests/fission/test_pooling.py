"""Pooling rules against ONNX Runtime: MaxPool, AveragePool and LpPool over 1-3 spatial axes with pads,
strides, dilations, ceil_mode (last windows that overhang, or would start in the padding), count_include_pad
and auto_pad; the global pools; and the primitive sequences (one window primitive; a PAD only where a
count_include_pad average has a ceil_mode overhang)."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from onnx import helper

from korch.fission import OpaqueOperatorWarning, fission
from korch.fission.linear import explicit_pads
from korch.fission.pooling import SEPARABLE_MAX_POOL
from korch.frontend import load_onnx
from korch.ir.ops import Op
from korch.ir import interpret, ort


def _model(op: str, shape, opset: int, dtype=np.float32, outputs=("y",), **attrs):
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    node = helper.make_node(op, ["x"], list(outputs), **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", elem, list(shape))],
                              [helper.make_tensor_value_info(o, elem if o == "y" else 7, None) for o in outputs])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def _input(shape, dtype=np.float32) -> np.ndarray:
    rng = np.random.default_rng(0)
    if np.dtype(dtype).kind in "iu":
        return rng.integers(0, 100, shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def _check(op: str, shape, opset=19, dtype=np.float32, oracle_attrs=None, **attrs):
    """Fission a one-node model, run it, compare with ORT (on ``oracle_attrs`` if given); returns the graph."""
    x = _input(shape, dtype)
    model = _model(op, shape, opset, dtype, **attrs)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an opaque fallback would hide a missing rule
        graph = fission(load_onnx(model))
    got = interpret.run(graph, {"x": x})["y"]
    oracle = model if oracle_attrs is None else _model(op, shape, opset, dtype, **oracle_attrs)
    want = ort.run_model(oracle, {"x": x})["y"]
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    return graph


def _ops(graph) -> list[Op]:
    return [n.op for n in graph.nodes]


# (input shape, attributes): 1-D to 3-D, strides 3 (ceil_mode overhangs of 2), dilations, asymmetric pads
WINDOWS = [
    ((1, 2, 11), {"kernel_shape": [3], "strides": [3]}),
    ((2, 3, 10), {"kernel_shape": [4], "strides": [3], "pads": [1, 2]}),
    ((1, 2, 9, 8), {"kernel_shape": [3, 2], "strides": [2, 3], "pads": [1, 0, 2, 1]}),
    ((1, 2, 9, 8), {"kernel_shape": [2, 3], "strides": [3, 1], "dilations": [2, 2], "pads": [1, 1, 0, 1]}),
    ((1, 1, 2, 2), {"kernel_shape": [3, 3], "strides": [3, 3], "pads": [1, 1, 1, 1]}),  # last window on the pad
    ((1, 2, 5, 7, 6), {"kernel_shape": [2, 3, 2], "strides": [2, 3, 3], "pads": [0, 1, 1, 1, 0, 1]}),
    ((1, 1, 12, 12, 12), {"kernel_shape": [3, 3, 3], "strides": [3, 3, 3], "dilations": [2, 2, 2]}),
]


@pytest.mark.parametrize("shape,attrs", WINDOWS)
@pytest.mark.parametrize("ceil_mode", [0, 1])
def test_max_pool(shape, attrs, ceil_mode):
    kernel = attrs["kernel_shape"]
    separable = math.prod(kernel) >= SEPARABLE_MAX_POOL * sum(kernel)  # the 3x3x3 window
    pools = _ops(_check("MaxPool", shape, 12, ceil_mode=ceil_mode, **attrs))
    assert pools == [Op.MAX_POOL] * (len(kernel) if separable else 1)


# large windows: SPP's stride-1 pools, strides with ceil_mode overhangs, dilations, asymmetric pads, 3-D
LARGE_WINDOWS = [
    ((1, 3, 13, 13), {"kernel_shape": [13, 13], "pads": [6, 6, 6, 6]}),
    ((1, 2, 20, 17), {"kernel_shape": [5, 4], "strides": [2, 3], "pads": [2, 0, 1, 3]}),
    ((2, 2, 19, 21), {"kernel_shape": [4, 5], "strides": [3, 2], "dilations": [2, 1], "pads": [3, 1, 0, 2]}),
    ((1, 1, 9, 10, 11), {"kernel_shape": [4, 3, 5], "strides": [1, 2, 3], "pads": [1, 0, 2, 2, 1, 0]}),
]


@pytest.mark.parametrize("shape,attrs", LARGE_WINDOWS)
@pytest.mark.parametrize("ceil_mode", [0, 1])
def test_large_max_pool_is_one_pool_per_axis(shape, attrs, ceil_mode):
    graph = _check("MaxPool", shape, 12, ceil_mode=ceil_mode, **attrs)
    k = len(attrs["kernel_shape"])
    assert _ops(graph) == [Op.MAX_POOL] * k
    for axis, node in enumerate(graph.nodes):  # each pool's window spans one axis, in order
        assert [i for i, size in enumerate(node.attrs["kernel"]) if size > 1] == [axis]
        assert all(p == 0 for i, p in enumerate(node.attrs["pads"]) if i % k != axis)


@pytest.mark.parametrize("shape,attrs", WINDOWS)
@pytest.mark.parametrize("ceil_mode", [0, 1])
@pytest.mark.parametrize("count_include_pad", [0, 1])
def test_average_pool(shape, attrs, ceil_mode, count_include_pad):
    _check("AveragePool", shape, 19, ceil_mode=ceil_mode, count_include_pad=count_include_pad, **attrs)


@pytest.mark.parametrize("shape,attrs", WINDOWS)
@pytest.mark.parametrize("ceil_mode", [0, 1])
@pytest.mark.parametrize("p", [1, 2, 3])
def test_lp_pool(shape, attrs, ceil_mode, p):
    _check("LpPool", shape, 18, ceil_mode=ceil_mode, p=p, **attrs)


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool", "LpPool"])
@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER", "VALID"])
@pytest.mark.parametrize("size,kernel,stride", [(7, 3, 1), (7, 3, 2), (8, 3, 2), (8, 2, 3), (9, 1, 2), (8, 4, 3)])
@pytest.mark.parametrize("ceil_mode", [0, 1])
def test_auto_pad(op, auto_pad, size, kernel, stride, ceil_mode):
    extra = {"count_include_pad": 1} if op == "AveragePool" else {"p": 2} if op == "LpPool" else {}
    window = {"kernel_shape": [kernel, kernel], "strides": [stride, stride], **extra}
    oracle = None
    if op == "MaxPool" and auto_pad != "VALID" and kernel == 1:
        # ORT rejects the negative SAME padding it computes here; no padding is what Conv does in ORT
        oracle = {"pads": [0, 0, 0, 0], **window}
    _check(op, (1, 2, size, size - 1), 18 if op == "LpPool" else 19, auto_pad=auto_pad, ceil_mode=ceil_mode,
           oracle_attrs=oracle, **window)


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER"])
@pytest.mark.parametrize("stride", [1, 2, 3])
def test_same_pads_with_dilations_follow_the_spec(op, auto_pad, stride):
    # ORT pads SAME windows by the undilated kernel: compare with the explicit pads the spec asks for
    pads = explicit_pads(auto_pad, None, [8], [3], [stride], [2])
    assert sum(pads) == (-(-8 // stride) - 1) * stride + 5 - 8
    _check(op, (1, 2, 8), 19, auto_pad=auto_pad, kernel_shape=[3], strides=[stride], dilations=[2],
           oracle_attrs={"pads": pads, "kernel_shape": [3], "strides": [stride], "dilations": [2]})


def test_max_pool_integers():
    _check("MaxPool", (1, 2, 7, 7), 12, np.uint8, kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2])
    _check("MaxPool", (1, 2, 7, 7), 12, np.int8, kernel_shape=[2, 2], ceil_mode=1, strides=[2, 2])


@pytest.mark.parametrize("opset", [1, 8, 10])
def test_max_pool_older_opsets(opset):
    _check("MaxPool", (1, 2, 7, 6), opset, kernel_shape=[3, 2], pads=[1, 0, 1, 1], strides=[2, 1])


@pytest.mark.parametrize("opset,extra", [(7, {}), (7, {"count_include_pad": 1}), (10, {"ceil_mode": 1})])
def test_average_pool_older_opsets(opset, extra):
    _check("AveragePool", (1, 2, 7, 6), opset, kernel_shape=[3, 2], pads=[1, 0, 1, 1], strides=[2, 3], **extra)


def test_average_pool_overhang_counts_pads_but_not_the_ceil_extra():
    graph = _check("AveragePool", (1, 2, 6, 6), 19, kernel_shape=[3, 3], strides=[3, 3], pads=[1, 1, 1, 1],
                   ceil_mode=1, count_include_pad=1)
    assert _ops(graph) == [Op.PAD, Op.AVG_POOL]
    assert graph.nodes[1].attrs["count_include_pad"] == 0


def test_average_pool_without_overhang_is_one_primitive():
    for attrs in ({"ceil_mode": 1, "count_include_pad": 0}, {"ceil_mode": 0, "count_include_pad": 1}):
        graph = _check("AveragePool", (1, 2, 7, 7), 19, kernel_shape=[3, 3], strides=[3, 3], pads=[1, 1, 1, 1],
                       **attrs)
        assert _ops(graph) == [Op.AVG_POOL]


def test_max_pool_indices_stay_opaque():
    model = _model("MaxPool", (1, 2, 6, 6), 12, outputs=("y", "i"), kernel_shape=[2, 2], strides=[2, 2])
    with pytest.warns(OpaqueOperatorWarning, match="MaxPool"):
        graph = fission(load_onnx(model))
    assert _ops(graph) == [Op.OPAQUE]
    x = _input((1, 2, 6, 6))
    got, want = interpret.run(graph, {"x": x}), ort.run_model(model, {"x": x})
    np.testing.assert_array_equal(got["i"], want["i"])


@pytest.mark.parametrize("shape", [(2, 3, 7), (2, 3, 5, 4), (1, 2, 3, 4, 5)])
def test_global_pools(shape):
    assert _ops(_check("GlobalAveragePool", shape)) == [Op.REDUCE_MEAN]
    assert _ops(_check("GlobalMaxPool", shape)) == [Op.REDUCE_MAX]
    for p in (1, 2, 3):
        _check("GlobalLpPool", shape, p=p)
