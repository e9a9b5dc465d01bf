"""Building a plan's kernels: each planned kernel compiled by the backend that should run it.

A measured plan names, for every kernel, the backend whose kernel was fastest
and checked; that backend builds it again (from the compilers' caches). A plan
priced by lower bounds names none: a kernel of one linear, window or opaque
primitive goes to the library (cuBLAS/cuDNN, oneDNN), one with a product or
convolution among others to Inductor (the library's product, the rest fused
around it), any other to the target's fusing backends in their order. A backend that fails hands the kernel to the
next; the last resort runs the kernel's primitives one torch operator at a
time (the library backend's lowering), which always builds.

Checking every kernel of a large model against the reference executor costs
more than building it, so the pipeline builds with ``check_kernels=False`` and
checks the whole executable against ONNX Runtime; only when that fails does
``recheck`` check each unchecked kernel against the reference executor and
rebuild the failing ones with the next backend.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

from korch.backends.base import Backend, BuiltKernel
from korch.backends.check import CheckResult, check
from korch.backends.library import LibraryKernel
from korch.backends.registry import backends_for
from korch.errors import KorchError, one_line
from korch.ir.graph import Graph
from korch.ir.ops import Kind
from korch.ir.subgraph import extract
from korch.orchestrate.plan import Plan, PlannedKernel

_LIBRARY_KINDS = (Kind.LINEAR, Kind.WINDOW, Kind.OPAQUE)


def kernel_graphs(graph: Graph, plan: Plan, layouts: bool = False) -> list[Graph]:
    """Each planned kernel's primitives cut out of ``graph`` as a graph of their own; with ``layouts``, reading
    and writing its values in the layout the plan gave it (as the compiled unit stores them and the search
    measured it), else contiguous (as the kernel-by-kernel executable stores every value)."""
    index = {node.name: i for i, node in enumerate(graph.nodes)}
    return [extract(graph, [index[n] for n in k.nodes], k.inputs, k.outputs, name=k.name,
                    **({"layout": k.layout} if layouts else {})) for k in plan.kernels]


def _preference(kernel: Graph, planned: PlannedKernel, backends: Sequence[Backend]) -> list[Backend]:
    claiming = [b for b in backends if b.claims(kernel) is None]
    if planned.backend:
        return sorted(claiming, key=lambda b: b.name != planned.backend)
    if len(kernel.nodes) == 1 and kernel.nodes[0].op.kind in _LIBRARY_KINDS:
        return sorted(claiming, key=lambda b: b.name != "library")
    if any(node.op.kind is Kind.LINEAR for node in kernel.nodes):
        # a product or convolution with fused neighbours, unmeasured: Inductor runs the product in the vendor
        # library (cuBLAS, cuDNN, oneDNN) and fuses the rest around it; korch's Triton products in fp32 run
        # without tensor cores (on an H100, YOLOv4's roofline plan took 17.2 ms against torch.compile's 6.7)
        return sorted(claiming, key=lambda b: b.name != "inductor")
    return claiming


def _select_variant(built: BuiltKernel, variant: dict | None) -> None:
    """Launch the variant the measurement chose (Triton kernels have several)."""
    wanted = (variant or {}).get("variant")
    generated = getattr(built, "generated", None)
    if wanted and generated is not None:
        for v in generated.variants:
            if v.describe() == wanted:
                built.variant = v


@dataclasses.dataclass
class BuiltStep:
    """One planned kernel, built: what runs, which backend built it, what was tried before."""

    planned: PlannedKernel
    kernel: Graph
    built: BuiltKernel
    backend: str
    refused: list[str] = dataclasses.field(default_factory=list)   # "backend: reason" of the failed tries
    checked: bool = False     # checked against the reference executor (here or when it was measured)


def build_step(planned: PlannedKernel, kernel: Graph, backends: Sequence[Backend], device: str, *,
               check_kernel: bool = True, skip: Sequence[str] = (), refused: Sequence[str] = ()) -> BuiltStep:
    refused = list(refused)
    for backend in _preference(kernel, planned, backends):
        if backend.name in skip:
            continue
        was_measured = backend.name == planned.backend and planned.measured
        try:
            built = backend.build(kernel, device)
            if check_kernel and not was_measured:
                result = check(built, kernel, device=device)
                if not result.ok:
                    raise ValueError(f"check failed: {result.message}")
        except Exception as exc:  # a kernel that fails to build or check goes to the next backend
            refused.append(f"{backend.name}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
            continue
        _select_variant(built, planned.variant)
        return BuiltStep(planned, kernel, built, backend.name, refused, checked=check_kernel or was_measured)
    return BuiltStep(planned, kernel, LibraryKernel(kernel, device), "torch", refused, checked=True)


def rebuild(kernel: Graph, backend_name: str, target: str, device: str, variant: dict | None = None) -> BuiltKernel:
    """The kernel an executable was written with, built again by the backend it names (from the caches)."""
    if backend_name == "torch":
        return LibraryKernel(kernel, device)
    backend = next((b for b in backends_for(target) if b.name == backend_name), None)
    if backend is None:
        raise KorchError(f"kernel {kernel.name}: backend {backend_name!r} is not available for {target}")
    built = backend.build(kernel, device)
    _select_variant(built, variant)
    return built


@dataclasses.dataclass(frozen=True)
class UnitComputed:
    """A planned kernel that the plan's compiled unit computes: not built on its own (``unit_steps``)."""

    launches: int = 1
    in_place: bool = False  # a unit returns its values (CPU)
    source: str = ""


