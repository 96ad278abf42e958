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
    lr: float = 1e-3
    weight_decay: float = 0.05
    betas: tuple[float, float] = (0.9, 0.999)
    schedule: str = "cosine"  # cosine | constant
    warmup_epochs: float = 1.0
    min_lr_ratio: float = 0.0
    clip_grad: float = 1.0  # global-norm clip; 0 = off
    augment: dict[str, Any] = field(default_factory=dict)  # fields of AugmentConfig
    # Progressive resizing: [[fraction of training, side], ...], e.g. [[0, 16], [0.6, 32]];
    # images are downscaled on the fly and position embeddings follow the grid.
    resolution_schedule: list[list[float]] = field(default_factory=list)
    mean: tuple[float, ...] = (0.5, 0.5, 0.5)
    std: tuple[float, ...] = (0.5, 0.5, 0.5)
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
        self.mean, self.std, self.log = tuple(self.mean), tuple(self.std), tuple(self.log)
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
