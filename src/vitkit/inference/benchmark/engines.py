"""What runs the model: eager PyTorch (the `Predictor`'s runner, as predict, eval and serve run
it), torch.compile, or an onnxruntime session; token merging applied first, then the precision
(`--precision`, `--int8`: `vitkit.inference.precision`).
Each engine gives a zero-argument callable per batch size that runs one batch of random
images."""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from vitkit.errors import ConfigError, ExportError
from vitkit.inference.bf16 import bf16_autocast
from vitkit.inference.compiled import compile_for_inference
from vitkit.inference.int8_engines import DEFAULT as INT8_DEFAULT
from vitkit.inference.int8_engines import engine_scheme
from vitkit.inference.precision import MEASURE_BATCH, choose_precision, requested_precision
from vitkit.inference.predictor import InferenceOptions, Predictor
from vitkit.inference.speedup import speed_up
from vitkit.model.vit import VisionTransformer
from vitkit.runtime import set_threads

ENGINES = ("torch", "onnxruntime")


@dataclass(frozen=True)
class EngineOptions:
    engine: str = "torch"
    compile: bool = False
    int8: bool = False
    merge_tokens: int = 0
    threads: int | None = None
    int8_engine: str | None = None  # the eager int8 implementation (default: quantize's)
    precision: str | None = None  # fp32 | bf16 | int8 | auto (None: fp32, or int8 with int8)

    def requested(self) -> str | None:
        """The precision asked for (`requested_precision`: --int8 means int8)."""
        int8 = self.int8_engine or (INT8_DEFAULT if self.int8 else None)
        return requested_precision(self.precision, int8)

    def inference(self, batch_size: int = MEASURE_BATCH) -> InferenceOptions:
        """The torch engine's `InferenceOptions`: the precision asked for, token merging, no
        test-time augmentation, auto measuring at `batch_size`."""
        return InferenceOptions(self.requested(), self.int8_engine, self.merge_tokens, "none",
                                batch_size)

    def check(self) -> None:
        requested = self.requested()  # --int8 with another --precision: refused
        if self.engine not in ENGINES:
            raise ConfigError(f"unknown engine {self.engine!r}: use --engine "
                              + " or --engine ".join(ENGINES))
        if self.compile and self.engine != "torch":
            raise ConfigError("--compile applies to the torch engine only: drop --compile, or "
                              "use --engine torch")
        if self.int8_engine is not None and self.engine != "torch":
            raise ConfigError("--int8-engine applies to the torch engine only (onnxruntime "
                              "quantises the graph itself): drop --int8-engine, or use "
                              "--engine torch")
        if self.engine != "torch" and requested in ("bf16", "auto"):
            raise ConfigError(f"--precision {requested} runs on the torch engine only "
                              "(onnxruntime takes fp32 or int8): use --engine torch")
        if self.merge_tokens < 0:
            raise ConfigError(f"--merge-tokens must be >= 0 (tokens merged per block), got "
                              f"{self.merge_tokens}")

    def describe(self, chosen: str | None = None, int8_engine: str | None = None,
                 device: torch.device | None = None) -> str:
        """"torch, int8 (onednn engine), token merging r=8"; `chosen`: the precision auto
        chose, `int8_engine` the int8 engine chosen, `device` the model's (default CPU)."""
        precision = chosen or self.requested()
        compiled = ""
        if self.compile:
            compiled = (" (not compiled: ONNX Runtime's int8 session runs outside torch)"
                        if runs_in_onnxruntime(precision, int8_engine or self.int8_engine)
                        else " (torch.compile, frozen weights)")
        parts = [self.engine + compiled]
        if precision == "bf16":
            autocast = bf16_autocast(device or torch.device("cpu"))
            parts.append("bf16 (torch.autocast)" if autocast else "bf16 (a bf16 copy)")
        elif precision == "auto":
            parts.append("precision auto")
        elif precision == "int8" and self.engine == "onnxruntime":
            parts.append("int8 (onnxruntime quantize_dynamic)")
        elif precision == "int8":
            engine = int8_engine or self.int8_engine or "auto"
            scheme = engine_scheme(engine)
            parts.append(f"int8 ({engine} engine)" + (f" with {scheme}" if scheme else ""))
        if self.merge_tokens:
            parts.append(f"token merging r={self.merge_tokens}")
        return ", ".join(parts) if len(parts) > 1 else parts[0] + ", fp32"


