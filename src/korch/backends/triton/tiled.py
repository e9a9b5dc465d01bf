"""The tiled matrix-product kernel shared by ``matmul.py`` and ``conv.py``: one skeleton, its epilogue, its variants.

Both kernel classes are a GEMM ``acc[M, N] = sum_k A[m, k] * B[k, n]`` over a
number of independent problems (matmul batch, conv group), written with the
one emitter (``emit.py``) over the index space of a tile: ``m`` (``[BLOCK_M,
1]``) and ``n`` (``[1, BLOCK_N]``) are the tile's rows and columns, ``ka``
(``[1, BLOCK_K]``) and ``kb`` (``[BLOCK_K, 1]``) the K positions of the current
step as the A and the B tile see them, and ``batch`` the program's problem.

This module writes what the classes share: program ids in grouped order
(GROUP_M rows of tiles share B tiles in L2), the K loop that zeroes masked
operand elements and calls ``tl.dot`` with a float32 accumulator, the
epilogue, the outputs free of the product, and the launch variants. A class
(``GemmClass``) says how a kernel is a GEMM and gives the index of each operand
and of the product in terms of the tile's variables.

* **Operands (prologues).** ``Emitter.value`` computes an operand where it is
  read, inside the K loop: layout primitives become index arithmetic,
  elementwise primitives expressions (a scale, a transpose as K^T, a reflect
  pad, a nearest upsample).
* **Epilogue.** Tensors computed from the product are carried forwards
  (``Derived``): each holds its value over the tile, the index in its own
  shape of every tile element, and the condition under which that element
  exists (a slice of the product). A transpose or reshape of the product only
  changes that index: the output layout is done in the store addresses.
* **Side outputs.** Outputs that do not depend on the product (an operand the
  model also reads elsewhere) are written by extra programs over
  ``SIDE_BLOCK`` flat elements each.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Sequence

from korch import config, precision
from korch.backends.triton import scalar, tiles
from korch.backends.triton.emit import Emitter, Val
from korch.backends.triton.generated import GeneratedKernel, Variant
from korch.backends.triton.indexing import Ix, Space, broadcast_index
from korch.backends.triton.kernel_class import KernelClass, Refuse, check_ops
from korch.ir.graph import Graph, Node
from korch.ir.ops import ELEMENTWISE, LAYOUT, Op

GROUP_M = 8
DOT_DTYPES = ("float16", "float32")
SIDE_BLOCK = 1024
# Offsets are int32: a tensor this large would overflow them.
MAX_ELEMENTS = 2**31 - 1
CONSTEXPRS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M")
# Each operand tile: the variables it varies along and its shape (its K variable is k<operand>: ka, kb).
OPERAND_TILES = {"a": (frozenset({"m", "ka"}), "(BLOCK_M, BLOCK_K)"), "b": (frozenset({"kb", "n"}), "(BLOCK_K, BLOCK_N)")}


@dataclasses.dataclass(frozen=True)
class Gemm:
    """How a kernel is a GEMM: its sizes, its independent problems, and the operand dtype given to ``tl.dot``."""

    m: int
    n: int
    k: int
    problems: int
    dtype: str


@dataclasses.dataclass(frozen=True)
class Derived:
    """A tensor computed from the product over the tile: its value, its own index of each tile element, and
    where that element exists (None: everywhere in range)."""

    value: Val
    index: tuple[Ix, ...]
    cond: Val | None = None


def linear_node(kernel: Graph, op: Op) -> Node:
    """The kernel's one ``op`` node; refuses kernels with anything but elementwise and layout primitives besides."""
    found = [n for n in kernel.nodes if n.op is op]
    if len(found) != 1:
        raise Refuse(f"{len(found)} {op.value} primitives (the class builds exactly one)")
    for node in kernel.nodes:
        if node is not found[0] and node.op not in ELEMENTWISE and node.op not in LAYOUT:
            raise Refuse(f"{node.op.value} cannot be fused with a {op.value}")
    return found[0]


