"""The conv kernel class: one CONV as an implicit GEMM with fused input prologues and epilogues.

For ``x (N, C, *S)`` and ``w (OC, C/G, *R)`` with G groups, each group is a GEMM
(``tiled.py``; the group is the program's problem ``batch``) with rows
``m = (n, *o)`` (M = N * prod(O)), columns the group's output channels, and
``k = (c, *r)`` (K = C/G * prod(R)): both split into their digits by the index
space. The A tile is gathered from the input (``x[n, g*C/G + c, o*stride -
pad + r*dilation]``, zero outside the input) through any elementwise/layout
prologue (a reflect pad, a nearest upsample, a normalization); the B tile is
read from the weight (the digits of ``k`` over a plain weight merge back into
one contiguous offset). The epilogue sees the product with channel index
``g*OC/G + column`` (bias, activations, residual add, output layout) as in the
matmul class.

Depthwise convolutions (one input channel per group) would waste all but one
column of every tile: they are refused and left to other backends, as are
CONV_TRANSPOSE kernels.
"""

from __future__ import annotations

import math

from korch.backends.triton import tiled
from korch.backends.triton.generated import GeneratedKernel
from korch.backends.triton.indexing import Ix, Space
from korch.backends.triton.kernel_class import Refuse
from korch.ir.graph import Graph, Node
from korch.ir.ops import Op


class ConvClass(tiled.GemmClass):
    name = "conv"
    op = Op.CONV

    def generate(self, kernel: Graph) -> GeneratedKernel:
        if any(n.op is Op.CONV_TRANSPOSE for n in kernel.nodes):
            raise Refuse("ConvTranspose is not generated (left to other backends)")
        return super().generate(kernel)

    def problem(self, kernel: Graph, node: Node, dtype: str) -> tiled.Gemm:
        w, out = kernel.tensors[node.inputs[1]], kernel.tensors[node.output]
        groups = node.attrs["group"]
        if w.shape[1] == 1 and groups > 1:
            raise Refuse("depthwise convolution (left to other backends)")
        m = out.shape[0] * math.prod(out.shape[2:])
        return tiled.Gemm(m, w.shape[0] // groups, w.shape[1] * math.prod(w.shape[2:]), groups, dtype)

    def operand_a(self, kernel: Graph, node: Node, space: Space):
        """The input index of the A tile and the conditions that it lies inside the (unpadded) input."""
        x, w = kernel.tensors[node.inputs[0]], kernel.tensors[node.inputs[1]]
        strides, pads, dilations = node.attrs["strides"], node.attrs["pads"], node.attrs["dilations"]
        rows = _rows(kernel, node, space)
        c, *window = space.unflatten(space.var("ka"), w.shape[1:])
        index, inside = [rows[0], _channel(space, w.shape[1], c)], []
        rank = len(window)
        for j, (o, r) in enumerate(zip(rows[1:], window)):
            begin, end = pads[j], pads[j + rank]
            i = space.add(space.mul(o, strides[j]), space.add_const(space.mul(r, dilations[j]), -begin))
            index.append(i)
            if begin > 0 or end > 0:
                text = space.render(i)
                inside += [(f"{text} >= 0", i.vars), (f"{text} < {x.shape[2 + j]}", i.vars)]
        return index, inside

    def operand_b(self, kernel: Graph, node: Node, space: Space) -> list[Ix]:
        w = kernel.tensors[node.inputs[1]]
        per_group_out = w.shape[0] // node.attrs["group"]
        return [_channel(space, per_group_out, space.var("n")), *space.unflatten(space.var("kb"), w.shape[1:])]

    def product_index(self, kernel: Graph, node: Node, space: Space) -> tuple[Ix, ...]:
        per_group_out = kernel.tensors[node.inputs[1]].shape[0] // node.attrs["group"]
        rows = _rows(kernel, node, space)
        return (rows[0], _channel(space, per_group_out, space.var("n")), *rows[1:])


def _rows(kernel: Graph, node: Node, space: Space) -> tuple[Ix, ...]:
    """The (batch, *output position) of each tile row ``m``."""
    out = kernel.tensors[node.output].shape
    return space.unflatten(space.var("m"), out[:1] + out[2:])


def _channel(space: Space, per_group: int, column: Ix) -> Ix:
    """The channel of a tile column: ``g * per_group + column`` for the program's group ``g = batch``."""
    return space.add(space.mul(space.var("batch"), per_group), column)


CONV = ConvClass()
