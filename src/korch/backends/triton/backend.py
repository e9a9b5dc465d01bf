"""The Triton backend: picks the kernel class that can write a candidate and builds it as one Triton kernel.

Kernel classes (``matmul``, ``conv``, ``window``, ``reduction``, ``pointwise``)
are ``KernelClass``es (``kernel_class.py``); the first class whose ``attempt``
writes a kernel claims it, and what it wrote is what ``build`` launches. When
none does, the refusal reported is that of the class owning the kernel's
heaviest op kind (a kernel with a reduction reports why the reduction class
refused it), which is the reason worth counting.
"""

from __future__ import annotations

import triton

from korch.backends.base import BuildError
from korch.backends.triton.conv import CONV
from korch.backends.triton.generated import GeneratedKernel
from korch.backends.triton.kernel_class import KernelClass
from korch.backends.triton.launch import TritonKernel, interpreting
from korch.backends.triton.matmul import MATMUL
from korch.backends.triton.pointwise import POINTWISE
from korch.backends.triton.reduction import REDUCTION
from korch.backends.triton.window import WINDOW
from korch.ir.graph import Graph
from korch.ir.ops import Kind, Op

# bump when generated code changes, so that profiled latencies are re-measured
GENERATOR_VERSION = "2"


def kernel_classes() -> list[KernelClass]:
    """The kernel classes, most specific first."""
    return [MATMUL, CONV, WINDOW, REDUCTION, POINTWISE]


def _owner(kernel: Graph) -> KernelClass | str:
    """The class whose refusal explains why ``kernel`` is not built, or a reason when there is none."""
    ops = {node.op for node in kernel.nodes}
    kinds = {op.kind for op in ops}
    if Kind.OPAQUE in kinds:
        return "opaque op"
    if Kind.LINEAR in kinds:
        return CONV if ops & {Op.CONV, Op.CONV_TRANSPOSE} else MATMUL
    if Kind.WINDOW in kinds:
        return WINDOW
    if Kind.REDUCE in kinds:
        return REDUCTION
    return POINTWISE


class TritonBackend:
    name = "triton"

    @property
    def version(self) -> str:
        return f"{triton.__version__}+korch{GENERATOR_VERSION}"

    def supports_device(self, device: str) -> bool:
        return device.startswith("cuda") or (device == "cpu" and interpreting())

    def claims(self, kernel: Graph) -> str | None:
        cls, outcome = _attempt(kernel)
        return None if cls else outcome

    def build(self, kernel: Graph, device: str) -> TritonKernel:
        cls, outcome = _attempt(kernel)
        if cls is None:
            raise BuildError(f"Triton backend refuses the kernel: {outcome}")
        return TritonKernel(kernel, outcome, device)


def _attempt(kernel: Graph) -> tuple[KernelClass | None, GeneratedKernel | str]:
    """The first class that writes ``kernel`` and what it wrote, or (None, the reason worth reporting)."""
    refusals = {}
    for cls in kernel_classes():
        outcome = cls.attempt(kernel)
        if not isinstance(outcome, str):
            return cls, outcome
        refusals[cls.name] = outcome
    owner = _owner(kernel)
    return None, owner if isinstance(owner, str) else refusals[owner.name]


def kernel_class_of(kernel: Graph) -> str | None:
    """The name of the kernel class that would generate ``kernel``, None if none claims it."""
    cls, _ = _attempt(kernel)
    return cls.name if cls else None
