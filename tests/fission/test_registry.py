"""The rule registry: every operator the foundation issue names has a rule; lookup, duplicates, declines."""

import warnings

import numpy as np
import pytest
from onnx import TensorProto, helper

from korch.fission import OpaqueOperatorWarning, claimed_ops, find_rule, fission, fission_rule
from korch.fission import registry
from korch.frontend import load_onnx
from korch.ir import Op
from korch.ir import interpret
from korch.ir.ort import run_model
from tests.fission.backend_cases import FRONTEND_OPS, collect_claimed, case_ops

REQUIRED = """Add Sub Mul Div Pow Sqrt Reciprocal Exp Log Erf Tanh Sigmoid Relu LeakyRelu PRelu Elu Selu Clip
HardSigmoid HardSwish Softplus Softsign Mish Gelu Neg Abs Floor Ceil Min Max Sum Mean Where Equal Less Greater
Not And Or Cast Softmax LogSoftmax LayerNormalization BatchNormalization InstanceNormalization GroupNormalization
LRN ReduceSum ReduceMean ReduceMax ReduceMin ReduceProd ReduceL2 ReduceSumSquare ReduceLogSumExp MatMul Gemm Conv
ConvTranspose MaxPool AveragePool GlobalAveragePool GlobalMaxPool Transpose Reshape Flatten Squeeze Unsqueeze
Concat Split Slice Pad Expand Tile Gather Resize Upsample DepthToSpace SpaceToDepth Identity Dropout
Constant""".split()


def test_every_required_operator_has_a_rule():
    missing = sorted(set(REQUIRED) - claimed_ops())
    assert not missing, missing


def test_every_claimed_operator_meets_an_onnx_backend_case():
    covered = {op for case in collect_claimed() for op in case_ops(case.model)}
    # Upsample's cases are of opset 9, where it is deprecated and the onnx package ships none that run;
    # GlobalLpPool has no case; the frontend ops are removed before fission. Their own test files cover them.
    tested_elsewhere = {"Upsample", "GlobalLpPool"} | FRONTEND_OPS
    assert not sorted(claimed_ops() - covered - tested_elsewhere)


def test_lookup_picks_the_largest_since_not_above_the_opset():
    assert find_rule("ReduceSum", 11).since < 13 <= find_rule("ReduceSum", 13).since
    assert find_rule("Softmax", 12).since < 13 <= find_rule("Softmax", 21).since
    assert find_rule("NoSuchOp", 21) is None


def test_duplicate_registration_warns():
    with pytest.warns(UserWarning, match="twice"):
        fission_rule("KorchTestOp", since=1)(lambda b, x: x)
        fission_rule("KorchTestOp", since=1)(lambda b, x: x)
    registry._RULES.pop(("", "KorchTestOp"))


def _one_node(op_type, shape=(2, 3), **attrs):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    graph = helper.make_graph([helper.make_node(op_type, ["x"], ["y"], **attrs)], "g", [x], [y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def test_a_declining_rule_leaves_the_node_opaque_with_a_warning():
    model = _one_node("Gelu", approximate="sigmoid-ish")
    with pytest.warns(OpaqueOperatorWarning, match="Gelu"):
        graph = fission(load_onnx(model))
    assert [n.op for n in graph.nodes] == [Op.OPAQUE]


def test_softmax_keeps_the_max_and_survives_large_inputs():
    graph = fission(load_onnx(_one_node("Softmax", shape=(2, 5), axis=1)))
    ops = [n.op for n in graph.nodes]
    assert ops.index(Op.REDUCE_MAX) < ops.index(Op.EXP)
    x = np.array([[1000, 1001, 1002, 0, -1000]] * 2, dtype=np.float32)
    got = interpret.run(graph, {"x": x})["y"]
    np.testing.assert_allclose(got, run_model(_one_node("Softmax", shape=(2, 5), axis=1), {"x": x})["y"],
                               rtol=1e-5, atol=1e-7)
    assert np.isfinite(got).all()


@pytest.mark.parametrize("op_type", ["Mish", "Softplus", "Elu", "Selu", "HardSwish", "Gelu", "LeakyRelu"])
def test_activations_match_onnxruntime_on_wide_inputs(op_type):
    model = _one_node(op_type, shape=(4, 50))
    x = np.linspace(-60, 60, 200, dtype=np.float32).reshape(4, 50)
    with warnings.catch_warnings():
        warnings.simplefilter("error", OpaqueOperatorWarning)
        graph = fission(load_onnx(model))
    np.testing.assert_allclose(interpret.run(graph, {"x": x})["y"], run_model(model, {"x": x})["y"],
                               rtol=1e-5, atol=1e-6)
