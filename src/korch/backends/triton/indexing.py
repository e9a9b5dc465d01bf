"""Index arithmetic of generated Triton kernels: per-axis indices as sums of digits of the loop variables.

A kernel iterates over a few *domain variables*, each with a known extent:
``x``: the flat element of a pointwise output; ``row``/``col``: a reduction's
kept and reduced positions; ``m``/``n``/``ka``/``kb``: a GEMM tile's rows,
columns and reduction positions (as the A and the B tile see them), and
``batch``, the tile's problem, which needs no mask. Every index a kernel
computes is an ``Ix``: either an
affine sum of *digits* ``(var // div) % mod`` of those variables, or an opaque
piece of Triton source (a reflect pad, a gathered index) with the variables it
reads.

Keeping indices affine in digits lets layout ops cancel: unflattening a
variable over a shape and flattening it back (a reshape round trip) gives the
variable again, so a reshape costs no division, and a reduction kernel can
prove that a reduced value is read at the row that computed it (``Space.same``).
Simplifications assume each variable lies in ``[0, extent)``; lanes beyond it are
masked (``<var>_mask``), so what they compute is never loaded or stored.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from collections.abc import Sequence

import numpy as np


@dataclasses.dataclass(frozen=True, order=True)
class Digit:
    """``(var // div) % mod``; ``mod`` None: no modulo."""

    var: str
    div: int
    mod: int | None

    def render(self) -> str:
        text = self.var if self.div == 1 else f"({self.var} // {self.div})"
        return text if self.mod is None else f"({text} % {self.mod})"


@dataclasses.dataclass(frozen=True)
class Ix:
    """``sum(coef * digit) + const``, or opaque Triton source ``code`` reading ``vars``."""

    terms: tuple[tuple[Digit, int], ...] = ()
    const: int = 0
    code: str | None = None
    vars: frozenset[str] = frozenset()

    @property
    def is_const(self) -> bool:
        return self.code is None and not self.terms


def const(value: int) -> Ix:
    return Ix(const=int(value))


class Space:
    """The domain variables of one kernel with their extents, and the index operations on them."""

    def __init__(self, extents: dict[str, int] | None = None):
        self.extents: dict[str, int] = dict(extents or {})
        self.unmasked: set[str] = set()

    def add_var(self, name: str, extent: int, masked: bool = True) -> Ix:
        """A new variable in ``[0, extent)``; ``masked``: the kernel has lanes beyond it, off under ``<name>_mask``."""
        self.extents[name] = int(extent)
        if not masked:
            self.unmasked.add(name)
        return self.var(name)

    def masked(self, vars_: frozenset[str]) -> list[str]:
        """The variables among ``vars_`` that have a mask, in a fixed order."""
        return sorted(v for v in vars_ if v not in self.unmasked)

    def var(self, name: str) -> Ix:
        return self._canon([(Digit(name, 1, None), 1)], 0)

    # --- canonical form -------------------------------------------------------------------------

    def _range(self, d: Digit) -> int:
        """How many values the digit takes."""
        whole = -(-self.extents[d.var] // d.div)
        return whole if d.mod is None else min(d.mod, whole)

    def _norm(self, d: Digit) -> Digit | None:
        """The digit in canonical form, None when it is always 0."""
        extent = self.extents[d.var]
        if d.div >= extent or d.mod == 1:
            return None
        if d.mod is not None and d.div * d.mod >= extent:
            return Digit(d.var, d.div, None)
        return d

    def _canon(self, terms, const_value: int) -> Ix:
        coefs: dict[Digit, int] = {}
        for d, c in terms:
            d = self._norm(d)
            if d is not None and c:
                coefs[d] = coefs.get(d, 0) + c
        items = sorted((d, c) for d, c in coefs.items() if c)
        merged = True
        while merged:  # c*(v//d % m) + c*m*(v//(d*m) % m2) -> c*(v//d % (m*m2))
            merged = False
            for i in range(len(items) - 1):
                (d1, c1), (d2, c2) = items[i], items[i + 1]
                if d1.var == d2.var and d1.mod is not None and d2.div == d1.div * d1.mod and c2 == c1 * d1.mod:
                    joined = self._norm(Digit(d1.var, d1.div, None if d2.mod is None else d1.mod * d2.mod))
                    items[i:i + 2] = [(joined, c1)] if joined is not None else []
                    merged = True
                    break
        return Ix(tuple(items), int(const_value), None, frozenset(d.var for d, _ in items))

    # --- arithmetic --------------------------------------------------------------------------------

    def opaque(self, code: str, vars_: frozenset[str]) -> Ix:
        return Ix(code=code, vars=frozenset(vars_))

    def add(self, a: Ix, b: Ix) -> Ix:
        if a == const(0) or b == const(0):
            return b if a == const(0) else a
        if a.code is None and b.code is None:
            return self._canon(a.terms + b.terms, a.const + b.const)
        return self.opaque(f"({self.render(a)} + {self.render(b)})", a.vars | b.vars)

    def add_const(self, a: Ix, k: int) -> Ix:
        return self.add(a, const(k))

    def mul(self, a: Ix, k: int) -> Ix:
        if k == 1:
            return a
        if a.code is None:
            return self._canon([(d, c * k) for d, c in a.terms], a.const * k)
        return self.opaque(f"({self.render(a)} * {k})", a.vars)

    def _affine_parts(self, a: Ix, k: int):
        """(terms, const) when ``a`` is a non-negative affine sum whose constant is a multiple of ``k``."""
        if a.code is not None or a.const < 0 or a.const % k or any(c <= 0 for _, c in a.terms):
            return None
        return a.terms, a.const

    def floordiv(self, a: Ix, k: int) -> Ix:
        if k == 1:
            return a
        if a.is_const:
            return const(a.const // k)
        parts = self._affine_parts(a, k)
        result = self._floordiv_terms(parts[0], k) if parts else None
        if result is None:
            return self.opaque(f"({self.render(a)} // {k})", a.vars)
        return self._canon(result, parts[1] // k)

    def _floordiv_terms(self, terms, k: int):
        high = [(d, c) for d, c in terms if c >= k]
        low = [(d, c) for d, c in terms if c < k]
        if any(c % k for _, c in high):
            return None
        result = [(d, c // k) for d, c in high]
        low_max = sum(c * (self._range(d) - 1) for d, c in low)
        if low_max < k:
            return result
        top, top_coef = max(low, key=lambda dc: dc[1])
        if k % top_coef or low_max - top_coef * (self._range(top) - 1) >= top_coef:
            return None
        q = k // top_coef  # floor((c*D + rest) / (c*q)) = D // q when rest < c
        if top.mod is None:
            return result + [(Digit(top.var, top.div * q, None), 1)]
        if top.mod % q == 0:
            return result + [(Digit(top.var, top.div * q, top.mod // q), 1)]
        return None

    def mod(self, a: Ix, k: int) -> Ix:
        if k == 1:
            return const(0)
        if a.is_const:
            return const(a.const % k)
        parts = self._affine_parts(a, k)
        result = self._mod_terms(parts[0], k) if parts else None
        if result is None:
            return self.opaque(f"({self.render(a)} % {k})", a.vars)
        return self._canon(result, 0)

    def _mod_terms(self, terms, k: int):
        kept = [(d, c) for d, c in terms if c % k]
        if any(c > k for _, c in kept):
            return None
        low_max = sum(c * (self._range(d) - 1) for d, c in kept)
        if low_max < k:
            return kept
        (top, top_coef) = max(kept, key=lambda dc: dc[1])
        rest = [(d, c) for d, c in kept if (d, c) != (top, top_coef)]
        if k % top_coef or low_max - top_coef * (self._range(top) - 1) >= top_coef:
            return None
        q = k // top_coef  # (c*D + rest) % (c*q) = c*(D % q) + rest when rest < c
        if self._range(top) <= q:
            return kept
        if top.mod is None or top.mod % q == 0:
            return rest + [(Digit(top.var, top.div, q), top_coef)]
        return None

    # --- shapes ----------------------------------------------------------------------------------

    def flatten(self, index: Sequence[Ix], shape: Sequence[int]) -> Ix:
        """The row-major offset of ``index`` in a contiguous tensor of ``shape``."""
        total, stride = const(0), 1
        for ix, size in reversed(list(zip(index, shape))):
            if size != 1:
                total = self.add(total, self.mul(ix, stride))
            stride *= size
        return total

    def unflatten(self, flat: Ix, shape: Sequence[int]) -> tuple[Ix, ...]:
        """The per-axis index of row-major offset ``flat`` in ``shape``."""
        out, leading = [], True
        strides = np.cumprod((1,) + tuple(shape[:0:-1]))[::-1] if shape else ()
        for size, stride in zip(shape, strides):
            if size == 1:
                out.append(const(0))
                continue
            quotient = self.floordiv(flat, int(stride))
            out.append(quotient if leading else self.mod(quotient, size))  # flat < numel: no modulo on the lead axis
            leading = False
        return tuple(out)

    def reshape(self, index: Sequence[Ix], src: Sequence[int], dst: Sequence[int]) -> list[Ix]:
        """The index in shape ``dst`` of the element at ``index`` of shape ``src`` (same row-major position)."""
        out = [const(0)] * len(dst)
        for src_axes, dst_axes in reshape_groups(src, dst):
            flat = self.flatten([index[i] for i in src_axes], [src[i] for i in src_axes])
            for axis, ix in zip(dst_axes, self.unflatten(flat, [dst[i] for i in dst_axes])):
                out[axis] = ix
        return out

    def same(self, a: Ix, b: Ix) -> bool:
        """Whether ``a`` and ``b`` provably agree on every unmasked lane."""
        return a == b and a.code is None

    # --- source ---------------------------------------------------------------------------------

    def render(self, ix: Ix) -> str:
        if ix.code is not None:
            return ix.code
        parts = [d.render() if c == 1 else f"{d.render()} * {c}" for d, c in ix.terms]
        if ix.const or not parts:
            parts.append(str(ix.const))
        return parts[0] if len(parts) == 1 else "(" + " + ".join(parts) + ")"


def table_index(space: Space, table: np.ndarray, position: Ix) -> Ix | None:
    """``table[position]`` (``position`` flat in ``table``) as index arithmetic, None when it must be loaded.

    Gather tables of layout ops have closed forms: a slice's ``start + step*j``,
    an integer nearest upsample's ``start + j // repeat``, and an uneven nearest
    resize's ``start + (j * num) // den``.
    """
    flat = np.asarray(table, dtype=np.int64).reshape(-1)
    n = flat.size
    if position.is_const:
        return const(int(flat[position.const]))
    start, j = int(flat[0]), np.arange(n, dtype=np.int64)
    step = int(flat[1] - flat[0]) if n > 1 else 0
    if np.array_equal(flat, start + step * j):
        return space.add_const(space.mul(position, step), start)
    repeat = int(np.count_nonzero(flat == start))
    if repeat > 1 and np.array_equal(flat, start + j // repeat):
        return space.add_const(space.floordiv(position, repeat), start)
    num, den = int(flat.max()) - start + 1, n
    g = math.gcd(num, den)
    num, den = num // g, den // g
    if num > 0 and n * num < 2**31 and np.array_equal(flat, start + (j * num) // den):  # int32 products
        return space.add_const(space.floordiv(space.mul(position, num), den), start)
    return None


def broadcast_index(index: Sequence[Ix], shape: Sequence[int]) -> tuple[Ix, ...]:
    """The index into an operand of ``shape`` that numpy-broadcasts to the indexed shape."""
    tail = tuple(index[len(index) - len(shape):]) if shape else ()
    return tuple(const(0) if size == 1 else ix for ix, size in zip(tail, shape))


def reshape_groups(src: Sequence[int], dst: Sequence[int]) -> list[tuple[list[int], list[int]]]:
    """Pairs (axes of ``src``, axes of ``dst``) holding the same elements, in order: a reshape's blocks."""
    src_ends = [int(v) for v in np.cumprod(src)] if len(src) else []
    dst_ends = [int(v) for v in np.cumprod(dst)] if len(dst) else []
    cuts = sorted(set(src_ends) & set(dst_ends)) or [1]
    groups: list[tuple[list[int], list[int]]] = [([], []) for _ in cuts]
    for axis, end in enumerate(src_ends):
        groups[min(bisect.bisect_left(cuts, end), len(cuts) - 1)][0].append(axis)
    for axis, end in enumerate(dst_ends):
        groups[min(bisect.bisect_left(cuts, end), len(cuts) - 1)][1].append(axis)
    return groups
