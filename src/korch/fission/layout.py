"""Fission rules of layout operators: every data movement of ONNX as TRANSPOSE, RESHAPE, SLICE,
CONCAT, PAD, GATHER or BROADCAST, plus the operators that only make constants.

Shape-like inputs (Reshape's shape, Slice's starts, Pad's pads, Gather's
indices, ...) must be constants: the IR is fully static. Rules whose result
would simply be their input emit a copy, so every output is produced by a node.
Shape, Size, Constant and ConstantOfShape become constants (the frontend
normally folds them first).
"""

from __future__ import annotations

import numpy as np

from korch.fission.builder import Builder, is_supported_dtype, normalize_axes
from korch.fission.registry import fission_rule
from korch.ir.ops import Op


def _produced(b: Builder, out: str, x: str) -> str:
    """``out``, or a copy of ``x`` when the rule turned out to be the identity."""
    return b.copy(x) if out == x else out


def _axis(axis: int, rank: int) -> int:
    (axis,) = normalize_axes([axis], rank)
    return axis


def _ints(b: Builder, name: str | None) -> list[int] | None:
    value = b.value(name)
    return None if value is None else [int(v) for v in np.asarray(value).reshape(-1)]


# -- permutation and reshaping ------------------------------------------------------

@fission_rule("Transpose", since=1)
def Transpose(b: Builder, x, *, perm=None):
    perm = list(reversed(range(b.rank(x)))) if perm is None else perm
    return _produced(b, b.transpose(x, perm), x)


def _reshape(b: Builder, x: str, target: list[int], allowzero: int) -> str:
    dims = [b.shape(x)[i] if d == 0 and not allowzero else d for i, d in enumerate(target)]
    if -1 in dims:
        known = int(np.prod([d for d in dims if d != -1], dtype=np.int64))
        dims[dims.index(-1)] = int(np.prod(b.shape(x), dtype=np.int64)) // known if known else 0
    return _produced(b, b.reshape(x, dims), x)


@fission_rule("Reshape", since=1)
def Reshape_1(b: Builder, x, *, shape, consumed_inputs=None):
    return _reshape(b, x, list(shape), 0)


@fission_rule("Reshape", since=5, const_inputs=(1,))
def Reshape(b: Builder, x, shape, *, allowzero=0):
    return _reshape(b, x, _ints(b, shape), allowzero)


@fission_rule("Flatten", since=1)
def Flatten(b: Builder, x, *, axis=1):
    shape = b.shape(x)
    axis = axis + len(shape) if axis < 0 else axis
    if not 0 <= axis <= len(shape):
        raise ValueError(f"Flatten axis {axis} out of range for rank {len(shape)}")
    return _produced(b, b.reshape(x, (int(np.prod(shape[:axis])), int(np.prod(shape[axis:])))), x)


def _squeeze(b: Builder, x: str, axes) -> str:
    shape = b.shape(x)
    axes = [i for i, d in enumerate(shape) if d == 1] if axes is None else normalize_axes(axes, len(shape))
    if any(shape[a] != 1 for a in axes):
        raise ValueError(f"Squeeze of axes {list(axes)} that are not 1 in {shape}")
    return _produced(b, b.reshape(x, [d for i, d in enumerate(shape) if i not in axes]), x)


def _unsqueeze(b: Builder, x: str, axes) -> str:
    shape = list(b.shape(x))
    for a in normalize_axes(axes, len(shape) + len(axes)):
        shape.insert(a, 1)
    return _produced(b, b.reshape(x, shape), x)


@fission_rule("Squeeze", since=1)
def Squeeze_1(b: Builder, x, *, axes=None):
    return _squeeze(b, x, axes)


@fission_rule("Squeeze", since=13, const_inputs=(1,))
def Squeeze(b: Builder, x, axes=None):
    return _squeeze(b, x, _ints(b, axes))


@fission_rule("Unsqueeze", since=1)
def Unsqueeze_1(b: Builder, x, *, axes):
    return _unsqueeze(b, x, list(axes))


@fission_rule("Unsqueeze", since=13, const_inputs=(1,))
def Unsqueeze(b: Builder, x, axes):
    return _unsqueeze(b, x, _ints(b, axes))


