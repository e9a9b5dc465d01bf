"""Loading an ONNX model into the clean, fully static form the rest of korch reads.

Owns reading (files, external data, caller's protos), validation, input shape
overrides, and the simplification loop: shape inference, no-op removal,
constant folding and dead code removal, repeated until nothing changes. Every
problem the user can fix is a one-line KorchError.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import GraphProto, ModelProto, NodeProto, TensorProto, helper, numpy_helper

from korch.errors import KorchError
from korch.frontend.fold import Folder
from korch.frontend.graph import remove_dead, topo_sort
from korch.frontend.noops import remove_noops
from korch.frontend.shapes import Shapes, elem_type_of, infer, light_model, probe_with_ort


@dataclass
class ImportedModel:
    """A loaded model: cleaned graph, a static shape for every tensor, its constants."""

    model: onnx.ModelProto
    shapes: dict[str, tuple[tuple[int, ...], str]]
    constants: dict[str, np.ndarray]
    opset: int


def parse_input_shape(spec: str) -> tuple[str, tuple[int, ...]]:
    """``"x=1x3x224x224"`` -> ``("x", (1, 3, 224, 224))``; ``"s="`` -> ``("s", ())``."""
    name, sep, dims = spec.strip().rpartition("=")
    name, dims = name.strip(), dims.strip()
    hint = f"bad input shape '{spec}': expected NAME=D0xD1x... such as x=1x3x224x224"
    if not sep or not name:
        raise KorchError(hint)
    if not dims:
        return name, ()
    parts = dims.replace(",", "x").split("x")
    if not all(p.strip().isdigit() for p in parts):
        raise KorchError(hint)
    return name, tuple(int(p) for p in parts)


def load_onnx(
    model: str | os.PathLike | ModelProto,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
) -> ImportedModel:
    """Load, validate and clean an ONNX model (a path or a proto, which is copied).

    ``input_shapes`` overrides graph input shapes, typically symbolic batch
    dimensions; afterwards every graph input must be static. Raises
    KorchError for anything the user can fix.
    """
    proto, base_dir, label = _read(model)
    opset = _default_opset(proto, label)
    if proto.functions:
        proto = onnx.inliner.inline_local_functions(proto)
        del proto.functions[:]
    graph = proto.graph
    constants, stored = _take_constants(graph, base_dir)
    _drop_constant_inputs(graph, constants)
    _check(proto, constants, label)
    _apply_overrides(graph, input_shapes or {})
    _require_static_inputs(graph)

    nodes, shapes = _simplify(proto, constants, opset)
    _write_back(proto, nodes, constants, stored)
    return ImportedModel(proto, _resolve(proto, constants, shapes), constants, opset)


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
            raise KorchError(f"cannot read initializer '{tensor.name}': {_first_line(exc)}") from None
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


def _drop_constant_inputs(graph: GraphProto, constants: Mapping[str, np.ndarray]) -> None:
    # Old exporters (IR < 4, or keep_initializers_as_inputs) list weights as inputs.
    for i in reversed(range(len(graph.input))):
        if graph.input[i].name in constants:
            del graph.input[i]


def _check(proto: ModelProto, constants: dict[str, np.ndarray], label: str) -> None:
    # The checker serializes its argument: give it the light copy, not the weights.
    light = light_model(
        proto.graph.node, proto.graph, constants, proto.opset_import, proto.ir_version,
        keep_output_types=True,
    )
    try:
        onnx.checker.check_model(light)
    except onnx.checker.ValidationError as exc:
        raise KorchError(f"{label} is not a valid ONNX model: {_first_line(exc)}") from None


def _format_dims(dims: Sequence[int]) -> str:
    return "x".join(str(d) for d in dims)


def _describe(dims) -> str:
    """Model dims as text: 1xbatchx?."""
    return "x".join(
        str(d.dim_value) if d.HasField("dim_value") else (d.dim_param or "?") for d in dims
    )


def _apply_overrides(graph: GraphProto, overrides: Mapping[str, Sequence[int]]) -> None:
    inputs = {value.name: value for value in graph.input}
    for name, dims in overrides.items():
        if name not in inputs:
            known = ", ".join(inputs) or "none"
            raise KorchError(f"--input-shape names '{name}', which is no graph input (inputs: {known})")
        if not all(isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d >= 0 for d in dims):
            raise KorchError(f"--input-shape {name}: dimensions must be integers >= 0, got {list(dims)}")
        dims = tuple(int(d) for d in dims)
        value = inputs[name]
        if not value.type.HasField("tensor_type"):
            raise KorchError(f"graph input '{name}' is not a tensor; korch takes tensor inputs only")
        tensor = value.type.tensor_type
        if tensor.HasField("shape"):
            old = tensor.shape.dim
            model_dims = _describe(old)
            if len(old) != len(dims):
                raise KorchError(
                    f"--input-shape {name}={_format_dims(dims)} has rank {len(dims)}, "
                    f"but graph input '{name}' has rank {len(old)} ({model_dims})"
                )
            for axis, (dim, new) in enumerate(zip(old, dims)):
                if dim.HasField("dim_value") and dim.dim_value >= 0 and dim.dim_value != new:
                    raise KorchError(
                        f"--input-shape {name}={_format_dims(dims)} sets axis {axis} to {new}, "
                        f"but the model fixes it to {dim.dim_value} ({model_dims})"
                    )
        value.type.CopyFrom(helper.make_tensor_type_proto(tensor.elem_type, dims))


def _require_static_inputs(graph: GraphProto) -> None:
    for value in graph.input:
        name = value.name
        if not value.type.HasField("tensor_type"):
            raise KorchError(f"graph input '{name}' is not a tensor; korch takes tensor inputs only")
        tensor = value.type.tensor_type
        if not tensor.elem_type:
            raise KorchError(f"graph input '{name}' has no element type")
        if not tensor.HasField("shape"):
            raise KorchError(
                f"graph input '{name}' has no shape (unknown rank); give it one with "
                f"--input-shape {name}=1x3x224x224"
            )
        dims = tensor.shape.dim
        static = [d.HasField("dim_value") and d.dim_value >= 0 for d in dims]
        if all(static):
            continue
        axis = static.index(False)
        what = f"symbolic dimension '{dims[axis].dim_param}'" if dims[axis].dim_param else "an unknown dimension"
        suggestion = _format_dims(d.dim_value if s else 1 for d, s in zip(dims, static))
        raise KorchError(
            f"graph input '{name}' has {what} at axis {axis}; give it a static shape "
            f"with --input-shape {name}={suggestion}"
        )


def _simplify(
    proto: ModelProto, constants: dict[str, np.ndarray], opset: int
) -> tuple[list[NodeProto], Shapes]:
    """Infer, remove no-ops, fold, drop dead code; until nothing changes."""
    graph = proto.graph
    outputs = [value.name for value in graph.output]
    folder = Folder(proto.opset_import)
    nodes = topo_sort(list(graph.node))
    while True:
        light = light_model(nodes, graph, constants, proto.opset_import, proto.ir_version)
        shapes = infer(light)
        nodes, removed = remove_noops(nodes, outputs, constants, shapes, opset)
        nodes, folded = folder.fold(nodes, constants, shapes)
        nodes, live = remove_dead(topo_sort(nodes), outputs)
        for name in [name for name in constants if name not in live]:
            del constants[name]
        if not (removed or folded):
            return nodes, shapes


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
        numpy_helper.from_array(array, name) for name, array in constants.items() if name not in kept
    )
    del graph.sparse_initializer[:]
    del graph.value_info[:]
    proto.ir_version = max(proto.ir_version, 4)


def _resolve(proto: ModelProto, constants: dict[str, np.ndarray], inferred: Shapes) -> dict:
    """A static shape and dtype for every tensor; onnxruntime fills what onnx could not."""
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
        shapes.update(probe_with_ort(proto, missing))
    outputs = {value.name for value in graph.output}
    inputs = {value.name for value in graph.input}
    for value in graph.output:
        shape, dtype = shapes[value.name]
        value.type.CopyFrom(helper.make_tensor_type_proto(elem_type_of(dtype), shape))
    for name, (shape, dtype) in shapes.items():
        if name not in outputs and name not in inputs and name not in constants:
            graph.value_info.append(
                helper.make_tensor_value_info(name, elem_type_of(dtype), shape)
            )
    return shapes
