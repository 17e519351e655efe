"""Label inference by clustering the gradient rows a secondary received.

Within a batch, the gradient of record i with respect to the embedding it came from is
(p_i − y_i)·∂z_i/∂h_i (Li et al., ICLR 2022, §3): rows of one class point one way, rows of the
other the opposite way, and their norms differ on a skewed task. An attacker who knows no label
at all can therefore split each batch's rows into groups and read the groups as classes:

* ``label-kmeans``: k-means (scikit-learn) on the rows;
* ``label-spectral``: spectral clustering (an RBF affinity on the rows, its spectral embedding,
  then k-means there; scikit-learn's ``spectral_embedding``), which also separates groups that
  are not linearly separable;
* ``label-fcm``: fuzzy c-means on the rows, the clustering VFL-AFE's distribution adjusting
  (§3.3, Eq. 7) runs on the very same gradients (:func:`vflink.privacy.afe.fuzzy_cmeans`, the
  one implementation both use): what +D finds, an attacker finds too.

Each batch is clustered on its own (the model moves between batches). For a binary task each
row is scored by how much closer it lies to the smaller group (positives are the minority
class, as for the direction attack), and the leak is the per-batch AUC; for a multi-class task
each batch is split into as many groups as classes and scored by accuracy, each group named by
the mapping to classes that fits best (an upper bound).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt
import torch

from vflink._checks import check_int, raise_if
from vflink.attacks.base import ATTACKS
from vflink.attacks.label_leakage import _LabelAttack
from vflink.privacy.afe import fuzzy_cmeans

__all__ = ["LabelFCMAttack", "LabelKMeansAttack", "LabelSpectralAttack", "minority_scores"]


def minority_scores(distances: npt.NDArray[np.float64], assignment: npt.NDArray[np.int64]
                    ) -> npt.NDArray[np.float64]:
    """Per row, how much closer it is to the smaller of two groups than to the larger:
    d(row, larger centre) − d(row, smaller centre) (``distances``: (n, 2))."""
    counts = np.bincount(assignment, minlength=2)
    small = int(np.argmin(counts))
    return np.asarray(distances[:, 1 - small] - distances[:, small], dtype=np.float64)


@dataclass(frozen=True, kw_only=True)
class _ClusteringAttack(_LabelAttack):
    """Cluster each batch's gradient rows (``seed``: the clustering's initialisations)."""

    seed: int = 0
    reference: ClassVar[str] = ("Li et al., ICLR 2022, §3 (the gradients' two groups); "
                                "VFL-AFE §3.3 (fuzzy c-means on the gradients)")

    def __post_init__(self) -> None:
        problems: list[str] = []
        check_int(problems, "seed", self.seed, min=0)
        raise_if(problems, f"{self.name} parameters")

    def _params(self) -> dict[str, Any]:
        return {"seed": self.seed}

    def _fit(self, rows: npt.NDArray[np.float64], k: int
             ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]:
        """Group ids and the distance of each row to each group's centre, (n, k)."""
        raise NotImplementedError

    def _per_batch(self, gradients: npt.NDArray[Any], batch: npt.NDArray[Any], k: int
                   ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]:
        g = np.asarray(gradients, dtype=np.float64).reshape(len(gradients), -1)
        assignment = np.zeros(len(g), dtype=np.int64)
        scores = np.zeros(len(g), dtype=np.float64)
        for key in np.unique(batch):
            idx = np.flatnonzero(batch == key)
            rows = g[idx]
            if len(idx) <= k or np.allclose(rows, rows[0]):
                continue  # nothing to split: every row scores alike
            ids, dist = self._fit(rows, k)
            assignment[idx] = ids
            if k == 2:
                scores[idx] = minority_scores(dist, ids)
        return assignment, scores

    def _scores(self, gradients: npt.NDArray[Any], batch: npt.NDArray[Any]
                ) -> npt.NDArray[np.float64]:
        return self._per_batch(gradients, batch, 2)[1]

    def _clusters(self, gradients: npt.NDArray[Any], batch: npt.NDArray[Any], k: int
                  ) -> npt.NDArray[np.int64] | None:
        return self._per_batch(gradients, batch, k)[0]


def _kmeans(rows: npt.NDArray[np.float64], k: int, seed: int
            ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]:
    from sklearn.cluster import KMeans

    fit = KMeans(n_clusters=k, n_init=4, random_state=seed).fit(rows)
    return fit.labels_.astype(np.int64), fit.transform(rows)


@ATTACKS.register("label-kmeans")
@dataclass(frozen=True, kw_only=True)
class LabelKMeansAttack(_ClusteringAttack):
    """k-means on each batch's gradient rows."""

    name: ClassVar[str] = "label-kmeans"
    summary: ClassVar[str] = ("a secondary recovers the primary's labels by k-means clustering "
                              "of each batch's gradient rows")

    def _fit(self, rows: npt.NDArray[np.float64], k: int
             ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]:
        return _kmeans(rows, k, self.seed)


@ATTACKS.register("label-spectral")
@dataclass(frozen=True, kw_only=True)
class LabelSpectralAttack(_ClusteringAttack):
    """Spectral clustering of each batch's gradient rows (RBF affinity at the median
    squared distance)."""

    name: ClassVar[str] = "label-spectral"
    summary: ClassVar[str] = ("a secondary recovers the primary's labels by spectral "
                              "clustering of each batch's gradient rows")

    def _fit(self, rows: npt.NDArray[np.float64], k: int
             ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]:
        from scipy.spatial.distance import pdist, squareform
        from sklearn.manifold import spectral_embedding

        d2 = squareform(pdist(rows, "sqeuclidean"))
        scale = float(np.median(d2[np.triu_indices(len(rows), 1)]))
        # capped below exp's underflow: a zero would cut the graph (no spectral embedding)
        affinity = np.exp(-np.minimum(d2 / (scale if scale > 0 else 1.0), 700.0))
        embedded = spectral_embedding(affinity, n_components=k, drop_first=False,
                                      random_state=self.seed)
        return _kmeans(embedded, k, self.seed)


@ATTACKS.register("label-fcm")
@dataclass(frozen=True, kw_only=True)
class LabelFCMAttack(_ClusteringAttack):
    """Fuzzy c-means on each batch's gradient rows (VFL-AFE Eq. 7); a row's score is its
    membership of the smaller group."""

    name: ClassVar[str] = "label-fcm"
    summary: ClassVar[str] = ("a secondary recovers the primary's labels by fuzzy c-means "
                              "clustering of each batch's gradient rows (VFL-AFE's +D)")

    def _fit(self, rows: npt.NDArray[np.float64], k: int
             ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]:
        generator = torch.Generator().manual_seed(self.seed)
        u = fuzzy_cmeans(torch.from_numpy(rows), k, generator=generator).numpy()
        # a membership is a similarity: 1 − u plays the distance of minority_scores
        return u.argmax(axis=1).astype(np.int64), 1.0 - u
