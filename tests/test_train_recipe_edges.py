"""Training settings a black-box trial of the recipes found mishandled (2026-11-30): a warmup
longer than the run in mixed units, a time budget spent by an evaluation, a shrinking
resolution schedule, a schedule side too large for memory, and the EMA's score in the log."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from vitkit.config import ViTConfig
from vitkit.errors import ConfigError
from vitkit.train import loop
from vitkit.train.checkpoint import Position
from vitkit.train.checkpoint import load_state as load_checkpoint
from vitkit.train.config import load_train_config
from vitkit.train.loop import TrainResult, run_loop
from vitkit.train.plan import RunPlan
from vitkit.train.setup import build_run


def test_a_warmup_in_epochs_longer_than_a_run_in_steps_is_warned_of_with_its_peak(caplog):
    model = ViTConfig(img_size=8, patch_size=2, width=16, depth=1, num_heads=2, mlp_dim=32)
    with caplog.at_level(logging.WARNING):
        RunPlan.create(model, 22, epochs=10, total_steps=10, warmup_epochs=2)
    assert ("the warmup (warmup_epochs=2, 44 steps) is longer than the run (total_steps=10): "
            "the learning rate peaks at 23% of lr; set warmup_steps=N below 10") in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        RunPlan.create(model, 2, epochs=1, warmup_steps=40)
    assert "the warmup (warmup_steps=40) is longer than the run (epochs=1, 2 steps)" \
        in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        RunPlan.create(model, 22, epochs=10, total_steps=10, warmup_epochs=2,
                       warmup_steps=5)  # as advised
    assert "longer than the run" not in caplog.text


def test_an_evaluation_that_spends_the_budget_ends_the_run_there(tmp_path, monkeypatch):
    """The budget ran out during an epoch-end evaluation: the run then trained one more step
    and evaluated again at once (63 s for a 15 s budget in the trial); now it ends at the
    evaluated step."""
    evaluate = loop.evaluate_and_log

    def slow_evaluation(*args, **kwargs):
        time.sleep(4.0)  # longer than the whole budget
        return evaluate(*args, **kwargs)

    monkeypatch.setattr(loop, "evaluate_and_log", slow_evaluation)
    cfg = load_train_config("digits", ["epochs=1000", "eval_every=1", "progress=false",
                                       "time_budget=3", f"out_dir={tmp_path}"])
    result = run_loop(build_run(cfg))
    history = load_checkpoint(tmp_path / "last.pt")["history"]
    assert len(history) == 1  # one evaluation, not a second one a step later
    assert history[0]["step"] == result.position.step == result.final["step"]
    assert result.stopped_early == "time budget"


def test_a_shrinking_resolution_schedule_is_refused_naming_the_fix():
    """It was accepted and announced ("8 px from 0% -> 4 px from 50%") but every step trained
    at 8 px (the step never shrinks the images)."""
    with pytest.raises(ConfigError, match=r"resolution_schedule sides \[8, 4\] shrink: a run's "
                                          r"image size only grows"):
        load_train_config("digits", ["resolution_schedule=[[0, 8], [0.5, 4]]"])
    cfg = load_train_config("digits", ["resolution_schedule=[[0, 4], [0.5, 8]]"])  # advised
    assert cfg.resolution_schedule == [[0, 4], [0.5, 8]]


@pytest.mark.parametrize("side, words", [(50000, "needs about"),
                                         (1e9, "needs more memory than any machine has")])
def test_a_schedule_side_too_large_for_memory_is_refused_before_anything_runs(tmp_path, side,
                                                                              words):
    cfg = load_train_config("digits", [f"resolution_schedule=[[0, {side}]]", "total_steps=2",
                                       "warmup_steps=0", f"out_dir={tmp_path}"])
    with pytest.raises(ConfigError, match=rf"{words}.*the resolution_schedule's sides"):
        build_run(cfg)


def test_the_ema_score_is_said_beside_the_raw_one_and_which_weights_are_saved():
    row = {"epoch": 6.0, "step": 132, "top1": 0.8384, "top5": 0.99, "ema_top1": 0.8774,
           "minutes": 0.3}
    text = TrainResult(Path("runs/ema"), Position(step=132, total_steps=132), row,
                       num_classes=10).format()
    assert "test top-1 83.84%, top-5 99.00%; EMA weights 87.74% (the ones saved)" in text
    row["ema_top1"] = 0.80
    text = TrainResult(Path("runs/ema"), Position(step=132, total_steps=132), row,
                       num_classes=10).format()
    assert "EMA weights 80.00% (the raw ones are saved)" in text
