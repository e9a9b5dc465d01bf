"""Fission rules of the pools: MaxPool, AveragePool, LpPool and the global pools.

A pool is one ``MAX_POOL`` or ``AVG_POOL`` primitive with every window
parameter explicit: ``auto_pad`` is resolved to pads, and ``ceil_mode`` becomes
extra padding at the end of each spatial axis, enough for the last partial
window (a window that would start in the end padding is not created, as the
spec and PyTorch say). The extra padding never counts as an element: for
``count_include_pad`` averages whose last window overhangs it, the explicit
pads are zeros written by a ``PAD`` (real elements to the pool) and the pool
then divides by the count of real elements. A max pool whose window is large
(at least twice as many positions as the sum of its sides: 4x4, 5x5, the 5/9/13
pools of YOLO's SPP blocks) is one ``MAX_POOL`` per axis: the maximum over a box
is the maximum along each axis in turn, so 13x13 reads 26 positions, not 169
(padding is -inf to a max pool, and no window lies wholly in it). LpPool is the p-th root of a
window sum, the sum an average times the kernel size. The global pools are
``REDUCE_MEAN``/``REDUCE_MAX``/``REDUCE_SUM`` over the spatial axes with ``keepdims``.
"""

from __future__ import annotations

import dataclasses
import math

from korch.fission.builder import Builder
from korch.fission.linear import explicit_pads
from korch.fission.registry import fission_rule
from korch.ir.ops import Op


@dataclasses.dataclass(frozen=True)
class _Window:
    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    pads: tuple[int, ...]  # the model's pads, resolved: begins then ends
    extra: tuple[int, ...]  # end padding ceil_mode adds on each axis

    @property
    def padded(self) -> tuple[int, ...]:
        k = len(self.kernel)
        return self.pads[:k] + tuple(e + x for e, x in zip(self.pads[k:], self.extra))

    def attrs(self, pads: tuple[int, ...]) -> dict:
        return {"kernel": self.kernel, "strides": self.strides, "pads": pads, "dilations": self.dilations}


