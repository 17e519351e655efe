"""The synthetic "sklearn" dataset of FedSim (§6.1 "Dataset", App. E Table 4).

FedSim §6.1: "we first create a global dataset by generating with sklearn API [...]. Then, we
randomly select some features as common features and randomly divide the remaining features
equally to both parties. Common features are not used in training [...] we also add different
scales σ_cf of Gaussian noise to the common features [...] v'_i = v_i + N(σ_cf² I) will be used
for linkage." Table 4: 60,000 samples, 50 features at each party, 5 float identifiers, binary
classification. The ``make_classification`` settings (20 informative, 10 redundant, 3 clusters
per class, class_sep 0.7) and the choice of the common features among the *informative* ones are
those of the FedSim authors' public generator for this dataset ("sklearn selects existing
features as common features", App. F.6, as opposed to "sklearn-random" whose common features
carry no information: ``identifiers_from = "any"`` picks them among all columns instead).

Deviations, all documented options: the paper counts the 5 common features inside each party's
50 columns (its generator draws 95 global features); here ``n_primary_features`` and
``n_secondary_features`` count *training* features only, so the global dataset has
``n_primary_features + n_secondary_features + n_identifiers`` columns. ``secondary_signal``
(default: the paper's random split) steers where the informative features go, and ``overlap``
(default 1: every record at both parties, as in the paper) makes partially overlapping parties.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pandas as pd
from sklearn.datasets import make_classification

from vflink._checks import check_float, check_int, raise_if
from vflink.data.schema import PartySchema
from vflink.datasets._base import (
    VFLDataset,
    check_fraction,
    check_seed,
    register_dataset,
    seed_streams,
    split_entities,
    table,
    truth_index,
)
from vflink.types import Task

__all__ = ["SklearnOptions", "VerticalFeatures", "make_sklearn", "vertical_classification"]

KEY = "id"
LABEL = "y"


@dataclass(frozen=True, kw_only=True)
class SklearnOptions:
    """Options of the "sklearn" synthetic dataset (defaults: FedSim App. E, Table 4).

    Attributes:
        n_samples: records in the global dataset (each party holds all of them when
            ``overlap`` is 1).
        n_primary_features: training features of the primary party (identifiers excluded).
        n_secondary_features: training features of the secondary party (identifiers excluded).
        n_identifiers: common features used only for linkage (FedSim's "common features").
        n_informative: ``make_classification``'s informative features.
        n_redundant: ``make_classification``'s redundant features (linear mixes of the
            informative ones; they count as signal for ``secondary_signal``).
        n_classes: 2 gives a binary task, more a multiclass task.
        n_clusters_per_class: ``make_classification``'s clusters per class.
        class_sep: ``make_classification``'s class separation (larger is easier).
        flip_y: fraction of labels flipped at random (label noise).
        sigma_cf: σ_cf, the standard deviation of the Gaussian noise N(0, σ_cf²) added to the
            secondary party's copy of the identifiers (FedSim §6.1); 0 keeps them equal.
        secondary_signal: fraction of the non-identifier signal features (informative and
            redundant) given to the secondary party, as far as its ``n_secondary_features``
            slots allow; ``None`` splits all features at random as the paper does.
        overlap: fraction of records held by both parties; the others are split evenly into
            primary-only and secondary-only records.
        identifiers_from: ``"informative"`` (the authors' generator: common features are
            informative features, so similar identifiers mean similar records; if there are more
            identifiers than informative features the rest are drawn from the others) or
            ``"any"`` (chosen among all features; mostly noise, like App. F.6's
            "sklearn-random").
        positive_fraction: a binary task's share of positive records (``make_classification``'s
            ``weights``, before ``flip_y``); ``None``: balanced. An imbalanced task is where a
            secondary reads the labels off the gradients best (Li et al., ICLR 2022, §5).
        seed: seeds every random choice (explicit randomness, no global state).
    """

    n_samples: int = 60_000
    n_primary_features: int = 50
    n_secondary_features: int = 50
    n_identifiers: int = 5
    n_informative: int = 20
    n_redundant: int = 10
    n_classes: int = 2
    n_clusters_per_class: int = 3
    class_sep: float = 0.7
    flip_y: float = 0.01
    sigma_cf: float = 0.0
    secondary_signal: float | None = None
    overlap: float = 1.0
    identifiers_from: str = "informative"
    positive_fraction: float | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        problems: list[str] = []
        check_int(problems, "n_samples", self.n_samples, min=10)
        check_int(problems, "n_primary_features", self.n_primary_features, min=1)
        check_int(problems, "n_secondary_features", self.n_secondary_features, min=1)
        check_int(problems, "n_identifiers", self.n_identifiers, min=1)
        check_int(problems, "n_informative", self.n_informative, min=1)
        check_int(problems, "n_redundant", self.n_redundant, min=0)
        check_int(problems, "n_classes", self.n_classes, min=2)
        check_int(problems, "n_clusters_per_class", self.n_clusters_per_class, min=1)
        check_float(problems, "class_sep", self.class_sep, min=0.0, min_exclusive=True)
        check_float(problems, "flip_y", self.flip_y, min=0.0, max=1.0)
        check_float(problems, "sigma_cf", self.sigma_cf, min=0.0)
        check_fraction(problems, "secondary_signal", self.secondary_signal, open_low=False,
                       allow_none=True)
        check_fraction(problems, "overlap", self.overlap, open_low=True)
        check_seed(problems, self.seed)
        check_float(problems, "positive_fraction", self.positive_fraction, min=0.0, max=1.0,
                    min_exclusive=True, allow_none=True)
        if self.positive_fraction == 1.0:
            problems.append("`positive_fraction` must be < 1 (some records negative), got 1.0")
        if self.positive_fraction is not None and self.n_classes != 2:
            problems.append(f"`positive_fraction` applies to a binary task (n_classes = 2), got "
                            f"n_classes = {self.n_classes!r}")
        if self.identifiers_from not in ("informative", "any"):
            problems.append(f"`identifiers_from` must be 'informative' or 'any', got "
                            f"{self.identifiers_from!r}")
        if not problems:
            n_features = (self.n_primary_features + self.n_secondary_features
                          + self.n_identifiers)
            check_classification_sizes(problems, n_features, self.n_informative,
                                       self.n_redundant, self.n_classes,
                                       self.n_clusters_per_class)
        raise_if(problems, "SklearnOptions")


def check_classification_sizes(problems: list[str], n_features: int, n_informative: int,
                               n_redundant: int, n_classes: int,
                               n_clusters_per_class: int) -> None:
    """Size constraints of ``make_classification`` (reported as option problems)."""
    if n_informative + n_redundant > n_features:
        problems.append(f"`n_informative` + `n_redundant` must be ≤ the {n_features} generated "
                        f"features, got {n_informative} + {n_redundant}")
    if n_informative < 31 and n_classes * n_clusters_per_class > 2**n_informative:
        problems.append(f"`n_classes` × `n_clusters_per_class` must be ≤ 2^`n_informative` = "
                        f"{2**n_informative}, got {n_classes} × {n_clusters_per_class}")


@dataclass(frozen=True, eq=False)
class VerticalFeatures:
    """A ``make_classification`` dataset cut into identifiers and two parties' features.

    Rows are entities in a random order; ``*_informative`` flag the signal-carrying columns.
    """

    identifiers: npt.NDArray[np.float64]
    primary: npt.NDArray[np.float64]
    secondary: npt.NDArray[np.float64]
    y: npt.NDArray[np.int64]
    primary_informative: npt.NDArray[np.bool_]
    secondary_informative: npt.NDArray[np.bool_]


def vertical_classification(*, n_samples: int, n_primary_features: int,
                            n_secondary_features: int, n_identifiers: int, n_informative: int,
                            n_redundant: int, n_classes: int, n_clusters_per_class: int,
                            class_sep: float, flip_y: float, secondary_signal: float | None,
                            make_rng: np.random.Generator, identifiers_from: str = "any",
                            split_rng: np.random.Generator,
                            weights: list[float] | None = None) -> VerticalFeatures:
    """Generate the global dataset and divide its columns (FedSim §6.1).

    ``make_rng`` drives the samples, ``split_rng`` the choice of identifier columns and the
    division of the other columns between the parties.
    """
    n_features = n_primary_features + n_secondary_features + n_identifiers
    # shuffle=False keeps the informative columns first and the redundant ones next, so we know
    # where the signal is; rows and columns are then permuted with our own generators.
    x, y = make_classification(
        n_samples=n_samples, n_features=n_features, n_informative=n_informative,
        n_redundant=n_redundant, n_repeated=0, n_classes=n_classes,
        n_clusters_per_class=n_clusters_per_class, class_sep=class_sep, flip_y=flip_y,
        weights=weights, shuffle=False, random_state=int(make_rng.integers(2**31 - 1)))
    rows = make_rng.permutation(n_samples)
    x = np.ascontiguousarray(x[rows], dtype=np.float64)
    y = np.asarray(y[rows], dtype=np.int64)
    signal = np.arange(n_features) < n_informative + n_redundant

    # "we randomly select some features as common features" (FedSim §6.1); the authors'
    # generator selects them among the informative ones.
    order = split_rng.permutation(n_features)
    if identifiers_from == "informative":
        order = np.concatenate([order[order < n_informative], order[order >= n_informative]])
    ident, rest = order[:n_identifiers], split_rng.permutation(order[n_identifiers:])
    if secondary_signal is None:
        # "... and randomly divide the remaining features equally to both parties"
        prim, sec = rest[:n_primary_features], rest[n_primary_features:]
    else:
        sig, noise = rest[signal[rest]], rest[~signal[rest]]
        m = len(sig)
        k = int(round(secondary_signal * m))
        k = min(max(k, m - n_primary_features, 0), n_secondary_features, m)
        n_noise_sec = n_secondary_features - k
        sec = np.concatenate([sig[:k], noise[:n_noise_sec]])
        prim = np.concatenate([sig[k:], noise[n_noise_sec:]])
        # Mix the columns so that position never tells which ones are informative.
        sec, prim = split_rng.permutation(sec), split_rng.permutation(prim)
    return VerticalFeatures(identifiers=x[:, ident], primary=x[:, prim], secondary=x[:, sec],
                            y=y, primary_informative=signal[prim],
                            secondary_informative=signal[sec])


def record_ids(n: int, rng: np.random.Generator) -> npt.NDArray[np.str_]:
    """Distinct string record ids in a random order (so ids never reveal row positions)."""
    width = len(str(n - 1))
    return np.array([f"r{v:0{width}d}" for v in rng.permutation(n)])


def make_sklearn(options: SklearnOptions) -> VFLDataset:
    """Build the "sklearn" dataset (see the module docstring)."""
    o = options
    make_rng, split_rng, entity_rng, noise_rng = seed_streams(o.seed, 4)
    feats = vertical_classification(
        n_samples=o.n_samples, n_primary_features=o.n_primary_features,
        n_secondary_features=o.n_secondary_features, n_identifiers=o.n_identifiers,
        n_informative=o.n_informative, n_redundant=o.n_redundant, n_classes=o.n_classes,
        n_clusters_per_class=o.n_clusters_per_class, class_sep=o.class_sep, flip_y=o.flip_y,
        secondary_signal=o.secondary_signal, make_rng=make_rng, split_rng=split_rng,
        identifiers_from=o.identifiers_from,
        weights=None if o.positive_fraction is None else [1.0 - o.positive_fraction])
    ids = record_ids(o.n_samples, entity_rng)
    prim_rows, sec_rows = split_entities(o.n_samples, o.overlap, entity_rng)

    ident_cols = tuple(f"cf{i}" for i in range(o.n_identifiers))
    p_cols = tuple(f"p{i}" for i in range(o.n_primary_features))
    s_cols = tuple(f"s{i}" for i in range(o.n_secondary_features))
    # v'_i = v_i + N(σ_cf² I) on the secondary's copy (FedSim §6.1). Noise is drawn per entity
    # for all entities, so the same seed gives the same noise whatever `overlap` is.
    noise = noise_rng.normal(0.0, 1.0, size=feats.identifiers.shape) * o.sigma_cf
    sec_ident = feats.identifiers + noise

    primary = pd.DataFrame(np.hstack([feats.identifiers[prim_rows], feats.primary[prim_rows]]),
                           columns=[*ident_cols, *p_cols])
    primary.insert(0, KEY, ids[prim_rows])
    primary[LABEL] = feats.y[prim_rows]
    secondary = pd.DataFrame(np.hstack([sec_ident[sec_rows], feats.secondary[sec_rows]]),
                             columns=[*ident_cols, *s_cols])
    secondary.insert(0, KEY, ids[sec_rows])

    task = Task.BINARY if o.n_classes == 2 else Task.MULTICLASS
    name = "sklearn"
    p_schema = PartySchema(name="primary", role="primary", key=(KEY,), identifiers=ident_cols,
                           numeric=p_cols, label=LABEL, task=task)
    s_schema = PartySchema(name="secondary", role="secondary", key=(KEY,),
                           identifiers=ident_cols, numeric=s_cols)
    informative = {
        "primary": tuple(c for c, f in zip(p_cols, feats.primary_informative) if f),
        "secondary": tuple(c for c, f in zip(s_cols, feats.secondary_informative) if f),
    }
    description = (
        f"Synthetic VFL data as in FedSim §6.1 / App. E Table 4: make_classification with "
        f"{o.n_samples} samples, {o.n_identifiers} common features used as identifiers "
        f"(σ_cf = {o.sigma_cf} Gaussian noise on the secondary's copy), "
        f"{o.n_primary_features} primary and {o.n_secondary_features} secondary features, "
        f"{o.n_classes} classes; exact key column {KEY!r}."
    )
    return VFLDataset(
        name=name,
        primary=table(p_schema, primary, name),
        secondaries=(table(s_schema, secondary, name),),
        description=description,
        true_secondary_index=(truth_index(prim_rows, sec_rows),),
        informative_features=informative,
    )


register_dataset(
    "sklearn", SklearnOptions, make_sklearn,
    "FedSim's synthetic make_classification data: 60,000 rows, 50+50 features, 5 identifiers")
register_dataset(
    "sklearn-small", SklearnOptions, make_sklearn,
    "A small, easier 'sklearn' preset for demos and tests: 6,000 rows, 10+10 features, "
    "3 identifiers",
    n_samples=6_000, n_primary_features=10, n_secondary_features=10, n_identifiers=3,
    n_informative=8, n_redundant=0, n_clusters_per_class=2, class_sep=1.0,
    identifiers_from="any")
