"""The pointwise Triton class in the interpreter: elementwise chains, layout ops as index maps, several outputs."""

import numpy as np
import pytest
from onnx import helper

from korch import config
from korch.backends.triton.launch import TritonKernel
from korch.backends.triton.pointwise import POINTWISE
from korch.ir.ops import Op
from tests.backends.kernels import check_built, kernel
from tests.backends.triton_graphs import build

I64 = np.int64


def _slice_inputs(starts, ends, axes, steps):
    return {"st": np.array(starts, I64), "en": np.array(ends, I64), "ax": np.array(axes, I64), "sp": np.array(steps, I64)}


def _layout(mode):
    """Transpose -> reshape -> strided slice -> concat with itself -> pad in ``mode``."""
    return kernel([helper.make_node("Transpose", ["x"], ["t"], perm=[0, 2, 1]),
                   helper.make_node("Reshape", ["t", "s"], ["r"]),
                   helper.make_node("Slice", ["r", "st", "en", "ax", "sp"], ["sl"]),
                   helper.make_node("Concat", ["sl", "e"], ["c"], axis=1),
                   helper.make_node("Pad", ["c", "p"], ["y"], mode=mode)],
                  {"x": (2, 3, 4), "e": (2, 2)}, {"y": (4, 11)},
                  {"s": np.array([2, 12], I64), "p": np.array([1, 2, 1, 3], I64), **_slice_inputs([1], [12], [1], [3])})


CASES = {
    "broadcast_add_mul": lambda: kernel(
        [helper.make_node("Add", ["a", "b"], ["c"]), helper.make_node("Mul", ["c", "d"], ["m"]),
         helper.make_node("Sub", ["m", "a"], ["y"])],
        {"a": (2, 3, 4), "b": (3, 1), "d": (4,)}, {"y": (2, 3, 4)}),
    "gelu_erf": lambda: kernel([helper.make_node("Gelu", ["x"], ["y"])], {"x": (3, 50)}, {"y": (3, 50)}),
    "gelu_tanh": lambda: kernel([helper.make_node("Gelu", ["x"], ["y"], approximate="tanh")],
                                {"x": (3, 50)}, {"y": (3, 50)}),
    "layout_constant_pad": lambda: _layout("constant"),
    "layout_reflect_pad": lambda: _layout("reflect"),
    "layout_edge_pad": lambda: _layout("edge"),
    "negative_step_slice_wrap_pad": lambda: kernel(
        [helper.make_node("Slice", ["x", "st", "en", "ax", "sp"], ["s"]),
         helper.make_node("Pad", ["s", "p"], ["y"], mode="wrap")],
        {"x": (3, 7)}, {"y": (5, 6)},
        {"p": np.array([1, 1, 1, 1], I64), **_slice_inputs([5], [-100], [1], [-2])}),
    "nearest_resize_then_add": lambda: kernel(
        [helper.make_node("Resize", ["x", "", "sc"], ["u"], mode="nearest"), helper.make_node("Add", ["u", "b"], ["y"])],
        {"x": (1, 2, 3, 5), "b": (2, 1, 1)}, {"y": (1, 2, 6, 10)}, {"sc": np.array([1, 1, 2, 2], np.float32)}),
    "nearest_resize_uneven": lambda: kernel(
        [helper.make_node("Resize", ["x", "", "", "sz"], ["u"], mode="nearest"), helper.make_node("Relu", ["u"], ["y"])],
        {"x": (1, 2, 3, 5)}, {"y": (1, 2, 7, 8)}, {"sz": np.array([1, 2, 7, 8], I64)}),
    "multi_output_transpose_and_pad": lambda: kernel(
        [helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Transpose", ["s"], ["t"], perm=[1, 0]),
         helper.make_node("Pad", ["s", "p"], ["q"], mode="constant"), helper.make_node("Mul", ["s", "x"], ["m"])],
        {"x": (5, 7)}, {"t": (7, 5), "q": (7, 7), "m": (5, 7)}, {"p": np.array([1, 0, 1, 0], I64)}),
    "float16_with_broadcast": lambda: build(
        {"a": ((4, 6), "float16"), "b": ((6,), "float16")},
        [(Op.MUL, ["a", "b"], "m", {}), (Op.TANH, ["m"], "y", {})], ["y", "m"]),
    "gather_large_table": lambda: build(
        {"x": ((3, 80), "float32")},
        [(Op.GATHER, ["x", "idx"], "g", {"axis": 1}), (Op.CAST, ["g"], "y", {"to": "int32"})], ["y"],
        constants={"idx": (np.arange(90) * 7) % 80}),
    "where_compare_broadcast_to": lambda: build(
        {"x": ((1, 5), "float32"), "z": ((4, 1), "float32")},
        [(Op.BROADCAST, ["x"], "b", {"shape": (4, 5)}), (Op.GREATER, ["b", "z"], "c", {}),
         (Op.WHERE, ["c", "b", "z"], "y", {})], ["y", "c"]),
}


