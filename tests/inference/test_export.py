"""`vitkit export`: ONNX files that onnxruntime runs to PyTorch's outputs within 1e-4, written
by default to a file name every system takes."""

from __future__ import annotations

import copy
import os
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

import vitkit
from vitkit.cli import main
from vitkit.errors import ExportError
from vitkit.export import (
    check_onnx,
    export_onnx,
    read_metadata,
    require,
)
from vitkit.export.checked_export import default_output_path

TOL = 1e-4


def says(text: str, *parts: str) -> None:
    """Assert that a message names each of `parts` (case-insensitive), showing it if not."""
    missing = [part for part in parts if part.lower() not in text.lower()]
    assert not missing, f"{missing} not in message: {text!r}"


def random_model(name: str = "Ti/16", **overrides) -> vitkit.VisionTransformer:
    """A small model with random non-zero weights everywhere (the head starts at zero).

    Built on the meta device: every parameter is overwritten anyway, and the R50's own
    initialisation takes seconds.
    """
    defaults = {"img_size": 32, "depth": 2, "num_classes": 5}
    model = vitkit.create_model(name, device="meta", **{**defaults, **overrides})
    model.to_empty(device="cpu")
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0.0, 0.1)
    for module in model.modules():  # buffers of to_empty() hold garbage
        if isinstance(module, torch.nn.BatchNorm2d):
            module.reset_running_stats()
    if model.config.pos_embed in ("sincos1d", "sincos2d"):  # non-persistent: rebuild
        model.pos_embed = torch.nn.Buffer(vitkit.VisionTransformer._make_pos_embed(model.config),
                                          persistent=False)
    return model.eval()


def run_onnx(path: Path, images: torch.Tensor) -> torch.Tensor:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return torch.from_numpy(session.run(None, {"images": images.numpy()})[0])


def test_static_export_matches_at_batch_1_and_4(tmp_path):
    model = random_model()
    path = export_onnx(model, tmp_path / "m.onnx")
    diff = check_onnx(model, path, batch_sizes=(1, 4))
    assert diff <= TOL
    images = torch.randn(4, 3, 32, 32)
    with torch.no_grad():
        expected = model(images)
    assert expected.abs().max() > 0.1  # a real signal, not zeros compared with zeros
    assert (run_onnx(path, images) - expected).abs().max() <= TOL


def test_fixed_batch_export_refuses_another_batch(tmp_path):
    model = random_model()
    path = export_onnx(model, tmp_path / "m.onnx", dynamic_batch=False)
    assert check_onnx(model, path, batch_sizes=(1,)) <= TOL
    with pytest.raises(ExportError) as info:
        check_onnx(model, path, batch_sizes=(4,))
    says(str(info.value), "batch of 4", "dynamic batch")
    dynamic = export_onnx(model, tmp_path / "dynamic.onnx", dynamic_batch=True)  # as advised
    assert check_onnx(model, dynamic, batch_sizes=(4,)) <= TOL


def test_dynamic_size_matches_bilinear_set_image_size(tmp_path):
    model = random_model()
    with torch.no_grad():
        model.pos_embed.normal_(0.0, 1.0)  # positions that visibly change the logits
    path = export_onnx(model, tmp_path / "m.onnx", dynamic_size=True)
    assert check_onnx(model, path, batch_sizes=(1, 3), sizes=[64, (16, 48)]) <= TOL
    images = torch.randn(2, 3, 64, 64)
    got = run_onnx(path, images)
    bilinear, bicubic = copy.deepcopy(model), copy.deepcopy(model)
    bilinear.set_image_size(64, mode="bilinear")
    bicubic.set_image_size(64, mode="bicubic")
    with torch.no_grad():
        to_bilinear = (got - bilinear(images)).abs().max().item()
        to_bicubic = (got - bicubic(images)).abs().max().item()
    assert to_bilinear <= TOL
    assert to_bicubic > 100 * to_bilinear  # it is the bilinear resampling, not just close


@pytest.mark.parametrize("pos_embed", ["sincos1d", "sincos2d", "none"])
def test_dynamic_size_fixed_positions(tmp_path, pos_embed):
    model = random_model(pos_embed=pos_embed)
    path = export_onnx(model, tmp_path / "m.onnx", dynamic_size=True)
    assert check_onnx(model, path, batch_sizes=(2,), sizes=[64, (48, 32)]) <= TOL


