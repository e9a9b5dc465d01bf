"""Reading, validation, input shape overrides and shape resolution of the ONNX frontend."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from korch.errors import KorchError
from korch.frontend import ImportedModel, load_onnx, parse_input_shape
from korch.frontend.inputs import parse_dim

F = TensorProto.FLOAT


def make(nodes, inputs, outputs, inits=(), opset=17, extra_opsets=(), ir_version=10):
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", opset), *extra_opsets], ir_version=ir_version
    )


def tensor(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


def batch_model() -> onnx.ModelProto:
    w = numpy_helper.from_array(np.ones((3, 4), np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])]
    return make(nodes, [tensor("x", F, ["batch", 5, 3])], [tensor("y", F, ["batch", 5, 4])], [w])


def one_line_error(excinfo) -> str:
    message = str(excinfo.value)
    assert message and "\n" not in message
    return message


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("x=1x3x224x224", ("x", (1, 3, 224, 224))),
        ("scalar=", ("scalar", ())),
        (" input.1 = 2x7 ", ("input.1", (2, 7))),
        ("ids=4", ("ids", (4,))),
        ("a=b=2x2", ("a=b", (2, 2))),
    ],
)
def test_parse_input_shape(spec, expected):
    assert parse_input_shape(spec) == expected


@pytest.mark.parametrize("spec", ["x", "=1x2", "x=1xx2", "x=1x-2", "x=axb", "x=1.5", ""])
def test_parse_input_shape_rejects_bad_specs(spec):
    with pytest.raises(KorchError) as excinfo:
        parse_input_shape(spec)
    assert "NAME=" in one_line_error(excinfo)


def test_symbolic_batch_needs_override():
    with pytest.raises(KorchError) as excinfo:
        load_onnx(batch_model())
    message = one_line_error(excinfo)
    assert "'x'" in message and "'batch'" in message and "axis 0" in message
    assert "--input-shape x=1x5x3" in message


def test_override_makes_every_tensor_static():
    imported = load_onnx(batch_model(), {"x": [2, 5, 3]})
    assert isinstance(imported, ImportedModel)
    assert imported.shapes == {
        "x": ((2, 5, 3), "float32"),
        "w": ((3, 4), "float32"),
        "h": ((2, 5, 4), "float32"),
        "y": ((2, 5, 4), "float32"),
    }
    graph = imported.model.graph
    assert [d.dim_value for d in graph.input[0].type.tensor_type.shape.dim] == [2, 5, 3]
    assert [d.dim_value for d in graph.output[0].type.tensor_type.shape.dim] == [2, 5, 4]
    assert {v.name for v in graph.value_info} == {"h"}
    onnx.checker.check_model(imported.model, full_check=True)


def test_override_of_unknown_input():
    with pytest.raises(KorchError) as excinfo:
        load_onnx(batch_model(), {"images": [1, 5, 3]})
    message = one_line_error(excinfo)
    assert "'images'" in message and "x" in message


@pytest.mark.parametrize(
    ("dims", "words"), [([2, 5], "rank"), ([2, 6, 3], "axis 1"), ([-1, 5, 3], "integers")]
)
def test_override_contradicting_the_model(dims, words):
    with pytest.raises(KorchError) as excinfo:
        load_onnx(batch_model(), {"x": dims})
    assert words in one_line_error(excinfo)


def two_inputs_sharing_seq() -> onnx.ModelProto:
    nodes = [helper.make_node("Add", ["a", "b"], ["y"])]
    return make(nodes, [tensor("a", F, ["batch", "seq", 4]), tensor("b", F, [1, "seq", 4])],
                [tensor("y", F, ["batch", "seq", 4])])


def test_a_named_dimension_is_set_in_every_input():
    """--dim seq=7 sizes every input dimension called seq; the rest still needs a value (batch)."""
    with pytest.raises(KorchError) as excinfo:
        load_onnx(two_inputs_sharing_seq(), {"seq": 7})
    assert "--dim batch=N" in one_line_error(excinfo)
    imported = load_onnx(two_inputs_sharing_seq(), {"seq": 7, "batch": 2})
    assert imported.shapes["a"] == ((2, 7, 4), "float32") and imported.shapes["b"] == ((1, 7, 4), "float32")
    assert imported.shapes["y"] == ((2, 7, 4), "float32")
    # an input's own shape and a named dimension together
    assert load_onnx(two_inputs_sharing_seq(), {"seq": 3, "a": [5, 3, 4]}).shapes["y"] == ((5, 3, 4), "float32")


def test_a_dimension_name_the_model_does_not_use():
    with pytest.raises(KorchError) as excinfo:
        load_onnx(two_inputs_sharing_seq(), {"sequence": 7})
    message = one_line_error(excinfo)
    assert "'sequence'" in message and "batch, seq" in message


@pytest.mark.parametrize("spec", ["seq", "=4", "seq=", "seq=four", "seq=0", "seq=-3", "seq=1.5"])
def test_parse_dim_rejects_bad_specs(spec):
    with pytest.raises(KorchError) as excinfo:
        parse_dim(spec)
    assert "NAME=SIZE" in one_line_error(excinfo)


def test_input_without_shape_takes_override():
    model = make([helper.make_node("Relu", ["x"], ["y"])], [tensor("x", F, None)], [tensor("y", F, None)])
    with pytest.raises(KorchError, match="no shape"):
        load_onnx(model)
    assert load_onnx(model, {"x": ()}).shapes["y"] == ((), "float32")


def test_initializers_listed_as_inputs_are_constants():
    w = numpy_helper.from_array(np.full((2,), 3.0, np.float32), "w")
    model = make(
        [helper.make_node("Mul", ["x", "w"], ["y"])],
        [tensor("x", F, [2]), tensor("w", F, [2])],
        [tensor("y", F, [2])],
        [w],
        opset=9,
        ir_version=3,
    )
    imported = load_onnx(model)
    assert [v.name for v in imported.model.graph.input] == ["x"]
    np.testing.assert_array_equal(imported.constants["w"], [3.0, 3.0])
    onnx.checker.check_model(imported.model)


def test_ort_fallback_for_custom_domain_op():
    nodes = [
        helper.make_node("Gelu", ["x"], ["g"], domain="com.microsoft"),
        helper.make_node("FusedMatMul", ["g", "w"], ["m"], domain="com.microsoft", transB=1),
        helper.make_node("Relu", ["m"], ["y"]),
    ]
    w = numpy_helper.from_array(np.ones((4, 3), np.float32), "w")
    model = make(
        nodes, [tensor("x", F, [2, 3])], [tensor("y", F, None)], [w],
        extra_opsets=[helper.make_opsetid("com.microsoft", 1)],
    )
    inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    assert "g" not in {v.name for v in inferred.graph.value_info}  # onnx knows nothing
    imported = load_onnx(model)
    assert imported.shapes["g"] == ((2, 3), "float32")
    assert imported.shapes["m"] == ((2, 4), "float32")
    assert imported.shapes["y"] == ((2, 4), "float32")


def test_unknown_custom_op_is_reported_by_tensor():
    nodes = [helper.make_node("Mystery", ["x"], ["m"], domain="acme"), helper.make_node("Relu", ["m"], ["y"])]
    model = make(nodes, [tensor("x", F, [2])], [tensor("y", F, None)], extra_opsets=[helper.make_opsetid("acme", 1)])
    with pytest.raises(KorchError) as excinfo:
        load_onnx(model)
    assert "'m'" in one_line_error(excinfo)


def test_missing_file(tmp_path):
    with pytest.raises(KorchError) as excinfo:
        load_onnx(tmp_path / "nope.onnx")
    assert one_line_error(excinfo) == f"no such file: {tmp_path / 'nope.onnx'}"


@pytest.mark.parametrize("content", [b"\xff\xfe garbage \x00\x01\x02" * 7, b"hello world\n", b""])
def test_garbage_file(tmp_path, content):
    path = tmp_path / "bad.onnx"
    path.write_bytes(content)
    with pytest.raises(KorchError) as excinfo:
        load_onnx(path)
    assert one_line_error(excinfo).startswith(f"{path} is not an ONNX model: ")


def test_invalid_model_reports_checker_line():
    model = make([helper.make_node("NoSuchOp", ["x"], ["y"])], [tensor("x", F, [2])], [tensor("y", F, [2])])
    with pytest.raises(KorchError) as excinfo:
        load_onnx(model)
    assert "NoSuchOp" in one_line_error(excinfo)


def test_external_data(tmp_path):
    rng = np.random.default_rng(0)
    w = rng.standard_normal((64, 32)).astype(np.float32)
    b = rng.standard_normal(32).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["y"])]
    model = make(
        nodes, [tensor("x", F, [1, 64])], [tensor("y", F, [1, 32])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
    )
    path = tmp_path / "model.onnx"
    onnx.save_model(
        model, path, save_as_external_data=True, all_tensors_to_one_file=True,
        location="weights.bin", size_threshold=0,
    )
    assert (tmp_path / "weights.bin").exists()
    imported = load_onnx(str(path))
    np.testing.assert_array_equal(imported.constants["w"], w)
    np.testing.assert_array_equal(imported.constants["b"], b)
    assert imported.shapes["y"] == ((1, 32), "float32")
    for init in imported.model.graph.initializer:
        assert init.data_location != TensorProto.EXTERNAL

    (tmp_path / "weights.bin").unlink()
    with pytest.raises(KorchError) as excinfo:
        load_onnx(path)
    assert "external data" in one_line_error(excinfo)
