"""The privacy-utility curve from ``vflink experiment`` outputs: test accuracy
(mean ± std over seeds) and AUC (mean) against the run's total ε, one row per protection mode,
as the Markdown table of docs/how-to/privacy.md and a figure.

The experiment files sweep ``privacy.total_epsilon`` × ``privacy.embeddings``
(``examples/experiments/dp-curve-*.toml``); several output folders (or run lists, as the
``*-runs.jsonl`` files kept beside the experiment files) may be merged, the first run of a
(mode, ε, seed) winning, so a curve can be completed a few modes at a time.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from vflink.errors import ConfigError

__all__ = ["curve_points", "curve_table", "load_runs", "plot_curve"]

_POINT = re.compile(r"total_epsilon=([0-9.eE+-]+), embeddings=([a-z-]+)")


def load_runs(sources: Iterable[Path]) -> list[dict[str, Any]]:
    """The runs of experiment output folders (their ``results.json``) or of ``.jsonl`` files
    (one run per line), in order."""
    runs: list[dict[str, Any]] = []
    for src in sources:
        path = src / "results.json" if src.is_dir() else src
        if not path.is_file():
            raise ConfigError(f"{src}: no results.json (an experiment output folder) or "
                              ".jsonl file of runs")
        if path.suffix == ".jsonl":
            runs += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        else:
            runs += list(json.loads(path.read_text())["runs"])
    return runs


def curve_points(runs: Iterable[dict[str, Any]]) -> dict[tuple[str, float], list[dict[str, Any]]]:
    """Runs by (mode, total ε), one per seed (the first one met)."""
    seen: set[tuple[str, float, int]] = set()
    points: dict[tuple[str, float], list[dict[str, Any]]] = defaultdict(list)
    for run in runs:
        match = _POINT.search(str(run.get("sweep", "")))
        if match is None:
            raise ConfigError(f"run {run.get('sweep')!r}: not a point of a sweep over "
                              "privacy.total_epsilon × privacy.embeddings")
        eps, mode = float(match.group(1)), match.group(2)
        key = (mode, eps, int(run["seed"]))
        if key in seen:
            continue
        seen.add(key)
        points[(mode, eps)].append(run)
    return dict(points)


def _cell(runs: Sequence[dict[str, Any]]) -> str:
    acc = np.array([100 * r["test"]["accuracy"] for r in runs])
    auc = np.array([r["test"].get("auc", np.nan) for r in runs], dtype=float)
    text = f"{acc.mean():.1f} ± {acc.std():.1f} / {np.nanmean(auc):.3f}"
    return text


def curve_table(points: dict[tuple[str, float], list[dict[str, Any]]],
                modes: Sequence[str] | None = None) -> str:
    """Markdown: a row per mode, a column per total ε; cells "accuracy mean ± std / AUC mean"
    (percent, population std over seeds); an empty cell where no run is."""
    eps = sorted({e for _, e in points})
    order = list(modes) if modes is not None else sorted({m for m, _ in points})
    lines = ["| total ε (δ = 1e-5) | " + " | ".join(f"{e:g}" for e in eps) + " |",
             "|---|" + "---|" * len(eps)]
    for mode in order:
        cells = [_cell(points[(mode, e)]) if (mode, e) in points else "" for e in eps]
        lines.append(f"| {mode} | " + " | ".join(cells) + " |")
    seeds = sorted({int(r["seed"]) for runs in points.values() for r in runs})
    lines.append("")
    lines.append(f"Test accuracy (%, mean ± std over seeds {seeds}) / AUC (mean).")
    return "\n".join(lines)


def plot_curve(points: dict[tuple[str, float], list[dict[str, Any]]], path: Path, *,
               title: str, modes: Sequence[str] | None = None) -> None:
    """Accuracy against total ε (log scale), one line per mode with ± std bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    order = list(modes) if modes is not None else sorted({m for m, _ in points})
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for mode in order:
        eps = sorted(e for m, e in points if m == mode)
        if not eps:
            continue
        acc = [np.array([100 * r["test"]["accuracy"] for r in points[(mode, e)]]) for e in eps]
        ax.errorbar(eps, [a.mean() for a in acc], yerr=[a.std() for a in acc], marker="o",
                    capsize=3, label=mode, linestyle="--" if mode == "off" else "-")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("total ε of the run (δ = 1e-5)")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
