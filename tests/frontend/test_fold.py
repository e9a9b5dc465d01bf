"""Constant folding, no-op removal and dead code removal of the ONNX frontend."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from korch import config
from korch.frontend import load_onnx

F = TensorProto.FLOAT


def make(nodes, inputs, outputs, inits=(), opset=17, extra_opsets=(), functions=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    return helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", opset), *extra_opsets],
        ir_version=10,
        functions=list(functions),
    )


def tensor(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


def const(name, value):
    return numpy_helper.from_array(np.asarray(value), name)


def run(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def ops(model: onnx.ModelProto) -> list[str]:
    return [node.op_type for node in model.graph.node]


def assert_static(imported) -> None:
    graph = imported.model.graph
    names = {v.name for v in graph.input} | {v.name for v in graph.output}
    names |= {t.name for t in graph.initializer}
    names |= {out for node in graph.node for out in node.output if out}
    assert names <= set(imported.shapes)
    for name, (shape, dtype) in imported.shapes.items():
        assert all(isinstance(d, int) and d >= 0 for d in shape), name
        assert isinstance(dtype, str) and dtype, name
    onnx.checker.check_model(imported.model)


def shape_chain_model(opset=17) -> onnx.ModelProto:
    """y = Reshape(x, Concat(Unsqueeze(Gather(Shape(x), 0)), [-1]))."""
    if opset >= 13:
        unsqueeze = helper.make_node("Unsqueeze", ["b", "axes"], ["bu"])
    else:
        unsqueeze = helper.make_node("Unsqueeze", ["b"], ["bu"], axes=[0])
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["b"], axis=0),
        unsqueeze,
        helper.make_node("Concat", ["bu", "minus_one"], ["shape"], axis=0),
        helper.make_node("Reshape", ["x", "shape"], ["r"]),
        helper.make_node("Relu", ["r"], ["y"]),
    ]
    inits = [
        const("zero", np.int64(0)),
        const("axes", np.array([0], np.int64)),
        const("minus_one", np.array([-1], np.int64)),
    ]
    return make(
        nodes, [tensor("x", F, ["batch", 3, 4])], [tensor("y", F, ["batch", 12])], inits, opset
    )


@pytest.mark.parametrize("opset", [11, 13, 17, 18, 21])
def test_shape_chain_folds_away(opset):
    original = shape_chain_model(opset)
    imported = load_onnx(original, {"x": (2, 3, 4)})
    assert ops(imported.model) == ["Reshape", "Relu"]
    shape_input = imported.model.graph.node[0].input[1]
    assert shape_input in {t.name for t in imported.model.graph.initializer}
    np.testing.assert_array_equal(imported.constants[shape_input], [2, -1])
    assert imported.shapes["y"] == ((2, 12), "float32")
    assert imported.opset == opset
    assert_static(imported)
    x = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
    np.testing.assert_array_equal(run(imported.model, {"x": x})[0], run(original, {"x": x})[0])


def test_newest_opset_folds():
    newest = onnx.defs.onnx_opset_version()
    imported = load_onnx(shape_chain_model(newest), {"x": (2, 3, 4)})
    assert ops(imported.model) == ["Reshape", "Relu"]
    assert imported.opset == newest


def test_caller_model_is_not_mutated():
    original = shape_chain_model()
    before = original.SerializeToString()
    load_onnx(original, {"x": (2, 3, 4)})
    assert original.SerializeToString() == before


def test_shape_with_start_end_and_size_fold():
    nodes = [
        helper.make_node("Shape", ["x"], ["s"], start=1, end=-1),
        helper.make_node("Size", ["x"], ["n"]),
        helper.make_node("Cast", ["n"], ["nf"], to=F),
        helper.make_node("Add", ["x", "nf"], ["y"]),
    ]
    model = make(nodes, [tensor("x", F, [2, 3, 4])], [tensor("y", F, None), tensor("s", 7, None)])
    imported = load_onnx(model)
    assert ops(imported.model) == ["Add"]
    np.testing.assert_array_equal(imported.constants["s"], [3])
    assert imported.constants[imported.model.graph.node[0].input[1]] == np.float32(24)
    assert imported.shapes["s"] == ((1,), "int64")
    assert_static(imported)


def test_constant_and_constant_of_shape_become_initializers():
    nodes = [
        helper.make_node("Constant", [], ["shape"], value=const("v", np.array([2, 3], np.int64))),
        helper.make_node("ConstantOfShape", ["shape"], ["ones"], value=const("o", np.array([1.0], np.float32))),
        helper.make_node("Add", ["x", "ones"], ["y"]),
    ]
    imported = load_onnx(make(nodes, [tensor("x", F, [2, 3])], [tensor("y", F, [2, 3])]))
    assert ops(imported.model) == ["Add"]
    np.testing.assert_array_equal(imported.constants["ones"], np.ones((2, 3), np.float32))
    assert "shape" not in imported.constants  # no longer used by anything
    assert_static(imported)


def test_fold_respects_max_elements():
    nodes = [
        helper.make_node("ConstantOfShape", ["shape"], ["big"], value=const("o", np.array([1.0], np.float32))),
        helper.make_node("Add", ["x", "big"], ["y"]),
    ]
    model = make(nodes, [tensor("x", F, [1000])], [tensor("y", F, [1000])], [const("shape", np.array([1000], np.int64))])
    with config.patch(fold_max_elements=100):
        imported = load_onnx(model)
    assert ops(imported.model) == ["ConstantOfShape", "Add"]
    assert_static(imported)
    assert ops(load_onnx(model).model) == ["Add"]


def test_nondeterministic_ops_are_not_folded():
    nodes = [
        helper.make_node("RandomNormal", [], ["noise"], shape=[2, 3], dtype=F),
        helper.make_node("Add", ["x", "noise"], ["y"]),
    ]
    imported = load_onnx(make(nodes, [tensor("x", F, [2, 3])], [tensor("y", F, [2, 3])]))
    assert ops(imported.model) == ["RandomNormal", "Add"]
    assert imported.shapes["noise"] == ((2, 3), "float32")


def test_weights_transform_folds():
    w = np.arange(12, dtype=np.float32).reshape(3, 4)
    nodes = [
        helper.make_node("Transpose", ["w"], ["wt"], perm=[1, 0]),
        helper.make_node("MatMul", ["x", "wt"], ["y"]),
    ]
    imported = load_onnx(make(nodes, [tensor("x", F, [2, 4])], [tensor("y", F, [2, 3])], [const("w", w)]))
    assert ops(imported.model) == ["MatMul"]
    np.testing.assert_array_equal(imported.constants["wt"], w.T)
    assert "w" not in imported.constants
    assert_static(imported)


def test_identity_and_dropout_removed():
    nodes = [
        helper.make_node("Identity", ["x"], ["a"]),
        helper.make_node("Relu", ["a"], ["b"]),
        helper.make_node("Dropout", ["b", "ratio"], ["c"]),
        helper.make_node("Sigmoid", ["c"], ["y"]),
    ]
    model = make(nodes, [tensor("x", F, [2, 3])], [tensor("y", F, [2, 3])], [const("ratio", np.float32(0.5))])
    imported = load_onnx(model)
    assert ops(imported.model) == ["Relu", "Sigmoid"]
    assert list(imported.model.graph.node[0].input) == ["x"]
    assert list(imported.model.graph.node[1].input) == [imported.model.graph.node[0].output[0]]
    assert "ratio" not in imported.constants
    assert_static(imported)


def test_noop_feeding_graph_output_renames_producer():
    nodes = [
        helper.make_node("Relu", ["x"], ["a"]),
        helper.make_node("Identity", ["a"], ["y"]),
        helper.make_node("Dropout", ["a"], ["z"], ratio=0.3),
        helper.make_node("Neg", ["a"], ["w"]),
    ]
    outputs = [tensor("y", F, [2, 3]), tensor("z", F, [2, 3]), tensor("w", F, [2, 3])]
    model = make(nodes, [tensor("x", F, [2, 3])], outputs, opset=11)
    imported = load_onnx(model)
    graph = imported.model.graph
    # Relu now writes y; z (a second graph output of the same value) stays an Identity of y.
    assert [(n.op_type, list(n.input), list(n.output)) for n in graph.node] == [
        ("Relu", ["x"], ["y"]),
        ("Identity", ["y"], ["z"]),
        ("Neg", ["y"], ["w"]),
    ]
    x = np.random.default_rng(1).standard_normal((2, 3)).astype(np.float32)
    for got, want in zip(run(imported.model, {"x": x}), run(model, {"x": x})):
        np.testing.assert_array_equal(got, want)
    assert_static(imported)


def test_identity_of_input_or_initializer_to_output_is_kept():
    nodes = [
        helper.make_node("Identity", ["x"], ["y"]),
        helper.make_node("Identity", ["w"], ["z"]),
    ]
    model = make(
        nodes,
        [tensor("x", F, [2])],
        [tensor("y", F, [2]), tensor("z", F, [3])],
        [const("w", np.ones(3, np.float32))],
    )
    imported = load_onnx(model)
    assert ops(imported.model) == ["Identity", "Identity"]
    assert imported.shapes["z"] == ((3,), "float32")
    assert_static(imported)


def test_dropout_mask_becomes_constant():
    nodes = [
        helper.make_node("Dropout", ["x"], ["d", "mask"]),
        helper.make_node("Cast", ["mask"], ["mf"], to=F),
        helper.make_node("Mul", ["d", "mf"], ["y"]),
    ]
    model = make(nodes, [tensor("x", F, [2, 3])], [tensor("y", F, [2, 3]), tensor("mask", TensorProto.BOOL, [2, 3])])
    imported = load_onnx(model)
    assert ops(imported.model) == ["Mul"]
    assert imported.constants["mask"].dtype == np.bool_ and imported.constants["mask"].all()
    x = np.random.default_rng(2).standard_normal((2, 3)).astype(np.float32)
    for got, want in zip(run(imported.model, {"x": x}), run(model, {"x": x})):
        np.testing.assert_array_equal(got, want)


def test_dead_nodes_and_initializers_removed():
    nodes = [
        helper.make_node("Relu", ["x"], ["y"]),
        helper.make_node("Add", ["x", "unused_w"], ["dead"]),
        helper.make_node("Sigmoid", ["dead"], ["dead2"]),
    ]
    inits = [const("unused_w", np.ones(2, np.float32)), const("orphan", np.ones(4, np.float32))]
    imported = load_onnx(make(nodes, [tensor("x", F, [2])], [tensor("y", F, [2])], inits))
    assert ops(imported.model) == ["Relu"]
    assert not imported.model.graph.initializer and not imported.constants
    assert set(imported.shapes) == {"x", "y"}


def test_unsorted_graph_is_sorted():
    nodes = [
        helper.make_node("Sigmoid", ["a"], ["y"]),
        helper.make_node("Relu", ["x"], ["a"]),
    ]
    imported = load_onnx(make(nodes, [tensor("x", F, [2])], [tensor("y", F, [2])]))
    assert ops(imported.model) == ["Relu", "Sigmoid"]


def test_if_with_constant_condition_is_inlined():
    then_branch = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["t"])], "then", [], [tensor("t", F, [2])]
    )
    else_branch = helper.make_graph(
        [helper.make_node("Neg", ["x"], ["t"])], "else", [], [tensor("t", F, [2])]
    )
    nodes = [
        helper.make_node("Equal", ["one", "one"], ["cond"]),
        helper.make_node("If", ["cond"], ["r"], then_branch=then_branch, else_branch=else_branch),
        helper.make_node("Sigmoid", ["r"], ["y"]),
    ]
    model = make(nodes, [tensor("x", F, [2])], [tensor("y", F, [2])], [const("one", np.int64(1))])
    imported = load_onnx(model)
    assert ops(imported.model) == ["Relu", "Sigmoid"]
    x = np.array([-1.0, 2.0], np.float32)
    np.testing.assert_array_equal(run(imported.model, {"x": x})[0], run(model, {"x": x})[0])
    assert_static(imported)


def test_if_with_runtime_condition_is_left_alone():
    then_branch = helper.make_graph([helper.make_node("Relu", ["x"], ["t"])], "then", [], [tensor("t", F, [2])])
    else_branch = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [], [tensor("e", F, [2])])
    nodes = [
        helper.make_node("Identity", ["x"], ["x2"]),
        helper.make_node("ReduceSum", ["x2"], ["s"], keepdims=0),
        helper.make_node("Greater", ["s", "zero"], ["cond"]),
        helper.make_node("If", ["cond"], ["y"], then_branch=then_branch, else_branch=else_branch),
    ]
    model = make(nodes, [tensor("x", F, [2])], [tensor("y", F, [2])], [const("zero", np.float32(0))])
    imported = load_onnx(model)
    assert ops(imported.model) == ["ReduceSum", "Greater", "If"]
    assert imported.shapes["y"] == ((2,), "float32")
    x = np.array([-1.0, 2.0], np.float32)
    np.testing.assert_array_equal(run(imported.model, {"x": x})[0], run(model, {"x": x})[0])


def test_local_functions_are_inlined():
    function = helper.make_function(
        "custom", "AddRelu", ["a"], ["b"],
        [helper.make_node("Add", ["a", "a"], ["s"]), helper.make_node("Relu", ["s"], ["b"])],
        opset_imports=[helper.make_opsetid("", 18)],
    )
    nodes = [helper.make_node("AddRelu", ["x"], ["y"], domain="custom")]
    model = make(
        nodes, [tensor("x", F, [2, 3])], [tensor("y", F, [2, 3])], opset=18,
        extra_opsets=[helper.make_opsetid("custom", 1)], functions=[function],
    )
    imported = load_onnx(model)
    assert ops(imported.model) == ["Add", "Relu"]
    assert not imported.model.functions
    assert imported.shapes["y"] == ((2, 3), "float32")
    assert_static(imported)


def test_subgraph_captures_follow_renames_and_stay_live():
    def branch(op, out):
        return helper.make_graph([helper.make_node(op, ["a", "b"], [out])], op, [], [tensor(out, F, [2])])

    nodes = [
        helper.make_node("Identity", ["x"], ["a"]),
        helper.make_node("Neg", ["x"], ["b"]),  # read only inside the branches
        helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
        helper.make_node("Greater", ["s", "zero"], ["cond"]),
        helper.make_node("If", ["cond"], ["y"], then_branch=branch("Add", "t"), else_branch=branch("Sub", "e")),
    ]
    model = make(nodes, [tensor("x", F, [2])], [tensor("y", F, [2])], [const("zero", np.float32(0))])
    imported = load_onnx(model)
    assert ops(imported.model) == ["Neg", "ReduceSum", "Greater", "If"]
    branches = [a.g for a in imported.model.graph.node[-1].attribute]
    assert all(list(g.node[0].input) == ["x", "b"] for g in branches)
    for x in (np.array([-1.0, 3.0], np.float32), np.array([-3.0, 1.0], np.float32)):
        np.testing.assert_array_equal(run(imported.model, {"x": x})[0], run(model, {"x": x})[0])
