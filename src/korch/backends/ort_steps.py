"""Which primitives of a graph ONNX Runtime's MLAS operators compute (``ort_gemm.py``), and the steps that do:
shared by a compiled unit (``runtime/unit.py``) and the MLAS backend's kernels (``mlas.py``), so that a kernel
is measured the way the unit runs it.

A step is ``(function, inputs, outputs)``, the function from input tensors to output tensors. ``replacements``
maps a primitive to the step that replaces it, or to None where another step computes its output (a softmax's
parts, all but the first of sibling products).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Collection, Sequence

import numpy as np

from korch.backends import ort_gemm
from korch.ir.graph import Graph, Node

Step = tuple[Callable, tuple[str, ...], tuple[str, ...]]


def replacements(graph: Graph, kernels: Sequence[Sequence[str]], token: int,
                 add_constant: Callable[[str, np.ndarray], str],
                 within: Collection[str] | None = None, mkl_products: bool = False) -> dict[str, Step | None]:
    """The MLAS steps of ``graph`` whose planned ``kernels`` (their primitives' names, in order) are given:
    products by constant weights and 1x1 convolutions (sibling ones as one), products of two activations, 1-D
    convolutions, and softmaxes within one kernel; with ``within``, only those of these primitives. ``token``
    keys the operators' sessions; ``add_constant(name, value)`` adds a constant the steps read (a weight laid
    out for MLAS) and returns its name. With ``mkl_products`` the products by constant weights run in MKL's
    packed GEMM instead (``ort_gemm.mkl_product_function``)."""
    nodes = {node.name: node for node in graph.nodes}
    allowed = (lambda name: True) if within is None else within.__contains__
    replaced: dict[str, Step | None] = {}
    slots = itertools.count()
    for node in (n for n in graph.nodes if allowed(n.name)):
        if ort_gemm.batched_eligible(graph, node):
            replaced[node.name] = (ort_gemm.batched_function(token, next(slots)), node.inputs, node.outputs)
        elif ort_gemm.conv1d_eligible(graph, node):
            weight = graph.constants[node.inputs[1]]
            columns = add_constant(f"{node.name}/columns", ort_gemm.conv_columns(weight))
            function = ort_gemm.conv1d_function(token, next(slots), node, weight.shape[2])
            replaced[node.name] = (function, (node.inputs[0], columns), node.outputs)
    for siblings in _siblings(graph, kernels, allowed, ort_gemm.pointwise_conv_eligible):
        _replace_pointwise_siblings(graph, siblings, token, next(slots), add_constant, replaced)
    kernel_of = {name: i for i, kernel in enumerate(kernels) for name in kernel}
    for softmax in ort_gemm.softmaxes(graph, graph.nodes):
        # its parts in one planned kernel
        if len({kernel_of[name] for name in softmax.parts}) == 1 and all(map(allowed, softmax.parts)):
            replaced.update(dict.fromkeys(softmax.parts))
            last = next(n for n in softmax.parts if nodes[n].output == softmax.output)
            replaced[last] = (ort_gemm.softmax_function(token, next(slots)), (softmax.input,), (softmax.output,))
    products = _siblings(graph, kernels, allowed, ort_gemm.eligible)
    # what ONNX Runtime reads, and the graph's outputs, are one contiguous array each: such products are not
    # left in column blocks
    contiguous = {name for step in replaced.values() if step for name in step[1]}
    contiguous.update(graph.outputs, (siblings[0].inputs[0] for siblings in products))
    for siblings in products:
        _replace_siblings(graph, siblings, token, next(slots), contiguous, add_constant, replaced, mkl_products)
    return replaced


def _siblings(graph: Graph, kernels: Sequence[Sequence[str]], allowed: Callable[[str], bool],
              eligible: Callable[[Graph, Node], bool]) -> list[list[Node]]:
    """The ``eligible`` primitives (products by a constant weight, or 1x1 convolutions) of the ``allowed``
    ones, grouped by the activation they multiply (attention's query, key and value projections; the two 1x1
    convolutions that open a CSP block), each group in plan order."""
    order = {name: i for i, name in enumerate(n for kernel in kernels for n in kernel)}
    groups: dict[str, list[Node]] = {}
    for node in sorted((n for n in graph.nodes if allowed(n.name) and eligible(graph, n)),
                       key=lambda n: order[n.name]):
        groups.setdefault(node.inputs[0], []).append(node)
    return list(groups.values())


def _replace_pointwise_siblings(graph: Graph, siblings: list[Node], token: int, slot: int,
                                add_constant: Callable[[str, np.ndarray], str],
                                replaced: dict[str, Step | None]) -> None:
    """One MLAS product for the 1x1 convolutions of one activation, by their weights' columns side by side,
    computed where the first runs; each output is its channels of that product. Every MLAS call costs about 8
    us more in a unit than alone (``benchmarks/mlas_call_overhead.py``): YOLOX-Nano's eleven pairs, 11 calls."""
    first = siblings[0]
    columns = _weights_side_by_side(graph, siblings, add_constant, replaced, ort_gemm.conv_columns)
    widths = [graph.tensor(n.inputs[1]).shape[0] for n in siblings]
    replaced[first.name] = (ort_gemm.pointwise_conv_function(token, slot, widths), (first.inputs[0], columns),
                            tuple(n.output for n in siblings))


def _replace_siblings(graph: Graph, siblings: list[Node], token: int, slot: int, contiguous: set[str],
                      add_constant: Callable[[str, np.ndarray], str], replaced: dict[str, Step | None],
                      mkl: bool = False) -> None:
    """One MLAS product (MKL's packed one with ``mkl``) for products of one activation, by their weights side by
    side (fewer calls, and wider products run faster: three 197x768x768 products 4% slower than one
    197x768x2304), computed where the first runs; each product's output is its block of columns. A weight too
    large for every thread to stream all of it is computed by MLAS in column blocks, one per thread, which the
    kernels after it read where they lie (``ort_gemm.column_blocks``), unless an output is one of ``contiguous``."""
    first = siblings[0]
    widths = [graph.tensor(n.output).shape[-1] for n in siblings]
    weight = _weights_side_by_side(graph, siblings, add_constant, replaced)
    if mkl:
        function = ort_gemm.mkl_product_function(token, slot, widths)
    else:
        blocks = 1 if any(n.output in contiguous for n in siblings) else \
            ort_gemm.column_blocks(graph.tensor(first.inputs[1]).shape[0], sum(widths))
        function = ort_gemm.product_function(token, slot, widths, blocks)
    replaced[first.name] = (function, (first.inputs[0], weight), tuple(n.output for n in siblings))


def _weights_side_by_side(graph: Graph, siblings: list[Node], add_constant: Callable[[str, np.ndarray], str],
                          replaced: dict[str, Step | None], columns: Callable[[np.ndarray], np.ndarray] | None = None) \
        -> str:
    """The name of the siblings' weights side by side, one matrix (each as ``columns`` lays it out, a
    convolution's ``conv_columns``; a lone product's own weight as it is); the siblings after the first are
    computed by the first's step (None in ``replaced``)."""
    first = siblings[0]
    replaced.update(dict.fromkeys(n.name for n in siblings[1:]))
    if columns is None and len(siblings) == 1:
        return first.inputs[1]
    matrices = [(columns or np.asarray)(graph.constants[n.inputs[1]]) for n in siblings]
    return add_constant(f"{first.name}/{'columns' if columns else 'siblings'}", np.concatenate(matrices, axis=1))
