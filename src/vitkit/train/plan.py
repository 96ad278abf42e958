"""The plan of a training run, as pure functions of the config: how many steps, how long the
warmup, which image size each step trains at, and how many steps fit a time budget.

Nothing here touches a model, data or a clock: the loop measures, the plan decides.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

from vitkit.config import ViTConfig
from vitkit.errors import ConfigError

log = logging.getLogger("vitkit.train")

# A budget is never fitted past this many steps (a guard against a clock that reads ~0).
MAX_STEPS = 10**7
# A run estimated to take longer than this is told how many steps would fit in it.
SHORT_RUN_SECONDS = 3600


@dataclass(frozen=True)
class RunPlan:
    """What a run's config implies once the data size is known.

    `planned_steps` is the length the config asks for (`total_steps`, else epochs x batches);
    a time budget may fit another length, and the warmup then keeps its share of the run.
    `resolution_schedule` holds (fraction of the run, side) stages, the first at fraction 0.
    """

    batches_per_epoch: int
    planned_steps: int
    warmup: int
    base_size: tuple[int, int]
    patch_size: int
    prefix_tokens: int
    resolution_schedule: tuple[tuple[float, int], ...] = ()

    @classmethod
    def create(cls, model: ViTConfig, batches_per_epoch: int, epochs: float,
               total_steps: int = 0, warmup_steps: int | None = None,
               warmup_epochs: float = 0.0,
               resolution_schedule: Sequence[Sequence[float]] = ()) -> RunPlan:
        """The plan of a run of `model` with `batches_per_epoch` batches per epoch."""
        if batches_per_epoch < 1:
            raise ConfigError("a run needs at least one batch per epoch")
        planned = total_steps or max(1, math.ceil(epochs * batches_per_epoch))
        warmup = warmup_steps if warmup_steps is not None else \
            round(warmup_epochs * batches_per_epoch)
        if warmup > planned:  # one in steps, the other in epochs: TrainConfig could not tell
            warmup_words = (f"warmup_steps={warmup_steps}" if warmup_steps is not None else
                            f"warmup_epochs={warmup_epochs:g}, {warmup} steps")
            run_words = (f"total_steps={total_steps}" if total_steps else
                         f"epochs={epochs:g}, {planned} steps")
            log.warning("the warmup (%s) is longer than the run (%s): the learning rate peaks "
                        "at %.0f%% of lr; set warmup_steps=N below %d (or warmup_epochs=0)",
                        warmup_words, run_words, 100 * planned / warmup, planned)
        stages = tuple((float(start), int(side)) for start, side in resolution_schedule)
        return cls(batches_per_epoch, planned, warmup, tuple(model.img_size), model.patch_size,
                   model.num_prefix_tokens, stages)

    # -- warmup ----------------------------------------------------------------------------------
    def warmup_for(self, total_steps: int) -> int:
        """Warmup steps of a run of `total_steps`: the configured warmup, scaled down by the
        same factor when a time budget fits fewer steps than planned (so a short budget does
        not spend the whole run warming up)."""
        if total_steps >= self.planned_steps:
            return self.warmup
        return round(self.warmup * total_steps / self.planned_steps)

    # -- progressive resizing ------------------------------------------------------------------
    def resolution_at(self, step: int, total_steps: int) -> tuple[int, int]:
        """The training image size at `step` of a `total_steps` run (a stage starts at step
        ceil(fraction x total_steps))."""
        size = self.base_size
        for start, side in self.resolution_schedule:
            if step >= start * total_steps:
                size = (side, side)
        return size

    def tokens(self, size: tuple[int, int]) -> int:
        """Tokens per image at `size`: the patch grid plus the prefix (class) token."""
        return (size[0] // self.patch_size) * (size[1] // self.patch_size) + self.prefix_tokens

    def tokens_between(self, first: int, total_steps: int) -> int:
        """Tokens per image summed over steps `first`..`total_steps - 1`, stage by stage."""
        starts = {math.ceil(start * total_steps) for start, _ in self.resolution_schedule}
        bounds = [*sorted(starts | {0}), total_steps]
        tokens = 0
        for low, high in pairwise(bounds):
            steps = min(high, total_steps) - max(low, first)
            if steps > 0:
                tokens += steps * self.tokens(self.resolution_at(low, total_steps))
        return tokens

    # -- time budget -----------------------------------------------------------------------------
    def fit_to_budget(self, step: int, seconds_per_token: float, remaining_seconds: float,
                      eval_seconds: float, eval_every: int = 1) -> int:
        """The largest total step count whose remaining steps (from `step`) and evaluations fit
        in `remaining_seconds`; `step` itself (end now) when not even one more step fits
        (its step would also bring a second evaluation at once).

        A step's cost is taken as proportional to its tokens per image, so low-resolution
        stages count as the cheaper steps they are; an evaluation (`eval_seconds`) runs every
        `eval_every` epochs.
        """
        def predicted(total: int) -> float:
            train = self.tokens_between(step, total) * seconds_per_token
            evaluations = (total - step) / self.batches_per_epoch / eval_every
            return train + eval_seconds * evaluations

        if predicted(step + 1) > remaining_seconds:
            return step
        low, high = step + 1, step + 2
        while predicted(high) < remaining_seconds and high < MAX_STEPS:
            low, high = high, high * 2
        while high - low > 1:
            middle = (low + high) // 2
            low, high = (middle, high) if predicted(middle) <= remaining_seconds else (low, middle)
        return low

    # -- what the run will do, said before it does it -------------------------------------------
    def describe(self, step: int, total_steps: int, batch_size: int, accum_steps: int,
                 warmup: int, time_budget: float = 0.0) -> str:
        """One line: steps, epochs, image size(s), batch and warmup of the run from `step`."""
        epochs = (total_steps - step) / self.batches_per_epoch  # left to train
        sizes = " -> ".join(f"{side} px from {start:.0%}" for start, side in
                            self.resolution_schedule) or _size_text(self.base_size)
        batch = f"batch {batch_size:,}" + (f" ({accum_steps} accumulated micro-batches of "
                                           f"{batch_size // accum_steps:,})"
                                           if accum_steps > 1 else "")
        start = f", from step {step:,}" if step else ""
        budget = f", time budget {_duration(time_budget)}" if time_budget else ""
        left = " left" if step else ""
        warmup_text = f"warmup {count(warmup, 'step')}" if warmup else "no warmup"
        return (f"plan: {count(total_steps, 'step')}{start} ({count(epochs, 'epoch')} of "
                f"{count(self.batches_per_epoch, 'batch')}{left}), image size {sizes}, {batch}, "
                f"{warmup_text}{budget}")

    def estimate(self, step: int, total_steps: int, seconds_per_token: float,
                 time_budget: float = 0.0, source: str = "measured") -> str:
        """The time the steps left (from `step`) will take at the rate (seconds per token per
        image) `source` says how it was measured, and how to shorten the run."""
        seconds = self.tokens_between(step, total_steps) * seconds_per_token
        per_step = self.tokens(self.resolution_at(step, total_steps)) * seconds_per_token
        text = (f"estimate: {_duration(seconds)} for the {count(total_steps - step, 'step')} "
                f"left ({per_step:.3g} s/step {source}, evaluations not included)")
        if time_budget:
            return text + f"; the run is sized to its --time-budget of {_duration(time_budget)}"
        text += ("; to shorten it: total_steps=N, epochs=N or --time-budget SECONDS")
        if seconds > SHORT_RUN_SECONDS:
            fits = self.fit_to_budget(step, seconds_per_token, SHORT_RUN_SECONDS, 0.0)
            text += f" (an hour fits about total_steps={fits}, or --time-budget 3600)"
        return text


def count(amount: float, unit: str) -> str:
    """`amount` of `unit` as a sentence says it: "1 epoch", "3,333 epochs", "0.25 epochs",
    "2 batches" (a whole number without decimals, a large one rounded, the unit plural
    unless the amount is exactly one)."""
    whole = round(amount)
    if abs(amount - whole) < 0.005 * max(1.0, abs(amount)) or abs(amount) >= 100:
        text = f"{whole:,}"
        one = whole == 1
    else:
        text = f"{amount:.3g}" if abs(amount) >= 0.001 else f"{amount:.1g}"
        one = False
    plural = "batches" if unit == "batch" else unit + "s"
    return f"{text} {unit if one else plural}"


def _size_text(size: tuple[int, int]) -> str:
    return f"{size[0]} px" if size[0] == size[1] else f"{size[0]}x{size[1]} px"


def _duration(seconds: float) -> str:
    """`seconds` as people say it: 45 s, 12 min, 3.5 h, 4.1 days."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"
