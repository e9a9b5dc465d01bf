"""The check against ONNX Runtime, steered by its user: per-output tolerance widened to the reference's own
spread, ``--tolerance``, ``--check-inputs``/``--inputs`` and ``--allow-unchecked``; a saturating output passes."""

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from korch.backends.library import LibraryKernel
from korch.errors import KorchError
from korch.pipeline import CheckFailed, optimize
from korch.runtime.selfcheck import SPREAD_FACTOR, check_outputs, reference
from tests.test_cli import assert_one_line_error, korch


def _relu_model() -> onnx.ModelProto:
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, (4, 8))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, (4, 8))])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def _saturating_model() -> onnx.ModelProto:
    """A detector's head: a steep sigmoid whose output is 0 or 1 to float32 rounding almost everywhere."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Mul", ["m", "steep"], ["s"]),
             helper.make_node("Sigmoid", ["s"], ["y"])]
    inits = [onnx.numpy_helper.from_array(rng.standard_normal((64, 32)).astype(np.float32), "w"),
             onnx.numpy_helper.from_array(np.array(40.0, np.float32), "steep")]
    graph = helper.make_graph(nodes, "saturating", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (16, 64))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, (16, 32))], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def _plant(monkeypatch, wrong):
    """Every library kernel returns ``wrong(output)``; the per-kernel check lets it through."""
    from korch.backends.check import CheckResult
    from korch.runtime import build

    real_call = LibraryKernel.__call__
    monkeypatch.setattr(LibraryKernel, "__call__", lambda self, *xs, out=None: [wrong(t) for t in real_call(self, *xs)])
    monkeypatch.setattr(build, "check", lambda *a, **k: CheckResult(True, 0.0, 0.0))
    monkeypatch.setattr(build, "_preference", lambda kernel, planned, backends: [
        b for b in backends if b.name == "library" and b.claims(kernel) is None])


def test_the_reference_spread_widens_one_outputs_tolerance():
    want = {"a": np.ones(100, np.float32), "b": np.ones(100, np.float32)}
    got = {name: value * np.float32(1.01) for name, value in want.items()}  # 1e-2 off in relative norm
    strict = check_outputs(got, want, 2e-3)
    assert not strict.ok
    widened = check_outputs(got, want, 2e-3, spreads={"a": 0.6e-2, "b": 0.1e-2})
    by_name = {o.name: o for o in widened.outputs}
    assert by_name["a"].ok and by_name["a"].tolerance == pytest.approx(SPREAD_FACTOR * 0.6e-2)
    assert not by_name["b"].ok and by_name["b"].tolerance is None  # 2 x 1e-3 is not above 2e-3
    assert by_name["a"].reference_spread == pytest.approx(0.6e-2)


def test_onnx_runtime_reports_its_own_spread_per_float_output():
    model = _saturating_model()
    feeds = {"x": np.random.default_rng(1).standard_normal((16, 64)).astype(np.float32)}
    expected, spreads = reference(model, feeds, ["y"])
    assert expected["y"].shape == (16, 32) and set(spreads) == {"y"}
    assert 0 <= spreads["y"] < 1e-2


def test_a_saturating_output_passes_optimize_and_run_check(tmp_path):
    model_path = tmp_path / "saturating.onnx"
    onnx.save(_saturating_model(), model_path)
    out = tmp_path / "out"
    assert korch("optimize", model_path, "--cost", "roofline", "-q", "-o", out).returncode == 0
    result = korch("run", out, "--check")
    assert result.returncode == 0, result.stderr
    assert "matches ONNX Runtime" in result.stdout


def test_tolerance_lets_a_small_error_through(tmp_path, monkeypatch):
    _plant(monkeypatch, lambda t: t * 1.01)
    with pytest.raises(CheckFailed):
        optimize(_relu_model(), output=tmp_path / "strict", target="cpu", cost="roofline")
    done = optimize(_relu_model(), output=tmp_path / "loose", target="cpu", cost="roofline", tolerance=0.05)
    assert done.manifest["check"]["ok"] and done.manifest["check"]["tolerance"] == 0.05
    with pytest.raises(KorchError, match="between 0 and 1"):
        optimize(_relu_model(), output=tmp_path / "bad", target="cpu", cost="roofline", tolerance=2.0)


def test_check_inputs_are_the_inputs_checked(tmp_path, monkeypatch):
    """A kernel wrong only for negative inputs passes a check on positive inputs and fails on random ones."""
    _plant(monkeypatch, lambda t: t.abs())
    monkeypatch.setattr(LibraryKernel, "__call__", lambda self, *xs, out=None: [x.abs() for x in xs])
    positive = {"x": np.abs(np.random.default_rng(0).standard_normal((4, 8))).astype(np.float32)}
    done = optimize(_relu_model(), output=tmp_path / "given", target="cpu", cost="roofline", check_inputs=positive)
    assert done.manifest["check"]["ok"]
    with pytest.raises(CheckFailed):
        optimize(_relu_model(), output=tmp_path / "random", target="cpu", cost="roofline")


def test_run_refuses_an_executable_that_failed_its_check_unless_allowed(tmp_path, monkeypatch):
    _plant(monkeypatch, lambda t: t * 2)
    out = tmp_path / "out"
    with pytest.raises(CheckFailed):
        optimize(_relu_model(), output=out, target="cpu", cost="roofline")
    assert json.loads((out / "manifest.json").read_text())["check"]["ok"] is False
    assert_one_line_error(korch("run", out), "did not match", "--allow-unchecked")
    assert korch("run", out, "--allow-unchecked").returncode == 0
    inputs = tmp_path / "inputs.npz"
    np.savez(inputs, x=np.ones((4, 8), np.float32))
    # the planted error lives in this process only: the executable rebuilt by korch run computes correctly
    checked = korch("run", out, "--allow-unchecked", "--inputs", inputs, "--check")
    assert checked.returncode == 0 and "seeded random" not in checked.stdout and "matches" in checked.stdout
    assert_one_line_error(korch("run", out, "--allow-unchecked", "--inputs", tmp_path / "none.npz"), "none.npz")
