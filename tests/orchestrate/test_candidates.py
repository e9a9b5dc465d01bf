"""Candidate enumeration equals a brute force over all node subsets, on random graphs and by hand."""

import itertools
import random

import numpy as np
import onnx
import pytest

from korch.errors import KorchError
from korch.fission.builder import Builder
from korch.ir import Graph, Op, Tensor, verify
from korch.ir.to_onnx import encode_opaque
from korch.orchestrate import candidates as cmod
from korch.orchestrate.candidates import default_predicate, enumerate_candidates

FULL = (1, 2, 4, 4)
UNARY = [Op.RELU, Op.EXP, Op.NEG, Op.SIGMOID]
BINARY = [Op.ADD, Op.MUL, Op.SUB, Op.MAX]


def random_graph(seed: int, size: int | None = None, with_opaque: bool = True) -> Graph:
    """A random DAG of 6-12 primitives (elementwise, reduce, matmul, conv, pool, concat/slice, opaque)."""
    rng = random.Random(seed)
    g = Graph(name=f"random{seed}")
    for name in ("x", "y"):
        g.add_tensor(Tensor(name=name, shape=FULL, dtype="float32"))
        g.inputs.append(name)
    b = Builder(g, "n")
    full, small, wide = ["x", "y"], [], []
    size = size or rng.randint(6, 12)

    def pick(pool):
        return rng.choice(pool[-3:]) if rng.random() < 0.6 else rng.choice(pool)

    kinds = ["unary"] * 4 + ["binary"] * 5 + ["reduce"] * 2 + ["linear"] * 2 + ["pool", "concat", "small"]
    if with_opaque:
        kinds.append("opaque")
    while len(g.nodes) < size:
        kind = rng.choice(kinds)
        if kind == "unary":
            full.append(b.emit(rng.choice(UNARY), pick(full)))
        elif kind == "binary":
            other = pick(small) if small and rng.random() < 0.3 else (
                b.scalar(rng.choice([0.5, 2.0]), "x") if rng.random() < 0.15 else pick(full))
            args = [pick(full), other]
            rng.shuffle(args)
            full.append(b.emit(rng.choice(BINARY), *args))
        elif kind == "reduce":
            axes = rng.choice([(3,), (2, 3)])
            small.append(b.emit(rng.choice([Op.REDUCE_SUM, Op.REDUCE_MAX]), pick(full), axes=axes, keepdims=True))
        elif kind == "small" and small:
            full.append(b.emit(Op.BROADCAST, pick(small), shape=FULL))
        elif kind == "linear":
            if rng.random() < 0.5:
                w = pick(full) if rng.random() < 0.5 else b.const(np.full((1, 2, 4, 4), 0.1, dtype=np.float32))
                full.append(b.emit(Op.MATMUL, pick(full), w))
            else:
                w = b.const(np.full((2, 2, 3, 3), 0.1, dtype=np.float32))
                full.append(b.emit(Op.CONV, pick(full), w, strides=(1, 1), pads=(1, 1, 1, 1), dilations=(1, 1), group=1))
        elif kind == "pool":
            full.append(b.emit(Op.MAX_POOL, pick(full), kernel=(3, 3), strides=(1, 1), pads=(1, 1, 1, 1),
                               dilations=(1, 1)))
        elif kind == "concat":
            if wide and rng.random() < 0.5:
                full.append(b.slice_axis(pick(wide), 1, rng.choice([0, 1, 2]), 2))
            else:
                wide.append(b.concat([pick(full), pick(full)], 1))
        elif kind == "opaque":
            k = len(g.nodes)
            outs = [Tensor(name=f"op{k}_{j}", shape=FULL, dtype="float32") for j in range(2)]
            full.extend(opaque(Builder(g, f"op{k}"), [pick(full)], outs))
    produced = [t for node in g.nodes for t in node.outputs]
    g.outputs = list(dict.fromkeys([produced[-1]] + rng.sample(produced, rng.randint(0, 2))))
    verify(g)
    return g


def opaque(b: Builder, inputs, outputs):
    """An opaque two-output ONNX Split node (its attributes as the frontend writes them)."""
    proto = onnx.helper.make_node("Split", inputs, [t.name for t in outputs], axis=1, num_outputs=len(outputs))
    return b.opaque(inputs, outputs, {"op_type": "Split", "domain": "", "opset": 18, "node": encode_opaque(proto)})


# -- an independent brute force ------------------------------------------------------------

