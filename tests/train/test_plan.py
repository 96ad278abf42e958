"""The run plan: step counts, warmup, the resolution schedule and the time-budget fit are pure
functions of the config, checked against step-by-step reference computations; a warmup longer
than the run is warned of with the peak it reaches, and every run logs its plan and an
estimate, with how to shorten it, before it runs long."""

import logging
import random
from types import SimpleNamespace

import pytest

from vitkit.cli import main
from vitkit.config import ViTConfig
from vitkit.errors import ConfigError
from vitkit.train import budget as budget_module
from vitkit.train.budget import BudgetClock
from vitkit.train.checkpoint import Position
from vitkit.train.compiling import CompileClock
from vitkit.train.config import load_train_config
from vitkit.train.loop import run_loop
from vitkit.train.plan import RunPlan, count
from vitkit.train.setup import build_run
from vitkit.train.step import TrainStep


def says(text: str, *parts: str) -> None:
    """Assert that a message names each of `parts` (case-insensitive), showing it if not."""
    missing = [part for part in parts if part.lower() not in text.lower()]
    assert not missing, f"{missing} not in message: {text!r}"


MODEL = ViTConfig(img_size=32, patch_size=4, width=16, depth=1, num_heads=2, mlp_dim=32,
                  num_classes=10)


def _plan(schedule=((0, 16), (0.4, 24), (0.7, 32)), **kwargs) -> RunPlan:
    options = dict(epochs=30, warmup_epochs=1, resolution_schedule=schedule) | kwargs
    return RunPlan.create(MODEL, batches_per_epoch=390, **options)


def test_planned_steps_and_warmup_follow_the_config():
    assert _plan().planned_steps == 30 * 390 and _plan().warmup == 390
    assert _plan(total_steps=1000, warmup_steps=7).planned_steps == 1000
    assert _plan(total_steps=1000, warmup_steps=7).warmup == 7
    assert _plan(epochs=0.01).planned_steps == 4  # ceil(3.9): a partial epoch still trains


def test_resolution_schedule_moves_up_at_its_fractions():
    plan = _plan()
    assert [plan.resolution_at(s, 100) for s in (0, 39, 40, 69, 70, 99)] == \
        [(16, 16), (16, 16), (24, 24), (24, 24), (32, 32), (32, 32)]
    assert _plan(schedule=()).resolution_at(5, 100) == (32, 32)


def test_tokens_between_equals_the_step_by_step_sum():
    rng = random.Random(0)
    for _ in range(300):
        stages = sorted(rng.sample(range(1, 100), rng.randint(0, 3)))
        schedule = [(0, 8), *[(s / 100, rng.choice([8, 12, 16, 32])) for s in stages]]
        plan = _plan(schedule=schedule)
        total = rng.randint(1, 400)
        first = rng.randint(0, total)
        by_step = sum(plan.tokens(plan.resolution_at(s, total)) for s in range(first, total))
        assert plan.tokens_between(first, total) == by_step


def test_the_budget_fit_is_the_longest_run_that_fits():
    plan = _plan()
    per_token, eval_seconds = 2e-5, 4.0
    for step, remaining in [(20, 3600.0), (2000, 1200.0), (5, 30.0)]:
        total = plan.fit_to_budget(step, per_token, remaining, eval_seconds, eval_every=2)

        def cost(n, step=step):
            return (plan.tokens_between(step, n) * per_token
                    + eval_seconds * (n - step) / plan.batches_per_epoch / 2)

        assert cost(total) <= remaining < cost(total + 1)


def test_one_slow_epoch_or_evaluation_does_not_resize_a_budgeted_run(monkeypatch):
    """A refit takes the median rate of the last epochs and the median of the last evaluations:
    one epoch 5x slower (another process on the cores), or one evaluation 40x slower, costs
    only its own extra seconds; a lasting slowdown still shortens the run."""
    now = [0.0]
    monkeypatch.setattr(budget_module, "time", SimpleNamespace(perf_counter=lambda: now[0]))
    plan = RunPlan.create(MODEL, batches_per_epoch=10, epochs=100)  # 64 tokens per image
    clock = BudgetClock(100.0, eval_every=1, plan=plan, compile_clock=CompileClock(False))
    pos = Position(total_steps=plan.planned_steps)
    clock.start(pos)

    def epoch(step_seconds: float, eval_seconds: float = 0.5) -> int:
        clock.start_epoch()
        for _ in range(10):
            now[0] += step_seconds
            pos.step, pos.batch = pos.step + 1, pos.batch + 1
            clock.after_step(pos, 64)
        clock.end_epoch()
        with clock.timing_evaluation():
            now[0] += eval_seconds
        pos.epoch, pos.batch = pos.epoch + 1, 0
        clock.refit_after_epoch(pos)
        return pos.total_steps

    for _ in range(4):
        steady = epoch(0.1)  # 1.5 s an epoch with its evaluation: about 66 epochs in 100 s
    assert 640 <= steady <= 680
    after_slow_epoch = epoch(0.5)  # 4 s more than usual: about 27 steps fewer
    assert steady - 40 <= after_slow_epoch < steady
    epoch(0.1)
    after_slow_eval = epoch(0.1, eval_seconds=20.0)  # 19.5 s more: about 130 steps fewer
    assert after_slow_epoch - 160 <= after_slow_eval < after_slow_epoch - 100
    epoch(0.5)
    epoch(0.5)
    assert epoch(0.5) < steady / 2  # three slow epochs in a row: the machine is slower now


