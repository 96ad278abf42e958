"""Which recipe a run starts from, and the command line's overrides on it: the policy behind
`vitkit train` and `vitkit finetune`, as functions a user can call.

Data is never chosen silently: a `--data-dir` without `data=` is read as an image folder when
it holds one (else refused, naming data=folder and data=cifar10), and `vitkit finetune RUN`
fine-tunes on the data the run recorded unless `--data` names other data; each says so in
one log line.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vitkit.catalog import lookup, unknown_name_error
from vitkit.data.sources.folder import is_image_folder
from vitkit.errors import ConfigError, VitkitError
from vitkit.train.checkpoint import resume_path
from vitkit.train.config import (
    NESTED_KEYS,
    TrainConfig,
    checkpoint_train_config,
    recipe_names,
    recipe_with_overrides,
    shipped_recipe,
)
from vitkit.train.resume import check_recipe_resumable
from vitkit.weights.formats.run_folder import WEIGHTS_FILES, is_run_folder

DEFAULT_RECIPE = "digits"
# What a run records about its data beyond `data` and `data_dir` that fine-tuning on the same
# Hugging Face dataset needs (its splits and reading mode).
HF_DATA_KEYS = ("train_split", "split", "streaming")
log = logging.getLogger("vitkit.train")


def _is_a_file(text: str) -> bool:
    """Whether `text` names an existing path (a name too long for the file system is none)."""
    try:
        return Path(text).exists()
    except OSError:
        return False


def run_config(recipe: str | None = None, overrides: Sequence[str] = (), *,
               resume: str | None = None, out: str | None = None,
               time_budget: float | None = None, data: str | None = None,
               data_dir: str | None = None) -> TrainConfig:
    """The run's TrainConfig: the recipe (with `resume` and no recipe, the checkpoint's),
    then KEY=VALUE overrides, then the flags. With `resume` and no `out`, the run goes on in
    the checkpoint's folder.

    Without a recipe the base is the digits recipe, unless the overrides choose other data
    (`data=folder ...`: TrainConfig's defaults; with `init_from=` not even its model). A
    `recipe` that holds "=" and is no file is the first override (`train epochs=3`). A
    `data_dir` without `data=` that holds an image folder trains on it (`data=folder`; with no
    recipe, from TrainConfig's defaults, as `data=folder` names it). With
    `resume` and a recipe, a checkpoint of another model or optimizer is refused before the
    recipe's own checks.
    """
    overrides = list(overrides)
    if recipe and "=" in recipe and not _is_a_file(recipe):  # `train epochs=3`: no recipe
        recipe, overrides = None, [recipe, *overrides]
    resume = str(resume_path(resume)) if resume else None
    _refuse_settings_as_words(recipe, overrides)
    if out is None and resume and not any(o.startswith("out_dir=") for o in overrides):
        out = str(Path(resume).parent)
    for flag, key in ((time_budget, "time_budget"), (out, "out_dir"), (data, "data"),
                      (data_dir, "data_dir")):
        if flag is not None:
            overrides.append(f"{key}={json.dumps(flag)}")
    if recipe is None and resume:
        base = checkpoint_train_config(resume, find_data_dir=not _names_data_dir(overrides))
        return build_config(None, overrides, base=_without_other_datas_folder(base, overrides),
                            resume=resume)
    if resume and not _names_data_dir(overrides):
        overrides += _the_runs_data_folder(recipe or DEFAULT_RECIPE, overrides, resume)
    if recipe is None and not resume:
        overrides += _folder_of_images(overrides)
    if recipe is None and _names_other_data(overrides):  # `train data=folder ...`: defaults
        fine_tuning = any(item.startswith("init_from=") for item in overrides)
        base = {} if fine_tuning else {"model": TrainConfig.model}  # model.X=... changes it
        return build_config(None, overrides, base=base)
    return build_config(recipe or DEFAULT_RECIPE, overrides, resume=resume)


def build_config(recipe: str | None, overrides: list[str], base: dict[str, Any] | None = None,
                 resume: str | None = None) -> TrainConfig:
    """The recipe (or `base`) with `overrides`, its data chosen (`choose_data`); a `resume`
    checkpoint of another model is refused before the config's own checks."""
    keys = recipe_with_overrides(recipe, overrides, base)
    if resume:
        check_recipe_resumable(keys, resume)
    choose_data(keys, data_named=_names_data(overrides) or bool(base))
    _refuse_default_model_on_digits(recipe, keys)
    return TrainConfig.from_dict(keys)


def _refuse_default_model_on_digits(recipe: str | None, keys: dict[str, Any]) -> None:
    """A recipe file of one's own that names no model and trains on the digits: TrainConfig's
    default model cannot take them. Refused here, saying that a recipe file is a whole recipe
    and giving the digits recipe's model to paste, rather than at the data check, whose fix
    (model.in_chans=1) only leads to the next mismatch (the image size)."""
    if not recipe or not Path(recipe).is_file() or "model" in keys or keys.get("init_from") or \
            keys.get("data", TrainConfig.data) != "digits":
        return  # (a shipped recipe without a model, finetune, is for init_from=)
    digits_model = json.dumps(shipped_recipe(DEFAULT_RECIPE)["model"])
    raise ConfigError(
        f"recipe {recipe} names no model, so the run would use TrainConfig's default, "
        f"{TrainConfig.model} (224x224, 3 channels), which cannot take the digits (8x8, 1 "
        "channel): a recipe file is a whole recipe, and the keys it leaves out take "
        "TrainConfig's defaults, not the digits recipe's. To change the digits recipe, give "
        f"its keys as KEY=VALUE arguments (vitkit train {DEFAULT_RECIPE} epochs=5), or add the "
        f"digits recipe's model to {recipe}: \"model\": {digits_model}")


def choose_data(keys: dict[str, Any], data_named: bool) -> None:
    """A `data_dir` with no data named (`data=`, `--data`, or the recipe a resumed checkpoint
    records) that would land on a recipe's default data (the embedded digits, or a
    fine-tuning recipe's CIFAR where the folder holds none): an image folder becomes
    `data=folder` (logged); anything else is left for TrainConfig to refuse, naming the
    sources that read a folder. (A recipe that trains on CIFAR from scratch keeps it.)"""
    data_dir = keys.get("data_dir")
    data = keys.get("data", TrainConfig.data)
    if data_named or not data_dir or (data != "digits" and not (
            keys.get("init_from") and data in ("cifar10", "cifar100")
            and not _holds_cifar(data, data_dir))):
        return
    if is_image_folder(data_dir):
        keys["data"] = "folder"
        log.info("--data-dir %s holds an image folder: training on data=folder (data=... "
                 "chooses another source)", data_dir)


def _holds_cifar(data: str, data_dir: str) -> bool:
    """Whether `data_dir` (or a folder in it) holds `data`'s binary files."""
    from vitkit.data.sources.cifar import find_cifar_dir

    try:
        find_cifar_dir(data, data_dir)
    except VitkitError:
        return False
    return True


def finetune_config(weights: str, overrides: Sequence[str] = (), *, data: str | None = None,
                    img_size: int | tuple[int, int] | None = None,
                    weights_dir: str | None = None, resume: str | None = None,
                    out: str | None = None, time_budget: float | None = None,
                    data_dir: str | None = None) -> TrainConfig:
    """The finetune recipe started from `weights`; the flags become overrides, as in
    `run_config`. A `weights` that names nothing is refused first, before any setting.
    Without `data` (or `data=`), weights from a vitkit run fine-tune on the data that run
    recorded (and its folder, unless `data_dir` is given); other weights on the recipe's."""
    if lookup(weights).kind == "unknown":
        raise unknown_name_error(weights, weights=True)
    overrides = [f"init_from={json.dumps(weights)}", *overrides]
    if data is None and not _names_data(overrides) and not resume:  # resumed: the run's data
        keep_data_dir = data_dir is None and not _names_data_dir(overrides)
        overrides += recorded_data_overrides(weights, keep_data_dir)
    for flag, key in ((data, "data"), (img_size, "model.img_size"),
                      (weights_dir, "weights_dir")):
        if flag is not None:
            overrides.append(f"{key}={json.dumps(flag)}")
    # resumed, the checkpoint's own recipe is the base (as `vitkit train --resume`), not the
    # finetune recipe's defaults (its batch of 512, its data)
    return run_config(None if resume else "finetune", overrides, resume=resume, out=out,
                      time_budget=time_budget, data_dir=data_dir)


def recorded_data_overrides(weights: str, keep_data_dir: bool) -> list[str]:
    """`data=...` (and `data_dir=...` when `keep_data_dir`) overrides for the data a vitkit
    run or training checkpoint recorded, logged; none (and a log line naming the recipe's
    default) for other weights."""
    recorded = recorded_recipe(weights, find_data_dir=keep_data_dir)
    if not recorded or not recorded.get("data"):
        log.info("fine-tuning on the finetune recipe's data (--data chooses it: digits, "
                 "cifar10, cifar100, folder or hf:NAME_OR_PATH)")
        return []
    keys = ["data", *(["data_dir"] if keep_data_dir else [])]
    if str(recorded["data"]).startswith("hf:"):
        keys += HF_DATA_KEYS
    chosen = {key: recorded[key] for key in keys if recorded.get(key) is not None}
    shown = " ".join(f"{key}={value}" for key, value in chosen.items())
    log.info("fine-tuning on %s, the data %s was trained on (--data chooses other data)",
             shown, weights)
    return [f"{key}={json.dumps(value)}" for key, value in chosen.items()]


def recorded_recipe(weights: str, find_data_dir: bool = True) -> dict[str, Any] | None:
    """The training recipe a vitkit run folder or training checkpoint records (its relative
    data folder found from where it trained, unless another is given: `find_data_dir`
    false); None for other weights (names, Hub repositories, foreign files)."""
    path = Path(weights).expanduser()
    if is_run_folder(path):
        path = next(path / name for name in WEIGHTS_FILES if (path / name).is_file())
    if not path.is_file():
        return None
    try:
        return checkpoint_train_config(path, find_data_dir)
    except VitkitError:  # a weights file that is not a vitkit training checkpoint
        return None


def _the_runs_data_folder(recipe: str, overrides: list[str], resume: str) -> list[str]:
    """A resumed run's data folder as an override, when a recipe is given that names the
    run's data but no folder (`vitkit train cifar10 epochs=80 --resume ...` of a run
    trained with --data-dir): the recipe alone would look in the default place."""
    keys = recipe_with_overrides(recipe, overrides)
    run = checkpoint_train_config(resume)
    if keys.get("data_dir") or not run.get("data_dir") or \
            keys.get("data", TrainConfig.data) != run.get("data"):
        return []
    log.info("resume: data=%s from the run's folder %s (data_dir=... reads another)",
             run["data"], run["data_dir"])
    return [f"data_dir={json.dumps(run['data_dir'])}"]


def _without_other_datas_folder(recipe: dict[str, Any], overrides: list[str]
                                ) -> dict[str, Any]:
    """A resumed run's recipe less its data folder when the overrides name other data and
    no folder (`--data cifar10` on a run of data=folder data_dir=pets: pets is no CIFAR);
    the class check that follows then says whether the run can go on with that data."""
    named = [item.partition("=")[2] for item in overrides if item.startswith("data=")]
    if not named or _names_data_dir(overrides) or not recipe.get("data_dir"):
        return recipe
    try:
        data = json.loads(named[-1])
    except ValueError:
        data = named[-1]
    if data == recipe.get("data"):
        return recipe
    log.info("data=%s is not the run's data=%s: its data_dir=%s is not read", data,
             recipe.get("data"), recipe["data_dir"])
    return {key: value for key, value in recipe.items() if key != "data_dir"}


def _folder_of_images(overrides: list[str]) -> list[str]:
    """`data=folder` (logged) for a `data_dir` that holds an image folder when no data is
    named and no recipe given (`vitkit train --data-dir pets`): the run is then the one
    `vitkit train data=folder data_dir=pets` starts, with TrainConfig's defaults (Ti/16 at
    224 px, the head sized from the class folders), not the digits recipe's 8x8 model."""
    folders = [item.partition("=")[2] for item in overrides if item.startswith("data_dir=")]
    if _names_data(overrides) or not folders:
        return []
    try:
        folder = json.loads(folders[-1])
    except ValueError:
        folder = folders[-1]
    if not isinstance(folder, str) or not is_image_folder(folder):
        return []  # left for TrainConfig to refuse, naming data=folder and data=cifar10
    log.info("--data-dir %s holds an image folder: training on data=folder with TrainConfig's "
             "defaults, as `vitkit train data=folder data_dir=%s` does (a recipe or data=... "
             "chooses otherwise)", folder, folder)
    return ["data=folder"]


def _names_data_dir(overrides: list[str]) -> bool:
    """Whether KEY=VALUE overrides give the data folder (`data_dir=...`, or --data-dir)."""
    return any(item.startswith("data_dir=") for item in overrides)


def _names_data(overrides: list[str]) -> bool:
    """Whether KEY=VALUE overrides name the data (`data=...`)."""
    return any(item.startswith("data=") for item in overrides)


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
