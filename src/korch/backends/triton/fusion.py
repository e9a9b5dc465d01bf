"""Fused elementwise and layout code around a matrix product: index arithmetic and value expressions.

The tiled kernels (``matmul.py``, ``conv.py``) compute one linear primitive per
tile; every other primitive of the kernel is fused around it as Triton source
written here.

* **Operands (prologues).** A tensor that does not depend on the product is
  computed where it is read: ``Emitter.value(tensor, index)`` walks its
  producers backwards, turning each layout primitive into index arithmetic
  (transpose permutes, reshape re-linearizes, slice/broadcast/pad/gather/concat
  remap, with masks where an index can fall outside its input) and each
  elementwise primitive into a ``scalar.expression``; kernel inputs and large
  constants become masked loads, scalar constants literals.
* **Epilogues.** Tensors computed from the product are carried forwards
  (``Epilogue``): each holds its value over the tile and the index, in its own
  shape, of every tile element. A transpose or reshape of the product only
  changes that index (the output layout is done in the store addresses).

Indices are ``Ix``: a Triton expression and the tile dimensions it varies
along (names given by a ``Tile``), so that loads of a bias stay ``[1, BLOCK_N]``
and masks cover exactly the dimensions a load varies along.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from korch.backends.triton import scalar
from korch.backends.triton.generated import Param
from korch.ir import dtypes, ops
from korch.ir.graph import Graph, Node
from korch.ir.ops import Op

# Offsets are int32: a tensor this large would overflow them.
MAX_ELEMENTS = 2**31 - 1
# Layout primitives an operand's index can be pushed through.
OPERAND_LAYOUT = frozenset({Op.TRANSPOSE, Op.RESHAPE, Op.SLICE, Op.BROADCAST, Op.PAD, Op.GATHER, Op.CONCAT})


class Unsupported(Exception):
    """The generator cannot build this kernel; the message is the claim's refusal reason."""


@dataclasses.dataclass(frozen=True)
class Ix:
    """An integer Triton expression and the tile dimensions it varies along."""

    expr: str
    dims: frozenset[str] = frozenset()


ZERO = Ix("0")


def const(value: int) -> Ix:
    return Ix(str(int(value)))


def add(a: Ix, b: Ix | int) -> Ix:
    b = const(b) if isinstance(b, int) else b
    if a.expr == "0":
        return b
    if b.expr == "0":
        return a
    return Ix(f"({a.expr} + {b.expr})", a.dims | b.dims)


def scale(a: Ix, factor: int) -> Ix:
    if factor == 0 or a.expr == "0":
        return ZERO
    return a if factor == 1 else Ix(f"{a.expr} * {factor}", a.dims)


def apply(template: str, *args: Ix) -> Ix:
    """``template.format(*exprs)`` varying along every argument's dimensions."""
    return Ix(template.format(*(a.expr for a in args)), frozenset().union(*(a.dims for a in args)))


def contiguous_strides(shape: Sequence[int]) -> list[int]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= size
    return strides[::-1]


def linear(index: Sequence[Ix], shape: Sequence[int]) -> Ix:
    """The row-major offset of ``index`` in a contiguous tensor of ``shape``."""
    total = ZERO
    for ix, size, stride in zip(index, shape, contiguous_strides(shape)):
        if size != 1:
            total = add(total, scale(ix, stride))
    return total


def _groups(src: Sequence[int], dst: Sequence[int]) -> list[tuple[list[int], list[int]]]:
    """Runs of non-unit axes of ``src`` and ``dst`` whose sizes multiply to the same number."""
    s = [i for i, n in enumerate(src) if n != 1]
    d = [j for j, n in enumerate(dst) if n != 1]
    groups, gs, gd, ps, pd = [], [], [], 1, 1
    while s or d:
        if ps <= pd and s:
            i = s.pop(0)
            gs.append(i)
            ps *= src[i]
        else:
            j = d.pop(0)
            gd.append(j)
            pd *= dst[j]
        if ps == pd and gs and gd:
            groups.append((gs, gd))
            gs, gd, ps, pd = [], [], 1, 1
    return groups


