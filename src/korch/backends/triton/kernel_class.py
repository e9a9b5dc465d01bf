"""What every Triton kernel class shares: the refusal, the claim protocol, and the checks made before writing.

A kernel class (pointwise, reduction, window, matmul, conv) has a ``name`` and
``generate(kernel) -> GeneratedKernel``, which raises ``Refuse`` with a short
reason when the class cannot write the kernel. ``claims`` is defined once, by
generating: writing source is cheap (nothing is compiled), and a class can only
claim what it can write.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from korch import config
from korch.backends.triton import scalar
from korch.backends.triton.generated import GeneratedKernel, Variant
from korch.cost.devices import GPUS
from korch.ir.graph import Graph
from korch.ir.ops import ELEMENTWISE, Op


class Refuse(Exception):
    """The generator cannot write this kernel; the message is the short reason claims report."""


class KernelClass:
    """A way of writing kernels; subclasses define ``name`` and ``generate``."""

    name = "kernel"

    def attempt(self, kernel: Graph) -> GeneratedKernel | str:
        """The generated kernel, or why this class cannot write it."""
        try:
            return self.generate(kernel)
        except Refuse as refusal:
            return str(refusal)
        except Exception as exc:  # noqa: BLE001 - a generator bug: refuse rather than claim a kernel that cannot be written
            return f"generator error: {type(exc).__name__}"

    def claims(self, kernel: Graph) -> str | None:
        """None when ``generate(kernel)`` succeeds, else why not."""
        outcome = self.attempt(kernel)
        return outcome if isinstance(outcome, str) else None

    def generate(self, kernel: Graph) -> GeneratedKernel:
        raise NotImplementedError


def check_ops(kernel: Graph, allowed: frozenset[Op]) -> None:
    """Refuse ops outside ``allowed`` and elementwise ops or dtypes the scalar table cannot write."""
    for node in kernel.nodes:
        if node.op not in allowed:
            raise Refuse(f"{node.op.kind.value} op {node.op.value}")
        in_dtypes = [kernel.tensors[t].dtype for t in node.inputs if t]
        out_dtypes = [kernel.tensors[t].dtype for t in node.outputs]
        if not all(d in scalar.TRITON_TYPES for d in in_dtypes + out_dtypes):
            raise Refuse("unsupported dtype")
        if node.op in ELEMENTWISE and not scalar.supported(node.op, in_dtypes):
            raise Refuse(f"no Triton expression for {node.op.value}")
        if node.op is Op.GATHER and node.inputs[1] not in kernel.constants:
            raise Refuse("gather with computed indices")


def wide_index(kernel: Graph) -> bool:
    """Whether index arithmetic needs int64 (some tensor has 2**31 elements or more)."""
    return any(t.numel >= 2**31 for t in kernel.tensors.values())


def next_power_of_2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


# programs per SM of an H100 that a memory-bound kernel's grid should reach
PROGRAMS_PER_SM = 4


def chosen_variants(variants: Sequence[Variant], elements: Callable[[Variant], int]) -> list[Variant]:
    """With ``config.launch_variants``: the default (first) and, of the others, the one with the most
    ``elements`` a program that still gives every SM of an H100 ``PROGRAMS_PER_SM`` programs (a memory-bound
    kernel wants both), else the one with the most programs; with 0, all of them."""
    if not config.launch_variants or len(variants) <= 2:
        return list(variants)
    others = variants[1:]
    filling = [v for v in others if v.grid[0] >= PROGRAMS_PER_SM * GPUS["h100"].sms]
    pick = max(filling, key=elements) if filling else max(others, key=lambda v: v.grid[0])
    return [variants[0], pick][:max(1, config.launch_variants)]

