"""Attention kernels at the shapes vitkit trains and serves: SDPA, vitkit's batched kernel,
and explicit attention (three autograd ops).

`vitkit.model.attention.attend` runs the batched kernel for CPU training passes of at most
`BATCHED_MAX_TOKENS` tokens and SDPA otherwise; this script measures whether those are the
right choices. Each call takes q, k and v from one (B, T, 3 * width) tensor, as the qkv
projection gives them, and returns (B, T, width), as the output projection takes it, so
every path pays its own layout copies. The three paths are timed in rotating order, medians.

    python benchmarks/attention.py [--reps 20]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from vitkit.model.attention import BATCHED_MAX_TOKENS, BatchedAttention

Attend = Callable[[torch.Tensor, int], torch.Tensor]

# (label, (batch, heads, tokens, head dim))
SHAPES = (
    ("tutorial step (P4, D48, 4 heads), batch 256", (256, 4, 65, 12)),
    ("CIFAR step (P4, D192, 3 heads), batch 128", (128, 3, 65, 64)),
    ("cifar10 recipe at 32 px (D128, 4 heads)", (128, 4, 64, 32)),
    ("cifar10 recipe at 16 px (D128, 4 heads)", (128, 4, 16, 32)),
    ("B/16 at 224, batch 8", (8, 12, 197, 64)),
    ("B/16 at 224, batch 64", (64, 12, 197, 64)),
)


def _heads(qkv: torch.Tensor, heads: int) -> tuple[torch.Tensor, ...]:
    batch, tokens, _ = qkv.shape
    return qkv.view(batch, tokens, 3, heads, -1).permute(2, 0, 3, 1, 4).unbind(0)


def _merge(out: torch.Tensor) -> torch.Tensor:
    batch, heads, tokens, head_dim = out.shape
    return out.transpose(1, 2).reshape(batch, tokens, heads * head_dim)


def sdpa(qkv: torch.Tensor, heads: int) -> torch.Tensor:
    return _merge(F.scaled_dot_product_attention(*_heads(qkv, heads)))


def batched(qkv: torch.Tensor, heads: int) -> torch.Tensor:
    return BatchedAttention.apply(qkv, heads)


def explicit(qkv: torch.Tensor, heads: int) -> torch.Tensor:
    q, k, v = _heads(qkv, heads)
    return _merge(((q * q.shape[-1] ** -0.5) @ k.transpose(-2, -1)).softmax(dim=-1) @ v)


PATHS: dict[str, Attend] = {"SDPA": sdpa, "batched": batched, "explicit": explicit}


def timings(shape: tuple[int, int, int, int], train: bool, reps: int) -> dict[str, float]:
    """Median milliseconds of one call of each path (with its backward when `train`)."""
    batch, heads, tokens, head_dim = shape
    qkv = torch.randn(batch, tokens, 3 * heads * head_dim, requires_grad=train)
    grad = torch.randn(batch, tokens, heads * head_dim)

    def call(path: Attend) -> float:
        start = time.perf_counter()
        if train:
            path(qkv, heads).backward(grad)
        else:
            with torch.no_grad():
                path(qkv, heads)
        return time.perf_counter() - start

    for path in PATHS.values():
        call(path), call(path)
    samples: dict[str, list[float]] = {name: [] for name in PATHS}
    names = list(PATHS)
    for rep in range(reps):
        for name in names[rep % 3:] + names[:rep % 3]:
            samples[name].append(call(PATHS[name]))
    return {name: 1e3 * statistics.median(values) for name, values in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=20)
    args = parser.parse_args()
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, median of "
          f"{args.reps} rotating calls; vitkit trains with the batched kernel up to "
          f"{BATCHED_MAX_TOKENS} tokens")
    print(f"{'shape':<46}{'pass':<11}{'SDPA ms':>9}{'batched ms':>12}{'explicit ms':>13}"
          f"{'batched vs SDPA':>17}")
    for label, shape in SHAPES:
        for train in (True, False):
            ms = timings(shape, train, args.reps)
            print(f"{label:<46}{'fwd + bwd' if train else 'forward':<11}{ms['SDPA']:>9.2f}"
                  f"{ms['batched']:>12.2f}{ms['explicit']:>13.2f}"
                  f"{ms['SDPA'] / ms['batched']:>16.2f}x", flush=True)


if __name__ == "__main__":
    main()
