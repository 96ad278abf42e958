"""bf16 linear layers prepacked for oneDNN, for CPU inference.

A bf16 `F.linear` on the CPU hands its weight to oneDNN in torch's plain layout, and oneDNN
reorders it into its own blocked layout (pairs of bf16 values for AVX512-BF16, tiles for AMX)
on every call. `prepack_linears` does that once per weight, as inductor does when it freezes a
model for the CPU: the same outputs, sooner, most of all on CPUs with AMX (figures per machine:
benchmarks/README.md, from `benchmarks/inference.py`).
"""

from __future__ import annotations

import platform
from typing import Any

import torch
from torch import nn

__all__ = ["PackedLinear", "prepack_linears", "prepacking_available"]


def prepacking_available() -> bool:
    """Whether this torch and CPU can run bf16 linears from prepacked oneDNN weights (x86
    only: the path that is measured and tested)."""
    return (platform.machine().lower() in ("x86_64", "amd64")
            and torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_linear_pointwise")
            and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()))


class PackedLinear(nn.Module):
    """`nn.Linear` with its bf16 weight held in oneDNN's layout: the same outputs, for
    inference only (no gradient reaches the weight). `weight` gives a plain copy.
    `rows_hint`: the row count (batch x tokens) oneDNN picks the layout for, as inductor
    passes it; None leaves the choice to oneDNN (any row count runs either way)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None,
                 rows_hint: int | None = None) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.rows_hint = rows_hint
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach().bfloat16(),
                                                              rows_hint)
        self.register_buffer("bias", None if bias is None else bias.detach().bfloat16().clone())

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> PackedLinear:
        return cls(linear.weight, linear.bias)

    @property
    def weight(self) -> torch.Tensor:
        return self.packed.to_dense()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")

    def __deepcopy__(self, memo: dict[int, Any]) -> PackedLinear:
        # oneDNN's packed tensors have no storage to copy: pack a plain copy again
        copied = PackedLinear(self.weight, self.bias, self.rows_hint)
        copied.train(self.training)
        return copied

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, bf16 prepacked for oneDNN")


def prepack_linears(model: nn.Module) -> nn.Module:
    """Replace every bf16 `nn.Linear` of `model` by a `PackedLinear`, in place; returns it
    (a float32 one, such as the bf16 copy's classifier, stays as it is)."""
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear and child.weight.dtype == torch.bfloat16:
                setattr(parent, name, PackedLinear.from_linear(child))
    return model
