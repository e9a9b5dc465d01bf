"""ir/ort.py: a session's inputs as seeded random arrays of the right type and shape."""

import numpy as np
from onnx import TensorProto, helper

from korch.ir import ort


def test_a_sessions_inputs_become_specs_with_named_axes_as_one_and_numpy_types():
    nodes = [helper.make_node("Gather", ["table", "ids"], ["rows"]),
             helper.make_node("Cast", ["flag"], ["flag_f"], to=TensorProto.FLOAT),
             helper.make_node("Add", ["rows", "flag_f"], ["y"])]
    inputs = [helper.make_tensor_value_info("table", TensorProto.FLOAT, (10, 4)),
              helper.make_tensor_value_info("ids", TensorProto.INT64, ("batch", 3)),
              helper.make_tensor_value_info("flag", TensorProto.BOOL, (1,))]
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    specs = ort.input_specs(ort.session(model.SerializeToString()))
    assert specs == {"table": ((10, 4), "float32"), "ids": ((1, 3), "int64"), "flag": ((1,), "bool")}
    feeds = ort.random_inputs(specs)
    assert feeds["ids"].dtype == np.int64 and feeds["ids"].shape == (1, 3) and feeds["flag"].dtype == np.bool_
    (y,) = ort.session(model.SerializeToString()).run(None, feeds)
    assert y.shape == (1, 3, 4)
