"""What a string names, answered in one place.

A name is a variant ("B/16", "Ti/4", "cifar10-tutorial"), a JSON config file, a named
official checkpoint ("B/16-i21k", "B/16-augreg-i21k-i1k-384"), a Hub repository
("hf-hub:ORG/NAME[@REVISION]"), a local weights file or folder, or a training run folder.
`lookup(text)` says which (`Named`): its kind, its config and where its weights are.
Everything that takes a name asks here: `create_model`, `count_parameters`, `config_of`,
`read_weights`, `load_pretrained`, `load_weights`, `vitkit summary`, `vitkit models` (its
tables) and `vitkit benchmark`. Reading file formats stays in `vitkit.weights.formats`.
A string that names nothing gets one error, `unknown_name_error`, whatever the verb: a path
that does not exist says so with the closest existing path; a short name gets the closest few
names and the command that lists them all.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from vitkit.config import (
    SIZES,
    TUTORIAL_TASKS,
    ViTConfig,
    is_variant_name,
    list_model_names,
    unknown_model_error,
    variant_config,
    variant_name,
)
from vitkit.errors import CheckpointError, ConfigError, VitkitError, WeightsNotFoundError
from vitkit.fieldtypes import closest_path, did_you_mean
from vitkit.files import cache_root
from vitkit.model.vit import VisionTransformer
from vitkit.preprocess import Preprocess
from vitkit.report import Report
from vitkit.weights import build_model, read_local, save_pretrained
from vitkit.weights.formats import hf_hub, hub
from vitkit.weights.formats.hub import NamedCheckpoint
from vitkit.weights.formats.run_folder import is_run_folder
from vitkit.weights.loading import load_state_dict_checked
from vitkit.weights.record import WeightsRecord

log = logging.getLogger("vitkit.catalog")

Kind = Literal["variant", "config_file", "checkpoint", "hub", "weights", "run_folder",
               "unknown"]
Size = int | tuple[int, int]
ConfigSource = str | Path | ViTConfig | dict[str, Any]
# The kinds of name an unknown one may have meant, besides variants and tutorial models.
_OTHER_KINDS = (", a checkpoint name like 'B/16-i21k' (`vitkit models --checkpoints`), a JSON "
                "config, a weights file or folder, or hf-hub:ORG/NAME")
# The suffixes of the files a name may be: weights, configs and exported graphs.
_FILE_SUFFIXES = {".pt", ".pth", ".bin", ".ckpt", ".npz", ".safetensors", ".json", ".onnx",
                  ".h5", ".msgpack"}


@dataclass(frozen=True)
class Named:
    """What one string names: its `kind`, and the `key` that kind's owner knows it by (the
    variant name, the checkpoint's table name, the hf-hub: name, or the path)."""

    text: str
    kind: Kind
    key: str

    @property
    def has_weights(self) -> bool:
        """Whether the name stands for trained weights, not only an architecture."""
        return self.kind in ("checkpoint", "hub", "weights", "run_folder")

    def config(self, **overrides: Any) -> ViTConfig:
        """The architecture, without building a model. Variants, config files and named
        checkpoints say it themselves (nothing is read or downloaded); weights files are read
        for theirs, and a Hub repository is fetched into the Hugging Face cache first."""
        if self.kind == "variant":
            return variant_config(self.key, **overrides)
        if self.kind == "unknown":
            raise unknown_name_error(self.text, weights=False)
        if self.kind == "config_file":
            config = ViTConfig.from_json(self.key)
        elif self.kind == "checkpoint":
            config = hub.named_checkpoint_config(self.key)
        else:
            config = read_local(self.weights_path()).config
        return config.replace(**overrides) if overrides else config

    def weights_path(self, weights_dir: str | Path | None = None,
                     download: bool | None = None) -> Path:
        """The local file or folder of the weights, fetched when need be: a named checkpoint
        from `weights_dir`, $VITKIT_WEIGHTS_DIR or the cache (downloaded once when allowed), a
        Hub repository through the Hugging Face cache."""
        if self.kind == "checkpoint":
            return hub.resolve_named(self.key, weights_dir, download)
        if self.kind == "hub":
            return hf_hub.resolve(self.key, weights_dir, download)
        if Path(self.key).exists():  # a JSON config too: its reader says it holds no weights
            return Path(self.key)
        raise unknown_name_error(self.text, weights=True)


