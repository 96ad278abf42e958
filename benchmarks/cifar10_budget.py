"""Time to accuracy on CIFAR-10: vitkit's recipe against the tutorial's setup, same budget.

Each run is a `vitkit train` subprocess (the same command a user types) with
`--time-budget`, one after the other so they never share the cores. The script then prints
the accuracy each reached and when, and draws both accuracy-vs-minutes curves in one PNG.

    python benchmarks/cifar10_budget.py --data-dir ../shared/data/cifar10/cifar-10-batches-bin
    python benchmarks/cifar10_budget.py --report runs/budget/cifar10 runs/budget/cifar10-tutorial
    python benchmarks/cifar10_budget.py --report RUN ... --write-readme --machine "AMD EPYC (...)"
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parent))  # readme_tables, for importers
import readme_tables

THRESHOLDS = (0.5, 0.7, 0.8, 0.85)


def run(recipe: str, data_dir: str, budget: float, out: Path) -> None:
    command = [sys.executable, "-m", "vitkit.cli", "train", recipe, "progress=false",
               "--data-dir", data_dir, "--time-budget", str(budget), "--out", str(out)]
    print("$", " ".join(command), flush=True)
    subprocess.run(command, check=True)


def history(run_dir: Path) -> list[dict[str, float]]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def minutes_to(rows: list[dict[str, float]], threshold: float) -> str:
    for row in rows:
        if row["top1"] >= threshold:
            return f"{row['minutes']:.1f}"
    return "-"


def report(run_dirs: list[Path], png: Path) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    header = (f"{'run':<22}{'epochs':>8}{'minutes':>9}{'final top-1':>13}{'best top-1':>12}"
              + "".join(f"{f'min to {int(t * 100)}%':>12}" for t in THRESHOLDS))
    lines = [header]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for run_dir in run_dirs:
        rows = history(run_dir)
        final, best = rows[-1], max(row["top1"] for row in rows)
        lines.append(f"{run_dir.name:<22}{final['epoch']:>8.1f}{final['minutes']:>9.1f}"
                     f"{100 * final['top1']:>12.2f}%{100 * best:>11.2f}%"
                     + "".join(f"{minutes_to(rows, t):>12}" for t in THRESHOLDS))
        ax.plot([r["minutes"] for r in rows], [100 * r["top1"] for r in rows], marker=".",
                label=f"{run_dir.name} ({100 * final['top1']:.1f}%)")
    ax.set(xlabel="training wall time (minutes, 2 CPU cores)", ylabel="CIFAR-10 test top-1 (%)",
           title="CIFAR-10 from scratch: accuracy vs. minutes")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)
    plt.close(fig)
    lines.append(f"curve: {png}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", help="cifar-10-batches-bin folder")
    parser.add_argument("--budget", type=float, default=3600, help="seconds per run")
    parser.add_argument("--recipes", default="cifar10,cifar10-tutorial")
    parser.add_argument("--out", type=Path, default=Path("runs/budget"))
    parser.add_argument("--png", type=Path, default=Path("docs/recipes/cifar10_budget.png"))
    parser.add_argument("--report", nargs="+", type=Path, metavar="RUN_DIR",
                        help="only report on finished runs")
    parser.add_argument("--machine", help="with --write-readme and --report: the CPU the runs "
                        "trained on, as their log's first line names it (default: this one)")
    readme_tables.add_flag(parser)
    args = parser.parse_args()
    with readme_tables.recording("cifar10_budget.py", args.write_readme, machine=args.machine):
        run_dirs = args.report
        if not run_dirs:  # training here: this machine's CPU line (a report's runs name theirs)
            from vitkit.runtime import cpu_description

            print(cpu_description(), flush=True)
            if not args.data_dir:
                parser.error("--data-dir is required to run (or pass --report RUN_DIR ...)")
            run_dirs = []
            for recipe in args.recipes.split(","):
                out = args.out / recipe
                run(recipe, args.data_dir, args.budget, out)
                run_dirs.append(out)
        print(report(run_dirs, args.png))


if __name__ == "__main__":
    main()
