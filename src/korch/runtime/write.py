"""Writing an executable: a plan's kernels built, its launch module generated, all of it saved in OUTDIR.

``write_executable`` builds every planned kernel (``build.build_plan``), lays
out the planned buffers (``codegen.plan_layout``), generates the launch module
(``codegen.launch_module``) and writes the directory through a
``bundle.BundleWriter``; ``finish`` writes the manifest once the caller has
checked the executable. ``load`` reads a finished directory back.
"""

from __future__ import annotations

import dataclasses
import os
import types
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from korch.backends.registry import device_for
from korch.errors import KorchError
from korch.ir.graph import Graph
from korch.ir.ops import Op
from korch.orchestrate.plan import Plan, PlannedKernel
from korch.runtime import bundle
from korch.runtime.build import BuiltStep, build_plan, kernel_graphs, rebuild
from korch.runtime.codegen import Layout, launch_module, plan_layout
from korch.runtime.executable import Executable


@dataclasses.dataclass
class Written:
    """An executable written but not yet finished (no manifest): check it, then ``finish``."""

    executable: Executable
    steps: list[BuiltStep]
    layout: Layout
    writer: bundle.BundleWriter
    manifest: dict

    def finish(self, **extra) -> Path:
        self.manifest.update(extra)
        return self.writer.finish(self.manifest)


def module_from_source(source: str, name: str = "korch_executable") -> types.ModuleType:
    module = types.ModuleType(name)
    exec(compile(source, f"<{name}>", "exec"), module.__dict__)
    return module


def _constant_outputs(graph: Graph, device: str) -> dict[str, torch.Tensor]:
    """Constants the launch sequence returns as graph outputs (a model whose output is a weight)."""
    from korch.ir.interpret import as_torch

    return {t: as_torch(graph.constants[t]).to(device) for t in graph.outputs if t in graph.constants}


def _capturable(kernels: list[Graph]) -> bool:
    """Whether the sequence can be a CUDA graph: opaque primitives run in ONNX Runtime on the CPU."""
    return not any(node.op is Op.OPAQUE for k in kernels for node in k.nodes)


def write_executable(outdir: str | os.PathLike, graph: Graph, plan: Plan, *, target: str,
                     reference_model: bytes, on_kernel: Callable[[int, int, PlannedKernel], None] | None = None,
                     steps: list[BuiltStep] | None = None, device: str | None = None) -> Written:
    """Build ``plan``'s kernels (unless ``steps`` are given, already built) and write the directory.

    ``device`` defaults to the target's; tests pass "cpu" with a GPU target to run korch's Triton kernels
    in Triton's interpreter."""
    from korch.version import __version__

    device = device or device_for(target)
    if steps is None:
        steps = build_plan(graph, plan, target, device, on_kernel, check_kernels=False)
    in_place = [s.built.in_place for s in steps]
    backends = [s.backend for s in steps]
    layout = plan_layout(graph, plan, in_place)
    source = launch_module(graph, plan, backends, in_place, layout, korch_version=__version__)
    writer = bundle.BundleWriter(outdir)
    writer.clear("kernels")
    for step in steps:
        if step.built.source:
            writer.write(f"kernels/{step.planned.name}_{step.backend}.py", step.built.source.encode())
    writer.write("model.py", source.encode())
    graph_json, weights_npz = bundle.graph_bytes(graph), bundle.weights_bytes(graph)
    writer.write("graph.json", graph_json)
    writer.write("weights.npz", weights_npz)
    writer.write("plan.json", plan.to_bytes())
    writer.write("reference.onnx", reference_model)
    _check_round_trip(graph, bundle.graph_from_bytes(graph_json, weights_npz))
    executable = Executable(module_from_source(source), [s.built for s in steps], _constant_outputs(graph, device),
                            device, use_cuda_graph=_capturable([s.kernel for s in steps]))
    memory = layout.memory
    manifest = {
        "model": plan.model, "target": target, "device": device, "versions": bundle.versions(),
        "inputs": [{"name": t, "shape": list(graph.tensors[t].shape), "dtype": graph.tensors[t].dtype}
                   for t in graph.inputs],
        "outputs": [{"name": t, "shape": list(graph.tensors[t].shape), "dtype": graph.tensors[t].dtype}
                    for t in graph.outputs],
        "kernels": [{"name": s.planned.name, "ops": s.planned.ops, "backend": s.backend,
                     "in_place": s.built.in_place, "launches": getattr(s.built, "launches", 1),
                     "refused": s.refused} for s in steps],
        "memory": {"buffers": len(memory.buffer_bytes), "planned_tensors": len(memory.assignment),
                   "peak_bytes": memory.peak_bytes, "naive_bytes": memory.naive_bytes},
        "cuda_graph": executable.cuda_graph,
    }
    executable.manifest = manifest
    return Written(executable, steps, layout, writer, manifest)


