"""`vitkit benchmark`: what it reports, from names and weights, on each engine; the sweep's
table and figure; bad input that names its fix. Tiny models, few calls; timings are not
asserted (the machine is shared), only that they are measured and consistent."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.flop_counter import FlopCounterMode

from vitkit import create_model
from vitkit.cli import build_parser, main
from vitkit.inference.benchmark.rss import (
    LinearMemoryModel,
    largest_fitting_batch,
    peak_rss_growth,
)
from vitkit.inference.benchmark.timing import Timing

FAST = ["--batch-size", "4", "--warmup", "0", "--iters", "2"]
KEYS = ("images_per_s", "latency_ms_median", "latency_ms_p90", "peak_memory_mib",
        "gflops_per_image", "peak_gflops", "mfu")


def says(text: str, *parts: str) -> None:
    """Assert that a message names each of `parts` (case-insensitive), showing it if not."""
    missing = [part for part in parts if part.lower() not in text.lower()]
    assert not missing, f"{missing} not in message: {text!r}"


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["benchmark", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def run_json(capsys, *argv: str) -> dict:
    code, out, err = run_cli(capsys, *argv, "--json")
    assert code == 0, err
    return json.loads(out)


def counted_gflops(name_or_config, img_size: int) -> float:
    """torch's own FlopCounterMode count of one image's forward pass (on the meta device, where
    attention is counted too, as tests/model/test_stems.py counts it): the full forward, every token
    through every block, as forward_flops counts the model."""
    model = create_model(name_or_config, device="meta", img_size=img_size)
    images = torch.zeros(1, model.config.in_chans, img_size, img_size, device="meta")
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model.forward_head(model.forward_features(images))
    return counter.get_total_flops() / 1e9


def test_benchmark_prints_images_per_s_latency_peak_memory_and_mfu(capsys):
    code, out, err = run_cli(capsys, "cifar10-tutorial", *FAST)
    assert code == 0, err
    for label in ("images/s (batch 4", "latency at batch 1 (median / p90)",
                  "peak memory during the run", "GFLOPs per image", "fp32 matmul peak", "MFU"):
        assert label in out
    images_per_s = float(re.search(r"images/s \(batch 4, median of 2\)\s+([\d,.]+)", out)[1]
                         .replace(",", ""))
    assert images_per_s > 0
    assert "MFU can pass 100%" not in out  # fp32 against the fp32 peak
    code, out, err = run_cli(capsys, "cifar10-tutorial", "--precision", "int8", *FAST)
    assert code == 0, err
    says(out, "fp32 peak", "int8", "MFU can pass 100%")


def test_benchmark_json_has_positive_measurements_consistent_with_each_other(capsys):
    result = run_json(capsys, "cifar10-tutorial", *FAST)
    for key in KEYS:
        assert result[key] > 0, key
    assert result["latency_ms_p90"] >= result["latency_ms_median"]
    # images/s is the batch over the median batch time; MFU is FLOP/s over the peak
    assert result["images_per_s"] == pytest.approx(4 / (result["batch_ms_median"] / 1e3))
    assert result["mfu"] == pytest.approx(result["gflops_per_image"] * result["images_per_s"]
                                          / result["peak_gflops"])
    # FLOPs per image as torch's FlopCounterMode counts the real forward pass
    assert result["gflops_per_image"] == pytest.approx(counted_gflops("cifar10-tutorial", 32),
                                                       rel=1e-9)
    assert result["img_size"] == [32, 32] and result["weights"] == "random init"


def test_benchmark_reads_saved_weights_and_resamples_to_img_size(capsys, tmp_path):
    from vitkit.weights import save_pretrained

    model = create_model("cifar10-tutorial")
    folder = save_pretrained(model, tmp_path / "tiny")
    result = run_json(capsys, str(folder), *FAST)
    assert result["weights"] == f"weights {folder}" and result["img_size"] == [32, 32]

    result = run_json(capsys, str(folder), "--img-size", "48", *FAST)
    assert result["img_size"] == [48, 48] and result["images_per_s"] > 0
    assert result["gflops_per_image"] == pytest.approx(counted_gflops(model.config, 48),
                                                       rel=1e-9)


def test_benchmark_names_a_model_by_its_variant_only_when_it_has_its_sizes(capsys, tmp_path):
    """The digits recipe's model is built from "Ti/2" at width 64 and depth 4: it is named by
    its numbers, not as ViT-Ti (width 192, depth 12); a true Ti/4 keeps its name."""
    from vitkit.weights import save_pretrained

    digits = create_model("Ti/2", img_size=8, in_chans=1, num_classes=10, width=64, depth=4,
                          num_heads=4, mlp_dim=128)
    result = run_json(capsys, str(save_pretrained(digits, tmp_path / "digits")), *FAST)
    assert "Ti" not in result["model"]
    says(result["model"], "custom ViT", "width 64", "depth 4", "heads 4", "patch 2")
    tiny = save_pretrained(create_model("Ti/4", img_size=16, num_classes=3), tmp_path / "ti")
    assert run_json(capsys, str(tiny), *FAST)["model"] == "Ti/4"


def test_benchmark_on_onnxruntime_reports_the_same_measurements(capsys):
    pytest.importorskip("onnxruntime")
    result = run_json(capsys, "cifar10-tutorial", "--engine", "onnxruntime", "--threads", "1",
                      *FAST)
    assert result["engine"].startswith("onnxruntime") and result["threads"] == 1
    for key in KEYS:
        assert result[key] > 0, key


def test_benchmark_int8_runs_the_quantized_model(capsys):
    from vitkit.inference.int8_engines import available_engines

    result = run_json(capsys, "cifar10-tutorial", "--int8", *FAST)
    engine = result["engine"].split("int8 (", 1)[1].split(" engine)")[0]  # the one measured fastest
    assert engine in available_engines() and result["images_per_s"] > 0
    assert f"asked, engine {engine}" not in result["precision_reason"]  # measured, not asked
    assert "int8 engines measured" in result["precision_reason"]


def test_benchmark_int8_on_onnxruntime_times_the_quantized_graph(capsys):
    pytest.importorskip("onnxruntime")
    result = run_json(capsys, "cifar10-tutorial", "--int8", "--engine", "onnxruntime", *FAST)
    assert "int8 (onnxruntime quantize_dynamic)" in result["engine"]
    assert result["images_per_s"] > 0


@pytest.mark.parametrize("int8", [False, True])
def test_benchmark_on_onnxruntime_times_only_a_graph_that_equals_the_model(
        capsys, unfaithful_exporter, int8):
    """An exporter that writes every logit 0.05 off (conftest): the benchmark refuses it."""
    pytest.importorskip("onnxruntime")
    code, _, err = run_cli(capsys, "cifar10-tutorial", "--engine", "onnxruntime",
                           *(["--int8"] if int8 else []), *FAST)
    assert code != 0 and "Traceback" not in err
    says(err, "ONNX outputs differ from PyTorch", "0.05", "32x32", "--engine torch")
    assert run_cli(capsys, "cifar10-tutorial", "--engine", "torch",
                   *(["--int8"] if int8 else []), *FAST)[0] == 0  # the fix, followed


def test_benchmark_merge_tokens_runs_the_merged_model_and_counts_its_flops(capsys):
    from vitkit import apply_token_merging

    result = run_json(capsys, "cifar10-tutorial", "--merge-tokens", "4", *FAST)
    assert "token merging r=4" in result["engine"] and result["images_per_s"] > 0
    model = apply_token_merging(create_model("cifar10-tutorial", device="meta"), 4)
    with FlopCounterMode(display=False) as counter, torch.no_grad():  # as counted_gflops
        model.forward_head(model.forward_features(torch.zeros(1, 3, 32, 32, device="meta")))
    assert result["gflops_per_image"] == pytest.approx(counter.get_total_flops() / 1e9,
                                                       rel=1e-6)
    assert result["gflops_per_image"] < counted_gflops("cifar10-tutorial", 32)


def test_token_merging_on_onnxruntime_times_the_merged_graph(capsys):
    pytest.importorskip("onnxruntime")
    result = run_json(capsys, "cifar10-tutorial", "--merge-tokens", "4", "--engine",
                      "onnxruntime", *FAST)
    assert result["engine"].startswith("onnxruntime") and "token merging r=4" in result["engine"]
    assert result["gflops_per_image"] < counted_gflops("cifar10-tutorial", 32)
    code, _, err = run_cli(capsys, "cifar10-tutorial", "--merge-tokens", "4", "--engine",
                           "onnxruntime", "--img-size", "48", *FAST)
    assert code == 0, err  # a benchmark at another size exports that size


def test_sweep_writes_a_two_panel_png_and_one_row_per_variant_and_resolution(capsys, tmp_path):
    png = tmp_path / "sweep.png"
    code, out, err = run_cli(capsys, "--sweep", "--variants", "cifar10-tutorial",
                             "--resolutions", "32,64", "--memory-gb", "2", "--out", str(png),
                             *FAST)
    assert code == 0, err
    rows = [line.split() for line in out.splitlines() if line.startswith("cifar10-tutorial")]
    assert [row[1] for row in rows] == ["32", "64"]
    assert all(int(row[-1].replace(",", "")) >= 1 for row in rows)  # largest batch
    assert "doubling then bisecting" in out and f"wrote {png}" in out
    with Image.open(png) as image:
        assert image.format == "PNG" and image.width > 1.5 * image.height  # two panels

    code, out, err = run_cli(capsys, "--sweep", "--variants", "cifar10-tutorial",
                             "--resolutions", "32,64", "--memory-gb", "2", "--out", str(png),
                             "--json", *FAST)
    assert code == 0, err
    rows = [json.loads(line) for line in out.splitlines()]
    assert [(r["variant"], r["img_size"]) for r in rows] == [("cifar10-tutorial", 32),
                                                             ("cifar10-tutorial", 64)]
    for row in rows:  # the largest batch is the estimate's: it fits the cap, one more does not
        per_image = row["memory_per_image_mib"]
        fixed = max(0.0, row["memory_mib_batch1"] - per_image)  # the line through batch 1

        def needed(batch: int, row=row, fixed=fixed, per_image=per_image) -> float:
            return (row["weights_mib"] + fixed + per_image * batch) * 2**20
        cap = row["memory_cap_gib"] * 2**30
        assert cap == 2 * 2**30
        assert needed(row["largest_batch"]) <= cap < needed(row["largest_batch"] + 1)

def test_sweep_reports_the_figure_file_it_wrote_for_a_name_without_a_suffix(capsys, tmp_path):
    """A figure name without a suffix, or with one that is no image format, gets .png; the
    report names the file written."""
    for given, written in (("adir", "adir.png"), ("sweep.v2", "sweep.v2.png")):
        code, out, err = run_cli(capsys, "--sweep", "--variants", "cifar10-tutorial",
                                 "--resolutions", "32", "--memory-gb", "2", "--out",
                                 str(tmp_path / given), *FAST)
        assert code == 0, err
        reported = Path(out.rstrip().splitlines()[-1].removeprefix("wrote "))
        assert reported == tmp_path / written and reported.is_file()
    assert sorted(path.name for path in tmp_path.iterdir()) == ["adir.png", "sweep.v2.png"]
    with Image.open(tmp_path / "adir.png") as image:
        assert image.format == "PNG"


def test_a_figure_that_cannot_be_written_is_refused_before_the_sweep(capsys, tmp_path,
                                                                    monkeypatch):
    """--out whose figure file is a folder (`fig` -> fig.png/), or .pgf without LaTeX, is
    refused before the sweep runs, naming the problem and a file that works."""
    import vitkit.inference.benchmark.figure as figure

    (tmp_path / "fig.png").mkdir()
    monkeypatch.setattr(figure, "installed", lambda program: False)  # no LaTeX, on any host
    sweep = ["--sweep", "--variants", "cifar10-tutorial", "--resolutions", "32",
             "--memory-gb", "2", *FAST]
    for given, problem in (("fig", "which is a folder"), ("x.pgf", "not installed")):
        code, out, err = run_cli(capsys, *sweep, "--out", str(tmp_path / given))
        assert code == 2 and out == ""  # no sweep row was run
        says(err, given, problem)
        suggested = re.search(r"e\.g\. (\S+)$", err.strip())[1]
        code, out, err = run_cli(capsys, *sweep, "--out", suggested)
        assert code == 0, err
        assert Path(out.rstrip().splitlines()[-1].removeprefix("wrote ")) == Path(suggested)
        assert Path(suggested).is_file()


def test_largest_fitting_batch_matches_the_closed_form_of_a_linear_estimate():
    for fixed, per_image, cap in [(0, 1, 1), (10, 3, 1000), (5e8, 7.3e6, 2**34), (100, 1, 99)]:
        expected = max(0, int((cap - fixed) // per_image))
        assert largest_fitting_batch(lambda b, f=fixed, p=per_image: f + p * b, cap) == expected
    line = LinearMemoryModel.fit(1, 100.0, 8, 90.0, min_per_image=5.0)  # noisy: slope < 0
    assert line.per_image == 5.0 and line(1) <= 100.0


def test_peak_rss_growth_is_the_runs_own_even_after_a_bigger_earlier_peak():
    big = torch.ones(300 * 2**20 // 4)  # 300 MiB, touched
    del big
    with peak_rss_growth() as peak:
        small = torch.ones(100 * 2**20 // 4)  # 100 MiB
        del small
    assert "high-water" in peak.method  # Linux: the exact kernel counter
    assert 90 < peak.mib < 200


def test_latency_percentile_matches_numpy():
    seconds = [0.5, 0.1, 0.3, 0.9, 0.2, 0.7, 0.4]
    timing = Timing(seconds, first_call_s=1.0)
    for q in (0, 50, 90, 100):
        assert timing.percentile(q) == pytest.approx(np.percentile(seconds, q))
    assert timing.median == pytest.approx(np.median(seconds))


# -- bad input: the message names the fix, and the fix works -----------------------------------
def test_unknown_variant_suggests_the_name_that_works(capsys):
    code, _, err = run_cli(capsys, "cifar10-tutorail", *FAST)
    assert code == 2
    says(err, "unknown model", "cifar10-tutorail")
    suggestion = re.search(r"Did you mean '([^']+)'", err)[1]
    code, out, err = run_cli(capsys, suggestion, *FAST)
    assert code == 0 and "images/s" in out, err


def test_img_size_not_divisible_by_the_patch_suggests_a_size_that_works(capsys):
    code, _, err = run_cli(capsys, "cifar10-tutorial", "--img-size", "30", *FAST)
    assert code == 2
    says(err, "30x30", "not divisible", "patch size 4")
    suggestion = re.search(r"e\.g\. (\d+x\d+)", err)[1]
    result = run_json(capsys, "cifar10-tutorial", "--img-size", suggestion, *FAST)
    assert result["img_size"] == [int(n) for n in suggestion.split("x")]


def test_batch_size_zero_is_refused_with_the_smallest_that_works(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["benchmark", "cifar10-tutorial", "--batch-size", "0"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2
    says(err, "--batch-size", ">= 1", "got 0")
    smallest = re.search(r">= (\d+)", err)[1]
    result = run_json(capsys, "cifar10-tutorial", "--batch-size", smallest, "--warmup", "0",
                      "--iters", "2")
    assert result["batch_size"] == 1 and result["images_per_s"] > 0


def test_benchmark_without_a_model_or_sweep_says_what_to_give(capsys):
    code, _, err = run_cli(capsys, *FAST)
    assert code == 2
    says(err, "vitkit benchmark B/16", "--sweep")


def test_int8_engine_picks_the_eager_implementation_and_is_refused_on_onnxruntime(capsys):
    """--int8-engine means what it means on eval and predict: the PyTorch int8 implementation
    (it implies --int8); onnxruntime quantises its graph itself."""
    result = run_json(capsys, "cifar10-tutorial", "--int8-engine", "torch", *FAST)
    assert "int8 (torch engine)" in result["engine"]
    code, _, err = run_cli(capsys, "cifar10-tutorial", "--int8-engine", "torch", "--engine",
                           "onnxruntime", *FAST)
    assert code == 2
    says(err, "--int8-engine", "torch engine", "--engine torch")


def test_the_sweep_measures_batch_one_after_a_first_call(tmp_path):
    """Batch 1's memory is measured after a first call (whose one-off allocations later calls
    reuse), so in a fresh process the per-image slope is real and Ti/16 at 64 px under 1 GiB
    gets a largest batch that fits (about 0.2 MiB per image), not one ten times too big."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "vitkit", "benchmark", "--sweep", "--variants", "Ti/16",
         "--resolutions", "64", "--threads", "1", "--iters", "2", "--warmup", "1",
         "--memory-gb", "1", "--out", str(tmp_path / "sweep.png"), "--json"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr
    row = json.loads(done.stdout)  # one cell: its row
    assert row["memory_mib_batch1"] < row["peak_memory_mib"]  # batch 1 needs less than 8
    assert row["memory_per_image_mib"] > 0.1
    assert row["largest_batch"] < 10_000


