"""The tiled matrix-product kernel shared by ``matmul.py`` and ``conv.py``: one skeleton, its launch variants.

Both kernel classes are a GEMM ``acc[M, N] = sum_k A[m, k] * B[k, n]`` over a
number of independent problems (matmul batch, conv group) with fused operand
and epilogue code (``fusion.py``). This module writes the part they share:
program ids in grouped order (GROUP_M rows of tiles share B tiles in L2), the
row/column ranges and masks, the K loop that zeroes masked operand elements
and calls ``tl.dot`` with a float32 accumulator, and the launch variants.

A class fills a ``GemmPlan`` with its own lines: ``head`` (after ``rm``/``rn``
and the problem index ``batch`` exist), ``k_lines`` (inside the loop, after
``rk``/``k_mask``), each operand's lines and value, and the epilogue.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from korch.backends.triton import scalar
from korch.backends.triton.fusion import SIDE_BLOCK, Counter, Emitter, Params, Tile, Unsupported, Val
from korch.backends.triton.generated import GeneratedKernel, Variant
from korch.ir import ops
from korch.ir.graph import Graph, Node

# tl.dot's handling of float32 operands: "tf32" (tensor cores, ~3e-4 relative error), "tf32x3" or "ieee".
DEFAULT_PRECISION = "tf32"
GROUP_M = 8
DOT_DTYPES = ("float16", "float32")

A_TILE = Tile(masks={"m": "m_mask[:, None]", "k": "k_mask[None, :]"}, zeros={"m": "zm[:, None]", "k": "zk[None, :]"})
B_TILE = Tile(masks={"k": "k_mask[:, None]", "n": "n_mask[None, :]"}, zeros={"k": "zk[:, None]", "n": "zn[None, :]"})
OUT_TILE = Tile(masks={"m": "m_mask[:, None]", "n": "n_mask[None, :]"}, zeros={"m": "zm[:, None]", "n": "zn[None, :]"})


def linear_node(kernel: Graph, op) -> Node:
    """The kernel's one ``op`` node; refuses kernels with anything but elementwise and layout primitives besides."""
    found = [n for n in kernel.nodes if n.op is op]
    if len(found) != 1:
        raise Unsupported(f"{len(found)} {op.value} primitives (the class builds exactly one)")
    for node in kernel.nodes:
        if node is not found[0] and node.op not in ops.ELEMENTWISE and node.op not in ops.LAYOUT:
            raise Unsupported(f"{node.op.value} cannot be fused with a {op.value}")
    return found[0]


def operand_dtype(kernel: Graph, node: Node) -> str:
    kinds = {kernel.tensors[x].dtype for x in node.inputs[:2]}
    if len(kinds) != 1 or not kinds <= set(DOT_DTYPES):
        raise Unsupported(f"{node.op.value} on {sorted(kinds)} (float16/float32 only)")
    return kinds.pop()


@dataclasses.dataclass
class GemmPlan:
    kernel_class: str
    m: int
    n: int
    k: int
    problems: int                 # independent GEMMs (batch, groups), the slowest program index
    dtype: str                    # operand dtype given to tl.dot
    params: Params
    names: Counter
    head: list[str] = dataclasses.field(default_factory=list)
    k_lines: list[str] = dataclasses.field(default_factory=list)
    operands: list[tuple[Emitter, Val]] = dataclasses.field(default_factory=list)
    zero_unless: list[str] = dataclasses.field(default_factory=list)   # conditions for A (conv padding)
    side: list[str] = dataclasses.field(default_factory=list)          # writing outputs free of the product
    side_elements: int = 0
    epilogue: list[str] = dataclasses.field(default_factory=list)


def operand_tile(emitter: Emitter, value: Val, which: str, dtype: str, zero_unless: Sequence[str] = ()) -> list[str]:
    """Lines making the operand variable ``a``/``b``: the full tile, zero where k is masked (and where any
    ``zero_unless`` condition fails: conv padding), in the dot dtype. A masked load is zero there already."""
    full = frozenset(emitter.tile.masks)
    shape = "(BLOCK_M, BLOCK_K)" if which == "a" else "(BLOCK_K, BLOCK_N)"
    expr = value.expr
    if not (expr in emitter.loads and value.dims == full):
        keep = " & ".join([emitter.tile.masks["k"], *zero_unless])
        expr = f"tl.where({keep}, {expr}, 0.0)"
        if value.dims != full:
            expr = f"tl.broadcast_to({expr}, {shape})"
    return emitter.lines + [f"{which} = {expr}.to({scalar.tl_dtype(dtype)})"]


