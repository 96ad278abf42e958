"""Images/s of vitkit, timm and Hugging Face in one run, with ratios and MFU.

Each library runs in its own worker process (so one library's process settings never leak
into another's), all with the same thread count. The parent asks the workers for one timed
repetition at a time, in rotating order, so slow phases of a noisy machine hit every library
alike, and reports medians; it times this machine's fp32 matmul peak before and between the
rounds and keeps the best, the denominator of MFU.

Tasks:
  infer     ViT-B/16 inference at 224, batch 8 (1000 classes)
  train     CIFAR-sized training step: patch 4, width 192, depth 6, 3 heads, MLP 768,
            32x32 images, batch 128, cross-entropy, AdamW (each library's usual optimizer)
  tutorial  the tutorial's training step: patch 4, width 48, depth 4, 4 heads, MLP 192,
            32x32 images, 10 classes, batch 256, AdamW

vitkit runs as its training and evaluation commands run it (`vitkit.runtime.configure_cpu`:
freed activation memory stays in the process). The row "timm + vitkit runtime" gives timm the
same process setting; the column "model for model" divides by that row, so it compares the
models alone. The "+ compile" rows run the model under `torch.compile` (inductor, static
shapes, as `vitkit train compile=true` does), vitkit and timm alike, both with the vitkit
runtime; each compiled row's first call (compilation) is timed apart from the medians and
printed below the table.

`--processes N` repeats the whole measurement with N fresh sets of workers, one after the
other, prints each table, and ends with each row's "model for model" ratio in every set and
their median: on a shared machine the same code moves between processes by more than within
one (as `benchmarks/step_one_process.py --processes`).

    python benchmarks/throughput.py [--reps 7] [--threads 2] [--tasks infer,train,tutorial]
        [--libraries vitkit,timm,hf,timm+runtime,vitkit+compile,timm+compile] [--processes N]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from vitkit.inference.benchmark.peak import MatmulPeak, timed
from vitkit.runtime import cpu_description, set_threads

sys.path.append(str(Path(__file__).resolve().parent))  # readme_tables, for importers
import readme_tables

LIBRARIES = ("vitkit", "timm", "hf", "timm+runtime")
COMPILED = ("vitkit+compile", "timm+compile")  # opt-in: each compiles for tens of seconds
LABELS = {"vitkit": "vitkit", "timm": "timm", "hf": "Hugging Face",
          "timm+runtime": "timm + vitkit runtime", "vitkit+compile": "vitkit + compile",
          "timm+compile": "timm + compile"}
# The "model for model" baseline of each row: the other library with the same settings.
SAME_SETTINGS = {"vitkit": "timm+runtime", "timm+runtime": "timm+runtime", "hf": "timm",
                 "timm": "timm", "vitkit+compile": "timm+compile",
                 "timm+compile": "timm+compile"}


@dataclass(frozen=True)
class Task:
    name: str
    title: str
    batch: int
    iters: int  # timed iterations per repetition
    train: bool
    img: int
    patch: int
    width: int
    depth: int
    heads: int
    classes: int


TASKS = {
    "infer": Task("infer", "ViT-B/16 inference, 224px, batch 8", 8, 2, False, 224, 16, 768, 12,
                  12, 1000),
    "train": Task("train", "CIFAR-sized training step (P4, D192, L6, 3 heads), batch 128", 128, 2,
                  True, 32, 4, 192, 6, 3, 10),
    "tutorial": Task("tutorial", "Tutorial training step (P4, D48, L4, 4 heads), batch 256", 256,
                     3, True, 32, 4, 48, 4, 4, 10),
}


def task_flops(task: Task) -> float:
    """Matmul FLOPs of one batch (training = forward + backward = 3x forward)."""
    from vitkit.config import ViTConfig
    from vitkit.summary import forward_flops

    config = ViTConfig(img_size=task.img, patch_size=task.patch, width=task.width,
                       depth=task.depth, num_heads=task.heads, mlp_dim=4 * task.width,
                       num_classes=task.classes)
    return forward_flops(config) * task.batch * (3 if task.train else 1)


def build(library: str, task: Task):
    """A zero-argument callable that runs one batch of `task` with `library`."""
    torch.manual_seed(0)
    kind = library.split("+")[0]
    if kind == "vitkit":
        from vitkit import create_model
        from vitkit.train.optim import build_adamw

        model = create_model(f"Ti/{task.patch}", img_size=task.img, patch_size=task.patch,
                             width=task.width, depth=task.depth, num_heads=task.heads,
                             mlp_dim=4 * task.width, num_classes=task.classes)
        make_opt = lambda m: build_adamw(m, lr=1e-3, weight_decay=0.05)  # noqa: E731
        forward = model
    elif kind == "timm":
        from timm.models.vision_transformer import VisionTransformer
        from timm.optim import create_optimizer_v2

        model = VisionTransformer(img_size=task.img, patch_size=task.patch,
                                  embed_dim=task.width, depth=task.depth, num_heads=task.heads,
                                  num_classes=task.classes)
        make_opt = lambda m: create_optimizer_v2(m, "adamw", lr=1e-3,  # noqa: E731
                                                 weight_decay=0.05)
        forward = model
    else:
        from transformers import ViTConfig, ViTForImageClassification

        config = ViTConfig(image_size=task.img, patch_size=task.patch, hidden_size=task.width,
                           num_hidden_layers=task.depth, num_attention_heads=task.heads,
                           intermediate_size=4 * task.width, num_labels=task.classes)
        model = ViTForImageClassification(config)
        make_opt = lambda m: torch.optim.AdamW(m.parameters(), lr=1e-3,  # noqa: E731
                                               weight_decay=0.05)
        forward = lambda x: model(pixel_values=x).logits  # noqa: E731
    if library.endswith("+compile"):
        forward = torch.compile(model, dynamic=False)

    images = torch.randn(task.batch, 3, task.img, task.img)
    labels = torch.randint(0, task.classes, (task.batch,))
    if not task.train:
        model.eval()

        def infer() -> None:
            with torch.inference_mode():
                forward(images)
        return infer

    model.train()
    optimizer = make_opt(model)

    def train_step() -> None:
        loss = torch.nn.functional.cross_entropy(forward(images), labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return train_step


def worker(library: str, threads: int, conn) -> None:
    """Serve ('setup', task) / ('time', None) / ('stop', None) requests from the parent."""
    set_threads(threads)  # a no-op at the default count: MKL's dynamic threading stays on
    if library != "timm" and library != "hf":
        from vitkit.runtime import configure_cpu
        configure_cpu(threads)
    run, task = None, None
    while True:
        command, arg = conn.recv()
        if command == "setup":
            task = TASKS[arg]
            run = build(library, task)
            first = timed(run)  # compiles, for the compiled rows
            run()
            conn.send(first)
        elif command == "time":
            start = time.perf_counter()
            for _ in range(task.iters):
                run()
            conn.send((time.perf_counter() - start) / task.iters)
        else:
            conn.send("bye")
            return


def time_task(task: Task, pipes: dict, reps: int, peak: MatmulPeak
              ) -> tuple[dict[str, list[float]], dict[str, float]]:
    """Seconds per batch of each library: `reps` rounds in rotating order, the peak sampled
    after each round; and each library's first-call seconds (compilation for compiled rows)."""
    for conn in pipes.values():
        conn.send(("setup", task.name))
    first = {lib: conn.recv() for lib, conn in pipes.items()}
    times: dict[str, list[float]] = {lib: [] for lib in pipes}
    order = list(pipes)
    for rep in range(reps):
        for lib in order[rep % len(order):] + order[:rep % len(order)]:
            pipes[lib].send(("time", None))
            times[lib].append(pipes[lib].recv())
        peak.sample(2)
    return times, first


