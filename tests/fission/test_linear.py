"""Linear rules against ONNX Runtime: MatMul with 1-D and broadcast operands, Gemm's transposes, scales
and bias shapes, Conv (1-D/2-D/3-D, grouped, depthwise, strided, dilated, asymmetric and auto pads, bias),
ConvTranspose (output_shape, output_padding, auto_pad, groups, dilations) and Einsum; plus the primitive
sequences the paper's fusion relies on (weights transposed and scaled at fission time, bias an ADD)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from onnx import helper, numpy_helper

from korch.fission import fission
from korch.fission.linear import explicit_pads
from korch.frontend import load_onnx
from korch.ir.ops import Op
from korch.ir import interpret, ort


def _model(op: str, shapes, opset: int, consts: dict, **attrs):
    names = [f"in{i}" if s is not None else "" for i, s in enumerate(shapes)]
    node = helper.make_node(op, names, ["y"], **attrs)
    inputs = [helper.make_tensor_value_info(n, 1, list(s)) for n, s in zip(names, shapes) if n and n not in consts]
    inits = [numpy_helper.from_array(v, n) for n, v in consts.items()]
    graph = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info("y", 1, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def _check(op: str, shapes, opset=17, const=(), oracle_attrs=None, **attrs):
    """Fission a one-node model, run it, compare with ORT (on ``oracle_attrs`` if given); returns the graph."""
    rng = np.random.default_rng(0)
    values = {f"in{i}": rng.standard_normal(s).astype(np.float32) for i, s in enumerate(shapes) if s is not None}
    consts = {n: values[n] for n in (f"in{i}" for i in const) if n in values}
    feeds = {n: v for n, v in values.items() if n not in consts}
    model = _model(op, shapes, opset, consts, **attrs)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an opaque fallback would hide a missing rule
        graph = fission(load_onnx(model))
    got = interpret.run(graph, feeds)["y"]
    oracle = model if oracle_attrs is None else _model(op, shapes, opset, consts, **oracle_attrs)
    want = ort.run_model(oracle, feeds)["y"]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    return graph


def _ops(graph) -> list[Op]:
    return [n.op for n in graph.nodes]


# -- MatMul ---------------------------------------------------------------------------


@pytest.mark.parametrize("a,b", [((3, 4), (4, 5)), ((2, 3, 4), (4, 5)), ((4,), (4, 5)), ((3, 4), (4,)),
                                 ((4,), (2, 4, 5)), ((2, 3, 4), (4,)), ((4,), (4,)), ((2, 1, 3, 4), (5, 4, 2)),
                                 ((1, 4), (3, 2, 4, 1))])
@pytest.mark.parametrize("const", [(), (1,)])
def test_matmul(a, b, const):
    _check("MatMul", [a, b], 13, const)


def test_matmul_vector_is_reshaped_around_one_matmul():
    assert _ops(_check("MatMul", [(4,), (2, 4, 5)], 13)) == [Op.RESHAPE, Op.MATMUL, Op.RESHAPE]


# -- Gemm -----------------------------------------------------------------------------

M, K, N = 3, 4, 5


@pytest.mark.parametrize("transA,transB", [(0, 0), (1, 0), (0, 1), (1, 1)])
@pytest.mark.parametrize("alpha,beta", [(1.0, 1.0), (0.5, 1.0), (1.0, 0.25), (2.0, 0.0)])
@pytest.mark.parametrize("const", [(), (1, 2)])
def test_gemm_attributes(transA, transB, alpha, beta, const):
    shapes = [(K, M) if transA else (M, K), (N, K) if transB else (K, N), (N,)]
    _check("Gemm", shapes, 13, const, transA=transA, transB=transB, alpha=alpha, beta=beta)


@pytest.mark.parametrize("c", [None, (), (1,), (N,), (M, 1), (1, N), (M, N)])
def test_gemm_bias_shapes(c):
    _check("Gemm", [(M, K), (K, N), c], 13, (1,), beta=0.5)


@pytest.mark.parametrize("opset", [7, 9, 11])
def test_gemm_older_opsets(opset):
    _check("Gemm", [(M, K), (N, K), (M, N)], opset, (1,), transB=1, alpha=0.5)


def test_gemm_weight_transpose_and_alpha_fold_into_the_constant():
    graph = _check("Gemm", [(M, K), (N, K), (N,)], 13, (1, 2), transB=1, alpha=0.5)
    assert _ops(graph) == [Op.MATMUL, Op.ADD]


def test_gemm_activation_operands_are_transposed_and_scaled_by_primitives():
    graph = _check("Gemm", [(K, M), (K, N)], 13, transA=1, alpha=3.0)
    assert _ops(graph) == [Op.TRANSPOSE, Op.MATMUL, Op.MUL]


# -- Conv -----------------------------------------------------------------------------


@pytest.mark.parametrize("x,w,attrs", [
    ((2, 3, 11), (4, 3, 3), {}),
    ((1, 3, 11), (4, 3, 4), {"strides": [2], "pads": [2, 1], "dilations": [2]}),
    ((2, 3, 9, 8), (4, 3, 3, 3), {"pads": [1, 1, 1, 1]}),
    ((1, 2, 10, 9), (6, 2, 3, 2), {"strides": [2, 3], "dilations": [2, 1], "pads": [0, 2, 1, 0]}),
    ((1, 6, 8, 8), (6, 1, 3, 3), {"group": 6, "pads": [1, 1, 1, 1]}),  # depthwise
    ((1, 6, 8, 8), (12, 1, 3, 3), {"group": 6, "strides": [2, 2]}),  # depthwise, multiplier 2
    ((1, 6, 7, 9), (4, 3, 3, 3), {"group": 2, "pads": [1, 0, 0, 1], "kernel_shape": [3, 3]}),
    ((1, 2, 5, 6, 7), (3, 2, 3, 2, 3), {"strides": [1, 2, 2], "pads": [1, 0, 1, 1, 1, 0]}),
    ((1, 4, 6, 5, 4), (4, 2, 2, 2, 2), {"group": 2, "dilations": [2, 1, 1]}),
])
@pytest.mark.parametrize("bias", [False, True])
def test_conv(x, w, attrs, bias):
    shapes = [x, w] + ([(w[0],)] if bias else [])
    graph = _check("Conv", shapes, 11, (1, 2), **attrs)
    assert _ops(graph) == ([Op.CONV, Op.ADD] if bias else [Op.CONV])


@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER", "VALID"])
@pytest.mark.parametrize("size,kernel,stride", [(7, 3, 1), (7, 3, 2), (8, 3, 2), (8, 2, 3), (6, 1, 2), (9, 4, 2)])
def test_conv_auto_pad(auto_pad, size, kernel, stride):
    _check("Conv", [(1, 2, size, size + 1), (3, 2, kernel, kernel)], 11, (1,), auto_pad=auto_pad,
           strides=[stride, stride])


@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER"])
def test_conv_same_pads_with_dilations_follow_the_spec(auto_pad):
    # ORT refuses SAME with dilations: compare with the explicit pads the spec asks for
    pads = explicit_pads(auto_pad, None, [9, 8], [3, 2], [2, 1], [2, 3])
    assert pads == ([2, 1, 2, 2] if auto_pad == "SAME_UPPER" else [2, 2, 2, 1])
    _check("Conv", [(1, 2, 9, 8), (3, 2, 3, 2)], 11, (1,), auto_pad=auto_pad, strides=[2, 1], dilations=[2, 3],
           oracle_attrs={"pads": pads, "strides": [2, 1], "dilations": [2, 3]})


def test_conv_with_a_weight_computed_at_run_time():
    _check("Conv", [(1, 2, 6, 6), (3, 2, 3, 3)], 11, (), pads=[1, 1, 1, 1])


# -- ConvTranspose ----------------------------------------------------------------------


@pytest.mark.parametrize("x,w,attrs", [
    ((2, 2, 5), (2, 3, 3), {}),
    ((1, 2, 5), (2, 3, 3), {"strides": [3], "output_padding": [2], "pads": [1, 2]}),
    ((1, 2, 4, 3), (2, 3, 3, 2), {"strides": [2, 3], "dilations": [2, 1], "output_padding": [1, 0]}),
    ((1, 4, 4, 3), (4, 2, 3, 3), {"group": 2, "strides": [2, 2], "pads": [1, 0, 0, 1]}),
    ((1, 4, 4, 4), (4, 1, 3, 3), {"group": 4, "strides": [2, 2], "pads": [1, 1, 1, 1], "output_padding": [1, 1]}),
    ((1, 2, 3, 4, 3), (2, 2, 2, 3, 2), {"strides": [2, 1, 2], "pads": [0, 1, 0, 1, 1, 0]}),
])
@pytest.mark.parametrize("bias", [False, True])
def test_conv_transpose(x, w, attrs, bias):
    channels = w[1] * attrs.get("group", 1)
    shapes = [x, w] + ([(channels,)] if bias else [])
    graph = _check("ConvTranspose", shapes, 17, (1, 2), **attrs)
    assert _ops(graph) == ([Op.CONV_TRANSPOSE, Op.ADD] if bias else [Op.CONV_TRANSPOSE])


@pytest.mark.parametrize("auto_pad", ["NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"])
@pytest.mark.parametrize("crop", [3, 2, 1, 0, -1])  # full size minus output_shape; -1: one zero appended
def test_conv_transpose_output_shape(auto_pad, crop):
    full = [2 * (4 - 1) + 0 + 3, 3 * (3 - 1) + 1 + 2]  # stride*(in-1) + output_padding + kernel
    _check("ConvTranspose", [(1, 2, 4, 3), (2, 3, 3, 2), (3,)], 17, (1, 2), auto_pad=auto_pad, strides=[2, 3],
           output_padding=[0, 1], output_shape=[f - crop for f in full],
           pads=[5, 5, 5, 5] if auto_pad == "NOTSET" else None)  # output_shape overrides pads


@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER", "VALID"])
@pytest.mark.parametrize("stride,kernel", [(2, 3), (2, 4), (1, 3), (3, 2), (2, 1)])
def test_conv_transpose_auto_pad(auto_pad, stride, kernel):
    _check("ConvTranspose", [(1, 2, 4, 5), (2, 3, kernel, kernel)], 17, (1,), auto_pad=auto_pad,
           strides=[stride, stride])


# -- Einsum -----------------------------------------------------------------------------


@pytest.mark.parametrize("equation,shapes", [
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("bhqd,bhkd->bhqk", [(2, 3, 4, 8), (2, 3, 5, 8)]),
    ("bhqk,bhkd->bhqd", [(2, 3, 4, 5), (2, 3, 5, 8)]),
    ("bshd->bhsd", [(2, 3, 4, 5)]),
    ("ij->ji", [(3, 4)]),
    ("ij->i", [(3, 4)]),
    ("ijk->", [(2, 3, 4)]),
    ("...ii->...i", [(3, 5, 5)]),
    ("iij->j", [(3, 3, 4)]),
    ("ii", [(4, 4)]),
    ("i,i", [(5,), (5,)]),
    ("ij,jk", [(3, 4), (4, 5)]),
    ("ij , jk -> ik", [(3, 4), (4, 5)]),
    ("ij,ij->ij", [(3, 4), (3, 4)]),
    ("i,j->ij", [(3,), (4,)]),
    ("bi,i->b", [(3, 4), (4,)]),
    ("abc,cd->abd", [(2, 3, 4), (4, 5)]),
    ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)]),
    ("bn,anm,bm->ba", [(2, 3), (4, 3, 5), (2, 5)]),
    ("...ij,...jk->...ik", [(2, 1, 3, 4), (1, 5, 4, 2)]),
    ("i...,i...->...", [(3, 2, 4), (3, 2, 4)]),
    ("BIj,Bjk->BIk", [(2, 3, 4), (2, 4, 5)]),
])
def test_einsum(equation, shapes):
    _check("Einsum", shapes, 12, equation=equation)


def test_einsum_attention_scores_are_one_matmul():
    ops = _ops(_check("Einsum", [(2, 3, 4, 8), (2, 3, 5, 8)], 12, (1,), equation="bhqd,bhkd->bhqk"))
    assert ops.count(Op.MATMUL) == 1 and Op.REDUCE_SUM not in ops
