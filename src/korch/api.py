"""korch's Python API: ``korch.optimize`` (a model in, a checked executable out) and ``korch.load``.

Both are thin: ``optimize`` exports a torch module to ONNX when given one,
picks an output directory and runs the pipeline (``korch.pipeline.optimize``,
the same function ``korch optimize`` runs); ``load`` reads what it wrote.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import onnx

from korch.errors import KorchError
from korch.pipeline import detect_target, model_bytes
from korch.pipeline import optimize as run_pipeline


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


def optimize(model, example_inputs=None, *, target: str | None = None, cost: str = "measured",
             db: str | os.PathLike | None = None, output: str | os.PathLike | None = None,
             input_shapes: Mapping[str, Sequence[int] | int] | None = None, jobs: int | None = None,
             time_limit: float | None = None, precision: str | None = None, tolerance: float | None = None,
             check_inputs=None, dynamic: Mapping[str, tuple[int, int]] | None = None):
    """Optimize ``model`` and return its executable, loaded and checked against ONNX Runtime.

    ``model``: an ONNX path, ``"zoo:NAME"``, an ``onnx.ModelProto`` or a torch
    ``nn.Module`` (exported through the dynamo ONNX exporter with
    ``example_inputs``). ``target``: "cpu", "h100", ...; default the GPU present,
    else the CPU. ``cost``: "measured" (kernels built and timed, remembered in
    the profile database ``db``) or "roofline" (lower bounds only, fast).
    ``output``: the executable's directory (default: under the korch cache).
    ``input_shapes``: static shapes for inputs with symbolic dimensions, an
    input's name -> its dims, or a dimension's name -> its size (``{"seq": 128}``).
    ``precision``: "fp32" (default) or "tf32", how a GPU computes float32 products.
    ``check_inputs`` (input name -> array) and ``tolerance`` (relative norm): the check against ONNX Runtime
    runs on these inputs (others seeded random), within this tolerance or the reference's own spread.
    ``dynamic``: one dimension's name -> (low, high), such as ``{"seq": (1, 512)}``: one executable serving
    every size in the range (``korch/dynamic.py``; CPU targets).
    """
    target = target or detect_target()
    with tempfile.TemporaryDirectory(prefix="korch-export-") as workdir:
        reference = _onnx_of(model, example_inputs, Path(workdir))
        if output is None:  # named by the model's content, so that another model never reuses the directory
            digest = hashlib.sha256(model_bytes(reference)).hexdigest()[:12]
            output = _default_output(reference if not isinstance(reference, onnx.ModelProto) else "model")
            output = output.with_name(f"{output.name}-{digest}-{target}" + (f"-{precision}" if precision else ""))
        if dynamic:
            return _optimize_dynamic(reference, dynamic, output=output, target=target, cost=cost, db=db, jobs=jobs,
                                     input_shapes=input_shapes, time_limit=time_limit, precision=precision,
                                     tolerance=tolerance, check_inputs=check_inputs)
        result = run_pipeline(reference, output=output, target=target, cost=cost, db=db, jobs=jobs,
                              input_shapes=input_shapes, time_limit=time_limit, precision=precision,
                              tolerance=tolerance, check_inputs=check_inputs)
    if result.executable is None:
        raise KorchError(f"no {target} device here to run the executable on")
    return result.executable


def _optimize_dynamic(reference, dynamic: Mapping[str, tuple[int, int]], *, check_inputs, **options):
    from korch.dynamic import optimize_dynamic

    if len(dynamic) != 1:
        raise KorchError(f"dynamic names one dimension and its range, such as {{'seq': (1, 512)}}; got {dynamic!r}")
    if check_inputs is not None:
        raise KorchError("check_inputs does not apply with dynamic: each unit is checked at its range's ends")
    (name, (low, high)), = dynamic.items()
    if not 1 <= low < high:
        raise KorchError(f"dynamic {name}: the range must be 1 <= low < high, got {low}..{high}")
    return optimize_dynamic(reference, (name, int(low), int(high)), **options).executable


def load(outdir: str | os.PathLike, device: str | None = None, target: str | None = None,
         allow_unchecked: bool = False):
    """The executable ``korch optimize`` wrote in ``outdir``, ready to call on numpy arrays or torch tensors
    (``device`` or ``target``, when given, must be what it was built for; one that failed its check against
    ONNX Runtime loads only with ``allow_unchecked``)."""
    from korch.runtime.load import load as load_executable

    return load_executable(outdir, device, target, allow_unchecked)
