"""Hugging Face Hub repositories: `hf-hub:ORG/NAME[@REVISION]` becomes a local folder.

A source, like `hub` (`vitkit.catalog` hands it the names it claims): it fetches through
`huggingface_hub` (so the standard cache, HF_HOME, HF_HUB_CACHE, HF_HUB_OFFLINE and HF_TOKEN
apply) and hands the snapshot folder to the format adapters: `hf` (transformers ViT:
config.json with model_type "vit") or `timm` (config.json with "architecture" and
"pretrained_cfg"). config.json is read first to tell the two apart; then only the weights file
the folder needs is fetched, safetensors first (a sharded repository: its index, then the
shards it names).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from vitkit.errors import CheckpointError, WeightsNotFoundError
from vitkit.files import read_json
from vitkit.network import hub_unreachable
from vitkit.weights.formats.sniff import INDEX_SUFFIX, WEIGHT_FILES, shard_map
from vitkit.weights.formats.vitkit import FORMAT_NAME  # a pushed vitkit save_pretrained folder

PREFIX = "hf-hub:"
CONFIG = "config.json"
WEIGHTS = WEIGHT_FILES  # in order of preference
HF_PREPROCESSOR = "preprocessor_config.json"
HF_MODEL_TYPES = ("vit", "vit-hybrid")  # what formats/hf.py reads
TIMM_ARCHITECTURES = ("vit_", "deit_", "deit3_")  # timm's plain ViT families
WHAT_VITKIT_READS = (
    "vitkit reads Hugging Face transformers ViTs (config.json with model_type \"vit\", e.g. "
    "hf-hub:google/vit-base-patch16-224) and timm ViTs (config.json with an \"architecture\" "
    "such as vit_base_patch16_224, e.g. hf-hub:timm/vit_base_patch16_224.augreg2_in21k_ft_in1k)")


# A Hub repository id as Hugging Face users write it, without the prefix: "ORG/NAME".
_BARE_REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]*[A-Za-z0-9_]")


def claims(name: str) -> bool:
    return name.startswith(PREFIX)


def is_bare_repo_id(text: str) -> bool:
    """Whether `text` has the shape of a Hub repository id without the prefix ("ORG/NAME",
    as `from_pretrained` in transformers takes it); "--" and ".." no id has."""
    return _BARE_REPO_ID.fullmatch(text) is not None and "--" not in text and ".." not in text


def cached(repo: str) -> bool:
    """Whether the Hugging Face cache holds the config.json of `repo` ("ORG/NAME") at main:
    asked of the cache alone, never the network."""
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(repo, CONFIG, cache_dir=cache_dir())
    return isinstance(found, str)


def parse(name: str) -> tuple[str, str | None]:
    """("ORG/NAME", revision or None) from "hf-hub:ORG/NAME[@REVISION]"."""
    repo, _, revision = name.removeprefix(PREFIX).partition("@")
    parts = repo.split("/")
    if len(parts) != 2 or not all(parts) or (revision == "" and "@" in name):
        raise WeightsNotFoundError(
            f"{name!r} is not a Hub model name: write hf-hub:ORG/NAME or hf-hub:ORG/NAME@REVISION "
            "(a branch, tag or commit), e.g. hf-hub:google/vit-base-patch16-224")
    return repo, revision or None


def cache_dir() -> Path:
    """The huggingface_hub cache in use, read from the environment at call time (HF_HUB_CACHE,
    else HF_HOME/hub, else the library's default), so a variable set after import counts."""
    from huggingface_hub import constants

    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.path.expanduser(os.environ["HF_HUB_CACHE"]))
    if os.environ.get("HF_HOME"):
        return Path(os.path.expanduser(os.environ["HF_HOME"])) / "hub"
    return Path(constants.HF_HUB_CACHE)


def offline(download: bool | None = None) -> bool:
    """True when downloads are off: download=False, VITKIT_OFFLINE or HF_HUB_OFFLINE set."""
    from huggingface_hub import constants

    if download is not None:
        return not download
    if os.environ.get("VITKIT_OFFLINE", "0") not in ("0", "", "false"):
        return True
    flag = os.environ.get("HF_HUB_OFFLINE")
    if flag is not None:
        return flag.strip().upper() in ("1", "ON", "YES", "TRUE")
    return constants.HF_HUB_OFFLINE


def resolve(name: str, weights_dir: str | Path | None = None,
            download: bool | None = None) -> Path:
    """The local snapshot folder of `name`, holding config.json and one weights file.

    `weights_dir` is not used: Hub files live in the huggingface_hub cache.
    """
    repo, revision = parse(name)
    fetcher = _Fetcher(repo, revision, offline(download))
    config_path = fetcher.get(CONFIG, required=True)
    kind = _repo_kind(repo, config_path)
    if kind == "hf":
        fetcher.get(HF_PREPROCESSOR, required=False)
    for filename in WEIGHTS:
        if fetcher.get(filename, required=False) is not None:
            return config_path.parent
    for filename in WEIGHTS:  # sharded (save_pretrained's max_shard_size): the index, its shards
        index = fetcher.get(filename + INDEX_SUFFIX, required=False)
        if index is not None:
            for shard in sorted(set(shard_map(index).values())):
                if Path(shard).name == shard:  # others: refused by name when the folder is read
                    fetcher.get(shard, required=True)
            return config_path.parent
    raise fetcher.missing_weights()


