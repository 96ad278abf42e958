"""Fused attention (SDPA) against explicit attention, at the shapes vitkit trains and serves.

Explicit attention (`softmax(q kᵀ / √d) v` as three ops) could skip SDPA's per-call overhead
at short sequences; this measures whether it does, forward + backward and forward only, with
q, k, v taken from one (B, T, 3, H, D) tensor as `Attention` takes them.

    python benchmarks/attention.py [--reps 20]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]

# (label, (batch, heads, tokens, head dim))
SHAPES = (
    ("tutorial step (P4, D48, 4 heads), batch 256", (256, 4, 65, 12)),
    ("CIFAR step (P4, D192, 3 heads), batch 128", (128, 3, 65, 64)),
    ("B/16 at 224, batch 64", (64, 12, 197, 64)),
    ("B/16 at 224, batch 8", (8, 12, 197, 64)),
)


def fused(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v)


def explicit(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return ((q * q.shape[-1] ** -0.5) @ k.transpose(-2, -1)).softmax(dim=-1) @ v


def time_ms(attend: Attend, shape: tuple[int, int, int, int], train: bool, reps: int) -> float:
    """Median milliseconds of one attention call (and its backward when `train`)."""
    batch, heads, tokens, head_dim = shape
    qkv = torch.randn(batch, tokens, 3, heads, head_dim, requires_grad=train)

    def step() -> None:
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        out = attend(q, k, v)
        if train:
            out.sum().backward()

    for _ in range(3):
        step()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return 1e3 * sorted(times)[len(times) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=20)
    args = parser.parse_args()
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"median of {args.reps} calls")
    print(f"{'shape':<46}{'pass':<12}{'SDPA ms':>9}{'explicit ms':>13}{'SDPA speed-up':>15}")
    for label, shape in SHAPES:
        for train in (True, False):
            sdpa_ms = time_ms(fused, shape, train, args.reps)
            explicit_ms = time_ms(explicit, shape, train, args.reps)
            print(f"{label:<46}{'fwd + bwd' if train else 'forward':<12}{sdpa_ms:>9.2f}"
                  f"{explicit_ms:>13.2f}{explicit_ms / sdpa_ms:>14.2f}x", flush=True)


if __name__ == "__main__":
    main()
