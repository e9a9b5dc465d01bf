"""korch's Python API: ``korch.optimize`` (a model in, a checked executable out) and ``korch.load``.

``compile_model`` is the whole job of ``korch optimize``: import, plan
(``korch.pipeline.optimize``), build and write the executable
(``runtime.write``), check it against ONNX Runtime, write the reports, and
only then the manifest. The CLI calls it with progress callbacks; the Python
API calls it and returns the loaded executable.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import onnx

from korch.errors import KorchError


@dataclasses.dataclass
class Progress:
    """Callbacks for long work (all optional): stage names, segments solved, kernels measured and built."""

    on_stage: Callable[[str], None] | None = None
    on_segment: Callable[[int, int], None] | None = None
    on_kernel: Callable[[str], None] | None = None
    on_build: Callable[[int, int, object], None] | None = None


@dataclasses.dataclass
class Compiled:
    """What ``compile_model`` did: the optimize result, the written executable (None: plan only) and the
    model's ONNX bytes as given (the reference ONNX Runtime runs)."""

    result: object
    written: object | None
    reference: bytes

    @property
    def executable(self):
        return self.written.executable if self.written else None


class CheckFailed(KorchError):
    """The executable does not match ONNX Runtime: the command fails, the report says by how much."""

    exit_code = 1


def detect_target() -> str:
    """The GPU present (its kind, when korch knows it), else the CPU."""
    import torch

    from korch.cost.devices import GPUS

    if not torch.cuda.is_available():
        return "cpu"
    name = torch.cuda.get_device_name().lower()
    return next((kind for kind in GPUS if kind in name), "h100")


def model_bytes(model) -> bytes:
    """The ONNX bytes of a model reference (path, ``zoo:NAME`` or ModelProto), as given."""
    from korch.summary import resolve_model

    resolved = resolve_model(model)
    if isinstance(resolved, onnx.ModelProto):
        return resolved.SerializeToString()
    try:
        return onnx.load(str(resolved)).SerializeToString()
    except FileNotFoundError:
        raise KorchError(f"no such model file: {resolved}") from None
    except Exception as exc:
        raise KorchError(f"cannot read {resolved} as an ONNX model: {type(exc).__name__}") from None


def _onnx_of(model, example_inputs, workdir: Path):
    """An ONNX reference for ``model``; a torch module is exported with its example inputs."""
    import torch

    if isinstance(model, torch.nn.Module):
        from korch.frontend.torch_module import export_module

        return export_module(model, example_inputs, workdir / f"{type(model).__name__}.onnx")
    if example_inputs is not None:
        raise KorchError("example_inputs are for torch modules; an ONNX model's input shapes come from the model "
                         "(override symbolic ones with input_shapes)")
    return model


def _default_output(model) -> Path:
    from korch import config

    name = Path(model).stem if isinstance(model, (str, os.PathLike)) else "model"
    return Path(config.cache_dir) / "executables" / name.removeprefix("zoo:")


def device_present(target: str) -> bool:
    import torch

    from korch.backends.registry import device_for

    return device_for(target) == "cpu" or torch.cuda.is_available()


def compile_model(model, *, output: str | os.PathLike, target: str | None = None, cost: str = "measured",
                  db: str | os.PathLike | None = None, jobs: int | None = None,
                  input_shapes: Mapping[str, Sequence[int]] | None = None, time_limit: float | None = None,
                  cut_points: str | None = None, max_kernel_nodes: int | None = None, plan_only: bool = False,
                  progress: Progress | None = None) -> Compiled:
    """Plan, build, check and write ``model``'s executable in ``output`` (see the module docstring).

    Without the target's device (planning for a GPU on a CPU-only machine), or
    with ``plan_only``, only the plan and the reports are written. A mismatch
    with ONNX Runtime raises ``CheckFailed`` after the reports are written (the
    directory then has no manifest: nothing loads it).
    """
    from korch.cost.devices import get_device
    from korch.pipeline import optimize
    from korch.runtime.bundle import BundleWriter

    progress = progress or Progress()
    target = target or detect_target()
    get_device(target)  # an unknown target fails here, before any work
    present = device_present(target)
    if cost == "measured" and not present:
        raise KorchError(f"--target {target} needs its GPU to measure kernels, and none is present: "
                         "use --cost roofline to plan from lower bounds")
    reference = model_bytes(model)
    result = optimize(model, target=target, cost=cost, time_limit=time_limit, cut_points=cut_points,
                      input_shapes=input_shapes, max_kernel_nodes=max_kernel_nodes, on_stage=progress.on_stage,
                      on_segment=progress.on_segment, db=str(db) if db else None, jobs=jobs,
                      on_kernel=progress.on_kernel)
    if plan_only or not present:
        writer = BundleWriter(output)
        writer.write("plan.json", result.plan.to_bytes())
        _write_reports(writer, result, None)
        return Compiled(result, None, reference)
    written = _build_and_check(model, result, reference, target, output, progress)
    return Compiled(result, written, reference)


