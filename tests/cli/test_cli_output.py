"""What the verbs print and write: each log message once, no onnxruntime chatter, one
consistent line when Ctrl-C stops a run (and one line, exit 130, outside training), the EMA's
score beside the raw one with which weights are saved, one report per evaluation (not one
overwritten file), figures where the help says, --merge-tokens refused beyond what the model
can merge, top-5 only when it says something."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import vitkit.summary
from vitkit.cli import build_parser, main
from vitkit.evaluation.evaluate_weights import default_out_dir, eval_report_name
from vitkit.train.checkpoint import Position
from vitkit.train.loop import TrainResult

TINY = ["model.depth=1", "progress=false"]


def says(text, *parts):
    """Assert that the message names each part (case-insensitive), showing it otherwise."""
    missing = [part for part in parts if part.lower() not in text.lower()]
    assert not missing, f"message lacks {missing}: {text}"


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}


# -- Hugging Face's warnings once -------------------------------------------------------------
def test_hugging_face_warnings_print_once(tmp_path):
    pytest.importorskip("datasets")
    script = textwrap.dedent("""
        import logging
        import datasets, huggingface_hub  # their loggers have handlers of their own
        import vitkit.cli as cli
        import vitkit.cli.models

        def warn(args):
            logging.getLogger("huggingface_hub.file_download").warning("hub warning")
            logging.getLogger("datasets.load").warning("datasets warning")
            logging.getLogger("vitkit.weights").info("vitkit info")

        vitkit.cli.models.run = warn
        raise SystemExit(cli.main(["models"]))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=_env(), cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr
    for message in ("hub warning", "datasets warning", "vitkit info"):
        assert done.stderr.count(message) == 1, done.stderr


# -- export --int8: the report, nothing else ----------------------------------------------------
def test_int8_export_prints_only_its_report(digits_run, tmp_path):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    out = tmp_path / "digits.int8.onnx"
    done = subprocess.run([sys.executable, "-m", "vitkit", "export", str(digits_run), "--int8",
                           "--out", str(out)], capture_output=True, text=True, env=_env(),
                          cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0].startswith(f"wrote {out}")
    lines = done.stdout.splitlines()  # the file, the float graph's check, the int8 check
    assert len(lines) == 3, lines
    assert lines[1].startswith("onnxruntime check") and "fp32" in lines[1], lines
    assert lines[2].startswith("onnxruntime check") and "int8" in lines[2], lines
    assert lines[2].endswith("OK"), lines
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr  # one note, nothing else
    says(done.stderr, str(digits_run), "run folder", "best.pt")


# -- Ctrl-C: one consistent line ---------------------------------------------------------------
def test_a_stopped_run_says_stopped_at_its_step_never_done(tmp_path, capsys, monkeypatch):
    """A run stopped by SIGINT (step 30 of 44) says where it stopped, its last evaluation
    and the --resume that continues it, never "done:"; that resume finishes the run."""
    import vitkit.train.loop as loop

    observe = loop.NonFiniteGuard.observe

    def interrupt_at_step_30(self, outcome, step, *args):
        if step == 30:
            os.kill(os.getpid(), signal.SIGINT)
        return observe(self, outcome, step, *args)

    monkeypatch.setattr(loop.NonFiniteGuard, "observe", interrupt_at_step_30)
    run = tmp_path / "run"
    assert main(["train", *TINY, "epochs=2", "--out", str(run)]) == 128 + signal.SIGINT
    out = capsys.readouterr().out
    assert "done:" not in out
    says(out, "stopped by SIGINT", "step 30 of 44", "step 22", "test top-1",
         f"--resume {run / 'last.pt'}")
    monkeypatch.setattr(loop.NonFiniteGuard, "observe", observe)
    assert main(["train", "--resume", str(run / "last.pt")]) == 0  # the advice, followed
    out = capsys.readouterr().out
    assert "done: epoch 2.00, step 44, test top-1" in out and "stopped by" not in out


# -- eval: a report per data and split -------------------------------------------------------
def test_each_evaluation_keeps_its_report_and_eval_json_is_the_latest(digits_run_copy, capsys):
    for split in ("test", "train"):
        assert main(["eval", str(digits_run_copy), "--split", split]) == 0
    out = capsys.readouterr().out
    says(out, f"wrote {digits_run_copy / 'eval-digits-train.json'}", "eval.json")
    test = json.loads((digits_run_copy / "eval-digits-test.json").read_text())
    train = json.loads((digits_run_copy / "eval-digits-train.json").read_text())
    assert (test["split"], train["split"]) == ("test", "train")
    assert json.loads((digits_run_copy / "eval.json").read_text()) == train
    assert eval_report_name("hf:ylecun/mnist", "test", 8, "torch") == \
        "eval-hf_ylecun_mnist-test-int8-merge8.json"
    help_text = _help("eval")
    assert "eval-DATA-SPLIT.json" in help_text and "eval.json is the latest" in help_text


