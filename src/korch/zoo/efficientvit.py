"""EfficientViT-B1 for semantic segmentation.

Cai, Li, Gan, Han, "EfficientViT: Multi-Scale Linear Attention for
High-Resolution Dense Prediction", ICCV 2023. Backbone B1: widths
[16, 32, 64, 128, 256], depths [1, 2, 3, 3, 4], head dim 16; local blocks are
DSConv (stem) and MBConv (expand 4) with Hardswish and BatchNorm, the last two
stages stack EfficientViT blocks (multi-scale ReLU linear attention + MBConv).

Head: the paper's segmentation head with its Cityscapes configuration (stage
2/3/4 features projected to 64 channels, upsampled to stride 8 and summed,
three MBConv blocks, a 4x expanding 1x1 conv, a 19-class classifier), because
the Korch input, 2048x2048, is a high-resolution dense-prediction input: the
paper benchmarks these at Cityscapes resolution and a classifier head would
pool the 2048x2048 features away. Output: logits at stride 8,
1x19x256x256. The upsampling of the head is bicubic, as in the paper's code.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from korch.zoo.common import ConvNormAct

WIDTHS = (16, 32, 64, 128, 256)
DEPTHS = (1, 2, 3, 3, 4)
HEAD_DIM = 16
NUM_CLASSES = 19


class DSConv(nn.Module):
    """Depthwise 3x3 (norm, act) then pointwise 1x1 (norm)."""

    def __init__(self, cin: int, cout: int, stride: int = 1) -> None:
        super().__init__()
        self.depth = ConvNormAct(cin, cin, 3, stride, groups=cin, act=nn.Hardswish())
        self.point = ConvNormAct(cin, cout, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.point(self.depth(x))


class MBConv(nn.Module):
    """Inverted bottleneck: 1x1 expand (act), 3x3 depthwise (act), 1x1 project.

    ``fewer_norm``: only the projection has a norm, the two others a bias (used
    by the downsampling block of the attention stages and in their blocks).
    """

    def __init__(self, cin: int, cout: int, stride: int = 1, expand: int = 4, *, fewer_norm: bool = False) -> None:
        super().__init__()
        mid = round(cin * expand)
        norm = not fewer_norm
        self.inverted = ConvNormAct(cin, mid, 1, norm=norm, act=nn.Hardswish())
        self.depth = ConvNormAct(mid, mid, 3, stride, groups=mid, norm=norm, act=nn.Hardswish())
        self.point = ConvNormAct(mid, cout, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.point(self.depth(self.inverted(x)))


class Residual(nn.Module):
    """``x + block(x)``."""

    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.block = block

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.block(x)


class LiteMLA(nn.Module):
    """Multi-scale ReLU linear attention.

    q, k, v come from one 1x1 conv; a second set of multi-scale tokens is made
    by aggregating them with a 5x5 depthwise conv and a grouped 1x1 conv (one
    group per head and q/k/v). Attention is linear: ``relu(q) (relu(k)^T v)``,
    normalized by ``relu(q) (relu(k)^T 1)``; v is padded with a column of ones
    so one pair of matmuls gives numerator and denominator together.
    """

    def __init__(self, channels: int, dim: int = HEAD_DIM, scale: int = 5, eps: float = 1e-15) -> None:
        super().__init__()
        heads = channels // dim
        total = heads * dim
        self.dim = dim
        # A 1-element tensor, not a scalar: the exporter's optimizer rewrites
        # ``x + c`` to ``x`` for a scalar |c| < 1e-8 (an "add of zero"), which
        # would turn the 0/0 of an all-zero relu(q) row into NaN.
        self.register_buffer("eps", torch.tensor([eps]), persistent=False)
        self.qkv = ConvNormAct(channels, 3 * total, 1, norm=False, bias=False)
        self.aggreg = nn.Sequential(
            nn.Conv2d(3 * total, 3 * total, scale, padding=scale // 2, groups=3 * total, bias=False),
            nn.Conv2d(3 * total, 3 * total, 1, groups=3 * heads, bias=False),
        )
        self.proj = ConvNormAct(2 * total, channels, 1)

    def _linear_attention(self, qkv: torch.Tensor) -> torch.Tensor:
        b, _, h, w = qkv.shape
        qkv = qkv.reshape(b, -1, 3 * self.dim, h * w).transpose(-1, -2)
        q = F.relu(qkv[..., : self.dim])
        k = F.relu(qkv[..., self.dim : 2 * self.dim])
        v = F.pad(qkv[..., 2 * self.dim :], (0, 1), mode="constant", value=1.0)
        kv = torch.matmul(k.transpose(-1, -2), v)
        out = torch.matmul(q, kv)
        out = out[..., :-1] / (out[..., -1:] + self.eps)
        return out.transpose(-1, -2).reshape(b, -1, h, w)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        qkv = self.qkv(x)
        qkv = torch.cat([qkv, self.aggreg(qkv)], dim=1)
        return self.proj(self._linear_attention(qkv))


class EfficientViTBlock(nn.Sequential):
    """Context (LiteMLA) then local (MBConv) module, each residual."""

    def __init__(self, channels: int) -> None:
        super().__init__(
            Residual(LiteMLA(channels)),
            Residual(MBConv(channels, channels, fewer_norm=True)),
        )


class Backbone(nn.Module):
    """EfficientViT-B1 backbone; returns the stage 4, 3 and 2 features (strides 32, 16, 8)."""

    def __init__(self) -> None:
        super().__init__()
        w0 = WIDTHS[0]
        self.stem = nn.Sequential(
            ConvNormAct(3, w0, 3, 2, act=nn.Hardswish()),
            *[Residual(DSConv(w0, w0)) for _ in range(DEPTHS[0])],
        )
        stages: list[nn.Module] = []
        cin = w0
        for w, d in zip(WIDTHS[1:3], DEPTHS[1:3]):
            blocks = [MBConv(cin, w, stride=2)]
            blocks += [Residual(MBConv(w, w)) for _ in range(d - 1)]
            stages.append(nn.Sequential(*blocks))
            cin = w
        for w, d in zip(WIDTHS[3:], DEPTHS[3:]):
            blocks = [MBConv(cin, w, stride=2, fewer_norm=True)]
            blocks += [EfficientViTBlock(w) for _ in range(d)]
            stages.append(nn.Sequential(*blocks))
            cin = w
        self.stages = nn.ModuleList(stages)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        x = self.stem(x)
        features = []
        for stage in self.stages:
            x = stage(x)
            features.append(x)
        return features[:0:-1]  # deepest first, the head's order


class SegHead(nn.Module):
    """Project each feature to ``width`` channels, upsample to stride 8, sum, refine, classify."""

    def __init__(self, in_channels=(256, 128, 64), factors=(4, 2, 1), width: int = 64, depth: int = 3) -> None:
        super().__init__()
        self.factors = factors
        self.inputs = nn.ModuleList(ConvNormAct(c, width, 1) for c in in_channels)
        self.middle = nn.Sequential(*[Residual(MBConv(width, width)) for _ in range(depth)])
        self.output = nn.Sequential(
            ConvNormAct(width, width * 4, 1, act=nn.Hardswish()),
            ConvNormAct(width * 4, NUM_CLASSES, 1, norm=False),
        )

    def forward(self, features: list[torch.Tensor]) -> torch.Tensor:
        x = None
        for feature, proj, factor in zip(features, self.inputs, self.factors):
            y = proj(feature)
            if factor != 1:
                y = F.interpolate(y, scale_factor=factor, mode="bicubic", align_corners=False)
            x = y if x is None else x + y
        return self.output(self.middle(x))


class EfficientViTSeg(nn.Module):
    """Image -> per-pixel class logits at stride 8."""

    # BatchNorm shifts for ``common.randomize``: centred, not the positive
    # default. Positive shifts leave a few pixels whose relu(q) is nearly zero,
    # where the attention's normalizer is 1e-5 of its median and the division
    # turns fp32 rounding into 1e-3 output errors.
    bn_shift = (-0.2, 0.2)

    def __init__(self) -> None:
        super().__init__()
        self.backbone = Backbone()
        self.head = SegHead()

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(image))
