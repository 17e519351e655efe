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
The logic is :mod:`vflink.experiments.afe_diagnostics`; this is its entry point.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from typing import Any

import torch

from vflink.experiments.afe_diagnostics import afe_diagnostics


def _print(record: dict[str, Any]) -> None:
    print(json.dumps(record), flush=True)


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
    afe_diagnostics(args.config, _print, modes=args.modes, seed=args.seed, settings=args.set)


if __name__ == "__main__":
    main()
