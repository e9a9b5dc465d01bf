"""A primitive graph as a function of one input dimension: what ``--dynamic seq=1..512`` compiles.

The importer and fission work on static shapes. For a model whose inputs share
a named dimension (``seq``), the primitive graphs at several sizes of it have
the same nodes, and differ only in integers (shapes, reshape targets, slice
bounds) and in constants that grow with the size (position embeddings, an
attention mask folded to a constant). ``SizeFunctions.fit`` reads those
differences off graphs imported at ``SAMPLES`` sizes: every integer that varies
must be a polynomial of degree at most two in the size with integer
coefficients (fitted on three sizes, verified on the fourth), and every
constant that varies must be the leading block of its value at a larger size
(a prefix along each axis that varies). Anything else is a one-line error
naming the node or constant.

``graph_at(graph, size)`` is then the graph at any size, where ``size`` may be
a symbolic integer: compiled with ``torch.export`` and a ``Dim``, one compiled
unit serves every size in a range, with no padding and no recompilation.
``check_graph_at`` verifies the functions against a graph imported at a size.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any

import numpy as np

from korch.errors import KorchError
from korch.ir.graph import Graph, Tensor

SAMPLE_COUNT = 4  # three sizes fit a polynomial of degree two, the fourth verifies it


@dataclasses.dataclass(frozen=True)
class Poly:
    """``c0 + c1 * size + c2 * size**2`` with integer coefficients."""

    c0: int
    c1: int = 0
    c2: int = 0

    def __call__(self, size):
        return self.c0 + self.c1 * size + self.c2 * size * size

    @property
    def is_size(self) -> bool:
        return (self.c0, self.c1, self.c2) == (0, 1, 0)

    def __str__(self) -> str:
        parts = [f"{self.c2}*size^2"] if self.c2 else []
        parts += [f"{self.c1}*size" if self.c1 != 1 else "size"] if self.c1 else []
        return " + ".join(parts + ([str(self.c0)] if self.c0 or not parts else []))


def _fit(sizes: Sequence[int], values: Sequence[int]) -> Poly | None:
    """The polynomial through the first three points that also hits the rest, or None."""
    (x0, x1, x2), (y0, y1, y2) = sizes[:3], [Fraction(v) for v in values[:3]]
    d01, d12 = (y1 - y0) / (x1 - x0), (y2 - y1) / (x2 - x1)
    c2 = (d12 - d01) / (x2 - x0)
    c1 = d01 - c2 * (x0 + x1)
    c0 = y0 - c1 * x0 - c2 * x0 * x0
    if any(c.denominator != 1 for c in (c0, c1, c2)):
        return None
    poly = Poly(int(c0), int(c1), int(c2))
    return poly if all(poly(x) == y for x, y in zip(sizes, values)) else None


def _vary(values: Sequence[Any], sizes: Sequence[int], where: str) -> Any:
    """One value, given at each of ``sizes``: itself where it does not vary, else its ``Poly`` (in
    tuples, element by element)."""
    first = values[0]
    if all(v == first for v in values):
        return first
    if isinstance(first, tuple) and all(isinstance(v, tuple) and len(v) == len(first) for v in values):
        return tuple(_vary([v[i] for v in values], sizes, where) for i in range(len(first)))
    if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        poly = _fit(sizes, values)
        if poly is not None:
            return poly
    raise KorchError(f"{where} changes with the dynamic dimension in a way korch cannot follow "
                     f"({', '.join(f'{s}: {v}' for s, v in zip(sizes, values))})")


def _evaluate(value: Any, size) -> Any:
    if isinstance(value, Poly):
        return value(size)
    if isinstance(value, tuple):
        return tuple(_evaluate(v, size) for v in value)
    return value


def _renaming(reference: Graph, graph: Graph) -> tuple[dict[str, str], dict[str, str]] | None:
    """``graph``'s tensor and node names -> ``reference``'s, matched by position, when both have the same
    primitives wired the same way (fission numbers the names it makes, and how many it made before may
    depend on the size), else None."""
    if len(reference.nodes) != len(graph.nodes) or reference.inputs != graph.inputs:
        return None
    tensors = {name: name for name in graph.inputs}
    nodes = {}
    for ref, node in zip(reference.nodes, graph.nodes):
        if (ref.op, len(ref.inputs), len(ref.outputs), set(ref.attrs)) != (node.op, len(node.inputs),
                                                                          len(node.outputs), set(node.attrs)):
            return None
        for want, got in zip(ref.inputs + ref.outputs, node.inputs + node.outputs):
            if (want == "") != (got == "") or (got and tensors.setdefault(got, want) != want):
                return None
        nodes[node.name] = ref.name
    for name in graph.constants:  # constants no primitive reads (an output that is a weight) keep their names
        tensors.setdefault(name, name)
    if ([tensors.get(o) for o in graph.outputs] != reference.outputs or len(set(tensors.values())) != len(tensors)
            or set(tensors.values()) != set(reference.tensors)
            or any(graph.tensors[g].dtype != reference.tensors[r].dtype for g, r in tensors.items())):
        return None
    return tensors, nodes


def _renaming_or_error(reference: Graph, graph: Graph, where: str) -> tuple[dict[str, str], dict[str, str]]:
    renaming = _renaming(reference, graph)
    if renaming is None:
        raise KorchError(f"the model's primitives {where}: --dynamic needs one primitive graph for every size")
    return renaming


def _aligned(reference: Graph, graph: Graph, where: str) -> Graph:
    """``graph`` with ``reference``'s names (see ``_renaming``), or a one-line error."""
    tensors, nodes = _renaming_or_error(reference, graph, where)
    return dataclasses.replace(
        graph, inputs=list(graph.inputs), outputs=[tensors[o] for o in graph.outputs],
        tensors={tensors[n]: Tensor(name=tensors[n], shape=t.shape, dtype=t.dtype) for n, t in graph.tensors.items()},
        constants={tensors[n]: v for n, v in graph.constants.items()},
        nodes=[node.replace(name=nodes[node.name], inputs=tuple(tensors.get(i, i) for i in node.inputs),
                            outputs=tuple(tensors[o] for o in node.outputs)) for node in graph.nodes])


