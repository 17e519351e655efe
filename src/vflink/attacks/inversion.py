"""Model inversion by a decoder (Ye et al. 2022; VFL-AFE §4.3, Figure 10).

The attacker holds auxiliary samples X_atk like the victim secondary's features and can query
the secondary's bottom model f (through whatever the secondary releases). It trains a decoder
f⁻¹ minimising ‖f⁻¹(f(X_atk)) − X_atk‖² and applies it to the embeddings it received, to
reconstruct the victim's features. Reported as reconstruction MSE (against the MSE of always
guessing the auxiliary mean, the no-information baseline); for images,
:func:`inversion_grid_png` draws truth and reconstructions side by side (Figure 10).

View: ``embeddings`` (n, d) received for the target records; ``extra``: ``aux_features``
(m, p) and ``aux_embeddings`` (m, d) = f(aux) as released to queries. ``infer`` returns the
reconstructed features, one row per target record. Truth: ``{"features": (n, p)}``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt
import torch
from torch import nn

from vflink._checks import check_choice, check_int, raise_if
from vflink._files import atomic_open
from vflink.attacks.base import ATTACKS, AttackResult, AttackView
from vflink.errors import ConfigError
from vflink.models.mlp import build_mlp, seeded_init

__all__ = ["DecoderInversion", "inversion_grid_png"]


@dataclass(frozen=True, kw_only=True)
class DecoderInversion:
    """Train f⁻¹ on (f(X_atk), X_atk); reconstruct features from received embeddings."""

    name: ClassVar[str] = "inversion-decoder"
    summary: ClassVar[str] = ("model inversion: a decoder trained on auxiliary samples and "
                              "queries of the secondary's bottom model (Ye et al. 2022; "
                              "VFL-AFE §4.3, Figure 10)")
    needs: ClassVar[frozenset[str]] = frozenset({"embeddings", "extra"})
    role: ClassVar[str] = "primary"

    hidden: tuple[int, ...] = (256, 256)
    epochs: int = 60
    lr: float = 1e-3
    batch_size: int = 128
    output: str = "linear"  # "sigmoid" for features in [0, 1] (pixels)
    seed: int = 0

    def __post_init__(self) -> None:
        problems: list[str] = []
        check_int(problems, "epochs", self.epochs, min=1)
        check_int(problems, "batch_size", self.batch_size, min=1)
        check_int(problems, "seed", self.seed, min=0)
        check_choice(problems, "output", self.output, ("linear", "sigmoid"))
        raise_if(problems, f"{self.name} parameters")

    def decoder(self, aux_embeddings: npt.NDArray[Any], aux_features: npt.NDArray[Any]
                ) -> nn.Module:
        """The trained decoder f⁻¹ (until the epochs are spent: "till it converges")."""
        h = torch.as_tensor(np.asarray(aux_embeddings, dtype=np.float32))
        x = torch.as_tensor(np.asarray(aux_features, dtype=np.float32))
        if len(h) != len(x):
            raise ConfigError(f"{len(h)} auxiliary embeddings for {len(x)} auxiliary samples")
        with seeded_init(self.seed):
            net: nn.Module = build_mlp(h.shape[1], self.hidden, x.shape[1])
        if self.output == "sigmoid":
            net = nn.Sequential(net, nn.Sigmoid())
        opt = torch.optim.Adam(net.parameters(), lr=self.lr)
        gen = torch.Generator().manual_seed(self.seed)
        for _ in range(self.epochs):
            order = torch.randperm(len(h), generator=gen)
            for start in range(0, len(h), self.batch_size):
                idx = order[start:start + self.batch_size]
                loss = ((net(h[idx]) - x[idx]) ** 2).mean()
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
        return net

    def infer(self, view: AttackView) -> npt.NDArray[np.float64]:
        view.require(self.needs, self.name)
        for key in ("aux_features", "aux_embeddings"):
            if key not in view.extra:
                raise ConfigError(f"attack {self.name!r} needs extra[{key!r}]")
        net = self.decoder(view.extra["aux_embeddings"], view.extra["aux_features"])
        with torch.no_grad():
            out = net(torch.as_tensor(np.asarray(view.embeddings, dtype=np.float32)))
        return out.double().numpy()

    def evaluate(self, view: AttackView, truth: Mapping[str, Any]) -> AttackResult:
        x = np.asarray(truth["features"], dtype=np.float64)
        recon = self.infer(view)
        mse = float(np.mean((recon - x) ** 2))
        mean = np.asarray(view.extra["aux_features"], dtype=np.float64).mean(axis=0)
        baseline = float(np.mean((mean[None, :] - x) ** 2))
        ratio = mse / baseline if baseline > 0 else float("nan")
        explanation = (f"a party that receives {view.party!r}'s embeddings reconstructs its "
                       f"features with mean squared error {mse:.4g}, {ratio:.0%} of the error "
                       "of guessing the average record (100 %: nothing learnt)")
        return AttackResult(attack=self.name, party=view.party,
                            metrics={"mse": mse, "baseline_mse": baseline, "mse_ratio": ratio},
                            explanation=explanation,
                            params={"hidden": list(self.hidden), "epochs": self.epochs,
                                    "seed": self.seed, "output": self.output},
                            details={"targets": int(len(x)),
                                     "aux": int(len(view.extra["aux_features"]))})


def inversion_grid_png(rows: Sequence[tuple[str, npt.NDArray[Any]]], shape: tuple[int, int],
                       path: Path, *, columns: int = 10) -> Path:
    """Figure 10: one row of images per entry (``(title, (n, h*w) array)``), e.g. the ground
    truth, then the reconstructions of each method, for the same ``columns`` records."""
    from matplotlib.figure import Figure  # matplotlib only when drawing

    fig = Figure(figsize=(columns * 0.8, len(rows) * 0.95 + 0.2), dpi=100)
    for r, (title, images) in enumerate(rows):
        for c in range(columns):
            ax = fig.add_subplot(len(rows), columns, r * columns + c + 1)
            ax.imshow(np.clip(np.asarray(images[c]).reshape(shape), 0, 1), cmap="gray",
                      vmin=0, vmax=1)
            ax.set_xticks([])
            ax.set_yticks([])
            if c == 0:
                ax.set_ylabel(title, fontsize=7, rotation=0, ha="right", va="center")
    fig.tight_layout()
    path = Path(path)
    with atomic_open(path, "wb") as fh:
        fig.savefig(fh, format="png")
    return path


ATTACKS.add(DecoderInversion.name, DecoderInversion)
