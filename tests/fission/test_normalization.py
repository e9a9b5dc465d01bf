"""Softmax and normalization rules against ONNX Runtime: old and new opsets, negative axes,
odd shapes, optional outputs, and the primitive sequences that matter for fusion."""

from __future__ import annotations


import numpy as np
import pytest
from onnx import helper, numpy_helper

from korch.fission import OpaqueOperatorWarning, find_rule, fission
from korch.fission.builder import Builder
from korch.frontend import load_onnx
from korch.ir.graph import Graph, Tensor
from korch.ir.ops import Op
from korch.ir import interpret, ort
from tests.fission.oracle import check_against_ort, lower as _lower


def _model(op: str, inputs: dict[str, np.ndarray], opset: int, outputs=("y",), constants=None, out_types=None,
           **attrs):
    """A one-node model; ``inputs`` are graph inputs, ``constants`` initializers; outputs typed like the
    first input unless ``out_types`` says otherwise."""
    constants = constants or {}
    first = next(iter(inputs.values()))
    out_types = out_types or {}
    names = list(inputs) + list(constants)
    node = helper.make_node(op, names, list(outputs), **attrs)
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), list(v.shape))
         for k, v in inputs.items()],
        [helper.make_tensor_value_info(o, helper.np_dtype_to_tensor_dtype(np.dtype(out_types.get(o, first.dtype))),
                                        None) for o in outputs if o],
        [numpy_helper.from_array(v, k) for k, v in constants.items() if k])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


_check = check_against_ort


