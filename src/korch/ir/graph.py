"""The primitive graph: tensors with static shapes, nodes of ``Op``s, constants, in topological order.

A ``Graph`` is the plain data every stage after fission reads. Nodes are frozen
and hashable (structurally equal nodes compare equal, so fission can
deduplicate); the graph container is mutable while it is being built and is
checked by ``korch.ir.verify.verify``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import numpy as np

from korch.ir.ops import Op


# How a tensor is stored where it crosses a kernel boundary. Layout is a property of how kernels read and write
# a value, never of what it is: a graph means the same thing whatever its tensors' layouts.
CONTIGUOUS = "contiguous"        # row-major in the logical order (NCHW for images)
CHANNELS_LAST = "channels_last"  # a 4-D value stored N, H, W, C (torch.channels_last)
LAYOUTS = (CONTIGUOUS, CHANNELS_LAST)


def other_layout(layout: str) -> str:
    """The layout a conversion from ``layout`` writes (there are two)."""
    return CONTIGUOUS if layout == CHANNELS_LAST else CHANNELS_LAST


def storage_order(layout: str, rank: int) -> tuple[int, ...]:
    """The axes of a value of ``rank`` in the order ``layout`` stores them, outermost first (row-major over
    the permuted shape): channels-last stores N, C, H, W as N, H, W, C."""
    return (0, 2, 3, 1) if layout == CHANNELS_LAST and rank == 4 else tuple(range(rank))


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Tensor:
    """A named value with a static shape, a numpy dtype name, and how it is stored (``LAYOUTS``)."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    layout: str = CONTIGUOUS

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        return self.numel * np.dtype(self.dtype).itemsize


def _freeze(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return _freeze(value.tolist())
    return value


class Attrs(Mapping[str, Any]):
    """An immutable, hashable attribute map; lists are stored as tuples."""

    __slots__ = ("_items", "_hash")

    def __init__(self, items: Mapping[str, Any] | Iterable[tuple[str, Any]] = ()):
        pairs = items.items() if isinstance(items, Mapping) else items
        self._items = tuple(sorted((k, _freeze(v)) for k, v in pairs))
        self._hash = hash(self._items)

    def __getitem__(self, key: str) -> Any:
        for k, v in self._items:
            if k == key:
                return v
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        return (k for k, _ in self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Attrs) and self._items == other._items

    def __repr__(self) -> str:
        return "Attrs(" + ", ".join(f"{k}={v!r}" for k, v in self._items) + ")"


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Node:
    """One primitive: ``outputs = op(*inputs; attrs)``. All but OPAQUE have one output."""

    op: Op
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: Attrs = Attrs()
    name: str = ""

    @property
    def output(self) -> str:
        (out,) = self.outputs
        return out

    def replace(self, **changes) -> "Node":
        return dataclasses.replace(self, **changes)


@dataclasses.dataclass(kw_only=True)
class Graph:
    """A primitive graph. ``nodes`` is kept in a topological order."""

    name: str = "graph"
    tensors: dict[str, Tensor] = dataclasses.field(default_factory=dict)
    inputs: list[str] = dataclasses.field(default_factory=list)
    outputs: list[str] = dataclasses.field(default_factory=list)
    constants: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
    nodes: list[Node] = dataclasses.field(default_factory=list)
    opset: int = 18  # the source model's default-domain opset (opaque nodes keep its semantics)

    def tensor(self, name: str) -> Tensor:
        return self.tensors[name]

    def add_tensor(self, tensor: Tensor) -> Tensor:
        if tensor.name in self.tensors:
            raise ValueError(f"tensor {tensor.name!r} already exists")
        self.tensors[tensor.name] = tensor
        return tensor

    def add_constant(self, name: str, value: np.ndarray) -> Tensor:
        value = np.asarray(value)
        self.constants[name] = value
        return self.add_tensor(Tensor(name=name, shape=tuple(value.shape), dtype=value.dtype.name))

    def producers(self) -> dict[str, Node]:
        return {out: node for node in self.nodes for out in node.outputs}

    def boundary_layouts(self) -> set[str]:
        """How the graph's inputs and outputs are stored (``LAYOUTS``): a kernel graph's boundaries."""
        return {self.tensors[t].layout for t in (*self.inputs, *self.outputs)}

    def consumers(self) -> dict[str, list[Node]]:
        users: dict[str, list[Node]] = {name: [] for name in self.tensors}
        for node in self.nodes:
            for name in node.inputs:
                if name:
                    users[name].append(node)
        return users

    def op_histogram(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for node in self.nodes:
            counts[node.op.value] = counts.get(node.op.value, 0) + 1
        return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))

    def __repr__(self) -> str:
        return (f"Graph({self.name!r}, {len(self.nodes)} nodes, inputs={self.inputs}, "
                f"outputs={self.outputs}, {len(self.constants)} constants)")
