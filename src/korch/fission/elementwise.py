"""Fission rules of elementwise operators: arithmetic, comparisons, logic, activations, Cast.

Each ONNX operator is one small function named like it; attributes are keyword
arguments with the spec's defaults. Activations that ONNX defines by a formula
become that formula in primitives (Gelu: 0.5 x (1 + erf(x / sqrt 2))).
"""

from __future__ import annotations

import functools
import math

from korch.fission.builder import Builder
from korch.fission.registry import fission_rule
from korch.ir import dtypes
from korch.ir.ops import Op


def _unary(op_type: str, op: Op, since: int = 6) -> None:
    fission_rule(op_type, since=since)(lambda b, x: b.emit(op, x))


def _binary(op_type: str, op: Op, since: int = 7) -> None:
    fission_rule(op_type, since=since)(lambda b, x, y: b.emit(op, x, y))


for _name, _op in {"Neg": Op.NEG, "Abs": Op.ABS, "Exp": Op.EXP, "Log": Op.LOG, "Sqrt": Op.SQRT,
                   "Reciprocal": Op.RECIPROCAL, "Tanh": Op.TANH, "Sigmoid": Op.SIGMOID, "Relu": Op.RELU,
                   "Floor": Op.FLOOR, "Ceil": Op.CEIL}.items():
    _unary(_name, _op)
for _name, _op in {"Erf": Op.ERF, "Sign": Op.SIGN, "IsNaN": Op.ISNAN}.items():
    _unary(_name, _op, since=9)
_unary("Round", Op.ROUND, since=11)
_unary("Not", Op.NOT, since=1)
_unary("Sin", Op.SIN, since=7)
_unary("Cos", Op.COS, since=7)

for _name, _op in {"Add": Op.ADD, "Sub": Op.SUB, "Mul": Op.MUL, "Div": Op.DIV, "Equal": Op.EQUAL,
                   "Less": Op.LESS, "Greater": Op.GREATER, "And": Op.AND, "Or": Op.OR, "Xor": Op.XOR}.items():
    _binary(_name, _op)
_binary("LessOrEqual", Op.LESS_EQUAL, since=12)
_binary("GreaterOrEqual", Op.GREATER_EQUAL, since=12)


@fission_rule("IsInf", since=10)
def IsInf(b: Builder, x, *, detect_negative=1, detect_positive=1):
    if detect_negative and detect_positive:
        return b.emit(Op.ISINF, x)
    if not detect_negative and not detect_positive:
        return b.emit(Op.LESS, x, x)  # always false, NaN included
    inf = b.scalar(math.inf if detect_positive else -math.inf, like=x)
    return b.emit(Op.EQUAL, x, inf)


@fission_rule("Mod", since=10)
def Mod(b: Builder, x, y, *, fmod=0):
    return b.emit(Op.MOD, x, y, fmod=int(fmod))


@fission_rule("Pow", since=7)
def Pow(b: Builder, x, y):
    x_type, y_type = b.dtype(x), b.dtype(y)
    if dtypes.is_int(x_type) and dtypes.is_float(y_type):
        # the result has the base's type: compute in the exponent's, then truncate as ONNX does
        return b.cast(b.emit(Op.POW, b.cast(x, y_type), y), x_type)
    return b.emit(Op.POW, x, b.cast(y, x_type))


@fission_rule("Where", since=9)
def Where(b: Builder, condition, x, y):
    return b.where(condition, x, y)


@fission_rule("Cast", since=6)
def Cast(b: Builder, x, *, to, saturate=1, round_mode="up"):
    target = dtypes.from_onnx(to)
    if target not in dtypes.SUPPORTED:
        return NotImplemented
    return b.copy(x) if target == b.dtype(x) else b.emit(Op.CAST, x, to=target)


@fission_rule("CastLike", since=15)
def CastLike(b: Builder, x, target_type, *, saturate=1, round_mode="up"):
    target = b.dtype(target_type)
    return b.copy(x) if target == b.dtype(x) else b.emit(Op.CAST, x, to=target)


def _variadic(op: Op, b: Builder, *xs):
    return functools.reduce(lambda acc, x: b.emit(op, acc, x), xs[1:], xs[0])


fission_rule("Max", since=8)(lambda b, *xs: _variadic(Op.MAX, b, *xs))
fission_rule("Min", since=8)(lambda b, *xs: _variadic(Op.MIN, b, *xs))
fission_rule("Sum", since=8)(lambda b, *xs: _variadic(Op.ADD, b, *xs))


@fission_rule("Mean", since=8)
def Mean(b: Builder, *xs):
    return b.div(_variadic(Op.ADD, b, *xs), b.scalar(len(xs), like=xs[0]))


