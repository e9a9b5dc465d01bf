"""Each primitive: its shape rule, its reference implementation and its ONNX form agree with ONNX Runtime."""

import numpy as np
import pytest

from korch.fission.builder import Builder
from korch.ir import Graph, IRError, Op, Tensor, verify
from korch.ir import ops
from korch.ir.serialize import from_json, to_json
from korch.ir.to_onnx import to_onnx
from korch.ir import interpret
from korch.ir.ort import random_inputs, run_model


def _graph(*inputs: tuple[str, tuple[int, ...], str]) -> tuple[Graph, Builder]:
    g = Graph(name="t")
    for name, shape, dtype in inputs:
        g.add_tensor(Tensor(name=name, shape=shape, dtype=dtype))
        g.inputs.append(name)
    return g, Builder(g, "n")


def _check_against_ort(g: Graph, out: str, seed: int = 0, feeds=None):
    g.outputs.append(out)
    verify(g)
    specs = {n: (g.tensors[n].shape, g.tensors[n].dtype) for n in g.inputs}
    feeds = feeds or random_inputs(specs, seed)
    ours = interpret.run(g, feeds)[out]
    theirs = run_model(to_onnx(g), feeds)[out]
    assert ours.shape == theirs.shape and ours.dtype == theirs.dtype
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)
    again = from_json(to_json(g))
    assert again.nodes == g.nodes and again.tensors == g.tensors
    np.testing.assert_array_equal(interpret.run(again, feeds)[out], ours)
    return ours


@pytest.mark.parametrize("op", sorted(ops.UNARY - {Op.NOT}, key=lambda o: o.name))
def test_unary_float(op):
    g, b = _graph(("x", (3, 5), "float32"))
    x = "x"
    if op in (Op.LOG, Op.SQRT):
        x = b.emit(Op.ABS, x)
    _check_against_ort(g, b.emit(op, x))


@pytest.mark.parametrize("op", sorted(ops.BINARY - ops.LOGICAL - {Op.MOD}, key=lambda o: o.name))
@pytest.mark.parametrize("dtype", ["float32", "int64"])
def test_binary_broadcasts(op, dtype):
    g, b = _graph(("a", (2, 1, 4), dtype), ("c", (3, 1), dtype))
    y = "c"
    if op in (Op.DIV, Op.POW):  # keep divisors and exponents away from 0 and negatives
        y = b.add(b.emit(Op.ABS, y), b.scalar(1, like=y))
    if op is Op.POW and dtype == "float32":
        _check_against_ort(g, b.emit(op, b.emit(Op.ABS, "a"), y))
    else:
        _check_against_ort(g, b.emit(op, "a", y))


@pytest.mark.parametrize("op", sorted(ops.LOGICAL, key=lambda o: o.name))
def test_logical(op):
    g, b = _graph(("a", (4, 3), "bool"), ("c", (3,), "bool"))
    _check_against_ort(g, b.emit(op, "a", "c"))


def test_where_cast_mod():
    g, b = _graph(("c", (2, 3), "bool"), ("x", (2, 3), "float32"), ("y", (3,), "float32"))
    w = b.where("c", "x", "y")
    i = b.emit(Op.CAST, b.mul(w, b.scalar(10, like=w)), to="int32")
    m = b.emit(Op.MOD, i, b.const(np.array(3, dtype="int32")), fmod=0)
    _check_against_ort(g, b.emit(Op.CAST, m, to="float32"))


@pytest.mark.parametrize("op", sorted(ops.REDUCE, key=lambda o: o.name))
@pytest.mark.parametrize("axes,keepdims", [((1,), True), ((0, 2), False), ((2,), False)])
def test_reduce(op, axes, keepdims):
    g, b = _graph(("x", (2, 3, 4), "float32"))
    _check_against_ort(g, b.reduce(op, "x", axes, keepdims))


@pytest.mark.parametrize("op", [Op.MAX_POOL, Op.AVG_POOL])
@pytest.mark.parametrize("count_include_pad", [0, 1])
def test_window(op, count_include_pad):
    g, b = _graph(("x", (1, 2, 9, 8), "float32"))
    extra = {"count_include_pad": count_include_pad} if op is Op.AVG_POOL else {}
    if op is Op.MAX_POOL and count_include_pad:
        extra = {}
        out = b.emit(op, "x", kernel=(3, 2), strides=(2, 1), pads=(1, 0, 1, 1), dilations=(2, 3))
    else:
        out = b.emit(op, "x", kernel=(3, 3), strides=(2, 2), pads=(1, 0, 2, 1), dilations=(1, 1), **extra)
    _check_against_ort(g, out)


