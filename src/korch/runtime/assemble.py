"""A plan's built kernels assembled into an executable, in memory: the launch module, planned buffers, the
files of its directory and its manifest.

``assemble`` lays out the planned buffers (``codegen.plan_layout``), generates
the launch module (``codegen.launch_module``), serializes the graph and its
weights (and checks they read back as they are) and returns a callable
``Executable`` with everything ``write.write_executable`` puts on disk. Nothing
here touches the disk, so an executable is checked before any of it is written.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Sequence

import numpy as np
import torch

from korch import config, precision
from korch.ir.graph import Graph
from korch.ir.interpret import as_torch
from korch.ir.ops import Op
from korch.orchestrate.plan import Plan
from korch.runtime import bundle
from korch.runtime.build import BuiltStep
from korch.runtime.codegen import Layout, launch_module, plan_layout
from korch.runtime.executable import Executable
from korch.runtime.unit import UNIT_FILE, CompiledUnit, library_files, unit_manifest
from korch.version import __version__


@dataclasses.dataclass
class Assembled:
    """An executable and what its directory holds, but for the reports and the manifest's check."""

    executable: Executable
    steps: list[BuiltStep]
    layout: Layout
    files: dict[str, bytes]     # path in OUTDIR -> contents
    manifest: dict


def module_from_source(source: str, name: str = "korch_executable") -> types.ModuleType:
    module = types.ModuleType(name)
    exec(compile(source, f"<{name}>", "exec"), module.__dict__)
    return module


def constant_outputs(graph: Graph, device: str) -> dict[str, torch.Tensor]:
    """Constants the launch sequence returns as graph outputs (a model whose output is a weight)."""
    return {t: as_torch(graph.constants[t]).to(device) for t in graph.outputs if t in graph.constants}


def _why_no_cuda_graph(kernels: list[Graph], device: str) -> str | None:
    """None when the sequence is to be a CUDA graph, else why not."""
    if device != "cuda":
        return "not a GPU"
    if not config.cuda_graph:
        return "not asked for (--no-cuda-graph)"
    if any(node.op is Op.OPAQUE for k in kernels for node in k.nodes):
        return "an opaque primitive runs in ONNX Runtime on the CPU"
    return None


def assemble(graph: Graph, plan: Plan, steps: Sequence[BuiltStep], *, target: str, device: str,
             reference_model: bytes, unit: bytes | None = None, unit_note: str = "",
             unit_choice: dict | None = None) -> Assembled:
    """The executable of ``plan`` whose kernels ``steps`` built, for ``device``, with its directory's files.

    With ``unit`` (the plan compiled into one package, ``runtime/unit.py``) the executable runs it and the
    directory holds it; ``unit_choice`` records which variant it is and what each measured
    (``unit.choose_unit``); ``unit_note`` says why there is none."""
    steps = list(steps)
    in_place = [s.built.in_place for s in steps]
    layout = plan_layout(graph, plan, in_place)
    source = launch_module(graph, plan, [s.backend for s in steps], in_place, layout, korch_version=__version__)
    files = {f"kernels/{s.planned.name}_{s.backend}.py": s.built.source.encode() for s in steps if s.built.source}
    files["model.py"] = source.encode()
    files["graph.json"], files["weights.npz"] = bundle.graph_bytes(graph), bundle.weights_bytes(graph)
    files["plan.json"] = plan.to_bytes()
    files["reference.onnx"] = reference_model
    _check_round_trip(graph, bundle.graph_from_bytes(files["graph.json"], files["weights.npz"]))
    if unit is not None:
        files[UNIT_FILE] = unit
        files.update(library_files(unit_choice or {}))
    no_cuda_graph = _why_no_cuda_graph([s.kernel for s in steps], device)
    built = [] if unit is not None else [s.built for s in steps]  # a unit computes every kernel itself
    executable = Executable(module_from_source(source), built, constant_outputs(graph, device),
                            device, use_cuda_graph=no_cuda_graph is None,
                            unit=None if unit is None else CompiledUnit.from_bytes(unit))
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
        "precision": precision.current().name,
        "cuda_graph": executable.cuda_graph,  # a capture that fails raises: the check replays it before writing
        **({"cuda_graph_why_not": no_cuda_graph} if no_cuda_graph and device == "cuda" else {}),
        "runs": "compiled unit" if unit is not None else "kernel by kernel",
        "unit": {**unit_manifest(device), **(unit_choice or {})} if unit is not None else {"why_not": unit_note},
    }
    executable.manifest = manifest
    return Assembled(executable, steps, layout, files, manifest)


def _check_round_trip(written: Graph, read: Graph) -> None:
    """What ``load`` will read is what was checked: the graph and every weight, shape and dtype included."""
    same = (read.nodes == written.nodes and read.tensors == written.tensors and read.inputs == written.inputs
            and read.outputs == written.outputs and read.constants.keys() == written.constants.keys()
            and all(read.constants[n].shape == v.shape and read.constants[n].dtype == v.dtype
                    and np.array_equal(read.constants[n], v, equal_nan=v.dtype.kind in "fc")
                    for n, v in written.constants.items()))
    if not same:
        raise RuntimeError("korch bug: the executable's graph or weights do not read back as written")