def _check_round_trip(written: Graph, read: Graph) -> None:
    """What ``load`` will read is what was checked: the graph and every weight, shape and dtype included."""
    same = (read.nodes == written.nodes and read.tensors == written.tensors and read.inputs == written.inputs
            and read.outputs == written.outputs and read.constants.keys() == written.constants.keys()
            and all(read.constants[n].shape == v.shape and read.constants[n].dtype == v.dtype
                    and np.array_equal(read.constants[n], v, equal_nan=v.dtype.kind in "fc")
                    for n, v in written.constants.items()))
    if not same:
        raise RuntimeError("korch bug: the executable's graph or weights do not read back as written")


def load(outdir: str | os.PathLike, device: str | None = None, target: str | None = None) -> Executable:
    """The executable in ``outdir``, its kernels built again from their kernel graphs (compiler caches make
    this quick), on its target's device (``device`` and ``target``, when given, must agree)."""
    from korch.cost.devices import get_device

    manifest, files = bundle.read_manifest(outdir)
    outdir = Path(outdir)
    built_for = manifest["device"]
    if target is not None and get_device(target).name != get_device(manifest["target"]).name:
        raise KorchError(f"{outdir} was built for {manifest['target']}, not for {target}: "
                         f"run korch optimize --target {target}")
    if device is not None and torch.device(device).type != built_for:
        raise KorchError(f"{outdir} was built for {manifest['target']} ({built_for}), not for {device}: "
                         f"run korch optimize --target for that device")
    if built_for == "cuda" and not torch.cuda.is_available():
        raise KorchError(f"{outdir} was built for {manifest['target']} (CUDA), and no CUDA device is present")
    graph = bundle.graph_from_bytes(files["graph.json"], files["weights.npz"])
    plan = Plan.from_bytes(files["plan.json"])
    module = module_from_source(files["model.py"].decode())
    if len(plan.kernels) != len(manifest["kernels"]):
        raise KorchError(f"{outdir}: plan.json and the manifest disagree on the kernels: run korch optimize again")
    _warn_on_new_versions(manifest.get("versions", {}), outdir)
    kernels = kernel_graphs(graph, plan)
    built = []
    for planned, kernel, entry in zip(plan.kernels, kernels, manifest["kernels"]):
        k = rebuild(kernel, entry["backend"], manifest["target"], built_for, planned.variant)
        if k.in_place != entry["in_place"]:
            raise KorchError(f"{outdir}: kernel {planned.name} ({entry['backend']}) no longer writes "
                             f"{'in place' if entry['in_place'] else 'fresh tensors'}: run korch optimize again")
        built.append(k)
    return Executable(module, built, _constant_outputs(graph, built_for), built_for, manifest=manifest,
                      use_cuda_graph=manifest.get("cuda_graph", True))


def _warn_on_new_versions(built_with: dict, outdir: Path) -> None:
    import warnings

    now = bundle.versions()
    changed = [f"{k} {v} -> {now[k]}" for k, v in built_with.items() if k in now and now[k] != v and k != "korch"]
    if changed:
        warnings.warn(f"{outdir} was built with other versions ({'; '.join(changed)}); "
                      "korch run --check compares it with ONNX Runtime again")
