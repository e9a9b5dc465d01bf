"""The fused-kernel cases every backend is checked on (the issue's list): ONNX snippets lowered to one kernel graph each."""

from __future__ import annotations

import numpy as np
from onnx import helper

from tests.backends.kernels import kernel

_rng = np.random.default_rng(7)


def _w(*shape):
    return _rng.standard_normal(shape).astype(np.float32) * 0.2


def softmax():
    return kernel([helper.make_node("Softmax", ["x"], ["y"], axis=-1)], {"x": (4, 8, 33)}, {"y": (4, 8, 33)})


def layer_norm():
    return kernel([helper.make_node("LayerNormalization", ["x", "g", "b"], ["y"], axis=-1, epsilon=1e-5)],
                  {"x": (2, 16, 48)}, {"y": (2, 16, 48)}, {"g": _w(48), "b": _w(48)})


def instance_norm_relu_pad():
    return kernel([helper.make_node("InstanceNormalization", ["x", "s", "b"], ["n"], epsilon=1e-5),
                   helper.make_node("Relu", ["n"], ["r"]),
                   helper.make_node("Pad", ["r", "pads"], ["y"], mode="reflect")],
                  {"x": (1, 4, 9, 11)}, {"y": (1, 4, 11, 13)},
                  {"s": _w(4), "b": _w(4), "pads": np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64)})


def gelu_erf():
    return kernel([helper.make_node("Gelu", ["x"], ["y"])], {"x": (3, 70)}, {"y": (3, 70)})


def gelu_tanh():
    return kernel([helper.make_node("Gelu", ["x"], ["y"], approximate="tanh")], {"x": (3, 70)}, {"y": (3, 70)})


def matmul_bias_relu_residual():
    return kernel([helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["a"]),
                   helper.make_node("Relu", ["a"], ["r"]), helper.make_node("Add", ["r", "x"], ["y"])],
                  {"x": (2, 5, 24)}, {"y": (2, 5, 24)}, {"w": _w(24, 24), "b": _w(24)})


def attention_scores():
    """Q @ K^T / sqrt(d) then softmax: the attention-shaped subgraph before P @ V."""
    return kernel([helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
                   helper.make_node("MatMul", ["q", "kt"], ["s"]),
                   helper.make_node("Div", ["s", "scale"], ["y"])],
                  {"q": (1, 2, 7, 16), "k": (1, 2, 7, 16)}, {"y": (1, 2, 7, 7)}, {"scale": np.float32(4.0)})


def attention_output():
    """P @ V and the heads merge (B, H, S, D) -> (B, S, H*D)."""
    return kernel([helper.make_node("MatMul", ["p", "v"], ["o"]),
                   helper.make_node("Transpose", ["o"], ["t"], perm=[0, 2, 1, 3]),
                   helper.make_node("Reshape", ["t", "shape"], ["y"])],
                  {"p": (1, 2, 7, 7), "v": (1, 2, 7, 16)}, {"y": (1, 7, 32)}, {"shape": np.array([1, 7, 32], np.int64)})


def conv_bias_relu():
    return kernel([helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
                   helper.make_node("Relu", ["c"], ["y"])],
                  {"x": (1, 3, 8, 8)}, {"y": (1, 4, 8, 8)}, {"w": _w(4, 3, 3, 3), "b": _w(4)})


def _silu(x: str, y: str) -> list:
    return [helper.make_node("Sigmoid", [x], [f"{x}_s"]), helper.make_node("Mul", [x, f"{x}_s"], [y])]


def pointwise_conv_silu():
    """YOLOX's 1x1 convolution with its bias and SiLU."""
    return kernel([helper.make_node("Conv", ["x", "w", "b"], ["c"]), *_silu("c", "y")],
                  {"x": (1, 16, 6, 5)}, {"y": (1, 24, 6, 5)}, {"w": _w(24, 16, 1, 1), "b": _w(24)})


def depthwise_conv_silu():
    """YOLOX's 3x3 depthwise downsampling convolution with its bias and SiLU."""
    return kernel([helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], strides=[2, 2], group=16),
                   *_silu("c", "y")],
                  {"x": (1, 16, 9, 8)}, {"y": (1, 16, 5, 4)}, {"w": _w(16, 1, 3, 3), "b": _w(16)})


def pool_add():
    return kernel([helper.make_node("MaxPool", ["x"], ["p"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
                   helper.make_node("Add", ["p", "p"], ["y"])],
                  {"x": (1, 2, 9, 9)}, {"y": (1, 2, 5, 5)})


ALL = {f.__name__: f for f in (softmax, layer_norm, instance_norm_relu_pad, gelu_erf, gelu_tanh,
                               matmul_bias_relu_residual, attention_scores, attention_output, conv_bias_relu, pool_add,
                               pointwise_conv_silu, depthwise_conv_silu)}
