"""`TrainConfig`: a training recipe as data (JSON), with `key=value` overrides."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from vitkit.config import ViTConfig, variant_config
from vitkit.data.augment import AugmentConfig
from vitkit.errors import CheckpointError, ConfigError
from vitkit.fieldtypes import check_fields, check_known_keys, check_value, did_you_mean, parse_text
from vitkit.files import check_json_size, parse_json, relative_data_dir_note
from vitkit.inference.tta import TTA_MODES
from vitkit.runtime import check_device
from vitkit.tasks import LOSSES, TASKS, loss_suggestion

LOG_FORMATS = ("csv", "jsonl", "tensorboard")
# Overrides with keys inside: model.depth=4 (a ViTConfig field), augment.flip=false.
NESTED_KEYS = {"model": ViTConfig, "augment": AugmentConfig}


def _require(ok: bool, message: str, value: Any) -> None:
    """Raise ConfigError(message with `value` filled in) unless `ok`."""
    if not ok:
        raise ConfigError(message.format(value))


@dataclass
class TrainConfig:
    """Everything a training run needs besides the data files themselves."""

    # A variant name, or a dict: {"variant": "Ti/4", ...ViTConfig overrides} or a full config.
    model: str | dict[str, Any] | None = "Ti/16"
    data: str = "digits"  # digits | cifar10 | cifar100 | folder | hf:NAME_OR_PATH
    data_dir: str | None = None
    # Folders and Hugging Face datasets: "memory" decodes every image up front at the model's
    # size; "stream" reads them as training goes (DataLoader workers, Inception crop, flat
    # memory); "auto" streams when the decoded images would take over 2 GiB.
    data_mode: str = "auto"  # auto | memory | stream
    workers: int | None = None  # loader processes for streamed data; null = one per core (<= 8)
    # The Inception crop of streamed training images: area fraction and aspect-ratio range.
    crop_scale: tuple[float, float] = (0.08, 1.0)
    crop_ratio: tuple[float, float] = (0.75, 1.3333333333333333)
    # Evaluation of streamed data in a fresh run: shorter side to size / eval_crop_pct, then a
    # centre crop (fine-tuning uses the checkpoint's own preprocessing).
    eval_crop_pct: float = 0.875
    # Hugging Face datasets: the training split (default "train") and the held-out split
    # (default: the first of validation, valid, val, test); streaming=true reads the dataset
    # as an IterableDataset (nothing downloaded up front).
    train_split: str | None = None
    split: str | None = None
    streaming: bool = False
    # What the model learns (`vitkit.tasks`): null = from the training targets (integer
    # classes: classification; float values: regression); "multilabel" for (N, K) 0/1 targets.
    task: str | None = None  # classification | regression | multilabel
    loss: str | None = None  # null = the task's; regression: mse | huber | l1
    train_limit: int | None = None  # use only the first N training images (quick runs)
    test_limit: int | None = None
    epochs: float = 10
    batch_size: int = 128  # images per optimizer step (all ranks together)
    accum_steps: int = 1  # split each batch into this many micro-batches
    total_steps: int = 0  # optimizer steps to train; 0 = from epochs (else replaces epochs)
    lr: float = 1e-3
    optimizer: str = "adamw"  # adamw | sgd (momentum, no nesterov)
    weight_decay: float = 0.05
    betas: tuple[float, float] = (0.9, 0.999)  # AdamW
    momentum: float = 0.9  # SGD
    schedule: str = "cosine"  # cosine | constant
    warmup_epochs: float = 1.0
    warmup_steps: int | None = None  # warmup in optimizer steps; when set, replaces warmup_epochs
    min_lr_ratio: float = 0.0
    clip_grad: float = 1.0  # global-norm clip; 0 = off
    # A step whose loss or gradients are not finite never updates the weights. "stop": the run
    # ends there with a TrainingError (last.pt keeps the checkpoint saved before the divergence,
    # diverged.pt gets the state at the failing step); "skip": the step
    # is dropped with a warning (its batch, step count and schedule position are used up, as
    # GradScaler skips steps) and the run ends after max_skipped_steps such steps in a row.
    nonfinite: str = "stop"  # stop | skip
    max_skipped_steps: int = 5
    augment: dict[str, Any] = field(default_factory=dict)  # fields of AugmentConfig
    # Progressive resizing: [[fraction of training, side], ...], e.g. [[0, 16], [0.6, 32]];
    # images are downscaled on the fly and position embeddings follow the grid.
    resolution_schedule: list[list[float]] = field(default_factory=list)
    # Training images are resized to resize_crop x the training size, then a random window of
    # the training size is cropped (vit_jax's resize + random_crop); 1.0 = resize only.
    resize_crop: float = 1.0
    # Input normalisation; None = 0.5 per channel, or the pretrained checkpoint's (init_from).
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    # Fine-tuning: start from these weights (any file, folder or name `load_pretrained` reads)
    # instead of a random init; `model` then holds overrides of the checkpoint's config
    # (img_size, dropout, drop_path, ...). num_classes comes from the data.
    init_from: str | None = None
    weights_dir: str | None = None  # where named checkpoints ("B/16-i21k") are looked up
    new_head: bool = True  # a new zero-initialised head (pre-logits dropped), as in the paper
    # resampling of learned positions to model.img_size (vitkit.weights.resampling); "auto":
    # the convention of the weights' format ("official" = vit_jax's for official .npz files)
    pos_interpolation: str = "auto"
    ema_decay: float | None = 0.0  # 0 or None = no weight EMA
    # auto (bf16 on CUDA, and on CPUs with fast bf16 for width >= 128; else off) | bf16 | off
    amp: str = "auto"
    device: str = "auto"  # auto | cpu | cuda | cuda:N | mps
    threads: int | None = None
    # torch.compile the model for the training steps (inductor; CPU needs a C++ compiler).
    # Faster steps on small models, but the first step (and the first at each new image size
    # or batch shape: one recompile each) pays tens of seconds of compilation, counted in
    # time_budget; off by default, as for short runs that costs more than it saves.
    compile: bool = False
    seed: int = 0
    time_budget: float = 0.0  # seconds of training wall time; 0 = none
    eval_batch_size: int = 500
    eval_every: int = 1  # evaluate every N epochs (and always at the end)
    # every evaluation's test-time augmentation: none | flip (vitkit.inference.tta)
    tta: str = "none"
    out_dir: str = "runs/train"
    log: tuple[str, ...] = ("csv", "jsonl")  # plus "tensorboard" when installed
    progress: bool = True
    name: str = ""

    def __post_init__(self) -> None:
        check_fields(self)  # every value has its field's type (epochs=five is refused here)
        self._check_model_keys()
        check_task(self.task, self.loss)
        self._check_augment()
        self._check_length()
        self._check_optimization()
        self._check_evaluation_and_output()
        check_device(self.device)
        if not self.init_from:  # with init_from the architecture comes from the checkpoint
            self._check_against_model(self.model_config())

    # -- checks (each names the setting and a value that works) ------------------------------
    def _check_model_keys(self) -> None:
        """`model` as a dict: "variant" plus ViTConfig fields, each of its field's type."""
        if not isinstance(self.model, dict):
            return
        fields = {key: value for key, value in self.model.items() if key != "variant"}
        check_known_keys(ViTConfig, fields, "model")
        for key, value in fields.items():  # kept as written: ViTConfig converts them
            check_value(ViTConfig, key, value, f"model.{key}")
        variant = self.model.get("variant")
        if variant is not None and not isinstance(variant, str):
            raise ConfigError(f"model.variant={variant!r} is not valid: it takes a model name "
                              "such as 'Ti/4' or 'B/16'")

    def _check_augment(self) -> None:
        """`augment` holds AugmentConfig fields, each of its type and range."""
        check_known_keys(AugmentConfig, self.augment, "augment")
        aug = {key: check_value(AugmentConfig, key, value, f"augment.{key}")
               for key, value in self.augment.items()}
        self.augment = aug
        _require(aug.get("crop_padding", 0) >= 0, "augment.crop_padding={} must be >= 0 "
                 "(pixels of padding before the random crop; 0 = no crop)",
                 aug.get("crop_padding"))
        _require(0 <= aug.get("random_erasing", 0) <= 1, "augment.random_erasing={} is a "
                 "probability: use a value in [0, 1], e.g. 0.25", aug.get("random_erasing"))
        for key in ("mixup_alpha", "cutmix_alpha"):
            _require(aug.get(key, 0) >= 0, f"augment.{key}={{}} must be >= 0 (0 = off, "
                     "e.g. 0.8)", aug.get(key))
        _require(0 <= aug.get("label_smoothing", 0) < 1, "augment.label_smoothing={} must be "
                 "in [0, 1), e.g. 0.1", aug.get("label_smoothing"))

    def _check_length(self) -> None:
        """Epochs, steps, batch, warmup, time budget and data limits that make a run."""
        _require(self.epochs > 0, "epochs={} must be > 0 (0.5 trains half an epoch); or set "
                 "the length in optimizer steps with total_steps=N", self.epochs)
        _require(self.total_steps >= 0, "total_steps={} must be >= 0 (0 = the length comes "
                 "from epochs)", self.total_steps)
        _require(self.batch_size >= 1, "batch_size={} must be >= 1 (images per optimizer "
                 "step), e.g. batch_size=64", self.batch_size)
        _require(self.accum_steps >= 1, "accum_steps={} must be >= 1 (1 = no gradient "
                 "accumulation)", self.accum_steps)
        if self.batch_size % self.accum_steps:
            divisors = [d for d in range(1, min(self.batch_size, 64) + 1)
                        if self.batch_size % d == 0]
            raise ConfigError(f"batch_size {self.batch_size} is not divisible by accum_steps "
                              f"{self.accum_steps}: each optimizer step splits the batch into "
                              f"accum_steps equal micro-batches. Use accum_steps in {divisors} "
                              "or change batch_size.")
        _require(self.warmup_epochs >= 0, "warmup_epochs={} must be >= 0 (0 = no warmup)",
                 self.warmup_epochs)
        _require(self.warmup_steps is None or self.warmup_steps >= 0, "warmup_steps={} must "
                 "be >= 0 (0 = no warmup; null = use warmup_epochs)", self.warmup_steps)
        if self.warmup_steps is not None and self.total_steps:
            _require(self.warmup_steps <= self.total_steps, "warmup_steps={} is longer than the "
                     f"run (total_steps={self.total_steps}), so the learning rate would never "
                     "reach lr: lower warmup_steps (about 5-10% of the steps is usual) or raise "
                     "total_steps", self.warmup_steps)
        elif self.warmup_steps is None and not self.total_steps:
            _require(self.warmup_epochs <= self.epochs, "warmup_epochs={} is longer than the "
                     f"run (epochs={self.epochs}), so the learning rate would never reach lr: "
                     f"lower warmup_epochs (e.g. warmup_epochs={self.epochs / 10:g}) or raise "
                     "epochs", self.warmup_epochs)
        _require(self.time_budget >= 0, "time_budget={} must be >= 0 seconds (0 = no budget)",
                 self.time_budget)
        for key in ("train_limit", "test_limit"):
            value = getattr(self, key)
            _require(value is None or value >= 1, f"{key}={{}} must be >= 1 images (or null for "
                     "all of them)", value)

    def _check_optimization(self) -> None:
        from vitkit.train.optim import OPTIMIZERS

        if self.optimizer not in OPTIMIZERS:
            raise ConfigError(f"optimizer={self.optimizer!r}: use one of "
                              f"{', '.join(OPTIMIZERS)}." + did_you_mean(self.optimizer,
                                                                        list(OPTIMIZERS)))
        if self.schedule not in ("cosine", "constant"):
            raise ConfigError(f"schedule={self.schedule!r}: use 'cosine' or 'constant'")
        if self.amp not in ("auto", "bf16", "off"):
            raise ConfigError(f"amp={self.amp!r}: use 'auto', 'bf16' or 'off'")
        _require(self.lr >= 0, "lr={} must be >= 0, e.g. lr=0.001", self.lr)
        _require(self.weight_decay >= 0, "weight_decay={} must be >= 0 (0 = none), e.g. 0.05",
                 self.weight_decay)
        _require(all(0 <= beta < 1 for beta in self.betas), "betas={} must both be in [0, 1), "
                 "e.g. betas=[0.9,0.999]", list(self.betas))
        if not 0.0 <= self.momentum < 1.0:
            raise ConfigError(f"momentum={self.momentum} must be in [0, 1), e.g. 0.9")
        _require(0 <= self.min_lr_ratio <= 1, "min_lr_ratio={} must be in [0, 1] (the final "
                 "learning rate as a fraction of lr)", self.min_lr_ratio)
        if self.nonfinite not in ("stop", "skip"):
            raise ConfigError(f"nonfinite={self.nonfinite!r}: use 'stop' (end the run at a step "
                              "whose loss is not finite) or 'skip' (drop such steps)")
        _require(self.max_skipped_steps >= 1, "max_skipped_steps={} must be >= 1 (non-finite "
                 "steps in a row that nonfinite=skip drops before the run stops), e.g. 5",
                 self.max_skipped_steps)
        _require(self.clip_grad >= 0, "clip_grad={} must be >= 0 (a global gradient norm; 0 = "
                 "off)", self.clip_grad)
        _require(self.ema_decay is None or 0 <= self.ema_decay < 1, "ema_decay={} must be in "
                 "[0, 1), e.g. 0.9999 (0 or null = no weight EMA)", self.ema_decay)
        if self.resize_crop < 1.0:
            raise ConfigError(f"resize_crop={self.resize_crop} must be >= 1 (1 = resize only; "
                              "512/384 = the official resize 512, random crop 384)")
        from vitkit.weights.resampling import check_pos_interpolation

        check_pos_interpolation(self.pos_interpolation)
        if (self.mean is None) != (self.std is None):
            raise ConfigError("set mean and std together (or neither, to use the defaults)")
        if self.mean is not None and self.std is not None:
            _require(len(self.mean) == len(self.std), "mean and std need one value per "
                     "channel each; got {}", f"mean={list(self.mean)}, std={list(self.std)}")
            _require(all(s > 0 for s in self.std), "std={} must be > 0 for every channel",
                     list(self.std))

    def _check_evaluation_and_output(self) -> None:
        from vitkit.data.sources import DATA_MODES, SOURCES, is_known_source

        if not is_known_source(self.data):
            raise ConfigError(f"data={self.data!r} is not a data source: use one of "
                              f"{', '.join(SOURCES)}." + did_you_mean(self.data, SOURCES[:-1]))
        if self.data == "digits" and self.data_dir:
            raise _folder_for_digits_error(self.data_dir)
        _require(self.data_mode in DATA_MODES, "data_mode={!r} is not one of "
                 + ", ".join(DATA_MODES), self.data_mode)
        _require(self.workers is None or self.workers >= 0, "workers={} must be >= 0 (0 reads "
                 "in the training process; null = one per core)", self.workers)
        _require(0 < self.crop_scale[0] <= self.crop_scale[1] <= 1, "crop_scale={} must be two "
                 "area fractions 0 < low <= high <= 1, e.g. [0.08, 1.0]", list(self.crop_scale))
        _require(0 < self.crop_ratio[0] <= self.crop_ratio[1], "crop_ratio={} must be two "
                 "aspect ratios 0 < low <= high, e.g. [0.75, 1.3333]", list(self.crop_ratio))
        _require(0 < self.eval_crop_pct <= 1, "eval_crop_pct={} must be in (0, 1], e.g. 0.875",
                 self.eval_crop_pct)
        hf_only = [key for key in ("train_split", "split") if getattr(self, key)]
        hf_only += ["streaming=true"] if self.streaming else []
        _require(not hf_only or self.data.startswith("hf:"), "{} apply to Hugging Face "
                 "datasets only (data=hf:NAME_OR_PATH)", ", ".join(hf_only))
        _require(self.eval_every >= 1, "eval_every={} must be >= 1 (evaluate every N epochs; "
                 "the end of the run is always evaluated)", self.eval_every)
        _require(self.tta in TTA_MODES, "tta={!r} is not one of " + ", ".join(TTA_MODES)
                 + " (flip: average the outputs on each image and its mirror image)", self.tta)
        _require(self.eval_batch_size >= 1, "eval_batch_size={} must be >= 1, e.g. 500",
                 self.eval_batch_size)
        _require(self.threads is None or self.threads >= 1, "threads={} must be >= 1 (or null "
                 "for all cores)", self.threads)
        unknown_logs = sorted(set(self.log) - set(LOG_FORMATS))
        _require(not unknown_logs, "log={} holds unknown formats: use any of "
                 + ", ".join(LOG_FORMATS), list(self.log))
        _require(bool(self.out_dir.strip()), "out_dir={!r} is empty: name a folder for the "
                 "checkpoints and metrics", self.out_dir)
        stages = [float(entry[0]) if len(entry) == 2 else -1.0
                  for entry in self.resolution_schedule]
        if stages and (stages[0] != 0 or stages != sorted(stages) or stages[-1] >= 1
                       or min(stages) < 0):
            raise ConfigError("resolution_schedule must start at fraction 0 and increase, e.g. "
                              "[[0, 16], [0.6, 32]] ([fraction of training, image side] pairs, "
                              "fractions below 1)")

    def _check_against_model(self, model: ViTConfig) -> None:
        """Settings that must fit the model: schedule sides, normalisation channels."""
        patch = model.patch_size
        sides = [entry[1] for entry in self.resolution_schedule]
        _require(sides == sorted(sides), "resolution_schedule sides {} shrink: a run's image "
                 "size only grows (the model's position grid is resampled up, never back "
                 "down), so give each stage a side at least the one before, e.g. [[0, 16], "
                 "[0.5, 32]]", sides)
        for _, side in self.resolution_schedule:
            _require(side >= patch and float(side).is_integer() and int(side) % patch == 0,
                     "resolution_schedule side {} must be a multiple of the patch size "
                     f"{patch} (each token is a {patch}x{patch} patch), e.g. {2 * patch}", side)
        if self.mean is not None:
            _require(len(self.mean) in (1, model.in_chans), "mean and std have {} values but the "
                     f"model takes {model.in_chans} channel(s): give one value per channel (or "
                     "one for all)", len(self.mean))

    def finetune_overrides(self) -> dict[str, Any]:
        """With `init_from`: `model` as overrides of the checkpoint's config (img_size, ...)."""
        if self.model is None or self.model == TrainConfig.model:
            return {}
        if not isinstance(self.model, dict):
            raise ConfigError(f"with init_from, model holds overrides of the checkpoint's "
                              f"config (e.g. model.img_size=384), not a variant: got "
                              f"{self.model!r}. Drop it or use model={{\"img_size\": 384}}.")
        if "variant" in self.model:
            raise ConfigError("with init_from, the architecture comes from the checkpoint: "
                              "remove model.variant (keep only overrides such as img_size)")
        return dict(self.model)

    def model_config(self) -> ViTConfig:
        """The model's config: a variant name, or a dict with "variant" plus overrides."""
        return model_config_of(self.model)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        check_known_keys(cls, data, "training config")
        return cls(**data)