def _ratio(times: dict[str, list[float]], base: str, med: float) -> str:
    return f"{statistics.median(times[base]) / med:.2f}x" if base in times else "-"


def report(task: Task, times: dict[str, list[float]], first: dict[str, float],
           peak_gflops: float) -> list[str]:
    """The task's table: ms and images per batch, speed vs timm, vs the same settings ("model
    for model"), MFU; then the compiled rows' first-call (compile) seconds."""
    flops = task_flops(task)
    reps = len(next(iter(times.values())))
    lines = [f"{task.title} -- median of {reps} interleaved repetitions",
             f"{'library':<24}{'ms/batch':>10}{'images/s':>10}{'vs timm':>9}"
             f"{'model for model':>17}{'MFU':>7}"]
    for lib, samples in times.items():
        med = statistics.median(samples)
        model_for_model = _ratio(times, SAME_SETTINGS[lib], med)
        lines.append(f"{LABELS[lib]:<24}{med * 1e3:>10.1f}{task.batch / med:>10.1f}"
                     f"{_ratio(times, 'timm', med):>9}{model_for_model:>17}"
                     f"{flops / med / 1e9 / peak_gflops:>7.0%}")
    lines.append("model for model: each row vs the row with its settings: " + "; ".join(
        f"{LABELS[lib]} vs {LABELS[SAME_SETTINGS[lib]]}" for lib in times
        if lib != SAME_SETTINGS[lib]))
    compiled = [f"{LABELS[lib]} {first[lib]:.1f} s" for lib in times if lib.endswith("compile")]
    if compiled:
        lines.append("first call (compilation, not in the medians): " + ", ".join(compiled))
    return lines