# -- concatenation and splitting ----------------------------------------------------

@fission_rule("Concat", since=1)
def Concat(b: Builder, *xs, axis=1):  # axis defaults to 1 in opset 1 only; it is required later
    return _produced(b, b.concat(list(xs), _axis(axis, b.rank(xs[0]))), xs[0])


def _split(b: Builder, x: str, axis: int, sizes: list[int] | None, parts: int | None = None):
    axis = _axis(axis, b.rank(x))
    dim = b.shape(x)[axis]
    if sizes is None:
        parts = parts or b.num_outputs
        chunk = -(-dim // parts)  # an uneven split makes the last part smaller
        sizes = [chunk] * (parts - 1) + [dim - chunk * (parts - 1)]
    if sum(sizes) != dim or min(sizes) < 0:
        raise ValueError(f"Split sizes {sizes} do not partition a dimension of {dim}")
    offsets = np.cumsum([0] + list(sizes[:-1]))
    return tuple(_produced(b, b.slice_axis(x, axis, int(o), int(n)), x) for o, n in zip(offsets, sizes))


@fission_rule("Split", since=1, const_inputs=(1,))
def Split_1(b: Builder, x, split_input=None, *, axis=0, split=None):
    sizes = list(split) if split is not None else _ints(b, split_input)
    return _split(b, x, axis, sizes)


@fission_rule("Split", since=13, const_inputs=(1,))
def Split_13(b: Builder, x, split=None, *, axis=0):
    return _split(b, x, axis, _ints(b, split))


@fission_rule("Split", since=18, const_inputs=(1,))
def Split(b: Builder, x, split=None, *, axis=0, num_outputs=None):
    return _split(b, x, axis, _ints(b, split), num_outputs)


# -- slicing and padding --------------------------------------------------------------

def _slice(b: Builder, x: str, starts, ends, axes, steps) -> str:
    shape = b.shape(x)
    rank = len(shape)
    first, stride, count = [0] * rank, [1] * rank, list(shape)
    axes = range(len(starts)) if axes is None else axes
    steps = [1] * len(starts) if steps is None else steps
    for axis, start, end, step in zip(axes, starts, ends, steps, strict=True):
        axis = _axis(axis, rank)
        dim = shape[axis]
        if step == 0:
            raise ValueError("Slice step 0")
        start = start + dim if start < 0 else start
        end = end + dim if end < 0 else end
        # The spec's clamping (not Python's): a negative step clamps end to [-1, dim-1].
        if step > 0:
            start, end = min(max(start, 0), dim), min(max(end, 0), dim)
            n = -(-(end - start) // step)
        else:
            start, end = min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)
            n = -(-(start - end) // -step)
        n = max(n, 0) if dim else 0
        first[axis], stride[axis], count[axis] = (start if n else 0), step, n
    if first == [0] * rank and stride == [1] * rank and tuple(count) == shape:
        return b.copy(x)
    return b.emit(Op.SLICE, x, starts=tuple(first), steps=tuple(stride), shape=tuple(count))


@fission_rule("Slice", since=1)
def Slice_1(b: Builder, x, *, starts, ends, axes=None):
    return _slice(b, x, list(starts), list(ends), axes, None)


@fission_rule("Slice", since=10, const_inputs=(1, 2, 3, 4))
def Slice(b: Builder, x, starts, ends, axes=None, steps=None):
    return _slice(b, x, _ints(b, starts), _ints(b, ends), _ints(b, axes), _ints(b, steps))


def _pad(b: Builder, x: str, pads: list[int], mode: str, value, axes) -> str:
    rank = b.rank(x)
    axes = list(range(rank)) if axes is None else [_axis(a, rank) for a in axes]
    if len(pads) != 2 * len(axes):
        raise ValueError(f"Pad has {len(pads)} pads for {len(axes)} axes")
    begin, end = [0] * rank, [0] * rank
    for i, a in enumerate(axes):
        begin[a], end[a] = pads[i], pads[len(axes) + i]
    out = x
    if min(begin + end) < 0:  # negative pads crop first
        shape = b.shape(x)
        starts = [max(-p, 0) for p in begin]
        counts = [max(d - s - max(-e, 0), 0) for d, s, e in zip(shape, starts, end)]
        starts = [s if n else 0 for s, n in zip(starts, counts)]
        out = b.emit(Op.SLICE, x, starts=tuple(starts), steps=(1,) * rank, shape=tuple(counts))
    begin, end = [max(p, 0) for p in begin], [max(p, 0) for p in end]
    if mode == "reflect" and any(max(p, q) >= d for p, q, d in zip(begin, end, b.shape(out)) if p or q):
        return NotImplemented  # ONNX Runtime rejects it too; the reflection would need several folds
    if not any(begin + end):
        return _produced(b, out, x)
    inputs = [out]
    if mode == "constant" and isinstance(value, str):  # a fill value computed at run time
        padded = b.emit(Op.PAD, out, pads=tuple(begin + end), mode=mode)
        return b.where(b.const(_border(b.shape(out), begin, end)), b.reshape(value, ()), padded)
    if mode == "constant" and value is not None and np.asarray(value).reshape(-1)[0] != 0:
        inputs.append(b.const(np.asarray(value).reshape(()).astype(b.dtype(x))))
    return b.emit(Op.PAD, *inputs, pads=tuple(begin + end), mode=mode)


def _border(shape, begin, end) -> np.ndarray:
    """True at the padded positions (size-1 axes where nothing is padded)."""
    mask = np.zeros([d + p + q if p or q else 1 for d, p, q in zip(shape, begin, end)], dtype=bool)
    for axis, (d, p, q) in enumerate(zip(shape, begin, end)):
        if p or q:
            pos = np.arange(d + p + q)
            mask |= ((pos < p) | (pos >= p + d)).reshape((-1,) + (1,) * (len(shape) - axis - 1))
    return mask


@fission_rule("Pad", since=1)
def Pad_1(b: Builder, x, *, paddings, mode="constant", value=0.0):
    return _pad(b, x, list(paddings), mode, value, None)


@fission_rule("Pad", since=2)
def Pad_2(b: Builder, x, *, pads, mode="constant", value=0.0):
    return _pad(b, x, list(pads), mode, value, None)


@fission_rule("Pad", since=11, const_inputs=(1, 3))
def Pad(b: Builder, x, pads, constant_value=None, axes=None, *, mode="constant"):
    value = b.value(constant_value)  # the tensor's name when it is not a constant
    return _pad(b, x, _ints(b, pads), mode, constant_value if value is None else value, _ints(b, axes))


# -- broadcasting and repetition --------------------------------------------------------

@fission_rule("Expand", since=8, const_inputs=(1,))
def Expand(b: Builder, x, shape):
    target = np.broadcast_shapes(b.shape(x), tuple(_ints(b, shape)))
    return _produced(b, b.broadcast(x, target), x)


def _tile(b: Builder, x: str, repeats: list[int]) -> str:
    shape = b.shape(x)
    if len(repeats) != len(shape) or min(repeats, default=1) < 0:
        raise ValueError(f"Tile repeats {repeats} do not fit rank {len(shape)}")
    # (d0, d1) tiled by (r0, r1) is (1, d0, 1, d1) broadcast to (r0, d0, r1, d1), then merged.
    spread, tiled = [], []
    for d, r in zip(shape, repeats):
        spread += [1, d] if r != 1 else [d]
        tiled += [r, d] if r != 1 else [d]
    out = b.broadcast(b.reshape(x, spread), tiled)
    return _produced(b, b.reshape(out, [d * r for d, r in zip(shape, repeats)]), x)


@fission_rule("Tile", since=1, const_inputs=(1, 2))
def Tile_1(b: Builder, x, tiles, axis):
    repeats = [1] * b.rank(x)
    repeats[_axis(_ints(b, axis)[0], b.rank(x))] = _ints(b, tiles)[0]
    return _tile(b, x, repeats)


@fission_rule("Tile", since=6, const_inputs=(1,))
def Tile(b: Builder, x, repeats):
    return _tile(b, x, _ints(b, repeats))


# -- gathers with constant indices ------------------------------------------------------

def _indices(b: Builder, name: str, dim) -> np.ndarray:
    """Constant indices as int64 with negatives counted from the end; ``dim`` may be an array."""
    idx = np.asarray(b.value(name)).astype(np.int64)
    idx = np.where(idx < 0, idx + dim, idx)
    if idx.size and (idx.min() < 0 or np.any(idx >= dim)):
        raise ValueError(f"gather index out of range [0, {dim})")
    return idx


@fission_rule("Gather", since=1)
def Gather(b: Builder, x, indices, *, axis=0):
    axis = _axis(axis, b.rank(x))
    size = b.shape(x)[axis]
    if b.value(indices) is not None:
        return b.gather(x, _indices(b, indices, size), axis)
    # indices computed at run time (an embedding lookup of input_ids): negatives count from the end, as in ONNX,
    # so that the GATHER primitive always reads [0, size) and fuses with what follows
    idx = b.cast(indices, "int64")
    negative = b.emit(Op.LESS, idx, b.scalar(0, like=idx))
    return b.emit(Op.GATHER, x, b.where(negative, b.add(idx, b.scalar(size, like=idx)), idx), axis=axis)


def _flat(b: Builder, x: str, leading: int) -> str:
    """``x`` with its first ``leading`` axes merged into one."""
    shape = b.shape(x)
    return b.reshape(x, (int(np.prod(shape[:leading], dtype=np.int64)),) + shape[leading:])


@fission_rule("GatherElements", since=11, const_inputs=(1,))
def GatherElements(b: Builder, x, indices, *, axis=0):
    shape = b.shape(x)
    axis = _axis(axis, len(shape))
    idx = _indices(b, indices, shape[axis])
    coords = list(np.indices(idx.shape, dtype=np.int64))
    coords[axis] = idx
    # one GATHER on the flattened input, with each output's flat source position
    return b.gather(_flat(b, x, len(shape)), np.ravel_multi_index(coords, shape), 0)


@fission_rule("GatherND", since=11, const_inputs=(1,))
def GatherND(b: Builder, x, indices, *, batch_dims=0):
    shape = b.shape(x)
    idx = np.asarray(b.value(indices)).astype(np.int64)
    depth = idx.shape[-1]
    batch, inner = shape[:batch_dims], shape[batch_dims:batch_dims + depth]
    idx = _indices(b, indices, np.asarray(inner, dtype=np.int64))
    flat = np.zeros(idx.shape[:-1], dtype=np.int64)
    for k, d in enumerate(inner):  # row-major position inside the indexed block
        flat = flat * d + idx[..., k]
    batch_index = np.arange(int(np.prod(batch, dtype=np.int64)), dtype=np.int64)
    flat += batch_index.reshape(batch + (1,) * (idx.ndim - 1 - batch_dims)) * int(np.prod(inner, dtype=np.int64))
    return b.gather(_flat(b, x, batch_dims + depth), flat, 0)


# -- block rearrangements -----------------------------------------------------------------

def _depth_to_space(b: Builder, x: str, k: int, mode: str) -> str:
    n, c, h, w = b.shape(x)
    if mode == "DCR":
        y = b.transpose(b.reshape(x, (n, k, k, c // (k * k), h, w)), (0, 3, 4, 1, 5, 2))
    else:
        y = b.transpose(b.reshape(x, (n, c // (k * k), k, k, h, w)), (0, 1, 4, 2, 5, 3))
    return b.reshape(y, (n, c // (k * k), h * k, w * k))


def _space_to_depth(b: Builder, x: str, k: int, mode: str) -> str:
    n, c, h, w = b.shape(x)
    perm = (0, 3, 5, 1, 2, 4) if mode == "DCR" else (0, 1, 3, 5, 2, 4)
    y = b.transpose(b.reshape(x, (n, c, h // k, k, w // k, k)), perm)
    return b.reshape(y, (n, c * k * k, h // k, w // k))


@fission_rule("DepthToSpace", since=1)
def DepthToSpace_1(b: Builder, x, *, blocksize):
    return _depth_to_space(b, x, blocksize, "DCR")


@fission_rule("DepthToSpace", since=11)
def DepthToSpace(b: Builder, x, *, blocksize, mode="DCR"):
    return _depth_to_space(b, x, blocksize, mode)


@fission_rule("SpaceToDepth", since=1)
def SpaceToDepth_1(b: Builder, x, *, blocksize):
    return _space_to_depth(b, x, blocksize, "DCR")


@fission_rule("SpaceToDepth", since=28)
def SpaceToDepth(b: Builder, x, *, blocksize, mode="DCR"):
    return _space_to_depth(b, x, blocksize, mode)


# -- no-ops of inference ------------------------------------------------------------------

@fission_rule("Identity", since=1)
def Identity(b: Builder, x):
    return b.copy(x)


def _dropout(b: Builder, x: str, mask_dtype: str):
    if b.num_outputs < 2:  # the mask is unused
        return b.copy(x)
    return b.copy(x), b.const(np.ones(b.shape(x), dtype=mask_dtype))


@fission_rule("Dropout", since=1)
def Dropout_1(b: Builder, x, *, is_test=0, ratio=0.5, consumed_inputs=None):
    if not is_test and ratio != 0:
        return NotImplemented  # training mode: random
    return _dropout(b, x, b.dtype(x))


@fission_rule("Dropout", since=7)
def Dropout_7(b: Builder, x, *, ratio=0.5):
    return _dropout(b, x, b.dtype(x))


@fission_rule("Dropout", since=10)
def Dropout_10(b: Builder, x, *, ratio=0.5):
    return _dropout(b, x, "bool")


@fission_rule("Dropout", since=12, const_inputs=(2,))
def Dropout(b: Builder, x, ratio=None, training_mode=None, *, seed=None):
    training = training_mode is not None and bool(np.asarray(b.value(training_mode)).reshape(-1)[0])
    if training:
        rate = 0.5 if ratio is None else b.value(ratio)
        if rate is None or float(np.asarray(rate).reshape(-1)[0]) != 0:
            return NotImplemented  # training mode with a non-zero ratio: random
    return _dropout(b, x, "bool")


# -- operators that make constants ----------------------------------------------------------

def _claimed(b: Builder, value: np.ndarray):
    return b.const(value) if is_supported_dtype(value.dtype.name) else NotImplemented


@fission_rule("Constant", since=1)
def Constant(b: Builder, *, value=None, sparse_value=None, value_float=None, value_floats=None, value_int=None,
             value_ints=None, value_string=None, value_strings=None):
    if value is not None:
        return _claimed(b, np.asarray(value))
    if sparse_value is not None:
        from onnx import numpy_helper

        dense = np.zeros(tuple(sparse_value.dims), dtype=numpy_helper.to_array(sparse_value.values).dtype)
        idx = numpy_helper.to_array(sparse_value.indices)
        flat = idx if idx.ndim == 1 else np.ravel_multi_index(tuple(idx.T), dense.shape)
        dense.reshape(-1)[flat] = numpy_helper.to_array(sparse_value.values)
        return _claimed(b, dense)
    for given, dtype in ((value_float, np.float32), (value_floats, np.float32), (value_int, np.int64),
                         (value_ints, np.int64)):
        if given is not None:
            return b.const(np.asarray(given, dtype=dtype))
    return NotImplemented  # strings


@fission_rule("Shape", since=1)
def Shape(b: Builder, x, *, start=0, end=None):
    return b.const(np.asarray(b.shape(x)[start:end], dtype=np.int64))


@fission_rule("Size", since=1)
def Size(b: Builder, x):
    return b.const(np.asarray(np.prod(b.shape(x), dtype=np.int64), dtype=np.int64))


@fission_rule("ConstantOfShape", since=9, const_inputs=(0,))
def ConstantOfShape(b: Builder, shape, *, value=None):
    fill = np.zeros((), np.float32) if value is None else np.asarray(value).reshape(())
    if not is_supported_dtype(fill.dtype.name):
        return NotImplemented
    return b.broadcast(b.const(fill), _ints(b, shape))
