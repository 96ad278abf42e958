"""`vitkit benchmark`: inference speed, memory, FLOPs and MFU of a model, and the
variants x resolutions sweep of the paper's Figure 12.

    timing.py   warm-up and timed calls (median, percentiles, first call)
    peak.py     the fp32 matmul peak and MFU
    memory.py   peak RSS growth, available memory, the largest batch under a cap
    source.py   the model: a variant name or weights, at the size asked for
    engines.py  eager / torch.compile / onnxruntime; int8 and token merging applied first
    run.py      one benchmark -> BenchmarkResult
    sweep.py    variants x resolutions -> SweepRow table
    figure.py   the sweep's two-panel PNG
    report.py   `vitkit benchmark`: one benchmark or the sweep (table and figure), as a report
"""

from vitkit.inference.benchmark.engines import ENGINES, EngineOptions
from vitkit.inference.benchmark.peak import MatmulPeak, mfu
from vitkit.inference.benchmark.rss import largest_fitting_batch, peak_rss_growth
from vitkit.inference.benchmark.run import BenchmarkResult, benchmark
from vitkit.inference.benchmark.sweep import DEFAULT_RESOLUTIONS, DEFAULT_VARIANTS, SweepRow, sweep

__all__ = ["DEFAULT_RESOLUTIONS", "DEFAULT_VARIANTS", "ENGINES", "BenchmarkResult",
           "EngineOptions", "MatmulPeak", "SweepRow", "benchmark", "largest_fitting_batch",
           "mfu", "peak_rss_growth", "sweep"]
