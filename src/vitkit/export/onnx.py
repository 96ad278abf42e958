"""Export a ViT to ONNX (dynamic batch, optionally dynamic resolution) and check it with
onnxruntime against PyTorch (`vitkit.export.int8` quantises the graph).

Exporter: torch's TorchScript-based exporter (`torch.onnx.export(..., dynamo=False)`). Both it
and the dynamo exporter give the same outputs (to float32 rounding, plain and hybrid models),
but the TorchScript one exports several times faster, and in seconds rather than minutes for a
ResNet backbone with a dynamic height and width (torch.export's symbolic-shape reasoning is the
slow part); it also needs no onnxscript.

The task goes with the graph: a regression model's graph ends in the de-standardisation
(`output * target_std + target_mean`, the training targets' statistics), so its output
"values" is in the targets' units; classification and multi-label graphs output "logits" as
the model does. The metadata says which ("task", "output").

Dynamic resolution is the model's own: export traces a model with a dynamic image size
(`VisionTransformer.set_dynamic_img_size`), whose forward fits the positions to each input's
token grid and whose stem pads with sizes traced as tensors, so the graph follows the input.
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import json
import logging
import math
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from vitkit.errors import ExportError, VitkitError
from vitkit.model.vit import VisionTransformer

FORMATS = ("onnx",)
INPUT_NAME, OUTPUT_NAME, VALUES_NAME = "images", "logits", "values"
MIN_OPSET = 14  # scaled_dot_product_attention
CHECK_BATCHES = (1, 3)  # batch sizes an exported graph is checked at (the export traces 2)
CHECK_ATOL = 1e-4  # a float graph's outputs within this of PyTorch's (see `float_tolerance`)
# a float graph's check (`check_float_graph`: an export, the int8 engine, a benchmark) also
# allows this fraction of the outputs' largest magnitude: float32 rounding grows with the
# logits, which reach about 100 on a random B/16 head
FLOAT_RTOL = 1e-5
INSTALL_HINT = "pip install 'vitkit[export]'"
ORT_ERROR, ORT_WARNING = 3, 2  # onnxruntime's log severities (its default: warning)


def require(module: str) -> Any:
    """Import onnx / onnxruntime lazily, saying how to install them when they are missing."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ExportError(f"ONNX export needs the '{module}' package, which is not installed: "
                          f"{INSTALL_HINT}") from exc


