"""The Triton backend: picks the kernel class that can write a candidate and builds it as one Triton kernel.

Kernel classes (``matmul``, ``conv``, ``window``, ``reduction``, ``pointwise``)
are ``KernelClass``es (``kernel_class.py``): ``claims(kernel) -> reason | None``
and ``generate(kernel)``; the first class that claims a kernel generates it. When none does, the refusal
reported is that of the class owning the kernel's heaviest op kind (a kernel
with a reduction reports why the reduction class refused it), which is the
reason worth counting.
"""

from __future__ import annotations

import triton

from korch.backends.base import BuildError
from korch.backends.triton.conv import CONV
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


def _refusal(cls: KernelClass, kernel: Graph) -> str | None:
    """``cls.claims(kernel)``; a class that fails while deciding refuses (one class's bug drops its kernels only)."""
    try:
        return cls.claims(kernel)
    except Exception as exc:  # noqa: BLE001 - any bug of one class only drops its kernels
        return f"{cls.name} claims failed: {type(exc).__name__}"


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

    def _claiming(self, kernel: Graph):
        for cls in kernel_classes():
            if _refusal(cls, kernel) is None:
                return cls, None
        owner = _owner(kernel)
        if isinstance(owner, str):
            return None, owner
        return None, _refusal(owner, kernel) or "no kernel class claims it"

    def claims(self, kernel: Graph) -> str | None:
        return self._claiming(kernel)[1]

    def build(self, kernel: Graph, device: str) -> TritonKernel:
        cls, reason = self._claiming(kernel)
        if cls is None:
            raise BuildError(f"Triton backend refuses the kernel: {reason}")
        try:
            generated = cls.generate(kernel)
        except Exception as exc:  # a generator bug drops the kernel, never the run
            raise BuildError(f"Triton {cls.name} generator failed: {exc}") from exc
        return TritonKernel(kernel, generated, device)


def kernel_class_of(kernel: Graph) -> str | None:
    """The name of the kernel class that would generate ``kernel``, None if none claims it."""
    for cls in kernel_classes():
        if _refusal(cls, kernel) is None:
            return cls.name
    return None
