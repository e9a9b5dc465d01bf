"""A convolution of a space-to-depth concatenation (YOLO's Focus stem) folded into one strided convolution of
the image (frontend/space_to_depth.py): ONNX Runtime computes the same on the rewritten model as on the model
as given, and graphs where the fold is not exact are left alone."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from korch.frontend import load_onnx
from tests.frontend.test_fold import const, make, ops, run, tensor

F = TensorProto.FLOAT
# (dy, dx) of the four parts in YOLOX's order: x[..., ::2, ::2], x[..., 1::2, ::2], x[..., ::2, 1::2], ...
FOCUS = [(0, 0), (1, 0), (0, 1), (1, 1)]


def focus(*, phases=FOCUS, rows_end=1 << 30, stride=1, pads=1, kernel=3, concat_readers=1, dilation=1,
          rows_in_two=False):
    """A (1, 3, 8, 10) image cut into ``phases`` by Slices of rows (up to ``rows_end``) then columns (as torch
    exports ``x[..., dy::2, dx::2]``), concatenated over channels and convolved with a bias to 5 channels.
    ``rows_in_two`` cuts the rows as ``x[..., dy:, :][..., ::2, :]``."""
    rng = np.random.default_rng(0)
    nodes, parts, inits = [], [], [const("zero", np.array([0], np.int64)), const("one", np.array([1], np.int64))]
    for k, (dy, dx) in enumerate(phases):
        rows, part = f"rows{k}", f"part{k}"
        if rows_in_two:
            nodes.append(helper.make_node("Slice", ["x", f"s{k}r", "rows_end", "axis2", "one"], [f"from{k}"]))
            nodes.append(helper.make_node("Slice", [f"from{k}", "zero", "rows_end", "axis2", "two"], [rows]))
        else:
            nodes.append(helper.make_node("Slice", ["x", f"s{k}r", "rows_end", "axis2", "two"], [rows]))
        nodes.append(helper.make_node("Slice", [rows, f"s{k}c", "big", "axis3", "two"], [part]))
        inits += [const(f"s{k}r", np.array([dy], np.int64)), const(f"s{k}c", np.array([dx], np.int64))]
        parts.append(part)
    nodes.append(helper.make_node("Concat", parts, ["cat"], axis=1))
    nodes.append(helper.make_node("Conv", ["cat", "w", "b"], ["y"], kernel_shape=[kernel, kernel],
                                  strides=[stride, stride], pads=[pads] * 4, dilations=[dilation, dilation]))
    outputs = [tensor("y", F, None)]
    if concat_readers > 1:
        nodes.append(helper.make_node("Relu", ["cat"], ["z"]))
        outputs.append(tensor("z", F, None))
    inits += [const("big", np.array([1 << 30], np.int64)), const("rows_end", np.array([rows_end], np.int64)), const("axis2", np.array([2], np.int64)),
              const("axis3", np.array([3], np.int64)), const("two", np.array([2], np.int64)),
              const("w", rng.standard_normal((5, 3 * len(phases), kernel, kernel)).astype(np.float32)),
              const("b", rng.standard_normal(5).astype(np.float32))]
    return make(nodes, [tensor("x", F, [1, 3, 8, 10])], outputs, inits, opset=17)


def _image(model) -> dict[str, np.ndarray]:
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    return {"x": np.random.default_rng(1).standard_normal(shape).astype(np.float32)}


@pytest.mark.parametrize("case", [dict(), dict(stride=2), dict(pads=0), dict(kernel=1, pads=0),
                                  dict(phases=[(1, 1), (0, 0), (0, 1), (1, 0)]), dict(rows_in_two=True)])
def test_the_stem_becomes_one_strided_convolution_of_the_image(case):
    model = focus(**case)
    imported = load_onnx(model)
    folded = imported.model
    assert ops(folded) == ["Conv"]
    conv = folded.graph.node[0]
    attrs = {a.name: list(a.ints) for a in conv.attribute}
    assert conv.input[0] == "x" and attrs["strides"] == [2 * case.get("stride", 1)] * 2
    assert attrs["kernel_shape"] == [2 * case.get("kernel", 3)] * 2
    assert any("space-to-depth" in line for line in imported.rewrites)
    x = _image(model)
    (expected,), (got,) = run(model, x), run(folded, x)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", [
    dict(phases=[(0, 0), (1, 0), (0, 1), (1, 0)]),  # a phase twice, one missing: not the whole image
    dict(concat_readers=2),                         # the concatenation is needed anyway
    dict(rows_end=6),                               # the phases leave the last two rows out
    dict(dilation=2),                               # dilated taps are not the image's neighbours
])
def test_the_graph_is_left_where_the_fold_is_not_exact(case):
    model = focus(**case)
    folded = load_onnx(model).model
    assert "Concat" in ops(folded)
    x = _image(model)
    for expected, got in zip(run(model, x), run(folded, x)):
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
