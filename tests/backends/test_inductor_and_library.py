"""The Inductor (C++ on CPUs) and library backends against the reference executor."""

import numpy as np
import pytest

from korch.backends.check import check, random_inputs
from korch.backends.inductor import InductorBackend, LibraryConvBackend, count_launches
from korch.backends.library import LibraryBackend
from korch.backends.torch_ops import kernel_function
from korch.ir.subgraph import extract
from korch.orchestrate.candidates import enumerate_candidates
from korch.ir import interpret
from korch.pipeline import load_model
from tests.backends import cases
from tests.backends.kernels import check_built


@pytest.mark.parametrize("case", list(cases.ALL))
def test_inductor_builds_the_fused_cases(case):
    graph = cases.ALL[case]()
    built = InductorBackend().build(graph, "cpu")
    check_built(built, graph)
    assert built.launches >= 1
    assert "def call(" in built.source


def test_inductor_fuses_softmax_into_one_cpp_kernel():
    built = InductorBackend().build(cases.softmax(), "cpu")
    assert built.launches == 1


def test_launch_count_reads_generated_kernels_and_library_calls():
    code = ("cpp_fused_0 = async_compile.cpp_pybinding(['float*'], '''...''')\n"
            "def call(args):\n    extern_kernels.mm(a, b, out=c)\n    cpp_fused_0(c)\n"
            "def benchmark_compiled_module():\n    extern_kernels.mm(x, y)\n")
    assert count_launches(code) == 2


def test_library_claims_single_primitives_only():
    lib = LibraryBackend()
    assert lib.claims(cases.gelu_erf()) is not None
    softmax = cases.softmax()
    single = extract(softmax, [0], softmax.inputs, [softmax.nodes[0].outputs[0]])
    assert lib.claims(single) is None
    check_built(lib.build(single, "cpu"), single)


@pytest.mark.parametrize("model", ["zoo:candy", "zoo:segformer_b0"])
def test_torch_lowering_matches_the_reference_on_zoo_candidates(model):
    """The fast torch lowering (library eager, Inductor's input) on a seeded sample of real candidates."""
    _, graph, _ = load_model(model)
    candidates = enumerate_candidates(graph).candidates
    rng = np.random.default_rng(0)
    for i in rng.choice(len(candidates), 60, replace=False):
        c = candidates[i]
        k = extract(graph, c.nodes, c.inputs, c.outputs)
        xs = random_inputs(k)
        expected = interpret.run(k, dict(zip(k.inputs, xs)))
        for name, got in zip(k.outputs, kernel_function(k, "cpu")(*xs)):
            np.testing.assert_allclose(got.numpy(), expected[name], rtol=1e-4, atol=1e-4, err_msg=c.signature)


def test_a_wrong_kernel_fails_its_check():
    graph = cases.softmax()

    class Wrong:
        backend, launches, source = "wrong", 1, None

        def __call__(self, *inputs, out=None):
            out[0].copy_(inputs[0])  # not a softmax
            return list(out)
    result = check(Wrong(), graph)
    assert not result.ok and "relative error" in result.message


def test_an_unwritten_output_fails_its_check():
    graph = cases.softmax()

    class Lazy:
        backend, launches, source = "lazy", 1, None

        def __call__(self, *inputs, out=None):
            return list(out)  # leaves the poisoned buffer
    assert not check(Lazy(), graph).ok


@pytest.mark.parametrize("case", ["conv_bias_relu", "pool_add", "instance_norm_relu_pad", "pointwise_conv_silu",
                                  "depthwise_conv_silu"])
def test_a_channels_last_kernel_reads_and_writes_channels_last(case):
    """A kernel graph whose 4-D values are stored channels-last (``extract(..., layout=)``): Inductor builds it for
    channels-last inputs and outputs, and it checks against the reference (which sees values, not strides); the
    library, which reads contiguous tensors only, declines it."""
    import torch

    from korch.backends.base import stored_as
    from korch.backends.check import RandomArena
    from korch.ir.graph import CHANNELS_LAST

    contiguous = cases.ALL[case]()
    graph = extract(contiguous, range(len(contiguous.nodes)), contiguous.inputs, contiguous.outputs,
                    layout=CHANNELS_LAST)
    assert {graph.tensors[t].layout for t in (*graph.inputs, *graph.outputs)} == {CHANNELS_LAST}
    built = InductorBackend().build(graph, "cpu")
    assert check(built, graph).ok
    inputs = RandomArena().inputs(graph)
    assert all(x.is_contiguous(memory_format=torch.channels_last) for x in inputs)
    (out,) = built(*inputs)
    assert out.is_contiguous(memory_format=torch.channels_last) and not out.is_contiguous()
    (want,) = InductorBackend().build(contiguous, "cpu")(*[stored_as(x, "contiguous") for x in inputs])
    torch.testing.assert_close(out, want)
    assert "contiguous boundaries only" in LibraryBackend().claims(graph)


