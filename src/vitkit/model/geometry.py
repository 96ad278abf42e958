"""Convolution geometry: output sizes (padded or TF "SAME") and each convolution's cost.

A stem describes itself as the list of its convolutions at an image size (`ConvShape`); its
token grid, FLOPs and parameter count are read from that one list.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn


def ceil_div(size: int, stride: int) -> int:
    """ceil(size / stride) for sizes >= 0, also traced as tensors. (Not -(-size // stride):
    ONNX's integer Div truncates, so an exported graph would floor negative quotients wrong.)"""
    return (size + stride - 1) // stride


def conv_output(size: int, kernel: int, stride: int, padding: int) -> int:
    """Output length of a convolution (or pooling) with symmetric zero padding."""
    return (size + 2 * padding - kernel) // stride + 1


@dataclass(frozen=True)
class ConvShape:
    """One convolution at one input size: channels, kernel, output grid, and whether a bias
    and an affine norm (BatchNorm / GroupNorm: scale and shift) come with it."""

    in_chans: int
    out_chans: int
    kernel: int
    out_size: tuple[int, int]
    bias: bool = False
    norm: bool = False

    @property
    def flops(self) -> int:
        """2 per multiply-add, as torch.utils.flop_counter counts a convolution."""
        return 2 * self.out_size[0] * self.out_size[1] * self.in_chans * self.kernel**2 \
            * self.out_chans

    @property
    def parameters(self) -> int:
        return self.in_chans * self.kernel**2 * self.out_chans + self.out_chans * (
            int(self.bias) + 2 * int(self.norm))


def conv_shape(conv: nn.Conv2d, in_size: tuple[int, int], norm: bool = False,
               same: bool = False) -> ConvShape:
    """The shape of `conv` applied to an `in_size` input: TF "SAME" output ceil(size /
    stride) when `same`, else the module's own zero padding."""
    kernel, stride, padding = conv.kernel_size[0], conv.stride[0], conv.padding[0]
    if same:
        out = (ceil_div(in_size[0], stride), ceil_div(in_size[1], stride))
    else:
        out = (conv_output(in_size[0], kernel, stride, padding),
               conv_output(in_size[1], kernel, stride, padding))
    return ConvShape(conv.in_channels, conv.out_channels, kernel, out, conv.bias is not None,
                     norm)