def _rand(*shape, seed=0, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def _ops(graph) -> list[Op]:
    return [n.op for n in graph.nodes]


# -- softmax ------------------------------------------------------------------------


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("opset,axis", [(11, 1), (11, -2), (11, 0), (13, 1), (13, -3), (13, 0), (1, 2)])
def test_softmax_axes(op, opset, axis):
    x = _rand(2, 3, 4, 5) * 30  # large logits: only the max subtraction keeps exp finite
    _check(_model(op, {"x": x}, opset, axis=axis), {"x": x})


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
def test_softmax_coerces_to_2d_before_opset_13(op):
    x = _rand(2, 3, 4)
    graph = _check(_model(op, {"x": x}, 11, axis=1), {"x": x})
    assert {n.attrs["axes"] for n in graph.nodes if n.op in (Op.REDUCE_MAX, Op.REDUCE_SUM)} == {(1, 2)}
    graph = _check(_model(op, {"x": x}, 13, axis=1), {"x": x})
    assert {n.attrs["axes"] for n in graph.nodes if n.op in (Op.REDUCE_MAX, Op.REDUCE_SUM)} == {(1,)}


def test_softmax_primitive_sequence():
    x = _rand(4, 7)
    graph = _lower(_model("Softmax", {"x": x}, 13))
    assert _ops(graph) == [Op.REDUCE_MAX, Op.SUB, Op.EXP, Op.REDUCE_SUM, Op.DIV]
    assert all(n.attrs["keepdims"] for n in graph.nodes if n.op in (Op.REDUCE_MAX, Op.REDUCE_SUM))
    graph = _lower(_model("LogSoftmax", {"x": x}, 13))
    assert _ops(graph) == [Op.REDUCE_MAX, Op.SUB, Op.EXP, Op.REDUCE_SUM, Op.LOG, Op.SUB]


# -- layer normalization ---------------------------------------------------------------


@pytest.mark.parametrize("axis", [-1, -2, 1, 0])
def test_layer_normalization_with_statistics_outputs(axis):
    x = _rand(2, 3, 4, 5) * 3 + 1
    normalized = x.shape[axis:]
    constants = {"scale": _rand(*normalized, seed=1), "bias": _rand(*normalized, seed=2)}
    model = _model("LayerNormalization", {"x": x}, 17, outputs=("y", "mean", "inv_std"), constants=constants,
                   axis=axis, epsilon=1e-3)
    _check(model, {"x": x})


def test_layer_normalization_without_bias_and_broadcast_scale():
    x = _rand(3, 1, 7)
    model = _model("LayerNormalization", {"x": x, "scale": _rand(7, seed=1)}, 17)
    graph = _check(model, {"x": x, "scale": _rand(7, seed=1)})
    assert _ops(graph) == [Op.REDUCE_MEAN, Op.SUB, Op.MUL, Op.REDUCE_MEAN, Op.ADD, Op.SQRT, Op.RECIPROCAL,
                           Op.MUL, Op.MUL]


def test_layer_normalization_float16_stashes_in_float32():
    x = _rand(4, 6, dtype=np.float16)
    model = _model("LayerNormalization", {"x": x}, 17, outputs=("y", "mean", "inv_std"),
                   out_types={"mean": np.float32, "inv_std": np.float32},
                   constants={"scale": _rand(6, seed=1, dtype=np.float16), "bias": _rand(6, seed=2, dtype=np.float16)})
    graph = _check(model, {"x": x}, rtol=1e-3, atol=1e-3)
    assert graph.tensors["mean"].dtype == "float32" and graph.tensors["y"].dtype == "float16"


# -- batch normalization ------------------------------------------------------------


def _bn_inputs(c: int):
    rng = np.random.default_rng(3)
    return {"scale": rng.standard_normal(c).astype(np.float32), "B": rng.standard_normal(c).astype(np.float32),
            "mean": rng.standard_normal(c).astype(np.float32),
            "var": rng.uniform(0.5, 2.0, c).astype(np.float32)}


@pytest.mark.parametrize("opset", [9, 14, 15])
@pytest.mark.parametrize("shape", [(2, 3, 5, 7), (2, 3, 4), (4, 3), (1, 3, 2, 3, 2)])
def test_batch_normalization_folds_constant_statistics(opset, shape):
    x = _rand(*shape)
    graph = _check(_model("BatchNormalization", {"x": x}, opset, constants=_bn_inputs(3), epsilon=1e-3), {"x": x})
    assert _ops(graph) == [Op.MUL, Op.ADD]


def test_batch_normalization_float16_input_with_float32_statistics():
    x = _rand(2, 3, 4, 4, dtype=np.float16)
    model = _model("BatchNormalization", {"x": x}, 15, constants=_bn_inputs(3))
    graph = _check(model, {"x": x}, rtol=4e-3, atol=4e-3)  # two float16 roundings (mul, add): ~2 ulp
    assert _ops(graph) == [Op.MUL, Op.ADD] and graph.tensors["y"].dtype == "float16"


def test_batch_normalization_with_runtime_statistics():
    x = _rand(2, 3, 5, 5)
    feeds = {"x": x, **_bn_inputs(3)}
    graph = _check(_model("BatchNormalization", feeds, 15), feeds)
    assert _ops(graph)[-2:] == [Op.MUL, Op.ADD]


def test_batch_normalization_opset_7_per_activation_statistics():
    x = _rand(2, 3, 4)
    stats = {k: np.broadcast_to(v[:, None], (3, 4)) * np.linspace(0.5, 1.5, 4, dtype=np.float32)
             for k, v in _bn_inputs(3).items()}
    want = (x - stats["mean"]) / np.sqrt(stats["var"] + 1e-5) * stats["scale"] + stats["B"]
    graph = _lower(_model("BatchNormalization", {"x": x}, 7, constants=stats, spatial=0))
    np.testing.assert_allclose(interpret.run(graph, {"x": x})["y"], want, rtol=1e-4, atol=1e-5)


def test_batch_normalization_opset_6_needs_is_test():
    x = _rand(2, 3, 4)
    stats = _bn_inputs(3)
    want = (x - stats["mean"][:, None]) / np.sqrt(stats["var"][:, None] + 1e-5) * stats["scale"][:, None] \
        + stats["B"][:, None]
    graph = _lower(_model("BatchNormalization", {"x": x}, 6, constants=stats, is_test=1))
    np.testing.assert_allclose(interpret.run(graph, {"x": x})["y"], want, rtol=1e-4, atol=1e-5)
    with pytest.warns(OpaqueOperatorWarning, match="BatchNormalization"):  # is_test=0 is training
        graph = fission(load_onnx(_model("BatchNormalization", {"x": x}, 6, constants=stats)))
    assert _ops(graph) == [Op.OPAQUE]


def test_batch_normalization_training_mode_stays_opaque():
    x = _rand(2, 3, 4)
    model = _model("BatchNormalization", {"x": x}, 15, outputs=("y", "running_mean", "running_var"),
                   constants=_bn_inputs(3), training_mode=1)
    with pytest.warns(OpaqueOperatorWarning, match="BatchNormalization"):
        graph = fission(load_onnx(model))
    assert _ops(graph) == [Op.OPAQUE]


# -- instance, group ---------------------------------------------------------------


@pytest.mark.parametrize("shape", [(2, 3, 7), (1, 2, 3, 4, 5), (3, 4, 1, 5)])
def test_instance_normalization(shape):
    x = _rand(*shape) * 2 + 3
    c = shape[1]
    model = _model("InstanceNormalization", {"x": x}, 6, constants={"s": _rand(c, seed=1), "B": _rand(c, seed=2)},
                   epsilon=1e-4)
    graph = _check(model, {"x": x})
    assert _ops(graph) == [Op.REDUCE_MEAN, Op.SUB, Op.MUL, Op.REDUCE_MEAN, Op.ADD, Op.SQRT, Op.DIV, Op.MUL, Op.ADD]


@pytest.mark.parametrize("shape,groups", [((2, 6, 5), 3), ((1, 4, 3, 3), 4), ((2, 6, 2, 1, 3), 1)])
def test_group_normalization_21_per_channel(shape, groups):
    x = _rand(*shape) + 2
    c = shape[1]
    model = _model("GroupNormalization", {"x": x}, 21, constants={"scale": _rand(c, seed=1), "bias": _rand(c, seed=2)},
                   num_groups=groups, epsilon=1e-3)
    _check(model, {"x": x})


def test_group_normalization_18_per_group():
    # onnx.checker rejects opset-18 GroupNormalization (deprecated), so the rule is driven directly
    x = _rand(2, 6, 5) + 2
    scale, bias = _rand(3, seed=1), _rand(3, seed=2)
    graph = Graph(name="g", opset=18)
    graph.add_tensor(Tensor(name="x", shape=x.shape, dtype="float32"))
    graph.inputs.append("x")
    graph.add_constant("scale", scale)
    graph.add_constant("bias", bias)
    y = find_rule("GroupNormalization", 18).fn(Builder(graph, "gn"), "x", "scale", "bias", num_groups=3)
    graph.outputs.append(y)
    model = _model("GroupNormalization", {"x": x}, 18, constants={"scale": scale, "bias": bias}, num_groups=3)
    want = ort.run_model(model, {"x": x})["y"]
    np.testing.assert_allclose(interpret.run(graph, {"x": x})[y], want, rtol=1e-4, atol=1e-5)


# -- LRN, MVN, Lp -------------------------------------------------------------------


@pytest.mark.parametrize("size", [1, 3, 5])
def test_lrn(size):
    x = _rand(2, 6, 3, 5)
    graph = _check(_model("LRN", {"x": x}, 13, size=size, alpha=0.3, beta=0.6, bias=1.5), {"x": x})
    assert Op.AVG_POOL in _ops(graph)


@pytest.mark.parametrize("size", [2, 4])
def test_lrn_even_size(size):
    # ONNX Runtime refuses even sizes; the spec's window is [c - floor((size-1)/2), c + ceil((size-1)/2)]
    x = _rand(2, 6, 3, 5)
    graph = _lower(_model("LRN", {"x": x}, 13, size=size, alpha=0.3, beta=0.6, bias=1.5))
    lo, hi = (size - 1) // 2, size - 1 - (size - 1) // 2
    squares = np.pad(x * x, ((0, 0), (lo, hi), (0, 0), (0, 0)))
    window = sum(squares[:, i:i + x.shape[1]] for i in range(size))
    want = x / (1.5 + 0.3 / size * window) ** 0.6
    np.testing.assert_allclose(interpret.run(graph, {"x": x})["y"], want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("shape,axes", [((2, 3, 4, 5), None), ((3, 4, 5), [1]), ((3, 4, 5), [0, -1])])
def test_mean_variance_normalization(shape, axes):
    x = _rand(*shape) * 2 + 1
    attrs = {} if axes is None else {"axes": axes}
    _check(_model("MeanVarianceNormalization", {"x": x}, 13, **attrs), {"x": x}, atol=1e-4)


@pytest.mark.parametrize("p,axis", [(1, 0), (2, -2), (2, -1), (1, 2)])
def test_lp_normalization(p, axis):
    x = _rand(3, 4, 5)
    _check(_model("LpNormalization", {"x": x}, 1, p=p, axis=axis), {"x": x})


def test_lp_normalization_of_a_zero_slice_is_zero():
    x = _rand(3, 4)
    x[1] = 0
    graph = _lower(_model("LpNormalization", {"x": x}, 22, p=2, axis=1))
    got = interpret.run(graph, {"x": x})["y"]
    assert np.all(got[1] == 0) and np.all(np.isfinite(got))