@contextlib.contextmanager
def quiet_onnxruntime() -> Iterator[Any]:
    """onnxruntime with its own messages silenced (errors still raise): its native logger at
    errors only, and the quantizer's Python logging and warnings (it logs through the root
    logger, a line per tensor). Yields onnxruntime."""
    ort = require("onnxruntime")
    disabled = logging.root.manager.disable
    ort.set_default_logger_severity(ORT_ERROR)
    logging.disable(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield ort
    finally:
        logging.disable(disabled)
        ort.set_default_logger_severity(ORT_WARNING)


def quiet_session(path: str | Path) -> Any:
    """An onnxruntime CPU session of `path` that logs errors only."""
    ort = require("onnxruntime")
    options = ort.SessionOptions()
    options.log_severity_level = ORT_ERROR
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


# -- the task's output ----------------------------------------------------------------------------
def destandardisation(model: VisionTransformer) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(target_std, target_mean) that turn a regression model's outputs into the targets'
    units; None for other tasks (their graphs output logits)."""
    from vitkit.tasks import task_of

    return task_of(model).output_scaling(model.config.num_classes)


class Destandardised(torch.nn.Module):
    """A regression model whose outputs are de-standardised inside the graph."""

    def __init__(self, model: VisionTransformer, std: torch.Tensor, mean: torch.Tensor) -> None:
        super().__init__()
        self.model = model
        param = next(model.parameters())
        self.register_buffer("std", std.to(param.device), persistent=False)
        self.register_buffer("mean", mean.to(param.device), persistent=False)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.model(images) * self.std + self.mean


def exported_outputs(model: VisionTransformer, outputs: torch.Tensor) -> torch.Tensor:
    """What the exported graph gives for `model`'s outputs: de-standardised for regression,
    unchanged otherwise."""
    stats = destandardisation(model)
    if stats is None:
        return outputs
    std, mean = stats
    return outputs * std.to(outputs.device) + mean.to(outputs.device)


def _output_description(model: VisionTransformer) -> dict[str, Any]:
    from vitkit.tasks import task_of

    task = task_of(model)
    return {"name": task.onnx_output, "num_classes": model.config.num_classes,
            "task": task.kind, "meaning": task.onnx_meaning, "names": task.names}


# -- export -------------------------------------------------------------------------------------
def onnx_metadata(model: VisionTransformer, dynamic_batch: bool,
                  dynamic_size: bool) -> dict[str, str]:
    """What a consumer needs beside the graph: preprocessing, class names, config, the task
    (kind, output names, target standardisation), what the output is, and the tokens merged
    per layer (0: no token merging) (JSON)."""
    from vitkit.preprocess import preprocess_for
    from vitkit.tasks import task_of
    from vitkit.version import __version__

    config = model.config
    preprocess = preprocess_for(model)
    return {
        "vitkit_version": __version__,
        "preprocess": json.dumps(preprocess.to_dict()),
        "class_names": json.dumps(model.class_names),
        "model_config": json.dumps(config.to_dict()),
        "input": json.dumps({"name": INPUT_NAME, "layout": "NCHW", "dtype": "float32",
                             "img_size": list(config.img_size), "dynamic_batch": dynamic_batch,
                             "dynamic_size": dynamic_size,
                             "size_multiple_of": model.patch_embed.size_step if dynamic_size
                             else None}),
        "output": json.dumps(_output_description(model)),
        "task": json.dumps(task_of(model).spec.to_dict()),
        "merge_tokens": json.dumps(getattr(model, "merge_r", 0)),
    }


def export_onnx(model: VisionTransformer, path: str | Path, *, dynamic_batch: bool = True,
                dynamic_size: bool | None = None, opset: int | None = None) -> Path:
    """Write `model` to an ONNX file at `path` (input "images" NCHW float32, output "logits";
    for a regression model "values", de-standardised in the graph).

    The height and width are dynamic when the model's image size is
    (`config.dynamic_img_size`): the file then takes every size the model does. With
    `dynamic_size=True` the model's dynamic image size is switched on first (in place);
    False exports the fixed size. Preprocessing, class names and the config go into the
    file's metadata_props as JSON strings. Puts `model` in eval mode. A token-merging model
    (`apply_token_merging`) exports at its fixed image size: each layer's merge count is
    fixed by the token count.
    """
    onnx = require("onnx")
    merging = getattr(model, "merge_r", 0)  # set by vitkit.inference.apply_token_merging
    if merging and (dynamic_size or (dynamic_size is None and model.config.dynamic_img_size)):
        raise ExportError("a token-merging model exports at its image size only (each "
                          "layer's merge count follows from the token count): export without "
                          "--dynamic-size (dynamic_size=False)")
    if opset is not None and opset < MIN_OPSET:
        raise ExportError(f"opset {opset} is too old: the attention (scaled_dot_product_attention)"
                          f" needs opset {MIN_OPSET} or newer; leave --opset out for torch's "
                          "default")
    if dynamic_size:
        try:
            model.set_dynamic_img_size()
        except VitkitError as exc:
            raise ExportError(f"{exc} Export without --dynamic-size.") from exc
    dynamic_size = model.config.dynamic_img_size if dynamic_size is None else dynamic_size
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    model = model.eval()
    stats = destandardisation(model)
    graph = model if stats is None else Destandardised(model, *stats)
    output_name = OUTPUT_NAME if stats is None else VALUES_NAME
    dims = {0: "batch"} if dynamic_batch else {}
    in_dims = {**dims, **({2: "height", 3: "width"} if dynamic_size else {})}
    dynamic_axes = {INPUT_NAME: in_dims, output_name: dims} if in_dims else None
    param = next(model.parameters())
    if param.dtype != torch.float32:
        raise ExportError(f"the model's weights are {param.dtype}; export takes float32 models: "
                          "call model.float() first")
    example = torch.zeros(2 if dynamic_batch else 1, model.config.in_chans,
                          *model.config.img_size, device=param.device)
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation notice
            torch.onnx.export(graph, (example,), str(path), dynamo=False,
                              input_names=[INPUT_NAME], output_names=[output_name],
                              dynamic_axes=dynamic_axes, opset_version=opset)
    except (RuntimeError, ValueError) as exc:
        hint = f" at opset {opset} (leave the opset out for torch's default)" if opset else ""
        raise ExportError(f"torch.onnx.export failed{hint}: {exc}") from exc
    proto = onnx.load(str(path), load_external_data=False)
    for key, value in onnx_metadata(model, dynamic_batch, dynamic_size).items():
        entry = proto.metadata_props.add()
        entry.key, entry.value = key, value
    onnx.save(proto, str(path))
    return path


def external_data_files(path: str | Path) -> list[str]:
    """The files, beside the graph at `path`, that hold its tensors stored outside it (a
    graph over protobuf's 2 GiB limit), as their names relative to its folder."""
    onnx = require("onnx")
    from onnx.external_data_helper import ExternalDataInfo, uses_external_data

    proto = onnx.load(str(path), load_external_data=False)
    return sorted({ExternalDataInfo(tensor).location for tensor in proto.graph.initializer
                   if uses_external_data(tensor)})


def read_metadata(path: str | Path) -> dict[str, Any]:
    """The metadata_props of an exported file, JSON values decoded."""
    onnx = require("onnx")
    proto = onnx.load(str(path), load_external_data=False)
    out: dict[str, Any] = {}
    for entry in proto.metadata_props:
        try:
            out[entry.key] = json.loads(entry.value)
        except json.JSONDecodeError:
            out[entry.key] = entry.value
    return out


# -- check --------------------------------------------------------------------------------------
def float_tolerance(model: VisionTransformer) -> float:
    """How far a float graph's outputs may be from PyTorch's: CHECK_ATOL, times the largest
    target std for a regression model (its graph outputs the targets' units)."""
    stats = destandardisation(model)
    return CHECK_ATOL * (1.0 if stats is None else max(1.0, stats[0].max().item()))


def default_check_sizes(model: VisionTransformer) -> list[tuple[int, int]]:
    """Two other resolutions for checking a dynamic-size export: larger, and non-square."""
    (height, width), patch = model.config.img_size, model.config.patch_size
    return [(height + 2 * patch, width + 2 * patch), (max(height - patch, patch), width)]


def onnx_and_torch_outputs(model: VisionTransformer, path: str | Path,
                            batch_sizes: Sequence[int], sizes: Sequence[int | tuple[int, int]]
                            ) -> Iterator[tuple[torch.Tensor, torch.Tensor, str]]:
    """(PyTorch outputs, onnxruntime outputs, "batch B at HxW") on seeded random inputs, for
    each batch size at the model's resolution and at each of `sizes`; the reference for
    another size is a copy of `model` with a fixed size, after
    `set_image_size(size, mode="bilinear")`. PyTorch's outputs are what the graph gives
    (`exported_outputs`: de-standardised for regression). Puts `model` in eval mode."""
    session = quiet_session(path)
    input_name = session.get_inputs()[0].name
    model.eval()
    device = next(model.parameters()).device
    native = tuple(model.config.img_size)
    generator = torch.Generator().manual_seed(0)
    for size in [native, *sizes]:
        hw = (size, size) if isinstance(size, int) else tuple(size)
        reference = model
        if hw != native:
            reference = copy.deepcopy(model)
            reference.set_dynamic_img_size(False)
            reference.set_image_size(hw, mode="bilinear")
        for batch in batch_sizes:
            images = torch.randn(batch, model.config.in_chans, *hw, generator=generator)
            with torch.no_grad():
                expected = exported_outputs(model, reference(images.to(device)).float()).cpu()
            try:
                got = session.run(None, {input_name: images.numpy()})[0]
            except Exception as exc:  # onnxruntime raises its own exception types
                raise ExportError(f"onnxruntime could not run {path} on a batch of {batch} at "
                                  f"{hw[0]}x{hw[1]}: {exc}. Export with a dynamic batch (and "
                                  "--dynamic-size for other resolutions).") from exc
            yield expected, torch.from_numpy(got), f"batch {batch} at {hw[0]}x{hw[1]}"


def check_onnx(model: VisionTransformer, path: str | Path, batch_sizes: Sequence[int] = (1, 3),
               sizes: Sequence[int | tuple[int, int]] | None = None,
               atol: float = 1e-4, rtol: float = 0.0) -> float:
    """Run the ONNX file with onnxruntime on random inputs and compare with PyTorch.

    Checks each batch size at the model's resolution and at each of `sizes`; the reference
    for another size is a copy of `model` with a fixed size, after
    `set_image_size(size, mode="bilinear")`. Returns the max abs difference; raises
    ExportError above `atol` + `rtol` x the largest magnitude of PyTorch's outputs (float32
    rounding grows with the logits). Puts `model` in eval mode.
    """
    worst, where, scale = 0.0, "", 0.0
    for expected, got, place in onnx_and_torch_outputs(model, path, batch_sizes, sizes or ()):
        diff = (got - expected).abs().max().item()
        scale = max(scale, expected.abs().max().item())
        if not math.isfinite(diff) or diff > worst:
            worst, where = diff, place
        if not math.isfinite(diff):
            break
    tolerance = atol + rtol * scale
    if not worst <= tolerance:
        bar = f"{atol:g}" if not rtol else \
            f"{tolerance:.3g} ({atol:g} + {rtol:g} x the outputs' largest magnitude {scale:.3g})"
        raise ExportError(f"the ONNX outputs differ from PyTorch by {worst:.3g} ({where}), "
                          f"above the tolerance {bar}; the export is not faithful.")
    return worst


def check_float_graph(model: VisionTransformer, path: str | Path, *,
                      dynamic_batch: bool = True, dynamic_size: bool | None = None,
                      **_: Any) -> dict[str, Any]:
    """Check the float graph at `path`, exported from `model` with `dynamic_batch` and
    `dynamic_size` as `export_onnx` takes them, before it runs or is quantised (an int8
    export, a benchmark): `check_onnx` within `float_tolerance` + FLOAT_RTOL x the outputs'
    largest magnitude, at batch 1 and 3 (1 for a fixed batch) and, for a dynamic-size graph,
    at `default_check_sizes`. Returns {"max_abs_diff", "checked_at", "tolerance"}; raises
    ExportError."""
    dynamic_size = model.config.dynamic_img_size if dynamic_size is None else dynamic_size
    sizes = default_check_sizes(model) if dynamic_size else []
    batches = CHECK_BATCHES if dynamic_batch else (1,)
    atol = float_tolerance(model)
    diff = check_onnx(model, path, batch_sizes=batches, sizes=sizes, atol=atol, rtol=FLOAT_RTOL)
    where = ", ".join(f"{h}x{w}" for h, w in [model.config.img_size, *sizes])
    absolute = "1e-4" if atol == CHECK_ATOL else \
        f"{_short(atol)} (1e-4 x the targets' largest std {atol / CHECK_ATOL:.3g})"
    return {"max_abs_diff": diff, "checked_at": f"batch {', '.join(map(str, batches))} at {where}",
            "tolerance": f"{absolute} + {_short(FLOAT_RTOL)} x the outputs' largest magnitude"}


def _short(number: float) -> str:
    """1e-4 for 0.0001."""
    mantissa, exponent = f"{number:.1e}".split("e")
    return f"{mantissa.removesuffix('.0')}e{int(exponent)}"
