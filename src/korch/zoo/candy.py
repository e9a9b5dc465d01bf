"""Candy: the fast neural style transfer network.

Johnson, Alahi, Fei-Fei, "Perceptual Losses for Real-Time Style Transfer and
Super-Resolution", ECCV 2016, as the ONNX model zoo's ``candy-9`` has it: the
``TransformerNet`` of the PyTorch ``fast_neural_style`` example. That variant
differs from the paper in the ways the example does: instance norm instead of
batch norm, reflection padding instead of zero padding, nearest upsampling
followed by a conv instead of fractionally-strided convs, no output tanh.
"""

from __future__ import annotations

import torch
from torch import nn

from korch.zoo.common import interpolate_nearest


class ConvLayer(nn.Sequential):
    """Reflection padding of ``kernel_size // 2``, then a conv."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int = 1) -> None:
        super().__init__(
            nn.ReflectionPad2d(kernel_size // 2),
            nn.Conv2d(in_channels, out_channels, kernel_size, stride),
        )


class UpsampleConvLayer(ConvLayer):
    """Nearest upsampling by ``upsample``, then a :class:`ConvLayer`."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, upsample: int) -> None:
        super().__init__(in_channels, out_channels, kernel_size)
        self.upsample = upsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(interpolate_nearest(x, self.upsample))


def _conv_in_relu(conv: nn.Module, channels: int) -> nn.Sequential:
    return nn.Sequential(conv, nn.InstanceNorm2d(channels, affine=True), nn.ReLU())


class ResidualBlock(nn.Module):
    """conv-IN-ReLU-conv-IN plus the identity; no activation after the sum."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            _conv_in_relu(ConvLayer(channels, channels, 3), channels),
            ConvLayer(channels, channels, 3),
            nn.InstanceNorm2d(channels, affine=True),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x)


class TransformerNet(nn.Sequential):
    """Image -> stylized image of the same size (3 channels)."""

    def __init__(self) -> None:
        super().__init__(
            _conv_in_relu(ConvLayer(3, 32, 9), 32),
            _conv_in_relu(ConvLayer(32, 64, 3, stride=2), 64),
            _conv_in_relu(ConvLayer(64, 128, 3, stride=2), 128),
            *[ResidualBlock(128) for _ in range(5)],
            _conv_in_relu(UpsampleConvLayer(128, 64, 3, upsample=2), 64),
            _conv_in_relu(UpsampleConvLayer(64, 32, 3, upsample=2), 32),
            ConvLayer(32, 3, 9),
        )
