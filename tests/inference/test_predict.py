"""`vitkit predict` and `vitkit.predict`: preprocessing, class names, batching, errors."""

from __future__ import annotations

import importlib.util
import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from vitkit import create_model, load_pretrained, save_pretrained
from vitkit.cli import main
from vitkit.data.classnames import imagenet_class_names, imagenet_synsets
from vitkit.errors import ConfigError, InputError
from vitkit.predict import Prediction, predict
from vitkit.preprocess import IMAGENET_MEAN, IMAGENET_STD, Preprocess

NAMES = ["ant", "bee", "cat", "dog", "eel", "fox", "gnu"]
# Not the default: shorter-side resize + centre crop, bicubic, ImageNet statistics.
PREPROCESS = Preprocess(img_size=(32, 32), resize_mode="shorter_side", crop_pct=0.875,
                        interpolation="bicubic", mean=IMAGENET_MEAN, std=IMAGENET_STD)
# Image files under the folder, in sorted order, with their sizes (width, height).
RELS = ["a.png", "b.png", "m.png", "sub/c.png", "sub/deeper/d.png", "z.png"]
SIZES = [(40, 30), (64, 64), (17, 50), (33, 90), (32, 32), (100, 21)]


def says(text: str, *parts: str) -> None:
    """Assert that a message names each of `parts` (case-insensitive), showing it if not."""
    missing = [part for part in parts if part.lower() not in text.lower()]
    assert not missing, f"{missing} not in message: {text!r}"


def _small_model(num_classes: int) -> torch.nn.Module:
    torch.manual_seed(1)
    model = create_model("Ti/16", img_size=32, depth=2, num_classes=num_classes)
    with torch.no_grad():  # a random non-zero head, so that the classes differ
        model.head.weight.normal_(0, 0.1)
        model.head.bias.normal_(0, 0.1)
    return model


def _png(path: Path, size: tuple[int, int], seed: int) -> Path:
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels).save(path)
    return path


@pytest.fixture(scope="module")
def weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("weights") / "named"
    return save_pretrained(_small_model(len(NAMES)), folder, PREPROCESS, NAMES)


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """RELS under one root (written in reverse order) + files that must be ignored."""
    root = tmp_path_factory.mktemp("images")
    for i, (rel, size) in reversed(list(enumerate(zip(RELS, SIZES, strict=True)))):
        _png(root / rel, size, seed=i)
    (root / "notes.txt").write_text("not an image")
    _png(root / ".hidden" / "e.png", (20, 20), seed=9)
    return root


def _files(root: Path) -> list[Path]:
    return [root / rel for rel in RELS]


def test_predict_equals_manual_forward(weights: Path, images: Path) -> None:
    model = load_pretrained(weights)
    assert model.preprocess == PREPROCESS and model.class_names == NAMES
    files = _files(images)
    results = predict(model, files, topk=3, batch_size=6)

    with torch.no_grad():
        probs = model(PREPROCESS([Image.open(f) for f in files])).softmax(dim=-1)
    expected_p, expected_i = probs.topk(3, dim=-1)
    assert [r.path for r in results] == [str(f) for f in files]
    for result, p_row, i_row in zip(results, expected_p, expected_i, strict=True):
        assert result.ok and result.indices == i_row.tolist()
        assert result.labels == [NAMES[i] for i in i_row.tolist()]
        assert torch.allclose(torch.tensor(result.probs), p_row, atol=1e-6, rtol=0)
        assert result.probs == sorted(result.probs, reverse=True)
        assert 0 < sum(result.probs) <= 1 + 1e-6
    # Other batch splits (4 + 2 here) agree up to float32 rounding of other batch shapes.
    for split, whole in zip(predict(model, files, topk=3, batch_size=4), results, strict=True):
        assert split.indices == whole.indices
        assert np.allclose(split.probs, whole.probs, atol=1e-5, rtol=0)
    # The stored preprocessing matters: the plain official one gives other probabilities.
    with torch.no_grad():
        other = model(Preprocess(img_size=(32, 32))([Image.open(f) for f in files]))
    assert not torch.allclose(other.softmax(dim=-1), probs, atol=1e-3)


