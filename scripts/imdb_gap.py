"""Why FedSim trails Exact on the IMDb title task: test RMSE split by exact title match.

Runs the algorithms of an IMDb experiment file (``examples/experiments/imdb-titles.toml`` or
``imdb-titles-normalized.toml``) for some seeds, each (seed) linked once as ``vflink
experiment`` does, and splits every algorithm's test RMSE between the primary records whose
title has an exact match among the secondary's titles (Exact links them) and the others. It
also prints the weight FedSim's similarity model gives to a link as a function of its distance.
Results: ``examples/experiments/imdb-gap.md``.

Two diagnostic changes of FedSim's model can be switched on (they are not vflink options; see
imdb-gap.md for why): ``--exact-flag`` gives the similarity model a second input, 1 where the
link's distance is 0; ``--pair-similarity`` gives each pair's SplitNN top model the pair's
similarity as one more input.

    python scripts/extract_datasets.py --imdb-out imdb_movies.csv.gz     # once
    PYTHONPATH=src OMP_NUM_THREADS=1 python scripts/imdb_gap.py --seeds 0 1 2 \\
        --config examples/experiments/imdb-titles.toml --out gap.json

The logic is :mod:`vflink.experiments.imdb_gap`; this is its entry point.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from vflink.experiments.imdb_gap import gap_table, imdb_gap

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", type=Path, default=ROOT / "examples/experiments/imdb-titles.toml")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--algorithms", nargs="+", default=None)
    ap.add_argument("--exact-flag", action="store_true")
    ap.add_argument("--pair-similarity", action="store_true")
    ap.add_argument("--out", type=Path, default=None, help="write the figures as JSON here")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    algorithms, runs = imdb_gap(args.config, seeds=args.seeds, algorithms=args.algorithms,
                                exact_flag=args.exact_flag,
                                pair_similarity=args.pair_similarity,
                                on_row=lambda row: print(json.dumps(row), flush=True))
    print(gap_table(algorithms, runs))
    if args.out is not None:
        args.out.write_text(json.dumps({"config": str(args.config), "runs": runs}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