def operand_dtype(kernel: Graph, node: Node) -> str:
    kinds = {kernel.tensors[x].dtype for x in node.inputs[:2]}
    if len(kinds) != 1 or not kinds <= set(DOT_DTYPES):
        raise Refuse(f"{node.op.value} on {sorted(kinds)} (float16/float32 only)")
    return kinds.pop()


def free_tensors(kernel: Graph, product: str) -> frozenset[str]:
    """Tensors that do not depend on ``product`` (computed where they are read)."""
    derived = {product}
    for node in kernel.nodes:
        if any(x in derived for x in node.inputs):
            derived.update(node.outputs)
    return frozenset(kernel.tensors) - derived


class GemmClass(KernelClass):
    """A kernel class whose kernels are one tiled GEMM around the primitive ``op``; subclasses give the indices."""

    name = "gemm"
    op: Op

    def __init__(self, input_precision: str | None = None):
        self._input_precision = input_precision

    @property
    def input_precision(self) -> str:
        """``tl.dot``'s handling of float32 operands: as given, else the run's precision policy's."""
        return self._input_precision or precision.current().dot_input_precision

    # --- what a class says ----------------------------------------------------------------------------------

    def problem(self, kernel: Graph, node: Node, dtype: str) -> Gemm:
        raise NotImplementedError

    def operand_a(self, kernel: Graph, node: Node, space: Space) -> tuple[list[Ix], list[tuple[str, frozenset[str]]]]:
        """The index of A at (``m``, ``ka``) and the conditions for it to lie inside its input (conv padding)."""
        raise NotImplementedError

    def operand_b(self, kernel: Graph, node: Node, space: Space) -> list[Ix]:
        """The index of B at (``kb``, ``n``)."""
        raise NotImplementedError

    def product_index(self, kernel: Graph, node: Node, space: Space) -> tuple[Ix, ...]:
        """The index of the product at (``m``, ``n``)."""
        raise NotImplementedError

    # --- the kernel ---------------------------------------------------------------------------------------

    def generate(self, kernel: Graph) -> GeneratedKernel:
        node = linear_node(kernel, self.op)
        gemm = self.problem(kernel, node, operand_dtype(kernel, node))
        check_ops(kernel, ELEMENTWISE | LAYOUT | {self.op})
        space = Space()
        space.add_var("batch", gemm.problems, masked=False)
        for var, extent in (("m", gemm.m), ("n", gemm.n), ("ka", gemm.k), ("kb", gemm.k)):
            space.add_var(var, extent)
        em = Emitter(kernel, space)  # operands and free tensors never reach the product: no handler for it
        free = free_tensors(kernel, node.output)
        side = [name for name in kernel.outputs if name in free]
        tile_count = f"num_m * num_n * {gemm.problems}"
        em.line("pid = tl.program_id(0)")
        em.line(f"num_m = ({gemm.m} + BLOCK_M - 1) // BLOCK_M")
        em.line(f"num_n = ({gemm.n} + BLOCK_N - 1) // BLOCK_N")
        with _block(em, f"if pid < {tile_count}:" if side else None):
            self._gemm(em, node, gemm)
        side_elements = 0
        if side:
            with _block(em, "else:"):
                side_elements = _side_outputs(em, side, tile_count)
        if any(kernel.tensors[t].numel > MAX_ELEMENTS for t in em.pointers):
            raise Refuse("tensor too large for int32 offsets")
        rate = tiles.matrix_rate(gemm.dtype, self.input_precision)
        return em.generated(self.name, CONSTEXPRS, variants(gemm, side_elements, rate), entry=f"{self.name}_kernel")

    def _gemm(self, em: Emitter, node: Node, gemm: Gemm) -> None:
        for line in ("batch = pid // (num_m * num_n)",
                     "tile = pid % (num_m * num_n)",
                     "width = GROUP_M * num_n",
                     "first_m = (tile // width) * GROUP_M",
                     "group_rows = tl.minimum(num_m - first_m, GROUP_M)",
                     "pid_m = first_m + (tile % width) % group_rows",
                     "pid_n = (tile % width) // group_rows",
                     "m = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M))[:, None]",
                     "n = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N))[None, :]",
                     f"m_mask = m < {gemm.m}",
                     f"n_mask = n < {gemm.n}",
                     "acc = tl.full((BLOCK_M, BLOCK_N), 0.0, tl.float32)"):
            em.line(line)
        with _block(em, f"for k0 in range(0, {gemm.k}, BLOCK_K):"):
            for line in ("rk = k0 + tl.arange(0, BLOCK_K)", "ka = rk[None, :]", "kb = rk[:, None]",
                         f"ka_mask = ka < {gemm.k}", f"kb_mask = kb < {gemm.k}"):
                em.line(line)
            a_index, a_inside = self.operand_a(em.kernel, node, em.space)
            inside = em.condition(a_inside)
            _operand_tile(em, "a", em.value(node.inputs[0], a_index, inside), inside, gemm.dtype)
            _operand_tile(em, "b", em.value(node.inputs[1], self.operand_b(em.kernel, node, em.space)), None, gemm.dtype)
            precision = f', input_precision="{self.input_precision}"' if gemm.dtype == "float32" else ""
            em.line(f"acc = tl.dot(a, b, acc{precision})")
        product = Val("acc", "float32", frozenset({"m", "n"}))
        _epilogue(em, node, Derived(product, self.product_index(em.kernel, node, em.space)))