def reindex(index: Sequence[Ix], src: Sequence[int], dst: Sequence[int]) -> list[Ix]:
    """The index in shape ``dst`` of the element at ``index`` of shape ``src`` (same row-major order)."""
    out = [ZERO] * len(dst)
    for gs, gd in _groups(src, dst):
        if len(gs) == 1 and len(gd) == 1:
            out[gd[0]] = index[gs[0]]
            continue
        flat = linear([index[i] for i in gs], [src[i] for i in gs])
        sizes = [dst[j] for j in gd]
        for j, size, stride in zip(gd, sizes, contiguous_strides(sizes)):
            part = apply(f"({{0}} // {stride})", flat) if stride != 1 else flat
            out[j] = apply(f"({{0}} % {size})", part) if j != gd[0] else part
    return out


def broadcast_index(index: Sequence[Ix], out_shape: Sequence[int], in_shape: Sequence[int]) -> list[Ix]:
    """The index of an operand of ``in_shape`` numpy-broadcast to ``out_shape`` at ``index``."""
    lead = len(out_shape) - len(in_shape)
    return [ZERO if n == 1 else index[lead + i] for i, n in enumerate(in_shape)]


def literal(value, dtype: str) -> str:
    v = np.asarray(value).reshape(()).item()
    if dtype == "bool":
        return "True" if v else "False"
    if dtypes.is_int(dtype):
        return str(int(v))
    if math.isnan(v):
        return "float('nan')"
    if math.isinf(v):
        return "float('inf')" if v > 0 else "float('-inf')"
    return repr(float(v))


@dataclasses.dataclass(frozen=True)
class Val:
    """A computed Triton value: its expression (a variable or literal) and the tile dimensions it varies along."""

    expr: str
    dims: frozenset[str]


@dataclasses.dataclass(frozen=True)
class Tile:
    """The tile a region computes on: the mask and a zero index for each tile dimension."""

    masks: dict[str, str]
    zeros: dict[str, str]

    def mask(self, dims: frozenset[str], extra: Sequence[Ix] = ()) -> str | None:
        terms = [self.masks[d] for d in sorted(dims)] + [f"({v.expr})" for v in extra]
        return " & ".join(terms) if terms else None


class Params:
    """The entry's tensor parameters: each graph tensor read or written once, with its source name."""

    def __init__(self, kernel: Graph):
        self.kernel = kernel
        self.names: dict[str, str] = {}

    def pointer(self, tensor: str) -> str:
        if tensor not in self.names:
            t = self.kernel.tensors[tensor]
            if t.dtype not in scalar.TRITON_TYPES:
                raise Unsupported(f"dtype {t.dtype} of {tensor} has no Triton type")
            if t.numel > MAX_ELEMENTS:
                raise Unsupported("tensor too large for int32 offsets")
            self.names[tensor] = f"p{len(self.names)}_{_identifier(tensor)}"
        return self.names[tensor]

    def signature(self) -> tuple[list[str], tuple[Param, ...]]:
        """Source parameter names and the matching ``Param``s, in order."""
        params = tuple(Param(name, "tensor", scalar.triton_type(self.kernel.tensors[name].dtype)) for name in self.names)
        return list(self.names.values()), params


def _identifier(name: str) -> str:
    clean = "".join(ch if ch.isalnum() else "_" for ch in name)[:24]
    return clean.strip("_") or "t"


class Counter:
    def __init__(self):
        self.n = 0

    def fresh(self, prefix: str) -> str:
        self.n += 1
        return f"{prefix}{self.n}"


