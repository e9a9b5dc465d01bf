"""Checking a built kernel against the reference executor before its latency is trusted.

Every kernel runs on seeded random inputs; its outputs are compared with
``korch.ir.interpret`` on the same inputs. Output buffers are poisoned
(NaN, or an extreme integer) before the run, so an element the kernel never
wrote shows as a mismatch. Floats compare by relative norm,
``||out - ref|| / ||ref||`` (float32 arithmetic lands far below the tolerance;
a tf32 matrix product near 3e-4), with NaN and infinity required at the same
places; integers and booleans compare exactly.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import threading
from collections.abc import Callable, Sequence

import numpy as np
import torch

from korch.backends.base import BuiltKernel, stored_as
from korch.ir import dtypes
from korch.ir.graph import CHANNELS_LAST, CONTIGUOUS, Graph, Tensor
from korch.ir import interpret
from korch.ir.ops import Op

# relative-norm tolerance for floating-point outputs
FLOAT_TOLERANCE = 2e-3


@dataclasses.dataclass(frozen=True)
class CheckResult:
    ok: bool
    max_abs: float
    rel_norm: float
    message: str = ""


def random_inputs(kernel: Graph, seed: int = 0, *, positive: bool = False) -> list[torch.Tensor]:
    """One seeded random CPU tensor per kernel input: normal floats (or in [0.5, 1.5) if ``positive``),
    small non-negative integers, fair booleans (what a lookup's indices are computed from, as ``index_bounds``
    says). Input ``i``'s values depend on ``seed``, ``i``, its dtype, shape and bound alone, and are drawn once
    per process (``_DRAWN``): a search builds and checks thousands of kernels whose inputs share a few shapes,
    and drawing 8M normals takes numpy 0.36 s, copying them 4 ms."""
    bounds = index_bounds(kernel)

    def drawn(i: int, name: str) -> np.ndarray:  # the generator is made only when the values are not held yet
        t, bound = kernel.tensors[name], bounds.get(name)
        return _DRAWN.get((seed, i, t.dtype, tuple(t.shape), positive, bound),
                          lambda: _random_values(np.random.default_rng((seed, i)), t.dtype, t.shape, positive, bound))

    return [torch.from_numpy(drawn(i, name).copy()) for i, name in enumerate(kernel.inputs)]


def index_bounds(kernel: Graph) -> dict[str, int]:
    """The inputs of ``kernel`` that the indices of a GATHER are computed from, each with the bound its values
    are drawn below: an integer one the least size of the axes such gathers read (drawn all over it, as a
    model's token ids spread over its table), a boolean one 1 (drawn False). Drawn so, a lookup stays inside
    its table (BERT's two token types, looked up by ids otherwise drawn up to 8), through the steps between;
    a condition outside the kernel, the ``ids < 0`` of the wrap of negative indices that fission writes, agrees
    with the non-negative ids drawn for it (drawn fair, it added the table's size to half of them). A kernel
    is not dropped for inputs its model never gives it."""
    producers, inputs = kernel.producers(), set(kernel.inputs)
    bounds: dict[str, int] = {}
    for node in kernel.nodes:
        if node.op is not Op.GATHER:
            continue
        size = max(1, kernel.tensors[node.inputs[0]].shape[node.attrs["axis"]])
        pending, seen = [node.inputs[1]], set()
        while pending:
            name = pending.pop()
            if name in seen:
                continue
            seen.add(name)
            dtype = kernel.tensors[name].dtype
            if name in inputs and not dtypes.is_float(dtype):
                bound = 1 if dtype == "bool" else size
                bounds[name] = min(bound, bounds.get(name, bound))
            if name in producers:
                pending.extend(i for i in producers[name].inputs if i)
    return bounds


class _DrawnValues:
    """Arrays by key, the least recently used dropped past ``limit_bytes`` (a search's shapes recur)."""

    def __init__(self, limit_bytes: int):
        self.limit, self.held = limit_bytes, 0
        self._arrays: collections.OrderedDict = collections.OrderedDict()
        self._lock = threading.Lock()

    def get(self, key, draw: Callable[[], np.ndarray]) -> np.ndarray:
        with self._lock:
            if key in self._arrays:
                self._arrays.move_to_end(key)
                return self._arrays[key]
        array = draw()
        array.setflags(write=False)  # callers copy: a kernel writing its inputs must not change the next one's
        with self._lock:
            if key not in self._arrays and array.nbytes <= self.limit:
                self._arrays[key] = array
                self.held += array.nbytes
                while self.held > self.limit:
                    self.held -= self._arrays.popitem(last=False)[1].nbytes
        return array


_DRAWN = _DrawnValues(256 << 20)


def _random_values(rng: np.random.Generator, dtype: str, shape, positive: bool = False,
                   bound: int | None = None) -> np.ndarray:
    """Values as ``random_inputs`` draws them; integers and booleans below ``bound`` where one is given."""
    if dtypes.is_float(dtype):
        v = rng.uniform(0.5, 1.5, shape) if positive else rng.standard_normal(shape)
    elif dtype == "bool":
        v = rng.random(shape) < 0.5 if bound is None else np.zeros(shape, dtype=bool)
    else:
        v = rng.integers(0, 8 if bound is None else bound, shape)
    return np.asarray(v).astype(dtype)


class RandomArena:
    """Timing inputs for kernel after kernel: random values (as ``random_inputs`` draws them) made once per
    process and handed out as views. Drawing fresh sets for every kernel cost 0.1 s a kernel on a CPU (a
    cache's worth of normals for the rotation sets, ``timing.rotation_sets``), a third of timing it.

    Views handed out between two ``reset`` calls never overlap, so each rotation set is memory of its own; each
    starts on a 64-byte boundary, as a fresh allocation does."""

    ALIGN_BYTES = 64

    def __init__(self, device: str = "cpu", seed: int = 0):
        self.device, self._rng = device, np.random.default_rng(seed)
        self._pools: dict[str, torch.Tensor] = {}
        self._used: dict[str, int] = {}

    def reset(self) -> None:
        self._used.clear()

    def inputs(self, kernel: Graph) -> list[torch.Tensor]:
        """One view per kernel input, in the input's layout, none overlapping another since the last ``reset``;
        what a lookup's indices are computed from within ``index_bounds``."""
        bounds = index_bounds(kernel)
        return [self.input(kernel.tensors[name], bounds.get(name)) for name in kernel.inputs]

    def input(self, tensor: Tensor, bound: int | None = None) -> torch.Tensor:
        """A view for ``tensor`` (``take``), its integers or booleans drawn again below ``bound`` where one is
        given (``index_bounds``)."""
        view = self.take(tensor.dtype, tensor.shape, tensor.layout)
        if bound is not None:
            view.copy_(torch.from_numpy(_random_values(self._rng, tensor.dtype, tuple(view.shape), bound=bound)))
        return view

    def take(self, dtype: str, shape, layout: str = CONTIGUOUS) -> torch.Tensor:
        """A view of ``shape`` stored in ``layout``, overlapping none handed out since the last ``reset``."""
        count = int(np.prod(shape, dtype=np.int64))
        step = max(1, self.ALIGN_BYTES // dtypes.itemsize(dtype))
        start = -(-self._used.get(dtype, 0) // step) * step
        pool = self._pools.get(dtype)
        if pool is None or start + count > pool.numel():
            size = max(start + count, 2 * (pool.numel() if pool is not None else 0), 1 << 16)
            pool = torch.from_numpy(_random_values(self._rng, dtype, (size,))).to(self.device, copy=True)
            self._pools[dtype] = pool  # views handed out before keep the old pool alive
        self._used[dtype] = start + count
        if layout == CHANNELS_LAST:  # N, H, W, C in memory, seen as N, C, H, W
            n, c, h, w = shape
            return pool[start:start + count].view(n, h, w, c).permute(0, 3, 1, 2)
        return pool[start:start + count].view(tuple(shape))


def _poisoned(kernel: Graph, device: str) -> list[torch.Tensor]:
    buffers = []
    for name in kernel.outputs:
        t = kernel.tensors[name]
        dtype = dtypes.torch_dtype(t.dtype)
        fill = float("nan") if dtypes.is_float(t.dtype) else (True if t.dtype == "bool" else torch.iinfo(dtype).min)
        buffers.append(stored_as(torch.full(t.shape, fill, dtype=dtype, device=device), t.layout))
    return buffers


def compare(actual: torch.Tensor, expected: np.ndarray, name: str, tolerance: float = FLOAT_TOLERANCE) -> CheckResult:
    """Whether ``actual`` matches the reference ``expected`` (see the module docstring), floats within
    ``tolerance`` in relative norm."""
    got = actual.detach().cpu().numpy()
    if got.shape != expected.shape:
        return CheckResult(False, float("inf"), float("inf"), f"{name}: shape {got.shape}, expected {expected.shape}")
    if expected.dtype.kind not in "fc":
        bad = int(np.count_nonzero(got != expected))
        diff = float(np.abs(got.astype(np.float64) - expected.astype(np.float64)).max(initial=0.0))
        return CheckResult(bad == 0, diff, float(bad > 0), f"{name}: {bad} elements differ" if bad else "")
    special = ~np.isfinite(expected)
    if special.any():  # NaN and infinity where expected, the rest compared as below
        g, e = got.astype(np.float64), expected.astype(np.float64)
        if not np.array_equal(g[special], e[special], equal_nan=True) or not np.isfinite(g[~special]).all():
            wrong = int(np.count_nonzero(~np.isclose(g, e, equal_nan=True) & (special | ~np.isfinite(g))))
            return CheckResult(False, float("inf"), float("inf"), f"{name}: {wrong} NaN/inf elements differ")
        got, expected = g[~special], e[~special]
    elif not np.isfinite(got).all():
        wrong = int(np.count_nonzero(~np.isfinite(got)))
        return CheckResult(False, float("inf"), float("inf"), f"{name}: {wrong} NaN/inf elements differ")
    # without masked copies where every value is finite, float32 outputs without float64 copies (a search checks
    # kernels whose outputs hold millions of values; the sums of squares are float64 either way)
    wide = np.float32 if got.dtype == expected.dtype == np.float32 else np.float64
    diff, max_abs = _difference(got, expected, wide)
    if math.isinf(max_abs) and wide is np.float32:  # finite values whose difference is past float32's range
        diff, max_abs = _difference(got, expected, np.float64)
    scale = _norm(expected)
    rel = _norm(diff) / scale if scale > 0 else max_abs
    ok = rel <= tolerance
    return CheckResult(ok, max_abs, rel, "" if ok else f"{name}: relative error {rel:.3g} (max abs {max_abs:.3g})")


def _difference(got: np.ndarray, expected: np.ndarray, dtype) -> tuple[np.ndarray, float]:
    """``got - expected`` in ``dtype`` and in the reference's order (a channels-last output is copied once), and
    its largest magnitude."""
    diff = np.array(got, dtype=dtype, order="C")
    with np.errstate(over="ignore"):
        diff -= expected
    return diff, max(float(diff.max(initial=0.0)), -float(diff.min(initial=0.0)))


def _norm(values: np.ndarray) -> float:
    """The Euclidean norm, its squares summed in float64 whatever the values' type (no float64 copy)."""
    flat = values.ravel()
    return float(np.sqrt(np.einsum("i,i->", flat, flat, dtype=np.float64)))


def check(built: BuiltKernel, kernel: Graph, *, device: str = "cpu", seed: int = 0) -> CheckResult:
    """Run ``built`` and the reference on the same random inputs; the worst output's result.

    When most of the reference's float output is NaN (a log or square root of
    negative inputs), the inputs are redrawn positive so that the check still
    tests something.
    """
    return _check_against(built, kernel, *_reference(kernel, seed), device)


def checked_variants(built: BuiltKernel, kernel: Graph, *, device: str = "cpu", seed: int = 0) -> tuple[int, ...]:
    """The indices of the launch variants of ``built`` (a Triton kernel's ``generated.variants``) whose outputs
    check, each into freshly poisoned buffers; a variant that raises does not check. ``built`` keeps the
    variant it had."""
    variants = getattr(getattr(built, "generated", None), "variants", ())
    inputs, expected = _reference(kernel, seed)
    chosen, ok = built.variant, []
    try:
        for index, variant in enumerate(variants):
            built.variant = variant
            try:
                if _check_against(built, kernel, inputs, expected, device).ok:
                    ok.append(index)
            except Exception:
                continue
    finally:
        built.variant = chosen
    return tuple(ok)


def _reference(kernel: Graph, seed: int) -> tuple[list[torch.Tensor], dict[str, np.ndarray]]:
    inputs = random_inputs(kernel, seed)
    expected = interpret.run(kernel, dict(zip(kernel.inputs, inputs)))
    if _mostly_nan(expected.values()):
        inputs = random_inputs(kernel, seed, positive=True)
        expected = interpret.run(kernel, dict(zip(kernel.inputs, inputs)))
    return inputs, expected


def _check_against(built: BuiltKernel, kernel: Graph, inputs: Sequence[torch.Tensor],
                   expected: dict[str, np.ndarray], device: str) -> CheckResult:
    buffers = _poisoned(kernel, device)
    actual = built(*[stored_as(x.to(device), kernel.tensors[n].layout) for x, n in zip(inputs, kernel.inputs)],
                   out=buffers)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    results = [compare(a, expected[name], name) for a, name in zip(actual, kernel.outputs)]
    failed = [r for r in results if not r.ok]
    worst = max(results, key=lambda r: r.rel_norm, default=CheckResult(True, 0.0, 0.0))
    return failed[0] if failed else worst


def _mostly_nan(arrays: Sequence[np.ndarray]) -> bool:
    floats = [a for a in arrays if a.dtype.kind == "f" and a.size]
    return bool(floats) and sum(int(np.isnan(a).sum()) for a in floats) * 2 > sum(a.size for a in floats)
