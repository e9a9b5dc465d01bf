"""The pointwise kernel class: elementwise and layout primitives as one Triton kernel over its outputs' elements.

Each program handles ``BLOCK`` consecutive elements of one output shape: the
flat position ``x`` is split into per-axis indices and every output is
computed by walking back through the graph (``emit.Emitter``): layout ops are
index arithmetic, never copies. Outputs of different shapes (a tensor and its
transpose, a value and a padded view of it) get consecutive ranges of program
ids, one range per distinct element count; outputs of one count (a tensor and
its transpose) are written by the same programs, sharing what they can.

``write_flat`` is shared with the window class, which adds a pool handler.
"""

from __future__ import annotations

from korch.backends.triton.emit import Emitter, Handler
from korch.backends.triton.generated import GeneratedKernel, Variant
from korch.backends.triton.indexing import Space
from korch.backends.triton.kernel_class import (KernelClass, Refuse, check_ops, chosen_variants, next_power_of_2,
                                                wide_index)
from korch.ir.graph import Graph, storage_order
from korch.ir.ops import ELEMENTWISE, LAYOUT, Op

# (BLOCK, warps); the first is the default
VARIANTS = ((1024, 4), (256, 4), (512, 4), (2048, 8))


def output_groups(kernel: Graph) -> list[tuple[int, list[str]]]:
    """The kernel's outputs grouped by element count, in order of first appearance."""
    groups: dict[int, list[str]] = {}
    for name in kernel.outputs:
        groups.setdefault(kernel.tensors[name].numel, []).append(name)
    return list(groups.items())


def write_flat(kernel: Graph, kernel_class: str, handlers: dict[Op, Handler] | None = None) -> GeneratedKernel:
    """One kernel over the elements of every output, program-id ranges per output shape."""
    groups = [(numel, names) for numel, names in output_groups(kernel) if numel > 0]
    if not groups:
        raise Refuse("empty outputs")
    space = Space()
    em = Emitter(kernel, space, handlers)
    em.line("pid = tl.program_id(0)")
    if wide_index(kernel):
        em.line("pid = pid.to(tl.int64)")
    start = "0"
    for g, (numel, names) in enumerate(groups):
        end = f"{start} + ({numel} + BLOCK - 1) // BLOCK"
        if len(groups) > 1:
            em.line(("if" if g == 0 else "elif") + f" pid < {end}:" if g < len(groups) - 1 else "else:")
            em.depth += 1
        x = space.add_var(f"x{g}", numel)
        em.line(f"x{g} = (pid - ({start})) * BLOCK + tl.arange(0, BLOCK)")
        em.line(f"x{g}_mask = x{g} < {numel}")
        em.push()
        for name in names:  # x runs over each output in the order it is stored: stores stay consecutive
            t = kernel.tensors[name]
            order = storage_order(t.layout, len(t.shape))
            stored = space.unflatten(x, [t.shape[i] for i in order])
            index = [stored[order.index(axis)] for axis in range(len(t.shape))]
            em.store(name, index, em.value(name, index))
        em.pop()
        if len(groups) > 1:
            em.depth -= 1
        start = end
    largest = max(numel for numel, _ in groups)
    variants = []
    for block, warps in VARIANTS:
        if block > max(256, next_power_of_2(largest)):
            continue
        grid = sum(-(-numel // block) for numel, _ in groups)
        variants.append(Variant((("BLOCK", block),), (grid,), num_warps=warps))
    return em.generated(kernel_class, ["BLOCK"], chosen_variants(variants, lambda v: dict(v.constexprs)["BLOCK"]))


class Pointwise(KernelClass):
    """Kernels of elementwise and layout primitives only."""

    name = "pointwise"
    ops = ELEMENTWISE | LAYOUT

    def generate(self, kernel: Graph) -> GeneratedKernel:
        check_ops(kernel, self.ops)
        return write_flat(kernel, self.name)


POINTWISE = Pointwise()