@contextlib.contextmanager
def _block(em: Emitter, header: str | None):
    """Lines under ``header`` (an ``if``, ``else`` or ``for``), one level deeper and in a scope of their own
    (what they define is not visible after them); no header: unchanged."""
    if header:
        em.line(header)
        em.depth += 1
        em.push()
    yield
    if header:
        em.pop()
        em.depth -= 1


def _operand_tile(em: Emitter, which: str, value: Val, inside: Val | None, dtype: str) -> None:
    """The operand variable ``a``/``b``: the full tile, zero where k is masked (and outside ``inside``), in the
    dot dtype. A masked load over the whole tile is zero there already."""
    tile_vars, shape = OPERAND_TILES[which]
    full = tile_vars <= value.vars
    code = value.code
    if not (full and code in em.loads):
        keep = " & ".join([f"k{which}_mask"] + ([inside.code] if inside else []))
        code = f"tl.where({keep}, {code}, 0.0)"
        if not full:
            code = f"tl.broadcast_to({code}, {shape})"
    em.line(f"{which} = {code}.to({scalar.tl_dtype(dtype)})")


def _epilogue(em: Emitter, node: Node, start: Derived) -> None:
    """Carry the product through the nodes after ``node`` that depend on it; store the kernel's outputs among them."""
    kernel = em.kernel
    derived = {node.output: start}
    for later in kernel.nodes[kernel.nodes.index(node) + 1:]:
        if any(x in derived for x in later.inputs):
            derived[later.output] = _forward(em, later, derived)
    for name in kernel.outputs:
        if name in derived:
            d = derived[name]
            em.store(name, d.index, d.value, d.cond)


def _forward(em: Emitter, node: Node, derived: dict[str, Derived]) -> Derived:
    kernel, sp = em.kernel, em.space
    shape = kernel.tensors[node.output].shape
    if node.op in ELEMENTWISE:
        return _forward_elementwise(em, node, derived, shape)
    if node.inputs[0] not in derived or any(x in derived for x in node.inputs[1:]):
        raise Refuse(f"{node.op.value} of the product cannot be fused")
    d = derived[node.inputs[0]]
    src = kernel.tensors[node.inputs[0]].shape
    if node.op is Op.TRANSPOSE:
        return Derived(d.value, tuple(d.index[p] for p in node.attrs["perm"]), d.cond)
    if node.op is Op.RESHAPE:
        return Derived(d.value, tuple(sp.reshape(d.index, src, shape)), d.cond)
    if node.op is Op.SLICE and all(s == 1 for s in node.attrs["steps"]):
        index, inside = [], []
        for ix, start, size, full in zip(d.index, node.attrs["starts"], shape, src):
            index.append(sp.add_const(ix, -start))
            if size != full:
                text = sp.render(index[-1])
                inside += [(f"{text} >= 0", index[-1].vars), (f"{text} < {size}", index[-1].vars)]
        return Derived(d.value, tuple(index), em.both(d.cond, em.condition(inside)))
    raise Refuse(f"{node.op.value} of the product cannot be fused")


