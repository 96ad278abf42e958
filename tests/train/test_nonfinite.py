"""A diverging run: it stops (or skips steps) before a non-finite step updates the weights,
saves the last finite weights as diverged.pt (last.pt keeps the checkpoint from before the
divergence), and says what to change; a diverging resume keeps the last good last.pt, and the
advice, followed, trains."""

import re
from pathlib import Path

import pytest
import torch

from vitkit.cli import main
from vitkit.errors import ConfigError, TrainingError
from vitkit.train.checkpoint import load_state
from vitkit.train.checkpoint import load_state as load_checkpoint
from vitkit.train.config import load_train_config
from vitkit.train.loop import run_loop
from vitkit.train.setup import Run, build_run


def says(text: str, *parts: str) -> None:
    """Assert that a message names each of `parts` (case-insensitive), showing it if not."""
    missing = [part for part in parts if part.lower() not in text.lower()]
    assert not missing, f"{missing} not in message: {text!r}"


QUICK = ["progress=false", "total_steps=12", "warmup_steps=2", "model.dropout=0.1",
         "augment.crop_padding=1", "ema_decay=0.9"]


def _all_finite(path) -> bool:
    state = load_checkpoint(path)
    tensors = [*state["model"].values(), *(state["ema"] or {}).values()]
    for group in state["optimizer"]["state"].values():
        tensors += [value for value in group.values() if torch.is_tensor(value)]
    return all(torch.isfinite(t.float()).all() for t in tensors)


