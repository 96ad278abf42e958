"""One benchmark: images/s at batch B, latency at batch 1, peak memory, FLOPs and MFU, as
timm's benchmark.py reports inference (median over timed calls after warm-up)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

import torch

from vitkit.catalog import model_name
from vitkit.errors import ConfigError
from vitkit.inference.benchmark.engines import Engine, EngineOptions
from vitkit.inference.benchmark.peak import MatmulPeak, mfu
from vitkit.inference.benchmark.rss import PeakMemory, peak_rss_growth
from vitkit.inference.benchmark.source import Size, load_benchmark_model
from vitkit.inference.benchmark.timing import Timing, time_calls
from vitkit.inference.merging import merge_schedule
from vitkit.runtime import cpu_description
from vitkit.summary import forward_flops, token_count


@dataclass(frozen=True)
class BenchmarkResult:
    model: str
    weights: str
    img_size: tuple[int, int]
    batch_size: int
    engine: str
    threads: int
    warmup: int
    iters: int
    images_per_s: float
    batch_ms_median: float
    latency_ms_median: float | None
    latency_ms_p90: float | None
    first_call_s: float  # the compile time with --compile
    peak_memory_mib: float
    memory_method: str
    weights_mib: float
    gflops_per_image: float
    peak_gflops: float
    peak_method: str
    mfu: float
    precision: str  # what ran: fp32, bf16 or int8 (--precision auto: what it chose)
    precision_reason: str
    cpu: str  # vitkit.runtime.cpu_description(): figures compare only on the same kind of CPU

    def to_dict(self) -> dict:
        return asdict(self)

    def json_lines(self) -> str:
        """The result as one line of JSON (`vitkit benchmark --json`)."""
        return json.dumps(self.to_dict())

    def format(self) -> str:
        size = f"{self.img_size[0]}x{self.img_size[1]}"
        rows = [(f"images/s (batch {self.batch_size}, median of {self.iters})",
                 f"{self.images_per_s:,.1f}"),
                ("time per batch (median)", f"{self.batch_ms_median:,.2f} ms")]
        if self.latency_ms_median is not None:
            rows.append(("latency at batch 1 (median / p90)",
                         f"{self.latency_ms_median:,.2f} / {self.latency_ms_p90:,.2f} ms"))
        rows += [("first call" + (" (compile)" if "torch.compile" in self.engine else ""),
                  f"{self.first_call_s:,.2f} s (not in images/s)"),
                 ("peak memory during the run", f"{self.peak_memory_mib:,.1f} MiB "
                  f"(+ {self.weights_mib:,.1f} MiB of weights before it)"),
                 ("GFLOPs per image", f"{self.gflops_per_image:,.3f}"),
                 ("fp32 matmul peak", f"{self.peak_gflops:,.0f} GFLOP/s ({self.peak_method})"),
                 ("MFU", f"{100 * self.mfu:.1f}%")]
        head = (f"{self.model} ({self.weights}), {size}, {self.engine}, {self.threads} "
                f"thread(s), warm-up {self.warmup}")
        width = max(len(label) for label, _ in rows) + 2
        notes = [f"peak memory: {self.memory_method}",
                 "FLOPs: 2 per multiply-add of the stem, encoder and head matmuls "
                 "(vitkit.summary.forward_flops); MFU = FLOPs per image x images/s / peak"
                 + ("" if self.precision == "fp32" else f" (the fp32 peak: {self.precision} "
                    "matmuls can run faster, so MFU can pass 100%)")]
        return "\n".join([self.cpu, head, f"  precision {self.precision} "
                          f"({self.precision_reason})",
                          *(f"  {label:<{width}}{value}" for label, value in rows), *notes])


def check_counts(batch_size: int, warmup: int, iters: int) -> None:
    if batch_size < 1:
        raise ConfigError(f"batch size must be >= 1, got {batch_size}: e.g. --batch-size 8")
    if iters < 1:
        raise ConfigError(f"timed iterations must be >= 1, got {iters}: e.g. --iters 10")
    if warmup < 0:
        raise ConfigError(f"warm-up calls must be >= 0, got {warmup}: e.g. --warmup 3")


def throughput(engine: Engine, batch: int, warmup: int, iters: int) -> tuple[Timing,
                                                                               PeakMemory]:
    """Time `iters` calls at `batch` after warm-up, measuring the peak memory around them."""
    run = engine.runner(batch)
    with peak_rss_growth() as memory:
        timing = time_calls(run, warmup, iters)
    return timing, memory


def weights_mib(model: torch.nn.Module) -> float:
    tensors = [*model.parameters(), *model.buffers()]
    return sum(t.numel() * t.element_size() for t in tensors) / 2**20


def benchmark(source: str, img_size: Size | None = None, batch_size: int = 8,
              options: EngineOptions | None = None, warmup: int = 3, iters: int = 10,
              latency: bool = True, weights_dir: str | None = None,
              peak: MatmulPeak | None = None) -> BenchmarkResult:
    """Benchmark inference of `source` (a variant name or weights; see
    `load_benchmark_model`) on random images."""
    options = options or EngineOptions()
    check_counts(batch_size, warmup, iters)
    options.check()
    model, origin = load_benchmark_model(source, img_size, weights_dir)
    config = model.config
    schedule = merge_schedule(config, options.merge_tokens,
                              token_count(config, stem=model.patch_embed))
    flops = forward_flops(config, stem=model.patch_embed, tokens_per_layer=schedule)
    weights = weights_mib(model)
    peak = peak or MatmulPeak(options.threads, warmup=1)
    peak.sample(3)
    engine = Engine(model, options, batch_size)
    timing, memory = throughput(engine, batch_size, warmup, iters)
    lat = time_calls(engine.runner(1), warmup, iters) if latency else None
    peak.sample(1)
    images_per_s = batch_size / timing.median
    return BenchmarkResult(
        model=model_name(config), weights=origin, img_size=tuple(config.img_size),
        batch_size=batch_size, engine=engine.describe(), threads=torch.get_num_threads(),
        warmup=warmup, iters=iters, images_per_s=images_per_s,
        batch_ms_median=1e3 * timing.median,
        latency_ms_median=1e3 * lat.median if lat else None,
        latency_ms_p90=1e3 * lat.percentile(90) if lat else None,
        first_call_s=timing.first_call_s, peak_memory_mib=memory.mib,
        memory_method=memory.method, weights_mib=weights, gflops_per_image=flops / 1e9,
        peak_gflops=peak.gflops, peak_method=peak.describe(),
        mfu=mfu(flops, images_per_s, peak.gflops), precision=engine.precision.name,
        precision_reason=engine.precision.reason, cpu=cpu_description())
