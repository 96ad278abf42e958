"""int8 inference: a trained digits model keeps its top-1 under dynamic int8 (eager torch and
ONNX Runtime), composes with token merging, and a missing engine says how to get one."""

import copy
import json
import shutil
import sys

import numpy as np
import pytest
import torch
from torch import nn

from vitkit import ConfigError, ExportError, apply_token_merging, load_pretrained
from vitkit.cli import main
from vitkit.data.sources import open_source
from vitkit.export import check_onnx_int8, export_onnx_int8, read_metadata
from vitkit.inference.int8_engines import available_engines
from vitkit.inference.quantize import quantize_int8

# The shared digits run (conftest.py: the README's digits model, ~88% test top-1), enough for
# agreement to mean something. int8 must keep the float top-1 on >= 97% of the test images.
MIN_AGREEMENT = 0.97


def says(text: str, *parts: str) -> None:
    """Assert that a message names each of `parts` (case-insensitive), showing it if not."""
    missing = [part for part in parts if part.lower() not in text.lower()]
    assert not missing, f"{missing} not in message: {text!r}"


@pytest.fixture(scope="module")
def digits_test() -> tuple[torch.Tensor, torch.Tensor]:
    test = open_source("digits")[1]
    return (test.images.float() / 255 - 0.5) / 0.5, test.labels  # the recipe's mean/std