def test_layout_ops():
    g, b = _graph(("x", (2, 3, 4), "float32"), ("y", (2, 1, 4), "float32"))
    t = b.transpose("x", (2, 0, 1))                                   # 4, 2, 3
    r = b.reshape(t, (8, 3))
    s = b.emit(Op.SLICE, r, starts=(7, 2), steps=(-2, -1), shape=(4, 3))
    c = b.concat([b.reshape(s, (2, 2, 3)), b.reshape(b.broadcast("y", (2, 3, 4)), (2, 4, 3))], axis=1)
    p = b.emit(Op.PAD, c, pads=(0, 1, 2, 1, 0, 0), mode="constant")
    q = b.emit(Op.PAD, p, b.scalar(-1.5, like=p), pads=(1, 0, 0, 0, 2, 1), mode="constant")
    out = b.gather(q, np.array([[0, 2], [1, 1]]), axis=2)
    _check_against_ort(g, out)


@pytest.mark.parametrize("mode", ["reflect", "edge", "wrap"])
def test_pad_modes(mode):
    g, b = _graph(("x", (3, 4), "float32"))
    _check_against_ort(g, b.emit(Op.PAD, "x", pads=(2, 1, 1, 3), mode=mode))


def test_matmul_batch_broadcast():
    g, b = _graph(("a", (2, 1, 3, 4), "float32"), ("w", (5, 4, 6), "float32"))
    _check_against_ort(g, b.emit(Op.MATMUL, "a", "w"))


@pytest.mark.parametrize("spatial", [1, 2, 3])
def test_conv_and_transpose(spatial):
    size = (7, 6, 5)[:spatial]
    g, b = _graph(("x", (1, 4) + size, "float32"), ("w", (6, 2) + (3,) * spatial, "float32"),
                  ("wt", (4, 3) + (2,) * spatial, "float32"))
    conv = b.emit(Op.CONV, "x", "w", strides=(2,) * spatial, pads=(1,) * spatial + (0,) * spatial,
                  dilations=(1,) * spatial, group=2)
    g.outputs.append(conv)
    convt = b.emit(Op.CONV_TRANSPOSE, "x", "wt", strides=(2,) * spatial, pads=(0,) * spatial + (1,) * spatial,
                   dilations=(1,) * spatial, group=2, output_padding=(1,) * spatial)
    _check_against_ort(g, convt)


def test_every_op_has_reference_and_onnx_form():
    assert interpret.supported_ops() == frozenset(Op)


def test_verify_rejects_bad_graphs():
    g, b = _graph(("x", (2, 3), "float32"))
    y = b.emit(Op.EXP, "x")
    g.outputs.append(y)
    verify(g)
    g.tensors[y] = Tensor(name=y, shape=(3, 2), dtype="float32")
    with pytest.raises(IRError, match="declared"):
        verify(g)
    with pytest.raises(IRError):
        b.emit(Op.MATMUL, "x", "x")
    g2, b2 = _graph(("x", (2, 3), "float32"))
    g2.outputs.append("missing")
    with pytest.raises(IRError, match="never defined"):
        verify(g2)


def test_builder_folds_constants_and_shares_small_ones():
    g, b = _graph(("x", (2, 3), "float32"))
    w = b.const(np.arange(6, dtype=np.float32).reshape(3, 2))
    wt = b.transpose(w, (1, 0))
    assert wt in g.constants and not g.nodes
    np.testing.assert_array_equal(g.constants[wt], np.arange(6, dtype=np.float32).reshape(3, 2).T)
    assert b.scalar(0.5, like="x") == b.scalar(0.5, like="x")


def test_max_pool_with_pads_as_wide_as_the_kernel_exports():
    # ceil_mode in a model can leave an end pad as wide as the dilated window, which ONNX Runtime refuses
    g, b = _graph(("x", (1, 2, 7, 7), "float32"))
    out = b.emit(Op.MAX_POOL, "x", kernel=(2, 2), strides=(3, 3), pads=(0, 0, 3, 3), dilations=(2, 2))
    _check_against_ort(g, out)
