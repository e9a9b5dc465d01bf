"""Signatures: equal for isomorphic candidates whatever the names and node order, different otherwise."""

import random

import numpy as np
import onnx

from korch.fission.builder import Builder
from korch.ir import Graph, Op, Tensor, verify
from korch.ir.to_onnx import encode_opaque
from korch.orchestrate.candidates import enumerate_candidates
from korch.orchestrate.signature import Signer, describe, signature
from tests.orchestrate.test_candidates import FULL, random_graph


def isomorphic_copy(graph: Graph, rng: random.Random) -> tuple[Graph, list[int]]:
    """The same graph with fresh tensor and node names and another topological order; old index -> new."""
    names = list(graph.tensors)
    fresh = [f"t{k}" for k in range(len(names))]
    rng.shuffle(fresh)
    rename = dict(zip(names, fresh))
    rename[""] = ""
    producer = {t: i for i, node in enumerate(graph.nodes) for t in node.outputs}
    preds = [{producer[t] for t in node.inputs if t in producer} for node in graph.nodes]
    order, placed = [], set()
    while len(order) < len(graph.nodes):
        ready = [i for i in range(len(graph.nodes)) if i not in placed and preds[i] <= placed]
        i = rng.choice(ready)
        order.append(i)
        placed.add(i)
    copy = Graph(name="copy", opset=graph.opset)
    for name in rng.sample(names, len(names)):
        t = graph.tensors[name]
        copy.tensors[rename[name]] = Tensor(name=rename[name], shape=t.shape, dtype=t.dtype)
    copy.inputs = [rename[t] for t in graph.inputs]
    copy.outputs = [rename[t] for t in graph.outputs]
    copy.constants = {rename[t]: v for t, v in graph.constants.items()}
    for k, i in enumerate(order):
        node = graph.nodes[i]
        copy.nodes.append(node.replace(inputs=tuple(rename[t] for t in node.inputs),
                                       outputs=tuple(rename[t] for t in node.outputs), name=f"node{k}"))
    verify(copy)
    new_index = [0] * len(order)
    for k, i in enumerate(order):
        new_index[i] = k
    return copy, new_index


def test_isomorphic_copies_share_signatures():
    for seed in range(80):
        rng = random.Random(seed)
        graph = random_graph(seed)
        copy, new_index = isomorphic_copy(graph, rng)
        max_nodes = rng.randint(3, 8)
        ours = enumerate_candidates(graph, max_nodes=max_nodes).candidates
        theirs = {c.nodes: c for c in enumerate_candidates(copy, max_nodes=max_nodes).candidates}
        assert len(ours) == len(theirs)
        for c in ours:
            other = theirs[frozenset(new_index[i] for i in c.nodes)]
            assert other.signature == c.signature
            assert sorted(describe(copy, other.nodes).split("+")) == sorted(describe(graph, c.nodes).split("+"))
        for c in ours[:20]:
            assert signature(graph, c.nodes) == c.signature


def _inputs(*specs):
    g = Graph(name="t")
    for name, shape, dtype in specs:
        g.add_tensor(Tensor(name=name, shape=shape, dtype=dtype))
        g.inputs.append(name)
    return g, Builder(g, "n")


def _base(y_shape=FULL, dtype="float32", axes=(3,), scale=0.5, first=Op.RELU, swap=False, same=False,
          extra_output=False):
    g, b = _inputs(("x", FULL, dtype), ("y", y_shape, dtype))
    a = b.emit(first, "x")
    args = (a, a) if same else (("y", a) if swap else (a, "y"))
    s = b.emit(Op.ADD, *args)
    c = b.emit(Op.REDUCE_SUM, s, axes=axes, keepdims=True)
    d = b.emit(Op.MUL, s, b.scalar(scale, "x"))
    g.outputs = [d, c] + ([a] if extra_output else [])
    return signature(g, range(4)), signature(g, {1, 3})


def test_any_structural_change_changes_the_signature():
    variants = {
        "base": _base(),
        "shape": _base(y_shape=(1, 2, 4, 1)),
        "dtype": _base(dtype="float64"),
        "attr": _base(axes=(2,)),
        "small constant": _base(scale=0.25),
        "op": _base(first=Op.EXP),
        "port order": _base(swap=True),
        "shared input": _base(same=True),
        "outputs": _base(extra_output=True),
    }
    assert _base() == variants["base"]  # deterministic
    whole = {v[0] for v in variants.values()}
    assert len(whole) == len(variants)
    assert variants["outputs"][1] == variants["base"][1]  # {add, mul} does not see relu's output change


def test_large_constants_enter_by_shape_only():
    def sig(value, shape=(1, 2, 8, 8)):
        g, b = _inputs(("x", (1, 2, 8, 8), "float32"))
        g.outputs = [b.emit(Op.RELU, b.emit(Op.ADD, "x", b.const(np.full(shape, value, dtype=np.float32))))]
        return signature(g, {0, 1})

    assert sig(1.0) == sig(2.0)
    assert sig(1.0) != sig(1.0, shape=(1, 1, 8, 8))


