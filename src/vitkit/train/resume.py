"""Resuming a run from its checkpoint: refused when the recipe trains another model or with
another optimizer; else the weights, EMA, optimizer, random states and position come back
exactly, and a new length (`epochs`, `total_steps`, `time_budget`) re-plans the run."""

from __future__ import annotations

import logging
import shlex
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch.optim.swa_utils import AveragedModel

from vitkit.config import ViTConfig
from vitkit.errors import CheckpointError, ConfigError, first_few
from vitkit.model.vit import VisionTransformer
from vitkit.tasks import make_task
from vitkit.train.checkpoint import Position, TrainCheckpoint, read_checkpoint
from vitkit.train.config import TrainConfig, model_config_of
from vitkit.train.plan import RunPlan

log = logging.getLogger("vitkit.train")
# what the batch order (`BatchOrder`) is drawn in: another value regroups the epochs
REGROUPING_KEYS = ("batch_size", "train_limit")


def check_resumable(state: TrainCheckpoint, path: str | Path, cfg: TrainConfig,
                    config: ViTConfig) -> None:
    """Refuse a checkpoint trained with another optimizer or model config than `cfg`'s."""
    check_same_optimizer(state, path, cfg.optimizer)
    check_same_model(state, path, config)


def check_recipe_resumable(recipe: dict[str, Any], path: str | Path) -> None:
    """Before a recipe's own checks (a warmup longer than the run, ...): refuse a checkpoint
    trained with another optimizer or model than `recipe` (a dict of training keys) names,
    which is the real problem when both are wrong. The head (and for data=arrays the input
    channels), sized from the data, is compared once the data is open (`check_resumable`); a
    fine-tuning recipe (`init_from`) takes the model from the checkpoint, so its source
    weights and model overrides must be the run's (`check_same_fine_tune`)."""
    state = read_checkpoint(path)
    if recipe.get("init_from"):
        check_same_fine_tune(state, path, recipe)
        return
    check_same_optimizer(state, path, str(recipe.get("optimizer", TrainConfig.optimizer)))
    try:
        config = model_config_of(recipe.get("model", TrainConfig.model))
    except (ConfigError, TypeError, ValueError):
        return  # TrainConfig names what is wrong with the model
    config = with_checkpoint_head(config, state.trained.config, recipe.get("model"),
                                  recipe.get("data"))
    check_same_model(state, path, config)


def check_same_fine_tune(state: TrainCheckpoint, path: str | Path,
                         recipe: dict[str, Any]) -> None:
    """Refuse resuming a run as a fine-tune of other weights than it began from (or of any,
    for a run trained from scratch), or with other model overrides (`model.dropout=...`,
    `--img-size`): its model is rebuilt from the checkpoint, so they would be recorded as the
    run's without acting."""
    saved, quoted = state.train_config, shlex.quote(str(path))
    fix = (f"resume with the run's own settings (vitkit train --resume {quoted}), or "
           "fine-tune anew into another folder (--out)")
    if not saved.get("init_from"):
        raise ConfigError(f"{path} was trained from scratch, not fine-tuned from "
                          f"{recipe['init_from']}: resume it with vitkit train --resume "
                          f"{quoted}, or fine-tune from it into another folder (vitkit "
                          f"finetune {quoted} --out NEW)")
    if not _same_source(str(recipe["init_from"]), str(saved["init_from"]), state.trained_in):
        raise ConfigError(f"{path} fine-tunes {saved['init_from']}, not {recipe['init_from']}: "
                          f"a resumed run keeps its weights; {fix}")
    ours, theirs = _overrides(recipe.get("model")), _overrides(saved.get("model"))
    changed = [f"{key}: checkpoint {theirs.get(key, 'unset')} vs "
               f"{ours.get(key, 'unset')}" for key in sorted({*ours, *theirs})
               if ours.get(key) != theirs.get(key)]
    if changed:
        raise ConfigError(f"{path} was fine-tuned with other model settings "
                          f"({'; '.join(changed)}): a resumed run keeps its model; {fix}")


def _same_source(given: str, recorded: str, trained_in: str | None) -> bool:
    """The same weights: equal names, or paths to the same file or folder (a relative
    recorded path read from the folder the run trained in)."""
    if given == recorded:
        return True
    mine, theirs = Path(given).expanduser(), Path(recorded).expanduser()
    if not theirs.is_absolute() and trained_in:
        theirs = Path(trained_in) / theirs
    return mine.exists() and theirs.exists() and mine.resolve() == theirs.resolve()


