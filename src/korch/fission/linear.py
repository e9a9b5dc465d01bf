"""Fission rules of the linear operators: MatMul, Gemm, Conv, ConvTranspose and Einsum.

Each becomes one ``MATMUL``, ``CONV`` or ``CONV_TRANSPOSE`` primitive framed by
layout and elementwise ops: 1-D MatMul operands are reshaped to 2-D and back,
Gemm's transposes are ``TRANSPOSE`` (folded into the weight when it is a
constant) and its alpha/beta are multiplies, a bias is an ``ADD`` broadcast
over the spatial axes, and ``auto_pad``/``output_shape`` are resolved to
explicit pads here, so the primitives only ever see numbers. Einsum becomes
diagonals (``SLICE`` of a flattened pair of axes), sums, and one ``MATMUL``
(or ``MUL``) per pair of operands. ``explicit_pads`` is shared with the pools.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from korch.fission.builder import Builder
from korch.fission.registry import fission_rule
from korch.ir import dtypes
from korch.ir.ops import Op

# -- padding shared with the pools -------------------------------------------------


def explicit_pads(auto_pad: str, pads: Sequence[int] | None, sizes: Sequence[int], kernel: Sequence[int],
                  strides: Sequence[int], dilations: Sequence[int]) -> list[int] | None:
    """ONNX (begins..., ends...) pads of a convolution or pool window; None for an unknown ``auto_pad``.

    SAME_* pads so that the output has ``ceil(in / stride)`` elements, the odd one
    at the end (UPPER) or the beginning (LOWER), measuring the dilated kernel as
    the spec says (ORT's pools use the undilated one; its Conv refuses dilations
    there). A negative total pads nothing, as ORT's Conv does.
    """
    k = len(sizes)
    if auto_pad == "NOTSET":
        return [int(p) for p in pads] if pads is not None else [0] * (2 * k)
    if auto_pad == "VALID":
        return [0] * (2 * k)
    if auto_pad not in ("SAME_UPPER", "SAME_LOWER"):
        return None
    begins, ends = [], []
    for size, kk, s, d in zip(sizes, kernel, strides, dilations):
        out = -(-size // s)
        total = max(0, (out - 1) * s + (kk - 1) * d + 1 - size)
        small = total // 2
        begins.append(small if auto_pad == "SAME_UPPER" else total - small)
        ends.append(total - begins[-1])
    return begins + ends


def _ones(value: Sequence[int] | None, k: int) -> list[int]:
    return [int(v) for v in value] if value is not None else [1] * k


def _add_channel_bias(b: Builder, y: str, bias: str | None) -> str:
    if bias is None:
        return y
    shape = (b.shape(bias)[0],) + (1,) * (b.rank(y) - 2)
    return b.add(y, b.reshape(bias, shape))


# -- MatMul and Gemm ---------------------------------------------------------------


@fission_rule("MatMul", since=1)
def MatMul(b: Builder, a, c):
    ra, rc = b.rank(a), b.rank(c)
    if ra == 0 or rc == 0:
        return NotImplemented
    a2 = b.reshape(a, (1,) + b.shape(a)) if ra == 1 else a
    c2 = b.reshape(c, b.shape(c) + (1,)) if rc == 1 else c
    y = b.emit(Op.MATMUL, a2, c2)
    # numpy: the axis a 1-D operand gained is removed again
    n = b.rank(y)
    dropped = {n - 2} if ra == 1 else set()
    dropped |= {n - 1} if rc == 1 else set()
    return b.reshape(y, [d for i, d in enumerate(b.shape(y)) if i not in dropped])


def _scaled(b: Builder, x: str, factor: float) -> str | None:
    """``x * factor``; None when an integer tensor would need a fractional factor."""
    if factor == 1:
        return x
    if dtypes.is_int(b.dtype(x)) and factor != int(factor):
        return None
    return b.mul(x, b.scalar(factor, like=x))


def _gemm(b: Builder, a: str, w: str, c: str | None, alpha: float, beta: float, transA: int, transB: int):
    if b.rank(a) != 2 or b.rank(w) != 2:
        return NotImplemented
    a = b.transpose(a, (1, 0)) if transA else a
    w = b.transpose(w, (1, 0)) if transB else w
    # alpha goes onto a constant operand when there is one: it folds away there
    on_weight = alpha != 1 and (b.value(w) is not None or b.value(a) is not None)
    if on_weight:
        if b.value(w) is not None:
            w = _scaled(b, w, alpha)
        else:
            a = _scaled(b, a, alpha)
        if a is None or w is None:
            return NotImplemented
    y = b.emit(Op.MATMUL, a, w)
    if not on_weight:
        y = _scaled(b, y, alpha)
        if y is None:
            return NotImplemented
    # as ONNX Runtime and BLAS do, beta == 0 ignores C (even where it holds inf or NaN)
    if c is not None and beta != 0:
        c = _scaled(b, c, beta)
        if c is None:
            return NotImplemented
        y = b.add(y, c)
    return y


@fission_rule("Gemm", since=1)
def Gemm_1(b: Builder, a, w, c, *, alpha=1.0, beta=1.0, broadcast=0, transA=0, transB=0):
    # broadcast=0 only promises that C already has the output's shape: the same arithmetic
    return _gemm(b, a, w, c, alpha, beta, transA, transB)


@fission_rule("Gemm", since=7)
def Gemm(b: Builder, a, w, c=None, *, alpha=1.0, beta=1.0, transA=0, transB=0):
    return _gemm(b, a, w, c, alpha, beta, transA, transB)


# -- Conv and ConvTranspose -------------------------------------------------------


@fission_rule("Conv", since=1)
def Conv(b: Builder, x, w, bias=None, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None,
         pads=None, strides=None):
    k = b.rank(x) - 2
    kernel = b.shape(w)[2:]
    if not 1 <= k <= 3 or (kernel_shape is not None and tuple(kernel_shape) != kernel):
        return NotImplemented
    strides, dilations = _ones(strides, k), _ones(dilations, k)
    pads = explicit_pads(auto_pad, pads, b.shape(x)[2:], kernel, strides, dilations)
    if pads is None:
        return NotImplemented
    y = b.emit(Op.CONV, x, w, strides=tuple(strides), pads=tuple(pads), dilations=tuple(dilations),
               group=int(group))
    return _add_channel_bias(b, y, bias)


def _transpose_pads(full: Sequence[int], target: Sequence[int], auto_pad: str) -> list[int]:
    """Pads cropping a transposed convolution of size ``full`` to ``target``, split as the spec says.

    The odd element is cropped at the end for SAME_UPPER, at the beginning otherwise (opset 11 text;
    opset 1's text says the reverse, but ORT and the ONNX reference split every opset this way).
    """
    begins, ends = [], []
    for f, t in zip(full, target):
        total = max(0, f - t)  # a larger target is zeros appended at the end (see ConvTranspose)
        small = total // 2
        begins.append(small if auto_pad == "SAME_UPPER" else total - small)
        ends.append(total - begins[-1])
    return begins + ends


@fission_rule("ConvTranspose", since=1)
def ConvTranspose(b: Builder, x, w, bias=None, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None,
                  output_padding=None, output_shape=None, pads=None, strides=None):
    k = b.rank(x) - 2
    sizes, kernel = b.shape(x)[2:], b.shape(w)[2:]
    if not 1 <= k <= 3 or (kernel_shape is not None and tuple(kernel_shape) != kernel):
        return NotImplemented
    if auto_pad not in ("NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER"):
        return NotImplemented
    strides, dilations = _ones(strides, k), _ones(dilations, k)
    output_padding = [int(p) for p in output_padding] if output_padding is not None else [0] * k
    full = [s * (n - 1) + op + (kk - 1) * d + 1
            for n, kk, s, d, op in zip(sizes, kernel, strides, dilations, output_padding)]
    target = None
    if output_shape is not None:
        target = [int(t) for t in output_shape][-k:]  # some exporters include N and C
    elif auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        # in * stride, but never more than the full result (ONNX shape inference and ORT agree)
        target = [min(n * s, f) for n, s, f in zip(sizes, strides, full)]
    if target is not None:
        pads = _transpose_pads(full, target, auto_pad)
    elif auto_pad == "VALID" or pads is None:
        pads = [0] * (2 * k)
    y = b.emit(Op.CONV_TRANSPOSE, x, w, strides=tuple(strides), pads=tuple(int(p) for p in pads),
               dilations=tuple(dilations), group=int(group), output_padding=tuple(output_padding))
    if target is not None and any(t > f for f, t in zip(full, target)):
        # an output_shape beyond the full result: zeros at the end, as ONNX Runtime does
        extra = [max(0, t - f) for f, t in zip(full, target)]
        y = b.emit(Op.PAD, y, pads=(0,) * (k + 2) + (0, 0, *extra), mode="constant")
    return _add_channel_bias(b, y, bias)


# -- Einsum ------------------------------------------------------------------------

_ELLIPSIS_LABELS = "0123456789"  # stand-ins for the axes of "...", never letters of an equation


def _is_term(term: str) -> bool:
    """Letters, with at most one "..." among them."""
    return term.count("...") <= 1 and all("a" <= ch.lower() <= "z" for ch in term.replace("...", "", 1))


def _parse_einsum(equation: str, ranks: Sequence[int]) -> tuple[list[str], str] | None:
    """Each operand's labels and the output's, with "..." spelled out as digits; None if malformed."""
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        return None
    spelled = []
    ellipsis_rank = 0
    for term, rank in zip(terms, ranks):
        if not _is_term(term):
            return None
        if "..." in term:
            n = rank - (len(term) - 3)
            if n < 0 or n > len(_ELLIPSIS_LABELS):
                return None
            ellipsis_rank = max(ellipsis_rank, n)
            term = term.replace("...", _ELLIPSIS_LABELS[len(_ELLIPSIS_LABELS) - n:])
        if len(term) != rank:
            return None
        spelled.append(term)
    ellipsis = _ELLIPSIS_LABELS[len(_ELLIPSIS_LABELS) - ellipsis_rank:]
    if arrow:
        if not _is_term(rhs):
            return None
        out = rhs.replace("...", ellipsis)
    else:  # implicit output: the ellipsis, then the labels seen once, in alphabetical order
        counts = {ch: sum(t.count(ch) for t in spelled) for ch in set("".join(spelled))}
        out = ellipsis + "".join(sorted(ch for ch, n in counts.items() if n == 1 and ch.isalpha()))
    if len(set(out)) != len(out) or not set(out) <= set("".join(spelled)):
        return None
    return spelled, out


def _diagonal(b: Builder, x: str, labels: str) -> tuple[str, str] | None:
    """Take the diagonal of every repeated label: the pair of axes made adjacent, flattened, sliced."""
    while True:
        repeated = next((ch for ch in labels if labels.count(ch) > 1), None)
        if repeated is None:
            return x, labels
        i = labels.index(repeated)
        j = labels.index(repeated, i + 1)
        n = b.shape(x)[i]
        if b.shape(x)[j] != n:
            return None
        order = [a for a in range(len(labels)) if a != j]
        order.insert(i + 1, j)
        x = b.transpose(x, order)
        shape = list(b.shape(x))
        x = b.reshape(x, shape[:i] + [n * n] + shape[i + 2:])
        x = b.slice_axis(x, i, 0, n, step=n + 1)
        labels = "".join(labels[a] for a in order)
        labels = labels[:i + 1] + labels[i + 2:]


def _sum_out(b: Builder, x: str, labels: str, keep: set[str]) -> tuple[str, str]:
    axes = [i for i, ch in enumerate(labels) if ch not in keep]
    if not axes:
        return x, labels
    return b.reduce(Op.REDUCE_SUM, x, axes, keepdims=False), "".join(ch for ch in labels if ch in keep)


def _arrange(b: Builder, x: str, labels: str, groups: Sequence[str], sizes: dict[str, int]) -> str:
    """``x`` transposed to the order of ``groups`` (labels it lacks become size-1 axes), each group one axis
    except the first (the batch labels), which stay separate."""
    x = b.transpose(x, [labels.index(ch) for group in groups for ch in group if ch in labels])
    batch, *rest = groups
    shape = [sizes[ch] if ch in labels else 1 for ch in batch]
    shape += [math.prod(sizes[ch] for ch in group if ch in labels) for group in rest]
    return b.reshape(x, shape)


def _contract(b: Builder, x: str, xl: str, y: str, yl: str, keep: set[str], sizes: dict[str, int]):
    """The product of two operands, summed over the shared labels ``keep`` does not hold."""
    x, xl = _sum_out(b, x, xl, keep | set(yl))
    y, yl = _sum_out(b, y, yl, keep | set(xl))
    # a size-1 "..." axis meeting a longer one
    shared = set(xl) & set(yl)
    x = b.broadcast(x, [sizes[c] if c in shared else d for c, d in zip(xl, b.shape(x))])
    y = b.broadcast(y, [sizes[c] if c in shared else d for c, d in zip(yl, b.shape(y))])
    batch = "".join(ch for ch in xl if ch in yl and ch in keep)
    summed = "".join(ch for ch in xl if ch in yl and ch not in keep)
    left = "".join(ch for ch in xl if ch not in yl)
    right = "".join(ch for ch in yl if ch not in xl)
    if not summed:  # nothing to contract: a broadcast product
        out = b.mul(_arrange(b, x, xl, [batch + left + right], sizes),
                    _arrange(b, y, yl, [batch + left + right], sizes))
    else:
        out = b.emit(Op.MATMUL, _arrange(b, x, xl, [batch, left, summed], sizes),
                     _arrange(b, y, yl, [batch, summed, right], sizes))
    labels = batch + left + right
    return b.reshape(out, [sizes[ch] for ch in labels]), labels


@fission_rule("Einsum", since=12)
def Einsum(b: Builder, *inputs, equation):
    parsed = _parse_einsum(equation, [b.rank(x) for x in inputs])
    if parsed is None or not inputs:
        return NotImplemented
    terms, out = parsed
    sizes: dict[str, int] = {}
    for x, labels in zip(inputs, terms):
        for ch, d in zip(labels, b.shape(x)):
            if sizes.get(ch, 1) not in (1, d) and d != 1:
                return NotImplemented
            sizes[ch] = max(sizes.get(ch, 1), d)
    operands = []
    for x, labels in zip(inputs, terms):
        diagonal = _diagonal(b, x, labels)
        if diagonal is None:
            return NotImplemented
        operands.append(diagonal)
    acc, labels = operands[0]
    for i, (y, yl) in enumerate(operands[1:], start=1):
        keep = set(out).union(*(set(t) for _, t in operands[i + 1:]))
        acc, labels = _contract(b, acc, labels, y, yl, keep, sizes)
    acc, labels = _sum_out(b, acc, labels, set(out))
    acc = b.transpose(acc, [labels.index(ch) for ch in out])
    acc = b.broadcast(acc, [sizes[ch] for ch in out])
    return b.copy(acc) if acc in inputs else acc
