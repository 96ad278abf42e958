"""Do ToMe's fewer tokens make the bf16 linears faster? Linears, then the whole model.

B/16's four bf16 linear layers (qkv, proj, fc1, fc2), prepacked for oneDNN as `--precision
bf16` runs them on the CPU, at the unmerged row count (batch x 197 tokens) in each of the twelve
layers, against the row counts that ToMe r leaves each layer; then the bf16 copy of B/16 with
and without ToMe r, and fp32. One process, rotating rounds, medians. On a Zen 4 EPYC the
linears' time falls with the rows; on AMX hosts it did not (benchmarks/README.md). `--per-rows`
adds the four linears at each row count alone, to show how their time follows the rows.
The first two rows share four layers between the calls; `--row-hints` adds ToMe's rows with a
layer of its own per call, as in the model (48 weights to stream, not 4), packed by default
and packed for each call's row count (`PackedLinear(rows_hint=...)`, as inductor packs): does
oneDNN's layout for its default row count slow the others down on AMX? (On a Zen 4 EPYC the
hint moved single linears by up to 8% either way.)

    python benchmarks/merged_linears.py --threads 2 [--per-rows] [--row-hints]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from vitkit import create_model
from vitkit.inference.bf16 import bf16_copy
from vitkit.inference.merging import apply_token_merging, merge_schedule
from vitkit.inference.packed_linear import PackedLinear, prepacking_available
from vitkit.runtime import configure_cpu, cpu_description

sys.path.append(str(Path(__file__).resolve().parent))  # readme_tables, for importers
import readme_tables


def linear_calls(calls: list[tuple[int, int, int]], own_layers: bool = False,
                 row_hints: bool = False) -> Callable[[], None]:
    """One call of a prepacked bf16 linear per (rows, in, out) of `calls`: one layer per
    (in, out), shared by the calls, or with `own_layers` a layer of its own per call, as in the
    model (`row_hints`: each packed for its call's rows)."""
    made: dict[object, PackedLinear] = {}
    layers = []
    for index, (m, a, b) in enumerate(calls):
        key = index if own_layers else (a, b)
        if key not in made:
            made[key] = PackedLinear(torch.randn(b, a) * 0.02, torch.zeros(b),
                                     m if row_hints else None)
        layers.append(made[key])
    inputs = {(m, a): torch.randn(m, a).bfloat16() for m, a, _ in calls}

    def run() -> None:
        for layer, (m, a, _) in zip(layers, calls, strict=True):
            layer(inputs[m, a])
    return run


def linear_flops(calls: list[tuple[int, int, int]]) -> int:
    """The FLOPs of one `linear_calls` run: 2 x rows x in x out per call."""
    return 2 * sum(rows * a * b for rows, a, b in calls)


def block_calls(width: int, hidden: int, attention_rows: list[int], mlp_rows: list[int]
                ) -> list[tuple[int, int, int]]:
    """(rows, in, out) of each block's qkv and proj (the attention's rows) and fc1 and fc2 (the
    MLP's rows: after the block's merge)."""
    calls = []
    for attention, mlp in zip(attention_rows, mlp_rows, strict=True):
        calls += [(attention, width, 3 * width), (attention, width, width),
                  (mlp, width, hidden), (mlp, hidden, width)]
    return calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--merge", type=int, default=8, help="ToMe r")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--per-rows", action="store_true",
                        help="also time the four linears at each row count alone")
    parser.add_argument("--row-hints", action="store_true",
                        help="also time ToMe's rows with each linear packed for its rows")
    readme_tables.add_flag(parser)
    args = parser.parse_args()
    with readme_tables.recording("merged_linears.py", args.write_readme):
        if not prepacking_available():
            raise SystemExit("this CPU or torch cannot run prepacked bf16 linears (x86 oneDNN)")
        configure_cpu(args.threads)
        print(cpu_description(), flush=True)

        model = create_model("B/16").eval()
        config = model.config
        tokens = [config.seq_len, *merge_schedule(config, args.merge, config.seq_len)]
        rows = [args.batch * t for t in tokens]
        full = block_calls(config.width, config.mlp_dim, rows[:1] * config.depth,
                           rows[:1] * config.depth)
        merged = block_calls(config.width, config.mlp_dim, rows[:-1], rows[1:])
        images = torch.randn(args.batch, config.in_chans, *config.img_size)
        bf16_model = bf16_copy(model)
        merged_model = bf16_copy(apply_token_merging(create_model("B/16").eval(), args.merge))
        runs = {f"linears, {rows[0]} rows each": linear_calls(full),
                f"linears, ToMe {args.merge}'s rows ({rows[-1]}-{rows[0]})": linear_calls(merged),
                "B/16 fp32": lambda: model(images),
                "B/16 bf16 copy": lambda: bf16_model(images),
                f"B/16 bf16 copy + ToMe {args.merge}": lambda: merged_model(images)}
        flops = {label: linear_flops(calls)
                 for label, calls in zip(list(runs)[:2], (full, merged), strict=True)}
        if args.row_hints:
            for hints in (False, True):
                label = (f"linears, ToMe {args.merge}'s rows, {len(merged)} layers"
                         + (", packed per rows" if hints else ""))
                runs[label] = linear_calls(merged, own_layers=True, row_hints=hints)
                flops[label] = linear_flops(merged)
        if args.per_rows:
            for m in sorted(set(rows), reverse=True):
                one = block_calls(config.width, config.mlp_dim, [m], [m])
                runs[f"linears at {m} rows"] = linear_calls(one)
                flops[f"linears at {m} rows"] = linear_flops(one)
        seconds: dict[str, list[float]] = {label: [] for label in runs}
        with torch.inference_mode():
            for run in runs.values():
                run()
            for _ in range(args.rounds):
                for label, run in runs.items():
                    begin = time.perf_counter()
                    run()
                    seconds[label].append(time.perf_counter() - begin)
        medians = {label: statistics.median(values) for label, values in seconds.items()}
        print(f"batch {args.batch}, medians of {args.rounds} rotating rounds")
        for label, median in medians.items():
            rate = (f"{flops[label] / median / 1e9:6.0f} GFLOP/s" if label in flops
                    else f"{medians['B/16 fp32'] / median:5.2f}x fp32")
            print(f"{label:52s} {median * 1e3:8.1f} ms  {rate}")
        full_time, merged_time = list(medians.values())[:2]
        labels = list(flops)[:2]
        print(f"ToMe {args.merge}'s rows: {flops[labels[1]] / flops[labels[0]]:.2f}x the linears' "
              f"FLOPs in {merged_time / full_time:.2f}x their time")


if __name__ == "__main__":
    main()
