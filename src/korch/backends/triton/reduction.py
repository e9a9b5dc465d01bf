"""The reduction kernel class: reductions over the same axes, with the work before and after them, as one kernel.

All reductions of a kernel read tensors of one shape ``S`` and reduce the same
axes (softmax's max and sum, a norm's two means). The kernel's domain is a
tile of ``XBLOCK`` rows (the kept positions of ``S``, flattened: ``row``) by
``RBLOCK`` reduced positions (``col``); kept and reduced axes need not be
contiguous, every address is computed through ``S``'s strides. A reduced value
is a ``[XBLOCK, 1]`` variable, read wherever the graph uses it provided the
index reading it lands on the same row (``Space.same``; a layout op that moves
the kept axes is refused).

Rows that fit in one block are *persistent*: one tile holds the row, so the
reductions and the outputs share loads. Longer rows loop: one loop per level of
dependent reductions (softmax: max, then sum), then one loop per output width
writing the outputs. An output is written either per row (a reduced value) or
per (row, position), where its shape keeps ``S``'s kept axes or, when those
lead ``S``, simply has a whole number of elements per row (group norm reshapes
back that way).
"""

from __future__ import annotations

import math

from korch.backends.triton import scalar
from korch.backends.triton.emit import Emitter, Val
from korch.backends.triton.generated import GeneratedKernel, Variant
from korch.backends.triton.indexing import Ix, Space
from korch.backends.triton.kernel_class import (KernelClass, Refuse, check_ops, chosen_variants, next_power_of_2,
                                                wide_index)
from korch.ir import dtypes
from korch.ir.graph import Graph, Node
from korch.ir.ops import ELEMENTWISE, LAYOUT, REDUCE, Op

# rows up to this many elements are reduced in one block
PERSISTENT_LIMIT = 4096
# (RBLOCK, warps) of looped rows; the first is the default
LOOP_VARIANTS = ((1024, 4), (2048, 8), (512, 4))

HELPERS = '''

@triton.jit
def _max_nan(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _min_nan(a, b):
    return tl.minimum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _row_max(x):
    # tl.max drops NaN; the reference propagates it
    nans = tl.sum((x != x).to(tl.float32), axis=1, keep_dims=True)
    return tl.where(nans > 0, float("nan"), tl.max(x, axis=1, keep_dims=True))


@triton.jit
def _row_min(x):
    nans = tl.sum((x != x).to(tl.float32), axis=1, keep_dims=True)
    return tl.where(nans > 0, float("nan"), tl.min(x, axis=1, keep_dims=True))


@triton.jit
def _mul(a, b):
    return a * b
'''

# op -> (identity, accumulate source, final reduction of axis 1). tl.sum / tl.max rather than tl.reduce with
# a combine of ours: the interpreter runs those with numpy, a custom combine element by element.
_REDUCERS = {
    Op.REDUCE_SUM: ("0.0", "{a} + {b}", "tl.sum({a}, axis=1, keep_dims=True)"),
    Op.REDUCE_MEAN: ("0.0", "{a} + {b}", "tl.sum({a}, axis=1, keep_dims=True)"),
    Op.REDUCE_MAX: ("float('-inf')", "_max_nan({a}, {b})", "_row_max({a})"),
    Op.REDUCE_MIN: ("float('inf')", "_min_nan({a}, {b})", "_row_min({a})"),
    Op.REDUCE_PROD: ("1.0", "{a} * {b}", "tl.reduce({a}, 1, _mul, keep_dims=True)"),
}