def test_hybrid_r50_exports_and_matches(tmp_path):
    model = random_model("R50+Ti/16", img_size=64, depth=1, num_classes=3)
    path = export_onnx(model, tmp_path / "r50.onnx", dynamic_size=True)
    # Native 64x64 and a non-square 96x64 (the SAME padding follows the size in-graph).
    assert check_onnx(model, path, batch_sizes=(1,), sizes=[(96, 64)]) <= TOL  # traced at 2


@pytest.mark.parametrize(("stem", "odd_size"), [
    ({"stem": "conv", "stem_channels": (8, 16)}, (13, 18)),  # padded 3x3 convs: ceil grid
    ({"stem": "resnet", "resnet_layers": (1,)}, (18, 13)),   # SAME padding in-graph: ceil grid
    ({"stem": "conv", "stem_channels": (8, 16), "stem_pool": True}, (13, 18)),  # ceil max-pool
])
def test_dynamic_export_is_the_models_own_forward_at_odd_sizes(tmp_path, stem, odd_size):
    model = random_model("Ti/4", img_size=16, depth=1, dynamic_img_size=True, **stem)
    path = export_onnx(model, tmp_path / "m.onnx")  # dynamic because the model is
    assert read_metadata(path)["input"]["dynamic_size"] is True
    for size in [(16, 16), odd_size, (24, 20)]:
        images = torch.randn(2, 3, *size)
        with torch.no_grad():
            expected = model(images)
        assert (run_onnx(path, images) - expected).abs().max() <= TOL, size
    assert check_onnx(model, path, batch_sizes=(1,), sizes=[(24, 20)]) <= TOL


def test_dynamic_size_argument_switches_the_model_or_exports_the_fixed_size(tmp_path):
    model = random_model()
    export_onnx(model, tmp_path / "static.onnx")
    assert not model.config.dynamic_img_size
    export_onnx(model, tmp_path / "dynamic.onnx", dynamic_size=True)
    assert model.config.dynamic_img_size  # switched on in place, as documented
    static = export_onnx(model, tmp_path / "static_again.onnx", dynamic_size=False)
    assert read_metadata(static)["input"]["dynamic_size"] is False
    with pytest.raises(ExportError) as info:
        check_onnx(model, static, batch_sizes=(1,), sizes=[64])
    says(str(info.value), "64x64", "--dynamic-size")
    dynamic = export_onnx(model, tmp_path / "dynamic_again.onnx", dynamic_size=True)  # advised
    assert check_onnx(model, dynamic, batch_sizes=(1,), sizes=[64]) <= TOL


def test_no_class_token_mean_pool_exports(tmp_path):
    model = random_model(pool="mean_patches", class_token=False)
    static = export_onnx(model, tmp_path / "static.onnx")
    assert check_onnx(model, static, batch_sizes=(1, 4)) <= TOL
    dynamic = export_onnx(model, tmp_path / "dynamic.onnx", dynamic_size=True)
    assert check_onnx(model, dynamic, batch_sizes=(2,), sizes=[48]) <= TOL


def test_metadata_describes_preprocessing_and_classes(tmp_path):
    model = random_model(num_classes=3)
    vitkit.save_pretrained(model, tmp_path / "weights", class_names=["cat", "dog", "fox"])
    loaded = vitkit.load_pretrained(tmp_path / "weights")
    meta = read_metadata(export_onnx(loaded, tmp_path / "m.onnx", dynamic_size=True))
    assert meta["class_names"] == ["cat", "dog", "fox"]
    assert meta["preprocess"]["img_size"] == [32, 32]
    assert meta["preprocess"]["mean"] == [0.5, 0.5, 0.5]
    assert meta["preprocess"]["std"] == [0.5, 0.5, 0.5]
    assert meta["model_config"]["patch_size"] == 16
    assert meta["input"]["dynamic_size"] is True
    assert meta["input"]["size_multiple_of"] == 16
    assert meta["output"]["num_classes"] == 3


def test_unknown_stem_refuses_dynamic_size(tmp_path):
    model = random_model()
    model.patch_embed = torch.nn.Sequential(model.patch_embed)
    with pytest.raises(ExportError) as info:
        export_onnx(model, tmp_path / "m.onnx", dynamic_size=True)
    says(str(info.value), "without --dynamic-size")
    assert check_onnx(model, export_onnx(model, tmp_path / "m.onnx")) <= TOL  # the advice


