"""Static shape resolution: a shape and dtype for every tensor of the graph.

onnx's shape inference (with data propagation) runs on a light copy of the
model whose large weights are graph inputs carrying only their type, so the
big tensors are never serialized while the small integer constants that
shape computations read stay visible. Where onnx gives up (ops of custom
domains, quirks), the model runs once in onnxruntime on seeded random inputs
with the missing tensors as extra outputs, and their shapes are read off.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import onnx
from onnx import (
    GraphProto,
    ModelProto,
    NodeProto,
    OperatorSetIdProto,
    TensorProto,
    TypeProto,
    ValueInfoProto,
    helper,
    numpy_helper,
)

from korch import config
from korch.errors import KorchError
from korch.frontend.fold import elem_type

Shapes = dict[str, tuple[tuple[int, ...] | None, str | None]]

# Constants up to this many elements (and int64 ones of any size) stay
# initializers in the copy that shape inference sees: data propagation needs them.
SMALL_CONSTANT = 1024


def elem_type_of(dtype: str) -> int:
    """The ONNX element type of a numpy dtype name ("float32", "bfloat16", "object")."""
    if not _ELEM_TYPES:
        for value in sorted(TensorProto.DataType.values()):
            try:
                name = helper.tensor_dtype_to_np_dtype(value).name
            except (KeyError, ValueError, TypeError):
                continue
            _ELEM_TYPES.setdefault(name, value)
    return _ELEM_TYPES[dtype]


_ELEM_TYPES: dict[str, int] = {}


def static_shape(type_proto: TypeProto) -> tuple[tuple[int, ...] | None, str | None]:
    """(shape, dtype name) of a tensor type; None for what is not known statically."""
    if not type_proto.HasField("tensor_type"):
        return None, None
    tensor = type_proto.tensor_type
    dtype = None
    if tensor.elem_type:
        dtype = helper.tensor_dtype_to_np_dtype(tensor.elem_type).name
    if not tensor.HasField("shape"):
        return None, dtype
    dims = []
    for dim in tensor.shape.dim:
        if not dim.HasField("dim_value") or dim.dim_value < 0:
            return None, dtype
        dims.append(dim.dim_value)
    return tuple(dims), dtype


def light_model(
    nodes: Iterable[NodeProto],
    graph: GraphProto,
    constants: dict[str, np.ndarray],
    opset_imports: Sequence[OperatorSetIdProto],
    ir_version: int,
) -> ModelProto:
    """A model of ``nodes`` in which large constants are typed graph inputs.

    Graph outputs keep only their element type: shapes the exporter declared
    (often symbolic) must not shadow inferred ones.
    """
    light = GraphProto(name=graph.name)
    light.node.extend(nodes)
    light.input.extend(graph.input)
    for out in graph.output:
        elem = out.type.tensor_type.elem_type if out.type.HasField("tensor_type") else 0
        light.output.append(helper.make_tensor_value_info(out.name, elem, None))
    for name, array in constants.items():
        if array.size > SMALL_CONSTANT and array.dtype != np.int64:
            light.input.append(helper.make_tensor_value_info(name, elem_type(array), array.shape))
        else:
            light.initializer.append(numpy_helper.from_array(array, name))
    model = helper.make_model(light, opset_imports=opset_imports)
    model.ir_version = max(ir_version, 4)  # IR 4: initializers need not be graph inputs
    return model


def infer(model: ModelProto) -> Shapes:
    """What onnx's shape inference (with data propagation) knows of every tensor."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
    except Exception:  # noqa: BLE001 - inference is best effort; the ORT probe covers gaps
        inferred = model
    graph = inferred.graph
    shapes: Shapes = {}
    for value in [*graph.input, *graph.value_info, *graph.output]:
        shape, dtype = static_shape(value.type)
        old_shape, old_dtype = shapes.get(value.name, (None, None))
        shapes[value.name] = (
            shape if shape is not None else old_shape,
            dtype if dtype is not None else old_dtype,
        )
    return shapes


def _random_input(value: ValueInfoProto, rng: np.random.Generator) -> np.ndarray:
    shape, dtype = static_shape(value.type)
    assert shape is not None and dtype is not None  # graph inputs are static by now
    kind = np.dtype(dtype).kind
    if kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    if kind in "iub":
        # 0 and 1 are valid indices, token ids and flags alike.
        return rng.integers(0, 2, size=shape).astype(dtype)
    if kind in "OSU":
        return np.full(shape, "a", dtype=object)
    return rng.standard_normal(shape).astype(dtype)


def probe_with_ort(model: ModelProto, names: list[str], values: Mapping[str, np.ndarray] | None = None) -> Shapes:
    """Shapes and dtypes of ``names`` from one onnxruntime run of ``model`` on ``values`` (inputs not
    given are seeded random).

    The names become extra graph outputs for the run only; ``model`` is
    restored afterwards. Raises KorchError naming the first tensor when
    onnxruntime cannot run the model.
    """
    from korch.ir.ort import session as ort_session

    graph = model.graph
    n_outputs = len(graph.output)
    declared = {out.name for out in graph.output}
    extra = [name for name in names if name not in declared]
    graph.output.extend(helper.make_empty_tensor_value_info(name) for name in extra)
    try:
        serialized = model.SerializeToString()
    finally:
        del graph.output[n_outputs:]

    rng = np.random.default_rng(config.seed)
    try:
        session = ort_session(serialized, optimize=False)
        feeds = {value.name: _random_input(value, rng) for value in graph.input}
        feeds.update(values or {})
        wanted = [name for name in names]
        results = session.run(wanted, feeds)
    except Exception as exc:  # noqa: BLE001 - any onnxruntime failure is reported the same way
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        random = [value.name for value in graph.input if value.name not in (values or {})]
        hint = f"; inputs {', '.join(random)} were random: give their values with --input-value" if random else ""
        raise KorchError(
            f"cannot find a static shape for tensor '{names[0]}': onnx shape inference "
            f"gives none and onnxruntime cannot run the model ({reason[:300]}){hint}"
        ) from None
    shapes: Shapes = {}
    for name, value in zip(names, results):
        if not isinstance(value, np.ndarray):
            raise KorchError(f"tensor '{name}' is a {type(value).__name__}, not a tensor")
        shapes[name] = (tuple(value.shape), value.dtype.name)
    return shapes
