"""The run's clock against its time budget (`time_budget` seconds, the time its checkpoint
already used included).

Every run is timed from its second step on: after `ESTIMATE_STEPS` timed steps the measured
rate is handed to the loop, which logs the run's estimated duration (`RunPlan.estimate`).
The budget sizes the run: once the first steps are timed (from the second step after the
start, for up to 20 steps; a recompile is no rate, so compile seconds are left out), the
schedule is fitted to the time left, and again after every epoch with the median rate of the
last `RATE_EPOCHS` epochs and of as many last evaluations' seconds (`RunPlan.fit_to_budget`:
the plan decides, the clock measures). The medians keep one slow epoch (another process busy
on the same cores) from re-sizing the run: a refit on that epoch alone would cut the run to a
fraction of its length and start its last resolution stage far too early, and a stage once
started is kept (the step never shrinks the images again).
"""

from __future__ import annotations

import logging
import statistics
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager

from vitkit.train.checkpoint import Position
from vitkit.train.compiling import CompileClock
from vitkit.train.distributed import DistInfo, min_over_ranks
from vitkit.train.plan import RunPlan

log = logging.getLogger("vitkit.train")
ESTIMATE_STEPS = 3  # timed steps behind the duration estimate
RATE_EPOCHS = 3  # a refit takes the median seconds per token of this many last epochs


class BudgetClock:
    """This process's training time, and the schedule re-fitted to the budget it leaves."""

    def __init__(self, budget: float, eval_every: int, plan: RunPlan,
                 compile_clock: CompileClock, info: DistInfo | None = None) -> None:
        self.budget = budget  # seconds; 0: no budget
        self.eval_every = eval_every
        self.plan = plan
        self.compile_clock = compile_clock
        self.info = info or DistInfo()  # under torchrun: the ranks share one fitted schedule
        self._epoch_rates: deque[float] = deque(maxlen=RATE_EPOCHS)  # seconds per token
        self._eval_times: deque[float] = deque(maxlen=RATE_EPOCHS)  # seconds
        self._started: float | None = None

    # -- wall time ---------------------------------------------------------------------------------
    def start(self, pos: Position) -> None:
        """The loop starts at `pos`: the clock runs, and the first steps will be timed."""
        self._started = time.perf_counter()
        per_epoch = self.plan.batches_per_epoch
        self._calibrate_at = pos.step + min(20, max(per_epoch // 4, 3))
        self._calibrate_from = (pos.step + 2, time.perf_counter(), 0.0)
        self._estimate_at = pos.step + 2 + ESTIMATE_STEPS

    def elapsed(self) -> float:
        """Seconds since `start` (0 before it)."""
        return time.perf_counter() - self._started if self._started is not None else 0.0

    def used(self, pos: Position) -> float:
        """The run's training time: what its checkpoint used and this process's."""
        return pos.elapsed + self.elapsed()

    def out_of_time(self, pos: Position) -> bool:
        return bool(self.budget) and self.used(pos) >= self.budget

    # -- measuring ---------------------------------------------------------------------------------
    def start_epoch(self) -> None:
        self._epoch_start = time.perf_counter()
        self._epoch_compile = self.compile_clock.seconds
        self._epoch_tokens = 0

    def after_step(self, pos: Position, step_tokens: int) -> float | None:
        """Count a step of `step_tokens` tokens per image; time the first steps, and at the
        last of them fit the schedule to the budget. Returns the measured seconds per token
        per image once, after `ESTIMATE_STEPS` timed steps (for the duration estimate)."""
        self._epoch_tokens += step_tokens
        if pos.step == self._calibrate_from[0]:
            self._calibrate_from = (pos.step, time.perf_counter(), self.compile_clock.seconds)
        if self.budget and pos.step == self._calibrate_at:
            seconds, steps = self._timed(pos)
            self.fit(pos, seconds / (steps * step_tokens))
        if pos.step == self._estimate_at:
            seconds, steps = self._timed(pos)
            return seconds / (steps * step_tokens)
        return None

    def _timed(self, pos: Position) -> tuple[float, int]:
        """Seconds and steps timed since the second step (compile seconds left out)."""
        steps = max(pos.step - self._calibrate_from[0], 1)
        seconds = time.perf_counter() - self._calibrate_from[1]
        seconds -= self.compile_clock.seconds - self._calibrate_from[2]  # a recompile is no rate
        return max(seconds, 0.0), steps

    def end_epoch(self) -> float:
        """The epoch's training seconds (its steps' rate, compile seconds left out, is kept
        for `refit_after_epoch`)."""
        train_seconds = time.perf_counter() - self._epoch_start
        self._step_seconds = train_seconds - (self.compile_clock.seconds - self._epoch_compile)
        return train_seconds

    @contextmanager
    def timing_evaluation(self) -> Iterator[None]:
        start = time.perf_counter()
        yield
        self._eval_times.append(time.perf_counter() - start)

    @property
    def eval_seconds(self) -> float:
        """An evaluation's seconds: the median of the last ones (0 before the first)."""
        return statistics.median(self._eval_times) if self._eval_times else 0.0

    # -- fitting -----------------------------------------------------------------------------------
    def refit_after_epoch(self, pos: Position) -> None:
        """Fit the rest of the run with the median rate of the last epochs (this one
        included) and the median seconds of the last evaluations."""
        self._epoch_rates.append(self._step_seconds / max(self._epoch_tokens, 1))
        if self.budget:
            self.fit(pos, statistics.median(self._epoch_rates))

    def fit(self, pos: Position, seconds_per_token: float) -> None:
        """Re-plan the run's length so the rest ends within the budget at `seconds_per_token`
        (a step's seconds per token per image). Under torchrun every rank takes the smallest
        fit of any rank (each times its own clock), so all follow one schedule and stop at
        the same step."""
        plan = self.plan
        remaining = self.budget - self.used(pos) - self.eval_seconds
        before = pos.total_steps
        fitted = plan.fit_to_budget(pos.step, seconds_per_token, remaining,
                                    self.eval_seconds, self.eval_every)
        pos.total_steps = min_over_ranks(fitted, self.info)
        if pos.total_steps < plan.planned_steps <= before:
            log.warning("the %.0f s time budget fits %d of the %d planned steps (%.2f epochs); "
                        "the schedule and its %d warmup steps are scaled to fit (warmup %d)",
                        self.budget, pos.total_steps, plan.planned_steps,
                        pos.total_steps / plan.batches_per_epoch, plan.warmup,
                        plan.warmup_for(pos.total_steps))
