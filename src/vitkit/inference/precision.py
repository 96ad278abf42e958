"""The number format inference runs in, chosen per machine: fp32, bf16 or int8.

`--precision fp32|bf16|int8|auto` (eval, predict, benchmark) goes through `choose_precision`,
and `apply_precision` gives the model and the context to run it in (both: `run_in_precision`).
What `auto` picks:

- CUDA: bf16 autocast (tensor cores).
- A CPU with fast bf16 (AMX, or AVX512-BF16 where a matmul at the model's width measures at
  least `BF16_MARGIN` faster in bf16): bf16 (on the CPU a bf16 copy of the model, `bf16_copy`)
  and every int8 engine are timed against fp32 on the model at the batch, and the fastest is
  kept. Neither wins by rule: on one AMX Xeon (2 threads, B/16, batch 8) bf16 autocast
  measured 2.5-2.9x fp32 and oneDNN's int8 3.7x, where another AMX machine measured bf16 at
  3.8x and torch's int8 at 2.1x. On AMX, where the prepacked bf16 copy has since won every
  longer timing, int8 replaces bf16 only when it measures `AMX_BF16_PREFERENCE` times faster.
  Without a model to time (no batch), AMX means bf16.
- Otherwise: dynamic int8 (`vitkit.inference.quantize`) by its fastest engine here.
In every measured case the fastest path must beat fp32 by `INT8_MARGIN` (timed alternately,
best of `ROUNDS`, or up to `MAX_ROUNDS` while the two fastest are close), else fp32 runs:
`auto` is never slower than fp32 by its own measurement.

int8's engine (torch's x86 kernels, oneDNN, ONNX Runtime, torchao: `vitkit.inference.quantize`)
is likewise measured, not assumed (`choose_int8_engine`): which is fastest depends on the CPU
(VNNI, AMX) and the model. `--int8-engine E` pins one. An engine that cannot run the model
(ONNX Runtime where its float graph does not match the model) is not timed, and the reason
says why.

A measured choice is remembered per CPU, torch build, model shape and batch size in
`<cache root>/precision.json` (`vitkit.files.cache_root`), so only the first call pays for
it. Each choice carries a one-line reason that the verbs print.

`--int8` (and `--int8-engine E`) means `--precision int8` (with that engine); with another
`--precision` it is refused (`requested_precision`). Training's `amp=auto` decides by the
machine and the model's width, on AVX512-BF16 without AMX by a matmul measured once per
machine (`training_precision`). Asked for bf16 where such a matmul measures slower than fp32
(an Emerald Rapids Xeon that shows no AMX: 0.5x), `--precision bf16` and `amp=bf16` run it and
say so.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from vitkit.errors import ConfigError, VitkitError
from vitkit.files import cache_root, write_atomic
from vitkit.inference.packed_linear import prepack_linears, prepacking_available
from vitkit.inference.quantize import AUTO as INT8_AUTO
from vitkit.inference.quantize import available_engines, engine_scheme, quantize_int8
from vitkit.runtime import cpu_model_and_flags

__all__ = ["PRECISIONS", "PRECISION_HELP", "NoInt8Engine", "Precision", "apply_precision",
           "autocast_context", "bf16_autocast", "bf16_copy", "choose_int8_engine",
           "choose_precision", "fast_bf16_cpu", "measured_bf16_speedup", "measurement_batch",
           "requested_precision", "run_in_precision", "slow_bf16", "training_precision"]

PRECISIONS = ("fp32", "bf16", "int8", "auto")
BF16_MARGIN = 1.3
INT8_MARGIN = 1.1
WARMUP_CALLS = 1  # untimed calls of each path before auto's rounds
# On AMX, int8 replaces bf16 only when it measures this much faster: with the bf16 copy
# prepacked, bf16 won all five longer timings against oneDNN's int8 on AMX hosts (1.09-1.55x,
# with and without ToMe), where auto's short measurement, on hosts that swing by 25%, put int8
# ahead three times of three with ToMe (docs/runs/cpu-amx).
AMX_BF16_PREFERENCE = 1.3
ROUNDS = 3
MAX_ROUNDS = 7  # auto's rounds while the two fastest paths are within CLOSE of each other
CLOSE = 1.25
PATHS_VERSION = 2  # in remembered keys; raised when measurements change (2: packed bf16)
MATMUL_FLOPS = 2**30  # about the work of `_bf16_matmul_speedup`'s matmul
MAX_MATMUL_ROWS = 65536  # its rows at most (a width-16 model would take 524k)
MATMUL_ROUNDS = 5  # its alternating rounds (fp32, bf16), best of each
MEASURE_BATCH = 8  # at most this many images in auto's measurement (eval, benchmark)
AMP_MIN_WIDTH = 128  # bf16 training on a bf16 CPU pays from this width on (training_precision)
EMULATED_BF16 = ("this CPU has no bf16 matmuls in hardware (AMX or AVX512-BF16), so bf16 is "
                 "emulated and likely slower than fp32")
PRECISION_HELP = ("number format: fp32 (default), bf16 (a bf16 copy of the model on CPUs, "
                  "autocast on CUDA), int8 (dynamic int8 Linear layers by the fastest engine "
                  "measured here, as --int8) or auto (the "
                  "fastest for this machine and model: bf16 on CUDA; on CPUs the fastest of "
                  "bf16 (AMX/AVX512-BF16 only) and int8 by a short measurement, else fp32; "
                  "says what it chose)")


@dataclass(frozen=True)
class Precision:
    """What the model runs in (`name`: fp32, bf16 or int8), why (`reason`), for int8 by
    which engine (`engine`, one of `vitkit.inference.quantize.ENGINES`), and whether an
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


