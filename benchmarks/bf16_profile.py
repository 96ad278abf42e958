"""Where ViT-B/16's bf16 inference time goes on this CPU, and the ceiling the matmuls set.

Prints the 2048x2048 matmul peak in fp32 and bf16 (their ratio bounds what bf16 can give a
model that is mostly matmuls), B/16 at 224, batch 8, in fp32, bf16 autocast and with bf16
weights and activations (no casts), medians of rotating rounds in one process, and the torch
profiler's top operators of two bf16 autocast batches.

    python benchmarks/bf16_profile.py --threads 2
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from vitkit import create_model
from vitkit.inference.benchmark.peak import MatmulPeak, timed
from vitkit.runtime import configure_cpu, cpu_description

sys.path.append(str(Path(__file__).resolve().parent))  # readme_tables, for importers
import readme_tables


def runners(batch: int) -> dict[str, Callable[[], object]]:
    torch.manual_seed(0)
    images = torch.randn(batch, 3, 224, 224)
    model = create_model("B/16").eval()  # random weights: the speed does not depend on them
    bf16_model = create_model("B/16").eval().to(torch.bfloat16)
    bf16_images = images.to(torch.bfloat16)

    def fp32() -> object:
        with torch.inference_mode():
            return model(images)

    def autocast() -> object:
        with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
            return model(images)

    def bf16_weights() -> object:
        with torch.inference_mode():
            return bf16_model(bf16_images)

    return {"fp32": fp32, "bf16 autocast": autocast, "bf16 weights and activations": bf16_weights}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--reps", type=int, default=5)
    readme_tables.add_flag(parser)
    args = parser.parse_args()
    with readme_tables.recording("bf16_profile.py", args.write_readme):
        configure_cpu(args.threads)
        print(cpu_description(), flush=True)
        peaks = {dtype: MatmulPeak(args.threads, dtype=dtype)
                 for dtype in (torch.float32, torch.bfloat16)}
        for peak in peaks.values():
            peak.sample(5)
        fp32_peak, bf16_peak = (peak.gflops for peak in peaks.values())
        print(f"matmul peak: fp32 {fp32_peak:.0f} GFLOP/s, bf16 {bf16_peak:.0f} GFLOP/s "
              f"({bf16_peak / fp32_peak:.2f}x)")
        rows = runners(args.batch)
        for run in rows.values():
            run()  # warm up
        times: dict[str, list[float]] = {label: [] for label in rows}
        order = list(rows)
        for rep in range(args.reps):
            for label in order[rep % len(order):] + order[:rep % len(order)]:
                times[label].append(timed(rows[label]))
        base = statistics.median(times["fp32"])
        print(f"ViT-B/16 at 224, batch {args.batch}, medians of {args.reps} rotating rounds")
        for label, samples in times.items():
            median = statistics.median(samples)
            print(f"  {label:<32}{args.batch / median:>8.2f} images/s {base / median:>6.2f}x")
        with profile(activities=[ProfilerActivity.CPU]) as profiler:
            for _ in range(2):
                rows["bf16 autocast"]()
        print("top operators of two bf16 autocast batches (self CPU time):")
        print(profiler.key_averages().table(sort_by="self_cpu_time_total", row_limit=12,
                                            max_name_column_width=40))


if __name__ == "__main__":
    main()