class Emitter:
    """Writes the lines computing tensors that do not depend on the product, at given indices, in one region."""

    def __init__(self, kernel: Graph, params: Params, tile: Tile, names: Counter, free: frozenset[str]):
        self.kernel, self.params, self.tile, self.names, self.free = kernel, params, tile, names, free
        self.producers = kernel.producers()
        self.lines: list[str] = []
        self.loads: set[str] = set()   # variables that are masked loads (zero where masked)
        self._memo: dict[tuple, Val] = {}

    def value(self, tensor: str, index: Sequence[Ix], valid: Sequence[Ix] = ()) -> Val:
        """``tensor`` at ``index`` (only where every ``valid`` holds; elsewhere any value)."""
        key = (tensor, tuple(index), tuple(valid))
        if key not in self._memo:
            self._memo[key] = self._compute(tensor, list(index), list(valid))
        return self._memo[key]

    def assign(self, expr: str, dims: frozenset[str]) -> Val:
        name = self.names.fresh("v")
        self.lines.append(f"{name} = {expr}")
        return Val(name, dims)

    def _compute(self, tensor: str, index: list[Ix], valid: list[Ix]) -> Val:
        t = self.kernel.tensors[tensor]
        if tensor in self.kernel.constants and t.numel == 1:
            return Val(literal(self.kernel.constants[tensor], t.dtype), frozenset())
        node = self.producers.get(tensor)
        if node is None:
            return self._load(tensor, index, valid)
        if tensor not in self.free:
            raise Unsupported("an operand depends on the product")
        if node.op in ops.ELEMENTWISE:
            return self.elementwise(node, [self.value(x, broadcast_index(index, t.shape, self.kernel.tensors[x].shape),
                                                      valid) for x in node.inputs])
        if node.op in OPERAND_LAYOUT:
            return self._layout(node, index, valid)
        raise Unsupported(f"{node.op.value} cannot be fused into a matrix-product operand")

    def _load(self, tensor: str, index: list[Ix], valid: list[Ix]) -> Val:
        t = self.kernel.tensors[tensor]
        offset = linear(index, t.shape)
        mask_dims = offset.dims | frozenset().union(*(v.dims for v in valid))
        for dim in sorted(mask_dims - offset.dims):  # a pointer must vary along every dimension its mask does
            offset = add(offset, Ix(self.tile.zeros[dim], frozenset({dim})))
        mask = self.tile.mask(offset.dims, valid)
        pointer = f"{self.params.pointer(tensor)} + {offset.expr}"
        load = f"tl.load({pointer}, mask={mask}, other=0)" if mask else f"tl.load({pointer})"
        if scalar.compute_dtype(t.dtype) != t.dtype:
            load += f".to({scalar.tl_dtype(scalar.compute_dtype(t.dtype))})"
        loaded = self.assign(load, offset.dims)
        self.loads.add(loaded.expr)
        return loaded

    def elementwise(self, node: Node, args: Sequence[Val]) -> Val:
        operand_dtypes = [self.kernel.tensors[x].dtype for x in node.inputs]
        if not scalar.supported(node.op, operand_dtypes):
            raise Unsupported(f"elementwise {node.op.value} on {operand_dtypes} has no Triton expression")
        expr = scalar.expression(node.op, [a.expr for a in args], node.attrs, operand_dtypes)
        return self.assign(expr, frozenset().union(*(a.dims for a in args)))

    def _layout(self, node: Node, index: list[Ix], valid: list[Ix]) -> Val:
        x = node.inputs[0]
        src = self.kernel.tensors[x].shape
        out = self.kernel.tensors[node.output].shape
        a = node.attrs
        if node.op is Op.TRANSPOSE:
            inner = [ZERO] * len(src)
            for i, p in enumerate(a["perm"]):
                inner[p] = index[i]
            return self.value(x, inner, valid)
        if node.op is Op.RESHAPE:
            return self.value(x, reindex(index, out, src), valid)
        if node.op is Op.BROADCAST:
            return self.value(x, broadcast_index(index, out, src), valid)
        if node.op is Op.SLICE:
            inner = [add(scale(ix, step), start) for ix, start, step in zip(index, a["starts"], a["steps"])]
            return self.value(x, inner, valid)
        if node.op is Op.PAD:
            return self._pad(node, index, valid)
        if node.op is Op.GATHER:
            return self._gather(node, index, valid)
        return self._concat(node, index, valid)

    def _pad(self, node: Node, index: list[Ix], valid: list[Ix]) -> Val:
        x, shape, mode = node.inputs[0], self.kernel.tensors[node.inputs[0]].shape, node.attrs.get("mode", "constant")
        pads = node.attrs["pads"]
        rank = len(shape)
        inner, inside = [], []
        for axis, (ix, size) in enumerate(zip(index, shape)):
            begin, end = pads[axis], pads[axis + rank]
            if begin == 0 and end == 0:
                inner.append(ix)
                continue
            shifted = add(ix, -begin)
            if mode == "constant":
                inner.append(shifted)
                inside.append(apply(f"({{0}} >= 0) & ({{0}} < {size})", shifted))
            elif mode == "reflect":
                if begin >= size or end >= size:
                    raise Unsupported("reflect pad wider than its input")
                mirrored = apply("tl.abs({0})", shifted)
                inner.append(apply(f"tl.where({{0}} >= {size}, {2 * (size - 1)} - {{0}}, {{0}})", mirrored))
            elif mode == "edge":
                inner.append(apply(f"tl.minimum(tl.maximum({{0}}, 0), {size - 1})", shifted))
            elif mode == "wrap":
                inner.append(apply(f"((({{0}} % {size}) + {size}) % {size})", shifted))
            else:
                raise Unsupported(f"pad mode {mode}")
        if not inside:
            return self.value(x, inner, valid)
        value = self.value(x, inner, valid + inside)
        fill = self.value(node.inputs[1], [], valid) if len(node.inputs) > 1 and node.inputs[1] else Val("0", frozenset())
        condition = apply(" & ".join(f"({c.expr})" for c in inside), *inside)
        return self.assign(f"tl.where({condition.expr}, {value.expr}, {fill.expr})",
                           value.dims | condition.dims | fill.dims)

    def _gather(self, node: Node, index: list[Ix], valid: list[Ix]) -> Val:
        x, indices = node.inputs
        axis = node.attrs["axis"]
        if indices not in self.kernel.constants:
            raise Unsupported("gather indices are not a constant")
        table = np.asarray(self.kernel.constants[indices]).astype(np.int64)
        k = table.ndim
        position = index[axis:axis + k]
        inner = index[:axis] + [self._lookup(indices, table, position, valid)] + index[axis + k:]
        return self.value(x, inner, valid)

    def _lookup(self, name: str, table: np.ndarray, position: Sequence[Ix], valid: list[Ix]) -> Ix:
        """``table[position]`` as an index: a literal, an affine or nearest-resize formula, or a load."""
        if table.size == 1:
            return const(int(table.reshape(-1)[0]))
        if table.ndim == 1:
            formula = _index_formula(table)
            if formula is not None:
                return apply(formula, position[0])
        loaded = self._load(name, list(position), valid)
        return Ix(f"{loaded.expr}.to(tl.int32)", loaded.dims)

    def _concat(self, node: Node, index: list[Ix], valid: list[Ix]) -> Val:
        axis = node.attrs["axis"]
        start, result = 0, None
        for part in node.inputs:
            size = self.kernel.tensors[part].shape[axis]
            local = add(index[axis], -start)
            inside = apply(f"({{0}} >= 0) & ({{0}} < {size})", local)
            inner = index[:axis] + [local] + index[axis + 1:]
            value = self.value(part, inner, valid + [inside])
            if result is None:
                result = value
            else:
                result = self.assign(f"tl.where({inside.expr}, {value.expr}, {result.expr})",
                                     result.dims | value.dims | inside.dims)
            start += size
        return result


