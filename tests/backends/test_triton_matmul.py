"""The matmul kernel class: generated kernels against the reference executor in Triton's interpreter,
claims and refusals, and compilation for Hopper."""

import dataclasses

import numpy as np
import pytest
from onnx import helper

from korch import config
from korch.backends.triton.ahead import compile_generated
from korch.backends.triton.launch import TritonKernel
from korch.backends.triton.matmul import MATMUL, MatmulClass
from tests.backends.kernels import check_built, kernel

H = helper.make_node


def _w(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _run(graph, cls=MATMUL):
    assert cls.claims(graph) is None, cls.claims(graph)
    generated = cls.generate(graph)
    check_built(TritonKernel(graph, generated, "cpu"), graph)
    return generated


CASES = {
    "odd_2d": lambda: kernel([H("MatMul", ["a", "b"], ["y"])], {"a": (33, 29), "b": (29, 47)}, {"y": (33, 47)}),
    "batched_3d_weight": lambda: kernel([H("MatMul", ["a", "b"], ["y"])], {"a": (3, 17, 20), "b": (20, 19)},
                                        {"y": (3, 17, 19)}),
    "batched_4d_broadcast": lambda: kernel([H("MatMul", ["a", "b"], ["y"])], {"a": (2, 1, 17, 20), "b": (3, 20, 19)},
                                           {"y": (2, 3, 17, 19)}),
    "gemm_bias_relu_residual": lambda: kernel(
        [H("Gemm", ["a", "w", "c"], ["g"], transB=1), H("Relu", ["g"], ["r"]), H("Add", ["r", "x"], ["y"])],
        {"a": (20, 24), "x": (20, 18)}, {"y": (20, 18)}, {"w": _w(18, 24), "c": _w(18, seed=1)}),
    "gelu_erf": lambda: kernel([H("MatMul", ["a", "w"], ["m"]), H("Gelu", ["m"], ["y"])], {"a": (2, 9, 24)},
                               {"y": (2, 9, 40)}, {"w": _w(24, 40)}),
    "gelu_tanh": lambda: kernel([H("MatMul", ["a", "w"], ["m"]), H("Gelu", ["m"], ["y"], approximate="tanh")],
                                {"a": (2, 9, 24)}, {"y": (2, 9, 40)}, {"w": _w(24, 40)}),
    "attention_scores": lambda: kernel(
        [H("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]), H("MatMul", ["q", "kt"], ["s"]), H("Mul", ["s", "sc"], ["y"])],
        {"q": (2, 3, 10, 16), "k": (2, 3, 10, 16)}, {"y": (2, 3, 10, 10)}, {"sc": np.array(0.25, np.float32)}),
    "attention_values_heads_merge": lambda: kernel(
        [H("MatMul", ["p", "v"], ["o"]), H("Transpose", ["o"], ["t"], perm=[0, 2, 1, 3]),
         H("Reshape", ["t", "shape"], ["y"])],
        {"p": (2, 3, 10, 10), "v": (2, 3, 10, 16)}, {"y": (2, 10, 48)}, {"shape": np.array([2, 10, 48], np.int64)}),
    "scaled_operand_and_split_heads": lambda: kernel(
        [H("Mul", ["x", "sc"], ["xs"]), H("Reshape", ["xs", "shape"], ["x4"]), H("MatMul", ["x4", "w"], ["y"])],
        {"x": (2, 10, 24)}, {"y": (2, 2, 5, 8)},
        {"sc": np.array(0.5, np.float32), "shape": np.array([2, 2, 5, 24], np.int64), "w": _w(24, 8)}),
    "two_outputs": lambda: kernel([H("MatMul", ["a", "w"], ["m"]), H("Sigmoid", ["m"], ["y"])], {"a": (12, 20)},
                                  {"m": (12, 17), "y": (12, 17)}, {"w": _w(20, 17)}),
    "sliced_product_epilogue": lambda: kernel(
        [H("MatMul", ["a", "b"], ["m"]), H("Slice", ["m", "st", "en", "ax"], ["s"]), H("Relu", ["s"], ["y"])],
        {"a": (12, 20), "b": (20, 17)}, {"y": (12, 10)},
        {"st": np.array([3], np.int64), "en": np.array([13], np.int64), "ax": np.array([1], np.int64)}),
    "operand_also_written": lambda: kernel([H("Relu", ["a"], ["r"]), H("MatMul", ["r", "w"], ["y"])], {"a": (12, 20)},
                                           {"r": (12, 20), "y": (12, 17)}, {"w": _w(20, 17)}),
}


@pytest.mark.parametrize("case", CASES)
def test_generated_matmul_matches_reference(case):
    _run(CASES[case]())


def test_float16_accumulates_in_float32():
    graph = kernel([H("MatMul", ["a", "b"], ["y"])], {"a": (20, 40), "b": (40, 24)}, {"y": (20, 24)})
    for t in graph.tensors.values():
        object.__setattr__(t, "dtype", "float16")
    generated = _run(graph)
    assert "tl.float16" in generated.source and "acc = tl.full((BLOCK_M, BLOCK_N), 0.0, tl.float32)" in generated.source


def test_input_precision_follows_the_precision_policy():
    graph = CASES["odd_2d"]()
    assert 'input_precision="ieee"' in MATMUL.generate(graph).source
    with config.patch(precision="tf32"):
        assert 'input_precision="tf32"' in MATMUL.generate(graph).source
    assert 'input_precision="tf32x3"' in _run(graph, MatmulClass(input_precision="tf32x3")).source


@pytest.mark.parametrize("launch_variants", [2, 0])
def test_every_variant_matches_reference(launch_variants):
    """The model's two tiles (of two shapes), and the eight fixed shapes it replaced."""
    graph = CASES["odd_2d"]()
    with config.patch(launch_variants=launch_variants):
        generated = MATMUL.generate(graph)
    built = TritonKernel(graph, generated, "cpu")
    shapes = {dict(v.constexprs)["BLOCK_M"] * 1000 + dict(v.constexprs)["BLOCK_N"] for v in generated.variants}
    assert len(generated.variants) == len(shapes) == 2 if launch_variants else len(generated.variants) > 3
    for variant in generated.variants:
        built.variant = variant
        check_built(built, graph)


def test_refuses_what_it_cannot_fuse():
    reduce_after = kernel([H("MatMul", ["a", "b"], ["m"]), H("ReduceSum", ["m", "axes"], ["y"], keepdims=0)],
                          {"a": (4, 5), "b": (5, 6)}, {"y": (6,)}, {"axes": np.array([0], np.int64)})
    assert "ReduceSum" in MATMUL.claims(reduce_after)
    product_broadcast = kernel([H("MatMul", ["a", "b"], ["m"]), H("Add", ["m", "x"], ["y"])],
                               {"a": (4, 5), "b": (5, 6), "x": (3, 4, 6)}, {"y": (3, 4, 6)})
    assert "broadcasts" in MATMUL.claims(product_broadcast)
    two = kernel([H("MatMul", ["a", "b"], ["m"]), H("MatMul", ["m", "c"], ["y"])],
                 {"a": (4, 5), "b": (5, 6), "c": (6, 2)}, {"y": (4, 2)})
    assert "2 MatMul" in MATMUL.claims(two)
    integers = kernel([H("MatMul", ["a", "b"], ["y"])], {"a": (4, 5), "b": (5, 6)}, {"y": (4, 6)})
    for t in integers.tensors.values():
        object.__setattr__(t, "dtype", "int32")
    assert "float16/float32" in MATMUL.claims(integers)


def test_the_models_two_tiles_compile_for_hopper():
    graph = kernel([H("MatMul", ["a", "b"], ["y"])], {"a": (197, 768), "b": (768, 3072)}, {"y": (197, 3072)})
    generated = MATMUL.generate(graph)
    singles = [dataclasses.replace(generated, variants=(v,)) for v in generated.variants]
    assert len(singles) == 2 and compile_generated(singles, jobs=2) == [None, None]


def test_compiles_for_hopper():
    cases = ("odd_2d", "gemm_bias_relu_residual", "attention_values_heads_merge", "operand_also_written")
    errors = compile_generated([MATMUL.generate(CASES[case]()) for case in cases], jobs=2)  # spawned processes
    assert dict(zip(cases, errors)) == dict.fromkeys(cases)
