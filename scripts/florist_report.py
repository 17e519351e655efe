"""FLORIST's Tables 1-3 and Figure 2(a)-(f) from the results of the three experiments.

    vflink experiment --config examples/experiments/florist-labels.toml --out runs/fl-labels
    vflink experiment --config examples/experiments/florist-features.toml --out runs/fl-features
    vflink experiment --config examples/experiments/florist-both.toml --out runs/fl-both
    python scripts/florist_report.py --labels runs/fl-labels --features runs/fl-features \\
        --both runs/fl-both --out runs/florist-report

Writes report.md (Table 1: attack AUC of the label strategies at β = 0.5; Table 2: attack AUC
of the feature strategies at α = 0.5; Table 3: FLORIST's AUC change against baseline-partial
for α = β; and pass/fail checks of FLORIST's claims) and figure2.png (a-c: test AUC, d-f: ACE).
The logic is :mod:`vflink.experiments.florist_report`; this is its entry point.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from vflink.experiments.florist_report import florist_report


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--labels", type=Path, nargs="+", required=True)
    p.add_argument("--features", type=Path, nargs="+", required=True)
    p.add_argument("--both", type=Path, nargs="+", required=True)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    print(florist_report(args.labels, args.features, args.both, args.out))


if __name__ == "__main__":
    main()
