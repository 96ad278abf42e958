"""int8 and token merging: speed against timm and vitkit fp32, and accuracy on trained models.

Speed (`--speed`): ViT-B/16 at 224, batch 8, random weights, every configuration in this one
process (the same threads and allocator setting for all: `vitkit.runtime.configure_cpu`), timed
in rotating order, one call per configuration per round; medians. Rows: timm fp32, vitkit fp32,
vitkit int8 by each engine of `vitkit.inference.int8_engines` (torch's x86 kernels, oneDNN, ONNX
Runtime; `--int8` runs the fastest of them, measured), ToMe at several r, int8 + ToMe by each
engine that merges tokens, bf16 autocast, `--precision bf16` as the verbs run it on the CPU (a
bf16 copy of the model, prepacked; alone and with ToMe; and unpacked), `--precision auto` as
the verbs resolve it here (alone and with the largest ToMe r: the issue's "fastest path") and
ONNX Runtime fp32 (the graph `vitkit export` writes); with `--compile`, fp32, bf16, oneDNN int8
and `auto` again as `vitkit benchmark --compile` runs them (frozen weights), alone and with the
largest ToMe r. The last column is each row's first call (compilation for compiled rows); a second
untimed call of every row follows, since compiled models whose frames are shared recompile
once more when called in turn (Ti/16: up to 38 s in that round, 0.03 s after).

Accuracy (`--accuracy WEIGHTS ...`): each trained model's test top-1 and images/s at fp32,
int8, bf16 (`--precision bf16` on the CPU) and token merging r = 1, 2, ... (the ToMe curve),
evaluated as `vitkit eval` does.

    python benchmarks/inference.py --speed --reps 7
    python benchmarks/inference.py --accuracy runs/budget/cifar10 runs/digits \\
        --data-dir ../shared/data/cifar10/cifar-10-batches-bin
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from vitkit import apply_token_merging, create_model
from vitkit.inference.benchmark.peak import MatmulPeak, timed
from vitkit.inference.int8_engines import available_engines
from vitkit.inference.int8_ranges import describe_scheme
from vitkit.inference.merging import merge_schedule
from vitkit.inference.quantize import quantize_int8
from vitkit.runtime import configure_cpu, cpu_description
from vitkit.summary import forward_flops, token_count

sys.path.append(str(Path(__file__).resolve().parent))  # readme_tables, for importers
import readme_tables

Runner = Callable[[], object]


def speed_rows(batch: int, merge: list[int], with_onnx: bool, with_bf16: bool = True,
               compiled: bool = False) -> dict[str, tuple[Runner, int]]:
    """Label -> (one batch of B/16 at 224, tokens merged per layer)."""
    from timm.models.vision_transformer import VisionTransformer as TimmViT

    torch.manual_seed(0)
    images = torch.randn(batch, 3, 224, 224)
    timm_model = TimmViT(img_size=224, patch_size=16, embed_dim=768, depth=12, num_heads=12,
                         num_classes=1000).eval()
    model = create_model("B/16").eval()  # random weights: the speed does not depend on them

    def merged(module: torch.nn.Module, r: int) -> Runner:
        def call() -> object:  # merging switched on for this call only (int8 is a copy)
            apply_token_merging(module, r)
            with torch.inference_mode():
                out = module(images)
            apply_token_merging(module, 0)
            return out
        return call

    rows = {"timm fp32": (_call(timm_model, images), 0), "vitkit fp32": (_call(model, images), 0)}
    engines = [engine for engine in available_engines()
               if with_onnx or engine != "onnxruntime"]
    for engine in engines:
        rows[f"vitkit int8 ({engine})"] = (_call(quantize_int8(model, engine), images), 0)
    for r in merge:
        rows[f"vitkit ToMe r={r}"] = (merged(model, r), r)
        merged_model = apply_token_merging(copy.deepcopy(model), r)
        for engine in engines:  # merged first, then quantised (ONNX Runtime exports the merge)
            int8_merged = quantize_int8(merged_model, engine)
            rows[f"vitkit int8 ({engine}) + ToMe r={r}"] = (_call(int8_merged, images), r)
    if with_bf16:
        def autocast() -> contextlib.AbstractContextManager:
            return torch.autocast("cpu", dtype=torch.bfloat16)
        rows["vitkit bf16 (autocast)"] = (_call(model, images, autocast), 0)
        rows.update(_bf16_copy_rows(model, images, max(merge, default=0)))
    rows.update(_auto_rows(model, images, max(merge, default=0)))
    if with_onnx:
        rows.update(_onnx_rows(model, images))
    if compiled:
        rows.update(_compiled_rows(model, images, max(merge, default=0)))
    return rows


def _compiled_rows(model, images: torch.Tensor, r: int) -> dict[str, tuple[Runner, int]]:
    """`vitkit benchmark --compile` (frozen weights: `compile_for_inference`) for fp32, bf16,
    oneDNN int8 and `--precision auto`, each alone and with ToMe r. The first call compiles."""
    from vitkit.inference.compiled import compile_for_inference
    from vitkit.inference.precision import Precision, apply_precision, choose_precision

    cpu = torch.device("cpu")
    rows = {}
    for merge, merged_model in _merged_copies(model, r):
        auto = choose_precision("auto", cpu, merged_model, images)
        for precision in (Precision("fp32", ""), Precision("bf16", ""),
                          Precision("int8", "", "onednn"), auto):
            if precision.engine not in (None, "torch", "onednn"):
                continue  # ONNX Runtime and torchao run outside inductor
            module, context = apply_precision(merged_model, precision, cpu, compiled=True)
            name = precision.name + (f" ({precision.engine})" if precision.engine else "")
            label = ("vitkit auto -> " if precision is auto else "vitkit ") + name + \
                " compiled" + _merged_label(merge)
            rows[label] = (_call(compile_for_inference(module, cpu), images, context), merge)
    return rows


def _bf16_copy_rows(model, images: torch.Tensor, r: int) -> dict[str, tuple[Runner, int]]:
    """`--precision bf16` as the verbs run it on the CPU (a bf16 copy of the model, no
    autocast, its linear weights prepacked for oneDNN: `vitkit.inference.bf16.bf16_copy`),
    alone and with ToMe r, and the copy unpacked (what prepacking gains)."""
    from vitkit.inference.bf16 import bf16_copy
    from vitkit.inference.packed_linear import prepacking_available

    rows = {"vitkit --precision bf16 (bf16 copy)" + _merged_label(merge):
            (_call(bf16_copy(merged_model), images), merge)
            for merge, merged_model in _merged_copies(model, r)}
    if prepacking_available():
        rows["vitkit bf16 copy, weights not prepacked"] = (
            _call(bf16_copy(model, prepack=False), images), 0)
    return rows


def _auto_rows(model, images: torch.Tensor, r: int) -> dict[str, tuple[Runner, int]]:
    """`--precision auto` as the verbs resolve it here, alone and with ToMe r (the issue's
    fastest path): the model after merging, then auto's precision measured on it."""
    from vitkit.inference.precision import run_in_precision

    cpu = torch.device("cpu")
    rows = {}
    for merge, merged_model in _merged_copies(model, r):
        module, context, chosen = run_in_precision("auto", cpu, merged_model, images)
        label = f"vitkit auto -> {chosen.name}" + (f" ({chosen.engine})" if chosen.engine
                                                   else "") + _merged_label(merge)
        rows[label] = (_call(module, images, context), merge)
        print(f"{label}: {chosen.reason}", flush=True)  # what auto measured
    return rows


