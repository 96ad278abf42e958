"""Training end to end: accuracy on real data, exact resume, DDP equivalence, budgets,
signals and the errors a user meets first."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from vitkit.catalog import read_weights
from vitkit.cli import main
from vitkit.data.dataset import DataError, ImageDataset
from vitkit.errors import CheckpointError, ConfigError
from vitkit.train import loop
from vitkit.train.checkpoint import load_state as load_checkpoint
from vitkit.train.config import load_train_config
from vitkit.train.loop import run_loop
from vitkit.train.setup import build_run


def says(text: str, *parts: str) -> None:
    """Assert that a message names each of `parts` (case-insensitive), showing it if not."""
    missing = [part for part in parts if part.lower() not in text.lower()]
    assert not missing, f"{missing} not in message: {text!r}"


# Every source of randomness in one run: dropout, drop path, crop, TrivialAugment, erasing,
# mixup/cutmix, EMA and gradient accumulation.
RANDOM_EVERYTHING = ["progress=false", "model.dropout=0.1", "model.drop_path=0.1",
                     "augment.crop_padding=1", "augment.trivial_augment=true",
                     "augment.random_erasing=0.25", "augment.mixup_alpha=0.8",
                     "augment.cutmix_alpha=1.0", "augment.label_smoothing=0.1",
                     "ema_decay=0.9", "accum_steps=2"]


def _weights(path: Path, key: str = "model") -> dict[str, torch.Tensor]:
    return load_checkpoint(path)[key]


def test_digits_recipe_from_the_cli_learns_the_embedded_data(tmp_path, capsys):
    assert main(["train", "digits", "progress=false", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    history = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert history[-1]["top1"] >= 0.95, history[-1]
    assert "test top-1" in out
    for name in ("last.pt", "best.pt", "metrics.csv", "learning_curve.png"):
        assert (tmp_path / name).stat().st_size > 0


def test_resume_continues_exactly(tmp_path):
    straight = load_train_config("digits", [*RANDOM_EVERYTHING, "epochs=2",
                                            f"out_dir={tmp_path / 'a'}"])
    run_loop(build_run(straight))

    split = load_train_config("digits", [*RANDOM_EVERYTHING, "epochs=2",
                                         f"out_dir={tmp_path / 'b'}"])
    first = build_run(split)
    halfway = first.position.total_steps // 2 + 3  # mid-epoch, mid-schedule
    step = first.step

    def stop_halfway(images, labels, lr, position):
        if first.position.step == halfway - 1:
            first.stop.reason = "SIGTERM"
        return step(images, labels, lr, position)

    first.step = stop_halfway
    run_loop(first)
    assert load_checkpoint(tmp_path / "b" / "last.pt")["position"]["step"] == halfway
    run_loop(build_run(split, resume=tmp_path / "b" / "last.pt"))

    for key in ("model", "ema"):
        a, b = _weights(tmp_path / "a" / "last.pt", key), _weights(tmp_path / "b" / "last.pt", key)
        assert a.keys() == b.keys()
        for name in a:
            assert torch.equal(a[name], b[name]), f"{key}.{name} differs after resume"
    # the resumed epoch's train_loss is the whole epoch's, not only the resumed part's
    rows = {run: [json.loads(line) for line in (tmp_path / run / "metrics.jsonl").read_text()
                  .splitlines()] for run in ("a", "b")}
    assert [row["epoch"] for row in rows["b"]] == [row["epoch"] for row in rows["a"]]
    assert [row["train_loss"] for row in rows["b"]] == \
        pytest.approx([row["train_loss"] for row in rows["a"]], rel=1e-6)


def _as_version_1(state: dict) -> dict:
    """The layout vitkit wrote before format 2: no "weights", preprocess as img_size/mean/std."""
    old = {key: value for key, value in state.items() if key != "weights"}
    pre = state["preprocess"]
    old.update(format="vitkit-train-1",
               preprocess={"img_size": pre["img_size"], "mean": pre["mean"], "std": pre["std"]})
    return old


def test_version_1_checkpoints_still_read_and_resume_exactly(tmp_path):
    overrides = [*RANDOM_EVERYTHING, "total_steps=12"]
    run_loop(build_run(load_train_config("digits", [*overrides, f"out_dir={tmp_path / 'a'}"])))
    split = load_train_config("digits", [*overrides, f"out_dir={tmp_path / 'b'}"])
    first = build_run(split)
    step = first.step

    def stop_halfway(images, labels, lr, position):
        if first.position.step == 5:
            first.stop.reason = "SIGTERM"
        return step(images, labels, lr, position)

    first.step = stop_halfway
    run_loop(first)
    old = tmp_path / "b" / "v1.pt"
    torch.save(_as_version_1(load_checkpoint(tmp_path / "b" / "last.pt")), old)
    record = read_weights(old)
    assert (record.origin, record.weights, record.preprocess.mean) == ("vitkit-train", "raw",
                                                                       (0.5,))
    run_loop(build_run(split, resume=old))
    for key in ("model", "ema"):
        a, b = _weights(tmp_path / "a" / "last.pt", key), _weights(tmp_path / "b" / "last.pt", key)
        assert all(torch.equal(a[name], b[name]) for name in a), key


def test_resume_with_more_epochs_extends_a_finished_run(tmp_path, caplog):
    constant = [*RANDOM_EVERYTHING, "schedule=constant", "warmup_epochs=0"]
    straight = load_train_config("digits", [*constant, "epochs=3", f"out_dir={tmp_path / 'a'}"])
    run_loop(build_run(straight))
    short = load_train_config("digits", [*constant, "epochs=2", f"out_dir={tmp_path / 'b'}"])
    run_loop(build_run(short))
    last = tmp_path / "b" / "last.pt"

    again = build_run(short, resume=last)  # the same command: nothing left to do
    assert again.position.step == again.position.total_steps == 2 * 22
    longer = load_train_config("digits", [*constant, "epochs=3", f"out_dir={tmp_path / 'b'}"])
    with caplog.at_level("WARNING"):
        extended = build_run(longer, resume=last)
    assert "re-planned from 44 to 66 steps" in caplog.text
    run_loop(extended)
    assert len(load_checkpoint(last)["history"]) == 3
    # With a constant rate the extended run is the 3-epoch run, exactly.
    a, b = _weights(tmp_path / "a" / "last.pt", "model"), _weights(last, "model")
    assert all(torch.equal(a[name], b[name]) for name in a)


@pytest.mark.slow
def test_two_processes_under_torchrun_equal_one_process(tmp_path):
    overrides = ["epochs=1", "warmup_epochs=0.5", "progress=false", "threads=1",
                 "augment.crop_padding=1", "augment.trivial_augment=true",
                 "augment.mixup_alpha=0.8"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    ran = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                          "--nproc-per-node", "2", "-m", "vitkit.cli", "train", "digits",
                          *overrides, "--out", str(tmp_path / "ddp")],
                         env=env, capture_output=True, text=True)
    assert ran.returncode == 0, f"torchrun exited {ran.returncode}:\n{ran.stderr[-4000:]}"
    # rank 0 speaks for both processes: each note once (the precision chosen, the plan)
    notes = [line for line in ran.stderr.splitlines() if line.startswith(("precision ", "plan:"))]
    assert len(notes) == 2 and notes[0] != notes[1], ran.stderr[-4000:]
    assert main(["train", "digits", *overrides, "--out", str(tmp_path / "single")]) == 0
    ddp, single = _weights(tmp_path / "ddp" / "last.pt"), _weights(tmp_path / "single" / "last.pt")
    worst = max((ddp[k] - single[k]).abs().max().item() for k in single)
    assert worst <= 1e-4  # same global batches; only the all-reduce summation order differs
    # every rank's images in the train loss, not rank 0's alone
    losses = [[json.loads(line)["train_loss"] for line in (tmp_path / run / "metrics.jsonl")
               .read_text().splitlines()] for run in ("ddp", "single")]
    assert losses[0] == pytest.approx(losses[1], rel=1e-4)
    assert load_checkpoint(tmp_path / "ddp" / "last.pt")["position"]["step"] == 22


@pytest.mark.slow
def test_an_odd_global_batch_under_torchrun_equals_one_process(tmp_path):
    """33 images on 2 ranks are 16 and 17: each rank's loss sum is divided by the global
    batch, so the ranks train as one process does; a global batch smaller than the ranks is
    refused, naming the batch size that works."""
    overrides = ["total_steps=8", "warmup_steps=2", "batch_size=33", "test_limit=40",
                 "progress=false", "threads=1"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node", "2", "-m", "vitkit.cli", "train", "digits"]
    ran = subprocess.run([*command, *overrides, "--out", str(tmp_path / "ddp")], env=env,
                         capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, f"torchrun exited {ran.returncode}:\n{ran.stderr[-4000:]}"
    assert main(["train", "digits", *overrides, "--out", str(tmp_path / "single")]) == 0
    ddp, single = _weights(tmp_path / "ddp" / "last.pt"), _weights(tmp_path / "single" / "last.pt")
    assert max((ddp[k] - single[k]).abs().max().item() for k in single) <= 1e-4
    # every image counted once over the ranks (each counted the global batch: 2 x 264), and
    # the train loss is the global batch's mean
    positions = [load_checkpoint(tmp_path / run / "last.pt")["position"] for run in
                 ("ddp", "single")]
    assert positions[0]["epoch_images"] == positions[1]["epoch_images"] == 8 * 33
    losses = [json.loads((tmp_path / run / "metrics.jsonl").read_text().splitlines()[-1])
              ["train_loss"] for run in ("ddp", "single")]
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)
    ran = subprocess.run([*command, "total_steps=2", "batch_size=1", "progress=false",
                          "threads=1", "--out", str(tmp_path / "one")], env=env,
                         capture_output=True, text=True, timeout=300)
    assert ran.returncode != 0
    says(ran.stderr, "batch_size=1", "global batch", "2 processes", "batch_size=2 or more")


def run_job(command: list[str], env: dict[str, str], timeout: float = 150
            ) -> subprocess.CompletedProcess:
    """A torchrun job: one that hangs fails the test, and every process of it is killed
    (a plain timeout kills torchrun alone and leaves its workers running)."""
    job = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
    try:
        out, err = job.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        for pid in [*_descendants(job.pid), job.pid]:  # torchrun's workers have sessions
            with contextlib.suppress(ProcessLookupError):  # of their own
                os.kill(pid, signal.SIGKILL)
        job.communicate()
        pytest.fail(f"the torchrun job still ran after {timeout} s: it hung")
    return subprocess.CompletedProcess(command, job.returncode, out, err)


def _descendants(pid: int) -> list[int]:
    listed = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True,
                            text=True).stdout.split()
    children = [int(child) for child in listed]
    return children + [grandchild for child in children for grandchild in _descendants(child)]


FAILING_RANK_DRIVER = """
import os, sys
from vitkit.cli import main
from vitkit.train.setup import Run
saved = Run.save
def save(self, name):
    if os.environ["RANK"] == "0" and name.removesuffix(".pt") == "last":
        raise OSError("the disk is full (a test)")
    return saved(self, name)
