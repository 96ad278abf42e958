"""The CUDA paths of vitkit against timm on one GPU, in one process: parity, bf16 autocast,
fused attention (SDPA's flash kernel), `torch.compile`, and B/16 inference and training
throughput.

vitkit runs twice: as shipped, and with its class-token shortcut turned off (a forward hook
on the final norm; the last block then runs every token, as timm's does). Both libraries get the
same process settings (TF32 off for the parity check, then torch's
defaults), the same weights (timm's, copied into vitkit) and the same input tensors. Timed
rounds alternate between the libraries (vitkit, timm, vitkit, timm, ...) and medians are
reported; CUDA events time each call after a synchronise.

    python benchmarks/gpu.py [--rounds 7] [--out gpu.json] [--skip-compile] [--write-readme]
    python benchmarks/gpu.py --report gpu.json [--write-readme]   # the table of a saved run

Needs a CUDA GPU and timm. Nothing here runs in the test suite.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import timm.models.vision_transformer as timm_vit
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from vitkit import VisionTransformer
from vitkit.runtime import cpu_description
from vitkit.weights import load_state_dict_checked
from vitkit.weights.formats.timm import config_from_timm_model

sys.path.append(str(Path(__file__).resolve().parent))  # readme_tables, for importers
import readme_tables


def timm_b16(img: int = 224, classes: int = 1000) -> torch.nn.Module:
    model = timm_vit.VisionTransformer(img_size=img, patch_size=16, embed_dim=768, depth=12,
                                       num_heads=12, num_classes=classes)
    with torch.no_grad():  # timm zero-inits the head: random values make the logits differ
        model.head.weight.normal_(0, 0.02)
    return model


def vitkit_from(reference: torch.nn.Module) -> VisionTransformer:
    config, state_dict = config_from_timm_model(reference)
    model = VisionTransformer(config)
    load_state_dict_checked(model, state_dict)
    return model


def parity(device: torch.device) -> dict[str, float]:
    """Max |logit difference| vitkit vs timm: fp32 (TF32 off), bf16 autocast, flash forced."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    reference = timm_b16().to(device).eval()
    model = vitkit_from(reference).to(device).eval()
    x = torch.randn(16, 3, 224, 224, device=device)
    out: dict[str, float] = {}
    with torch.no_grad():
        a, b = model(x), reference(x)
        out["fp32_max_abs_diff"] = (a - b).abs().max().item()
        out["logit_range"] = (b.max() - b.min()).item()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            c, d = model(x).float(), reference(x).float()
        out["bf16_vitkit_vs_timm_bf16"] = (c - d).abs().max().item()
        out["bf16_vitkit_vs_fp32"] = (c - b).abs().max().item()
        out["bf16_top1_agreement_with_fp32"] = (c.argmax(1) == b.argmax(1)).float().mean().item()
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION), torch.autocast("cuda",
                                                                     dtype=torch.bfloat16):
            e = model(x).float()  # raises if the flash kernel cannot run this attention
        out["flash_forced_vs_default_bf16"] = (e - c).abs().max().item()
    torch.backends.cudnn.allow_tf32 = True  # back to torch's defaults
    return out


def cuda_ms(fn: Callable[[], None]) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end)


