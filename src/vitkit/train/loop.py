"""The training loop: AdamW or SGD, warmup + cosine, clipping, accumulation, EMA, evaluation
every epoch, atomic checkpoints with exact resume, time budgets, DDP under torchrun, and
fine-tuning from pretrained weights (`init_from`)."""

from __future__ import annotations

import logging
import math
import signal
import time
from contextlib import nullcontext, suppress
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel

from vitkit.config import ViTConfig
from vitkit.data.augment import AugmentConfig, BatchAugment, resize_batch, soft_cross_entropy
from vitkit.data.dataset import DataError, ImageDataset
from vitkit.data.feeds import (
    EvaluationFeed,
    TrainingFeed,
    evaluation_feed,
    record_count,
    training_feed,
)
from vitkit.data.loader import BatchOrder, shard
from vitkit.data.skipped import write_skipped_files
from vitkit.data.sources import Records, open_source
from vitkit.data.transforms import InceptionCrop, evaluation_preprocess
from vitkit.errors import CheckpointError, ConfigError
from vitkit.evaluation.classify import evaluate
from vitkit.model.posembed import resample_grid_embed
from vitkit.model.vit import VisionTransformer
from vitkit.preprocess import Preprocess
from vitkit.runtime import check_device, configure_cpu
from vitkit.train.compiling import CompileClock, compile_for_training
from vitkit.train.config import TrainConfig
from vitkit.train.distributed import (
    DistInfo,
    barrier,
    broadcast_flag,
    cleanup,
    init_distributed,
)
from vitkit.train.finetune import (
    config_from_run,
    pretrained_model,
    read_init,
    resize_random_crop,
    target_config,
)
from vitkit.train.memory import check_fits_in_memory
from vitkit.train.nonfinite import NonFiniteGuard, StepOutcome
from vitkit.train.optim import build_optimizer
from vitkit.train.plan import RunPlan
from vitkit.train.recorder import MetricsRecorder
from vitkit.train.rundir import prepare_run_dir
from vitkit.train.schedule import SCHEDULES
from vitkit.weights.formats import train_checkpoint
from vitkit.weights.formats.train_checkpoint import Position, TrainCheckpoint

log = logging.getLogger("vitkit.train")


@dataclass
class TrainResult:
    out_dir: Path
    position: Position
    final: dict[str, float]
    stopped_early: str = ""
    is_main: bool = True

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


def pick_device(name: str) -> torch.device:
    """The torch device for a `device=` setting, refused clearly when this machine lacks it."""
    check_device(name)
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def check_data_fits(config: ViTConfig, train: Records, resize: bool = False) -> None:
    """Refuse data the model cannot take, naming the fix (`resize`: images of another size
    are resized to the model's, as when fine-tuning at a higher resolution). Streamed records
    are decoded to the model's channels and size, so only their labels are checked."""
    if train.labels is None:
        return  # a stream's labels are only known as it is read (its classes size the head)
    labels = torch.as_tensor(train.labels)
    top = int(labels.max())
    if top >= config.num_classes or int(labels.min()) < 0:
        raise DataError(f"labels run from {int(labels.min())} to {top} but the head has "
                        f"{config.num_classes} outputs: set model.num_classes={top + 1}")
    if train.streamed:
        return
    if train.channels != config.in_chans:
        raise DataError(f"the data has {train.channels} channel(s) but the model takes "
                        f"{config.in_chans}: set model.in_chans={train.channels}")
    if train.image_size != config.img_size and not resize:
        raise DataError(f"the images are {train.image_size[0]}x{train.image_size[1]} but the "
                        f"model takes {config.img_size[0]}x{config.img_size[1]}: set "
                        f"model.img_size={list(train.image_size)} (or resize the data)")


