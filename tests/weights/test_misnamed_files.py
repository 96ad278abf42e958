"""Files whose name or state misleads: a PyTorch file named .safetensors is read by what its
bytes are (with a warning that says how to name it), and a run's damaged last.pt points to the
run's best.pt rather than to a download. Each test follows the message's advice and sees it
work."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from messages import says
from vitkit.catalog import load_pretrained, read_weights
from vitkit.cli import main
from vitkit.config import ViTConfig
from vitkit.errors import CheckpointError
from vitkit.model.vit import VisionTransformer
from vitkit.train.checkpoint import load_state
from vitkit.weights import save_pretrained

SMALL = ViTConfig(img_size=32, patch_size=16, width=192, depth=1, num_heads=3, mlp_dim=768,
                  num_classes=3)
TINY_RUN = ['model={"img_size": 8, "patch_size": 4, "in_chans": 1, "width": 16, "depth": 1, '
            '"num_heads": 2, "mlp_dim": 32}', "progress=false", "warmup_epochs=0",
            "batch_size=32", "train_limit=128", "test_limit=64", "threads=1"]


def _same(first: dict[str, torch.Tensor], second: dict[str, torch.Tensor]) -> bool:
    return first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)


@pytest.mark.parametrize("zipped", [True, False], ids=["zip", "legacy-pickle"])
def test_a_pytorch_file_named_safetensors_is_read_by_its_bytes_and_told_its_name(
        tmp_path, caplog, zipped):
    model = VisionTransformer(SMALL)
    misnamed = tmp_path / "model.safetensors"
    torch.save(model.state_dict(), misnamed, _use_new_zipfile_serialization=zipped)
    with caplog.at_level(logging.WARNING, logger="vitkit"):
        record = read_weights(misnamed)
    says(caplog.text, str(misnamed), "PyTorch file", "weights_only=True", "rename it to .pt")
    assert _same(record.state_dict, model.state_dict())

    # the advice: named .pt, it reads the same, with nothing to warn of
    caplog.clear()
    renamed = misnamed.rename(tmp_path / "model.pt")
    with caplog.at_level(logging.WARNING, logger="vitkit"):
        assert _same(read_weights(renamed).state_dict, model.state_dict())
    assert "safetensors" not in caplog.text


def test_a_vitkit_folder_whose_model_safetensors_is_a_pytorch_file_loads(tmp_path, caplog):
    model = VisionTransformer(SMALL)
    folder = save_pretrained(model, tmp_path / "folder")
    tensors = {k: v.clone() for k, v in load_file(folder / "model.safetensors").items()}
    (folder / "model.safetensors").unlink()  # its tensors were mapped from it
    torch.save(tensors, folder / "model.safetensors")  # saved by the wrong function
    with caplog.at_level(logging.WARNING, logger="vitkit"):
        loaded = load_pretrained(folder)
    says(caplog.text, "PyTorch file", "safetensors.torch.save_file")
    assert _same(loaded.state_dict(), model.state_dict())


@pytest.fixture
def damaged_run(tmp_path) -> Path:
    """A two-epoch run whose last.pt was cut short (a copy that stopped half way)."""
    run = tmp_path / "run"
    assert main(["train", *TINY_RUN, "epochs=2", "--out", str(run)]) == 0
    data = (run / "last.pt").read_bytes()
    (run / "last.pt").write_bytes(data[:len(data) // 2])
    return run


@pytest.mark.parametrize("named", ["folder", "last.pt"])
def test_resuming_from_a_damaged_last_pt_points_to_best_pt_and_that_resumes(
        damaged_run, capsys, named):
    given = damaged_run if named == "folder" else damaged_run / "last.pt"
    assert main(["train", "epochs=3", "--resume", str(given)]) == 2
    err = capsys.readouterr().err
    says(err, str(damaged_run / "last.pt"), "damaged", f"--resume {damaged_run / 'best.pt'}")
    assert "download" not in err

    advice = re.search(r"--resume (\S+)", err).group(1)
    assert main(["train", "epochs=3", "--resume", advice]) == 0
    position = load_state(damaged_run / "last.pt")["position"]  # written whole again
    assert position["epoch"] == 3


def test_reading_a_damaged_last_pt_points_to_best_pt(damaged_run):
    with pytest.raises(CheckpointError) as caught:
        read_weights(damaged_run / "last.pt")
    says(caught.value, "damaged", str(damaged_run / "best.pt"))
    assert "download" not in str(caught.value)
    advice = re.search(r"instead, (\S+)", str(caught.value)).group(1)
    assert read_weights(advice).path == damaged_run / "best.pt"


def test_with_both_checkpoints_damaged_the_way_out_is_training_again(damaged_run, capsys):
    data = (damaged_run / "best.pt").read_bytes()
    (damaged_run / "best.pt").write_bytes(data[:len(data) // 3])
    assert main(["train", "epochs=3", "--resume", str(damaged_run)]) == 2
    err = capsys.readouterr().err
    says(err, "best.pt is damaged too", "train again", "--overwrite")
    assert main(["train", *TINY_RUN, "epochs=1", "--out", str(damaged_run), "--overwrite"]) == 0
    assert load_state(damaged_run / "last.pt")["position"]["epoch"] == 1
