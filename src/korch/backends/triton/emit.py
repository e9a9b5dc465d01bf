"""The one emitter of generated Triton kernels: a kernel graph's values as Triton statements.

Every kernel class (pointwise, reduction, window, matmul, conv) writes its
kernel through an ``Emitter``. ``Emitter.value(tensor, index)`` returns a
Triton variable holding ``tensor`` at ``index`` (one ``Ix`` per axis, see
``indexing.py``) for every lane of the current block, emitting the statements
that compute it. It walks back from the tensor to the kernel's inputs: an
elementwise node evaluates its operands at the broadcast index; a layout node
maps the index to its input's index (transpose permutes, reshape re-splits,
slice is start + i*step, pad clamps, mirrors or masks, concat selects a piece
under a condition, gather looks the index up, broadcast drops axes); inputs
and large constants are loaded, scalar constants are written as literals.
Values are memoized per (tensor, index, condition), so shared work is emitted
once per scope. Kernel classes add handlers for the ops they own (reductions,
pools) and write their loops around it; the GEMM classes also carry values
forwards from the product (``tiled.py``) with ``elementwise`` and ``store``.

A *condition* restricts where a value is needed (a concat piece, the inside of
a constant pad, a convolution's padding): loads under it are masked by it, so
they never touch memory outside their tensor. A masked load is zero where its
mask is off (``loads`` names them).

``generated`` writes the whole module: the prelude, the kernel header with its
pointer parameters (inputs, constants, outputs) and constexprs, and the body.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np

from korch.backends.triton import scalar
from korch.backends.triton.generated import GeneratedKernel, Param, Variant
from korch.backends.triton.indexing import Ix, Space, broadcast_index, const, table_index
from korch.backends.triton.kernel_class import Refuse
from korch.ir import dtypes
from korch.ir.graph import Graph, Node, storage_order
from korch.ir.ops import ELEMENTWISE, LAYOUT, Op

# constants with at most this many elements are written into the source
BAKED_CONSTANT = 1


@dataclasses.dataclass(frozen=True)
class Val:
    """A Triton value: source (a variable or a literal), its compute dtype, the domain variables it varies with."""

    code: str
    dtype: str
    vars: frozenset[str] = frozenset()
    literal: bool = False


Handler = Callable[["Emitter", Node, tuple[Ix, ...], "Val | None"], Val]


def literal(value, dtype: str) -> Val:
    value = np.asarray(value).item()
    if dtypes.is_float(dtype):
        text = repr(float(value)) if np.isfinite(value) else f"float('{value}')"
    else:
        text = str(int(value)) if dtype != "bool" else ("True" if value else "False")
    return Val(text, scalar.compute_dtype(dtype), literal=True)


class Emitter:
    """The statements of one kernel's body, its pointer parameters, and the values computed so far per scope."""

    def __init__(self, kernel: Graph, space: Space, handlers: dict[Op, Handler] | None = None):
        self.kernel, self.space = kernel, space
        self.handlers = dict(handlers or {})
        self.producer = kernel.producers()
        self.lines: list[str] = []
        self.depth = 1
        self.scopes: list[dict] = [{}]
        self.pointers: dict[str, str] = {}   # tensor name -> argument name
        self.loads: set[str] = set()         # variables holding masked loads (zero where masked)
        self._count = 0

    # --- statements and scopes ---------------------------------------------------------------

    def line(self, text: str) -> None:
        self.lines.append("    " * self.depth + text)

    def fresh(self, prefix: str = "t") -> str:
        self._count += 1
        return f"{prefix}{self._count}"

    def assign(self, expr: str, prefix: str = "t") -> str:
        name = self.fresh(prefix)
        self.line(f"{name} = {expr}")
        return name

    def push(self) -> None:
        self.scopes.append({})

    def pop(self) -> None:
        self.scopes.pop()

    def _memo_get(self, key):
        for scope in reversed(self.scopes):
            if key in scope:
                return scope[key]
        return None

    def _memo_put(self, key, value):
        self.scopes[-1][key] = value
        return value

    # --- parameters ---------------------------------------------------------------------------

    def pointer(self, tensor: str) -> str:
        if tensor not in self.pointers:
            kind = "out" if tensor in self.kernel.outputs else ("c" if tensor in self.kernel.constants else "in")
            self.pointers[tensor] = f"{kind}{len(self.pointers)}"
        return self.pointers[tensor]

    def params(self) -> tuple[Param, ...]:
        """Pointer parameters in signature order: inputs, constants, outputs (each once)."""
        order = sorted(self.pointers, key=lambda t: (t in self.kernel.outputs, self.pointers[t]))
        return tuple(Param(t, "tensor", scalar.triton_type(self.kernel.tensors[t].dtype)) for t in order)

    def signature(self) -> str:
        return ", ".join(self.pointers[p.name] for p in self.params())

    def generated(self, kernel_class: str, constexprs: Sequence[str], variants: Sequence[Variant],
                  helpers: str = "", entry: str = "kernel") -> GeneratedKernel:
        """The whole module: prelude, ``helpers``, then the entry with its parameters and the body written."""
        params = ", ".join(([self.signature()] if self.pointers else []) + [f"{c}: tl.constexpr" for c in constexprs])
        source = scalar.PRELUDE + helpers + f"\n\n@triton.jit\ndef {entry}({params}):\n" + "\n".join(self.lines) + "\n"
        return GeneratedKernel(kernel_class, source, entry, self.params(), tuple(variants))

    # --- masks ----------------------------------------------------------------------------------

    def mask(self, vars_: frozenset[str], cond: Val | None = None) -> str | None:
        parts = [f"{v}_mask" for v in self.space.masked(vars_)]
        if cond is not None:
            parts.append(cond.code)
        return " & ".join(parts) if parts else None

    def both(self, a: Val | None, b: Val | None) -> Val | None:
        if a is None or b is None:
            return a or b
        key = ("&", a.code, b.code)
        found = self._memo_get(key)
        return found or self._memo_put(key, Val(self.assign(f"{a.code} & {b.code}", "m"), "bool", a.vars | b.vars))

    def condition(self, parts: Sequence[tuple[str, frozenset[str]]]) -> Val | None:
        """A condition variable from (Triton boolean source, vars) parts; None when there are none."""
        if not parts:
            return None
        code = " & ".join(f"({p})" for p, _ in parts)
        key = ("cond", code)
        found = self._memo_get(key)
        vars_ = frozenset().union(*(v for _, v in parts))
        return found or self._memo_put(key, Val(self.assign(code, "m"), "bool", vars_))

    # --- loads and stores -------------------------------------------------------------------

    def _address(self, tensor: str, offset: Ix, vars_: frozenset[str]) -> str:
        text = f"{self.pointer(tensor)} + {self.space.render(offset)}"
        for v in self.space.masked(vars_ - offset.vars):  # widen the pointer block to the mask's shape
            text += f" + 0 * {v}"
        return text

    def offset(self, tensor: str, index: Sequence[Ix]) -> Ix:
        """Where the element at (logical) ``index`` of ``tensor`` is stored, in elements from its start: row-major
        over the axes in the order its layout stores them."""
        t = self.kernel.tensors[tensor]
        order = storage_order(t.layout, len(t.shape))
        return self.space.flatten([index[i] for i in order], [t.shape[i] for i in order])

    def load(self, tensor: str, index: Sequence[Ix], cond: Val | None) -> Val:
        return self.load_flat(tensor, self.offset(tensor, index), cond)

    def load_flat(self, tensor: str, offset: Ix, cond: Val | None) -> Val:
        t = self.kernel.tensors[tensor]
        vars_ = offset.vars | (cond.vars if cond else frozenset())
        mask = self.mask(vars_, cond)
        address = self._address(tensor, offset, vars_)
        compute = scalar.compute_dtype(t.dtype)
        text = f"tl.load({address}, mask={mask}, other=0)" if mask else f"tl.load({address})"
        if compute != t.dtype:
            text += f".to({scalar.tl_dtype(compute)})"
        loaded = self.assign(text)
        if mask:
            self.loads.add(loaded)
        return Val(loaded, compute, vars_)

    def store(self, tensor: str, index: Sequence[Ix], value: Val, cond: Val | None = None) -> None:
        """Store ``value`` at ``index`` on every lane where the variables it varies with are in range (and ``cond``)."""
        t = self.kernel.tensors[tensor]
        offset = self.offset(tensor, index)
        code = value.code
        if value.literal:
            code = f"tl.full([1], {code}, {scalar.tl_dtype(value.dtype)})"
        if t.dtype != value.dtype:
            code = f"{code}.to({scalar.tl_dtype(t.dtype)})"
        vars_ = offset.vars | value.vars | (cond.vars if cond else frozenset())
        mask = self.mask(vars_, cond)
        address = self._address(tensor, offset, vars_)
        self.line(f"tl.store({address}, {code}, mask={mask})" if mask else f"tl.store({address}, {code})")

    # --- values ----------------------------------------------------------------------------------

    def value(self, tensor: str, index: Sequence[Ix], cond: Val | None = None) -> Val:
        shape = self.kernel.tensors[tensor].shape
        index = tuple(const(0) if size == 1 else ix for ix, size in zip(index, shape))
        key = (tensor, index, cond.code if cond else None)
        found = self._memo_get(key)
        if found is not None:
            return found
        return self._memo_put(key, self._compute(tensor, index, cond))

    def _compute(self, tensor: str, index: tuple[Ix, ...], cond: Val | None) -> Val:
        constant = self.kernel.constants.get(tensor)
        if constant is not None and constant.size <= BAKED_CONSTANT:
            return literal(constant.reshape(-1)[0], constant.dtype.name)
        node = self.producer.get(tensor)
        if node is None:
            return self.load(tensor, index, cond)
        if node.op in self.handlers:
            return self.handlers[node.op](self, node, index, cond)
        if node.op in ELEMENTWISE:
            return self._elementwise(node, index, cond)
        if node.op in LAYOUT:
            return self._layout(node, index, cond)
        raise Refuse(f"{node.op.kind.value} op {node.op.value}")

    def _elementwise(self, node: Node, index: tuple[Ix, ...], cond: Val | None) -> Val:
        operands = [self.value(t, broadcast_index(index, self.kernel.tensors[t].shape), cond) for t in node.inputs]
        return self.elementwise(node, operands)

    def elementwise(self, node: Node, operands: Sequence[Val]) -> Val:
        """``node`` applied to its operands' values."""
        in_dtypes = [self.kernel.tensors[t].dtype for t in node.inputs]
        args = [o.code for o in operands]
        if node.op is Op.CAST and operands[0].literal:
            args[0] = f"tl.full([1], {args[0]}, {scalar.tl_dtype(operands[0].dtype)})"
        expr = scalar.expression(node.op, args, node.attrs, in_dtypes)
        out_dtype = scalar.compute_dtype(self.kernel.tensors[node.output].dtype)
        vars_ = frozenset().union(*(o.vars for o in operands))
        return Val(self.assign(expr), out_dtype, vars_)

    # --- layout ops: the output index -> the input index ------------------------------------------------

    def _layout(self, node: Node, index: tuple[Ix, ...], cond: Val | None) -> Val:
        x = node.inputs[0]
        in_shape = self.kernel.tensors[x].shape
        a = node.attrs
        sp = self.space
        if node.op is Op.TRANSPOSE:
            source = [const(0)] * len(index)
            for out_axis, in_axis in enumerate(a["perm"]):
                source[in_axis] = index[out_axis]
            return self.value(x, source, cond)
        if node.op is Op.RESHAPE:
            return self.value(x, sp.reshape(index, self.kernel.tensors[node.output].shape, in_shape), cond)
        if node.op is Op.SLICE:
            source = [sp.add_const(sp.mul(ix, step), start) for ix, start, step in zip(index, a["starts"], a["steps"])]
            return self.value(x, source, cond)
        if node.op is Op.BROADCAST:
            return self.value(x, broadcast_index(index, in_shape), cond)
        if node.op is Op.PAD:
            return self._pad(node, index, cond)
        if node.op is Op.CONCAT:
            return self._concat(node, index, cond)
        return self._gather(node, index, cond)

    def _pad(self, node: Node, index: tuple[Ix, ...], cond: Val | None) -> Val:
        x, sp = node.inputs[0], self.space
        shape, rank = self.kernel.tensors[x].shape, len(index)
        pads, mode = node.attrs["pads"], node.attrs["mode"]
        source, inside = [], []
        for axis, (ix, size) in enumerate(zip(index, shape)):
            begin, end = pads[axis], pads[rank + axis]
            j = sp.add_const(ix, -begin)
            if (begin == 0 and end == 0) or size == 1 and mode != "constant":
                source.append(j if size != 1 else const(0))
                continue
            if mode == "constant":
                if begin:
                    inside.append((f"{sp.render(j)} >= 0", j.vars))
                if end:
                    inside.append((f"{sp.render(j)} < {size}", j.vars))
                source.append(j)
            else:
                source.append(self._fold(j, size, mode))
        if mode != "constant" or not inside:
            return self.value(x, source, cond)
        inner = self.condition(inside)
        v = self.value(x, source, self.both(cond, inner))
        fill = self.value(node.inputs[1], (), cond) if len(node.inputs) > 1 and node.inputs[1] else literal(0, v.dtype)
        return Val(self.assign(f"tl.where({inner.code}, {v.code}, {fill.code})"), v.dtype, v.vars | inner.vars)

    def _fold(self, j: Ix, size: int, mode: str) -> Ix:
        """An out-of-range index mapped back inside (the IR keeps reflect pads smaller than the axis)."""
        if j.is_const:
            return const(int(_fold_number(j.const, size, mode)))
        s = self.space.render(j)
        if mode == "reflect":
            code = f"tl.where({s} < 0, -{s}, tl.where({s} >= {size}, {2 * (size - 1)} - {s}, {s}))"
        elif mode == "edge":
            code = f"tl.minimum(tl.maximum({s}, 0), {size - 1})"
        else:  # wrap
            code = f"((({s}) % {size}) + {size}) % {size}"
        return self.space.opaque(self.assign(code, "i"), j.vars)

    def _concat(self, node: Node, index: tuple[Ix, ...], cond: Val | None) -> Val:
        axis, sp = node.attrs["axis"], self.space
        ix = index[axis]
        pieces, start = [], 0
        for t in node.inputs:
            size = self.kernel.tensors[t].shape[axis]
            pieces.append((t, start, size))
            start += size
        if ix.is_const:
            t, begin, _ = next(p for p in pieces if p[1] <= ix.const < p[1] + p[2])
            return self.value(t, index[:axis] + (const(ix.const - begin),) + index[axis + 1:], cond)
        s = sp.render(ix)
        result: Val | None = None
        for k, (t, begin, size) in reversed(list(enumerate(pieces))):
            parts = []
            if k > 0:
                parts.append((f"{s} >= {begin}", ix.vars))
            if k < len(pieces) - 1:
                parts.append((f"{s} < {begin + size}", ix.vars))
            inside = self.condition(parts)
            v = self.value(t, index[:axis] + (sp.add_const(ix, -begin),) + index[axis + 1:], self.both(cond, inside))
            if result is None:
                result = v
            else:
                code = self.assign(f"tl.where({inside.code}, {v.code}, {result.code})")
                result = Val(code, v.dtype, v.vars | result.vars | inside.vars)
        return result

    def _gather(self, node: Node, index: tuple[Ix, ...], cond: Val | None) -> Val:
        x, table_name = node.inputs
        axis, sp = node.attrs["axis"], self.space
        table = self.kernel.constants[table_name]
        q = table.ndim
        position = sp.flatten(index[axis:axis + q], table.shape)
        looked_up = table_index(sp, table, position)
        if looked_up is None:
            loaded = self.load_flat(table_name, position, cond)
            looked_up = sp.opaque(loaded.code, loaded.vars)
        return self.value(x, index[:axis] + (looked_up,) + index[axis + q:], cond)


def _fold_number(j: int, size: int, mode: str) -> int:
    if mode == "edge":
        return min(max(j, 0), size - 1)
    if mode == "wrap":
        return j % size
    return -j if j < 0 else (2 * (size - 1) - j if j >= size else j)