def test_folder_equals_files_and_skips_non_images(weights: Path, images: Path) -> None:
    model = load_pretrained(weights)
    from_folder = predict(model, [images], topk=2, batch_size=32)
    from_files = [predict(model, [f], topk=2)[0] for f in _files(images)]
    assert [r.path for r in from_folder] == [str(f) for f in _files(images)]  # sorted, no .txt
    for a, b in zip(from_folder, from_files, strict=True):
        assert a.indices == b.indices and a.labels == b.labels
        assert np.allclose(a.probs, b.probs, atol=1e-5, rtol=0)  # batch of 6 vs batches of 1


def test_bad_files_are_reported_without_stopping_the_others(weights: Path, images: Path,
                                                            tmp_path: Path) -> None:
    model = load_pretrained(weights)
    good = _files(images)
    corrupt = tmp_path / "corrupt.jpg"
    corrupt.write_bytes(np.random.default_rng(0).integers(0, 256, 500, np.uint8).tobytes())
    truncated = tmp_path / "truncated.png"
    truncated.write_bytes(good[1].read_bytes()[:300])
    inputs = [good[0], corrupt, good[1], truncated, good[2]]
    results = predict(model, inputs, topk=2, batch_size=2)
    assert [r.path for r in results] == [str(p) for p in inputs]
    assert [r.ok for r in results] == [True, False, True, False, True]
    assert "cannot read image" in results[1].error and str(corrupt) not in results[1].error
    assert results[3].error and results[3].labels == []
    clean = predict(model, [good[0], good[1], good[2]], topk=2)
    for a, b in zip([results[0], results[2], results[4]], clean, strict=True):
        assert a.indices == b.indices and np.allclose(a.probs, b.probs, atol=1e-5, rtol=0)