def _body(plan: GemmPlan, precision: str) -> list[str]:
    (ea, va), (eb, vb) = plan.operands
    dot_options = f', input_precision="{precision}"' if plan.dtype == "float32" else ""
    loop = [*plan.k_lines, *operand_tile(ea, va, "a", plan.dtype, plan.zero_unless),
            *operand_tile(eb, vb, "b", plan.dtype),
            f"acc = tl.dot(a, b, acc{dot_options})"]
    gemm = [
        "batch = pid // (num_m * num_n)",
        "tile = pid % (num_m * num_n)",
        "width = GROUP_M * num_n",
        "first_m = (tile // width) * GROUP_M",
        "group_rows = tl.minimum(num_m - first_m, GROUP_M)",
        "pid_m = first_m + (tile % width) % group_rows",
        "pid_n = (tile % width) // group_rows",
        "rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)",
        "rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)",
        f"m_mask = rm < {plan.m}",
        f"n_mask = rn < {plan.n}",
        "zm = tl.full([BLOCK_M], 0, tl.int32)",
        "zn = tl.full([BLOCK_N], 0, tl.int32)",
        "zk = tl.full([BLOCK_K], 0, tl.int32)",
        *plan.head,
        "acc = tl.full((BLOCK_M, BLOCK_N), 0.0, tl.float32)",
        f"for k0 in range(0, {plan.k}, BLOCK_K):",
        *["    " + line for line in ["rk = k0 + tl.arange(0, BLOCK_K)", f"k_mask = rk < {plan.k}", *loop]],
        *plan.epilogue,
    ]
    head = ["pid = tl.program_id(0)", f"num_m = ({plan.m} + BLOCK_M - 1) // BLOCK_M",
            f"num_n = ({plan.n} + BLOCK_N - 1) // BLOCK_N"]
    if not plan.side:
        return head + gemm
    side = [f"re = (pid - num_m * num_n * {plan.problems}) * {SIDE_BLOCK} + tl.arange(0, {SIDE_BLOCK})",
            f"ze = tl.full([{SIDE_BLOCK}], 0, tl.int32)", *plan.side]
    return (head + [f"if pid < num_m * num_n * {plan.problems}:"] + ["    " + line for line in gemm]
            + ["else:"] + ["    " + line for line in side])


def generated(plan: GemmPlan, precision: str = DEFAULT_PRECISION) -> GeneratedKernel:
    entry = f"{plan.kernel_class}_kernel"
    arg_names, params = plan.params.signature()
    constexprs = ["BLOCK_M: tl.constexpr", "BLOCK_N: tl.constexpr", "BLOCK_K: tl.constexpr", "GROUP_M: tl.constexpr"]
    header = f"@triton.jit\ndef {entry}({', '.join(arg_names + constexprs)}):\n"
    source = scalar.PRELUDE + "\n\n" + header + "".join(f"    {line}\n" for line in _body(plan, precision))
    return GeneratedKernel(plan.kernel_class, source, entry, params, variants(plan))


def variants(plan: GemmPlan) -> tuple[Variant, ...]:
    out = []
    for bm, bn, bk, warps, stages in block_sizes(plan.m, plan.n, plan.k):
        grid = (-(-plan.m // bm) * -(-plan.n // bn) * plan.problems + -(-plan.side_elements // SIDE_BLOCK),)
        constexprs = (("BLOCK_M", bm), ("BLOCK_N", bn), ("BLOCK_K", bk), ("GROUP_M", GROUP_M))
        out.append(Variant(constexprs, grid, warps, stages))
    return tuple(out)


def block_sizes(m: int, n: int, k: int) -> list[tuple[int, int, int, int, int]]:
    """(BLOCK_M, BLOCK_N, BLOCK_K, warps, stages) choices, blocks clipped to the problem (tl.dot needs >= 16)."""
    configs = [(64, 64, 32, 4, 3), (128, 128, 32, 8, 3), (128, 64, 64, 4, 4), (64, 128, 32, 4, 4),
               (128, 256, 64, 8, 3), (32, 64, 32, 4, 2), (64, 32, 64, 4, 4), (16, 64, 64, 4, 3)]
    seen, out = set(), []
    for bm, bn, bk, warps, stages in configs:
        key = (_clip(bm, m), _clip(bn, n), _clip(bk, k))
        if key not in seen:
            seen.add(key)
            out.append((*key, warps if key[0] * key[1] >= 128 * 64 else 4, stages))
    return out


def _clip(block: int, size: int) -> int:
    return max(16, min(block, 1 << max(0, size - 1).bit_length()))


class GemmClass:
    """A kernel class whose kernels are one tiled GEMM: subclasses say how a kernel becomes a ``GemmPlan``."""

    name = "gemm"

    def __init__(self, input_precision: str = DEFAULT_PRECISION):
        self.input_precision = input_precision

    def claims(self, kernel: Graph) -> str | None:
        try:
            self._plan(kernel)
        except Unsupported as exc:
            return str(exc)
        return None

    def generate(self, kernel: Graph) -> GeneratedKernel:
        return generated(self._plan(kernel), self.input_precision)

    def _plan(self, kernel: Graph) -> GemmPlan:
        raise NotImplementedError
