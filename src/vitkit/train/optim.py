"""Optimizer parameter groups: no weight decay on norms, biases, class token and positions."""

from __future__ import annotations

import torch
from torch import nn


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Two groups: matrices and conv kernels decay; 1-D tensors and tokens do not."""
    skip = set(getattr(model, "no_weight_decay", lambda: set())())
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        (no_decay if param.ndim <= 1 or name in skip else decay).append(param)
    return [{"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0}]


def build_adamw(model: nn.Module, lr: float, weight_decay: float = 0.05,
                betas: tuple[float, float] = (0.9, 0.999)) -> torch.optim.AdamW:
    """AdamW over `param_groups`, using the fused kernel (one pass over all tensors)."""
    return torch.optim.AdamW(param_groups(model, weight_decay), lr=lr, betas=betas, fused=True)
