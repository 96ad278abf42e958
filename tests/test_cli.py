"""The `vitkit` command: model listing, summaries with the exact counts, clean errors."""

import subprocess
import sys

import pytest

from vitkit.cli import main


def run(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_models_lists_variants_and_tutorials(capsys):
    code, out, _ = run(capsys, "models")
    assert code == 0
    for name in ("Ti/16", "B/16", "H/14", "einops-tutorial", "cifar10-tutorial"):
        assert name in out
    assert "86,567,656" in out and "632,045,800" in out


def test_summary_b16_prints_the_exact_total(capsys):
    code, out, _ = run(capsys, "summary", "B/16")
    assert code == 0
    assert "Total params:                      86,567,656" in out
    assert "blocks.11" in out and "(1, 197, 768)" in out


def test_summary_einops_tutorial_reconciles_with_torchsummary(capsys):
    _, out, _ = run(capsys, "summary", "einops-tutorial")
    assert "86,567,656" in out
    assert "86,415,592" in out and "torchsummary" in out
    assert "152,064" in out and "class token 768" in out and "position embeddings 151,296" in out


def test_summary_cifar10_tutorial(capsys):
    _, out, _ = run(capsys, "summary", "cifar10-tutorial", "--max-depth", "2")
    assert "Total params:                      119,098" in out
    assert "blocks.3.mlp" in out


def test_summary_overrides_and_non_square_images(capsys):
    code, out, _ = run(capsys, "summary", "S/16", "--img-size", "64x128", "--num-classes", "5",
                       "--set", "pool=mean_patches", "--set", "class_token=false")
    assert code == 0
    assert "(1, 32, 384)" in out and "(1, 5)" in out


@pytest.mark.parametrize(("argv", "message"), [
    (["summary", "B/61x"], "unknown model"),
    (["summary", "B/16", "--set", "num_heads=7"], "not divisible by num_heads"),
    (["summary", "B/16", "--img-size", "225"], "not divisible by patch size"),
    (["summary", "B/16", "--set", "poool=1"], "Did you mean 'pool'"),
])
def test_bad_input_is_one_clear_line_not_a_traceback(capsys, argv, message):
    code, _, err = run(capsys, *argv)
    assert code == 2
    assert message in err and "Traceback" not in err


def test_console_script_entry_point_runs():
    result = subprocess.run([sys.executable, "-m", "vitkit.cli", "summary", "cifar10-tutorial"],
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert "119,098" in result.stdout


def test_overrides_may_follow_flags_and_the_last_one_wins(tmp_path):
    # total_steps=3 after --out overrides the earlier total_steps=500
    assert main(["train", "digits", "total_steps=500", "--out", str(tmp_path), "progress=false",
                 "total_steps=3"]) == 0
    history = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert '"step": 3' in history[-1]


def test_stray_arguments_are_refused(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "digits", "--out", str(tmp_path), "oops"])
    assert exit_info.value.code == 2 and "unrecognized arguments: oops" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["models", "epochs=3"])  # a verb without overrides
