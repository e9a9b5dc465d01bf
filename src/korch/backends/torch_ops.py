"""A kernel graph as a torch function: the library backend runs it eagerly, Inductor compiles it.

The reference executor is written for plainness (index maps built with numpy,
CPU tensors); here each primitive uses torch's own fast operator where one
exists (slicing views, ``F.pad``, ``F.max_pool2d``, ``F.conv2d`` on cuDNN or
oneDNN), and every index tensor is made once, at build time, on the kernel's
device. Ops without an override here use the reference's implementation, which
is device-agnostic for them (a GATHER with run-time indices, an embedding
lookup, is ``index_select``, which Inductor fuses as an indirect load). Opaque
primitives run in ONNX Runtime on the CPU.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Collection, Mapping, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from korch.backends.activations import ACTIVATIONS, activation_chains
from korch.ir.graph import CHANNELS_LAST, Graph, Node
from korch.ir.ops import Op
from korch.ir import interpret

NodeFn = Callable[..., list[torch.Tensor]]
_POOL = {(Op.MAX_POOL, 1): F.max_pool1d, (Op.MAX_POOL, 2): F.max_pool2d, (Op.MAX_POOL, 3): F.max_pool3d,
         (Op.AVG_POOL, 1): F.avg_pool1d, (Op.AVG_POOL, 2): F.avg_pool2d, (Op.AVG_POOL, 3): F.avg_pool3d}
_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
def _symmetric(pads: Sequence[int]) -> list[int] | None:
    k = len(pads) // 2
    return list(pads[:k]) if list(pads[:k]) == list(pads[k:]) else None


def _slice(node: Node, device) -> NodeFn:
    a = node.attrs
    index = []
    for start, step, count in zip(a["starts"], a["steps"], a["shape"]):
        if step > 0:
            index.append(slice(start, start + step * (count - 1) + 1, step))
        else:
            index.append(None)  # negative steps: an index tensor
    if all(i is not None for i in index):
        key = tuple(index)
        return lambda x: [x[key]]
    tensors = [torch.as_tensor(start + step * np.arange(count), device=device)
               for start, step, count in zip(a["starts"], a["steps"], a["shape"])]

    def run(x):
        for axis, (i, t) in enumerate(zip(index, tensors)):
            x = x[(slice(None),) * axis + (i,)] if i is not None else torch.index_select(x, axis, t)
        return [x]
    return run


def _constant_gather(graph: Graph, node: Node, device) -> NodeFn | None:
    """A Gather whose indices are a constant: a slice where they step evenly (a view compilers read with
    affine loads, where ``index_select`` is an indirect load per element), else ``index_select`` with the
    index tensor made once. None when the indices are computed at run time."""
    table = graph.constants.get(node.inputs[1])
    if table is None:
        return None
    axis = node.attrs["axis"]
    size = graph.tensors[node.inputs[0]].shape[axis]
    flat = np.asarray(table, dtype=np.int64).reshape(-1)
    flat = np.where(flat < 0, flat + size, flat)
    steps = np.diff(flat)

    def gathered(x):  # the output's shape, from the input's: the axes past ``axis`` may be more (a blocked array's)
        return (*x.shape[:axis], *table.shape, *x.shape[axis + 1:])
    if flat.size and (flat.size == 1 or (steps[0] > 0 and np.all(steps == steps[0]))):
        step = int(steps[0]) if flat.size > 1 else 1
        key = (slice(None),) * axis + (slice(int(flat[0]), int(flat[-1]) + 1, step),)
        return lambda x, _: [x[key].reshape(gathered(x))]
    index = torch.as_tensor(flat, device=device)
    return lambda x, _: [torch.index_select(x, axis, index).reshape(gathered(x))]


def _pad(graph: Graph, node: Node, device) -> NodeFn:
    pads, mode = list(node.attrs["pads"]), node.attrs["mode"]
    rank = len(pads) // 2
    if mode == "constant":
        torch_pads = [p for axis in reversed(range(rank)) for p in (pads[axis], pads[rank + axis])]
        fill = node.inputs[1] if len(node.inputs) > 1 else ""
        if not fill or fill in graph.constants:
            # a constant fill is read now: ``value.item()`` on every call would sync a GPU (illegal in a CUDA
            # graph capture) and is a data-dependent value to torch.export
            value = float(np.asarray(graph.constants[fill]).reshape(-1)[0]) if fill else 0.0
            return lambda x, _=None: [F.pad(x, torch_pads, value=value)]
        # a fill computed at run time (fission writes those as a Where, but a kernel's graph may come from
        # elsewhere) stays on the device: padded positions are where a padded mask of ones is
        return lambda x, value: [torch.where(F.pad(torch.zeros_like(x), torch_pads, value=1.0) > 0,
                                             value.to(x.dtype).reshape(()), F.pad(x, torch_pads))]
    input_shape = graph.tensors[node.inputs[0]].shape
    maps = {axis: torch.as_tensor(interpret.pad_index(size, pads[axis], pads[rank + axis], mode), device=device)
            for axis, size in enumerate(input_shape) if pads[axis] or pads[rank + axis]}

    def run(x, value=None):
        for axis, index in maps.items():
            x = torch.index_select(x, axis, index)
        return [x]
    return run


def _pool(node: Node) -> NodeFn | None:
    a = node.attrs
    k = len(a["kernel"])
    pads = _symmetric(a["pads"])
    if pads is None or any(2 * p > kk for p, kk in zip(pads, a["kernel"])):
        return None
    fn = _POOL[(node.op, k)]
    if node.op is Op.MAX_POOL:
        return lambda x: [fn(x, a["kernel"], a["strides"], pads, a["dilations"])]
    if any(d != 1 for d in a["dilations"]):
        return None
    include = bool(a["count_include_pad"])
    return lambda x: [fn(x, a["kernel"], a["strides"], pads, count_include_pad=include)]


def _conv(node: Node) -> NodeFn:
    a = node.attrs
    if len(a["strides"]) == 1:
        return _conv1d_as_2d(node)
    pads = _symmetric(a["pads"])
    k = len(a["strides"])
    fn = _CONV[k]
    if pads is None:
        return lambda x, w: [fn(interpret.pad_spatial(x, a["pads"], 0.0), w, stride=a["strides"],
                                dilation=a["dilations"], groups=a["group"])]
    return lambda x, w: [fn(x, w, stride=a["strides"], padding=pads, dilation=a["dilations"], groups=a["group"])]


def _conv1d_as_2d(node: Node) -> NodeFn:
    """A 1-D convolution as a 2-D one of height 1. Inductor's freezing packs only 2-D and 3-D convolutions for
    oneDNN, and ATen sends a 1-D one of at most 20480 input elements and batch 1 to its slow im2col loop:
    Whisper-tiny's first convolution (80 mel bins by 256 frames) took 0.26 ms there in a compiled unit (180
    GFLOP/s), where its second, larger one went to oneDNN (280 GFLOP/s)."""
    a = node.attrs
    conv2d = _conv(dataclasses.replace(node, attrs={
        **a, "strides": [1, *a["strides"]], "dilations": [1, *a["dilations"]],
        "pads": [0, a["pads"][0], 0, a["pads"][1]]}))
    return lambda x, w: [conv2d(x.unsqueeze(-2), w.unsqueeze(-2))[0].squeeze(-2)]


def is_depthwise_conv(graph: Graph, node: Node) -> bool:
    """A 2-D convolution of one input and one output channel per group."""
    if node.op is not Op.CONV or len(node.attrs["strides"]) != 2:
        return False
    x, weight = (graph.tensors[name].shape for name in node.inputs[:2])
    return node.attrs["group"] == x[1] == weight[0] and weight[1] == 1


def is_pointwise_conv(graph: Graph, node: Node) -> bool:
    """A 1x1 convolution: stride 1, no padding, one group."""
    if node.op is not Op.CONV:
        return False
    a, weight = node.attrs, graph.tensors[node.inputs[1]].shape
    return a["group"] == 1 and all(s == 1 for s in (*weight[2:], *a["strides"], *a["dilations"])) \
        and not any(a["pads"])


def _pointwise_conv(graph: Graph, node: Node, channels_last: bool) -> NodeFn | None:
    """A 1x1 convolution (stride 1, no padding, one group) as a batched product over the channels, or None:
    per image ``W @ X`` with ``X`` the [C, pixels] view of an NCHW value, or with ``channels_last``
    ``X @ W^T`` with ``X`` the [pixels, C] view of a channels-last one, so that neither copies its input.
    On CPUs oneDNN's convolution spends ~25 us a call setting itself up; the product calls the BLAS
    directly (a ``bmm``, which Inductor does not repack as oneDNN's linear, as it does a 2-D ``mm``):
    YOLOX-Nano's 78 pointwise convolutions 4.0 -> 2.9 ms on a 2-core Xeon."""
    if not is_pointwise_conv(graph, node):
        return None
    c_out, c_in = graph.tensors[node.inputs[1]].shape[:2]

    def nchw(x, w):
        y = torch.bmm(w.reshape(1, c_out, c_in).expand(x.shape[0], c_out, c_in), x.reshape(x.shape[0], c_in, -1))
        return [y.view(x.shape[0], c_out, *x.shape[2:])]

    def nhwc(x, w):
        pixels = x.movedim(1, -1)
        y = torch.bmm(pixels.reshape(x.shape[0], -1, c_in), w.reshape(c_out, c_in).t().expand(x.shape[0], c_in, c_out))
        return [y.view(*pixels.shape[:-1], c_out).movedim(-1, 1)]
    return nhwc if channels_last else nchw


def _depthwise_conv(graph: Graph, node: Node) -> NodeFn | None:
    """A 2-D depthwise convolution (one group per channel, one output channel per group) as the sum of its taps:
    each a strided window of the padded input times that tap's weight per channel, or None. Inductor computes
    the sum as one loop, fused with what the kernel does after it (its bias, its SiLU), and over a channels-last
    value vectorised along the channels; oneDNN's convolution spends 15-25 us a call setting itself up.
    YOLOX-Nano's 3x3 over 64 channels with its SiLU, 2 threads, Zen 5: at 26x26 43 against 19 us, at 52x52 76
    against 59 us, stride 2 at 52x52 47 against 19 us. Over an NCHW value the taps are vectorised along the
    rows' pixels, masked at each row's ends, and ran slower than oneDNN (64 channels at 104x104: 2.8 against
    0.9 ms): only for channels-last values."""
    if not is_depthwise_conv(graph, node):
        return None
    a = node.attrs
    x, weight = (graph.tensors[name].shape for name in node.inputs)
    channels, (kh, kw), (dh, dw), (sh, sw) = x[1], weight[2:], a["dilations"], a["strides"]
    out_h, out_w = graph.tensors[node.outputs[0]].shape[2:]
    span_h, span_w = (out_h - 1) * sh + 1, (out_w - 1) * sw + 1

    def run(x, w):
        # read channels-last where it lies (a compiled unit stores it so at a kernel boundary)
        padded = interpret.pad_spatial(x.contiguous(memory_format=torch.channels_last), a["pads"], 0.0)
        taps = w.reshape(channels, kh * kw).t().contiguous()  # a constant: folded when the weights are frozen
        total = None
        for i, j in itertools.product(range(kh), range(kw)):
            window = padded[:, :, i * dh:i * dh + span_h:sh, j * dw:j * dw + span_w:sw]
            term = window * taps[i * kw + j].view(1, -1, 1, 1)
            total = term if total is None else total + term
        return [total]
    return run


# oneDNN's block of output channels on AVX-512 (8 on AVX2): a convolution of fewer computes the whole block anyway
NARROW_CHANNELS = 16
# the most output channels a narrow convolution's folded taps make (``_narrow_conv``): their plane is written, then
# read back shifted once a tap
MAX_FOLDED_CHANNELS = 64


def narrow_conv_axis(graph: Graph, node: Node) -> int | None:
    """The spatial axis (2: rows, 3: columns) whose taps ``_narrow_conv`` folds into output channels, or None: a
    2-D convolution of one group with fewer than ``NARROW_CHANNELS`` output channels, a window wider than 1 and
    stride 1 along the axis, and at most ``MAX_FOLDED_CHANNELS`` channels folded; of two such axes the wider."""
    if node.op is not Op.CONV or len(node.attrs["strides"]) != 2 or node.attrs["group"] != 1:
        return None
    c_out, _, *window = graph.tensors[node.inputs[1]].shape
    if c_out >= NARROW_CHANNELS:
        return None
    axes = [axis for axis, (k, stride) in enumerate(zip(window, node.attrs["strides"]), start=2)
            if k > 1 and stride == 1 and c_out * k <= MAX_FOLDED_CHANNELS]
    return max(axes, key=lambda axis: window[axis - 2], default=None)


def _narrow_conv(graph: Graph, node: Node) -> NodeFn | None:
    """A convolution of few output channels (``narrow_conv_axis``) as a convolution of one tap along an axis,
    that axis's taps folded into its output channels, then their sum, each tap's plane shifted by its offset, or
    None. oneDNN computes a block of 16 output channels however few are asked for: Candy's last convolution (32 to
    3 channels, 9x9, 224x224) took 14.0 ms as it is and 4.0 ms so (27 channels of a 9x1 window, and a loop
    Inductor fuses with what follows; 2-core Xeon, 2026-12-02)."""
    axis = narrow_conv_axis(graph, node)
    if axis is None:
        return None
    a = node.attrs
    c_out, c_in, *window = graph.tensors[node.inputs[1]].shape
    taps, dilation = window[axis - 2], a["dilations"][axis - 2]
    out_length = graph.tensors[node.outputs[0]].shape[axis]
    one_tap = [1, window[1]] if axis == 2 else [window[0], 1]
    strides = [1 if i == axis - 2 else s for i, s in enumerate(a["strides"])]
    dilations = [1 if i == axis - 2 else d for i, d in enumerate(a["dilations"])]

    def run(x, w):
        padded = interpret.pad_spatial(x, a["pads"], 0.0)
        # output channel o * taps + i holds tap i of channel o: a constant once the weights are frozen
        folded = w.movedim(axis, 1).reshape(c_out * taps, c_in, *one_tap)
        planes = F.conv2d(padded, folded, stride=strides, dilation=dilations).unflatten(1, (c_out, taps))
        total = None
        for i in range(taps):
            term = planes[:, :, i].narrow(axis, i * dilation, out_length)
            total = term if total is None else total + term
        return [total]
    return run


# binary ops whose torch function takes a Python number as its second operand (the first for commutative ones)
_SCALAR_OPERAND = {Op.ADD: torch.add, Op.MUL: torch.mul, Op.SUB: torch.sub,
                   Op.POW: lambda x, exponent: torch.pow(x, exponent).to(x.dtype),
                   Op.EQUAL: torch.eq, Op.LESS: torch.lt, Op.LESS_EQUAL: torch.le, Op.GREATER: torch.gt,
                   Op.GREATER_EQUAL: torch.ge}
_COMMUTATIVE = {Op.ADD, Op.MUL, Op.EQUAL}


def _scalar_operand(graph: Graph, node: Node) -> NodeFn | None:
    """A binary op with a one-element constant operand as torch's op with a Python number, or None.

    Compilers see a number where they would see a tensor load: Inductor turns ``pow(x, 3.0)`` into two
    multiplications, where ``pow(x, tensor(3.0))`` is a vectorised ``exp(log)`` (GELU's cube: 4x slower).
    """
    fn = _SCALAR_OPERAND.get(node.op)
    if fn is None or len(node.inputs) != 2:
        return None
    out_shape = graph.tensors[node.outputs[0]].shape
    for position in (1, 0) if node.op in _COMMUTATIVE else (1,):
        constant, other = node.inputs[position], node.inputs[1 - position]
        value = graph.constants.get(constant)
        if value is None or np.size(value) != 1 or graph.tensors[other].shape != out_shape:
            continue
        number = np.asarray(value).reshape(-1)[0].item()  # a Python bool, int or float, as the dtype says
        if position == 1:
            return lambda x, _: [fn(x, number)]
        return lambda _, y: [fn(y, number)]
    return None


def runs_in_torch(node: Node) -> bool:
    """Whether ``node`` runs as torch operators (every primitive but opaque ones ONNX Runtime must run)."""
    return node.op is not Op.OPAQUE


def _opaque(node: Node) -> NodeFn:
    def run(*xs):
        device = next((x.device for x in xs if x is not None), torch.device("cpu"))
        outs = interpret.run_node(node, [None if x is None else x.cpu() for x in xs])
        return [o.to(device) for o in outs]
    return run


def node_function(graph: Graph, node: Node, device, channels_last: bool = False,
                  pointwise_products: bool = True) -> NodeFn:
    """A callable from the node's input tensors to its output tensors, on ``device``; ``channels_last``, the
    layout the values it reads and writes are stored in (a compiled unit's boundaries), where it matters;
    ``pointwise_products``, whether a CPU computes 1x1 convolutions as products (``_pointwise_conv``), over
    channels-last values depthwise ones as their taps (``_depthwise_conv``), and those of few output channels with
    their taps folded into channels (``_narrow_conv``), or all by the library."""
    if node.op is Op.SLICE:
        return _slice(node, device)
    if node.op is Op.PAD:
        return _pad(graph, node, device)
    if node.op is Op.GATHER:
        gather = _constant_gather(graph, node, device)
        if gather is not None:
            return gather
    if node.op in (Op.MAX_POOL, Op.AVG_POOL):
        fn = _pool(node)
        if fn is not None:
            return fn
    if node.op is Op.CONV:
        cpu = torch.device(device).type == "cpu"
        own = pointwise_products and cpu
        return (own and _pointwise_conv(graph, node, channels_last)) \
            or (own and channels_last and _depthwise_conv(graph, node)) or (own and _narrow_conv(graph, node)) \
            or _conv(node)
    if node.op is Op.OPAQUE:
        return _opaque(node)
    if node.op is Op.TANH and torch.device(device).type == "cpu":
        # Inductor's vectorised tanh on CPUs (Sleef's) takes twice its sigmoid: GPT-2's GELU 300 -> 150 us
        return lambda x: [2 * torch.sigmoid(2 * x) - 1]
    with_number = _scalar_operand(graph, node)
    if with_number is not None:
        return with_number
    return lambda *xs: interpret.run_node(node, xs)


# Above this input, tanh(softplus(x)) is 1.0 in float32 (1 - 8e-18 at 20), and e^x (e^x + 2) would overflow soon
_MISH_SATURATED = 20.0


def _tanh_of_softplus(x: torch.Tensor) -> list[torch.Tensor]:
    """tanh(log(1 + e^x)) = n / (n + 2), n = e^x (e^x + 2): one exponential where the primitives take three
    transcendentals (exp, log1p, and tanh's)."""
    e = torch.exp(torch.clamp(x, max=_MISH_SATURATED))
    n = e * (e + 2)
    return [torch.where(x > _MISH_SATURATED, torch.ones_like(x), n / (n + 2))]


def rewritten_steps(graph: Graph, kernels: Sequence[Sequence[str]], device,
                    replaced: Collection[str] = ()) -> dict[str, tuple]:
    """Steps computing a primitive from further back in its own kernel, faster than its own function, on a CPU:
    the tanh of a float32 softplus (Mish's core: YOLOv4 has 72 Mish over 44M values) from the softplus's input,
    with one exponential (5.9M values: 1.7 ms against 7.4 on 2 threads); the last primitive of an activation
    fission wrote as several (``activations.py``) as torch's op, which Inductor's freezing joins with the
    convolution or product before it. What a rewritten step skips stays, for any other reader (Inductor drops
    it when there is none). ``kernels``: the planned kernels' primitive names; a primitive and what it is
    computed from must share one to be rewritten. ``replaced``: primitives other steps compute (MLAS's
    products, ``ort_steps``), which no rewritten step bypasses."""
    if torch.device(device).type != "cpu":
        return {}
    producer = {t: node for node in graph.nodes for t in node.outputs}
    kernel_of = {name: i for i, kernel in enumerate(kernels) for name in kernel}

    def share_a_kernel(node: Node, source: Node) -> bool:
        return node.name in kernel_of and kernel_of.get(source.name) == kernel_of[node.name]

    steps = {}
    for node in graph.nodes:
        source = producer.get(node.inputs[0]) if node.op is Op.TANH else None
        if source is not None and source.op is Op.SOFTPLUS and share_a_kernel(node, source) and \
                graph.tensors[source.inputs[0]].dtype == "float32":
            steps[node.name] = (_tanh_of_softplus, source.inputs, node.outputs)
        product, bias = _biased_product(graph, node, producer)
        if product is not None and product.name not in replaced and share_a_kernel(node, product):
            steps[node.name] = (_linear, [*product.inputs, bias], node.outputs)
    for chain in activation_chains(graph, kernel_of):
        if not any(name in replaced for name in chain.nodes):
            steps[chain.nodes[-1]] = (_torch_activation(chain.activation), [chain.source], [chain.output])
    return steps


def _biased_product(graph: Graph, node: Node, producer: Mapping[str, Node]) -> tuple[Node | None, str]:
    """(the product, the bias) where ``node`` adds a bias (a constant over the last axis) to a float32 activation
    times a constant 2-D weight, else (None, ""): as one ``F.linear`` it is the product Inductor's freezing packs
    for oneDNN with its bias, and then with the activation after it."""
    if node.op is not Op.ADD or len(node.inputs) != 2 or graph.tensors[node.outputs[0]].dtype != "float32":
        return None, ""
    for position in (0, 1):
        product, bias = producer.get(node.inputs[position]), graph.constants.get(node.inputs[1 - position])
        if product is None or product.op is not Op.MATMUL or bias is None:
            continue
        weight = graph.constants.get(product.inputs[1])
        if weight is None or weight.ndim != 2 or weight.dtype != np.float32 or product.inputs[0] in graph.constants:
            continue
        if bias.dtype == np.float32 and bias.size == weight.shape[1] and bias.shape[-1:] == weight.shape[1:] and \
                graph.tensors[node.outputs[0]].shape == graph.tensors[product.outputs[0]].shape:
            return product, node.inputs[1 - position]
    return None, ""


def _linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> list[torch.Tensor]:
    return [F.linear(x, weight.t(), bias.reshape(-1))]


def _torch_activation(name: str) -> NodeFn:
    fn = ACTIVATIONS[name]
    return lambda x: [fn(x)]


def kernel_function(kernel: Graph, device, replaced: Mapping | None = None,
                    pointwise_products: bool = True) -> Callable[..., list[torch.Tensor]]:
    """``f(*inputs) -> outputs`` computing ``kernel`` with torch on ``device`` (constants bound, on the device).
    ``replaced`` maps a primitive's name to the step computing it instead, (function, inputs, outputs), or to
    None where another step computes its outputs (``ort_steps.replacements``); ``rewritten_steps`` apply where
    it does not say. ``pointwise_products``: as ``node_function``'s."""
    constants = {name: interpret.as_torch(v).to(device) for name, v in kernel.constants.items()}
    replaced = {**rewritten_steps(kernel, [[node.name for node in kernel.nodes]], device, replaced or ()),
                **(replaced or {})}
    channels_last = CHANNELS_LAST in kernel.boundary_layouts()
    steps = [replaced.get(node.name) or (node_function(kernel, node, device, channels_last, pointwise_products),
                                         node.inputs, node.outputs)
             for node in kernel.nodes if node.name not in replaced or replaced[node.name]]
    inputs, outputs = list(kernel.inputs), list(kernel.outputs)

    def run(*values: torch.Tensor) -> list[torch.Tensor]:
        env = dict(constants)
        env.update(zip(inputs, values))
        for fn, ins, outs in steps:
            env.update(zip(outs, fn(*[env[n] if n else None for n in ins])))
        return [env[n] for n in outputs]
    return run
