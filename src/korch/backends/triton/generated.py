"""What a Triton kernel generator produces: plain data the launcher compiles, runs and tunes.

A generator (``pointwise.py``, ``reduction.py``, ``window.py``, ``matmul.py``,
``conv.py``) turns a kernel graph into a ``GeneratedKernel``: a whole Python
module of source (``scalar.PRELUDE`` plus one ``@triton.jit`` entry and any
helpers), the entry's parameters in call order, and the launch variants to
choose among (block sizes, warps, stages, grid). The launcher
(``launch.py``) binds parameters to tensors by name, so generators never touch
tensors.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Param:
    """One runtime parameter of the entry kernel.

    ``kind`` is "tensor" (a pointer to the kernel graph's tensor ``name``: an
    input, an output, or a constant too large to bake in) or "int" (a scalar
    argument with the fixed ``value``). ``triton_type`` is its type in the
    ``triton.compile`` signature: "*fp32", "*i64", "i32", ...
    """

    name: str
    kind: str
    triton_type: str
    value: int | None = None


@dataclasses.dataclass(frozen=True)
class Variant:
    """One way to launch: values of the entry's constexpr parameters, the grid, warps and stages."""

    constexprs: tuple[tuple[str, int], ...]   # (name, value), in any order
    grid: tuple[int, ...]                     # 1 to 3 program counts
    num_warps: int = 4
    num_stages: int = 2

    def describe(self) -> str:
        items = ", ".join(f"{k}={v}" for k, v in self.constexprs)
        return f"{items}, grid={self.grid}, warps={self.num_warps}, stages={self.num_stages}"


@dataclasses.dataclass(frozen=True)
class GeneratedKernel:
    kernel_class: str                 # "pointwise", "reduction", "window", "matmul", "conv"
    source: str                       # the whole module
    entry: str                        # the @triton.jit function to launch
    params: tuple[Param, ...]         # runtime parameters, in the entry's order, before its constexprs
    variants: tuple[Variant, ...]     # at least one; the first is the default (and the interpreter's)
