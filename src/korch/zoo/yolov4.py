"""YOLOv4 with 1000 classes.

Bochkovskiy, Wang, Liao, "YOLOv4: Optimal Speed and Accuracy of Object
Detection", 2020, layer for layer as its darknet ``yolov4.cfg``: a CSPDarknet53
backbone with Mish, an SPP block (max pools 5, 9, 13), a PANet neck with
LeakyReLU(0.1), and three YOLO heads whose 1x1 convs output
``3 * (5 + num_classes)`` channels at strides 8, 16, 32. ``num_classes`` is
1000, the Korch paper's setting. The outputs are the raw head tensors; box
decoding and NMS are not part of the network.
"""

from __future__ import annotations

import torch
from torch import nn

from korch.zoo.common import ConvNormAct, interpolate_nearest

NUM_CLASSES = 1000
NUM_ANCHORS = 3


def mish_conv(cin: int, cout: int, k: int = 1, stride: int = 1) -> ConvNormAct:
    return ConvNormAct(cin, cout, k, stride, act=nn.Mish())


def leaky_conv(cin: int, cout: int, k: int = 1, stride: int = 1) -> ConvNormAct:
    return ConvNormAct(cin, cout, k, stride, act=nn.LeakyReLU(0.1))


class ResBlock(nn.Module):
    """``x + conv3x3(conv1x1(x))``, Mish after each conv."""

    def __init__(self, channels: int, hidden: int) -> None:
        super().__init__()
        self.body = nn.Sequential(mish_conv(channels, hidden, 1), mish_conv(hidden, channels, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x)


class CSPStage(nn.Module):
    """Downsample, split into a shortcut 1x1 and a 1x1 + residual blocks + 1x1 path, concat, fuse.

    The first stage is darknet's special case: its split is as wide as the
    downsampled tensor and its residual blocks' 1x1 convs halve the width.
    """

    def __init__(self, cin: int, cout: int, blocks: int, *, first: bool = False) -> None:
        super().__init__()
        split = cout if first else cout // 2
        self.down = mish_conv(cin, cout, 3, 2)
        self.shortcut = mish_conv(cout, split, 1)
        self.main = nn.Sequential(
            mish_conv(cout, split, 1),
            *[ResBlock(split, cout // 2 if first else split) for _ in range(blocks)],
            mish_conv(split, split, 1),
        )
        self.fuse = mish_conv(2 * split, cout, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.down(x)
        return self.fuse(torch.cat([self.main(x), self.shortcut(x)], dim=1))


class CSPDarknet53(nn.Module):
    """Returns the stride 8, 16 and 32 features (256, 512, 1024 channels)."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = mish_conv(3, 32, 3)
        self.stages = nn.ModuleList(
            [
                CSPStage(32, 64, 1, first=True),
                CSPStage(64, 128, 2),
                CSPStage(128, 256, 8),
                CSPStage(256, 512, 8),
                CSPStage(512, 1024, 4),
            ]
        )

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        x = self.stem(x)
        features = []
        for stage in self.stages:
            x = stage(x)
            features.append(x)
        return features[2:]


def conv_stack(cin: int, channels: int, n: int) -> nn.Sequential:
    """``n`` leaky convs alternating 1x1 to ``channels`` and 3x3 to ``2 * channels``."""
    layers = []
    for i in range(n):
        if i % 2 == 0:
            layers.append(leaky_conv(cin, channels, 1))
            cin = channels
        else:
            layers.append(leaky_conv(channels, 2 * channels, 3))
            cin = 2 * channels
    return nn.Sequential(*layers)


class SPP(nn.Module):
    """Concat of stride-1 max pools 13, 9, 5 and the input (darknet's route order)."""

    def __init__(self, sizes=(13, 9, 5)) -> None:
        super().__init__()
        self.pools = nn.ModuleList(nn.MaxPool2d(k, 1, k // 2) for k in sizes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([pool(x) for pool in self.pools] + [x], dim=1)


class Neck(nn.Module):
    """SPP on the stride-32 feature, then PANet: top-down then bottom-up path aggregation."""

    def __init__(self) -> None:
        super().__init__()
        self.pre_spp = conv_stack(1024, 512, 3)
        self.spp = SPP()
        self.post_spp = conv_stack(2048, 512, 3)
        # top-down
        self.reduce5 = leaky_conv(512, 256, 1)
        self.lateral4 = leaky_conv(512, 256, 1)
        self.td4 = conv_stack(512, 256, 5)
        self.reduce4 = leaky_conv(256, 128, 1)
        self.lateral3 = leaky_conv(256, 128, 1)
        self.td3 = conv_stack(256, 128, 5)
        # bottom-up
        self.down3 = leaky_conv(128, 256, 3, 2)
        self.bu4 = conv_stack(512, 256, 5)
        self.down4 = leaky_conv(256, 512, 3, 2)
        self.bu5 = conv_stack(1024, 512, 5)

    def forward(self, c3: torch.Tensor, c4: torch.Tensor, c5: torch.Tensor) -> tuple[torch.Tensor, ...]:
        p5 = self.post_spp(self.spp(self.pre_spp(c5)))
        up = interpolate_nearest(self.reduce5(p5), 2)
        p4 = self.td4(torch.cat([self.lateral4(c4), up], dim=1))
        up = interpolate_nearest(self.reduce4(p4), 2)
        n3 = self.td3(torch.cat([self.lateral3(c3), up], dim=1))
        n4 = self.bu4(torch.cat([self.down3(n3), p4], dim=1))
        n5 = self.bu5(torch.cat([self.down4(n4), p5], dim=1))
        return n3, n4, n5


def yolo_head(cin: int) -> nn.Sequential:
    """3x3 leaky conv doubling the channels, then the linear 1x1 prediction conv."""
    return nn.Sequential(
        leaky_conv(cin, 2 * cin, 3),
        nn.Conv2d(2 * cin, NUM_ANCHORS * (5 + NUM_CLASSES), 1),
    )


class YOLOv4(nn.Module):
    """Image -> raw predictions at strides 8, 16, 32 (3015 channels each)."""

    def __init__(self) -> None:
        super().__init__()
        self.backbone = CSPDarknet53()
        self.neck = Neck()
        self.heads = nn.ModuleList(yolo_head(c) for c in (128, 256, 512))

    def forward(self, image: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        features = self.neck(*self.backbone(image))
        return tuple(head(f) for head, f in zip(self.heads, features))