def _forward_elementwise(em: Emitter, node: Node, derived: dict[str, Derived], shape: tuple[int, ...]) -> Derived:
    kernel = em.kernel
    mine = [derived[x] for x in node.inputs if x in derived]
    first = mine[0]
    for x in node.inputs:
        if x in derived and (kernel.tensors[x].shape != shape or derived[x].index != first.index):
            raise Refuse("the epilogue broadcasts or re-indexes the product")
    cond = None
    for d in mine:
        if d.cond is not None and (cond is None or d.cond.code != cond.code):
            cond = em.both(cond, d.cond)
    operands = [derived[x].value if x in derived else
                em.value(x, broadcast_index(first.index, kernel.tensors[x].shape), cond) for x in node.inputs]
    return Derived(em.elementwise(node, operands), first.index, cond)


def _side_outputs(em: Emitter, names: Sequence[str], tiles: str) -> int:
    """Write the outputs ``names`` (free of the product) by flat element; the most elements of one."""
    em.line(f"re = (pid - {tiles}) * {SIDE_BLOCK} + tl.arange(0, {SIDE_BLOCK})")
    groups: dict[int, list[str]] = {}
    for name in names:
        groups.setdefault(em.kernel.tensors[name].numel, []).append(name)
    for g, (numel, group) in enumerate(groups.items()):
        var = em.space.add_var(f"s{g}", numel)
        em.line(f"s{g} = re")
        em.line(f"s{g}_mask = s{g} < {numel}")
        for name in group:
            index = em.space.unflatten(var, em.kernel.tensors[name].shape)
            em.store(name, index, em.value(name, index))
    return max(groups)


def variants(gemm: Gemm, side_elements: int, matrix_flops: float) -> tuple[Variant, ...]:
    """The launch variants: the model's best tiles at ``matrix_flops`` (``tiles.py``, ``config.launch_variants`` of
    them), or with ``launch_variants = 0`` the eight fixed shapes of ``block_sizes``."""
    if config.launch_variants > 0:
        chosen = tiles.best_tiles(gemm.m, gemm.n, gemm.k, gemm.problems, gemm.dtype, config.launch_variants,
                                  matrix_flops)
        shapes = [(t.block_m, t.block_n, t.block_k, t.warps, t.stages) for t in chosen]
    else:
        shapes = block_sizes(gemm.m, gemm.n, gemm.k)
    out = []
    for bm, bn, bk, warps, stages in shapes:
        grid = (-(-gemm.m // bm) * -(-gemm.n // bn) * gemm.problems + -(-side_elements // SIDE_BLOCK),)
        constexprs = (("BLOCK_M", bm), ("BLOCK_N", bn), ("BLOCK_K", bk), ("GROUP_M", GROUP_M))
        out.append(Variant(constexprs, grid, warps, stages))
    return tuple(out)


def block_sizes(m: int, n: int, k: int) -> list[tuple[int, int, int, int, int]]:
    """The eight fixed (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages) shapes korch tried before ``tiles.py``, clipped to
    the problem (tl.dot needs >= 16)."""
    configs = [(64, 64, 32, 4, 3), (128, 128, 32, 8, 3), (128, 64, 64, 4, 4), (64, 128, 32, 4, 4),
               (128, 256, 64, 8, 3), (32, 64, 32, 4, 2), (64, 32, 64, 4, 4), (16, 64, 64, 4, 3)]
    seen, out = set(), []
    for bm, bn, bk, warps, stages in configs:
        key = (tiles.clip_side(bm, m), tiles.clip_side(bn, n), tiles.clip_side(bk, k))
        if key not in seen:
            seen.add(key)
            out.append((*key, warps if key[0] * key[1] >= 128 * 64 else 4, stages))
    return out
