"""Graph inputs: which are real, user overrides of their shapes, and the static check.

Initializers that old exporters also list as graph inputs are constants, not
inputs. ``--input-shape NAME=1x3x224x224`` (parsed by ``parse_input_shape``)
replaces an input's dims, ``--dim seq=128`` (``parse_dim``) sets every input
dimension the model names ``seq``; afterwards every input must be fully static.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np
from onnx import GraphProto, helper

from korch.errors import KorchError


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


def parse_dim(spec: str) -> tuple[str, int]:
    """``"seq=128"`` -> ``("seq", 128)``."""
    name, sep, size = spec.strip().rpartition("=")
    if not sep or not name.strip() or not size.strip().isdigit() or int(size) < 1:
        raise KorchError(f"bad --dim '{spec}': expected NAME=SIZE with SIZE >= 1, such as seq=128")
    return name.strip(), int(size)


def parse_dynamic(spec: str) -> tuple[str, int, int]:
    """``"seq=1..512"`` -> ``("seq", 1, 512)``: a dimension and the range of sizes one executable serves."""
    name, sep, span = spec.strip().rpartition("=")
    low, dots, high = span.strip().partition("..")
    if (not sep or not name.strip() or not dots or not low.strip().isdigit() or not high.strip().isdigit()
            or not 1 <= int(low) < int(high)):
        raise KorchError(f"bad --dynamic '{spec}': expected NAME=LOW..HIGH with 1 <= LOW < HIGH, such as seq=1..512")
    return name.strip(), int(low), int(high)


def parse_input_value(spec: str) -> tuple[str, np.ndarray]:
    """``"sr=16000"`` -> ``("sr", array(16000.))``; ``"ids=1,2,3"`` -> a 1-D array (cast to the input's type
    by ``check_input_values``)."""
    name, sep, text = spec.strip().partition("=")
    try:
        numbers = [float(v) for v in text.split(",")] if sep and name.strip() and text.strip() else None
    except ValueError:
        numbers = None
    if numbers is None:
        raise KorchError(f"bad --input-value '{spec}': expected NAME=NUMBER or NAME=N1,N2,..., such as sr=16000")
    return name.strip(), np.array(numbers[0] if len(numbers) == 1 else numbers)


def check_input_values(graph: GraphProto, values: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``values`` cast to their graph inputs' element types and broadcast to their (static) shapes."""
    from onnx import helper as onnx_helper

    inputs = {value.name: value for value in graph.input}
    checked = {}
    for name, value in values.items():
        if name not in inputs:
            raise KorchError(f"--input-value names '{name}', which is no graph input (inputs: {', '.join(inputs)})")
        tensor = inputs[name].type.tensor_type
        dtype = onnx_helper.tensor_dtype_to_np_dtype(tensor.elem_type)
        shape = tuple(d.dim_value for d in tensor.shape.dim)
        value = np.asarray(value)
        cast = value.astype(dtype)
        if value.dtype.kind == "f" and dtype.kind in "iub" and not np.array_equal(cast, value):
            raise KorchError(f"--input-value {name}: {value.tolist()} is not a whole number; {name} is {dtype}")
        try:
            checked[name] = np.array(np.broadcast_to(cast, shape))  # a copy; ascontiguousarray makes 0-d 1-d
        except ValueError:
            raise KorchError(f"--input-value {name}: {value.size} value(s) do not fit its shape "
                             f"{_format_dims(shape) or 'scalar'}") from None
    return checked


def drop_constant_inputs(graph: GraphProto, constants: Mapping[str, np.ndarray]) -> None:
    # Old exporters (IR < 4, or keep_initializers_as_inputs) list weights as inputs.
    for i in reversed(range(len(graph.input))):
        if graph.input[i].name in constants:
            del graph.input[i]


def _format_dims(dims: Iterable[int]) -> str:
    return "x".join(str(d) for d in dims)


def _describe(dims) -> str:
    """Model dims as text: 1xbatchx?."""
    return "x".join(
        str(d.dim_value) if d.HasField("dim_value") else (d.dim_param or "?") for d in dims
    )


def _is_dim(d) -> bool:
    return isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d >= 0


def apply_overrides(graph: GraphProto, overrides: Mapping[str, Sequence[int] | int]) -> None:
    """Replace the dims of the named graph inputs (a sequence of dims, ``--input-shape``; they must agree with
    the model) and set the named dimensions (an int, ``--dim``)."""
    named = {name: size for name, size in overrides.items() if _is_dim(size)}
    _set_named_dims(graph, named)
    inputs = {value.name: value for value in graph.input}
    for name, dims in overrides.items():
        if name in named:
            continue
        if name not in inputs:
            known = ", ".join(inputs) or "none"
            raise KorchError(
                f"--input-shape names '{name}', which is no graph input (inputs: {known})"
            )
        if isinstance(dims, (str, bytes)) or not all(_is_dim(d) for d in dims):
            raise KorchError(f"--input-shape {name}: dimensions must be integers >= 0, got {dims!r}")
        dims = tuple(int(d) for d in dims)
        value = inputs[name]
        if not value.type.HasField("tensor_type"):
            raise KorchError(f"graph input '{name}' is not a tensor; korch takes tensor inputs only")
        tensor = value.type.tensor_type
        if tensor.HasField("shape"):
            _check_agrees(name, dims, tensor.shape.dim)
        value.type.CopyFrom(helper.make_tensor_type_proto(tensor.elem_type, dims))


def _set_named_dims(graph: GraphProto, sizes: Mapping[str, int]) -> None:
    dims = [d for value in graph.input if value.type.HasField("tensor_type")
            for d in value.type.tensor_type.shape.dim]
    names = sorted({d.dim_param for d in dims if d.dim_param})
    for name, size in sizes.items():
        if name not in names:
            raise KorchError(f"no input dimension is called '{name}' (--dim, --dynamic; the model's named "
                             f"dimensions: {', '.join(names) or 'none'})")
        if size < 1:
            raise KorchError(f"--dim {name}: the size must be >= 1, got {size}")
    for d in dims:
        if d.dim_param in sizes:
            d.dim_value = int(sizes[d.dim_param])  # clears dim_param: the two are one field's alternatives


def _check_agrees(name: str, dims: tuple[int, ...], old) -> None:
    given = f"--input-shape {name}={_format_dims(dims)}"
    if len(old) != len(dims):
        raise KorchError(
            f"{given} has rank {len(dims)}, but graph input '{name}' has rank {len(old)} "
            f"({_describe(old)})"
        )
    for axis, (dim, new) in enumerate(zip(old, dims)):
        if dim.HasField("dim_value") and dim.dim_value >= 0 and dim.dim_value != new:
            raise KorchError(
                f"{given} sets axis {axis} to {new}, but the model fixes it to {dim.dim_value} "
                f"({_describe(old)})"
            )


def require_static_inputs(graph: GraphProto) -> None:
    """Every graph input must be a tensor of known element type and static shape."""
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
        param = dims[axis].dim_param
        what = f"symbolic dimension '{param}'" if param else "an unknown dimension"
        suggestion = _format_dims(d.dim_value if s else 1 for d, s in zip(dims, static))
        by_name = f"--dim {param}=N or " if param else ""
        raise KorchError(
            f"graph input '{name}' has {what} at axis {axis}; give it a static shape "
            f"with {by_name}--input-shape {name}={suggestion}"
        )
