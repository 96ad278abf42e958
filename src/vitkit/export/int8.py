"""Int8 ONNX graphs: an exported graph with ONNX Runtime's dynamic int8 quantisation (int8
weights of MatMul/Gemm, activations quantised per batch), and its check against the float
model. On the CPU it runs several times faster than fp32 eager torch, most of all at batch 1
(figures per machine: benchmarks/README.md; `vitkit.inference.quantize` holds the eager int8
engines)."""

from __future__ import annotations

import importlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from vitkit.errors import ExportError
from vitkit.export.onnx import (
    check_float_graph,
    export_onnx,
    onnx_and_torch_outputs,
    quiet_onnxruntime,
)
from vitkit.model.vit import VisionTransformer
from vitkit.runtime import cpu_model_and_flags
from vitkit.tasks import task_of

QUANTIZED_OPS = ("MatMul", "Gemm")  # the convolutions (patch embedding, stems) stay float
INT8_RTOL = 0.1  # int8 logits may differ from fp32 by up to this fraction of the logits' range


def quantize_onnx_int8(source: str | Path, target: str | Path,
                       metadata: dict[str, Any] | None = None) -> Path:
    """Write `source` (an fp32 ONNX file) to `target` with ONNX Runtime's dynamic int8
    quantisation (int8 weights of MatMul/Gemm, per-tensor, over 7 bits on a CPU without VNNI;
    convolutions stay float), metadata_props kept and `metadata` added (JSON values)."""
    try:
        quantization = importlib.import_module("onnxruntime.quantization")
        onnx = importlib.import_module("onnx")
    except ImportError as exc:
        raise ExportError("int8 ONNX export needs onnx and onnxruntime, which are not "
                          "installed: pip install 'vitkit[export]'") from exc
    target = Path(target)
    # Without VNNI, ONNX Runtime's x86 int8 kernels add uint8 x int8 products in pairs in 16
    # bits (`vpmaddubsw`), which saturates on 8-bit weights; ONNX Runtime's advice for such
    # CPUs is 7-bit weights (`reduce_range`), which brings the logits several times closer
    # to fp32 there (vitkit.inference.int8_ranges draws the same line for torch's int8).
    flags = cpu_model_and_flags()[1]
    seven_bit = "avx2" in flags and not {"avx512_vnni", "avx_vnni"} & flags
    with quiet_onnxruntime():  # a line per tensor, and "please run pre-processing" advice
        # MatMul/Gemm only: ONNX Runtime's default also makes each Conv a ConvInteger, which
        # on a conv stem moves the logits an order of magnitude further from fp32 than the
        # quantised linears alone do.
        quantization.quantize_dynamic(str(source), str(target),
                                      weight_type=quantization.QuantType.QInt8,
                                      op_types_to_quantize=list(QUANTIZED_OPS),
                                      reduce_range=seven_bit)
    original = onnx.load(str(source), load_external_data=False)
    proto = onnx.load(str(target), load_external_data=False)
    present = {entry.key for entry in proto.metadata_props}
    for entry in original.metadata_props:
        if entry.key not in present:
            proto.metadata_props.add(key=entry.key, value=entry.value)
    added = {"quantization": "dynamic int8 (onnxruntime.quantization.quantize_dynamic)",
             "weight_bits": 7 if seven_bit else 8, **(metadata or {})}
    for key, value in added.items():
        proto.metadata_props.add(key=key, value=json.dumps(value))
    onnx.save(proto, str(target))
    return target


def export_onnx_int8(model: VisionTransformer, path: str | Path, *, check_float: bool = True,
                     **kwargs: Any) -> Path:
    """`export_onnx` (`kwargs` go to it), then ONNX Runtime's dynamic int8 quantisation of the
    graph, written to `path` (the float graph is a temporary file beside it).

    With `check_float` the float graph is first checked against `model` in onnxruntime
    (`check_float_graph`), so that an exporter error cannot hide inside int8's looser
    tolerance; raises ExportError. The result goes into the file's metadata as "fp32_check".
    """
    path = Path(path)
    float_path = path.with_name(path.name + ".fp32.tmp")
    try:
        export_onnx(model, float_path, **kwargs)
        metadata = {}
        if check_float:
            try:
                metadata["fp32_check"] = check_float_graph(model, float_path, **kwargs)
            except ExportError as exc:
                raise ExportError(f"before int8 quantisation, {exc}") from exc
        return quantize_onnx_int8(float_path, path, metadata)
    finally:
        float_path.unlink(missing_ok=True)


def check_onnx_int8(model: VisionTransformer, path: str | Path,
                    batch_sizes: Sequence[int] = (1, 3),
                    sizes: Sequence[int | tuple[int, int]] | None = None,
                    rtol: float = INT8_RTOL, fix: str = "export without --int8"
                    ) -> tuple[float, float]:
    """Compare an int8 ONNX file with the float `model` on random inputs.

    Passes when the max abs logit difference is at most `rtol` times the range (max - min)
    of the float logits (a regression model: of its values), and every image whose float
    top-1 margin over the runner-up exceeds twice that difference keeps its top-1 class
    (those cannot flip within the error). Returns (max abs difference, top-1 agreement over
    all images); raises ExportError, whose message ends with `fix`.
    """
    outputs = task_of(model).onnx_output  # "logits", or a regression model's "values"
    expected_all, got_all = [], []
    for expected, got, _ in onnx_and_torch_outputs(model, path, batch_sizes, sizes or ()):
        expected_all.append(expected)
        got_all.append(got)
    expected, got = torch.cat(expected_all), torch.cat(got_all)
    diff = (got - expected).abs().max().item()
    spread = (expected.max() - expected.min()).item()
    if not diff <= rtol * spread:
        raise ExportError(f"the int8 ONNX {outputs} differ from the float model's by "
                          f"{diff:.3g}, above {rtol:g} x their range {spread:.3g}; the "
                          f"quantised graph is not faithful: {fix}.")
    agree = got.argmax(-1) == expected.argmax(-1)
    if expected.shape[-1] > 1:
        top2 = expected.topk(2, dim=-1).values
        clear = (top2[:, 0] - top2[:, 1]) > 2 * diff
        if not agree[clear].all():
            raise ExportError("the int8 ONNX graph changes the top-1 class of an input whose "
                              f"float margin exceeds the quantisation error: {fix}.")
    return diff, agree.float().mean().item()
