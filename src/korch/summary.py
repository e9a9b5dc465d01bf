"""What ``korch inspect`` reports about a model: operators, primitives, opaque ops, bytes, FLOPs.

``load_model`` is the one way the CLI and the Python API turn a user's model
reference (a path, ``zoo:NAME`` or a ModelProto) into an imported model and
its primitive graph.
"""

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

ZOO_PREFIX = "zoo:"


def resolve_model(model: str | os.PathLike | onnx.ModelProto) -> str | Path | onnx.ModelProto:
    """``zoo:NAME`` -> the path of the exported zoo model; anything else unchanged."""
    if isinstance(model, str) and model.startswith(ZOO_PREFIX):
        from korch import zoo

        return zoo.export(model[len(ZOO_PREFIX):])
    return model


def load_model(model: str | os.PathLike | onnx.ModelProto,
               input_shapes: Mapping[str, Sequence[int]] | None = None) -> tuple[ImportedModel, Graph, FissionReport]:
    imported = load_onnx(resolve_model(model), input_shapes)
    name = Path(model).stem if isinstance(model, (str, os.PathLike)) else None
    graph, report = fission_with_report(imported, name=name.removeprefix(ZOO_PREFIX) if name else None)
    report.warn()
    return imported, graph, report


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