# -- activations -----------------------------------------------------------------

def _negative(b: Builder, x: str) -> str:
    return b.emit(Op.LESS, x, b.scalar(0, like=x))


@fission_rule("LeakyRelu", since=6)
def LeakyRelu(b: Builder, x, *, alpha=0.01):
    scaled = b.mul(x, b.scalar(alpha, like=x))
    if 0 <= alpha <= 1:
        return b.maximum(x, scaled)  # x >= alpha*x exactly when x >= 0
    return b.where(_negative(b, x), scaled, x)


@fission_rule("PRelu", since=7)
def PRelu(b: Builder, x, slope):
    return b.where(_negative(b, x), b.mul(x, slope), x)


@fission_rule("Elu", since=6)
def Elu(b: Builder, x, *, alpha=1.0):
    expm1 = b.sub(b.emit(Op.EXP, x), b.scalar(1, like=x))
    return b.where(_negative(b, x), b.mul(expm1, b.scalar(alpha, like=x)), x)


@fission_rule("Selu", since=6)
def Selu(b: Builder, x, *, alpha=1.67326319217681884765625, gamma=1.05070102214813232421875):
    scaled_exp = b.sub(b.mul(b.emit(Op.EXP, x), b.scalar(alpha, like=x)), b.scalar(alpha, like=x))
    nonpositive = b.emit(Op.LESS_EQUAL, x, b.scalar(0, like=x))
    return b.mul(b.where(nonpositive, scaled_exp, x), b.scalar(gamma, like=x))


@fission_rule("Clip", since=6)
def Clip_6(b: Builder, x, *, min=-3.4028234663852886e38, max=3.4028234663852886e38):
    return b.minimum(b.maximum(x, b.scalar(min, like=x)), b.scalar(max, like=x))


@fission_rule("Clip", since=11)
def Clip(b: Builder, x, lo=None, hi=None):
    if lo:
        x = b.maximum(x, lo)
    if hi:
        x = b.minimum(x, hi)
    return x if (lo or hi) else b.copy(x)


def _hard_sigmoid(b: Builder, x: str, alpha: float, beta: float) -> str:
    linear = b.add(b.mul(x, b.scalar(alpha, like=x)), b.scalar(beta, like=x))
    return b.minimum(b.maximum(linear, b.scalar(0, like=x)), b.scalar(1, like=x))


@fission_rule("HardSigmoid", since=6)
def HardSigmoid(b: Builder, x, *, alpha=0.2, beta=0.5):
    return _hard_sigmoid(b, x, alpha, beta)


@fission_rule("HardSwish", since=14)
def HardSwish(b: Builder, x):
    return b.mul(x, _hard_sigmoid(b, x, 1 / 6, 0.5))


_unary("Softplus", Op.SOFTPLUS, since=1)


@fission_rule("Softsign", since=1)
def Softsign(b: Builder, x):
    return b.div(x, b.add(b.emit(Op.ABS, x), b.scalar(1, like=x)))


@fission_rule("Mish", since=18)
def Mish(b: Builder, x):
    return b.mul(x, b.emit(Op.TANH, b.emit(Op.SOFTPLUS, x)))


@fission_rule("Gelu", since=20)
def Gelu(b: Builder, x, *, approximate="none"):
    half_x = b.mul(x, b.scalar(0.5, like=x))
    if approximate == "tanh":
        cube = b.mul(b.mul(x, x), x)
        inner = b.add(x, b.mul(cube, b.scalar(0.044715, like=x)))
        t = b.emit(Op.TANH, b.mul(inner, b.scalar(math.sqrt(2 / math.pi), like=x)))
    elif approximate == "none":
        t = b.emit(Op.ERF, b.mul(x, b.scalar(1 / math.sqrt(2), like=x)))
    else:
        return NotImplemented
    return b.mul(half_x, b.add(t, b.scalar(1, like=x)))


@fission_rule("ThresholdedRelu", since=10)
def ThresholdedRelu(b: Builder, x, *, alpha=1.0):
    return b.where(b.emit(Op.GREATER, x, b.scalar(alpha, like=x)), x, b.scalar(0, like=x))


@fission_rule("Celu", since=12)
def Celu(b: Builder, x, *, alpha=1.0):
    a = b.scalar(alpha, like=x)
    negative_part = b.mul(b.sub(b.emit(Op.EXP, b.div(x, a)), b.scalar(1, like=x)), a)
    return b.add(b.emit(Op.RELU, x), b.minimum(b.scalar(0, like=x), negative_part))

