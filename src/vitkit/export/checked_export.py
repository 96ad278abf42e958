"""`vitkit export`: weights in, an ONNX file (float or int8) out, checked with onnxruntime
against the model it came from; the report says where it went and how close it is."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from vitkit.errors import ExportError
from vitkit.export.int8 import INT8_RTOL, check_onnx_int8, export_onnx_int8
from vitkit.export.onnx import (
    CHECK_BATCHES,
    FORMATS,
    check_float_graph,
    default_check_sizes,
    export_onnx,
    external_data_files,
    read_metadata,
)
from vitkit.files import names_folder
from vitkit.model.vit import VisionTransformer
from vitkit.report import Report
from vitkit.tasks import Task, task_of
from vitkit.weights.formats.hf_hub import PREFIX as HUB_PREFIX


def default_output_path(weights: str, int8: bool = False, merge_tokens: int = 0) -> Path:
    """Beside the weights: FILE.onnx for a file, FOLDER/model.onnx for a folder (.int8.onnx
    with int8, .mergeR before it with token merging); for a checkpoint name or Hub repository,
    NAME.onnx here (hf-hub:ORG/NAME@REV: ORG-NAME-REV.onnx; "/", ":" and "@" become "-",
    none of which every file system takes)."""
    suffix = _suffix(int8, merge_tokens)
    source = Path(weights)
    if source.is_dir():
        return source / f"model{suffix}"
    if source.exists():
        return source.with_suffix(suffix)
    return Path(re.sub(r"[/:@\\]+", "-", weights.removeprefix(HUB_PREFIX)) + suffix)


def _suffix(int8: bool, merge_tokens: int) -> str:
    return (f".merge{merge_tokens}" if merge_tokens else "") + (".int8.onnx" if int8 else ".onnx")


def export_weights(weights: str, out: str | Path | None = None, *, format: str = "onnx",
                   int8: bool = False, dynamic_size: bool = False, opset: int | None = None,
                   weights_dir: str | Path | None = None,
                   prepare: Callable[[VisionTransformer], VisionTransformer] | None = None
                   ) -> Report:
    """Export weights (any source `load_pretrained` reads) to `out` (default:
    `default_output_path`) and check the file with onnxruntime: a float graph with
    `check_float_graph` (1e-4, times the targets' largest std for regression, + 1e-5 x the
    outputs' largest magnitude), or for `int8`, within INT8_RTOL x the logits' range with
    the clear top-1 classes kept. The graph is written to a temporary folder beside `out`
    and moved into place only once it passes, so a graph that fails leaves no file and a
    previous export at `out` (with any external-data files) as it was.
    `prepare` changes the loaded model first: `vitkit export --merge-tokens R` passes token
    merging (`vitkit.inference.speed_up`), and the graph then merges as the model does, at
    its image size only, checked against it."""
    from vitkit.catalog import load_pretrained

    format = format.lower()
    if format not in FORMATS:
        raise ExportError(f"unknown format {format!r}: use --format " + " or ".join(FORMATS))
    model = load_pretrained(weights, weights_dir=weights_dir)
    if prepare is not None:
        model = prepare(model)
    merge_tokens = getattr(model, "merge_r", 0)  # set by token merging
    given = out
    out = Path(default_output_path(weights, int8, merge_tokens) if out is None else out)
    write = export_onnx_int8 if int8 else export_onnx
    sizes = default_check_sizes(model) if dynamic_size else []
    task = task_of(model)
    if out.is_dir() or (given is not None and names_folder(given)):  # "DIR/": Path drops "/"
        verb = "is" if out.is_dir() else "names"
        raise ExportError(f"--out {given} {verb} a folder: give the file to write, e.g. --out "
                          f"{out / ('model' + _suffix(int8, merge_tokens))}")
    if out.suffix.lower() != ".onnx":  # best.pt, model.safetensors: read as what they say
        why = ("is an existing file that is not an .onnx graph, and exporting would replace "
               "it" if out.is_file() else "does not end in .onnx, so the graph would be read "
               "as the kind of file its name says")
        raise ExportError(f"--out {given} {why}: give a path ending in .onnx, e.g. --out "
                          f"{out.with_suffix(_suffix(int8, merge_tokens))}")
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        written = write(model, staging / out.name, dynamic_size=dynamic_size, opset=opset)
        size_mib = written.stat().st_size / 2**20
        check_lines, check_data = _check(model, written, int8, dynamic_size, sizes, task)
        for name in [*external_data_files(written), out.name]:  # the graph last
            (out.parent / name).parent.mkdir(parents=True, exist_ok=True)
            os.replace(staging / name, out.parent / name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # and what the graph does not use
    axes = "batch, height, width" if dynamic_size else "batch"
    merging = f", merges {merge_tokens} tokens per layer" if merge_tokens else ""
    lines = [f"wrote {out} ({size_mib:.1f} MiB{', int8' if int8 else ''}{merging}, "
             f"dynamic {axes})"]
    where = ", ".join(f"{h}x{w}" for h, w in [model.config.img_size, *sizes])
    if task.onnx_note:
        lines.append(task.onnx_note)
    data = {"path": str(out), "mib": size_mib, "int8": int8, "dynamic_size": dynamic_size,
            "merge_tokens": merge_tokens, "checked_at": where, "task": task.kind}
    data.update(check_data)
    return Report("\n".join(lines + check_lines), data)


def _check(model: VisionTransformer, path: Path, int8: bool, dynamic_size: bool,
           sizes: list[tuple[int, int]], task: Task) -> tuple[list[str], dict]:
    """The report's lines and data of the onnxruntime check of the graph at `path` (at the
    model's size and `sizes`): the float graph by `check_float_graph`; an int8 one (whose
    float graph `export_onnx_int8` checked) by `check_onnx_int8`. Raises ExportError."""
    if not int8:
        check = check_float_graph(model, path, dynamic_size=dynamic_size)
        return ([f"onnxruntime check: max abs diff {check['max_abs_diff']:.2g} over "
                 f"{check['checked_at']} (tolerance {check['tolerance']}): OK"],
                {"max_abs_diff": check["max_abs_diff"]})
    where = ", ".join(f"{h}x{w}" for h, w in [model.config.img_size, *sizes])
    diff, agree = check_onnx_int8(model, path, batch_sizes=CHECK_BATCHES, sizes=sizes)
    outputs, agreement = task.onnx_output, task.agreement_words(agree)
    fp32 = read_metadata(path)["fp32_check"]  # written by export_onnx_int8
    return ([f"onnxruntime check of the fp32 graph before quantisation: max abs diff "
             f"{fp32['max_abs_diff']:.2g} over {fp32['checked_at']} (tolerance "
             f"{fp32['tolerance']}): OK",
             f"onnxruntime check (int8 vs fp32): max abs diff {diff:.2g} over batch 1, 3 at "
             f"{where} (tolerance {INT8_RTOL:g} x the {outputs}' range){agreement}: OK"],
            {"max_abs_diff": diff, "top1_agreement": agree,
             "fp32_max_abs_diff": fp32["max_abs_diff"]})
