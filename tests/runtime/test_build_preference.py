"""Which backend builds a kernel that a plan priced by lower bounds leaves unnamed."""

import types

import numpy as np
import onnx
from onnx import TensorProto, helper

from korch.pipeline import load_model
from korch.runtime.build import _preference

BACKENDS = [types.SimpleNamespace(name=name, claims=lambda kernel: None) for name in ("triton", "inductor", "library")]
UNNAMED = types.SimpleNamespace(backend="")


def _graph(ops: list[str]):
    """x (8x16) through ``ops`` in a chain; a MatMul takes a 16x16 weight."""
    w = onnx.numpy_helper.from_array(np.ones((16, 16), np.float32), "w")
    nodes, last = [], "x"
    for i, op in enumerate(ops):
        nodes.append(helper.make_node(op, [last, "w"] if op == "MatMul" else [last], [f"t{i}"]))
        last = f"t{i}"
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (8, 16))],
                              [helper.make_tensor_value_info(last, TensorProto.FLOAT, (8, 16))], [w])
    return load_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)]))[1]


def _order(ops, planned=UNNAMED):
    return [b.name for b in _preference(_graph(ops), planned, BACKENDS)]


def test_a_product_with_fused_neighbours_goes_to_inductor_first():
    assert _order(["MatMul", "Relu"]) == ["inductor", "triton", "library"]


def test_a_lone_product_goes_to_the_library_and_pointwise_kernels_keep_the_target_order():
    assert _order(["MatMul"])[0] == "library"
    assert _order(["Relu", "Neg"]) == ["triton", "inductor", "library"]


def test_a_measured_plan_names_its_backend():
    assert _order(["MatMul", "Relu"], types.SimpleNamespace(backend="triton"))[0] == "triton"
