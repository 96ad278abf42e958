"""Training beside another process: the thread count vitkit chooses against `threads=1` and
`threads=2` forced, on idle cores and with a busy loop pinned on one core.

Two workloads, each measured on idle cores and then beside the busy loop:
- the README's `vitkit train` (the digits recipe, run to its end) in a fresh process per
  setting: its wall time from start to exit, at the default threads and at `threads=1`;
- the training step of the cifar10-tutorial and cifar10 recipes' models (batch 128, AdamW,
  32x32 random images) in this process, in interleaved rounds of the three settings:
  "default" is `vitkit.cores.choose_threads()`'s choice, re-measured each round as training
  re-checks it.

The busy loop is a Python process spinning on the last core the machine lets this one run on
(`os.sched_setaffinity`). OMP_NUM_THREADS is removed from the environment, so that "default"
is vitkit's own choice. Linux only (the busy loop's affinity and /proc/stat).

    python benchmarks/contention.py [--rounds 3] [--steps 4] [--skip-readme] [--write-readme]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from vitkit.cores import choose_threads
from vitkit.model.vit import VisionTransformer
from vitkit.runtime import cpu_description, set_threads
from vitkit.train.config import TrainConfig
from vitkit.train.recipe import recipe_with_overrides

sys.path.append(str(Path(__file__).resolve().parent))
import readme_tables

SETTINGS = ("default", "threads=1", "threads=2")
RECIPES = ("cifar10-tutorial", "cifar10")  # their models: width 48 and 192
BUSY_LOOP = "while True: pass"
# The spinner forks away from its parent, which exits, so that it is no child of this process
# (vitkit counts its own child processes' time as its own: DataLoader workers), and prints
# its process id.
SPINNER = """import os, sys
if os.fork():
    sys.exit()
os.sched_setaffinity(0, {{{core}}})
print(os.getpid(), flush=True)
""" + BUSY_LOOP


@contextmanager
def busy_core(enabled: bool) -> Iterator[int | None]:
    """Another process spinning on the last allowed core while the body runs (None: none)."""
    if not enabled:
        yield None
        return
    core = max(os.sched_getaffinity(0))
    launcher = subprocess.Popen([sys.executable, "-c", SPINNER.format(core=core)],
                                stdout=subprocess.PIPE, text=True)
    pid = int(launcher.stdout.readline())
    launcher.wait()
    time.sleep(1.0)  # running, and seen in /proc/stat
    try:
        yield core
    finally:
        os.kill(pid, signal.SIGKILL)


def recipe_step(recipe: str, steps: int, rounds: int) -> dict[str, float]:
    """Median seconds per step of `recipe`'s model at batch 128, per setting, the settings
    interleaved round by round (each round: one warm-up step, then `steps` timed)."""
    config = TrainConfig.from_dict(recipe_with_overrides(recipe, [])).model_config()
    torch.manual_seed(0)
    model = VisionTransformer(config).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(128, config.in_chans, *config.img_size)
    y = torch.randint(0, config.num_classes, (128,))
    default_threads = torch.get_num_threads()
    times: dict[str, list[float]] = {name: [] for name in SETTINGS}
    chosen: list[int] = []

    def step() -> None:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(rounds):
        for name in SETTINGS:
            set_threads(default_threads)
            if name == "default":
                chosen.append(choose_threads(what="training").threads)
            else:
                set_threads(int(name.split("=")[1]))
            step()
            for _ in range(steps):
                start = time.perf_counter()
                step()
                times[name].append(time.perf_counter() - start)
    set_threads(default_threads)
    result = {name: statistics.median(values) for name, values in times.items()}
    result["default threads"] = statistics.median(chosen)
    return result


def readme_train(threads: int | None) -> float:
    """Wall seconds of the README's `vitkit train` in a fresh process (`threads=N` when given)."""
    with tempfile.TemporaryDirectory(prefix="vitkit-contention-") as folder:
        argv = [sys.executable, "-m", "vitkit", "train", "--out", str(Path(folder) / "run"),
                "progress=false"]
        if threads:
            argv.append(f"threads={threads}")
        start = time.perf_counter()
        subprocess.run(argv, check=True, capture_output=True, env=environment())
        return time.perf_counter() - start


def environment() -> dict[str, str]:
    return {key: value for key, value in os.environ.items() if key != "OMP_NUM_THREADS"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds of the step")
    parser.add_argument("--steps", type=int, default=4, help="timed steps per setting and round")
    parser.add_argument("--skip-readme", action="store_true",
                        help="leave out the README's `vitkit train` runs (about 5 minutes)")
    readme_tables.add_flag(parser)
    args = parser.parse_args(argv)
    os.environ.pop("OMP_NUM_THREADS", None)
    if len(os.sched_getaffinity(0)) < 2:
        parser.error("a busy core beside training needs at least 2 cores")
    with readme_tables.recording("contention.py", args.write_readme, argv=argv):
        print(cpu_description())
        print(f"busy loop: `python -c '{BUSY_LOOP}'` pinned on core "
              f"{max(os.sched_getaffinity(0))}\n")
        print("A training step at batch 128 on 32x32 images (median s/step; `default` is "
              "vitkit's choice, its thread count in brackets)\n")
        print("| model | cores | default | threads=1 | threads=2 | default / threads=1 |")
        print("|---|---|---|---|---|---|")
        for recipe in RECIPES:
            for busy in (False, True):
                with busy_core(busy):
                    row = recipe_step(recipe, args.steps, args.rounds)
                print(f"| {recipe} | {'one busy' if busy else 'idle'} | {row['default']:.3f} "
                      f"({row['default threads']:.0f}) | {row['threads=1']:.3f} | "
                      f"{row['threads=2']:.3f} | {row['default'] / row['threads=1']:.2f} |",
                      flush=True)
        if not args.skip_readme:
            print("\nThe README's `vitkit train` (digits recipe, to its end; wall seconds)\n")
            print("| cores | default | threads=1 | default / threads=1 |")
            print("|---|---|---|---|")
            for busy in (False, True):
                with busy_core(busy):
                    default, one = readme_train(None), readme_train(1)
                print(f"| {'one busy' if busy else 'idle'} | {default:.1f} | {one:.1f} | "
                      f"{default / one:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