def test_warmup_keeps_its_share_when_a_budget_shortens_the_run():
    plan = _plan()  # 11,700 planned steps, 390 of warmup
    assert plan.warmup_for(plan.planned_steps) == 390
    assert plan.warmup_for(2 * plan.planned_steps) == 390  # a longer run keeps its warmup
    assert plan.warmup_for(390) == 13  # the cifar10 recipe under --time-budget 120


def test_a_short_budget_does_not_leave_the_run_in_warmup(tmp_path, caplog):
    cfg = load_train_config("digits", ["epochs=50", "warmup_epochs=10", "time_budget=4",
                                       "progress=false", f"out_dir={tmp_path}"])
    trainer = build_run(cfg)
    result = run_loop(trainer)
    assert result.position.total_steps < trainer.plan.planned_steps
    assert trainer.warmup_steps < result.position.total_steps / 2
    assert "time budget fits" in caplog.text


def test_a_run_needs_a_batch():
    with pytest.raises(ConfigError, match="at least one batch"):
        RunPlan.create(MODEL, batches_per_epoch=0, epochs=1)


def test_the_plan_is_said_with_its_length_and_the_estimate_says_how_to_shorten_it():
    plan = RunPlan.create(MODEL.replace(img_size=384, patch_size=16), batches_per_epoch=98,
                          epochs=1, total_steps=10_000, warmup_steps=500)
    said = plan.describe(0, 10_000, 512, 8, 500)
    assert said.startswith("plan: ")
    says(said, "10,000 steps", "102 epochs of 98 batches", "image size 384 px", "batch 512",
         "8 accumulated micro-batches of 64", "warmup 500 steps")
    seconds_per_token = 30.0 / plan.tokens((384, 384))  # 30 s a step
    estimate = plan.estimate(5, 10_000, seconds_per_token)
    says(estimate, "3.5 days", "9,995 steps left", "30 s/step")
    fits = int(estimate.split("an hour fits about total_steps=")[1].split(",")[0])
    assert fits == 5 + 120  # 120 steps of 30 s fit in the hour
    shorter = RunPlan.create(MODEL.replace(img_size=384, patch_size=16), 98, 1, fits, 0)
    assert shorter.tokens_between(5, fits) * seconds_per_token <= 3600  # the advice fits


def test_a_warmup_in_epochs_longer_than_a_run_in_steps_is_warned_of_with_its_peak(caplog):
    model = ViTConfig(img_size=8, patch_size=2, width=16, depth=1, num_heads=2, mlp_dim=32)
    with caplog.at_level(logging.WARNING):
        RunPlan.create(model, 22, epochs=10, total_steps=10, warmup_epochs=2)
    says(caplog.text, "warmup_epochs=2", "44 steps", "longer than the run", "total_steps=10",
         "23% of lr", "warmup_steps=N below 10")
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        RunPlan.create(model, 2, epochs=1, warmup_steps=40)
    says(caplog.text, "warmup_steps=40", "longer than the run", "epochs=1", "2 steps")
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        RunPlan.create(model, 22, epochs=10, total_steps=10, warmup_epochs=2,
                       warmup_steps=5)  # as advised
    assert "longer than the run" not in caplog.text


def test_a_run_logs_its_plan_and_an_estimate_with_how_to_shorten_it(tmp_path, caplog,
                                                                     monkeypatch):
    """The plan, then an estimate foreseen before the first step runs, then a measured one."""
    logged_before_first_step = []
    original_step = TrainStep.__call__

    def step(self, *args, **kwargs):
        if not logged_before_first_step:
            logged_before_first_step.append(caplog.text)
        return original_step(self, *args, **kwargs)

    monkeypatch.setattr(TrainStep, "__call__", step)
    with caplog.at_level(logging.INFO, logger="vitkit.train"):
        assert main(["train", "digits", "total_steps=7", "warmup_steps=1", "batch_size=16",
                     "progress=false", "--out", str(tmp_path)]) == 0
    plan = next(line for line in caplog.text.splitlines() if "plan:" in line)
    says(plan, "plan: 7 steps", "epochs of", "image size 8 px", "batch 16", "warmup 1 step")
    assert "warmup 1 steps" not in plan
    first, timed = [line for line in caplog.text.splitlines() if "estimate:" in line]
    assert "plan:" in logged_before_first_step[0] and first in logged_before_first_step[0]
    says(first, "7 steps left", "foreseen from one forward and backward pass of 16 of the 16 "
         "images", "total_steps=N")
    says(timed, "2 steps left", "measured", "total_steps=N", "epochs=N", "--time-budget SECONDS")


@pytest.mark.parametrize(("amount", "unit", "words"), [
    (1, "epoch", "1 epoch"), (1.0, "batch", "1 batch"), (3, "batch", "3 batches"),
    (10_000 / 3, "epoch", "3,333 epochs"), (0.25, "epoch", "0.25 epochs"),
    (12.34, "epoch", "12.3 epochs"), (0, "step", "0 steps"), (38_995, "step", "38,995 steps")])
def test_amounts_read_as_english(amount, unit, words):
    assert count(amount, unit) == words


def test_a_long_run_on_few_batches_is_planned_in_words():
    """A fine-tune of 10,000 steps on 3 batches an epoch: no "3.33e+03 epochs", no "1 epochs"."""
    plan = RunPlan.create(MODEL, batches_per_epoch=3, epochs=1, total_steps=10_000,
                          warmup_steps=0)
    said = plan.describe(0, 10_000, 512, 1, 0)
    says(said, "10,000 steps (3,333 epochs of 3 batches)", "no warmup")
    assert "e+" not in said
    one = RunPlan.create(MODEL, batches_per_epoch=1, epochs=1).describe(0, 1, 8, 1, 0)
    says(one, "plan: 1 step (1 epoch of 1 batch)")
