"""vitkit: the Vision Transformer of "An Image Is Worth 16x16 Words", faithful and fast."""

from vitkit.catalog import count_parameters, create_model, load_pretrained
from vitkit.config import ViTConfig, list_model_names, variant_config
from vitkit.errors import (
    CheckpointError,
    ConfigError,
    DataError,
    ExportError,
    InputError,
    TrainingError,
    VitkitError,
)
from vitkit.inference.merging import apply_token_merging
from vitkit.model import VisionTransformer
from vitkit.version import __version__
from vitkit.weights import save_pretrained

__all__ = [
    "CheckpointError",
    "ConfigError",
    "DataError",
    "ExportError",
    "InputError",
    "TrainingError",
    "ViTConfig",
    "VisionTransformer",
    "VitkitError",
    "__version__",
    "apply_token_merging",
    "count_parameters",
    "create_model",
    "list_model_names",
    "load_pretrained",
    "save_pretrained",
    "variant_config",
]
