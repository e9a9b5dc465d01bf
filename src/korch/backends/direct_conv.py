"""A network's first convolution computed directly in a compiled unit (``korch_ort::direct_conv``,
``direct_conv.h``): the image read as it lies (NCHW), the output channels-last, the bias and a ReLU or SiLU after
it in its kernel computed in registers (``conv_epilogue.Epilogue``).

A convolution of an image of few channels is a product of few output channels, the shape on which a GEMM
library's kernels reach half a CPU's FMA rate (oneDNN on YOLOX-Nano's 6x6 stride-2 stem of 3 -> 16 channels);
before it, the unit copied the image into channels-last for oneDNN, and after it a loop applied the SiLU. The
direct kernel broadcasts each input element once to every tap and output pixel of its tile that it meets. Timed
alone on this session's Xeon (2 threads, with SiLU, from an NCHW image, the host 1.5x slower than on a quiet
day): YOLOX-Nano's stem 1.03 against 2.41 ms in oneDNN with the copy, MobileNetV2's 3x3 stride-2 3 -> 32 0.28
against 0.61, ResNet's 7x7 stride-2 3 -> 64 1.77 against 2.28, YOLOv4's 3x3 3 -> 32 at 416x416 3.9 against 6.7,
Segformer's 7x7 stride-4 3 -> 32 at 512x512 0.98 against 2.45.
``eligible`` says which convolutions it computes (``korch_direct::supported``); a unit takes it where
``choose_unit`` measures it faster (``Variant.direct_convolutions``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from korch.backends import ort_gemm
from korch.backends.activations import activation_chains
from korch.backends.conv_epilogue import Epilogue
from korch.backends.ort_steps import Step
from korch.ir.graph import Graph, Node
from korch.ir.ops import Op

# the operator's activation codes (korch_direct::Activation)
ACTIVATIONS = {(): 0, ("relu",): 1, ("silu",): 2}
# at most this many input channels: beyond them a GEMM library's product is wide enough
MAX_CHANNELS = 4
# (stride, kernel width) the operator is compiled for, and its output channels (korch_direct::supported)
_TAPS = {(1, 3), (2, 3), (2, 6), (2, 7), (4, 7)}
_OUTPUT_CHANNELS = {16, 32, 64}


def eligible(graph: Graph, node: Node) -> bool:
    """A float32 2-D convolution of one group by a constant weight, of at most ``MAX_CHANNELS`` input channels,
    equal strides the operator is compiled for and no dilation, reading a graph input or any NCHW value."""
    if node.op is not Op.CONV or len(node.inputs) != 2 or node.inputs[1] not in graph.constants:
        return False
    weight, x = graph.constants[node.inputs[1]], graph.tensor(node.inputs[0])
    a = node.attrs
    if weight.ndim != 4 or weight.dtype != np.float32 or x.dtype != "float32" or a["group"] != 1:
        return False
    strides = set(a["strides"])
    return weight.shape[1] <= MAX_CHANNELS and len(strides) == 1 and (strides.pop(), weight.shape[3]) in _TAPS \
        and weight.shape[0] in _OUTPUT_CHANNELS and set(a["dilations"]) == {1} \
        and all(isinstance(d, int) for d in x.shape)


def taps_outermost(weight: np.ndarray) -> np.ndarray:
    """(C_out, C, KH, KW) as the operator reads it: (C, KH, KW, C_out)."""
    return np.ascontiguousarray(weight.transpose(1, 2, 3, 0))


def conv_function(spec: Sequence[int], activation: int):
    """The step of a direct convolution: the NCHW input, the weight ``taps_outermost`` and the bias in, its
    output (channels-last, a (N, C, H, W) view) out."""
    spec = list(spec)

    def run(x, w, b):
        return [ort_gemm.ops().direct_conv(x, w, b, spec, activation).permute(0, 3, 1, 2)]
    return run


def fake_conv(x, w, b, spec, activation):
    """``korch_ort::direct_conv``'s output, for tracing."""
    stride, (top, left, bottom, right) = spec[0], spec[1:5]
    return x.new_empty(x.shape[0], (x.shape[2] + top + bottom - w.shape[1]) // stride + 1,
                       (x.shape[3] + left + right - w.shape[2]) // stride + 1, w.shape[3])


def replacements(graph: Graph, kernels: Sequence[Sequence[str]],
                 add_constant: Callable[[str, np.ndarray], str]) -> dict[str, Step | None]:
    """The direct convolutions of ``graph``, whose planned ``kernels`` (primitive names, in order) are given:
    each eligible CONV's step, and None for the primitives after it its call computes (``Epilogue``: a bias and
    a ReLU or SiLU). ``add_constant`` adds the weights laid out for the operator, and a zero bias where a
    convolution has none."""
    consumers = graph.consumers()
    nodes = {node.name: node for node in graph.nodes}
    replaced: dict[str, Step | None] = {}
    chains = None  # found where a kernel has an eligible convolution: the chains' probes run torch ops
    for kernel in kernels:
        for node in (nodes[name] for name in kernel if eligible(graph, nodes[name])):
            if chains is None:
                kernel_of = {name: i for i, k in enumerate(kernels) for name in k}
                chains = {chain.source: chain for chain in activation_chains(graph, kernel_of)}
            weight = graph.constants[node.inputs[1]]
            epilogue = Epilogue(graph, node, set(kernel), consumers, residual=False, activations=("relu", "silu"),
                                chains=chains)
            bias = add_constant(f"{node.name}/direct bias", np.ascontiguousarray(
                graph.constants[epilogue.bias].reshape(-1)) if epilogue.bias else np.zeros(weight.shape[0], np.float32))
            taps = add_constant(f"{node.name}/taps", taps_outermost(weight))
            top, left, bottom, right = node.attrs["pads"]
            function = conv_function([node.attrs["strides"][0], top, left, bottom, right],
                                     ACTIVATIONS[epilogue.activation[:1]])
            replaced[node.name] = (function, (node.inputs[0], taps, bias), (epilogue.output or node.output,))
            replaced.update(dict.fromkeys(n.name for n in epilogue.nodes))
    return replaced
