"""Layers and weight set-up shared by the zoo models.

Owns the conv + norm + activation building block, the multi-head self-attention
written with plain MatMul + Softmax (so the exported ONNX has standard ops, not
a fused attention), and ``randomize``: the step that turns a freshly built model
into one with seeded, non-trivial, well-scaled weights.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["ConvNormAct", "SelfAttention", "interpolate_nearest", "randomize", "same_padding"]


def same_padding(kernel_size: int) -> int:
    """Padding that keeps the spatial size of a stride-1 conv with an odd kernel."""
    return kernel_size // 2


class ConvNormAct(nn.Sequential):
    """Conv2d, then an optional BatchNorm2d, then an optional activation.

    The conv has a bias only when asked, or when there is no norm after it.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int = 3,
        stride: int = 1,
        *,
        groups: int = 1,
        bias: bool | None = None,
        norm: bool = True,
        act: nn.Module | None = None,
        bn_eps: float = 1e-5,
    ) -> None:
        layers: list[nn.Module] = [
            nn.Conv2d(
                in_channels,
                out_channels,
                kernel_size,
                stride,
                padding=same_padding(kernel_size),
                groups=groups,
                bias=(not norm) if bias is None else bias,
            )
        ]
        if norm:
            layers.append(nn.BatchNorm2d(out_channels, eps=bn_eps))
        if act is not None:
            layers.append(act)
        super().__init__(*layers)


class SelfAttention(nn.Module):
    """Multi-head scaled dot-product self-attention over ``(B, N, C)`` tokens.

    Separate query/key/value projections as in the BERT and ViT papers. An
    optional additive mask ``(B, 1, 1 | N, N)`` is added to the scores.
    """

    def __init__(self, dim: int, num_heads: int, *, qkv_bias: bool = True) -> None:
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"dim {dim} is not a multiple of num_heads {num_heads}")
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.query = nn.Linear(dim, dim, bias=qkv_bias)
        self.key = nn.Linear(dim, dim, bias=qkv_bias)
        self.value = nn.Linear(dim, dim, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape
        return x.reshape(b, n, self.num_heads, self.head_dim).transpose(1, 2)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        b, n, c = x.shape
        q = self._heads(self.query(x))
        k = self._heads(self.key(x))
        v = self._heads(self.value(x))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_dim)
        if mask is not None:
            scores = scores + mask
        probs = torch.softmax(scores, dim=-1)
        out = torch.matmul(probs, v).transpose(1, 2).reshape(b, n, c)
        return self.proj(out)


# Ranges of the uniform draws of norm layers' affine parameters.
NORM_SCALE = (0.5, 1.5)
NORM_SHIFT = (-0.2, 0.2)
# BatchNorm shifts are positive by default: with zero-mean, unit-variance
# pre-activations each ReLU-like layer of a random net amplifies a relative
# perturbation by about 1.2x, and over YOLOv4's ~100 conv layers fp32 rounding
# alone reaches 3e-4 of the output scale (against float64), too much to compare
# two runtimes at rtol 1e-3. Shifts of U(0, 1) keep about a third of the units
# below zero and bring that error to ~3e-5. A model overrides the range with a
# ``bn_shift`` attribute.
BN_SHIFT = (0.0, 1.0)

_BATCH_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d)
_AFFINE_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.InstanceNorm2d, nn.LayerNorm, nn.GroupNorm)


@torch.no_grad()
def randomize(model: nn.Module, calibration_input: tuple[torch.Tensor, ...]) -> nn.Module:
    """Give ``model``'s norm layers seeded, non-trivial parameters; return it in eval mode.

    Convolutions and linears keep torch's default (seeded) initialization.
    Every affine norm gets a scale drawn from ``NORM_SCALE`` and a shift from
    ``NORM_SHIFT`` (``BN_SHIFT`` for BatchNorms). BatchNorm running statistics
    are then *calibrated*: one forward pass in training mode on
    ``calibration_input`` sets them to that batch's statistics. Random
    statistics would not do: with no normalization left in eval mode, deep
    stacks of default-initialized convs (YOLOv4 has over a hundred) scale the
    activations by a roughly constant factor per layer, to zero or to overflow.
    Calibrated statistics are data dependent, far from the identity.
    """
    bn_shift = getattr(model, "bn_shift", BN_SHIFT)
    for module in model.modules():
        if isinstance(module, _AFFINE_NORMS) and module.weight is not None:
            module.weight.uniform_(*NORM_SCALE)
            module.bias.uniform_(*(bn_shift if isinstance(module, _BATCH_NORMS) else NORM_SHIFT))
    batch_norms = [m for m in model.modules() if isinstance(m, _BATCH_NORMS)]
    if batch_norms:
        model.eval()
        saved = [m.momentum for m in batch_norms]
        for m in batch_norms:
            m.reset_running_stats()
            m.momentum = None  # cumulative average: after one batch, exactly its statistics
            m.train()
        model(*calibration_input)
        for m, momentum in zip(batch_norms, saved):
            m.momentum = momentum
    return model.eval()


def interpolate_nearest(x: torch.Tensor, factor: int) -> torch.Tensor:
    """Nearest-neighbour upsampling by an integer factor (an ONNX Resize)."""
    return F.interpolate(x, scale_factor=factor, mode="nearest")