def fast_bf16_cpu(flags: frozenset[str] | None = None) -> str | None:
    """"amx" or "avx512_bf16" when this CPU computes bf16 matmuls in hardware, else None."""
    flags = cpu_model_and_flags()[1] if flags is None else flags
    if "amx_bf16" in flags:
        return "amx"
    if "avx512_bf16" in flags:
        return "avx512_bf16"
    return None


def _bf16_matmul_speedup(width: int) -> float:
    """How many times faster a (rows x width) @ (width x 4 width) matmul runs in bf16 than in
    fp32 on this CPU, rows chosen for about a GFLOP (1,024 to `MAX_MATMUL_ROWS`), so a narrow
    model's measurement is not a fraction of a millisecond that a busy moment decides."""
    rows = min(MAX_MATMUL_ROWS, max(1024, MATMUL_FLOPS // (8 * width * width)))
    generator = torch.Generator().manual_seed(0)  # not the global one: a resumed run's
    a = torch.randn(rows, width, generator=generator)  # random state stays as restored
    b = torch.randn(width, 4 * width, generator=generator)
    a16, b16 = a.bfloat16(), b.bfloat16()
    runs = {"fp32": lambda: a @ b, "bf16": lambda: a16 @ b16}
    times: dict[str, list[float]] = {name: [] for name in runs}
    for run in runs.values():
        run()  # warm-up: kernels chosen, memory allocated
    for _ in range(MATMUL_ROUNDS):  # in turns, so a busy moment hits both
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    return min(times["fp32"]) / min(times["bf16"])


def measured_bf16_speedup(width: int) -> float:
    """`_bf16_matmul_speedup(width)`, remembered per CPU, torch build, thread count and width
    (`<cache root>/precision.json`), so the runs on one machine, and every resume of them,
    decide alike."""
    key = "|".join([f"v{PATHS_VERSION}:bf16-matmul", _cpu_key(), torch.__version__,
                    str(torch.get_num_threads()), str(width)])
    remembered = _remembered().get(key)
    if isinstance(remembered, dict) and isinstance(remembered.get("speedup"), float):
        return remembered["speedup"]
    speedup = _bf16_matmul_speedup(width)
    _remember(key, {"speedup": speedup})
    return speedup


def _cpu_key() -> str:
    """The CPU's model name and a digest of its flags: virtual machines of different
    generations may share a masked name ("Intel(R) Xeon(R) Processor")."""
    name, flags = cpu_model_and_flags()
    digest = hashlib.sha256(" ".join(sorted(flags)).encode()).hexdigest()[:12]
    return f"{name} (flags {digest})"


def slow_bf16(device: torch.device, width: int, flags: frozenset[str] | None = None
              ) -> str | None:
    """Why bf16 is likely slower than fp32 on this CPU for a model `width` wide (emulated, or
    an AVX512-BF16 matmul measured slower), or None (CUDA, AMX, or a bf16 matmul as fast)."""
    if device.type != "cpu":
        return None
    kind = fast_bf16_cpu(flags)
    if kind is None:
        return EMULATED_BF16
    if kind == "avx512_bf16" and (speedup := measured_bf16_speedup(width)) < 1:
        return f"{bf16_matmul_note(width, speedup)}, so bf16 is likely slower"
    return None


def bf16_matmul_note(width: int, speedup: float) -> str:
    """What a bf16 matmul measured (`speedup`) on this AVX512-BF16 CPU without AMX."""
    return (f"a bf16 matmul at width {width} measured {speedup:.2f}x fp32 on this CPU "
            "(AVX512-BF16 without AMX)")


@torch.no_grad()
def _timings(runners: dict[str, Callable[[], object]]) -> dict[str, float]:
    """The best seconds of each runner over `ROUNDS` rounds, timed in turns so a busy moment
    hits all; more rounds, up to `MAX_ROUNDS`, while the two fastest paths other than fp32
    are within `CLOSE` of each other (on a shared AMX host two paths 20% apart once came out
    in the wrong order from three rounds). In inference mode, as the verbs run: with autograd
    recording, the bf16 copy measured 1.37x slower and oneDNN's int8 1.15x on a Zen 4 EPYC
    (B/16 + ToMe r=8), enough to put int8 first where bf16 is faster (AMX)."""
    times: dict[str, list[float]] = {name: [] for name in runners}
    with torch.inference_mode():
        for run in runners.values():
            for _ in range(WARMUP_CALLS):
                run()  # warm-up: kernels chosen, memory allocated
        rounds = 0
        while rounds < ROUNDS or (rounds < MAX_ROUNDS and _undecided(times)):
            for name, run in runners.items():
                start = time.perf_counter()
                run()
                times[name].append(time.perf_counter() - start)
            rounds += 1
    return {name: min(values) for name, values in times.items()}


def _undecided(times: dict[str, list[float]]) -> bool:
    """Whether the two fastest paths (fp32 aside) are within `CLOSE` of each other."""
    best = sorted(min(values) for name, values in times.items() if name != "fp32")
    return len(best) > 1 and best[1] < CLOSE * best[0]


def choose_int8_engine(model: nn.Module, batch: torch.Tensor) -> tuple[str, str]:
    """The fastest int8 engine installed for `model` on `batch` and a line of what each
    measured against fp32 (remembered like `auto`'s choice)."""
    measured = _int8_measurement(model, batch, None)
    return measured["engine"], measured["reason"]


def _int8_measurement(model: nn.Module, batch: torch.Tensor, engine: str | None,
                      with_bf16: bool = False, bf16_preference: float = 1.0,
                      remeasure: bool = False) -> dict[str, object]:
    """{"engine", "reason", "speedup", "remembered"}: `engine` (None or "auto": every
    installed engine, the fastest kept), and bf16 when `with_bf16` (then "engine" may be
    "bf16"; an int8 engine replaces it only when `bf16_preference` times faster), timed
    against fp32 on `batch`; remembered per machine, model and batch, and timed again when
    `remeasure` (a measurement for this model alone: not remembered, so the entry stays for
    the models it was measured on). Raises NoInt8Engine when no path but fp32 can run the
    model; the error of an engine asked for by name is raised as it is."""
    engines = available_engines() if engine in (None, INT8_AUTO) else [engine]
    paths = ["bf16", *engines] if with_bf16 else engines
    preference = bf16_preference if with_bf16 else 1.0
    key = (f"v{PATHS_VERSION}:int8:{'|'.join(paths)}|"
           + (f"prefer-bf16-{preference}|" if preference != 1.0 else "")
           + _measurement_key(model, batch))
    remembered = None if remeasure else _remembered().get(key)
    if remembered and remembered.get("engine") in paths:
        return {**remembered, "reason": f"{remembered['reason']} (measured before)",
                "remembered": True}
    runners = {"fp32": _runner(model, batch)}
    if with_bf16:
        runners["bf16"] = _bf16_runner(model, batch)
    pinned = engine not in (None, INT8_AUTO)
    engine_runners, skipped = _engine_runners(model, batch, engines, pinned)
    if not engine_runners and not with_bf16:
        raise NoInt8Engine("no int8 engine can run this model: " + "; ".join(skipped))
    seconds = _timings(runners | engine_runners)
    fp32 = seconds.pop("fp32")
    fastest = min(seconds, key=lambda name: seconds[name] / (preference if name == "bf16"
                                                            else 1.0))
    each = ", ".join(f"{name} {fp32 / value:.2f}x" for name, value in seconds.items())
    if preference != 1.0:
        each += f" (int8 replaces bf16 only at {preference:g}x its speed here)"
    what = "bf16 and int8 engines" if with_bf16 else "int8 engines"
    measured = {"engine": fastest, "speedup": fp32 / seconds[fastest],
                "reason": f"{what} measured {each} fp32 on this model at batch "
                          f"{len(batch)}" if len(paths) > 1 else
                          f"int8 ({fastest}) measured {fp32 / seconds[fastest]:.2f}x fp32 on "
                          f"this model at batch {len(batch)}"}
    if skipped:
        measured["reason"] += "; " + "; ".join(skipped)
    if not remeasure:
        _remember(key, measured)
    return measured


def _engine_runners(model: nn.Module, batch: torch.Tensor, engines: list[str], pinned: bool
                    ) -> tuple[dict[str, Callable[[], object]], list[str]]:
    """A runner of each int8 engine in `engines` that can run `model`, and a line for each
    that cannot (an export ONNX Runtime cannot take, or one that does not match the model:
    `vitkit.inference.onnx_int8`). A `pinned` engine's error is raised."""
    runners, skipped = {}, []
    for name in engines:
        try:
            runners[name] = _runner(quantize_int8(model, name), batch)
        except VitkitError as exc:
            if pinned:
                raise
            cause = exc.__cause__ if isinstance(exc.__cause__, VitkitError) else exc
            skipped.append(f"{name} not timed ({str(cause).rstrip('.')})")
    return runners, skipped


class NoInt8Engine(ConfigError):
    """No installed int8 engine can run the model (`--precision int8` fails; auto runs fp32)."""


def _bf16_runner(model: nn.Module, batch: torch.Tensor) -> Callable[[], object]:
    """One call of `model` on `batch` in bf16 as `apply_precision` runs it."""
    module, context = apply_precision(model, Precision("bf16", ""), batch.device)

    def run() -> object:
        with context():
            return module(batch)
    return run


def _runner(model: nn.Module, batch: torch.Tensor) -> Callable[[], object]:
    return lambda: model(batch)


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
            measured = _int8_measurement(model, batch, None, remeasure=remeasure)
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
        measured = _int8_measurement(
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


def _measurement_key(model: nn.Module, batch: torch.Tensor) -> str:
    config = getattr(model, "config", None)
    shape = (f"{config.width}x{config.depth}x{config.mlp_dim}/p{config.patch_size}"
             if config is not None else type(model).__name__)
    merged = getattr(model, "merge_r", 0)  # `apply_token_merging`'s r
    shape += f"/merge{merged}" if merged else ""  # ToMe: fewer tokens
    return "|".join([_cpu_key(), torch.__version__, str(torch.get_num_threads()),
                     shape, "x".join(str(d) for d in batch.shape)])


def _store() -> Path:
    return cache_root() / "precision.json"


def _remembered() -> dict[str, dict]:
    try:
        data = json.loads(_store().read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _remember(key: str, entry: dict) -> None:
    data = _remembered()
    data[key] = entry
    text = json.dumps(data, indent=1).encode()
    with contextlib.suppress(OSError):  # a read-only cache: measure again next time
        write_atomic(_store(), lambda stream: stream.write(text))


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


def training_precision(amp: str, device: torch.device, width: int,
                       flags: frozenset[str] | None = None) -> Precision:
    """What `amp=auto|bf16|off` trains in: bf16 with amp=bf16; with amp=auto, bf16 on CUDA,
    on a CPU with AMX for a model at least `AMP_MIN_WIDTH` wide, and on one with AVX512-BF16
    but no AMX where also a bf16 matmul at the model's width measures at least `BF16_MARGIN`
    faster (`measured_bf16_speedup`: remembered per machine, so the runs on one machine
    decide alike; the training set-up also makes the ranks agree and a resume keep its run's
    choice); else fp32. Measured: on a Xeon with AMX, bf16 autocast made the width-48 tutorial
    step 2.4x slower (casts dominate small matmuls) and the width-192 CIFAR step 1.18x faster;
    on a Zen 4 EPYC (AVX512-BF16, no AMX) the CIFAR step 1.51x (16 px) and 1.63x (24 px)
    faster; on an Emerald Rapids Xeon that shows AVX512-BF16 but no AMX, a bf16 matmul ran at
    0.5x fp32 and the width-192 step at 0.54x; without either, CPU bf16 is emulated and slower."""
    if amp == "bf16":
        slow = slow_bf16(device, width, flags)
        return Precision("bf16", f"amp=bf16; {slow}: amp=auto decides by the machine" if slow
                         else "amp=bf16")
    kind = fast_bf16_cpu(flags) if device.type == "cpu" else None
    if amp != "auto":
        return Precision("fp32", f"amp={amp}")
    if device.type == "cuda":
        return Precision("bf16", "amp=auto on CUDA: bf16 autocast")
    if device.type != "cpu":
        return Precision("fp32", f"amp=auto on {device.type}: fp32")
    if kind is None:
        return Precision("fp32", "amp=auto: this CPU has no bf16 matmuls in hardware (AMX or "
                                 "AVX512-BF16), so bf16 would be slower")
    hardware = "AMX" if kind == "amx" else "AVX512-BF16"
    if width < AMP_MIN_WIDTH:
        return Precision("fp32", f"amp=auto: width {width} < {AMP_MIN_WIDTH}, where bf16 casts "
                                 f"cost more than {hardware} saves")
    if kind == "amx":
        return Precision("bf16", f"amp=auto: the CPU has AMX and the model is {width} wide "
                                 f"(>= {AMP_MIN_WIDTH})")
    speedup = measured_bf16_speedup(width)
    if speedup < BF16_MARGIN:
        return Precision("fp32", f"amp=auto: {bf16_matmul_note(width, speedup)}, under the "
                                 f"{BF16_MARGIN}x bf16 must gain to pay for its casts")
    return Precision("bf16", f"amp=auto: the CPU has AVX512-BF16, a bf16 matmul at width "
                             f"{width} measured {speedup:.1f}x fp32 (>= {BF16_MARGIN}x) and the "
                             f"model is {width} wide (>= {AMP_MIN_WIDTH})")


def bf16_autocast(device: torch.device) -> bool:
    """Whether bf16 runs under autocast on `device` (CUDA) rather than as a bf16 copy of the
    model (the CPU: `bf16_copy`)."""
    return device.type != "cpu"


def bf16_copy(model: nn.Module, prepack: bool = True) -> nn.Module:
    """A copy of `model` with bf16 weights and activations that takes and returns float32
    tensors, keeping the model's class and attributes. On the CPU it replaces autocast, which
    casts every weight to bf16 on every call: on a Xeon with AMX (2 threads, B/16, batch 8)
    those casts were 12% of the time, and the copy ran 3.26x fp32 against autocast's 2.62x
    (docs/runs/cpu-amx); on a Zen 4 EPYC 3.21x against 3.15x. The residual stream is bf16 too:
    on the trained CIFAR-10 models of docs/models top-1 moved by 0.06-0.08 points (autocast:
    0.03-0.06). With `prepack`, where oneDNN runs bf16, the linear layers' weights are
    prepacked for it (`vitkit.inference.packed_linear`): the same outputs, faster, but opaque
    to torch.compile (which packs them itself when it freezes weights).

    The classifier (`head`, one small matmul) stays float32, taking the bf16 features: bf16
    outputs hold 8 significant bits, so a model's scores tied often (28-31 distinct values
    over 64 images per label of a small multi-label model: 2.5 points of mAP) and regression
    values were rounded to 1/128 of their scale; with the head in float32, mAP was fp32's."""
    copied = copy.deepcopy(model).to(torch.bfloat16)
    head = getattr(copied, "head", None)
    if isinstance(head, nn.Linear):
        head.float().register_forward_pre_hook(_inputs_to_float32)
    if prepack and prepacking_available():
        prepack_linears(copied)  # the bf16 ones
    copied.register_forward_pre_hook(_inputs_to_bf16)
    copied.register_forward_hook(_output_to_float32)
    return copied


def _inputs_to_float32(module: nn.Module, args: tuple) -> tuple:
    return tuple(a.float() if isinstance(a, torch.Tensor) and a.is_floating_point() else a
                 for a in args)


def _inputs_to_bf16(module: nn.Module, args: tuple) -> tuple:
    return tuple(a.to(torch.bfloat16) if isinstance(a, torch.Tensor) and a.is_floating_point()
                 else a for a in args)


def _output_to_float32(module: nn.Module, args: tuple, output: object) -> object:
    return output.float() if isinstance(output, torch.Tensor) else output


def autocast_context(device: torch.device, dtype: torch.dtype | None
                     ) -> Callable[[], contextlib.AbstractContextManager]:
    """A factory of the context that runs a model under `dtype` autocast on `device` (None:
    no context): how training runs amp=bf16 and CUDA runs `--precision bf16`."""
    if dtype is None:
        return contextlib.nullcontext
    return functools.partial(torch.autocast, device.type, dtype=dtype)


def apply_precision(model: nn.Module, precision: Precision, device: torch.device,
                    compiled: bool = False
                    ) -> tuple[nn.Module, Callable[[], contextlib.AbstractContextManager]]:
    """The model to run (an int8 copy by `precision.engine` for int8; for bf16 on the CPU a
    bf16 copy, `bf16_copy`, its weights prepacked unless it will be `compiled`) and a factory
    of the context to run it in (bf16 autocast for bf16 on CUDA)."""
    if precision.name == "int8":
        return quantize_int8(model, precision.engine or "torch"), contextlib.nullcontext
    if precision.name == "bf16" and not bf16_autocast(device):
        return bf16_copy(model, prepack=not compiled), contextlib.nullcontext
    if precision.name == "bf16":
        return model, autocast_context(device, torch.bfloat16)
    return model, contextlib.nullcontext
