"""What ``korch inspect`` reports about a model: operators, primitives, opaque ops, bytes, FLOPs."""

from __future__ import annotations

import dataclasses
import os
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path

import onnx

from korch.fission import FissionReport, fission_with_report
from korch.frontend import ImportedModel, load_onnx
from korch.ir import Graph
from korch.ir.analysis import graph_flops, parameter_bytes

@dataclasses.dataclass
class ModelSummary:
    name: str
    opset: int
    inputs: dict[str, list[int]]
    outputs: dict[str, list[int]]
    onnx_nodes: int
    operator_histogram: dict[str, int]
    primitive_nodes: int
    primitive_histogram: dict[str, int]
    primitive_kinds: dict[str, int]
    opaque_operators: dict[str, str]
    parameter_bytes: int
    flops: int

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def summarize(source: onnx.ModelProto, imported: ImportedModel, graph: Graph, report: FissionReport) -> ModelSummary:
    """``source`` is the model as the user gave it: its operator histogram is of the unfolded graph."""
    ops = Counter(n.op_type if not n.domain or n.domain == "ai.onnx" else f"{n.domain}.{n.op_type}"
                  for n in source.graph.node)
    kinds = Counter(n.op.kind.value for n in graph.nodes)
    return ModelSummary(
        name=graph.name,
        opset=imported.opset,
        inputs={n: list(graph.tensors[n].shape) for n in graph.inputs},
        outputs={n: list(graph.tensors[n].shape) for n in graph.outputs},
        onnx_nodes=len(source.graph.node),
        operator_histogram=dict(ops.most_common()),
        primitive_nodes=len(graph.nodes),
        primitive_histogram=graph.op_histogram(),
        primitive_kinds=dict(kinds.most_common()),
        opaque_operators={op: f"x{report.opaque_count[op]}: {why}" for op, why in sorted(report.opaque.items())},
        parameter_bytes=parameter_bytes(graph),
        flops=graph_flops(graph),
    )
