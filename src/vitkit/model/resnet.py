"""The ResNet-v2 backbone of the paper's hybrid (BiT-style); `stems.ResNetStem` puts the
token projection on its feature map.

Written to the official JAX code, which decides whether the released R50+ViT weights give
their outputs: convolutions with weight standardisation (w - mean) / (std + 1e-5) per output
filter, GroupNorm with 32 groups and epsilon 1e-6, TensorFlow "SAME" padding (asymmetric at
stride 2; the max-pool pads with -inf), post-activation bottleneck units. timm's hybrids
normalise with other constants (`NORM_CONVENTIONS`), which its files are read with
(`ViTConfig.resnet_norm`). Parameter names
follow timm's hybrid so state dicts move between the two.

The SAME padding is computed with integer ops that also work on sizes traced as tensors, so
an ONNX trace (`vitkit.export`) follows a dynamic input size.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from vitkit.model.geometry import ConvShape, ceil_div, conv_shape

GN_GROUPS = 32
GN_EPS = 1e-6
WS_EPS = 1e-5
# The constants each convention normalises with: (weight standardisation epsilon, whether it
# is added to the variance inside the square root rather than to the std, GroupNorm epsilon).
# "official": the JAX code above; "timm": timm's hybrids (StdConv2dSame eps=1e-8, GroupNormAct
# 1e-5), which its R50+ViT files are computed with.
NORM_CONVENTIONS = {"official": (WS_EPS, False, GN_EPS), "timm": (1e-8, True, 1e-5)}


def same_padding(size: Any, kernel: int, stride: int) -> tuple[Any, Any]:
    """TensorFlow "SAME": output ceil(size / stride); the odd pixel of padding goes last.

    `size` is an int, or a 0-d tensor while tracing (then the padding stays in the graph)."""
    total = (ceil_div(size, stride) - 1) * stride + kernel - size
    total = total.clamp(min=0) if isinstance(total, torch.Tensor) else max(total, 0)
    return total // 2, total - total // 2


def pad_same(x: torch.Tensor, kernel: int, stride: int, value: float = 0.0) -> torch.Tensor:
    top, bottom = same_padding(x.shape[-2], kernel, stride)
    left, right = same_padding(x.shape[-1], kernel, stride)
    if torch.jit.is_tracing() or top or bottom or left or right:
        x = F.pad(x, (left, right, top, bottom), value=value)
    return x


class StdConv2d(nn.Conv2d):
    """Conv2d (no bias, SAME padding) whose kernel is standardised on every call."""

    ws_eps, eps_in_variance = WS_EPS, False  # `ResNetBackbone.use_norm_convention` sets them

    def __init__(self, in_chans: int, out_chans: int, kernel_size: int, stride: int = 1) -> None:
        super().__init__(in_chans, out_chans, kernel_size, stride, padding=0, bias=False)

    def standardized_weight(self) -> torch.Tensor:
        weight = self.weight
        mean = weight.mean(dim=(1, 2, 3), keepdim=True)
        if self.eps_in_variance:
            variance = weight.var(dim=(1, 2, 3), keepdim=True, correction=0)
            return (weight - mean) / torch.sqrt(variance + self.ws_eps)
        std = weight.std(dim=(1, 2, 3), keepdim=True, correction=0)
        return (weight - mean) / (std + self.ws_eps)

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

    def conv_shapes(self, size: tuple[int, int]) -> list[ConvShape]:
        """Its convolutions (each with its GroupNorm) on a `size` input, in forward order."""
        first = conv_shape(self.conv1, size, norm=True, same=True)
        middle = conv_shape(self.conv2, size, norm=True, same=True)
        shapes = [first, middle, conv_shape(self.conv3, middle.out_size, norm=True, same=True)]
        if self.downsample is not None:
            shapes.append(conv_shape(self.downsample.conv, size, norm=True, same=True))
        return shapes


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

    def conv_shapes(self, size: tuple[int, int]) -> tuple[list[ConvShape], tuple[int, int]]:
        """The root conv on a `size` input, and the size after the (SAME) max-pool."""
        root = conv_shape(self.conv, size, norm=True, same=True)
        return [root], (ceil_div(root.out_size[0], 2), ceil_div(root.out_size[1], 2))


class ResNetBackbone(nn.Module):
    """Root block and bottleneck stages; the first stage keeps the stride, the others halve."""

    def __init__(self, in_chans: int, layers: tuple[int, ...], width: int = 64,
                 norm_convention: str = "official") -> None:
        super().__init__()
        self.stem = RootBlock(in_chans, width)
        stages, previous = [], width
        for index, depth in enumerate(layers):
            stage_width = width * 2**index
            stages.append(Stage(previous, stage_width, depth, 1 if index == 0 else 2))
            previous = 4 * stage_width
        self.stages = nn.Sequential(*stages)
        self.out_chans = previous
        self.use_norm_convention(norm_convention)

    def use_norm_convention(self, convention: str) -> None:
        """Normalise with the constants of `convention` (`NORM_CONVENTIONS`): the official
        code's, or timm's for weights timm computes with."""
        ws_eps, in_variance, gn_eps = NORM_CONVENTIONS[convention]
        for module in self.modules():
            if isinstance(module, StdConv2d):
                module.ws_eps, module.eps_in_variance = ws_eps, in_variance
            elif isinstance(module, nn.GroupNorm):
                module.eps = gn_eps

    @staticmethod
    def total_stride(layers: tuple[int, ...]) -> int:
        """4 from the root block, then 2 per stage after the first."""
        return 4 * 2 ** max(len(layers) - 1, 0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.stages(self.stem(x))

    def conv_shapes(self, size: tuple[int, int]) -> tuple[list[ConvShape], tuple[int, int]]:
        """Every convolution on a `size` image in forward order, and the feature map's size."""
        shapes, size = self.stem.conv_shapes(size)
        for block in (block for stage in self.stages for block in stage.blocks):
            block_shapes = block.conv_shapes(size)
            shapes += block_shapes
            size = block_shapes[2].out_size
        return shapes, size
