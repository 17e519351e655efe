"""Reproduce VFL-AFE's Figure 9 / Table 2 (utility), Table 1 (membership inference) and
Figure 10 (inversion) on Adult and Fashion-MNIST halves.

    PYTHONPATH=src python scripts/reproduce_afe.py --config examples/experiments/afe-fmnist.toml \
        --out runs/afe-fmnist [--seeds 0 1 2] [--attacks]

For each seed: centralised (``combine``), unprotected (``splitnn``, privacy off) and the four
protected variants (vanilla, +R = rescale, +D = adjust, AFE) with the file's ``[privacy]``
settings; with ``--attacks`` (classification data with an auxiliary set: Fashion-MNIST's test
images) the unprotected, vanilla and AFE runs are also attacked (``vflink.experiments.afe``).
Writes ``results.json`` and ``results.md`` (mean ± std over seeds) and ``inversion.png``.
The logic is :mod:`vflink.experiments.afe_reproduction`; this is its entry point.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from typing import Any

import torch

from vflink.experiments.afe_reproduction import METHODS, merge_results, reproduce_afe


def _print_run(record: dict[str, Any]) -> None:
    print(json.dumps({k: record[k] for k in ("seed", "method", "test", "seconds")},
                     default=float), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seeds", type=int, nargs="*", default=None)
    parser.add_argument("--methods", nargs="*", default=list(METHODS))
    parser.add_argument("--attacks", action="store_true")
    parser.add_argument("--aux-rows", type=int, default=5000)
    parser.add_argument("--total-epsilon", type=float, default=None,
                        help="the run's total ε (budget first) instead of the "
                        "file's per-release ε")
    parser.add_argument("--delta", type=float, default=None, help="δ instead of the file's")
    parser.add_argument("--merge", type=Path, nargs="*", default=None,
                        help="only summarise the results.json of these output folders (runs "
                        "split over several processes, e.g. one per seed) into --out")
    args = parser.parse_args()
    if args.merge:
        print(merge_results(args.config, args.merge, args.out))
        return
    torch.set_num_threads(1)
    logging.basicConfig(level=logging.WARNING)
    print(reproduce_afe(args.config, args.out, seeds=args.seeds, methods=args.methods,
                        attacks=args.attacks, aux_rows=args.aux_rows, on_run=_print_run,
                        total_epsilon=args.total_epsilon, delta=args.delta))


if __name__ == "__main__":
    main()
