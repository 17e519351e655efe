"""Raw numeric identifiers (latitude/longitude, trajectories, numeric quasi-identifiers).

Optional standardisation uses statistics passed in explicitly (:class:`Standardization`), so that
both parties scale with the *same* mean and scale — standardising each side with its own
statistics would shift one table against the other and break the distances.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from vflink.errors import ConfigError, DataError

__all__ = ["RawEncoder", "Standardization"]


@dataclass(frozen=True, kw_only=True)
class Standardization:
    """Per-column ``(x - mean) / scale``; build it once with :meth:`fit` and share it."""

    mean: tuple[float, ...]
    scale: tuple[float, ...]

    def __post_init__(self) -> None:
        mean = tuple(float(v) for v in self.mean)
        scale = tuple(float(v) for v in self.scale)
        if len(mean) != len(scale) or not mean:
            raise ConfigError(
                f"`mean` and `scale` must be non-empty and of equal length, got {len(mean)} "
                f"and {len(scale)}"
            )
        if not all(np.isfinite(mean)) or not all(np.isfinite(s) and s > 0 for s in scale):
            raise ConfigError(f"`scale` must be finite numbers > 0 and `mean` finite, got "
                              f"mean={mean}, scale={scale}")
        object.__setattr__(self, "mean", mean)
        object.__setattr__(self, "scale", scale)

    @classmethod
    def fit(cls, *tables: npt.ArrayLike) -> Standardization:
        """Mean and standard deviation over the rows of all ``tables`` (e.g. both parties'
        public or agreed reference data); a zero deviation becomes scale 1."""
        rows = np.concatenate([_as_2d(t) for t in tables], axis=0)
        if rows.shape[0] == 0:
            raise DataError("cannot fit a standardisation on zero rows")
        std = rows.std(axis=0)
        return cls(mean=tuple(rows.mean(axis=0)), scale=tuple(np.where(std > 0, std, 1.0)))

    def apply(self, values: npt.ArrayLike) -> npt.NDArray[np.float64]:
        x = _as_2d(values)
        if x.shape[1] != len(self.mean):
            raise DataError(
                f"standardisation was fitted on {len(self.mean)} columns, got {x.shape[1]}"
            )
        return np.asarray((x - np.asarray(self.mean)) / np.asarray(self.scale), dtype=np.float64)


def _as_2d(values: npt.ArrayLike) -> npt.NDArray[np.float64]:
    try:
        x = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise DataError(f"numeric identifiers expected: {exc}") from None
    if x.ndim == 1:
        x = x[:, None]
    if x.ndim != 2:
        raise DataError(f"numeric identifiers must be a 1-D or 2-D array, got shape {x.shape}")
    return x


@dataclass(frozen=True, kw_only=True)
class RawEncoder:
    """Identifiers as float64 vectors, optionally standardised; compared with Euclidean distance
    (or haversine for (lat, lon) degrees — do not standardise those)."""

    standardization: Standardization | None = None
    metric: str = "euclidean"

    def encode(self, values: npt.ArrayLike) -> npt.NDArray[np.float64]:
        if self.standardization is None:
            return _as_2d(values)
        return self.standardization.apply(values)
