"""Reduction rules against ONNX Runtime: axes as attribute and as input, negative and empty axes,
keepdims, noop_with_empty_axes, integer inputs, and the max subtraction of ReduceLogSumExp."""

from __future__ import annotations


import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from korch.ir.ops import Op
from korch.ir import interpret
from tests.fission.oracle import check_against_ort, lower as _lower

REDUCTIONS = ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
              "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare"]


def _axes_input_opset(op: str) -> int:
    return 13 if op == "ReduceSum" else 18


def _model(op: str, x: np.ndarray, opset: int, axes=None, axes_as_input=False, **attrs):
    inputs, initializers = ["x"], []
    if axes_as_input:
        inputs.append("axes" if axes is not None else "")
        if axes is not None:
            initializers.append(numpy_helper.from_array(np.asarray(axes, dtype=np.int64), "axes"))
    elif axes is not None:
        attrs["axes"] = list(axes)
    node = helper.make_node(op, inputs, ["y"], **attrs)
    elem = helper.np_dtype_to_tensor_dtype(x.dtype)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", elem, list(x.shape))],
                              [helper.make_tensor_value_info("y", elem, None)], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def _check(model: onnx.ModelProto, x: np.ndarray, rtol=1e-4, atol=1e-5):
    return check_against_ort(model, {"x": x}, rtol, atol)


def _positive_input(op: str, shape=(3, 5, 7), dtype=np.float32) -> np.ndarray:
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape).astype(dtype)
    if op in ("ReduceLogSum", "ReduceProd"):  # log needs a positive sum; keep products tame
        x = (np.abs(x) * 0.5 + 0.5).astype(dtype)
    return x


@pytest.mark.parametrize("op", REDUCTIONS)
@pytest.mark.parametrize("axes,keepdims", [((-1,), 0), ((0, -1), 1), (None, 1), (None, 0), ((1,), 1)])
def test_axes_attribute(op, axes, keepdims):
    x = _positive_input(op)
    _check(_model(op, x, 11, axes, keepdims=keepdims), x)


@pytest.mark.parametrize("op", REDUCTIONS)
@pytest.mark.parametrize("axes,keepdims,noop", [((-2,), 0, 0), ((2, 0), 1, 0), (None, 0, 0), ([], 1, 0),
                                                (None, 1, 1), ([], 0, 1)])
def test_axes_input(op, axes, keepdims, noop):
    x = _positive_input(op)
    _check(_model(op, x, _axes_input_opset(op), axes, axes_as_input=True, keepdims=keepdims,
                  noop_with_empty_axes=noop), x)


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMax", "ReduceProd", "ReduceL1", "ReduceSumSquare"])
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_integer_inputs(op, dtype):
    x = np.random.default_rng(1).integers(-4, 5, size=(4, 3, 2)).astype(dtype)
    _check(_model(op, x, _axes_input_opset(op), (1,), axes_as_input=True, keepdims=0), x)


def test_reduce_l2_of_integers_rounds_toward_zero():
    x = np.random.default_rng(2).integers(-9, 10, size=(5, 6)).astype(np.int64)
    _check(_model("ReduceL2", x, 18, (1,), axes_as_input=True), x)


def test_log_sum_exp_is_safe_for_large_inputs():
    x = _positive_input("ReduceLogSumExp") * 200.0
    x[0, :, 0] = -np.inf  # a slice with no finite value
    graph = _check(_model("ReduceLogSumExp", x, 18, (1,), axes_as_input=True, keepdims=0), x)
    ops = [n.op for n in graph.nodes]
    assert ops.index(Op.REDUCE_MAX) < ops.index(Op.EXP)


def test_reduce_is_one_primitive():
    x = _positive_input("ReduceMean")
    graph = _lower(_model("ReduceMean", x, 18, (-1,), axes_as_input=True, keepdims=1))
    assert [n.op for n in graph.nodes] == [Op.REDUCE_MEAN]
    assert graph.nodes[0].attrs["axes"] == (2,)


def test_reduce_over_an_empty_axis_gives_the_identity():
    x = np.zeros((2, 0, 3), dtype=np.float32)
    for op, want in [("ReduceSum", 0.0), ("ReduceProd", 1.0), ("ReduceMax", -np.inf), ("ReduceL2", 0.0),
                     ("ReduceLogSumExp", -np.inf)]:
        graph = _lower(_model(op, x, _axes_input_opset(op), (1,), axes_as_input=True, keepdims=0))
        got = interpret.run(graph, {"x": x})["y"]
        np.testing.assert_array_equal(got, np.full((2, 3), want, dtype=np.float32))


def test_scalar_input():
    x = np.array(-2.5, dtype=np.float32)
    for op in ("ReduceSum", "ReduceL1", "ReduceSumSquare", "ReduceLogSumExp"):
        _check(_model(op, x, _axes_input_opset(op), keepdims=1, axes_as_input=True), x)
