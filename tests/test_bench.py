"""``korch bench``'s peers for a plain ONNX file: the file's own graph in torch (onnx2torch), labelled so."""

import subprocess
import sys

import numpy as np
import onnx
import pytest
import torch

from korch import bench
from korch import precision as korch_precision
from korch.errors import KorchError
from korch.ir.ort import run_model
from tests.runtime.test_executable import _two_output_model


def test_an_onnx_file_becomes_its_own_torch_module():
    model = _two_output_model()
    module, note = bench.torch_module_for("m.onnx", model.SerializeToString(), "cpu")
    assert note == "(onnx2torch)"
    x = np.random.default_rng(1).standard_normal((1, 3, 8, 8)).astype(np.float32)
    with torch.no_grad():
        got = module(torch.from_numpy(x))
    want = run_model(model, {"x": x})
    np.testing.assert_allclose(got[0].numpy(), want["p"], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got[1].numpy(), want["y"], rtol=1e-4, atol=1e-5)


def test_the_torchvision_stand_in_stays_inside_onnx2torch():
    """Without torchvision, onnx2torch still imports, and the process sees no fake torchvision."""
    import importlib.util

    if importlib.util.find_spec("torchvision") is not None:
        pytest.skip("torchvision is installed here; `make test` installs onnx2torch without it")
    script = """
import sys
from korch import bench
bench._onnx2torch_convert()
print("torchvision visible:", "torchvision" in sys.modules)
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "torchvision visible: False" in result.stdout


def test_a_model_onnx2torch_cannot_convert_is_a_named_failure():
    from onnx import TensorProto, helper

    node = helper.make_node("Det", ["x"], ["y"])
    graph = helper.make_graph([node], "det", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (2, 3, 3))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, (2,))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    with pytest.raises(KorchError, match="onnx2torch cannot convert"):
        bench.torch_module_for("det.onnx", model.SerializeToString(), "cpu")


def test_systems_take_turns_and_a_peer_failing_midway_is_named(monkeypatch):
    """Rounds interleave korch and its peers (a slow spell lands on all alike); each latency is the median
    of its rounds' medians; a peer that fails in a later round is reported as failed, not half-timed."""
    calls = []

    def fake_time_system(name, fn, inputs, device, budget_s, note="", warmup=3, min_runs=10):
        calls.append(name)
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32  # the executable's policy
        if name == "eager" and calls.count("eager") == 2:
            raise RuntimeError("out of memory\nmore")
        return bench.SystemTiming(name, {"korch": 1.0, "ort": 2.0}.get(name, 3.0) * len(calls), 0.5, 4, note)

    class Executable:
        device, input_names = torch.device("cpu"), ["x"]
        precision = korch_precision.get("tf32")

        def __call__(self, x):
            return x

    monkeypatch.setattr(bench, "time_system", fake_time_system)
    monkeypatch.setattr(bench, "torch_module_for", lambda *args: (torch.nn.Identity(), ""))
    monkeypatch.setattr(bench, "_peer", lambda name, module, reference: (lambda xs: None))
    result = bench.bench(Executable(), model="m.onnx", reference_model=b"", peers=["eager", "ort"], target="cpu",
                         feeds={"x": np.zeros(2, np.float32)}, rounds=3)
    assert calls == ["korch", "eager", "ort", "korch", "eager", "ort", "korch", "ort"]
    assert result.failed == {"eager": "RuntimeError: out of memory"}
    assert [p.name for p in result.peers] == ["ort"]
    assert result.korch.median_s == 4.0 and result.korch.runs == 12  # rounds at 1, 4, 7
    assert result.peers[0].median_s == 2.0 * 6  # rounds at 3, 6, 8
    assert result.to_json()["precision"] == "tf32" and not torch.backends.cuda.matmul.allow_tf32


def test_every_compile_mode_is_a_peer_and_the_graphed_eager_peer_needs_a_gpu():
    assert set(bench.COMPILE_MODES) <= set(bench.PEERS) and {"eager-cuda-graph", "ort"} <= set(bench.PEERS)
    assert bench.COMPILE_MODES["compile-reduce-overhead"] == "reduce-overhead"
    if not torch.cuda.is_available():
        with pytest.raises(KorchError, match="needs a GPU"):
            bench._peer("eager-cuda-graph", torch.nn.Identity(), b"")


def test_the_table_shows_the_precision_and_a_peer_on_another_device_apart(capsys):
    from korch.cli import _print_bench

    timing = lambda name, s, note="": bench.SystemTiming(name, s, s, 10, note)  # noqa: E731
    result = bench.BenchResult(model="zoo:candy", target="h100", device="NVIDIA H100", korch=timing("korch", 1e-3),
                               peers=[timing("ort", 5e-3, "CPU provider"), timing("compile", 2e-3)], failed={},
                               versions={}, precision="tf32")
    _print_bench(result)
    out = capsys.readouterr().out
    assert "precision tf32" in out
    lines = [line for line in out.splitlines() if "compile" in line or "CPU provider" in line]
    assert "compile" in lines[0] and "CPU provider" in lines[1]  # the other device's peer comes last, apart


@pytest.mark.parametrize("cost_model, words", [("measured", "predicted / measured 0.80"), ("roofline", "a floor")])
def test_the_table_is_followed_by_the_plans_prediction_against_korchs_time(capsys, cost_model, words):
    from korch.cli import _print_bench

    korch = bench.SystemTiming("korch", 5e-3, 4e-3, 10)
    result = bench.BenchResult(model="zoo:candy", target="cpu", device="cpu", korch=korch, peers=[], failed={},
                               versions={}, cost_model=cost_model, predicted_s=4e-3)
    _print_bench(result)
    (line,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("korch's plan predicted")]
    assert "4.000 ms" in line and words in line and "5,000.0 µs" in line
    assert result.to_json()["predicted_s"] == 4e-3 and result.to_json()["cost_model"] == cost_model
