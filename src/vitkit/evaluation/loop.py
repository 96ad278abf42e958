"""The one evaluation loop: a predictor's outputs on this rank's share of an evaluation feed,
fed to the task's accumulator (`Task.accumulator`), combined over ranks and scored into one
`EvalResult` (classification: loss, top-1, top-5 and the confusion matrix, counted; regression
and multi-label: every output and target gathered, scored on the whole set). Training
evaluates with it; so does `vitkit eval`."""

from __future__ import annotations

from collections.abc import Callable

import torch

from vitkit.data.feeds import EvaluationFeed, eval_batches
from vitkit.tasks import EvalResult, Ranks, SingleProcess, Task

# raw feed batch -> (B, K) outputs: `vitkit.inference.predictor.Predictor` is one
Predictor = Callable[[torch.Tensor], torch.Tensor]


@torch.no_grad()
def evaluate(predictor: Predictor, feed: EvaluationFeed, task: Task, *, batch_size: int = 500,
             ranks: Ranks | None = None, should_stop: Callable[[], bool] | None = None,
             label_map: torch.Tensor | None = None) -> EvalResult:
    """Evaluate `predictor` on this rank's share of `feed` and combine the task's metrics
    over `ranks` (None: one process).

    `predictor(images)` takes a raw feed batch (uint8 pictures or float arrays, (B, C, H, W))
    and returns (B, K) outputs: it normalises, resizes to the model's size and runs the model
    in its precision with gradients off (`vitkit.inference.predictor.Predictor` does, built
    from weights or, in training, from the live model with the run's autocast). Its
    `num_outputs`, when it has one, sizes the counts before any batch. In a single
    process, `should_stop` is asked before each batch (a signal need not wait for the end);
    the result is then `interrupted`. `label_map[i]`: the model's output for the data's class
    i (`Task.output_map`; None: the same index)."""
    ranks = ranks or SingleProcess()
    scores = task.accumulator(getattr(predictor, "num_outputs", None),
                              where=feed.name or "the held-out split")
    interrupted = False
    for images, targets in eval_batches(feed, batch_size, ranks.rank, ranks.world_size):
        if should_stop is not None and not ranks.enabled and should_stop():
            interrupted = True  # under DDP every rank must join the sync below
            break
        if label_map is not None:
            targets = label_map[targets]
        scores.update(predictor(images), targets)
    scores.sync(ranks)
    return scores.compute(interrupted)