Run.save = save
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_a_failure_on_one_rank_ends_the_job_instead_of_hanging(tmp_path):
    """A failure on rank 0 alone (its checkpoint write: a full disk) ends the whole job: the
    failing rank leaves at once, rank 1's next collective fails, and it says that another
    process ended (no rank waits for gloo's timeout)."""
    driver = tmp_path / "driver.py"
    driver.write_text(FAILING_RANK_DRIVER)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    ran = run_job([sys.executable, "-m", "torch.distributed.run", "--standalone",
                   "--nproc-per-node", "2", str(driver), "train", "digits", "epochs=3",
                   "test_limit=40", "progress=false", "threads=1",
                   "--out", str(tmp_path / "run")], env)
    assert ran.returncode != 0 and "the disk is full (a test)" in ran.stderr
    assert "another process of this torchrun job ended" in ran.stderr


SIGNALLED_RANK_DRIVER = """
import os, signal, sys
from vitkit.cli import main
from vitkit.train.setup import Run
from vitkit.train.step import TrainStep
WHEN = sys.argv.pop(1)
def signal_rank_1():
    if os.environ["RANK"] == "1":
        os.kill(os.getpid(), signal.SIGTERM)
saved, step = Run.save, TrainStep.__call__
def save(self, name):
    if WHEN == "save" and name.removesuffix(".pt") == "last":
        signal_rank_1()
    return saved(self, name)
def call(self, images, labels, lr, position):
    if WHEN == "step" and position.step == 5:
        signal_rank_1()
    return step(self, images, labels, lr, position)
Run.save, TrainStep.__call__ = save, call
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
@pytest.mark.parametrize("when", ["step", "save"])
def test_a_signal_to_one_rank_stops_every_rank(tmp_path, when):
    """SIGTERM to rank 1 alone, mid-epoch or during rank 0's epoch-end save: the ranks decide
    together, so both stop (the signalled one with 143) and last.pt resumes."""
    driver = tmp_path / "driver.py"
    driver.write_text(SIGNALLED_RANK_DRIVER)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    ran = run_job([sys.executable, "-m", "torch.distributed.run", "--standalone",
                   "--nproc-per-node", "2", str(driver), when, "train", "digits",
                   "epochs=3", "test_limit=40", "progress=false", "threads=1",
                   "--out", str(tmp_path / "run")], env)
    assert "exitcode  : 143" in ran.stderr, ran.stderr[-3000:]  # rank 1: 128 + SIGTERM
    position = load_checkpoint(tmp_path / "run" / "last.pt")["position"]
    assert 0 < position["step"] < 3 * 22


def _noisy_folder(root: Path) -> Path:
    """Three classes of 12 varied-size noisy PNGs (a class tint in the middle) in train/val."""
    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        for k in range(3):
            (root / split / f"c{k}").mkdir(parents=True)
            for i in range(12):
                h, w = (int(v) for v in rng.integers(16, 40, 2))
                pixels = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
                pixels[h // 4:3 * h // 4, w // 4:3 * w // 4, k] = 255
                Image.fromarray(pixels).save(root / split / f"c{k}" / f"{i}.png")
    return root


@pytest.mark.slow
def test_two_processes_on_streamed_data_equal_one_process(tmp_path):
    # Each rank streams its share of a global batch; the ranks augment the gathered global
    # batch (one flip mask, one mixup pairing), so they train as one process does.
    data = _noisy_folder(tmp_path / "data")
    overrides = ["data=folder", f"data_dir={data}", "data_mode=stream", "workers=1",
                 'model={"variant": "Ti/4", "img_size": 16, "depth": 2, "width": 32, '
                 '"num_heads": 2, "mlp_dim": 64}', "epochs=1", "batch_size=12",
                 "warmup_epochs=0", "threads=1", "progress=false", "augment.flip=true",
                 "augment.crop_padding=2", "augment.mixup_alpha=0.8"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    ran = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                          "--nproc-per-node", "2", "-m", "vitkit.cli", "train", *overrides,
                          "--out", str(tmp_path / "ddp")],
                         env=env, capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, f"torchrun exited {ran.returncode}:\n{ran.stderr[-4000:]}"
    assert main(["train", *overrides, "--out", str(tmp_path / "single")]) == 0
    ddp, single = _weights(tmp_path / "ddp" / "last.pt"), _weights(tmp_path / "single" / "last.pt")
    assert max((ddp[k] - single[k]).abs().max().item() for k in single) <= 1e-4


@pytest.mark.slow
def test_a_time_budget_under_torchrun_fits_one_schedule_for_every_rank(tmp_path):
    # Each rank times its own clock; were each to re-fit its own run length, they would stop
    # at different steps and the gloo collectives would mismatch (a crash).
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    ran = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                          "--nproc-per-node", "2", "-m", "vitkit.cli", "train", "digits",
                          "epochs=20", "progress=false", "threads=1", "--time-budget", "6",
                          "--out", str(tmp_path)],
                         env=env, capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, f"torchrun exited {ran.returncode}:\n{ran.stderr[-4000:]}"
    assert "done:" in ran.stdout
    state = load_checkpoint(tmp_path / "last.pt")
    position = state["position"]
    assert position["total_steps"] < 20 * 22  # fitted to the budget
    assert position["step"] == state["history"][-1]["step"] <= position["total_steps"]


def test_time_budget_sizes_the_schedule_and_stops_cleanly(tmp_path):
    cfg = load_train_config("digits", ["epochs=1000", "progress=false", "time_budget=6",
                                       f"out_dir={tmp_path}"])
    result = run_loop(build_run(cfg))
    # The trainer's own clock (start-up excluded), so a busy machine cannot fail this.
    assert load_checkpoint(tmp_path / "last.pt")["position"]["elapsed"] < 2 * 6
    planned_without_budget = 1000 * 22
    assert result.position.total_steps < planned_without_budget / 10
    # Evaluated at its last step, whatever that was: how far 6 s of training gets (and so the
    # accuracy) depends on how busy the machine is; learning is tested by the runs above.
    assert result.final["step"] == result.position.step >= 1
    assert 0.0 <= result.final["top1"] <= 1.0 and result.final["test_loss"] > 0.0
    history = load_checkpoint(tmp_path / "last.pt")["history"]
    assert history[-1]["step"] == result.position.step
    assert (tmp_path / "last.pt").exists()


@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_saves_a_checkpoint_that_resumes_and_exits_128_plus_it(tmp_path, signum, code):
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "vitkit.cli", "train", "digits", "epochs=500",
                             "progress=false", "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics, deadline = out / "metrics.jsonl", time.time() + 60
    while not (metrics.exists() and metrics.read_text()) and time.time() < deadline:
        time.sleep(0.2)  # wait until it trains: an epoch has been logged
    time.sleep(0.5)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=60)
    name = signal.Signals(signum).name
    assert proc.returncode == code, err  # 128 + the signal: a stopped run is not a finished one
    assert f"{name}: saved" in err and "--resume" in err and "Traceback" not in err
    state = load_checkpoint(out / "last.pt")
    assert 0 < state["position"]["step"] < 500 * 22
    resumed = build_run(load_train_config("digits", ["epochs=500", "progress=false",
                                                   f"out_dir={out}"]), resume=out / "last.pt")
    assert resumed.position.step == state["position"]["step"]


def test_a_signal_stops_an_evaluation_midway(tmp_path, monkeypatch):
    """SIGINT does not wait for the evaluation to end: it stops at the next test batch."""
    import vitkit.evaluation.loop as metrics

    original = metrics.eval_batches

    def signal_after_first_batch(*args, **kwargs):
        for i, batch in enumerate(original(*args, **kwargs)):
            if i == 1:
                os.kill(os.getpid(), signal.SIGINT)
            yield batch

    monkeypatch.setattr(metrics, "eval_batches", signal_after_first_batch)
    cfg = load_train_config("digits", ["epochs=50", "progress=false", "eval_batch_size=50",
                                       f"out_dir={tmp_path}"])
    before = signal.getsignal(signal.SIGINT)  # SIG_IGN when pytest runs as a background job
    result = run_loop(build_run(cfg))
    assert (result.stopped_early, result.signal_number) == ("SIGINT", signal.SIGINT.value)
    assert (tmp_path / "metrics.jsonl").read_text() == ""  # the cut evaluation logged no row
    assert load_checkpoint(tmp_path / "last.pt")["position"]["step"] == 22
    assert signal.getsignal(signal.SIGINT) is before  # the handler is restored


def test_a_signal_during_evaluation_still_saves_and_reports(tmp_path, monkeypatch, caplog):
    """A SIGTERM that lands during an evaluation, after the in-loop check, still saves
    last.pt and says so."""
    original = loop.evaluate_and_log

    def evaluate_then_signal(*args, **kwargs):
        result = original(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGTERM)
        return result

    monkeypatch.setattr(loop, "evaluate_and_log", evaluate_then_signal)
    cfg = load_train_config("digits", ["epochs=50", "progress=false", f"out_dir={tmp_path}"])
    with caplog.at_level("WARNING"):
        result = run_loop(build_run(cfg))
    assert result.stopped_early == "SIGTERM"
    assert "SIGTERM: saved" in caplog.text
    state = load_checkpoint(tmp_path / "last.pt")
    assert state["position"]["step"] == result.position.step == 22  # one epoch, then stopped
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # handler restored


def test_cifar10_subset_trains_above_chance(tmp_path, cifar10_dir):
    overrides = ["model=cifar10-tutorial", "data=cifar10", f"data_dir={cifar10_dir}",
                 "train_limit=4000", "test_limit=1000", "epochs=2", "batch_size=128",
                 "lr=0.002", "progress=false", "augment.crop_padding=4"]
    assert main(["train", "digits", *overrides, "--out", str(tmp_path)]) == 0
    history = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert history[-1]["top1"] > 0.2  # chance is 0.1
    assert main(["eval", str(tmp_path / "last.pt"), "--data-dir", str(cifar10_dir),
                 "--limit", "500", "--out", str(tmp_path / "eval")]) == 0
    report = json.loads((tmp_path / "eval" / "eval.json").read_text())
    assert report["images"] == 500 and set(report["per_class_accuracy"]) >= {"cat", "truck"}
    assert (tmp_path / "eval" / "confusion_matrix.png").stat().st_size > 5000


# -- errors -------------------------------------------------------------------------------------
def _tiny_data(labels: list[int], size: int = 8) -> ImageDataset:
    images = torch.randint(0, 255, (len(labels), 1, size, size), dtype=torch.uint8)
    return ImageDataset(images, torch.tensor(labels), [str(i) for i in range(10)])


def test_labels_outside_the_head_are_refused():
    cfg = load_train_config("digits", ["progress=false"])
    with pytest.raises(DataError) as caught:
        build_run(cfg, train_data=_tiny_data([0, 12]), test_data=_tiny_data([0, 1]))
    says(str(caught.value), "labels", "0 to 12", "model.num_classes=13")
    # the advice followed (on a batch the two images fill)
    cfg = load_train_config("digits", ["progress=false", "batch_size=2", "model.num_classes=13"])
    assert build_run(cfg, train_data=_tiny_data([0, 12]),
                     test_data=_tiny_data([0, 1])).model.config.num_classes == 13


def test_images_of_another_size_than_the_model_are_refused():
    cfg = load_train_config("digits", ["progress=false"])
    with pytest.raises(DataError) as caught:
        build_run(cfg, train_data=_tiny_data([0, 1], 16), test_data=_tiny_data([0, 1], 16))
    says(str(caught.value), "16x16", "model.img_size=16", "resize the data")
    # the advice followed (on a batch the two images fill)
    cfg = load_train_config("digits", ["progress=false", "batch_size=2", "model.img_size=16"])
    assert build_run(cfg, train_data=_tiny_data([0, 1], 16),
                     test_data=_tiny_data([0, 1], 16)).model.config.img_size == (16, 16)


def test_resume_from_another_model_config_is_refused(tmp_path):
    assert main(["train", "digits", "epochs=1", "warmup_epochs=0.5", "progress=false",
                 "--out", str(tmp_path)]) == 0
    cfg = load_train_config("digits", ["model.depth=2", "progress=false"])
    with pytest.raises(CheckpointError) as caught:
        build_run(cfg, resume=tmp_path / "last.pt")
    says(str(caught.value), "another model config", "depth", "checkpoint 4")


def test_unknown_recipe_keys_and_missing_data_have_clear_errors(tmp_path, capsys):
    with pytest.raises(ConfigError, match="Did you mean 'epochs'"):
        load_train_config("digits", ["epochz=3"])
    with pytest.raises(ConfigError) as caught:
        load_train_config("digits", ["augment.flipp=true"])
    says(str(caught.value), "augment key", "flipp", "'flip'")
    # the suggestions followed
    assert load_train_config("digits", ["epochs=3", "augment.flip=true"]).epochs == 3
    code = main(["train", "digits", "data=cifar10", "--data-dir", str(tmp_path / "nowhere")])
    err = capsys.readouterr().err
    assert code == 2 and "nowhere" in err and "Traceback" not in err


def test_progressive_resizing_trains_and_resumes_exactly(tmp_path):
    schedule = ["resolution_schedule=[[0, 4], [0.5, 8]]", "epochs=2", "progress=false",
                "ema_decay=0.9", "augment.mixup_alpha=0.8"]
    straight = build_run(load_train_config("digits", [*schedule, f"out_dir={tmp_path / 'a'}"]))
    result = run_loop(straight)
    assert [row["resolution"] for row in result.position.history] == [4, 8]
    assert straight.model.config.img_size == (8, 8)

    split_cfg = load_train_config("digits", [*schedule, f"out_dir={tmp_path / 'b'}"])
    first = build_run(split_cfg)
    step = first.step

    def stop_early(images, labels, lr, position):
        if first.position.step == 8:  # still at 4x4: the checkpoint holds a 2x2 grid
            first.stop.reason = "SIGTERM"
        return step(images, labels, lr, position)

    first.step = stop_early
    run_loop(first)
    assert load_checkpoint(tmp_path / "b" / "last.pt")["model"]["pos_embed"].shape[1] == 1 + 4
    run_loop(build_run(split_cfg, resume=tmp_path / "b" / "last.pt"))
    a, b = _weights(tmp_path / "a" / "last.pt"), _weights(tmp_path / "b" / "last.pt")
    for name in a:
        assert torch.equal(a[name], b[name]), name


def test_a_crash_while_the_metrics_are_rewritten_leaves_the_previous_files(tmp_path,
                                                                           monkeypatch):
    """metrics.csv (rewritten whole at every evaluation) and metrics.jsonl (rewritten on
    resume) are replaced atomically: a failure mid-write keeps the last complete file."""
    import csv

    from vitkit.train.recorder import MetricsRecorder

    rows = [{"epoch": 1.0, "step": 10, "top1": 0.5}, {"epoch": 2.0, "step": 20, "top1": 0.6}]
    MetricsRecorder(tmp_path, ["csv", "jsonl"], history=rows)
    recorder = MetricsRecorder(tmp_path, ["csv"], history=rows)
    before = {name: (tmp_path / name).read_bytes() for name in ("metrics.csv", "metrics.jsonl")}
    assert before["metrics.csv"].decode().splitlines()[0] == "epoch,step,top1"

    def crash(self, rows):
        raise OSError("disk full")
    monkeypatch.setattr(csv.DictWriter, "writerows", crash)
    with pytest.raises(OSError, match="disk full"):
        recorder.write({"epoch": 3.0, "step": 30, "top1": 0.7},
                       [*rows, {"epoch": 3.0, "step": 30, "top1": 0.7}])
    assert (tmp_path / "metrics.csv").read_bytes() == before["metrics.csv"]
    monkeypatch.setattr("vitkit.train.recorder.json.dumps", lambda row: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        MetricsRecorder(tmp_path, ["jsonl"], history=rows[:1])
    assert (tmp_path / "metrics.jsonl").read_bytes() == before["metrics.jsonl"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.csv", "metrics.jsonl"]


def test_an_evaluation_that_spends_the_budget_ends_the_run_there(tmp_path, monkeypatch):
    """A budget that runs out during an epoch-end evaluation ends the run at the evaluated
    step, not one step later with a second evaluation (which can take as long again)."""
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
