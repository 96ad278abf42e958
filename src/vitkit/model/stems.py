"""The stem: how images become the token grid of eq. 1 (the x_p E of the paper).

One class per kind: `PatchStem` (the paper's P x P projection E), `ConvStem` (a few 3x3
convolutions, "early convolutions") and `ResNetStem` (the paper's hybrid: ResNet-v2 stages,
then a projection of their feature map). Each describes its convolutions at an image size
(`conv_shapes`); its token grid, FLOPs and parameter count are read from that one list. Each
also knows the image sizes it takes when the model's size is dynamic, its first-layer pixel
filters (for the paper's Figure 7) and how to initialise itself. `build_stem(config)` is the
one place that turns `config.stem` into a module.

State-dict names are those of the released checkpoints' converters (`patch_embed.proj.*`,
`patch_embed.backbone.*`, `patch_embed.convs.*`): do not rename attributes.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, ClassVar, NamedTuple

import torch
from torch import nn

from vitkit.errors import InputError
from vitkit.model.geometry import ConvShape, ceil_div, conv_shape
from vitkit.model.init import (
    init_feature_conv_,
    init_norm_,
    init_projection_,
    init_residual_norm_,
)
from vitkit.model.resnet import ResNetBackbone

if TYPE_CHECKING:
    from vitkit.config import ViTConfig


class PixelFilters(NamedTuple):
    """The filters a stem applies to the pixels: `weight` (D, C, kh, kw) as applied, the
    `layer`'s name inside the stem and `what` it is."""

    weight: torch.Tensor
    layer: str
    what: str


class Stem(nn.Module, ABC):
    """Images (B, C, H, W) -> feature map (B, D, grid_h, grid_w) -> tokens (B, N, D)."""

    kind: ClassVar[str]  # the config's `stem` value

    def __init__(self, patch_size: int) -> None:
        super().__init__()
        self.patch_size = patch_size  # pixels per token side

    @classmethod
    @abstractmethod
    def from_config(cls, config: ViTConfig) -> Stem:
        """The stem `config` describes."""

    @abstractmethod
    def feature_map(self, images: torch.Tensor) -> torch.Tensor:
        """(B, D, grid_h, grid_w): the tokens before flattening."""

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """(B, N, D) tokens in row-major order, contiguous: a transposed view would carry its
        layout through every residual add, and each LayerNorm and Linear would copy it."""
        return self.feature_map(images).flatten(2).transpose(1, 2).contiguous()

    @abstractmethod
    def conv_shapes(self, img_size: tuple[int, int]) -> tuple[list[ConvShape], tuple[int, int]]:
        """Its convolutions on an `img_size` image in forward order, and the token grid."""

    @property
    @abstractmethod
    def size_step(self) -> int:
        """With a dynamic image size, heights and widths must be multiples of this."""

    @abstractmethod
    def pixel_filters(self) -> PixelFilters:
        """The first layer's filters, as they are applied to the pixels."""

    @abstractmethod
    def init_weights_(self, scheme: str) -> None:
        """Initialise in place with a scheme of `vitkit.model.init` ("jax", "trunc_normal")."""

    # -- read from conv_shapes --------------------------------------------------------------
    def token_grid(self, img_size: tuple[int, int]) -> tuple[int, int]:
        """Tokens along height and width for an `img_size` image."""
        return self.conv_shapes(tuple(img_size))[1]

    def flops(self, img_size: tuple[int, int]) -> int:
        """Convolution FLOPs for one image (2 per multiply-add; norms and ReLUs left out)."""
        return sum(shape.flops for shape in self.conv_shapes(tuple(img_size))[0])

    def parameter_count(self) -> int:
        """Parameters of its convolutions and norms, worked out from their shapes."""
        size = (self.patch_size, self.patch_size)
        return sum(shape.parameters for shape in self.conv_shapes(size)[0])

    def check_size(self, img_size: tuple[int, int]) -> None:
        """Raise InputError unless the stem takes `img_size` (a dynamic-size model's check)."""
        height, width = img_size
        step = self.size_step
        if height % step or width % step or height < 1 or width < 1:
            near = f"{max(step, height - height % step)}x{max(step, width - width % step)}"
            raise InputError(
                f"image size {height}x{width} does not fit the model's {self.kind} stem, which "
                f"takes heights and widths that are multiples of {step} (one token per "
                f"{self.patch_size}x{self.patch_size} pixels): resize or crop the images to a "
                f"multiple of {step}, e.g. {near}.")


