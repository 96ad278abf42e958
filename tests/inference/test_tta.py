"""Flip test-time augmentation (`vitkit.inference.tta`): the mirror-averaged outputs, the
recipe's `tta` in training, and `--tta` of eval and predict, each checked against the
model run by hand on the same images."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from vitkit import VisionTransformer, ViTConfig, load_pretrained
from vitkit.cli import main
from vitkit.errors import ConfigError
from vitkit.inference.tta import FlipAveraged, recorded_tta, with_tta
from vitkit.preprocess import preprocess_for


def _model() -> VisionTransformer:
    config = ViTConfig(img_size=8, patch_size=2, in_chans=3, width=16, depth=2, num_heads=2,
                       mlp_dim=32, num_classes=5)
    model = VisionTransformer(config).eval()
    with torch.no_grad():  # the head starts at zero (as in the paper): give it outputs
        for param in model.parameters():
            param.add_(0.1 * torch.randn_like(param))
    return model


def test_flip_averaging_is_the_mean_of_the_two_views_and_mirror_invariant() -> None:
    model = _model()
    images = torch.randn(4, 3, 8, 8)
    averaged = FlipAveraged(model)
    with torch.no_grad():
        expected = (model(images) + model(torch.flip(images, dims=[3]))) / 2
        got = averaged(images)
        mirrored = averaged(torch.flip(images, dims=[3]))
        plain = model(images)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)
    torch.testing.assert_close(mirrored, got, rtol=0, atol=1e-5)  # same two views, swapped
    assert not torch.allclose(got, plain, atol=1e-4)  # the mirror view changes the outputs
    assert with_tta(model, "none") is model


def test_the_tta_choice_defaults_to_the_training_run_and_unknown_ones_are_refused() -> None:
    assert recorded_tta(None, "flip") == "flip"
    assert recorded_tta(None) == "none"  # weights of other origins record none
    assert recorded_tta("none", "flip") == "none"  # asked for wins
    with pytest.raises(ConfigError) as info:
        with_tta(_model(), "mirror")
    for part in ("tta='mirror'", "none", "flip"):
        assert part in str(info.value), str(info.value)


@pytest.fixture(scope="module")
def flip_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A short digits run whose evaluations use flip TTA."""
    out = tmp_path_factory.mktemp("tta") / "run"
    assert main(["train", "epochs=2", "lr=0.003", "model.patch_size=4", "tta=flip",
                 "progress=false", "--out", str(out)]) == 0
    return out


def _digits_test() -> tuple[torch.Tensor, torch.Tensor]:
    from vitkit.data.sources.digits import load_digits

    test = load_digits("test")
    return test.images, test.labels


def _top1_by_hand(run: Path, flip: bool) -> float:
    model = load_pretrained(run).eval()
    images, labels = _digits_test()
    with torch.no_grad():
        x = preprocess_for(model).normalize(images)
        logits = model(x)
        if flip:
            logits = (logits + model(torch.flip(x, dims=[3]))) / 2
    return (logits.argmax(1) == labels).double().mean().item()


def test_eval_of_a_flip_run_reproduces_its_training_score_with_tta(flip_run: Path,
                                                                  capsys) -> None:
    rows = [json.loads(line) for line in (flip_run / "metrics.jsonl").read_text().splitlines()]
    assert main(["eval", str(flip_run), "--out", str(flip_run / "eval")]) == 0
    printed = capsys.readouterr().out
    report = json.loads((flip_run / "eval" / "eval-digits-test-flip.json").read_text())
    assert report["tta"] == "flip" and "flip TTA" in printed
    assert report["top1"] == pytest.approx(max(row["top1"] for row in rows), abs=1e-9)
    assert report["top1"] == pytest.approx(_top1_by_hand(flip_run, flip=True), abs=1e-9)
    assert main(["eval", str(flip_run), "--tta", "none", "--out", str(flip_run / "eval")]) == 0
    plain = json.loads((flip_run / "eval" / "eval-digits-test.json").read_text())
    assert plain["tta"] == "none"
    assert plain["top1"] == pytest.approx(_top1_by_hand(flip_run, flip=False), abs=1e-9)
    capsys.readouterr()
    assert main(["eval", str(flip_run), "--json", "--out", str(flip_run / "eval")]) == 0
    assert json.loads(capsys.readouterr().out) == report  # --json: eval.json's object alone


def test_the_training_line_says_its_scores_are_mirror_averaged(flip_run: Path) -> None:
    from vitkit.train.checkpoint import Position
    from vitkit.train.loop import TrainResult

    final = {"epoch": 2.0, "step": 10, "top1": 0.9, "top5": 1.0, "minutes": 0.1}
    done = TrainResult(flip_run, Position(), final, num_classes=10, tta="flip").format()
    assert done.startswith("done: epoch 2.00, step 10, test top-1 90.00%, top-5 100.00% "
                           "(flip TTA)")


def test_predict_with_flip_tta_gives_the_mirror_averaged_probabilities(flip_run: Path,
                                                                       capsys) -> None:
    from vitkit.data.sources.digits import SAMPLE_INDEX, sample_digit

    assert main(["predict", str(flip_run), str(sample_digit()), "--json", "--topk", "1"]) == 0
    default = json.loads(capsys.readouterr().out)
    assert main(["predict", str(flip_run), str(sample_digit()), "--json", "--topk", "1",
                 "--tta", "none"]) == 0
    plain = json.loads(capsys.readouterr().out)
    model = load_pretrained(flip_run).eval()
    images, _ = _digits_test()
    with torch.no_grad():
        x = preprocess_for(model).normalize(images[SAMPLE_INDEX:SAMPLE_INDEX + 1])
        one = model(x).softmax(-1)
        both = ((model(x) + model(torch.flip(x, dims=[3]))) / 2).softmax(-1)
    assert default["topk"][0]["prob"] == pytest.approx(both.max().item(), abs=1e-5)
    assert plain["topk"][0]["prob"] == pytest.approx(one.max().item(), abs=1e-5)
    assert abs(both.max().item() - one.max().item()) > 1e-6


