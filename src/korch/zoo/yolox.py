"""YOLOX-Nano with its inference decode.

Ge, Liu, Wang, Li, Sun, "YOLOX: Exceeding YOLO Series in 2021", 2021, Nano
configuration (depth 0.33, width 0.25, depthwise-separable 3x3 convs, SiLU,
BatchNorm eps 1e-3 as the official code sets it): a Focus stem (space-to-depth
by strided slicing), CSPDarknet with an SPP bottleneck, a PAFPN neck and the
decoupled head with 80 classes. The output is the decoded prediction tensor the
official model gives in inference mode, ``(1, 3549, 85)`` for 416x416: per
anchor point ``(x, y, w, h)`` in pixels (grid offset and stride applied,
``exp`` on the sizes), then sigmoid objectness and 80 sigmoid class scores.
NMS is not part of the network. The head's prior-probability bias
initialization is omitted: the weights are random anyway.
"""

from __future__ import annotations

import torch
from torch import nn

from korch.zoo.common import ConvNormAct, interpolate_nearest

DEPTH = 0.33
WIDTH = 0.25
NUM_CLASSES = 80
STRIDES = (8, 16, 32)
BN_EPS = 1e-3


def base_conv(cin: int, cout: int, k: int = 1, stride: int = 1, groups: int = 1) -> ConvNormAct:
    return ConvNormAct(cin, cout, k, stride, groups=groups, act=nn.SiLU(), bn_eps=BN_EPS)


class DWConv(nn.Sequential):
    """Depthwise kxk then pointwise 1x1, each conv-BN-SiLU."""

    def __init__(self, cin: int, cout: int, k: int, stride: int = 1) -> None:
        super().__init__(base_conv(cin, cin, k, stride, groups=cin), base_conv(cin, cout, 1))


