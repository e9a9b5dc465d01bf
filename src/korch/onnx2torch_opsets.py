"""onnx2torch for the opsets current exporters write: the operator versions onnx2torch 1.5 stops short of.

``korch bench MODEL.onnx`` runs its PyTorch peers (eager, ``torch.compile``) on the ONNX graph converted to a
torch module by onnx2torch, which knows no operator version past opset 17 and few past 13: every model exported
at opset 18 or later (torch's exporter writes 18 and up; the zoo's files are at 20) lost those peers. ``register``
adds, for each such version, a converter that hands the node to the converter of the older version meaning the
same, rewritten where the newer version moved an attribute into an input (a reduction's ``axes``), and refuses
(``NotImplementedError``, as onnx2torch does) a node using what the older version cannot express. Mish (18) and
Gelu (20), new operators, get converters of their own.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from onnx import helper

# The versions added by later opsets whose changes are new element types alone (float8 and the like): the
# older converter serves as it is
_TYPES_ONLY = {"Shape": ((19,), 15), "Cast": ((19,), 13), "Identity": ((19,), 16),
               "Equal": ((19,), 13), "Constant": ((19,), 13), "ConstantOfShape": ((20,), 9), "IsNaN": ((20,), 13),
               "IsInf": ((20,), 10)}
# Reductions whose axes became an input (18; ReduceMax and ReduceMin took booleans too at 20)
_AXES_AS_INPUT = {"ReduceMean": ((18,), 13), "ReduceL2": ((18,), 13), "ReduceL1": ((18,), 13),
                  "ReduceLogSumExp": ((18,), 13), "ReduceProd": ((18,), 13), "ReduceSumSquare": ((18,), 13),
                  "ReduceMax": ((18, 20), 13), "ReduceMin": ((18, 20), 13)}


def register() -> None:
    """Add the converters (once per process: a version onnx2torch already knows is left alone)."""
    from onnx2torch.node_converters.registry import add_converter, get_converter

    def add(op: str, versions, converter) -> None:
        for version in versions:
            try:
                get_converter(op, version)
            except NotImplementedError:
                add_converter(op, version)(converter)

    for op, (versions, known) in _TYPES_ONLY.items():
        add(op, versions, _as_older(op, known, _unchanged))
    for op, (versions, known) in _AXES_AS_INPUT.items():
        add(op, versions, _as_older(op, known, _axes_as_attribute))
    add("Pad", (18, 19), _as_older("Pad", 13, _refusing(lambda node: node.attributes.get("mode") == "wrap"
                                                          or _given(node, 3), "wrap mode or axes")))
    add("Resize", (18, 19), _as_older("Resize", 13, _refusing(_resize_beyond_13, "antialias, axes, aspect policy")))
    add("AveragePool", (19,), _as_older("AveragePool", 11, _without_unit_dilations))
    add("Split", (18,), _as_older("Split", 13, _without("num_outputs")))  # 13 splits evenly by its outputs
    add("Reshape", (19,), _as_older("Reshape", 14, _allowing_zero_only_where_none))
    add("Mish", (18,), _module(lambda node: torch.nn.Mish()))
    add("Gelu", (20,), _module(lambda node: torch.nn.GELU(approximate=node.attributes.get("approximate", "none"))))


def _as_older(op: str, known: int, adapt: Callable) -> Callable:
    """A converter giving ``adapt(node, graph)``, the node as version ``known`` of ``op`` writes it, to that
    version's converter."""
    def converter(node, graph):
        from onnx2torch.node_converters.registry import get_converter

        return get_converter(op, known)(adapt(node, graph), graph)
    return converter


def _unchanged(node, graph):
    return node


def _refusing(uses_more: Callable, what: str) -> Callable:
    def adapt(node, graph):
        if uses_more(node):
            raise NotImplementedError(f"{node.operation_type} with {what}: its older version cannot express it")
        return node
    return adapt


def _given(node, index: int) -> bool:
    return len(node.input_values) > index and bool(node.input_values[index])


def _resize_beyond_13(node) -> bool:
    a = node.attributes
    return bool(a.get("antialias", 0)) or "axes" in a or a.get("keep_aspect_ratio_policy", "stretch") != "stretch" \
        or a.get("coordinate_transformation_mode") == "half_pixel_symmetric"


def _rewritten(node, inputs, attributes: dict):
    """``node`` with ``inputs`` and ``attributes`` instead of its own (the older version's form)."""
    from onnx2torch.onnx_node import OnnxNode

    proto = helper.make_node(node.operation_type, list(inputs), list(node.output_values), name=node.proto.name,
                             domain=node.domain, **attributes)
    return OnnxNode(proto, node.unique_name)


def _constant_ints(node, index: int, graph) -> list[int]:
    """The integers of the node's input ``index``, a constant of the graph (``KeyError`` if it is computed)."""
    from onnx2torch.utils.common import get_const_value

    value = get_const_value(node.input_values[index], graph)
    return [int(v) for v in (value.tolist() if hasattr(value, "tolist") else value)]


def _axes_as_attribute(node, graph):
    """A reduction of opset 18 or later as 13 writes it: its ``axes`` input, a constant, as the attribute."""
    attributes = {k: v for k, v in node.attributes.items() if k != "noop_with_empty_axes"}
    if _given(node, 1):
        attributes["axes"] = _constant_ints(node, 1, graph)
    if not attributes.get("axes") and node.attributes.get("noop_with_empty_axes", 0):
        raise NotImplementedError(f"{node.operation_type} with no axes and noop_with_empty_axes")
    return _rewritten(node, node.input_values[:1], attributes)


def _allowing_zero_only_where_none(node, graph):
    """A Reshape whose ``allowzero`` (which onnx2torch refuses) changes nothing: its shape a constant with no 0
    in it (torch's exporter sets it on every Reshape of opset 14 and up)."""
    if not node.attributes.get("allowzero", 0):
        return node
    try:
        shape = _constant_ints(node, 1, graph)
    except KeyError:  # computed: a 0 there would be read differently
        raise NotImplementedError("Reshape with allowzero=1 and a computed shape") from None
    if 0 in shape:
        raise NotImplementedError("Reshape with allowzero=1 and a 0 in its shape")
    return _without("allowzero")(node, graph)


def _without_unit_dilations(node, graph):
    if any(d != 1 for d in node.attributes.get("dilations", [])):
        raise NotImplementedError("AveragePool with dilations: its older version cannot express them")
    return _without("dilations")(node, graph)


def _without(attribute: str) -> Callable:
    def adapt(node, graph):
        return _rewritten(node, node.input_values, {k: v for k, v in node.attributes.items() if k != attribute})
    return adapt


def _module(make: Callable) -> Callable:
    """A converter of a one-input, one-output operator into the torch module ``make(node)``."""
    def converter(node, graph):
        from onnx2torch.utils.common import OperationConverterResult, onnx_mapping_from_node

        return OperationConverterResult(torch_module=make(node), onnx_mapping=onnx_mapping_from_node(node))
    return converter
