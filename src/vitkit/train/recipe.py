"""Which recipe a run starts from, and the command line's overrides on it: the policy behind
`vitkit train` and `vitkit finetune`, as functions a user can call."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path

from vitkit.catalog import lookup, unknown_name_error
from vitkit.errors import ConfigError
from vitkit.train.config import (
    NESTED_KEYS,
    TrainConfig,
    checkpoint_train_config,
    load_train_config,
    recipe_names,
)

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
    _refuse_settings_as_words(recipe, overrides)
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
    `run_config`. A `weights` that names nothing is refused first, before any setting."""
    if lookup(weights).kind == "unknown":
        raise unknown_name_error(weights, weights=True)
    overrides = [f"init_from={json.dumps(weights)}", *overrides]
    for flag, key in ((data, "data"), (img_size, "model.img_size"),
                      (weights_dir, "weights_dir")):
        if flag is not None:
            overrides.append(f"{key}={json.dumps(flag)}")
    return run_config("finetune", overrides, resume=resume, out=out, time_budget=time_budget,
                      data_dir=data_dir)


def is_setting_key(key: str) -> bool:
    """Whether `key` is a training setting a KEY=VALUE override sets: a TrainConfig field,
    or model.FIELD / augment.FIELD."""
    parent, _, leaf = key.rpartition(".")
    if not parent:
        return key in {f.name for f in dataclasses.fields(TrainConfig)}
    return parent in NESTED_KEYS and (
        leaf in {f.name for f in dataclasses.fields(NESTED_KEYS[parent])}
        or (parent, leaf) == ("model", "variant"))


def setting_example(key: str, value: str | None) -> str:
    """"epochs=3": how a setting is written, with `value` (or an ellipsis) filled in."""
    return f"{key}={value if value is not None else '...'}"


def _refuse_settings_as_words(recipe: str | None, overrides: list[str]) -> None:
    """`train epochs 3`: a setting's name and its value as two words, where KEY=VALUE was
    meant (the recipe slot, or a word among the overrides, that is no recipe but a key)."""
    words = [recipe, *overrides] if recipe and not _is_recipe(recipe) else overrides
    for index, word in enumerate(words):
        if word and "=" not in word and is_setting_key(word):
            following = words[index + 1] if index + 1 < len(words) else None
            value = following if following is not None and "=" not in following else None
            what = "no recipe" if word == recipe else "not KEY=VALUE"
            raise ConfigError(f"{word!r} is {what}: training settings are KEY=VALUE, e.g. "
                              f"{setting_example(word, value)}")


def _is_recipe(name: str) -> bool:
    return Path(name).exists() or name in recipe_names()


def _names_other_data(overrides: list[str]) -> bool:
    """Whether KEY=VALUE overrides choose data other than the embedded digits (then a run with
    no recipe starts from TrainConfig's defaults, not from the digits recipe)."""
    data = [item.partition("=")[2].strip('"') for item in overrides if item.startswith("data=")]
    return bool(data) and data[-1] != "digits"

