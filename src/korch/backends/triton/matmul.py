"""The matmul kernel class: one MATMUL (numpy batch broadcasting) with fused operand prologues and epilogues.

The product ``(*batch, M, K) @ (*batch, K, N)`` runs as a tiled ``tl.dot``
(``tiled.py``), one program per (batch element, M tile, N tile). Operands are
read through any elementwise/layout chain over the kernel inputs (a scale, a
transpose as K^T, a reshape, a broadcast batch axis); the product flows into
elementwise epilogues with broadcast inputs (bias, activation, residual) and an
output layout (transpose, reshape) done in the store addresses. Every kernel
output must depend on the product.
"""

from __future__ import annotations

from korch.backends.triton import tiled
from korch.backends.triton.fusion import (
    ZERO,
    Counter,
    Derived,
    Emitter,
    Ix,
    Params,
    Val,
    broadcast_index,
    epilogue,
    free_tensors,
    side_outputs,
)
from korch.ir.graph import Graph
from korch.ir.ops import Op


class MatmulClass(tiled.GemmClass):
    name = "matmul"

    def _plan(self, kernel: Graph) -> tiled.GemmPlan:
        node = tiled.linear_node(kernel, Op.MATMUL)
        dtype = tiled.operand_dtype(kernel, node)
        a, b = node.inputs
        product = kernel.tensors[node.output].shape
        *batch, m, n = product
        k = kernel.tensors[a].shape[-1]
        plan = tiled.GemmPlan("matmul", m, n, k, _prod(batch), dtype, Params(kernel), Counter())
        plan.head, batch_index = _batch_indices(batch)
        free = free_tensors(kernel, node.output)
        for operand, tile, rows, cols in ((a, tiled.A_TILE, Ix("rm[:, None]", frozenset("m")),
                                           Ix("rk[None, :]", frozenset("k"))),
                                          (b, tiled.B_TILE, Ix("rk[:, None]", frozenset("k")),
                                           Ix("rn[None, :]", frozenset("n")))):
            emitter = Emitter(kernel, plan.params, tile, plan.names, free)
            shape = kernel.tensors[operand].shape
            full = (*batch, *shape[-2:])
            index = broadcast_index(batch_index + [rows, cols], full, shape)
            plan.operands.append((emitter, emitter.value(operand, index)))
        out = Emitter(kernel, plan.params, tiled.OUT_TILE, plan.names, free)
        start = Derived(Val("acc", frozenset("mn")),
                        tuple(batch_index + [Ix("rm[:, None]", frozenset("m")), Ix("rn[None, :]", frozenset("n"))]))
        plan.epilogue = epilogue(kernel, out, node.output, start, node)
        plan.side, plan.side_elements = side_outputs(kernel, plan.params, plan.names, free)
        return plan


def _batch_indices(batch: list[int]) -> tuple[list[str], list[Ix]]:
    """Lines splitting the program's problem number ``batch`` into one index per batch axis."""
    lines, index, inner = [], [], 1
    for axis in reversed(range(len(batch))):
        size = batch[axis]
        if size == 1:
            index.append(ZERO)
            continue
        lines.append(f"b{axis} = (batch // {inner}) % {size}" if inner > 1 else f"b{axis} = batch % {size}")
        index.append(Ix(f"b{axis}"))
        inner *= size
    return lines, index[::-1]


def _prod(sizes: list[int]) -> int:
    total = 1
    for s in sizes:
        total *= s
    return total


MATMUL = MatmulClass()
