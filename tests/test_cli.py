"""The command line: inspect, fission, zoo, and one-line errors with exit status 2 for bad input."""

import json
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from korch.ir.ort import run_model


def korch(*args, cwd=None, env=None, timeout=300):
    return subprocess.run([sys.executable, "-m", "korch", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=timeout)


def _save(tmp_path, nodes, inputs, outputs, name="m.onnx", opset=18, initializers=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    path = tmp_path / name
    onnx.save(model, path)
    return path


@pytest.fixture
def softmax_model(tmp_path):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])
    return _save(tmp_path, [helper.make_node("Softmax", ["x"], ["y"], axis=-1)], [x], [y])


def assert_one_line_error(result, *needles):
    assert result.returncode == 2, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("korch: error:"), result.stderr
    assert "Traceback" not in result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_missing_file(tmp_path):
    assert_one_line_error(korch("inspect", tmp_path / "nope.onnx"), "nope.onnx")


def test_not_an_onnx_file(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x00\xffthis is not a protobuf" * 10)
    assert_one_line_error(korch("inspect", bad), "bad.onnx")


def test_symbolic_dimension_needs_an_override(softmax_model):
    assert_one_line_error(korch("inspect", softmax_model), "batch", "--input-shape")


def test_unhonourable_attribute(tmp_path):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    path = _save(tmp_path, [helper.make_node("Relu", ["x"], ["y"], frobnicate=3)], [x], [y])
    assert_one_line_error(korch("inspect", path), "frobnicate", "Relu")


def test_unknown_operator_stays_opaque_with_a_warning(tmp_path):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5])
    v = helper.make_tensor_value_info("v", TensorProto.FLOAT, [2, 2])
    i = helper.make_tensor_value_info("i", TensorProto.INT64, [2, 2])
    k = helper.make_tensor("k", TensorProto.INT64, [1], [2])
    nodes = [helper.make_node("Exp", ["x"], ["e"]), helper.make_node("TopK", ["e", "k"], ["v", "i"], axis=1)]
    path = _save(tmp_path, nodes, [x], [v, i], initializers=[k])
    result = korch("inspect", path, "--json")
    assert result.returncode == 0, result.stderr
    assert "TopK" in result.stderr and "warning" in result.stderr
    summary = json.loads(result.stdout)
    assert "TopK" in summary["opaque_operators"]
    assert summary["primitive_histogram"] == {"Exp": 1, "Opaque": 1}


def test_inspect_json_with_override(softmax_model):
    result = korch("inspect", softmax_model, "--input-shape", "x=4x8", "--json")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["inputs"] == {"x": [4, 8]}
    assert summary["operator_histogram"] == {"Softmax": 1}
    assert summary["primitive_histogram"]["ReduceMax"] == 1
    assert summary["flops"] > 0 and summary["opaque_operators"] == {}


def test_inspect_tables(softmax_model):
    result = korch("inspect", softmax_model, "--input-shape", "x=4x8")
    assert result.returncode == 0, result.stderr
    assert "primitives after fission" in result.stdout and "ReduceMax" in result.stdout


def test_fission_writes_a_primitive_onnx_model_that_matches(softmax_model, tmp_path):
    out = tmp_path / "prim.onnx"
    result = korch("fission", softmax_model, out, "--input-shape", "x=4x8", "--ir", tmp_path / "g.json")
    assert result.returncode == 0, result.stderr
    model = onnx.load(out)
    onnx.checker.check_model(model)
    assert {n.op_type for n in model.graph.node} >= {"ReduceMax", "Exp", "ReduceSum", "Div"}
    x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32) * 30
    want = np.exp(x - x.max(1, keepdims=True))
    want /= want.sum(1, keepdims=True)
    np.testing.assert_allclose(run_model(model, {"x": x})["y"], want, rtol=1e-5, atol=1e-6)
    assert json.loads((tmp_path / "g.json").read_text())["format"] == "korch-ir"


def test_bad_input_shape_spec(softmax_model):
    assert_one_line_error(korch("inspect", softmax_model, "--input-shape", "x=4xbanana"), "x=4xbanana")


def test_dim_sizes_a_named_dimension(softmax_model):
    assert korch("inspect", softmax_model, "--dim", "batch=4", "--json").returncode == 0
    assert_one_line_error(korch("inspect", softmax_model, "--dim", "batch=four"), "batch=four")
    assert_one_line_error(korch("inspect", softmax_model, "--dim", "seq=4"), "'seq'", "batch")


def test_zoo_list_and_unknown_name(tmp_path):
    result = korch("zoo", "list")
    assert result.returncode == 0 and "candy" in result.stdout and "segformer_b0" in result.stdout
    assert_one_line_error(korch("zoo", "export", "nope", tmp_path / "x.onnx"), "nope")
    assert not (tmp_path / "x.onnx").exists()


def test_precision_is_an_option_and_tf32_on_a_cpu_a_one_line_error(softmax_model, tmp_path):
    for command in ("optimize", "bench"):
        assert "--precision {fp32,tf32}" in korch(command, "--help").stdout
    result = korch("optimize", softmax_model, "-o", tmp_path / "out", "--target", "cpu", "--cost", "roofline",
                   "--input-shape", "x=2x4", "--precision", "tf32")
    assert_one_line_error(result, "is for GPU targets")
    assert not (tmp_path / "out").exists()