def lookup(source: str | Path) -> Named:
    """What `source` names. A path that exists is a file; then "hf-hub:" names, named
    checkpoints (in any spelling: "ViT-B_16-i21k" is "B/16-i21k") and variant names; last, a
    bare "ORG/NAME" is the Hub repository hf-hub:ORG/NAME when the Hugging Face cache holds it
    (uncached, it is refused with that advice: a bare name never downloads)."""
    text, path = str(source), Path(source)
    if path.suffix.lower() == ".json":
        return Named(text, "config_file", text)
    if path.exists():
        return Named(text, "run_folder" if is_run_folder(path) else "weights", text)
    if hf_hub.claims(text):
        return Named(text, "hub", text)
    key = hub.normalize_name(text)
    if key is not None:
        return Named(text, "checkpoint", key)
    if is_variant_name(text):
        return Named(text, "variant", text)
    if hf_hub.is_bare_repo_id(text) and hf_hub.cached(text):  # "ORG/NAME", as HF users write
        return Named(text, "hub", hf_hub.PREFIX + text)
    return Named(text, "unknown", text)


def unknown_name_error(text: str, weights: bool) -> VitkitError:
    """The error for a string that names nothing. A path that does not exist: "no such file
    or folder: runs/digit; did you mean runs/digits?". A short name: the closest few names
    (checkpoint names only when the caller wants `weights`), never the whole list, and the
    command that lists them."""
    timm_advice = None if looks_like_path(text) else hub.timm_tag_advice(text)
    if timm_advice is not None:
        return WeightsNotFoundError(timm_advice) if weights else ConfigError(timm_advice)
    if looks_like_path(text):
        guess, missing = closest_path(text), _first_missing(text)
        hint = f"; did you mean {guess}?" if guess else \
            f" ({missing} does not exist)" if missing != Path(text).expanduser() else ""
        return WeightsNotFoundError(f"no such file or folder: {text}{hint}")
    known = hub.named_checkpoints() if weights else all_names()
    if hf_hub.is_bare_repo_id(text) and not did_you_mean(text, known):  # "B/16-i21x": a typo
        advice = (f"{text!r} is no local file or folder, and the Hugging Face cache at "
                  f"{hf_hub.cache_dir()} does not hold a repository of that name: for the Hub "
                  f"repository write hf-hub:{text}, which downloads it into that cache (offline: "
                  "pass a local folder holding its config.json and weights)")
        return WeightsNotFoundError(advice) if weights else ConfigError(advice)
    if not weights:
        return unknown_model_error(text, all_names(), _OTHER_KINDS)
    return WeightsNotFoundError(
        f"{text!r} is neither a file nor a known checkpoint name."
        + did_you_mean(text, hub.named_checkpoints())
        + " `vitkit models --checkpoints` lists them (a variant such as 'B/16' names an "
          "architecture, not weights).")


def looks_like_path(text: str) -> bool:
    """Whether a string was meant as a path, not a name: it ends in a file suffix (".pt",
    ".npz", ...), starts like one ("./", "~", "/"), has separators no name has ("runs/a/b",
    "\\", a trailing "/"), or names an entry of a folder that exists ("runs/digit")."""
    path = Path(text).expanduser()
    if path.suffix.lower() in _FILE_SUFFIXES or text.startswith((".", "~", "/")):
        return True
    if "\\" in text or text.count("/") > 1 or text.endswith("/"):
        return True
    return "/" in text and path.parent.is_dir()


def _first_missing(text: str) -> Path:
    path = Path(text).expanduser()
    return next(p for p in [*reversed(path.parents), path] if not p.exists())


