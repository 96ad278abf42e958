"""The training loop, top to bottom.

`train(cfg)` sets the run up (`vitkit.train.setup.build_run`: device, model, data, optimizer,
EMA, plan, resume) and runs `run_loop`: for each epoch, for each batch, the learning rate
from the schedule and one optimisation step (`vitkit.train.step`); a diverging step stops
the run (or is skipped); the time budget is timed and fitted (`vitkit.train.budget`); at the
end of an epoch (or of the run, or when it stops early) an evaluation of the task's metrics
(classification top-1/top-5; regression mae/rmse/r2; multi-label map/f1), best.pt on a new
best of the task's primary metric, last.pt, then the metrics row (so a row on disk is one the
checkpoint holds: a save that fails writes none; a full disk ends the run with one line,
`vitkit.train.checkpoint.room_to_write`). SIGINT/SIGTERM save last.pt and stop; the
CLI exits 128 + the signal.
"""

from __future__ import annotations

import logging
import signal
from dataclasses import dataclass
from pathlib import Path

from vitkit.evaluation.loop import evaluate
from vitkit.inference.bf16 import autocast_context
from vitkit.inference.predictor import InferenceOptions, Predictor
from vitkit.tasks import Task, make_task
from vitkit.train.checkpoint import Position, resume_path, room_to_write
from vitkit.train.config import TrainConfig
from vitkit.train.distributed import (
    DistInfo,
    barrier,
    broadcast_flag,
    cleanup,
    sum_over_ranks,
)
from vitkit.train.nonfinite import NonFiniteGuard
from vitkit.train.recorder import MetricsRecorder
from vitkit.train.rundir import prepare_run_dir, undone_unless_saved
from vitkit.train.schedule import SCHEDULES
from vitkit.train.setup import Run, build_run
from vitkit.train.step_probe import first_estimate
from vitkit.train.stopping import StopRequest
from vitkit.weights.formats.run_folder import BEST, DIVERGED, LAST, METRICS_JSONL

log = logging.getLogger("vitkit.train")


@dataclass
class TrainResult:
    """How a run ended: where it is (`position`), its last evaluation row (`final`), and why
    it stopped early ("SIGINT", "SIGTERM", "time budget"; "" when it ran to its last step)."""

    out_dir: Path
    position: Position
    final: dict[str, float]
    stopped_early: str = ""
    is_main: bool = True
    num_classes: int = 0  # the model's outputs (top-5 is reported only with more than 5)
    task: str = "classification"  # which scores `format` prints
    tta: str = "none"  # the evaluations' test-time augmentation (`vitkit.inference.tta`)

    def format(self) -> str:
        """What `vitkit train` prints: one line on how the run ended, and where its files are.
        "done" when it ended as planned (its last step, or the time budget it was fitted to),
        with its final evaluation; "stopped" by a signal, with the step it stopped at, its
        last evaluation and its step, and how to continue."""
        pos = self.position
        files = f"checkpoints, metrics and learning_curve.png in {self.out_dir}"
        if self.signal_number:
            last = f"; last evaluation at step {self.final['step']}: " \
                   f"{self._scores()}" if self.final else ""
            return (f"stopped by {self.stopped_early} at step {pos.step} of "
                    f"{pos.total_steps}{last}; continue with --resume "
                    f"{self.out_dir / LAST}\n{files}")
        if not self.final:
            return files
        reason = f" ({self.stopped_early})" if self.stopped_early else ""
        return (f"done: epoch {self.final['epoch']:.2f}, step {self.final['step']}, "
                f"{self._scores()}, {self.final['minutes']:.1f} min{reason}\n{files}")

    def _scores(self) -> str:
        tta = f" ({self.tta} TTA)" if self.tta != "none" else ""
        task = make_task(self.task)
        return task.final_words(self.final, self.num_classes) + tta + ema_words(self.final, task)

    @property
    def signal_number(self) -> int:
        """The signal that stopped the run (SIGINT 2, SIGTERM 15), else 0."""
        stopped_by_signal = self.stopped_early in ("SIGINT", "SIGTERM")
        return signal.Signals[self.stopped_early].value if stopped_by_signal else 0

    @property
    def exit_status(self) -> int:
        """What the CLI exits with: 128 + the signal number when one stopped the run (130,
        143, as schedulers expect), else 0."""
        return 128 + self.signal_number if self.signal_number else 0


