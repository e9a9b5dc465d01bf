"""Fission rules of Resize and Upsample: one separable filter per resized axis.

Every interpolation mode is the same thing per axis: output position ``o``
reads input positions ``indices[o, :]`` with weights ``weights[o, :]``. The
tables are computed here in numpy from the ONNX spec's formulas (behaviour
checked against onnx's reference implementation); on the graph a filter is a
GATHER of the taps, a MUL by the constant weights and a REDUCE_SUM over the tap
axis, or a lone GATHER when each output copies one input (nearest, say).
Nearest takes 1 tap, linear 2, cubic 4; antialiased downsampling widens the
linear and cubic kernels by 1/scale.
"""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import numpy as np

from korch.fission.builder import Builder, normalize_axes
from korch.fission.registry import fission_rule
from korch.ir import dtypes
from korch.ir.ops import Op


# -- tables ---------------------------------------------------------------------------

def _source_coords(mode: str, size_in: int, size_out: int, scale: float, roi: tuple[float, float]) -> np.ndarray:
    """x_original of every output position along one axis (``scale * size_in`` may be fractional)."""
    y = np.arange(size_out, dtype=np.float64)
    width = scale * size_in
    if mode == "half_pixel":
        return (y + 0.5) / scale - 0.5
    if mode == "half_pixel_symmetric":
        offset = size_in / 2 * (1 - size_out / width)
        return offset + (y + 0.5) / scale - 0.5
    if mode == "pytorch_half_pixel":
        return (y + 0.5) / scale - 0.5 if size_out > 1 else np.zeros(size_out)
    if mode == "align_corners":  # onnx's reference divides by the fractional width, as its test data does
        return y * (size_in - 1) / (width - 1) if width != 1 else np.zeros(size_out)
    if mode == "asymmetric":
        return y / scale
    if mode == "tf_half_pixel_for_nn":
        return (y + 0.5) / scale
    if mode == "tf_crop_and_resize":
        start, end = roi
        if width == 1:
            return np.full(size_out, (end - start) * (size_in - 1) / 2 + start * (size_in - 1))
        return start * (size_in - 1) + y * (end - start) * (size_in - 1) / (width - 1)
    raise ValueError(f"unknown coordinate_transformation_mode {mode!r}")


def _nearest(x: np.ndarray, rounding: str, scale: float) -> tuple[np.ndarray, np.ndarray]:
    if rounding == "round_prefer_floor":
        index = np.ceil(x - 0.5)
    elif rounding == "round_prefer_ceil":
        index = np.floor(x + 0.5)
    elif rounding == "floor":
        index = np.floor(x)
    elif rounding == "ceil":
        index = np.ceil(x)
    elif rounding == "simple":  # Upsample and Resize-10, as ONNX Runtime reads them
        index = np.ceil(x) if scale < 1 else np.floor(x)
    else:
        raise ValueError(f"unknown nearest_mode {rounding!r}")
    return index.astype(np.int64)[:, None], np.ones((len(x), 1))


def _keys_cubic(t: np.ndarray, a: float) -> np.ndarray:
    t = np.abs(t)
    near = ((a + 2) * t - (a + 3)) * t * t + 1
    far = ((a * t - 5 * a) * t + 8 * a) * t - 4 * a
    return np.where(t <= 1, near, np.where(t < 2, far, 0.0))


def _interpolating(x: np.ndarray, mode: str, scale: float, antialias: bool, a: float):
    """Taps and weights of linear or cubic interpolation at source coordinates ``x``."""
    radius = 1 if mode == "linear" else 2
    stretch = min(scale, 1.0) if antialias else 1.0
    first = math.floor(-radius / stretch) + 1
    offsets = np.arange(first, 2 - first)
    # base: the input position left of x, strictly (x integral -> ratio 1), as the spec's reference does
    base = np.ceil(x) - 1
    ratio = x - base
    t = (offsets[None, :] - ratio[:, None]) * stretch
    weights = np.clip(1 - np.abs(t), 0, 1) if mode == "linear" else _keys_cubic(t, a)
    if antialias:
        weights = weights / weights.sum(axis=1, keepdims=True)
    return base.astype(np.int64)[:, None] + offsets[None, :], weights


