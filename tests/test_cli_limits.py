"""Limits of the command line a black-box trial of it found unguarded (2026-11-30): a batch
too large for memory reported as a bug, non-finite or empty sweep options, stale help and
output words, an unchecked norm_eps."""

from __future__ import annotations

import numpy as np
import pytest

from vitkit import create_model
from vitkit.cli import build_parser, main
from vitkit.errors import ConfigError


def test_a_batch_too_large_for_memory_is_an_error_naming_the_fix_not_a_bug(capsys):
    args = ["benchmark", "cifar10-tutorial", "--threads", "1", "--iters", "1", "--warmup", "0"]
    assert main([*args, "--batch-size", "100000000"]) == 2  # was 1 and "a bug in vitkit"
    err = capsys.readouterr().err
    assert "error: out of memory (" in err and "lower the batch size or the image size" in err
    assert "Traceback" not in err
    assert main([*args, "--batch-size", "2"]) == 0  # as advised


@pytest.mark.parametrize("args, words", [
    (["benchmark", "--sweep", "--variants", "Ti/16", "--memory-gb", "nan"],
     "argument --memory-gb: must be a finite number"),
    (["benchmark", "--sweep", "--variants", "Ti/16", "--memory-gb", "inf"],
     "argument --memory-gb: must be a finite number"),
    (["summary", "B/16", "--max-depth", "0"], "argument --max-depth: must be >= 1")])
def test_options_that_meant_nothing_are_refused_at_the_flag(capsys, args, words):
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code == 2
    assert words in capsys.readouterr().err


def test_an_empty_variant_list_is_refused_as_an_empty_resolution_list_is(capsys):
    assert main(["benchmark", "--sweep", "--variants", "", "--threads", "1"]) == 2
    assert "no variants given" in capsys.readouterr().err


def test_benchmark_int8_help_names_the_engine_auto_picks():
    bench = build_parser()._subparsers._group_actions[0].choices["benchmark"]
    text = " ".join(bench.format_help().split())
    assert "the engine --int8-engine names (default auto: the fastest measured" in text


def test_models_names_the_cache_in_use(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("VITKIT_CACHE", str(tmp_path / "my-cache"))
    assert main(["models"]) == 0
    assert f"cached in {tmp_path / 'my-cache'}, or put the file" in capsys.readouterr().out


@pytest.mark.parametrize("eps", [-1.0, 0.0, 2.0])
def test_a_norm_eps_that_is_not_small_and_positive_is_refused(eps):
    """norm_eps=-1 was accepted and the model gave NaN for every input."""
    with pytest.raises(ConfigError, match="norm_eps must be a small positive number"):
        create_model("cifar10-tutorial", norm_eps=eps)
    assert create_model("cifar10-tutorial", norm_eps=1e-6).config.norm_eps == 1e-6


@pytest.mark.parametrize("final_norm, words", [("none", "(the model has no final norm)"),
                                               ("tokens", "after the final norm"),
                                               ("pooled", "after the pooled norm")])
def test_the_feature_words_follow_the_final_norm(final_norm, words):
    from vitkit.evaluation.features import representation_of

    pool = "mean_patches" if final_norm == "pooled" else "class_token"
    model = create_model("Ti/16", img_size=32, depth=1, final_norm=final_norm, pool=pool)
    assert words in representation_of(model)


def test_knn_with_k_above_the_training_images_says_the_k_it_used(monkeypatch, caplog):
    from vitkit.evaluation import frozen_report
    from vitkit.evaluation.features import FrozenFeatures

    rng = np.random.default_rng(0)
    features = FrozenFeatures(rng.normal(size=(12, 4)).astype(np.float32),
                              np.arange(12) % 3, rng.normal(size=(6, 4)).astype(np.float32),
                              np.arange(6) % 3, ["a", "b", "c"], "pooled representation",
                              "synthetic")
    monkeypatch.setattr(frozen_report, "frozen_features", lambda *args: features)
    report = frozen_report.probe_report("weights", k=100000)
    assert "kNN (k=12, 100000 asked, T=0.07, cosine)" in report.text
    assert report.data["knn"]["k"] == 12 and report.data["knn"]["k_asked"] == 100000
    assert "k=100000 is more than the 12 training images" in caplog.text
