"""ONNX Runtime's blocked-layout convolutions in a compiled unit: values kept in MLAS's NCHWc layout between kernels.

ONNX Runtime runs a convolution network with its values in a blocked layout: a (N, C, H, W) value stored as
(N, C/B, H, W, B), its channels padded to MLAS's block B (16 with AVX-512, 8 with AVX2), so that its
convolutions read and write B channels of a pixel as one vector. On blocked values they beat oneDNN's
channels-last ones 1.5-2x on depthwise convolutions and up to 1.6x on 1x1 ones, and lose it all when they
reorder in and out at every call (``benchmarks/ort_nchwc_direct.py``). So here they pay only as a layout kept:

* ``replacements`` gives every 2-D float32 convolution by a constant weight a step calling
  ``korch_ort::nchwc_conv`` (``ort_gemm_op.cpp``: one-node ``com.microsoft.nchwc`` sessions, the output
  blocks split over torch's threads), with the per-channel bias, a residual sum and the ReLU or clip that
  follow it in its kernel inside the call (as ONNX Runtime fuses them);
* an elementwise primitive whose full-size inputs are stored blocked computes on the blocked arrays and stores
  its output blocked (a residual sum, a SiLU, a squeeze-and-excitation scale: Inductor's loops read and write
  the 5-D arrays contiguously), its per-channel operands blocked too;
* a pool, a reduction over the image, a gather or slice along rows or columns, a concatenation of whole blocks
  or a slice of channels from a block boundary whose input is stored blocked computes on the blocked arrays
  (``_layout_step``: YOLO's SPP pools, CSP concatenations and upsamplings, squeeze-and-excitation averages);
* any other reader sees a blocked value through ``from_blocked`` (a view Inductor's loops index), and a
  convolution reading a value not stored blocked converts it with ``to_blocked`` in its own kernel.

A blocked value's name in a unit's steps is its name with ``BLOCKED`` appended. The padded channels hold
finite values (the padded weights and biases are zeros), which a convolution multiplies by zero weights: an
elementwise step over padded channels is blocked only where it keeps finite values finite (no division).
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Collection, Mapping, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from korch.backends import ort_gemm
from korch.backends.conv_epilogue import Epilogue, per_channel_shape
from korch.ir.graph import Graph, Node
from korch.ir.ops import ELEMENTWISE, WINDOW, Op

BLOCKED = "#nchwc"
NCHWC_DOMAIN = "com.microsoft.nchwc"
# elementwise operations that keep finite values finite: over padded channels a blocked step must (a convolution
# multiplies the padded channels by zero weights, and 0 * inf is NaN)
_FINITE = frozenset({Op.ADD, Op.SUB, Op.MUL, Op.MAX, Op.MIN, Op.NEG, Op.ABS, Op.RELU, Op.SIGMOID, Op.TANH, Op.ERF})
# reductions over the image computed on blocked arrays (not a product: over padded channels it could overflow)
_IMAGE_REDUCTIONS = frozenset({Op.REDUCE_SUM, Op.REDUCE_MEAN, Op.REDUCE_MAX, Op.REDUCE_MIN})
# activation inside the convolution: kinds of korch_ort::nchwc_conv's activation list (its first number)
RELU, CLIP = 1.0, 2.0

Step = tuple[Callable, tuple[str, ...], tuple[str, ...]]


@functools.cache
def block() -> int:
    """MLAS's channel block on this CPU: the channels ONNX Runtime's ``ReorderInput`` pads four to (it takes
    multiples of 4)."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("ReorderInput", ["x"], ["y"], domain=NCHWC_DOMAIN)], "block",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 1, 1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(NCHWC_DOMAIN, 1)],
                              ir_version=8)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return int(session.run(None, {"x": np.zeros((1, 4, 1, 1), np.float32)})[0].shape[1])