def train(cfg: TrainConfig, resume: str | Path | None = None,
          overwrite: bool = False) -> TrainResult:
    """Train with `cfg` (resuming from a checkpoint when given) into `cfg.out_dir`, which must
    not hold another run unless this one continues it or `overwrite` clears it
    (`vitkit.train.rundir.prepare_run_dir`). A run refused, or failing, before its first
    checkpoint leaves the folder as it was (`undone_unless_saved`), so the corrected command
    can start there."""
    resume = resume_path(resume) if resume is not None else None  # a run folder: its last.pt
    # a full disk under any write of the run: one line that names the file (`room_to_write`)
    with room_to_write(cfg.out_dir), undone_unless_saved(cfg.out_dir):
        prepare_run_dir(cfg.out_dir, resume, overwrite)
        return run_loop(build_run(cfg, resume))


def run_loop(run: Run) -> TrainResult:
    """Train `run` to its last step, or until it stops early."""
    cfg, pos, info, clock, stop = run.cfg, run.position, run.info, run.clock, run.stop
    recorder = MetricsRecorder(run.out_dir, cfg.log, pos.history,
                               run.task.primary_metric) if info.is_main else None
    stop.catch_signals()
    clock.start(pos)
    schedule = SCHEDULES[cfg.schedule]
    per_epoch = run.plan.batches_per_epoch
    final: dict[str, float] = {}
    guard = NonFiniteGuard(cfg, run.amp_dtype is not None, run.out_dir)
    if pos.step >= pos.total_steps:
        log.warning("nothing to train: the run is at step %d of %d; a larger epochs= or "
                    "--time-budget with --resume extends it", pos.step, pos.total_steps)
        if recorder is not None and not (run.out_dir / LAST).exists():
            run.save(LAST)  # resumed into another --out: the folder holds the run
            recorder.plot(pos.history)
            log.info("wrote the run's last.pt and learning curve to %s", run.out_dir)
    elif info.is_main:
        log.info("%s", run.plan.describe(pos.step, pos.total_steps, cfg.batch_size,
                                         cfg.accum_steps, run.warmup_steps, cfg.time_budget))
        log.info("%s", first_estimate(run))
    bar, failed = None, True
    try:
        while pos.step < pos.total_steps and not any_rank_stopping(stop, info):
            bar = _progress_bar(run, per_epoch)
            epoch_loss, epoch_images = 0.0, 0  # this rank's, in this process
            carried = (pos.epoch_loss, pos.epoch_images) if pos.batch else (0.0, 0)
            clock.start_epoch()
            for batch_index, images, labels in run.data.feed.epoch(pos.epoch, pos.batch):
                lr = cfg.lr * schedule(pos.step, pos.total_steps, run.warmup_steps,
                                       cfg.min_lr_ratio)
                outcome = run.step(images, labels, lr, pos)
                step_tokens = run.plan.tokens(tuple(run.model.config.img_size))
                pos.step += 1  # a skipped step uses up its batch and schedule position
                pos.batch = batch_index + 1
                if outcome.updated:  # this rank's images: the sum over ranks counts each once
                    epoch_loss += outcome.loss * outcome.images
                    epoch_images += outcome.images
                diverged = guard.observe(outcome, pos.step, pos.epoch + pos.batch / per_epoch,
                                         lr)
                if diverged is not None:  # last.pt keeps the checkpoint from before it
                    run.save(DIVERGED)
                    raise diverged
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(step=f"{pos.step}/{pos.total_steps}",
                                    loss=f"{outcome.loss:.3f}", lr=f"{lr:.2e}", refresh=False)
                rate = clock.after_step(pos, step_tokens)
                moved = run.threads.check() if run.threads is not None else None
                if moved is not None and info.is_main:
                    log.info("%s", moved)
                if rate is not None and info.is_main and pos.step < pos.total_steps:
                    log.info("%s", run.plan.estimate(pos.step, pos.total_steps, rate,
                                                     cfg.time_budget))
                if clock.out_of_time(pos) and not stop.reason:
                    stop.reason = "time budget"
                if broadcast_flag(bool(stop.reason), info):
                    stop.reason = stop.reason or "stopped by another rank"
                    break
                if pos.step >= pos.total_steps:
                    break
            if bar is not None:
                bar.close()
            # one decision for every rank, taken once: a signal may land after the check in
            # the loop, or later in this epoch's end, on one rank only
            stopping = broadcast_flag(bool(stop.reason), info)
            if stopping:
                stop.reason = stop.reason or "stopped by another rank"
            train_seconds = clock.end_epoch()
            loss_here, images_here = sum_over_ranks(epoch_loss, epoch_images, info)
            loss_sum, images = carried[0] + loss_here, carried[1] + images_here
            epoch_done = pos.batch >= per_epoch
            scheduled = epoch_done and (pos.epoch + 1) % cfg.eval_every == 0
            if epoch_done:  # before the evaluation, so a best.pt it saves resumes past it
                pos.epoch, pos.batch = pos.epoch + 1, 0
            pos.epoch_loss, pos.epoch_images = (0.0, 0) if epoch_done else (loss_sum, images)
            if epoch_done and not stopping:  # before the evaluation: a budget spent here
                clock.refit_after_epoch(pos)   # ends the run at this step, evaluated once
            evaluated, row = False, {}  # a signalled rank skips it, so every rank does too
            if not broadcast_flag(stop.signalled(), info) and (
                    scheduled or pos.step >= pos.total_steps or stopping):
                with clock.timing_evaluation():
                    row = evaluate_and_log(run, loss_sum / max(images, 1),
                                           images_here / max(train_seconds, 1e-9),
                                           recorder)
                final, evaluated = row or final, True
            # an evaluation that spent the budget ends the run here, evaluated (rather than
            # one more step and a second evaluation); every rank asks, so all stop together
            if cfg.time_budget and broadcast_flag(evaluated and clock.out_of_time(pos), info) \
                    and not stop.reason:
                stop.reason = "time budget"
            run.save(LAST)
            if recorder is not None and row:  # once last.pt holds it: a resume keeps it
                with room_to_write(run.out_dir / METRICS_JSONL):  # then metrics.csv, the curve
                    recorder.write(row, pos.history)
            guard.checkpoint_saved(pos.step)
            run.data.write_skipped(run.out_dir, info)
        # Checked after the loop, not inside it: a signal can land during an evaluation or a
        # save, after the in-loop check, and must still be reported.
        if stop.signalled():
            log.warning("%s: saved %s; continue with --resume", stop.reason,
                        run.out_dir / LAST)
        failed = False
    finally:
        if bar is not None:  # an error (a divergence) is then printed on a line of its own
            bar.close()
        stop.release_signals()
        run.data.feed.close()
        if not failed:  # a rank that fails leaves at once, so the others' next collective
            barrier(info)  # fails too instead of waiting in this barrier
        if recorder is not None:
            recorder.close()
        cleanup(info)
    return TrainResult(run.out_dir, pos, final, stop.reason, info.is_main,
                       run.model.config.num_classes, run.task.kind, cfg.tta)


