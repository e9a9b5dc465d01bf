"""Constant folding: nodes computable at load time become constants.

A node whose inputs are all constants is evaluated once by onnx's
``ReferenceEvaluator`` on a one-node model carrying the model's opset imports.
``Shape`` and ``Size`` of a tensor whose static shape is known fold even
though the tensor is not constant, which makes the Shape->Gather->Concat->
Reshape chains of exported models vanish. An ``If`` with a constant condition
is replaced by the nodes of the branch it takes. Nondeterministic ops, ops
with subgraphs, and results larger than ``config.fold_max_elements`` stay.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence

import numpy as np
from onnx import GraphProto, NodeProto, OperatorSetIdProto, TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from korch import config
from korch.frontend.graph import DEFAULT_DOMAINS, attributes, is_op, rename_inputs, subgraphs

Shapes = dict[str, tuple[tuple[int, ...] | None, str | None]]

NONDETERMINISTIC = frozenset(
    {
        "RandomNormal",
        "RandomUniform",
        "RandomNormalLike",
        "RandomUniformLike",
        "Multinomial",
        "Bernoulli",
    }
)
# Identity and Dropout are removed (not copied into new constants) by noops.py.
_NOT_FOLDED = NONDETERMINISTIC | {"Identity", "Dropout"}


def elem_type(array: np.ndarray) -> int:
    """The ONNX element type of a numpy array (strings included)."""
    if array.dtype.kind in "OSU":
        return TensorProto.STRING
    return helper.np_dtype_to_tensor_dtype(array.dtype)


class Folder:
    """Folds constants in a node list; remembers the nodes it failed to fold."""

    def __init__(self, opset_imports: Sequence[OperatorSetIdProto]):
        self.opset_imports = list(opset_imports)
        self._failed: set[str] = set()  # first output names of unfoldable nodes

    def fold(
        self, nodes: list[NodeProto], constants: dict[str, np.ndarray], shapes: Shapes
    ) -> tuple[list[NodeProto], bool]:
        """Fold what can be folded in topologically sorted ``nodes``.

        Adds the folded values to ``constants``; returns the remaining nodes
        (with the nodes of inlined If branches) and whether anything changed.
        """
        kept: list[NodeProto] = []
        changed = False
        for node in nodes:
            if is_op(node, "If") and node.input[0] in constants:
                branch = _inline_if(node, constants, _all_names(nodes, constants))
                if branch is not None:
                    kept.extend(branch)
                    changed = True
                    continue
            values = self._fold_node(node, constants, shapes)
            if values is None:
                kept.append(node)
            else:
                constants.update(values)
                changed = True
        return kept, changed

    def _fold_node(
        self, node: NodeProto, constants: dict[str, np.ndarray], shapes: Shapes
    ) -> dict[str, np.ndarray] | None:
        if not node.output or node.output[0] in self._failed:
            return None
        if is_op(node, "Shape", "Size") and node.input[0] not in constants:
            return _fold_shape(node, shapes)
        default = node.domain in DEFAULT_DOMAINS
        if (default and node.op_type in _NOT_FOLDED) or any(True for _ in subgraphs(node)):
            return None
        if not all(name in constants for name in node.input if name):
            return None
        limit = None if is_op(node, "Constant") else config.fold_max_elements
        expected = {out: shapes.get(out, (None, None)) for out in node.output if out}
        if limit is not None and any(
            shape is not None and math.prod(shape) > limit for shape, _ in expected.values()
        ):
            return None
        try:
            values = _evaluate(node, constants, self.opset_imports)
        except Exception:  # noqa: BLE001 - anything the evaluator cannot run stays a node
            self._failed.add(node.output[0])
            return None
        for name, value in values.items():
            shape, dtype = expected[name]
            if (
                not isinstance(value, np.ndarray)
                or (limit is not None and value.size > limit)
                or (shape is not None and value.shape != shape)
            ):
                self._failed.add(node.output[0])
                return None
            if dtype is not None and value.dtype.name != dtype:
                values[name] = value.astype(dtype)
        return values


def _fold_shape(node: NodeProto, shapes: Shapes) -> dict[str, np.ndarray] | None:
    shape = shapes.get(node.input[0], (None, None))[0]
    if shape is None:
        return None
    if node.op_type == "Size":
        return {node.output[0]: np.array(math.prod(shape), dtype=np.int64)}
    attrs = attributes(node)
    # Python slicing clamps start/end exactly as Shape-15 specifies.
    dims = shape[attrs.get("start", 0) : attrs.get("end", len(shape))]
    return {node.output[0]: np.array(dims, dtype=np.int64)}


def _evaluate(
    node: NodeProto,
    constants: dict[str, np.ndarray],
    opset_imports: Sequence[OperatorSetIdProto],
) -> dict[str, np.ndarray]:
    feeds = {name: constants[name] for name in node.input if name}
    inputs = [helper.make_tensor_value_info(n, elem_type(a), a.shape) for n, a in feeds.items()]
    names = [out for out in node.output if out]
    outputs = [helper.make_empty_tensor_value_info(out) for out in names]
    graph = helper.make_graph([node], "fold", inputs, outputs)
    model = helper.make_model(graph, opset_imports=opset_imports)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        results = ReferenceEvaluator(model).run(None, feeds)
    return {
        name: np.asarray(value) if isinstance(value, np.generic) else value
        for name, value in zip(names, results)
    }


def _all_names(nodes: list[NodeProto], constants: dict[str, np.ndarray]) -> set[str]:
    names = set(constants)

    def visit(graph_nodes, graph: GraphProto | None = None) -> None:
        if graph is not None:
            names.update(v.name for v in graph.input)
            names.update(t.name for t in graph.initializer)
        for node in graph_nodes:
            names.update(node.input)
            names.update(node.output)
            for sub in subgraphs(node):
                visit(sub.node, sub)

    visit(nodes)
    return names


def _inline_if(
    node: NodeProto, constants: dict[str, np.ndarray], taken: set[str]
) -> list[NodeProto] | None:
    """The nodes of the branch a constant condition takes, renamed apart.

    The branch's outputs reach the If's outputs through Identity nodes, which
    noops.py then removes.
    """
    cond = constants[node.input[0]]
    if cond.size != 1:
        return None
    attrs = {a.name: a.g for a in node.attribute}
    branch = attrs["then_branch" if bool(cond.reshape(-1)[0]) else "else_branch"]
    if branch.sparse_initializer:
        return None
    local = [t.name for t in branch.initializer] + [o for n in branch.node for o in n.output if o]
    mapping = {}
    for name in local:
        new, i = f"{node.output[0]}/{name}", 0
        while new in taken:
            i += 1
            new = f"{node.output[0]}/{name}_{i}"
        taken.add(new)
        mapping[name] = new
    for init in branch.initializer:
        constants[mapping[init.name]] = numpy_helper.to_array(init)
    nodes = []
    for original in branch.node:
        copy = NodeProto()
        copy.CopyFrom(original)
        rename_inputs(copy, mapping)
        for i, out in enumerate(copy.output):
            if out:
                copy.output[i] = mapping[out]
        nodes.append(copy)
    for value, out in zip(branch.output, node.output):
        if out:
            nodes.append(helper.make_node("Identity", [mapping.get(value.name, value.name)], [out]))
    return nodes