class _Plan:
    """The reduction domain of one kernel: shape ``S``, reduced axes, rows, and how each output is indexed."""

    def __init__(self, kernel: Graph):
        self.kernel = kernel
        self.reductions = [n for n in kernel.nodes if n.op in REDUCE]
        if not self.reductions:
            raise Refuse("no reduction")
        shapes = {kernel.tensors[n.inputs[0]].shape for n in self.reductions}
        if len(shapes) > 1 or len({n.attrs["axes"] for n in self.reductions}) > 1:
            raise Refuse("two reduction groups")
        if not all(dtypes.is_float(kernel.tensors[n.inputs[0]].dtype) for n in self.reductions):
            raise Refuse("integer reduction")
        self.shape = shapes.pop()
        self.axes = tuple(self.reductions[0].attrs["axes"])
        self.kept = [i for i in range(len(self.shape)) if i not in self.axes]
        self.rows = math.prod(self.shape[i] for i in self.kept)
        self.width = math.prod(self.shape[i] for i in self.axes)
        if self.rows == 0 or self.width == 0:
            raise Refuse("empty reduction")
        self.space = Space()
        self.row = self.space.add_var("row", self.rows)
        self.col = self.space.add_var("col", self.width)
        self.index = self._assemble(self.space.unflatten(self.row, [self.shape[i] for i in self.kept]),
                                    self.space.unflatten(self.col, [self.shape[i] for i in self.axes]), self.axes)
        self.outputs = [(name, *self._output_index(name)) for name in kernel.outputs]
        self.levels = self._levels()

    def _assemble(self, kept_ix, other_ix, other_axes) -> tuple[Ix, ...]:
        index: list[Ix] = [None] * (len(kept_ix) + len(other_ix))
        for axis, ix in zip(self.kept, kept_ix):
            index[axis] = ix
        for axis, ix in zip(other_axes, other_ix):
            index[axis] = ix
        return tuple(index)

    def col_var(self, extent: int) -> str:
        if extent == self.width:
            return "col"
        name = f"ocol{extent}"
        self.space.add_var(name, extent)
        return name

    def _output_index(self, name: str) -> tuple[tuple[Ix, ...], str | None]:
        """How output ``name`` is iterated: its index in terms of ``row`` and a column variable (None: per row)."""
        shape = self.kernel.tensors[name].shape
        numel, sp = math.prod(shape), self.space
        if numel == self.rows:
            return sp.unflatten(self.row, shape), None
        if len(shape) == len(self.shape) and all(shape[i] == self.shape[i] for i in self.kept):
            others = [i for i in range(len(shape)) if i not in self.kept]
            var = self.col_var(math.prod(shape[i] for i in others))
            kept_ix = [self.index[i] for i in self.kept]
            return self._assemble(kept_ix, sp.unflatten(sp.var(var), [shape[i] for i in others]), others), var
        if numel % self.rows == 0 and self.kept == list(range(len(self.kept))):
            per_row = numel // self.rows
            var = self.col_var(per_row)
            return sp.unflatten(sp.add(sp.mul(self.row, per_row), sp.var(var)), shape), var
        raise Refuse("output not aligned with rows")

    def _levels(self) -> list[list[Node]]:
        """Reductions grouped by how many reductions feed them (each level needs the previous one)."""
        level: dict[str, int] = {}
        for node in self.kernel.nodes:
            depth = max((level.get(t, 0) for t in node.inputs if t), default=0)
            for out in node.outputs:
                level[out] = depth + (node.op in REDUCE)
        groups: dict[int, list[Node]] = {}
        for node in self.reductions:
            groups.setdefault(level[node.output], []).append(node)
        return [groups[k] for k in sorted(groups)]

    @property
    def persistent_block(self) -> int:
        widths = [self.width] + [self.space.extents[v] for _, _, v in self.outputs if v]
        return next_power_of_2(max(widths))