def _help(verb: str) -> str:
    parser = build_parser()
    action = next(a for a in parser._actions if a.dest == "verb")
    return " ".join(action.choices[verb].format_help().split())


# -- fewshot: the figure where its help says -------------------------------------------------
def test_fewshot_writes_its_figure_where_the_help_says(digits_run_copy, tmp_path, monkeypatch,
                                                       capsys):
    monkeypatch.chdir(tmp_path)
    assert "default: beside the first weights" in _help("fewshot")
    assert main(["fewshot", str(digits_run_copy), "--shots", "1", "--seeds", "1"]) == 0
    assert f"wrote {digits_run_copy / 'fewshot.png'}" in capsys.readouterr().out
    assert (digits_run_copy / "fewshot.png").stat().st_size > 0
    assert list(tmp_path.iterdir()) == []  # nothing in the working directory
    assert "./eval for a checkpoint name" in _help("fewshot")
    assert default_out_dir("B/16-i21k", None) == Path("eval")


# -- --merge-tokens: refused beyond what the model can merge ---------------------------------
@pytest.mark.parametrize("verb, extra", [("eval", ["--out", "out"]), ("predict", ["digit.png"]),
                                         ("benchmark", ["--iters", "1", "--warmup", "0"]),
                                         ("export", ["--out", "merged.onnx"])])
def test_merging_more_tokens_than_the_model_has_is_refused(verb, extra, digits_run, tmp_path,
                                                           capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Image.fromarray(np.zeros((8, 8), np.uint8)).save(tmp_path / "digit.png")
    code = main([verb, str(digits_run), *extra, "--merge-tokens", "20"])
    err = capsys.readouterr().err
    assert code == 2, err
    says(err, "20 tokens", "16 patch tokens", "--merge-tokens 8 or less")
    assert main([verb, str(digits_run), *extra, "--merge-tokens", "8"]) == 0


# -- top-5 only with more than 5 classes ------------------------------------------------------
def _three_class_folder(root: Path) -> Path:
    rng = np.random.default_rng(0)
    for split in ("train", "test"):
        for label, name in enumerate(("ant", "bee", "cat")):
            (root / split / name).mkdir(parents=True)
            for index in range(6):
                pixels = np.full((8, 8, 3), 100 * label, np.uint8) + \
                    rng.integers(0, 20, (8, 8, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(root / split / name / f"{index}.png")
    return root


def test_top5_is_printed_only_with_more_than_five_classes(tmp_path, capsys, caplog,
                                                          digits_run_copy):
    folder = _three_class_folder(tmp_path / "three")
    run = tmp_path / "run"
    with caplog.at_level("INFO", logger="vitkit.train"):
        assert main(["train", "data=folder", f"data_dir={folder}", "model.img_size=8",
                     "model.patch_size=2", "model.depth=1", "model.width=32",
                     "model.num_heads=2", "model.mlp_dim=64", "total_steps=3", "batch_size=6",
                     "warmup_steps=0", "progress=false", "--out", str(run)]) == 0
    out = capsys.readouterr().out
    assert "test top-1" in out and "top-5" not in out
    assert "test top-1" in caplog.text and "top-5" not in caplog.text
    assert main(["eval", str(run)]) == 0
    out = capsys.readouterr().out
    assert "top-1" in out and "top-5" not in out
    assert main(["eval", str(digits_run_copy)]) == 0  # ten classes: top-5 says something
    assert "top-5" in capsys.readouterr().out


def test_ctrl_c_outside_training_is_one_line_and_exit_130(monkeypatch, capsys):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(vitkit.summary, "summarize", interrupted)
    assert main(["summary", "Ti/16"]) == 130
    assert capsys.readouterr().err == "vitkit summary: interrupted\n"


def test_the_ema_score_is_said_beside_the_raw_one_and_which_weights_are_saved():
    row = {"epoch": 6.0, "step": 132, "top1": 0.8384, "top5": 0.99, "ema_top1": 0.8774,
           "minutes": 0.3}
    text = TrainResult(Path("runs/ema"), Position(step=132, total_steps=132), row,
                       num_classes=10).format()
    says(text, "test top-1 83.84%", "top-5 99.00%", "EMA weights 87.74%", "the ones saved")
    row["ema_top1"] = 0.80
    text = TrainResult(Path("runs/ema"), Position(step=132, total_steps=132), row,
                       num_classes=10).format()
    says(text, "EMA weights 80.00%", "raw ones are saved")