def _overrides(model: Any) -> dict[str, Any]:
    """A fine-tuning recipe's `model` as the overrides a recipe file holds (tuples as
    lists): none for TrainConfig's default (a run that set no model key), a variant for
    another name."""
    if model is None or model == TrainConfig.model:
        return {}
    if not isinstance(model, dict):
        return {"variant": model}
    return {key: list(value) if isinstance(value, tuple) else value
            for key, value in model.items()}


def with_checkpoint_head(config: ViTConfig, saved: ViTConfig, model: Any, data: Any
                         ) -> ViTConfig:
    """`config` with the checkpoint's head size (and, for data=arrays, input channels)
    wherever the recipe's `model` leaves them unset: the data sized them when the run began,
    so a resumed run keeps them (one of an older vitkit, which sized only some data's heads,
    included)."""
    def sets(key: str) -> bool:
        return isinstance(model, dict) and key in model

    if not sets("num_classes"):
        config = config.replace(num_classes=saved.num_classes)
    if data == "arrays" and not sets("in_chans"):
        config = config.replace(in_chans=saved.in_chans)
    return config


def check_same_classes(state: TrainCheckpoint, path: str | Path, cfg: TrainConfig,
                       classes: list[str]) -> None:
    """Refuse resuming a classifier on data whose classes (`classes`, as the data names
    them) are not the ones it was trained on: the head and its class names are the
    checkpoint's, so the run would train other classes under its names (more failed on the
    labels; fewer or renamed trained on without a word). Not compared: data or files that
    name no classes, and CIFAR or Hugging Face classes named only by their indices
    "0".."K-1", as many as the run's (a CIFAR copy without its names file)."""
    saved, task = list(state.trained.class_names), state.trained.task
    if not saved or not classes or saved == classes or not make_task(task).class_labels:
        return
    unnamed = cfg.data.startswith(("cifar", "hf:")) and len(saved) == len(classes) and \
        (_only_indices(saved) or _only_indices(classes))
    if unnamed:
        return
    recorded = state.train_config
    given = " ".join([f"--{flag} {shlex.quote(str(value))}" for flag, value in
                      (("data", cfg.data), ("data-dir", cfg.data_dir)) if value]
                     + _hf_keys(cfg))
    finetune = f"fine-tune from it on this data: vitkit finetune {shlex.quote(str(path))} " \
        f"{given}" if len(classes) > 1 else \
        "fine-tune from it on data of two classes or more (a classifier needs two; this holds one)"
    found = (f"it was trained on {len(saved)} classes ({first_few(saved)}) but "
             f"{cfg.data_dir or cfg.data} holds {len(classes)} ({first_few(classes)})")
    if _is_recorded_data(cfg, recorded):
        raise CheckpointError(f"cannot resume from {path}: {found}: the run's data has changed "
                              f"since it trained. Restore its classes to resume, or {finetune}")
    own = " ".join(f"{key}={recorded[key]}" for key in ("data", "data_dir") if recorded.get(key))
    raise CheckpointError(
        f"cannot resume from {path}: {found}. Resume without --data/--data-dir (data=, "
        "data_dir=): the run reads the data it was trained on" + (f" ({own})" if own else "")
        + f"; or {finetune}")


def _hf_keys(cfg: TrainConfig) -> list[str]:
    """The keys that say which part of a Hugging Face dataset `cfg` reads (its splits, and
    streaming), as KEY=VALUE arguments; none for other data."""
    if not cfg.data.startswith("hf:"):
        return []
    keys = [shlex.quote(f"{key}={value}") for key, value in
            (("train_split", cfg.train_split), ("split", cfg.split)) if value]
    return keys + (["streaming=true"] if cfg.streaming else [])


def _is_recorded_data(cfg: TrainConfig, recorded: dict[str, Any]) -> bool:
    """Whether `cfg` reads the data the run recorded: its source, and its folder as recorded
    or as found from the folder the run trained in (which ends in the recorded path)."""
    data_dir = recorded.get("data_dir")
    if cfg.data != recorded.get("data") or bool(cfg.data_dir) != bool(data_dir):
        return False
    if not data_dir:
        return True
    tail = Path(str(data_dir)).parts
    return Path(str(cfg.data_dir)).parts[-len(tail):] == tail


def _only_indices(names: list[str]) -> bool:
    return names == [str(index) for index in range(len(names))]


def check_same_optimizer(state: TrainCheckpoint, path: str | Path, optimizer: str) -> None:
    used = state.train_config.get("optimizer", "adamw")
    if used != optimizer:
        raise CheckpointError(f"cannot resume from {path}: it was trained with optimizer="
                              f"{used} but the config says {optimizer}. Resume with "
                              f"optimizer={used}.")