Timings = dict[str, tuple[dict[str, list[float]], dict[str, float]]]


def measure(libraries: list[str], tasks: list[str], threads: int, reps: int,
            peak: MatmulPeak) -> Timings:
    """Each task's per-library seconds and first-call seconds, from a fresh worker process per
    library (stopped at the end)."""
    ctx = mp.get_context("spawn")
    pipes, procs = {}, []
    for lib in libraries:
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=worker, args=(lib, threads, child), daemon=True)
        proc.start()
        pipes[lib], procs = parent, [*procs, proc]
    try:
        return {name: time_task(TASKS[name], pipes, reps, peak) for name in tasks}
    finally:
        for conn in pipes.values():
            conn.send(("stop", None))
        for proc in procs:
            proc.join(timeout=30)


def model_for_model(times: dict[str, list[float]]) -> dict[str, float]:
    """Each row's speed over the row with its settings, for the rows that have one."""
    return {lib: statistics.median(times[SAME_SETTINGS[lib]]) / statistics.median(samples)
            for lib, samples in times.items()
            if SAME_SETTINGS[lib] != lib and SAME_SETTINGS[lib] in times}


def summary(runs: list[Timings]) -> list[str]:
    """Per task and row: the "model for model" ratio of each set of workers and the median."""
    lines = []
    for task in runs[0]:
        ratios: dict[str, list[float]] = {}
        for timings in runs:
            for lib, ratio in model_for_model(timings[task][0]).items():
                ratios.setdefault(lib, []).append(ratio)
        for lib, values in ratios.items():
            lines.append(f"{task:<9} {LABELS[lib]} vs {LABELS[SAME_SETTINGS[lib]]} in "
                         f"{len(values)} sets of workers: "
                         f"{', '.join(f'{v:.2f}x' for v in sorted(values))}; median "
                         f"{statistics.median(values):.2f}x")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--tasks", default="infer,train")
    parser.add_argument("--libraries", default=",".join(LIBRARIES))
    parser.add_argument("--processes", type=int, default=1, metavar="N",
                        help="repeat the measurement with N fresh sets of worker processes")
    readme_tables.add_flag(parser)
    args = parser.parse_args()
    with readme_tables.recording("throughput.py", args.write_readme):
        set_threads(args.threads)
        print(cpu_description(), flush=True)
        peak = MatmulPeak(args.threads)
        peak.sample(10)
        runs = []
        for index in range(args.processes):
            timings = measure(args.libraries.split(","), args.tasks.split(","), args.threads,
                              args.reps, peak)
            runs.append(timings)
            heading = (f"set of workers {index + 1} of {args.processes}: "
                       if args.processes > 1 else "")
            print(f"{heading}torch {torch.__version__}, {args.threads} threads, fp32 matmul peak "
                  f"{peak.gflops:.0f} GFLOP/s (2048x2048, best of {peak.samples} timed before and "
                  "between the repetitions); MFU = matmul FLOPs / time / peak\n")
            for name, (times, first) in timings.items():
                print("\n".join(report(TASKS[name], times, first, peak.gflops)), "\n", flush=True)
        if args.processes > 1:
            print("\n".join(summary(runs)), flush=True)


if __name__ == "__main__":
    main()