def _merged_copies(model, r: int) -> Iterator[tuple[int, torch.nn.Module]]:
    """(0, a copy of `model`) and, for r > 0, (r, a copy merging r tokens per layer)."""
    for merge in sorted({0, r}):
        yield merge, apply_token_merging(copy.deepcopy(model), merge)


def _merged_label(merge: int) -> str:
    return f" + ToMe r={merge}" if merge else ""


def _call(module: torch.nn.Module, images: torch.Tensor,
          context: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext
          ) -> Runner:
    """One batch through `module` in inference mode, inside `context()`."""
    def call() -> object:
        with torch.inference_mode(), context():
            return module(images)
    return call


def _onnx_rows(model, images: torch.Tensor) -> dict[str, tuple[Runner, int]]:
    import onnxruntime as ort

    from vitkit.export import export_onnx

    options = ort.SessionOptions()
    options.intra_op_num_threads = torch.get_num_threads()
    options.inter_op_num_threads = 1
    rows = {}
    with tempfile.TemporaryDirectory() as folder:
        for label, write in (("onnxruntime fp32", export_onnx),):
            path = write(model, Path(folder) / f"{label.split()[1]}.onnx")
            session = ort.InferenceSession(str(path), options,
                                           providers=["CPUExecutionProvider"])
            feed = {session.get_inputs()[0].name: images.numpy()}
            rows[label] = ((lambda s=session, f=feed: s.run(None, f)), 0)
    return rows


