"""A layer table with output shapes and parameter counts, and the model's FLOPs.

Shapes come from a forward pass on the meta device, so even ViT-H costs no memory.
The totals split parameters held by layers (Conv2d/Linear/LayerNorm: what torchsummary
counts) from those held directly by the model (class token, position embeddings).
FLOPs count what torch.utils.flop_counter counts, 2 per multiply-add: the stem's
convolutions (the stem works them out, `Stem.flops`) and the encoder's and head's matmuls.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from vitkit.catalog import config_of, variant_of
from vitkit.config import ViTConfig
from vitkit.errors import ConfigError
from vitkit.model.layers import DropPath
from vitkit.model.stems import Stem, build_stem
from vitkit.model.vit import VisionTransformer


@dataclass
class Row:
    name: str
    kind: str
    shape: tuple[int, ...]
    params: int


@dataclass
class Summary:
    config: ViTConfig
    rows: list[Row]
    total: int
    in_layers: int
    direct: dict[str, int]
    trainable: int
    flops: int
    stem_flops: int

    def format(self) -> str:
        header = ("Layer", "Type", "Output shape", "Params")
        body = [(r.name, r.kind, str(tuple(r.shape)), f"{r.params:,}") for r in self.rows]
        widths = [max(len(row[i]) for row in [header, *body]) for i in range(4)]

        def line(cells: tuple[str, ...]) -> str:
            return "  ".join(c.rjust(w) if i == 3 else c.ljust(w)
                             for i, (c, w) in enumerate(zip(cells, widths, strict=True)))

        rule = "-" * len(line(header))
        direct = " + ".join(f"{name} {count:,}" for name, count in self.direct.items())
        cfg = self.config
        name = variant_of(cfg) or "custom ViT"  # the sizes follow on the same line
        out = [f"{name}: image {cfg.img_size[0]}x{cfg.img_size[1]}x{cfg.in_chans}, "
               f"patch {cfg.patch_size}, {cfg.seq_len} tokens, width {cfg.width}, depth "
               f"{cfg.depth}, heads {cfg.num_heads}, MLP {cfg.mlp_dim}, {cfg.num_classes} classes",
               rule, line(header), rule, *(line(r) for r in body), rule,
               f"Total params:                      {self.total:,}",
               f"Trainable params:                  {self.trainable:,}",
               f"  in Conv2d/Linear/LayerNorm:      {self.in_layers:,}  (what torchsummary counts)",
               f"  held directly by the model:      {sum(self.direct.values()):,}"
               + (f"  ({direct})" if direct else ""),
               f"Size (fp32):                       {self.total * 4 / 2**20:,.2f} MB",
               f"Forward FLOPs per image:           {_flops_text(self.flops)} "
               "(2 per multiply-add, as torch's FlopCounterMode counts)",
               f"  {self.config.stem} stem convolutions:".ljust(35) + _flops_text(self.stem_flops),
               f"  encoder and head matmuls:        {_flops_text(self.flops - self.stem_flops)}"
               "  (norms, activations and softmax not counted)"]
        return "\n".join(out)


def _flops_text(flops: int) -> str:
    return f"{flops / 1e9:,.2f} GFLOPs" if flops >= 1e9 else f"{flops / 1e6:,.2f} MFLOPs"


def _kind(module: nn.Module) -> str:
    return type(module).__name__


def summarize(model: str | Path | ViTConfig, max_depth: int = 1, **overrides: Any) -> Summary:
    """Build `model` (a config, or any name `vitkit.catalog.lookup` knows, with `overrides`) on
    the meta device, run one image through it and tabulate."""
    config = config_of(model, **overrides)
    with torch.device("meta"):
        model = VisionTransformer(config).eval()
    shapes: dict[str, tuple[int, ...]] = {}
    hooks = []
    for name, module in model.named_modules():
        if name and name.count(".") < max_depth + (1 if name.startswith("blocks.") else 0):
            def record(_m, _inp, out, name=name):
                tensor = out[0] if isinstance(out, tuple) else out
                shapes[name] = tuple(tensor.shape)
            hooks.append(module.register_forward_hook(record))
    with torch.no_grad():
        images = torch.zeros(1, config.in_chans, *config.img_size, device="meta")
        model.forward_head(model.forward_features(images))  # every token through every block
    for hook in hooks:
        hook.remove()

    rows: list[Row] = []
    modules = dict(model.named_modules())
    direct: dict[str, int] = {}
    for name, param in model.named_parameters(recurse=False):
        direct[{"cls_token": "class token", "pos_embed": "position embeddings"}.get(name, name)] = \
            param.numel()
    direct_rows = [Row(name, "Parameter", tuple(param.shape), param.numel())
                   for name, param in model.named_parameters(recurse=False)]
    for name, module in modules.items():
        if name not in shapes or isinstance(module, nn.Identity | nn.Dropout | DropPath):
            continue
        if direct_rows and not name.startswith("patch_embed"):
            rows += direct_rows  # the tokens join right after the patch embedding (eq. 1)
            direct_rows = []
        rows.append(Row(name, _kind(module), shapes[name], _count(module)))
    total = sum(p.numel() for p in model.parameters())
    return Summary(config, rows, total, total - sum(direct.values()), direct,
                   sum(p.numel() for p in model.parameters() if p.requires_grad),
                   forward_flops(config, stem=model.patch_embed),
                   model.patch_embed.flops(config.img_size))


def _count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def _size_and_stem(config: ViTConfig, img_size: int | tuple[int, int] | None,
                   stem: Stem | None) -> tuple[tuple[int, int], Stem]:
    size = config.img_size if img_size is None else \
        (img_size, img_size) if isinstance(img_size, int) else tuple(img_size)
    if stem is None:
        with torch.device("meta"):
            stem = build_stem(config)
    return size, stem


def token_count(config: ViTConfig, img_size: int | tuple[int, int] | None = None,
                stem: Stem | None = None) -> int:
    """Tokens entering the encoder at `img_size` (default: the config's): the stem's token
    grid plus the prefix (class) tokens."""
    size, stem = _size_and_stem(config, img_size, stem)
    grid_h, grid_w = stem.token_grid(size)
    return grid_h * grid_w + config.num_prefix_tokens


def forward_flops(config: ViTConfig, img_size: int | tuple[int, int] | None = None,
                  stem: Stem | None = None, tokens_per_layer: Sequence[int] | None = None
                  ) -> int:
    """FLOPs of one image's forward pass at `img_size` (default: the config's), counted as
    torch.utils.flop_counter does: 2 per multiply-add of the stem's convolutions and of the
    encoder's and head's matmuls; norms, activations and softmax left out.

    `stem` is the model's stem if at hand; otherwise one is built on the meta device.
    `tokens_per_layer` is a token schedule: the tokens each layer keeps for its MLP (and hands
    to the next layer), e.g. `vitkit.inference.merging.merge_schedule` for token merging;
    default: every token through every layer. A layer that keeps fewer tokens than it attends
    over also pays token merging's bipartite matching (key similarities of sets A and B) and
    the sums over the tokens merged into one (a 0/1 matrix product).
    """
    size, stem = _size_and_stem(config, img_size, stem)
    tokens, width, mlp = token_count(config, size, stem), config.width, config.mlp_dim
    if tokens_per_layer is None:
        tokens_per_layer = [tokens] * config.depth
    if len(tokens_per_layer) != config.depth:
        raise ConfigError(f"the token schedule has {len(tokens_per_layer)} layers, the model "
                         f"{config.depth}")
    blocks = 0
    for merged in tokens_per_layer:
        patches = tokens - config.num_prefix_tokens
        r = tokens - merged
        # token merging: key similarities of sets A and B; per merged token, the sums (of
        # tokens and of sizes) over the merged tokens that share its target
        matching = 2 * ((patches + 1) // 2) * (patches // 2) * (width // config.num_heads) \
            + 2 * r * r * (width + 1) if r else 0
        blocks += (2 * tokens * width * 3 * width     # qkv
                   + 2 * 2 * tokens * tokens * width  # q k^T and A v
                   + 2 * tokens * width * width       # output projection
                   + matching
                   + 2 * 2 * merged * width * mlp)    # MLP
        tokens = merged
    head_in = config.pre_logits_dim or width
    head = 2 * width * config.pre_logits_dim + 2 * head_in * config.num_classes
    return stem.flops(size) + blocks + head