def test_opset_too_old_is_refused_and_a_chosen_opset_used(tmp_path):
    model = random_model()
    with pytest.raises(ExportError) as info:
        export_onnx(model, tmp_path / "m.onnx", opset=13)
    says(str(info.value), "opset 13", "opset 14", "--opset")
    path = export_onnx(model, tmp_path / "m.onnx", opset=17)
    opsets = {entry.domain: entry.version for entry in onnx.load(str(path)).opset_import}
    assert opsets[""] == 17
    assert check_onnx(model, path) <= TOL


def test_missing_onnxruntime_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    with pytest.raises(ExportError) as info:
        require("onnxruntime")
    says(str(info.value), "onnxruntime", "pip install 'vitkit[export]'")


def test_cli_export_end_to_end(tmp_path, capsys):
    folder = vitkit.save_pretrained(random_model(), tmp_path / "weights")
    assert main(["export", str(folder)]) == 0
    out = capsys.readouterr().out
    path = folder / "model.onnx"
    assert path.is_file() and f"wrote {path}" in out
    says(out, "onnxruntime check", "max abs diff", "batch 1, 3", "32x32", "tolerance 1e-4",
         "1e-5")
    assert out.rstrip().endswith("OK")

    target = tmp_path / "dyn.onnx"
    assert main(["export", str(folder), "--out", str(target), "--dynamic-size"]) == 0
    out = capsys.readouterr().out
    assert target.is_file() and "dynamic batch, height, width" in out
    assert "at 32x32, 64x64, 16x32" in out and out.rstrip().endswith("OK")
    images = torch.randn(2, 3, 48, 48)
    assert np.isfinite(run_onnx(target, images).numpy()).all()


def test_cli_unknown_format(tmp_path, capsys):
    folder = vitkit.save_pretrained(random_model(), tmp_path / "weights")
    assert main(["export", str(folder), "--format", "tflite"]) == 2
    err = capsys.readouterr().err
    says(err, "error:", "unknown format", "tflite", "--format onnx")
    assert "Traceback" not in err
    assert main(["export", str(folder), "--format", "onnx"]) == 0  # as advised


@pytest.mark.parametrize("pool", ["class_token", "mean_patches"])
def test_a_token_merging_model_exports_and_matches(tmp_path, pool):
    model = vitkit.apply_token_merging(random_model(img_size=64, depth=3, pool=pool), 4)
    path = export_onnx(model, tmp_path / "m.onnx", dynamic_size=False)
    assert check_onnx(model, path, batch_sizes=(1, 4)) <= TOL
    assert read_metadata(path)["merge_tokens"] == 4
    plain = export_onnx(random_model(), tmp_path / "plain.onnx")
    assert read_metadata(plain)["merge_tokens"] == 0


def test_a_token_merging_model_refuses_a_dynamic_size_with_the_fix(tmp_path):
    model = vitkit.apply_token_merging(random_model(img_size=64), 4)
    with pytest.raises(ExportError) as info:
        export_onnx(model, tmp_path / "m.onnx", dynamic_size=True)
    says(str(info.value), "token-merging", "image size only", "without --dynamic-size",
         "dynamic_size=False")
    model.set_dynamic_img_size()  # the model's own setting asks for a dynamic size too
    with pytest.raises(ExportError) as info:
        export_onnx(model, tmp_path / "m.onnx")
    says(str(info.value), "image size only", "dynamic_size=False")
    path = export_onnx(model, tmp_path / "m.onnx", dynamic_size=False)  # the fix
    assert check_onnx(model, path, batch_sizes=(2,)) <= TOL


