"""The CLI's library policy, callable without the CLI: which recipe a run starts from, where
`vitkit export` writes by default, one meaning of --int8 and one --merge-tokens across verbs."""

from pathlib import Path

import pytest

from vitkit.cli import build_parser
from vitkit.export import default_output_path
from vitkit.inference.int8_engines import DEFAULT
from vitkit.inference.quantize import int8_engine
from vitkit.report import Report
from vitkit.train.recipe import finetune_config, run_config


def test_without_a_recipe_a_run_starts_from_digits_unless_overrides_name_other_data(tmp_path):
    digits = run_config(None, ["epochs=3"], out=str(tmp_path))
    assert (digits.data, digits.epochs, digits.out_dir) == ("digits", 3, str(tmp_path))
    assert run_config("epochs=3").epochs == 3  # an override in the recipe's place
    other = run_config(None, ["data=folder", "model.depth=2"], data_dir=str(tmp_path))
    assert other.data == "folder" and other.data_dir == str(tmp_path)
    assert other.model["depth"] == 2


def test_finetune_starts_the_finetune_recipe_from_the_weights(tmp_path):
    cfg = finetune_config("B/16-i21k", ["lr=0.01"], data="cifar100", img_size=224,
                          time_budget=60.0, out=str(tmp_path))
    assert cfg.init_from == "B/16-i21k" and cfg.data == "cifar100" and cfg.lr == 0.01
    assert cfg.time_budget == 60.0 and cfg.out_dir == str(tmp_path)


def test_export_writes_beside_the_weights_by_default(tmp_path):
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"")
    assert default_output_path(str(weights)) == tmp_path / "model.onnx"
    assert default_output_path(str(weights), int8=True) == tmp_path / "model.int8.onnx"
    assert default_output_path(str(tmp_path)) == tmp_path / "model.onnx"
    assert default_output_path("B/16-i21k") == Path("B-16-i21k.onnx")


def test_int8_means_int8_weights_for_the_verbs_engine_on_every_verb():
    verbs = build_parser()._subparsers._group_actions[0].choices
    for name in ("eval", "predict", "export", "benchmark"):
        actions = {action.dest: action for action in verbs[name]._actions}
        assert actions["int8"].help.startswith("int8 weights for this verb's engine"), name
        assert actions["merge_tokens"].metavar == "R", name
    assert "int8_engine" not in {action.dest for action in verbs["export"]._actions}
    assert int8_engine(False) is None and int8_engine(True) == DEFAULT
    assert int8_engine(False, "torchao") == "torchao"  # the engine implies int8


@pytest.mark.parametrize("data", [{"top1": 0.5}, {}])
def test_a_report_is_text_and_the_same_facts_as_json(data):
    report = Report("line one\nline two", data)
    assert report.format() == str(report) == "line one\nline two"
    assert report.to_dict() == data