def test_on_a_cpu_inductor_returns_its_outputs_in_their_layouts_and_never_an_input():
    """A CPU kernel returns what it computes (the compiled unit copies nothing into buffers passed in), each
    output stored as planned; a kernel that only reshapes its input returns a copy, not a view of it."""
    import dataclasses

    import torch
    from onnx import helper

    from korch.ir.graph import CHANNELS_LAST
    from tests.backends.kernels import kernel

    conv = cases.conv_bias_relu()
    built = InductorBackend().build(conv, "cpu")
    assert not built.in_place
    check_built(built, conv)
    for name in (*conv.inputs, *conv.outputs):
        conv.tensors[name] = dataclasses.replace(conv.tensors[name], layout=CHANNELS_LAST)
    laid = InductorBackend().build(conv, "cpu")
    x = random_inputs(conv)[0].contiguous(memory_format=torch.channels_last)
    (y,) = laid(x)
    assert y.is_contiguous(memory_format=torch.channels_last) and not y.is_contiguous()

    reshape = kernel([helper.make_node("Reshape", ["x", "shape"], ["y"])], {"x": (4, 6)}, {"y": (24,)},
                     {"shape": np.array([24], np.int64)})
    built = InductorBackend().build(reshape, "cpu")
    x = random_inputs(reshape)[0]
    (y,) = built(x)
    assert y.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
    np.testing.assert_array_equal(y.numpy(), x.reshape(24).numpy())
    out = torch.empty(24)
    assert built(x, out=[out])[0] is out and torch.equal(out, y)


def test_a_cpu_kernel_reads_a_view_with_other_strides_than_it_was_compiled_for():
    """A kernel-by-kernel CPU executable passes what the library returns, a slice of a larger value among them
    (EfficientViT's measured plan); the compiled kernel asserts its strides, so it takes the view as stored."""
    import torch
    from onnx import helper

    from tests.backends.kernels import kernel

    graph = kernel([helper.make_node("Exp", ["x"], ["e"]), helper.make_node("Relu", ["e"], ["y"])],
                   {"x": (1, 16, 64, 1)}, {"y": (1, 16, 64, 1)}, {})
    built = InductorBackend().build(graph, "cpu")
    whole = torch.randn(1, 16, 64, 17)
    view = whole[..., 3:4]
    assert not view.is_contiguous()
    (y,) = built(view)
    torch.testing.assert_close(y, torch.relu(torch.exp(view)))


def test_a_cpu_kernel_is_compiled_as_the_unit_compiles_it_weights_packed_activation_as_post_op():
    """Measured alone, a convolution with its bias and HardSwish runs as one packed oneDNN call with the
    activation as its post-op, as inside a compiled unit (unfrozen, it was an ATen convolution and a loop)."""
    from tests.runtime.test_unit import _activations_model

    _, graph, _ = load_model(_activations_model())
    built = InductorBackend().build(graph, "cpu")
    assert "mkldnn._convolution_pointwise" in built.source
    assert "hardswish" in built.source
    assert "aten.convolution" not in built.source
    check_built(built, graph)