def test_check_onnx_adds_a_tolerance_relative_to_the_outputs_only_when_asked(
        tmp_path, unfaithful_exporter):
    """A graph 0.05 off (conftest): refused at 1e-4 whatever the logits; with rtol=1e-5
    refused on logits of magnitude ~1 and accepted on logits of magnitude ~1e4, where 0.05 is
    within 1e-4 + 1e-5 x their magnitude."""
    model = random_model()
    path = vitkit.export.export_onnx(model, tmp_path / "m.onnx")  # the patched exporter
    with pytest.raises(ExportError) as info:
        check_onnx(model, path, atol=1e-4, rtol=1e-5)
    says(str(info.value), "differ from PyTorch", "0.05", "tolerance", "0.0001", "1e-05",
         "largest magnitude")
    with torch.no_grad():
        model.head.weight.mul_(1e4)
        model.head.bias.mul_(1e4)
    path = vitkit.export.export_onnx(model, tmp_path / "large.onnx")
    with pytest.raises(ExportError) as info:
        check_onnx(model, path)
    says(str(info.value), "tolerance 0.0001", "not faithful")
    assert "largest magnitude" not in str(info.value)  # no relative term unless asked
    assert check_onnx(model, path, atol=1e-4, rtol=1e-5) == pytest.approx(0.05, abs=0.01)


def test_cli_export_passes_a_model_with_large_logits(tmp_path, capsys):
    """Logits in the thousands carry float32 rounding far above a bare 1e-4; the check's
    relative term (1e-5 x the outputs' largest magnitude) passes such an export."""
    model = random_model()
    with torch.no_grad():
        model.head.weight.mul_(1e4)
        model.head.bias.mul_(1e4)
    folder = vitkit.save_pretrained(model, tmp_path / "weights")
    assert main(["export", str(folder)]) == 0
    path = folder / "model.onnx"
    assert capsys.readouterr().out.rstrip().endswith("OK")
    with pytest.raises(ExportError) as info:
        check_onnx(model, path)  # a bare 1e-4 refuses it
    says(str(info.value), "tolerance 0.0001", "not faithful")
    assert check_onnx(model, path, atol=1e-4, rtol=1e-5) < 0.02


def test_cli_export_refuses_an_unfaithful_graph_and_leaves_no_file(
        tmp_path, capsys, unfaithful_exporter):
    folder = vitkit.save_pretrained(random_model(), tmp_path / "weights")
    target = tmp_path / "m.onnx"
    assert main(["export", str(folder), "--out", str(target)]) != 0
    err = capsys.readouterr().err
    says(err, "ONNX outputs differ from PyTorch", "0.05")
    assert "Traceback" not in err
    assert not target.exists()
    target.write_bytes(b"a previous export")  # a refused graph leaves it as it was
    assert main(["export", str(folder), "--out", str(target)]) != 0
    assert target.read_bytes() == b"a previous export"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "weights"]  # no staging


def test_cli_export_refuses_a_new_name_not_ending_in_onnx(tmp_path, capsys):
    """An --out not ending in .onnx (which would be read as the kind of file its name says) is
    refused, naming one that does, which is then written (--format in any case)."""
    model = random_model()
    folder = vitkit.save_pretrained(model, tmp_path / "weights")
    target = tmp_path / "out" / "model.safetensors"
    assert main(["export", str(folder), "--out", str(target)]) != 0
    err = capsys.readouterr().err
    suggested = tmp_path / "out" / "model.onnx"
    says(err, f"--out {target}", "does not end in .onnx", f"--out {suggested}")
    assert not target.exists() and "Traceback" not in err
    assert main(["export", str(folder), "--format", "ONNX", "--out", str(suggested)]) == 0
    assert check_onnx(model, suggested) <= TOL


def test_cli_export_over_a_previous_export_replaces_it_and_leaves_no_staging(tmp_path):
    model = random_model()
    folder = vitkit.save_pretrained(model, tmp_path / "weights")
    target = tmp_path / "out" / "m.onnx"
    target.parent.mkdir()
    target.write_bytes(b"a previous export")
    assert main(["export", str(folder), "--out", str(target)]) == 0
    assert [p.name for p in target.parent.iterdir()] == ["m.onnx"]
    assert check_onnx(model, target) <= TOL


def test_cli_export_int8_removes_a_file_its_int8_check_refuses(tmp_path, capsys, monkeypatch):
    """The float graph passes; the int8 check (here made to refuse) leaves no file either."""
    import vitkit.export.checked_export

    def refuse(*args, **kwargs):
        raise ExportError("the int8 graph's logits differ by 9 (made to refuse)")

    monkeypatch.setattr(vitkit.export.checked_export, "check_onnx_int8", refuse)
    folder = vitkit.save_pretrained(random_model(), tmp_path / "weights")
    target = tmp_path / "m.int8.onnx"
    assert main(["export", str(folder), "--int8", "--out", str(target)]) != 0
    assert "made to refuse" in capsys.readouterr().err
    assert not target.exists() and list(tmp_path.glob("*.onnx*")) == []