class PatchStem(Stem):
    """Split into P x P patches and project each to `width`: a Conv2d with kernel = stride = P."""

    kind = "patch"

    def __init__(self, patch_size: int, in_chans: int, width: int) -> None:
        super().__init__(patch_size)
        self.proj = nn.Conv2d(in_chans, width, kernel_size=patch_size, stride=patch_size)

    @classmethod
    def from_config(cls, config: ViTConfig) -> PatchStem:
        return cls(config.patch_size, config.in_chans, config.width)

    def feature_map(self, images: torch.Tensor) -> torch.Tensor:
        return self.proj(images)

    def conv_shapes(self, img_size: tuple[int, int]) -> tuple[list[ConvShape], tuple[int, int]]:
        proj = conv_shape(self.proj, img_size)  # floor(size / P): the remainder is cut off
        return [proj], proj.out_size

    @property
    def size_step(self) -> int:
        return self.patch_size  # anything else would drop the pixels of a partial patch

    def pixel_filters(self) -> PixelFilters:
        return PixelFilters(self.proj.weight.detach(), "proj", "patch embedding E")

    def init_weights_(self, scheme: str) -> None:
        init_projection_(self.proj, scheme)


class ConvStem(Stem):
    """A hybrid's tokenizer: 3x3 convolutions (BatchNorm, ReLU), log2(P) of them halving the
    resolution (by default the last ones), then a 1x1 projection to `width` ("early
    convolutions", Xiao et al. 2021). A conv halves by its stride of 2, or with `pool` by a
    2x2 max-pooling after it (conv, pool, BatchNorm, ReLU: the VGG-like blocks of fast CIFAR
    ConvNets, 4x the FLOPs of the strided conv).

    At sizes that are multiples of P it gives the patch grid; other sizes give ceil(size / P)
    tokens per side (each 3x3 conv pads by one pixel; pooling keeps a partial last window).
    The convolutions run channels-last, oneDNN's faster layout on CPUs (the stem gains most;
    the whole training step of the cifar10 models a few percent).
    """

    kind = "conv"

    def __init__(self, patch_size: int, in_chans: int, width: int,
                 channels: tuple[int, ...], strides: tuple[int, ...],
                 pool: bool = False) -> None:
        super().__init__(patch_size)
        layers: list[nn.Module] = []
        previous = in_chans
        self.pooled = tuple(pool and stride == 2 for stride in strides)
        for out, stride, pooled in zip(channels, strides, self.pooled, strict=True):
            if pooled:
                layers += [nn.Conv2d(previous, out, 3, 1, 1, bias=False),
                           nn.MaxPool2d(2, ceil_mode=True)]
            else:
                layers.append(nn.Conv2d(previous, out, 3, stride, 1, bias=False))
            layers += [nn.BatchNorm2d(out), nn.ReLU(inplace=True)]
            previous = out
        self.convs = nn.Sequential(*layers)
        self.proj = nn.Conv2d(previous, width, kernel_size=1)

    @classmethod
    def from_config(cls, config: ViTConfig) -> ConvStem:
        return cls(config.patch_size, config.in_chans, config.width, config.stem_channels,
                   config.conv_stem_strides(), config.stem_pool)

    def feature_map(self, images: torch.Tensor) -> torch.Tensor:
        return self.proj(self.convs(images.contiguous(memory_format=torch.channels_last)))

    def conv_shapes(self, img_size: tuple[int, int]) -> tuple[list[ConvShape], tuple[int, int]]:
        shapes, size = [], tuple(img_size)
        for conv, pooled in zip(self._convs(), self.pooled, strict=True):
            shapes.append(conv_shape(conv, size, norm=True))  # each is followed by BatchNorm
            size = shapes[-1].out_size
            if pooled:
                size = (ceil_div(size[0], 2), ceil_div(size[1], 2))
        shapes.append(conv_shape(self.proj, size))
        return shapes, shapes[-1].out_size

    @property
    def size_step(self) -> int:
        return 1  # padded convolutions take any size

    def pixel_filters(self) -> PixelFilters:
        return PixelFilters(self.convs[0].weight.detach(), "convs.0",
                            "first 3x3 conv of the stem")

    def init_weights_(self, scheme: str) -> None:
        for module in self.convs:
            if isinstance(module, nn.Conv2d):
                init_feature_conv_(module, scheme)
            elif isinstance(module, nn.BatchNorm2d):
                init_norm_(module)
        init_projection_(self.proj, scheme)

    def _convs(self) -> list[nn.Conv2d]:
        return [module for module in self.convs if isinstance(module, nn.Conv2d)]