def test_a_cpu_kernels_product_is_packed_for_onednn_as_in_the_unit_its_gelu_a_post_op():
    """Measured alone, a product with its bias and GELU runs as one packed oneDNN call with the GELU as its
    post-op, as the unit's ahead-of-time compile runs it; compiled as a Python module Inductor packed the weight
    for MKL (``mkl._mkl_linear``), which takes no post-op, and computed the GELU in a loop after it."""
    from onnx import helper

    from tests.backends.kernels import kernel

    rng = np.random.default_rng(5)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["a"]),
             helper.make_node("Gelu", ["a"], ["y"])]
    graph = kernel(nodes, {"x": (24, 32)}, {"y": (24, 48)},
                   {"w": rng.standard_normal((32, 48)).astype(np.float32) / 6,
                    "b": rng.standard_normal(48).astype(np.float32)})
    built = InductorBackend().build(graph, "cpu")
    calls = [line for line in built.source.split("def call(", 1)[1].splitlines() if not line.lstrip().startswith("#")]
    assert any("mkldnn._linear_pointwise" in line and "'gelu'" in line for line in calls), "\n".join(calls)
    assert not any("_mkl_linear" in line for line in calls)
    assert built.launches == 1
    check_built(built, graph)


def _pointwise_conv_model():
    """A 1x1 convolution with its bias and a ReLU, then a 3x3 one (of 16 output channels: not one of few,
    ``torch_ops.narrow_conv_axis``)."""
    import onnx
    from onnx import TensorProto, helper

    rng = np.random.default_rng(11)
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c"]), helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Conv", ["r", "w3"], ["y"], pads=[1, 1, 1, 1])]
    inits = [onnx.numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)
             for name, shape in (("w1", (16, 8, 1, 1)), ("b1", (16,)), ("w3", (16, 16, 3, 3)))]
    graph = helper.make_graph(nodes, "pointwise", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, 8, 6, 6))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, (1, 16, 6, 6))], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


@pytest.fixture
def any_size_for_the_library(monkeypatch):
    """The library-convolution backend claims these small test kernels' convolutions (it leaves small ones to
    korch's forms: ``test_the_library_convolution_backend_claims_only_convolutions_large_enough_to_win``)."""
    from korch.backends import inductor

    monkeypatch.setattr(inductor, "LIBRARY_POINTWISE_MIN_FLOPS", 0)
    monkeypatch.setattr(inductor, "LIBRARY_DEPTHWISE_MIN_FLOPS", 0)


def test_a_kernels_1x1_convolution_is_measured_both_as_a_product_and_as_the_librarys_convolution(
        any_size_for_the_library):
    """The Inductor backend computes a 1x1 convolution as a product (no oneDNN set-up); the library-convolution
    backend builds the same kernel with oneDNN's packed convolution, its ReLU as post-op. Both match the
    reference; only kernels with a 1x1 convolution are claimed, on CPUs only."""
    from korch.backends.registry import backends_for

    _, graph, _ = load_model(_pointwise_conv_model())
    last = graph.nodes[-1]
    assert last.op.value == "Conv" and len(graph.nodes) >= 3
    kernel = extract(graph, range(len(graph.nodes) - 1), graph.inputs, [last.inputs[0]])
    products, library = InductorBackend().build(kernel, "cpu"), LibraryConvBackend().build(kernel, "cpu")
    assert "bmm" in products.source and "_convolution_pointwise" not in products.source
    assert "_convolution_pointwise" in library.source and "bmm" not in library.source
    assert library.backend == LibraryConvBackend.name != products.backend
    for built in (products, library):
        check_built(built, kernel)
    three_by_three = extract(graph, [len(graph.nodes) - 1], [last.inputs[0]], graph.outputs)
    assert LibraryConvBackend().claims(three_by_three) is not None
    assert LibraryConvBackend().claims(kernel) is None
    assert not LibraryConvBackend().supports_device("cuda")
    names = lambda target: [b.name for b in backends_for(target)]
    assert LibraryConvBackend.name in names("cpu") and LibraryConvBackend.name not in names("h100")