def _repo_kind(repo: str, config_path: Path) -> str:
    """"hf", "timm" or "vitkit", from config.json; the no-ViT error otherwise."""
    meta: Any = read_json(config_path, CheckpointError, "delete it from the cache and run "
                          "again to download it afresh")
    meta = meta if isinstance(meta, dict) else {}
    if meta.get("format") == FORMAT_NAME:
        return "vitkit"
    if "architecture" in meta or "pretrained_cfg" in meta:
        architecture = str(meta.get("architecture", ""))
        if architecture.startswith(TIMM_ARCHITECTURES):
            return "timm"
        raise CheckpointError(f"hf-hub:{repo} holds a timm {architecture or 'model'!s}, not a "
                              f"ViT: {WHAT_VITKIT_READS}.")
    model_type = meta.get("model_type")
    if model_type in HF_MODEL_TYPES:
        return "hf"
    holds = f"a {model_type!r} model (config.json model_type)" if model_type else \
        "a config.json without model_type or architecture"
    raise CheckpointError(f"hf-hub:{repo} holds {holds}, not a ViT: {WHAT_VITKIT_READS}.")


class _Fetcher:
    """One repository's files through huggingface_hub, with vitkit's errors."""

    def __init__(self, repo: str, revision: str | None, local_only: bool) -> None:
        self.repo, self.revision, self.local_only = repo, revision, local_only
        self.cache = cache_dir()
        # No network: read the cache only, rather than wait through the library's retries.
        self.unreachable = None if local_only else hub_unreachable()

    @property
    def label(self) -> str:
        return f"hf-hub:{self.repo}" + (f"@{self.revision}" if self.revision else "")

    def get(self, filename: str, required: bool) -> Path | None:
        """The local path of `filename`; None when the repository has no such file (and it
        is not `required`)."""
        from huggingface_hub import hf_hub_download, try_to_load_from_cache
        from huggingface_hub.errors import (
            EntryNotFoundError,
            GatedRepoError,
            HfHubHTTPError,
            LocalEntryNotFoundError,
            RepositoryNotFoundError,
            RevisionNotFoundError,
        )

        cached = try_to_load_from_cache(self.repo, filename, cache_dir=self.cache,
                                        revision=self.revision)
        if cached is not None and not isinstance(cached, str):
            return self._absent(filename, required)  # the cache records that it does not exist
        try:
            return Path(hf_hub_download(self.repo, filename, revision=self.revision,
                                        cache_dir=self.cache,
                                        local_files_only=self.local_only or
                                        self.unreachable is not None))
        except GatedRepoError:
            raise WeightsNotFoundError(
                f"{self.label} is a gated repository: accept its terms on its Hub page, then "
                "log in (`hf auth login`, or set HF_TOKEN) and run again") from None
        except RepositoryNotFoundError:
            raise WeightsNotFoundError(
                f"{self.label}: no such repository on the Hub, or it is private. Check the "
                "name (hf-hub:ORG/NAME, e.g. hf-hub:google/vit-base-patch16-224); for a private "
                "one, log in (`hf auth login`, or set HF_TOKEN) and run again") from None
        except RevisionNotFoundError:
            raise WeightsNotFoundError(
                f"{self.label}: the repository has no revision {self.revision!r}: pass a branch, "
                "tag or commit it has, or leave @REVISION out for main") from None
        except LocalEntryNotFoundError:
            if not required:
                return None  # may be absent offline; the caller says what is missing
            raise self._not_cached(filename) from None
        except EntryNotFoundError:  # the Hub answered: the repository has no such file
            return self._absent(filename, required)
        except HfHubHTTPError as exc:
            raise WeightsNotFoundError(
                f"{self.label}: the Hub refused {filename} ({str(exc).splitlines()[0]}); try "
                "again later, or download the repository elsewhere and pass its folder") \
                from None

    def _absent(self, filename: str, required: bool) -> None:
        if not required:
            return None
        raise CheckpointError(
            f"{self.label} holds no {filename}, so it is not a model repository vitkit reads: "
            f"{WHAT_VITKIT_READS}.")

    def _not_cached(self, filename: str) -> WeightsNotFoundError:
        # the revision asked for: `hf download` alone caches main
        what = self.repo + (f" --revision {self.revision}" if self.revision else "")
        if self.local_only:
            why = "downloads are off (HF_HUB_OFFLINE or VITKIT_OFFLINE is set)"
            fix = ("unset HF_HUB_OFFLINE (and VITKIT_OFFLINE) to download it, or fetch it on a "
                   f"connected machine with `hf download {what}` (or `huggingface-cli "
                   f"download {what}`) into this cache")
        else:
            why = "the Hub could not be reached" + (
                f" ({self.unreachable})" if self.unreachable else "")
            fix = (f"check the connection, or fetch it elsewhere with `hf download {what}` "
                   "and copy the cache folder here")
        return WeightsNotFoundError(
            f"{self.label}: {filename} is not in the Hugging Face cache at {self.cache} and "
            f"{why}. Fix: {fix}; or pass a local model folder instead of the hf-hub: name.")

    def missing_weights(self) -> CheckpointError:
        names = " or ".join(WEIGHTS)
        if self.local_only or self.unreachable:
            return self._not_cached(names)
        return CheckpointError(f"{self.label} holds no {names}: {WHAT_VITKIT_READS}.")