def _folder_for_digits_error(data_dir: str) -> ConfigError:
    """A data folder given with the digits (which read none): a missing one is named as
    missing; else the sources that read a folder, the one its files suggest first."""
    if not Path(data_dir).expanduser().exists():
        return ConfigError(f"data_dir={data_dir} does not exist{relative_data_dir_note(data_dir)}"
                           "; the data it names would be read with data=folder, cifar10, "
                           "cifar100 or arrays (data=digits, the default, reads no folder)")
    return ConfigError(f"data_dir={data_dir} is not read by data=digits (the embedded 8x8 "
                       f"digits, the default): name the data the folder holds: "
                       f"{_sources_for(data_dir)}")


def _sources_for(data_dir: str) -> str:
    """The data sources that read a folder, the one its files suggest first."""
    folder = Path(data_dir).expanduser()
    arrays = sorted(path.relative_to(folder).as_posix() for pattern in ("*.npz", "*/images.npy")
                    for path in folder.glob(pattern)) if folder.is_dir() else []
    options = [f"data=folder for an image folder ({data_dir}/train/<class_name>/<image>.jpg "
               f"and {data_dir}/val/<class_name>/<image>.jpg)",
               "data=cifar10 (or cifar100) for the CIFAR binaries",
               "data=arrays for NumPy arrays (train.npz and test.npz holding images and "
               "targets; docs/tasks.md)"]
    if arrays:
        options = [f"data=arrays for the NumPy arrays it holds ({' and '.join(arrays[:3])})",
                   *options[:-1]]
    return "; ".join(options[:-1]) + "; or " + options[-1]


