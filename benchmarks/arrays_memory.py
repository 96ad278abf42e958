"""Peak memory of training on memory-mapped scientific arrays (`data=arrays data_mode=stream`):
a set 10x the size of another should peak within ~100 MB of it.

1. Writes (once, cached under --root, never inside the repository) two single-channel 64x64
   float32 sets, --small and --large samples (default 2,000 and 20,000: 33 MB and 328 MB of
   images), each twice: ROOT/<n>-npz/{train,test}.npz written with numpy.savez (uncompressed
   members, read in place) and ROOT/<n>-npy/{train,test}/{images,targets}.npy. Targets are
   integer classes (10 bins of the field's mean).
2. Trains each in a fresh process for --steps steps (default: one epoch of the large set, so
   every sample of both sets is read at least once) and reports that process's peak RSS
   (VmHWM: its own high-water mark; getrusage's ru_maxrss would carry over the forking
   parent's); a control run reads the large set into memory instead. --via loop (default)
   drives a short training loop here: vitkit's MappedArrays feed (`training_feed`),
   normalised with the training set's `channel_stats`, a tiny VisionTransformer,
   cross-entropy and AdamW. --via cli runs `vitkit train` instead (needs a
   training side that takes float arrays). The memory under test is the data path's: the
   model and its classification targets are the same for both sizes.

    python benchmarks/arrays_memory.py                      # ~1 GB of files, a few minutes
    python benchmarks/arrays_memory.py --small 500 --large 5000 --steps 80   # a quick check
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.append(str(Path(__file__).resolve().parent))  # readme_tables, for importers
import readme_tables

TARGET_MB = 100
SIZE = 64
MODEL = {"width": 32, "depth": 2, "num_heads": 2, "mlp_dim": 64, "patch_size": 8,
         "img_size": [SIZE, SIZE], "in_chans": 1, "num_classes": 10}


def cpu_line() -> str:
    """The CPU, its cores and speed-relevant instruction sets, torch (vitkit.runtime's one
    line, as every benchmark prints it) and numpy."""
    from vitkit.runtime import cpu_description

    return f"{cpu_description()}, numpy {np.__version__}"


# -- 1. the sets --------------------------------------------------------------------------------
def _fields(count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    images = rng.standard_normal((count, SIZE, SIZE), dtype=np.float32)
    images += rng.normal(0, 1, size=(count, 1, 1)).astype(np.float32)
    targets = np.digitize(images.mean(axis=(1, 2)), np.linspace(-1.5, 1.5, 9))
    return images, targets.astype(np.int64)


def write_sets(root: Path, count: int, held_out: int) -> dict[str, Path]:
    """ROOT/<count>-npz and ROOT/<count>-npy, written unless present."""
    folders = {"npz": root / f"{count}-npz", "npy": root / f"{count}-npy"}
    if all((folder / "done").is_file() for folder in folders.values()):
        return folders
    images, targets = _fields(count + held_out, seed=count)
    splits = {"train": slice(0, count), "test": slice(count, count + held_out)}
    for layout, folder in folders.items():
        folder.mkdir(parents=True, exist_ok=True)
        for split, part in splits.items():
            if layout == "npz":
                np.savez(folder / f"{split}.npz", images=images[part], targets=targets[part])
            else:
                (folder / split).mkdir(exist_ok=True)
                np.save(folder / split / "images.npy", images[part])
                np.save(folder / split / "targets.npy", targets[part])
        (folder / "done").write_text("")
    return folders


# -- 2. a training process ----------------------------------------------------------------------
def _own_peak() -> tuple[int, int]:
    """(VmHWM, VmRSS) of this process, bytes."""
    values = {}
    with open("/proc/self/status") as status:
        for line in status:
            key, _, rest = line.partition(":")
            if key in ("VmHWM", "VmRSS"):
                values[key] = int(rest.split()[0]) * 1024
    return values["VmHWM"], values["VmRSS"]


def train_loop(data_dir: str, steps: int, batch: int, mode: str = "stream") -> dict:
    """`steps` training steps on data=arrays data_mode=`mode`, through vitkit's feed."""
    import torch
    import torch.nn.functional as F

    from vitkit.config import ViTConfig
    from vitkit.data.feeds import training_feed
    from vitkit.data.loader import BatchOrder
    from vitkit.data.sources import open_source
    from vitkit.model import VisionTransformer
    from vitkit.preprocess import normalize

    torch.manual_seed(0)
    train, _ = open_source("arrays", data_dir, (SIZE, SIZE), 1, mode=mode)
    kind = type(train).__name__
    mean, std = train.channel_stats()
    order = BatchOrder(len(train), batch, seed=0)
    feed = training_feed(train, order, None, 1, (SIZE, SIZE), seed=0)
    model = VisionTransformer(ViTConfig(**MODEL))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    done, epoch, losses = 0, 0, []
    while done < steps:
        for _, images, labels in feed.epoch(epoch):
            loss = F.cross_entropy(model(normalize(images, mean, std, 1.0)), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(float(loss))
            done += 1
            if done == steps:
                break
        epoch += 1
    return {"records": kind, "samples": len(train), "steps": done,
            "epochs": done / order.batches_per_epoch(),
            "loss_first": float(np.mean(losses[:10])), "loss_last": float(np.mean(losses[-10:]))}


def train_cli(data_dir: str, steps: int, batch: int, out: Path) -> dict:
    from vitkit.cli import main

    out.mkdir(parents=True, exist_ok=True)
    recipe = out / "recipe.json"
    recipe.write_text(json.dumps({"model": MODEL, "data": "arrays", "data_dir": data_dir,
                                  "data_mode": "stream", "batch_size": batch,
                                  "total_steps": steps, "warmup_steps": 2, "progress": False,
                                  "out_dir": str(out / "run"), "test_limit": 2 * batch}))
    code = main(["train", str(recipe), "--overwrite"])
    if code:
        raise SystemExit(f"vitkit train failed ({code})")
    return {"records": "vitkit train", "steps": steps}


def child(args: argparse.Namespace) -> None:
    start = time.perf_counter()
    if args.via == "cli":
        result = train_cli(args.child, args.steps, args.batch, Path(args.child + "-run"))
    else:
        result = train_loop(args.child, args.steps, args.batch, args.mode)
    peak, now = _own_peak()
    print(json.dumps({**result, "peak": peak, "rss_end": now,
                      "seconds": time.perf_counter() - start}))


def measure(folder: Path, args: argparse.Namespace, mode: str = "stream") -> dict:
    import vitkit

    source = str(Path(vitkit.__file__).resolve().parents[1])  # the vitkit this script imports
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (source, os.environ.get("PYTHONPATH")) if p)}
    command = [sys.executable, __file__, "--child", str(folder), "--steps", str(args.steps),
               "--batch", str(args.batch), "--via", args.via, "--mode", mode]
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode:
        raise SystemExit(f"training on {folder} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _mb(value: float) -> str:
    return f"{value / 1024**2:,.0f} MB"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path("/tmp/vitkit-bench-arrays"),
                        help="where the generated sets are kept (outside the repository)")
    parser.add_argument("--small", type=int, default=2_000, help="samples of the small set")
    parser.add_argument("--large", type=int, default=20_000, help="samples of the large set")
    parser.add_argument("--held-out", type=int, default=256, help="held-out samples of each")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, help="training steps of every run (default: one "
                        "epoch of the large set)")
    parser.add_argument("--via", choices=("loop", "cli"), default="loop",
                        help="loop: vitkit's feed + a tiny ViT trained here; cli: vitkit train")
    parser.add_argument("--no-control", action="store_true", help="skip the control run: "
                        "the large set read into memory (data_mode=memory)")
    parser.add_argument("--mode", default="stream", help=argparse.SUPPRESS)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    readme_tables.add_flag(parser)
    args = parser.parse_args(argv)
    if args.child:
        child(args)
        return 0
    name = "arrays_memory.py" + (" --via cli" if args.via == "cli" else "")
    with readme_tables.recording(name, args.write_readme, argv=argv):
        args.steps = args.steps or args.large // args.batch
        root = args.root.resolve()
        if Path(__file__).resolve().parent.parent in [root, *root.parents]:
            parser.error(f"--root {root} is inside the repository: pick a folder outside it")
        print(cpu_line(), flush=True)
        image_mb = SIZE * SIZE * 4 / 1024**2
        print(f"sets: {args.small:,} and {args.large:,} single-channel {SIZE}x{SIZE} float32 "
              f"fields ({args.small * image_mb:,.0f} MB and {args.large * image_mb:,.0f} MB of "
              f"images), each as numpy.savez .npz and as a .npy folder, in {root}", flush=True)
        folders = {count: write_sets(root, count, args.held_out) for count in
                   (args.small, args.large)}
        print(f"training: {args.steps} steps of batch {args.batch} (one epoch of the large set; "
              f"{args.steps * args.batch / args.small:.0f} epochs of the small one), data_mode="
              f"stream, {'vitkit train' if args.via == 'cli' else 'vitkit feed + tiny ViT loop'}, "
              "integer class targets (the memory measured is the data path's)\n", flush=True)
        print(f"{'layout':<8}{'samples':>9}{'records':>15}{'peak RSS':>11}{'RSS at end':>12}"
              f"{'seconds':>9}  loss first -> last 10 steps")
        verdicts = []
        for layout in ("npz", "npy"):
            runs = {}
            for count in (args.small, args.large):
                runs[count] = run = measure(folders[count][layout], args)
                losses = (f"{run['loss_first']:.3f} -> {run['loss_last']:.3f}"
                          if "loss_first" in run else "")
                print(f"{layout:<8}{count:>9,}{run['records']:>15}{_mb(run['peak']):>11}"
                      f"{_mb(run['rss_end']):>12}{run['seconds']:>9.1f}  {losses}", flush=True)
            growth = runs[args.large]["peak"] - runs[args.small]["peak"]
            ok = abs(growth) < TARGET_MB * 1024**2
            verdicts.append(ok)
            print(f"{layout:<8}{'10x':>9}{'difference':>15}{_mb(growth):>11}   target < "
                  f"{TARGET_MB} MB: {'PASS' if ok else 'FAIL'}", flush=True)
        if not args.no_control and args.via == "loop":
            run = measure(folders[args.large]["npy"], args, mode="memory")
            print(f"control: the {args.large:,}-sample .npy set read into memory "
                  f"(data_mode=memory, {run['records']}) peaks at {_mb(run['peak'])}: the "
                  "measure sees the data")
        return 0 if all(verdicts) else 1


if __name__ == "__main__":
    raise SystemExit(main())
