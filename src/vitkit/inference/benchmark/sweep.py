"""Variants x resolutions, as the paper's Figure 12: inference images/s at a batch size, and
the largest batch that fits a memory cap.

The largest batch is not found by allocating it: peak memory is measured at batch 1 and at
the timed batch B (2 when B is 1), a line through the two (`LinearMemoryModel`) plus the
weights estimates any batch, and `largest_fitting_batch` doubles then bisects on that
estimate.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch

from vitkit.errors import ConfigError
from vitkit.inference.benchmark.engines import Engine, EngineOptions
from vitkit.inference.benchmark.peak import MatmulPeak, mfu
from vitkit.inference.benchmark.rss import (
    LinearMemoryModel,
    largest_fitting_batch,
    peak_rss_growth,
)
from vitkit.inference.benchmark.run import check_counts, throughput, weights_mib
from vitkit.inference.benchmark.source import load_benchmark_model
from vitkit.summary import forward_flops

DEFAULT_VARIANTS = ("Ti/16", "S/16", "B/16", "B/32", "L/16")
DEFAULT_RESOLUTIONS = (224, 384)
METHOD = ("largest batch: doubling then bisecting on an estimate (weights + a line through the "
          "peak RSS growth measured at batch 1 and at batch {batch}); no batch that large was "
          "allocated")


@dataclass(frozen=True)
class SweepRow:
    variant: str
    img_size: int
    batch_size: int
    gflops_per_image: float
    images_per_s: float
    mfu: float
    peak_memory_mib: float  # at batch_size, above the weights
    memory_mib_batch1: float
    weights_mib: float
    memory_per_image_mib: float
    largest_batch: int
    memory_cap_gib: float

    def to_dict(self) -> dict:
        return asdict(self)


def parse_list(text: str, what: str) -> list[str]:
    items = [item.strip() for item in text.split(",") if item.strip()]
    if not items:
        raise ConfigError(f"no {what} given: list them separated by commas")
    return items


def parse_resolutions(text: str) -> list[int]:
    """"224,384" -> [224, 384]."""
    sizes = []
    for item in parse_list(text, "resolutions"):
        if not item.isdigit() or int(item) < 1:
            raise ConfigError(f"resolution {item!r} is not a positive integer: give e.g. "
                              "--resolutions 224,384")
        sizes.append(int(item))
    return sizes


def measure_cell(variant: str, resolution: int, batch_size: int, options: EngineOptions,
                 warmup: int, iters: int, cap_bytes: float, peak: MatmulPeak,
                 weights_dir: str | None = None) -> SweepRow:
    """One (variant, resolution): images/s at `batch_size`; the largest batch under the cap."""
    model, _ = load_benchmark_model(variant, resolution, weights_dir)
    config = model.config
    flops = forward_flops(config, stem=model.patch_embed)
    weights = weights_mib(model) * 2**20
    engine = Engine(model, options, batch_size)
    engine.runner(1)()  # not measured: a process's first call allocates what later ones reuse
    with peak_rss_growth() as single:
        engine.runner(1)()
    timing, memory = throughput(engine, batch_size, warmup, iters)
    other_batch, other_bytes = batch_size, memory.bytes
    if batch_size == 1:
        with peak_rss_growth() as double:
            engine.runner(2)()
        other_batch, other_bytes = 2, double.bytes
    image_bytes = 4 * config.in_chans * resolution**2 + 4 * config.seq_len * config.width
    line = LinearMemoryModel.fit(1, single.bytes, other_batch, other_bytes, image_bytes)
    largest = largest_fitting_batch(lambda b: weights + line(b), cap_bytes)
    peak.sample(1)
    images_per_s = batch_size / timing.median
    return SweepRow(config.name or variant, resolution, batch_size, flops / 1e9, images_per_s,
                    mfu(flops, images_per_s, peak.gflops), memory.mib, single.mib,
                    weights / 2**20, line.per_image / 2**20, largest, cap_bytes / 2**30)


def sweep(variants: Sequence[str] = DEFAULT_VARIANTS,
          resolutions: Sequence[int] = DEFAULT_RESOLUTIONS, batch_size: int = 8,
          options: EngineOptions | None = None, warmup: int = 2, iters: int = 5,
          memory_cap_bytes: float | None = None, weights_dir: str | None = None
          ) -> tuple[list[SweepRow], MatmulPeak]:
    """Every (variant, resolution) in order; the matmul peak sampled between cells."""
    from vitkit.inference.benchmark.rss import available_memory_bytes

    options = options or EngineOptions()
    check_counts(batch_size, warmup, iters)
    options.check()
    cap = memory_cap_bytes if memory_cap_bytes is not None else 0.8 * available_memory_bytes()
    if cap <= 0:
        raise ConfigError(f"the memory cap must be positive, got {cap / 2**30:g} GB: e.g. "
                          "--memory-gb 8")
    peak = MatmulPeak(options.threads, warmup=1)
    peak.sample(3)
    rows = [measure_cell(variant, resolution, batch_size, options, warmup, iters, cap, peak,
                         weights_dir)
            for variant in variants for resolution in resolutions]
    return rows, peak


def format_sweep(rows: Sequence[SweepRow], peak: MatmulPeak) -> str:
    """The table, one row per (variant, resolution), and how its columns were found."""
    header = (f"{'variant':<18}{'size':>6}{'GFLOPs':>9}{'images/s':>11}{'MFU':>7}"
              f"{'MiB@B':>9}{'MiB/img':>9}{'largest batch':>15}")
    lines = [header, "-" * len(header)]
    for row in rows:
        lines.append(f"{row.variant:<18}{row.img_size:>6}{row.gflops_per_image:>9.2f}"
                     f"{row.images_per_s:>11.1f}{100 * row.mfu:>6.1f}%"
                     f"{row.peak_memory_mib:>9.1f}{row.memory_per_image_mib:>9.2f}"
                     f"{row.largest_batch:>15,}")
    batch = rows[0].batch_size if rows else 0
    other = 2 if batch == 1 else batch
    lines += [f"images/s at batch {batch}, {torch.get_num_threads()} thread(s); MFU against "
              f"the fp32 matmul peak {peak.gflops:,.0f} GFLOP/s ({peak.describe()}); MiB@B: "
              "peak RSS growth at the timed batch",
              METHOD.format(batch=other) + f"; memory cap {rows[0].memory_cap_gib:.1f} GiB"
              if rows else ""]
    return "\n".join(lines)
