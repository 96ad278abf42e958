"""A layer table with output shapes and parameter counts, and the model's FLOPs.

Shapes come from a forward pass on the meta device, so even ViT-H costs no memory.
The totals split parameters held by layers (Conv2d/Linear/LayerNorm: what torchsummary
counts) from those held directly by the model (class token, position embeddings).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from vitkit.config import ViTConfig
from vitkit.model.layers import DropPath
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
        out = [f"{cfg.name or 'ViT'}: image {cfg.img_size[0]}x{cfg.img_size[1]}x{cfg.in_chans}, "
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
               "(matmuls; 1 multiply-add = 2 FLOPs)"]
        return "\n".join(out)


def _flops_text(flops: int) -> str:
    return f"{flops / 1e9:,.2f} GFLOPs" if flops >= 1e9 else f"{flops / 1e6:,.2f} MFLOPs"


def _kind(module: nn.Module) -> str:
    return type(module).__name__


def summarize(config: ViTConfig, max_depth: int = 1) -> Summary:
    """Build `config` on the meta device, run one image through it and tabulate."""
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
        model(torch.zeros(1, config.in_chans, *config.img_size, device="meta"))
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
                   forward_flops(config))


def _count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def forward_flops(config: ViTConfig) -> int:
    """Matmul FLOPs of one image's forward pass (2 per multiply-add; norms etc. left out)."""
    tokens, width, mlp = config.seq_len, config.width, config.mlp_dim
    per_block = (2 * tokens * width * 3 * width      # qkv
                 + 2 * 2 * tokens * tokens * width   # q k^T and A v
                 + 2 * tokens * width * width        # output projection
                 + 2 * 2 * tokens * width * mlp)     # MLP
    head_in = config.pre_logits_dim or width
    head = 2 * width * config.pre_logits_dim + 2 * head_in * config.num_classes
    return _stem_flops(config) + config.depth * per_block + head


def _stem_flops(config: ViTConfig) -> int:
    """The patch projection, or the conv stem's 3x3 convolutions and 1x1 projection."""
    if config.stem != "conv":
        return 2 * config.num_patches * config.in_chans * config.patch_size**2 * config.width
    height, width = config.img_size
    halvings = config.patch_size.bit_length() - 1
    flops, previous = 0, config.in_chans
    for index, channels in enumerate(config.stem_channels):
        if index >= len(config.stem_channels) - halvings:
            height, width = (height + 1) // 2, (width + 1) // 2
        flops += 2 * height * width * previous * 9 * channels
        previous = channels
    return flops + 2 * config.num_patches * previous * config.width
