"""Fission rules of softmax and the normalizations: Softmax, LogSoftmax, LayerNormalization,
BatchNormalization, InstanceNormalization, GroupNormalization, LRN,
MeanVarianceNormalization, LpNormalization.

Statistics are reductions with ``keepdims`` so that everything after them is
elementwise with implicit broadcasting (what fuses well). Softmax subtracts
the max before ``exp``; variances are the mean of squared deviations (two
passes, no ``E[x^2] - E[x]^2`` cancellation). Inference-mode
BatchNormalization is one multiply and one add: with constant statistics the
builder folds the factor and the shift into constants.
"""

from __future__ import annotations

import math

import numpy as np

from korch.fission.builder import Builder, normalize_axes
from korch.fission.registry import fission_rule
from korch.ir import dtypes
from korch.ir.ops import Op

# -- softmax --------------------------------------------------------------------


def _softmax(b: Builder, x: str, axes: tuple[int, ...], log: bool) -> str:
    shifted = b.sub(x, b.reduce(Op.REDUCE_MAX, x, axes))
    exp = b.emit(Op.EXP, shifted)
    total = b.reduce(Op.REDUCE_SUM, exp, axes)
    return b.sub(shifted, b.emit(Op.LOG, total)) if log else b.div(exp, total)


def _coerced_axes(b: Builder, x: str, axis: int) -> tuple[int, ...]:
    """Before opset 13 the input is seen as 2-D, [0, axis) x [axis, rank): reduce the whole second part."""
    (first,) = normalize_axes([axis], b.rank(x))
    return tuple(range(first, b.rank(x)))


@fission_rule("Softmax", since=1)
def Softmax_1(b: Builder, input, *, axis=1):
    return _softmax(b, input, _coerced_axes(b, input, axis), log=False)


@fission_rule("Softmax", since=13)
def Softmax(b: Builder, input, *, axis=-1):
    return _softmax(b, input, normalize_axes([axis], b.rank(input)), log=False)


@fission_rule("LogSoftmax", since=1)
def LogSoftmax_1(b: Builder, input, *, axis=1):
    return _softmax(b, input, _coerced_axes(b, input, axis), log=True)


@fission_rule("LogSoftmax", since=13)
def LogSoftmax(b: Builder, input, *, axis=-1):
    return _softmax(b, input, normalize_axes([axis], b.rank(input)), log=True)


# -- statistics shared by the normalizations --------------------------------------


def _moments(b: Builder, x: str, axes: tuple[int, ...]) -> tuple[str, str, str]:
    """(mean, x - mean, variance) over ``axes``, statistics kept with size-1 axes."""
    mean = b.reduce(Op.REDUCE_MEAN, x, axes)
    centered = b.sub(x, mean)
    variance = b.reduce(Op.REDUCE_MEAN, b.mul(centered, centered), axes)
    return mean, centered, variance


def _std(b: Builder, variance: str, epsilon: float) -> str:
    return b.emit(Op.SQRT, b.add(variance, b.scalar(epsilon, like=variance)))


def _per_channel(b: Builder, v: str, rank: int) -> str:
    """A (C,) vector shaped (C, 1, ..., 1) to broadcast against (N, C, *spatial)."""
    if b.rank(v) != 1 or rank <= 2:
        return v
    return b.reshape(v, b.shape(v) + (1,) * (rank - 2))


def _stash_dtype(stash_type: int) -> str | None:
    try:
        dtype = dtypes.from_onnx(stash_type)
    except Exception:
        return None
    return dtype if dtypes.is_float(dtype) else None


# -- layer, instance, group ---------------------------------------------------------


@fission_rule("LayerNormalization", since=17)
def LayerNormalization(b: Builder, X, Scale, B=None, *, axis=-1, epsilon=1e-5, stash_type=1):
    stash = _stash_dtype(stash_type)
    if stash is None:
        return NotImplemented
    (first,) = normalize_axes([axis], b.rank(X))
    mean, centered, variance = _moments(b, b.cast(X, stash), tuple(range(first, b.rank(X))))
    inv_std = b.emit(Op.RECIPROCAL, _std(b, variance, epsilon))
    y = b.mul(b.cast(b.mul(centered, inv_std), b.dtype(X)), Scale)
    return (b.add(y, B) if B else y), mean, inv_std


@fission_rule("InstanceNormalization", since=1)
def InstanceNormalization(b: Builder, input, scale, B, *, epsilon=1e-5, consumed_inputs=()):
    shape = b.shape(input)
    x = input if len(shape) > 2 else b.reshape(input, shape + (1,))
    _, centered, variance = _moments(b, x, tuple(range(2, b.rank(x))))
    normalized = b.div(centered, _std(b, variance, epsilon))
    y = b.add(b.mul(normalized, _per_channel(b, scale, b.rank(x))), _per_channel(b, B, b.rank(x)))
    return b.reshape(y, shape)


