"""Where vitkit's training-step speed comes from: the same model, optimizer and batch with
each of vitkit's step optimisations off and on, added one at a time, in one process.

"full forward, SDPA" is the computation timm runs (every token through every block, torch's
fused attention kernel); "class-token shortcut" runs the last block for the class token alone
(`VisionTransformer.forward`); "chunked attention" computes the other blocks' attention with
`vitkit.model.chunked_attention` in its plain layout, "transposed products" in its layout
for heads narrower than 16 (both vitkit's defaults for CPU training; each applies only where
its rule says, so on the "cifar" task, head dim 64, neither changes anything). The
configurations are timed in rotating order; medians. The task "recipe" is the `cifar10`
recipe's model (hybrid conv stem, mean pooling: no class token, so no shortcut) at 32 px,
batch 128. `--plain` leaves the process settings as they are (as an independent harness does)
instead of `configure_cpu`.

    python benchmarks/step_ablation.py [--task tutorial|cifar|recipe] [--reps 31] [--steps 1]
        [--plain]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import vitkit.model.chunked_attention
import vitkit.model.layers
from vitkit import VisionTransformer, create_model
from vitkit.model.chunked_attention import TRANSPOSED_BELOW, use_chunked_attention
from vitkit.runtime import configure_cpu, cpu_description
from vitkit.train.config import load_train_config
from vitkit.train.optim import build_adamw

sys.path.append(str(Path(__file__).resolve().parent))  # readme_tables, for importers
import readme_tables

TASKS = {  # name: (create_model settings, batch size)
    "tutorial": (dict(img_size=32, patch_size=4, width=48, depth=4, num_heads=4, mlp_dim=192,
                      num_classes=10), 256),
    "cifar": (dict(img_size=32, patch_size=4, width=192, depth=6, num_heads=3, mlp_dim=768,
                   num_classes=10), 128),
    "recipe": ("cifar10", 128),
}
CONFIGS = {  # label: (class-token shortcut, chunked attention, transposed products)
    "full forward, SDPA (timm's)": (False, False, False),
    "+ class-token shortcut": (True, False, False),
    "+ chunked attention": (True, True, False),
    "+ transposed products (vitkit)": (True, True, True),
}


def build(task: str) -> tuple[VisionTransformer, int]:
    settings, batch = TASKS[task]
    if isinstance(settings, str):  # a shipped recipe's model
        return VisionTransformer(load_train_config(settings).model_config()), batch
    return create_model("Ti/4", **settings), batch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", choices=list(TASKS), default="tutorial")
    parser.add_argument("--reps", type=int, default=31)
    parser.add_argument("--steps", type=int, default=1, help="steps per timed repetition")
    parser.add_argument("--plain", action="store_true",
                        help="plain process settings (no configure_cpu), as a harness has them")
    readme_tables.add_flag(parser)
    args = parser.parse_args()
    name = f"step_ablation.py --task {args.task}" + (" --plain" if args.plain else "")
    with readme_tables.recording(name, args.write_readme):
        if not args.plain:
            configure_cpu()
        print(cpu_description(), flush=True)
        torch.manual_seed(0)
        model, batch = build(args.task)
        optimizer = build_adamw(model, lr=1e-3, weight_decay=0.05)
        images = torch.randn(batch, 3, *model.config.img_size)
        labels = torch.randint(0, model.config.num_classes, (batch,))
        shortcut = model.pools_class_token_only

        def configure(setting: tuple[bool, bool, bool]) -> None:
            use_shortcut, use_chunked, use_transposed = setting
            model.pools_class_token_only = shortcut if use_shortcut else (lambda: False)
            vitkit.model.layers.use_chunked_attention = use_chunked_attention if use_chunked \
                else (lambda qkv, num_heads, dropout, training=True: False)
            vitkit.model.chunked_attention.TRANSPOSED_BELOW = TRANSPOSED_BELOW if use_transposed \
                else 0

        def step() -> None:
            F.cross_entropy(model(images), labels).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        for setting in CONFIGS.values():
            configure(setting)
            step()
        seconds: dict[str, list[float]] = {label: [] for label in CONFIGS}
        labels_in_order = list(CONFIGS)
        for rep in range(args.reps):
            shift = rep % len(labels_in_order)
            for label in labels_in_order[shift:] + labels_in_order[:shift]:
                configure(CONFIGS[label])
                start = time.perf_counter()
                for _ in range(args.steps):
                    step()
                seconds[label].append((time.perf_counter() - start) / args.steps)
        configure((True, True, True))
        base = statistics.median(seconds[labels_in_order[0]])
        print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; {args.task} step, "
              f"batch {batch}, {model.config.seq_len} tokens, class-token pool: "
              f"{shortcut()}; {'plain settings' if args.plain else 'configure_cpu'}; medians of "
              f"{args.reps} x {args.steps} steps, rotating")
        print(f"{'configuration':<36}{'ms/step':>9}{'images/s':>10}{'speed-up':>10}")
        for label, values in seconds.items():
            median = statistics.median(values)
            print(f"{label:<36}{1e3 * median:>9.1f}{batch / median:>10.0f}{base / median:>9.2f}x")


if __name__ == "__main__":
    main()