@dataclasses.dataclass(frozen=True)
class SizeFunctions:
    """What of a primitive graph varies with one dimension, and how (see the module docstring)."""

    dim: str
    attrs: Mapping[str, Mapping[str, Any]]      # node -> attribute -> value with Polys, for nodes that vary
    shapes: Mapping[str, tuple]                 # tensor -> shape with Polys, for tensors that vary
    input_axes: Mapping[str, tuple[int, ...]]   # graph input -> its axes that are the dimension itself
    reference: Graph = dataclasses.field(repr=False, compare=False)  # the graph whose names the maps use

    def for_graph(self, graph: Graph, size: int) -> "SizeFunctions":
        """The same functions in the names of ``graph`` (imported at ``size``), checked against it."""
        tensors, nodes = _renaming_or_error(graph, self.reference,
                                            f"at {self.dim}={size} differ from those at the sizes fitted")
        moved = SizeFunctions(self.dim, {nodes[n]: a for n, a in self.attrs.items()},
                              {tensors[t]: s for t, s in self.shapes.items()}, self.input_axes, graph)
        moved.check_graph_at(graph, graph, size)
        return moved

    @classmethod
    def fit(cls, dim: str, graphs: Mapping[int, Graph]) -> "SizeFunctions":
        """Fitted on ``graphs`` (size -> the primitive graph imported at that size; ``SAMPLE_COUNT`` sizes)."""
        sizes = sorted(graphs)
        if len(sizes) < SAMPLE_COUNT:
            raise ValueError(f"fitting needs {SAMPLE_COUNT} sizes, got {sizes}")
        first = graphs[sizes[0]]
        samples = [first] + [_aligned(first, graphs[s], f"at {dim}={sizes[0]} and {dim}={s} differ")
                             for s in sizes[1:]]
        attrs = {}
        for i, node in enumerate(first.nodes):
            values = [g.nodes[i].attrs for g in samples]
            varying = {k: _vary([v[k] for v in values], sizes, f"attribute {k} of {node.name}")
                       for k in node.attrs if any(v[k] != node.attrs[k] for v in values)}
            if varying:
                attrs[node.name] = varying
        shapes = {t: _vary([g.tensors[t].shape for g in samples], sizes, f"the shape of {t}")
                  for t in first.tensors if any(g.tensors[t].shape != first.tensors[t].shape for g in samples)}
        for name in first.constants:
            if name in shapes:
                _check_prefixes(name, [g.constants[name] for g in samples])
            elif any(not np.array_equal(g.constants[name], first.constants[name], equal_nan=True) for g in samples):
                raise KorchError(f"the value of constant {name} changes with {dim}: --dynamic cannot follow it")
        input_axes = {}
        for name in first.inputs:
            shape = shapes.get(name, ())
            axes = tuple(i for i, d in enumerate(shape) if isinstance(d, Poly) and d.is_size)
            odd = [i for i, d in enumerate(shape) if isinstance(d, Poly) and not d.is_size]
            if odd:
                raise KorchError(f"axis {odd[0]} of input {name} is {shape[odd[0]]} (size: {dim}): --dynamic "
                                 f"serves inputs whose varying axes are {dim} itself")
            if axes:
                input_axes[name] = axes
        if not input_axes:
            raise KorchError(f"no input dimension varies with {dim}")
        return cls(dim, attrs, shapes, input_axes, first)

    def graph_at(self, graph: Graph, size) -> Graph:
        """``graph`` (imported at some size) at ``size``, which may be symbolic: its attributes and shapes
        evaluated; constants keep the values they have in ``graph`` (``PlanModule`` cuts those that grow)."""
        tensors = {name: Tensor(name=name, shape=_evaluate(self.shapes[name], size), dtype=t.dtype)
                   if name in self.shapes else t for name, t in graph.tensors.items()}
        # attribute maps with symbolic integers stay plain dicts: Attrs hashes its values
        nodes = [node.replace(attrs={**node.attrs, **self._attrs_at(node.name, size)}) if node.name in self.attrs
                 else node for node in graph.nodes]
        return dataclasses.replace(graph, tensors=tensors, nodes=nodes)

    def _attrs_at(self, node: str, size) -> dict[str, Any]:
        return {key: _evaluate(value, size) for key, value in self.attrs[node].items()}

    def varying_constants(self, graph: Graph) -> list[str]:
        return [name for name in graph.constants if name in self.shapes]

    def check_graph_at(self, reference: Graph, graph: Graph, size: int) -> None:
        """A one-line error unless ``graph``, imported at ``size``, is ``reference`` (in whose names these
        functions are) at ``size``."""
        graph = _aligned(reference, graph, f"at {self.dim}={size} differ from those at the sizes fitted")
        expected = self.graph_at(reference, size)
        for node, want in zip(graph.nodes, expected.nodes):
            if dict(node.attrs) != dict(want.attrs):
                raise KorchError(f"primitive {want.name} at {self.dim}={size} is not what the sizes fitted say: "
                                 "--dynamic cannot serve this range")
        wrong = next((t for t in graph.tensors if graph.tensors[t].shape != expected.tensors[t].shape), None)
        if wrong is not None:
            raise KorchError(f"tensor {wrong} at {self.dim}={size} has shape {graph.tensors[wrong].shape}, not "
                             f"{expected.tensors[wrong].shape}: --dynamic cannot serve this range")


def _check_prefixes(name: str, values: Sequence[np.ndarray]) -> None:
    largest = max(values, key=lambda v: v.size)
    for value in values:
        if value.ndim != largest.ndim or not np.array_equal(
                largest[tuple(slice(0, n) for n in value.shape)], value, equal_nan=True):
            raise KorchError(f"constant {name} at a smaller size is not the leading block of its value at a larger "
                             "one: --dynamic cannot follow it")
