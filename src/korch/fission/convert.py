"""Operator fission: an imported ONNX model becomes a primitive ``Graph``.

Each ONNX node is handed to its registered rule (``registry.find_rule``). A
node without a rule, with a dtype korch does not claim, with a non-constant
input a rule needs constant, or that its rule declines, becomes one OPAQUE
primitive; one warning at the end names every such operator. An attribute no
rule knows is an error: korch would otherwise compute something else.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections import Counter

import numpy as np
import onnx
from onnx import helper

from korch.errors import KorchError
from korch.fission.builder import Builder, is_supported_dtype
from korch.fission.registry import Rule, find_rule
from korch.frontend import ImportedModel
from korch.ir.graph import Graph, Tensor
from korch.ir.to_onnx import encode_opaque, outer_scope_names
from korch.ir.verify import verify


class OpaqueOperatorWarning(UserWarning):
    """Some operators stayed opaque: korch runs them through a library, without fusing them."""


@dataclasses.dataclass
class FissionReport:
    """What fission did with each ONNX operator type."""

    lowered: Counter = dataclasses.field(default_factory=Counter)
    opaque: dict[str, str] = dataclasses.field(default_factory=dict)  # op type -> first reason
    opaque_count: Counter = dataclasses.field(default_factory=Counter)

    def warn(self) -> None:
        """One warning naming every operator kept opaque, if any."""
        if self.opaque:
            listed = ", ".join(f"{op} x{self.opaque_count[op]} ({why})" for op, why in sorted(self.opaque.items()))
            warnings.warn(f"operators kept opaque (run by ONNX Runtime, not fused): {listed}",
                          OpaqueOperatorWarning, stacklevel=3)


def _attributes(node: onnx.NodeProto) -> dict:
    out = {}
    for attr in node.attribute:
        value = helper.get_attribute_value(attr)
        if isinstance(value, bytes):
            value = value.decode()
        elif isinstance(value, list) and value and isinstance(value[0], bytes):
            value = [v.decode() for v in value]
        elif isinstance(value, onnx.TensorProto):
            value = onnx.numpy_helper.to_array(value)
        out[attr.name] = value
    return out


def _why_opaque(rule: Rule | None, node: onnx.NodeProto, inputs: list[str | None], graph: Graph) -> str | None:
    if rule is None:
        return "no fission rule"
    if node.attribute and any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
        return "has a subgraph"
    for i in rule.const_inputs:
        if i < len(inputs) and inputs[i] and inputs[i] not in graph.constants:
            return f"input {i} ({inputs[i]}) is not a constant"
    used = [graph.tensors[x].dtype for x in inputs if x]
    bad = sorted({d for d in used if not is_supported_dtype(d)})
    if bad:
        return f"dtype {', '.join(bad)} is not supported"
    return None


def fission(imported: ImportedModel, *, name: str | None = None) -> Graph:
    """The primitive graph of an imported model (verified), with a warning naming any opaque operators."""
    graph, report = fission_with_report(imported, name=name)
    report.warn()
    return graph


def fission_with_report(imported: ImportedModel, *, name: str | None = None) -> tuple[Graph, FissionReport]:
    model = imported.model
    graph = Graph(name=name or model.graph.name or "model", opset=imported.opset)
    report = FissionReport()
    for cname, value in imported.constants.items():
        graph.add_constant(cname, np.asarray(value))
    initializers = set(imported.constants)
    for inp in model.graph.input:
        if inp.name in initializers:
            continue
        shape, dtype = imported.shapes[inp.name]
        graph.add_tensor(Tensor(name=inp.name, shape=tuple(shape), dtype=dtype))
        graph.inputs.append(inp.name)

    value_of: dict[str, str] = {n: n for n in graph.tensors}  # ONNX tensor name -> IR tensor name
    constant_cache: dict = {}
    for index, node in enumerate(model.graph.node):
        base = node.output[0] if node.output and node.output[0] else f"{node.op_type}_{index}"
        inputs = [value_of[x] if x else None for x in node.input]
        domain_opset = _domain_opset(model, node.domain)
        rule = find_rule(node.op_type, domain_opset, node.domain)
        builder = Builder(graph, base, constant_cache, num_outputs=sum(1 for o in node.output if o))
        why = _why_opaque(rule, node, inputs, graph)
        results = None
        if why is None:
            results = _apply(rule, builder, node, inputs)
            if results is NotImplemented:
                why, results = "its rule declines these attributes or shapes", None
        if results is None:
            outputs = [Tensor(name=o, shape=tuple(imported.shapes[o][0]), dtype=imported.shapes[o][1])
                       for o in node.output if o]
            attrs = {"op_type": node.op_type, "domain": node.domain, "opset": domain_opset,
                     "default_opset": imported.opset, "node": encode_opaque(node)}
            # an If's or a Loop's body may read values of the enclosing graph by name: they become inputs too
            captures = [n for n in outer_scope_names(node) if n in value_of]
            if captures:
                attrs["captures"] = tuple(captures)
            results = builder.opaque([x or "" for x in inputs] + [value_of[n] for n in captures], outputs, attrs)
            report.opaque.setdefault(node.op_type, why)
            report.opaque_count[node.op_type] += 1
            value_of.update(zip([o for o in node.output if o], results))
            continue
        report.lowered[node.op_type] += 1
        for onnx_name, ir_name in zip(node.output, results):
            if not onnx_name or ir_name is None:
                continue
            value_of[onnx_name] = onnx_name if builder.rename(ir_name, onnx_name) else ir_name

    _bind_outputs(graph, model, value_of, constant_cache)
    _drop_unused_constants(graph)
    return verify(graph), report


def _drop_unused_constants(graph: Graph) -> None:
    """Constants no node reads (weights folded into new ones, helpers of declined rules)."""
    used = {name for node in graph.nodes for name in node.inputs}
    for name in [c for c in graph.constants if c not in used]:
        del graph.constants[name]
        del graph.tensors[name]


def _domain_opset(model: onnx.ModelProto, domain: str) -> int:
    domain = "" if domain == "ai.onnx" else domain
    for imp in model.opset_import:
        if (imp.domain or "") == domain or (domain == "" and imp.domain == "ai.onnx"):
            return imp.version
    return 1


def _apply(rule: Rule, builder: Builder, node: onnx.NodeProto, inputs: list[str | None]):
    attrs = _attributes(node)
    unknown = sorted(set(attrs) - rule.attributes)
    if unknown:
        raise KorchError(f"node {node.name or node.output[0]!r} ({node.op_type}): attribute "
                         f"{', '.join(repr(u) for u in unknown)} is not something korch can honour")
    result = rule.fn(builder, *inputs, **attrs)
    if result is NotImplemented:
        _undo(builder)
        return NotImplemented
    results = list(result) if isinstance(result, (list, tuple)) else [result]
    if len(results) < len([o for o in node.output if o]):
        raise AssertionError(f"rule for {node.op_type} returned {len(results)} outputs for {len(node.output)}")
    return results


def _undo(builder: Builder) -> None:
    """Remove what a declining rule had already emitted."""
    graph = builder.graph
    for node in builder.created:
        graph.nodes.remove(node)
        for out in node.outputs:
            graph.tensors.pop(out, None)
    builder.created.clear()


def _bind_outputs(graph: Graph, model: onnx.ModelProto, value_of: dict[str, str], cache: dict) -> None:
    """Graph outputs keep their ONNX names and are each produced by a node of their own."""
    produced = {o for n in graph.nodes for o in n.outputs}
    taken: set[str] = set()
    for out in model.graph.output:
        ir_name = value_of[out.name]
        if ir_name == out.name and ir_name in produced and ir_name not in taken:
            graph.outputs.append(ir_name)
        else:
            builder = Builder(graph, out.name, cache)
            copy = builder.copy(ir_name)
            if not builder.rename(copy, out.name):
                raise KorchError(f"graph output {out.name!r} clashes with another tensor of that name")
            graph.outputs.append(out.name)
        taken.add(out.name)
