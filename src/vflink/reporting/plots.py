"""Plots written into run directories (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from vflink._files import atomic_open

if TYPE_CHECKING:
    from vflink.runfiles.results import RunResult

__all__ = ["learning_curve", "plot_link_model"]


def learning_curve(result: RunResult, path: Path) -> None:
    """Training loss and the validation headline metric per epoch, best epoch marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    epochs = [r.epoch for r in result.history]
    metric = result.headline
    fig, ax1 = plt.subplots(figsize=(6, 3.5), dpi=100)
    ax1.plot(epochs, [r.train_loss for r in result.history], color="tab:blue", label="train loss")
    ax1.set_xlabel("epoch")
    ax1.set_ylabel("train loss", color="tab:blue")
    ax2 = ax1.twinx()
    ax2.plot(epochs, [r.validation[metric] for r in result.history], color="tab:orange",
             label=f"validation {metric}")
    ax2.set_ylabel(f"validation {metric}", color="tab:orange")
    ax2.axvline(result.best_epoch, color="grey", linestyle=":", label="best epoch")
    ax1.set_title(f"{result.algorithm}: test {metric} = {result.metrics['test'][metric]:.4f}")
    fig.tight_layout()
    with atomic_open(path, "wb") as fh:
        fig.savefig(fh, format=Path(path).suffix.lstrip(".").lower() or "png")
    plt.close(fig)


def plot_link_model(model: dict[str, Any], path: Path,
                    measured: dict[str, Any] | None = None) -> None:
    """A model link's charts in one figure: the match-weight histogram of the candidate pairs
    (matched and not), the estimated precision, recall and F1 at every threshold (with the
    measured PR curve when labels were given), and the waterfall of one pair (each field's
    contribution to its match weight).

    Drawn on a bare :class:`~matplotlib.figure.Figure` (the Agg canvas, no pyplot state), so
    that a link can draw it in a thread beside its write."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(15, 4), dpi=100)
    ax1, ax2, ax3 = fig.subplots(1, 3)
    hist = model.get("weight_histogram", {})
    edges = hist.get("edges", [])
    if len(edges) > 1:
        centres = [(a + b) / 2 for a, b in zip(edges, edges[1:], strict=False)]
        ax1.bar(centres, hist["unmatched"], width=1.0, color="tab:grey", label="not matched")
        ax1.bar(centres, hist["matched"], width=1.0, bottom=hist["unmatched"],
                color="tab:green", label="matched")
        ax1.set_yscale("symlog")
    ax1.set_xlabel("match weight (bits)")
    ax1.set_ylabel("candidate pairs")
    ax1.set_title(f"match weights (λ = {model.get('lambda', float('nan')):.3g})")
    ax1.legend()
    curve = model.get("threshold_curve", {})
    for key, colour in (("precision", "tab:blue"), ("recall", "tab:orange"),
                        ("f1", "tab:green")):
        ax2.plot(curve.get("threshold", []), curve.get(key, []), color=colour,
                 label=f"estimated {key}")
    if measured:
        m = measured.get("measured", {})
        ax2.scatter([model.get("threshold", 0.5)] * 3,
                    [m.get("precision"), m.get("recall"), m.get("f1")], color="black",
                    marker="x", label="measured (labels) at the threshold")
    ax2.axvline(model.get("threshold", 0.5), color="grey", linestyle=":")
    ax2.set_xlabel("threshold (match probability)")
    ax2.set_ylim(0, 1.02)
    ax2.set_title("quality by threshold, label-free")
    ax2.legend(loc="lower left", fontsize=8)
    fall = model.get("waterfall", {})
    names = ["prior", *(f"{f['field']}: {f['level']}" for f in fall.get("fields", []))]
    values = [fall.get("prior", 0.0), *(f["weight"] for f in fall.get("fields", []))]
    start = 0.0
    for i, v in enumerate(values):
        ax3.bar(i, v, bottom=start, color="tab:green" if v >= 0 else "tab:red")
        start += v
    ax3.axhline(0, color="grey", linewidth=0.5)
    ax3.set_xticks(range(len(names)), names, rotation=60, ha="right", fontsize=7)
    ax3.set_ylabel("cumulative match weight (bits)")
    ax3.set_title(f"pair ({fall.get('primary_index')}, {fall.get('secondary_index')}): "
                  f"w = {fall.get('match_weight', 0.0):.2f}, "
                  f"p = {fall.get('match_probability', 0.0):.3f}")
    fig.tight_layout()
    with atomic_open(path, "wb") as fh:
        fig.savefig(fh, format="png")
