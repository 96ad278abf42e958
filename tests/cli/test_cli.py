"""The `vitkit` command: model listing (and the cache it reads), summaries with the exact
counts, clean errors, and options that would mean nothing refused at the flag."""

import json
import subprocess
import sys

import pytest
import torch

from vitkit.cli import build_parser, main


def says(text, *parts):
    """Assert that the message names each part (case-insensitive), showing it otherwise."""
    missing = [part for part in parts if part.lower() not in text.lower()]
    assert not missing, f"message lacks {missing}: {text}"


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


@pytest.mark.parametrize("verb", ["predict", "eval", "export", "benchmark", "serve", "probe"])
def test_an_unknown_flag_is_reported_with_the_verbs_usage(verb, capsys):
    """An unknown flag after a verb is refused with that verb's usage (which lists its
    flags), not the top-level one, naming the flag."""
    with pytest.raises(SystemExit) as exit_info:
        main([verb, "cifar10-tutorial", "x.png", "--bogus"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and f"usage: vitkit {verb} " in err
    says(err, f"vitkit {verb}: error: unrecognized arguments: --bogus is not an option of "
         f"vitkit {verb}")
    says(err, "its options are", f"vitkit {verb} --help")  # nothing is close: all are listed


# -- did-you-mean for verbs and flags ---------------------------------------------------------
def refused(capsys, *argv):
    """The stderr of a command argparse refuses, checking it exits 2."""
    with pytest.raises(SystemExit) as exit_info:
        main(list(argv))
    assert exit_info.value.code == 2
    return capsys.readouterr().err


def test_a_mistyped_verb_and_flag_are_told_the_closest_and_those_run(tmp_path, capsys):
    err = refused(capsys, "trian", "total_steps=2", "progress=false")
    says(err, "usage: vitkit ", "'trian' is not a command", "Did you mean 'train'?")
    err = refused(capsys, "train", "--ouput", str(tmp_path), "total_steps=2", "progress=false")
    says(err, "usage: vitkit train ", "--ouput is not an option of vitkit train",
         "Did you mean --out?")
    assert not (tmp_path / "last.pt").exists()  # refused before anything ran
    assert main(["train", "--out", str(tmp_path), "total_steps=2", "progress=false"]) == 0
    assert (tmp_path / "last.pt").exists()

    err = refused(capsys, "predict", str(tmp_path), "--sample", "--tpok", "3")
    says(err, "usage: vitkit predict ", "--tpok is not an option of vitkit predict",
         "Did you mean --topk?")
    err = refused(capsys, "predict", str(tmp_path), "--sample", "--limt", "3")
    says(err, "--limt is not an option of vitkit predict", "its options are", "--topk")
    assert "Did you mean" not in err  # nothing is close to --limt among predict's flags
    capsys.readouterr()
    assert main(["predict", str(tmp_path), "--sample", "--topk", "3", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out.splitlines()[-1])["topk"]) == 3


def test_a_verb_close_to_none_is_told_every_verb(capsys):
    err = refused(capsys, "fit")
    says(err, "'fit' is not a command", "the commands are", "train", "finetune", "predict",
         "eval", "vitkit --help")
    assert "Did you mean" not in err


def _long_options(verb_parser):
    return [option for action in verb_parser._actions for option in action.option_strings
            if option.startswith("--") and option != "--help"]


def _required_options(verb_parser):
    """The required --flags with a value each (argparse checks them before unknown flags)."""
    return [item for action in verb_parser._actions if action.required and action.option_strings
            for item in (action.option_strings[0], "x")]


@pytest.mark.parametrize("verb", list(build_parser()._subparsers._group_actions[0].choices))
def test_every_flag_of_every_verb_mistyped_is_told_the_flag(verb, capsys):
    """Each --flag of `verb` with its last letter dropped, or written with underscores, is
    refused naming the flag (the one closest; another only when nearly as close)."""
    verb_parser = build_parser()._subparsers._group_actions[0].choices[verb]
    options, required = _long_options(verb_parser), _required_options(verb_parser)
    for option in options:
        typos = {option[:-1], "--" + option[2:].replace("-", "_")} - set(options)
        for typo in (typo for typo in typos if len(typo) > 3):  # two letters at least
            err = refused(capsys, verb, "x", *required, typo)
            assert f"{typo} is not an option of vitkit {verb}. Did you mean " in err, err
            suggested = err.rsplit("Did you mean ", 1)[1].rstrip("?\n").split(" or ")
            assert option in suggested and len(suggested) <= 3, err


@pytest.mark.parametrize("argv, words", [
    (["train", "--ouput=runs/x"], ("--ouput is not an option", "Did you mean --out?")),
    (["train", "--overwite"], ("Did you mean --overwrite?",)),
    (["eval", "x", "--limt", "3"], ("Did you mean --limit?",)),
    (["predict", "x", "--batch_size", "2"], ("Did you mean --batch-size?",)),
    (["train", "--epochs", "3"], ("training settings are KEY=VALUE", "epochs=3"))])
def test_mistyped_flags_name_the_nearest(argv, words, capsys):
    says(refused(capsys, *argv), f"usage: vitkit {argv[0]} ", *words)


# -- summary of checkpoints and named checkpoints --------------------------------------------
def _total(out: str) -> int:
    line = next(line for line in out.splitlines() if line.startswith("Total params:"))
    return int(line.split()[2].replace(",", ""))


def test_summary_of_a_training_checkpoint(tmp_path, capsys):
    from vitkit.train.checkpoint import load_state as load_checkpoint
    from vitkit.train.config import load_train_config
    from vitkit.train.setup import build_run

    cfg = load_train_config("digits", ["model.depth=3", f"out_dir={tmp_path}", "progress=false"])
    build_run(cfg).save("best")  # a checkpoint as training writes it (no steps needed)
    code, out, err = run(capsys, "summary", str(tmp_path / "best.pt"))
    assert code == 0, err
    assert "image 8x8x1, patch 2, 17 tokens, width 64, depth 3" in out and "blocks.2" in out
    stored = load_checkpoint(tmp_path / "best.pt")["model"]
    assert _total(out) == sum(t.numel() for t in stored.values())  # every tensor is a parameter


def test_summary_of_a_named_checkpoint_needs_no_download(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("VITKIT_OFFLINE", "1")
    monkeypatch.setenv("VITKIT_CACHE", str(tmp_path))  # empty: nothing cached
    code, out, err = run(capsys, "summary", "B/16-i21k-i1k-384")
    assert code == 0, err
    # ViT-B/16 at 384 px: 577 positions instead of 197, the 1000-way head.
    assert _total(out) == 86_567_656 + (577 - 197) * 768
    code, out, err = run(capsys, "summary", "R50+B/16-i21k")
    assert code == 0, err
    assert "(1, 21843)" in out
    timm = pytest.importorskip("timm")
    import torch

    with torch.device("meta"):  # timm's R50+ViT-B/16 (no pre-logits layer) + ours (768 x 768)
        reference = timm.create_model("vit_base_r50_s16_224", num_classes=21843)
    assert _total(out) == sum(p.numel() for p in reference.parameters()) + 768 * 768 + 768
    assert list(tmp_path.iterdir()) == []  # nothing downloaded


def test_summary_of_a_binary_file_given_as_json_config(tmp_path, capsys):
    path = tmp_path / "weights.json"
    path.write_bytes(b"\x80\x02\xff\xfe binary")
    code, _, err = run(capsys, "summary", str(path))
    assert code == 2
    says(err, str(path), "JSON config", "binary")


# -- every verb: a VitkitError is one line and exit 2; anything else is a reported bug ---------
@pytest.mark.parametrize("argv", [
    ["summary", "B/16", "--set", "depth=two"],
    ["train", "digits", "epochs=-1"],
    ["finetune", "{tmp}/missing.npz"],
    ["eval", "{tmp}/not-a-checkpoint.pt"],
    ["predict", "{tmp}/not-a-checkpoint.pt", "{tmp}/not-a-checkpoint.pt"],
    ["export", "{tmp}/not-a-checkpoint.pt"],
    ["explain", "{tmp}/not-a-checkpoint.pt", "--out", "{tmp}/explain"],
])
def test_every_verb_reports_bad_input_in_one_line(argv, tmp_path, capsys):
    (tmp_path / "not-a-checkpoint.pt").write_bytes(b"GIF89a not a checkpoint")
    argv = [arg.format(tmp=tmp_path) for arg in argv]
    code, _, err = run(capsys, *argv, *(["--out", str(tmp_path / "run")]
                                        if argv[0] in ("train", "finetune") else []))
    assert code == 2, err
    assert err.startswith(f"vitkit {argv[0]}: error: ") and len(err.strip().splitlines()) == 1
    assert "Traceback" not in err and "please report" not in err


def test_an_unexpected_exception_keeps_its_traceback_and_asks_for_a_report(monkeypatch, capsys):
    import vitkit.cli.models

    def broken(args):
        raise RuntimeError("boom")

    monkeypatch.setattr(vitkit.cli.models, "run", broken)
    code, _, err = run(capsys, "models")
    assert code == 1
    assert "Traceback" in err and "RuntimeError: boom" in err
    assert err.strip().splitlines()[-1].startswith("vitkit models: this is a bug in vitkit")
    says(err, "report", "bug", "command you ran")


def test_overrides_can_come_first_without_a_recipe(tmp_path):
    assert main(["train", "total_steps=2", "progress=false", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "last.pt").exists()  # the default digits recipe


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a CUDA GPU")
@pytest.mark.parametrize("device, said", [("gpu", ("device='gpu'", "device name")),
                                          ("cuda", ("device='cuda'", "no usable CUDA GPU"))])
def test_train_on_a_device_this_machine_lacks_says_so_once(tmp_path, capsys, device, said):
    from vitkit.errors import ConfigError
    from vitkit.train.setup import pick_device

    args = ["train", "digits", "total_steps=1", "progress=false", "--out", str(tmp_path)]
    assert main([*args, f"device={device}"]) == 2
    err = capsys.readouterr().err
    assert err.count(said[0]) == 1 and "Traceback" not in err, err
    says(err, *said, "device=auto")
    with pytest.raises(ConfigError) as refused:  # the library's own door refuses it too
        pick_device(device)
    says(str(refused.value), *said, "device=auto")
    assert main([*args, "device=auto", "--overwrite"]) == 0  # the advice works


@pytest.mark.parametrize("args, words", [
    (["benchmark", "--sweep", "--variants", "Ti/16", "--memory-gb", "nan"],
     ("--memory-gb", "finite")),
    (["benchmark", "--sweep", "--variants", "Ti/16", "--memory-gb", "inf"],
     ("--memory-gb", "finite")),
    (["summary", "B/16", "--max-depth", "0"], ("--max-depth", ">= 1"))])
def test_options_that_meant_nothing_are_refused_at_the_flag(capsys, args, words):
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code == 2
    says(capsys.readouterr().err, *words)
    if args[0] == "summary":  # the bound it names is taken
        assert main([*args[:-1], "1"]) == 0


def test_models_names_the_cache_in_use(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("VITKIT_CACHE", str(tmp_path / "my-cache"))
    assert main(["models"]) == 0
    says(capsys.readouterr().out, "cached", str(tmp_path / "my-cache"))

