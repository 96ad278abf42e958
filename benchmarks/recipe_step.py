"""The cifar10 recipe's training step at each of its resolutions, SDPA against the batched
attention kernel, in one process.

The recipe's hybrid pools by mean (no class-token shortcut), so the attention kernel is the
only change between the two rows. Each repetition times a few steps with the kernel off
(`BATCHED_MAX_TOKENS = 0`: SDPA everywhere) and on, in turns, on the same model, optimizer
and batch; medians.

    python benchmarks/recipe_step.py [--reps 5] [--steps 4]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from importlib import resources

import torch
import torch.nn.functional as F

from vitkit import create_model
from vitkit.model import attention
from vitkit.runtime import configure_cpu
from vitkit.train.optim import build_adamw


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--steps", type=int, default=4, help="steps per timed repetition")
    parser.add_argument("--batch-size", type=int, default=128)
    args = parser.parse_args()
    configure_cpu()
    recipe = json.loads(resources.files("vitkit.recipes").joinpath("cifar10.json").read_text())
    settings = dict(recipe["model"])
    model = create_model(settings.pop("variant"), **settings)
    optimizer = build_adamw(model, lr=1e-3, weight_decay=0.05)
    default = attention.BATCHED_MAX_TOKENS
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; cifar10 recipe "
          f"(hybrid, width {model.config.width}, {model.config.num_heads} heads), batch "
          f"{args.batch_size}, AdamW; medians of {args.reps} x {args.steps} steps")
    print(f"{'resolution':<12}{'tokens':>7}{'SDPA img/s':>12}{'batched img/s':>15}{'speed-up':>10}")
    for size in (16, 24, 32):
        model.set_image_size(size)
        images = torch.randn(args.batch_size, 3, size, size)
        labels = torch.randint(0, 10, (args.batch_size,))

        def step(images: torch.Tensor = images, labels: torch.Tensor = labels) -> None:
            F.cross_entropy(model(images), labels).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        step(), step()
        seconds: dict[int, list[float]] = {0: [], default: []}
        for rep in range(args.reps):
            for limit in ((0, default) if rep % 2 == 0 else (default, 0)):
                attention.BATCHED_MAX_TOKENS = limit
                start = time.perf_counter()
                for _ in range(args.steps):
                    step()
                seconds[limit].append((time.perf_counter() - start) / args.steps)
        attention.BATCHED_MAX_TOKENS = default
        sdpa, batched = (args.batch_size / statistics.median(seconds[k]) for k in (0, default))
        tokens = model.config.seq_len
        print(f"{size} px{'':<7}{tokens:>7}{sdpa:>12.0f}{batched:>15.0f}{batched / sdpa:>9.2f}x",
              flush=True)


if __name__ == "__main__":
    main()