def check_task(task: str | None, loss: str | None) -> None:
    """`task` names a task and `loss` one of its losses (of any task when task is null)."""
    if task is not None and task not in TASKS:
        raise ConfigError(f"task={task!r} is not a task: use one of {', '.join(TASKS)} (or "
                          "leave it unset: it follows the targets)." + did_you_mean(task, TASKS))
    if loss is None:
        return
    allowed = LOSSES[task] if task else tuple(
        dict.fromkeys(name for names in LOSSES.values() for name in names))
    if loss not in allowed:
        fits = f"task={task} takes" if task else "use one of"
        raise ConfigError(f"loss={loss!r} is not a loss here: {fits} {', '.join(allowed)} (or "
                          "leave it unset for the task's default)."
                          + loss_suggestion(loss, allowed))


def model_config_of(model: str | dict[str, Any] | None) -> ViTConfig:
    """The ViTConfig a recipe's `model` value names: a variant name, or a dict with
    "variant" plus overrides (or a whole config)."""
    if isinstance(model, str):
        return variant_config(model)
    if isinstance(model, dict):
        fields = dict(model)
        variant = fields.pop("variant", None)
        return variant_config(variant, **fields) if variant else ViTConfig.from_dict(fields)
    raise ConfigError(f"model must be a variant name or a dict, got {model!r}")