def _logits(model: nn.Module, images: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return model(images)


def test_int8_keeps_the_top1_of_a_trained_model(digits_run, digits_test):
    images, labels = digits_test
    model = load_pretrained(digits_run).eval()
    quantized = quantize_int8(model)
    linears = [m for m in quantized.modules() if type(m) is nn.Linear]
    assert not linears  # every Linear was replaced by its int8 version
    assert any(type(m) is nn.Linear for m in model.modules())  # the original is untouched
    fp32, int8 = _logits(model, images), _logits(quantized, images)
    agreement = (fp32.argmax(1) == int8.argmax(1)).double().mean().item()
    assert agreement >= MIN_AGREEMENT
    assert 0 < (fp32 - int8).abs().max() < 0.1 * (fp32.max() - fp32.min())
    assert quantized.config == model.config  # predicts and evaluates like the original
    accuracy = [(logits.argmax(1) == labels).double().mean().item() for logits in (fp32, int8)]
    assert abs(accuracy[0] - accuracy[1]) <= 0.02  # test top-1 within 2 points


def test_int8_composes_with_token_merging(digits_run, digits_test):
    images, _ = digits_test
    model = apply_token_merging(load_pretrained(digits_run).eval(), 1)
    merged = _logits(model, images)
    quantized = quantize_int8(model)
    both = _logits(quantized, images)
    assert (merged.argmax(1) == both.argmax(1)).double().mean() >= MIN_AGREEMENT
    with torch.inference_mode():  # quantising kept the merging
        assert quantized.forward_features(images).shape[1] == 17 - 4


def test_a_missing_int8_engine_says_how_to_install_it(monkeypatch, digits_run):
    model = load_pretrained(digits_run)
    monkeypatch.setitem(sys.modules, "torchao", None)
    monkeypatch.setitem(sys.modules, "torchao.quantization", None)
    with pytest.raises(ConfigError) as info:
        quantize_int8(model, "torchao")
    says(str(info.value), "torchao", "pip install 'vitkit[int8]'", "engine 'torch'")
    assert quantize_int8(model, "torch") is not model  # the advice works
    assert "torchao" not in available_engines()  # and auto does not measure it


def test_an_unknown_int8_engine_is_refused(digits_run):
    """An unknown engine is refused, naming it and the engines there are; a named one runs."""
    model = load_pretrained(digits_run)
    with pytest.raises(ConfigError) as info:
        quantize_int8(model, "tensorrt")
    says(str(info.value), "tensorrt", "torch", "onednn", "onnxruntime", "torchao", "'auto'")
    assert quantize_int8(model, "torch") is not model  # one of those named


def test_torchao_engine_agrees_when_installed(digits_run, digits_test):
    pytest.importorskip("torchao")
    images, _ = digits_test
    model = load_pretrained(digits_run).eval()
    fp32, int8 = _logits(model, images), _logits(quantize_int8(model, "torchao"), images)
    assert (fp32.argmax(1) == int8.argmax(1)).double().mean() >= MIN_AGREEMENT


def test_int8_onnx_runs_in_onnxruntime_and_agrees(digits_run, digits_test, tmp_path):
    ort = pytest.importorskip("onnxruntime")
    images, _ = digits_test
    model = load_pretrained(digits_run).eval()
    path = export_onnx_int8(model, tmp_path / "digits.int8.onnx")
    assert not list(tmp_path.glob("*.tmp"))  # the float graph was temporary
    float_path = tmp_path / "digits.onnx"
    from vitkit.export import export_onnx

    export_onnx(model, float_path)
    assert path.stat().st_size < 0.5 * float_path.stat().st_size  # int8 weights
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = torch.from_numpy(session.run(None, {"images": images.numpy()})[0])
    fp32 = _logits(model, images)
    assert (got.argmax(1) == fp32.argmax(1)).double().mean() >= MIN_AGREEMENT
    diff, agreement = check_onnx_int8(model, path)
    assert diff > 0 and 0 <= agreement <= 1
    metadata = read_metadata(path)
    assert metadata["preprocess"]["mean"] == [0.5] and "quantization" in metadata


def test_check_onnx_int8_catches_a_graph_of_another_model(digits_run, tmp_path):
    model = load_pretrained(digits_run).eval()
    path = export_onnx_int8(model, tmp_path / "a.onnx")
    other = load_pretrained(digits_run).eval()
    with torch.no_grad():
        other.head.weight.mul_(-1)  # the logits change sign: top-1 flips everywhere
    with pytest.raises(ExportError) as info:
        check_onnx_int8(other, path)
    says(str(info.value), "int8 ONNX", "without --int8")


def test_cli_eval_predict_and_export_take_int8_and_merge_tokens(digits_run, tmp_path, capsys):
    out = tmp_path / "eval"
    assert main(["eval", str(digits_run), "--out", str(out), "--int8", "--merge-tokens", "1"]) == 0
    text = capsys.readouterr().out
    import json

    report = json.loads((out / "eval.json").read_text())
    assert report["int8"] in available_engines()  # the engine measured fastest, merging too
    assert f"int8 ({report['int8']}), 1 tokens merged per layer: top-1" in text
    assert report["merge_tokens"] == 1 and report["top1"] > 0.5

    images, _ = open_source("digits")[1].images[:3], None
    folder = tmp_path / "images"
    folder.mkdir()
    from PIL import Image

    for i, image in enumerate(images):
        Image.fromarray(image[0].numpy()).save(folder / f"{i}.png")
    assert main(["predict", str(digits_run), str(folder), "--int8", "--merge-tokens", "2",
                 "--topk", "1"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    # one line per image, then the digits model's note on what it reads
    # (inference/test_predict.py)
    assert lines[-1].startswith("note: ") and "light strokes" in lines[-1]
    assert len(lines[:-1]) == 3 and all("%" in line for line in lines[:-1])

    target = tmp_path / "m.int8.onnx"
    assert main(["export", str(digits_run / "best.pt"), "--int8", "--out", str(target)]) == 0
    text = capsys.readouterr().out
    assert target.is_file() and "int8" in text and text.rstrip().endswith("OK")
    assert np.isfinite(target.stat().st_size)


def test_cli_refuses_negative_merge_tokens(digits_run, capsys):
    with pytest.raises(SystemExit):
        main(["eval", str(digits_run), "--merge-tokens", "-1"])
    says(capsys.readouterr().err, "--merge-tokens", ">= 0", "-1")


def test_cli_exports_a_merging_graph_at_the_models_size(digits_run, tmp_path, capsys):
    checkpoint = tmp_path / "best.pt"
    shutil.copy(digits_run / "best.pt", checkpoint)
    assert main(["export", str(checkpoint), "--merge-tokens", "2", "--int8"]) == 0
    out = capsys.readouterr().out
    target = tmp_path / "best.merge2.int8.onnx"  # beside the weights, named for both
    assert target.is_file() and f"wrote {target}" in out and "merges 2 tokens per layer" in out
    assert out.rstrip().endswith("OK") and read_metadata(target)["merge_tokens"] == 2
    assert main(["export", str(checkpoint), "--merge-tokens", "2", "--dynamic-size"]) == 2
    err = capsys.readouterr().err
    says(err, "image size only", "without --dynamic-size")
    assert main(["export", str(checkpoint), "--merge-tokens", "2"]) == 0  # the fix
    assert (tmp_path / "best.merge2.onnx").is_file() and capsys.readouterr().out.rstrip() \
        .endswith("OK")



def _dynamic_int8_reference(layer: nn.Module, x: torch.Tensor, bits: int) -> torch.Tensor:
    """Dynamic int8 written out: `x` per-tensor affine over [0, 2^bits - 1] (its range widened
    to hold 0), the layer's own int8 weights (per tensor or per channel); integer products
    summed in float64."""
    qmax = 2**bits - 1
    low, high = min(x.min().item(), 0.0), max(x.max().item(), 0.0)
    scale = (high - low) / qmax
    zero_point = min(max(round(-low / scale), 0), qmax)
    xq = (torch.round(x.double() / scale) + zero_point).clamp(0, qmax) - zero_point
    weight = layer.weight()
    if _per_channel(layer):
        weight_scale = weight.q_per_channel_scales().double()
    else:
        weight_scale = torch.tensor(weight.q_scale(), dtype=torch.float64)
    product = xq @ weight.int_repr().double().t()
    return (product * scale * weight_scale + layer.bias().double()).float()


def _per_channel(layer: nn.Module) -> bool:
    return layer.weight().qscheme() in (torch.per_channel_affine, torch.per_channel_symmetric)


def _with_flags(monkeypatch, flags: set[str]) -> None:
    import vitkit.inference.int8_ranges as int8_ranges

    monkeypatch.setattr(int8_ranges, "cpu_model_and_flags", lambda: ("cpu", frozenset(flags)))


VNNI, AVX2 = {"avx2", "avx512f", "avx512_vnni"}, {"avx2", "avx512f"}


@pytest.mark.parametrize("engine", ["torch", "onednn"])
@pytest.mark.parametrize("flags", [VNNI, AVX2], ids=["vnni", "avx2"])
def test_int8_quantises_activations_over_eight_bits(monkeypatch, engine, flags):
    """The scheme's module computes 8-bit dynamic quantisation exactly as written out, where
    torch's own module computes the 7-bit one; the inputs put uint8 activations at 255 next to
    weights at their ends, where a 16-bit pair sum would saturate."""
    from torch.ao.nn.quantized.dynamic import Linear as DynamicInt8Linear

    from vitkit.inference.int8_ranges import FullRangeInt8Linear, int8_scheme

    if engine not in available_engines():
        pytest.skip(f"this torch build has no {engine} quantized engine")
    real = int8_scheme()
    if flags is VNNI and real != "8-bit":
        pytest.skip("no AVX512-VNNI here: 8-bit weights with 8-bit activations could saturate")
    if real == "torch":
        pytest.skip("not an x86 CPU with AVX2: vitkit keeps torch's own int8 here")
    _with_flags(monkeypatch, flags)
    torch.manual_seed(0)
    float_model = nn.Sequential(nn.Linear(64, 32)).eval()
    with torch.no_grad():
        float_model[0].weight.copy_(torch.randn(32, 64).sign() * torch.rand(32, 1))
    x = torch.randn(40, 64) * 3 + 1
    x[:, ::2] = x.max()  # quantised to 255
    quantized = quantize_int8(float_model, engine)[0]
    assert type(quantized) is FullRangeInt8Linear
    weights = quantized.weight().int_repr()
    if flags is AVX2:  # 7 bits per output channel, symmetric, the range used
        assert _per_channel(quantized)
        assert (quantized.weight().q_per_channel_zero_points() == 0).all()
        assert weights.min() == -64 and weights.max() == 63
    else:
        assert weights.abs().max() >= 127
    seven_bit = DynamicInt8Linear(64, 32)  # the same packed weights in torch's own module
    seven_bit._packed_params = quantized._packed_params
    with torch.no_grad():
        full, reduced = quantized(x), seven_bit(x)
    eight_ref, seven_ref = (_dynamic_int8_reference(quantized, x, bits) for bits in (8, 7))
    step = (eight_ref - seven_ref).abs().max().item()
    assert (reduced - seven_ref).abs().max().item() < 0.01 * step  # the reference is right
    assert (full - eight_ref).abs().max().item() < 0.01 * step  # and 8 bits are what runs


@pytest.mark.parametrize("flags, scheme, words", [
    (VNNI, "8-bit", "8-bit activations and weights"),
    (AVX2, "7-bit weights", "8-bit activations, 7-bit weights per channel"),
    (set(), "torch", "torch's 7-bit activations"),
    ({"neon", "asimd"}, "torch", "torch's 7-bit activations")])
def test_the_int8_scheme_follows_the_cpu_and_is_named(monkeypatch, flags, scheme, words):
    """Each CPU gets its scheme, and what eval, predict and benchmark print names it."""
    from torch.ao.nn.quantized.dynamic import Linear as DynamicInt8Linear

    from vitkit.inference.benchmark.engines import EngineOptions
    from vitkit.inference.int8_ranges import FullRangeInt8Linear, int8_scheme
    from vitkit.inference.precision import Precision

    _with_flags(monkeypatch, flags)
    assert int8_scheme() == scheme
    assert words in Precision("int8", "asked", "onednn").describe()
    assert words in EngineOptions(precision="int8", int8_engine="torch").describe()
    assert "bits" not in Precision("int8", "asked", "onnxruntime").describe()
    model = nn.Sequential(nn.Linear(8, 4)).eval()
    for engine in {"torch", "onednn"} & set(available_engines()):
        layer = quantize_int8(model, engine)[0]
        assert (type(layer) is FullRangeInt8Linear) is (scheme != "torch"), engine
        assert type(layer) in (FullRangeInt8Linear, DynamicInt8Linear)
        assert _per_channel(layer) is (scheme == "7-bit weights"), engine


def test_int8_keeps_a_trained_model_closer_to_fp32_than_torchs_seven_bits(digits_run, digits_test):
    """On the trained digits model, vitkit's schemes (those this CPU can run without
    saturating) follow the fp32 logits more closely than torch's 7-bit activations: under
    0.75x their mean error."""
    from vitkit.inference.int8_ranges import int8_scheme, quantize_linears

    here = int8_scheme()
    if here == "torch":
        pytest.skip("not an x86 CPU with AVX2: vitkit keeps torch's own int8 here")
    images, _ = digits_test
    model = load_pretrained(digits_run).eval()
    fp32 = _logits(model, images)
    schemes = ["8-bit", "7-bit weights"] if here == "8-bit" else ["7-bit weights"]
    error = {}
    for scheme in [*schemes, "torch"]:  # 8-bit weights only where they cannot saturate
        int8 = _logits(quantize_linears(copy.deepcopy(model), scheme), images)
        error[scheme] = (int8 - fp32).abs().mean().item()
    for scheme in schemes:
        assert error[scheme] < 0.75 * error["torch"], error


def test_onnxruntime_int8_runs_a_merging_model_as_torch_does(digits_run, digits_test):
    pytest.importorskip("onnxruntime")
    images, _ = digits_test
    model = apply_token_merging(load_pretrained(digits_run).eval(), 4)
    fp32 = _logits(model, images)
    int8 = _logits(quantize_int8(model, "onnxruntime"), images)
    assert (fp32.argmax(1) == int8.argmax(1)).double().mean() >= MIN_AGREEMENT
    assert (int8 - fp32).abs().max() <= 0.05 * (fp32.max() - fp32.min())


def test_an_int8_export_checks_its_float_graph_before_quantising(digits_run, tmp_path,
                                                                  unfaithful_exporter):
    pytest.importorskip("onnxruntime")
    model = load_pretrained(digits_run).eval()
    unchecked = export_onnx_int8(model, tmp_path / "unchecked.onnx", check_float=False)
    diff, agreement = check_onnx_int8(model, unchecked)  # int8's own check lets it through
    assert diff >= 0.5 * unfaithful_exporter and agreement > 0.9
    target = tmp_path / "checked.onnx"
    with pytest.raises(ExportError) as info:
        export_onnx_int8(model, target)
    says(str(info.value), "before int8 quantisation", "ONNX outputs differ from PyTorch", "0.05",
         "8x8", "tolerance", "0.0001", "1e-05")
    assert not target.exists() and not list(tmp_path.glob("*.tmp"))


@pytest.mark.parametrize("how", ["dynamic size", "fixed batch"])
def test_the_float_check_follows_the_graph_exported(digits_run, digits_test, tmp_path, how):
    """A model with a dynamic image size exported at its size (as the onnxruntime engine
    exports it) is checked at that size only; a fixed-batch graph at batch 1."""
    pytest.importorskip("onnxruntime")
    images, _ = digits_test
    model = load_pretrained(digits_run).eval()
    if how == "dynamic size":
        model.set_dynamic_img_size()
        engine = quantize_int8(model, "onnxruntime")
        fp32 = _logits(model, images)
        assert (fp32.argmax(1) == _logits(engine, images).argmax(1)).double().mean() >= \
            MIN_AGREEMENT
        path = export_onnx_int8(model, tmp_path / "m.onnx", dynamic_size=False)
        assert read_metadata(path)["fp32_check"]["checked_at"] == "batch 1, 3 at 8x8"
        path = export_onnx_int8(model, tmp_path / "m.onnx", dynamic_size=True)
        assert read_metadata(path)["fp32_check"]["checked_at"] == \
            "batch 1, 3 at 8x8, 12x12, 6x8"
    else:
        path = export_onnx_int8(model, tmp_path / "m.onnx", dynamic_batch=False)
        check = read_metadata(path)["fp32_check"]
        assert check["checked_at"] == "batch 1 at 8x8" and check["max_abs_diff"] <= 1e-4


def test_the_onnxruntime_engine_refuses_an_unfaithful_graph_and_auto_passes_it_by(
        digits_run, digits_test, unfaithful_exporter):
    pytest.importorskip("onnxruntime")
    images, _ = digits_test
    model = load_pretrained(digits_run).eval()
    with pytest.raises(ExportError) as info:
        quantize_int8(model, "onnxruntime")
    says(str(info.value), "onnxruntime int8 engine", "cannot run this model",
         "before int8 quantisation", "another int8 engine", "--int8-engine torch")
    fp32 = _logits(model, images)  # the fix, followed: torch's engine
    int8 = _logits(quantize_int8(model, "torch"), images)
    assert (fp32.argmax(1) == int8.argmax(1)).double().mean() >= MIN_AGREEMENT
    from vitkit.inference.int8_choice import choose_int8_engine

    engine, reason = choose_int8_engine(model, images[:8])  # every engine timed but that one
    assert engine in available_engines() and engine != "onnxruntime"
    says(reason, "onnxruntime not timed", "before int8 quantisation", "ONNX outputs differ",
         "0.05")
    assert not reason.endswith(".")
    assert "onnxruntime " not in reason.split(";")[0]  # no time measured for it


def test_cli_eval_and_export_refuse_an_unfaithful_graph_and_evals_fix_works(
        digits_run, tmp_path, capsys, unfaithful_exporter):
    pytest.importorskip("onnxruntime")
    out = tmp_path / "eval"
    assert main(["eval", str(digits_run), "--out", str(out), "--int8-engine", "onnxruntime"]) != 0
    err = capsys.readouterr().err
    says(err, "onnxruntime int8 engine", "cannot run this model", "--int8-engine torch")
    assert "Traceback" not in err
    assert main(["eval", str(digits_run), "--out", str(out), "--int8-engine", "torch"]) == 0
    assert json.loads((out / "eval.json").read_text())["int8"] == "torch"
    target = tmp_path / "m.int8.onnx"  # vitkit export --int8 refuses the graph and writes none
    assert main(["export", str(digits_run / "best.pt"), "--int8", "--out", str(target)]) != 0
    err = capsys.readouterr().err
    says(err, "before int8 quantisation", "ONNX outputs differ", "0.05")
    assert not target.exists() and not list(tmp_path.glob("*.tmp"))


# -- the int8 graph: what it quantises, and its checks ------------------------------------------

def test_onnx_int8_quantises_matmul_and_gemm_only(tmp_path):
    """As documented ("int8 MatMul/Gemm weights"): convolutions stay float, no ConvInteger
    (which moves a conv-stem model's logits far from fp32)."""
    onnx = pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    from vitkit import create_model

    torch.manual_seed(0)
    model = create_model("Ti/4", img_size=16, stem="conv", stem_channels=[16, 32], width=32,
                         depth=1, num_heads=2, mlp_dim=64, num_classes=3).eval()
    path = export_onnx_int8(model, tmp_path / "conv.int8.onnx")
    ops = {node.op_type for node in onnx.load(str(path)).graph.node}
    assert "MatMulInteger" in ops and "Conv" in ops
    assert "ConvInteger" not in ops


def test_onnxruntime_int8_of_a_dynamic_size_model_takes_other_sizes(digits_run, digits_test):
    pytest.importorskip("onnxruntime")
    from vitkit.errors import InputError

    model = load_pretrained(digits_run).eval()
    model.set_dynamic_img_size()
    int8 = quantize_int8(model, "onnxruntime")
    images = torch.nn.functional.interpolate(digits_test[0][:64], size=(16, 12),
                                             mode="bilinear")
    fp32 = _logits(model, images)
    got = _logits(int8, images)  # another size runs
    assert (got - fp32).abs().max() <= 0.05 * (fp32.max() - fp32.min())
    with pytest.raises(InputError) as info:  # refused, not cropped
        int8(images[..., :15, :])
    says(str(info.value), "15x12", "does not fit", "patch stem")

    merging = quantize_int8(apply_token_merging(copy.deepcopy(model), 2), "onnxruntime")
    with pytest.raises(InputError) as info:
        merging(images)
    says(str(info.value), "16x12", "onnxruntime int8 graph of 8x8", "token merging",
         "feed 8x8 images", "--int8-engine torch")
    torch_int8 = quantize_int8(apply_token_merging(copy.deepcopy(model), 2), "torch")
    assert _logits(torch_int8, images).shape == (64, 10)  # the advice