def _reach(graph):
    producer = {t: i for i, node in enumerate(graph.nodes) for t in node.outputs}
    succ = {i: set() for i in range(len(graph.nodes))}
    for i, node in enumerate(graph.nodes):
        for t in node.inputs:
            if t in producer:
                succ[producer[t]].add(i)
    reach = {}
    for i in reversed(range(len(graph.nodes))):
        reach[i] = set(succ[i]).union(*(reach[s] for s in succ[i]))
    return producer, succ, reach


def brute_force(graph, max_nodes, predicate, allowed=None):
    _, succ, reach = _reach(graph)
    undirected = {i: set(succ[i]) for i in succ}
    for i, s in succ.items():
        for j in s:
            undirected[j].add(i)
    allowed = sorted(allowed if allowed is not None else range(len(graph.nodes)))
    found = set()
    for size in range(1, max_nodes + 1):
        for combo in itertools.combinations(allowed, size):
            s = set(combo)
            seen, todo = {combo[0]}, [combo[0]]
            while todo:
                for j in undirected[todo.pop()] & s - seen:
                    seen.add(j)
                    todo.append(j)
            if seen != s:
                continue
            outside_reached = set().union(*(reach[a] for a in s)) - s
            if any(reach[c] & s for c in outside_reached):
                continue
            if predicate(graph, frozenset(s)) is None:
                found.add(frozenset(s))
    return found


def expected_io(graph, nodes):
    producer, _, _ = _reach(graph)
    inputs = []
    for i in sorted(nodes):
        for t in graph.nodes[i].inputs:
            if t and producer.get(t) not in nodes and t not in inputs:
                inputs.append(t)
    outputs = [t for i in sorted(nodes) for t in graph.nodes[i].outputs
               if t in graph.outputs or any(t in graph.nodes[j].inputs for j in range(len(graph.nodes)) if j not in nodes)]
    return tuple(inputs), tuple(outputs)


def _check(graph, max_nodes, predicate=default_predicate, allowed=None):
    got = enumerate_candidates(graph, max_nodes=max_nodes, predicate=predicate, nodes=allowed)
    sets = [c.nodes for c in got.candidates]
    assert len(sets) == len(set(sets)), "duplicate candidates"
    assert set(sets) == brute_force(graph, max_nodes, predicate, allowed)
    for k, c in enumerate(got.candidates):
        assert c.id == k
        assert (c.inputs, c.outputs) == expected_io(graph, c.nodes)
        assert len(c.signature) == 16
    return got


@pytest.mark.parametrize("chunk", range(4))
def test_random_graphs_match_brute_force(chunk):
    for seed in range(chunk * 60, chunk * 60 + 60):
        rng = random.Random(seed)
        graph = random_graph(seed)
        _check(graph, rng.randint(2, 8))