def all_names() -> list[str]:
    """Every name `vitkit models` lists: variants, tutorial models, named checkpoints."""
    return list_model_names() + list(hub.named_checkpoints())


# -- models by name ------------------------------------------------------------------------------
def config_of(source: ConfigSource, **overrides: Any) -> ViTConfig:
    """The model a name, file, dict or config describes, with `overrides` replacing fields,
    without building it (see `Named.config` for what is read)."""
    if isinstance(source, ViTConfig):
        return source.replace(**overrides) if overrides else source
    if isinstance(source, dict):
        return ViTConfig.from_dict({**source, **overrides})
    return lookup(source).config(**overrides)


def create_model(name_or_config: ConfigSource = "B/16", device: str | torch.device | None = None,
                 **overrides: Any) -> VisionTransformer:
    """Build a randomly initialised ViT of any model `lookup` knows (a named checkpoint gives
    its architecture, without its weights).

    >>> model = create_model("B/16", num_classes=10, img_size=384)

    A tutorial model built for another task than classification (`TUTORIAL_TASKS`:
    "t2t-tutorial" is a regression model) carries it as `model.task`. A weights file, run
    folder or Hub repository gives its architecture too, with a warning that its weights were
    not read (`load_pretrained` reads them).
    """
    from vitkit.tasks import TaskSpec

    if isinstance(name_or_config, (str, Path)) and lookup(name_or_config).kind in (
            "weights", "run_folder", "hub"):
        log.warning("create_model(%r) builds the architecture of those weights, initialised at "
                    "random: load_pretrained(%r) reads the weights", str(name_or_config),
                    str(name_or_config))
    config = config_of(name_or_config, **overrides)
    with torch.device(device or "cpu"):
        model = VisionTransformer(config)
    if config.name in TUTORIAL_TASKS:
        model.info = model.info.replace(task=TaskSpec(TUTORIAL_TASKS[config.name]))
    return model


def variant_of(config: ViTConfig) -> str:
    """The variant or tutorial name of a config ("B/16", "R50+B/16", "cifar10-tutorial") when
    its sizes are that model's (width, depth, heads, MLP, patch, stem), else "". A config
    built from a variant with other sizes (the digits recipe's "Ti/2" at width 64, depth 4)
    carries the variant's name in `config.name`, which then no longer says what it is."""
    for name in (config.name, variant_name(config)):
        try:
            named = variant_config(name) if name else None
        except ConfigError:  # a checkpoint's or a user's own name
            named = None
        if named is not None and _sizes(named) == _sizes(config):
            return name
    return ""


def model_name(config: ViTConfig) -> str:
    """What reports call a model: `variant_of`, else its numbers ("custom ViT (width 64,
    depth 4, heads 4, MLP 128, patch 2)")."""
    return variant_of(config) or (
        f"custom ViT (width {config.width}, depth {config.depth}, heads {config.num_heads}, "
        f"MLP {config.mlp_dim}, patch {config.patch_size})")


def _sizes(config: ViTConfig) -> tuple[Any, ...]:
    return (config.width, config.depth, config.num_heads, config.mlp_dim, config.patch_size,
            config.stem, tuple(config.resnet_layers))


def count_parameters(name_or_config: ConfigSource, **overrides: Any) -> int:
    """Exact parameter count, computed on the meta device (nothing allocated)."""
    with torch.device("meta"):
        model = VisionTransformer(config_of(name_or_config, **overrides))
    return sum(p.numel() for p in model.parameters())


# -- weights by name -----------------------------------------------------------------------------
def read_weights(source: str | Path, weights_dir: str | Path | None = None,
                 download: bool | None = None, source_img_size: Size | None = None, *,
                 img_size: Size | None = None, num_heads: int | None = None,
                 global_pool: str | None = None) -> WeightsRecord:
    """Read and convert weights (a file, folder, run folder, checkpoint name or Hub
    repository) without building a model; see `vitkit.weights.read_local` for the options."""
    path = lookup(source).weights_path(weights_dir, download)
    return read_local(path, source_img_size, img_size=img_size, num_heads=num_heads,
                      global_pool=global_pool)


