"""A network's first convolution computed directly (``korch_ort::direct_conv``): each output pixel and channel as
torch computes it (strides, uneven pads, edges, the bias and activation inside, several images, one or two
threads), only the convolutions it is built for taken, and a unit with it matching ONNX Runtime."""

import dataclasses
import os
import subprocess
import sys
import textwrap

import numpy as np
import onnx
import pytest
import torch
import torch.nn.functional as F
from onnx import TensorProto, helper

from korch.backends import direct_conv, ort_gemm
from korch.ir.ort import run_model
from korch.pipeline import optimize
from korch.runtime import unit

from tests.backends.test_nchwc import assert_the_choice_is_measured_and_recorded
from tests.backends.test_ort_gemm import library  # noqa: F401 (the operators opened, autouse)

DIRECT_VARIANT = dataclasses.replace(unit.VARIANTS["packed for oneDNN"], direct_convolutions=True)
ACTIVATIONS = {(): lambda y: y, ("relu",): torch.relu, ("silu",): F.silu}


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("activation", list(ACTIVATIONS), ids=lambda a: a[0] if a else "none")
@pytest.mark.parametrize("c_out", [16, 32, 64])
@pytest.mark.parametrize("conv", [(1, 3, (1, 1, 1, 1)), (2, 3, (0, 0, 1, 1)), (2, 6, (2, 2, 2, 2)),
                                  (2, 6, (3, 1, 2, 4)), (2, 7, (3, 3, 3, 3)), (4, 7, (3, 3, 3, 3))],
                         ids=lambda c: f"s{c[0]}k{c[1]}p{''.join(map(str, c[2]))}")
def test_a_direct_convolution_computes_torchs(conv, c_out, activation, threads):
    """Every output pixel, the edge tiles and the last columns that fill no tile included (widths of 37 and 50
    pixels), with the bias and the activation inside, for two images of 3 channels and one of 1."""
    stride, k, (top, left, bottom, right) = conv
    rng = torch.Generator().manual_seed(0)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for shape in ((2, 3, 37, 41), (1, 1, 23, 50)):
            x = torch.randn(shape, generator=rng)
            w = torch.randn(c_out, shape[1], k, k, generator=rng) * 0.3
            b = torch.randn(c_out, generator=rng)
            got = ort_gemm.ops().direct_conv(x, torch.from_numpy(direct_conv.taps_outermost(w.numpy())), b,
                                             [stride, top, left, bottom, right], direct_conv.ACTIVATIONS[activation])
            padded = F.pad(x.double(), (left, right, top, bottom))
            expected = ACTIVATIONS[activation](F.conv2d(padded, w.double(), b.double(), stride)).float()
            assert got.shape == (shape[0], *expected.shape[2:], c_out)
            torch.testing.assert_close(got.permute(0, 3, 1, 2), expected, rtol=1e-5, atol=1e-5)
    finally:
        torch.set_num_threads(before)


