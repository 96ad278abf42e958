"""The official JAX/Flax ViT (vit_jax `models_vit.py` / `models_resnet.py`, linen) run on
an official-layout .npz: the reference that vitkit's loaded checkpoints must reproduce.

Needs jax and flax (not vitkit's dependencies; use a separate environment):

    python -m venv jaxenv && jaxenv/bin/pip install jax flax
    jaxenv/bin/python tools/official_jax_reference.py CKPT.npz IMAGES.npy LOGITS.npy [float64]

IMAGES.npy holds float32 (B, H, W, C) images already normalised. The module structure, Flax's
defaults (tanh GELU, LayerNorm and GroupNorm epsilon 1e-6, "SAME" padding) and the
weight standardisation follow the official code; the pre-linen names of the original
release are mapped to linen names as the official `checkpoint.py` does.
"""

from __future__ import annotations

import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax.traverse_util import unflatten_dict


def weight_standardize(w, axis, eps):
    w = w - jnp.mean(w, axis=axis)
    return w / (jnp.std(w, axis=axis) + eps)


class StdConv(nn.Conv):
    def param(self, name, *args, **kwargs):
        param = super().param(name, *args, **kwargs)
        if name == "kernel":
            param = weight_standardize(param, axis=[0, 1, 2], eps=1e-5)
        return param


class ResidualUnit(nn.Module):
    features: int
    strides: tuple = (1, 1)

    @nn.compact
    def __call__(self, x):
        needs_projection = x.shape[-1] != self.features * 4 or self.strides != (1, 1)
        residual = x
        if needs_projection:
            residual = StdConv(self.features * 4, (1, 1), self.strides, use_bias=False,
                               name="conv_proj")(residual)
            residual = nn.GroupNorm(name="gn_proj")(residual)
        y = StdConv(self.features, (1, 1), use_bias=False, name="conv1")(x)
        y = nn.relu(nn.GroupNorm(name="gn1")(y))
        y = StdConv(self.features, (3, 3), self.strides, use_bias=False, name="conv2")(y)
        y = nn.relu(nn.GroupNorm(name="gn2")(y))
        y = StdConv(self.features * 4, (1, 1), use_bias=False, name="conv3")(y)
        y = nn.GroupNorm(name="gn3")(y)
        return nn.relu(residual + y)


class ResNetStage(nn.Module):
    block_size: int
    nout: int
    first_stride: tuple

    @nn.compact
    def __call__(self, x):
        x = ResidualUnit(self.nout, strides=self.first_stride, name="unit1")(x)
        for i in range(1, self.block_size):
            x = ResidualUnit(self.nout, strides=(1, 1), name=f"unit{i + 1}")(x)
        return x


class AddPositionEmbs(nn.Module):
    @nn.compact
    def __call__(self, x):
        return x + self.param("pos_embedding", nn.initializers.zeros, (1, *x.shape[1:]))


class MlpBlock(nn.Module):
    mlp_dim: int

    @nn.compact
    def __call__(self, x):
        y = nn.gelu(nn.Dense(self.mlp_dim)(x))
        return nn.Dense(x.shape[-1])(y)


class Encoder1DBlock(nn.Module):
    mlp_dim: int
    num_heads: int

    @nn.compact
    def __call__(self, inputs):
        x = nn.LayerNorm()(inputs)
        x = nn.MultiHeadDotProductAttention(num_heads=self.num_heads)(x, x)
        x = x + inputs
        y = nn.LayerNorm()(x)
        return x + MlpBlock(self.mlp_dim)(y)


class Encoder(nn.Module):
    num_layers: int
    mlp_dim: int
    num_heads: int

    @nn.compact
    def __call__(self, x):
        x = AddPositionEmbs(name="posembed_input")(x)
        for i in range(self.num_layers):
            x = Encoder1DBlock(self.mlp_dim, self.num_heads, name=f"encoderblock_{i}")(x)
        return nn.LayerNorm(name="encoder_norm")(x)


