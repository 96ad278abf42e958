"""float64 arrays with values float32 cannot hold (|x| > 3.4e38): refused before they are cast,
naming the index and the fix (rescale), for targets and images, read into memory or batch by
batch, and for images given to `vitkit predict`; never a numpy overflow warning followed by a
message about NaN or inf the file does not hold, or a run that diverges."""

import json
import warnings
from pathlib import Path

import numpy as np
import pytest

from vitkit.cli import main

MODEL = "model=" + json.dumps({"width": 16, "depth": 1, "num_heads": 2, "mlp_dim": 32,
                               "patch_size": 4, "img_size": [16, 16]})
def says(text: str, *parts: str) -> None:
    """Assert that a message names each of `parts` (case-insensitive), showing it if not."""
    missing = [part for part in parts if part.lower() not in text.lower()]
    assert not missing, f"{missing} not in message: {text!r}"


QUICK = ["epochs=1", "warmup_epochs=0", "batch_size=15", "progress=false", "data=arrays"]


def _arrays(folder: Path, images: np.ndarray, targets: np.ndarray) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for split in ("train", "test"):
        np.savez(folder / f"{split}.npz", images=images, targets=targets)
    return folder


def _train(folder: Path, mode: str, out: Path) -> int:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no RuntimeWarning of a cast that overflows
        return main(["train", MODEL, *QUICK, f"data_dir={folder}", f"data_mode={mode}",
                     "--out", str(out)])


@pytest.mark.parametrize("mode", ["memory", "stream"])
def test_targets_and_images_beyond_float32_are_refused_and_rescaled_they_train(
        tmp_path, capsys, mode):
    rng = np.random.default_rng(0)
    images, targets = rng.random((30, 16, 16)), rng.random(30)
    big_targets = targets.copy()
    big_targets[[4, 7]] *= 1e300
    folder = _arrays(tmp_path / "t", images, big_targets)
    assert _train(folder, mode, tmp_path / "r0") == 2
    err = capsys.readouterr().err
    says(err, str(folder / "train.npz"), "targets", "2 target(s)", "float32", "3.4e38",
         "index 4, 7", "rescale")
    assert "NaN" not in err and "Traceback" not in err
    big_images = images.copy()
    big_images[3, 5, 5] = -2e300
    folder = _arrays(tmp_path / "i", big_images, targets)
    assert _train(folder, mode, tmp_path / "r1") == 2
    err = capsys.readouterr().err
    says(err, "arrays:train", "image 3", "float32", "3.4e38", "rescale")
    assert "diverged" not in err and "Traceback" not in err
    big_images[3, 5, 5] = -2.0  # the advice: values float32 holds
    assert _train(_arrays(tmp_path / "ok", big_images, targets), mode, tmp_path / "r2") == 0


def test_predict_names_the_image_beyond_float32_and_predicts_the_others(tmp_path, capsys):
    rng = np.random.default_rng(1)
    folder = _arrays(tmp_path / "d", rng.random((30, 16, 16)), rng.random(30))
    assert _train(folder, "memory", tmp_path / "run") == 0
    batch = rng.random((3, 1, 16, 16))
    batch[1] *= 1e300
    batch[2, 0, 0, 0] = np.nan
    np.save(tmp_path / "batch.npy", batch)
    capsys.readouterr()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert main(["predict", str(tmp_path / "run" / "best.pt"),
                     str(tmp_path / "batch.npy")]) == 1  # some images could not be used
    out = capsys.readouterr()
    text = out.out + out.err
    assert "batch.npy[0]: value=" in text
    says(text, "batch.npy[1]", "float32", "3.4e38")
    says(text, "batch.npy[2]", "NaN or inf", "numpy.nan_to_num")
    batch[1] /= 1e300  # the advice: rescale, and fix the NaN with numpy.nan_to_num
    np.save(tmp_path / "batch.npy", np.nan_to_num(batch))
    assert main(["predict", str(tmp_path / "run" / "best.pt"), str(tmp_path / "batch.npy")]) == 0
    assert capsys.readouterr().out.count("value=") == 3


def test_a_table_or_hugging_face_value_beyond_float32_is_refused_by_place(tmp_path):
    from PIL import Image

    from vitkit.data.sources import open_source
    from vitkit.errors import DataError

    for split in ("train", "val"):
        (tmp_path / "t" / split).mkdir(parents=True)
        Image.new("RGB", (16, 16)).save(tmp_path / "t" / split / "a.png")
        (tmp_path / "t" / split / "targets.csv").write_text("file,mass\na.png,1e300\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(DataError) as caught:
            open_source("folder", str(tmp_path / "t"), (16, 16), 3, mode="memory")
    says(str(caught.value), "targets.csv", "line 2", "'mass'", "'1e300'", "float32",
         "3.4e38", "rescale the column")
    for split in ("train", "val"):  # float32's largest value, as numpy prints it, fits
        (tmp_path / "t" / split / "targets.csv").write_text("file,mass\na.png,3.4028235e38\n")
    train, _ = open_source("folder", str(tmp_path / "t"), (16, 16), 3, mode="memory")
    assert train.labels[0, 0] == np.finfo(np.float32).max
    datasets = pytest.importorskip("datasets")
    datasets.disable_progress_bars()
    png = tmp_path / "t" / "train" / "a.png"
    features = datasets.Features({"image": datasets.Image(), "mass": datasets.Value("float64")})
    whole = datasets.Dataset.from_dict({"image": [str(png)] * 4,
                                        "mass": [1.0, -3e300, 2.0, 3.4028235e38]},
                                       features=features)
    datasets.DatasetDict(train=whole, test=whole).save_to_disk(str(tmp_path / "hf"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(DataError) as caught:
            open_source(f"hf:{tmp_path / 'hf'}", image_size=(16, 16), channels=3,
                        mode="memory", workers=0)
    says(str(caught.value), "1 value(s)", "'mass'", "float32", "3.4e38", "index 1",
         "rescale the column")  # float32's largest value, at 3, fits
    rescaled = datasets.Dataset.from_dict({"image": [str(png)] * 4,  # the advice
                                           "mass": [1.0, -3.0, 2.0, 3.4028235e38]},
                                          features=features)
    datasets.DatasetDict(train=rescaled, test=rescaled).save_to_disk(str(tmp_path / "hf2"))
    train, _ = open_source(f"hf:{tmp_path / 'hf2'}", image_size=(16, 16), channels=3,
                           mode="memory", workers=0)
    assert train.labels[:, 0].tolist()[:3] == [1.0, -3.0, 2.0]
