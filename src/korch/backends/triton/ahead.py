"""Compiling generated kernels ahead of time for a GPU that is not here (Hopper by default).

Used by the survey ``benchmarks/compile_hopper.py`` and by the tests: every
compile for a real target runs here, in spawned processes with the interpreter
off. A process that has run kernels in Triton's interpreter keeps some of its
patches to ``triton.language`` and cannot compile afterwards
(``launch.compile_for_target`` refuses to run in one).
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Sequence

from korch import workers
from korch.errors import one_line
from korch.ir.graph import Graph


@dataclasses.dataclass(frozen=True)
class AheadResult:
    kernel_class: str | None   # None: no class claims the kernel
    status: str                # "compiled", "refused", "generate_failed", "compile_failed"
    reason: str
    seconds: float
    aligned_args: int = 0      # arguments the compiled kernel knows divisible by 16 (as the JIT's would)
    pointer_args: int = 0      # of its arguments, the tensors


def compile_one(kernel: Graph, arch: int = 90) -> AheadResult:
    """Generate ``kernel`` with the first Triton class that claims it and compile it for ``arch``."""
    from korch.backends.triton.backend import kernel_classes
    from korch.backends.triton.launch import compile_for_target

    start = time.perf_counter()
    cls = next((c for c in kernel_classes() if c.claims(kernel) is None), None)
    if cls is None:
        return AheadResult(None, "refused", "", 0.0)
    try:
        generated = cls.generate(kernel)
    except Exception as exc:
        return AheadResult(cls.name, "generate_failed", one_line(exc, 200), time.perf_counter() - start)
    try:
        compiled = compile_for_target(generated, arch)
        if not compiled.asm.get("cubin"):
            raise RuntimeError("no cubin")
    except Exception as exc:
        return AheadResult(cls.name, "compile_failed", one_line(exc, 200), time.perf_counter() - start)
    aligned = _entry_signature(compiled.asm.get("ttir", ""), generated.entry).count("tt.divisibility = 16")
    pointers = sum(p.kind == "tensor" for p in generated.params)
    return AheadResult(cls.name, "compiled", "", time.perf_counter() - start, aligned, pointers)


def _entry_signature(ttir: str, entry: str) -> str:
    """The line of the entry's definition in Triton IR (its arguments and their attributes)."""
    return next((line for line in ttir.splitlines() if f"@{entry}(" in line), "")


def _init_worker() -> None:
    os.environ["TRITON_INTERPRET"] = "0"


def _compile_generated(generated, arch: int) -> str | None:
    from korch.backends.triton.launch import compile_for_target

    try:
        compile_for_target(generated, arch)
    except Exception as exc:
        return one_line(exc, 200)
    return None


def _in_workers(fn, items: Sequence, arch: int, jobs: int | None) -> list:
    if not items:
        return []
    with workers.pool(jobs or os.cpu_count() or 1, initializer=_init_worker) as pool:
        return list(pool.map(fn, items, [arch] * len(items)))


def compile_many(kernels: Sequence[Graph], arch: int = 90, jobs: int | None = None) -> list[AheadResult]:
    """``compile_one`` of each kernel graph, in ``jobs`` spawned processes (default: the core count)."""
    return _in_workers(compile_one, kernels, arch, jobs)


def compile_generated(generated: Sequence, arch: int = 90, jobs: int | None = None) -> list[str | None]:
    """Compile already generated kernels (``GeneratedKernel``) in spawned processes: an error line or None each."""
    return _in_workers(_compile_generated, generated, arch, jobs)