class ResNetStem(Stem):
    """The paper's hybrid: a ResNet-v2 feature map -> tokens with a (P / stride)-sized
    projection (1x1 for R50+B/16, 8x8 on the stride-4 root block for R+Ti/32).

    The ResNet pads "SAME", so its map has ceil(size / stride) cells per side; the projection
    then takes floor(map / kernel) tokens.
    """

    kind = "resnet"

    def __init__(self, patch_size: int, in_chans: int, width: int, layers: tuple[int, ...],
                 resnet_width: int = 64, norm_convention: str = "official") -> None:
        super().__init__(patch_size)
        self.backbone = ResNetBackbone(in_chans, layers, resnet_width, norm_convention)
        kernel = patch_size // ResNetBackbone.total_stride(layers)
        self.proj = nn.Conv2d(self.backbone.out_chans, width, kernel_size=kernel, stride=kernel)

    @classmethod
    def from_config(cls, config: ViTConfig) -> ResNetStem:
        return cls(config.patch_size, config.in_chans, config.width, config.resnet_layers,
                   config.resnet_width, config.resnet_norm)

    def feature_map(self, images: torch.Tensor) -> torch.Tensor:
        return self.proj(self.backbone(images))

    def conv_shapes(self, img_size: tuple[int, int]) -> tuple[list[ConvShape], tuple[int, int]]:
        shapes, feature_size = self.backbone.conv_shapes(tuple(img_size))
        proj = conv_shape(self.proj, feature_size)
        return [*shapes, proj], proj.out_size

    @property
    def size_step(self) -> int:
        # A 1x1 projection takes every cell of the map, which SAME padding gives any size;
        # a larger one would drop the map's partial cells, so sizes must fill whole tokens.
        return 1 if self.proj.kernel_size[0] == 1 else self.patch_size

    def pixel_filters(self) -> PixelFilters:
        return PixelFilters(self.backbone.stem.conv.standardized_weight().detach(),
                            "backbone.stem.conv", "ResNet 7x7 root conv, weight-standardised")

    def init_weights_(self, scheme: str) -> None:
        for module in self.backbone.modules():
            if isinstance(module, nn.Conv2d):
                init_feature_conv_(module, scheme)
            elif isinstance(module, nn.GroupNorm):
                init_norm_(module)
        for block in (block for stage in self.backbone.stages for block in stage.blocks):
            init_residual_norm_(block.norm3, scheme)
        init_projection_(self.proj, scheme)


STEMS: dict[str, type[Stem]] = {stem.kind: stem for stem in (PatchStem, ConvStem, ResNetStem)}


def build_stem(config: ViTConfig) -> Stem:
    """The stem `config.stem` names, built from the config's stem options."""
    return STEMS[config.stem].from_config(config)
