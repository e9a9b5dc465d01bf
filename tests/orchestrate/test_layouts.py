"""The layout-aware program (orchestrate/layouts.py) against brute force: on small 4-D graphs with random
costs per kernel and layout and per conversion, the solver's optimum equals the cheapest of every executable
selection of kernels, every layout of each, and the conversions that selection then needs."""

import itertools
import math
import random

import pytest

from korch.ir.graph import CHANNELS_LAST, CONTIGUOUS, Graph, Tensor
from korch.ir.ops import Op
from korch.fission.builder import Builder
from korch.orchestrate.candidates import enumerate_candidates
from korch.orchestrate.layouts import Conversion, conversions, laid_out, stored_name, with_layouts
from korch.orchestrate.partition import partition
from korch.orchestrate.problem import segment_problem
from korch.orchestrate.solver import solve

IMAGE = (1, 4, 3, 3)


def _graph(shape=IMAGE) -> tuple[Graph, Builder]:
    g = Graph(name="t")
    g.add_tensor(Tensor(name="in0", shape=shape, dtype="float32"))
    g.inputs.append("in0")
    return g, Builder(g, "n")


def _pool(b: Builder, x: str) -> str:
    """A 1x1 max pool: a window operation, so that the graph's values have layouts (``with_layouts``)."""
    return b.emit(Op.MAX_POOL, x, kernel=(1, 1), strides=(1, 1), pads=(0, 0, 0, 0), dilations=(1, 1))


def chain() -> Graph:
    """pool -> exp -> (neg, add with the input): a fork and a join of 4-D values."""
    g, b = _graph()
    a = _pool(b, "in0")
    e = b.emit(Op.EXP, a)
    n = b.emit(Op.NEG, e)
    g.outputs = [b.emit(Op.ADD, n, "in0"), e]
    return g


def diamond() -> Graph:
    g, b = _graph()
    a = _pool(b, "in0")
    left, right = b.emit(Op.EXP, a), b.emit(Op.NEG, a)
    g.outputs = [b.emit(Op.MUL, left, right)]
    return g


def with_flat_tail() -> Graph:
    """A 4-D value reshaped to 2-D: the 2-D one has no layouts."""
    g, b = _graph()
    a = _pool(b, "in0")
    flat = b.reshape(a, (1, 36))
    g.outputs = [b.emit(Op.EXP, flat)]
    return g


def brute_force(graph: Graph, base, cost, move_cost) -> float:
    """The cheapest plan, by enumeration: a selection of kernels runs if some order gives each its inputs; each
    kernel picks a layout; a value read (or output) in a layout nobody wrote it in costs one conversion."""
    outputs, best = set(graph.outputs), math.inf
    given = set(graph.inputs) | set(graph.constants)
    for size in range(1, len(base) + 1):
        for chosen in itertools.combinations(base, size):
            available, pending = set(given), list(chosen)
            while pending:
                ready = [c for c in pending if set(c.inputs) <= available]
                if not ready:
                    break
                for c in ready:
                    available |= set(c.outputs)
                    pending.remove(c)
            if pending or not outputs <= available or \
                    not set().union(*(c.nodes for c in chosen)) >= set(range(len(graph.nodes))):
                continue
            for layouts in itertools.product(*[[CONTIGUOUS, CHANNELS_LAST] if laid_out(graph, c) else [CONTIGUOUS]
                                               for c in chosen]):
                total = sum(cost[(c.nodes, lay)] for c, lay in zip(chosen, layouts))
                written = {t: {CONTIGUOUS} for t in graph.inputs}
                read: dict[str, set] = {t: {CONTIGUOUS} for t in outputs}
                for c, lay in zip(chosen, layouts):
                    stored = set(laid_out(graph, c)) if lay != CONTIGUOUS else set()
                    for t in c.outputs:
                        written.setdefault(t, set()).add(lay if t in stored else CONTIGUOUS)
                    for t in c.inputs:
                        read.setdefault(t, set()).add(lay if t in stored else CONTIGUOUS)
                for t, wanted in read.items():
                    for lay in wanted - written.get(t, set()):
                        total += move_cost[Conversion(t, lay)]
                best = min(best, total)
    return best


def solved(graph: Graph, cost, move_cost) -> tuple[float, object]:
    cset = with_layouts(graph, enumerate_candidates(graph, max_nodes=3))
    (segment,) = partition(graph, cset)
    costs = [cost[(c.nodes, c.layout)] for c in cset.candidates]
    problem, ids, moves = segment_problem(graph, cset, segment, costs, lambda m: move_cost[m])
    return solve(problem).objective, (cset, ids, moves)


@pytest.mark.parametrize("make", [chain, diamond, with_flat_tail])
@pytest.mark.parametrize("seed", range(6))
def test_the_program_finds_the_cheapest_kernels_and_layouts(make, seed):
    graph = make()
    base = enumerate_candidates(graph, max_nodes=3).candidates
    rng = random.Random(seed)
    cost = {}
    for c in base:
        cost[(c.nodes, CONTIGUOUS)] = rng.uniform(1, 10)
        # channels-last kernels often much cheaper, sometimes dearer
        cost[(c.nodes, CHANNELS_LAST)] = cost[(c.nodes, CONTIGUOUS)] * rng.choice([0.1, 0.3, 0.8, 1.5])
    move_cost = {Conversion(t, to): rng.uniform(0.5, 6) for t in graph.tensors for to in (CONTIGUOUS, CHANNELS_LAST)}
    objective, _ = solved(graph, cost, move_cost)
    assert objective == pytest.approx(brute_force(graph, base, cost, move_cost), rel=1e-6)


def test_cheap_channels_last_kernels_are_chosen_with_their_conversions():
    graph = chain()
    base = enumerate_candidates(graph, max_nodes=3).candidates
    cost = {}
    for c in base:
        cost[(c.nodes, CONTIGUOUS)] = 10.0
        cost[(c.nodes, CHANNELS_LAST)] = 1.0
    move_cost = {Conversion(t, to): 0.5 for t in graph.tensors for to in (CONTIGUOUS, CHANNELS_LAST)}
    objective, (cset, ids, moves) = solved(graph, cost, move_cost)
    # every kernel channels-last: the input converted in, both outputs converted out
    assert objective == pytest.approx(brute_force(graph, base, cost, move_cost))
    assert objective < 10.0


def test_a_graph_without_convolutions_or_pools_gets_no_layout_columns():
    g, b = _graph()
    g.outputs = [b.emit(Op.EXP, b.emit(Op.RELU, "in0"))]
    base = enumerate_candidates(g, max_nodes=3)
    assert with_layouts(g, base) is base


def test_layout_columns_and_conversions():
    graph = with_flat_tail()
    base = enumerate_candidates(graph, max_nodes=3)
    cset = with_layouts(graph, base)
    variants = cset.candidates[len(base.candidates):]
    # a column for each kernel with a 4-D value at its boundary: not the exp of the 2-D value alone
    assert {c.nodes for c in variants} == {c.nodes for c in base.candidates if c.nodes != frozenset({2})}
    for v in variants:
        original = next(c for c in base.candidates if c.nodes == v.nodes)
        assert v.layout == CHANNELS_LAST and v.signature == original.signature + "@channels_last"
        assert cset.candidates[v.id] is v
    assert {m.tensor for m in conversions(graph, variants)} == {"in0", graph.nodes[0].output}
    assert stored_name("x", CONTIGUOUS) == "x" and stored_name("x", CHANNELS_LAST) != "x"
