"""The matmul kernel class: one MATMUL (numpy batch broadcasting) with fused operand prologues and epilogues.

The product ``(*batch, M, K) @ (*batch, K, N)`` runs as a tiled ``tl.dot``
(``tiled.py``), one program per (batch element, M tile, N tile): the program's
problem ``batch`` is the flat batch position, split into one index per batch
axis (a broadcast operand reads index 0 on its size-1 axes). Operands are read
through any elementwise/layout chain over the kernel inputs (a scale, a
transpose as K^T, a reshape, a broadcast batch axis); the product flows into
elementwise epilogues with broadcast inputs (bias, activation, residual) and an
output layout (transpose, reshape) done in the store addresses.
"""

from __future__ import annotations

import math

from korch.backends.triton import tiled
from korch.backends.triton.indexing import Ix, Space, broadcast_index
from korch.ir.graph import Graph, Node
from korch.ir.ops import Op


class MatmulClass(tiled.GemmClass):
    name = "matmul"
    op = Op.MATMUL

    def problem(self, kernel: Graph, node: Node, dtype: str) -> tiled.Gemm:
        *batch, m, n = kernel.tensors[node.output].shape
        return tiled.Gemm(m, n, kernel.tensors[node.inputs[0]].shape[-1], math.prod(batch), dtype)

    def operand_a(self, kernel: Graph, node: Node, space: Space):
        a = node.inputs[0]
        return list(broadcast_index(_batch(kernel, node, space) + (space.var("m"), space.var("ka")),
                                    kernel.tensors[a].shape)), []

    def operand_b(self, kernel: Graph, node: Node, space: Space) -> list[Ix]:
        b = node.inputs[1]
        return list(broadcast_index(_batch(kernel, node, space) + (space.var("kb"), space.var("n")),
                                    kernel.tensors[b].shape))

    def product_index(self, kernel: Graph, node: Node, space: Space) -> tuple[Ix, ...]:
        return _batch(kernel, node, space) + (space.var("m"), space.var("n"))


def _batch(kernel: Graph, node: Node, space: Space) -> tuple[Ix, ...]:
    """One index per batch axis of the product: the program's problem ``batch`` split over them."""
    return space.unflatten(space.var("batch"), kernel.tensors[node.output].shape[:-2])


MATMUL = MatmulClass()