@pytest.mark.parametrize("pointwise", [True, False])
def test_the_library_convolution_backend_claims_only_convolutions_large_enough_to_win(pointwise):
    """oneDNN's set-up decides a small convolution, so korch's form of it (a product, the taps' sum) is all that is
    measured; from the least size on (``LIBRARY_*_MIN_FLOPS``), the library's convolution is measured beside it."""
    from onnx import helper

    from korch.backends import inductor
    from korch.ir.analysis import node_flops
    from korch.ir.graph import CHANNELS_LAST
    from tests.backends.kernels import kernel

    def conv_kernel(channels: int, side: int):
        weight = (channels, channels, 1, 1) if pointwise else (channels, 1, 3, 3)
        attrs = {} if pointwise else {"pads": [1, 1, 1, 1], "group": channels}
        graph = kernel([helper.make_node("Conv", ["x", "w"], ["y"], **attrs)], {"x": (1, channels, side, side)},
                       {"y": (1, channels, side, side)}, {"w": np.ones(weight, np.float32)})
        return extract(graph, range(len(graph.nodes)), graph.inputs, graph.outputs, layout=CHANNELS_LAST)

    least = inductor.LIBRARY_POINTWISE_MIN_FLOPS if pointwise else inductor.LIBRARY_DEPTHWISE_MIN_FLOPS
    small, large = conv_kernel(32, 16), conv_kernel(128, 64)
    assert node_flops(small, small.nodes[0]) < least <= node_flops(large, large.nodes[0])
    assert LibraryConvBackend().claims(small) is not None and LibraryConvBackend().claims(large) is None
    assert InductorBackend().claims(small) is None and InductorBackend().claims(large) is None


def test_a_one_dimensional_convolution_is_packed_for_onednn_like_a_two_dimensional_one():
    """A 1-D convolution of 80 channels by 64 frames (batch 1, at most 20480 input elements) went to ATen's
    slow im2col loop; as a 2-D one of height 1 freezing packs it for oneDNN, and it still matches ONNX Runtime."""
    from onnx import helper

    from tests.backends.kernels import kernel

    graph = kernel([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1])], {"x": (1, 80, 64)}, {"y": (1, 16, 64)},
                   {"w": np.random.default_rng(0).standard_normal((16, 80, 3)).astype(np.float32)})
    built = InductorBackend().build(graph, "cpu")
    calls = [line for line in built.source.splitlines() if not line.lstrip().startswith("#")]
    assert any("mkldnn._convolution_pointwise" in line for line in calls)
    assert not any("convolution(" in line for line in calls)  # ATen's call (extern_kernels.convolution)
    check_built(built, graph)


def test_a_channels_last_depthwise_convolution_is_one_loop_without_a_convolution_call(any_size_for_the_library):
    """Over channels-last values Inductor computes a depthwise convolution with its bias and SiLU in its own
    loop (``torch_ops._depthwise_conv``); over NCHW ones it calls the library's convolution."""
    from korch.ir.graph import CHANNELS_LAST

    contiguous = cases.depthwise_conv_silu()
    laid = extract(contiguous, range(len(contiguous.nodes)), contiguous.inputs, contiguous.outputs,
                   layout=CHANNELS_LAST)
    built = {layout: InductorBackend().build(graph, "cpu") for layout, graph in (("nchw", contiguous), ("nhwc", laid))}
    assert "convolution" in built["nchw"].source and "convolution" not in built["nhwc"].source
    check_built(built["nhwc"], laid)
    # the library's convolution is the other candidate, measured beside it (only where the taps would be used)
    assert LibraryConvBackend().claims(contiguous) is not None and LibraryConvBackend().claims(laid) is None
    by_library = LibraryConvBackend().build(laid, "cpu")
    assert "convolution" in by_library.source
    check_built(by_library, laid)


def test_a_convolution_of_few_output_channels_is_measured_with_its_taps_folded_and_by_the_library():
    """Candy's last convolution's kind (3 output channels, a 9x9 window): the Inductor backend convolves its rows'
    taps as 27 channels and sums the shifted planes with the bias after them in its own loop; the library-convolution
    backend claims the kernel too and convolves the weight as it is. Both match the reference."""
    from onnx import helper

    from tests.backends.kernels import kernel

    rng = np.random.default_rng(3)
    graph = kernel([helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[4, 4, 4, 4])], {"x": (1, 8, 14, 12)},
                   {"y": (1, 3, 14, 12)}, {"w": rng.standard_normal((3, 8, 9, 9)).astype(np.float32),
                                           "b": rng.standard_normal(3).astype(np.float32)})
    assert LibraryConvBackend().claims(graph) is None
    folded, library = InductorBackend().build(graph, "cpu"), LibraryConvBackend().build(graph, "cpu")
    assert "(1, 27, " in folded.source and "(1, 27, " not in library.source  # the folded taps' planes
    for built in (folded, library):
        check_built(built, graph)
