"""Fission rules of the ONNX reductions: ReduceSum, ReduceMean, ReduceMax, ReduceMin,
ReduceProd, ReduceL1, ReduceL2, ReduceLogSum, ReduceLogSumExp, ReduceSumSquare.

Each reduction is one ``REDUCE_*`` primitive framed by elementwise ops: an
optional map before it (``|x|``, ``x*x``) and after it (``sqrt``, ``log``);
ReduceLogSumExp subtracts the max first. The axes are an attribute up to
opset 12 (ReduceSum) or 17 (the others) and a constant input from then on,
where ``noop_with_empty_axes`` makes empty axes mean "reduce nothing" instead
of "reduce everything". Reducing over an axis of size 0 gives the op's
identity; the ``REDUCE_*`` primitives define that.
"""

from __future__ import annotations

from collections.abc import Callable

from korch.fission.builder import Builder, normalize_axes
from korch.fission.registry import fission_rule
from korch.ir import dtypes
from korch.ir.ops import Op

Map = Callable[[Builder, str], str] | None


def _resolve_axes(b: Builder, x: str, axes, noop_with_empty_axes: int) -> tuple[int, ...]:
    """The sorted axes to reduce; () means nothing is reduced."""
    axes = [] if axes is None else [int(a) for a in axes]
    if not axes:
        return () if noop_with_empty_axes else tuple(range(b.rank(x)))
    return normalize_axes(axes, b.rank(x))


def _axes_input(b: Builder, axes: str | None):
    return None if axes is None else b.value(axes).reshape(-1)


def _reduction(b: Builder, op: Op, x: str, axes: tuple[int, ...], keepdims: int,
               before: Map = None, after: Map = None) -> str:
    """``after(REDUCE(before(x)))``; with no axes to reduce, ``after(before(x))``."""
    y = before(b, x) if before else x
    if axes:
        y = b.reduce(op, y, axes, keepdims=bool(keepdims))
    y = after(b, y) if after else y
    return b.copy(y) if y == x else y


def _abs(b: Builder, x: str) -> str:
    return b.emit(Op.ABS, x)


def _square(b: Builder, x: str) -> str:
    return b.mul(x, x)


def _in_float(fn: Callable[[Builder, str], str]) -> Callable[[Builder, str], str]:
    """``fn`` for float math (sqrt, log) on any dtype: integers go through float64 and back."""
    def apply(b: Builder, x: str) -> str:
        dtype = b.dtype(x)
        if not dtypes.is_int(dtype):
            return fn(b, x)
        return b.cast(fn(b, b.cast(x, "float64")), dtype)
    return apply


_sqrt = _in_float(lambda b, x: b.emit(Op.SQRT, x))
_log = _in_float(lambda b, x: b.emit(Op.LOG, x))


def _log_sum_exp(b: Builder, x: str, axes: tuple[int, ...], keepdims: int) -> str:
    if not axes:
        return b.copy(x)  # log(exp(x)) over a single element
    # the max of an all -inf slice (or of an empty one) is not finite: shift by 0 there
    peak = b.reduce(Op.REDUCE_MAX, x, axes, keepdims=True)
    peak = b.where(b.emit(Op.ISINF, peak), b.scalar(0, like=x), peak)
    total = b.reduce(Op.REDUCE_SUM, b.emit(Op.EXP, b.sub(x, peak)), axes, keepdims=bool(keepdims))
    return b.add(b.emit(Op.LOG, total), b.reshape(peak, b.shape(total)))


# name -> (primitive, map before, map after)
_KINDS: dict[str, tuple[Op, Map, Map]] = {
    "ReduceSum": (Op.REDUCE_SUM, None, None),
    "ReduceMean": (Op.REDUCE_MEAN, None, None),
    "ReduceMax": (Op.REDUCE_MAX, None, None),
    "ReduceMin": (Op.REDUCE_MIN, None, None),
    "ReduceProd": (Op.REDUCE_PROD, None, None),
    "ReduceL1": (Op.REDUCE_SUM, _abs, None),
    "ReduceL2": (Op.REDUCE_SUM, _square, _sqrt),
    "ReduceLogSum": (Op.REDUCE_SUM, None, _log),
    "ReduceSumSquare": (Op.REDUCE_SUM, _square, None),
}


def _register(name: str, axes_input_since: int) -> None:
    op, before, after = _KINDS[name]

    def with_axes_attribute(b: Builder, data, *, axes=None, keepdims=1):
        return _reduction(b, op, data, _resolve_axes(b, data, axes, 0), keepdims, before, after)

    def with_axes_input(b: Builder, data, axes=None, *, keepdims=1, noop_with_empty_axes=0):
        resolved = _resolve_axes(b, data, _axes_input(b, axes), noop_with_empty_axes)
        return _reduction(b, op, data, resolved, keepdims, before, after)

    with_axes_attribute.__name__ = with_axes_input.__name__ = name
    fission_rule(name, since=1)(with_axes_attribute)
    fission_rule(name, since=axes_input_since, const_inputs=(1,))(with_axes_input)


for _name in _KINDS:
    _register(_name, 13 if _name == "ReduceSum" else 18)


def _log_sum_exp_any_dtype(b: Builder, x: str, axes: tuple[int, ...], keepdims: int) -> str:
    if dtypes.is_int(b.dtype(x)):
        return b.cast(_log_sum_exp(b, b.cast(x, "float64"), axes, keepdims), b.dtype(x))
    return _log_sum_exp(b, x, axes, keepdims)


@fission_rule("ReduceLogSumExp", since=1)
def ReduceLogSumExp_1(b: Builder, data, *, axes=None, keepdims=1):
    return _log_sum_exp_any_dtype(b, data, _resolve_axes(b, data, axes, 0), keepdims)


@fission_rule("ReduceLogSumExp", since=18, const_inputs=(1,))
def ReduceLogSumExp(b: Builder, data, axes=None, *, keepdims=1, noop_with_empty_axes=0):
    resolved = _resolve_axes(b, data, _axes_input(b, axes), noop_with_empty_axes)
    return _log_sum_exp_any_dtype(b, data, resolved, keepdims)

