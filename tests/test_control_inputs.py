"""Inputs as real models have them: a 0-d scalar input, integer and bool inputs, and a scalar that steers an
``If`` (given with ``--input-value``, used where shapes are probed, in the check and by ``korch run``)."""

import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from korch.errors import KorchError
from korch.frontend.inputs import parse_input_value
from korch.ir.ops import Op
from korch.ir.ort import run_model
from korch.pipeline import load_model
from tests.test_cli import assert_one_line_error, korch

F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def _save(path, nodes, inputs, outputs, initializers=()):
    graph = helper.make_graph(nodes, path.stem, inputs, outputs, list(initializers))
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), path)
    return path


def _if_on_sample_rate(path):
    """z = relu(x)^2 when sr == 16000; the other branch reshapes x to a size it does not have (it fails)."""
    then_branch = helper.make_graph([helper.make_node("Relu", ["x"], ["y_then"])], "then", [],
                                    [helper.make_tensor_value_info("y_then", F, [4])])
    bad = onnx.numpy_helper.from_array(np.array([3], np.int64), "bad_shape")
    else_branch = helper.make_graph([helper.make_node("Reshape", ["x", "bad_shape"], ["y_else"])], "else", [],
                                    [helper.make_tensor_value_info("y_else", F, [3])], [bad])
    nodes = [helper.make_node("Equal", ["sr", "rate"], ["c"]),
             helper.make_node("If", ["c"], ["y"], then_branch=then_branch, else_branch=else_branch),
             helper.make_node("Mul", ["y", "y"], ["z"])]
    return _save(path, nodes, [helper.make_tensor_value_info("x", F, [4]), helper.make_tensor_value_info("sr", I64, [])],
                 [helper.make_tensor_value_info("z", F, None)],
                 [onnx.numpy_helper.from_array(np.array(16000, np.int64), "rate")])


@pytest.mark.parametrize("unit", ["compiled unit", "kernel by kernel"])
def test_a_scalar_input_runs_and_checks(tmp_path, unit):
    model = _save(tmp_path / "mul.onnx", [helper.make_node("Mul", ["x", "s"], ["y"])],
                  [helper.make_tensor_value_info("x", F, [4]), helper.make_tensor_value_info("s", F, [])],
                  [helper.make_tensor_value_info("y", F, [4])])
    extra = ["--kernel-by-kernel"] if unit == "kernel by kernel" else []
    env = {**os.environ, "KORCH_COMPILED_UNIT": "1" if unit == "compiled unit" else "0"}
    assert korch("optimize", model, "--cost", "roofline", "-q", "-o", tmp_path / "out", *extra, env=env).returncode == 0
    s = tmp_path / "s.npy"
    np.save(s, np.array(3.0, np.float32))
    result = korch("run", tmp_path / "out", "--input", f"s={s}", "--check", env=env)
    assert result.returncode == 0 and "matches ONNX Runtime" in result.stdout, result.stderr


def test_integer_and_bool_inputs_run_and_check(tmp_path):
    nodes = [helper.make_node("Cast", ["i"], ["f"], to=F), helper.make_node("Add", ["f", "x"], ["a"]),
             helper.make_node("Where", ["m", "a", "x"], ["y"])]
    model = _save(tmp_path / "ints.onnx", nodes, [helper.make_tensor_value_info("x", F, [2, 3]),
                                                 helper.make_tensor_value_info("i", I64, [2, 3]),
                                                 helper.make_tensor_value_info("m", B, [2, 3])],
                  [helper.make_tensor_value_info("y", F, [2, 3])])
    assert korch("optimize", model, "--cost", "roofline", "-q", "-o", tmp_path / "out").returncode == 0
    assert korch("run", tmp_path / "out", "--check").returncode == 0


def test_an_input_that_steers_an_if_needs_its_value(tmp_path):
    model = _if_on_sample_rate(tmp_path / "vad.onnx")
    result = korch("inspect", model)
    assert_one_line_error(result, "--input-value", "sr")  # and no ONNX Runtime log lines before it
    out = tmp_path / "out"
    built = korch("optimize", model, "--input-value", "sr=16000", "--cost", "roofline", "-q", "-o", out)
    assert built.returncode == 0, built.stderr
    ran = korch("run", out, "--check")
    assert ran.returncode == 0 and "--input-value when built: sr" in ran.stdout, ran.stderr


def test_the_if_body_reads_the_enclosing_graph_in_the_primitive_export(tmp_path):
    """The opaque If takes the values its branches capture as inputs; the exported primitive graph runs."""
    model = _if_on_sample_rate(tmp_path / "vad.onnx")
    _, graph, _ = load_model(model, input_values={"sr": np.array(16000)})
    (opaque,) = [n for n in graph.nodes if n.op is Op.OPAQUE]
    assert opaque.attrs["captures"] == ("x",) and opaque.inputs[-1] == "x"
    exported = tmp_path / "prim.onnx"
    assert korch("fission", model, exported, "--input-value", "sr=16000").returncode == 0
    x = np.array([-1, 0.5, 2, -3], np.float32)
    got = run_model(str(exported), {"x": x, "sr": np.array(16000)})
    np.testing.assert_allclose(list(got.values())[0], np.maximum(x, 0) ** 2)


@pytest.mark.parametrize("spec, words", [("sr=fast", "NAME=NUMBER"), ("sr", "NAME=NUMBER"),
                                         ("=3", "NAME=NUMBER")])
def test_bad_input_value_specs(spec, words):
    with pytest.raises(KorchError, match=words):
        parse_input_value(spec)


def test_input_values_are_checked_against_the_inputs(tmp_path):
    model = _if_on_sample_rate(tmp_path / "vad.onnx")
    assert_one_line_error(korch("inspect", model, "--input-value", "rate=3"), "'rate'", "no graph input")
    assert_one_line_error(korch("inspect", model, "--input-value", "sr=16000.5"), "whole number")
    assert_one_line_error(korch("inspect", model, "--input-value", "sr=1,2"), "do not fit")
    assert_one_line_error(korch("inspect", model, "--input-value", "sr=loud"), "sr=loud")
