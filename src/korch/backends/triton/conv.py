"""The conv kernel class: one CONV as an implicit GEMM with fused input prologues and epilogues.

For ``x (N, C, *S)`` and ``w (OC, C/G, *R)`` with G groups, each group is a GEMM
(``tiled.py``) with rows ``m = (n, *o)`` (M = N * prod(O)), columns the
group's output channels, and ``k = (c, *r)`` (K = C/G * prod(R)). The A tile is
gathered from the input (``x[n, g*C/G + c, o*stride - pad + r*dilation]``,
zero outside the input) through any elementwise/layout prologue (a reflect pad,
a nearest upsample, a normalization); the B tile is read from the weight. The
epilogue sees the product with channel index ``g*OC/G + column`` (bias,
activations, residual add, output layout) as in the matmul class.

Depthwise convolutions (one input channel per group) would waste all but one
column of every tile: they are refused and left to other backends, as are
CONV_TRANSPOSE kernels.
"""

from __future__ import annotations

import math

from korch.backends.triton import tiled
from korch.backends.triton.fusion import (
    ZERO,
    Counter,
    Derived,
    Emitter,
    Ix,
    Params,
    Unsupported,
    Val,
    contiguous_strides,
    epilogue,
    free_tensors,
    side_outputs,
)
from korch.ir.graph import Graph, Node
from korch.ir.ops import Op

A, K, M, N = frozenset("mk"), frozenset("k"), frozenset("m"), frozenset("n")


class ConvClass(tiled.GemmClass):
    name = "conv"

    def _plan(self, kernel: Graph) -> tiled.GemmPlan:
        if any(n.op is Op.CONV_TRANSPOSE for n in kernel.nodes):
            raise Unsupported("ConvTranspose is not generated (left to other backends)")
        node = tiled.linear_node(kernel, Op.CONV)
        dtype = tiled.operand_dtype(kernel, node)
        x, w = (kernel.tensors[name] for name in node.inputs)
        out = kernel.tensors[node.output]
        groups = node.attrs["group"]
        per_group_in, per_group_out = w.shape[1], w.shape[0] // groups
        if per_group_in == 1 and groups > 1:
            raise Unsupported("depthwise convolution (left to other backends)")
        spatial = out.shape[2:]
        m, k = out.shape[0] * math.prod(spatial), per_group_in * math.prod(w.shape[2:])
        plan = tiled.GemmPlan("conv", m, per_group_out, k, groups, dtype, Params(kernel), Counter())
        plan.head = _split("rm", "r", out.shape[:1] + spatial)
        plan.k_lines = _split("rk", "k", w.shape[1:])
        free = free_tensors(kernel, node.output)
        a = Emitter(kernel, plan.params, tiled.A_TILE, plan.names, free)
        index, valid = self._input_index(node, x.shape, spatial, w.shape[2:], plan.k_lines)
        plan.operands.append((a, a.value(node.inputs[0], index, valid)))
        plan.zero_unless = [v.expr for v in valid]
        b = Emitter(kernel, plan.params, tiled.B_TILE, plan.names, free)
        plan.operands.append((b, b.value(node.inputs[1], self._weight_index(kernel, node, groups, per_group_out))))
        channel = _channel(groups, per_group_out, "rn[None, :]", N)
        rows = [Ix("r0[:, None]", M)] + [Ix(f"r{j + 1}[:, None]", M) for j in range(len(spatial))]
        start = Derived(Val("acc", frozenset("mn")), (rows[0], channel, *rows[1:]))
        out_emitter = Emitter(kernel, plan.params, tiled.OUT_TILE, plan.names, free)
        plan.epilogue = epilogue(kernel, out_emitter, node.output, start, node)
        plan.side, plan.side_elements = side_outputs(kernel, plan.params, plan.names, free)
        return plan

    @staticmethod
    def _input_index(node: Node, x_shape, spatial, window, k_lines: list[str]) -> tuple[list[Ix], list[Ix]]:
        """The input index of the A tile and the conditions that it lies inside the (unpadded) input."""
        strides, pads, dilations = node.attrs["strides"], node.attrs["pads"], node.attrs["dilations"]
        rank = len(spatial)
        groups = node.attrs["group"]
        index = [Ix("r0[:, None]", M), _channel(groups, x_shape[1] // groups, "k0[None, :]", K)]
        valid = []
        for j in range(rank):
            size, begin, end = x_shape[2 + j], pads[j], pads[j + rank]
            k_lines.append(f"i{j} = r{j + 1}[:, None] * {strides[j]} + (k{j + 1} * {dilations[j]} - {begin})[None, :]")
            index.append(Ix(f"i{j}", A))
            if begin > 0 or end > 0:
                valid.append(Ix(f"(i{j} >= 0) & (i{j} < {size})", A))
        return index, valid

    @staticmethod
    def _weight_index(kernel: Graph, node: Node, groups: int, per_group_out: int) -> list[Ix]:
        w = kernel.tensors[node.inputs[1]]
        channel = _channel(groups, per_group_out, "rn[None, :]", N)
        if node.inputs[1] not in kernel.producers():
            # a plain (OC, C/G, *R) array: its k axes are contiguous, so the flat k is the offset past the
            # channel; it goes on the last axis of size > 1 (the later ones have stride 1 too)
            index = [channel] + [ZERO] * (w.rank - 1)
            inner = [j for j in range(1, w.rank) if w.shape[j] != 1]
            if inner:
                index[inner[-1]] = Ix("rk[:, None]", K)
            return index
        return [channel] + [Ix(f"k{j}[:, None]", K) for j in range(w.rank - 1)]


def _channel(groups: int, per_group: int, column: str, dims: frozenset[str]) -> Ix:
    """The channel of a tile column: ``g * per_group + column`` for the program's group ``g = batch``."""
    return Ix(column, dims) if groups == 1 else Ix(f"(batch * {per_group} + {column})", dims)


def _split(flat: str, prefix: str, sizes) -> list[str]:
    """Lines naming ``prefix{i}`` the row-major coordinates of the flat index ``flat`` in ``sizes``."""
    lines = []
    for i, (size, stride) in enumerate(zip(sizes, contiguous_strides(sizes))):
        part = f"{flat} // {stride}" if stride != 1 else flat
        lines.append(f"{prefix}{i} = {part}" if i == 0 else f"{prefix}{i} = ({part}) % {size}")
    return lines


CONV = ConvClass()
