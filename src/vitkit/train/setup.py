"""Setting up a training run: `build_run(cfg, resume)` assembles what the loop needs.

In order: the device (and the process group under torchrun); the model's config, from the
recipe, from pretrained weights (`init_from`), or from the run's checkpoint when a
fine-tuning run resumes; a check that the run fits in memory, before anything is allocated;
the data and the task its targets imply (a resumed run's own), with the head sized to them;
the model; the preprocessing (float arrays: their per-channel statistics); optimizer, EMA
and the augmentation the data and task allow; the feeds and the plan; the checkpoint's state
on resume (re-planned when the length changed); the training step (DDP, compile).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

from vitkit.config import ViTConfig
from vitkit.cores import ThreadWatch, choose_threads
from vitkit.data.augment import BatchAugment
from vitkit.errors import ConfigError
from vitkit.files import working_folder
from vitkit.inference.cpu_probes import slow_bf16
from vitkit.inference.precision import Precision
from vitkit.model.vit import VisionTransformer
from vitkit.preprocess import Preprocess
from vitkit.runtime import (
    avoid_cudnn_attention,
    check_device,
    set_threads,
    tune_cpu_allocator,
)
from vitkit.tasks import Task, make_task
from vitkit.train.amp import training_precision
from vitkit.train.budget import BudgetClock
from vitkit.train.checkpoint import Position, TrainCheckpoint, read_checkpoint, write
from vitkit.train.compiling import CompileClock
from vitkit.train.config import TrainConfig
from vitkit.train.data import (
    Source,
    TrainingData,
    augment_config,
    check_data_fits,
    feed_data,
    holds_float_images,
    open_data,
    output_count,
)
from vitkit.train.distributed import DistInfo, init_distributed, min_over_ranks
from vitkit.train.finetune import config_from_run, pretrained_model, read_init, target_config
from vitkit.train.memory_estimate import check_fits_in_memory
from vitkit.train.optim import build_optimizer
from vitkit.train.plan import RunPlan
from vitkit.train.preprocessing import channel_stats, run_preprocess
from vitkit.train.resume import (
    check_resumable,
    check_same_classes,
    replan_if_length_changed,
    restore,
    with_checkpoint_head,
)
from vitkit.train.step import TrainStep
from vitkit.train.stopping import StopRequest
from vitkit.weights import WeightsRecord
from vitkit.weights.formats.train_checkpoint import TrainedWeights

log = logging.getLogger("vitkit.train")


@dataclass
class Run:
    """What the loop needs: the model and what updates it (`step`), the data, the plan, where
    the run stands (`position`), its clocks and why it should stop."""

    cfg: TrainConfig
    info: DistInfo
    device: torch.device
    model: VisionTransformer  # the plain module: checkpoints and evaluation use it
    ema: AveragedModel | None
    optimizer: torch.optim.Optimizer
    generator: torch.Generator  # the augmentation's random state
    preprocess: Preprocess
    data: TrainingData
    plan: RunPlan
    position: Position
    step: TrainStep
    amp_dtype: torch.dtype | None
    compile_clock: CompileClock
    clock: BudgetClock
    stop: StopRequest = field(default_factory=StopRequest)
    scored_weights: str = "raw"  # "ema" while the EMA scored better at the last evaluation
    task: Task = field(default_factory=make_task)  # what the head learns (vitkit.tasks)
    threads: ThreadWatch | None = None  # moves the CPU threads as other processes come and go

    @property
    def out_dir(self) -> Path:
        return Path(self.cfg.out_dir)

    @property
    def warmup_steps(self) -> int:
        """Warmup steps of the run as now planned (scaled into a shorter budget-fitted run)."""
        return self.plan.warmup_for(self.position.total_steps)

    def checkpoint(self) -> TrainCheckpoint:
        """The run as a training checkpoint: the weights that scored, and the run state."""
        pos = self.position
        trained = TrainedWeights(
            config=self.model.config,  # at the current resolution
            preprocess=self.preprocess, class_names=list(self.data.class_names),
            model=self.model.state_dict(),
            ema=self.ema.state_dict() if self.ema is not None else None,
            weights=self.scored_weights, task=self.task.spec)
        return TrainCheckpoint(
            trained, optimizer=self.optimizer.state_dict(),
            position=replace(pos, elapsed=self.clock.used(pos)),
            torch_rng=torch.get_rng_state(), augment_rng=self.generator.get_state(),
            train_config=self.cfg.to_dict(), trained_in=working_folder(),
            trained_as={"precision": "fp32" if self.amp_dtype is None else "bf16",
                        "device": self.device.type})

    def save(self, name: str) -> Path | None:
        """Write the checkpoint `name` (a run file's name, `vitkit.weights.formats.run_folder`:
        LAST, BEST, DIVERGED; "last" stands for last.pt) atomically (main rank only)."""
        if not self.info.is_main:
            return None
        return write(self.checkpoint(), self.out_dir / (name if name.endswith(".pt") else
                                                        f"{name}.pt"))


def build_run(cfg: TrainConfig, resume: str | Path | None = None,
              train_data: Source | None = None, test_data: Source | None = None) -> Run:
    """Everything a run of `cfg` needs, from its checkpoint when `resume` names one
    (`train_data`/`test_data`: data to use instead of the config's source)."""
    device, info, threads = join_devices(cfg)
    if cfg.batch_size < info.world_size:  # each step would be skipped: nothing trained
        raise ConfigError(f"batch_size={cfg.batch_size} is the global batch, shared by "
                          f"{info.world_size} processes, so some would get no image: set "
                          f"batch_size={info.world_size} or more")
    warn_of_zero_lr(cfg)
    if avoid_cudnn_attention(device):
        log.info("cuDNN attention off for training: its bf16 backward can give NaN gradients "
                 "(flash and memory-efficient attention serve instead; docs/speed.md)")
    state = read_checkpoint(resume) if resume else None
    config, init, saved_pre = model_source(cfg, state)
    if state is not None and not cfg.init_from:
        config = with_checkpoint_head(config, state.trained.config, cfg.model, cfg.data)
    largest = max((int(side) for _, side in cfg.resolution_schedule), default=0)
    at_largest = config if largest <= max(config.img_size) else \
        config.replace(img_size=(largest, largest))  # a schedule's largest stage
    check_fits_in_memory(at_largest, cfg.batch_size, cfg.accum_steps, device,
                         info.world_size)  # before the data and model are made
    train, test, config, spec = open_data(cfg, config, Path(cfg.out_dir), info, train_data,
                                          test_data, state.trained.task if state else None,
                                          resumed=state is not None)
    if state is not None:
        check_same_classes(state, resume, cfg, list(train.classes))
    task = make_task(spec)
    torch.manual_seed(cfg.seed)
    if init is not None:
        model = pretrained_model(init, cfg, output_count(train, spec, test),
                                 list(train.classes)).to(device)
        config = model.config
    else:
        model = VisionTransformer(config).to(device)
    check_data_fits(config, train, resize=bool(cfg.init_from), task=spec)
    streamed, float_images = train.streamed, holds_float_images(train)
    # the pretrained model's own preprocessing: its mean/std follow an adapted channel count
    preprocess = run_preprocess(cfg, config, model.preprocess if init is not None else saved_pre,
                                streamed, float_stats(train, state, cfg) if float_images else None)
    optimizer = build_optimizer(model, cfg.optimizer, cfg.lr, cfg.weight_decay, cfg.betas,
                                cfg.momentum)
    ema = make_ema(model, cfg.ema_decay)
    augment = BatchAugment(augment_config(cfg, streamed, spec, float_images),
                           config.num_classes, task)
    generator = torch.Generator().manual_seed(cfg.seed)
    data = feed_data(cfg, train, test, config, preprocess, info, device)
    plan = RunPlan.create(config, data.order.batches_per_epoch(), cfg.epochs, cfg.total_steps,
                          cfg.warmup_steps, cfg.warmup_epochs, cfg.resolution_schedule)
    position, scored_weights = Position(total_steps=plan.planned_steps), "raw"
    if state is not None:
        check_resumable(state, resume, cfg, config)
        position = restore(state, resume, model, ema, optimizer, generator)
        scored_weights = state.trained.weights
        replan_if_length_changed(cfg, state.train_config, plan, position,
                                 data.order.batches_per_epoch())
    position.batches_per_epoch = data.order.batches_per_epoch()
    compile_clock = CompileClock(cfg.compile)
    amp = amp_dtype(cfg.amp, device, model.config.width, info=info,
                    resumed=state.trained_as if state is not None else None)
    step = TrainStep(cfg, model, ema, optimizer, augment, generator, preprocess, plan, info,
                     device, amp, compile_clock, global_batches=data.feed.global_batches,
                     trained_size=tuple(model.config.img_size) if position.step else None,
                     task=task)
    clock = BudgetClock(cfg.time_budget, cfg.eval_every, plan, compile_clock, info)
    return Run(cfg, info, device, model, ema, optimizer, generator, preprocess, data, plan,
               position, step, amp, compile_clock, clock, scored_weights=scored_weights,
               task=task, threads=threads)


def warn_of_zero_lr(cfg: TrainConfig) -> None:
    """Warn when the learning rate peaks at 0: the weights never move, and the model scores
    what it scored at the start (chance, for a fresh one)."""
    if cfg.lr == 0:
        log.warning("warning: lr=0: the %s schedule's learning rate is 0 at every step, so the "
                    "weights never change and the model stays where it starts (at chance, "
                    "for a fresh model); set lr= above 0 (e.g. lr=0.001)", cfg.schedule)


def float_stats(train: Source, state: TrainCheckpoint | None, cfg: TrainConfig | None = None
                ) -> tuple[list[float], list[float]]:
    """The per-channel mean and std float arrays are normalised with: the training images'
    (`channel_stats`), or on resume the ones the run trained with, exactly; the config's
    mean= and std= when it sets both (the images' are then not computed)."""
    if state is not None and state.trained.preprocess.scale == 1:
        saved = state.trained.preprocess
        return list(saved.mean), list(saved.std)
    if cfg is not None and cfg.mean is not None and cfg.std is not None:
        return list(cfg.mean), list(cfg.std)
    return channel_stats(train)


def pick_device(name: str) -> torch.device:
    """The torch device for a `device=` setting, refused clearly when this machine lacks it."""
    check_device(name)
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def join_devices(cfg: TrainConfig) -> tuple[torch.device, DistInfo, ThreadWatch | None]:
    """This process's device, its place in the process group `torchrun` describes (one GPU
    per rank) and, training on the CPU, what follows the cores other processes use (the
    threads are set: `vitkit.cores.choose_threads`)."""
    device = pick_device(cfg.device)
    info = init_distributed(device)
    if device.type == "cuda" and info.enabled:
        device = torch.device("cuda", info.local_rank)
    watch = None
    if device.type == "cpu":
        watch = choose_threads(cfg.threads, what="training", pin="threads={n}").watch()
    else:
        set_threads(cfg.threads)  # the GPU does the work: the CPU's threads feed it
    tune_cpu_allocator()
    return device, info, watch


def model_source(cfg: TrainConfig, state: TrainCheckpoint | None
                 ) -> tuple[ViTConfig, WeightsRecord | None, Preprocess | None]:
    """The model config to train, the pretrained weights to start from (`init_from`; None
    for a fresh model) and the preprocessing a resumed fine-tuning run trained with."""
    if cfg.init_from and state:  # the run's checkpoint has the model: skip init_from
        config, saved_pre = config_from_run(state)
        return config, None, saved_pre
    if cfg.init_from:
        init = read_init(cfg)
        return target_config(init, cfg.finetune_overrides()), init, None
    return cfg.model_config(), None, None


def make_ema(model: VisionTransformer, decay: float) -> AveragedModel | None:
    """The exponential moving average of the weights (`ema_decay`; 0: none)."""
    if not decay:
        return None
    return AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(decay), use_buffers=True)


