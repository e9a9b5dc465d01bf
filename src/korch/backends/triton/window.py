"""The window kernel class: MAX_POOL / AVG_POOL with elementwise and layout work before and after, as one kernel.

The kernel iterates over its outputs' elements like a pointwise kernel
(``pointwise.write_flat``); a pool's value at an output position is its window
unrolled at generation time: for each kernel offset the input position is
``out * stride - pad_begin + offset * dilation`` per spatial axis, masked where
it falls in the padding (-inf for max; left out of the sum, and out of the
divisor unless ``count_include_pad``, for average). Work before the pool is
computed at each window position; work after it on the pooled value.
"""

from __future__ import annotations

import itertools
import math

from korch.backends.triton import scalar
from korch.backends.triton.emit import Emitter, Val
from korch.backends.triton.generated import GeneratedKernel
from korch.backends.triton.indexing import Ix
from korch.backends.triton.kernel_class import KernelClass, Refuse, check_ops
from korch.backends.triton.pointwise import write_flat
from korch.ir import dtypes
from korch.ir.graph import Graph, Node
from korch.ir.ops import ELEMENTWISE, LAYOUT, Op
from korch.ir.ops import WINDOW as WINDOW_OPS

# windows with more positions than this are refused (each position is written out)
MAX_WINDOW = 64
MAX_POOLS = 2


def _pool(em: Emitter, node: Node, index: tuple[Ix, ...], cond: Val | None) -> Val:
    x = node.inputs[0]
    a, sp = node.attrs, em.space
    in_shape = em.kernel.tensors[x].shape
    out_shape = em.kernel.tensors[node.output].shape
    is_max = node.op is Op.MAX_POOL
    outside = "float('-inf')" if is_max else "0.0"
    acc: str | None = None
    count: list[str] = []
    vars_ = frozenset()
    for offsets in itertools.product(*(range(n) for n in a["kernel"])):
        position, inside = list(index[:2]), []
        for i, offset in enumerate(offsets):
            stride, begin, dilation, size = a["strides"][i], a["pads"][i], a["dilations"][i], in_shape[2 + i]
            shift = offset * dilation - begin
            h = sp.add_const(sp.mul(index[2 + i], stride), shift)
            if shift < 0:
                inside.append((f"{sp.render(h)} >= 0", h.vars))
            if (out_shape[2 + i] - 1) * stride + shift >= size:
                inside.append((f"{sp.render(h)} < {size}", h.vars))
            position.append(h)
        local = em.condition(inside)
        v = em.value(x, position, em.both(cond, local))
        vars_ |= v.vars | (local.vars if local else frozenset())
        term = v.code if local is None else f"tl.where({local.code}, {v.code}, {outside})"
        if acc is None:
            acc = em.assign(term, "acc")
        elif is_max:
            em.line(f"{acc} = tl.maximum({acc}, {term}, propagate_nan=tl.PropagateNan.ALL)")
        else:
            em.line(f"{acc} = {acc} + {term}")
        count.append("1.0" if local is None else f"{local.code}.to(tl.float32)")
    if not is_max:
        total = float(len(count))
        divisor = str(total) if a.get("count_include_pad", 0) or all(c == "1.0" for c in count) else \
            "(" + " + ".join(count) + ")"
        acc = em.assign(f"{acc} / {divisor}", "acc")
    return Val(acc, scalar.compute_dtype(em.kernel.tensors[x].dtype), vars_)


class Window(KernelClass):
    """Kernels holding MAX_POOL / AVG_POOL nodes with elementwise and layout ops around them."""

    name = "window"
    ops = ELEMENTWISE | LAYOUT | WINDOW_OPS

    def generate(self, kernel: Graph) -> GeneratedKernel:
        pools = [n for n in kernel.nodes if n.op in WINDOW_OPS]
        if not pools:
            raise Refuse("no window op")
        if len(pools) > MAX_POOLS:
            raise Refuse("too many pools")
        for node in pools:
            if not dtypes.is_float(kernel.tensors[node.inputs[0]].dtype):
                raise Refuse("integer pool")
            if math.prod(node.attrs["kernel"]) > MAX_WINDOW:
                raise Refuse("pool window too large")
        check_ops(kernel, self.ops)
        return write_flat(kernel, self.name, {Op.MAX_POOL: _pool, Op.AVG_POOL: _pool})


WINDOW = Window()