@pytest.mark.parametrize("flags", [["--variants", "S/16"], ["--resolutions", "64"],
                                   ["--memory-gb", "1"], ["--out", "sweep.png"]])
def test_sweep_settings_without_sweep_are_refused_not_ignored(capsys, flags):
    """--variants, --resolutions, --memory-gb and --out set the sweep only: without --sweep
    they are refused, naming the flag and advising --sweep or dropping it; dropped, it runs."""
    code, _, err = run_cli(capsys, "cifar10-tutorial", *flags, *FAST)
    assert code == 2
    says(err, flags[0], "sweep", "add --sweep", f"drop {flags[0]}")
    assert run_json(capsys, "cifar10-tutorial", *FAST)["images_per_s"] > 0  # dropped


def test_compile_with_onnxruntime_int8_says_it_does_not_compile(capsys):
    """--compile where the int8 engine is ONNX Runtime's compiles nothing: the row says so,
    and the first call is not called a compile."""
    pytest.importorskip("onnxruntime")
    result = run_json(capsys, "cifar10-tutorial", "--int8-engine", "onnxruntime", "--compile",
                      *FAST)
    assert "torch.compile" not in result["engine"]
    assert "not compiled: ONNX Runtime's int8 session" in result["engine"]
    code, out, _ = run_cli(capsys, "cifar10-tutorial", "--int8-engine", "onnxruntime",
                           "--compile", *FAST)
    assert code == 0 and "first call (compile)" not in out


def test_a_batch_too_large_for_memory_is_an_error_naming_the_fix_not_a_bug(capsys):
    args = ["benchmark", "cifar10-tutorial", "--threads", "1", "--iters", "1", "--warmup", "0"]
    assert main([*args, "--batch-size", "100000000"]) == 2  # a user error, not a crash
    err = capsys.readouterr().err
    says(err, "error:", "out of memory", "lower the batch size")
    assert "Traceback" not in err
    assert main([*args, "--batch-size", "2"]) == 0  # as advised


def test_an_empty_variant_list_is_refused_as_an_empty_resolution_list_is(capsys):
    assert main(["benchmark", "--sweep", "--variants", "", "--threads", "1"]) == 2
    says(capsys.readouterr().err, "no variants", "separated by commas")


def test_benchmark_int8_help_names_the_engine_auto_picks():
    bench = build_parser()._subparsers._group_actions[0].choices["benchmark"]
    text = " ".join(bench.format_help().split())
    assert "the engine --int8-engine names (default auto: the fastest measured" in text
