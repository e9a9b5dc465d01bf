"""A PyTorch ``nn.Module`` as an ONNX model: torch's dynamo exporter with the example inputs.

``export_module`` is the one way korch turns a module into ONNX: the zoo's
cached exports and ``korch.optimize(module, example_inputs)`` both use it.
Shapes are static (those of the example inputs) unless dynamic ones are asked for, weights embedded, the
exporter's default opset. The file is written whole or not at all.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch

from korch.errors import KorchError, one_line


@contextlib.contextmanager
def quiet_exporter() -> Iterator[None]:
    """Silence the exporter's noise that is no concern of ours.

    It warns, at every export, that torchvision's operators cannot be
    registered (torchvision is not installed), and torch's own pytree code
    raises a FutureWarning.
    """
    logger = logging.getLogger("torch.onnx._internal.exporter._registration")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            yield
    finally:
        logger.setLevel(level)


def output_names(count: int) -> list[str]:
    """ONNX output names: ``output`` alone, else ``output_0``, ``output_1``, ..."""
    return ["output"] if count == 1 else [f"output_{i}" for i in range(count)]


def export_module(module: torch.nn.Module, example_inputs: Sequence[torch.Tensor] | torch.Tensor,
                  path: str | os.PathLike, *, input_names: Sequence[str] | None = None,
                  num_outputs: int | None = None, dynamic_shapes=None) -> Path:
    """Export ``module`` called on ``example_inputs`` to the ONNX file ``path`` (returned); with
    ``dynamic_shapes`` (``torch.export``'s spec, ``torch.export.Dim`` by axis) those dimensions stay symbolic,
    named as their ``Dim``s."""
    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    example_inputs = tuple(example_inputs) if isinstance(example_inputs, (tuple, list)) else ()
    if not example_inputs or not all(isinstance(x, torch.Tensor) for x in example_inputs):
        raise KorchError("a torch module needs example_inputs: a tensor or a sequence of tensors")
    if num_outputs is None:
        with torch.no_grad():
            result = module(*example_inputs)
        num_outputs = 1 if isinstance(result, torch.Tensor) else len(result)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=".onnx", dir=path.parent)
    os.close(fd)
    try:
        with quiet_exporter():
            torch.onnx.export(module, example_inputs, tmp, dynamo=True,
                              input_names=list(input_names or [f"input_{i}" if len(example_inputs) > 1 else "input"
                                                               for i in range(len(example_inputs))]),
                              output_names=output_names(num_outputs), external_data=False, verbose=False,
                              dynamic_shapes=dynamic_shapes)
        os.chmod(tmp, 0o644)  # mkstemp made it private
        os.replace(tmp, path)
    except KorchError:
        raise
    except Exception as exc:
        raise KorchError(f"torch's ONNX exporter failed on {type(module).__name__}: "
                         f"{one_line(exc)}") from exc
    finally:
        Path(tmp).unlink(missing_ok=True)
    return path
