"""`TrainConfig`: a training recipe as data (JSON), with `key=value` overrides."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from vitkit.config import ViTConfig, _did_you_mean, check_known_keys, variant_config
from vitkit.errors import ConfigError


@dataclass
class TrainConfig:
    """Everything a training run needs besides the data files themselves."""

    model: Any = "Ti/4"  # variant name, or a dict: {"variant": "Ti/4", ...overrides} / full config
    data: str = "digits"  # digits | cifar10 | cifar100 | folder
    data_dir: str | None = None
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
    ema_decay: float = 0.0  # 0 = no weight EMA
    amp: str = "auto"  # auto (bf16 on CUDA, off on CPU) | bf16 | off
    device: str = "auto"
    threads: int | None = None
    seed: int = 0
    time_budget: float = 0.0  # seconds of training wall time; 0 = none
    eval_batch_size: int = 500
    eval_every: int = 1  # evaluate every N epochs (and always at the end)
    out_dir: str = "runs/train"
    log: tuple[str, ...] = ("csv", "jsonl")  # plus "tensorboard" when installed
    progress: bool = True
    name: str = ""

    def __post_init__(self) -> None:
        self.betas = tuple(self.betas)  # type: ignore[assignment]
        self.mean = tuple(self.mean) if self.mean is not None else None
        self.std = tuple(self.std) if self.std is not None else None
        self.log = tuple(self.log)
        if self.batch_size % self.accum_steps:
            raise ConfigError(f"batch_size {self.batch_size} is not divisible by accum_steps "
                              f"{self.accum_steps}")
        if self.schedule not in ("cosine", "constant"):
            raise ConfigError(f"schedule={self.schedule!r}: use 'cosine' or 'constant'")
        from vitkit.data.augment import AugmentConfig

        check_known_keys(AugmentConfig, self.augment, "augment")
        stages = [float(start) for start, _ in self.resolution_schedule]
        if stages and (stages[0] != 0 or stages != sorted(stages)):
            raise ConfigError("resolution_schedule must start at fraction 0 and increase, e.g. "
                              "[[0, 16], [0.6, 32]]")
        if self.amp not in ("auto", "bf16", "off"):
            raise ConfigError(f"amp={self.amp!r}: use 'auto', 'bf16' or 'off'")
        self._check_optimization()

    def _check_optimization(self) -> None:
        from vitkit.train.optim import OPTIMIZERS

        if self.optimizer not in OPTIMIZERS:
            raise ConfigError(f"optimizer={self.optimizer!r}: use one of "
                              f"{', '.join(OPTIMIZERS)}." + _did_you_mean(self.optimizer,
                                                                        list(OPTIMIZERS)))
        if not 0.0 <= self.momentum < 1.0:
            raise ConfigError(f"momentum={self.momentum} must be in [0, 1), e.g. 0.9")
        if self.total_steps < 0 or (self.warmup_steps or 0) < 0:
            raise ConfigError("total_steps and warmup_steps must be >= 0")
        if self.resize_crop < 1.0:
            raise ConfigError(f"resize_crop={self.resize_crop} must be >= 1 (1 = resize only; "
                              "512/384 = the official resize 512, random crop 384)")
        from vitkit.weights.resampling import check_pos_interpolation

        check_pos_interpolation(self.pos_interpolation)
        if (self.mean is None) != (self.std is None):
            raise ConfigError("set mean and std together (or neither, to use the defaults)")

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
        if isinstance(self.model, str):
            return variant_config(self.model)
        if isinstance(self.model, dict):
            fields = dict(self.model)
            variant = fields.pop("variant", None)
            return variant_config(variant, **fields) if variant else ViTConfig.from_dict(fields)
        raise ConfigError(f"model must be a variant name or a dict, got {self.model!r}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        check_known_keys(cls, data, "training config")
        return cls(**data)


def recipe_names() -> list[str]:
    """Recipes shipped with the package (`vitkit train NAME`)."""
    folder = resources.files("vitkit.recipes")
    return sorted(p.name.removesuffix(".json") for p in folder.iterdir()
                  if p.name.endswith(".json"))


def load_train_config(path_or_name: str | None, overrides: list[str] | None = None
                      ) -> TrainConfig:
    """A recipe file or shipped recipe name, then `key=value` overrides (`model.depth=4`)."""
    data: dict[str, Any] = {}
    if path_or_name:
        path = Path(path_or_name)
        if path.is_file():
            text = path.read_text()
        elif path_or_name in recipe_names():
            text = resources.files("vitkit.recipes").joinpath(f"{path_or_name}.json").read_text()
        else:
            raise ConfigError(f"no recipe file or shipped recipe {path_or_name!r}."
                              + _did_you_mean(path_or_name, recipe_names())
                              + f" Shipped recipes: {', '.join(recipe_names())}.")
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"recipe {path_or_name} is not valid JSON: {exc}") from exc
        data.pop("_comment", None)
        data.pop("_notes", None)
    for item in overrides or []:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not KEY=VALUE")
        key, raw = item.split("=", 1)
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        target = data
        *parents, leaf = key.strip().split(".")
        for parent in parents:
            current = target.get(parent)
            if isinstance(current, str) and parent == "model":
                current = {"variant": current}
            target[parent] = current if isinstance(current, dict) else {}
            target = target[parent]
        target[leaf] = value
    return TrainConfig.from_dict(data)
