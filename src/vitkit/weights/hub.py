"""Moved to `vitkit.weights.formats.hub`; this name stays for existing imports."""

from vitkit.errors import WeightsNotFoundError
from vitkit.weights.formats.hub import (
    BASE_URL,
    cache_dir,
    download_file,
    local_filename,
    named_checkpoints,
    normalize_name,
    resolve_named,
)

__all__ = ["BASE_URL", "WeightsNotFoundError", "cache_dir", "download_file", "local_filename",
           "named_checkpoints", "normalize_name", "resolve_named"]