def test_symmetric_structures():
    def sig(left, right, ins=("x", "y")):
        g, b = _inputs(("x", FULL, "float32"), ("y", FULL, "float32"))
        p = b.emit(Op.RELU, ins[0])
        q = b.emit(Op.RELU, ins[1])
        lhs, rhs = b.emit(left, p), b.emit(right, q if ins[0] != ins[1] else p)
        g.outputs = [b.emit(Op.SUB, lhs, rhs)]
        return signature(g, range(len(g.nodes))), g

    assert sig(Op.EXP, Op.NEG)[0] != sig(Op.NEG, Op.EXP)[0]
    assert sig(Op.EXP, Op.EXP, ("x", "y"))[0] != sig(Op.EXP, Op.EXP, ("x", "x"))[0]
    # sub(exp(relu x), exp(relu y)) is sub(exp(relu y), exp(relu x)) with x and y renamed
    g, b = _inputs(("y", FULL, "float32"), ("x", FULL, "float32"))
    q = b.emit(Op.EXP, b.emit(Op.RELU, "y"))
    p = b.emit(Op.EXP, b.emit(Op.RELU, "x"))
    g.outputs = [b.emit(Op.SUB, q, p)]
    assert signature(g, range(5)) == sig(Op.EXP, Op.EXP)[0]
    # fully symmetric: two identical consumers of one tensor; every order gives one signature
    g, b = _inputs(("x", FULL, "float32"))
    r = b.emit(Op.RELU, "x")
    g.outputs = [b.emit(Op.ADD, b.emit(Op.EXP, r), b.emit(Op.EXP, r))]
    expected = signature(g, range(4))
    for seed in range(10):
        copy, _ = isomorphic_copy(g, random.Random(seed))
        assert signature(copy, range(4)) == expected
    # ties that only trying every choice resolves: which relu comes first decides the input numbering
    g, b = _inputs(("x", FULL, "float32"), ("y", FULL, "float32"))
    g.outputs = [b.emit(Op.RELU, "x"), b.emit(Op.RELU, "y"), b.emit(Op.RELU, "x")]
    expected = signature(g, range(3))
    for seed in range(20):
        copy, _ = isomorphic_copy(g, random.Random(seed))
        assert signature(copy, range(3)) == expected


def residual_blocks(count: int, seed: int = 0) -> Graph:
    """``count`` identical residual blocks (conv, relu, conv, add, relu) with different weights."""
    rng = np.random.default_rng(seed)
    g, b = _inputs(("x", FULL, "float32"))
    x = "x"
    for _ in range(count):
        conv = {"strides": (1, 1), "pads": (2, 2, 2, 2), "dilations": (1, 1), "group": 1}
        w1, w2 = (b.const(rng.standard_normal((2, 2, 5, 5)).astype(np.float32)) for _ in range(2))
        h = b.emit(Op.RELU, b.emit(Op.CONV, x, w1, **conv))
        h = b.emit(Op.CONV, h, w2, **conv)
        x = b.emit(Op.RELU, b.emit(Op.ADD, h, x))
    g.outputs = [x]
    verify(g)
    return g


def test_repeated_blocks_share_signatures():
    g = residual_blocks(3)
    cands = enumerate_candidates(g, max_nodes=5).candidates
    by_nodes = {c.nodes: c.signature for c in cands}
    inside = [c for c in cands if max(c.nodes) < 5]
    assert inside
    for c in inside:
        for k in (1, 2):
            assert by_nodes[frozenset(i + 5 * k for i in c.nodes)] == c.signature
    assert len({c.signature for c in cands}) < len(cands)


def test_signer_matches_signature_and_describe():
    g = residual_blocks(1)
    signer = Signer(g)
    assert signer(range(5)) == signature(g, range(5)) == signer(range(5), signer.outputs(range(5)))
    assert describe(g, {3, 0, 1, 2}) == "Conv+Relu+Conv+Add"


def test_opaque_nodes_are_compared_without_their_names():
    def sig(prefix, axis=1):
        g, b = _inputs((f"{prefix}x", FULL, "float32"))
        outs = [Tensor(name=f"{prefix}o{k}", shape=(1, 1, 4, 4), dtype="float32") for k in range(2)]
        proto = onnx.helper.make_node("Split", [f"{prefix}x"], [t.name for t in outs], name=prefix, axis=axis,
                                      num_outputs=2)
        b.opaque([f"{prefix}x"], outs, {"op_type": "Split", "domain": "", "opset": 18, "node": encode_opaque(proto)})
        g.outputs = [t.name for t in outs]
        return signature(g, {0})

    assert sig("a") == sig("b") != sig("a", axis=0)
