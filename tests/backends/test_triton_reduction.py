"""The reduction Triton class in the interpreter: softmax, norms, long rows in loops, strided reduced axes."""

import numpy as np
import pytest
from onnx import helper

from korch import config
from korch.backends.triton.launch import TritonKernel
from korch.backends.triton.reduction import REDUCTION
from korch.ir.ops import Op
from tests.backends.kernels import check_built, kernel
from tests.backends.triton_graphs import build

I64 = np.int64
_rng = np.random.default_rng(3)


def _w(*shape):
    return _rng.standard_normal(shape).astype(np.float32)


def _reduce(op, shape, axes, keepdims=1):
    out = tuple(1 if i in axes else d for i, d in enumerate(shape)) if keepdims else \
        tuple(d for i, d in enumerate(shape) if i not in axes)
    return kernel([helper.make_node(op, ["x", "a"], ["y"], keepdims=keepdims)], {"x": shape}, {"y": out},
                  {"a": np.array(axes, I64)})


def _group_norm():
    """GroupNormalization as exported by torch: reshape to groups, instance norm, reshape back, affine."""
    return kernel([helper.make_node("Reshape", ["x", "s1"], ["r"]),
                   helper.make_node("InstanceNormalization", ["r", "one", "zero"], ["n"]),
                   helper.make_node("Reshape", ["n", "s2"], ["m"]),
                   helper.make_node("Mul", ["m", "g"], ["mg"]), helper.make_node("Add", ["mg", "b"], ["y"])],
                  {"x": (2, 6, 3, 3)}, {"y": (2, 6, 3, 3)},
                  {"s1": np.array([2, 3, -1], I64), "s2": np.array([2, 6, 3, 3], I64), "one": np.ones(3, np.float32),
                   "zero": np.zeros(3, np.float32), "g": _w(6, 1, 1), "b": _w(6, 1, 1)})


CASES = {
    "softmax_last_axis": lambda: kernel([helper.make_node("Softmax", ["x"], ["y"], axis=-1)],
                                        {"x": (4, 6, 33)}, {"y": (4, 6, 33)}),
    "softmax_axis1_4d": lambda: kernel([helper.make_node("Softmax", ["x"], ["y"], axis=1)],
                                       {"x": (2, 5, 3, 4)}, {"y": (2, 5, 3, 4)}),
    "layer_norm": lambda: kernel([helper.make_node("LayerNormalization", ["x", "g", "b"], ["y"], axis=-1)],
                                 {"x": (2, 7, 24)}, {"y": (2, 7, 24)}, {"g": _w(24), "b": _w(24)}),
    "instance_norm_relu_pad": lambda: kernel(
        [helper.make_node("InstanceNormalization", ["x", "s", "b"], ["n"]), helper.make_node("Relu", ["n"], ["r"]),
         helper.make_node("Pad", ["r", "p"], ["y"], mode="reflect")],
        {"x": (2, 3, 5, 6)}, {"y": (2, 3, 7, 8)}, {"s": _w(3), "b": _w(3), "p": np.array([0, 0, 1, 1, 0, 0, 1, 1], I64)}),
    "group_norm_via_reshape": _group_norm,
    "long_row_softmax_loops": lambda: kernel([helper.make_node("Softmax", ["x"], ["y"], axis=-1)],
                                             {"x": (3, 5000)}, {"y": (3, 5000)}),
    "long_row_layer_norm_loops": lambda: kernel(
        [helper.make_node("LayerNormalization", ["x", "g", "b"], ["y"], axis=-1)],
        {"x": (2, 4500)}, {"y": (2, 4500)}, {"g": _w(4500), "b": _w(4500)}),
    "reduce_mean_middle_axis": lambda: _reduce("ReduceMean", (3, 7, 10), [1]),
    "reduce_max_middle_axis_dropped": lambda: _reduce("ReduceMax", (3, 7, 10), [1], keepdims=0),
    "reduce_min_spatial": lambda: _reduce("ReduceMin", (2, 3, 4, 5), [2, 3]),
    "reduce_prod_first_and_last": lambda: _reduce("ReduceProd", (3, 4, 5), [0, 2]),
    "sum_and_exp_two_outputs": lambda: build(
        {"x": ((4, 9), "float32")},
        [(Op.EXP, ["x"], "e", {}), (Op.REDUCE_SUM, ["e"], "s", {"axes": (1,), "keepdims": True}),
         (Op.REDUCE_MAX, ["x"], "m", {"axes": (1,), "keepdims": False}), (Op.SUB, ["e", "s"], "y", {})],
        ["y", "s", "m", "e"]),
    "max_propagates_nan": lambda: build(
        {"x": ((40, 3), "float32")},
        [(Op.ADD, ["x", "two"], "s", {}), (Op.LOG, ["s"], "l", {}),
         (Op.REDUCE_MAX, ["l"], "y", {"axes": (1,), "keepdims": False})], ["y"], constants={"two": np.float32(2.0)}),
    "float16_softmax": lambda: build(
        {"x": ((5, 40), "float16")},
        [(Op.REDUCE_MAX, ["x"], "m", {"axes": (1,), "keepdims": True}), (Op.SUB, ["x", "m"], "d", {}),
         (Op.EXP, ["d"], "e", {}), (Op.REDUCE_SUM, ["e"], "s", {"axes": (1,), "keepdims": True}),
         (Op.DIV, ["e", "s"], "y", {})], ["y"]),
}


