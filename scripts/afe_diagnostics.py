"""What VFL-AFE's rescaling and distribution adjusting find to work on: per-epoch diagnostics.

    PYTHONPATH=src python scripts/afe_diagnostics.py --config examples/experiments/afe-adult.toml \
        [--modes vanilla rescale adjust afe] [--seed 0] [--set training.lr=1e-5 ...]

For each mode it trains the config's SplitNN run in this process and prints one JSON line per
epoch, averaged over the training batches of every secondary:

* ``clipped``: fraction of embeddings longer than t (Alg. 1 line 6 shortens them);
* ``spread``: the batch's largest pairwise distance after clipping, over 2t: how much of the
  ball's diameter the embeddings use (1: nothing left for rescaling to reclaim);
* ``estimate``: Eq. 5's Δ̃ = μh + 3σh over 2t (above 1: Eq. 4 shrinks the embeddings);
* ``factor``: the factor line 8 applied; ``kl``: Eq. 6's divergence (without α);
* ``confident``: fraction of Eq. 7's soft labels at or above the threshold c; ``cl``: Eq. 8
  (without β, with the sign of the text; see ``vflink.privacy.afe.contrastive_loss``);

and one line with the run's test accuracy. ``--set section.key=VALUE`` (VALUE in JSON) changes
one setting, e.g. ``privacy.rescale_cap=true`` or ``model.top_hidden=[64]``. These figures are
the secondary's own (``EmbeddingProtection.observer``); a run never sends them (§3.2).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vflink.config import read_toml
from vflink.runfiles.config import DataConfig, RunConfig
from vflink.runfiles.experiment import parse_experiment
from vflink.runfiles.inputs import load_inputs
from vflink.runner.federation import in_process
from vflink.runner.train import run_training


def _override(base: RunConfig, settings: list[str]) -> RunConfig:
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


def diagnose(config: RunConfig, mode: str) -> float:
    """Train ``config`` with ``mode``; print one line per epoch; return the test accuracy."""
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
            print(json.dumps({"mode": mode, "epoch": done, **means}), flush=True)
            batches.clear()

    for name in fed.secondaries:
        fed.parties[name].protection.observer = observe
    result = run_training(config, tables=inputs, federation=fed, progress=progress)
    return float(result.metrics["test"]["accuracy"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--modes", nargs="*", default=["vanilla", "rescale", "adjust", "afe"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--set", nargs="*", default=[], metavar="SECTION.KEY=JSON")
    args = parser.parse_args()
    torch.set_num_threads(1)
    logging.basicConfig(level=logging.WARNING)
    exp = parse_experiment(read_toml(args.config), base_dir=args.config.parent.resolve())
    base = _override(exp.configs[0], args.set)
    for mode in args.modes:
        accuracy = diagnose(base.replace(seed=args.seed), mode)
        print(json.dumps({"mode": mode, "seed": args.seed, "set": args.set,
                          "test_accuracy": round(accuracy * 100, 2)}), flush=True)

if __name__ == "__main__":
    main()
