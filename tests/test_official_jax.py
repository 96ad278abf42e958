"""Loaded official-layout checkpoints against the official JAX/Flax model itself.

Runs only where an interpreter with jax and flax is named by VITKIT_JAX_PYTHON (they are not
vitkit dependencies; see tools/official_jax_reference.py). Tolerance: 1e-4 max abs on the
logits, the issue's contract for official checkpoints.
"""

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

import vitkit
from vitkit.catalog import load_pretrained
from vitkit.weights import save_npz

JAX_PYTHON = os.environ.get("VITKIT_JAX_PYTHON")
SCRIPT = Path(__file__).resolve().parent.parent / "tools" / "official_jax_reference.py"
TOL = 1e-4

pytestmark = pytest.mark.skipif(not JAX_PYTHON, reason="set VITKIT_JAX_PYTHON to an "
                                "interpreter with jax and flax to compare with the official model")

CASES = {
    "B-sized block, class token, pre-logits": ("B/16", dict(depth=2, pre_logits_dim=768,
                                                             num_classes=21)),
    "gap classifier": ("S/16", dict(depth=2, class_token=False, pool="mean_patches")),
    "hybrid R50": ("R50+Ti/16", dict(depth=1, num_classes=5)),
    "hybrid root block only (R+ViT-Ti_16)": ("R+ViT-Ti_16", dict(depth=1, num_classes=5)),
}


@pytest.mark.parametrize("case", CASES)
def test_matches_official_flax_model(tmp_path, case):
    name, overrides = CASES[case]
    model = vitkit.create_model(name, img_size=64, act="gelu_tanh", **overrides)
    with torch.no_grad():  # norm scales near 1, so activations reach the GELU's curved range
        for pname, param in model.named_parameters():
            is_scale = "norm" in pname and pname.endswith("weight")
            param.normal_(1.0 if is_scale else 0.0, 0.1 if is_scale else 0.05)
    path = save_npz(model, tmp_path / "ckpt.npz")
    images = torch.randn(2, 3, 64, 64)
    np.save(tmp_path / "images.npy", images.permute(0, 2, 3, 1).numpy())
    subprocess.run([JAX_PYTHON, str(SCRIPT), str(path), str(tmp_path / "images.npy"),
                    str(tmp_path / "logits.npy")], check=True,
                   env={**os.environ, "JAX_PLATFORMS": "cpu"})
    official = torch.from_numpy(np.load(tmp_path / "logits.npy"))
    loaded = load_pretrained(path)
    with torch.no_grad():
        assert (loaded(images) - official).abs().max().item() <= TOL
        for module in loaded.modules():  # the check can fail: PyTorch's default GELU
            if isinstance(module, torch.nn.GELU):
                module.approximate = "none"
        assert (loaded(images) - official).abs().max().item() > TOL


def test_same_math_in_double_precision(tmp_path):
    """In float64 the two agree to rounding: what is left at fp32 is fp32 noise."""
    model = vitkit.create_model("R50+S/16", img_size=96, depth=2, act="gelu_tanh",
                                pre_logits_dim=384, num_classes=7)
    with torch.no_grad():
        for pname, param in model.named_parameters():
            is_scale = "norm" in pname and pname.endswith("weight")
            param.normal_(1.0 if is_scale else 0.0, 0.1 if is_scale else 0.05)
    path = save_npz(model, tmp_path / "ckpt.npz")
    images = torch.randn(2, 3, 96, 96, dtype=torch.float64)
    np.save(tmp_path / "images.npy", images.permute(0, 2, 3, 1).numpy())
    subprocess.run([JAX_PYTHON, str(SCRIPT), str(path), str(tmp_path / "images.npy"),
                    str(tmp_path / "logits.npy"), "float64"], check=True,
                   env={**os.environ, "JAX_PLATFORMS": "cpu", "JAX_ENABLE_X64": "1"})
    official = torch.from_numpy(np.load(tmp_path / "logits.npy"))
    with torch.no_grad():
        ours = load_pretrained(path).double()(images)
    assert (ours - official).abs().max().item() <= 1e-9
