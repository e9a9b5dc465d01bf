"""``korch bench``'s PyTorch peers of ONNX files written at opsets 18-20 (``korch.onnx2torch_opsets``): each
operator version onnx2torch 1.5 lacks converts and computes what ONNX Runtime computes, and a node using what the
older version cannot express is a named failure, not a wrong peer."""

import numpy as np
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from korch import bench
from korch.errors import KorchError
from korch.ir.ort import run_model

X = (1, 4, 6, 8)


def _model(node, out_shape, initializers=(), opset=20, x_shape=X):
    graph = helper.make_graph([node], "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)],
                              [numpy_helper.from_array(np.asarray(v), name) for name, v in initializers])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


CASES = {
    "Pad 19, reflect": _model(helper.make_node("Pad", ["x", "pads"], ["y"], mode="reflect"), (1, 4, 8, 10),
                              [("pads", np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64))]),
    "Resize 19": _model(helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="nearest"), (1, 4, 12, 16),
                        [("scales", np.array([1, 1, 2, 2], np.float32))]),
    "ReduceMean 18, axes input": _model(helper.make_node("ReduceMean", ["x", "axes"], ["y"], keepdims=1),
                                        (1, 4, 1, 1), [("axes", np.array([2, 3], np.int64))]),
    "ReduceMax 20, axes input": _model(helper.make_node("ReduceMax", ["x", "axes"], ["y"], keepdims=0), (1, 6, 8),
                                       [("axes", np.array([1], np.int64))]),
    "Reshape 19, allowzero": _model(helper.make_node("Reshape", ["x", "shape"], ["y"], allowzero=1), (4, 48),
                                    [("shape", np.array([4, 48], np.int64))]),
    "Split 18, num_outputs": _model(helper.make_node("Split", ["x"], ["y", "z"], axis=3, num_outputs=2),
                                    (1, 4, 6, 4)),
    "AveragePool 19": _model(helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[2, 2], strides=[2, 2]),
                             (1, 4, 3, 4)),
    "Mish 18": _model(helper.make_node("Mish", ["x"], ["y"]), X),
    "Gelu 20, tanh": _model(helper.make_node("Gelu", ["x"], ["y"], approximate="tanh"), X),
    "Cast 19, Identity 19": _model(helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT), X),
}


@pytest.mark.parametrize("name", CASES)
def test_an_operator_of_a_newer_opset_converts_and_matches_onnx_runtime(name):
    model = CASES[name]
    if name.startswith("Split"):  # its second output too
        model.graph.output.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, (1, 4, 6, 4)))
    module, note = bench.torch_module_for("m.onnx", model.SerializeToString(), "cpu")
    x = np.random.default_rng(len(name)).standard_normal(X).astype(np.float32)
    with torch.no_grad():
        got = module(torch.from_numpy(x))
    got = got if isinstance(got, (list, tuple)) else [got]
    want = run_model(model, {"x": x})
    assert note == "(onnx2torch)" and len(got) == len(model.graph.output)
    for value, output in zip(got, model.graph.output):
        np.testing.assert_allclose(value.numpy(), want[output.name], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("node, initializers", [
    (helper.make_node("Pad", ["x", "pads"], ["y"], mode="wrap"), [("pads", np.array([0, 0, 1, 1, 0, 0, 1, 1]))]),
    (helper.make_node("Reshape", ["x", "shape"], ["y"], allowzero=1), [("shape", np.array([0, 4, 48]))]),
])
def test_a_node_using_what_the_older_version_lacks_is_a_named_failure(node, initializers):
    """Pad's wrap mode (19) has no Pad 13 form; a 0 in an ``allowzero`` shape means an empty dimension, where
    Reshape 14 would copy the input's: converting either would make a peer compute something else."""
    model = _model(node, (1, 4, 8, 10), initializers)
    with pytest.raises(KorchError, match="onnx2torch cannot convert the model: .*(wrap|allowzero)"):
        bench.torch_module_for("m.onnx", model.SerializeToString(), "cpu")