class VisionTransformer(nn.Module):
    patch: int
    hidden_size: int
    num_layers: int
    mlp_dim: int
    num_heads: int
    classifier: str
    representation_size: int | None
    num_classes: int
    resnet_layers: tuple | None
    resnet_width: int = 64

    @nn.compact
    def __call__(self, x):
        if self.resnet_layers is not None:
            width = self.resnet_width
            x = StdConv(width, (7, 7), (2, 2), use_bias=False, name="conv_root")(x)
            x = nn.relu(nn.GroupNorm(name="gn_root")(x))
            x = nn.max_pool(x, window_shape=(3, 3), strides=(2, 2), padding="SAME")
            if self.resnet_layers:
                x = ResNetStage(self.resnet_layers[0], width, (1, 1), name="block1")(x)
                for i, size in enumerate(self.resnet_layers[1:], 1):
                    x = ResNetStage(size, width * 2**i, (2, 2), name=f"block{i + 1}")(x)
        x = nn.Conv(self.hidden_size, (self.patch, self.patch), (self.patch, self.patch),
                    padding="VALID", name="embedding")(x)
        n, h, w, c = x.shape
        x = jnp.reshape(x, [n, h * w, c])
        if self.classifier == "token":
            cls = self.param("cls", nn.initializers.zeros, (1, 1, c))
            x = jnp.concatenate([jnp.tile(cls, [n, 1, 1]), x], axis=1)
        x = Encoder(self.num_layers, self.mlp_dim, self.num_heads, name="Transformer")(x)
        x = x[:, 0] if self.classifier == "token" else jnp.mean(x, axis=1)
        if self.representation_size is not None:
            x = nn.tanh(nn.Dense(self.representation_size, name="pre_logits")(x))
        if self.num_classes:
            x = nn.Dense(self.num_classes, name="head")(x)
        return x


_PRE_LINEN = {"MultiHeadDotProductAttention_1": "MultiHeadDotProductAttention_0",
              "MlpBlock_3": "MlpBlock_0", "LayerNorm_2": "LayerNorm_1"}


def load_params(path: str) -> tuple[VisionTransformer, dict]:
    arrays = dict(np.load(path, allow_pickle=False))
    arrays = {k.removeprefix("opt/target/"): v for k, v in arrays.items()}
    params = {}
    for key, value in arrays.items():
        parts = [_PRE_LINEN.get(p, p) for p in key.split("/")]
        if len(parts) > 1 and parts[-2].startswith("gn") and parts[-1] in ("scale", "bias"):
            value = value.reshape(-1)  # the released files store (1, 1, 1, C)
        params[tuple(parts)] = value
    tree = unflatten_dict(params)
    block = tree["Transformer"]["encoderblock_0"]
    query = block["MultiHeadDotProductAttention_0"]["query"]["kernel"]
    layers = None
    if "conv_root" in tree:
        layers, stage = [], 1
        while f"block{stage}" in tree:
            layers.append(len(tree[f"block{stage}"]))
            stage += 1
        layers = tuple(layers)
    model = VisionTransformer(
        patch=tree["embedding"]["kernel"].shape[0], hidden_size=query.shape[0],
        num_layers=sum(k.startswith("encoderblock_") for k in tree["Transformer"]),
        mlp_dim=block["MlpBlock_0"]["Dense_0"]["kernel"].shape[1], num_heads=query.shape[1],
        classifier="token" if "cls" in tree else "gap",
        representation_size=tree["pre_logits"]["kernel"].shape[1] if "pre_logits" in tree
        else None,
        num_classes=tree["head"]["kernel"].shape[1] if "head" in tree else 0,
        resnet_layers=layers,
        resnet_width=tree["conv_root"]["kernel"].shape[3] if "conv_root" in tree else 64)
    return model, tree


def main(ckpt: str, images: str, out: str, precision: str = "float32") -> None:
    """`precision="float64"` (with JAX_ENABLE_X64=1) runs the reference in double precision."""
    model, params = load_params(ckpt)
    dtype = np.float64 if precision == "float64" else np.float32
    params = jax.tree_util.tree_map(lambda a: np.asarray(a, dtype), params)
    logits = model.apply({"params": params}, jnp.asarray(np.load(images), dtype=dtype))
    np.save(out, np.asarray(logits, dtype=dtype))


if __name__ == "__main__":
    main(*sys.argv[1:5])