def unit_steps(graph: Graph, plan: Plan, target: str, device: str) -> list[BuiltStep]:
    """The plan's steps where its compiled unit runs them: nothing built, each named by the backend
    ``build_plan`` would try first (the one a measured plan priced), with the launches it priced."""
    backends = _backends(target, device)
    steps = []
    for planned, kernel in zip(plan.kernels, kernel_graphs(graph, plan)):
        first = next(iter(_preference(kernel, planned, backends)), None)
        steps.append(BuiltStep(planned, kernel, UnitComputed(launches=planned.launches),
                               first.name if first else "torch", checked=True))
    return steps


def _backends(target: str, device: str) -> list[Backend]:
    return [b for b in backends_for(target) if b.supports_device(device)]


def build_plan(graph: Graph, plan: Plan, target: str, device: str,
               on_kernel: Callable[[int, int, PlannedKernel], None] | None = None, *,
               check_kernels: bool = True) -> list[BuiltStep]:
    """Every kernel of ``plan`` built for ``device`` (see the module docstring)."""
    backends = _backends(target, device)
    steps = []
    for i, (planned, kernel) in enumerate(zip(plan.kernels, kernel_graphs(graph, plan))):
        if on_kernel:
            on_kernel(i, len(plan.kernels), planned)
        steps.append(build_step(planned, kernel, backends, device, check_kernel=check_kernels))
    return steps


def recheck(steps: Sequence[BuiltStep], target: str, device: str) -> tuple[list[BuiltStep], int]:
    """The steps with every unchecked kernel checked, and those that fail rebuilt by the next backend;
    returns them and how many were rebuilt."""
    backends = _backends(target, device)
    result, rebuilt = [], 0
    for step in steps:
        if not step.checked:
            try:
                outcome = check(step.built, step.kernel, device=device)
            except Exception as exc:  # a kernel that raises on its own inputs is as wrong as one that miscomputes
                outcome = CheckResult(False, math.inf, math.inf, f"raised {one_line(exc)}")
            if not outcome.ok:
                why = f"{step.backend}: check failed: {outcome.message}"
                step = build_step(step.planned, step.kernel, backends, device, skip=(step.backend,),
                                  refused=[*step.refused, why])
                rebuilt += 1
            else:
                step = dataclasses.replace(step, checked=True)
        result.append(step)
    return result, rebuilt
