"""The conv kernel class (implicit GEMM): generated kernels against the reference executor in Triton's
interpreter, refusals, real zoo candidates, and compilation for Hopper."""

import random

import numpy as np
import pytest
from onnx import helper

from korch.backends.check import check
from korch.backends.triton.ahead import compile_generated
from korch.backends.triton.conv import CONV
from korch.backends.triton.launch import TritonKernel
from korch.backends.triton.matmul import MATMUL
from korch.ir.analysis import graph_flops
from korch.ir.ops import Op
from korch.ir.subgraph import extract
from tests.backends.kernels import check_built, kernel

H = helper.make_node


def _w(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _conv(x, w, y, after=(), outputs=None, **attrs):
    """Conv with bias of input shape ``x``, weight shape ``w``; ``after`` nodes read "c" (and "x")."""
    return kernel([H("Conv", ["x", "w", "b"], ["c"], **attrs), *after], {"x": x}, outputs or {"c": y},
                  {"w": _w(*w), "b": _w(w[0], seed=1)})


CASES = {
    "3x3_pad1": lambda: _conv((2, 5, 9, 8), (6, 5, 3, 3), (2, 6, 9, 8), pads=[1, 1, 1, 1]),
    "3x3_pad1_stride2": lambda: _conv((1, 5, 9, 8), (6, 5, 3, 3), (1, 6, 5, 4), pads=[1, 1, 1, 1], strides=[2, 2]),
    "1x1": lambda: _conv((2, 7, 5, 5), (9, 7, 1, 1), (2, 9, 5, 5)),
    "dilation2": lambda: _conv((1, 4, 10, 9), (5, 4, 3, 3), (1, 5, 6, 5), dilations=[2, 2]),
    "grouped_bias_relu": lambda: _conv((1, 8, 6, 6), (6, 4, 3, 3), None, [H("Relu", ["c"], ["y"])],
                                       {"y": (1, 6, 6, 6)}, pads=[1, 1, 1, 1], group=2),
    "silu": lambda: _conv((1, 4, 6, 6), (8, 4, 3, 3), None, [H("Sigmoid", ["c"], ["s"]), H("Mul", ["c", "s"], ["y"])],
                          {"y": (1, 8, 4, 4)}),
    "leaky_relu": lambda: _conv((1, 4, 6, 6), (4, 4, 3, 3), None, [H("LeakyRelu", ["c"], ["y"], alpha=0.1)],
                                {"y": (1, 4, 6, 6)}, pads=[1, 1, 1, 1]),
    "residual_add": lambda: _conv((1, 4, 6, 6), (4, 4, 3, 3), None, [H("Add", ["c", "x"], ["y"])], {"y": (1, 4, 6, 6)},
                                  pads=[1, 1, 1, 1]),
    "conv1d_asymmetric_pads": lambda: kernel([H("Conv", ["x", "w"], ["c"], pads=[2, 1])], {"x": (2, 3, 11)},
                                             {"c": (2, 4, 11)}, {"w": _w(4, 3, 4)}),
    "reflect_pad_prologue": lambda: kernel(
        [H("Pad", ["x", "pads"], ["p"], mode="reflect"), H("Relu", ["p"], ["r"]), H("Conv", ["r", "w"], ["c"])],
        {"x": (1, 3, 7, 6)}, {"c": (1, 4, 7, 6)},
        {"w": _w(4, 3, 3, 3), "pads": np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64)}),
    "nearest_upsample_prologue": lambda: kernel(
        [H("Resize", ["x", "", "scales"], ["u"], mode="nearest"), H("Conv", ["u", "w"], ["c"], pads=[1, 1, 1, 1])],
        {"x": (1, 3, 4, 5)}, {"c": (1, 4, 8, 10)}, {"w": _w(4, 3, 3, 3), "scales": np.array([1, 1, 2, 2], np.float32)}),
    "prologue_with_padding_zero": lambda: kernel(
        [H("Add", ["x", "one"], ["xp"]), H("Conv", ["xp", "w"], ["c"], pads=[1, 1, 1, 1])],
        {"x": (1, 3, 5, 5)}, {"c": (1, 4, 5, 5)}, {"w": _w(4, 3, 3, 3), "one": np.array(1.0, np.float32)}),
    "channels_last_output": lambda: kernel(
        [H("Conv", ["x", "w"], ["c"]), H("Reshape", ["c", "shape"], ["r"]), H("Transpose", ["r"], ["y"], perm=[0, 2, 1])],
        {"x": (1, 4, 6, 6)}, {"y": (1, 36, 8)}, {"w": _w(8, 4, 1, 1), "shape": np.array([1, 8, 36], np.int64)}),
}


@pytest.mark.parametrize("case", CASES)
def test_generated_conv_matches_reference(case):
    graph = CASES[case]()
    assert CONV.claims(graph) is None, CONV.claims(graph)
    check_built(TritonKernel(graph, CONV.generate(graph), "cpu"), graph)


def test_refuses_depthwise_and_transposed():
    depthwise = _conv((1, 4, 6, 6), (4, 1, 3, 3), (1, 4, 6, 6), pads=[1, 1, 1, 1], group=4)
    assert "depthwise" in CONV.claims(depthwise)
    transposed = kernel([H("ConvTranspose", ["x", "w"], ["y"])], {"x": (1, 4, 5, 5)}, {"y": (1, 3, 7, 7)},
                        {"w": _w(4, 3, 3, 3)})
    assert "ConvTranspose" in CONV.claims(transposed)


def test_compiles_for_hopper():
    cases = ("3x3_pad1_stride2", "grouped_bias_relu", "reflect_pad_prologue", "channels_last_output")
    errors = compile_generated([CONV.generate(CASES[case]()) for case in cases], jobs=2)  # spawned processes
    assert dict(zip(cases, errors)) == dict.fromkeys(cases)


def _linear_candidates(model):
    from korch.orchestrate.candidates import enumerate_candidates
    from korch.pipeline import load_model

    _, graph, _ = load_model(model)
    for c in enumerate_candidates(graph).candidates:
        ops = {graph.nodes[i].op for i in c.nodes}
        if ops & {Op.MATMUL, Op.CONV}:
            k = extract(graph, c.nodes, c.inputs, c.outputs)
            yield (CONV if Op.CONV in ops else MATMUL), k


@pytest.mark.parametrize("model, pool, count", [("zoo:candy", 5, 1), ("zoo:segformer_b0", 400, 4)])
def test_claimed_zoo_candidates_generate_and_check(model, pool, count):
    claimed = [(cls, k) for cls, k in _linear_candidates(model) if cls.claims(k) is None]
    assert claimed
    # a fixed-seed sample among the cheapest (the interpreter needs ~20 s for candy's smallest conv)
    claimed.sort(key=lambda ck: graph_flops(ck[1]))
    for cls, k in random.Random(0).sample(claimed[:pool], count):
        generated = cls.generate(k)
        built = TritonKernel(k, generated, "cpu")
        built.variant = min(generated.variants, key=lambda v: v.grid[0])  # fewest programs: fastest to interpret
        result = check(built, k)
        assert result.ok, (k.nodes, result.message)
