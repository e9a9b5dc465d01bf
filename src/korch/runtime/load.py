"""Reading an executable's directory back: ``load`` checks it, opens or rebuilds its kernels, returns the callable.

The manifest and the checksums of the files it loads are verified first
(``bundle.read_manifest``). An executable with a compiled unit opens it
(``runtime/unit.py``: nothing is compiled; a unit built for another torch or
CPU instruction set is a one-line error naming what to do). Otherwise the
kernels are built again from their kernel graphs by the backends the manifest
names (the compilers' caches make this quicker) and must write their outputs
the way they did when checked.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import torch

from korch.cost.devices import get_device
from korch.errors import KorchError
from korch.orchestrate.plan import Plan
from korch.runtime import buckets, bundle, unit
from korch.runtime.assemble import constant_outputs, module_from_source
from korch.runtime.build import kernel_graphs, rebuild
from korch.runtime.executable import Executable


def load(outdir: str | os.PathLike, device: str | None = None, target: str | None = None,
         allow_unchecked: bool = False) -> Executable | buckets.BucketedExecutable:
    """The executable in ``outdir`` on its target's device (``device`` and ``target``, when given, must agree);
    one that failed its check against ONNX Runtime only with ``allow_unchecked``. One built for a range of
    sizes (``--dynamic``) is a ``BucketedExecutable``."""
    manifest, files = bundle.read_manifest(outdir)
    outdir = Path(outdir)
    check = manifest.get("check") or {}
    if check and not check.get("ok", False) and not allow_unchecked:
        raise KorchError(f"{outdir} did not match ONNX Runtime when it was built (max rel error "
                         f"{check.get('max_rel', float('nan')):.3g}; see its report.md): --allow-unchecked runs it "
                         "anyway, korch optimize --tolerance or --check-inputs checks it otherwise")
    built_for = manifest["device"]
    if target is not None and get_device(target).name != get_device(manifest["target"]).name:
        raise KorchError(f"{outdir} was built for {manifest['target']}, not for {target}: "
                         f"run korch optimize --target {target}")
    if device is not None and torch.device(device).type != built_for:
        raise KorchError(f"{outdir} was built for {manifest['target']} ({built_for}), not for {device}: "
                         f"run korch optimize --target for that device")
    if built_for == "cuda" and not torch.cuda.is_available():
        raise KorchError(f"{outdir} was built for {manifest['target']} (CUDA), and no CUDA device is present")
    if manifest.get("runs") == buckets.RUNS:
        return buckets.BucketedExecutable(outdir, manifest, lambda bucket: load(bucket, allow_unchecked=allow_unchecked))
    module = module_from_source(files["model.py"].decode())
    if manifest.get("runs") == "compiled unit":
        return _load_unit(outdir, manifest, module)
    graph = bundle.graph_from_bytes(files["graph.json"], files["weights.npz"])
    plan = Plan.from_bytes(files["plan.json"])
    if len(plan.kernels) != len(manifest["kernels"]):
        raise KorchError(f"{outdir}: plan.json and the manifest disagree on the kernels: run korch optimize again")
    _warn_on_new_versions(manifest.get("versions", {}), outdir)
    built = []
    for planned, kernel, entry in zip(plan.kernels, kernel_graphs(graph, plan), manifest["kernels"]):
        k = rebuild(kernel, entry["backend"], manifest["target"], built_for, planned.variant)
        if k.in_place != entry["in_place"]:
            raise KorchError(f"{outdir}: kernel {planned.name} ({entry['backend']}) no longer writes "
                             f"{'in place' if entry['in_place'] else 'fresh tensors'}: run korch optimize again")
        built.append(k)
    return Executable(module, built, constant_outputs(graph, built_for), built_for, manifest=manifest,
                      use_cuda_graph=manifest.get("cuda_graph", True))


def _load_unit(outdir: Path, manifest: dict, module) -> Executable:
    unit.check_compatible(manifest.get("unit", {}), str(outdir))
    _warn_on_new_versions(manifest.get("versions", {}), outdir)
    # the launch module's declarations (inputs, outputs) describe the executable; the unit computes it
    # opened where it lies (read_manifest verified it): a copy of a large unit would cost more than the load
    return Executable(module, [], {}, manifest["device"], manifest=manifest,
                      unit=unit.CompiledUnit(outdir / unit.UNIT_FILE,
                                             [outdir / name for name in bundle.unit_libraries(manifest)]))


def _warn_on_new_versions(built_with: dict, outdir: Path) -> None:
    now = bundle.versions()
    changed = [f"{k} {v} -> {now[k]}" for k, v in built_with.items() if k in now and now[k] != v and k != "korch"]
    if changed:
        warnings.warn(f"{outdir} was built with other versions ({'; '.join(changed)}); "
                      "korch run --check compares it with ONNX Runtime again")
