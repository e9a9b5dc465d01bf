"""ONNX Runtime's blocked-layout convolutions in a compiled unit: the layout is ONNX Runtime's own, each
convolution computes what torch's does (bias and activation inside, padded channels, split over threads), and a
unit keeps values blocked between convolutions and the elementwise steps between them, matching ONNX Runtime."""

import dataclasses

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
import torch.nn.functional as F
from onnx import TensorProto, helper

from korch.backends import nchwc, ort_gemm
from korch.ir.ort import run_model
from korch.pipeline import optimize
from korch.runtime import unit

from tests.backends.test_ort_gemm import _slot, library  # noqa: F401 (library: the operators opened, autouse)

BLOCKED_VARIANT = dataclasses.replace(unit.VARIANTS["packed for oneDNN"], nchwc=True)


def test_to_blocked_is_onnx_runtimes_reorder():
    """korch's blocked array of 20 channels is what ONNX Runtime's ReorderInput makes of them, padding included."""
    x = np.random.default_rng(0).standard_normal((2, 20, 5, 7)).astype(np.float32)
    graph = helper.make_graph([helper.make_node("ReorderInput", ["x"], ["y"], domain=nchwc.NCHWC_DOMAIN)], "r",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid(nchwc.NCHWC_DOMAIN, 1)])
    reordered = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x})[0]
    size = nchwc.block()
    assert size in (8, 16) and reordered.shape == (2, nchwc.padded(20, size), 5, 7)
    blocked = nchwc.to_blocked(torch.from_numpy(x), size)
    # ONNX Runtime's (N, C, H, W) shape over the blocked memory
    np.testing.assert_array_equal(blocked.numpy().reshape(reordered.shape), reordered)
    np.testing.assert_array_equal(nchwc.from_blocked(blocked, 20).numpy(), x)


# (input channels, output channels, groups, kernel, stride, pads (top, left, bottom, right), dilation, batch)
CONVS = [(32, 64, 1, 3, 1, (1, 1, 1, 1), 1, 1), (24, 40, 1, 1, 1, (0, 0, 0, 0), 1, 2),
         (3, 32, 1, 3, 2, (0, 0, 1, 1), 1, 1), (144, 144, 144, 3, 2, (1, 1, 1, 1), 1, 2),
         (40, 40, 40, 5, 1, (2, 2, 2, 2), 1, 1), (16, 16, 1, 3, 1, (2, 2, 2, 2), 2, 1)]
