"""The checker's seeded random inputs: equal for equal inputs, drawn once per process, never changed by a caller."""

import numpy as np
import torch

from korch.backends import check
from korch.ir.graph import Graph, Node, Tensor
from korch.ir.ops import Op


def _negation(shapes: list[tuple[int, ...]]) -> Graph:
    graph = Graph(name="neg")
    for i, shape in enumerate(shapes):
        graph.add_tensor(Tensor(name=f"x{i}", shape=shape, dtype="float32"))
        graph.add_tensor(Tensor(name=f"y{i}", shape=shape, dtype="float32"))
        graph.nodes.append(Node(op=Op.NEG, inputs=(f"x{i}",), outputs=(f"y{i}",), name=f"y{i}"))
    graph.inputs, graph.outputs = [f"x{i}" for i in range(len(shapes))], [f"y{i}" for i in range(len(shapes))]
    return graph


def test_an_input_is_seeded_by_its_place_and_shape_and_a_caller_cannot_change_the_next_draw():
    first, second = check.random_inputs(_negation([(64, 8), (3, 5)])), check.random_inputs(_negation([(64, 8)]))
    assert torch.equal(first[0], second[0])  # the same place, dtype and shape: the same values
    assert not torch.equal(check.random_inputs(_negation([(64, 8)]), seed=1)[0], first[0])
    second[0].add_(1.0)  # a kernel writing its input
    assert torch.equal(check.random_inputs(_negation([(64, 8)]))[0], first[0])
    assert 0.5 <= float(check.random_inputs(_negation([(4, 4)]), positive=True)[0].min()) < 1.5


def test_the_drawn_values_keep_to_their_byte_limit_least_recently_used_first():
    drawn = check._DrawnValues(limit_bytes=3 * 400)
    for key in "abc":
        drawn.get(key, lambda: np.zeros(100, np.float32))  # 400 bytes each
    drawn.get("a", lambda: np.ones(100, np.float32))  # used again: kept, not drawn again
    drawn.get("d", lambda: np.zeros(100, np.float32))
    assert list(drawn._arrays) == ["c", "a", "d"] and drawn.held == 1200
    assert drawn.get("a", lambda: np.ones(100, np.float32))[0] == 0.0
