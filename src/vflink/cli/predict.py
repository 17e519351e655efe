"""``vflink predict``: predictions for new primary records with a trained run."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

__all__ = ["register", "run"]

HELP = """Predict new primary records with a run directory written by `vflink train`.

The records (CSV/Parquet with the primary's columns; the label column is optional) are linked
to the secondary parties' data as in training — keyed hashes, or top-K soft linkage through the
coordinator — every party loads its own saved model, the secondaries send embeddings of the
linked rows and the primary predicts. If the label column is present, metrics are printed too.

Besides the predictions, every row says how well it was linked: best_similarity (soft linkage:
the similarity of its best link) and low_similarity (below the lowest 1% of the training rows'
best-link similarities, stored in the run's link_quality.json), or matched (exact alignment: a
secondary record with the same key was found). A warning counts the rows that were linked worse
than nearly every training row: their predictions deserve less trust.
"""


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "predict", help="predict new primary records with a trained run", description=HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", required=True, type=Path, help="run directory from `vflink train`")
    p.add_argument("--input", required=True, type=Path, help="new primary records")
    p.add_argument("--out", required=True, type=Path, help="predictions (.csv or .parquet)")
    p.add_argument("--config", type=Path, default=None,
                   help="accepted for symmetry; the run directory's config.json is used")
    p.add_argument("--overwrite", action="store_true", help="replace an existing output file")
    p.add_argument("--delimiter", help="CSV delimiter of --input (default: detected among "
                   ", ; tab |; write tab as '\\t')")
    p.add_argument("--encoding", help="text encoding of --input (default: utf-8; e.g. "
                   "latin-1, cp1252)")
    p.add_argument("--decimal", help="decimal mark of numbers in --input: . (default) or , "
                   "(for 1,5)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.markup import escape

    from vflink._files import atomic_open
    from vflink.cli._outputs import refuse_existing
    from vflink.data.table import read_frame
    from vflink.errors import ConfigError
    from vflink.runner.predict import predict_records

    out: Path = args.out
    if out.suffix.lower() not in (".csv", ".parquet"):
        raise ConfigError(f"--out must end in .csv or .parquet, got {str(out)!r}")
    refuse_existing(out, overwrite=args.overwrite)
    records = read_frame(args.input, delimiter=args.delimiter, encoding=args.encoding,
                         decimal=args.decimal)
    console = Console()
    with console.status(f"predicting {len(records)} records with {args.run}"):
        result = predict_records(args.run, records, source=str(args.input))
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.suffix.lower() == ".parquet":
        with atomic_open(out, "wb") as fh:
            result.frame.to_parquet(fh, index=False)
    else:
        with atomic_open(out, "w", newline="") as fh:
            result.frame.to_csv(fh, index=False)
    console.print(f"wrote {len(result.frame)} predictions to {out}")
    for text in result.warnings:
        console.print(f"[yellow]warning:[/] {escape(text)}", highlight=False)
    if result.metrics:
        console.print("metrics on the given labels: " +
                      ", ".join(f"{k} {v:.4f}" for k, v in result.metrics.items()))
    return 0
