"""Which int8 engine runs a model fastest here: measured, not assumed, because the answer
depends on the CPU (VNNI, AMX) and the model.

`measure_int8` times every installed engine (`vitkit.inference.int8_engines`), and bf16 too
when asked, against fp32 on the model at the batch (`vitkit.inference.autotune.best_times`)
and remembers the outcome per machine, model shape and batch. An engine that cannot run the
model (ONNX Runtime where its graph does not match the model) is not timed, and the reason
says why. `choose_int8_engine` is the engine alone.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from vitkit.errors import ConfigError, VitkitError
from vitkit.inference.autotune import PATHS_VERSION, best_times, remember, remembered
from vitkit.inference.bf16 import bf16_model
from vitkit.inference.cpu_probes import cpu_key
from vitkit.inference.int8_engines import AUTO, available_engines, quantize_by_engine

__all__ = ["NoInt8Engine", "choose_int8_engine", "measure_int8"]


class NoInt8Engine(ConfigError):
    """No installed int8 engine can run the model (`--precision int8` fails; auto runs fp32)."""


def choose_int8_engine(model: nn.Module, batch: torch.Tensor) -> tuple[str, str]:
    """The fastest int8 engine installed for `model` on `batch` and a line of what each
    measured against fp32 (remembered like `auto`'s choice)."""
    measured = measure_int8(model, batch, None)
    return measured["engine"], measured["reason"]


def measure_int8(model: nn.Module, batch: torch.Tensor, engine: str | None,
                 with_bf16: bool = False, bf16_preference: float = 1.0,
                 remeasure: bool = False) -> dict[str, object]:
    """{"engine", "reason", "speedup", "remembered"}: `engine` (None or "auto": every
    installed engine, the fastest kept), and bf16 when `with_bf16` (then "engine" may be
    "bf16"; an int8 engine replaces it only when `bf16_preference` times faster), timed
    against fp32 on `batch`; remembered per machine, model and batch, and timed again when
    `remeasure` (a measurement for this model alone: not remembered, so the entry stays for
    the models it was measured on). Raises NoInt8Engine when no path but fp32 can run the
    model; the error of an engine asked for by name is raised as it is."""
    engines = available_engines() if engine in (None, AUTO) else [engine]
    paths = ["bf16", *engines] if with_bf16 else engines
    preference = bf16_preference if with_bf16 else 1.0
    key = (f"v{PATHS_VERSION}:int8:{'|'.join(paths)}|"
           + (f"prefer-bf16-{preference}|" if preference != 1.0 else "")
           + _measurement_key(model, batch))
    known = None if remeasure else remembered().get(key)
    if known and known.get("engine") in paths:
        return {**known, "reason": f"{known['reason']} (measured before)", "remembered": True}
    runners = {"fp32": _runner(model, batch)}
    if with_bf16:
        runners["bf16"] = _bf16_runner(model, batch)
    pinned = engine not in (None, AUTO)
    engine_runners, skipped = _engine_runners(model, batch, engines, pinned)
    if not engine_runners and not with_bf16:
        raise NoInt8Engine("no int8 engine can run this model: " + "; ".join(skipped))
    seconds = best_times(runners | engine_runners)
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
        remember(key, measured)
    return measured


def _engine_runners(model: nn.Module, batch: torch.Tensor, engines: list[str], pinned: bool
                    ) -> tuple[dict[str, Callable[[], object]], list[str]]:
    """A runner of each int8 engine in `engines` that can run `model`, and a line for each
    that cannot (an export ONNX Runtime cannot take, or one that does not match the model:
    `vitkit.inference.onnx_int8`). A `pinned` engine's error is raised."""
    runners, skipped = {}, []
    for name in engines:
        try:
            runners[name] = _runner(quantize_by_engine(model, name), batch)
        except VitkitError as exc:
            if pinned:
                raise
            cause = exc.__cause__ if isinstance(exc.__cause__, VitkitError) else exc
            skipped.append(f"{name} not timed ({str(cause).rstrip('.')})")
    return runners, skipped


def _bf16_runner(model: nn.Module, batch: torch.Tensor) -> Callable[[], object]:
    """One call of `model` on `batch` in bf16 as `--precision bf16` runs it."""
    module, context = bf16_model(model, batch.device)

    def run() -> object:
        with context():
            return module(batch)
    return run


def _runner(model: nn.Module, batch: torch.Tensor) -> Callable[[], object]:
    return lambda: model(batch)


def _measurement_key(model: nn.Module, batch: torch.Tensor) -> str:
    config = getattr(model, "config", None)
    shape = (f"{config.width}x{config.depth}x{config.mlp_dim}/p{config.patch_size}"
             if config is not None else type(model).__name__)
    merged = getattr(model, "merge_r", 0)  # `apply_token_merging`'s r
    shape += f"/merge{merged}" if merged else ""  # ToMe: fewer tokens
    return "|".join([cpu_key(), torch.__version__, str(torch.get_num_threads()),
                     shape, "x".join(str(d) for d in batch.shape)])