def size_head_to_folder(cfg: TrainConfig, config: ViTConfig,
                        train: Records) -> ViTConfig:
    """A fresh run on `data=folder` or `data=hf:...`: the head has one output per class found.
    A `model.num_classes` set to another number is refused; left unset (a variant name, or a
    model dict without it), the head is sized from the data."""
    found = len(train.classes)
    named_classes = cfg.data == "folder" or cfg.data.startswith("hf:")
    if not named_classes or cfg.init_from or not found or config.num_classes == found:
        return config
    if isinstance(cfg.model, dict) and "num_classes" in cfg.model:
        shown = ", ".join(train.classes[:5]) + (", ..." if found > 5 else "")
        raise ConfigError(f"model.num_classes={config.num_classes} but the data "
                          f"{cfg.data_dir or cfg.data} holds {found} classes ({shown}): set "
                          f"model.num_classes={found} (or use a recipe whose model leaves "
                          "num_classes unset, and the head is sized from the data)")
    log.info("data=%s: %d classes found, the head has %d outputs", cfg.data, found, found)
    return config.replace(num_classes=found)


class Trainer:
    """One training run; `run()` trains to the end, or until stopped, and returns results."""

    def __init__(self, cfg: TrainConfig, resume: str | Path | None = None,
                 train_data: ImageDataset | None = None,
                 test_data: ImageDataset | None = None) -> None:
        self.cfg = cfg
        self.device = pick_device(cfg.device)
        self.info: DistInfo = init_distributed(self.device)
        if self.device.type == "cuda" and self.info.enabled:
            self.device = torch.device("cuda", self.info.local_rank)
        configure_cpu(cfg.threads)
        init, saved_pre = None, None
        resume_state = train_checkpoint.read_checkpoint(resume) if resume else None
        if cfg.init_from and resume_state:  # the run's checkpoint has the model: skip init_from
            self.model_config, saved_pre = config_from_run(resume_state)
        elif cfg.init_from:
            init = read_init(cfg)
            self.model_config = target_config(init, cfg.finetune_overrides())
        else:
            self.model_config = cfg.model_config()
        check_fits_in_memory(self.model_config, cfg.batch_size, cfg.accum_steps, self.device,
                             self.info.world_size)  # before the data and model are made
        if train_data is None or test_data is None:
            train_data, test_data = open_source(
                cfg.data, cfg.data_dir, self.model_config.img_size, self.model_config.in_chans,
                cfg.train_limit, cfg.test_limit, cfg.data_mode, cfg.train_split, cfg.split,
                cfg.streaming, cfg.workers)
        self.train_data, self.test_data = train_data, test_data
        self.streamed = train_data.streamed
        self.model_config = size_head_to_folder(cfg, self.model_config, train_data)
        self.out_dir = Path(cfg.out_dir)
        if self.info.is_main and not self.streamed:  # the run's folder names every image it
            write_skipped_files(self.out_dir, train_data, test_data)  # could not read
        torch.manual_seed(cfg.seed)
        if init is not None:
            classes = len(train_data.classes) or int(train_data.labels.max()) + 1
            self.model = pretrained_model(init, cfg, classes).to(self.device)
            self.model_config = self.model.config
        else:
            self.model = VisionTransformer(self.model_config).to(self.device)
        check_data_fits(self.model_config, train_data, resize=bool(cfg.init_from))
        self.preprocess = self._preprocess(init, saved_pre)
        self.scored_weights = "raw"  # "ema" while the EMA scored better at the last evaluation
        self.optimizer = build_optimizer(self.model, cfg.optimizer, cfg.lr, cfg.weight_decay,
                                         cfg.betas, cfg.momentum)
        self.ema = self._make_ema()
        self.augment = BatchAugment(self._augment_config(), self.model_config.num_classes)
        self.generator = torch.Generator().manual_seed(cfg.seed)
        self.order = BatchOrder(record_count(train_data), cfg.batch_size, cfg.seed)
        if self.order.batches_per_epoch() == 0:
            raise DataError(f"{len(train_data)} training images do not fill one batch of "
                            f"{cfg.batch_size}: lower batch_size")
        self.feed, self.eval_data = self._feeds(train_data, test_data)
        self.plan = RunPlan.create(self.model_config, self.order.batches_per_epoch(),
                                   cfg.epochs, cfg.total_steps, cfg.warmup_steps,
                                   cfg.warmup_epochs, cfg.resolution_schedule)
        self.position = Position(total_steps=self.plan.planned_steps)
        if resume_state:
            self._resume(resume_state, resume)
        self.compile_clock = CompileClock(cfg.compile)
        self.train_model = self._training_model()
        self.amp_dtype = self._amp_dtype()
        self._stop_reason = ""
        # the resolution the last step trained at (progressive resizing only moves up)
        self._trained_size: tuple[int, int] | None = (
            tuple(self.model.config.img_size) if self.position.step else None)

    # -- set-up -----------------------------------------------------------------------------
    def _preprocess(self, init: Any, saved: Preprocess | None) -> Preprocess:
        """The run's preprocessing at the model's size: the pretrained weights' (or, on resume
        of a fine-tuning run, the one it trained with), else mean = std = 0.5 per channel;
        the config's mean/std replace those when set."""
        size = list(self.model_config.img_size)
        base = init.preprocess if init is not None else saved
        if base is not None:
            pre = base.replace(img_size=size)
        else:
            pre = evaluation_preprocess(size, self.model_config.in_chans, self.streamed,
                                        self.cfg.eval_crop_pct)
        if self.cfg.mean is not None and self.cfg.std is not None:
            pre = pre.replace(mean=list(self.cfg.mean), std=list(self.cfg.std))
        return pre

    def _augment_config(self) -> AugmentConfig:
        """The batched augmentation; on streamed data the Inception crop replaces the padded
        random crop."""
        augment = AugmentConfig(**self.cfg.augment)
        if self.streamed and augment.crop_padding:
            if "crop_padding" in self.cfg.augment:
                log.info("streamed data: the Inception crop replaces augment.crop_padding")
            augment = replace(augment, crop_padding=0)
        return augment

    def _feeds(self, train: Records, test: Records) -> tuple[TrainingFeed, EvaluationFeed]:
        """Where the batches come from: memory, or DataLoader workers decoding records."""
        cfg, size = self.cfg, tuple(self.model_config.img_size)
        channels, pin = self.model_config.in_chans, self.device.type == "cuda"
        crop = InceptionCrop(size, tuple(cfg.crop_scale), tuple(cfg.crop_ratio),
                             self.preprocess.interpolation)
        if self.streamed and cfg.resize_crop > 1:
            log.info("streamed data: the Inception crop replaces resize_crop")
        rank, world = self.info.rank, self.info.world_size
        return (training_feed(train, self.order, crop, channels, size, cfg.seed, rank, world,
                              cfg.workers, pin),
                evaluation_feed(test, self.preprocess, channels, cfg.workers, pin))

    def _make_ema(self) -> torch.optim.swa_utils.AveragedModel | None:
        if not self.cfg.ema_decay:
            return None
        from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

        return AveragedModel(self.model, multi_avg_fn=get_ema_multi_avg_fn(self.cfg.ema_decay),
                             use_buffers=True)

    def _amp_dtype(self) -> torch.dtype | None:
        if self.cfg.amp == "bf16" or (self.cfg.amp == "auto" and self.device.type == "cuda"):
            return torch.bfloat16
        return None

    @property
    def warmup_steps(self) -> int:
        """Warmup steps of the run as now planned (scaled into a shorter budget-fitted run)."""
        return self.plan.warmup_for(self.position.total_steps)

    def _training_model(self) -> torch.nn.Module:
        """What the steps call: the model, in DDP under torchrun, compiled with compile=true
        (`self.model` stays the plain module that checkpoints and evaluation use)."""
        model = DistributedDataParallel(self.model) if self.info.enabled else self.model
        return compile_for_training(model, self.device) if self.cfg.compile else model

    # -- progressive resizing ---------------------------------------------------------------------
    @torch.no_grad()
    def set_resolution(self, size: tuple[int, int]) -> None:
        """Move the model (and the optimizer's moments of learned positions) to `size`."""
        if tuple(self.model.config.img_size) == tuple(size):
            return
        old_grid = self.model.config.grid_size
        self.model.set_image_size(size)
        if self.ema is not None:
            self.ema.module.set_image_size(size)
        pos = self.model.pos_embed
        if isinstance(pos, torch.nn.Parameter) and pos in self.optimizer.state:
            for key, value in self.optimizer.state[pos].items():
                if torch.is_tensor(value) and value.dim() == 3:
                    moment = resample_grid_embed(value, old_grid, self.model.config.grid_size,
                                                 self.model_config.num_prefix_tokens, "bicubic")
                    if key.endswith("exp_avg_sq"):  # bicubic overshoots below zero; its
                        moment.clamp_(min=0)  # square root in AdamW must stay real
                    self.optimizer.state[pos][key] = moment
        if self.info.enabled and isinstance(pos, torch.nn.Parameter):
            self.train_model = self._training_model()  # parameter shapes changed

    # -- checkpoints ----------------------------------------------------------------------------
    def checkpoint(self) -> TrainCheckpoint:
        """The run as a training checkpoint: the weights that scored, and the run state."""
        pos = self.position
        return TrainCheckpoint(
            config=self.model.config,  # at the current resolution
            preprocess=self.preprocess, class_names=list(self.train_data.classes),
            model=self.model.state_dict(),
            ema=self.ema.state_dict() if self.ema is not None else None,
            optimizer=self.optimizer.state_dict(),
            position=replace(pos, elapsed=pos.elapsed + self._elapsed()),
            torch_rng=torch.get_rng_state(), augment_rng=self.generator.get_state(),
            train_config=self.cfg.to_dict(), weights=self.scored_weights)

    def save(self, name: str) -> Path | None:
        """Write `name`.pt atomically (main rank only)."""
        if not self.info.is_main:
            return None
        return train_checkpoint.write(self.checkpoint(), self.out_dir / f"{name}.pt")

    def _resume(self, state: TrainCheckpoint, path: str | Path) -> None:
        used = state.train_config.get("optimizer", "adamw")
        if used != self.cfg.optimizer:
            raise CheckpointError(f"cannot resume from {path}: it was trained with optimizer="
                                  f"{used} but the config says {self.cfg.optimizer}. Resume with "
                                  f"optimizer={used}.")
        saved = state.config
        if saved.replace(img_size=self.model_config.img_size) != self.model_config:
            diffs = [f"{k}: checkpoint {v!r} vs config {getattr(self.model_config, k)!r}"
                     for k, v in saved.to_dict().items()
                     if k != "name" and v != self.model_config.to_dict()[k]]
            raise CheckpointError(f"cannot resume from {path}: it was trained with another model "
                                  f"config ({'; '.join(diffs)}). Resume with the same recipe.")
        self.model.set_image_size(saved.img_size)
        if self.ema is not None:
            self.ema.module.set_image_size(saved.img_size)
        self.model.load_state_dict(state.model)
        self.optimizer.load_state_dict(state.optimizer)
        if self.ema is not None and state.ema is not None:
            self.ema.load_state_dict(state.ema)
        torch.set_rng_state(state.torch_rng)
        self.generator.set_state(state.augment_rng)
        self.position = replace(state.position, history=list(state.position.history))
        self.scored_weights = state.weights
        log.info("resumed from %s at epoch %d, batch %d", path, self.position.epoch,
                 self.position.batch)
        self._replan_if_length_changed(state.train_config)

    def _replan_if_length_changed(self, saved: dict[str, Any]) -> None:
        """Resuming with another `epochs`, `total_steps` or `time_budget` re-plans the run.

        The same command resumes exactly; a longer one extends the run (also a finished one),
        as in timm and Hugging Face: the schedule is stretched to the new length from the
        current step on. A new time budget is fitted after the first steps are timed.
        """
        new = self.cfg.to_dict()
        changed = ", ".join(f"{key} {saved[key]} -> {new[key]}"
                            for key in ("epochs", "total_steps", "time_budget")
                            if key in saved and saved[key] != new[key])
        if not changed:
            return
        pos, before = self.position, self.position.total_steps
        pos.total_steps = self.plan.planned_steps
        if self.cfg.time_budget and pos.elapsed >= self.cfg.time_budget:
            log.warning("resume: %s, but the checkpoint already used %.0f s of the %.0f s "
                        "budget; raise time_budget to train on", changed, pos.elapsed,
                        self.cfg.time_budget)
            pos.total_steps = pos.step
        elif pos.total_steps <= pos.step:
            log.warning("resume: %s, but the checkpoint is already at step %d of the %d now "
                        "planned; nothing to train", changed, pos.step, pos.total_steps)
        else:
            log.warning("resume: %s; the run is re-planned from %d to %d steps (the learning "
                        "rate schedule is stretched from step %d on)", changed, before,
                        pos.total_steps, pos.step)

    # -- stopping -------------------------------------------------------------------------------
    def _install_signal_handlers(self) -> dict[int, Any]:
        previous = {}

        def request_stop(signum: int, _frame: Any) -> None:
            self._stop_reason = signal.Signals(signum).name

        for signum in (signal.SIGINT, signal.SIGTERM):
            with suppress(ValueError):  # signals can only be caught in the main thread
                previous[signum] = signal.signal(signum, request_stop)
        return previous

    def _signalled(self) -> bool:
        """SIGINT or SIGTERM arrived: stop at the next step or evaluation batch."""
        return self._stop_reason in ("SIGINT", "SIGTERM")

    def _elapsed(self) -> float:
        return time.perf_counter() - self._started if hasattr(self, "_started") else 0.0

    def _time_used(self) -> float:
        return self.position.elapsed + self._elapsed()

    def _fit_schedule_to_budget(self, seconds: float, tokens: int, eval_seconds: float) -> None:
        """Re-plan the run's length so the rest ends within the budget (`seconds` of training
        ran `tokens` tokens per image, summed over its steps)."""
        pos, plan, cfg = self.position, self.plan, self.cfg
        remaining = cfg.time_budget - self._time_used() - eval_seconds
        before = pos.total_steps
        pos.total_steps = plan.fit_to_budget(pos.step, seconds / max(tokens, 1), remaining,
                                             eval_seconds, cfg.eval_every)
        if pos.total_steps < plan.planned_steps <= before:
            log.warning("the %.0f s time budget fits %d of the %d planned steps (%.2f epochs); "
                        "the schedule and its %d warmup steps are scaled to fit (warmup %d)",
                        cfg.time_budget, pos.total_steps, plan.planned_steps,
                        pos.total_steps / plan.batches_per_epoch, plan.warmup,
                        plan.warmup_for(pos.total_steps))

    # -- the loop -------------------------------------------------------------------------------
    def run(self) -> TrainResult:
        cfg, pos = self.cfg, self.position
        recorder = (MetricsRecorder(self.out_dir, cfg.log, pos.history) if self.info.is_main
                    else None)
        previous_handlers = self._install_signal_handlers()
        self._started = time.perf_counter()
        schedule = SCHEDULES[cfg.schedule]
        per_epoch = self.order.batches_per_epoch()
        eval_seconds = 0.0
        calibrate_at = pos.step + min(20, max(per_epoch // 4, 3))
        calibrate_from = (pos.step + 2, time.perf_counter(), 0.0)
        clock = self.compile_clock
        final: dict[str, float] = {}
        guard = NonFiniteGuard(cfg, self.amp_dtype is not None)
        if pos.step >= pos.total_steps:
            log.warning("nothing to train: the run is at step %d of %d; a larger epochs= or "
                        "--time-budget with --resume extends it", pos.step, pos.total_steps)
        try:
            while pos.step < pos.total_steps and not self._stop_reason:
                bar = self._progress(pos.epoch, per_epoch, pos.batch)
                epoch_loss, epoch_images, epoch_start = 0.0, 0, time.perf_counter()
                epoch_compile = clock.seconds
                epoch_tokens = 0
                for batch_index, images, labels in self.feed.epoch(pos.epoch, pos.batch):
                    lr = cfg.lr * schedule(pos.step, pos.total_steps, self.warmup_steps,
                                           cfg.min_lr_ratio)
                    outcome = self._train_step(images, labels, lr)
                    step_tokens = self.plan.tokens(tuple(self.model.config.img_size))
                    epoch_tokens += step_tokens
                    pos.step += 1  # a skipped step uses up its batch and schedule position
                    pos.batch = batch_index + 1
                    if outcome.updated:
                        epoch_loss += outcome.loss * len(labels)
                        epoch_images += len(labels)
                    diverged = guard.observe(outcome, pos.step, pos.epoch + pos.batch / per_epoch,
                                             lr)
                    if diverged is not None:
                        self.save("last")  # the weights in memory are the last finite ones
                        raise diverged
                    if bar is not None:
                        bar.update(len(labels))
                        bar.set_postfix(loss=f"{outcome.loss:.3f}", lr=f"{lr:.2e}",
                                        refresh=False)
                    if pos.step == calibrate_from[0]:
                        calibrate_from = (pos.step, time.perf_counter(), clock.seconds)
                    if cfg.time_budget and pos.step == calibrate_at:
                        steps = max(pos.step - calibrate_from[0], 1)
                        seconds = time.perf_counter() - calibrate_from[1]
                        seconds -= clock.seconds - calibrate_from[2]  # a recompile is no rate
                        self._fit_schedule_to_budget(seconds, steps * step_tokens, eval_seconds)
                    out_of_time = bool(cfg.time_budget) and self._time_used() >= cfg.time_budget
                    if out_of_time and not self._stop_reason:
                        self._stop_reason = "time budget"
                    if broadcast_flag(bool(self._stop_reason), self.info):
                        self._stop_reason = self._stop_reason or "stopped by another rank"
                        break
                    if pos.step >= pos.total_steps:
                        break
                if bar is not None:
                    bar.close()
                train_seconds = time.perf_counter() - epoch_start
                step_seconds = train_seconds - (clock.seconds - epoch_compile)
                epoch_done = pos.batch >= per_epoch
                interrupted = self._stop_reason in ("SIGINT", "SIGTERM")
                scheduled = epoch_done and (pos.epoch + 1) % cfg.eval_every == 0
                if not interrupted and (scheduled or pos.step >= pos.total_steps
                                        or self._stop_reason):
                    eval_start = time.perf_counter()
                    final = self._evaluate_and_log(pos, epoch_loss, epoch_images, train_seconds,
                                                   recorder) or final
                    eval_seconds = time.perf_counter() - eval_start
                if epoch_done:
                    pos.epoch, pos.batch = pos.epoch + 1, 0
                    if cfg.time_budget and not self._stop_reason:
                        self._fit_schedule_to_budget(step_seconds, epoch_tokens, eval_seconds)
                self.save("last")
                self._write_skipped()
            # Checked after the loop, not inside it: a signal can land during an evaluation or a
            # save, after the in-loop check, and must still be reported.
            if self._stop_reason in ("SIGINT", "SIGTERM"):
                log.warning("%s: saved %s; continue with --resume", self._stop_reason,
                            self.out_dir / "last.pt")
        finally:
            for signum, handler in previous_handlers.items():
                signal.signal(signum, handler)
            self.feed.close()
            barrier(self.info)
            if recorder is not None:
                recorder.close()
            cleanup(self.info)
        return TrainResult(self.out_dir, pos, final, self._stop_reason, self.info.is_main)

    def _progress(self, epoch: int, total: int, start: int):
        if not (self.cfg.progress and self.info.is_main):
            return None
        from tqdm.auto import tqdm

        batch = self.cfg.batch_size
        return tqdm(total=total * batch, initial=start * batch, desc=f"epoch {epoch + 1}",
                    unit="img", dynamic_ncols=True, leave=False)

    def _write_skipped(self) -> None:
        """Streamed data: name every record skipped so far in the run's skipped_files.txt."""
        if self.streamed and self.info.is_main:
            write_skipped_files(self.out_dir, self.feed, self.eval_data)

    def _train_step(self, images: torch.Tensor, labels: torch.Tensor, lr: float) -> StepOutcome:
        """One optimizer update on a batch (none when its loss or gradients are not finite);
        returns the batch's mean loss and gradient norm. In-memory batches are global (sharded
        here, after augmenting); streamed ones are already this rank's share."""
        cfg = self.cfg
        if len(labels) == 0:  # every record of a streamed batch was unreadable
            return StepOutcome(0.0, 0.0, updated=False)
        images, targets = self.augment(images, labels, self.generator, self.preprocess.mean,
                                       self.preprocess.std)
        size = self.plan.resolution_at(self.position.step, self.position.total_steps)
        last = self._trained_size
        if last is not None and size[0] * size[1] < last[0] * last[1]:
            size = last  # a re-fitted budget may move a stage boundary back: never shrink
        self._trained_size = size
        self.set_resolution(size)
        if cfg.resize_crop > 1:
            images = resize_random_crop(images, size, cfg.resize_crop, self.generator)
        else:
            images = resize_batch(images, size)
        if self.feed.global_batches:
            images = shard(images, self.info.rank, self.info.world_size)
            targets = shard(targets, self.info.rank, self.info.world_size)
        images = images.to(self.device, non_blocking=True)
        targets = targets.to(self.device, non_blocking=True)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        micro_images = images.chunk(cfg.accum_steps)
        micro_targets = targets.chunk(cfg.accum_steps)
        total = 0.0
        self.compile_clock.start(micro_images[0].shape)
        for i, (x, y) in enumerate(zip(micro_images, micro_targets, strict=True)):
            last = i == len(micro_images) - 1
            sync = nullcontext() if last or not self.info.enabled else self.train_model.no_sync()
            with sync, torch.autocast(self.device.type, dtype=self.amp_dtype or torch.bfloat16,
                                      enabled=self.amp_dtype is not None):
                loss = soft_cross_entropy(self.train_model(x).float(), y)
                (loss * len(x) / len(images)).backward()
            total += loss.item() * len(x)
        self.compile_clock.stop()
        # The total norm before clipping; with clip_grad=0 the factor is 1 (grads unchanged).
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.clip_grad or math.inf)
        outcome = StepOutcome(total / len(images), float(norm))
        if broadcast_flag(not outcome.finite, self.info):  # checked before the update
            self.optimizer.zero_grad(set_to_none=True)
            return replace(outcome, updated=False)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.ema is not None:
            self.ema.update_parameters(self.model)
        return outcome

    def _evaluate_and_log(self, pos: Position, loss_sum: float, images: int, seconds: float,
                          recorder: MetricsRecorder | None) -> dict[str, float]:
        """Evaluate the model (and the EMA), log a row, and save best.pt on a new best.

        Which weights the checkpoints hold is decided here, once: the EMA's when they scored
        better than the raw model's at this evaluation, else the raw ones.
        """
        cfg = self.cfg
        num_classes = self.model_config.num_classes
        size = tuple(self.model.config.img_size)
        signalled = self._signalled
        result = evaluate(self.model, self.eval_data, num_classes, self.preprocess,
                          cfg.eval_batch_size, self.device, self.info, self.amp_dtype, size,
                          signalled)
        if result.interrupted:  # SIGINT/SIGTERM mid-evaluation: no row, the run stops
            return {}
        row: dict[str, float] = {
            "epoch": pos.epoch + pos.batch / self.order.batches_per_epoch(), "step": pos.step,
            "resolution": size[0],
            "train_loss": loss_sum / max(images, 1), **result.as_dict(),
            "images_per_s": images / max(seconds, 1e-9), "minutes": self._time_used() / 60,
        }
        if cfg.compile:  # seconds of this process's steps that compiled, within "minutes"
            row["compile_s"] = self.compile_clock.seconds
        if self.ema is not None:
            ema_result = evaluate(self.ema.module, self.eval_data, num_classes, self.preprocess,
                                  cfg.eval_batch_size, self.device, self.info, self.amp_dtype,
                                  size, signalled)
            if ema_result.interrupted:
                return {}
            row["ema_top1"] = ema_result.top1
        pos.history.append(row)
        self.scored_weights = "ema" if row.get("ema_top1", -1.0) > row["top1"] else "raw"
        top1 = max(row["top1"], row.get("ema_top1", -1.0))
        if top1 > pos.best_top1:
            pos.best_top1 = top1
            self.save("best")
        if recorder is not None:
            recorder.write(row, pos.history)
            log.info("epoch %.2f  loss %.4f  test top-1 %.2f%%  top-5 %.2f%%  %.0f img/s",
                     row["epoch"], row["train_loss"], 100 * row["top1"], 100 * row["top5"],
                     row["images_per_s"])
        return row


def train(cfg: TrainConfig, resume: str | Path | None = None,
          overwrite: bool = False) -> TrainResult:
    """Train with `cfg` (resuming from a checkpoint when given) into `cfg.out_dir`, which must
    not hold another run unless this one continues it or `overwrite` clears it
    (`vitkit.train.rundir.prepare_run_dir`)."""
    prepare_run_dir(cfg.out_dir, resume, overwrite)
    return Trainer(cfg, resume).run()