def load_pretrained(source: str | Path, *, weights_dir: str | Path | None = None,
                    download: bool | None = None, pos_interpolation: str | None = None,
                    source_img_size: Size | None = None, **overrides: Any) -> VisionTransformer:
    """A ViT with weights from a file, folder, run folder, checkpoint name or Hub repository,
    in eval mode.

    >>> model = load_pretrained("B/16-i21k", img_size=384, num_classes=10)

    The model carries `model.preprocess` (what its inputs must look like) and
    `model.class_names` (when the checkpoint names its classes). At another `img_size` the
    position embeddings are resampled with `pos_interpolation` (one of POS_INTERPOLATIONS;
    default: as the format's own code does, e.g. vit_jax's corner-aligned bilinear for
    official .npz, timm's antialiased bicubic for timm files, Hugging Face's bicubic for
    Hugging Face files).
    `source_img_size` is the training resolution of a file with a non-square position grid;
    `num_heads` and `global_pool` complete timm state dicts of non-standard widths.
    """
    hints = {k: overrides.pop(k) for k in ("num_heads", "global_pool") if k in overrides}
    weights = read_weights(source, weights_dir, download, source_img_size,
                           img_size=overrides.get("img_size"), **hints)
    return build_model(weights, pos_interpolation, **overrides)


def load_weights(model: VisionTransformer, source: str | Path, **read_options: Any) -> None:
    """Load a checkpoint into an existing model, strictly, with errors that name the fix."""
    read_options.setdefault("img_size", model.config.img_size)
    weights = read_weights(source, **read_options)
    try:
        load_state_dict_checked(model, weights.state_dict)
    except CheckpointError as exc:
        raise CheckpointError(f"{source} does not fit this model: {exc}") from exc


# -- Hugging Face's habits: model.save_pretrained(dir), VisionTransformer.from_pretrained(src) ---
# The model sits below the weights and the catalog (the layers only import downwards), so the
# two methods are attached to it here, thin calls of `save_pretrained` and `load_pretrained`.
def _save_pretrained_method(self: VisionTransformer, directory: str | Path,
                            preprocess: Preprocess | None = None,
                            class_names: list[str] | None = None) -> Path:
    """Write the model as vitkit's folder (model.safetensors + config.json) and return it:
    `vitkit.save_pretrained(model, directory, preprocess, class_names)`; the folder loads
    with `VisionTransformer.from_pretrained(directory)`."""
    return save_pretrained(self, directory, preprocess, class_names)


def _from_pretrained_method(cls: type[VisionTransformer], source: str | Path,
                            **options: Any) -> VisionTransformer:
    """A ViT with weights from any source `load_pretrained` reads (a folder or file, a run
    folder, a checkpoint name, hf-hub:ORG/NAME), in eval mode; keyword arguments
    (`img_size=384`, `num_classes=10`, `weights_dir`, `download`, ...) are `load_pretrained`'s:
    `load_pretrained(source, **options)`. The model is a `VisionTransformer`, whichever
    subclass this is called on."""
    return load_pretrained(source, **options)


_save_pretrained_method.__name__ = _save_pretrained_method.__qualname__ = "save_pretrained"
_from_pretrained_method.__name__ = _from_pretrained_method.__qualname__ = "from_pretrained"
VisionTransformer.save_pretrained = _save_pretrained_method  # type: ignore[attr-defined]
VisionTransformer.from_pretrained = classmethod(_from_pretrained_method)  # type: ignore[attr-defined]


# -- the tables of `vitkit models` ---------------------------------------------------------------
@dataclass(frozen=True)
class ModelRow:
    """One row of `vitkit models`: a listed variant or tutorial model and its size."""

    name: str
    config: ViTConfig
    params: int


