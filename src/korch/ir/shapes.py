"""Shape and dtype rules of the primitives: ``infer(op, attrs, inputs) -> (shape, dtype)``.

The builder of fission uses these rules to type every new tensor, and
``verify`` re-runs them to check a graph. OPAQUE has no rule: its output types
come from the imported model.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from korch.ir import ops
from korch.ir.graph import Tensor
from korch.ir.ops import Op

Shape = tuple[int, ...]


class IRError(ValueError):
    """A primitive whose inputs or attributes break its op's rules."""


def _check(cond: bool, message: str) -> None:
    if not cond:
        raise IRError(message)


def broadcast_shapes(*shapes: Shape) -> Shape:
    try:
        return tuple(int(d) for d in np.broadcast_shapes(*shapes))
    except ValueError:
        raise IRError(f"shapes {list(shapes)} do not broadcast") from None


def _elementwise(op: Op, attrs: Mapping[str, Any], xs: Sequence[Tensor]) -> tuple[Shape, str]:
    arity = 1 if op in ops.UNARY or op is Op.CAST else 3 if op is Op.WHERE else 2
    _check(len(xs) == arity, f"{op.value} takes {arity} inputs, got {len(xs)}")
    shape = broadcast_shapes(*(x.shape for x in xs))
    if op is Op.CAST:
        return shape, attrs["to"]
    values = xs[1:] if op is Op.WHERE else xs
    if op is Op.WHERE:
        _check(xs[0].dtype == "bool", f"Where's condition must be bool, got {xs[0].dtype}")
    dtypes = {x.dtype for x in values}
    _check(len(dtypes) == 1, f"{op.value} mixes dtypes {sorted(dtypes)}")
    (dtype,) = dtypes
    if op in ops.LOGICAL or op is Op.NOT:
        _check(dtype == "bool", f"{op.value} needs bool inputs, got {dtype}")
    if op in ops.COMPARISON or op in (Op.ISNAN, Op.ISINF):
        return shape, "bool"
    return shape, dtype


def _reduce(op: Op, attrs: Mapping[str, Any], xs: Sequence[Tensor]) -> tuple[Shape, str]:
    (x,) = xs
    axes = attrs["axes"]
    _check(len(axes) > 0 and list(axes) == sorted(set(axes)), f"{op.value} axes {axes} must be sorted, unique, non-empty")
    _check(all(0 <= a < x.rank for a in axes), f"{op.value} axes {axes} out of range for rank {x.rank}")
    if attrs["keepdims"]:
        shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape))
    else:
        shape = tuple(d for i, d in enumerate(x.shape) if i not in axes)
    return shape, x.dtype


def window_output_size(size: int, kernel: int, stride: int, begin: int, end: int, dilation: int) -> int:
    return (size + begin + end - dilation * (kernel - 1) - 1) // stride + 1


def _window(op: Op, attrs: Mapping[str, Any], xs: Sequence[Tensor]) -> tuple[Shape, str]:
    (x,) = xs
    kernel, strides, pads, dilations = attrs["kernel"], attrs["strides"], attrs["pads"], attrs["dilations"]
    k = len(kernel)
    _check(x.rank == k + 2, f"{op.value} with a {k}-d kernel needs a rank-{k + 2} input, got {x.shape}")
    _check(len(strides) == k and len(dilations) == k and len(pads) == 2 * k, f"{op.value} attribute lengths disagree")
    spatial = tuple(
        window_output_size(x.shape[2 + i], kernel[i], strides[i], pads[i], pads[k + i], dilations[i]) for i in range(k)
    )
    _check(all(s > 0 for s in spatial), f"{op.value} output would be empty: {spatial}")
    return x.shape[:2] + spatial, x.dtype


def _transpose(attrs, xs):
    (x,) = xs
    perm = attrs["perm"]
    _check(sorted(perm) == list(range(x.rank)), f"Transpose perm {perm} is not a permutation of rank {x.rank}")
    return tuple(x.shape[p] for p in perm), x.dtype


def _reshape(attrs, xs):
    (x,) = xs
    shape = tuple(attrs["shape"])
    _check(all(d >= 0 for d in shape), f"Reshape to {shape}: dims must be resolved")
    _check(int(np.prod(shape, dtype=np.int64)) == x.numel, f"Reshape {x.shape} -> {shape} changes the element count")
    return shape, x.dtype


def _slice(attrs, xs):
    (x,) = xs
    starts, steps, shape = attrs["starts"], attrs["steps"], tuple(attrs["shape"])
    _check(len(starts) == len(steps) == len(shape) == x.rank, "Slice needs one start, step and size per axis")
    for axis, (start, step, count) in enumerate(zip(starts, steps, shape)):
        _check(step != 0, "Slice step 0")
        if count:
            last = start + (count - 1) * step
            _check(0 <= start < x.shape[axis] and 0 <= last < x.shape[axis],
                   f"Slice axis {axis}: start {start}, step {step}, count {count} leaves [0, {x.shape[axis]})")
    return shape, x.dtype


def _concat(attrs, xs):
    axis = attrs["axis"]
    _check(len(xs) >= 1, "Concat needs inputs")
    first = xs[0]
    _check(0 <= axis < first.rank, f"Concat axis {axis} out of range")
    for x in xs[1:]:
        _check(x.dtype == first.dtype, "Concat mixes dtypes")
        _check(x.rank == first.rank and all(a == b for i, (a, b) in enumerate(zip(x.shape, first.shape)) if i != axis),
               f"Concat shapes {first.shape} and {x.shape} disagree off axis {axis}")
    shape = list(first.shape)
    shape[axis] = sum(x.shape[axis] for x in xs)
    return tuple(shape), first.dtype


