"""Resize and Upsample rules against ONNX Runtime: every mode and coordinate transformation,
scales and sizes, axes and aspect-ratio policies, antialiasing, old opsets, and the
primitive shapes of the separable filters."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from onnx import helper, numpy_helper

from korch.fission import OpaqueOperatorWarning, fission
from korch.fission.resize import axis_filter, filter_order
from korch.frontend import load_onnx
from korch.ir.ops import Op
from korch.ir import interpret, ort

X = np.random.default_rng(0).standard_normal((1, 2, 4, 8)).astype(np.float32)


def _model(x, op="Resize", opset=19, roi=None, scales=None, sizes=None, **attrs):
    consts = {"roi": roi, "scales": scales, "sizes": sizes}
    dtypes = {"roi": np.float32, "scales": np.float32, "sizes": np.int64}
    inputs = ["x"] + [k if consts[k] is not None else "" for k in ("roi", "scales", "sizes")]
    if op == "Upsample" or opset == 10:
        inputs = ["x", "scales"] if scales is not None else ["x"]
    while inputs[-1] == "":
        inputs.pop()
    if "scales_attribute" in attrs:  # Upsample-7
        attrs["scales"] = attrs.pop("scales_attribute")
    node = helper.make_node(op, inputs, ["y"], **attrs)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", helper.np_dtype_to_tensor_dtype(x.dtype), x.shape)],
        [helper.make_empty_tensor_value_info("y")],
        [numpy_helper.from_array(np.asarray(v, dtypes[k]), k) for k, v in consts.items() if v is not None])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def _check(x=X, atol=1e-5, **kw):
    model = _model(x, **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("error", OpaqueOperatorWarning)
        graph = fission(load_onnx(model))
    got, want = interpret.run(graph, {"x": x})["y"], ort.run_model(model, {"x": x})["y"]
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=atol)
    return [n.op for n in graph.nodes]


# Binary fractions with integral scale * size: align_corners then reads the same in onnx's reference
# (fractional width) and in ONNX Runtime (integral width), and ONNX Runtime's float32 coordinates
# land on the same side of nearest's ties as the exact ones.
SCALES = [[1, 1, 2.0, 0.375], [1, 1, 0.75, 1.25], [1, 1, 0.5, 1.5]]
SIZES = [[1, 2, 8, 4], [1, 2, 3, 11], [1, 2, 1, 1]]
COORDS = ["half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric"]


@pytest.mark.parametrize("coords", COORDS)
@pytest.mark.parametrize("nearest_mode", ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"])
def test_nearest_is_one_gather_per_resized_axis(coords, nearest_mode):
    for scales in SCALES:
        ops = _check(scales=scales, mode="nearest", coordinate_transformation_mode=coords, nearest_mode=nearest_mode)
        assert ops == [Op.GATHER, Op.GATHER]
    for sizes in SIZES:
        _check(sizes=sizes, mode="nearest", coordinate_transformation_mode=coords, nearest_mode=nearest_mode)


@pytest.mark.parametrize("coords", COORDS)
@pytest.mark.parametrize("mode", ["linear", "cubic"])
def test_linear_and_cubic(coords, mode):
    for scales in SCALES:
        ops = _check(scales=scales, mode=mode, coordinate_transformation_mode=coords)
        # per axis a gather of the taps, weighted and summed (or a lone gather where it only picks)
        assert ops.count(Op.GATHER) == 2 and set(ops) <= {Op.GATHER, Op.MUL, Op.REDUCE_SUM}
    for sizes in SIZES[:2]:
        _check(sizes=sizes, mode=mode, coordinate_transformation_mode=coords)


@pytest.mark.parametrize("a", [-0.5, -0.75])
def test_cubic_coefficient_and_exclude_outside(a):
    for scales in SCALES:
        _check(scales=scales, mode="cubic", cubic_coeff_a=a, exclude_outside=1)


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
def test_tf_crop_and_resize_extrapolates(mode):
    roi = [0, 0, -0.2, 0.3, 1, 1, 0.9, 1.4]
    ops = _check(roi=roi, sizes=[1, 2, 6, 9], mode=mode, coordinate_transformation_mode="tf_crop_and_resize",
                 extrapolation_value=-3.0)
    assert ops.count(Op.WHERE) == 2


@pytest.mark.parametrize("mode", ["linear", "cubic"])
def test_antialias_downsampling_widens_the_filter(mode):
    x = np.random.default_rng(1).standard_normal((1, 1, 16, 13)).astype(np.float32)
    _check(x, scales=[1, 1, 0.35, 0.5], mode=mode, antialias=1)
    _check(x, sizes=[1, 1, 5, 20], mode=mode, antialias=1, exclude_outside=1)
    indices, weights, _ = axis_filter(16, 5, 5 / 16, (0.0, 1.0), mode=mode, coordinate_mode="half_pixel",
                                      nearest_mode="", cubic_coeff_a=-0.75, exclude_outside=False, antialias=True)
    assert indices.shape[1] > (2 if mode == "linear" else 4)
    np.testing.assert_allclose(weights.sum(axis=1), 1.0)


@pytest.mark.parametrize("policy", ["stretch", "not_larger", "not_smaller"])
def test_axes_and_keep_aspect_ratio(policy):
    # (ONNX Runtime ignores the policy when axes are negative)
    _check(sizes=[3, 10], axes=[2, 3], mode="linear", keep_aspect_ratio_policy=policy)
    _check(sizes=[9, 5], axes=[3, 2], mode="nearest", keep_aspect_ratio_policy=policy)
    if policy == "stretch":
        _check(sizes=[9, 5], axes=[-1, -2], mode="cubic")


def test_scales_with_axes_and_identity_axes():
    assert _check(scales=[2.0, 1.0], axes=[3, 2], mode="linear") == [Op.GATHER, Op.MUL, Op.REDUCE_SUM]
    assert _check(scales=[1, 1, 1, 1], mode="cubic") == [Op.RESHAPE]  # a copy


def test_third_of_a_scale_lands_on_its_ties():
    # 0.33333334f is 1/3 rounded: source coordinates 3y, not 2.99999991y, as in ONNX Runtime
    x = np.arange(9 * 3, dtype=np.float32).reshape(1, 1, 3, 9)
    _check(x, scales=[1, 1, 1, 1 / 3], mode="nearest", coordinate_transformation_mode="asymmetric",
           nearest_mode="floor")


def test_integer_inputs():
    x = np.random.default_rng(2).integers(0, 255, (1, 1, 4, 5)).astype(np.uint8)
    assert _check(x, scales=[1, 1, 2, 3], mode="nearest", coordinate_transformation_mode="asymmetric") == \
        [Op.GATHER, Op.GATHER]


def test_integer_interpolation_rounds_once_at_the_end():
    # onnx's reference (not ONNX Runtime, which rounds differently) defines this: float math, round half
    # to even, saturate
    from onnx.reference import ReferenceEvaluator

    x = np.random.default_rng(2).integers(0, 255, (1, 1, 4, 5)).astype(np.uint8)
    model = _model(x, scales=[1, 1, 2.0, 1.5], mode="linear")
    graph = fission(load_onnx(model))
    assert [n.op for n in graph.nodes][-4:] == [Op.ROUND, Op.MAX, Op.MIN, Op.CAST]
    np.testing.assert_array_equal(interpret.run(graph, {"x": x})["y"], ReferenceEvaluator(model).run(None, {"x": x})[0])


@pytest.mark.parametrize("opset", [11, 13])
def test_older_resize_opsets(opset):
    _check(opset=opset, roi=[], scales=[1, 1, 2.0, 0.375], mode="linear",
           coordinate_transformation_mode="align_corners")
    _check(opset=opset, roi=[], scales=[], sizes=[1, 2, 7, 3], mode="cubic", cubic_coeff_a=-0.5)
    _check(opset=opset, roi=[], scales=[1, 1, 1.5, 0.5], mode="nearest", nearest_mode="ceil")


@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_resize_10_and_upsample(mode):
    _check(opset=10, scales=[1, 1, 0.6, 1.7], mode=mode)
    _check(op="Upsample", opset=9, scales=[1, 1, 2.0, 1.5], mode=mode)
    _check(op="Upsample", opset=7, mode=mode, scales_attribute=[1.0, 1.0, 3.0, 1.5])



def test_upsampling_filters_the_innermost_axis_first_on_the_smaller_image():
    # 8x bilinear along H and W (a decoder's upsampling): the W pass gathers element by element, so it runs
    # before the H pass makes the image 8x taller; the result still matches ONNX Runtime
    x = np.random.default_rng(1).standard_normal((1, 3, 4, 5)).astype(np.float32)
    model = _model(x, scales=[1, 1, 8.0, 8.0], mode="linear")
    graph = fission(load_onnx(model))
    gathers = [n for n in graph.nodes if n.op is Op.GATHER]
    assert [graph.tensors[n.outputs[0]].shape for n in gathers] == [(1, 3, 4, 40, 2), (1, 3, 32, 2, 40)]
    np.testing.assert_allclose(interpret.run(graph, {"x": x})["y"], ort.run_model(model, {"x": x})["y"],
                               rtol=1e-4, atol=1e-5)


def test_filter_order_shrinks_before_it_grows():
    # H downsampled 4x, W upsampled 2x: H first whatever the inner axis costs
    assert filter_order((1, 1, 64, 64), {2: (16, 2), 3: (128, 2)}) == [2, 3]
    assert filter_order((1, 1, 16, 16), {2: (128, 2), 3: (128, 2)}) == [3, 2]
