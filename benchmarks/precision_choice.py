"""Does `--precision auto` pick the fastest path? Its choice, then the paths timed.

One process: `auto`'s own measurement for the model with ToMe r (a fresh cache, so it
measures), then vitkit fp32, the bf16 copy alone and with ToMe r (not with `--no-bf16`),
oneDNN's and ONNX Runtime's int8 with ToMe r and `auto`'s choice with ToMe r, timed in
rotating rounds (the first call of each untimed; medians). A quick check for a machine lent
for minutes (an AMX host); the full table is benchmarks/inference.py.

    python benchmarks/precision_choice.py --model B/16 --merge 8 --threads 2 [--no-bf16]
    python benchmarks/precision_choice.py --auto-warmups 3 --auto-rounds 5   # auto's settings
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from vitkit import create_model
from vitkit.inference import autotune
from vitkit.inference.int8_engines import available_engines
from vitkit.inference.merging import apply_token_merging
from vitkit.inference.precision import Precision, apply_precision, choose_precision
from vitkit.runtime import configure_cpu, cpu_description

sys.path.append(str(Path(__file__).resolve().parent))  # readme_tables, for importers
import readme_tables


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="B/16")
    parser.add_argument("--merge", type=int, default=8, help="ToMe r")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--auto-warmups", type=int, default=autotune.WARMUP_CALLS,
                        help="untimed calls of each path before auto's timed rounds")
    parser.add_argument("--auto-rounds", type=int, default=autotune.ROUNDS,
                        help="auto's timed rounds (more while its two fastest paths are close)")
    parser.add_argument("--no-bf16", action="store_true",
                        help="leave out the bf16 rows (minutes on a CPU without fast bf16)")
    readme_tables.add_flag(parser)
    args = parser.parse_args()
    name = "precision_choice.py" + (f" --model {args.model}" if args.model != "B/16" else "")
    with readme_tables.recording(name, args.write_readme):
        autotune.WARMUP_CALLS, autotune.ROUNDS = args.auto_warmups, args.auto_rounds

        os.environ["VITKIT_CACHE"] = tempfile.mkdtemp()  # auto measures instead of recalling
        configure_cpu(args.threads)
        print(cpu_description(), flush=True)
        cpu = torch.device("cpu")
        model = create_model(args.model).eval()
        config = model.config
        images = torch.randn(args.batch, config.in_chans, *config.img_size)
        merged = apply_token_merging(create_model(args.model).eval(), args.merge)
        tome = f" + ToMe {args.merge}"
        start = time.perf_counter()
        auto = choose_precision("auto", cpu, merged, images)
        chosen = f"{auto.name} {auto.engine or ''}".strip()
        print(f"auto{tome} -> {chosen} ({time.perf_counter() - start:.0f} s; {args.auto_warmups} "
              f"warm-up call(s), {args.auto_rounds}+ rounds): {auto.reason}", flush=True)

        paths = {"fp32": (model, None)}
        if not args.no_bf16:
            paths |= {"bf16 copy": (model, Precision("bf16", "")),
                      f"bf16 copy{tome}": (merged, Precision("bf16", ""))}
        for engine in ("onednn", "onnxruntime"):
            if engine in available_engines():
                paths[f"int8 {engine}{tome}"] = (merged, Precision("int8", "", engine))
        paths[f"auto ({chosen}){tome}"] = (merged, auto)
        runners = {label: module if precision is None
                   else apply_precision(module, precision, cpu)[0]
                   for label, (module, precision) in paths.items()}
        seconds: dict[str, list[float]] = {label: [] for label in runners}
        with torch.inference_mode():
            for run in runners.values():
                run(images)
            for _ in range(args.rounds):
                for label, run in runners.items():
                    begin = time.perf_counter()
                    run(images)
                    seconds[label].append(time.perf_counter() - begin)
        fp32 = statistics.median(seconds["fp32"])
        print(f"{args.model}, batch {args.batch}, medians of {args.rounds} rotating rounds")
        for label, values in seconds.items():
            median = statistics.median(values)
            print(f"{label:32s} {median * 1e3:8.1f} ms  {args.batch / median:7.2f} images/s  "
                  f"{fp32 / median:5.2f}x fp32")


if __name__ == "__main__":
    main()
