"""Optimizers: AdamW (training from scratch) or SGD with momentum (the paper's fine-tuning),
both with no weight decay on norms, biases, class token and position embeddings."""

from __future__ import annotations

import torch
from torch import nn

from vitkit.errors import ConfigError

OPTIMIZERS = ("adamw", "sgd")


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


def build_sgd(model: nn.Module, lr: float, weight_decay: float = 0.0,
              momentum: float = 0.9) -> torch.optim.SGD:
    """SGD with (heavy-ball) momentum over `param_groups`: buf = m * buf + g; p -= lr * buf,
    the update of optax.sgd(momentum=0.9) that the official fine-tuning uses."""
    return torch.optim.SGD(param_groups(model, weight_decay), lr=lr, momentum=momentum,
                           fused=True)


def build_optimizer(model: nn.Module, name: str, lr: float, weight_decay: float,
                    betas: tuple[float, float] = (0.9, 0.999), momentum: float = 0.9
                    ) -> torch.optim.Optimizer:
    """The optimizer named by `TrainConfig.optimizer`."""
    if name == "adamw":
        return build_adamw(model, lr, weight_decay, betas)
    if name == "sgd":
        return build_sgd(model, lr, weight_decay, momentum)
    raise ConfigError(f"optimizer={name!r}: use one of {', '.join(OPTIMIZERS)}")