def test_the_avx2_code_computes_torchs_too():
    """On an AVX-512 CPU the suite runs the AVX-512 code: the AVX2 one, compiled from the same source, is taken in
    a process of its own (``KORCH_DIRECT_CONV_AVX2``), over every stride, kernel and width it is built for."""
    script = textwrap.dedent("""
        import itertools, torch, torch.nn.functional as F
        from korch.backends import direct_conv, ort_gemm
        ort_gemm.open_library()
        worst = 0.0
        for (stride, k), c_out, act in itertools.product(sorted(direct_conv._TAPS), [16, 32, 64], [0, 2]):
            x, w, b = torch.randn(2, 3, 29, 43), torch.randn(c_out, 3, k, k) * 0.3, torch.randn(c_out)
            got = ort_gemm.ops().direct_conv(x, torch.from_numpy(direct_conv.taps_outermost(w.numpy())), b,
                                             [stride, 1, 2, 2, 1], act).permute(0, 3, 1, 2)
            y = F.conv2d(F.pad(x.double(), (2, 1, 1, 2)), w.double(), b.double(), stride)
            expected = (F.silu(y) if act else y).float()
            worst = max(worst, ((got - expected).abs() / (1 + expected.abs())).max().item())
        print(worst)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "KORCH_DIRECT_CONV_AVX2": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert float(done.stdout.split()[-1]) < 1e-5


def _conv_model(c_in: int, c_out: int, k: int, stride: int = 1, group: int = 1, dilation: int = 1) -> onnx.ModelProto:
    w = np.zeros((c_out, c_in // group, k, k), np.float32)
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], strides=[stride] * 2, group=group,
                                                dilations=[dilation] * 2, pads=[k // 2] * 4)], "conv",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, c_in, 32, 32))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [onnx.numpy_helper.from_array(w, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("model, taken", [
    ((3, 16, 6, 2), True), ((3, 32, 3, 2), True), ((4, 16, 3, 1), True), ((1, 32, 3, 1), True),
    ((3, 64, 7, 2), True), ((3, 32, 7, 4), True),
    ((5, 16, 3, 1), False),  # more input channels than a first convolution's
    ((3, 128, 3, 2), False),  # more output channels than the registers hold sums for
    ((3, 24, 3, 2), False),  # output channels not whole vectors
    ((3, 16, 3, 2, 1, 2), False),  # dilated
    ((4, 16, 3, 1, 2), False),  # grouped
    ((3, 16, 5, 1), False),  # a kernel width it is not built for
])
def test_only_the_convolutions_it_is_built_for_are_taken(model, taken):
    graph = optimize(_conv_model(*model), target="cpu", cost="roofline").graph
    conv = next(node for node in graph.nodes if node.op.name == "CONV")
    assert direct_conv.eligible(graph, conv) == taken


def _stem_model(batch: int = 2) -> onnx.ModelProto:
    """YOLOX's kind of stem: a 6x6 stride-2 convolution of 3 channels with a bias and SiLU, a depthwise one, a 1x1
    one with ReLU; and a second 3x3 convolution of the image without bias or activation, its output read by
    two convolutions (so nothing after it is computed inside its call)."""
    rng = np.random.default_rng(0)
    inits = {"stem_w": rng.standard_normal((16, 3, 6, 6)) * 0.2, "stem_b": rng.standard_normal(16),
             "dw_w": rng.standard_normal((16, 1, 3, 3)) * 0.3, "pw_w": rng.standard_normal((32, 16, 1, 1)) * 0.3,
             "side_w": rng.standard_normal((32, 3, 3, 3)) * 0.3, "two_w": rng.standard_normal((32, 32, 1, 1)) * 0.2}
    nodes = [helper.make_node("Conv", ["x", "stem_w", "stem_b"], ["stem"], strides=[2, 2], pads=[2, 2, 2, 2]),
             helper.make_node("Sigmoid", ["stem"], ["gate"]), helper.make_node("Mul", ["stem", "gate"], ["silu"]),
             helper.make_node("Conv", ["silu", "dw_w"], ["dw"], group=16, pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["dw", "pw_w"], ["pw"]), helper.make_node("Relu", ["pw"], ["a"]),
             helper.make_node("Conv", ["x", "side_w"], ["side"], strides=[2, 2], pads=[0, 0, 1, 1]),
             helper.make_node("Conv", ["side", "two_w"], ["two"]), helper.make_node("Add", ["side", "two"], ["b"]),
             helper.make_node("Add", ["a", "b"], ["y"])]
    graph = helper.make_graph(nodes, "stem",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, (batch, 3, 64, 64))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, (batch, 32, 32, 32))],
                              [onnx.numpy_helper.from_array(v.astype(np.float32), k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_unit_computes_the_stem_its_bias_and_silu_in_one_call_and_matches_onnx_runtime():
    model = _stem_model()
    result = optimize(model, target="cpu", cost="roofline")
    graph, kernels = result.graph, [k.nodes for k in result.plan.kernels]
    replaced = direct_conv.replacements(graph, kernels, lambda name, value: name)
    convs = [n for n in graph.nodes if n.op.name == "CONV" and direct_conv.eligible(graph, n)]
    assert len(convs) == 2 and all(replaced[c.name] for c in convs)
    kernel_of = {name: i for i, kernel in enumerate(kernels) for name in kernel}
    stem = next(c for c in convs if graph.constants[c.inputs[1]].shape[2] == 6)
    after = [n for n in graph.nodes if n.op.name in ("ADD", "SIGMOID", "MUL")
             and kernel_of[n.name] == kernel_of[stem.name] and n.name in replaced]
    assert {n.op.name for n in after} <= {"ADD", "SIGMOID", "MUL"} and all(replaced[n.name] is None for n in after)
    x = np.random.default_rng(1).standard_normal((2, 3, 64, 64)).astype(np.float32)
    got = unit.CompiledUnit.from_bytes(unit.compile_unit(graph, result.plan, "cpu", DIRECT_VARIANT))(
        torch.from_numpy(x))[0]
    np.testing.assert_allclose(got.numpy(), run_model(model, {"x": x})["y"], rtol=1e-4, atol=1e-4)


def test_the_unit_choice_measures_direct_convolutions_and_records_them():
    assert_the_choice_is_measured_and_recorded(_stem_model(batch=1), unit.DIRECT_CONVOLUTIONS, "direct_convolutions")