def recipe_names() -> list[str]:
    """Recipes shipped with the package (`vitkit train NAME`)."""
    folder = resources.files("vitkit.recipes")
    return sorted(p.name.removesuffix(".json") for p in folder.iterdir()
                  if p.name.endswith(".json"))


def load_train_config(path_or_name: str | None, overrides: list[str] | None = None,
                      base: dict[str, Any] | None = None) -> TrainConfig:
    """A recipe file or shipped recipe name (or `base`, a recipe as a dict, such as the one a
    checkpoint stores), then `key=value` overrides (`model.depth=4`, `augment.flip=false`),
    each read by the type of the field it sets."""
    return TrainConfig.from_dict(recipe_with_overrides(path_or_name, overrides, base))


def recipe_with_overrides(path_or_name: str | None, overrides: list[str] | None = None,
                          base: dict[str, Any] | None = None) -> dict[str, Any]:
    """The keys `load_train_config` builds its TrainConfig from, before any check of their
    values as a whole (each override is typed by its field)."""
    data: dict[str, Any] = dict(base or {})
    if path_or_name:
        data = read_recipe(path_or_name)
    for item in overrides or []:
        apply_override(data, item)
    return data


def shipped_recipe(name: str) -> dict[str, Any]:
    """The keys of a recipe shipped with the package (comments dropped), whatever files the
    working folder holds."""
    return _recipe_keys(resources.files("vitkit.recipes").joinpath(f"{name}.json").read_text(),
                        name)