def test_a_saved_model_folder_keeps_the_runs_tta_for_eval(flip_run: Path, tmp_path: Path,
                                                         capsys) -> None:
    """save_pretrained writes the run's TTA into config.json (`eval_tta`), so `vitkit eval` of
    the folder reproduces the run's score by default; a new head drops it; a wrong value is
    refused with the fix."""
    from vitkit import save_pretrained
    from vitkit.errors import CheckpointError

    model = load_pretrained(flip_run)
    assert model.eval_tta == "flip"
    folder = save_pretrained(model, tmp_path / "saved")
    assert json.loads((folder / "config.json").read_text())["eval_tta"] == "flip"
    assert main(["eval", str(folder), "--data", "digits", "--json", "--out",
                 str(tmp_path / "eval")]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["tta"] == "flip"
    assert report["top1"] == pytest.approx(_top1_by_hand(flip_run, flip=True), abs=1e-9)
    assert load_pretrained(folder, num_classes=3).eval_tta == "none"  # not what was trained
    meta = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**meta, "eval_tta": "mirror"}))
    with pytest.raises(CheckpointError) as info:
        load_pretrained(folder)
    for part in ("tta='mirror'", "none", "flip", "save_pretrained"):
        assert part in str(info.value), str(info.value)
    save_pretrained(model, folder)  # the message's fix: the folder reads again, flip kept
    assert load_pretrained(folder).eval_tta == "flip"


# -- flip TTA on weights trained without flips: a warning, with the fix -------------------------
def test_the_warning_names_a_run_that_never_flipped_its_inputs() -> None:
    from vitkit.inference.tta import unflipped_training_warning

    unflipped = {"augment": {"flip": False}}
    caution = unflipped_training_warning("flip", unflipped)
    assert caution is not None and "augment.flip=false" in caution and "--tta none" in caution
    assert unflipped_training_warning("none", unflipped) is None
    assert unflipped_training_warning("flip", {"augment": {"flip": True}}) is None
    assert unflipped_training_warning("flip", {"augment": {}}) is None  # pictures flip by default
    assert unflipped_training_warning("flip", {}) is None
    assert unflipped_training_warning("flip", {"augment": {}}, pictures=False)  # arrays do not
    assert unflipped_training_warning("flip", None) is None  # no recipe: nothing to say


def test_eval_and_predict_warn_when_flip_tta_meets_a_run_without_flips(flip_run: Path,
                                                                      caplog, capsys) -> None:
    """The digits recipe trains without flips (a digit's mirror image is no digit), so flip TTA
    of its run warns; the fix the warning names, --tta none, runs without it."""
    import logging

    with caplog.at_level(logging.WARNING, logger="vitkit"):
        assert main(["eval", str(flip_run), "--out", str(flip_run / "eval")]) == 0
    for part in ("never flipped its inputs", "augment.flip=false", "--tta none"):
        assert part in caplog.text, caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="vitkit"):
        assert main(["eval", str(flip_run), "--tta", "none", "--out", str(flip_run / "eval")]) \
            == 0
    assert "flipped" not in caplog.text
    from vitkit.data.sources.digits import sample_digit

    caplog.clear()
    capsys.readouterr()
    with caplog.at_level(logging.WARNING, logger="vitkit"):
        assert main(["predict", str(flip_run), str(sample_digit()), "--json"]) == 0
    assert "never flipped its inputs" in caplog.text
    assert json.loads(capsys.readouterr().out)["topk"]  # stdout stays JSON
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="vitkit"):
        assert main(["predict", str(flip_run), str(sample_digit()), "--tta", "none"]) == 0
    assert "flipped" not in caplog.text


def test_training_with_flip_tta_and_no_flips_warns(caplog) -> None:
    import logging

    from vitkit.train.config import load_train_config
    from vitkit.train.data import augment_config

    with caplog.at_level(logging.WARNING, logger="vitkit"):
        augment_config(load_train_config("digits", ["tta=flip"]), streamed=False)
    for part in ("tta=flip", "does not flip", "augment.flip=false", "tta=none",
                 "augment.flip=true"):
        assert part in caplog.text, caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="vitkit"):
        augment_config(load_train_config("digits", ["tta=flip", "augment.flip=true"]),
                       streamed=False)
        augment_config(load_train_config("digits", []), streamed=False)
    assert caplog.text == ""


def test_serving_a_run_without_flips_with_flip_tta_warns(flip_run: Path, caplog) -> None:
    import logging

    pytest.importorskip("fastapi", reason="vitkit serve needs the [serve] extra")
    from vitkit.serve.service import ModelService

    with caplog.at_level(logging.WARNING, logger="vitkit"):
        service = ModelService.load(str(flip_run))  # the run's own TTA: flip
    assert service.tta == "flip" and "never flipped its inputs" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="vitkit"):
        assert ModelService.load(str(flip_run), tta="none").tta == "none"
    assert "flipped" not in caplog.text