def check_same_model(state: TrainCheckpoint, path: str | Path, config: ViTConfig) -> None:
    """Refuse a checkpoint whose model differs from `config` (the image size aside: a
    progressive-resizing run is saved at its current size)."""
    saved = state.trained.config
    if saved.replace(img_size=config.img_size) != config:
        diffs = [f"{k}: checkpoint {v!r} vs config {getattr(config, k)!r}"
                 for k, v in saved.to_dict().items()
                 if k != "name" and v != config.to_dict()[k]]
        raise CheckpointError(f"cannot resume from {path}: it was trained with another model "
                              f"config ({'; '.join(diffs)}). Resume with the same recipe "
                              "(or without one: the checkpoint's own).")


def restore(state: TrainCheckpoint, path: str | Path, model: VisionTransformer,
            ema: AveragedModel | None, optimizer: torch.optim.Optimizer,
            generator: torch.Generator) -> Position:
    """Load the checkpoint's weights (at its resolution), EMA, optimizer and random states;
    the position it was saved at."""
    size = state.trained.config.img_size
    model.set_image_size(size)
    if ema is not None:
        ema.module.set_image_size(size)
    model.load_state_dict(state.trained.model)
    optimizer.load_state_dict(state.optimizer)
    if ema is not None and state.trained.ema is not None:
        ema.load_state_dict(state.trained.ema)
    torch.set_rng_state(state.torch_rng)
    generator.set_state(state.augment_rng)
    position = replace(state.position, history=list(state.position.history))
    log.info("resumed from %s at epoch %d, batch %d", path, position.epoch, position.batch)
    return position


def replan_if_length_changed(cfg: TrainConfig, saved: dict[str, Any], plan: RunPlan,
                             pos: Position, batches_per_epoch: int) -> None:
    """Resuming with another `epochs`, `total_steps`, `time_budget`, `batch_size` or
    `train_limit`, or over data that makes another number of batches per epoch (a folder
    that gained images), re-plans the run (`accum_steps` splits the same batches: it changes
    nothing here).

    The same command resumes exactly; a longer one extends the run (also a finished one),
    as in timm and Hugging Face: the schedule is stretched to the new length from the
    current step on. A new time budget is fitted after the first steps are timed. New
    batches take effect at an epoch's end (where `vitkit train` writes last.pt): the epochs
    left are counted in the new batches.
    """
    new = cfg.to_dict()
    regrouping = [key for key in REGROUPING_KEYS if key in saved and saved[key] != new[key]]
    epoch_changed = pos.batches_per_epoch not in (0, batches_per_epoch)
    if (regrouping or epoch_changed) and pos.batch:
        kept = " ".join(f"{key}={saved[key]}" for key in regrouping)
        why = (f"({kept}): resume with {kept}" if regrouping else
               f"({pos.batches_per_epoch} per epoch; the data now makes {batches_per_epoch}): "
               "resume over the data it began with")
        raise ConfigError(
            f"the checkpoint stopped within epoch {pos.epoch + 1} (after its batch {pos.batch}), "
            f"whose rest is read in the batches it began with {why}; other batches can start "
            "at an epoch's end")
    changes = [f"{key} {saved[key]} -> {new[key]}"
               for key in ("epochs", "total_steps", "time_budget", *REGROUPING_KEYS)
               if key in saved and saved[key] != new[key]]
    if epoch_changed and not regrouping:
        changes.append(f"batches per epoch {pos.batches_per_epoch} -> {batches_per_epoch}")
    if not changes:
        return
    changed = ", ".join(changes)
    before = pos.total_steps
    pos.total_steps = plan.planned_steps
    if not cfg.total_steps:  # epochs left, in the current batches (the steps done may be of others)
        done = pos.epoch * batches_per_epoch + pos.batch
        pos.total_steps = pos.step + max(0, plan.planned_steps - done)
    if cfg.time_budget and pos.elapsed >= cfg.time_budget:
        log.warning("resume: %s, but the checkpoint already used %.0f s of the %.0f s "
                    "budget; raise time_budget to train on", changed, pos.elapsed,
                    cfg.time_budget)
        pos.total_steps = pos.step
    elif pos.total_steps <= pos.step:
        log.warning("resume: %s, but the checkpoint is already at step %d of the %d now "
                    "planned; nothing to train", changed, pos.step, pos.total_steps)
    else:
        log.warning("resume: %s; the run is re-planned from %d to %d steps (the learning "
                    "rate schedule is stretched from step %d on)", changed, before,
                    pos.total_steps, pos.step)