def _write_reports(writer, result, manifest: dict | None) -> None:
    from korch.orchestrate.report import render_markdown
    from korch.orchestrate.report_html import render_html

    writer.write("report.md", render_markdown(result.plan, result.rejected, manifest).encode())
    writer.write("report.html", render_html(result.graph, result.plan, executable=manifest).encode())


def _build_and_check(model, result, reference: bytes, target: str, output, progress: Progress):
    from korch.runtime.selfcheck import check_against_onnxruntime
    from korch.runtime.write import write_executable

    if progress.on_stage:
        progress.on_stage("build the executable")
    written = write_executable(output, result.graph, result.plan, target=target, reference_model=reference,
                               on_kernel=progress.on_build)
    if progress.on_stage:
        progress.on_stage("check against ONNX Runtime")
    reference_model = onnx.load_from_string(reference)
    check = check_against_onnxruntime(written.executable, reference_model)
    if not check.ok:  # find the kernels that are wrong, rebuild them with the next backend, check again
        from korch.backends.registry import device_for
        from korch.runtime.build import recheck

        if progress.on_stage:
            progress.on_stage("check each kernel against the reference executor")
        steps, rebuilt = recheck(written.steps, target, device_for(target))
        if rebuilt:
            written = write_executable(output, result.graph, result.plan, target=target, reference_model=reference,
                                       steps=steps)
            check = check_against_onnxruntime(written.executable, reference_model)
    written.manifest["check"] = check.to_json()
    written.executable.check = check
    _write_reports(written.writer, result, written.manifest)
    if not check.ok:
        out = Path(output)
        raise CheckFailed(f"the executable in {out} {check.summary()}; see {out / 'report.md'}")
    written.finish()
    return written


def optimize(model, example_inputs=None, *, target: str | None = None, cost: str = "measured",
             db: str | os.PathLike | None = None, output: str | os.PathLike | None = None,
             input_shapes: Mapping[str, Sequence[int]] | None = None, jobs: int | None = None,
             time_limit: float | None = None):
    """Optimize ``model`` and return its executable, loaded and checked against ONNX Runtime.

    ``model``: an ONNX path, ``"zoo:NAME"``, an ``onnx.ModelProto`` or a torch
    ``nn.Module`` (exported through the dynamo ONNX exporter with
    ``example_inputs``). ``target``: "cpu", "h100", ...; default the GPU present,
    else the CPU. ``cost``: "measured" (kernels built and timed, remembered in
    the profile database ``db``) or "roofline" (lower bounds only, fast).
    ``output``: the executable's directory (default: under the korch cache).
    """
    target = target or detect_target()
    with tempfile.TemporaryDirectory(prefix="korch-export-") as workdir:
        reference = _onnx_of(model, example_inputs, Path(workdir))
        if output is None:  # named by the model's content, so that another model never reuses the directory
            digest = hashlib.sha256(model_bytes(reference)).hexdigest()[:12]
            output = _default_output(reference if not isinstance(reference, onnx.ModelProto) else "model")
            output = output.with_name(f"{output.name}-{digest}-{target}")
        compiled = compile_model(reference, output=output, target=target, cost=cost, db=db, jobs=jobs,
                                 input_shapes=input_shapes, time_limit=time_limit)
    if compiled.executable is None:
        raise KorchError(f"no {target} device here to run the executable on")
    return compiled.executable


def load(outdir: str | os.PathLike, device: str | None = None, target: str | None = None):
    """The executable ``korch optimize`` wrote in ``outdir``, ready to call on numpy arrays or torch tensors
    (``device`` or ``target``, when given, must be what it was built for)."""
    from korch.runtime.write import load as load_executable

    return load_executable(outdir, device, target)