def _index_formula(table: np.ndarray) -> str | None:
    """A closed form of a 1-D index table: ``start + step*i`` or nearest resize ``(i * num) // den``."""
    i = np.arange(table.size, dtype=np.int64)
    if table.size > 1:
        step = int(table[1] - table[0])
        if np.array_equal(table, table[0] + step * i):
            return f"({int(table[0])} + {{0}} * {step})"
    num, den = int(table.max()) + 1, table.size
    g = math.gcd(num, den)
    num, den = num // g, den // g
    if np.array_equal(table, (i * num) // den):
        return f"(({{0}} * {num}) // {den})"
    return None


@dataclasses.dataclass(frozen=True)
class Derived:
    """A tensor computed from the product over the tile: its value and its own index of each tile element."""

    value: Val
    index: tuple[Ix, ...]
    valid: tuple[Ix, ...] = ()


def free_tensors(kernel: Graph, product: str) -> frozenset[str]:
    """Tensors that do not depend on ``product`` (computed where they are read)."""
    derived = {product}
    for node in kernel.nodes:
        if any(x in derived for x in node.inputs):
            derived.update(node.outputs)
    return frozenset(kernel.tensors) - derived


def epilogue(kernel: Graph, emitter: Emitter, product: str, start: Derived, linear_node: Node) -> list[str]:
    """Lines computing every tensor that depends on the product and storing the kernel's outputs."""
    derived = {product: start}
    after = kernel.nodes[kernel.nodes.index(linear_node) + 1:]
    for node in after:
        if any(x in derived for x in node.inputs):
            derived[node.output] = _forward(kernel, emitter, node, derived)
    for name in kernel.outputs:
        if name in derived:
            emitter.lines.append(_store(kernel, emitter, name, derived[name]))
    return emitter.lines


SIDE_BLOCK = 1024


def side_outputs(kernel: Graph, params: Params, names: Counter, free: frozenset[str]) -> tuple[list[str], int]:
    """Lines writing the outputs that do not depend on the product (an operand the model also reads
    elsewhere), by extra programs over ``SIDE_BLOCK`` flat elements ``re``; and the most elements of one."""
    lines, most = [], 0
    for name in kernel.outputs:
        if name not in free:
            continue
        t = kernel.tensors[name]
        most = max(most, t.numel)
        emitter = Emitter(kernel, params, Tile(masks={"e": f"(re < {t.numel})"}, zeros={"e": "ze"}), names, free)
        index = reindex([Ix("re", frozenset("e"))], (t.numel,), t.shape)
        value = emitter.value(name, index)
        expr = value.expr if value.dims else f"tl.broadcast_to({value.expr}, ({SIDE_BLOCK},))"
        offset = add(linear(index, t.shape), Ix("ze", frozenset("e")))
        lines += emitter.lines
        lines.append(f"tl.store({params.pointer(name)} + {offset.expr}, {expr}.to({scalar.tl_dtype(t.dtype)}), "
                     f"mask=re < {t.numel})")
    return lines, most


def _forward(kernel: Graph, emitter: Emitter, node: Node, derived: dict[str, Derived]) -> Derived:
    shape = kernel.tensors[node.output].shape
    if node.op in ops.ELEMENTWISE:
        return _forward_elementwise(kernel, emitter, node, derived, shape)
    if node.inputs[0] not in derived or any(x in derived for x in node.inputs[1:]):
        raise Unsupported(f"{node.op.value} of the product cannot be fused")
    d = derived[node.inputs[0]]
    src = kernel.tensors[node.inputs[0]].shape
    if node.op is Op.TRANSPOSE:
        return Derived(d.value, tuple(d.index[p] for p in node.attrs["perm"]), d.valid)
    if node.op is Op.RESHAPE:
        return Derived(d.value, tuple(reindex(d.index, src, shape)), d.valid)
    if node.op is Op.SLICE and all(s == 1 for s in node.attrs["steps"]):
        index, valid = [], list(d.valid)
        for ix, start, size, full in zip(d.index, node.attrs["starts"], shape, src):
            index.append(add(ix, -start))
            if size != full:
                valid.append(apply(f"({{0}} >= 0) & ({{0}} < {size})", index[-1]))
        return Derived(d.value, tuple(index), tuple(valid))
    raise Unsupported(f"{node.op.value} of the product cannot be fused")


def _forward_elementwise(kernel: Graph, emitter: Emitter, node: Node, derived: dict[str, Derived],
                         shape: tuple[int, ...]) -> Derived:
    mine = [derived[x] for x in node.inputs if x in derived]
    first = mine[0]
    for x in node.inputs:
        if x in derived and (kernel.tensors[x].shape != shape or derived[x].index != first.index):
            raise Unsupported("the epilogue broadcasts or re-indexes the product")
    valid = tuple(dict.fromkeys(v for d in mine for v in d.valid))
    args = [derived[x].value if x in derived else
            emitter.value(x, broadcast_index(first.index, shape, kernel.tensors[x].shape), valid)
            for x in node.inputs]
    return Derived(emitter.elementwise(node, args), first.index, valid)


def _store(kernel: Graph, emitter: Emitter, name: str, d: Derived) -> str:
    t = kernel.tensors[name]
    offset = linear(d.index, t.shape)
    dims = frozenset(emitter.tile.masks)
    for dim in sorted(dims - offset.dims):
        offset = add(offset, Ix(emitter.tile.zeros[dim], frozenset({dim})))
    mask = emitter.tile.mask(dims, d.valid)
    value = d.value.expr if d.value.dims == dims else f"tl.broadcast_to({d.value.expr}, (BLOCK_M, BLOCK_N))"
    return f"tl.store({emitter.params.pointer(name)} + {offset.expr}, {value}.to({scalar.tl_dtype(t.dtype)}), mask={mask})"

