"""What a run does when a step's loss or gradients are not finite (a diverging run).

The check comes before the optimizer update, so the weights in memory stay finite.
`nonfinite="stop"` ends the run at the first such step; `"skip"` drops the step (no update,
like GradScaler's skipped steps) and ends the run after `max_skipped_steps` in a row. Either
way the run ends with a `TrainingError` that names the step, the loss, the settings to change
and the checkpoint to go on from.

The steps before a non-finite one may already have wrecked the weights (a huge learning rate
makes one finite but destroying update), so last.pt is not overwritten when a run diverges: it
keeps the checkpoint saved before the divergence, and the state at the failing step goes to
diverged.pt.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path

from vitkit.errors import TrainingError
from vitkit.train.config import TrainConfig
from vitkit.weights.formats.run_folder import DIVERGED, LAST

log = logging.getLogger("vitkit.train")
# The learning rate advised after a divergence is a tenth of the one used, and at most this:
# a rate far above any recipe's (lr=1e6) is not fixed by dividing it by ten.
MAX_ADVISED_LR = 0.01


@dataclass(frozen=True)
class StepOutcome:
    """One optimizer step: the mean loss over this rank's images, the total gradient norm
    before clipping, whether the optimizer updated the weights, and how many images this
    rank trained on (its share of the global batch under torchrun)."""

    loss: float
    grad_norm: float
    updated: bool = True
    images: int = 0

    @property
    def finite(self) -> bool:
        return math.isfinite(self.loss) and math.isfinite(self.grad_norm)


def divergence_advice(cfg: TrainConfig, amp_on: bool) -> str:
    """The settings to change after a diverging step, each with a value to try."""
    fixes = [f"a lower learning rate (e.g. lr={min(cfg.lr / 10, MAX_ADVISED_LR):g})"]
    if cfg.warmup_steps is not None:
        fixes.append(f"a longer warmup (e.g. warmup_steps={max(2 * cfg.warmup_steps, 100)})")
    else:
        fixes.append(f"a longer warmup (e.g. warmup_epochs={max(2 * cfg.warmup_epochs, 1):g})")
    if amp_on:
        fixes.append("amp=off (bf16 autocast is on)")
    if not cfg.clip_grad:
        fixes.append("gradient clipping (clip_grad=1.0; it is off)")
    return "; ".join(fixes)


DIVERGED_CHECKPOINT = DIVERGED


class NonFiniteGuard:
    """Counts non-finite steps in a row and decides: go on, skip with a warning, or stop.

    The loop tells it when last.pt was saved (`checkpoint_saved`), so the error of a diverged
    run names the last good checkpoint in `out_dir`.
    """

    def __init__(self, cfg: TrainConfig, amp_on: bool, out_dir: str | Path) -> None:
        self.cfg = cfg
        self.amp_on = amp_on
        self.out_dir = Path(out_dir)
        self.in_a_row = 0  # not saved in checkpoints: a resumed run starts counting at 0
        self.saved_step: int | None = None  # the step this process last saved last.pt at

    def checkpoint_saved(self, step: int) -> None:
        """last.pt now holds the run at `step`."""
        self.saved_step = step

    def observe(self, outcome: StepOutcome, step: int, epoch: float, lr: float
                ) -> TrainingError | None:
        """After step `step` (counted from 1): None to go on, or the error that ends the run
        (the caller saves diverged.pt, leaves last.pt as it is, then raises it)."""
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
        kept, then = self._last_good()
        return TrainingError(
            f"{head}. No update was made from it; the state at that step is saved as "
            f"{self.out_dir / DIVERGED_CHECKPOINT} (the steps before it may already have "
            f"damaged the weights). {kept} Try {divergence_advice(self.cfg, self.amp_on)}{tail}; "
            f"then {then}.")

    def _last_good(self) -> tuple[str, str]:
        """Where the last checkpoint from before the divergence is, and how to go on."""
        last = self.out_dir / LAST
        start_over = "start over with the new setting and --overwrite"
        if not last.is_file():
            return "No checkpoint was saved before the divergence.", start_over
        when = f"at step {self.saved_step}" if self.saved_step is not None else "earlier"
        return (f"The last good checkpoint, {last} (saved {when}, before the divergence), is "
                "kept.", f"continue from it with --resume {last} and the new setting, or "
                f"{start_over}")
