"""What VFL-AFE's rescaling and distribution adjusting find to work on: per-epoch diagnostics
(``scripts/afe_diagnostics.py`` is the entry point).

For each mode, :func:`afe_diagnostics` trains the config's SplitNN run in this process (one
pipeline, given the in-process federation so that each secondary's protection can be observed)
and emits one record per epoch, averaged over the training batches of every secondary:

* ``clipped``: fraction of embeddings longer than t (Alg. 1 line 6 shortens them);
* ``spread``: the batch's largest pairwise distance after clipping, over 2t: how much of the
  ball's diameter the embeddings use (1: nothing left for rescaling to reclaim);
* ``estimate``: Eq. 5's Δ̃ = μh + 3σh over 2t (above 1: Eq. 4 shrinks the embeddings);
* ``factor``: the factor line 8 applied; ``kl``: Eq. 6's divergence (without α);
* ``confident``: fraction of Eq. 7's soft labels at or above the threshold c; ``cl``: Eq. 8
  (without β, with the sign of the text; see ``vflink.privacy.afe.contrastive_loss``);

and one record with the run's test accuracy. These figures are the secondary's own
(``EmbeddingProtection.observer``); a run never sends them (§3.2).
"""

from __future__ import annotations

import dataclasses
import json
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from vflink.config import read_toml
from vflink.runfiles.config import DataConfig, RunConfig
from vflink.runfiles.experiment import parse_experiment
from vflink.runfiles.inputs import load_inputs
from vflink.runner.federation import in_process
from vflink.runner.train import run_training

__all__ = ["afe_diagnostics", "diagnose", "override"]

#: ``emit(record)``: one JSON-serialisable record (an epoch's figures, or a run's accuracy)
Emit = Callable[[dict[str, Any]], None]


def override(base: RunConfig, settings: list[str]) -> RunConfig:
    """``base`` with ``section.key=VALUE`` settings (VALUE in JSON) changed."""
    sections: dict[str, dict[str, Any]] = defaultdict(dict)
    for item in settings:
        key, _, value = item.partition("=")
        section, _, name = key.partition(".")
        sections[section][name] = json.loads(value)
    for section, changes in sections.items():
        if section == "data":
            base = base.replace(data=DataConfig(dataset=base.data.dataset,
                                                options={**base.data.options, **changes}))
        else:
            base = base.replace(**{section: dataclasses.replace(getattr(base, section),
                                                                **changes)})
    return base


def diagnose(config: RunConfig, mode: str, emit: Emit) -> float:
    """Train ``config`` with ``mode``; ``emit`` one record per epoch; return the test
    accuracy."""
    config = config.replace(algorithm="splitnn",
                            privacy=dataclasses.replace(config.privacy, embeddings=mode))
    inputs = load_inputs(config)
    fed = in_process(inputs, config)
    batches: dict[str, list[float]] = defaultdict(list)

    def observe(event: str, figures: dict[str, float]) -> None:
        for key, value in figures.items():
            batches[key].append(value)

    def progress(stage: str, done: int, total: int) -> None:
        if stage == "epoch" and batches:
            means = {k: round(float(np.mean(v)), 4) for k, v in batches.items()}
            emit({"mode": mode, "epoch": done, **means})
            batches.clear()

    for name in fed.secondaries:
        fed.parties[name].protection.observer = observe
    result = run_training(config, tables=inputs, federation=fed, progress=progress)
    return float(result.metrics["test"]["accuracy"])


def afe_diagnostics(config: Path, emit: Emit, *,
                    modes: Sequence[str] = ("vanilla", "rescale", "adjust", "afe"),
                    seed: int = 0, settings: Sequence[str] = ()) -> None:
    """Diagnose every mode of the experiment file ``config`` (its first run), with
    ``settings`` (``section.key=JSON``) changed."""
    exp = parse_experiment(read_toml(config), base_dir=config.parent.resolve())
    base = override(exp.configs[0], list(settings))
    for mode in modes:
        accuracy = diagnose(base.replace(seed=seed), mode, emit)
        emit({"mode": mode, "seed": seed, "set": list(settings),
              "test_accuracy": round(accuracy * 100, 2)})