def read_recipe(path_or_name: str) -> dict[str, Any]:
    """A recipe's keys from a JSON file or a shipped recipe name (comments dropped)."""
    path = Path(path_or_name)
    if path.is_file():
        check_json_size(path, ConfigError, "a recipe is a JSON object of training keys")
        return _recipe_keys(path.read_text(), path_or_name)
    if path_or_name in recipe_names():
        return shipped_recipe(path_or_name)
    raise ConfigError(f"no recipe file or shipped recipe {path_or_name!r}."
                      + did_you_mean(path_or_name, recipe_names())
                      + f" Shipped recipes: {', '.join(recipe_names())}.")


def _recipe_keys(text: str, path_or_name: str) -> dict[str, Any]:
    """A recipe's JSON text as keys (comments dropped); refused, naming the fix, when it is
    not a JSON object."""
    data = parse_json(text, f"recipe {path_or_name}", ConfigError,
                      "a recipe is a JSON object of training keys, as the shipped ones are "
                      "(docs/training.md); write it as JSON, or give the keys as KEY=VALUE "
                      "arguments instead (vitkit train epochs=5 lr=0.001)")
    if not isinstance(data, dict):
        raise ConfigError(f"recipe {path_or_name} must hold a JSON object of training keys")
    data.pop("_comment", None)
    data.pop("_notes", None)
    return data