ACTIVATIONS = {"none": ([], lambda y: y), "relu": ([nchwc.RELU], torch.relu),
               "clip": ([nchwc.CLIP, 0.0, 6.0], lambda y: y.clamp(0, 6))}


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("residual", [False, True], ids=["", "residual"])
@pytest.mark.parametrize("activation", list(ACTIVATIONS))
@pytest.mark.parametrize("conv", CONVS, ids=lambda c: "x".join(map(str, c[:5])))
def test_a_blocked_convolution_computes_torchs(conv, activation, residual, threads):
    """Each output channel block as torch computes it, with the bias, a residual sum before the activation, and
    the activation inside; padded channels, several images, and the output blocks split over two threads."""
    c_in, c_out, groups, k, stride, pads, dilation, batch = conv
    size = nchwc.block()
    rng = torch.Generator().manual_seed(0)
    x = torch.randn(batch, c_in, 11, 13, generator=rng)
    w = torch.randn(c_out, c_in // groups, k, k, generator=rng) * 0.2
    b = torch.randn(c_out, generator=rng)
    spec = [size, k, k, stride, stride, *pads, dilation, dilation, groups, c_out]
    codes, reference_activation = ACTIVATIONS[activation]
    out_size = [(s + pads[i] + pads[i + 2] - dilation * (k - 1) - 1) // stride + 1 for i, s in enumerate((11, 13))]
    added = torch.randn(batch, c_out, *out_size, generator=rng) if residual else None
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        given = x if groups == 1 and c_in < size else nchwc.to_blocked(x, size)
        got = ort_gemm.ops().nchwc_conv(given, w, b, None if added is None else nchwc.to_blocked(added, size),
                                        spec, codes, 7, _slot())
    finally:
        torch.set_num_threads(previous)
    expected = F.conv2d(F.pad(x, (pads[1], pads[3], pads[0], pads[2])), w, b, stride=stride, dilation=dilation,
                        groups=groups)
    expected = reference_activation(expected if added is None else expected + added)
    assert tuple(got.shape) == tuple(nchwc.fake_conv(given, w, b, None, spec, codes, 7, 0).shape)
    torch.testing.assert_close(nchwc.from_blocked(got, c_out), expected, rtol=1e-4, atol=1e-4)


def _inverted_residual(c_mid: int = 144, divide: bool = False, batch: int = 1) -> onnx.ModelProto:
    """MobileNetV2's kind of block: a stem convolution of 3 channels with ReLU6, a depthwise one, a 1x1 one to 24
    channels (not a whole number of blocks), an expansion, depthwise and projection with a residual sum, a SiLU,
    the average over the image and a classifier; ``divide``: the residual sum divided by a per-channel constant."""
    rng = np.random.default_rng(0)
    inits, nodes = {}, []

    def conv(x, y, cin, cout, k, stride=1, groups=1, clip=True):
        inits[y + "_w"] = (rng.standard_normal((cout, cin // groups, k, k)) * 0.2).astype(np.float32)
        inits[y + "_b"] = rng.standard_normal(cout).astype(np.float32)
        nodes.append(helper.make_node("Conv", [x, y + "_w", y + "_b"], [y + "_c" if clip else y],
                                      pads=[k // 2] * 4, strides=[stride] * 2, group=groups))
        if clip:
            inits[y + "_lo"], inits[y + "_hi"] = np.array(0, np.float32), np.array(6, np.float32)
            nodes.append(helper.make_node("Clip", [y + "_c", y + "_lo", y + "_hi"], [y]))
        return y

    a = conv(conv(conv("x", "stem", 3, 32, 3, 2), "dw1", 32, 32, 3, groups=32), "pr1", 32, 24, 1, clip=False)
    b = conv(conv(conv(a, "ex2", 24, c_mid, 1), "dw2", c_mid, c_mid, 3, groups=c_mid), "pr2", c_mid, 24, 1, clip=False)
    nodes.append(helper.make_node("Add", [a, b], ["sum"]))
    if divide:
        inits["scale"] = rng.uniform(1, 2, (24, 1, 1)).astype(np.float32)
        nodes.append(helper.make_node("Div", ["sum", "scale"], ["res"]))
    else:
        nodes.append(helper.make_node("Identity", ["sum"], ["res"]))
    c = conv("res", "ex3", 24, 96, 1, clip=False)
    nodes += [helper.make_node("Sigmoid", [c], ["sg"]), helper.make_node("Mul", [c, "sg"], ["silu"]),
              helper.make_node("GlobalAveragePool", ["silu"], ["gap"]), helper.make_node("Flatten", ["gap"], ["flat"])]
    inits["fc_w"] = (rng.standard_normal((10, 96)) * 0.2).astype(np.float32)
    nodes.append(helper.make_node("Gemm", ["flat", "fc_w"], ["y"], transB=1))
    graph = helper.make_graph(nodes, "inverted_residual",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, (batch, 3, 32, 32))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, (batch, 10)),
                               helper.make_tensor_value_info("silu", TensorProto.FLOAT, (batch, 96, 16, 16))],
                              [onnx.numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _blocked_steps(result) -> dict[str, str]:
    """Each step's first output as a unit of blocked convolutions computes it (suffixed where blocked)."""
    module = unit.plan_module(result.graph, result.plan, "cpu", BLOCKED_VARIANT)
    return {out.removesuffix(nchwc.BLOCKED): out for kernel in module._kernels for _, _, (out, *_) in kernel}


@pytest.mark.parametrize("divide", [False, True], ids=["sum", "divided_sum"])
def test_a_unit_keeps_values_blocked_between_convolutions_and_matches_onnx_runtime(divide):
    model = _inverted_residual(divide=divide, batch=2)
    result = optimize(model, target="cpu", cost="roofline")
    steps = _blocked_steps(result)
    outputs = {n.output: n for n in result.graph.nodes}
    convolutions = [n for n in result.graph.nodes if n.op.name == "CONV"]
    assert len(convolutions) == 7 and all(nchwc.eligible(result.graph, n) for n in convolutions)
    sums = [name for name, node in outputs.items() if node.op.name == "ADD" and
            all(t not in result.graph.constants for t in node.inputs)]
    assert len(sums) == 1
    # the residual sum reads two convolutions' blocked outputs and is stored blocked; a division over 24 of 32
    # channels is not (padded ones hold zeros: 0 / 0, which the next convolution's zero weights would not hide)
    assert steps[sums[0]].endswith(nchwc.BLOCKED)
    divisions = [name for name, node in outputs.items() if node.op.name == "DIV"]
    assert len(divisions) == divide and not any(steps[name].endswith(nchwc.BLOCKED) for name in divisions)
    x = np.random.default_rng(1).standard_normal((2, 3, 32, 32)).astype(np.float32)
    expected = run_model(model, {"x": x})
    got = unit.CompiledUnit.from_bytes(unit.compile_unit(result.graph, result.plan, "cpu", BLOCKED_VARIANT))(
        torch.from_numpy(x))
    for value, name in zip(got, ("y", "silu")):
        np.testing.assert_allclose(value.numpy(), expected[name], rtol=1e-4, atol=1e-4)


def test_blocked_convolutions_and_mlas_products_share_a_unit():
    """With products in MLAS too, each primitive is computed once, by the convolution's step or the product's."""
    model = _inverted_residual()
    result = optimize(model, target="cpu", cost="roofline")
    variant = dataclasses.replace(unit.VARIANTS["MLAS by ONNX Runtime"], nchwc=True)
    module = unit.plan_module(result.graph, result.plan, "cpu", variant)
    steps = [step for kernel in module._kernels for step in kernel]
    assert sum(out.endswith(nchwc.BLOCKED) for _, _, (out, *_) in steps) >= 7
    assert any(fn.__qualname__.startswith("product_function") for fn, _, _ in steps)  # the classifier in MLAS
    x = np.random.default_rng(4).standard_normal((1, 3, 32, 32)).astype(np.float32)
    got = unit.CompiledUnit.from_bytes(unit.compile_unit(result.graph, result.plan, "cpu", variant))(
        torch.from_numpy(x))
    np.testing.assert_allclose(got[0].numpy(), run_model(model, {"x": x})["y"], rtol=1e-4, atol=1e-4)


def _feature_pyramid(batch: int = 2) -> onnx.ModelProto:
    """YOLO's kind of network between convolutions: an SPP max pool, a CSP concatenation of whole blocks, a
    nearest 2x upsampling concatenated with a feature of its size (fission moves the convolution reading the
    concatenation before the upsampling, in parts), a squeeze-and-excitation average over the image (a scale
    per image and channel: the batch is 2), a slice of channels from a block boundary and a spatial one, and a
    concatenation of 4 + 12 channels (not whole blocks of 8 or 16), which must stay unblocked."""
    rng = np.random.default_rng(3)
    inits, nodes = {}, []

    def node(op, inputs, output, **attrs):
        nodes.append(helper.make_node(op, inputs, [output], **attrs))
        return output

    def conv(x, y, cin, cout, k=1, stride=1):
        inits[y + "_w"] = (rng.standard_normal((cout, cin, k, k)) * 0.3).astype(np.float32)
        c = node("Conv", [x, y + "_w"], y + "_c", pads=[k // 2] * 4, strides=[stride] * 2)
        return node("Mul", [c, node("Sigmoid", [c], y + "_s")], y)  # SiLU

    def const(name, value):
        inits[name] = np.asarray(value)
        return name

    high = conv(conv("x", "stem", 3, 16, 3, 2), "high", 16, 32)  # 16x16
    low = conv(high, "down", 32, 32, 3, 2)  # 8x8
    a, b = conv(low, "csp1", 32, 16), conv(low, "csp2", 32, 16)
    pooled = node("MaxPool", [b], "pool", kernel_shape=[5, 5], pads=[2, 2, 2, 2])
    csp = conv(node("Concat", [a, pooled], "csp", axis=1), "csp3", 32, 32)
    up = node("Resize", [csp, "", const("scales", np.array([1, 1, 2, 2], np.float32))], "up", mode="nearest")
    fused = conv(node("Concat", [up, high], "fpn", axis=1), "fuse", 64, 32)
    se = conv(node("ReduceMean", [fused], "gap", axes=[2, 3], keepdims=1), "se", 32, 32)
    scaled = node("Mul", [fused, se], "scaled")
    part = node("Slice", [scaled, const("s0", np.array([16], np.int64)), const("s1", np.array([32], np.int64)),
                          const("s2", np.array([1], np.int64))], "part")
    crop = node("Slice", [part, const("c0", np.array([2, 2], np.int64)), const("c1", np.array([14, 14], np.int64)),
                          const("c2", np.array([2, 3], np.int64))], "crop")
    box, score = conv(crop, "box", 16, 4), conv(crop, "score", 16, 12)
    node("Concat", [box, score], "y", axis=1)
    graph = helper.make_graph(nodes, "feature_pyramid",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, (batch, 3, 32, 32))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, (batch, 16, 12, 12))],
                              [onnx.numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_pools_concatenations_upsamplings_averages_and_slices_keep_values_blocked():
    model = _feature_pyramid()
    result = optimize(model, target="cpu", cost="roofline")
    steps = _blocked_steps(result)
    by_op = {}
    for node in result.graph.nodes:
        by_op.setdefault(node.op.name, []).append(node.output)
    blocked = {op: [steps[name].endswith(nchwc.BLOCKED) for name in names] for op, names in by_op.items()
               if op in ("MAX_POOL", "GATHER", "REDUCE_MEAN", "SLICE", "CONCAT")}
    assert blocked["MAX_POOL"] == [True] * len(by_op["MAX_POOL"])  # one pool per axis (fission)
    assert blocked["GATHER"] == [True, True]  # the upsampling (after the fuse convolution, which fission moves)
    assert blocked["REDUCE_MEAN"] == [True]
    assert blocked["SLICE"] == [True, True]
    assert blocked["CONCAT"] == [True, False]  # the last, of 4 + 12 channels, is read through views
    x = np.random.default_rng(5).standard_normal((2, 3, 32, 32)).astype(np.float32)
    got = unit.CompiledUnit.from_bytes(unit.compile_unit(result.graph, result.plan, "cpu", BLOCKED_VARIANT))(
        torch.from_numpy(x))[0]
    np.testing.assert_allclose(got.numpy(), run_model(model, {"x": x})["y"], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kernel, strides, pads, dilations", [
    ((3, 3), (2, 2), (1, 1, 1, 1), (1, 1)),  # ResNet's, after its stem
    ((5, 1), (1, 1), (2, 0, 2, 0), (1, 1)),  # SPP's 5x5, one axis at a time
    ((3, 2), (1, 2), (0, 1, 2, 0), (2, 1)),  # uneven pads, dilated rows
])
def test_a_max_pool_of_a_blocked_array_over_its_taps_is_torchs(kernel, strides, pads, dilations):
    x = torch.randn(2, 20, 11, 12)
    padded = F.pad(x, (pads[1], pads[3], pads[0], pads[2]), value=float("-inf"))
    expected = F.max_pool2d(padded, kernel, strides, dilation=dilations)
    pool = nchwc._max_over_taps(kernel, strides, pads, dilations, expected.shape[2:])
    got = nchwc.from_blocked(pool(nchwc.to_blocked(x, 16))[0], 20)
    torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("starts, steps, shape", [
    ((0, 16, 0, 0), (1, 1, 1, 1), (2, 20, 9, 9)),  # channels from a block boundary, into the padded last block
    ((0, 0, 1, 2), (1, 1, 2, 3), (2, 40, 4, 3)),  # rows and columns by steps, every channel
    ((0, 32, 8, 0), (1, 1, 1, 1), (2, 8, 1, 9)),
])
def test_a_slice_of_a_blocked_array_holds_the_slice_of_the_value(starts, steps, shape):
    x = torch.randn(2, 40, 9, 9)
    key = nchwc._blocked_slice(x.shape, starts, steps, shape, 16)
    expected = x[tuple(slice(b, b + s * (c - 1) + 1, s) for b, s, c in zip(starts, steps, shape))]
    torch.testing.assert_close(nchwc.from_blocked(nchwc.to_blocked(x, 16)[key], shape[1]), expected)


@pytest.mark.parametrize("starts, steps", [((0, 8, 0, 0), (1, 1, 1, 1)), ((0, 16, 0, 0), (1, 2, 1, 1)),
                                           ((0, 0, 8, 0), (1, 1, -1, 1)), ((1, 0, 0, 0), (1, 1, 1, 1))])
def test_a_slice_that_cuts_a_block_or_the_batch_or_steps_back_is_not_blocked(starts, steps):
    assert nchwc._blocked_slice((2, 40, 9, 9), starts, steps, (1, 8, 1, 9), 16) is None


def test_a_convolution_computes_its_bias_and_clip_inside_its_call():
    result = optimize(_inverted_residual(), target="cpu", cost="roofline")
    kernel_of = {n: i for i, k in enumerate(result.plan.kernels) for n in k.nodes}
    replaced = nchwc.replacements(result.graph, [k.nodes for k in result.plan.kernels], 1, lambda n, v: n)
    producer = {n.output: n for n in result.graph.nodes}
    clips = [n for n in result.graph.nodes if n.op.name == "MAX" and producer[n.inputs[0]].op.name == "ADD" and
             producer[producer[n.inputs[0]].inputs[0]].op.name == "CONV"]
    assert len(clips) == 4  # after the stem, dw1, ex2 and dw2
    fused = 0
    for clip in clips:
        bias = producer[clip.inputs[0]]
        conv = producer[bias.inputs[0]]
        if kernel_of[clip.name] == kernel_of[bias.name] == kernel_of[conv.name]:  # computed by the conv's call
            assert replaced[clip.name] is None and replaced[bias.name] is None and replaced[conv.name]
            fused += 1
    assert fused


def assert_the_choice_is_measured_and_recorded(model: onnx.ModelProto, key: str, field: str) -> None:
    """``choose_unit`` on ``model``'s roofline plan times the unit with and without the ``key`` choice, records
    it (the manifest's ``key``, the variant's ``field``, korch's operators' library where it is taken), and the
    unit kept matches ONNX Runtime."""
    result = optimize(model, target="cpu", cost="roofline")
    data, choice = unit.choose_unit(result.graph, result.plan)
    assert choice[key] in ("yes", "no")
    assert any(key in name for name in choice["measured_ms"])
    assert getattr(unit.chosen_variant(choice), field) == (choice[key] == "yes")
    if choice[key] == "yes":
        assert choice["libraries"] == [ort_gemm.LIBRARY_FILE]
    x = np.random.default_rng(2).standard_normal(result.graph.tensor("x").shape).astype(np.float32)
    got = unit.CompiledUnit.from_bytes(data)(torch.from_numpy(x))[0]
    np.testing.assert_allclose(got.numpy(), run_model(model, {"x": x})["y"], rtol=1e-4, atol=1e-4)


def test_the_unit_choice_measures_blocked_convolutions_and_records_them():
    assert_the_choice_is_measured_and_recorded(_inverted_residual(c_mid=48), unit.BLOCKED_CONVOLUTIONS, "nchwc")


@pytest.mark.parametrize("setting", ["always", "never"])
def test_the_choice_can_be_fixed_instead_of_measured(setting, monkeypatch):
    """``--blocked-convolutions always`` keeps the blocked unit without timing it against the other, ``never``
    compiles none."""
    from korch import config

    monkeypatch.setattr(unit, "VARIANTS", {"packed for oneDNN": unit.VARIANTS["packed for oneDNN"]})
    model = _inverted_residual(c_mid=32)
    result = optimize(model, target="cpu", cost="roofline")
    with config.patch(blocked_convolutions=setting, unit_boundaries="channels-last"):
        data, choice = unit.choose_unit(result.graph, result.plan)
    blocked = [name for name in choice["measured_ms"] if unit.BLOCKED_CONVOLUTIONS in name]
    if setting == "never":
        assert unit.BLOCKED_CONVOLUTIONS not in choice and not blocked
        # korch's operators only where the stem is computed directly (``backends/direct_conv.py``)
        assert ("libraries" in choice) == (choice.get(unit.DIRECT_CONVOLUTIONS) == "yes")
    else:
        assert choice[unit.BLOCKED_CONVOLUTIONS] == "yes" and choice["variant"].endswith(unit.BLOCKED_CONVOLUTIONS)
        assert not blocked  # kept untimed
    x = np.random.default_rng(3).standard_normal((1, 3, 32, 32)).astype(np.float32)
    got = unit.CompiledUnit.from_bytes(data)(torch.from_numpy(x))[0]
    np.testing.assert_allclose(got.numpy(), run_model(model, {"x": x})["y"], rtol=1e-4, atol=1e-4)


def test_an_unknown_choice_is_a_one_line_error():
    from korch.errors import KorchError

    with pytest.raises(KorchError, match="unknown blocked-convolutions choice 'sometimes'"):
        optimize(_inverted_residual(c_mid=32), target="cpu", cost="roofline", blocked_convolutions="sometimes")
