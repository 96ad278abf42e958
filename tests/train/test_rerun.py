"""Nothing is lost by re-running: `vitkit train --out X` over a run refuses and says how to
continue (--resume), start over (--overwrite) or keep it (another --out); --resume without a
recipe continues with the checkpoint's own recipe; --overwrite deletes the earlier run's eval
reports with its files, and a folder with no checkpoint is not offered for resuming."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from PIL import Image

from vitkit.cli import main
from vitkit.train.checkpoint import load_state as load_checkpoint
from vitkit.train.rundir import prepare_run_dir


def says(text: str, *parts: str) -> None:
    """Assert that a message names each of `parts` (case-insensitive), showing it if not."""
    missing = [part for part in parts if part.lower() not in text.lower()]
    assert not missing, f"{missing} not in message: {text!r}"


# Not the digits recipe's settings, so that a resume that fell back to it would be refused.
FIRST_RUN = ["digits", "total_steps=2", "model.depth=2", "lr=0.002", "progress=false"]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("run") / "first"
    assert main(["train", *FIRST_RUN, "--out", str(out)]) == 0
    return out


@pytest.fixture
def run(finished_run, tmp_path) -> Path:
    """A fresh copy of the finished run for each test."""
    return Path(shutil.copytree(finished_run, tmp_path / "run"))


def _rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _csv_rows(out: Path) -> int:
    return len((out / "metrics.csv").read_text().splitlines()) - 1  # minus the header


def test_a_second_run_into_the_same_folder_is_refused_and_nothing_changes(run, capsys):
    before = {name: (run / name).read_bytes() for name in ("last.pt", "metrics.jsonl",
                                                           "metrics.csv")}
    assert main(["train", *FIRST_RUN, "--out", str(run)]) == 2
    err = capsys.readouterr().err
    says(err, str(run), "already holds a run", "last.pt", "best.pt", "metrics.jsonl")
    for advice in (f"--resume {run / 'last.pt'}", "--overwrite", "another --out"):
        assert advice in err
    assert "Traceback" not in err
    assert all((run / name).read_bytes() == data for name, data in before.items())


def test_following_resume_continues_the_run(run):
    assert main(["train", *FIRST_RUN, "total_steps=4", "--out", str(run),
                 "--resume", str(run / "last.pt")]) == 0
    state = load_checkpoint(run / "last.pt")
    assert state["position"]["step"] == 4
    rows = _rows(run)
    assert [row["step"] for row in rows] == [2, 4]  # the first run's row kept, one added
    assert _csv_rows(run) == len(rows) == len(state["history"])


def test_following_overwrite_starts_over_and_clears_the_old_files(run):
    old = load_checkpoint(run / "last.pt")["model"]
    assert main(["train", *FIRST_RUN, "total_steps=1", "seed=1", "--out", str(run),
                 "--overwrite"]) == 0
    rows = _rows(run)
    assert [row["step"] for row in rows] == [1]  # only the new run's metrics
    assert _csv_rows(run) == 1
    new = load_checkpoint(run / "last.pt")
    assert new["position"]["step"] == 1
    assert not torch.equal(new["model"]["head.weight"], old["head.weight"])


def test_following_another_out_keeps_both(run, tmp_path):
    other = tmp_path / "second"
    assert main(["train", *FIRST_RUN, "--out", str(other)]) == 0
    assert len(_rows(run)) == 1 and len(_rows(other)) == 1


def test_overwrite_and_resume_of_the_same_run_contradict(run):
    from vitkit import ConfigError

    with pytest.raises(ConfigError, match="--overwrite would delete"):
        prepare_run_dir(run, resume=run / "last.pt", overwrite=True)
    assert (run / "last.pt").exists()
    prepare_run_dir(run, resume=run / "last.pt")  # continuing is fine


def test_resume_without_a_recipe_uses_the_checkpoints_recipe(run, capsys):
    # No recipe, no --out: the checkpoint's recipe (depth 2, lr 0.002), in its folder.
    assert main(["train", "--resume", str(run / "last.pt"), "total_steps=3"]) == 0
    state = load_checkpoint(run / "last.pt")
    assert state["position"]["step"] == 3
    assert state["train_config"]["lr"] == 0.002 and state["train_config"]["total_steps"] == 3
    assert state["model_config"]["depth"] == 2
    assert [row["step"] for row in _rows(run)] == [2, 3]
    # The digits recipe itself has depth 4: naming it is still refused with the difference.
    assert main(["train", "digits", "--resume", str(run / "last.pt"), "progress=false"]) == 2
    says(capsys.readouterr().err, "depth", "checkpoint 2", "config 4")


@pytest.mark.parametrize("recipe", [[], ["digits"]])
def test_resume_from_a_file_that_is_not_a_checkpoint_says_so(recipe, run, tmp_path, capsys):
    png = tmp_path / "cat.png"
    png.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(100))
    assert main(["train", *recipe, "--resume", str(png), "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    says(err, str(png), "not a vitkit training checkpoint")
    assert "weights_only=False" not in err and "Traceback" not in err
    # A PyTorch file that is a plain state dict, not a training checkpoint:
    weights = tmp_path / "weights.pt"
    torch.save({"w": torch.zeros(2)}, weights)
    assert main(["train", "--resume", str(weights), "--out", str(tmp_path / "y")]) == 2
    assert "holds no training recipe" in capsys.readouterr().err
    # Following the advice (the last.pt that `vitkit train` wrote) works.
    assert main(["train", *recipe, *FIRST_RUN[1:], "total_steps=3", "--resume",
                 str(run / "last.pt")]) == 0


@pytest.mark.parametrize("how", ["resume", "overwrite"])
def test_starting_in_the_folder_removes_stale_temporary_checkpoints(run, how, caplog):
    """A kill -9 during `save_atomic` leaves `.last.pt.XXXX.tmp`; the next start clears it."""
    stale = [run / ".last.pt.abc123.tmp", run / ".best.pt.x_9.tmp"]
    for path in stale:
        path.write_bytes(b"half a checkpoint")
    unrelated = run / ".notes.tmp"
    unrelated.write_text("not ours")
    flags = ["--resume", str(run / "last.pt")] if how == "resume" else ["--overwrite"]
    with caplog.at_level("INFO"):
        assert main(["train", *FIRST_RUN, "total_steps=4", "--out", str(run), *flags]) == 0
    says(caplog.text, "removed 2", "stale temporary checkpoint")
    assert not any(path.exists() for path in stale) and unrelated.exists()
    assert load_checkpoint(run / "last.pt")["position"]["step"] == 4


def test_a_resume_logs_each_evaluation_once(run):
    """A run killed after logging a row but before saving its checkpoint re-runs that part
    when resumed; the log keeps the row once (it is rebuilt from the checkpoint's history)."""
    saved = _rows(run)
    with open(run / "metrics.jsonl", "a") as stream:  # logged, then killed before the save
        stream.write(json.dumps({**saved[-1], "step": 4, "epoch": 0.18}) + "\n")
    assert main(["train", *FIRST_RUN, "total_steps=6", "--out", str(run),
                 "--resume", str(run / "last.pt")]) == 0
    rows = _rows(run)
    steps = [row["step"] for row in rows]
    assert steps == [2, 6] and len(set(steps)) == len(steps)
    history = load_checkpoint(run / "last.pt")["history"]
    assert rows == history and _csv_rows(run) == len(history)


def test_a_resume_from_best_pt_continues_after_its_evaluation(tmp_path):
    """best.pt is saved by an evaluation at an epoch's end; resumed from it, the run goes on
    with the next epoch and does not run or log that evaluation a second time."""
    out = tmp_path / "run"
    args = ["digits", "epochs=1", "train_limit=128", "batch_size=64", "model.depth=2",
            "warmup_epochs=0", "progress=false"]
    assert main(["train", *args, "--out", str(out)]) == 0
    assert load_checkpoint(out / "best.pt")["position"]["epoch"] == 1  # past its evaluation
    assert main(["train", "epochs=2", "--resume", str(out / "best.pt")]) == 0
    rows = _rows(out)
    assert [row["epoch"] for row in rows] == [1.0, 2.0] and [row["step"] for row in rows] == [2, 4]
    assert all(row["train_loss"] > 0 and row["images_per_s"] > 0 for row in rows)
    assert _csv_rows(out) == 2


TINY = ['model={"img_size": 16, "patch_size": 8, "width": 16, "depth": 1, "num_heads": 2, '
        '"mlp_dim": 32}', "epochs=1", "batch_size=4", "warmup_epochs=0", "progress=false"]


def _folder(root: Path, classes: list[str]) -> Path:
    for split in ("train", "val"):
        for k, name in enumerate(classes):
            (root / split / name).mkdir(parents=True, exist_ok=True)
            for i in range(4):
                Image.new("RGB", (16, 16), (60 * k + i, 20, 90)).save(
                    root / split / name / f"{i}.png")
    return root


def test_overwrite_deletes_the_earlier_runs_eval_reports(tmp_path):
    data = _folder(tmp_path / "data", ["cat", "dog"])
    run = tmp_path / "run"
    assert main(["train", "data=folder", f"data_dir={data}", *TINY, "--out", str(run)]) == 0
    assert main(["eval", str(run)]) == 0
    assert main(["eval", str(run), "--limit", "3"]) == 0  # kept apart from the whole split's
    assert json.loads((run / "eval-folder-test-first3.json").read_text())["images"] == 3
    assert json.loads((run / "eval-folder-test.json").read_text())["images"] == 8
    reports = ["eval.json", "eval-folder-test.json", "eval-folder-test-first3.json",
               "confusion_matrix.png"]
    assert all((run / name).is_file() for name in reports)
    (run / "notes.txt").write_text("mine")  # not a run's file: kept
    assert main(["train", "data=folder", f"data_dir={data}", *TINY, "--out", str(run),
                 "--overwrite"]) == 0
    assert not any((run / name).exists() for name in reports)
    assert (run / "notes.txt").read_text() == "mine" and (run / "last.pt").is_file()


QUICK = ["epochs=1", "warmup_epochs=0", "train_limit=256", "test_limit=200", "progress=false"]


def test_a_run_folder_without_a_checkpoint_is_not_offered_for_resuming(tmp_path, capsys):
    out = tmp_path / "metrics_only"
    out.mkdir()
    (out / "metrics.jsonl").write_text('{"epoch": 1.0}\n')
    assert main(["train", *QUICK, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    says(err, str(out), "already holds a run", "metrics.jsonl", "no last.pt", "--overwrite")
    assert "--resume" not in err
    assert main(["train", *QUICK, "--out", str(out), "--overwrite"]) == 0
