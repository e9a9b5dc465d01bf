"""torch_ops: a primitive graph as torch operators, checked against ONNX Runtime; one-element constants
reach the compiler as numbers."""

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

from korch.backends.torch_ops import kernel_function
from korch.ir.ops import Op
from korch.ir.ort import run_model
from korch.pipeline import load_model


def _model(nodes, inputs, outputs, constants):
    graph = helper.make_graph(nodes, "ops", [helper.make_tensor_value_info(n, t, s) for n, (t, s) in inputs.items()],
                              [helper.make_tensor_value_info(n, t, s) for n, (t, s) in outputs.items()],
                              [onnx.numpy_helper.from_array(v, n) for n, v in constants.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


F, B = TensorProto.FLOAT, TensorProto.BOOL
SCALAR_CASES = {
    "gelu_cube": ([helper.make_node("Pow", ["x", "three"], ["c"]), helper.make_node("Mul", ["c", "k"], ["y"])],
                  {"y": (F, (4, 8))}),
    "number_first": ([helper.make_node("Add", ["k", "x"], ["a"]), helper.make_node("Sub", ["k", "a"], ["y"])],
                     {"y": (F, (4, 8))}),
    "compare": ([helper.make_node("Less", ["x", "k"], ["y"]), helper.make_node("Equal", ["k", "x"], ["z"])],
                {"y": (B, (4, 8)), "z": (B, (4, 8))}),
    "broadcasting_constant": ([helper.make_node("Mul", ["x", "k11"], ["y"])], {"y": (F, (1, 4, 8))}),
}


@pytest.mark.parametrize("case", sorted(SCALAR_CASES))
def test_one_element_constants_match_onnx_runtime(case):
    nodes, outputs = SCALAR_CASES[case]
    constants = {"three": np.array(3.0, np.float32), "k": np.array([0.5], np.float32),
                 "k11": np.full((1, 1, 1), 0.5, np.float32)}
    used = {i for n in nodes for i in n.input}
    model = _model(nodes, {"x": (F, (4, 8))}, outputs, {n: v for n, v in constants.items() if n in used})
    x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    x[0, :2] = 0.5  # Equal has something to find
    _, graph, _ = load_model(model)
    got = kernel_function(graph, "cpu")(torch.from_numpy(x))
    want = run_model(model, {"x": x})
    for name, value in zip(graph.outputs, got):
        assert value.shape == want[name].shape
        np.testing.assert_allclose(value.numpy(), want[name], rtol=1e-6)


def test_a_constant_exponent_compiles_to_multiplications():
    """Inductor multiplies for ``pow(x, 3.0)``; with the exponent as a tensor it calls a vectorised pow."""
    from torch._inductor.compile_fx import compile_fx
    from torch._inductor.utils import run_and_get_code
    from torch.fx.experimental.proxy_tensor import make_fx

    nodes, outputs = SCALAR_CASES["gelu_cube"]
    model = _model(nodes, {"x": (F, (4, 8))}, outputs,
                   {"three": np.array(3.0, np.float32), "k": np.array([0.5], np.float32)})
    _, graph, _ = load_model(model)
    x = torch.randn(4, 8)
    traced = make_fx(kernel_function(graph, "cpu"))(x)
    assert "pow.Tensor_Scalar" in traced.code, traced.code
    _, codes = run_and_get_code(lambda: compile_fx(traced, [x])(x))
    assert codes and not any("pow(" in code for code in codes), codes


GATHER_INDICES = {"scalar": np.array(1), "progression": np.array([0, 2, 4]), "negative": np.array([-1]),
                  "irregular": np.array([3, 0, 3]), "table": np.array([[0, 1], [1, 2]]),
                  "descending": np.array([4, 2, 0])}


@pytest.mark.parametrize("case", sorted(GATHER_INDICES))
@pytest.mark.parametrize("axis", [0, 1])
def test_a_constant_gather_matches_onnx_runtime(case, axis):
    indices = GATHER_INDICES[case]
    x = np.random.default_rng(1).standard_normal((5, 6, 3)).astype(np.float32)
    out_shape = x.shape[:axis] + indices.shape + x.shape[axis + 1:]
    model = _model([helper.make_node("Gather", ["x", "i"], ["y"], axis=axis)], {"x": (F, x.shape)},
                   {"y": (F, out_shape)}, {"i": indices.astype(np.int64)})
    _, graph, _ = load_model(model)
    (got,) = kernel_function(graph, "cpu")(torch.from_numpy(x))
    np.testing.assert_array_equal(got.numpy(), run_model(model, {"x": x})["y"])


def test_evenly_stepping_constant_indices_are_a_slice_not_an_indirect_load():
    from torch.fx.experimental.proxy_tensor import make_fx

    model = _model([helper.make_node("Gather", ["x", "i"], ["y"], axis=1)], {"x": (F, (2, 6, 3))},
                   {"y": (F, (2, 3))}, {"i": np.array(4, np.int64)})
    _, graph, _ = load_model(model)
    traced = make_fx(kernel_function(graph, "cpu"))(torch.randn(2, 6, 3))
    assert "index_select" not in traced.code and "slice" in traced.code, traced.code


def test_a_pad_filled_at_run_time_stays_on_the_device(monkeypatch):
    """A primitive Pad whose fill is a tensor input (not a constant) never reads it on the host: ``.item()``
    would stall a GPU on every call and cannot be captured in a CUDA graph."""
    from korch.backends.torch_ops import node_function
    from korch.ir import interpret
    from korch.ir.graph import Attrs, Graph, Node, Tensor
    from korch.ir.ops import Op

    graph = Graph(name="pad")
    for name, shape in (("x", (2, 3)), ("v", ()), ("y", (3, 6))):
        graph.add_tensor(Tensor(name=name, shape=shape, dtype="float32"))
    node = Node(op=Op.PAD, inputs=("x", "v"), outputs=("y",), attrs=Attrs({"pads": (0, 1, 1, 2), "mode": "constant"}))
    graph.nodes.append(node)
    graph.inputs, graph.outputs = ["x", "v"], ["y"]
    x, v = torch.randn(2, 3), torch.tensor(-7.5)
    want = interpret.run_node(node, [x, v])[0]
    monkeypatch.setattr(torch.Tensor, "item", lambda self: pytest.fail("a host sync: Tensor.item()"))
    (got,) = node_function(graph, node, "cpu")(x, v)
    assert torch.equal(got, want) and got[2, 0] == -7.5


def test_tanh_through_a_sigmoid_matches_onnx_runtime_over_the_whole_range():
    """On CPUs Tanh runs as 2 sigmoid(2x) - 1 (Inductor's sigmoid is twice as fast as its tanh): the same
    values as ONNX Runtime's Tanh to float32 rounding, at zero, tiny, large and infinite inputs."""
    model = _model([helper.make_node("Tanh", ["x"], ["y"])], {"x": (F, (12,))}, {"y": (F, (12,))}, {})
    x = np.array([0.0, 1e-30, -1e-7, 1e-3, 0.5, -0.5, 3.0, -9.0, 20.0, -100.0, np.inf, -np.inf], np.float32)
    _, graph, _ = load_model(model)
    got = kernel_function(graph, "cpu")(torch.from_numpy(x))[0].numpy()
    np.testing.assert_allclose(got, run_model(model, {"x": x})["y"], rtol=0, atol=3e-7)


# (input shape, weight shape, Conv attributes): the pointwise ones a product computes, and convolutions that
# are not pointwise (a wider window, a stride, groups, padding) and stay convolutions
CONV_CASES = {
    "pointwise_2d": ((2, 6, 5, 7), (4, 6, 1, 1), {}),
    "pointwise_1d": ((1, 8, 9), (3, 8, 1), {}),
    "pointwise_3d": ((1, 5, 3, 4, 2), (6, 5, 1, 1, 1), {}),
    "window": ((1, 6, 5, 7), (4, 6, 3, 3), {"pads": [1, 1, 1, 1]}),
    # few output channels: a window's taps along an axis folded into channels (Candy's last convolution's kind)
    "narrow_9x9": ((1, 8, 12, 11), (3, 8, 9, 9), {"pads": [4, 4, 4, 4]}),
    "narrow_columns_dilated": ((2, 5, 10, 13), (2, 5, 3, 5),
                               {"pads": [1, 2, 0, 1], "strides": [2, 1], "dilations": [1, 2]}),
    "narrow_too_many_taps": ((1, 4, 8, 8), (15, 4, 5, 5), {"pads": [2, 2, 2, 2]}),
    "strided": ((1, 6, 6, 6), (4, 6, 1, 1), {"strides": [2, 2]}),
    "grouped": ((1, 6, 5, 5), (6, 3, 1, 1), {"group": 2}),
    "padded": ((1, 6, 5, 5), (4, 6, 1, 1), {"pads": [1, 0, 1, 0]}),
    # 1-D windows run as 2-D convolutions of height 1 (Whisper's stem: 80 mel bins, then stride 2)
    "window_1d": ((1, 80, 64), (16, 80, 3), {"pads": [1, 1]}),
    "strided_1d": ((1, 16, 64), (16, 16, 3), {"pads": [1, 1], "strides": [2]}),
    "dilated_grouped_1d": ((2, 8, 30), (12, 2, 3), {"pads": [2, 0], "dilations": [2], "group": 4}),
    # depthwise: over channels-last values the sum of the taps (YOLOX's 3x3, its stride-2 downsampling)
    "depthwise": ((1, 16, 9, 9), (16, 1, 3, 3), {"pads": [1, 1, 1, 1], "group": 16}),
    "depthwise_strided": ((1, 32, 12, 11), (32, 1, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2], "group": 32}),
    "depthwise_uneven": ((2, 8, 11, 10), (8, 1, 5, 3),
                         {"pads": [2, 1, 1, 0], "strides": [2, 1], "dilations": [1, 2], "group": 8}),
}


def _conv_graph(case):
    x_shape, w_shape, attrs = CONV_CASES[case]
    weight = np.random.default_rng(1).standard_normal(w_shape).astype(np.float32)
    model = _model([helper.make_node("Conv", ["x", "w"], ["y"], **attrs)], {"x": (F, x_shape)}, {"y": (F, None)},
                   {"w": weight})
    x = np.random.default_rng(0).standard_normal(x_shape).astype(np.float32)
    return model, load_model(model)[1], x


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("case", sorted(CONV_CASES))
def test_convolutions_match_onnx_runtime_in_either_layout(case, channels_last):
    """Whichever layout the values are stored in, and whether or not the product form applies."""
    from korch.backends.torch_ops import node_function

    model, graph, x = _conv_graph(case)
    (node,) = [n for n in graph.nodes if n.op.name == "CONV"]
    fn = node_function(graph, node, "cpu", channels_last=channels_last)
    value = torch.from_numpy(x)
    if channels_last and value.dim() == 4:
        value = value.to(memory_format=torch.channels_last)
    (got,) = fn(value, torch.from_numpy(graph.constants[node.inputs[1]]))
    np.testing.assert_allclose(got.numpy(), run_model(model, {"x": x})["y"], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("channels_last", [False, True])
def test_a_pointwise_convolution_is_a_product_that_copies_nothing(channels_last):
    """A 1x1 convolution is one ``bmm`` over views of its input, in the layout the input is stored in: no
    convolution, no copy. The output is laid out as the input was."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from korch.backends.torch_ops import node_function

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.called = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.called.append(func.__name__.split(".")[0])
            return func(*args, **(kwargs or {}))

    _, graph, x = _conv_graph("pointwise_2d")
    (node,) = [n for n in graph.nodes if n.op.name == "CONV"]
    memory_format = torch.channels_last if channels_last else torch.contiguous_format
    value = torch.from_numpy(x).to(memory_format=memory_format)
    weight = torch.from_numpy(graph.constants[node.inputs[1]])
    with Ops() as ops:
        (got,) = node_function(graph, node, "cpu", channels_last=channels_last)(value, weight)
    assert "bmm" in ops.called
    assert not {"convolution", "clone", "copy_", "contiguous", "_unsafe_view"} & set(ops.called), ops.called
    assert got.is_contiguous(memory_format=memory_format)


def test_a_depthwise_convolution_over_channels_last_values_is_its_taps_sum():
    """Over channels-last values a depthwise convolution is multiplications and additions of windows, which
    Inductor fuses into one loop (no convolution call); over NCHW ones it stays a convolution."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from korch.backends.torch_ops import node_function

    class Ops(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            called.append(func.__name__.split(".")[0])
            return func(*args, **(kwargs or {}))

    model, graph, x = _conv_graph("depthwise_strided")
    (node,) = [n for n in graph.nodes if n.op.name == "CONV"]
    weight = torch.from_numpy(graph.constants[node.inputs[1]])
    for channels_last, convolves in ((True, False), (False, True)):
        called = []
        value = torch.from_numpy(x).to(memory_format=torch.channels_last if channels_last else torch.contiguous_format)
        with Ops():
            node_function(graph, node, "cpu", channels_last=channels_last)(value, weight)
        assert ("convolution" in called) == convolves, called


@pytest.mark.parametrize("case, folded", [("narrow_9x9", (27, 8, 1, 9)), ("narrow_columns_dilated", (10, 5, 3, 1)),
                                           ("narrow_too_many_taps", (15, 4, 5, 5)), ("window", (12, 6, 1, 3))])
def test_a_convolution_of_few_output_channels_folds_one_axis_taps_into_channels(case, folded):
    """A convolution of fewer output channels than oneDNN's block convolves one tap along an axis, that axis's
    taps as output channels (the wider axis of stride 1, while the channels stay few), then sums the shifted
    planes; the library's form (``pointwise_products=False``) convolves with the weight as it is."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from korch.backends.torch_ops import node_function

    class Weights(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.__name__.startswith("convolution"):
                shapes.append(tuple(args[1].shape))
            return func(*args, **(kwargs or {}))

    model, graph, x = _conv_graph(case)
    (node,) = [n for n in graph.nodes if n.op.name == "CONV"]
    weight = torch.from_numpy(graph.constants[node.inputs[1]])
    for own, expected in ((True, folded), (False, tuple(weight.shape))):
        shapes = []
        with Weights():
            node_function(graph, node, "cpu", pointwise_products=own)(torch.from_numpy(x), weight)
        assert shapes == [expected]


def _mish_model(op_type="Mish"):
    nodes = [helper.make_node("Mish", ["x"], ["y"])] if op_type == "Mish" else \
        [helper.make_node("Softplus", ["x"], ["s"]), helper.make_node("Tanh", ["s"], ["t"]),
         helper.make_node("Mul", ["x", "t"], ["y"])]
    return _model(nodes, {"x": (F, (40,))}, {"y": (F, (40,))}, {})


MISH_EDGES = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-30, -1e-7, 0.5, -0.5, 3.0, -9.0, 19.9, 20.0, 20.1, 44.0,
              89.0, 1e30, -20.0, -87.0, -100.0, -1e30]


@pytest.mark.parametrize("op_type", ["Mish", "decomposed"])
def test_mishs_tanh_of_softplus_is_one_exponential_and_matches_onnx_runtime(op_type):
    """On CPUs a kernel's tanh of a softplus is computed from the softplus's input, n / (n + 2) with
    n = e^x (e^x + 2): ONNX Runtime's values (its Mish, or its Softplus, Tanh and Mul) at every edge."""
    from korch.backends.torch_ops import rewritten_steps

    model = _mish_model(op_type)
    _, graph, _ = load_model(model)
    ops = {n.name: n.op for n in graph.nodes}
    assert [ops[n] for n in rewritten_steps(graph, [list(ops)], "cpu")] == [Op.TANH]
    x = np.array(MISH_EDGES + list(np.linspace(-30, 30, 40 - len(MISH_EDGES))), np.float32)
    got = kernel_function(graph, "cpu")(torch.from_numpy(x))[0].numpy()
    want = run_model(model, {"x": x})["y"]
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-30)


def test_mish_is_rewritten_only_within_one_kernel_on_a_cpu():
    from korch.backends.torch_ops import rewritten_steps

    _, graph, _ = load_model(_mish_model("decomposed"))
    names = [n.name for n in graph.nodes]
    assert len(rewritten_steps(graph, [names], "cpu")) == 1
    assert rewritten_steps(graph, [names], "cuda") == {}  # GPUs keep their own transcendentals
    split = [[n] for n in names]  # the softplus's kernel is not the tanh's
    assert rewritten_steps(graph, split, "cpu") == {}


def test_inductor_computes_a_mish_kernel_without_log1p():
    from korch.backends.inductor import InductorBackend
    from tests.backends.kernels import check_built

    _, graph, _ = load_model(_mish_model("Mish"))
    built = InductorBackend().build(graph, "cpu")
    check_built(built, graph)
    assert "log1p" not in built.source and "exp_u20" in built.source
