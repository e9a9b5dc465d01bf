"""The float32 arithmetic policy of a run: how every float32 matrix product is computed, and the tolerance that follows.

A GPU multiplies float32 matrices either exactly (``fp32``: IEEE products,
float32 accumulation; torch's default for matmuls) or on tensor cores with
each operand rounded to TF32 (``tf32``: 10 mantissa bits, float32
accumulation, about 7x the FLOP/s on an H100). One policy holds for a whole
run and reaches everything that multiplies:

* korch's Triton GEMMs and convolutions: ``tl.dot``'s ``input_precision``;
* cuBLAS and cuDNN, and Inductor's GEMM templates, which follow torch's switches
  (``torch.backends.cuda.matmul.allow_tf32``, ``torch.backends.cudnn.allow_tf32``;
  note cuDNN's defaults to on: ``applied`` sets both either way);
* every peer korch is timed against (``korch bench``), so that no ratio sets
  exact arithmetic against TF32.

The policy is ``config.precision``; the manifest records it and an executable
applies it when it runs. A policy carries the tolerance of the whole-model
check against ONNX Runtime (relative norm of the difference): the spread that
policy's arithmetic itself produces on the zoo, measured by
``benchmarks/precision_spread.py`` (``docs/precision.md``), with a margin. Per
kernel checks keep ``backends.check.FLOAT_TOLERANCE``: one TF32 product is
within it; only depth (a hundred layers of rounded operands) needs more.

A CPU multiplies float32 exactly under either policy. ``emulated`` rounds the
operands of torch's matrix products and convolutions to TF32 in this process,
so a CPU can measure what a GPU's TF32 arithmetic does to a model.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from korch import config
from korch.errors import KorchError


@dataclasses.dataclass(frozen=True)
class Policy:
    name: str
    dot_input_precision: str   # tl.dot on float32 operands: "ieee" or "tf32"
    tf32: bool                 # torch's cuBLAS and cuDNN TF32 switches
    model_tolerance: float     # relative norm, whole model against ONNX Runtime
    description: str


POLICIES = {
    "fp32": Policy("fp32", "ieee", False, 2e-3, "exact float32 products (torch's default for matmuls)"),
    "tf32": Policy("tf32", "tf32", True, 5e-2, "float32 products on tensor cores, operands rounded to TF32"),
}
DEFAULT = "fp32"


def get(name: str | Policy) -> Policy:
    if isinstance(name, Policy):
        return name
    try:
        return POLICIES[name]
    except KeyError:
        raise KorchError(f"unknown precision {name!r}: choose {' or '.join(POLICIES)}") from None


def current() -> Policy:
    """The run's policy (``config.precision``)."""
    return get(config.precision)


@contextlib.contextmanager
def applied(policy: str | Policy | None = None) -> Iterator[Policy]:
    """Set torch's TF32 switches to ``policy`` (default: the current one) for the block; restores them after."""
    policy = get(policy) if policy is not None else current()
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = policy.tf32
    try:
        yield policy
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


@contextlib.contextmanager
def use(policy: str | Policy) -> Iterator[Policy]:
    """``policy`` is the run's for the block: ``config.precision`` and torch's switches."""
    policy = get(policy)
    with config.patch(precision=policy.name), applied(policy):
        yield policy


def round_to_tf32(x: torch.Tensor) -> torch.Tensor:
    """``x`` (float32) with its mantissa rounded to TF32's 10 bits, to nearest, ties away from zero (as the
    tensor cores' conversion does); other dtypes unchanged."""
    if x.dtype != torch.float32:
        return x
    bits = x.contiguous().view(torch.int32)
    finite = torch.isfinite(x)
    rounded = ((bits + 0x1000) & ~0x1FFF).view(torch.float32)  # 13 dropped bits; the carry may reach the exponent
    return torch.where(finite, rounded, x).view(x.shape)


# torch functions whose float32 tensor operands a GPU's TF32 mode rounds (products accumulate in float32)
_PRODUCTS = frozenset({
    torch.matmul, torch.mm, torch.bmm, torch.addmm, torch.baddbmm, torch.einsum, torch.Tensor.matmul,
    torch.Tensor.__matmul__, torch.Tensor.mm, torch.Tensor.bmm, F.linear, F.conv1d, F.conv2d, F.conv3d,
    F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d,
})


class _TF32Operands(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _PRODUCTS:
            args = tuple(round_to_tf32(a) if isinstance(a, torch.Tensor) else a for a in args)
            kwargs = {k: round_to_tf32(v) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
        return func(*args, **kwargs)


@contextlib.contextmanager
def emulated(policy: str | Policy) -> Iterator[Policy]:
    """Within the block, torch on the CPU computes matrix products and convolutions as ``policy`` does on a GPU
    (for ``tf32``: operands rounded to TF32, float32 accumulation)."""
    policy = get(policy)
    with _TF32Operands() if policy.tf32 else contextlib.nullcontext():
        yield policy
