"""`vitkit train --data SOURCE`, as eval and finetune take it. No option is read as an
abbreviation of a longer one (argparse's default), so `train --data cifar10` names the data,
not data_dir=cifar10."""

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from vitkit.cli import main


def says(text: str, *parts: str) -> None:
    """Assert that a message names each of `parts` (case-insensitive), showing it if not."""
    missing = [part for part in parts if part.lower() not in text.lower()]
    assert not missing, f"{missing} not in message: {text!r}"


TINY = ('model={"variant": "Ti/4", "img_size": 16, "width": 16, "depth": 1, "num_heads": 2, '
        '"mlp_dim": 32}')
QUICK = ["epochs=1", "warmup_epochs=0", "batch_size=8", "progress=false"]


@pytest.fixture
def pets(tmp_path: Path, monkeypatch) -> Path:
    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        for shade, name in ((40, "dark"), (215, "light")):
            folder = tmp_path / "pets" / split / name
            folder.mkdir(parents=True)
            for index in range(4):
                pixels = np.clip(shade + rng.normal(0, 20, (16, 16, 3)), 0, 255)
                Image.fromarray(pixels.astype(np.uint8)).save(folder / f"{index}.png")
    monkeypatch.chdir(tmp_path)
    return tmp_path / "pets"


def test_train_takes_data_as_a_flag(pets: Path, tmp_path: Path) -> None:
    assert main(["train", "--data", "folder", "--data-dir", "pets", TINY, *QUICK,
                 "--out", "runs/pets"]) == 0
    recipe = torch.load(tmp_path / "runs" / "pets" / "last.pt", weights_only=True)
    assert (recipe["train_config"]["data"], recipe["train_config"]["data_dir"]) == \
        ("folder", "pets")
    assert recipe["classes"] == ["dark", "light"]


def test_the_flag_wins_over_a_data_override_as_the_other_flags_do(pets: Path,
                                                                  tmp_path: Path) -> None:
    assert main(["train", "data=cifar10", "--data", "folder", "--data-dir", "pets", TINY,
                 *QUICK, "--out", "runs/pets"]) == 0
    recipe = torch.load(tmp_path / "runs" / "pets" / "last.pt", weights_only=True)
    assert recipe["train_config"]["data"] == "folder"


@pytest.mark.parametrize("words", [["train", "--dat", "folder"], ["train", "--data-di", "pets"],
                                   ["eval", "runs/pets", "--dat", "digits"],
                                   ["train", "--time", "5"]])
def test_an_abbreviated_option_is_refused_not_read_as_another(pets: Path, capsys,
                                                              words: list[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(words)
    assert stopped.value.code == 2
    says(capsys.readouterr().err, "unrecognized arguments", words[-2])
    assert not (pets.parent / "runs").exists()


def test_resuming_with_other_data_does_not_read_the_runs_folder_as_it(pets: Path,
                                                                       tmp_path: Path,
                                                                       capsys) -> None:
    """data=folder data_dir=pets resumed with --data digits: pets is not read as digits; the
    class check refuses the resume and suggests the fine-tune on the digits."""
    assert main(["train", "data=folder", "data_dir=pets", TINY, *QUICK,
                 "--out", "runs/pets"]) == 0
    capsys.readouterr()
    assert main(["train", "--resume", "runs/pets", "--data", "digits", "epochs=2"]) == 2
    err = capsys.readouterr().err
    assert "not read by data=digits" not in err
    says(err, "cannot resume", "runs/pets/last.pt",
         "vitkit finetune runs/pets/last.pt --data digits")
