"""The JSON files vitkit reads have limits, each refused naming the file and the limit (exit
2, one line from the CLI): a file over 16 MiB (before it is read), nesting deeper than 64
levels (never a RecursionError), a class or target name over 1,000 characters (named by its
index, never printed). Unknown keys in vitkit's own config.json are warned of, with the
closest known key; foreign configs keep their many keys of their own without a word."""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path

import numpy as np
import pytest
from tests.messages import says

import vitkit
from vitkit.cli import main
from vitkit.config import ViTConfig
from vitkit.data.sources import open_source
from vitkit.errors import CheckpointError, ConfigError, DataError
from vitkit.files import JSON_MAX_BYTES, JSON_MAX_DEPTH, read_json
from vitkit.train.recipe import run_config

TINY = ViTConfig(img_size=16, patch_size=8, width=16, depth=1, num_heads=2, mlp_dim=32,
                 num_classes=3)


@pytest.fixture()
def folder(tmp_path: Path) -> Path:
    model = vitkit.create_model(TINY)
    return vitkit.save_pretrained(model, tmp_path / "tiny", class_names=["a", "b", "c"])


def _edit(folder: Path, **changes) -> dict:
    meta = json.loads((folder / "config.json").read_text())
    meta.update(changes)
    (folder / "config.json").write_text(json.dumps(meta))
    return meta


def _summary_fails(path: Path, capsys) -> str:
    assert main(["summary", str(path)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err


def test_a_deeply_nested_config_is_refused_in_one_line(folder, capsys) -> None:
    (folder / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    says(_summary_fails(folder, capsys), "config.json", "deeper than 64 levels")
    nested = {"format": "vitkit", "x": 1}
    for _ in range(JSON_MAX_DEPTH + 1):  # deeper than the limit, too shallow for recursion
        nested = {"x": nested}
    (folder / "config.json").write_text(json.dumps(nested))
    says(_summary_fails(folder, capsys), "deeper than 64 levels")


def test_a_deeply_nested_model_config_is_a_config_error(tmp_path: Path, capsys) -> None:
    with pytest.raises(ConfigError, match="deeper than 64"):
        ViTConfig.from_json('{"a": ' * 50_000 + "1" + "}" * 50_000)
    path = tmp_path / "model.json"
    path.write_text('{"a": ' * 50_000 + "1" + "}" * 50_000)
    says(_summary_fails(path, capsys), "model.json", "deeper than 64")


def test_a_deeply_nested_override_is_refused_in_one_line(tmp_path: Path, capsys) -> None:
    nested = "[" * 50_000 + "]" * 50_000
    assert main(["train", f"mean={nested}", "epochs=1", f"out_dir={tmp_path}"]) == 2
    err = capsys.readouterr().err
    says(err, "nests too deeply", "flat value")
    assert "Traceback" not in err and "bug in vitkit" not in err
    # the advice: a flat value (a list one level deep) is read
    assert tuple(run_config(None, ["mean=[0.5]", "std=[0.5]"]).mean) == (0.5,)


def test_a_config_over_16_mib_is_refused_before_it_is_read(folder, capsys) -> None:
    _edit(folder, padding="x" * (17 * 2 ** 20))
    says(_summary_fails(folder, capsys), "config.json", "16 MiB")
    assert JSON_MAX_BYTES == 16 * 2 ** 20
    with pytest.raises(CheckpointError, match="16 MiB"):
        read_json(folder / "config.json", CheckpointError, "restore it")


def test_a_class_name_over_1000_characters_is_refused_by_index(folder, capsys) -> None:
    _edit(folder, class_names=["a", "b" * 2000, "c"])
    err = _summary_fails(folder, capsys)
    says(err, "index 1", "2,000 characters", "1,000")
    assert "bbbbbbbbbb" not in err  # the name itself is never printed
    _edit(folder, class_names=["a", "b" * 1000, "c"])  # at the limit: read
    assert vitkit.load_pretrained(folder).class_names[1] == "b" * 1000


def test_a_target_name_over_1000_characters_is_refused_in_arrays(tmp_path: Path, capsys) -> None:
    root = tmp_path / "d"
    root.mkdir()
    rng = np.random.default_rng(0)
    for split in ("train", "test"):
        np.savez(root / f"{split}.npz", images=rng.random((16, 8, 8), dtype=np.float32),
                 targets=rng.random((16, 2), dtype=np.float32),
                 target_names=np.array(["a", "t" * 2000]))
    with pytest.raises(DataError, match="1,000"):
        open_source("arrays", str(root))


def test_an_unknown_key_is_warned_of_with_the_closest_known_one(folder, caplog) -> None:
    _edit(folder, clas_names=["x"], **{"k" * 5000: 1})
    with caplog.at_level(logging.WARNING, logger="vitkit"):
        vitkit.load_pretrained(folder)
    says(caplog.text, "unknown key", "'clas_names'", "did you mean 'class_names'",
         "5,000 characters")
    assert "k" * 100 not in caplog.text  # a long key is cut short
    caplog.clear()
    meta = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(
        {k: v for k, v in meta.items() if k != "clas_names" and not k.startswith("kkk")}))
    with caplog.at_level(logging.WARNING, logger="vitkit"):
        vitkit.load_pretrained(folder)
    assert "unknown key" not in caplog.text


def test_a_foreign_config_keeps_its_own_keys_quietly(tmp_path: Path, caplog) -> None:
    """A Hugging Face folder's config.json has many keys vitkit does not read."""
    from vitkit.weights.formats.sniff import Found
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "vit", "torch_dtype": "f32",
                                                    "transformers_version": "4.0"}))
    with caplog.at_level(logging.WARNING, logger="vitkit"):
        assert Found.at(folder).config()["model_type"] == "vit"
    assert "unknown key" not in caplog.text


def test_a_dataset_label_name_over_1000_characters_is_refused(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (8, 8)).save(buffer, format="PNG")
    image = {"bytes": buffer.getvalue(), "path": None}
    features = datasets.Features({"image": datasets.Image(),
                                  "label": datasets.ClassLabel(names=["a", "x" * 2000])})
    whole = datasets.Dataset.from_dict({"image": [image] * 4, "label": [0, 1, 0, 1]},
                                       features=features)
    datasets.DatasetDict(train=whole, test=whole).save_to_disk(str(tmp_path / "saved"))
    with pytest.raises(DataError, match="index 1") as caught:
        open_source(f"hf:{tmp_path / 'saved'}")
    says(str(caught.value), "label names", "1,000")
