"""Which recipe a run starts from, and the command line's overrides on it: the policy behind
`vitkit train` and `vitkit finetune`, as functions a user can call."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from vitkit.train.config import TrainConfig, checkpoint_train_config, load_train_config

DEFAULT_RECIPE = "digits"


def run_config(recipe: str | None = None, overrides: Sequence[str] = (), *,
               resume: str | None = None, out: str | None = None,
               time_budget: float | None = None, data_dir: str | None = None) -> TrainConfig:
    """The run's TrainConfig: the recipe (with `resume` and no recipe, the checkpoint's),
    then KEY=VALUE overrides, then the flags. With `resume` and no `out`, the run goes on in
    the checkpoint's folder.

    Without a recipe the base is the digits recipe, unless the overrides choose other data
    (`data=folder ...`: TrainConfig's defaults; with `init_from=` not even its model). A
    `recipe` that holds "=" and is no file is the first override (`train epochs=3`).
    """
    overrides = list(overrides)
    if recipe and "=" in recipe and not Path(recipe).exists():  # `train epochs=3`: no recipe
        recipe, overrides = None, [recipe, *overrides]
    if out is None and resume and not any(o.startswith("out_dir=") for o in overrides):
        out = str(Path(resume).parent)
    for flag, key in ((time_budget, "time_budget"), (out, "out_dir"), (data_dir, "data_dir")):
        if flag is not None:
            overrides.append(f"{key}={json.dumps(flag)}")
    if recipe is None and resume:
        return load_train_config(None, overrides, base=checkpoint_train_config(resume))
    if recipe is None and _names_other_data(overrides):  # `train data=folder ...`: defaults
        fine_tuning = any(item.startswith("init_from=") for item in overrides)
        base = {} if fine_tuning else {"model": TrainConfig.model}  # model.X=... changes it
        return load_train_config(None, overrides, base=base)
    return load_train_config(recipe or DEFAULT_RECIPE, overrides)


def finetune_config(weights: str, overrides: Sequence[str] = (), *, data: str | None = None,
                    img_size: int | tuple[int, int] | None = None,
                    weights_dir: str | None = None, resume: str | None = None,
                    out: str | None = None, time_budget: float | None = None,
                    data_dir: str | None = None) -> TrainConfig:
    """The finetune recipe started from `weights`; the flags become overrides, as in
    `run_config`."""
    overrides = [f"init_from={json.dumps(weights)}", *overrides]
    for flag, key in ((data, "data"), (img_size, "model.img_size"),
                      (weights_dir, "weights_dir")):
        if flag is not None:
            overrides.append(f"{key}={json.dumps(flag)}")
    return run_config("finetune", overrides, resume=resume, out=out, time_budget=time_budget,
                      data_dir=data_dir)


def _names_other_data(overrides: list[str]) -> bool:
    """Whether KEY=VALUE overrides choose data other than the embedded digits (then a run with
    no recipe starts from TrainConfig's defaults, not from the digits recipe)."""
    data = [item.partition("=")[2].strip('"') for item in overrides if item.startswith("data=")]
    return bool(data) and data[-1] != "digits"

