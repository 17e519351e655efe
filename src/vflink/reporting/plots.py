"""Plots written into run directories (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from vflink._files import atomic_open

if TYPE_CHECKING:
    from vflink.runfiles.results import RunResult

__all__ = ["learning_curve"]


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
