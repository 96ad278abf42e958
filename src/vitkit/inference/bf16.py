"""How a model runs in bf16: on the CPU as a bf16 copy of it (`bf16_copy`), on CUDA under
autocast (`autocast_context`); `bf16_model` gives either, with the context to run it in.

On the CPU the copy replaces autocast, which casts every weight to bf16 on every call; with
its linear weights prepacked for oneDNN (`vitkit.inference.packed_linear`) it runs faster
still. What each costs and gains on each machine: benchmarks/README.md.
"""

from __future__ import annotations

import contextlib
import copy
import functools
from collections.abc import Callable

import torch
from torch import nn

from vitkit.inference.packed_linear import prepack_linears, prepacking_available

__all__ = ["autocast_context", "bf16_autocast", "bf16_copy", "bf16_model"]


def bf16_autocast(device: torch.device) -> bool:
    """Whether bf16 runs under autocast on `device` (CUDA) rather than as a bf16 copy of the
    model (the CPU: `bf16_copy`)."""
    return device.type != "cpu"


def bf16_model(model: nn.Module, device: torch.device, compiled: bool = False
               ) -> tuple[nn.Module, Callable[[], contextlib.AbstractContextManager]]:
    """The model to run in bf16 on `device` and a factory of the context to run it in: on the
    CPU a bf16 copy (`bf16_copy`, its weights prepacked unless it will be `compiled`) and no
    context, elsewhere `model` itself under bf16 autocast."""
    if bf16_autocast(device):
        return model, autocast_context(device, torch.bfloat16)
    return bf16_copy(model, prepack=not compiled), contextlib.nullcontext


def bf16_copy(model: nn.Module, prepack: bool = True) -> nn.Module:
    """A copy of `model` with bf16 weights and activations that takes and returns float32
    tensors, keeping the model's class and attributes. The residual stream is bf16 too. With
    `prepack`, where oneDNN runs bf16, the linear layers' weights are prepacked for it
    (`vitkit.inference.packed_linear`): the same outputs, faster, but opaque to torch.compile
    (which packs them itself when it freezes weights).

    The classifier (`head`, one small matmul) stays float32, taking the bf16 features: bf16
    outputs hold 8 significant bits, so a model's scores would tie (and rank arbitrarily) and
    regression values would be rounded to 1/128 of their scale."""
    copied = copy.deepcopy(model).to(torch.bfloat16)
    head = getattr(copied, "head", None)
    if isinstance(head, nn.Linear):
        head.float().register_forward_pre_hook(_inputs_to_float32)
    if prepack and prepacking_available():
        prepack_linears(copied)  # the bf16 ones
    copied.register_forward_pre_hook(_inputs_to_bf16)
    copied.register_forward_hook(_output_to_float32)
    return copied


def _inputs_to_float32(module: nn.Module, args: tuple) -> tuple:
    return tuple(a.float() if isinstance(a, torch.Tensor) and a.is_floating_point() else a
                 for a in args)


def _inputs_to_bf16(module: nn.Module, args: tuple) -> tuple:
    return tuple(a.to(torch.bfloat16) if isinstance(a, torch.Tensor) and a.is_floating_point()
                 else a for a in args)


def _output_to_float32(module: nn.Module, args: tuple, output: object) -> object:
    return output.float() if isinstance(output, torch.Tensor) else output


def autocast_context(device: torch.device, dtype: torch.dtype | None
                     ) -> Callable[[], contextlib.AbstractContextManager]:
    """A factory of the context that runs a model under `dtype` autocast on `device` (None:
    no context): how training runs amp=bf16 and CUDA runs `--precision bf16`."""
    if dtype is None:
        return contextlib.nullcontext
    return functools.partial(torch.autocast, device.type, dtype=dtype)