def test_cli_json_lines_match_the_library(weights: Path, images: Path, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.jpg"
    bad.write_bytes(b"\x00not a jpeg" * 10)
    # Some inputs unreadable: the others are predicted, the bad one is named, exit status 1.
    assert main(["predict", str(weights), str(images), str(bad), "--json", "--topk", "3",
                 "--batch-size", "2"]) == 1
    captured = capsys.readouterr()
    lines = [json.loads(line) for line in captured.out.splitlines()]
    expected = predict(load_pretrained(weights), [images], topk=3)
    assert [line["path"] for line in lines] == [r.path for r in expected] + [str(bad)]
    for line, result in zip(lines, expected, strict=False):
        assert [t["index"] for t in line["topk"]] == result.indices
        assert [t["label"] for t in line["topk"]] == result.labels
        assert np.allclose([t["prob"] for t in line["topk"]], result.probs, atol=1e-6)
    assert "error" in lines[-1] and "topk" not in lines[-1]
    says(captured.err, "1 of 7", "could not be read", str(bad))


def test_cli_human_output(weights: Path, images: Path,
                          capsys: pytest.CaptureFixture[str]) -> None:
    file = _files(images)[0]
    assert main(["predict", str(weights), str(file), "--topk", "2"]) == 0
    out = capsys.readouterr().out.strip()
    result = predict(load_pretrained(weights), [file], topk=2)[0]
    first, second = (f"{n} ({100 * p:.2f}%)" for n, p in zip(result.labels, result.probs,
                                                               strict=True))
    assert out == f"{file}: {first}, {second}"


@pytest.mark.parametrize("make_args, parts", [
    (lambda w, tmp: [str(w), str(tmp / "missing.png")],
     ("missing.png", "does not exist", "image files")),
    (lambda w, tmp: [str(w), str(tmp)], ("holds no images", "image files")),
    (lambda w, tmp: [str(w), str(_bad(tmp))], ("none of the 1", "could be read", "valid image")),
    (lambda w, tmp: [str(w), str(_png(tmp / "x.png", (8, 8), 0)), "--topk", "0"],
     ("topk", ">= 1", "got 0")),
])
def test_cli_errors_are_clean(weights: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                              make_args, parts: tuple[str, ...]) -> None:
    """Bad input exits 2 with one clean error line naming the problem and what to pass."""
    assert main(["predict", *make_args(weights, tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("vitkit predict: error: ")
    says(err, *parts)
    assert "Traceback" not in err


def _bad(folder: Path) -> Path:
    path = folder / "only.jpg"
    path.write_bytes(b"garbage")
    return path


def test_model_without_head_is_refused(tmp_path: Path) -> None:
    model = create_model("Ti/16", img_size=32, depth=2, num_classes=0)
    file = _png(tmp_path / "x.png", (32, 32), 0)
    with pytest.raises(ConfigError) as info:
        predict(model, [file])
    says(str(info.value), "no classification head", "num_classes=0")
    with pytest.raises(InputError) as info:
        predict(_small_model(3), [tmp_path / "nope"])
    says(str(info.value), "nope", "does not exist")


def test_imagenet_names() -> None:
    names_1k, names_21k = imagenet_class_names(1000), imagenet_class_names(21843)
    assert len(names_1k) == 1000 and len(names_21k) == 21843
    assert names_1k[0] == "tench" and names_1k[1] == "goldfish" and names_1k[999] == "toilet tissue"
    assert names_21k[0] == "organism" and names_21k[-1] == "knothole"
    assert names_21k[359] == "tench" and imagenet_synsets(21843)[359] == "n01440764"
    assert imagenet_class_names(10) is None and imagenet_synsets(999) is None
    synsets_1k, synsets_21k = imagenet_synsets(1000), imagenet_synsets(21843)
    assert synsets_1k == sorted(synsets_1k) and synsets_21k == sorted(synsets_21k)
    # All ImageNet-1k classes but one (teddy bear) are in the fall11 21k release.
    assert set(synsets_1k) - set(synsets_21k) == {"n04399382"}


def test_21k_order_is_timms_goog_order() -> None:
    spec = importlib.util.find_spec("timm")  # locates timm's data files without importing it
    if spec is None or spec.origin is None:
        pytest.skip("timm is not installed")
    info = Path(spec.origin).parent / "data" / "_info"
    goog = (info / "imagenet21k_goog_synsets.txt").read_text().split()
    assert imagenet_synsets(21843) == goog
    assert imagenet_synsets(1000) == (info / "imagenet_synsets.txt").read_text().split()


def test_head_size_picks_names_when_the_checkpoint_has_none(tmp_path: Path) -> None:
    folder = save_pretrained(_small_model(1000), tmp_path / "in1k", PREPROCESS)
    model = load_pretrained(folder)
    assert model.class_names is None
    file = _png(tmp_path / "x.png", (32, 32), 0)
    result = predict(model, [file], topk=4)[0]
    names = imagenet_class_names(1000)
    assert result.labels == [names[i] for i in result.indices] and len(result.labels) == 4
    # Other head sizes without names fall back to "class N"; topk is capped at the head size.
    unnamed = predict(_small_model(3), [file], topk=10)[0]
    assert unnamed.labels == [f"class {i}" for i in unnamed.indices]
    assert sorted(unnamed.indices) == [0, 1, 2]
    assert abs(sum(unnamed.probs) - 1) < 1e-5


def test_prediction_dict_and_format() -> None:
    p = Prediction("x.png", ["a", "b"], [3, 1], [0.75, 0.125])
    assert p.to_dict() == {"path": "x.png", "topk": [{"label": "a", "index": 3, "prob": 0.75},
                                                     {"label": "b", "index": 1, "prob": 0.125}]}
    assert p.format() == "x.png: a (75.00%), b (12.50%)"
    bad = Prediction("y.jpg", error="cannot read image (broken)")
    assert bad.to_dict() == {"path": "y.jpg", "error": "cannot read image (broken)"}
    assert bad.format() == "y.jpg: error: cannot read image (broken)"


def test_a_training_checkpoint_shows_its_stored_class_names(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]
                                                            ) -> None:
    """A 10-way head trained on 3 named classes: the names are shown, not "class 2"."""
    from vitkit.data.dataset import ImageDataset
    from vitkit.predict import class_names_for
    from vitkit.train.config import load_train_config
    from vitkit.train.setup import build_run

    images = torch.randint(0, 255, (8, 1, 8, 8), dtype=torch.uint8)
    data = ImageDataset(images, torch.arange(8) % 3, ["cat", "horse", "ship"])
    trainer = build_run(load_train_config("digits", [f"out_dir={tmp_path}", "batch_size=8",
                                                   "progress=false"]),
                      train_data=data, test_data=data)
    with torch.no_grad():  # make "ship" the clear winner for every image
        trainer.model.head.bias.copy_(torch.tensor([0.0, 1, 9, 0, 0, 0, 0, 0, 0, 0]))
        trainer.model.head.weight.zero_()
    trainer.save("last")
    model = load_pretrained(tmp_path / "last.pt")
    assert class_names_for(model) == ["cat", "horse", "ship"] + [f"class {i}"
                                                                 for i in range(3, 10)]
    file = _png(tmp_path / "x.png", (8, 8), 0)
    assert main(["predict", str(tmp_path / "last.pt"), str(file), "--topk", "2"]) == 0
    assert capsys.readouterr().out.startswith(f"{file}: ship (")
    result = predict(model, [file], topk=2)[0]
    assert result.labels == ["ship", "horse"] and result.indices == [2, 1]


def test_a_file_reached_twice_is_predicted_once(weights: Path, images: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    model = load_pretrained(weights)
    first = _files(images)[0]
    again = images / "sub" / ".." / first.name  # the same file by another path
    results = predict(model, [first, images, first, again], topk=1)
    assert [r.path for r in results] == [str(first)] + [str(f) for f in _files(images)[1:]]
    assert main(["predict", str(weights), str(first), str(first), str(images)]) == 0
    assert len(capsys.readouterr().out.splitlines()) == len(RELS)


def test_cli_names_each_unreadable_file_and_exits_1(weights: Path, images: Path, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    bad = [_bad(tmp_path), tmp_path / "empty.png"]
    bad[1].write_bytes(b"")
    good = _files(images)[:2]
    assert main(["predict", str(weights), str(good[0]), str(bad[0]), str(good[1]),
                 str(bad[1])]) == 1
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert [line.split(": ")[0] for line in lines] == [str(good[0]), str(bad[0]), str(good[1]),
                                                       str(bad[1])]
    assert "error" not in lines[0] and "error" in lines[1] and "error" not in lines[2]
    says(err, "2 of 4", "could not be read", str(bad[0]), str(bad[1]))
    # Following the advice (pass valid images) gives a clean exit.
    assert main(["predict", str(weights), *map(str, good)]) == 0


# -- the digits model's input: light strokes on black, and a shipped sample -------------------
# (`digits_run`: the shared short run of the README's set-up command, conftest.py)
def test_the_sample_digit_is_a_held_out_3_of_the_embedded_set_and_ships() -> None:
    import ast
    import fnmatch
    import re

    from vitkit.data.sources.digits import SAMPLE_INDEX, load_digits, sample_digit

    test = load_digits("test")
    assert int(test.labels[SAMPLE_INDEX]) == 3 and sample_digit().name == "digit_3.png"
    with Image.open(sample_digit()) as image:
        assert image.mode == "L" and image.size == (8, 8)
        assert np.array_equal(np.asarray(image), test.images[SAMPLE_INDEX, 0].numpy())
    package = Path(__file__).resolve().parents[2] / "src" / "vitkit"
    pyproject = (package.parents[1] / "pyproject.toml").read_text()
    data = re.search(r"^\[tool\.setuptools\.package-data\]\nvitkit = (\[.*\])$", pyproject, re.M)
    shipped = ast.literal_eval(data.group(1))
    relative = sample_digit().resolve().relative_to(package).as_posix()
    assert any(fnmatch.fnmatch(relative, pattern) for pattern in shipped)


def test_a_digits_run_predicts_the_shipped_sample_and_says_what_it_expects(
        digits_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`vitkit predict runs/digits --sample` (the README's command): the sample is a 3; the
    report says the model expects light strokes on black and how to get the sample."""
    from vitkit.data.sources.digits import INPUT_NOTE, sample_digit

    assert main(["predict", str(digits_run), "--sample", "--topk", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"{sample_digit()}: 3 (")
    assert lines[1].startswith("note: ")
    says(lines[1], INPUT_NOTE, f"vitkit predict {digits_run} --sample")
    assert main(["predict", str(digits_run), str(sample_digit()), "--json"]) == 0
    [line] = capsys.readouterr().out.splitlines()  # --json: the JSON lines alone
    assert json.loads(line)["topk"][0]["label"] == "3"
    # With no input at all the error names --sample, and following it works (above).
    assert main(["predict", str(digits_run)]) == 2
    assert "--sample" in capsys.readouterr().err


def test_a_dark_on_light_digit_is_warned_about_and_inverting_it_as_advised_predicts_it(
        digits_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        caplog: pytest.LogCaptureFixture) -> None:
    from PIL import ImageOps

    from vitkit.data.sources.digits import INVERTED_WARNING, sample_digit

    drawn = tmp_path / "my_digit.png"  # drawn the usual way: dark strokes on white
    with Image.open(sample_digit()) as image:
        ImageOps.invert(image).resize((64, 64), Image.Resampling.NEAREST).save(drawn)
    with caplog.at_level(logging.WARNING):
        assert main(["predict", str(digits_run), str(drawn)]) == 0
    assert INVERTED_WARNING in caplog.text and str(drawn) in caplog.text
    capsys.readouterr()
    caplog.clear()
    inverted = tmp_path / "inverted.png"  # the advice: PIL.ImageOps.invert
    with Image.open(drawn) as image:
        ImageOps.invert(image).save(inverted)
    with caplog.at_level(logging.WARNING):
        assert main(["predict", str(digits_run), str(inverted), "--topk", "1"]) == 0
    assert INVERTED_WARNING not in caplog.text
    assert capsys.readouterr().out.startswith(f"{inverted}: 3 (")


def test_weights_not_trained_on_digits_get_no_digits_note_or_warning(
        weights: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        caplog: pytest.LogCaptureFixture) -> None:
    bright = tmp_path / "white.png"
    Image.new("RGB", (32, 32), (250, 250, 250)).save(bright)
    with caplog.at_level(logging.WARNING):
        assert main(["predict", str(weights), str(bright)]) == 0
    assert "note:" not in capsys.readouterr().out
    assert "light strokes" not in caplog.text


def test_the_shipped_sample_on_a_model_of_other_images_gets_a_note_that_it_says_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`--sample` on weights not trained on the digits: predicted (exit 0), with a note that a
    digit says nothing about this model; images of its own kind get no such note."""
    from vitkit.data.sources.digits import sample_digit

    weights = save_pretrained(_small_model(4), tmp_path / "rgb")
    assert main(["predict", str(weights), "--sample"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{sample_digit()}: ")
    note = next(line for line in out.splitlines() if line.startswith("note: "))
    says(note, "--sample", "8x8 digit", str(weights), "says nothing", "images of its own kind")
    assert main(["predict", str(weights), str(_png(tmp_path / "own.png", (32, 32), 0))]) == 0
    assert "note:" not in capsys.readouterr().out
    digit_sized = create_model("Ti/2", img_size=8, in_chans=1, depth=1, num_classes=10)
    saved = save_pretrained(digit_sized, tmp_path / "digits_saved")  # keeps no train_config
    assert main(["predict", str(saved), "--sample"]) == 0
    assert "says nothing" not in capsys.readouterr().out


def test_a_folder_reached_through_a_link_is_read_and_a_link_loop_is_not_followed(tmp_path):
    """Predict reads the images of a folder linked into the given one, as training does, and
    does not follow a link back up the tree."""
    from vitkit.predict import expand_inputs

    real = tmp_path / "real"
    real.mkdir()
    for name in ("b.png", "a.png", ".hidden.png"):
        Image.new("RGB", (8, 8)).save(real / name)
    split = tmp_path / "val"
    split.mkdir()
    (split / "img").symlink_to(real, target_is_directory=True)
    (real / "loop").symlink_to(split, target_is_directory=True)  # back into the tree
    found = expand_inputs([split])
    assert [path.name for path in found] == ["a.png", "b.png"]
    assert found[0] == split / "img" / "a.png"