def axis_filter(size_in: int, size_out: int, scale: float, roi: tuple[float, float], *, mode: str,
                coordinate_mode: str, nearest_mode: str, cubic_coeff_a: float, exclude_outside: bool,
                antialias: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(indices[out, taps], weights[out, taps], outside[out])`` of one resized axis.

    ``outside`` flags the outputs that tf_crop_and_resize sets to the extrapolation value.
    """
    x = _source_coords(coordinate_mode, size_in, size_out, scale, roi)
    # Snap float64 noise (1.0000000000000002) onto the integer or half it stands for: nearest's
    # rounding at ties, and which taps count, must not depend on it.
    halves = np.round(2 * x) / 2
    x = np.where(np.abs(x - halves) <= 1e-9 * np.maximum(1.0, np.abs(x)), halves, x)
    if mode == "nearest":
        indices, weights = _nearest(x, nearest_mode, scale)
    else:
        indices, weights = _interpolating(x, mode, scale, antialias, cubic_coeff_a)
    if exclude_outside:
        weights = np.where((indices < 0) | (indices >= size_in), 0.0, weights)
        total = weights.sum(axis=1, keepdims=True)
        weights = weights / np.where(total == 0, 1.0, total)
    outside = np.zeros(size_out, dtype=bool)
    if coordinate_mode == "tf_crop_and_resize":
        outside = (x < 0) | (x > size_in - 1)
        # those outputs are overwritten: read any one input there, so nearest stays a plain gather
        weights = np.where(outside[:, None], np.eye(1, weights.shape[1]), weights)
    return _compact(np.clip(indices, 0, size_in - 1), weights) + (outside,)


def _compact(indices: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Merge taps that read the same input, drop zero weights, keep as few tap columns as any row needs."""
    rows = []
    for idx, w in zip(indices, weights):
        merged: dict[int, float] = {}
        for i, v in zip(idx.tolist(), w.tolist()):
            merged[i] = merged.get(i, 0.0) + v
        rows.append([(i, v) for i, v in merged.items() if v != 0] or [(int(idx[0]), 0.0)])
    taps = max(len(r) for r in rows) if rows else 1
    out_idx = np.zeros((len(rows), taps), dtype=np.int64)
    out_w = np.zeros((len(rows), taps))
    for o, row in enumerate(rows):
        for k, (i, v) in enumerate(row):
            out_idx[o, k], out_w[o, k] = i, v
        out_idx[o, len(row):] = row[0][0]
    return out_idx, out_w


# -- graph ----------------------------------------------------------------------------

def separable_filter(b: Builder, x: str, axis: int, indices: np.ndarray, weights: np.ndarray) -> str:
    """``out[.., o, ..] = sum_k weights[o, k] * x[.., indices[o, k], ..]`` along ``axis``."""
    if indices.shape[1] == 1 and np.all(weights == 1):
        return b.gather(x, indices[:, 0], axis)
    taps = b.gather(x, indices, axis)  # (.., out, taps, ..)
    w = weights.reshape(weights.shape + (1,) * (b.rank(x) - axis - 1)).astype(b.dtype(x))
    return b.reduce(Op.REDUCE_SUM, b.mul(taps, b.const(w)), [axis + 1], keepdims=False)


INNER_GATHER_COST = 8  # a tap along the innermost axis is a scalar load; along any other, part of a vector load


def filter_order(shape, filters: dict[int, tuple[int, int]]) -> list[int]:
    """The order of the per-axis filters (``{axis: (size out, taps)}``) that reads the fewest taps.

    Separable filters commute, and the order decides how many elements each pass makes: upsampling an image
    4x along H first makes the W pass's gathers over an image already 4x taller. Taps along the innermost
    axis cost more (``INNER_GATHER_COST``): a compiler vectorizes across the innermost axis, and there each
    output reads its own input positions.
    """
    def taps_read(order) -> float:
        sizes, total = list(shape), 0.0
        for a in order:
            sizes[a] = filters[a][0]
            total += math.prod(sizes) * filters[a][1] * (INNER_GATHER_COST if a == len(shape) - 1 else 1)
        return total
    return list(min(itertools.permutations(filters), key=taps_read))


def _target(shape, axes, scales, sizes, policy) -> tuple[list[float], list[int]]:
    """Per-axis scale and output size, from ``sizes`` (under the aspect-ratio policy) or ``scales``."""
    scale, size = [1.0] * len(shape), list(shape)
    if sizes is not None and sizes.size:
        given = {a: int(s) for a, s in zip(axes, sizes.reshape(-1), strict=True)}
        ratios = {a: given[a] / shape[a] for a in axes}
        if policy == "stretch":
            for a in axes:
                scale[a], size[a] = ratios[a], given[a]
        else:
            common = (min if policy == "not_larger" else max)(ratios.values())
            for a in axes:
                scale[a], size[a] = common, int(common * shape[a] + 0.5)  # round half up
    elif scales is not None and scales.size:
        for a, s in zip(axes, scales.reshape(-1).tolist(), strict=True):
            scale[a], size[a] = _intended(s), int(math.floor(float(s) * shape[a]))
    else:
        raise ValueError("Resize needs scales or sizes")
    return scale, size


def _resize(b: Builder, x: str, scales, sizes, roi, *, axes=None, mode="nearest",
            coordinate_transformation_mode="half_pixel", nearest_mode="round_prefer_floor", cubic_coeff_a=-0.75,
            exclude_outside=0, extrapolation_value=0.0, antialias=0, keep_aspect_ratio_policy="stretch") -> str:
    if mode not in ("nearest", "linear", "cubic"):
        raise ValueError(f"unknown Resize mode {mode!r}")
    shape = b.shape(x)
    rank = len(shape)
    axes = list(range(rank)) if axes is None else [normalize_axes([a], rank)[0] for a in axes]
    scale, size = _target(shape, axes, scales, sizes, keep_aspect_ratio_policy)
    box = {a: (0.0, 1.0) for a in range(rank)}
    if roi is not None and coordinate_transformation_mode == "tf_crop_and_resize":
        flat = roi.reshape(-1).astype(np.float64).tolist()
        box.update({a: (flat[i], flat[len(axes) + i]) for i, a in enumerate(axes) if flat})
    work_dtype = b.dtype(x)
    filters = {a: axis_filter(shape[a], size[a], scale[a], box[a], mode=mode,
                              coordinate_mode=coordinate_transformation_mode, nearest_mode=nearest_mode,
                              cubic_coeff_a=cubic_coeff_a, exclude_outside=bool(exclude_outside),
                              antialias=bool(antialias) and mode != "nearest")
               for a in axes if not (math.isclose(scale[a], 1.0) and size[a] == shape[a] and box[a] == (0.0, 1.0))}
    if not any(outside.any() for _, _, outside in filters.values()):  # crop-and-resize keeps the spec's order
        order = filter_order(shape, {a: (size[a], indices.shape[1]) for a, (indices, _, _) in filters.items()})
        filters = {a: filters[a] for a in order}
    out = x
    for a, (indices, weights, outside) in filters.items():
        if not (indices.shape[1] == 1 and np.all(weights == 1)) and b.dtype(out) not in ("float32", "float64"):
            # weighted sums of halves run in float32, of integers in float64 (rounded once, at the end)
            out = b.cast(out, "float32" if b.dtype(out) == "float16" else "float64")
        out = separable_filter(b, out, a, indices, weights)
        if outside.any():
            mask = b.const(outside.reshape((-1,) + (1,) * (rank - a - 1)))
            out = b.where(mask, b.scalar(extrapolation_value, like=out), out)
    if b.dtype(out) != work_dtype:
        if dtypes.is_int(work_dtype):
            info = np.iinfo(work_dtype)
            out = b.emit(Op.ROUND, out)
            out = b.minimum(b.maximum(out, b.scalar(info.min, like=out)), b.scalar(info.max, like=out))
        out = b.cast(out, work_dtype)
    return b.copy(x) if out == x else out


def _intended(scale: float) -> float:
    """The simple ratio a float32 scale stands for (1/3 for 0.33333334), else the scale itself.

    Source coordinates use it, so that ``y / scale`` lands exactly on the ties
    the model means (ONNX Runtime gets there by float32 rounding); output sizes
    keep the spec's floor(size * scale) with the stored value.
    """
    ratio = Fraction(scale).limit_denominator(1 << 10)
    return float(ratio) if np.float32(float(ratio)) == np.float32(scale) else float(scale)


def _array(b: Builder, name: str | None) -> np.ndarray | None:
    value = b.value(name)
    return None if value is None else np.asarray(value)


@fission_rule("Upsample", since=7)
def Upsample_7(b: Builder, x, *, scales, mode="nearest"):
    return _resize(b, x, np.asarray(scales, dtype=np.float32), None, None, mode=mode,
                   coordinate_transformation_mode="asymmetric", nearest_mode="simple")


@fission_rule("Upsample", since=9, const_inputs=(1,))
def Upsample(b: Builder, x, scales, *, mode="nearest"):
    return _resize(b, x, _array(b, scales), None, None, mode=mode,
                   coordinate_transformation_mode="asymmetric", nearest_mode="simple")


@fission_rule("Resize", since=10, const_inputs=(1,))
def Resize_10(b: Builder, x, scales, *, mode="nearest"):
    return _resize(b, x, _array(b, scales), None, None, mode=mode,
                   coordinate_transformation_mode="asymmetric", nearest_mode="simple")


@fission_rule("Resize", since=11, const_inputs=(1, 2, 3))
def Resize_11(b: Builder, x, roi=None, scales=None, sizes=None, *, mode="nearest",
              coordinate_transformation_mode="half_pixel", nearest_mode="round_prefer_floor", cubic_coeff_a=-0.75,
              exclude_outside=0, extrapolation_value=0.0):
    return _resize(b, x, _array(b, scales), _array(b, sizes), _array(b, roi), mode=mode,
                   coordinate_transformation_mode=coordinate_transformation_mode, nearest_mode=nearest_mode,
                   cubic_coeff_a=cubic_coeff_a, exclude_outside=exclude_outside,
                   extrapolation_value=extrapolation_value)


@fission_rule("Resize", since=18, const_inputs=(1, 2, 3))
def Resize(b: Builder, x, roi=None, scales=None, sizes=None, *, mode="nearest",
           coordinate_transformation_mode="half_pixel", nearest_mode="round_prefer_floor", cubic_coeff_a=-0.75,
           exclude_outside=0, extrapolation_value=0.0, antialias=0, axes=None, keep_aspect_ratio_policy="stretch"):
    return _resize(b, x, _array(b, scales), _array(b, sizes), _array(b, roi), axes=axes, mode=mode,
                   coordinate_transformation_mode=coordinate_transformation_mode, nearest_mode=nearest_mode,
                   cubic_coeff_a=cubic_coeff_a, exclude_outside=exclude_outside,
                   extrapolation_value=extrapolation_value, antialias=antialias,
                   keep_aspect_ratio_policy=keep_aspect_ratio_policy)