def amp_dtype(amp: str, device: torch.device, width: int,
              flags: frozenset[str] | None = None, info: DistInfo | None = None,
              resumed: dict[str, str] | None = None) -> torch.dtype | None:
    """bf16 autocast or None (fp32) for amp=bf16|off|auto; auto decides by the device, the
    CPU's instruction sets (`flags`: this CPU's when None) and the model's width, on some CPUs
    by a measurement (`vitkit.inference.precision.training_precision`); logs what it chose and
    why. With amp=auto a resume keeps what its run trained in on this kind of device
    (`resumed`, the checkpoint's `trained_as`; older checkpoints decide again), so it continues
    exactly, warning where bf16 is emulated or slow here; the ranks of a run (`info`) train in
    bf16 only when every rank chose it."""
    if amp == "auto" and resumed is not None and resumed["device"] == device.type:
        chosen = Precision(resumed["precision"], f"amp=auto: {resumed['precision']}, as the "
                                                 "run trained before this resume")
        if chosen.name == "bf16" and (slow := slow_bf16(device, width, flags)):
            log.warning("warning: this run trained in bf16, which continues so the resume is "
                        "exact, but %s; amp=off trains on in fp32", slow)
    else:
        chosen = training_precision(amp, device, width, flags)
    if amp == "auto" and info is not None:
        everywhere = min_over_ranks(int(chosen.name == "bf16"), info)
        if chosen.name == "bf16" and not everywhere:
            chosen = Precision("fp32", f"amp=auto: fp32, as another rank chose (here: "
                                       f"{chosen.reason})")
    if amp == "auto":
        log.info("%s", chosen.describe())
    elif chosen.reason != f"amp={amp}":  # asked for bf16 where it is emulated or slower
        log.warning("%s", chosen.describe())
    return torch.bfloat16 if chosen.name == "bf16" else None
