"""The dataset container, the dataset registry and helpers shared by the loaders."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from vflink._checks import raise_if
from vflink.data.schema import PartySchema
from vflink.data.table import PartyTable
from vflink.errors import ConfigError, DataError
from vflink.registry import Registry
from vflink.types import MISSING, Alignment

__all__ = [
    "DATASETS",
    "DatasetSpec",
    "VFLDataset",
    "dataset_names",
    "load_dataset",
]

#: Every loadable dataset, by name (ARCHITECTURE.md, convention 5).
DATASETS: Registry[DatasetSpec] = Registry("dataset")


@dataclass(frozen=True, eq=False)
class VFLDataset:
    """A ready-made VFL scenario: the primary party's table and one or more secondary tables.

    Attributes:
        name: the registry name it was loaded under.
        primary: the labelled table (role ``"primary"``).
        secondaries: one or more unlabelled tables (role ``"secondary"``); their row order is
            shuffled with the seed, so it never reveals the alignment.
        description: what the data is, where it comes from and its licence.
        true_secondary_index: ground truth for evaluation only (never give it to a party):
            one int64 array per secondary, of shape ``(len(primary),)``, holding for each primary
            row the position of its true match in that secondary table, or ``-1`` where the
            record has no counterpart there. ``None`` where no true match exists (e.g. a house
            and a nearby town are related, not the same record).
        informative_features: for synthetic data, the feature columns of each party that carry
            label signal (``make_classification``'s informative and redundant columns).
        options: the resolved loader options, for run directories and reproducibility.
        splits: the (train, validation, test) primary rows where the data's authors fixed
            them (a reproduction preset); ``None`` lets the run split with its own seed.
    """

    name: str
    primary: PartyTable
    secondaries: tuple[PartyTable, ...]
    description: str = ""
    true_secondary_index: tuple[npt.NDArray[np.int64], ...] | None = None
    informative_features: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    options: Mapping[str, object] = field(default_factory=dict)
    splits: tuple[npt.NDArray[np.int64], ...] | None = None

    def __post_init__(self) -> None:
        if self.splits is not None:
            parts = tuple(np.ascontiguousarray(p, dtype=np.int64) for p in self.splits)
            every = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
            if (len(parts) != 3 or any(len(p) == 0 for p in parts)
                    or len(np.unique(every)) != len(every) or every.min() < 0
                    or every.max() >= len(self.primary)):
                raise DataError(f"dataset {self.name!r}: `splits` must be three non-empty, "
                                "disjoint arrays of primary rows")
            object.__setattr__(self, "splits", parts)
        secondaries = tuple(self.secondaries)
        object.__setattr__(self, "secondaries", secondaries)
        if self.primary.schema.role != "primary":
            raise DataError(f"dataset {self.name!r}: table {self.primary.name!r} is not primary")
        if not secondaries:
            raise DataError(f"dataset {self.name!r}: needs at least one secondary table")
        for table in secondaries:
            if table.schema.role != "secondary":
                raise DataError(f"dataset {self.name!r}: table {table.name!r} is not secondary")
        names = [t.name for t in self.parties]
        if len(set(names)) != len(names):
            raise DataError(f"dataset {self.name!r}: party names must be unique, got {names}")
        if self.true_secondary_index is not None:
            truth = tuple(np.ascontiguousarray(t, dtype=np.int64)
                          for t in self.true_secondary_index)
            if len(truth) != len(secondaries):
                raise DataError(f"dataset {self.name!r}: {len(truth)} ground-truth arrays for "
                                f"{len(secondaries)} secondary tables")
            for t, table in zip(truth, secondaries):
                if t.shape != (len(self.primary),):
                    raise DataError(f"dataset {self.name!r}: ground truth for {table.name!r} has "
                                    f"shape {t.shape}, expected ({len(self.primary)},)")
                if t.size and (t.min() < MISSING or t.max() >= len(table)):
                    raise DataError(f"dataset {self.name!r}: ground truth for {table.name!r} "
                                    f"points outside [0, {len(table)})")
                t.flags.writeable = False
            object.__setattr__(self, "true_secondary_index", truth)

    @property
    def parties(self) -> tuple[PartyTable, ...]:
        """The primary table followed by the secondary tables."""
        return (self.primary, *self.secondaries)

    @property
    def secondary(self) -> PartyTable:
        """The first (in two-party scenarios: the only) secondary table."""
        return self.secondaries[0]

    def party(self, name: str) -> PartyTable:
        """The table of the party called ``name``."""
        for table in self.parties:
            if table.name == name:
                return table
        valid = ", ".join(t.name for t in self.parties)
        raise ConfigError(f"dataset {self.name!r} has no party {name!r}; parties are: {valid}")

    def _secondary_position(self, secondary: str | int) -> int:
        if isinstance(secondary, int) and not isinstance(secondary, bool):
            if not 0 <= secondary < len(self.secondaries):
                raise ConfigError(f"`secondary` must be an int in [0, {len(self.secondaries)}), "
                                  f"got {secondary}")
            return secondary
        names = [t.name for t in self.secondaries]
        if secondary not in names:
            raise ConfigError(f"dataset {self.name!r} has no secondary party {secondary!r}; "
                              f"secondary parties are: {', '.join(names)}")
        return names.index(str(secondary))

    def true_alignment(self, secondary: str | int = 0) -> Alignment:
        """The ground-truth :class:`~vflink.types.Alignment` (k = 1) with one secondary.

        Every primary row appears, linked to its true match or to ``MISSING`` (-1). For
        evaluation and for the *Exact* baseline only: in a real deployment nobody has it.
        """
        pos = self._secondary_position(secondary)
        if self.true_secondary_index is None:
            raise DataError(f"dataset {self.name!r} has no true matches: its parties hold "
                            "related records, not copies of the same records")
        truth = self.true_secondary_index[pos]
        return Alignment(np.arange(len(truth), dtype=np.int64), truth.copy(),
                         secondary=self.secondaries[pos].name)


@dataclass(frozen=True, eq=False)
class DatasetSpec:
    """How to load one registered dataset: its option type, builder and preset defaults."""

    name: str
    options_type: type[Any]
    build: Callable[[Any], VFLDataset]
    summary: str
    defaults: Mapping[str, object] = field(default_factory=dict)

    def option_names(self) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(self.options_type))

    def default_options(self) -> dict[str, object]:
        """The options this dataset loads with when none are given (not validated: some
        datasets, like "imdb-movies", have options the user must supply)."""
        out: dict[str, object] = {}
        for f in dataclasses.fields(self.options_type):
            if f.default is not dataclasses.MISSING:
                out[f.name] = f.default
            elif f.default_factory is not dataclasses.MISSING:
                out[f.name] = f.default_factory()
        out.update(self.defaults)
        return out

    def load(self, **options: object) -> VFLDataset:
        valid = self.option_names()
        unknown = sorted(set(options) - set(valid))
        if unknown:
            raise ConfigError(f"unknown option(s) {unknown} for dataset {self.name!r}; valid "
                              f"options are: {', '.join(sorted(valid))}")
        try:
            resolved = self.options_type(**{**self.defaults, **options})
        except ConfigError as exc:
            # Re-word "invalid XOptions" as "invalid options for dataset 'name'", keeping
            # every problem (a config file reports all its mistakes at once).
            raise_if(exc.problems, f"options for dataset {self.name!r}")
            raise
        dataset = self.build(resolved)
        return dataclasses.replace(dataset, name=self.name, options=_options_dict(resolved))


def _options_dict(options: object) -> dict[str, object]:
    return {f.name: getattr(options, f.name) for f in dataclasses.fields(options)}  # type: ignore[arg-type]


def register_dataset(name: str, options_type: type[Any], build: Callable[[Any], VFLDataset],
                     summary: str, **defaults: object) -> None:
    """Register ``build(options_type(**defaults, **user_options))`` under ``name``."""
    DATASETS.add(name, DatasetSpec(name, options_type, build, summary, dict(defaults)))


def dataset_names() -> tuple[str, ...]:
    """The names :func:`load_dataset` accepts, sorted."""
    return DATASETS.names()


def load_dataset(name: str, **options: object) -> VFLDataset:
    """Load the dataset registered as ``name`` with the given options.

    Unknown names raise :class:`~vflink.errors.UnknownNameError` listing the valid ones;
    unknown or invalid options raise :class:`~vflink.errors.ConfigError` naming every problem.
    Nothing is downloaded: real tables ship inside the package (see ``data/PROVENANCE.md``).
    """
    return DATASETS.get(name).load(**options)


# --------------------------------------------------------------------------- shared helpers
def read_shipped(filename: str, **read_csv: Any) -> pd.DataFrame:
    """Read a table shipped in ``vflink/datasets/data/`` (works from a wheel or a checkout)."""
    ref = resources.files("vflink.datasets").joinpath("data", filename)
    if not ref.is_file():
        raise DataError(f"shipped data file {filename!r} is missing from the vflink install; "
                        "reinstall vflink (its package data includes vflink/datasets/data/*)")
    with resources.as_file(ref) as path:
        return pd.read_csv(path, **read_csv)


def split_entities(n: int, overlap: float,
                   rng: np.random.Generator) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Which of ``n`` entities each of two parties holds, as shuffled entity numbers.

    A fraction ``overlap`` of the entities is held by both parties; the rest is split evenly
    between primary-only and secondary-only records (the union/intersection setting of FLORIST
    §2, where membership of the intersection must not leak).
    """
    order = rng.permutation(n).astype(np.int64)
    n_shared = int(round(overlap * n))
    rest = order[n_shared:]
    n_primary_only = (len(rest) + 1) // 2
    primary = np.concatenate([order[:n_shared], rest[:n_primary_only]])
    secondary = np.concatenate([order[:n_shared], rest[n_primary_only:]])
    return rng.permutation(primary), rng.permutation(secondary)


def truth_index(primary_entities: npt.NDArray[np.int64],
                secondary_entities: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """For each primary entity, its row in the secondary table (or -1 when absent)."""
    lookup = pd.Series(np.arange(len(secondary_entities), dtype=np.int64),
                       index=pd.Index(secondary_entities))
    if not lookup.index.is_unique:
        raise DataError("secondary entities must be unique to define a ground truth")
    found = lookup.reindex(pd.Index(primary_entities))
    return found.fillna(MISSING).to_numpy(dtype=np.int64)


def table(schema: PartySchema, frame: pd.DataFrame, dataset: str) -> PartyTable:
    """Validate ``frame`` against ``schema``, keeping only the schema's columns, in its order."""
    return PartyTable.from_frame(schema, frame[list(schema.columns)],
                                 source=f"dataset:{dataset}/{schema.name}")


def seed_streams(seed: int, n: int) -> list[np.random.Generator]:
    """``n`` independent generators from one seed.

    Each purpose (features, split, noise, shuffling) gets its own stream, so changing one option
    (say the noise scale σ_cf) leaves every other random choice of the same seed unchanged.
    """
    return [np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(n)]


def check_fraction(problems: list[str], name: str, value: object, *, open_low: bool,
                   allow_none: bool = False) -> None:
    """A number in [0, 1] (or (0, 1] with ``open_low``)."""
    if value is None and allow_none:
        return
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if ok:
        v = float(value)  # type: ignore[arg-type]
        ok = math.isfinite(v) and (0.0 < v if open_low else 0.0 <= v) and v <= 1.0
    if not ok:
        interval = "(0, 1]" if open_low else "[0, 1]"
        extra = " or None" if allow_none else ""
        problems.append(f"`{name}` must be a number in {interval}{extra}, got {value!r}")


def check_seed(problems: list[str], value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        problems.append(f"`seed` must be an int ≥ 0, got {value!r}")


def check_max_rows(problems: list[str], value: object, *, minimum: int = 10) -> None:
    if value is None:
        return
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        problems.append(f"`max_rows` must be an int ≥ {minimum} or None, got {value!r}")


def as_str_tuple(value: object) -> object:
    """Config files give lists; options store tuples (frozen dataclasses stay hashable)."""
    if isinstance(value, str):
        return (value,)
    if isinstance(value, Sequence):
        return tuple(value)
    return value