def apply_override(data: dict[str, Any], item: str) -> None:
    """Set one `key=value` (or `model.key=value`, `augment.key=value`) in a recipe dict."""
    if "=" not in item:
        raise ConfigError(f"override {item!r} is not KEY=VALUE (e.g. epochs=5)")
    key, raw = item.split("=", 1)
    key = key.strip()
    *parents, leaf = key.split(".")
    if not parents:
        data[leaf] = parse_text(TrainConfig, leaf, raw, what="training config")
        return
    if len(parents) > 1 or parents[0] not in NESTED_KEYS:
        raise ConfigError(f"override {key}=...: only model and augment have keys inside "
                          "(model.depth=4, augment.flip=false); other keys have no dots")
    parent = parents[0]
    current = data.get(parent)
    if parent == "model" and isinstance(current, str):
        current = {"variant": current}
    target = dict(current) if isinstance(current, dict) else {}
    if parent == "model" and leaf == "variant":
        target[leaf] = raw.strip()
    else:
        target[leaf] = parse_text(NESTED_KEYS[parent], leaf, raw, label=key, what=parent)
    data[parent] = target


def checkpoint_train_config(path: str | Path, find_data_dir: bool = True) -> dict[str, Any]:
    """The recipe a training checkpoint (last.pt, best.pt) was trained with, as a dict; its
    relative data folder found from the folder the run trained in (`data_dir_from_here`)
    unless `find_data_dir` is false (another data folder is given)."""
    from vitkit.train.checkpoint import load_state as load_checkpoint
    from vitkit.weights.formats.train_checkpoint import data_dir_from_here

    state = load_checkpoint(path)
    recipe = state.get("train_config") if isinstance(state, dict) else None
    if not isinstance(recipe, dict):
        raise CheckpointError(f"{path} is not a vitkit training checkpoint (it holds no "
                              "training recipe): --resume takes the last.pt or best.pt that "
                              "`vitkit train` writes")
    if not find_data_dir:
        return dict(recipe)
    return data_dir_from_here(dict(recipe), Path(path), trained_in=state.get("trained_in"))
