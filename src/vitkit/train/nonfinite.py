"""What a run does when a step's loss or gradients are not finite (a diverging run).

The check comes before the optimizer update, so the weights in memory (and every checkpoint
written from them) stay finite. `nonfinite="stop"` ends the run at the first such step;
`"skip"` drops the step (no update, like GradScaler's skipped steps) and ends the run after
`max_skipped_steps` in a row. Either way the run ends with a `TrainingError` that names the
step, the loss and the settings to change.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

from vitkit.errors import TrainingError
from vitkit.train.config import TrainConfig

log = logging.getLogger("vitkit.train")


@dataclass(frozen=True)
class StepOutcome:
    """One optimizer step: the batch's mean loss, the total gradient norm before clipping,
    and whether the optimizer updated the weights."""

    loss: float
    grad_norm: float
    updated: bool = True

    @property
    def finite(self) -> bool:
        return math.isfinite(self.loss) and math.isfinite(self.grad_norm)


def divergence_advice(cfg: TrainConfig, amp_on: bool) -> str:
    """The settings to change after a diverging step, each with a value to try."""
    fixes = [f"a lower learning rate (e.g. lr={cfg.lr / 10:g})"]
    if cfg.warmup_steps is not None:
        fixes.append(f"a longer warmup (e.g. warmup_steps={max(2 * cfg.warmup_steps, 100)})")
    else:
        fixes.append(f"a longer warmup (e.g. warmup_epochs={max(2 * cfg.warmup_epochs, 1):g})")
    if amp_on:
        fixes.append("amp=off (bf16 autocast is on)")
    if not cfg.clip_grad:
        fixes.append("gradient clipping (clip_grad=1.0; it is off)")
    return "; ".join(fixes)


class NonFiniteGuard:
    """Counts non-finite steps in a row and decides: go on, skip with a warning, or stop."""

    def __init__(self, cfg: TrainConfig, amp_on: bool) -> None:
        self.cfg = cfg
        self.amp_on = amp_on
        self.in_a_row = 0  # not saved in checkpoints: a resumed run starts counting at 0

    def observe(self, outcome: StepOutcome, step: int, epoch: float, lr: float
                ) -> TrainingError | None:
        """After step `step` (counted from 1): None to go on, or the error that ends the run
        (the caller saves last.pt first, then raises it)."""
        if outcome.finite:
            self.in_a_row = 0
            return None
        self.in_a_row += 1
        what = (f"the loss was {outcome.loss:.4g} and the gradient norm {outcome.grad_norm:.4g} "
                f"at step {step} (epoch {epoch:.2f}, learning rate {lr:.3g})")
        if self.cfg.nonfinite == "skip" and self.in_a_row < self.cfg.max_skipped_steps:
            log.warning("step %d skipped (nonfinite=skip, %d of %d in a row): %s", step,
                        self.in_a_row, self.cfg.max_skipped_steps, what)
            return None
        if self.cfg.nonfinite == "skip":
            head = (f"training diverged: {self.in_a_row} steps in a row were not finite "
                    f"(max_skipped_steps={self.cfg.max_skipped_steps}); at the last one {what}")
            tail = ""
        else:
            head = f"training diverged: {what}"
            tail = "; or nonfinite=skip to drop such steps"
        return TrainingError(
            f"{head}. No update was made from it: last.pt holds the weights of the last finite "
            f"step. Try {divergence_advice(self.cfg, self.amp_on)}{tail}; then start over "
            "with --overwrite, or continue with --resume and the new setting.")
