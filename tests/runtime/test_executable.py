"""Executables: written, loaded, called on numpy and torch, checked against ONNX Runtime; bad ones refused."""

import json
import shutil

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

from korch.pipeline import CheckFailed, optimize
from korch.errors import KorchError
from korch.orchestrate.plan import Plan
from korch.runtime import bundle
from korch.runtime.codegen import plan_layout
from korch.runtime.memory import KernelStep, check_plan
from korch.ir.ort import random_inputs, run_model
from korch.runtime.load import load


def _two_output_model() -> onnx.ModelProto:
    """Conv + bias + ReLU feeding both a pooled branch and a softmax branch: two outputs, layout and reductions."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Transpose", ["r"], ["t"], perm=[0, 2, 3, 1]),
             helper.make_node("Softmax", ["t"], ["s"], axis=-1),
             helper.make_node("Mul", ["s", "k"], ["y"])]
    inits = [onnx.numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)
             for name, shape in (("w", (8, 3, 3, 3)), ("b", (8,)), ("k", (8,)))]
    graph = helper.make_graph(nodes, "two_outputs", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, 3, 8, 8))],
                              [helper.make_tensor_value_info("p", TensorProto.FLOAT, (1, 8, 4, 4)),
                               helper.make_tensor_value_info("y", TensorProto.FLOAT, (1, 8, 8, 8))], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("exe") / "out"
    model = _two_output_model()
    compiled = optimize(model, output=out, target="cpu", cost="roofline")
    return out, model, compiled


def _feeds(exe, seed=3):
    return random_inputs(exe.input_specs, seed)


def test_written_executable_matches_onnxruntime_and_records_the_check(built):
    out, model, compiled = built
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["check"]["ok"] and manifest["check"]["max_abs"] < 1e-4
    assert manifest["target"] == "cpu" and manifest["device"] == "cpu"
    assert set(bundle.LOADED_FILES) <= set(manifest["files"]) and "reference.onnx" in manifest["files"]
    assert {"torch", "onnx", "onnxruntime", "korch"} <= set(manifest["versions"])
    assert len(manifest["kernels"]) == len(compiled.plan.kernels)
    report = (out / "report.md").read_text()
    assert "## Executable" in report and "matches" in report
    assert 'id="executable"' in (out / "report.html").read_text()


def test_generated_module_names_every_kernel_and_its_backend(built):
    out, _, compiled = built
    source = (out / "model.py").read_text()
    compile(source, "model.py", "exec")
    for i, k in enumerate(compiled.plan.kernels):
        assert f"# {k.name}: {k.ops} [" in source and f"K[{i}](" in source
    assert "def launch(K, S, C, x0):" in source
    kernel_files = list((out / "kernels").iterdir())
    assert kernel_files and all("def call(" in f.read_text() for f in kernel_files if "inductor" in f.name)


def test_loaded_executable_runs_numpy_and_torch_and_returns_fresh_outputs(built):
    out, model, _ = built
    exe = load(out)
    feeds = _feeds(exe)
    want = run_model(model, feeds)
    first = exe(feeds["x"])
    assert isinstance(first, tuple) and all(isinstance(o, np.ndarray) for o in first)
    for got, name in zip(first, exe.output_names):
        np.testing.assert_allclose(got, want[name], rtol=1e-4, atol=1e-5)
    kept = [o.copy() for o in first]
    tensors = exe(x=torch.from_numpy(_feeds(exe, seed=9)["x"]))
    assert all(isinstance(t, torch.Tensor) for t in tensors)
    for before, after in zip(kept, first):  # a later call never changes earlier outputs
        np.testing.assert_array_equal(before, after)
    assert not np.allclose(tensors[0].numpy(), first[0])
    by_name = exe.run(feeds)
    np.testing.assert_allclose(by_name["y"], want["y"], rtol=1e-4, atol=1e-5)


def test_planned_buffers_never_hold_two_live_tensors(built):
    out, _, compiled = built
    plan, graph = compiled.plan, compiled.graph
    layout = plan_layout(graph, plan, [k["in_place"] for k in compiled.manifest["kernels"]])
    check_plan([KernelStep(k.inputs, k.outputs) for k in plan.kernels], layout.memory)
    assert layout.memory.peak_bytes <= layout.memory.naive_bytes
    assert set(layout.output_buffers) <= set(graph.outputs)


@pytest.mark.parametrize("value,needle", [
    (np.zeros((1, 3, 8, 9), np.float32), "expected 1x3x8x8 float32"),
    (np.zeros((1, 3, 8, 8), np.float64), "float64"),
])
def test_wrong_inputs_are_one_line_errors(built, value, needle):
    exe = load(built[0])
    with pytest.raises(KorchError, match=needle):
        exe(value)
    with pytest.raises(KorchError, match="missing input"):
        exe()
    with pytest.raises(KorchError, match="unknown input"):
        exe(value, z=value)


def _copy(built, tmp_path):
    target = tmp_path / "copy"
    shutil.copytree(built[0], target)
    return target


@pytest.mark.parametrize("damage,needle", [
    (lambda d: (d / "weights.npz").write_bytes(b"garbage"), "corrupted"),
    (lambda d: (d / "model.py").write_text("x = 1\n"), "corrupted"),
    (lambda d: (d / "graph.json").unlink(), "graph.json is missing"),
    (lambda d: (d / "manifest.json").unlink(), "not a korch executable"),
    (lambda d: (d / "manifest.json").write_text("{ truncated"), "corrupted"),
])
def test_damaged_directories_are_refused_before_anything_runs(built, tmp_path, damage, needle):
    d = _copy(built, tmp_path)
    damage(d)
    with pytest.raises(KorchError, match=needle):
        load(d)


def test_executable_for_another_device_is_refused(built, tmp_path):
    with pytest.raises(KorchError, match="built for cpu"):
        load(built[0], device="cuda")
    d = _copy(built, tmp_path)
    manifest = json.loads((d / "manifest.json").read_text())
    manifest.update(target="h100", device="cuda")
    (d / "manifest.json").write_text(json.dumps(manifest))
    if not torch.cuda.is_available():
        with pytest.raises(KorchError, match="no CUDA device"):
            load(d)


def test_a_mismatch_fails_the_build_and_keeps_the_executable_marked(tmp_path, monkeypatch):
    """A kernel that computes the wrong thing, let through the per-kernel check, is caught by the model check;
    the executable is kept, its manifest says it failed, and it loads only when asked to."""
    from korch.backends.check import CheckResult
    from korch.backends.library import LibraryKernel
    from korch.runtime import build

    real_call = LibraryKernel.__call__
    monkeypatch.setattr(LibraryKernel, "__call__", lambda self, *xs, out=None: [2 * t for t in real_call(self, *xs)])
    monkeypatch.setattr(build, "check", lambda *a, **k: CheckResult(True, 0.0, 0.0))
    monkeypatch.setattr(build, "_preference", lambda kernel, planned, backends: [
        b for b in backends if b.name == "library" and b.claims(kernel) is None])
    out = tmp_path / "out"
    with pytest.raises(CheckFailed, match="DOES NOT match.*--allow-unchecked"):
        optimize(_two_output_model(), output=out, target="cpu", cost="roofline")
    assert json.loads((out / "manifest.json").read_text())["check"]["ok"] is False
    assert "DOES NOT match" in (out / "report.md").read_text()
    with pytest.raises(KorchError, match="did not match ONNX Runtime.*--allow-unchecked"):
        load(out)
    outputs = load(out, allow_unchecked=True).run({"x": np.ones((1, 3, 8, 8), np.float32)})
    assert set(outputs) == {"p", "y"}


def test_planning_for_an_absent_gpu_writes_the_plan_only(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the executable is built")
    out = tmp_path / "out"
    compiled = optimize(_two_output_model(), output=out, target="h100", cost="roofline")
    assert compiled.executable is None and Plan.load(out / "plan.json").target == "h100"
    assert (out / "report.html").exists() and not (out / "manifest.json").exists()
    with pytest.raises(KorchError, match="needs its GPU to measure"):
        optimize(_two_output_model(), output=tmp_path / "m", target="h100", cost="measured")


def opaque_model() -> onnx.ModelProto:
    """Relu, then Det (korch cannot split it: an opaque primitive), then Neg."""
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Det", ["r"], ["d"]),
             helper.make_node("Neg", ["d"], ["y"])]
    graph = helper.make_graph(nodes, "opaque", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (4, 3, 3))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, (4,))])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def test_opaque_operators_run_in_the_executable(tmp_path):
    """An operator korch cannot split runs as an opaque kernel (ONNX Runtime) between generated ones."""
    model = opaque_model()
    with pytest.warns(UserWarning, match="Det"):
        compiled = optimize(model, output=tmp_path / "out", target="cpu", cost="roofline")
    assert compiled.executable.check.ok
    kernels = {k["ops"]: k["backend"] for k in compiled.manifest["kernels"]}
    assert kernels["Det"] == "library" and not compiled.executable.cuda_graph


def test_a_wrong_fused_kernel_is_found_and_rebuilt_by_the_next_backend(tmp_path, monkeypatch):
    """Kernels are not checked one by one up front; when the model check fails, each is, and the wrong ones
    are rebuilt by the next backend, so the executable still matches."""
    from korch.backends.inductor import InductorKernel

    real_call = InductorKernel.__call__

    def doubled(self, *xs, out=None):
        results = real_call(self, *xs, out=out)
        for r in results:
            r.mul_(2)
        return results
    monkeypatch.setattr(InductorKernel, "__call__", doubled)
    compiled = optimize(_two_output_model(), output=tmp_path / "out", target="cpu", cost="roofline")
    assert compiled.executable.check.ok
    kernels = compiled.manifest["kernels"]
    assert all(k["backend"] != "inductor" for k in kernels)
    assert any("inductor: check failed" in r for k in kernels for r in k["refused"])
    assert (tmp_path / "out" / "manifest.json").exists()


def test_graph_and_weights_round_trip_exactly(tmp_path):
    """Every constant comes back with its shape and dtype, 0-d scalars included."""
    from korch.ir.graph import Graph
    from korch.ir.ops import Op

    graph = Graph(name="g", opset=18)
    graph.add_constant("scalar", np.array(2.5, np.float32))
    graph.add_constant("vector", np.arange(3, dtype=np.int64))
    graph.add_tensor(graph.tensors["vector"].__class__(name="x", shape=(3,), dtype="float32"))
    graph.inputs.append("x")
    graph.add_tensor(graph.tensors["x"].__class__(name="y", shape=(3,), dtype="float32"))
    from korch.ir.graph import Node

    graph.nodes.append(Node(op=Op.MUL, name="m", inputs=("x", "scalar"), outputs=("y",)))
    graph.outputs.append("y")
    writer = bundle.BundleWriter(tmp_path)
    writer.write("graph.json", bundle.graph_bytes(graph))
    writer.write("weights.npz", bundle.weights_bytes(graph))
    back = bundle.read_graph(tmp_path)
    assert back.nodes == graph.nodes and back.tensors == graph.tensors
    for name, value in graph.constants.items():
        assert back.constants[name].shape == value.shape and back.constants[name].dtype == value.dtype
        np.testing.assert_array_equal(back.constants[name], value)


def test_gpu_plan_with_triton_kernels_runs_in_the_interpreter(tmp_path):
    """The GPU path of an executable on the CPU: korch's Triton kernels (Triton's interpreter, set up by
    conftest) write planned buffers in place, and the whole sequence matches ONNX Runtime."""
    from korch.backends.triton.launch import interpreting
    from korch.runtime.assemble import assemble
    from korch.runtime.build import build_plan
    from korch.runtime.selfcheck import check_against_onnxruntime
    from korch.runtime.write import write_executable

    assert interpreting()
    model = _two_output_model()
    result = optimize(model, target="h100", cost="roofline")
    steps = build_plan(result.graph, result.plan, "h100", "cpu", check_kernels=False)
    assembled = assemble(result.graph, result.plan, steps, target="h100", device="cpu",
                         reference_model=model.SerializeToString())
    write_executable(tmp_path / "out", assembled, {})
    backends = [k["backend"] for k in assembled.manifest["kernels"]]
    assert "triton" in backends, backends
    assert any(k["in_place"] for k in assembled.manifest["kernels"] if k["backend"] == "triton")
    check = check_against_onnxruntime(assembled.executable, model)
    assert check.ok, check.summary()
    assert "K[0](" in (tmp_path / "out" / "model.py").read_text()


def test_an_executable_that_raises_fails_its_check_and_its_plan_is_written(tmp_path, monkeypatch):
    """A run that raises (EfficientViT's kernel-by-kernel executable after a 45-minute search: a stride
    assertion in a compiled kernel) is a failed check, not a traceback: the directory is written, marked."""
    from korch.runtime.executable import Executable

    def broken(self, kernels, inputs):
        raise AssertionError("expected size 16==16, stride 278528==16384 at dim=1")

    monkeypatch.setattr(Executable, "launch_sequence", broken)  # every kernel checks alone
    out = tmp_path / "out"
    with pytest.raises(CheckFailed, match="DOES NOT match.*raised AssertionError: expected size"):
        optimize(_two_output_model(), output=out, target="cpu", cost="roofline", compiled_unit=False)
    assert json.loads((out / "manifest.json").read_text())["check"]["ok"] is False
    assert (out / "plan.json").exists()


def test_a_kernel_that_raises_is_rebuilt_by_the_next_backend(tmp_path, monkeypatch):
    """Kernels are built unchecked; when the executable's run raises, each kernel is checked alone, and one that
    raises on its own inputs is wrong like one that miscomputes: the next backend builds it."""
    from korch.backends.library import LibraryKernel
    from korch.runtime import build

    def broken(self, *xs, out=None):
        raise RuntimeError("the library's call failed")

    monkeypatch.setattr(LibraryKernel, "__call__", broken)
    monkeypatch.setattr(build, "_preference", lambda kernel, planned, backends: sorted(
        (b for b in backends if b.claims(kernel) is None), key=lambda b: b.name != "library"))
    result = optimize(_two_output_model(), output=tmp_path / "out", target="cpu", cost="roofline",
                      compiled_unit=False)
    assert result.executable.check.ok
    refused = [why for k in result.manifest["kernels"] for why in k.get("refused", [])]
    assert refused and all("raised RuntimeError: the library's call failed" in why for why in refused)


def test_recorded_versions_are_the_imported_packages_versions():
    """The versions a manifest records, read from the packages' records where they are not imported, are the
    modules' own; a package that is not installed is left out, not an error."""
    import onnx
    import onnxruntime
    import torch

    found = bundle.versions()
    assert found["torch"] == torch.__version__ and found["numpy"] == np.__version__
    assert found["onnx"] == onnx.__version__ and found["onnxruntime"] == onnxruntime.__version__
    assert bundle._version_of("no_such_package_korch_knows") is None
