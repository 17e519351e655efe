"""The one training loop of a run: mini-batches, validation, early stopping, checkpoints.

Every training plan (:mod:`vflink.runner.plans`: SplitNN and FedSim across the party boundary,
Solo and Combine at the primary, FLORIST union training over the PSU union) hands this loop a
:class:`Trainee`: the primary-side party it trains, wrapped in what the plan decides (which
metric early stopping watches, what an epoch records, which metrics the run reports). The loop
never asks which plan it runs.

It may import: the party layer's types, metrics, transport's traffic counter, the run files.
It is called by the train stage (:mod:`vflink.runner.train`) and by nothing below it.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from vflink.metrics.functional import higher_is_better
from vflink.runfiles.config import RunConfig
from vflink.runfiles.results import EpochRecord
from vflink.transport import TrafficCounter

__all__ = ["BEST", "CHECKPOINT", "FINAL", "Progress", "Trainee", "train_and_evaluate"]

log = logging.getLogger(__name__)

#: ``progress(stage, done, total)``: the CLI renders it as a progress bar.
Progress = Callable[[str, int, int], None]

#: State names every party writes into its own state directory; a state NAME is the pair
#: NAME.json + NAME.<digest>.safetensors (vflink.models.statefile).
CHECKPOINT, BEST, FINAL = "checkpoint", "best", "model"

Rows = npt.NDArray[np.int64]


class Trainee(Protocol):
    """What the loop trains: a plan's primary-side party with the plan's choices.

    ``metric`` is the validation metric early stopping watches, or ``None`` for a fixed number
    of epochs (the last epoch is the result). ``setup`` runs once (its traffic is the setup's
    share of the run's communication) and returns the rows to train on (a plan may narrow the
    training split: FLORIST's baseline-partial trains on the intersection only);
    ``final_metrics`` gives the run's train / validation / test metrics after the best state
    is restored. ``earliest_stop`` is the first epoch after which early stopping may end the
    run (a protection calibrated for a number of epochs asks for them: label DP's noise was
    paid for one release per epoch, and its evidence accumulates over them).
    """

    metric: str | None

    def earliest_stop(self) -> int: ...

    def setup(self, splits: tuple[Rows, ...], epochs: int, batch_size: int) -> Rows: ...

    def batches(self, rows: Rows, batch_size: int, rng: np.random.Generator) -> Iterator[Rows]:
        ...

    def begin_epoch(self, epoch: int, last: bool) -> None: ...

    def train_step(self, batch: Rows) -> float: ...

    def evaluate(self, rows: Rows) -> dict[str, float]: ...

    def log_epoch(self, record: EpochRecord) -> None: ...

    def keep_best(self, checkpoints: bool, state_prefix: str) -> None: ...

    def restore_best(self, checkpoints: bool) -> None: ...

    def save_checkpoint(self, state_prefix: str, epoch: int, extra: dict[str, Any]) -> None: ...

    def load_checkpoint(self) -> dict[str, Any]: ...

    def progress_state(self) -> dict[str, Any]: ...

    def resume_progress(self, state: dict[str, Any]) -> None: ...

    def final_metrics(self, splits: tuple[Rows, ...], history: list[EpochRecord]
                      ) -> dict[str, dict[str, float]]: ...


def _records(raw: list[dict[str, Any]]) -> list[EpochRecord]:
    return [EpochRecord(**r) for r in raw]


def train_and_evaluate(trainee: Trainee, config: RunConfig, splits: tuple[Rows, ...],
                       counter: TrafficCounter, *, batch_size: int,
                       progress: Progress | None = None, checkpoints: bool = False,
                       state_prefix: str = "", resume: bool = False,
                       fingerprint: dict[str, Any] | None = None,
                       accounting: dict[str, Any] | None = None
                       ) -> tuple[dict[str, dict[str, float]], tuple[EpochRecord, ...], int]:
    """Train with early stopping on the validation metric; restore the best epoch; evaluate.

    With ``checkpoints`` every party writes its state atomically at each epoch boundary
    (``checkpoint``, and ``best`` when validation improves), so a run that died can be
    continued with ``resume``: the same batches, ids and random numbers follow, and the final
    model equals that of an uninterrupted run. ``fingerprint`` (the run's configuration and
    data, see ``runner/resume.py``) is recorded in each checkpoint.

    ``accounting["communication"]``, if a dict is given, receives the training traffic: setup,
    every epoch and the final evaluation. The setup's share travels in the checkpoint, so a
    resumed run reports the same total as an uninterrupted one. Saving, loading, snapshotting
    and restoring states is bookkeeping and not counted: a resumed run does it differently, and
    state names carry the run id.
    """
    train, val, _ = splits
    t = config.training
    rng = np.random.default_rng([config.seed, 1])
    metric = trainee.metric
    better = metric is None or higher_is_better(metric)
    best: float | None = None
    best_epoch = 0
    stale = 0
    first_epoch = 1
    history: list[EpochRecord] = []
    if resume:
        progress_state = trainee.load_checkpoint()["training_progress"]
        rng.bit_generator.state = progress_state["rng"]
        trainee.resume_progress(progress_state)
        best, best_epoch, stale = (progress_state["best"], progress_state["best_epoch"],
                                   progress_state["stale"])
        history = _records(progress_state["history"])
        setup_traffic = dict(progress_state.get("setup_communication", {}))
        first_epoch = len(history) + 1
        log.info("resuming after epoch %d (best epoch %d)", len(history), best_epoch)
        if progress is not None:
            progress("epoch", len(history), t.epochs)
    else:
        before_setup = counter.snapshot()
        train = trainee.setup(splits, t.epochs, batch_size)
        setup_traffic = TrafficCounter.delta(counter.snapshot(), before_setup)
    finished = resume and ((stale >= t.patience and len(history) >= trainee.earliest_stop())
                           or first_epoch > t.epochs)
    for epoch in range(first_epoch, t.epochs + 1):
        if finished:
            break
        before = counter.snapshot()
        start = time.perf_counter()
        trainee.begin_epoch(epoch, epoch == t.epochs)
        losses = [trainee.train_step(b) for b in trainee.batches(train, batch_size, rng)]
        val_metrics = trainee.evaluate(val)
        record = EpochRecord(epoch, float(np.mean(losses)), val_metrics,
                             TrafficCounter.delta(counter.snapshot(), before),
                             time.perf_counter() - start)
        history.append(record)
        if metric is None:  # a fixed number of epochs: the last one is the result
            best_epoch = epoch
        else:
            score = val_metrics[metric]
            improved = best is None or (score > best if better else score < best)
            if improved:
                best, best_epoch, stale = score, epoch, 0
                trainee.keep_best(checkpoints, state_prefix)
            else:
                stale += 1
        if checkpoints:
            trainee.save_checkpoint(state_prefix, epoch, {
                "run": fingerprint or {}, "training_progress": {
                    "rng": rng.bit_generator.state, **trainee.progress_state(), "best": best,
                    "best_epoch": best_epoch, "stale": stale,
                    "history": [dataclasses.asdict(r) for r in history],
                    "setup_communication": setup_traffic}})
        trainee.log_epoch(record)
        if progress is not None:
            progress("epoch", epoch, t.epochs)
        if metric is not None and stale >= t.patience and epoch >= trainee.earliest_stop():
            log.info("early stopping after epoch %d (best %d)", epoch, best_epoch)
            break
    trainee.restore_best(checkpoints)
    before_final = counter.snapshot()
    metrics = trainee.final_metrics(splits, history)
    if accounting is not None:
        accounting["communication"] = TrafficCounter.combine(
            setup_traffic, *(r.communication for r in history),
            TrafficCounter.delta(counter.snapshot(), before_final))
    return metrics, tuple(history), best_epoch