@pytest.mark.parametrize("name", CASES)
def test_reduction_kernel_matches_reference(name):
    graph = CASES[name]()
    assert REDUCTION.claims(graph) is None
    check_built(TritonKernel(graph, REDUCTION.generate(graph), "cpu"), graph)


def test_short_rows_are_one_pass_and_long_rows_loop():
    short = REDUCTION.generate(CASES["softmax_last_axis"]()).source
    long = REDUCTION.generate(CASES["long_row_softmax_loops"]()).source
    assert "for r0 in range" not in short and short.count("tl.load(") == 1  # max, sum and output share one load
    assert long.count("for r0 in range") == 3  # max, then sum, then the output


def test_reduction_refusals_name_the_reason():
    two_groups = build({"x": ((4, 6), "float32")},
                       [(Op.REDUCE_SUM, ["x"], "a", {"axes": (0,), "keepdims": True}),
                        (Op.REDUCE_SUM, ["x"], "b", {"axes": (1,), "keepdims": True})], ["a", "b"])
    assert REDUCTION.claims(two_groups) == "two reduction groups"
    moved = build({"x": ((4, 6), "float32")},
                  [(Op.REDUCE_SUM, ["x"], "s", {"axes": (1,), "keepdims": False}),
                   (Op.RESHAPE, ["s"], "r", {"shape": (2, 2)}), (Op.TRANSPOSE, ["r"], "t", {"perm": (1, 0)}),
                   (Op.RESHAPE, ["t"], "f", {"shape": (4,)}), (Op.BROADCAST, ["f"], "b", {"shape": (6, 4)}),
                   (Op.TRANSPOSE, ["b"], "bt", {"perm": (1, 0)}), (Op.ADD, ["x", "bt"], "y", {})], ["y"])
    assert REDUCTION.claims(moved) == "layout op on a reduced axis"
    assert REDUCTION.claims(CASES["layer_norm"]()) is None
    pointwise = kernel([helper.make_node("Relu", ["x"], ["y"])], {"x": (3,)}, {"y": (3,)})
    assert REDUCTION.claims(pointwise) == "no reduction"


def test_many_rows_keep_the_default_and_the_widest_variant_that_fills_the_gpu():
    graph = build({"x": ((8192, 64), "float32")},
                  [(Op.REDUCE_SUM, ["x"], "s", {"axes": (1,), "keepdims": True})], ["s"])
    with config.patch(launch_variants=0):
        every = REDUCTION.generate(graph).variants
    chosen = REDUCTION.generate(graph).variants
    xblock = [dict(v.constexprs)["XBLOCK"] for v in every]
    assert xblock == [32, 64, 8, 1]  # 2048 elements a program by default; then twice, a quarter, one row
    # of the others, 8 rows a program is the widest that still gives an H100's 132 SMs 4 programs each (1024)
    assert list(chosen) == [every[0], every[2]]