class Focus(nn.Module):
    """Space-to-depth by slicing the four pixel phases, then a 3x3 conv."""

    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.conv = base_conv(4 * cin, cout, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        top_left = x[..., ::2, ::2]
        top_right = x[..., ::2, 1::2]
        bottom_left = x[..., 1::2, ::2]
        bottom_right = x[..., 1::2, 1::2]
        return self.conv(torch.cat([top_left, bottom_left, top_right, bottom_right], dim=1))


class Bottleneck(nn.Module):
    """1x1 conv then depthwise-separable 3x3, plus the input when ``shortcut``."""

    def __init__(self, channels: int, shortcut: bool) -> None:
        super().__init__()
        self.body = nn.Sequential(base_conv(channels, channels, 1), DWConv(channels, channels, 3))
        self.shortcut = shortcut

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.body(x)
        return x + y if self.shortcut else y


class CSPLayer(nn.Module):
    """Two 1x1 branches of half width, bottlenecks on the first, concat, 1x1 fuse."""

    def __init__(self, cin: int, cout: int, n: int, shortcut: bool = True) -> None:
        super().__init__()
        hidden = cout // 2
        self.conv1 = base_conv(cin, hidden)
        self.conv2 = base_conv(cin, hidden)
        self.blocks = nn.Sequential(*[Bottleneck(hidden, shortcut) for _ in range(n)])
        self.conv3 = base_conv(2 * hidden, cout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv3(torch.cat([self.blocks(self.conv1(x)), self.conv2(x)], dim=1))


class SPPBottleneck(nn.Module):
    """1x1 halving conv, concat with its stride-1 max pools 5, 9, 13, 1x1 conv."""

    def __init__(self, cin: int, cout: int, sizes=(5, 9, 13)) -> None:
        super().__init__()
        hidden = cin // 2
        self.conv1 = base_conv(cin, hidden)
        self.pools = nn.ModuleList(nn.MaxPool2d(k, 1, k // 2) for k in sizes)
        self.conv2 = base_conv(hidden * (len(sizes) + 1), cout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv1(x)
        return self.conv2(torch.cat([x] + [pool(x) for pool in self.pools], dim=1))


class CSPDarknet(nn.Module):
    """Returns the dark3, dark4, dark5 features (strides 8, 16, 32)."""

    def __init__(self) -> None:
        super().__init__()
        c = int(WIDTH * 64)
        n = max(round(DEPTH * 3), 1)
        self.stem = Focus(3, c)
        self.dark2 = nn.Sequential(DWConv(c, 2 * c, 3, 2), CSPLayer(2 * c, 2 * c, n))
        self.dark3 = nn.Sequential(DWConv(2 * c, 4 * c, 3, 2), CSPLayer(4 * c, 4 * c, 3 * n))
        self.dark4 = nn.Sequential(DWConv(4 * c, 8 * c, 3, 2), CSPLayer(8 * c, 8 * c, 3 * n))
        self.dark5 = nn.Sequential(
            DWConv(8 * c, 16 * c, 3, 2),
            SPPBottleneck(16 * c, 16 * c),
            CSPLayer(16 * c, 16 * c, n, shortcut=False),
        )

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x = self.dark2(self.stem(x))
        d3 = self.dark3(x)
        d4 = self.dark4(d3)
        return d3, d4, self.dark5(d4)


class PAFPN(nn.Module):
    """Top-down then bottom-up feature pyramid over the three backbone features."""

    def __init__(self) -> None:
        super().__init__()
        c3, c4, c5 = (int(c * WIDTH) for c in (256, 512, 1024))
        n = round(3 * DEPTH)
        self.backbone = CSPDarknet()
        self.lateral_conv0 = base_conv(c5, c4)
        self.c3_p4 = CSPLayer(2 * c4, c4, n, shortcut=False)
        self.reduce_conv1 = base_conv(c4, c3)
        self.c3_p3 = CSPLayer(2 * c3, c3, n, shortcut=False)
        self.bu_conv2 = DWConv(c3, c3, 3, 2)
        self.c3_n3 = CSPLayer(2 * c3, c4, n, shortcut=False)
        self.bu_conv1 = DWConv(c4, c4, 3, 2)
        self.c3_n4 = CSPLayer(2 * c4, c5, n, shortcut=False)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x2, x1, x0 = self.backbone(x)
        fpn_out0 = self.lateral_conv0(x0)
        f_out0 = self.c3_p4(torch.cat([interpolate_nearest(fpn_out0, 2), x1], dim=1))
        fpn_out1 = self.reduce_conv1(f_out0)
        pan_out2 = self.c3_p3(torch.cat([interpolate_nearest(fpn_out1, 2), x2], dim=1))
        pan_out1 = self.c3_n3(torch.cat([self.bu_conv2(pan_out2), fpn_out1], dim=1))
        pan_out0 = self.c3_n4(torch.cat([self.bu_conv1(pan_out1), fpn_out0], dim=1))
        return pan_out2, pan_out1, pan_out0


class HeadLevel(nn.Module):
    """Decoupled head of one level: stem, then a classification and a regression branch."""

    def __init__(self, cin: int, width: int) -> None:
        super().__init__()
        self.stem = base_conv(cin, width)
        self.cls_convs = nn.Sequential(DWConv(width, width, 3), DWConv(width, width, 3))
        self.reg_convs = nn.Sequential(DWConv(width, width, 3), DWConv(width, width, 3))
        self.cls_pred = nn.Conv2d(width, NUM_CLASSES, 1)
        self.reg_pred = nn.Conv2d(width, 4, 1)
        self.obj_pred = nn.Conv2d(width, 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        cls = self.cls_pred(self.cls_convs(x))
        reg_feat = self.reg_convs(x)
        return torch.cat([self.reg_pred(reg_feat), self.obj_pred(reg_feat).sigmoid(), cls.sigmoid()], dim=1)


class YOLOXHead(nn.Module):
    """Per-level predictions flattened to ``(B, points, 85)`` and decoded to pixels."""

    def __init__(self) -> None:
        super().__init__()
        width = int(256 * WIDTH)
        self.levels = nn.ModuleList(HeadLevel(int(c * WIDTH), width) for c in (256, 512, 1024))

    def forward(self, features: tuple[torch.Tensor, ...]) -> torch.Tensor:
        outputs, grids, strides = [], [], []
        for level, x, stride in zip(self.levels, features, STRIDES):
            out = level(x)
            h, w = out.shape[-2:]
            yv, xv = torch.meshgrid(torch.arange(h, device=out.device), torch.arange(w, device=out.device), indexing="ij")
            grids.append(torch.stack([xv, yv], dim=2).reshape(1, -1, 2))
            strides.append(torch.full((1, h * w, 1), stride, device=out.device))
            outputs.append(out.flatten(start_dim=2))
        out = torch.cat(outputs, dim=2).permute(0, 2, 1)
        grid = torch.cat(grids, dim=1).to(out.dtype)
        stride = torch.cat(strides, dim=1).to(out.dtype)
        return torch.cat(
            [(out[..., 0:2] + grid) * stride, torch.exp(out[..., 2:4]) * stride, out[..., 4:]],
            dim=-1,
        )


class YOLOX(nn.Module):
    """Image -> decoded detections ``(1, points, 5 + 80)``."""

    def __init__(self) -> None:
        super().__init__()
        self.backbone = PAFPN()
        self.head = YOLOXHead()

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(image))
