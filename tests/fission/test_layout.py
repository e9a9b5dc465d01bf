"""Layout rules against ONNX Runtime: old and new opsets, negative axes and indices, clamped
slices, cropping pads, and the rules for the operators the frontend normally removes."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper, shape_inference

from korch.fission import OpaqueOperatorWarning, fission, fission_with_report
from korch.frontend import ImportedModel, load_onnx
from korch.ir.ops import Op
from korch.ir import interpret, ort

INT64_MAX, INT64_MIN = np.iinfo(np.int64).max, np.iinfo(np.int64).min


def _x(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _model(op, feeds, consts=None, opset=19, inputs=None, outputs=("y",), **attrs):
    """One ``op`` node; ``feeds`` become graph inputs and ``consts`` initializers (``inputs`` orders them)."""
    consts = {k: np.asarray(v) for k, v in (consts or {}).items()}
    node = helper.make_node(op, inputs or [*feeds, *consts], list(outputs), **attrs)
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape) for k, v in feeds.items()],
        [helper.make_empty_tensor_value_info(o) for o in outputs],
        [numpy_helper.from_array(v, k) for k, v in consts.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def _check(op, feeds, consts=None, **kw):
    model = _model(op, feeds, consts, **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("error", OpaqueOperatorWarning)
        graph = fission(load_onnx(model))
    got, want = interpret.run(graph, feeds), ort.run_model(model, feeds)
    for name, value in want.items():
        assert got[name].shape == value.shape and got[name].dtype == value.dtype, name
        np.testing.assert_allclose(got[name], value, rtol=1e-4, atol=1e-5, err_msg=name)
    return [n.op for n in graph.nodes]


def test_transpose_default_perm_reverses():
    assert _check("Transpose", {"x": _x(2, 3, 1, 5)}) == [Op.TRANSPOSE]
    _check("Transpose", {"x": _x(2, 3, 1, 5)}, perm=[2, 0, 3, 1])


@pytest.mark.parametrize("shape, allowzero", [((0, -1, 5), 0), ((3, 0, -1), 0), ((-1,), 0), ((5, 1, 6), 1)])
def test_reshape(shape, allowzero):
    assert _check("Reshape", {"x": _x(3, 2, 5)}, {"s": np.array(shape, np.int64)}, allowzero=allowzero) == [Op.RESHAPE]


@pytest.mark.parametrize("axis", [0, 2, -1, -3, 3])
def test_flatten(axis):
    _check("Flatten", {"x": _x(2, 3, 1, 5)}, axis=axis, opset=13)


def test_squeeze_and_unsqueeze_attributes_and_inputs():
    _check("Squeeze", {"x": _x(1, 3, 1, 5)}, axes=[-2, 0], opset=11)
    _check("Squeeze", {"x": _x(1, 3, 1, 5)}, opset=13)  # every size-1 axis
    _check("Squeeze", {"x": _x(1, 3, 1, 5)}, {"a": np.array([-4], np.int64)}, opset=13)
    _check("Unsqueeze", {"x": _x(3, 5)}, axes=[-1, 0], opset=11)
    _check("Unsqueeze", {"x": _x(3, 5)}, {"a": np.array([3, -5, 1], np.int64)}, opset=13)


def test_concat_negative_axis():
    assert _check("Concat", {"a": _x(2, 1, 4), "b": _x(2, 3, 4, seed=1), "c": _x(2, 2, 4, seed=2)},
                  axis=-2) == [Op.CONCAT]


def test_split_versions():
    x = {"x": _x(2, 7, 3)}
    _check("Split", x, axis=1, split=[3, 4], opset=11, outputs=("a", "b"))
    _check("Split", x, {"s": np.array([2, 0, 5], np.int64)}, axis=-2, opset=13, outputs=("a", "b", "c"))
    ops = _check("Split", x, axis=1, num_outputs=3, opset=18, outputs=("a", "b", "c"))  # 3, 3, 1
    assert ops == [Op.SLICE] * 3


def test_equal_split_takes_the_output_count():
    assert _check("Split", {"x": _x(2, 9)}, axis=-1, opset=13, outputs=("a", "b", "c")) == [Op.SLICE] * 3


@pytest.mark.parametrize("starts, ends, axes, steps", [
    ([1, -3], [INT64_MAX, -1], [0, -1], [1, 2]),
    ([-1, 8], [INT64_MIN, 1], [1, 2], [-2, -3]),
    ([-10], [-100], [1], [-1]),  # the spec clamps end to -1, so one element remains
    ([0, 0, 0], [INT64_MAX] * 3, [0, 1, 2], [1, 1, 1]),  # identity
    ([4], [2], [0], [1]),  # empty
])
def test_slice_inputs(starts, ends, axes, steps):
    consts = {"s": np.array(starts, np.int64), "e": np.array(ends, np.int64), "a": np.array(axes, np.int64),
              "p": np.array(steps, np.int64)}
    _check("Slice", {"x": _x(4, 5, 9)}, consts, opset=13)


def test_slice_attributes():
    assert _check("Slice", {"x": _x(4, 5, 9)}, starts=[1, -4], ends=[1000, -1], axes=[2, 0], opset=9) == [Op.SLICE]


@pytest.mark.parametrize("mode, pads", [
    ("constant", [1, 0, 2, 3, 0, 1]), ("reflect", [2, 1, 0, 0, 3, 2]), ("edge", [-1, 2, 1, 1, 0, -2]),
    ("constant", [0, -1, 2, -1, 0, 1]), ("wrap", [3, 0, 7, 0, 4, 8]), ("reflect", [-1, 0, 0, 0, 0, 3]),
])
def test_pad_modes_and_cropping(mode, pads):
    ops = _check("Pad", {"x": _x(3, 4, 5)}, {"p": np.array(pads, np.int64), "v": np.array(1.5, np.float32)},
                 mode=mode)
    assert ops[-1] is Op.PAD and (Op.SLICE in ops) == (min(pads) < 0)


def test_pad_old_attribute_and_axes_input():
    _check("Pad", {"x": _x(3, 4)}, pads=[1, 2, 0, 1], mode="constant", value=-2.0, opset=2)
    _check("Pad", {"x": _x(2, 3, 4)}, {"p": np.array([1, 0, 2, 3], np.int64), "v": np.array(0.5, np.float32),
                                      "a": np.array([-1, 0], np.int64)}, opset=18)


def test_pad_with_a_runtime_fill_value():
    feeds = {"x": _x(2, 3), "v": np.array(-7.0, np.float32)}
    ops = _check("Pad", feeds, {"p": np.array([1, 0, 1, 2], np.int64)}, inputs=["x", "p", "v"])
    assert ops == [Op.PAD, Op.WHERE]


def test_expand_result_can_exceed_the_shape_input():
    assert _check("Expand", {"x": _x(3, 1, 5)}, {"s": np.array([4, 1], np.int64)}, opset=13) == [Op.BROADCAST]


def test_tile_is_layout_only():
    ops = _check("Tile", {"x": _x(2, 3, 1)}, {"r": np.array([2, 1, 3], np.int64)}, opset=13)
    assert set(ops) <= {Op.RESHAPE, Op.BROADCAST}


def test_gather_scalar_and_negative_indices():
    assert _check("Gather", {"x": _x(4, 5, 3)}, {"i": np.array(-2, np.int64)}, axis=-2) == [Op.GATHER]
    _check("Gather", {"x": _x(4, 5, 3)}, {"i": np.array([[0, -1], [3, 1]], np.int32)}, axis=0)


def test_gather_elements_and_nd():
    idx = np.random.default_rng(3).integers(-5, 5, size=(4, 2, 3))
    _check("GatherElements", {"x": _x(4, 5, 3)}, {"i": idx}, axis=1, opset=13)
    nd = np.array([[[1, -1], [0, 2]], [[2, 0], [-3, 1]]], np.int64)
    _check("GatherND", {"x": _x(3, 4, 2)}, {"i": nd}, opset=13)
    _check("GatherND", {"x": _x(2, 4, 3, 2)}, {"i": np.array([[[1, 2]], [[3, -1]]], np.int64)}, batch_dims=1,
           opset=13)


@pytest.mark.parametrize("op, mode", [("DepthToSpace", "DCR"), ("DepthToSpace", "CRD"), ("SpaceToDepth", None)])
def test_block_rearrangements(op, mode):
    x = _x(2, 8, 3, 5) if op == "DepthToSpace" else _x(2, 3, 4, 6)
    attrs = {"mode": mode} if mode else {}
    assert _check(op, {"x": x}, blocksize=2, opset=13, **attrs) == [Op.RESHAPE, Op.TRANSPOSE, Op.RESHAPE]


def _raw(op, feeds, outputs, opset=19, consts=None, **attrs):
    """Fission without the frontend (which would remove or fold ``op``): shapes come from onnx."""
    model = _model(op, feeds, consts, opset=opset, outputs=outputs, **attrs)
    typed = shape_inference.infer_shapes(model)
    shapes = {v.name: (tuple(d.dim_value for d in v.type.tensor_type.shape.dim),
                       helper.tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type).name)
              for v in [*typed.graph.input, *typed.graph.output]}
    imported = ImportedModel(model, shapes, {k: np.asarray(v) for k, v in (consts or {}).items()}, opset)
    graph, report = fission_with_report(imported)
    assert not report.opaque, report.opaque
    return graph, interpret.run(graph, feeds)


def test_identity_dropout_and_constants_without_the_frontend():
    x = _x(3, 4)
    _, out = _raw("Identity", {"x": x}, ["y"])
    np.testing.assert_array_equal(out["y"], x)
    _, out = _raw("Dropout", {"x": x}, ["y", "m"], opset=10, ratio=0.3)
    np.testing.assert_array_equal(out["y"], x)
    assert out["m"].dtype == bool and out["m"].all()
    graph, _ = _raw("Dropout", {"x": x}, ["y"], opset=13)
    assert not graph.constants  # no mask where none is read
    consts = {"r": np.array(0.0, np.float32), "t": np.array(True)}
    _, out = _raw("Dropout", {"x": x}, ["y", "m"], opset=13, consts=consts)
    np.testing.assert_array_equal(out["y"], x)
    _, out = _raw("Shape", {"x": x}, ["y"], start=-1)
    np.testing.assert_array_equal(out["y"], [4])
    _, out = _raw("Size", {"x": x}, ["y"])
    assert out["y"] == 12
    _, out = _raw("ConstantOfShape", {}, ["y"], consts={"s": np.array([2, 3], np.int64)},
                  value=numpy_helper.from_array(np.array([7], np.int32)))
    np.testing.assert_array_equal(out["y"], np.full((2, 3), 7, np.int32))
    _, out = _raw("Constant", {}, ["y"], value_floats=[1.0, 2.5])
    np.testing.assert_array_equal(out["y"], np.array([1.0, 2.5], np.float32))


def test_training_dropout_stays_opaque():
    model = _model("Dropout", {"x": _x(3, 4)}, {"r": np.array(0.5, np.float32), "t": np.array(True)}, opset=13)
    imported = ImportedModel(model, {"x": ((3, 4), "float32"), "y": ((3, 4), "float32")},
                             {"r": np.array(0.5, np.float32), "t": np.array(True)}, 13)
    _, report = fission_with_report(imported)
    assert "Dropout" in report.opaque


def test_constant_value_attribute_types():
    model = _model("Constant", {}, outputs=("y",), value=helper.make_tensor("v", TensorProto.INT32, [2], [3, -4]))
    imported = ImportedModel(model, {"y": ((2,), "int32")}, {}, 19)
    graph, _ = fission_with_report(imported)
    np.testing.assert_array_equal(interpret.run(graph, {})["y"], np.array([3, -4], np.int32))
