"""The builder fission rules write primitives with: typed, named, deduplicated, folded.

``Builder.emit(op, *inputs, **attrs)`` adds one primitive, types its output with
the IR's shape rules and returns the output's name. Primitives whose inputs are
all constants are evaluated at once by the reference executor and become
constants (a weight transpose, say), unless the result is large. Small
constants are shared, so one ``0.5`` serves the whole graph.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from korch import config
from korch.ir import dtypes
from korch.ir.graph import Attrs, Graph, Node, Tensor
from korch.ir.ops import Op
from korch.ir.shapes import infer

_SHARED_CONSTANT_MAX_ELEMENTS = 64


class Builder:
    """Appends primitives to ``graph`` on behalf of one source operator named ``base``."""

    def __init__(self, graph: Graph, base: str, constant_cache: dict | None = None, num_outputs: int = 1):
        self.graph = graph
        self.base = base
        self.num_outputs = num_outputs  # how many outputs of the source operator the model uses
        self.created: list[Node] = []
        self._constant_cache = constant_cache if constant_cache is not None else {}
        self._count = 0

    # -- reading -----------------------------------------------------------------
    def info(self, name: str) -> Tensor:
        return self.graph.tensors[name]

    def shape(self, name: str) -> tuple[int, ...]:
        return self.graph.tensors[name].shape

    def dtype(self, name: str) -> str:
        return self.graph.tensors[name].dtype

    def rank(self, name: str) -> int:
        return len(self.graph.tensors[name].shape)

    def value(self, name: str | None) -> np.ndarray | None:
        """The value of a constant tensor, or None if ``name`` is absent or not constant."""
        return self.graph.constants.get(name) if name else None

    # -- constants ---------------------------------------------------------------
    def _fresh(self, label: str) -> str:
        while True:
            self._count += 1
            name = f"{self.base}/{label}{self._count}"
            if name not in self.graph.tensors:
                return name

    def const(self, value, dtype: str | None = None) -> str:
        """A constant tensor holding ``value``; small ones are shared across the graph."""
        array = np.asarray(value, dtype=dtype)
        key = None
        if array.size <= _SHARED_CONSTANT_MAX_ELEMENTS:
            key = (array.dtype.name, array.shape, array.tobytes())
            if key in self._constant_cache:
                return self._constant_cache[key]
        name = self._fresh("const")
        self.graph.add_constant(name, array)
        if key is not None:
            self._constant_cache[key] = name
        return name

    def scalar(self, value: float | int | bool, like: str) -> str:
        """A 0-d constant of the dtype of tensor ``like``."""
        return self.const(np.array(value, dtype=self.dtype(like)))

    # -- primitives ----------------------------------------------------------------
    def emit(self, op: Op, *inputs: str, **attrs) -> str:
        frozen = Attrs(attrs)
        shape, dtype = infer(op, frozen, [self.info(name) for name in inputs])
        if all(name in self.graph.constants for name in inputs) and int(np.prod(shape)) <= config.fold_max_elements:
            return self._fold(op, inputs, frozen)
        name = self._fresh(op.value)
        self.graph.add_tensor(Tensor(name=name, shape=shape, dtype=dtype))
        node = Node(op=op, inputs=tuple(inputs), outputs=(name,), attrs=frozen, name=name)
        self.graph.nodes.append(node)
        self.created.append(node)
        return name

    def _fold(self, op: Op, inputs: Sequence[str], attrs: Attrs) -> str:
        from korch.ir.interpret import as_torch, run_node

        node = Node(op=op, inputs=tuple(inputs), outputs=("folded",), attrs=attrs)
        (value,) = run_node(node, [as_torch(self.graph.constants[n]) for n in inputs])
        return self.const(value.numpy())

    def opaque(self, inputs: Sequence[str], outputs: Sequence[Tensor], attrs: dict) -> list[str]:
        """An OPAQUE node with outputs typed by the caller (the imported model)."""
        names = []
        for t in outputs:
            name = t.name if t.name not in self.graph.tensors else self._fresh("opaque")
            self.graph.add_tensor(Tensor(name=name, shape=t.shape, dtype=t.dtype))
            names.append(name)
        node = Node(op=Op.OPAQUE, inputs=tuple(inputs), outputs=tuple(names), attrs=Attrs(attrs),
                    name=f"{self.base}/opaque")
        self.graph.nodes.append(node)
        self.created.append(node)
        return names

    def rename(self, old: str, new: str) -> bool:
        """Give a tensor this builder created the name ``new``; False if that is not possible."""
        if new in self.graph.tensors or not any(old in n.outputs for n in self.created):
            return False
        self.graph.tensors[new] = Tensor(name=new, shape=self.shape(old), dtype=self.dtype(old))
        del self.graph.tensors[old]
        swap = {old: new}
        for i, node in enumerate(self.graph.nodes[len(self.graph.nodes) - len(self.created):]):
            renamed = node.replace(inputs=tuple(swap.get(x, x) for x in node.inputs),
                                   outputs=tuple(swap.get(x, x) for x in node.outputs),
                                   name=new if node.name == old else node.name)
            self.graph.nodes[len(self.graph.nodes) - len(self.created) + i] = renamed
            self.created[i] = renamed
        return True

    # -- sugar used by many rules ---------------------------------------------------
    def add(self, a: str, b: str) -> str: return self.emit(Op.ADD, a, b)
    def sub(self, a: str, b: str) -> str: return self.emit(Op.SUB, a, b)
    def mul(self, a: str, b: str) -> str: return self.emit(Op.MUL, a, b)
    def div(self, a: str, b: str) -> str: return self.emit(Op.DIV, a, b)
    def maximum(self, a: str, b: str) -> str: return self.emit(Op.MAX, a, b)
    def minimum(self, a: str, b: str) -> str: return self.emit(Op.MIN, a, b)
    def where(self, c: str, a: str, b: str) -> str: return self.emit(Op.WHERE, c, a, b)

    def cast(self, x: str, to: str) -> str:
        return x if self.dtype(x) == to else self.emit(Op.CAST, x, to=to)

    def reduce(self, op: Op, x: str, axes: Sequence[int], keepdims: bool = True) -> str:
        axes = normalize_axes(axes, self.rank(x))
        return self.emit(op, x, axes=axes, keepdims=bool(keepdims))

    def reshape(self, x: str, shape: Sequence[int]) -> str:
        shape = tuple(int(d) for d in shape)
        return x if shape == self.shape(x) else self.emit(Op.RESHAPE, x, shape=shape)

    def transpose(self, x: str, perm: Sequence[int]) -> str:
        perm = tuple(int(p) for p in perm)
        return x if perm == tuple(range(len(perm))) else self.emit(Op.TRANSPOSE, x, perm=perm)

    def broadcast(self, x: str, shape: Sequence[int]) -> str:
        shape = tuple(int(d) for d in shape)
        return x if shape == self.shape(x) else self.emit(Op.BROADCAST, x, shape=shape)

    def slice_axis(self, x: str, axis: int, start: int, count: int, step: int = 1) -> str:
        """Elements ``start, start+step, ...`` (``count`` of them) along ``axis``."""
        shape = list(self.shape(x))
        if start == 0 and step == 1 and count == shape[axis]:
            return x
        starts, steps = [0] * len(shape), [1] * len(shape)
        starts[axis], steps[axis], shape[axis] = start, step, count
        return self.emit(Op.SLICE, x, starts=tuple(starts), steps=tuple(steps), shape=tuple(shape))

    def concat(self, xs: Sequence[str], axis: int) -> str:
        return xs[0] if len(xs) == 1 else self.emit(Op.CONCAT, *xs, axis=axis)

    def gather(self, x: str, indices, axis: int) -> str:
        return self.emit(Op.GATHER, x, self.const(np.asarray(indices, dtype=np.int64)), axis=axis)

    def copy(self, x: str) -> str:
        """A new tensor equal to ``x`` (a same-shape reshape), for outputs that must be produced by a node."""
        name = self._fresh("copy")
        t = self.info(x)
        self.graph.add_tensor(Tensor(name=name, shape=t.shape, dtype=t.dtype))
        node = Node(op=Op.RESHAPE, inputs=(x,), outputs=(name,), attrs=Attrs({"shape": t.shape}), name=name)
        self.graph.nodes.append(node)
        self.created.append(node)
        return name


def normalize_axes(axes: Sequence[int], rank: int) -> tuple[int, ...]:
    """Sorted, unique, non-negative axes; raises ValueError when one is out of range."""
    out = set()
    for a in axes:
        a = int(a)
        if not -rank <= a < rank:
            raise ValueError(f"axis {a} out of range for rank {rank}")
        out.add(a % rank)
    return tuple(sorted(out))


def is_supported_dtype(dtype: str) -> bool:
    return dtype in dtypes.SUPPORTED
