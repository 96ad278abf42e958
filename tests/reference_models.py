"""Helpers of the parity tests: random weights everywhere, and timm as a reference for the
official hybrids (its ResNet set to the official constants).

timm's ResNet differs from the official code in two constants (GroupNorm epsilon 1e-5 instead
of 1e-6; weight standardisation / sqrt(var + 1e-8) instead of / (std + 1e-5)).
"""

from functools import partial

import torch
import torch.nn.functional as F
from timm.layers import StdConv2dSame
from timm.layers.padding import pad_same as timm_pad_same


def official_resnet_constants(model: torch.nn.Module) -> None:
    """Set timm's ResNet to the official GroupNorm epsilon and weight standardisation."""
    def official_forward(conv, x):
        weight = conv.weight
        mean = weight.mean(dim=(1, 2, 3), keepdim=True)
        std = weight.std(dim=(1, 2, 3), keepdim=True, correction=0)
        if conv.same_pad:
            x = timm_pad_same(x, conv.kernel_size, conv.stride, conv.dilation)
        return F.conv2d(x, (weight - mean) / (std + 1e-5), conv.bias, conv.stride, conv.padding,
                        conv.dilation, conv.groups)

    for module in model.modules():
        if isinstance(module, torch.nn.GroupNorm):
            module.eps = 1e-6
        if isinstance(module, StdConv2dSame):
            module.forward = partial(official_forward, module)


def randomise(model: torch.nn.Module, std: float = 0.1) -> torch.nn.Module:
    """Random values in every parameter (libraries zero-init some), so each weight matters."""
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0, std)
    return model.eval()
