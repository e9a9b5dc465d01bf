"""A 1x1 convolution of a channel concatenation split per part and moved before upsampling Resizes
(frontend/linear_motion.py): the rewritten graph computes what ONNX Runtime computes on the model as given,
and graphs where the move is not exact or does not save are left alone."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from korch import config
from korch.frontend import load_onnx
from tests.frontend.test_fold import const, make, ops, run, tensor

F = TensorProto.FLOAT


def decoder(*, mode="linear", factor=2, concat_readers=1, kernel=1, axis=1, coordinates="half_pixel",
            opset=19):
    """x0 (8 channels, 4x4) resized by sizes and x1 (4 channels, 8x8 / factor) resized by scales to 8x8,
    concatenated with x2 (6 channels, 8x8), fused by a convolution with a bias (5 output channels)."""
    rng = np.random.default_rng(0)
    small = 8 // factor
    attrs = dict(mode=mode, coordinate_transformation_mode=coordinates)
    nodes = [
        helper.make_node("Resize", ["x0", "", "", "sizes"], ["r0"], **attrs),
        helper.make_node("Resize", ["x1", "", "scales"], ["r1"], **attrs),
        helper.make_node("Concat", ["r0", "r1", "x2"], ["cat"], axis=axis),
        helper.make_node("Conv", ["cat", "w", "b"], ["y"], kernel_shape=[kernel, kernel],
                         pads=[kernel // 2] * 4),
    ]
    outputs = [tensor("y", F, None)]
    if concat_readers > 1:
        nodes.append(helper.make_node("Relu", ["cat"], ["z"]))
        outputs.append(tensor("z", F, None))
    inits = [const("sizes", np.array([1, 8, 8, 8], np.int64)),
             const("scales", np.array([1, 1, factor, factor], np.float32)),
             const("w", rng.standard_normal((5, 18, kernel, kernel)).astype(np.float32)),
             const("b", rng.standard_normal(5).astype(np.float32))]
    inputs = [tensor("x0", F, [1, 8, 4, 4]), tensor("x1", F, [1, 4, small, small]), tensor("x2", F, [1, 6, 8, 8])]
    return make(nodes, inputs, outputs, inits, opset=opset)


def feeds(model) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    return {v.name: rng.standard_normal([d.dim_value for d in v.type.tensor_type.shape.dim]).astype(np.float32)
            for v in model.graph.input}


@pytest.mark.parametrize("mode", ["linear", "nearest"])
@pytest.mark.parametrize("opset", [13, 19])
def test_a_fuse_convolution_runs_per_part_before_the_upsampling_and_computes_the_same(mode, opset):
    model = decoder(mode=mode, opset=opset)
    moved = load_onnx(model).model
    assert "Concat" not in ops(moved)
    assert ops(moved).count("Conv") == 3 and ops(moved).count("Resize") == 2 and ops(moved).count("Add") == 2
    resized = {n.input[0] for n in moved.graph.node if n.op_type == "Resize"}
    convs = {n.output[0]: n for n in moved.graph.node if n.op_type == "Conv"}
    assert resized <= set(convs)  # both Resizes now read a convolution's output
    x = feeds(model)
    (expected,), (got,) = run(model, x), run(moved, x)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", [
    dict(mode="cubic"),                      # cubic weights: left as ONNX Runtime computes them
    dict(coordinates="tf_crop_and_resize"),  # extrapolates: a constant would not pass through
    dict(concat_readers=2),                  # the concatenation is needed anyway
    dict(kernel=3),                          # mixes pixels
])
def test_the_graph_is_left_where_the_move_is_not_exact_or_does_not_save(case):
    model = decoder(**case)
    moved = load_onnx(model).model
    x = feeds(model)
    for expected, got in zip(run(model, x), run(moved, x)):
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    assert ops(moved).count("Concat") == 1 and ops(moved).count("Conv") == 1


def test_a_downsampling_resize_keeps_its_convolution_after_it():
    model = decoder(factor=1)  # x1 resized by scales of 1
    for node in model.graph.initializer:
        if node.name == "sizes":
            node.CopyFrom(const("sizes", np.array([1, 8, 8, 8], np.int64)))
    model.graph.input[0].CopyFrom(tensor("x0", F, [1, 8, 16, 16]))
    moved = load_onnx(model).model
    assert ops(moved).count("Concat") == 1


def test_the_move_is_off_when_configured_so():
    with config.patch(move_linear_maps=False):
        assert ops(load_onnx(decoder()).model).count("Concat") == 1


def test_the_rewrite_is_named_and_its_executable_matches_onnx_runtime_on_the_model_as_given(tmp_path):
    import korch

    model = decoder()
    assert load_onnx(model).rewrites == ["1x1 Conv 'y' split over its 3 concatenated inputs, 2 moved before their "
                                         "upsampling Resize"]
    executable = korch.optimize(model, target="cpu", cost="roofline", output=tmp_path / "out")
    x = feeds(model)
    (expected,) = run(model, x)
    got = executable(*(x[name] for name in ("x0", "x1", "x2")))
    got = got[0] if isinstance(got, (list, tuple)) else got
    np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-4, atol=1e-4)
    assert "## Graph rewrites" in (tmp_path / "out" / "report.md").read_text()


def test_a_concatenation_an_if_body_reads_stays():
    model = decoder()
    branch = lambda: helper.make_graph([helper.make_node("Relu", ["cat"], ["branch_out"])], "branch", [],
                                       [tensor("branch_out", F, None)])
    model.graph.node.append(helper.make_node("If", ["flag"], ["z"], then_branch=branch(), else_branch=branch()))
    model.graph.input.append(tensor("flag", TensorProto.BOOL, []))
    model.graph.output.append(tensor("z", F, None))
    assert ops(load_onnx(model).model).count("Concat") == 1


def projection(*, bias_shape=(6,), relu=False, conv_bias=True, readers=1):
    """Tokens (1, 16, 8) projected to 6 channels, laid out as a 4x4 map, mixed by a 1x1 convolution to 5."""
    rng = np.random.default_rng(2)
    nodes = [helper.make_node("MatMul", ["a", "wm"], ["p"]), helper.make_node("Add", ["bm", "p"], ["q"])]
    last = "q"
    if relu:
        nodes.append(helper.make_node("Relu", ["q"], ["r"]))
        last = "r"
    nodes += [helper.make_node("Transpose", [last], ["t"], perm=[0, 2, 1]),
              helper.make_node("Reshape", ["t", "grid"], ["m"]),
              helper.make_node("Conv", ["m", "wk"] + (["bk"] if conv_bias else []), ["y"], kernel_shape=[1, 1])]
    outputs = [tensor("y", F, None)] + ([tensor("t", F, None)] if readers > 1 else [])
    inits = [const("wm", rng.standard_normal((8, 6)).astype(np.float32)),
             const("bm", rng.standard_normal(bias_shape).astype(np.float32)),
             const("grid", np.array([1, -1, 4, 4], np.int64)),
             const("wk", rng.standard_normal((5, 6, 1, 1)).astype(np.float32)),
             const("bk", rng.standard_normal(5).astype(np.float32))]
    return make(nodes, [tensor("a", F, [1, 16, 8])], outputs, inits, opset=19)


@pytest.mark.parametrize("conv_bias", [True, False])
def test_a_1x1_convolution_of_a_token_projection_folds_into_it(conv_bias):
    model = projection(conv_bias=conv_bias)
    imported = load_onnx(model)
    assert "Conv" not in ops(imported.model) and ops(imported.model).count("MatMul") == 1
    assert imported.rewrites == ["1x1 Conv 'y' folded into the MatMul 'p' that projects its tokens"]
    x = feeds(model)
    (expected,), (got,) = run(model, x), run(imported.model, x)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("case", [dict(relu=True), dict(readers=2), dict(bias_shape=(16, 6))])
def test_a_projection_stays_where_the_fold_is_not_exact(case):
    """An activation between, a layout another node reads, a bias per token and channel."""
    model = projection(**case)
    moved = load_onnx(model).model
    assert ops(moved).count("Conv") == 1
    x = feeds(model)
    for expected, got in zip(run(model, x), run(moved, x)):
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_a_decoders_moved_parts_fold_into_their_projections():
    """The split, the move and the fold together, as in Segformer's decoder: every convolution gone."""
    model = decoder()
    rng = np.random.default_rng(3)
    # x2 becomes a token projection laid out as a map
    model.graph.input[2].CopyFrom(tensor("tok", F, [1, 64, 3]))
    model.graph.node.insert(0, helper.make_node("MatMul", ["tok", "wt"], ["pt"]))
    model.graph.node.insert(1, helper.make_node("Transpose", ["pt"], ["ptt"], perm=[0, 2, 1]))
    model.graph.node.insert(2, helper.make_node("Reshape", ["ptt", "grid"], ["x2"]))
    model.graph.initializer.extend([const("wt", rng.standard_normal((3, 6)).astype(np.float32)),
                                    const("grid", np.array([1, 6, 8, 8], np.int64))])
    imported = load_onnx(model)
    assert ops(imported.model).count("Conv") == 2 and "Concat" not in ops(imported.model)
    assert len(imported.rewrites) == 2
    x = feeds(model)
    (expected,), (got,) = run(model, x), run(imported.model, x)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