def test_cli_export_moves_the_graph_and_its_external_data_only_and_refuses_a_folder(
        tmp_path, capsys, monkeypatch):
    """A graph whose tensors are stored beside it (as torch writes one over 2 GiB; here made
    so) arrives with its data file and still runs; a stray file written beside it in the
    staging folder (as int8's float weights are) is not moved. An --out that is a folder is
    refused before any work, naming a file in it, which then works."""
    import onnx

    import vitkit.export.checked_export

    export_faithfully = vitkit.export.checked_export.export_onnx

    def export_with_external_data(model, path, **kwargs):
        path = export_faithfully(model, path, **kwargs)
        onnx.save_model(onnx.load(str(path)), str(path), save_as_external_data=True,
                        location="m.onnx.data", size_threshold=0)
        (path.parent / "stray.bin").write_bytes(b"not used by the graph")
        return path

    monkeypatch.setattr(vitkit.export.checked_export, "export_onnx", export_with_external_data)
    model = random_model()
    folder = vitkit.save_pretrained(model, tmp_path / "weights")
    target = tmp_path / "out" / "m.onnx"
    assert main(["export", str(folder), "--out", str(target)]) == 0
    assert sorted(p.name for p in target.parent.iterdir()) == ["m.onnx", "m.onnx.data"]
    assert check_onnx(model, target) <= TOL
    capsys.readouterr()
    assert main(["export", str(folder), "--out", str(tmp_path / "out")]) != 0
    err = capsys.readouterr().err
    says(err, f"--out {tmp_path / 'out'}", "is a folder",
         f"--out {tmp_path / 'out' / 'model.onnx'}")
    assert "Traceback" not in err
    assert main(["export", str(folder), "--out", str(tmp_path / "out" / "model.onnx")]) == 0


def test_cli_export_to_a_path_ending_in_a_separator_names_a_file_in_that_folder(
        tmp_path, capsys):
    """`--out DIR/` means a folder even before DIR exists: refused, naming a file in it
    (int8's own name with --int8), and no file DIR is written; that file then works."""
    folder = vitkit.save_pretrained(random_model(), tmp_path / "weights")
    target = tmp_path / "onnx"
    for flags, name in (([], "model.onnx"), (["--int8"], "model.int8.onnx")):
        assert main(["export", str(folder), *flags, "--out", f"{target}{os.sep}"]) != 0
        err = capsys.readouterr().err
        suggested = target / name
        says(err, f"--out {target}{os.sep}", "folder", f"--out {suggested}")
        assert "Traceback" not in err
        assert not target.exists()
    assert main(["export", str(folder), "--out", str(target / "model.onnx")]) == 0
    assert (target / "model.onnx").is_file()
    assert f"wrote {target / 'model.onnx'}" in capsys.readouterr().out


def test_a_dynamic_graph_refuses_a_size_the_patch_does_not_divide(tmp_path):
    """The dynamic-size graph of a patch stem refuses an 18x16 image, as the model does,
    rather than crop it silently (its Reshape names the blocks it needs); multiples of the
    patch still equal the model."""
    model = random_model("Ti/4", img_size=16, depth=1, dynamic_img_size=True)
    path = export_onnx(model, tmp_path / "m.onnx")
    images = torch.randn(1, 3, 18, 16)
    with pytest.raises(vitkit.InputError) as info:
        model(images)
    says(str(info.value), "18x16", "patch stem", "multiple of 4", "16x16")
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    with pytest.raises(Exception, match=r"\{1,3,4,4,4,4\}"):
        session.run(None, {name: images.numpy()})
    for size in [(16, 16), (20, 24)]:
        images = torch.randn(2, 3, *size)
        with torch.no_grad():
            expected = model(images)
        assert (run_onnx(path, images) - expected).abs().max() <= TOL, size


def test_a_hub_repository_exports_to_a_file_name_every_system_takes() -> None:
    assert default_output_path("hf-hub:me/tiny-vit") == Path("me-tiny-vit.onnx")
    assert default_output_path("hf-hub:me/tiny-vit@v1", int8=True) == \
        Path("me-tiny-vit-v1.int8.onnx")
    assert default_output_path("B/16-i21k") == Path("B-16-i21k.onnx")