def _window(b: Builder, x: str, kernel_shape, auto_pad, pads, strides, dilations, ceil_mode) -> _Window | None:
    k = len(kernel_shape)
    if b.rank(x) != k + 2 or not 1 <= k <= 3:
        return None
    kernel = tuple(int(v) for v in kernel_shape)
    strides = tuple(int(v) for v in strides) if strides is not None else (1,) * k
    dilations = tuple(int(v) for v in dilations) if dilations is not None else (1,) * k
    sizes = b.shape(x)[2:]
    resolved = explicit_pads(auto_pad, pads, sizes, kernel, strides, dilations)
    if resolved is None:
        return None
    extra = [0] * k
    # SAME_* outputs have ceil(in / stride) elements whatever ceil_mode says (spec, shape inference and ORT
    # agree); VALID keeps its partial windows under ceil_mode as ORT and shape inference do (the spec's
    # VALID formula would drop them)
    if ceil_mode and auto_pad in ("NOTSET", "VALID"):
        for i, (size, kk, s, d) in enumerate(zip(sizes, kernel, strides, dilations)):
            begin, end = resolved[i], resolved[k + i]
            span = (kk - 1) * d + 1
            out = -(-(size + begin + end - span) // s) + 1
            if (out - 1) * s >= size + begin:  # the last window would start in the end padding
                out -= 1
            extra[i] = max(0, (out - 1) * s + span - (size + begin + end))
    return _Window(kernel, strides, dilations, tuple(resolved), tuple(extra))


def _max_pool(b: Builder, x, kernel_shape, auto_pad="NOTSET", pads=None, strides=None, dilations=None,
              ceil_mode=0):
    if b.num_outputs > 1:
        return NotImplemented  # Indices: argmax positions are not a primitive
    w = _window(b, x, kernel_shape, auto_pad, pads, strides, dilations, ceil_mode)
    if w is None:
        return NotImplemented
    if math.prod(w.kernel) < SEPARABLE_MAX_POOL * sum(w.kernel):
        return b.emit(Op.MAX_POOL, x, **w.attrs(w.padded)), None
    for axis in range(len(w.kernel)):
        x = b.emit(Op.MAX_POOL, x, **_along(w, axis))
    return x, None


# a max pool is split by axis when its window has at least this many times the positions of its sides' sum
SEPARABLE_MAX_POOL = 2


def _along(w: _Window, axis: int) -> dict:
    """The attributes of ``w``'s pool along ``axis`` alone (a window of one position on every other axis)."""
    k = len(w.kernel)

    def only(values, other):
        return tuple(v if i == axis else other for i, v in enumerate(values))

    padded = w.padded
    return {"kernel": only(w.kernel, 1), "strides": only(w.strides, 1), "dilations": only(w.dilations, 1),
            "pads": only(padded[:k], 0) + only(padded[k:], 0)}


@fission_rule("MaxPool", since=1)
def MaxPool_1(b: Builder, x, *, kernel_shape, auto_pad="NOTSET", pads=None, strides=None):
    return _max_pool(b, x, kernel_shape, auto_pad, pads, strides)


@fission_rule("MaxPool", since=8)
def MaxPool_8(b: Builder, x, *, kernel_shape, auto_pad="NOTSET", pads=None, storage_order=0, strides=None):
    return _max_pool(b, x, kernel_shape, auto_pad, pads, strides)


@fission_rule("MaxPool", since=10)
def MaxPool(b: Builder, x, *, kernel_shape, auto_pad="NOTSET", ceil_mode=0, dilations=None, pads=None,
            storage_order=0, strides=None):
    return _max_pool(b, x, kernel_shape, auto_pad, pads, strides, dilations, ceil_mode)


def _average_pool(b: Builder, x, kernel_shape, auto_pad="NOTSET", pads=None, strides=None, dilations=None,
                  ceil_mode=0, count_include_pad=0):
    w = _window(b, x, kernel_shape, auto_pad, pads, strides, dilations, ceil_mode)
    if w is None:
        return NotImplemented
    if not count_include_pad or not any(w.extra):
        return b.emit(Op.AVG_POOL, x, count_include_pad=int(bool(count_include_pad)), **w.attrs(w.padded))
    # The divisor is the window clipped to the explicitly padded input: explicit pads count, the
    # ceil_mode extra does not. Zeros written by PAD are real elements to a count_include_pad=0 pool.
    k = len(w.kernel)
    padded = x
    if any(w.pads):
        padded = b.emit(Op.PAD, x, pads=(0, 0) + w.pads[:k] + (0, 0) + w.pads[k:], mode="constant")
    return b.emit(Op.AVG_POOL, padded, count_include_pad=0, **w.attrs((0,) * k + w.extra))


@fission_rule("AveragePool", since=1)
def AveragePool_1(b: Builder, x, *, kernel_shape, auto_pad="NOTSET", pads=None, strides=None):
    return _average_pool(b, x, kernel_shape, auto_pad, pads, strides)


@fission_rule("AveragePool", since=7)
def AveragePool_7(b: Builder, x, *, kernel_shape, auto_pad="NOTSET", count_include_pad=0, pads=None, strides=None):
    return _average_pool(b, x, kernel_shape, auto_pad, pads, strides, count_include_pad=count_include_pad)


@fission_rule("AveragePool", since=10)
def AveragePool_10(b: Builder, x, *, kernel_shape, auto_pad="NOTSET", ceil_mode=0, count_include_pad=0,
                   pads=None, strides=None):
    return _average_pool(b, x, kernel_shape, auto_pad, pads, strides, None, ceil_mode, count_include_pad)


@fission_rule("AveragePool", since=19)
def AveragePool(b: Builder, x, *, kernel_shape, auto_pad="NOTSET", ceil_mode=0, count_include_pad=0,
                dilations=None, pads=None, strides=None):
    return _average_pool(b, x, kernel_shape, auto_pad, pads, strides, dilations, ceil_mode, count_include_pad)


def _power(b: Builder, x: str, p: int) -> str:
    """``|x|^p``."""
    if p == 2:
        return b.mul(x, x)
    magnitude = b.emit(Op.ABS, x)
    return magnitude if p == 1 else b.emit(Op.POW, magnitude, b.scalar(p, like=x))


def _root(b: Builder, total: str, p: int) -> str:
    """``total^(1/p)``."""
    if p == 1:
        return total
    if p == 2:
        return b.emit(Op.SQRT, total)
    return b.emit(Op.POW, total, b.scalar(1.0 / p, like=total))


def _lp_pool(b: Builder, x, kernel_shape, p, auto_pad="NOTSET", pads=None, strides=None, dilations=None,
             ceil_mode=0):
    w = _window(b, x, kernel_shape, auto_pad, pads, strides, dilations, ceil_mode)
    if w is None or p <= 0:
        return NotImplemented
    # pads are zeros to the sum; an average over the whole kernel, times its size, is the sum
    mean = b.emit(Op.AVG_POOL, _power(b, x, p), count_include_pad=1, **w.attrs(w.padded))
    return _root(b, b.mul(mean, b.scalar(math.prod(w.kernel), like=x)), p)


@fission_rule("LpPool", since=1)
def LpPool_1(b: Builder, x, *, kernel_shape, auto_pad="NOTSET", p=2, pads=None, strides=None):
    return _lp_pool(b, x, kernel_shape, p, auto_pad, pads, strides)


@fission_rule("LpPool", since=18)
def LpPool(b: Builder, x, *, kernel_shape, auto_pad="NOTSET", ceil_mode=0, dilations=None, p=2, pads=None,
           strides=None):
    return _lp_pool(b, x, kernel_shape, p, auto_pad, pads, strides, dilations, ceil_mode)


def _spatial_axes(b: Builder, x: str) -> tuple[int, ...]:
    return tuple(range(2, b.rank(x)))


@fission_rule("GlobalAveragePool", since=1)
def GlobalAveragePool(b: Builder, x):
    axes = _spatial_axes(b, x)
    return b.reduce(Op.REDUCE_MEAN, x, axes, keepdims=True) if axes else b.copy(x)


@fission_rule("GlobalMaxPool", since=1)
def GlobalMaxPool(b: Builder, x):
    axes = _spatial_axes(b, x)
    return b.reduce(Op.REDUCE_MAX, x, axes, keepdims=True) if axes else b.copy(x)


@fission_rule("GlobalLpPool", since=2)
def GlobalLpPool(b: Builder, x, *, p=2):
    if p <= 0:
        return NotImplemented
    axes = _spatial_axes(b, x)
    powered = _power(b, x, p)
    return _root(b, b.reduce(Op.REDUCE_SUM, powered, axes, keepdims=True) if axes else powered, p)