@pytest.mark.parametrize("name", CASES)
def test_pointwise_kernel_matches_reference(name):
    graph = CASES[name]()
    assert POINTWISE.claims(graph) is None
    check_built(TritonKernel(graph, POINTWISE.generate(graph), "cpu"), graph)


def test_layout_ops_cost_no_division_when_they_cancel():
    graph = kernel([helper.make_node("Reshape", ["x", "s"], ["r"]), helper.make_node("Relu", ["r"], ["y"])],
                   {"x": (2, 3, 4)}, {"y": (6, 4)}, {"s": np.array([6, 4], I64)})
    source = POINTWISE.generate(graph).source
    assert "tl.load(in0 + x0," in source and "//" not in source.split("def kernel")[1]


def test_pointwise_refuses_what_it_cannot_write():
    reduce = kernel([helper.make_node("ReduceSum", ["x", "a"], ["y"], keepdims=1)], {"x": (2, 3)}, {"y": (2, 1)},
                    {"a": np.array([1], I64)})
    assert POINTWISE.claims(reduce) == "reduce op ReduceSum"
    computed = build({"x": ((4,), "float32"), "i": ((2,), "int64")}, [(Op.GATHER, ["x", "i"], "y", {"axis": 0})], ["y"])
    assert POINTWISE.claims(computed) == "gather with computed indices"


def test_variants_start_with_a_safe_default_and_grid_covers_every_output():
    graph = CASES["multi_output_transpose_and_pad"]()
    generated = POINTWISE.generate(graph)
    for variant in generated.variants:
        block = dict(variant.constexprs)["BLOCK"]
        assert variant.grid == (sum(-(-n // block) for n in (35, 49)),)  # (7,5) and (5,7) share one range, (7,7) has its own
    assert dict(generated.variants[0].constexprs)["BLOCK"] == 256


@pytest.mark.parametrize("launch_variants, blocks", [(2, [1024, 512]), (0, [1024, 256, 512, 2048])])
def test_a_large_kernel_keeps_the_default_and_the_largest_block_that_fills_the_gpu(launch_variants, blocks):
    graph = build({"x": ((1 << 20,), "float32")}, [(Op.RELU, ["x"], "y", {})], ["y"])
    with config.patch(launch_variants=launch_variants):
        generated = POINTWISE.generate(graph)
    # 2**20 elements: blocks of 512 make 2048 programs (4 a SM of an H100's 132: 528), of 2048 only 512
    assert [dict(v.constexprs)["BLOCK"] for v in generated.variants] == blocks


def _huge():
    """2**31 elements and more: generated and compiled, never run (index arithmetic must be int64)."""
    return build({"x": ((3, 2**30), "float32")}, [(Op.TRANSPOSE, ["x"], "t", {"perm": (1, 0)}),
                                                    (Op.RELU, ["t"], "y", {})], ["y"])


COMPILE_ONLY = {"huge_transpose_int64": _huge}


def test_huge_tensors_index_in_int64():
    source = POINTWISE.generate(_huge()).source
    assert "pid = pid.to(tl.int64)" in source
