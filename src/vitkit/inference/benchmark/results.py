"""`vitkit benchmark`: one benchmark, or with `sweep` the variants x resolutions table and its
figure, as a report."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vitkit.errors import ConfigError
from vitkit.inference.benchmark.engines import EngineOptions
from vitkit.inference.benchmark.figure import figure_problem, plot_sweep
from vitkit.inference.benchmark.peak import MatmulPeak
from vitkit.inference.benchmark.run import BenchmarkResult, benchmark
from vitkit.inference.benchmark.source import Size
from vitkit.inference.benchmark.sweep import (
    DEFAULT_VARIANTS,
    SweepRow,
    format_sweep,
    parse_list,
    parse_resolutions,
    sweep,
)
from vitkit.runtime import cpu_description


@dataclass(frozen=True)
class SweepReport:
    """The sweep's rows, the matmul peak they were measured against, and the figure."""

    rows: list[SweepRow]
    peak: MatmulPeak
    figure: Path

    def format(self) -> str:
        return f"{cpu_description()}\n{format_sweep(self.rows, self.peak)}\nwrote {self.figure}"

    def to_dict(self) -> dict[str, Any]:
        return {"cpu": cpu_description(), "rows": [row.to_dict() for row in self.rows],
                "peak_gflops": self.peak.gflops, "figure": str(self.figure)}

    def json_lines(self) -> str:
        """One JSON object per row, with the peak and the CPU (`vitkit benchmark --sweep
        --json`)."""
        return "\n".join(json.dumps({**row.to_dict(), "peak_gflops": self.peak.gflops,
                                     "cpu": cpu_description()}) for row in self.rows)


# The figure a sweep writes when no `out` is given (`vitkit benchmark --sweep`).
SWEEP_FIGURE = "benchmark_sweep.png"


def benchmark_report(model: str | None, img_size: Size | None = None, batch_size: int = 8,
                     options: EngineOptions | None = None, warmup: int = 3, iters: int = 10,
                     weights_dir: str | None = None, *, sweep_table: bool = False,
                     variants: str | None = None, resolutions: str | None = None,
                     memory_gb: float | None = None, out: str | Path | None = None
                     ) -> BenchmarkResult | SweepReport:
    """Benchmark `model`; with `sweep_table`, the `variants` (comma-separated; default:
    `model`, else DEFAULT_VARIANTS) at each of `resolutions` (default "224,384"), the largest
    batch under `memory_gb` (default 0.8 x the available memory), and the figure written to
    `out` (default SWEEP_FIGURE). The sweep's own settings without `sweep_table` are refused
    (they would be ignored)."""
    options = options or EngineOptions()
    if not sweep_table:
        given = [flag for flag, value in (("--variants", variants), ("--resolutions",
                 resolutions), ("--memory-gb", memory_gb), ("--out", out)) if value is not None]
        if given:
            raise ConfigError(f"{', '.join(given)} set{'s' if len(given) == 1 else ''} the "
                              "sweep, and no sweep was asked for: add --sweep for the variants "
                              f"x resolutions table, or drop {' and '.join(given)}")
        if model is None:
            raise ConfigError("name the model to benchmark, e.g. `vitkit benchmark B/16`, or "
                              "add --sweep for the variants x resolutions table")
        return benchmark(model, img_size, batch_size, options, warmup, iters,
                         weights_dir=weights_dir)
    out = SWEEP_FIGURE if out is None else out
    problem = figure_problem(out)
    if problem:  # before the sweep, not after it
        raise ConfigError(f"--out {problem}")
    names = parse_list(variants, "variants") if variants is not None else \
        [model] if model else list(DEFAULT_VARIANTS)
    sizes = parse_resolutions("224,384" if resolutions is None else resolutions)
    cap = memory_gb * 2**30 if memory_gb is not None else None
    rows, peak = sweep(names, sizes, batch_size, options, warmup, iters, cap, weights_dir)
    figure = plot_sweep(rows, out, title=f"inference, {options.describe()}")
    return SweepReport(rows, peak, figure)
