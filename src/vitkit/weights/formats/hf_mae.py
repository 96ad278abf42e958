"""Hugging Face `ViTMAEForPreTraining` state dicts <-> `MaskedAutoencoder`, both ways.

The encoder (`vit.*`) and the decoder's blocks (`decoder.decoder_layers.N.*`) are ViT layers:
their keys are read by the ViT adapter's mapping (`vitkit.weights.formats.hf.convert_hf`),
in both transformers 4's and 5's spelling. The rest of the decoder is named here:

    decoder.decoder_embed     decoder.embed        Linear to the decoder's width
    decoder.mask_token        decoder.mask_token
    decoder.decoder_pos_embed decoder.pos_embed    fixed 2-D sin-cos table (class row zero)
    decoder.decoder_norm      decoder.norm
    decoder.decoder_pred      decoder.pred         Linear to P*P*C pixels

Writing gives transformers 5's names (`vit.layers.N.attention.q_proj`, ...), which
`ViTMAEForPreTraining.load_state_dict` takes, with a config dict for `ViTMAEConfig`.
"""

from __future__ import annotations

import re
from typing import Any

import torch

from vitkit.errors import CheckpointError, ConfigError
from vitkit.model import VisionTransformer
from vitkit.objectives.mae import MAEDecoderConfig, MaskedAutoencoder
from vitkit.weights.formats.hf import convert_hf

_DECODER_RENAMES = {
    "decoder.decoder_embed.": "embed.", "decoder.decoder_norm.": "norm.",
    "decoder.decoder_pred.": "pred.",
}
_DECODER_TENSORS = {"decoder.mask_token": "mask_token", "decoder.decoder_pos_embed": "pos_embed"}
_DECODER_LAYER = "decoder.decoder_layers."
_ACTS = {"gelu": "gelu", "gelu_tanh": "gelu_pytorch_tanh"}


def _setting(config: Any, name: str, default: Any) -> Any:
    value = config.get(name) if isinstance(config, dict) else getattr(config, name, None)
    return default if value is None else value


def mae_from_hf_state_dict(state_dict: dict[str, torch.Tensor], hf_config: Any
                           ) -> MaskedAutoencoder:
    """A `MaskedAutoencoder` holding the weights of a HF `ViTMAEForPreTraining` state dict;
    `hf_config` is its `ViTMAEConfig` (object or config.json dict). The encoder's position
    embedding is loaded and frozen, as HF's is."""
    encoder_sd, layers_sd, decoder_sd = {}, {}, {}
    for key, tensor in state_dict.items():
        if key.startswith("vit."):
            encoder_sd[key] = tensor
        elif key.startswith(_DECODER_LAYER):
            layers_sd["layers." + key.removeprefix(_DECODER_LAYER)] = tensor
        elif key in _DECODER_TENSORS:
            decoder_sd[_DECODER_TENSORS[key]] = tensor
        else:
            prefix = next((p for p in _DECODER_RENAMES if key.startswith(p)), None)
            if prefix is None:
                raise CheckpointError(f"not a Hugging Face ViTMAEForPreTraining weight: {key!r}")
            decoder_sd[_DECODER_RENAMES[prefix] + key.removeprefix(prefix)] = tensor
    config, encoder_weights = convert_hf(encoder_sd, hf_config)
    decoder = MAEDecoderConfig(
        width=_setting(hf_config, "decoder_hidden_size", 512),
        depth=_setting(hf_config, "decoder_num_hidden_layers", 8),
        num_heads=_setting(hf_config, "decoder_num_attention_heads", 16),
        mlp_dim=_setting(hf_config, "decoder_intermediate_size", 2048))
    decoder_config = {"hidden_size": decoder.width, "num_hidden_layers": decoder.depth,
                      "num_attention_heads": decoder.num_heads,
                      "intermediate_size": decoder.mlp_dim}
    _, blocks = convert_hf(layers_sd, decoder_config)
    decoder_sd.update(blocks)
    encoder = VisionTransformer(config)
    _load(encoder, encoder_weights, "encoder")
    if encoder.pos_embed is not None:
        encoder.pos_embed.requires_grad_(False)
    model = MaskedAutoencoder(encoder, decoder, _setting(hf_config, "mask_ratio", 0.75),
                              _setting(hf_config, "norm_pix_loss", False))
    _load(model.decoder, decoder_sd, "decoder")
    return model


def _load(module: torch.nn.Module, state_dict: dict[str, torch.Tensor], part: str) -> None:
    missing, unexpected = module.load_state_dict(state_dict, strict=False)
    if missing or unexpected:
        raise CheckpointError(f"the {part} weights do not fit the config: missing "
                              f"{missing[:5]}, unexpected {unexpected[:5]}; the state dict "
                              "and its ViTMAEConfig must come from the same model")