def speed(args: argparse.Namespace) -> None:
    configure_cpu(args.threads)
    peak = MatmulPeak(args.threads)
    peak.sample(5)
    merge = [int(r) for r in args.merge.split(",") if r]
    rows = speed_rows(args.batch, merge, not args.no_onnx, not args.no_bf16, args.compile)
    first_call = {label: timed(runner) for label, (runner, _) in rows.items()}  # compiles
    for runner, _ in rows.values():  # untimed: compiled models that share frames (the blocks'
        runner()  # forward_first, forward_head) recompile these once more when called in turn
    times: dict[str, list[float]] = {label: [] for label in rows}
    order = list(rows)
    for rep in range(args.reps):
        for label in order[rep % len(order):] + order[:rep % len(order)]:
            times[label].append(timed(rows[label][0]))
        peak.sample(1)
    config = create_model("B/16", device="meta").config
    fp32 = {label: statistics.median(times[label]) for label in ("timm fp32", "vitkit fp32")}
    print(f"torch {torch.__version__}, {args.threads} threads, fp32 matmul peak "
          f"{peak.gflops:.0f} GFLOP/s; ViT-B/16 at 224, batch {args.batch}, medians of "
          f"{args.reps} rotating rounds, one process (same settings for every row); int8 "
          f"of the torch and onednn rows: {describe_scheme()}")
    print(f"{'configuration':<50}{'ms/batch':>10}{'images/s':>10}{'vs timm':>9}"
          f"{'vs vitkit':>10}{'GFLOPs/img':>12}{'1st call s':>11}")
    for label, samples in times.items():
        med = statistics.median(samples)
        flops = forward_flops(config, tokens_per_layer=merge_schedule(
            config, rows[label][1], token_count(config))) / 1e9
        print(f"{label:<50}{med * 1e3:>10.1f}{args.batch / med:>10.2f}"
              f"{fp32['timm fp32'] / med:>8.2f}x{fp32['vitkit fp32'] / med:>9.2f}x"
              f"{flops:>12.1f}{first_call[label]:>11.1f}")


def accuracy(args: argparse.Namespace) -> None:
    from vitkit.catalog import read_weights
    from vitkit.evaluation.loop import evaluate
    from vitkit.evaluation.splits import data_for, split_to_evaluate
    from vitkit.inference.bf16 import bf16_copy
    from vitkit.inference.predictor import Predictor
    from vitkit.tasks import make_task
    from vitkit.weights import build_model

    configure_cpu(args.threads)
    for source in args.accuracy:
        weights = read_weights(source)
        model = build_model(weights).eval()
        config = model.config
        data, data_dir, limit = data_for(weights, None, args.data_dir, "test", None)
        data_dir = data_dir or args.data_dir
        dataset, _ = split_to_evaluate(weights, data, data_dir, "test", limit,
                                       config.img_size, config.in_chans)
        patches = config.seq_len - config.num_prefix_tokens
        rs = [r for r in (1, 2, 4, 8, 16) if r <= patches // 2]
        print(f"\n{source}: {data} test, {config.seq_len} tokens, depth {config.depth}")
        print(f"{'configuration':<22}{'tokens at the end':>18}{'top-1':>9}{'images/s':>10}"
              f"{'speed-up':>10}")
        base = None
        for label, module, r in [("fp32", model, 0), ("int8", quantize_int8(model), 0),
                                 ("bf16 (bf16 copy)", bf16_copy(model), 0),
                                 *[(f"ToMe r={r}", model, r) for r in rs],
                                 *[(f"int8 + ToMe r={r}", None, r) for r in rs[:2]]]:
            apply_token_merging(model, r)
            if module is None:
                module = quantize_int8(model)
            predictor = Predictor.from_model(module, preprocess=weights.preprocess,
                                             image_size=config.img_size)
            task = make_task(weights.task)
            evaluate(predictor, dataset, task, batch_size=args.batch_eval)  # warm-up pass
            start = time.perf_counter()
            result = evaluate(predictor, dataset, task, batch_size=args.batch_eval)
            rate = result.count / (time.perf_counter() - start)
            base = base or rate
            end = _tokens_left(config.seq_len, config.num_prefix_tokens, config.depth, r)
            print(f"{label:<22}{end:>18}{100 * result.metrics['top1']:>8.2f}%{rate:>10.0f}"
                  f"{rate / base:>9.2f}x")
            apply_token_merging(model, 0)


def _tokens_left(tokens: int, prefix: int, depth: int, r: int) -> int:
    from vitkit.inference.merging import clip_merge_count

    for _ in range(depth):
        tokens -= clip_merge_count(r, tokens, prefix)
    return tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--speed", action="store_true", help="the B/16 speed table")
    parser.add_argument("--accuracy", nargs="+", metavar="WEIGHTS",
                        help="trained weights (run folders, checkpoints) to score")
    parser.add_argument("--data-dir", help="data folder when the weights' own is elsewhere")
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--batch-eval", type=int, default=500)
    parser.add_argument("--merge", default="8,12,16", help="ToMe r values of the speed table")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--no-onnx", action="store_true")
    parser.add_argument("--compile", action="store_true",
                        help="also fp32, bf16, int8 (onednn) and auto under `--compile` (frozen "
                             "weights), alone and with the largest ToMe r")
    parser.add_argument("--no-bf16", action="store_true",
                        help="leave out the bf16 autocast row (slow where bf16 is emulated)")
    readme_tables.add_flag(parser)
    args = parser.parse_args()
    name = ("inference.py" + " --speed" * args.speed + " --accuracy" * bool(args.accuracy)
            + " --compile" * args.compile)
    with readme_tables.recording(name, args.write_readme):
        if not (args.speed or args.accuracy):
            parser.error("ask for --speed and/or --accuracy WEIGHTS ...")
        configure_cpu(args.threads)
        print(cpu_description(), flush=True)
        if args.speed:
            speed(args)
        if args.accuracy:
            accuracy(args)


if __name__ == "__main__":
    main()
