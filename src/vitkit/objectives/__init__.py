"""Pre-training objectives: each one module wrapping a vitkit encoder with what it trains.

    mae.py      masked autoencoder (He et al. 2021): `MaskedAutoencoder`, `MAEDecoderConfig`
    mpp.py      masked patch prediction (the ViT paper's Appendix B.1.2):
                `MaskedPatchPrediction`, `MPPConfig`

Hugging Face's `ViTMAEForPreTraining` layout is read and written by
`vitkit.weights.formats.hf_mae`, beside the other formats.
"""

from vitkit.objectives.mae import (
    MAEDecoderConfig,
    MAEOutput,
    MaskedAutoencoder,
    fix_mae_positions_,
    patchify,
    random_masking,
    unpatchify,
)
from vitkit.objectives.mpp import (
    MaskedPatchPrediction,
    MPPConfig,
    MPPOutput,
    color_targets,
    corrupt,
    mpp_loss,
)

__all__ = ["MAEDecoderConfig", "MAEOutput", "MPPConfig", "MPPOutput", "MaskedAutoencoder",
           "MaskedPatchPrediction", "color_targets", "corrupt", "fix_mae_positions_", "mpp_loss",
           "patchify", "random_masking", "unpatchify"]
