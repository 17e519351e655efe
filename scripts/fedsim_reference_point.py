"""Run one point of examples/experiments/fedsim-reference.toml (some algorithms, one seed).

    PYTHONPATH=src python scripts/fedsim_reference_point.py --pool split --top-k 10 \\
        --sigma-cf 0.2 --seed 0 --algorithms fedsim top1sim solo combine --out runs/ref.jsonl

Appends one JSON line per algorithm (test/validation metrics, best epoch, seconds, linkage
recall) to ``--out``; the experiment file's per-algorithm overrides are applied. For long
reproductions on a shared machine, where ``vflink experiment`` would run the whole grid.
The logic is :func:`vflink.experiments.fedsim_reference.run_point`; this is its entry point.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import torch

from vflink.experiments.fedsim_reference import run_point

EXPERIMENT = Path(__file__).resolve().parents[1] / "examples/experiments/fedsim-reference.toml"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pool", choices=("split", "all"), default="split")
    parser.add_argument("--top-k", type=int, default=10)
    parser.add_argument("--sigma-cf", type=float, default=0.2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--n-samples", type=int, default=60_000)
    parser.add_argument("--epochs", type=int, default=None, help="cap every algorithm's epochs")
    parser.add_argument("--patience", type=int, default=None,
                        help="stop an algorithm this many epochs after its best validation epoch "
                             "(the file's patience equals its epochs: the authors train them all)")
    parser.add_argument("--algorithms", nargs="+", default=["fedsim", "top1sim", "solo",
                                                            "combine"])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    torch.set_num_threads(1)
    run_point(EXPERIMENT, args.out, pool=args.pool, top_k=args.top_k, sigma_cf=args.sigma_cf,
              seed=args.seed, n_samples=args.n_samples, epochs=args.epochs,
              patience=args.patience, algorithms=args.algorithms)


if __name__ == "__main__":
    main()
