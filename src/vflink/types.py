"""Small value types shared by every layer: tasks and alignments."""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import numpy as np
import numpy.typing as npt

from vflink.errors import ConfigError, DataError

__all__ = ["MISSING", "Alignment", "Compute", "Task"]

#: Marker in :attr:`Alignment.secondary_index` for "no linked secondary row".
MISSING = -1

_R = TypeVar("_R")


class Compute(Protocol):
    """What a pure algorithm asks of a compute engine (ARCHITECTURE.md, "Where wave 3 lives"):
    ``map(fn, items, shared=...)`` runs ``fn(shared, item)`` for every item and returns the
    results in the items' order (``shared`` goes to each worker once, not once per item;
    ``progress(1)`` is called as each item finishes, in order);
    ``workers`` tasks run at once; a task takes at most ``chunk_rows`` rows. A
    :class:`vflink.engine.Engine` is one; algorithms take a ``Compute`` rather than an engine
    so they never import the engine package, and ``None`` keeps their in-process paths."""

    @property
    def workers(self) -> int: ...

    @property
    def chunk_rows(self) -> int: ...

    def map(self, fn: Callable[[Any, Any], _R], items: Sequence[Any], *, shared: Any = None,
            progress: Callable[[int], None] | None = None) -> list[_R]: ...


class Task(enum.StrEnum):
    """The learning task of the primary party's label."""

    BINARY = "binary"
    MULTICLASS = "multiclass"
    REGRESSION = "regression"

    @classmethod
    def parse(cls, value: str | Task) -> Task:
        if isinstance(value, Task):
            return value
        try:
            return cls(value)
        except ValueError:
            valid = ", ".join(t.value for t in cls)
            raise ConfigError(f"`task` must be one of {valid}, got {value!r}") from None

    @property
    def is_classification(self) -> bool:
        return self is not Task.REGRESSION


@dataclass(frozen=True, eq=False)
class Alignment:
    """Which secondary row(s) each primary row is linked to.

    This is the typed hand-off from the alignment stage to training: training consumes an
    ``Alignment``, never a linkage object (ARCHITECTURE.md, "The data flow").

    Attributes:
        primary_index: shape ``(n,)``, 0-based row positions in the primary table.
        secondary_index: shape ``(n, k)``, 0-based row positions in the secondary table, ordered
            from most to least similar; :data:`MISSING` (-1) where a primary row has no link.
        similarity: optional shape ``(n, k)`` similarities (soft linkage, FedSim §4.1); only the
            primary party ever holds them.
        secondary: name of the secondary party this alignment refers to.
    """

    primary_index: npt.NDArray[np.int64]
    secondary_index: npt.NDArray[np.int64]
    similarity: npt.NDArray[np.float32] | None = None
    secondary: str = "secondary"
    meta: dict[str, float] = field(default_factory=dict)
    #: a model link's decisions, shape ``(n, k)`` (primary only): which links are matches
    match: npt.NDArray[np.bool_] | None = None

    def __post_init__(self) -> None:
        p = np.ascontiguousarray(self.primary_index, dtype=np.int64)
        s = np.asarray(self.secondary_index, dtype=np.int64)
        if s.ndim == 1:
            s = s[:, None]
        s = np.ascontiguousarray(s)
        if p.ndim != 1:
            raise DataError(f"alignment primary_index must be 1-D, got shape {p.shape}")
        if s.ndim != 2 or s.shape[0] != p.shape[0] or s.shape[1] < 1:
            raise DataError(
                f"alignment secondary_index must have shape ({p.shape[0]}, k>=1), got {s.shape}"
            )
        if s.size and s.min() < MISSING:
            raise DataError(f"alignment secondary_index has negative entries below {MISSING}")
        object.__setattr__(self, "primary_index", p)
        object.__setattr__(self, "secondary_index", s)
        if self.similarity is not None:
            sim = np.ascontiguousarray(self.similarity, dtype=np.float32)
            if sim.ndim == 1:
                sim = sim[:, None]
            if sim.shape != s.shape:
                raise DataError(
                    f"alignment similarity shape {sim.shape} != secondary_index shape {s.shape}"
                )
            object.__setattr__(self, "similarity", sim)
        if self.match is not None:
            match = np.asarray(self.match, dtype=bool).reshape(s.shape)
            object.__setattr__(self, "match", match)

    @property
    def k(self) -> int:
        return int(self.secondary_index.shape[1])

    def __len__(self) -> int:
        return int(self.primary_index.shape[0])

    @property
    def matched(self) -> npt.NDArray[np.bool_]:
        """Boolean mask of primary rows with at least one linked secondary row."""
        return np.asarray((self.secondary_index != MISSING).any(axis=1))

    def without_similarity(self) -> Alignment:
        """The view a secondary party may hold: indices only (ARCHITECTURE.md, boundary table)."""
        return Alignment(self.primary_index, self.secondary_index, None, self.secondary)

    def subset(self, rows: npt.NDArray[np.bool_] | npt.NDArray[np.int64]) -> Alignment:
        """The alignment restricted to the given positions (mask or indices) of this alignment."""
        sim = None if self.similarity is None else self.similarity[rows]
        match = None if self.match is None else self.match[rows]
        return Alignment(self.primary_index[rows], self.secondary_index[rows], sim,
                         self.secondary, dict(self.meta), match)

    def for_primary_rows(self, n_primary: int) -> npt.NDArray[np.int64]:
        """A dense ``(n_primary, k)`` table of linked secondary rows, MISSING where unlinked."""
        dense = np.full((n_primary, self.k), MISSING, dtype=np.int64)
        dense[self.primary_index] = self.secondary_index
        return dense
