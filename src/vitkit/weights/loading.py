"""Load a converted state dict into a model, with errors that say what does not fit."""

from __future__ import annotations

import torch
from torch import nn

from vitkit.errors import CheckpointError


def load_state_dict_checked(model: nn.Module, state_dict: dict[str, torch.Tensor]) -> None:
    """Strict load: every key present, no extras, every shape equal; else a clear error."""
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state_dict))
    unexpected = sorted(set(state_dict) - set(expected))
    mismatched = [f"{key}: checkpoint {tuple(state_dict[key].shape)} vs model {tuple(v.shape)}"
                  for key, v in expected.items()
                  if key in state_dict and state_dict[key].shape != v.shape]
    if not (missing or unexpected or mismatched):
        model.load_state_dict(state_dict)
        return
    lines = ["the checkpoint does not fit the model config:"]
    if mismatched:
        lines.append("  shapes differ: " + "; ".join(mismatched[:6]))
        if "head.weight" in state_dict and "head.weight" in expected and \
                state_dict["head.weight"].shape != expected["head.weight"].shape:
            lines.append(f"  the classifier size differs (checkpoint "
                         f"{len(state_dict['head.weight'])} outputs, model "
                         f"{len(expected['head.weight'])}): load_pretrained(path, "
                         f"num_classes={len(expected['head.weight'])}) reads the rest with a "
                         "new head")
        if any(line.startswith("pos_embed:") for line in mismatched):
            lines.append("  the position grid differs: load with load_pretrained(path, "
                         "img_size=...), which resamples the position embeddings")
    if missing:
        lines.append(f"  missing from the checkpoint: {', '.join(missing[:8])}")
    if unexpected:
        lines.append(f"  not in the model: {', '.join(unexpected[:8])}")
    raise CheckpointError("\n".join(lines))
