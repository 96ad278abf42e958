"""Named official checkpoints: their download URLs, a local cache, and an offline folder.

A source adapter: it turns a name into a local file, which the npz adapter then reads.
`resolve_named("B/16-i21k")` returns a local path: the file in `weights_dir` (or
$VITKIT_WEIGHTS_DIR) when it is there, else in the cache (~/.cache/vitkit or
$VITKIT_CACHE), downloading it once when downloads are allowed.
"""

from __future__ import annotations

import os
import re
import tempfile
import urllib.parse
import urllib.request
from pathlib import Path

from vitkit.config import _did_you_mean
from vitkit.errors import WeightsNotFoundError

BASE_URL = "https://storage.googleapis.com/vit_models"

# name -> path under BASE_URL. "i21k": ImageNet-21k pre-trained, with the pre-logits layer and
# a 21,843-way head; "i21k-i1k-384": fine-tuned on ImageNet-2012 at 384 (at 224 where named).
_OFFICIAL = {
    "B/16-i21k": "imagenet21k/ViT-B_16.npz",
    "B/32-i21k": "imagenet21k/ViT-B_32.npz",
    "L/16-i21k": "imagenet21k/ViT-L_16.npz",
    "L/32-i21k": "imagenet21k/ViT-L_32.npz",
    "H/14-i21k": "imagenet21k/ViT-H_14.npz",
    "R50+B/16-i21k": "imagenet21k/R50+ViT-B_16.npz",
    "R50+L/32-i21k": "imagenet21k/R50+ViT-L_32.npz",
    "R26+B/32-i21k": "imagenet21k/R26+ViT-B_32.npz",
    "B/16-i21k-i1k-384": "imagenet21k+imagenet2012/ViT-B_16.npz",
    "B/16-i21k-i1k-224": "imagenet21k+imagenet2012/ViT-B_16-224.npz",
    "B/32-i21k-i1k-384": "imagenet21k+imagenet2012/ViT-B_32.npz",
    "L/16-i21k-i1k-384": "imagenet21k+imagenet2012/ViT-L_16.npz",
    "L/16-i21k-i1k-224": "imagenet21k+imagenet2012/ViT-L_16-224.npz",
    "L/32-i21k-i1k-384": "imagenet21k+imagenet2012/ViT-L_32.npz",
    "R50+B/16-i21k-i1k-384": "imagenet21k+imagenet2012/R50+ViT-B_16.npz",
}
_ALIASES = {"R50+ViT-B/16-i21k": "R50+B/16-i21k"}


def named_checkpoints() -> dict[str, str]:
    """Every known name and its download URL."""
    return {name: _url(path) for name, path in _OFFICIAL.items()}


def _url(path: str) -> str:
    return f"{BASE_URL}/{urllib.parse.quote(path)}"  # "+" -> "%2B", as the bucket expects


def normalize_name(name: str) -> str | None:
    """The registry key for `name` ("ViT-B_16-i21k", "b16-i21k" and "B/16-i21k" agree)."""
    def canon(text: str) -> str:
        return re.sub(r"[^a-z0-9+]", "", text.lower().replace("vit", ""))

    wanted = canon(_ALIASES.get(name, name))
    return next((key for key in _OFFICIAL if canon(key) == wanted), None)


def local_filename(name: str) -> str:
    """The file name a named checkpoint has on disk: "imagenet21k_ViT-B_16.npz"."""
    return _OFFICIAL[name].replace("/", "_")


def cache_dir() -> Path:
    return Path(os.environ.get("VITKIT_CACHE", Path.home() / ".cache" / "vitkit"))


def resolve_named(name: str, weights_dir: str | Path | None = None,
                  download: bool | None = None) -> Path:
    """Local path of a named checkpoint, downloading it into the cache if allowed."""
    key = normalize_name(name)
    if key is None:
        raise WeightsNotFoundError(
            f"{name!r} is neither a file nor a known checkpoint name."
            + _did_you_mean(name, _OFFICIAL) + f" Known names: {', '.join(_OFFICIAL)}.")
    filename = local_filename(key)
    basename = _OFFICIAL[key].split("/")[-1]
    folders = [Path(p) for p in (weights_dir, os.environ.get("VITKIT_WEIGHTS_DIR")) if p]
    folders.append(cache_dir())
    for folder in folders:
        for candidate in (folder / filename, folder / _OFFICIAL[key], folder / basename):
            if candidate.is_file():
                return candidate
    if download is None:
        download = os.environ.get("VITKIT_OFFLINE", "0") in ("0", "", "false")
    url = _url(_OFFICIAL[key])
    if not download:
        places = ", ".join(str(f / filename) for f in folders)
        raise WeightsNotFoundError(
            f"{key} is not on this machine and downloads are off. Download {url} and put it "
            f"at one of: {places} (or pass --weights-dir FOLDER).")
    return download_file(url, cache_dir() / filename)


def download_file(url: str, target: Path) -> Path:
    """Download to a temporary file beside `target`, then rename (never a partial file)."""
    from tqdm.auto import tqdm

    target.parent.mkdir(parents=True, exist_ok=True)
    handle, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".part", dir=target.parent)
    try:
        with urllib.request.urlopen(url, timeout=60) as response, os.fdopen(handle, "wb") as out:
            total = int(response.headers.get("Content-Length", 0)) or None
            with tqdm(total=total, unit="B", unit_scale=True, desc=target.name) as bar:
                while chunk := response.read(1 << 20):
                    out.write(chunk)
                    bar.update(len(chunk))
        os.replace(tmp, target)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise WeightsNotFoundError(
            f"could not download {url} ({exc}). Offline, download it elsewhere and put it at "
            f"{target} or pass --weights-dir FOLDER.") from exc
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


# -- the adapter -------------------------------------------------------------------------------
def claims(name: str) -> bool:
    """Whether `name` is one of the named official checkpoints."""
    return normalize_name(name) is not None


resolve = resolve_named
