"""The backend interface: how a candidate kernel becomes a compiled, launchable, checkable kernel.

A backend sees a kernel as plain IR: the candidate's primitives cut out of the
model (``korch.ir.subgraph.extract``) as a ``Graph`` whose ``inputs`` are the
tensors the kernel reads, whose ``constants`` it may bake in or read, and whose
``outputs`` it must write. It never sees the model or the orchestrator.

* ``claims(kernel)`` answers quickly, without compiling, whether the backend
  can build the kernel (None) or why not (a short reason, counted in reports).
* ``build(kernel, device)`` compiles it for a torch device ("cpu", "cuda") and
  returns a ``BuiltKernel``; it raises ``BuildError`` when it cannot.

A ``BuiltKernel`` is called on torch tensors on that device, one per
``kernel.inputs`` in order, and returns one tensor per ``kernel.outputs``. With
``out=`` it writes into the given tensors instead (the executable's planned
buffers); ``in_place`` says whether it writes them directly (else it computes
into fresh tensors and copies, and the executable lets it allocate instead).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

from korch.errors import KorchError
from korch.ir.graph import CHANNELS_LAST, CONTIGUOUS, Graph


class BuildError(KorchError):
    """A backend could not build a kernel (the kernel is dropped, never the run)."""


class BuiltKernel(Protocol):
    backend: str
    launches: int             # device kernels one call launches (Inductor may split a candidate)
    source: str | None        # generated source, for the readable executable; None for library calls
    in_place: bool            # writes ``out=`` buffers directly (no copy)

    def __call__(self, *inputs: torch.Tensor, out: Sequence[torch.Tensor] | None = None) -> list[torch.Tensor]:
        ...


class Backend(Protocol):
    name: str                 # "triton", "inductor", "library"

    @property
    def version(self) -> str:  # part of the profile database key: a new compiler re-measures
        ...

    def supports_device(self, device: str) -> bool:
        ...

    def claims(self, kernel: Graph) -> str | None:
        ...

    def build(self, kernel: Graph, device: str) -> BuiltKernel:
        ...


def memory_format(layout: str) -> torch.memory_format:
    """torch's memory format of ``layout`` (``ir.graph.LAYOUTS``)."""
    return torch.channels_last if layout == CHANNELS_LAST else torch.contiguous_format


def stored_as(tensor: torch.Tensor, layout: str) -> torch.Tensor:
    """``tensor`` with the strides of ``layout`` (``ir.graph.LAYOUTS``), copied only if it has others."""
    return tensor.contiguous(memory_format=memory_format(layout))


def contiguous_only(backend: str, kernel: Graph) -> str | None:
    """The reason a backend that reads and writes contiguous tensors only gives for a kernel with other
    boundary layouts (None when it has none)."""
    if kernel.boundary_layouts() - {CONTIGUOUS}:
        return f"{backend}: contiguous boundaries only"
    return None


def write_outputs(results: Sequence[torch.Tensor], out: Sequence[torch.Tensor] | None) -> list[torch.Tensor]:
    """``results``, copied into ``out`` when the caller gave buffers (for backends that allocate)."""
    if out is None:
        return list(results)
    if len(out) != len(results):
        raise ValueError(f"{len(out)} output buffers for {len(results)} outputs")
    for buffer, value in zip(out, results):
        buffer.copy_(value)
    return list(out)