def any_rank_stopping(stop: StopRequest, info: DistInfo) -> bool:
    """Whether any rank has a reason to stop, asked of every rank at once before an epoch, so
    a signal that reaches one rank (also during rank 0's save) stops them all together."""
    if broadcast_flag(bool(stop.reason), info):
        stop.reason = stop.reason or "stopped by another rank"
        return True
    return False


def evaluate_and_log(run: Run, train_loss: float, images_per_s: float,
                     recorder: MetricsRecorder | None) -> dict[str, float]:
    """Evaluate the model (and the EMA), log a row, and save best.pt on a new best; the row
    reaches the metrics files later (`MetricsRecorder.write`), once last.pt holds it.
    `train_loss`: the epoch's mean over every rank's images (a resumed epoch's included);
    `images_per_s`: every rank's images over this process's time training the epoch.

    Which weights the checkpoints hold is decided here, once: the EMA's when they scored
    better than the raw model's at this evaluation (the task's primary metric: top-1, R^2 or
    mAP), else the raw ones.
    """
    cfg, pos, task = run.cfg, run.position, run.task
    primary = task.primary_metric
    size = tuple(run.model.config.img_size)

    def score(model):  # the live model in the run's autocast, with the recipe's TTA
        predictor = Predictor.from_model(model, InferenceOptions(tta=cfg.tta),
                                         context=autocast_context(run.device, run.amp_dtype),
                                         device=run.device, image_size=size,
                                         preprocess=run.preprocess)
        return evaluate(predictor, run.data.evaluation, task, batch_size=cfg.eval_batch_size,
                        ranks=run.info, should_stop=run.stop.signalled)

    result = score(run.model)
    if result.interrupted:  # SIGINT/SIGTERM mid-evaluation: no row, the run stops
        return {}
    row: dict[str, float] = {
        "epoch": pos.epoch + pos.batch / run.plan.batches_per_epoch, "step": pos.step,
        "resolution": size[0],
        "train_loss": train_loss, **result.as_dict(),
        "images_per_s": images_per_s, "minutes": run.clock.used(pos) / 60,
    }
    if cfg.compile:  # seconds of this process's steps that compiled, within "minutes"
        row["compile_s"] = run.compile_clock.seconds
    if run.ema is not None:
        ema_result = score(run.ema.module)
        if ema_result.interrupted:
            return {}
        row[f"ema_{primary}"] = ema_result.score
    pos.history.append(row)
    ema_won = run.ema is not None and task.better(row[f"ema_{primary}"], row[primary])
    run.scored_weights = "ema" if ema_won else "raw"
    best = row[f"ema_{primary}"] if ema_won else row[primary]
    if task.better(best, pos.best_score):
        pos.best_score = best
        run.save(BEST)
    if recorder is not None:
        log.info("epoch %.2f  loss %.4f  %s%s  %.0f img/s", row["epoch"], row["train_loss"],
                 task.epoch_words(row, run.model.config.num_classes), ema_words(row, task),
                 row["images_per_s"])
    return row


def ema_words(row: dict[str, float], task: Task) -> str:
    """"; EMA weights 87.74% (the ones saved)" for a row that scored the weights' moving
    average too (`ema_decay`): which of the two the checkpoints hold is the better one."""
    primary = task.primary_metric
    if f"ema_{primary}" not in row:
        return ""
    ema = row[f"ema_{primary}"]
    saved = "the ones saved" if ema > row[primary] else "the raw ones are saved"
    return f"; EMA weights {task.metric_text(ema)} ({saved})"


def _progress_bar(run: Run, per_epoch: int):
    """A tqdm bar over the epoch's steps (progress=true, main rank), from the next batch; its
    postfix counts the run's steps."""
    if not (run.cfg.progress and run.info.is_main):
        return None
    from tqdm.auto import tqdm

    pos = run.position
    return tqdm(total=per_epoch, initial=pos.batch, desc=f"epoch {pos.epoch + 1}",
                unit="step", dynamic_ncols=True, leave=False)
