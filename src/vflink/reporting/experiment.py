"""An experiment's tables and plot, from its ``results.json`` (:mod:`vflink.experiments.grid`).

They read the results only (algorithms × sweep values, mean ± std over seeds), so a results
file from another run or another machine gives the same table: ``vflink experiment`` writes
``results.md`` and ``plot.png`` with them.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from vflink._files import atomic_open

__all__ = ["markdown_table", "plot_results"]


def _fmt(stat: dict[str, float], metric: str) -> str:
    scale = 100.0 if metric == "accuracy" else 1.0
    unit = "%" if metric == "accuracy" else ""
    if math.isnan(stat["mean"]):
        return "n/a"
    return f"{stat['mean'] * scale:.2f} ± {stat['std'] * scale:.2f}{unit}"


def markdown_table(results: dict[str, Any]) -> str:
    """One table per metric: algorithms as rows, sweep values as columns, mean ± std."""
    sweep = results["sweep"]
    values = [str(v) for v in sweep["values"]]
    first = results["summary"][values[0]][results["algorithms"][0]]
    lines = [f"# {results['name']}", "",
             f"Test metrics over seeds {results['seeds']} (mean ± std).", ""]
    if results.get("encodings"):
        lines += ["Identifiers reached the coordinator as: "
                  + ", ".join(results["encodings"]) + ".", ""]
    for metric in first:
        head = [sweep["key"] + " =" + f" {v}" if sweep["key"] else metric for v in values]
        lines += [f"## {metric}", "", "| algorithm | " + " | ".join(head) + " |",
                  "|---|" + "---|" * len(values)]
        for alg in results["algorithms"]:
            cells = [_fmt(results["summary"][v][alg][metric], metric) for v in values]
            lines.append(f"| {alg} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def plot_results(results: dict[str, Any], path: Path) -> None:
    from matplotlib.figure import Figure

    metric = results["headline_metric"]
    values = results["sweep"]["values"]
    fig = Figure(figsize=(6.5, 4.0), dpi=110)
    ax = fig.add_subplot()
    xs = np.arange(len(values))
    for i, alg in enumerate(results["algorithms"]):
        stats = [results["summary"][str(v)][alg][metric] for v in values]
        means = [s["mean"] for s in stats]
        stds = [s["std"] for s in stats]
        if len(values) > 1:
            ax.errorbar(xs, means, yerr=stds, marker="o", capsize=3, label=alg)
        else:
            ax.bar(i, means[0], yerr=stds[0], capsize=3, label=alg)
    if len(values) > 1:
        ax.set_xticks(xs, [str(v) for v in values])
        ax.set_xlabel(results["sweep"]["key"])
    else:
        ax.set_xticks([])
    ax.set_ylabel(f"test {metric}")
    ax.set_title(results["name"])
    ax.legend(fontsize="small")
    fig.tight_layout()
    with atomic_open(path, "wb") as fh:
        fig.savefig(fh, format="png")
