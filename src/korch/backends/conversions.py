"""What copying a value into the other layout costs a compiled unit: the loop Inductor writes for it, timed.

A plan that chooses layouts (``orchestrate/layouts.py``) pays for each value it converts, and the program
prices those conversions beside its kernels. The compiled unit (``runtime/unit.py``) makes no copy of its own:
a value is stored in its writer's layout, an Inductor loop that reads it in the other one reads it strided,
and a library call (a convolution) gets it through Inductor's copy loop. So a conversion is priced as that
loop: ``x`` copied into a buffer of the other layout, compiled by Inductor as the unit compiles (GCC's inliner
limits raised, ``inlining.py``), timed as kernels are, less the calling cost of a compiled function (the unit
calls none). A loop that fuses the strided read costs less; the copy is what it costs at most.

``torch.Tensor.copy_`` is no measure of it: on this repository's AMD EPYC it copies a [1, 384, 128, 128]
float32 value into channels-last in 6.7 ms, Inductor's loop in 1.2 ms, and EfficientViT's plan priced its 23
conversions 65 ms that way while its unit ran as fast as its kernels summed alone (431 ms against 434.5).

Timings are kept in the profile database under ``signature`` (no candidate's signature has that form), with
the Inductor backend's version: a new Inductor loop is timed again.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from korch.backends.base import BuildError, memory_format
from korch.backends.check import RandomArena
from korch.backends.inlining import raised_inline_limits
from korch.backends.timing import time_measured, timing_inputs
from korch.errors import one_line
from korch.ir.graph import Tensor, other_layout

PREFIX = "layout-conversion"
INDUCTOR = "inductor"  # the backend whose loop a conversion is timed as, and whose version its record keeps


def signature(tensor: Tensor, to: str) -> str:
    """The database signature of copying a value shaped as ``tensor`` into layout ``to``."""
    shape = "x".join(str(d) for d in tensor.shape)
    return f"{PREFIX}:{tensor.dtype}:{shape}:{to}"


def compiled_copy(example: torch.Tensor, to: str):
    """Inductor's loop copying a tensor stored as ``example`` is into a buffer of layout ``to``, called as
    ``copy(x, out)``."""
    from torch._inductor.compile_fx import compile_fx
    from torch.fx.experimental.proxy_tensor import make_fx

    out = torch.empty_like(example, memory_format=memory_format(to))
    graph_module = make_fx(lambda x, y: y.copy_(x))(example, out)
    with raised_inline_limits():
        return compile_fx(graph_module, [example, out])


def loop_s(tensor: Tensor, to: str, arena: RandomArena, device: str,
           warm_path: Callable[[], object] | None = None) -> float:
    """Seconds Inductor's loop takes to copy a value shaped as ``tensor``, stored in the other layout, into
    ``to`` (timed on ``arena``'s values, as kernels are, ``warm_path`` Inductor's empty kernel); ``BuildError``
    if Inductor cannot compile it."""
    sets, outputs = _copy_sets(tensor, to, arena, device)
    try:
        copy = compiled_copy(sets[0], to)
    except Exception as exc:  # Inductor's failures are many and varied
        raise BuildError(f"{INDUCTOR}: a layout conversion: {one_line(exc)}") from exc
    return time_measured(lambda i: copy(sets[i], outputs[i]), [[x] for x in sets], device, warm_path).median_s


def torch_copy_s(tensor: Tensor, to: str, arena: RandomArena, device: str) -> float:
    """Seconds ``torch.Tensor.copy_`` takes for the same copy (where no Inductor loop is to be had)."""
    sets, outputs = _copy_sets(tensor, to, arena, device)
    return time_measured(lambda i: outputs[i].copy_(sets[i]), [[x] for x in sets], device).median_s


def _copy_sets(tensor: Tensor, to: str, arena: RandomArena, device: str):
    arena.reset()
    sets = timing_inputs(lambda: arena.take(tensor.dtype, tensor.shape, other_layout(to)), 2 * tensor.nbytes,
                         device)
    return sets, [torch.empty_like(x, memory_format=memory_format(to)) for x in sets]

