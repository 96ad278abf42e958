"""The training step of vitkit and timm, model for model, measured the way an independent
harness does: one process, plain torch settings (no allocator tuning unless `--runtime`), both
models built with the same architecture and fed the same tensors, the same optimizer
(`torch.optim.AdamW` over all parameters), rounds interleaved in rotating order; medians.

`benchmarks/throughput.py` runs each library in its own worker process instead; this script
is the check that its "model for model" ratio holds when the two share a process and its
settings (docs/speed.md, "Two ways to measure the step").

`--set-threads N` calls `torch.set_num_threads(N)` first, as `throughput.py`'s workers (and
many harnesses' `--threads`) do. That call is not neutral even when N is the default: PyTorch's
`set_num_threads` also turns MKL's dynamic threading off (`mkl_set_dynamic(0)`), and then the
small GEMMs that SDPA's CPU flash-attention kernel calls from inside its OpenMP threads run
slower (the tutorial's attention forward and backward: 22 -> 32 ms on 2 cores). timm's
attention is that kernel; vitkit's CPU training attention (chunked, its matmuls at top level)
is not, so this one setting moves the ratio (docs/speed.md, "Two ways to measure the step").
`MKL_DYNAMIC=FALSE` in the environment does the same without the call.

`--compile` compiles both models with `torch.compile` (default mode, static shapes) before
the warm-up steps, which then include the compile: the model-for-model figure for users who
compile. vitkit's chunked CPU attention is one custom op there, timm's attention is SDPA.

`--processes N` runs the whole measurement in N fresh processes, one after the other, and
prints each one's ratio and their median: on a shared machine the same code moves between
processes by more than within one (docs/speed.md, "Two ways to measure the step").

    python benchmarks/step_one_process.py [--tasks tutorial,train] [--reps 15] [--runtime]
        [--set-threads N] [--compile] [--processes N]
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from vitkit.runtime import cpu_description

sys.path.append(str(Path(__file__).resolve().parent))  # readme_tables, for importers
import readme_tables

# name: (batch, patch, width, depth, heads, classes), 32x32 images, MLP 4 x width
TASKS = {"tutorial": (256, 4, 48, 4, 4, 10), "train": (128, 4, 192, 6, 3, 10)}


def models(task: str) -> dict[str, torch.nn.Module]:
    """vitkit's and timm's ViT of `task`, both with a class token pooled at the end."""
    from timm.models.vision_transformer import VisionTransformer as TimmViT

    from vitkit import create_model

    _, patch, width, depth, heads, classes = TASKS[task]
    torch.manual_seed(0)
    vitkit = create_model(f"Ti/{patch}", img_size=32, patch_size=patch, width=width,
                          depth=depth, num_heads=heads, mlp_dim=4 * width, num_classes=classes)
    timm = TimmViT(img_size=32, patch_size=patch, embed_dim=width, depth=depth, num_heads=heads,
                   mlp_ratio=4.0, num_classes=classes)
    return {"vitkit": vitkit, "timm": timm}


def step(model: torch.nn.Module, images: torch.Tensor, labels: torch.Tensor
         ) -> Callable[[], None]:
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)

    def run() -> None:
        loss = torch.nn.functional.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return run


def measure(task: str, reps: int, iters: int, compile: bool = False) -> dict[str, float]:
    batch, *_, classes = TASKS[task]
    generator = torch.Generator().manual_seed(0)
    images = torch.randn(batch, 3, 32, 32, generator=generator)
    labels = torch.randint(0, classes, (batch,), generator=generator)
    built = models(task)
    if compile:
        built = {name: torch.compile(model, dynamic=False) for name, model in built.items()}
    runs = {name: step(model, images, labels) for name, model in built.items()}
    for run in runs.values():
        run(), run()  # warm-up
    times: dict[str, list[float]] = {name: [] for name in runs}
    order = list(runs)
    for rep in range(reps):
        for name in order[rep % 2:] + order[:rep % 2]:
            start = time.perf_counter()
            for _ in range(iters):
                runs[name]()
            times[name].append((time.perf_counter() - start) / iters)
    return {name: statistics.median(values) for name, values in times.items()}


def _without_processes(argv: list[str]) -> list[str]:
    """`argv` less its --processes option (as "--processes N" or "--processes=N") and less
    --write-readme (the parent writes the table of all the processes)."""
    kept, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--processes":
            skip = True
        elif not arg.startswith("--processes=") and arg != readme_tables.FLAG:
            kept.append(arg)
    return kept


def in_processes(count: int, argv: list[str]) -> None:
    """Run this script with `argv` in `count` fresh processes in turn; print each process's
    ratio per task and the median."""
    ratios: dict[str, list[float]] = {}
    for index in range(count):
        lines = subprocess.run([sys.executable, __file__, *argv], check=True, text=True,
                               capture_output=True).stdout.splitlines()
        if index == 0:
            print(*lines[:2], sep="\n", flush=True)  # the CPU and the settings
        for line in lines:
            match = re.match(r"(\w+) .* vitkit/timm ([\d.]+)x", line)
            if match:
                ratios.setdefault(match[1], []).append(float(match[2]))
                print(f"process {index + 1}: {line}", flush=True)
    for task, values in ratios.items():
        print(f"{task:<9} vitkit/timm in {len(values)} processes: "
              f"{', '.join(f'{v:.2f}x' for v in sorted(values))}; median "
              f"{statistics.median(values):.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", default="tutorial,train")
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--iters", type=int, default=3)
    parser.add_argument("--runtime", action="store_true",
                        help="apply vitkit's process setting (vitkit.runtime.configure_cpu) "
                             "first: it then holds for both models")
    parser.add_argument("--set-threads", type=int, metavar="N",
                        help="call torch.set_num_threads(N) first (which also turns MKL's "
                             "dynamic threading off)")
    parser.add_argument("--compile", action="store_true",
                        help="torch.compile both models (default mode, static shapes) first")
    parser.add_argument("--processes", type=int, default=1, metavar="N",
                        help="repeat the measurement in N fresh processes, one after the other")
    readme_tables.add_flag(parser)
    args = parser.parse_args()
    name = "step_one_process.py" + "".join(f" --{flag.replace('_', '-')}" for flag in
                                           ("runtime", "set_threads", "compile")
                                           if getattr(args, flag))
    with readme_tables.recording(name, args.write_readme):
        if args.processes > 1:
            in_processes(args.processes, _without_processes(sys.argv[1:]))
            return
        if args.set_threads:
            torch.set_num_threads(args.set_threads)
        print(cpu_description(), flush=True)
        if args.runtime:
            from vitkit.runtime import configure_cpu

            configure_cpu()
        print(f"one process, {torch.get_num_threads()} threads, "
              f"{'vitkit runtime' if args.runtime else 'plain settings'}"
              f"{', torch.set_num_threads called' if args.set_threads else ''}"
              f"{', both models compiled' if args.compile else ''}, "
              "torch.optim.AdamW for "
              f"both, medians of {args.reps} interleaved rounds of {args.iters} steps")
        for task in args.tasks.split(","):
            seconds = measure(task, args.reps, args.iters, args.compile)
            batch = TASKS[task][0]
            ours, theirs = seconds["vitkit"], seconds["timm"]
            print(f"{task:<9} vitkit {ours * 1e3:7.1f} ms ({batch / ours:6.0f} img/s)  timm "
                  f"{theirs * 1e3:7.1f} ms  vitkit/timm {theirs / ours:.2f}x", flush=True)


if __name__ == "__main__":
    main()