def mae_to_hf_state_dict(model: MaskedAutoencoder
                         ) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """(HF `ViTMAEForPreTraining` state dict, `ViTMAEConfig` fields) for `model`.

    HF's model has a square image, a P x P patch stem, a class token, a final LayerNorm on
    the tokens and no head; other encoders are refused, naming what to change."""
    encoder, config = model.encoder, model.encoder.config
    height, width = config.img_size
    problems = []
    if height != width:
        problems.append(f"a square image (not {height}x{width})")
    if config.stem != "patch":
        problems.append(f"the patch stem (not stem={config.stem!r})")
    if not config.class_token:
        problems.append("a class token (class_token=True)")
    if config.final_norm != "tokens":
        problems.append(f"final_norm='tokens' (not {config.final_norm!r})")
    if config.num_classes or config.pre_logits_dim:
        problems.append("no head (encoder.reset_classifier(0))")
    if problems:
        raise ConfigError("Hugging Face's ViTMAEForPreTraining needs " + ", ".join(problems))
    grid = config.grid_size
    sd: dict[str, torch.Tensor] = {
        "vit.embeddings.cls_token": encoder.cls_token,
        "vit.embeddings.position_embeddings": _positions(encoder, grid),
        "vit.embeddings.patch_embeddings.projection.weight": encoder.patch_embed.proj.weight,
        "vit.embeddings.patch_embeddings.projection.bias": encoder.patch_embed.proj.bias,
        "vit.layernorm.weight": encoder.norm.weight, "vit.layernorm.bias": encoder.norm.bias,
    }
    sd.update(_blocks(encoder.blocks, "vit.layers."))
    decoder = model.decoder
    sd.update(_blocks(decoder.blocks, _DECODER_LAYER))
    sd["decoder.mask_token"] = decoder.mask_token
    sd["decoder.decoder_pos_embed"] = decoder.positions(grid)
    for hf_prefix, prefix in _DECODER_RENAMES.items():
        for name in ("weight", "bias"):
            sd[hf_prefix + name] = getattr(decoder, prefix.rstrip("."))._parameters[name]
    sd = {key: tensor.detach().clone() for key, tensor in sd.items()}
    decoder_config = model.decoder_config
    hf_config = {
        "model_type": "vit_mae", "image_size": height, "patch_size": config.patch_size,
        "num_channels": config.in_chans, "hidden_size": config.width,
        "num_hidden_layers": config.depth, "num_attention_heads": config.num_heads,
        "intermediate_size": config.mlp_dim, "hidden_act": _ACTS[config.act],
        "qkv_bias": config.qkv_bias, "layer_norm_eps": config.norm_eps,
        "hidden_dropout_prob": config.dropout,
        "attention_probs_dropout_prob": config.attn_dropout,
        "decoder_hidden_size": decoder_config.width,
        "decoder_num_hidden_layers": decoder_config.depth,
        "decoder_num_attention_heads": decoder_config.num_heads,
        "decoder_intermediate_size": decoder_config.mlp_dim,
        "mask_ratio": model.mask_ratio, "norm_pix_loss": model.norm_pix_loss,
    }
    return sd, hf_config


def _positions(encoder: VisionTransformer, grid: tuple[int, int]) -> torch.Tensor:
    """The encoder's position table as HF stores it: the learned or fixed table, zeros for
    pos_embed='none'."""
    table = encoder.positions(grid)
    if table is None:
        return torch.zeros(1, encoder.config.seq_len, encoder.config.width)
    return table


def _blocks(blocks: torch.nn.ModuleList, prefix: str) -> dict[str, torch.Tensor]:
    """vitkit blocks in transformers 5's layer names, the fused qkv split into q, k, v."""
    sd: dict[str, torch.Tensor] = {}
    names = {"norm1": "layernorm_before", "norm2": "layernorm_after",
             "attn.proj": "attention.o_proj", "mlp.fc1": "mlp.fc1", "mlp.fc2": "mlp.fc2"}
    for index, block in enumerate(blocks):
        for key, tensor in block.state_dict(keep_vars=True).items():
            match = re.match(r"^attn\.qkv\.(weight|bias)$", key)
            if match:
                for part, chunk in zip("qkv", tensor.chunk(3, dim=0), strict=True):
                    sd[f"{prefix}{index}.attention.{part}_proj.{match.group(1)}"] = chunk
                continue
            module, name = key.rsplit(".", 1)
            sd[f"{prefix}{index}.{names[module]}.{name}"] = tensor
    return sd
