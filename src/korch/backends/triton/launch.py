"""Running generated Triton kernels: bind parameters to tensors, pick a launch variant, compile ahead for a GPU.

``TritonKernel`` is the Triton backend's ``BuiltKernel``. On CUDA it launches
the compiled kernel; on a CPU it runs in Triton's interpreter (only when
``TRITON_INTERPRET=1`` was set before triton was imported: CI checks numerics
that way). ``tune`` times the variants that checked and keeps the fastest.

``compile_for_target`` compiles a generated kernel for a GPU that need not be
present (``GPUTarget("cuda", 90, 32)``: Hopper), which proves that it builds
and reports its resource use; it specialises the arguments' alignment as the
JIT does (``alignment_attrs``). It refuses to run in a process that runs the
interpreter: the interpreter patches ``triton.language`` in place, and a
compile there fails depending on what ran before. ``ahead.py`` compiles in
spawned processes instead.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import TypeVar

import torch

from korch.backends.base import BuildError, stored_as, write_outputs
from korch.backends.triton.generated import GeneratedKernel, Variant
from korch.backends.triton.loader import load_module
from korch.ir import dtypes
from korch.ir.graph import CONTIGUOUS, Graph
from korch.ir.interpret import as_torch

T = TypeVar("T")


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


class TritonKernel:
    backend = "triton"
    launches = 1
    in_place = True

    def __init__(self, kernel: Graph, generated: GeneratedKernel, device: str):
        if device == "cpu" and not interpreting():
            raise BuildError("Triton kernels run on CPUs only in the interpreter (TRITON_INTERPRET=1)")
        self.kernel, self.generated, self.device = kernel, generated, device
        self.source = generated.source
        self.variant: Variant = generated.variants[0]
        try:
            self.fn = getattr(load_module(generated.source), generated.entry)
        except Exception as exc:  # a generator bug surfaces as a kernel that does not build
            raise BuildError(f"generated Triton source does not load: {exc}") from exc
        self._constants = {p.name: as_torch(kernel.constants[p.name]).to(device)
                           for p in generated.params if p.kind == "tensor" and p.name in kernel.constants}
        self._outputs = [kernel.tensors[name] for name in kernel.outputs]
        # inputs the kernel reads in another layout than contiguous: a tensor passed in the wrong one is stored
        # as the kernel reads it (a no-op for one stored so already), never read as if it were
        self._laid_out = [(i, kernel.tensors[name].layout) for i, name in enumerate(kernel.inputs)
                          if kernel.tensors[name].layout != CONTIGUOUS]

    def _allocate(self) -> list[torch.Tensor]:
        return [stored_as(torch.empty(t.shape, dtype=dtypes.torch_dtype(t.dtype), device=self.device), t.layout)
                for t in self._outputs]

    def __call__(self, *inputs: torch.Tensor, out: Sequence[torch.Tensor] | None = None) -> list[torch.Tensor]:
        results = list(out) if out is not None else self._allocate()
        if self._laid_out:
            inputs = list(inputs)
            for i, layout in self._laid_out:
                inputs[i] = stored_as(inputs[i], layout)
        env = dict(self._constants)
        env.update(zip(self.kernel.inputs, inputs))
        env.update(zip(self.kernel.outputs, results))
        args = [env[p.name] if p.kind == "tensor" else p.value for p in self.generated.params]
        v = self.variant
        self.fn[v.grid](*args, **dict(v.constexprs), num_warps=v.num_warps, num_stages=v.num_stages)
        return write_outputs(results, None)

    def tune(self, time_call: Callable[[Callable[[int], object]], T], input_sets: Sequence[Sequence[torch.Tensor]],
             checked: Sequence[int], seconds: Callable[[T], float] = float) -> T:
        """Time the variants whose indices are ``checked`` (those whose outputs were checked: an unchecked one is
        never chosen) with ``time_call`` (given a call of input set ``i``, its timing); keep the fastest by
        ``seconds``; return its timing, the kernel's (the measured search times it no further). Each variant
        runs once first, so that its compilation is not timed."""
        best, best_timing, best_s = self.variant, None, float("inf")
        buffers = self._allocate()
        for index in checked:
            self.variant = self.generated.variants[index]
            try:
                self(*input_sets[0], out=buffers)  # compiles this variant (Triton compiles at its first launch)
                timing = time_call(lambda i: self(*input_sets[i], out=buffers))
            except Exception:  # a variant that does not fit (shared memory, registers) is skipped
                continue
            if seconds(timing) < best_s:
                best, best_timing, best_s = self.variant, timing, seconds(timing)
        self.variant = best
        if best_timing is None:
            raise BuildError("no checked launch variant of the Triton kernel ran")
        return best_timing


def compile_for_target(generated: GeneratedKernel, arch: int = 90, variant: Variant | None = None):
    """Compile ``generated`` for CUDA compute capability ``arch`` without a GPU; returns Triton's compiled kernel."""
    if interpreting():
        raise RuntimeError("this process runs Triton's interpreter: compile for a GPU in a spawned process "
                           "(korch.backends.triton.ahead)")
    import triton
    from triton.backends.compiler import GPUTarget

    v = variant or generated.variants[0]
    fn = getattr(load_module(generated.source, compiled=True), generated.entry)
    # by position: source parameter names need not be the graph's tensor names (those need not be identifiers)
    signature = {arg: p.triton_type for arg, p in zip(fn.arg_names, generated.params)}
    constexprs = dict(v.constexprs)
    signature.update({name: "constexpr" for name in constexprs})
    source = triton.compiler.ASTSource(fn=fn, signature=signature, constexprs=constexprs,
                                       attrs=alignment_attrs(generated))
    return triton.compile(source, target=GPUTarget("cuda", arch, 32),
                          options={"num_warps": v.num_warps, "num_stages": v.num_stages})


def alignment_attrs(generated: GeneratedKernel) -> dict[tuple[int], list]:
    """The specialisation Triton's JIT gives a launch's arguments, for an ahead-of-time compile to match: every
    pointer divisible by 16 (torch's allocations are aligned far beyond) and every int that is. With it, the
    kernel compiled ahead is the one the JIT builds and caches on the GPU, not a less vectorised twin."""
    return {(i,): [["tt.divisibility", 16]] for i, p in enumerate(generated.params)
            if p.kind == "tensor" or (p.value is not None and p.value % 16 == 0)}

