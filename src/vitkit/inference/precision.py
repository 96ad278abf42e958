"""The number format inference runs in, chosen per machine: fp32, bf16 or int8.

`--precision fp32|bf16|int8|auto` (eval, predict, benchmark) goes through `choose_precision`,
and `apply_precision` gives the model and the context to run it in (both: `run_in_precision`).
What `auto` picks:

- CUDA: bf16 autocast (tensor cores).
- A CPU with fast bf16 (AMX, or AVX512-BF16 where a matmul at the model's width measures at
  least `BF16_MARGIN` faster in bf16: `vitkit.inference.cpu_probes`): bf16 (on the CPU a bf16
  copy of the model, `vitkit.inference.bf16`) and every int8 engine are timed against fp32 on
  the model at the batch, and the fastest is kept (`vitkit.inference.int8_choice`). Neither
  wins by rule: which is faster depends on the machine. On AMX, where bf16 is fast and short
  measurements swing, int8 replaces bf16 only when it measures `AMX_BF16_PREFERENCE` times
  faster. Without a model to time (no batch), AMX means bf16.
- Otherwise: dynamic int8 (`vitkit.inference.int8_engines`) by its fastest engine here.
In every measured case the fastest path must beat fp32 by `INT8_MARGIN` (timed alternately:
`vitkit.inference.autotune`), else fp32 runs: `auto` is never slower than fp32 by its own
measurement.

int8's engine is likewise measured, not assumed; `--int8-engine E` pins one. A measured
choice is remembered per CPU, torch build, model shape and batch size, so only the first call
pays for it. Each choice carries a one-line reason that the verbs print.

`--int8` (and `--int8-engine E`) means `--precision int8` (with that engine); with another
`--precision` it is refused (`requested_precision`). Asked for bf16 where it is likely slower
than fp32 (emulated, or an AVX512-BF16 matmul measured slower), `--precision bf16` runs it
and says so. Training's `amp=auto` is `vitkit.train.amp`. Measured speeds per machine:
benchmarks/README.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from vitkit.errors import ConfigError, VitkitError
from vitkit.inference.bf16 import bf16_model
from vitkit.inference.cpu_probes import (
    bf16_matmul_note,
    fast_bf16_cpu,
    measured_bf16_speedup,
    slow_bf16,
)
from vitkit.inference.int8_choice import NoInt8Engine, measure_int8
from vitkit.inference.int8_engines import AUTO as INT8_AUTO
from vitkit.inference.int8_engines import engine_scheme, quantize_by_engine

__all__ = ["MEASURE_BATCH", "PRECISIONS", "PRECISION_HELP", "Precision", "apply_precision",
           "choose_precision", "measurement_batch", "requested_precision", "run_in_precision"]

PRECISIONS = ("fp32", "bf16", "int8", "auto")
BF16_MARGIN = 1.3  # a bf16 matmul this much faster than fp32 makes an AVX512-BF16 CPU fast
INT8_MARGIN = 1.1  # auto's fastest path must beat fp32 by this much
AMX_BF16_PREFERENCE = 1.3  # on AMX, int8 replaces bf16 only when this much faster
MEASURE_BATCH = 8  # at most this many images in auto's measurement (eval, benchmark)
PRECISION_HELP = ("number format: fp32 (default), bf16 (a bf16 copy of the model on CPUs, "
                  "autocast on CUDA), int8 (dynamic int8 Linear layers by the fastest engine "
                  "measured here, as --int8) or auto (the "
                  "fastest for this machine and model: bf16 on CUDA; on CPUs the fastest of "
                  "bf16 (AMX/AVX512-BF16 only) and int8 by a short measurement, else fp32; "
                  "says what it chose)")


@dataclass(frozen=True)
class Precision:
    """What the model runs in (`name`: fp32, bf16 or int8), why (`reason`), for int8 by
    which engine (`engine`, one of `vitkit.inference.int8_engines.ENGINES`), and whether an
    earlier measurement on a model of the same shape chose it (`remembered`)."""

    name: str
    reason: str
    engine: str | None = None
    remembered: bool = False  # chosen from an earlier measurement (see `run_in_precision`)

    def describe(self) -> str:
        scheme = engine_scheme(self.engine)
        engine = f"{self.engine}; {scheme}" if scheme else self.engine
        name = f"{self.name} ({engine})" if engine else self.name
        return f"precision {name} ({self.reason})"


def choose_precision(requested: str | None, device: torch.device,
                     model: nn.Module | None = None, batch: torch.Tensor | None = None,
                     flags: frozenset[str] | None = None,
                     int8_engine: str | None = None, remeasure: bool = False) -> Precision:
    """The precision to run `model` in on `device` (`requested` None: the default, fp32);
    `auto` decides by the machine and, where no rule is clear, by timing `model` on `batch`
    (see the module docstring; `remeasure`: not from memory); int8's engine is `int8_engine`,
    or measured when that is None or "auto"."""
    if requested is None:
        return Precision("fp32", "the default; --precision auto chooses per machine")
    if requested not in PRECISIONS:
        raise ConfigError(f"--precision {requested!r} is not one of {', '.join(PRECISIONS)}")
    if requested == "int8" and device.type != "cpu":
        raise ConfigError("--precision int8 is a CPU path (dynamic int8 Linear layers); on "
                          f"{device.type} use --precision bf16 (or auto)")
    if requested == "int8":
        if int8_engine not in (None, INT8_AUTO):
            return Precision("int8", f"asked, engine {int8_engine}", int8_engine)
        if model is None or batch is None:
            return Precision("int8", "asked; engine torch (no model to measure the others "
                                     "on)", "torch")
        try:
            measured = measure_int8(model, batch, None, remeasure=remeasure)
        except NoInt8Engine as exc:
            raise NoInt8Engine(f"{exc}. Run it in fp32: leave out --int8 and --precision int8 "
                               "(fp32 is the default), or use --precision auto, which falls "
                               "back to fp32.") from exc
        return Precision("int8", f"asked; {measured['reason']}", str(measured["engine"]),
                         bool(measured.get("remembered")))
    if requested == "bf16" and (slow := slow_bf16(
            device, getattr(getattr(model, "config", None), "width", 768), flags)):
        return Precision("bf16", f"asked; {slow}: --precision auto chooses by measuring")
    if requested != "auto":
        return Precision(requested, "asked")
    if device.type == "cuda":
        return Precision("bf16", "CUDA: bf16 autocast")
    kind = fast_bf16_cpu(flags)
    width = getattr(getattr(model, "config", None), "width", 768)
    bf16_why = "the CPU has AMX" if kind == "amx" else None
    why = "no fast bf16 on this CPU"
    if kind == "avx512_bf16":
        speedup = measured_bf16_speedup(width)
        if speedup >= BF16_MARGIN:
            bf16_why = f"AVX512-BF16 (a bf16 matmul at width {width} measured {speedup:.1f}x)"
        else:
            why = f"no fast bf16 on this CPU: {bf16_matmul_note(width, speedup)}"
    if model is None or batch is None:
        if bf16_why:
            return Precision("bf16", f"{bf16_why}: bf16 matmuls in hardware")
        return Precision("fp32", why)
    why = bf16_why or why
    try:
        measured = measure_int8(
            model, batch, int8_engine, with_bf16=bf16_why is not None, remeasure=remeasure,
            bf16_preference=AMX_BF16_PREFERENCE if kind == "amx" else 1.0)
    except NoInt8Engine as exc:
        return Precision("fp32", f"{why}; {exc}")
    engine, speedup = str(measured["engine"]), float(measured["speedup"])  # type: ignore[arg-type]
    remembered = bool(measured.get("remembered"))
    if speedup < INT8_MARGIN:
        fastest = "bf16" if engine == "bf16" else f"int8 ({engine})"
        return Precision("fp32", f"{why}; {measured['reason']}; the fastest, {fastest}, only "
                                 f"{speedup:.2f}x fp32")
    if engine == "bf16":
        return Precision("bf16", f"{why}; {measured['reason']}; bf16 is {speedup:.1f}x fp32",
                         remembered=remembered)
    return Precision("int8", f"{why}; {measured['reason']}; int8 ({engine}) is {speedup:.1f}x "
                             "fp32", engine, remembered)


def run_in_precision(requested: str | None, device: torch.device, model: nn.Module,
                     batch: torch.Tensor | None, int8_engine: str | None = None,
                     compiled: bool = False
                     ) -> tuple[nn.Module, Callable[[], contextlib.AbstractContextManager],
                                Precision]:
    """`choose_precision`, then `apply_precision`: the model to run, the context to run it in
    and the choice. An engine remembered from a model of the same shape that cannot run this
    one (ONNX Runtime, where this model's graph fails its check) is not refused: the engines
    are timed again for this model, the one that fails left out, and that measurement is not
    remembered (the remembered one still holds for the models it was measured on)."""
    chosen = choose_precision(requested, device, model, batch, int8_engine=int8_engine)
    try:
        return (*apply_precision(model, chosen, device, compiled=compiled), chosen)
    except VitkitError:
        if not chosen.remembered:
            raise
    remembered = chosen.engine
    chosen = choose_precision(requested, device, model, batch, int8_engine=int8_engine,
                              remeasure=True)
    chosen = dataclasses.replace(chosen, reason=f"{chosen.reason}; measured for this model "
                                 f"alone: {remembered}, remembered for its shape, cannot run it")
    return (*apply_precision(model, chosen, device, compiled=compiled), chosen)


def requested_precision(precision: str | None, int8: str | None = None) -> str | None:
    """The precision the flags ask for (None: none, the default fp32): `--precision` (None:
    not given), where `int8` is the engine `--int8 [--int8-engine E]` asks for (None: not
    given). `--int8` means int8, so with another `--precision` it is refused."""
    if int8 is not None and precision not in (None, "int8"):
        raise ConfigError(f"--int8 means --precision int8, but --precision {precision} was "
                          f"given too: drop --int8 (and --int8-engine) to run in {precision}, "
                          "or drop --precision")
    if precision is not None and precision not in PRECISIONS:
        raise ConfigError(f"--precision {precision!r} is not one of {', '.join(PRECISIONS)}")
    return "int8" if int8 is not None else precision


def measurement_batch(in_chans: int, img_size: tuple[int, int] | list[int],
                      batch_size: int) -> torch.Tensor:
    """Random images of the model's shape for auto's measurement: min(batch_size, 8) of them
    (the timing does not depend on the pixels)."""
    generator = torch.Generator().manual_seed(0)
    return torch.randn(min(batch_size, MEASURE_BATCH), in_chans, *img_size, generator=generator)


def apply_precision(model: nn.Module, precision: Precision, device: torch.device,
                    compiled: bool = False
                    ) -> tuple[nn.Module, Callable[[], contextlib.AbstractContextManager]]:
    """The model to run (an int8 copy by `precision.engine` for int8; for bf16 on the CPU a
    bf16 copy, `vitkit.inference.bf16.bf16_copy`, its weights prepacked unless it will be
    `compiled`) and a factory of the context to run it in (bf16 autocast for bf16 on CUDA)."""
    if precision.name == "int8":
        return quantize_by_engine(model, precision.engine or "torch"), contextlib.nullcontext
    if precision.name == "bf16":
        return bf16_model(model, device, compiled)
    return model, contextlib.nullcontext