def _group_norm(b: Builder, X: str, scale: str, bias: str, num_groups: int, epsilon: float,
                stash: str, per_group: bool) -> str:
    shape = b.shape(X)
    n, c = shape[:2]
    if c % num_groups:
        return NotImplemented
    grouped = b.reshape(b.cast(X, stash), (n, num_groups, math.prod(shape[1:]) // num_groups))
    _, centered, variance = _moments(b, grouped, (2,))
    normalized = b.cast(b.div(centered, _std(b, variance, epsilon)), b.dtype(X))
    if per_group:  # opset 18: one scale and bias per group
        scale, bias = b.reshape(scale, (num_groups, 1)), b.reshape(bias, (num_groups, 1))
        return b.reshape(b.add(b.mul(normalized, scale), bias), shape)
    normalized = b.reshape(normalized, shape)
    return b.add(b.mul(normalized, _per_channel(b, scale, len(shape))), _per_channel(b, bias, len(shape)))


@fission_rule("GroupNormalization", since=18)
def GroupNormalization_18(b: Builder, X, scale, bias, *, num_groups, epsilon=1e-5):
    return _group_norm(b, X, scale, bias, num_groups, epsilon, b.dtype(X), per_group=True)


@fission_rule("GroupNormalization", since=21)
def GroupNormalization(b: Builder, X, scale, bias, *, num_groups, epsilon=1e-5, stash_type=1):
    stash = _stash_dtype(stash_type)
    if stash is None:
        return NotImplemented
    return _group_norm(b, X, scale, bias, num_groups, epsilon, stash, per_group=False)


# -- batch normalization (inference) ------------------------------------------------


def _batch_norm(b: Builder, x: str, scale: str, bias: str, mean: str, var: str, epsilon: float) -> str:
    # y = (x - mean) / sqrt(var + eps) * scale + B  ==  x * factor + (B - mean * factor);
    # factor and shift in the widest dtype of the inputs (opset 15 lets them differ from x's)
    stats = (scale, bias, mean, var)
    wide = np.result_type(*(b.dtype(v) for v in (x, *stats))).name
    scale, bias, mean, var = (b.cast(v, wide) for v in stats)
    factor = b.div(scale, _std(b, var, epsilon))
    shift = b.sub(bias, b.mul(mean, factor))
    factor, shift = (_per_channel(b, b.cast(v, b.dtype(x)), b.rank(x)) for v in (factor, shift))
    return b.add(b.mul(x, factor), shift)


@fission_rule("BatchNormalization", since=1)
def BatchNormalization_1(b: Builder, X, scale, B, mean, var, *, epsilon=1e-5, momentum=0.9, is_test=0,
                         spatial=1, consumed_inputs=()):
    if not is_test:
        return NotImplemented  # training: statistics of the batch, and running averages as outputs
    return _batch_norm(b, X, scale, B, mean, var, epsilon)


@fission_rule("BatchNormalization", since=7)
def BatchNormalization_7(b: Builder, X, scale, B, mean, var, *, epsilon=1e-5, momentum=0.9, spatial=1):
    # spatial=0 gives statistics of shape (C, D1, ..., Dn): they broadcast as they are
    if b.num_outputs > 1:
        return NotImplemented  # running mean/var outputs exist only in training
    return _batch_norm(b, X, scale, B, mean, var, epsilon)


@fission_rule("BatchNormalization", since=14)
def BatchNormalization(b: Builder, X, scale, B, input_mean, input_var, *, epsilon=1e-5, momentum=0.9,
                       training_mode=0):
    if training_mode:
        return NotImplemented
    return _batch_norm(b, X, scale, B, input_mean, input_var, epsilon)


# -- the rest ---------------------------------------------------------------------


@fission_rule("LRN", since=1)
def LRN(b: Builder, X, *, size, alpha=0.0001, beta=0.75, bias=1.0):
    # The sum of squares over a window of channels is an average pool over the channel axis
    # (made the first spatial axis) that counts the zero padding, times ``size``.
    shape = b.shape(X)
    n, c = shape[:2]
    columns = b.reshape(b.mul(X, X), (n, 1, c, math.prod(shape[2:])))
    before = (size - 1) // 2
    window_mean = b.emit(Op.AVG_POOL, columns, kernel=(size, 1), strides=(1, 1),
                         pads=(before, 0, size - 1 - before, 0), dilations=(1, 1), count_include_pad=1)
    base = b.add(b.mul(b.reshape(window_mean, shape), b.scalar(alpha, like=X)), b.scalar(bias, like=X))
    return b.div(X, b.emit(Op.POW, base, b.scalar(beta, like=X)))


@fission_rule("MeanVarianceNormalization", since=9)
def MeanVarianceNormalization(b: Builder, X, *, axes=(0, 2, 3)):
    _, centered, variance = _moments(b, X, normalize_axes(axes, b.rank(X)))
    std = b.add(b.emit(Op.SQRT, variance), b.scalar(1e-9, like=X))
    return b.div(centered, std)


@fission_rule("LpNormalization", since=1)
def LpNormalization(b: Builder, input, *, axis=-1, p=2):
    axes = normalize_axes([axis], b.rank(input))
    if p == 1:
        norm = b.reduce(Op.REDUCE_SUM, b.emit(Op.ABS, input), axes)
    elif p == 2:
        norm = b.emit(Op.SQRT, b.reduce(Op.REDUCE_SUM, b.mul(input, input), axes))
    else:
        return NotImplemented  # the spec allows only p = 1 and p = 2
    zero = b.emit(Op.EQUAL, norm, b.scalar(0, like=input))
    # a zero norm means a zero slice: divide it by 1 so it stays 0 (not 0/0)
    return b.div(input, b.where(zero, b.scalar(1, like=input), norm))