def _poison(trainer: Run, bad_steps: set[int]) -> None:
    """Make the loss NaN at the given steps (counted from 1), as a diverging model would."""
    model = trainer.step.train_model

    class Poisoned(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = model

        def forward(self, x):
            out = self.inner(x)
            return out * float("nan") if trainer.position.step + 1 in bad_steps else out

    trainer.step.train_model = Poisoned()


def _stop_after(trainer: Run, step: int) -> None:
    original = trainer.step

    def step_then_stop(images, labels, lr, position):
        outcome = original(images, labels, lr, position)
        if trainer.position.step + 1 == step:
            trainer.stop.reason = "SIGTERM"
        return outcome

    trainer.step = step_then_stop


def test_a_diverging_cli_run_stops_with_advice_that_works(tmp_path, capsys):
    out = tmp_path / "run"
    args = ["train", "digits", "epochs=3", "progress=false", "--out", str(out)]
    assert main([*args, "lr=100"]) == 2  # a TrainingError: no traceback
    err = capsys.readouterr().err
    assert "Traceback" not in err and "clip_grad" not in err  # clipping is on: not advised
    step = int(re.search(r"at step (\d+)", err).group(1))
    assert re.search(r"the loss was \S+", err)
    state = load_checkpoint(out / "diverged.pt")
    assert state["position"]["step"] == step  # saved at the failing step, without its update
    assert _all_finite(out / "diverged.pt")
    assert not (out / "best.pt").exists() or _all_finite(out / "best.pt")
    if not (out / "last.pt").exists():  # diverged in the first epoch: nothing saved before
        says(err, "no checkpoint", "before the divergence")

    advised = re.search(r"lr=([0-9.e+-]+)\)", err).group(1)
    assert main([*args, f"lr={advised}", "--overwrite"]) == 0
    assert _all_finite(out / "last.pt")


def test_clip_grad_and_amp_are_advised_only_when_they_would_change_something(tmp_path, capsys):
    args = ["train", "digits", "epochs=2", "lr=100", "clip_grad=0", "progress=false",
            "--out", str(tmp_path)]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "clip_grad=1.0" in err and "amp=off" not in err


def test_stop_keeps_the_weights_of_the_last_finite_step(tmp_path):
    reference = build_run(load_train_config("digits", [*QUICK, f"out_dir={tmp_path / 'ref'}"]))
    _stop_after(reference, 4)
    run_loop(reference)

    diverging = build_run(load_train_config("digits", [*QUICK, f"out_dir={tmp_path / 'div'}"]))
    _poison(diverging, {5})
    with pytest.raises(TrainingError, match="at step 5"):
        run_loop(diverging)
    a, b = load_checkpoint(tmp_path / "ref" / "last.pt"), load_checkpoint(tmp_path / "div" /
                                                                         "diverged.pt")
    for key in ("model", "ema"):
        assert all(torch.equal(a[key][name], b[key][name]) for name in a[key]), key
    assert _all_finite(tmp_path / "div" / "diverged.pt")
    assert not (tmp_path / "div" / "last.pt").exists()  # none was saved before step 5


def test_skip_drops_the_step_and_resumes_exactly(tmp_path, caplog):
    skip = [*QUICK, "nonfinite=skip"]
    straight = build_run(load_train_config("digits", [*skip, f"out_dir={tmp_path / 'a'}"]))
    _poison(straight, {3, 4})
    with caplog.at_level("WARNING"):
        run_loop(straight)
    assert "step 3 skipped" in caplog.text and "step 4 skipped" in caplog.text
    adam_steps = {int(s["step"]) for s in straight.optimizer.state_dict()["state"].values()}
    assert adam_steps == {12 - 2}  # two steps made no update; the counter still reached 12

    split_cfg = load_train_config("digits", [*skip, f"out_dir={tmp_path / 'b'}"])
    first = build_run(split_cfg)
    _poison(first, {3, 4})
    _stop_after(first, 7)
    run_loop(first)
    run_loop(build_run(split_cfg, resume=tmp_path / "b" / "last.pt"))
    a, b = load_checkpoint(tmp_path / "a" / "last.pt"), load_checkpoint(tmp_path / "b" /
                                                                       "last.pt")
    for key in ("model", "ema"):
        assert all(torch.equal(a[key][name], b[key][name]) for name in a[key]), key


def test_skip_stops_after_max_skipped_steps_in_a_row(tmp_path):
    cfg = load_train_config("digits", [*QUICK, "nonfinite=skip", "max_skipped_steps=3",
                                       f"out_dir={tmp_path}"])
    trainer = build_run(cfg)
    _poison(trainer, {2, 4, 5, 6, 7})  # 2 alone is skipped; 4, 5, 6 in a row stop the run
    with pytest.raises(TrainingError, match="3 steps in a row"):
        run_loop(trainer)
    assert load_checkpoint(tmp_path / "diverged.pt")["position"]["step"] == 6
    assert _all_finite(tmp_path / "diverged.pt")


@pytest.mark.parametrize("override, fix", [("nonfinite=ignore", "nonfinite=skip"),
                                           ("max_skipped_steps=0", "max_skipped_steps=5")])
def test_bad_nonfinite_settings_are_refused_and_the_fix_is_accepted(override, fix):
    with pytest.raises(ConfigError, match=override.split("=")[0]):
        load_train_config("digits", [override])
    assert load_train_config("digits", [fix])


def test_the_divergence_error_starts_a_line_of_its_own_after_the_progress_bar(tmp_path, capsys):
    """The progress bar is closed (its line cleared: carriage return) before the error is
    printed, so the error starts a line of its own."""
    args = ["train", "digits", "epochs=2", "train_limit=512", "lr=1e4", "progress=true"]
    assert main([*args, "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "step/s" in err or "s/step" in err  # the bar ran
    assert re.search(r"(^|\n|\r)vitkit train: error: training diverged", err)


def _weights(path: Path) -> dict[str, torch.Tensor]:
    return load_state(path)["model"]


def test_a_diverging_resume_keeps_the_last_good_checkpoint(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "digits", "epochs=1", "warmup_epochs=0.5", "batch_size=256",
                 "progress=false", "--out", str(out)]) == 0
    before = _weights(out / "last.pt")
    capsys.readouterr()
    assert main(["train", "--resume", str(out / "last.pt"), "epochs=2", "lr=1e6",
                 "nonfinite=stop"]) == 2
    err = capsys.readouterr().err
    after = _weights(out / "last.pt")
    assert all(torch.equal(before[name], after[name]) for name in before)
    assert all(torch.isfinite(tensor).all() for tensor in after.values())
    assert f"{out / 'last.pt'}" in err and "before the divergence" in err
    assert (out / "diverged.pt").is_file() and str(out / "diverged.pt") in err
    for _ in range(8):  # follow the advice (a tenth of the rate) until the run goes through
        advised = re.search(r"lr=([0-9.e+-]+)\)", err).group(1)
        resume = re.search(r"--resume (\S+) and the new setting", err).group(1)
        if main(["train", "--resume", resume, "epochs=2", f"lr={advised}"]) == 0:
            break
        err = capsys.readouterr().err
        assert all(torch.equal(before[name], tensor) for name, tensor in
                   _weights(out / "last.pt").items())  # each try starts from the good one
    else:
        pytest.fail("following the advice never trained")
    assert load_state(out / "last.pt")["position"]["step"] == 10
