"""The classification evaluation loop: loss, top-1, top-5, per-class accuracy and the
confusion matrix, summed over ranks (training evaluates with it; so does `vitkit eval`)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.distributed as dist
import torch.nn.functional as F

from vitkit.data.augment import resize_batch
from vitkit.data.feeds import EvaluationFeed, eval_batches
from vitkit.preprocess import Preprocess

TOP_K = 5  # the second accuracy reported, after top-1


def reports_top_k(num_classes: int, k: int = TOP_K) -> bool:
    """Whether top-k accuracy says anything: only with more than k classes (with k or fewer
    every image is right within its top k). Reports print top-k only then."""
    return num_classes > k


class Ranks(Protocol):
    """This process's place among the ranks (`vitkit.train.distributed.DistInfo` is one)."""

    @property
    def rank(self) -> int: ...

    @property
    def world_size(self) -> int: ...

    @property
    def enabled(self) -> bool: ...


@dataclass(frozen=True)
class SingleProcess:
    """One process: nothing to combine."""

    rank: int = 0
    world_size: int = 1
    enabled: bool = False


def all_reduce_sum(tensor: torch.Tensor, info: Ranks) -> torch.Tensor:
    """Sum a tensor over ranks (in place); a no-op in a single process."""
    if info.enabled:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


@dataclass
class EvalResult:
    loss: float
    top1: float
    top5: float
    count: int
    confusion: torch.Tensor  # (classes, classes): rows true label, columns prediction
    interrupted: bool = False  # `should_stop` ended it early: the counts cover part of the data

    @property
    def per_class(self) -> torch.Tensor:
        totals = self.confusion.sum(1).clamp(min=1)
        return self.confusion.diag() / totals

    @property
    def score(self) -> float:
        """The metric best.pt is chosen by (`vitkit.tasks`: classification's is top-1)."""
        return self.top1

    def as_dict(self) -> dict[str, float]:
        return {"test_loss": self.loss, "top1": self.top1, "top5": self.top5}


@torch.no_grad()
def evaluate(model: torch.nn.Module, dataset: EvaluationFeed,
             num_classes: int,
             preprocess: Preprocess, batch_size: int = 500, device: torch.device | None = None,
             info: Ranks | None = None,
             context: Callable[[], contextlib.AbstractContextManager] | None = None,
             image_size: tuple[int, int] | None = None,
             should_stop: Callable[[], bool] | None = None,
             label_map: torch.Tensor | None = None) -> EvalResult:
    """Evaluate on this rank's share of `dataset` and combine the counts over ranks.

    Images are normalised with `preprocess` (its mean and std), then resized to `image_size`
    when it differs from the dataset's (bilinear, antialiased when shrinking). The model runs
    inside `context()` (from `vitkit.inference.precision`: `apply_precision`'s, or
    `autocast_context` for a run's amp; None: none). In a single process, `should_stop` is
    asked before each batch (a signal need not wait for the end). `label_map[i]`: the model's
    output for the data's class i (`match_classes`; None: the same index).
    """
    info = info or SingleProcess()
    device = device or torch.device("cpu")
    was_training = model.training
    model.eval()
    loss_sum = torch.zeros((), dtype=torch.float64)
    correct = torch.zeros(2, dtype=torch.float64)
    confusion = torch.zeros(num_classes, num_classes, dtype=torch.float64)
    k = min(5, num_classes)
    interrupted = False
    for images, labels in eval_batches(dataset, batch_size, info.rank, info.world_size):
        if should_stop is not None and not info.enabled and should_stop():
            interrupted = True  # under DDP every rank must join the all-reduce below
            break
        x = resize_batch(preprocess.normalize(images.to(device)), image_size)
        labels = (labels if label_map is None else label_map[labels]).to(device)
        with (context or contextlib.nullcontext)():
            logits = model(x)
        logits = logits.float()
        loss_sum += F.cross_entropy(logits, labels, reduction="sum").double().cpu()
        topk = logits.topk(k, dim=1).indices
        hits = topk == labels[:, None]
        correct[0] += hits[:, 0].sum().double().cpu()
        correct[1] += hits.any(dim=1).sum().double().cpu()
        flat = labels.cpu() * num_classes + topk[:, 0].cpu()
        confusion += torch.bincount(flat, minlength=num_classes**2).reshape(
            num_classes, num_classes).double()
    totals = torch.cat([loss_sum[None], correct, confusion.flatten()])
    all_reduce_sum(totals, info)
    count = int(totals[3:].sum().item())
    model.train(was_training)
    return EvalResult(loss=float(totals[0]) / max(count, 1), top1=float(totals[1]) / max(count, 1),
                      top5=float(totals[2]) / max(count, 1), count=count,
                      confusion=totals[3:].reshape(num_classes, num_classes).long(),
                      interrupted=interrupted)
