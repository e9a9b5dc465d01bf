"""SegFormer-B0 for ADE20K (150 classes).

Xie, Wang, Yu, Anandkumar, Alvarez, Luo, "SegFormer: Simple and Efficient
Design for Semantic Segmentation with Transformers", NeurIPS 2021. MiT-B0
encoder: four stages of overlapping patch embedding (strided conv + LayerNorm),
transformer blocks with efficient self-attention (keys and values from a
spatially reduced sequence: strided conv + LayerNorm, reduction ratios
8, 4, 2, 1) and Mix-FFN (linear, 3x3 depthwise conv, GELU, linear), and a
final LayerNorm per stage; embedding dims 32, 64, 160, 256, two blocks per
stage, 1, 2, 5, 8 heads. All-MLP decoder: per-stage linear to 256 channels,
bilinear upsampling (align_corners=False) to 1/4 resolution, concat, 1x1
conv + BN + ReLU fuse, 1x1 classifier. Output at 1/4 resolution, as the
original model returns it. LayerNorm eps values are the original code's
(1e-6 in blocks and stage norms, 1e-5 in patch embeddings and reductions).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

EMBED_DIMS = (32, 64, 160, 256)
DEPTHS = (2, 2, 2, 2)
HEADS = (1, 2, 5, 8)
SR_RATIOS = (8, 4, 2, 1)
MLP_RATIO = 4
DECODER_DIM = 256
NUM_CLASSES = 150


def _to_image(x: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """``(B, N, C)`` tokens -> ``(B, C, H, W)`` map."""
    return x.transpose(1, 2).reshape(x.shape[0], x.shape[2], h, w)


def _to_tokens(x: torch.Tensor) -> torch.Tensor:
    """``(B, C, H, W)`` map -> ``(B, N, C)`` tokens."""
    return x.flatten(2).transpose(1, 2)


class OverlapPatchEmbed(nn.Module):
    """Strided conv with overlapping windows, then LayerNorm over channels."""

    def __init__(self, cin: int, dim: int, patch: int, stride: int) -> None:
        super().__init__()
        self.proj = nn.Conv2d(cin, dim, patch, stride, padding=patch // 2)
        self.norm = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, int, int]:
        x = self.proj(x)
        h, w = x.shape[-2:]
        return self.norm(_to_tokens(x)), h, w


class EfficientSelfAttention(nn.Module):
    """Self-attention whose keys and values come from the sequence reduced ``sr_ratio``-fold per side."""

    def __init__(self, dim: int, heads: int, sr_ratio: int) -> None:
        super().__init__()
        self.heads = heads
        self.head_dim = dim // heads
        self.q = nn.Linear(dim, dim)
        self.kv = nn.Linear(dim, 2 * dim)
        self.proj = nn.Linear(dim, dim)
        self.sr_ratio = sr_ratio
        if sr_ratio > 1:
            self.sr = nn.Conv2d(dim, dim, sr_ratio, sr_ratio)
            self.norm = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor, h: int, w: int) -> torch.Tensor:
        b, n, c = x.shape
        q = self.q(x).reshape(b, n, self.heads, self.head_dim).transpose(1, 2)
        if self.sr_ratio > 1:
            x = self.norm(_to_tokens(self.sr(_to_image(x, h, w))))
        kv = self.kv(x).reshape(b, -1, 2, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        k, v = kv[0], kv[1]
        attn = torch.softmax(torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_dim), dim=-1)
        out = torch.matmul(attn, v).transpose(1, 2).reshape(b, n, c)
        return self.proj(out)


class MixFFN(nn.Module):
    """Linear expand, 3x3 depthwise conv over the token map, GELU, linear project."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.dwconv = nn.Conv2d(hidden, hidden, 3, 1, 1, groups=hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor, h: int, w: int) -> torch.Tensor:
        x = _to_tokens(self.dwconv(_to_image(self.fc1(x), h, w)))
        return self.fc2(F.gelu(x))


class Block(nn.Module):
    """Pre-norm transformer block: attention and Mix-FFN, each residual."""

    def __init__(self, dim: int, heads: int, sr_ratio: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = EfficientSelfAttention(dim, heads, sr_ratio)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = MixFFN(dim, dim * MLP_RATIO)

    def forward(self, x: torch.Tensor, h: int, w: int) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), h, w)
        return x + self.mlp(self.norm2(x), h, w)


class Stage(nn.Module):
    """Patch embedding, blocks, LayerNorm; returns a ``(B, C, H, W)`` map."""

    def __init__(self, cin: int, dim: int, patch: int, stride: int, depth: int, heads: int, sr_ratio: int) -> None:
        super().__init__()
        self.embed = OverlapPatchEmbed(cin, dim, patch, stride)
        self.blocks = nn.ModuleList(Block(dim, heads, sr_ratio) for _ in range(depth))
        self.norm = nn.LayerNorm(dim, eps=1e-6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x, h, w = self.embed(x)
        for block in self.blocks:
            x = block(x, h, w)
        return _to_image(self.norm(x), h, w)


class MixTransformer(nn.Module):
    """MiT-B0 encoder; returns the four stage maps (strides 4, 8, 16, 32)."""

    def __init__(self) -> None:
        super().__init__()
        cins = (3,) + EMBED_DIMS[:-1]
        self.stages = nn.ModuleList(
            Stage(cin, dim, 7 if i == 0 else 3, 4 if i == 0 else 2, depth, heads, sr)
            for i, (cin, dim, depth, heads, sr) in enumerate(zip(cins, EMBED_DIMS, DEPTHS, HEADS, SR_RATIOS))
        )

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        features = []
        for stage in self.stages:
            x = stage(x)
            features.append(x)
        return features


class AllMLPDecoder(nn.Module):
    """Unify channels with linears, upsample to 1/4, concat (deepest first), fuse, classify."""

    def __init__(self) -> None:
        super().__init__()
        self.linears = nn.ModuleList(nn.Linear(c, DECODER_DIM) for c in EMBED_DIMS)
        self.fuse = nn.Sequential(
            nn.Conv2d(4 * DECODER_DIM, DECODER_DIM, 1, bias=False),
            nn.BatchNorm2d(DECODER_DIM),
            nn.ReLU(),
        )
        self.classifier = nn.Conv2d(DECODER_DIM, NUM_CLASSES, 1)

    def forward(self, features: list[torch.Tensor]) -> torch.Tensor:
        size = features[0].shape[-2:]
        maps = []
        for feature, linear in zip(features, self.linears):
            h, w = feature.shape[-2:]
            x = _to_image(linear(_to_tokens(feature)), h, w)
            if (h, w) != tuple(size):
                x = F.interpolate(x, size=size, mode="bilinear", align_corners=False)
            maps.append(x)
        return self.classifier(self.fuse(torch.cat(maps[::-1], dim=1)))


class SegFormer(nn.Module):
    """Image -> class logits at 1/4 resolution."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = MixTransformer()
        self.decoder = AllMLPDecoder()

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.encoder(image))
