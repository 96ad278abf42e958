"""bf16 autocast against fp32 for the training step, by model width: the evidence behind
`amp=auto` (`vitkit.train.amp.training_precision`: bf16 on a CPU with AMX, or
with AVX512-BF16 where a bf16 matmul also measures >= 1.3x fp32, for models at least 128
wide).

One process, the same model and tensors for both, rounds alternated (fp32, bf16, fp32, ...),
medians; batch 128 at 32 px, AdamW. Prints the CPU line first: the ratio depends on whether the
CPU has bf16 matmuls in hardware.

    python benchmarks/amp_step.py [--reps 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from vitkit.catalog import create_model
from vitkit.runtime import configure_cpu, cpu_description

sys.path.append(str(Path(__file__).resolve().parent))  # readme_tables, for importers
import readme_tables

MODELS = {
    "tutorial (patch 4, width 48, 4 layers)": dict(
        patch_size=4, width=48, depth=4, num_heads=4, mlp_dim=192),
    "model A (conv stem, width 128, 6 layers)": dict(
        patch_size=4, width=128, depth=6, num_heads=4, mlp_dim=256, stem="conv",
        stem_channels=[32, 64, 128], class_token=False, pool="mean_patches",
        pos_embed="sincos2d"),
    "CIFAR-sized (patch 4, width 192, 6 layers)": dict(
        patch_size=4, width=192, depth=6, num_heads=3, mlp_dim=768),
}


def step_seconds(name: str, reps: int) -> tuple[float, float]:
    """Median seconds of one training step in fp32 and in bf16 autocast."""
    model = create_model("Ti/16", img_size=32, num_classes=10, **MODELS[name])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    images, labels = torch.randn(128, 3, 32, 32), torch.randint(0, 10, (128,))

    def step(bf16: bool) -> None:
        with torch.autocast("cpu", torch.bfloat16, enabled=bf16):
            loss = F.cross_entropy(model(images), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    for bf16 in (False, True, False, True):  # warm-up: kernels chosen, memory allocated
        step(bf16)
    times: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(reps):
        for bf16 in (False, True):
            start = time.perf_counter()
            step(bf16)
            step(bf16)
            times[bf16].append((time.perf_counter() - start) / 2)
    return statistics.median(times[False]), statistics.median(times[True])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    readme_tables.add_flag(parser)
    args = parser.parse_args()
    with readme_tables.recording("amp_step.py", args.write_readme):
        configure_cpu()
        print(cpu_description())
        print(f"{'model':<44}{'fp32 img/s':>12}{'bf16 img/s':>12}{'bf16 / fp32':>13}")
        for name in MODELS:
            fp32, bf16 = step_seconds(name, args.reps)
            print(f"{name:<44}{128 / fp32:>12.0f}{128 / bf16:>12.0f}{fp32 / bf16:>12.2f}x")


if __name__ == "__main__":
    main()
