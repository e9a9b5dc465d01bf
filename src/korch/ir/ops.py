"""The primitive vocabulary: one ``Op`` enum, its kinds, and the exact semantics of each op.

Every operator of an imported model is rewritten (``korch.fission``) into these
primitives. Each op states its meaning here once; the shape rules
(``ir/shapes.py``), the reference executor (``ir/interpret.py``) and the
ONNX exporter (``ir/to_onnx.py``) are interpretations of the same names.

Conventions every stage relies on:

* **Broadcasting.** Elementwise ops (unary, binary, ternary) take inputs whose
  shapes broadcast to the output shape by numpy's rule (align trailing axes; a
  size-1 or missing axis repeats). No other op broadcasts implicitly;
  ``BROADCAST`` broadcasts explicitly.
* **Dtypes.** Inputs of an elementwise op share one dtype, except ``WHERE``'s
  condition (bool). Comparisons return bool; ``CAST`` returns ``attrs.to``.
* **Axes** in attributes are non-negative and sorted where order does not matter.
* **Integer arithmetic.** ``DIV`` on integers truncates toward zero, as ONNX does
  (C semantics); ``MOD`` follows ``attrs.fmod`` (0: sign of divisor, 1: sign of
  dividend).

Semantics by op (``x``, ``y``, ``z``: inputs; ``out``: the single output):

Elementwise unary: ``NEG -x``, ``ABS |x|``, ``EXP e^x``, ``LOG ln x``,
``SQRT``, ``RECIPROCAL 1/x``, ``TANH``, ``ERF``, ``SIGMOID 1/(1+e^-x)``,
``RELU max(x, 0)``, ``SOFTPLUS ln(1 + e^x)`` (computed without overflow), ``FLOOR``, ``CEIL``, ``ROUND`` (half to even), ``SIGN``,
``NOT`` (bool), ``SIN``, ``COS``, ``ISNAN``, ``ISINF``.
Elementwise binary: ``ADD SUB MUL DIV POW MAX MIN MOD``; comparisons
``EQUAL LESS LESS_EQUAL GREATER GREATER_EQUAL``; logic ``AND OR XOR`` (bool).
``MAX``/``MIN`` propagate NaN.
Elementwise ternary: ``WHERE(cond, x, y)``: x where cond else y.
``CAST(x; to)``: convert to dtype ``to`` (float to int truncates toward zero,
to bool is ``x != 0``).

Reduce ``REDUCE_SUM REDUCE_MAX REDUCE_MIN REDUCE_MEAN REDUCE_PROD (x; axes,
keepdims)``: reduce over ``axes`` (non-empty, sorted); with ``keepdims`` the
reduced axes stay with size 1.

Window reduce ``MAX_POOL``, ``AVG_POOL (x; kernel, strides, pads, dilations
[, count_include_pad])`` on ``x`` of shape (N, C, *spatial): ``pads`` is
(begin_1..begin_k, end_1..end_k) as in ONNX; output size per spatial axis is
``floor((in + begin + end - dilation*(kernel-1) - 1) / stride) + 1``. Padding
is -inf for max; for average it counts in the divisor only when
``count_include_pad``. Every window holds at least one real element.

Layout (each output element is one input element, or a pad value):
``TRANSPOSE(x; perm)`` out.shape[i] = x.shape[perm[i]].
``RESHAPE(x; shape)`` same elements in row-major order, new static shape.
``SLICE(x; starts, steps)``: out[i_0..i_k] = x[starts_0 + i_0*steps_0, ...],
one start and non-zero step per axis; the output shape says how many.
``CONCAT(x_0..x_n; axis)``. ``PAD(x[, value]; pads, mode)``: ``pads`` as ONNX
(begins then ends, non-negative), ``mode`` constant (fill with ``value``, a
0-d constant input or 0), reflect (mirror without the edge), edge (repeat the
edge), wrap (periodic).
``GATHER(x, indices; axis)``: ``indices`` is an int64 tensor (a constant, or
computed at run time: an embedding lookup) with values in [0, x.shape[axis]);
out.shape = x.shape[:axis] + indices.shape +
x.shape[axis+1:], out[.., j.., ..] = x[.., indices[j..], ..].
``BROADCAST(x; shape)``: numpy-broadcast ``x`` to ``shape`` (ONNX Expand with
a static result shape).
Resize/Upsample have no primitive of their own: nearest resize is one
``GATHER`` per resized axis, linear resize two gathers and a weighted sum per
axis (``fission/resize.py``).

Linear (output linear in each input):
``MATMUL(a, b)``: numpy ``matmul`` on inputs of rank >= 2; batch axes broadcast.
``CONV(x, w; strides, pads, dilations, group)``: ONNX Conv without bias, x of
shape (N, C, *spatial) with 1 to 3 spatial axes, w of shape (M, C/group, *k).
``CONV_TRANSPOSE(x, w; strides, pads, dilations, group, output_padding)``:
ONNX ConvTranspose without bias, w of shape (C, M/group, *k); out spatial =
stride*(in-1) + output_padding + dilation*(k-1) + 1 - begin - end.

Opaque ``OPAQUE(*inputs; op_type, domain, opset, node)``: any other ONNX node,
kept whole (``node`` is its serialized ``NodeProto``) and executed by a library
implementation (ONNX Runtime). It may have several outputs.
"""

