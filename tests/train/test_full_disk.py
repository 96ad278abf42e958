"""A full disk during training (ENOSPC, EDQUOT) is the user's problem, not a bug: `vitkit train`
exits 2 with one line that names the file, the room left and what the file needs, says the
previous checkpoint is kept, and gives the fix; following it (free space, resume) continues
the run. The metrics files never hold an evaluation whose checkpoint failed."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

from messages import says
from vitkit.cli import main
from vitkit.train import checkpoint
from vitkit.train.checkpoint import load_state, read_checkpoint

TINY = ['model={"img_size": 8, "patch_size": 4, "in_chans": 1, "width": 16, "depth": 1, '
        '"num_heads": 2, "mlp_dim": 32}', "progress=false", "warmup_epochs=0", "batch_size=32",
        "train_limit=128", "test_limit=64", "threads=1"]  # 4 steps an epoch


def _full_disk(monkeypatch: pytest.MonkeyPatch, name: str, nth: int, how: str) -> None:
    """Make the `nth` save of the run file `name` fail as a full disk does: in the write
    (after some bytes), in the fsync (a spent quota), or in the rename."""
    real_write_atomic, real_fsync, real_replace = checkpoint.write_atomic, os.fsync, os.replace
    saves = {"count": 0}

    def write_atomic(path, write, **options):
        if Path(path).name != name:
            return real_write_atomic(path, write, **options)
        saves["count"] += 1
        failing = saves["count"] == nth

        def filling(stream):
            if failing and how == "write":
                stream.write(b"\0" * 1000)
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return write(stream)

        def fsync(fd):
            if failing and how == "fsync":
                raise OSError(errno.EDQUOT, os.strerror(errno.EDQUOT))
            return real_fsync(fd)

        def replace(source, target):
            if failing and how == "rename":
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), source, None, target)
            return real_replace(source, target)

        with monkeypatch.context() as inner:
            inner.setattr(os, "fsync", fsync)
            inner.setattr(os, "replace", replace)
            return real_write_atomic(path, filling, **options)

    monkeypatch.setattr(checkpoint, "write_atomic", write_atomic)


def _epochs(run: Path) -> list[float]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [row["epoch"] for row in rows]


def _csv_epochs(run: Path) -> list[float]:
    lines = (run / "metrics.csv").read_text().splitlines()
    column = lines[0].split(",").index("epoch")
    return [float(line.split(",")[column]) for line in lines[1:]]


@pytest.mark.parametrize("how", ["write", "fsync", "rename"])
def test_a_full_disk_at_a_save_exits_2_keeps_last_pt_and_resume_continues(
        tmp_path, capsys, monkeypatch, how):
    run = tmp_path / "run"
    with monkeypatch.context() as patch:
        _full_disk(patch, "last.pt", nth=2, how=how)
        assert main(["train", *TINY, "epochs=3", "--out", str(run)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    says(err, str(run / "last.pt"), "free there", "needs about", "the previous last.pt is kept",
         "free space", f"--resume {run / 'last.pt'}")
    says(err, "quota" if how == "fsync" else "no space left")
    assert not [p.name for p in run.iterdir() if p.name.endswith(".tmp")]  # nothing left over
    # last.pt is the first epoch's, whole; the metrics hold no row of the failed epoch
    assert read_checkpoint(run / "last.pt").position.epoch == 1
    assert _epochs(run) == [1.0] and _csv_epochs(run) == [1.0]

    # the advice: space freed (no patch), resume: the run goes on to its end
    assert main(["train", "--resume", str(run / "last.pt")]) == 0
    assert load_state(run / "last.pt")["position"]["epoch"] == 3
    assert _epochs(run) == [1.0, 2.0, 3.0] and _csv_epochs(run) == [1.0, 2.0, 3.0]


def test_a_full_disk_at_best_pt_keeps_both_checkpoints(tmp_path, capsys, monkeypatch):
    run = tmp_path / "run"
    assert main(["train", *TINY, "epochs=1", "--out", str(run)]) == 0
    before = {"best.pt": (run / "best.pt").read_bytes()}
    state = load_state(run / "last.pt")  # a best score any evaluation betters: a new best.pt
    state["position"]["best_score"] = -1.0
    checkpoint.save_atomic(state, run / "last.pt")
    before["last.pt"] = (run / "last.pt").read_bytes()
    with monkeypatch.context() as patch:
        _full_disk(patch, "best.pt", nth=1, how="write")
        assert main(["train", "epochs=2", "--resume", str(run)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    says(err, str(run / "best.pt"), "the previous best.pt is kept", "last.pt keeps the run",
         f"--resume {run / 'last.pt'}")
    assert {name: (run / name).read_bytes() for name in before} == before
    assert _epochs(run) == [1.0]
    # the other advice: continue in a run folder on a disk with room
    other = tmp_path / "other"
    assert main(["train", "epochs=2", "--resume", str(run / "last.pt"), "--out", str(other)]) == 0
    assert load_state(other / "last.pt")["position"]["epoch"] == 2 and (other / "best.pt").is_file()


def test_a_full_disk_writing_the_metrics_is_one_line_too(tmp_path, capsys, monkeypatch):
    def full(self, row, history):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr("vitkit.train.recorder.MetricsRecorder.write", full)
    run = tmp_path / "run"
    assert main(["train", *TINY, "epochs=1", "--out", str(run)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    says(err, str(run / "metrics.jsonl"), "no space left", "last.pt keeps the run",
         f"--resume {run / 'last.pt'}")
    monkeypatch.undo()
    assert main(["train", "epochs=2", "--resume", str(run)]) == 0
    assert _epochs(run) == [1.0, 2.0]