def test_restricted_and_custom_predicates_match_brute_force():
    def accept_all(graph, nodes):
        return None

    def no_two_reductions(graph, nodes):  # a plain function: no bind, no grow
        return "two reductions" if sum(graph.nodes[i].op.kind.value == "reduce" for i in nodes) > 1 else None

    for seed in range(1000, 1040):
        rng = random.Random(seed)
        graph = random_graph(seed)
        n = len(graph.nodes)
        allowed = sorted(rng.sample(range(n), rng.randint(1, n))) if seed % 2 else range(rng.randint(0, n // 2), n)
        _check(graph, rng.randint(1, 7), default_predicate, allowed)
        _check(graph, rng.randint(1, 7), rng.choice([accept_all, no_two_reductions]))


def _graph(*shapes):
    g = Graph(name="t")
    for k, shape in enumerate(shapes):
        g.add_tensor(Tensor(name=f"in{k}", shape=shape, dtype="float32"))
        g.inputs.append(f"in{k}")
    return g, Builder(g, "n")


def test_multi_output_candidates_and_rejections():
    g, b = _graph(FULL)
    a = b.emit(Op.RELU, "in0")
    e = b.emit(Op.EXP, a)
    n = b.emit(Op.NEG, a)
    s = b.emit(Op.ADD, e, n)
    g.outputs = [s, e]
    got = _check(g, 4)
    multi = {c.nodes: c.outputs for c in got.candidates if len(c.outputs) > 1}
    assert multi[frozenset({0, 1})] == (a, e)
    assert multi[frozenset({0, 1, 2, 3})] == (e, s)
    # {relu, add} leaves through exp and comes back: not convex, and counted
    assert frozenset({0, 3}) not in {c.nodes for c in got.candidates}
    assert got.rejected[cmod.NOT_CONVEX] >= 1


def test_opaque_nodes_only_alone_and_kind_rules():
    g, b = _graph(FULL, FULL)
    w = b.const(np.ones((2, 2, 3, 3), dtype=np.float32))
    c1 = b.emit(Op.CONV, "in0", w, strides=(1, 1), pads=(1, 1, 1, 1), dilations=(1, 1), group=1)
    r = b.emit(Op.RELU, c1)
    (o1, o2) = opaque(b, [r], [Tensor(name="o1", shape=FULL, dtype="float32"),
                               Tensor(name="o2", shape=FULL, dtype="float32")])
    c2 = b.emit(Op.MATMUL, o1, "in1")
    m = b.emit(Op.MATMUL, c2, o2)
    red = b.emit(Op.REDUCE_SUM, m, axes=(3,), keepdims=True)
    g.outputs = [red]
    got = _check(g, 8)
    sets = {c.nodes for c in got.candidates}
    assert frozenset({2}) in sets
    assert all(len(s) == 1 for s in sets if 2 in s)
    assert frozenset({0, 1}) in sets and frozenset({3, 4}) not in sets and frozenset({4, 5}) not in sets
    assert got.rejected["opaque primitive with others"] >= 2
    assert got.rejected["two linear primitives"] >= 1
    assert got.rejected["linear with reduce"] >= 1
    only = next(c for c in got.candidates if c.nodes == frozenset({2}))
    assert only.outputs == ("o1", "o2") and only.inputs == (r,)


def test_default_predicate_reasons():
    g, b = _graph(FULL)
    x = b.emit(Op.EXP, "in0")
    mx = b.emit(Op.REDUCE_MAX, x, axes=(3,), keepdims=True)
    sub = b.emit(Op.SUB, x, mx)
    ex = b.emit(Op.EXP, sub)
    sm = b.emit(Op.REDUCE_SUM, ex, axes=(3,), keepdims=True)
    out = b.emit(Op.DIV, ex, sm)
    other = b.emit(Op.REDUCE_SUM, out, axes=(2, 3), keepdims=True)
    pool = b.emit(Op.MAX_POOL, out, kernel=(3, 3), strides=(1, 1), pads=(1, 1, 1, 1), dilations=(1, 1))
    g.outputs = [other, pool]
    assert default_predicate(g, frozenset(range(6))) is None  # softmax: one reduction group
    assert default_predicate(g, frozenset(range(7))) == "reductions of different shapes or axes"
    assert default_predicate(g, frozenset({5, 7})) is None
    assert default_predicate(g, frozenset({4, 5, 7})) == "reduce with window"


def test_output_limit_and_hubs():
    g, b = _graph(FULL)
    h = b.emit(Op.RELU, "in0")
    leaves = [b.emit(op, h) for op in [Op.EXP, Op.NEG, Op.SIGMOID, Op.TANH, Op.ABS]]
    g.outputs = leaves
    assert default_predicate(g, frozenset({0, 1, 2, 3})) is None  # h (read by two more leaves) and 3 leaves
    assert default_predicate(g, frozenset({0, 1, 2, 3, 4})) == "more than 4 outputs"
    assert default_predicate(g, frozenset(range(6))) == "more than 4 outputs"  # the 5 leaves
    assert default_predicate(g, frozenset({0})) is None
    # a hub: a node with more than HUB_DEGREE neighbours keeps at most HUB_NEIGHBOURS of them
    g, b = _graph(FULL)
    h = b.emit(Op.RELU, "in0")
    g.outputs = [b.concat([b.emit(Op.EXP, h) for _ in range(cmod.HUB_DEGREE + 1)], 1)]
    got = _check(g, 6)
    assert got.rejected[f"more than {cmod.HUB_NEIGHBOURS} neighbours of a node with more than {cmod.HUB_DEGREE}"]
    assert max(len(c.nodes) for c in got.candidates if 0 in c.nodes) == cmod.HUB_NEIGHBOURS + 1


def test_errors():
    g, _ = _graph(FULL)
    with pytest.raises(KorchError):
        enumerate_candidates(g, max_nodes=0)
    with pytest.raises(KorchError):
        enumerate_candidates(g, nodes=[3])
    assert enumerate_candidates(g).candidates == []