from __future__ import annotations

import enum


class Kind(enum.Enum):
    """The primitive kinds of the paper's Table 1, with window reductions apart."""

    ELEMENTWISE = "elementwise"
    REDUCE = "reduce"
    WINDOW = "window"
    LAYOUT = "layout"
    LINEAR = "linear"
    OPAQUE = "opaque"


class Op(enum.Enum):
    # elementwise unary
    NEG = "Neg"
    ABS = "Abs"
    EXP = "Exp"
    LOG = "Log"
    SQRT = "Sqrt"
    RECIPROCAL = "Reciprocal"
    TANH = "Tanh"
    ERF = "Erf"
    SIGMOID = "Sigmoid"
    RELU = "Relu"
    SOFTPLUS = "Softplus"
    FLOOR = "Floor"
    CEIL = "Ceil"
    ROUND = "Round"
    SIGN = "Sign"
    NOT = "Not"
    SIN = "Sin"
    COS = "Cos"
    ISNAN = "IsNaN"
    ISINF = "IsInf"
    # elementwise binary
    ADD = "Add"
    SUB = "Sub"
    MUL = "Mul"
    DIV = "Div"
    POW = "Pow"
    MAX = "Max"
    MIN = "Min"
    MOD = "Mod"
    EQUAL = "Equal"
    LESS = "Less"
    LESS_EQUAL = "LessOrEqual"
    GREATER = "Greater"
    GREATER_EQUAL = "GreaterOrEqual"
    AND = "And"
    OR = "Or"
    XOR = "Xor"
    # elementwise ternary and conversion
    WHERE = "Where"
    CAST = "Cast"
    # reduce
    REDUCE_SUM = "ReduceSum"
    REDUCE_MAX = "ReduceMax"
    REDUCE_MIN = "ReduceMin"
    REDUCE_MEAN = "ReduceMean"
    REDUCE_PROD = "ReduceProd"
    # window reduce
    MAX_POOL = "MaxPool"
    AVG_POOL = "AveragePool"
    # layout
    TRANSPOSE = "Transpose"
    RESHAPE = "Reshape"
    SLICE = "Slice"
    CONCAT = "Concat"
    PAD = "Pad"
    GATHER = "Gather"
    BROADCAST = "Broadcast"
    # linear
    MATMUL = "MatMul"
    CONV = "Conv"
    CONV_TRANSPOSE = "ConvTranspose"
    # opaque
    OPAQUE = "Opaque"

    @property
    def kind(self) -> Kind:
        return _KIND[self]

    def __repr__(self) -> str:
        return f"Op.{self.name}"


UNARY = frozenset({
    Op.NEG, Op.ABS, Op.EXP, Op.LOG, Op.SQRT, Op.RECIPROCAL, Op.TANH, Op.ERF, Op.SIGMOID,
    Op.RELU, Op.SOFTPLUS, Op.FLOOR, Op.CEIL, Op.ROUND, Op.SIGN, Op.NOT, Op.SIN, Op.COS, Op.ISNAN, Op.ISINF,
})
COMPARISON = frozenset({Op.EQUAL, Op.LESS, Op.LESS_EQUAL, Op.GREATER, Op.GREATER_EQUAL})
LOGICAL = frozenset({Op.AND, Op.OR, Op.XOR})
BINARY = frozenset({Op.ADD, Op.SUB, Op.MUL, Op.DIV, Op.POW, Op.MAX, Op.MIN, Op.MOD}) | COMPARISON | LOGICAL
ELEMENTWISE = UNARY | BINARY | {Op.WHERE, Op.CAST}
REDUCE = frozenset({Op.REDUCE_SUM, Op.REDUCE_MAX, Op.REDUCE_MIN, Op.REDUCE_MEAN, Op.REDUCE_PROD})
WINDOW = frozenset({Op.MAX_POOL, Op.AVG_POOL})
LAYOUT = frozenset({Op.TRANSPOSE, Op.RESHAPE, Op.SLICE, Op.CONCAT, Op.PAD, Op.GATHER, Op.BROADCAST})
LINEAR = frozenset({Op.MATMUL, Op.CONV, Op.CONV_TRANSPOSE})
OPAQUE = frozenset({Op.OPAQUE})

_KIND = {
    **{op: Kind.ELEMENTWISE for op in ELEMENTWISE},
    **{op: Kind.REDUCE for op in REDUCE},
    **{op: Kind.WINDOW for op in WINDOW},
    **{op: Kind.LAYOUT for op in LAYOUT},
    **{op: Kind.LINEAR for op in LINEAR},
    Op.OPAQUE: Kind.OPAQUE,
}
assert set(_KIND) == set(Op), "every Op needs a kind"
