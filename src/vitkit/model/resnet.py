"""The paper's hybrid tokenizer: the official ResNet stem (BiT-style) feeding the ViT.

Written to the official JAX code, which decides whether the released R50+ViT weights give
their outputs: convolutions with weight standardisation (w - mean) / (std + 1e-5) per output
filter, GroupNorm with 32 groups and epsilon 1e-6, TensorFlow "SAME" padding (asymmetric at
stride 2; the max-pool pads with -inf), post-activation bottleneck units. Parameter names
follow timm's hybrid so state dicts move between the two.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

GN_GROUPS = 32
GN_EPS = 1e-6
WS_EPS = 1e-5


def same_padding(size: int, kernel: int, stride: int) -> tuple[int, int]:
    """TensorFlow "SAME": output ceil(size / stride); the odd pixel of padding goes last."""
    total = max((math.ceil(size / stride) - 1) * stride + kernel - size, 0)
    return total // 2, total - total // 2


def pad_same(x: torch.Tensor, kernel: int, stride: int, value: float = 0.0) -> torch.Tensor:
    top, bottom = same_padding(x.shape[-2], kernel, stride)
    left, right = same_padding(x.shape[-1], kernel, stride)
    if top or bottom or left or right:
        x = F.pad(x, (left, right, top, bottom), value=value)
    return x


class StdConv2d(nn.Conv2d):
    """Conv2d (no bias, SAME padding) whose kernel is standardised on every call."""

    def __init__(self, in_chans: int, out_chans: int, kernel_size: int, stride: int = 1) -> None:
        super().__init__(in_chans, out_chans, kernel_size, stride, padding=0, bias=False)

    def standardized_weight(self) -> torch.Tensor:
        weight = self.weight
        mean = weight.mean(dim=(1, 2, 3), keepdim=True)
        std = weight.std(dim=(1, 2, 3), keepdim=True, correction=0)
        return (weight - mean) / (std + WS_EPS)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = pad_same(x, self.kernel_size[0], self.stride[0])
        return F.conv2d(x, self.standardized_weight(), None, self.stride)


def group_norm(channels: int) -> nn.GroupNorm:
    return nn.GroupNorm(GN_GROUPS, channels, eps=GN_EPS)


class Downsample(nn.Module):
    """The projection shortcut: 1x1 standardised conv + GroupNorm."""

    def __init__(self, in_chans: int, out_chans: int, stride: int) -> None:
        super().__init__()
        self.conv = StdConv2d(in_chans, out_chans, 1, stride)
        self.norm = group_norm(out_chans)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.conv(x))


class Bottleneck(nn.Module):
    """1x1 -> 3x3 (strided) -> 1x1 (4x wider), GroupNorm after each; ReLU after the sum."""

    def __init__(self, in_chans: int, width: int, stride: int) -> None:
        super().__init__()
        out_chans = 4 * width
        needs_projection = in_chans != out_chans or stride != 1
        self.downsample = Downsample(in_chans, out_chans, stride) if needs_projection else None
        self.conv1, self.norm1 = StdConv2d(in_chans, width, 1), group_norm(width)
        self.conv2, self.norm2 = StdConv2d(width, width, 3, stride), group_norm(width)
        self.conv3, self.norm3 = StdConv2d(width, out_chans, 1), group_norm(out_chans)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = x if self.downsample is None else self.downsample(x)
        y = F.relu(self.norm1(self.conv1(x)))
        y = F.relu(self.norm2(self.conv2(y)))
        y = self.norm3(self.conv3(y))
        return F.relu(shortcut + y)


class Stage(nn.Module):
    def __init__(self, in_chans: int, width: int, depth: int, stride: int) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*(Bottleneck(in_chans if i == 0 else 4 * width, width,
                                                 stride if i == 0 else 1) for i in range(depth)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(x)


class RootBlock(nn.Module):
    """7x7/2 standardised conv, GroupNorm, ReLU, 3x3/2 max-pool (SAME, -inf padding)."""

    def __init__(self, in_chans: int, width: int) -> None:
        super().__init__()
        self.conv = StdConv2d(in_chans, width, 7, 2)
        self.norm = group_norm(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.norm(self.conv(x)))
        return F.max_pool2d(pad_same(x, 3, 2, value=float("-inf")), 3, 2)


class ResNetBackbone(nn.Module):
    """Root block and bottleneck stages; the first stage keeps the stride, the others halve."""

    def __init__(self, in_chans: int, layers: tuple[int, ...], width: int = 64) -> None:
        super().__init__()
        self.stem = RootBlock(in_chans, width)
        stages, previous = [], width
        for index, depth in enumerate(layers):
            stage_width = width * 2**index
            stages.append(Stage(previous, stage_width, depth, 1 if index == 0 else 2))
            previous = 4 * stage_width
        self.stages = nn.Sequential(*stages)
        self.out_chans = previous

    @staticmethod
    def total_stride(layers: tuple[int, ...]) -> int:
        """4 from the root block, then 2 per stage after the first."""
        return 4 * 2 ** max(len(layers) - 1, 0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.stages(self.stem(x))


class HybridEmbed(nn.Module):
    """ResNet feature map -> tokens with a (patch / stride)-sized projection (1x1 for R50/16)."""

    def __init__(self, patch_size: int, in_chans: int, width: int, layers: tuple[int, ...],
                 resnet_width: int = 64) -> None:
        super().__init__()
        self.backbone = ResNetBackbone(in_chans, layers, resnet_width)
        kernel = patch_size // ResNetBackbone.total_stride(layers)
        self.proj = nn.Conv2d(self.backbone.out_chans, width, kernel_size=kernel, stride=kernel)

    def feature_map(self, images: torch.Tensor) -> torch.Tensor:
        """(B, D, grid_h, grid_w): the tokens before flattening."""
        return self.proj(self.backbone(images))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.feature_map(images).flatten(2).transpose(1, 2)  # (B, N, D)
