"""CUDA graphs fail loudly: a capture that fails is a one-line error, never a silent switch to kernel-by-kernel
launches; the check replays the captured graph; the manifest claims a graph only when one was captured and
checked. On a CPU the graph machinery is planted: torch's capture fails here as it would on a GPU that cannot
capture a kernel, and a fake graph stands in where a replay must be observed."""

import json

import numpy as np
import pytest
import torch

from korch.pipeline import optimize
from korch.runtime import executable as executable_module
from korch.runtime.executable import CudaGraphFailed
from korch.runtime.selfcheck import check_against_onnxruntime
from tests.runtime.test_executable import _two_output_model


@pytest.fixture(scope="module")
def kernel_by_kernel(tmp_path_factory):
    out = tmp_path_factory.mktemp("graph") / "out"
    compiled = optimize(_two_output_model(), output=out, target="cpu", cost="roofline", compiled_unit=False)
    return compiled.executable


@pytest.fixture
def graph_wanted(monkeypatch):
    """Every executable of this test asks for a CUDA graph (a CPU one never does)."""
    monkeypatch.setattr(executable_module.Executable, "cuda_graph", property(lambda self: True, lambda self, v: None),
                        raising=False)


class ZeroingGraph:
    """A stand-in CUDA graph: capture runs the launches; replay writes zeros, as a graph that lost its kernels."""

    captured: list = []

    def __init__(self):
        ZeroingGraph.captured.append(self)

    def replay(self):
        for output in self.outputs:
            output.zero_()


def test_a_failing_capture_is_an_error_not_a_fallback(kernel_by_kernel, graph_wanted):
    exe = kernel_by_kernel
    exe._calls, exe._graph = 0, None
    feeds = {name: np.ones(shape, dtype) for name, (shape, dtype) in exe.input_specs.items()}
    for _ in range(exe.calls_until_replay):
        exe.run(feeds)
    with pytest.raises(CudaGraphFailed) as raised:
        exe.run(feeds)  # torch without CUDA cannot make a graph: the capture fails
    message = str(raised.value)
    assert "CUDA graph capture failed" in message and "--no-cuda-graph" in message and "\n" not in message
    with pytest.raises(CudaGraphFailed):
        exe.run(feeds)  # and stays failed: nothing switched to kernel by kernel behind the caller's back


def test_the_check_replays_the_graph_and_fails_a_wrong_replay(kernel_by_kernel, graph_wanted, monkeypatch):
    exe = kernel_by_kernel
    exe._calls, exe._graph = 0, None
    launch = exe.module.launch

    class Capture:
        def __init__(self, graph):
            self.graph = graph

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    def launch_and_remember(*args):
        outputs = launch(*args)
        if ZeroingGraph.captured:
            ZeroingGraph.captured[-1].outputs = outputs
        return outputs

    monkeypatch.setattr(torch.cuda, "CUDAGraph", ZeroingGraph)
    monkeypatch.setattr(torch.cuda, "graph", Capture)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(exe.module, "launch", launch_and_remember)
    result = check_against_onnxruntime(exe, _two_output_model())
    assert result.replayed and not result.ok  # the first call was right; the replayed one is zeros
    assert "CUDA graph replay checked" in result.summary()


def test_optimize_fails_in_one_line_and_writes_no_manifest_when_capture_fails(tmp_path, graph_wanted):
    out = tmp_path / "out"
    with pytest.raises(CudaGraphFailed, match="CUDA graph capture failed"):
        optimize(_two_output_model(), output=out, target="cpu", cost="roofline", compiled_unit=False)
    assert not (out / "manifest.json").exists()


def test_korch_optimize_prints_one_line_and_exits_2_when_capture_fails(tmp_path, graph_wanted, capsys):
    import onnx

    from korch.cli import main

    onnx.save(_two_output_model(), tmp_path / "m.onnx")
    code = main(["optimize", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "out"), "--target", "cpu",
                 "--cost", "roofline", "--kernel-by-kernel", "-q"])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("korch: error: CUDA graph capture failed")
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_the_manifest_says_why_a_gpu_executable_has_no_graph(tmp_path):
    from korch import config
    from korch.ir.graph import Graph, Node
    from korch.ir.ops import Op
    from korch.runtime.assemble import _why_no_cuda_graph

    plain, opaque = Graph(name="a"), Graph(name="b")
    opaque.nodes.append(Node(op=Op.OPAQUE, inputs=(), outputs=(), name="n"))
    assert _why_no_cuda_graph([plain], "cuda") is None
    assert "opaque" in _why_no_cuda_graph([plain, opaque], "cuda")
    with config.patch(cuda_graph=False):
        assert "--no-cuda-graph" in _why_no_cuda_graph([plain], "cuda")
    out = tmp_path / "out"
    optimize(_two_output_model(), output=out, target="cpu", cost="roofline", compiled_unit=False, cuda_graph=False)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["cuda_graph"] is False and manifest["check"]["replayed"] is False
