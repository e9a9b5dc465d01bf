"""Memory planning: intermediate tensors share buffers when their lifetimes do not overlap.

The executable runs its kernels in plan order. A tensor lives from the first
kernel that writes it to the last kernel that reads it; two tensors whose
lives do not overlap can occupy the same buffer. ``plan_memory`` assigns every
intermediate tensor a buffer greedily in execution order: a tensor takes the
smallest free buffer that holds it, else the largest free buffer grown to fit,
else a new one; a buffer is free again after the last reader of its tensor.
Graph inputs belong to the caller and graph outputs get buffers of their own
(they are returned), so neither is planned.

The plan is plain data; ``peak_bytes`` (the sum of the buffers) is reported
next to ``naive_bytes`` (one buffer per intermediate tensor).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

# Buffers are rounded up to this many bytes, so any dtype's view of one is aligned.
ALIGN = 64


@dataclasses.dataclass(frozen=True)
class KernelStep:
    """What the planner needs of one kernel: the tensors it reads and writes."""

    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class MemoryPlan:
    buffer_bytes: tuple[int, ...]          # size of each buffer
    assignment: dict[str, int]             # intermediate tensor -> buffer index
    naive_bytes: int                       # one buffer per intermediate tensor

    @property
    def peak_bytes(self) -> int:
        return sum(self.buffer_bytes)


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def lifetimes(steps: Sequence[KernelStep], planned: set[str]) -> dict[str, tuple[int, int]]:
    """tensor -> (step of its first write, step of its last read, or of its write when never read)."""
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for i, step in enumerate(steps):
        for t in step.outputs:
            if t in planned:
                first.setdefault(t, i)
                last[t] = max(last.get(t, i), i)
        for t in step.inputs:
            if t in planned:
                if t not in first:
                    raise ValueError(f"step {i} reads {t!r} before any step writes it")
                last[t] = i
    return {t: (first[t], last[t]) for t in first}


def plan_memory(steps: Sequence[KernelStep], nbytes: Mapping[str, int], *, graph_inputs: Sequence[str] = (),
                graph_outputs: Sequence[str] = (), constants: Sequence[str] = ()) -> MemoryPlan:
    """Buffers for the intermediate tensors of ``steps`` (see the module docstring)."""
    excluded = set(graph_inputs) | set(graph_outputs) | set(constants)
    planned = {t for s in steps for t in s.outputs if t not in excluded}
    life = lifetimes(steps, planned)
    sizes: list[int] = []
    free: set[int] = set()
    assignment: dict[str, int] = {}
    ends: dict[int, list[int]] = {}
    for i, step in enumerate(steps):
        for t in step.outputs:
            if t not in planned or t in assignment:
                continue
            need = _aligned(nbytes[t])
            fits = [b for b in free if sizes[b] >= need]
            if fits:
                b = min(fits, key=lambda b: (sizes[b], b))
            elif free:
                b = max(free, key=lambda b: (sizes[b], -b))
                sizes[b] = need
            else:
                b = len(sizes)
                sizes.append(need)
            free.discard(b)
            assignment[t] = b
            ends.setdefault(life[t][1], []).append(b)
        free.update(ends.pop(i, ()))
    return MemoryPlan(buffer_bytes=tuple(sizes), assignment=assignment,
                      naive_bytes=sum(_aligned(nbytes[t]) for t in planned))


def check_plan(steps: Sequence[KernelStep], plan: MemoryPlan) -> None:
    """Raise if two tensors sharing a buffer are alive at once (the planner's invariant, for tests and loading)."""
    life = lifetimes(steps, set(plan.assignment))
    by_buffer: dict[int, list[tuple[int, int, str]]] = {}
    for t, b in plan.assignment.items():
        by_buffer.setdefault(b, []).append((*life[t], t))
    for b, spans in by_buffer.items():
        spans.sort()
        for (s0, e0, t0), (s1, e1, t1) in zip(spans, spans[1:]):
            if s1 <= e0:
                raise AssertionError(f"buffer {b}: {t0} (steps {s0}-{e0}) overlaps {t1} (steps {s1}-{e1})")