def model_rows() -> list[ModelRow]:
    """The variants and tutorial models `vitkit models` lists, with their parameter counts."""
    return [ModelRow(name, config_of(name), count_parameters(name))
            for name in list_model_names()]


def checkpoint_rows() -> list[NamedCheckpoint]:
    """Every named checkpoint with its URL and expected ImageNet top-1 (`--checkpoints`)."""
    return hub.checkpoint_table()


def models_report(checkpoints: bool = False) -> Report:
    """`vitkit models`: the variants and tutorial models with their sizes, then the named
    official checkpoints and where they are cached; with `checkpoints`, `checkpoints_report`."""
    if checkpoints:
        return checkpoints_report()
    models = model_rows()
    lines = [f"{'name':<18}{'layers':>7}{'width':>7}{'MLP':>7}{'heads':>7}{'image':>9}"
             f"{'params':>15}"]
    for model in models:
        cfg = model.config
        image = f"{cfg.img_size[0]}" if cfg.img_size[0] == cfg.img_size[1] else \
            f"{cfg.img_size[0]}x{cfg.img_size[1]}"
        lines.append(f"{model.name:<18}{cfg.depth:>7}{cfg.width:>7}{cfg.mlp_dim:>7}"
                     f"{cfg.num_heads:>7}{image:>9}{model.params:>15,}")
    lines.append(f"\nAny size {'/'.join(SIZES)} with any patch size parses too (e.g. 'L/8', "
                 "'Ti/4'); change anything with keyword overrides.")
    rows, cache = checkpoint_rows(), cache_root()
    original = [row for row in rows if not row.augreg]
    lines.append("\nNamed official checkpoints (load_pretrained(NAME), or NAME wherever a "
                 f"command takes weights; cached in {cache}, or put the file in "
                 "--weights-dir):")
    lines += [f"  {row.name:<24}{row.url}" for row in original]
    lines.append(f"  ... and {len(rows) - len(original)} AugReg checkpoints (e.g. "
                 "B/16-augreg-i21k-i1k-384): `vitkit models --checkpoints` lists every name "
                 "with its URL and ImageNet top-1.\nHub repositories load as hf-hub:ORG/NAME "
                 "(e.g. hf-hub:google/vit-base-patch16-224).")
    data = {"models": [{"name": model.name, "layers": model.config.depth,
                        "width": model.config.width, "mlp_dim": model.config.mlp_dim,
                        "heads": model.config.num_heads,
                        "img_size": list(model.config.img_size), "params": model.params}
                       for model in models],
            "checkpoints": [row.name for row in rows], "cache": str(cache)}
    return Report("\n".join(lines), data)


def checkpoints_report() -> Report:
    """`vitkit models --checkpoints`: every named checkpoint with its expected ImageNet top-1
    (and where that figure comes from) and its URL."""
    rows = checkpoint_rows()
    width = max(len(row.name) for row in rows) + 2
    lines = [f"{'name':<{width}}{'top-1 %':>8}  {'source':<11}url"]
    for row in rows:
        top1 = f"{row.top1:.2f}" if row.top1 is not None else "-"
        lines.append(f"{row.name:<{width}}{top1:>8}  {row.top1_source or '-':<11}{row.url}")
    lines.append("\ntop-1: ImageNet-2012 validation; 'timm' = timm's results-imagenet.csv (its "
                 "own evaluation of the same weights), 'vit README' = the official README's "
                 "expected figure; '-' = no published figure. i21k checkpoints have a "
                 "21,843-way ImageNet-21k head.")
    data = {"checkpoints": [{"name": row.name, "top1": row.top1,
                             "top1_source": row.top1_source, "url": row.url} for row in rows]}
    return Report("\n".join(lines), data)


__all__ = ["ModelRow", "Named", "all_names", "checkpoint_rows", "checkpoints_report",
           "config_of", "count_parameters", "create_model", "load_pretrained", "load_weights",
           "looks_like_path", "lookup", "model_name", "model_rows", "models_report",
           "read_weights", "unknown_name_error", "variant_of"]
