"""The privacy-utility curve (docs/how-to/privacy.md) from `vflink experiment`
outputs: the Markdown table (test accuracy mean ± std over seeds / AUC mean, a row per
protection mode, a column per total ε) and a figure.

    vflink experiment --config examples/experiments/dp-curve-adult-rr.toml --out runs/dp-curve-adult
    PYTHONPATH=src python scripts/dp_curve.py runs/dp-curve-adult --title "Adult" \
        --png runs/dp-curve-adult/curve.png [--jsonl runs.jsonl]

Several folders (or `*-runs.jsonl` files) may be given: the first run of a (mode, ε, seed)
wins. The logic is :mod:`vflink.experiments.dp_curve`; this is its entry point.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from vflink.experiments.dp_curve import curve_points, curve_table, load_runs, plot_curve

MODES = ["off", "vanilla", "afe", "normalized", "release-once", "randomized-response"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sources", type=Path, nargs="+",
                        help="experiment output folders or .jsonl files of runs")
    parser.add_argument("--title", default="privacy-utility curve")
    parser.add_argument("--png", type=Path, default=None, help="write the figure here")
    parser.add_argument("--jsonl", type=Path, default=None,
                        help="write the merged runs here, one per line")
    args = parser.parse_args()
    runs = load_runs(args.sources)
    points = curve_points(runs)
    modes = [m for m in MODES if any(k[0] == m for k in points)]
    modes += sorted({m for m, _ in points} - set(modes))
    print(curve_table(points, modes))
    if args.png is not None:
        plot_curve(points, args.png, title=args.title, modes=modes)
    if args.jsonl is not None:
        kept = [r for rs in points.values() for r in rs]
        args.jsonl.write_text("".join(json.dumps(r, default=float) + "\n" for r in kept))


if __name__ == "__main__":
    main()
