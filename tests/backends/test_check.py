"""The checker: seeded random inputs (equal for equal inputs, drawn once per process, never changed by a caller),
and the comparison of a kernel's output with the reference's."""

import numpy as np
import pytest
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


def _compared(actual, expected) -> check.CheckResult:
    return check.compare(torch.tensor(actual, dtype=torch.float32), np.array(expected, dtype=np.float32), "y")


def test_floats_compare_by_relative_norm_as_float64_would():
    rng = np.random.default_rng(0)
    expected = rng.standard_normal((64, 33)).astype(np.float32)
    actual = (expected + 1e-4 * rng.standard_normal(expected.shape)).astype(np.float32)
    diff = actual.astype(np.float64) - expected.astype(np.float64)
    result = _compared(actual, expected)
    assert result.ok and result.message == ""
    assert result.rel_norm == pytest.approx(np.linalg.norm(diff) / np.linalg.norm(expected.astype(np.float64)), 1e-6)
    assert result.max_abs == pytest.approx(np.abs(diff).max(), 1e-6)
    channels_last = torch.from_numpy(actual.reshape(1, 3, 32, 22)).contiguous(memory_format=torch.channels_last)
    assert check.compare(channels_last, expected.reshape(1, 3, 32, 22), "y") == result  # however stored
    huge = _compared([3e38, -3e38], [3e38, -3e38])  # squares past float32's range, summed in float64
    assert huge.ok and huge.rel_norm == 0.0
    assert _compared([3e38, -3e38], [3e38, 3e38]).rel_norm == pytest.approx(2 ** 0.5, 1e-6)  # a float32 overflow
    far = _compared(expected * 1.01, expected)  # 1e-2 in relative norm, over the 2e-3 tolerance
    assert not far.ok and far.message.startswith("y: relative error 0.01")
    assert _compared([[0.0, 0.0]], [[0.0, 0.0]]).ok  # a zero reference: the largest difference decides


def test_nan_and_infinity_must_stand_where_the_reference_has_them():
    nan, inf = float("nan"), float("inf")
    assert _compared([1.0, nan, -inf], [1.0, nan, -inf]).ok
    assert _compared([1.0, 2.0, -inf], [1.0, nan, -inf]).message == "y: 1 NaN/inf elements differ"
    assert _compared([1.0, nan, inf], [1.0, nan, -inf]).message == "y: 1 NaN/inf elements differ"
    unwritten = _compared([nan, 2.0, nan], [1.0, 2.0, 3.0])  # a poisoned element the kernel never wrote
    assert not unwritten.ok and unwritten.message == "y: 2 NaN/inf elements differ" and unwritten.rel_norm == inf
    assert _compared([1.0, nan, 3.3], [1.0, nan, 3.0]).message.startswith("y: relative error")  # the rest


def test_integers_and_booleans_compare_exactly():
    assert check.compare(torch.tensor([1, 2, 3]), np.array([1, 2, 3]), "i").ok
    off = check.compare(torch.tensor([1, 2, 4]), np.array([1, 2, 3]), "i")
    assert not off.ok and off.message == "i: 1 elements differ" and off.max_abs == 1.0
    assert not check.compare(torch.tensor([True, False]), np.array([True, True]), "b").ok
    assert not check.compare(torch.zeros(2, 3), np.zeros((3, 2), np.float32), "s").ok  # shapes differ


def _token_type_lookup() -> Graph:
    """BERT's token-type embedding as fission lowers it: a 2-row table read at run-time ids, negatives wrapped."""
    import onnx
    from onnx import TensorProto, helper

    from tests.fission.oracle import lower

    table = np.arange(2 * 16, dtype=np.float32).reshape(2, 16)
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["y"], axis=0)], "lookup",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, (4, 32))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, (4, 32, 16))],
        [onnx.numpy_helper.from_array(table, "table")])
    return lower(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)]))


def _lookup_kernels() -> dict[str, Graph]:
    """The lookup as one kernel, and the kernel a search also measures with the wrap's condition (ids < 0)
    computed outside it: its inputs the ids and a boolean (hf_bert's six kernels that failed their check)."""
    from korch.ir.subgraph import extract
    from korch.orchestrate.candidates import enumerate_candidates

    graph = _token_type_lookup()
    kernels = {}
    wanted = {frozenset(node.op for node in graph.nodes): "whole",
              frozenset(node.op for node in graph.nodes if node.op is not Op.LESS): "condition outside"}
    for c in enumerate_candidates(graph).candidates:
        ops = [graph.nodes[i].op for i in c.nodes]
        if len(ops) == len(set(ops)) and frozenset(ops) in wanted:
            kernels[wanted[frozenset(ops)]] = extract(graph, c.nodes, c.inputs, c.outputs)
    return kernels


@pytest.mark.parametrize("which", ["whole", "condition outside"])
def test_what_a_lookup_reads_is_drawn_within_its_table_for_checks_and_timings(which):
    from korch.backends.inductor import InductorBackend

    kernel = _lookup_kernels()[which]
    assert [n.op for n in kernel.nodes].count(Op.GATHER) == 1
    bounds = {"ids": 2} if which == "whole" else {"ids": 2, kernel.inputs[1]: 1}
    assert check.index_bounds(kernel) == bounds
    for drawn in (check.random_inputs(kernel), check.RandomArena().inputs(kernel)):
        ids = drawn[kernel.inputs.index("ids")]
        assert int(ids.min()) == 0 and int(ids.max()) == 1  # both rows read, none past them
        assert all(not bool(x.any()) for x in drawn if x.dtype == torch.bool)  # ids < 0 nowhere, as drawn
    result = check.check(InductorBackend().build(kernel, "cpu"), kernel)
    assert result.ok, result.message
