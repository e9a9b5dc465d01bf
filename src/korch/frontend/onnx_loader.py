"""Loading an ONNX model into the clean, fully static form the rest of korch reads.

Owns reading (files, external data, caller's protos), validation, and the
simplification loop: shape inference, no-op removal,
constant folding and dead code removal, repeated until nothing changes. Every
problem the user can fix is a one-line KorchError.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
import dataclasses
from dataclasses import dataclass

import numpy as np
import onnx
import onnx.external_data_helper
import onnx.inliner
from onnx import GraphProto, ModelProto, NodeProto, TensorProto, helper, numpy_helper

from korch.errors import KorchError
from korch.frontend.fold import Folder
from korch.frontend.graph import remove_dead, topo_sort
from korch.frontend.inputs import (
    apply_overrides,
    check_input_values,
    drop_constant_inputs,
    parse_input_shape,
    require_static_inputs,
)
from korch.frontend.linear_motion import move_linear_maps
from korch.frontend.space_to_depth import fold_space_to_depth
from korch.frontend.noops import remove_noops
from korch.frontend.shapes import Shapes, elem_type_of, infer, light_model, probe_with_ort


__all__ = ["ImportedModel", "load_onnx", "parse_input_shape"]


@dataclass
class ImportedModel:
    """A loaded model: cleaned graph, a static shape for every tensor, its constants."""

    model: onnx.ModelProto
    shapes: dict[str, tuple[tuple[int, ...], str]]
    constants: dict[str, np.ndarray]
    opset: int
    input_values: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)  # given, typed and shaped
    rewrites: list[str] = dataclasses.field(default_factory=list)  # what the frontend changed beyond folding


def load_onnx(
    model: str | os.PathLike | ModelProto,
    input_shapes: Mapping[str, Sequence[int] | int] | None = None,
    input_values: Mapping[str, np.ndarray] | None = None,
) -> ImportedModel:
    """Load, validate and clean an ONNX model (a path or a proto, which is copied).

    ``input_shapes`` overrides graph input shapes, typically symbolic batch
    dimensions; afterwards every graph input must be static. ``input_values``
    are what onnxruntime runs on where shapes are probed (an input that steers
    an ``If`` needs its real value; others are seeded random). Raises
    KorchError for anything the user can fix.
    """
    proto, base_dir, label = _read(model)
    opset = _default_opset(proto, label)
    if proto.functions:
        try:
            proto = onnx.inliner.inline_local_functions(proto)
        except Exception as exc:  # noqa: BLE001
            reason = _first_line(exc)
            raise KorchError(f"cannot inline the functions of {label}: {reason}") from None
        del proto.functions[:]
    graph = proto.graph
    constants, stored = _take_constants(graph, base_dir)
    drop_constant_inputs(graph, constants)
    apply_overrides(graph, input_shapes or {})
    require_static_inputs(graph)
    _check(proto, constants, label)

    nodes, shapes, rewrites = _simplify(proto, constants, opset)
    _write_back(proto, nodes, constants, stored)
    values = check_input_values(graph, input_values or {})
    return ImportedModel(proto, _resolve(proto, constants, shapes, values), constants, opset, values, rewrites)


def _read(model: str | os.PathLike | ModelProto) -> tuple[ModelProto, str, str]:
    if isinstance(model, ModelProto):
        proto = ModelProto()
        proto.CopyFrom(model)
        return proto, "", "the model"
    path = os.fspath(model)
    if not os.path.exists(path):
        raise KorchError(f"no such file: {path}")
    if os.path.isdir(path):
        raise KorchError(f"{path} is a directory, not an ONNX model")
    try:
        proto = onnx.load(path, load_external_data=False)
    except Exception as exc:  # noqa: BLE001 - protobuf raises several kinds
        raise KorchError(f"{path} is not an ONNX model: {_first_line(exc)}") from None
    if proto.ir_version <= 0 or not proto.HasField("graph") or not proto.opset_import:
        raise KorchError(f"{path} is not an ONNX model: no IR version, graph or opset import")
    base_dir = os.path.dirname(os.path.abspath(path))
    try:
        onnx.external_data_helper.load_external_data_for_model(proto, base_dir)
    except Exception as exc:  # noqa: BLE001
        raise KorchError(f"cannot read the external data of {path}: {_first_line(exc)}") from None
    return proto, base_dir, path


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:300]


def _default_opset(proto: ModelProto, label: str) -> int:
    versions = [o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")]
    if not versions:
        raise KorchError(f"{label} imports no opset of the default ONNX domain")
    newest = onnx.defs.onnx_opset_version()
    if versions[0] > newest:
        raise KorchError(
            f"{label} uses opset {versions[0]}; the installed onnx knows opsets up to {newest}"
        )
    return versions[0]


def _take_constants(graph: GraphProto, base_dir: str) -> tuple[dict[str, np.ndarray], set[str]]:
    """Every initializer as an array, and the names whose TensorProto can be kept as is."""
    constants, stored = {}, set()
    for tensor in graph.initializer:
        try:
            constants[tensor.name] = numpy_helper.to_array(tensor, base_dir)
        except Exception as exc:  # noqa: BLE001
            reason = _first_line(exc)
            raise KorchError(f"cannot read initializer '{tensor.name}': {reason}") from None
        if tensor.data_location != TensorProto.EXTERNAL:
            stored.add(tensor.name)
    for sparse in graph.sparse_initializer:
        values = numpy_helper.to_array(sparse.values, base_dir)
        indices = numpy_helper.to_array(sparse.indices, base_dir)
        dims = tuple(sparse.dims)
        dense = np.zeros(int(np.prod(dims)), dtype=values.dtype)
        flat = indices if indices.ndim == 1 else np.ravel_multi_index(tuple(indices.T), dims)
        dense[flat] = values
        constants[sparse.values.name] = dense.reshape(dims)
    return constants, stored


def _check(proto: ModelProto, constants: dict[str, np.ndarray], label: str) -> None:
    # The checker serializes its argument: give it the light copy, not the weights,
    # with the nodes sorted (korch sorts them anyway).
    graph = proto.graph
    light = light_model(
        topo_sort(list(graph.node)), graph, constants, proto.opset_import, proto.ir_version
    )
    # The checker wants a shape on every graph output; onnxruntime does not, nor
    # does korch, which infers them. Give the copy empty ones to pass that check.
    for value in light.graph.output:
        value.type.tensor_type.shape.SetInParent()
        if not value.type.tensor_type.elem_type:
            value.type.tensor_type.elem_type = TensorProto.FLOAT
    try:
        onnx.checker.check_model(light)
    except onnx.checker.ValidationError as exc:
        # a deprecated schema (GroupNormalization-18) still runs in ONNX Runtime and korch
        if "deprecated" not in str(exc):
            raise KorchError(f"{label} is not a valid ONNX model: {_first_line(exc)}") from None


def _simplify(
    proto: ModelProto, constants: dict[str, np.ndarray], opset: int
) -> tuple[list[NodeProto], Shapes, list[str]]:
    """Infer, remove no-ops, fold, move linear maps, drop dead code; until nothing changes. Also returns a
    line per linear map moved."""
    graph = proto.graph
    outputs = [value.name for value in graph.output]
    folder = Folder(proto.opset_import)
    nodes = topo_sort(list(graph.node))
    rewrites: list[str] = []
    while True:
        moved: list[str] = []
        light = light_model(nodes, graph, constants, proto.opset_import, proto.ir_version)
        shapes = infer(light)
        nodes, removed = remove_noops(nodes, outputs, constants, shapes, opset)
        nodes, folded = folder.fold(nodes, constants, shapes)
        if not (removed or folded):
            nodes, moved = move_linear_maps(nodes, outputs, constants, shapes, opset)
            nodes, folded_stem = fold_space_to_depth(nodes, outputs, constants, shapes)
            moved += folded_stem
            rewrites += moved
        nodes, live = remove_dead(topo_sort(nodes), outputs)
        for name in [name for name in constants if name not in live]:
            del constants[name]
        if not (removed or folded or moved):
            return nodes, shapes, rewrites


def _write_back(
    proto: ModelProto, nodes: list[NodeProto], constants: dict[str, np.ndarray], stored: set[str]
) -> None:
    """Put the cleaned nodes and constants into ``proto``, reusing unchanged initializers."""
    graph = proto.graph
    del graph.node[:]
    graph.node.extend(nodes)
    kept = set()
    for i in reversed(range(len(graph.initializer))):
        name = graph.initializer[i].name
        if name in constants and name in stored and name not in kept:
            kept.add(name)
        else:
            del graph.initializer[i]
    graph.initializer.extend(
        numpy_helper.from_array(array, name)
        for name, array in constants.items()
        if name not in kept
    )
    del graph.sparse_initializer[:]
    del graph.value_info[:]
    proto.ir_version = max(proto.ir_version, 4)


def _resolve(proto: ModelProto, constants: dict[str, np.ndarray], inferred: Shapes,
             values: Mapping[str, np.ndarray]) -> dict:
    """A static shape and dtype for every tensor, written into the model's types.

    onnxruntime fills in what onnx's inference could not.
    """
    graph = proto.graph
    names = [value.name for value in graph.input] + list(constants)
    names += [out for node in graph.node for out in node.output if out]
    names += [value.name for value in graph.output]
    shapes: Shapes = {}
    for name in dict.fromkeys(names):
        if name in constants:
            shapes[name] = (tuple(constants[name].shape), constants[name].dtype.name)
        else:
            shapes[name] = inferred.get(name, (None, None))
    missing = [name for name, (shape, dtype) in shapes.items() if shape is None or dtype is None]
    if missing:
        # Declared output shapes may be symbolic or stale; the probe must not trip on them.
        for value in graph.output:
            shape, dtype = shapes[value.name]
            elem = elem_type_of(dtype) if dtype else value.type.tensor_type.elem_type
            value.type.CopyFrom(helper.make_tensor_type_proto(elem, shape))
        shapes.update(probe_with_ort(proto, missing, values))
    for value in graph.output:
        shape, dtype = shapes[value.name]
        value.type.CopyFrom(helper.make_tensor_type_proto(elem_type_of(dtype), shape))
    skip = {value.name for value in [*graph.input, *graph.output]} | set(constants)
    graph.value_info.extend(
        helper.make_tensor_value_info(name, elem_type_of(dtype), shape)
        for name, (shape, dtype) in shapes.items()
        if name not in skip
    )
    return shapes