def _pad(attrs, xs):
    x = xs[0]
    pads, mode = attrs["pads"], attrs["mode"]
    _check(len(pads) == 2 * x.rank and all(p >= 0 for p in pads), f"Pad pads {pads} must be 2*rank non-negatives")
    _check(mode in ("constant", "reflect", "edge", "wrap"), f"Pad mode {mode!r}")
    if len(xs) == 2:
        _check(xs[1].shape == () and xs[1].dtype == x.dtype, "Pad value must be a 0-d tensor of the input's dtype")
    if mode == "reflect":
        _check(all(pads[i] < x.shape[i] and pads[x.rank + i] < x.shape[i] for i in range(x.rank)),
               "reflect Pad wider than the input")
    return tuple(d + pads[i] + pads[x.rank + i] for i, d in enumerate(x.shape)), x.dtype


def _gather(attrs, xs):
    x, indices = xs
    axis = attrs["axis"]
    _check(0 <= axis < x.rank, f"Gather axis {axis} out of range")
    _check(indices.dtype == "int64", "Gather indices must be int64")
    return x.shape[:axis] + indices.shape + x.shape[axis + 1:], x.dtype


def _broadcast(attrs, xs):
    (x,) = xs
    shape = tuple(attrs["shape"])
    _check(broadcast_shapes(x.shape, shape) == shape, f"Broadcast {x.shape} -> {shape} is not a numpy broadcast")
    return shape, x.dtype


def _matmul(attrs, xs):
    a, b = xs
    _check(a.rank >= 2 and b.rank >= 2, f"MatMul needs rank >= 2, got {a.shape} and {b.shape}")
    _check(a.shape[-1] == b.shape[-2], f"MatMul inner dims disagree: {a.shape} @ {b.shape}")
    _check(a.dtype == b.dtype, "MatMul mixes dtypes")
    batch = broadcast_shapes(a.shape[:-2], b.shape[:-2])
    return batch + (a.shape[-2], b.shape[-1]), a.dtype


def _conv_common(attrs, x: Tensor, w: Tensor, name: str) -> int:
    k = x.rank - 2
    _check(1 <= k <= 3 and w.rank == x.rank, f"{name} needs (N, C, *spatial) with 1-3 spatial axes, got {x.shape} and {w.shape}")
    _check(x.dtype == w.dtype, f"{name} mixes dtypes")
    _check(len(attrs["strides"]) == k and len(attrs["dilations"]) == k and len(attrs["pads"]) == 2 * k,
           f"{name} attribute lengths disagree with {k} spatial axes")
    return k


def _conv(attrs, xs):
    x, w = xs
    k = _conv_common(attrs, x, w, "Conv")
    group, strides, pads, dilations = attrs["group"], attrs["strides"], attrs["pads"], attrs["dilations"]
    _check(x.shape[1] == w.shape[1] * group and w.shape[0] % group == 0, f"Conv channels: x {x.shape}, w {w.shape}, group {group}")
    spatial = tuple(
        window_output_size(x.shape[2 + i], w.shape[2 + i], strides[i], pads[i], pads[k + i], dilations[i]) for i in range(k)
    )
    _check(all(s > 0 for s in spatial), f"Conv output would be empty: {spatial}")
    return (x.shape[0], w.shape[0]) + spatial, x.dtype


def _conv_transpose(attrs, xs):
    x, w = xs
    k = _conv_common(attrs, x, w, "ConvTranspose")
    group, strides, pads, dilations = attrs["group"], attrs["strides"], attrs["pads"], attrs["dilations"]
    output_padding = attrs["output_padding"]
    _check(x.shape[1] == w.shape[0], f"ConvTranspose channels: x {x.shape}, w {w.shape}")
    spatial = tuple(
        strides[i] * (x.shape[2 + i] - 1) + output_padding[i] + dilations[i] * (w.shape[2 + i] - 1) + 1 - pads[i] - pads[k + i]
        for i in range(k)
    )
    _check(all(s > 0 for s in spatial), f"ConvTranspose output would be empty: {spatial}")
    return (x.shape[0], w.shape[1] * group) + spatial, x.dtype


_RULES: dict[Op, Callable[[Mapping[str, Any], Sequence[Tensor]], tuple[Shape, str]]] = {
    Op.TRANSPOSE: _transpose,
    Op.RESHAPE: _reshape,
    Op.SLICE: _slice,
    Op.CONCAT: _concat,
    Op.PAD: _pad,
    Op.GATHER: _gather,
    Op.BROADCAST: _broadcast,
    Op.MATMUL: _matmul,
    Op.CONV: _conv,
    Op.CONV_TRANSPOSE: _conv_transpose,
}


def infer(op: Op, attrs: Mapping[str, Any], inputs: Sequence[Tensor]) -> tuple[Shape, str]:
    """The output shape and dtype of a single-output primitive; raises IRError if ill-formed."""
    if op in ops.ELEMENTWISE:
        return _elementwise(op, attrs, inputs)
    if op in ops.REDUCE:
        return _reduce(op, attrs, inputs)
    if op in ops.WINDOW:
        return _window(op, attrs, inputs)
    if op in _RULES:
        return _RULES[op](attrs, inputs)
    raise IRError(f"{op.value} has no shape rule (opaque outputs are typed by the model)")
