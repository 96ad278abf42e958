"""ONNX Runtime's dynamic int8 as a PyTorch module: the model exported with vitkit's exporter,
quantised with `onnxruntime.quantization.quantize_dynamic` (`vitkit.export.export_onnx_int8`)
and run in an in-memory `InferenceSession` (its VNNI/AMX int8 kernels where the CPU has them).

`OnnxRuntimeInt8(model)` answers `forward(images)` like `model` (logits; a regression model's
standardised outputs, as its own forward gives) and every other attribute (config,
preprocessing, task, class names) from `model`, so eval and predict take it as they take the
model. No file is left behind: the graph is read into memory and its folder deleted. The
float graph is checked against `model` before it is quantised (`export_onnx_int8`), and the
int8 graph after, as `vitkit export --int8` checks it (`check_onnx_int8`: within INT8_RTOL of
the outputs' range, clear top-1 classes kept), so a graph the exporter got wrong, or one that
int8 bends too far (a small regression model can be one), raises ExportError instead of answering
wrongly: `auto` then leaves the engine out, and a pinned engine is refused.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import torch
from torch import nn

from vitkit.errors import ExportError, InputError
from vitkit.export import check_onnx_int8, export_onnx_int8, require
from vitkit.export.onnx import destandardisation
from vitkit.runtime import installed

__all__ = ["OnnxRuntimeInt8", "cpu_session", "onnxruntime_available"]


def cpu_session(graph: bytes | str | Path, threads: int | None = None) -> Any:
    """An ONNX Runtime CPU session of `graph` (a file or its bytes) with `threads` intra-op
    threads (default torch's) and one inter-op thread, as vitkit runs every ONNX graph."""
    ort = require("onnxruntime")
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads or torch.get_num_threads()
    options.inter_op_num_threads = 1
    source = graph if isinstance(graph, bytes) else str(graph)
    return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])


def onnxruntime_available() -> bool:
    """Whether onnx and onnxruntime are installed (`pip install 'vitkit[export]'`)."""
    return installed("onnx") and installed("onnxruntime")


def _with_fix(message: str, engines: str) -> str:
    """An export error's message with the other engines (`engines`) as its fix (the
    faithfulness check names them already)."""
    return message if f"use another int8 engine: {engines}" in message else \
        f"{message} Use another int8 engine: {engines}."


class OnnxRuntimeInt8(nn.Module):
    """`model` as an int8 ONNX Runtime session (see the module docstring); `others`, the flags
    that pick another int8 engine, is the fix its refusals give."""

    def __init__(self, model: nn.Module, threads: int | None = None, *,
                 others: str = "--int8-engine torch") -> None:
        super().__init__()
        self.float_model = model.eval()  # attributes are answered from it (see __getattr__)
        self.others = others
        # a dynamic-size model's graph takes every size (a token-merging one exports at its
        # own size only: `export_onnx`)
        dynamic = model.config.dynamic_img_size and not getattr(model, "merge_r", 0)
        self.fixed_size = None if dynamic else tuple(model.config.img_size)
        with tempfile.TemporaryDirectory(prefix="vitkit-int8-") as folder:
            try:
                path = export_onnx_int8(model, Path(folder) / "model.onnx",
                                        dynamic_batch=True, dynamic_size=dynamic)
                check_onnx_int8(model, path, fix=f"use another int8 engine: {others}")
            except ExportError as exc:
                raise ExportError(f"the onnxruntime int8 engine cannot run this model: "
                                  f"{_with_fix(str(exc), others)}") from exc
            graph = path.read_bytes()
        self.session = cpu_session(graph, threads)
        self.input_name = self.session.get_inputs()[0].name
        self.standardise = destandardisation(model)  # (std, mean): the graph outputs units

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        self.float_model.check_input(images)  # as the model refuses them (the graph would not)
        if self.fixed_size is not None and tuple(images.shape[-2:]) != self.fixed_size:
            height, width = self.fixed_size  # a dynamic-size model with token merging
            raise InputError(
                f"images of {images.shape[-2]}x{images.shape[-1]} for an onnxruntime int8 "
                f"graph of {height}x{width} (token merging fixes the size): feed "
                f"{height}x{width} images, or use another int8 engine: {self.others}")
        feed = {self.input_name: images.detach().float().cpu().contiguous().numpy()}
        outputs = torch.from_numpy(self.session.run(None, feed)[0])
        if self.standardise is not None:
            std, mean = self.standardise
            outputs = (outputs - mean) / std
        return outputs

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self._modules["float_model"], name)
