"""Tabulate the fedsim-reference grid (runs appended by ``fedsim_reference_point.py``).

    PYTHONPATH=src python scripts/fedsim_reference_table.py runs/ref.jsonl

Prints Markdown: per linkage pool, one row per (σ_cf, K) and one column per algorithm, the test
accuracy as mean ± std over the seeds (with the number of seeds when it is not 3), next to the
FedSim authors' logged figures. Solo and Combine do not link, so one set of seeds serves every
(σ_cf, K, pool); Top1Sim uses only the top-1 link, the same for K = 10 and K = 100.
The logic is :func:`vflink.experiments.fedsim_reference.reference_table`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from vflink.experiments.fedsim_reference import reference_table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", type=Path, nargs="+", help="JSON lines from the point script")
    args = parser.parse_args()
    print(reference_table(args.runs))


if __name__ == "__main__":
    main()
