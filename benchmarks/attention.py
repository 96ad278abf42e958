"""Fused attention (SDPA) against explicit and chunked attention, at vitkit's shapes.

Explicit attention (`softmax(q kᵀ / √d) v` as three ops over the whole batch) could skip
SDPA's per-call overhead at short sequences; `vitkit.model.chunked_attention` (CPU training
only: forward + backward) runs it over cache-sized chunks of the batch. This measures each,
forward + backward and forward only, with q, k, v taken from one (B, T, 3, H, D) tensor as
`Attention` takes them. (Timed alone, these calls swing more between runs than inside a
training step; benchmarks/step_ablation.py measures the step.)

    python benchmarks/attention.py [--reps 20]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from vitkit.model.chunked_attention import chunked_attention
from vitkit.runtime import cpu_description

sys.path.append(str(Path(__file__).resolve().parent))  # readme_tables, for importers
import readme_tables

Attend = Callable[[torch.Tensor], torch.Tensor]  # qkv (B, T, 3, H, D) -> attention output

# (label, (batch, heads, tokens, head dim))
SHAPES = (
    ("tutorial step (P4, D48, 4 heads), batch 256", (256, 4, 65, 12)),
    ("CIFAR step (P4, D192, 3 heads), batch 128", (128, 3, 65, 64)),
    ("cifar10 recipe (D128, 4 heads, 64 tokens), 128", (128, 4, 64, 32)),
    ("B/16 at 224, batch 64", (64, 12, 197, 64)),
    ("B/16 at 224, batch 8", (8, 12, 197, 64)),
)


def fused(qkv: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(*qkv.permute(2, 0, 3, 1, 4).unbind(0))


def explicit(qkv: torch.Tensor) -> torch.Tensor:
    q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
    return ((q * q.shape[-1] ** -0.5) @ k.transpose(-2, -1)).softmax(dim=-1) @ v


def chunked(qkv: torch.Tensor) -> torch.Tensor:
    return chunked_attention(qkv.flatten(2), qkv.shape[3])


def time_ms(attend: Attend, shape: tuple[int, int, int, int], train: bool, reps: int) -> float:
    """Median milliseconds of one attention call (and its backward when `train`)."""
    batch, heads, tokens, head_dim = shape
    qkv = torch.randn(batch, tokens, 3, heads, head_dim, requires_grad=train)

    def step() -> None:
        out = attend(qkv)
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
    readme_tables.add_flag(parser)
    args = parser.parse_args()
    with readme_tables.recording("attention.py", args.write_readme):
        torch.manual_seed(0)
        print(cpu_description())
        print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
              f"median of {args.reps} calls")
        print(f"{'shape':<50}{'pass':<11}{'SDPA ms':>9}{'explicit ms':>13}{'chunked ms':>12}")
        for label, shape in SHAPES:
            for train in (True, False):
                sdpa_ms = time_ms(fused, shape, train, args.reps)
                explicit_ms = time_ms(explicit, shape, train, args.reps)
                chunked_ms = f"{time_ms(chunked, shape, train, args.reps):.2f}" if train else "-"
                print(f"{label:<50}{'fwd + bwd' if train else 'forward':<11}{sdpa_ms:>9.2f}"
                      f"{explicit_ms:>13.2f}{chunked_ms:>12}", flush=True)


if __name__ == "__main__":
    main()
