"""The model to benchmark, from any name `vitkit.catalog` knows, at the size asked for."""

from __future__ import annotations

from vitkit.catalog import create_model, load_pretrained, lookup
from vitkit.model.vit import VisionTransformer

Size = int | tuple[int, int]
# Kinds whose weights are read: they are on this machine, or a Hub repository asked for by name.
LOADED_KINDS = ("weights", "run_folder", "hub")


def load_benchmark_model(source: str, img_size: Size | None = None,
                         weights_dir: str | None = None) -> tuple[VisionTransformer, str]:
    """(model in eval mode, where its weights come from).

    Files, folders, run folders and Hub repositories are read with `load_pretrained`; any
    other name (a variant such as "B/16", a JSON config, a named official checkpoint) gives a
    randomly initialised model of the config it names, since speed does not depend on the
    weights' values and nothing needs downloading. At another `img_size` the position
    embeddings are resampled as `VisionTransformer.set_image_size` does.
    """
    named = lookup(source)
    if named.kind in LOADED_KINDS:
        model, origin = load_pretrained(source, weights_dir=weights_dir), f"weights {source}"
    else:
        model, origin = create_model(named.config()), "random init"
    if img_size is not None:
        size = (img_size, img_size) if isinstance(img_size, int) else tuple(img_size)
        if size != tuple(model.config.img_size):
            model.set_image_size(size)
    return model.eval(), origin
