"""`vitkit explain WEIGHTS [IMAGE...]`: attention rollout, mean attention distance, position
and filter figures (`vitkit.analysis.explain.explain_report`)."""

from __future__ import annotations

import argparse
from typing import Any

from vitkit.arguments import add_weights_argument, fraction_below_one, output_folder
from vitkit.cli.output import print_report


def add_parser(verbs: Any) -> None:
    parser = verbs.add_parser("explain", help="attention rollout and maps, mean attention "
                                              "distance, position and filter figures")
    add_weights_argument(parser)
    parser.add_argument("images", nargs="*", metavar="IMAGE",
                        help="image files, folders or .npy/.npz array files (default: test "
                             "images of --data)")
    parser.add_argument("--out", required=True, type=output_folder,
                        help="folder for the PNGs and explain.json")
    parser.add_argument("--head-fusion", default="mean", choices=("mean", "max", "min"))
    parser.add_argument("--discard-ratio", type=fraction_below_one, default=0.0,
                        help="zero this fraction (in [0, 1)) of the weakest attentions "
                             "(rollout)")
    parser.add_argument("--num-images", type=int,
                        help="test images to sample across classes when no IMAGE is given; "
                             "all count in the mean attention distance (default 128, the "
                             "paper's; fewer when the test split is smaller)")
    parser.add_argument("--show", type=int, default=8,
                        help="images drawn in the rollout figure (default 8)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the class-stratified sample of test images")
    parser.add_argument("--data", help="digits, cifar10, cifar100 or folder (default: as "
                                       "trained)")
    parser.add_argument("--data-dir", help="local dataset folder")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> None:
    from vitkit.analysis.explain import explain_report

    print_report(explain_report(args.weights, args.images, args.out, args.data, args.data_dir,
                                args.num_images, args.weights_dir, args.seed,
                                head_fusion=args.head_fusion, discard_ratio=args.discard_ratio,
                                show=args.show))