def padded(channels: int, size: int) -> int:
    return -(-channels // size) * size


def to_blocked(x: torch.Tensor, size: int) -> torch.Tensor:
    """A (N, C, H, W) value (fewer axes: leading ones added) as (N, C/size, H, W, size), channels zero-padded."""
    if x.dim() < 4:
        x = x.reshape((1,) * (4 - x.dim()) + tuple(x.shape))
    n, c, h, w = x.shape
    if padded(c, size) != c:
        x = F.pad(x, (0, 0, 0, 0, 0, padded(c, size) - c))
    return x.reshape(n, -1, size, h, w).permute(0, 1, 3, 4, 2).contiguous()


def from_blocked(x: torch.Tensor, channels: int) -> torch.Tensor:
    """The (N, channels, H, W) value a blocked array holds (a view where torch can make one)."""
    n, blocks, h, w, size = x.shape
    return x.permute(0, 1, 4, 2, 3).reshape(n, blocks * size, h, w)[:, :channels]


def _is_depthwise(weight: np.ndarray, group: int) -> bool:
    return group > 1 and weight.shape[1] == 1 and weight.shape[0] == group


def eligible(graph: Graph, node: Node) -> bool:
    """A float32 2-D CONV of an activation by a constant weight, of one group or depthwise (one input and one
    output channel a group)."""
    if node.op is not Op.CONV or len(node.inputs) != 2 or node.inputs[0] in graph.constants:
        return False
    weight = graph.constants.get(node.inputs[1])
    if weight is None or weight.ndim != 4 or weight.dtype != np.float32 or \
            graph.tensor(node.inputs[0]).dtype != "float32":
        return False
    group = node.attrs["group"]
    return group == 1 or _is_depthwise(weight, group)


def reads_unblocked(graph: Graph, node: Node, size: int) -> bool:
    """Whether ``node``'s convolution reads its input NCHW, unblocked (``_unblocked_input``)."""
    return _unblocked_input(graph.tensor(node.inputs[0]).shape[1], node.attrs["group"], size)


def _unblocked_input(channels: int, group: int, size: int) -> bool:
    """MLAS's form for fewer input channels than a block in one group (a network's first convolution, of 3
    colour channels): its input NCHW, unblocked."""
    return group == 1 and channels < size


def blocked_weight(weight: np.ndarray, group: int, size: int, unblocked_input: bool) -> np.ndarray:
    """``weight`` (O, I, kh, kw) padded to blocks and in the order nchwc.Conv reads: OIHWBo (output channels
    innermost) for depthwise ones and those reading an unblocked input, else OIHWBiBo."""
    o, i, kh, kw = weight.shape
    po = padded(o, size)
    if _is_depthwise(weight, group) or unblocked_input:
        w = np.zeros((po, i, kh, kw), np.float32)
        w[:o] = weight
        return w.reshape(po // size, size, i, kh, kw).transpose(0, 2, 3, 4, 1).reshape(po, i, kh, kw).copy()
    pi = padded(i, size)
    w = np.zeros((po, pi, kh, kw), np.float32)
    w[:o, :i] = weight
    return w.reshape(po // size, size, pi // size, size, kh, kw).transpose(0, 2, 4, 5, 3, 1) \
        .reshape(po, pi, kh, kw).copy()


# korch_ort::nchwc_conv's spec: block, kernel (2), strides (2), pads (top, left, bottom, right), dilations (2),
# group, output channels
def spec(graph: Graph, node: Node, size: int) -> list[int]:
    a = node.attrs
    weight = graph.constants[node.inputs[1]]
    return [size, *weight.shape[2:], *a["strides"], *a["pads"], *a["dilations"], a["group"], weight.shape[0]]


def _model_bytes(w: torch.Tensor, b: torch.Tensor, sum: bool, spec: Sequence[int], activation: Sequence[float],
                 first: int, last: int) -> torch.Tensor:
    """The one-node nchwc.Conv model of output blocks [first, last) of a convolution (what
    ``korch_ort::nchwc_conv`` opens a session on per part): input x (and with ``sum`` b, added before the
    activation), output y, the blocked weight and padded bias its initializers, the activation inside."""
    from onnx import TensorProto, helper, numpy_helper

    size, kernel, strides, pads, dilations, group = spec[0], spec[1:3], spec[3:5], spec[5:9], spec[9:11], spec[11]
    weight = w.detach().cpu().numpy()
    full = blocked_weight(weight, group, size, _unblocked_input(weight.shape[1], group, size))
    bias = np.zeros(full.shape[0], np.float32)
    bias[:weight.shape[0]] = b.detach().cpu().numpy().reshape(-1)
    part = slice(first * size, last * size)
    attrs = {"kernel_shape": list(kernel), "strides": list(strides), "pads": list(pads),
             "dilations": list(dilations), "group": (last - first) * size if group > 1 else 1}
    if activation and activation[0] == RELU:
        attrs["activation"] = "Relu"
    elif activation and activation[0] == CLIP:
        attrs.update(activation="Clip", activation_params=[float(activation[1]), float(activation[2])])
    inputs = ["x", "b"] if sum else ["x"]
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "weight", "bias", *inputs[1:]], ["y"], domain=NCHWC_DOMAIN, **attrs)],
        "korch_nchwc_conv", [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, None, None, None]) for n in inputs],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, None, None, None])],
        [numpy_helper.from_array(np.ascontiguousarray(full[part]), "weight"),
         numpy_helper.from_array(np.ascontiguousarray(bias[part]), "bias")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(NCHWC_DOMAIN, 1)],
                              ir_version=8)
    return ort_gemm._serialized(model)