Runner = Callable[[], object]


def runs_in_onnxruntime(precision: str | None, int8_engine: str | None) -> bool:
    """Whether the torch engine's model is ONNX Runtime's int8 session (auto's or
    --int8-engine onnxruntime's pick), which torch.compile cannot compile."""
    return precision == "int8" and int8_engine == "onnxruntime"


class Engine:
    """Prepared once; `runner(batch)` gives a callable that runs one batch."""

    def __init__(self, model: VisionTransformer, options: EngineOptions,
                 batch_size: int = MEASURE_BATCH) -> None:
        """`batch_size`: the batch auto measures at (min(batch_size, 8) images)."""
        options.check()
        self.options = options
        self.in_chans, self.img_size = model.config.in_chans, tuple(model.config.img_size)
        set_threads(options.threads)
        model.eval()
        self.device = next(model.parameters()).device
        self.session, self.context = None, contextlib.nullcontext
        module: nn.Module
        if options.engine == "onnxruntime":
            module = speed_up(model, options.merge_tokens)  # the graph exported merges too
            self.precision = choose_precision(options.requested(), torch.device("cpu"),
                                              int8_engine="onnxruntime")
            self.session = _onnx_session(module, options.threads,
                                         options.requested() == "int8")
        else:  # the model as predict, eval and serve run it (no TTA: one forward per batch)
            predictor = Predictor.from_model(model, options.inference(batch_size),
                                             compiled=options.compile, announce=False)
            module, self.context, self.precision = (predictor.runner, predictor.context,
                                                    predictor.precision)
        if options.compile and not runs_in_onnxruntime(self.precision.name,
                                                       self.precision.engine):
            module = compile_for_inference(module, self.device)
        self.module = module

    def images(self, batch: int) -> torch.Tensor:
        generator = torch.Generator().manual_seed(0)
        return torch.randn(batch, self.in_chans, *self.img_size, generator=generator)

    def runner(self, batch: int) -> Runner:
        images = self.images(batch)
        if self.session is not None:
            feed = {self.session.get_inputs()[0].name: images.numpy()}
            return lambda: self.session.run(None, feed)

        def run() -> torch.Tensor:
            with torch.no_grad(), self.context():
                return self.module(images)
        return run

    def describe(self) -> str:
        return self.options.describe(self.precision.name, self.precision.engine, self.device)


def _onnx_session(model: VisionTransformer, threads: int | None, int8: bool = False):
    """Export with vitkit's exporter (int8: then onnxruntime's dynamic quantisation) to a
    temporary file and open it in onnxruntime. The float graph is checked against `model`
    first (`check_float_graph`; for int8 inside `export_onnx_int8`), so only a faithful graph
    is timed."""
    from vitkit.export import export_onnx, export_onnx_int8
    from vitkit.export.onnx import check_float_graph
    from vitkit.inference.onnx_int8 import cpu_session

    with tempfile.TemporaryDirectory(prefix="vitkit-benchmark-") as folder:
        target = Path(folder) / "model.onnx"
        try:
            if int8:
                path = export_onnx_int8(model, target, dynamic_batch=True, dynamic_size=False)
            else:
                path = export_onnx(model, target, dynamic_batch=True, dynamic_size=False)
                check_float_graph(model, path, dynamic_batch=True, dynamic_size=False)
        except ExportError as exc:
            raise ExportError(f"{exc} Time PyTorch instead: --engine torch.") from exc
        return cpu_session(path, threads)
