"""Elementwise primitives as Triton expressions: the one table every Triton kernel class uses.

``expression(op, args, attrs, dtypes)`` returns the Triton source of one
elementwise primitive applied to already-computed operand expressions (strings
naming Triton values of the same block shape, or broadcastable ones). Float
arithmetic of narrower types (float16) is done in float32 and cast back at the
store; ``compute_dtype`` says which.

Only ``tl`` builtins are used, no ``libdevice`` calls: the interpreter cannot run
those, and the same source must run in CI and on the GPU. The few functions
``tl`` lacks (tanh, softplus, round half to even, fmod, pow) are the ``@triton.jit``
helpers of ``PRELUDE``, written to keep float32 accuracy (see each one).

Semantics follow ``korch/ir/ops.py`` exactly: integer ``DIV`` truncates toward
zero (Triton's ``//`` on integers does, as C), ``MOD`` follows ``fmod``, ``MAX``
and ``MIN`` propagate NaN, ``ROUND`` is half to even, ``SOFTPLUS`` does not
overflow.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from korch.ir import dtypes
from korch.ir.ops import Op

# IR dtype -> Triton type name (for pointers "*fp32", for casts "tl.float32").
TRITON_TYPES = {
    "float16": "fp16", "float32": "fp32", "float64": "fp64",
    "int8": "i8", "int16": "i16", "int32": "i32", "int64": "i64", "uint8": "u8", "bool": "i1",
}
_TL_NAMES = {
    "float16": "tl.float16", "float32": "tl.float32", "float64": "tl.float64",
    "int8": "tl.int8", "int16": "tl.int16", "int32": "tl.int32", "int64": "tl.int64", "uint8": "tl.uint8",
    "bool": "tl.int1",
}

_UNARY = {
    Op.NEG: "(-{0})",
    Op.ABS: "tl.abs({0})",
    Op.EXP: "tl.exp({0})",
    Op.LOG: "tl.log({0})",
    Op.SQRT: "tl.sqrt_rn({0})",
    Op.RECIPROCAL: "(1.0 / {0})",
    Op.TANH: "_tanh({0})",
    Op.ERF: "tl.erf({0})",
    Op.SIGMOID: "(1.0 / (1.0 + tl.exp(-{0})))",
    Op.RELU: "tl.maximum({0}, 0)",
    Op.SOFTPLUS: "_softplus({0})",
    Op.FLOOR: "tl.floor({0})",
    Op.CEIL: "tl.ceil({0})",
    Op.ROUND: "_round_half_even({0})",
    Op.NOT: "({0} == 0)",
    Op.SIN: "tl.sin({0})",
    Op.COS: "tl.cos({0})",
    Op.ISNAN: "({0} != {0})",
    Op.ISINF: "(tl.abs({0}) == float('inf'))",
}
_BINARY = {
    Op.ADD: "({0} + {1})",
    Op.SUB: "({0} - {1})",
    Op.MUL: "({0} * {1})",
    Op.EQUAL: "({0} == {1})",
    Op.LESS: "({0} < {1})",
    Op.LESS_EQUAL: "({0} <= {1})",
    Op.GREATER: "({0} > {1})",
    Op.GREATER_EQUAL: "({0} >= {1})",
    Op.AND: "({0} & {1})",
    Op.OR: "({0} | {1})",
    Op.XOR: "({0} ^ {1})",
}
# Every op ``expression`` writes: the templates above and the ops written case by case.
OPS = frozenset(_UNARY) | frozenset(_BINARY) | {Op.SIGN, Op.DIV, Op.MOD, Op.MAX, Op.MIN, Op.POW, Op.WHERE, Op.CAST}


def triton_type(dtype: str) -> str:
    """The Triton signature type of a pointer to ``dtype`` elements ("*fp32")."""
    return "*" + TRITON_TYPES[dtype]


def tl_dtype(dtype: str) -> str:
    return _TL_NAMES[dtype]


def compute_dtype(dtype: str) -> str:
    """The dtype a value of ``dtype`` is computed in: float16 math runs in float32."""
    return "float32" if dtype == "float16" else dtype


def supported(op: Op, operand_dtypes: Sequence[str]) -> bool:
    """Whether ``expression`` can write ``op`` on operands of these dtypes."""
    if not all(d in TRITON_TYPES for d in operand_dtypes):
        return False
    if op is Op.POW:
        return all(dtypes.is_float(d) for d in operand_dtypes)
    return op in OPS


def expression(op: Op, args: Sequence[str], attrs: Mapping, operand_dtypes: Sequence[str]) -> str:
    """Triton source computing ``op`` on the operand expressions ``args``."""
    is_float = bool(operand_dtypes) and dtypes.is_float(operand_dtypes[-1])
    if op in _UNARY:
        return _UNARY[op].format(*args)
    if op in _BINARY:
        return _BINARY[op].format(*args)
    a = args[0]
    if op is Op.SIGN:
        return f"(({a} > 0).to({a}.dtype) - ({a} < 0).to({a}.dtype))"
    if op is Op.DIV:
        # floats: IEEE division; ints: Triton's // truncates toward zero, as ONNX wants
        return f"({a} / {args[1]})" if is_float else f"({a} // {args[1]})"
    if op is Op.MOD:
        b = args[1]
        if is_float:
            rem = f"_fmod({a}, {b})"
        else:
            rem = f"({a} % {b})"  # sign of the dividend (C remainder)
        if attrs.get("fmod", 0):
            return rem
        # sign of the divisor: shift a non-zero remainder whose sign differs from b's
        return f"tl.where(({rem} != 0) & (({rem} < 0) != ({b} < 0)), {rem} + {b}, {rem})"
    if op in (Op.MAX, Op.MIN):
        pick = "tl.maximum" if op is Op.MAX else "tl.minimum"
        if is_float:
            return f"{pick}({a}, {args[1]}, propagate_nan=tl.PropagateNan.ALL)"
        return f"{pick}({a}, {args[1]})"
    if op is Op.POW:
        if args[1] in _SMALL_POWERS:
            return _SMALL_POWERS[args[1]].format(a)
        return f"_pow({a}, {args[1]})"
    if op is Op.WHERE:
        return f"tl.where({a}, {args[1]}, {args[2]})"
    if op is Op.CAST:
        target = attrs["to"]
        if target == "bool":
            return f"({a} != 0)"
        if dtypes.is_int(target) and is_float:
            # float -> int truncates toward zero (Triton's fptosi does; NaN is undefined as in ONNX)
            return f"{a}.to({tl_dtype(target)})"
        return f"{a}.to({tl_dtype(compute_dtype(target))})"
    raise NotImplementedError(f"no Triton expression for {op.value}")


# An exponent given as a literal (a baked-in scalar constant) with a cheap exact form.
_SMALL_POWERS = {"2.0": "({0} * {0})", "3.0": "({0} * {0} * {0})", "1.0": "({0})", "0.5": "tl.sqrt_rn({0})"}

PRELUDE = '''import triton
import triton.language as tl


@triton.jit
def _tanh(x):
    # odd series near 0 (the exp form cancels there), exp form elsewhere
    a = tl.abs(x)
    e = tl.exp(-2.0 * a)
    big = (1.0 - e) / (1.0 + e)
    x2 = x * x
    small = a * (1.0 - x2 * (1.0 / 3.0 - x2 * (2.0 / 15.0)))
    r = tl.where(a < 0.04, small, big)
    return tl.where(x < 0, -r, r)


@triton.jit
def _softplus(x):
    # max(x, 0) + log1p(e^-|x|): no overflow; log1p by its series when e^-|x| is tiny
    t = tl.exp(-tl.abs(x))
    return tl.maximum(x, 0.0) + tl.where(t < 1e-4, t - 0.5 * t * t, tl.log(1.0 + t))


@triton.jit
def _round_half_even(x):
    r = tl.floor(x + 0.5)
    tie = (r - x) == 0.5
    odd = (r - 2.0 * tl.floor(r * 0.5)) != 0
    return tl.where(tie & odd, r - 1.0, r)


@triton.jit
def _trunc(x):
    return tl.where(x < 0, tl.ceil(x), tl.floor(x))


@triton.jit
def _fmod(a, b):
    # C fmod: sign of the dividend
    return a - b * _trunc(a / b)


@triton.jit
def _pow(a, b):
    mag = tl.exp(b * tl.log(tl.abs(a)))
    whole = b == tl.floor(b)
    odd = whole & (_fmod(b, 2.0) != 0)
    neg = tl.where(whole, tl.where(odd, -mag, mag), float("nan"))
    zero = tl.where(b > 0, 0.0, tl.where(b == 0, 1.0, float("inf")))
    return tl.where(b == 0, 1.0, tl.where(a < 0, neg, tl.where(a == 0, zero, mag)))
'''