_LIBRARY = torch.library.Library("korch", "FRAGMENT")
_LIBRARY.define("ort_nchwc_model(Tensor w, Tensor b, bool sum, int[] spec, float[] activation, int first, int last) "
                "-> Tensor")
_LIBRARY.impl("ort_nchwc_model", _model_bytes, "CompositeExplicitAutograd")


def output_size(x: torch.Tensor, spec: Sequence[int]) -> tuple[int, int]:
    kernel, strides, pads, dilations = spec[1:3], spec[3:5], spec[5:9], spec[9:11]
    return tuple((x.shape[2 + i] + pads[i] + pads[i + 2] - dilations[i] * (kernel[i] - 1) - 1) // strides[i] + 1
                 for i in range(2))


def fake_conv(x, w, b, sum, spec, activation, unit, slot):
    """``korch_ort::nchwc_conv``'s output, for tracing."""
    size = spec[0]
    return x.new_empty(x.shape[0], padded(spec[12], size) // size, *output_size(x, spec), size)


def conv_function(unit: int, slot: int, spec: Sequence[int], activation: Sequence[float]):
    """The step of a convolution: its input (blocked, or NCHW where ``reads_unblocked``), weight, bias and a
    blocked residual to add (or None) in, its output blocked out."""
    spec, activation = list(spec), list(activation)

    def run(x, w, b, residual=None):
        return [ort_gemm.ops().nchwc_conv(x, w, b, residual, spec, activation, unit, slot)]
    return run


def replacements(graph: Graph, kernels: Sequence[Sequence[str]], token: int,
                 add_constant: Callable[[str, np.ndarray], str], size: int | None = None,
                 skip: Collection[str] = ()) -> dict[str, Step | None]:
    """The blocked convolutions of ``graph``, whose planned ``kernels`` (primitive names, in order) are given:
    each eligible CONV's step (but those of ``skip``, which other steps compute), and None for the primitives its
    call computes. ``add_constant`` adds a zero bias where a convolution has none."""
    size = size or block()
    consumers = graph.consumers()
    nodes = {node.name: node for node in graph.nodes}
    producer = {t: node.name for node in graph.nodes for t in node.outputs}
    order = {name: i for i, name in enumerate(name for kernel in kernels for name in kernel)}
    slots = itertools.count()
    replaced: dict[str, Step | None] = {}
    for kernel in kernels:
        names = set(kernel)
        for node in (nodes[name] for name in kernel if name not in skip and eligible(graph, nodes[name])):
            def earlier(value: str, at: int = order[node.name]) -> bool:
                return value not in producer or order[producer[value]] < at
            fused = Epilogue(graph, node, names, consumers, earlier)
            bias = fused.bias or add_constant(f"{node.name}/bias",
                                              np.zeros(graph.constants[node.inputs[1]].shape[0], np.float32))
            x = node.inputs[0] if reads_unblocked(graph, node, size) else node.inputs[0] + BLOCKED
            inputs = (x, node.inputs[1], bias) + ((fused.residual + BLOCKED,) if fused.residual else ())
            function = conv_function(token, next(slots), spec(graph, node, size), _activation(fused.activation))
            replaced[node.name] = (function, inputs, ((fused.output or node.output) + BLOCKED,))
            replaced.update(dict.fromkeys(n.name for n in fused.nodes))
    return replaced


def _activation(activation: tuple) -> list[float]:
    """An ``Epilogue``'s activation as ``korch_ort::nchwc_conv`` takes it."""
    return {"relu": [RELU], "clip": [CLIP, *activation[1:]]}[activation[0]] if activation else []


def blocked_step(graph: Graph, node: Node, step: Step, blocked: Collection[str], size: int) -> Step | None:
    """``step`` (computing ``node``) on blocked arrays, where what it reads is stored blocked (``blocked``: the
    names of such values), else None: an elementwise one (``_elementwise_step``), or a layout or window primitive
    that keeps the layout (``_layout_step``)."""
    if len(step[2]) != 1:
        return None
    out = graph.tensor(step[2][0])
    if out.rank != 4 or out.dtype != "float32" or not all(isinstance(d, int) for d in out.shape):
        return None
    if node.op in ELEMENTWISE:
        return _elementwise_step(graph, node, step, blocked, size)
    return _layout_step(graph, node, step, blocked, size) if tuple(step[1]) == tuple(node.inputs) else None


def _elementwise_step(graph: Graph, node: Node, step: Step, blocked: Collection[str], size: int) -> Step | None:
    """An elementwise step whose every full-size input is stored blocked and whose other inputs broadcast by
    channel, on the blocked arrays."""
    out = graph.tensor(step[2][0])
    if out.shape[1] % size and node.op not in _FINITE:
        return None
    inputs, full = [], False
    for name in step[1]:
        if not name:
            return None
        t = graph.tensor(name)
        if t.dtype != "float32":
            return None
        if tuple(t.shape) == tuple(out.shape):
            if name not in blocked:
                return None
            inputs.append(name + BLOCKED)
            full = True
        elif t.numel == 1:
            inputs.append(name)
        elif per_channel_shape(t.shape, out.shape[1], out.shape[0]):
            inputs.append(name + BLOCKED)
        else:
            return None
    return (step[0], tuple(inputs), (step[2][0] + BLOCKED,)) if full else None


def _layout_step(graph: Graph, node: Node, step: Step, blocked: Collection[str], size: int) -> Step | None:
    """``step``, a primitive that keeps the blocked layout, on blocked arrays (all it reads of full size stored
    blocked): one computing each channel from that channel alone over the image's rows and columns, which are
    the blocked array's axes 2 and 3 as they are NCHW's (2-D pools, reductions over the image, gathers and slices
    along rows or columns: YOLO's SPP pools and nearest upsampling, squeeze-and-excitation's average; a
    reduction's or a gather's own step computes so on the blocked array as it is), or one joining or cutting
    channels at block boundaries (a concatenation whose inputs but the last fill whole blocks: the CSP blocks'
    and the feature pyramid's; a slice starting at one). A slice's or concatenation's channels past the value's
    own in its last block are real channels of another value: finite, as padded ones must be."""
    a, x, output = node.attrs, node.inputs[0], (node.output + BLOCKED,)
    if node.op is Op.CONCAT:
        axis = a["axis"] % 4
        if axis == 0 or not all(t in blocked for t in node.inputs) or \
                (axis == 1 and any(graph.tensor(t).shape[1] % size for t in node.inputs[:-1])):
            return None
        return _concat(axis), tuple(t + BLOCKED for t in node.inputs), output
    if x not in blocked:
        return None
    if node.op is Op.MAX_POOL and len(a["kernel"]) == 2:
        return _max_over_taps(a["kernel"], a["strides"], a["pads"], a["dilations"],
                              graph.tensor(node.output).shape[2:]), (x + BLOCKED,), output
    if node.op in WINDOW and len(a["kernel"]) == 2:
        return _over_channel_planes(step[0]), (x + BLOCKED,), output
    if node.op in _IMAGE_REDUCTIONS and a["keepdims"] and set(a["axes"]) <= {2, 3}:
        return step[0], (x + BLOCKED,), output
    if node.op is Op.GATHER and a["axis"] % 4 in (2, 3) and node.inputs[1] in graph.constants and \
            graph.constants[node.inputs[1]].ndim == 1:  # torch_ops._constant_gather's step
        return step[0], (x + BLOCKED, node.inputs[1]), output
    if node.op is Op.SLICE:
        key = _blocked_slice(graph.tensor(x).shape, a["starts"], a["steps"], graph.tensor(node.output).shape, size)
        return (None if key is None else ((lambda v: [v[key]]), (x + BLOCKED,), output))
    return None


def _concat(axis: int):
    return lambda *xs: [torch.cat(xs, axis)]


def _max_over_taps(kernel: Sequence[int], strides: Sequence[int], pads: Sequence[int], dilations: Sequence[int],
                   size: Sequence[int]):
    """A 2-D max pool of a blocked array as the maximum of its taps, each a strided slice of the array padded
    with -inf: one loop over the output whose innermost axis is the block, which Inductor vectorizes (its own
    pooling of the (N * C/B, B, H, W) view gathers and transposes tiles: ResNet's 3x3 pool of 64 channels at
    112x112 took 0.33 ms on one thread so)."""
    def run(v):
        padded = F.pad(v, (0, 0, pads[1], pads[3], pads[0], pads[2]), value=float("-inf"))
        taps = [padded[:, :, i * dilations[0]:i * dilations[0] + strides[0] * (size[0] - 1) + 1:strides[0],
                       j * dilations[1]:j * dilations[1] + strides[1] * (size[1] - 1) + 1:strides[1]]
                for i in range(kernel[0]) for j in range(kernel[1])]
        return [functools.reduce(torch.maximum, taps)]
    return run


def _over_channel_planes(function: Callable):
    """``function`` of (N, C, H, W) values, which computes each channel alone, on a blocked array: its blocks
    as a batch of (N * C/B, B, H, W) (a view), the output back in the blocked order."""
    def run(v):
        n, blocks = v.shape[:2]
        y = function(v.permute(0, 1, 4, 2, 3).flatten(0, 1))[0]
        return [y.unflatten(0, (n, blocks)).permute(0, 1, 3, 4, 2).contiguous()]
    return run


def _blocked_slice(shape: Sequence[int], starts: Sequence[int], steps: Sequence[int], out: Sequence[int],
                   size: int) -> tuple | None:
    """The index of a SLICE on a blocked array: the batch whole, channels from a block's start by one, rows and
    columns by positive steps; else None."""
    if starts[0] != 0 or steps[0] != 1 or out[0] != shape[0] or starts[1] % size or steps[1] != 1 or \
            min(steps[2:]) <= 0:
        return None
    channels = slice(starts[1] // size, -(-(starts[1] + out[1]) // size))
    rows_and_columns = (slice(b, b + s * (c - 1) + 1, s) for b, s, c in zip(starts[2:], steps[2:], out[2:]))
    return (slice(None), channels, *rows_and_columns)
