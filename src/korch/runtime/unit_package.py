"""A compiled unit's package, loaded to run: ``CompiledUnit`` (the AOTInductor loader called directly, the
operator libraries the unit calls opened first), and the package's file name in an OUTDIR."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

import torch

from korch import heap
from korch.backends import ort_gemm
from korch.errors import KorchError

UNIT_FILE = "model.pt2"


class CompiledUnit:
    """A loaded ``model.pt2``: ``unit(*inputs) -> tuple of outputs`` (fresh tensors); ``libraries``, the paths of
    the operator libraries it calls (korch_ort's), are opened first. Loading one has the process keep the memory
    a call frees for the next (``heap.keep_freed_memory``).

    The package's loader is called directly (``torch._C._aoti``): ``torch._inductor.aoti_load_package``
    would import Inductor and Dynamo (1.5 s) and flatten the arguments with pytree on every call, and a
    unit's inputs and outputs are already flat tuples of tensors.
    """

    def __init__(self, package: str | os.PathLike, libraries: Sequence[Path] = ()):
        heap.keep_freed_memory()
        for path in libraries:
            ort_gemm.open_library(path)
        try:
            self._loader = torch._C._aoti.AOTIModelPackageLoader(str(package), "model", False, 1, -1)
        except Exception as exc:  # a package torch cannot open: a damaged or foreign file
            raise KorchError(f"{package}: cannot load the compiled unit ({type(exc).__name__}): "
                             "run korch optimize again") from None

    def __call__(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(self._loader.boxed_run(list(inputs)))

    @classmethod
    def from_bytes(cls, data: bytes) -> "CompiledUnit":
        # the loader unpacks the package into a directory of its own, so the file can go once loaded
        with tempfile.TemporaryDirectory(prefix="korch-unit-") as tmp:
            path = Path(tmp) / UNIT_FILE
            path.write_bytes(data)
            return cls(path)