def make_step(model: torch.nn.Module, train: bool, x: torch.Tensor, y: torch.Tensor,
              iters: int) -> Callable[[], None]:
    """`iters` bf16-autocast inference calls, or training steps (AdamW, cross-entropy)."""
    if not train:
        model.eval()

        def infer() -> None:
            with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
                for _ in range(iters):
                    model(x)
        return infer
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)

    def step() -> None:
        for _ in range(iters):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = F.cross_entropy(model(x).float(), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    return step


def throughput(device: torch.device, train: bool, batch: int, rounds: int, compiled: bool,
               iters: int) -> dict[str, object]:
    reference = timm_b16().to(device)
    full = vitkit_from(reference).to(device)
    full.norm.register_forward_hook(lambda *_: None)  # a hook there turns the shortcut off
    models = {"vitkit": vitkit_from(reference).to(device), "vitkit_full_path": full,
              "timm": reference}
    x = torch.randn(batch, 3, 224, 224, device=device)
    y = torch.randint(0, 1000, (batch,), device=device)
    steps, first_ms = {}, {}
    for name, model in models.items():
        run = torch.compile(model) if compiled else model
        steps[name] = make_step(run, train, x, y, iters)
        first_ms[name] = cuda_ms(make_step(run, train, x, y, 1))  # compiles when compiled
        for _ in range(2):
            steps[name]()
    times: dict[str, list[float]] = {name: [] for name in models}
    for _ in range(rounds):
        for name in models:  # alternate: slow phases hit both alike
            times[name].append(cuda_ms(steps[name]) / iters)
    medians = {name: statistics.median(t) for name, t in times.items()}
    return {
        "task": f"B/16 {'training step' if train else 'inference'}, 224 px, batch {batch}, "
                f"bf16 autocast{', torch.compile' if compiled else ''}",
        "images_per_s": {name: batch * 1000 / ms for name, ms in medians.items()},
        "ms_per_call": medians,
        "vitkit_over_timm": medians["timm"] / medians["vitkit"],
        "vitkit_full_path_over_timm": medians["timm"] / medians["vitkit_full_path"],
        "first_call_ms": first_ms,
    }


def table(report: dict) -> str:
    """The run's parity and throughput, as benchmarks/README.md shows them."""
    versions = f"torch {report['torch']}, timm {report['timm']}, Python {report['python']}"
    p = report["parity"]
    lines = [f"{report['gpu']} (capability {'.'.join(map(str, report['capability']))}), {versions}",
             f"parity (B/16 at 224, batch 16, max |logit difference|): fp32 "
             f"{p['fp32_max_abs_diff']:.1e} (logit range {p['logit_range']:.1f}), both bf16 "
             f"{p['bf16_vitkit_vs_timm_bf16']:.1e}, vitkit bf16 vs fp32 "
             f"{p['bf16_vitkit_vs_fp32']:.1e}, flash forced vs default "
             f"{p['flash_forced_vs_default_bf16']:.1e}",
             f"{'task':<68}{'vitkit':>8}{'no shortcut':>12}{'timm':>8}{'ratio':>7}"
             f"{'no shortcut':>12}",
             "(images/s; ratios over timm; no shortcut: vitkit with its class-token shortcut off)"]
    for row in report["throughput"]:
        ips = row["images_per_s"]
        lines.append(f"{row['task']:<68}{ips['vitkit']:>8.0f}{ips['vitkit_full_path']:>12.0f}"
                     f"{ips['timm']:>8.0f}{row['vitkit_over_timm']:>7.2f}"
                     f"{row['vitkit_full_path_over_timm']:>12.2f}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    parser.add_argument("--skip-compile", action="store_true")
    parser.add_argument("--report", type=Path, metavar="JSON",
                        help="print the table of a run saved with --out, measuring nothing")
    readme_tables.add_flag(parser)
    args = parser.parse_args()
    if args.report:
        saved = json.loads(args.report.read_text())
        print(table(saved))
        if args.write_readme:
            readme_tables.write_table("gpu.py", table(saved), machine=saved["gpu"],
                                      command="python benchmarks/gpu.py")
        return
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks/gpu.py needs a CUDA GPU")
    device = torch.device("cuda")
    import timm

    print(cpu_description(), flush=True)
    report: dict[str, object] = {
        "cpu": cpu_description(), "gpu": torch.cuda.get_device_name(),
        "capability": torch.cuda.get_device_capability(),
        "torch": torch.__version__, "timm": timm.__version__, "python": platform.python_version(),
    }
    print(json.dumps(report))
    started = time.perf_counter()
    report["parity"] = parity(device)
    print(json.dumps(report["parity"]))
    results = []
    for compiled in (False, True) if not args.skip_compile else (False,):
        for train, batch, iters in ((False, 256, 4), (True, 128, 2)):
            result = throughput(device, train, batch, args.rounds, compiled, iters)
            results.append(result)
            print(json.dumps(result), flush=True)
    report["throughput"] = results
    report["seconds"] = time.perf_counter() - started
    print("\n" + table(report))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    if args.write_readme:
        readme_tables.write_table("gpu.py", table(report), machine=report["gpu"],
                                  command=readme_tables.command_line("gpu.py"))


if __name__ == "__main__":
    main()