class _Writer:
    def __init__(self, kernel: Graph, plan: _Plan, persistent: bool):
        self.kernel, self.plan, self.persistent = kernel, plan, persistent
        self.em = Emitter(kernel, plan.space, {op: self._reduced for op in REDUCE})
        self.results: dict[str, Val] = {}
        self.wide = wide_index(kernel)

    def _reduced(self, em: Emitter, node: Node, index: tuple[Ix, ...], cond) -> Val:
        plan, sp = self.plan, self.plan.space
        kept_ix = [index[i] for i in plan.kept] if node.attrs["keepdims"] else list(index)
        if not sp.same(sp.flatten(kept_ix, [plan.shape[i] for i in plan.kept]), plan.row):
            raise Refuse("layout op on a reduced axis")
        return self.results[node.output]

    def _define_col(self, var: str, start: str) -> None:
        extent = self.plan.space.extents[var]
        arange = "tl.arange(0, RBLOCK)[None, :]"
        self.em.line(f"{var} = {start}{arange}" if start else f"{var} = {arange}")
        if self.wide:
            self.em.line(f"{var} = {var}.to(tl.int64)")
        self.em.line(f"{var}_mask = {var} < {extent}")

    def _loop(self, var: str) -> None:
        self.em.line(f"for r0 in range(0, {self.plan.space.extents[var]}, RBLOCK):")
        self.em.depth += 1
        self.em.push()
        self._define_col(var, "r0 + ")

    def _end_loop(self) -> None:
        self.em.pop()
        self.em.depth -= 1

    def write(self) -> None:
        em, plan = self.em, self.plan
        em.line("pid = tl.program_id(0)" + (".to(tl.int64)" if self.wide else ""))
        em.line("row = pid * XBLOCK + tl.arange(0, XBLOCK)[:, None]")
        em.line(f"row_mask = row < {plan.rows}")
        if self.persistent:
            self._define_col("col", "")
            for var in {v for _, _, v in plan.outputs if v and v != "col"}:
                em.line(f"{var} = col")
                em.line(f"{var}_mask = {var} < {plan.space.extents[var]}")
        for level in plan.levels:
            self._reduce_level(level)
        for name, index, var in plan.outputs:
            if var is None or self.persistent:
                em.store(name, index, em.value(name, index))
        if not self.persistent:
            for var in dict.fromkeys(v for _, _, v in plan.outputs if v):
                self._loop(var)
                for name, index, v in plan.outputs:
                    if v == var:
                        em.store(name, index, em.value(name, index))
                self._end_loop()

    def _reduce_level(self, level: list[Node]) -> None:
        em, plan = self.em, self.plan
        if self.persistent:
            for node in level:
                ident, _, final = _REDUCERS[node.op]
                v = em.value(node.inputs[0], plan.index)
                masked = em.assign(f"tl.where(row_mask & col_mask, {v.code}, {ident})")
                self._finish(node, final.format(a=masked))
            return
        accs = {}
        for node in level:
            ident = _REDUCERS[node.op][0]
            dtype = scalar.tl_dtype(scalar.compute_dtype(self.kernel.tensors[node.inputs[0]].dtype))
            accs[node.output] = em.assign(f"tl.full([XBLOCK, RBLOCK], {ident}, {dtype})", "acc")
        self._loop("col")
        for node in level:
            ident, combine, _ = _REDUCERS[node.op]
            v = em.value(node.inputs[0], plan.index)
            acc = accs[node.output]
            em.line(f"{acc} = " + combine.format(a=acc, b=f"tl.where(row_mask & col_mask, {v.code}, {ident})"))
        self._end_loop()
        for node in level:
            self._finish(node, _REDUCERS[node.op][2].format(a=accs[node.output]))

    def _finish(self, node: Node, reduced: str) -> None:
        if node.op is Op.REDUCE_MEAN:
            reduced = f"{reduced} / {self.plan.width}"
        dtype = scalar.compute_dtype(self.kernel.tensors[node.inputs[0]].dtype)
        self.results[node.output] = Val(self.em.assign(reduced, "r"), dtype, frozenset({"row"}))


class Reduction(KernelClass):
    """Kernels with reductions over one set of axes, plus elementwise and layout work around them."""

    name = "reduction"
    ops = ELEMENTWISE | LAYOUT | REDUCE

    def generate(self, kernel: Graph) -> GeneratedKernel:
        check_ops(kernel, self.ops)
        plan = _Plan(kernel)
        persistent = plan.persistent_block <= PERSISTENT_LIMIT
        writer = _Writer(kernel, plan, persistent)
        writer.write()
        return writer.em.generated(self.name, ["XBLOCK", "RBLOCK"], _variants(plan, persistent), HELPERS)


def _variants(plan: _Plan, persistent: bool) -> list[Variant]:
    """Launch variants, the default first, narrowed by ``kernel_class.chosen_variants`` (elements a program
    reduces at once: XBLOCK rows of RBLOCK)."""
    rows = next_power_of_2(plan.rows)
    if not persistent:
        every = [Variant((("XBLOCK", 1), ("RBLOCK", r)), (plan.rows,), num_warps=w) for r, w in LOOP_VARIANTS]
    else:
        rblock = plan.persistent_block
        default = max(1, min(rows, 2048 // rblock))
        blocks = dict.fromkeys(b for b in (default, default * 2, max(1, default // 4), 1) if b <= rows)
        every = [Variant((("XBLOCK", b), ("RBLOCK", rblock)), (-(-plan.rows // b),),
                         num_warps=8 if b * rblock >= 4096 else 4) for b in blocks]
    return chosen_variants(every, lambda v: dict(v.constexprs)["XBLOCK"] * dict(v.constexprs)["RBLOCK"])


REDUCTION = Reduction()
