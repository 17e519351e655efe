"""``sklearn-reference``: the FedSim authors' synthetic data, built exactly as their code does.

The FedSim authors generate their "sklearn" task (§6.1, App. E Table 4) with a generator class
in their public repository (``src/preprocess/sklearn/syn_data_generator.py``, class
``TwoPartyClsMany2ManyGenerator``) and split it in ``BaseModel.split_data``. This preset repeats
those steps with the same library calls, so the arrays are bit-for-bit the authors' (the pinned
checksum in ``tests/unit/datasets/test_sklearn_reference.py`` guards it):

1. ``make_classification(n_samples=60000, n_features=95, n_informative=20, n_redundant=0,
   n_clusters_per_class=3, class_sep=0.3, n_classes=2, shift=None, random_state=512)`` with its
   default ``shuffle=True`` (rows and columns shuffled by scikit-learn), default ``flip_y=0.01``.
2. The first ``n_informative + n_redundant`` = 20 columns are the "useful" ones; the
   identifiers (the authors' "common features") are the first 5 of them.
3. The trained columns are the 75 others ("noise") followed by the 15 remaining useful ones;
   ``RandomState(513).shuffle`` permutes these 90 columns in place, and the first 45 go to the
   primary, the last 45 to the secondary.
4. The secondary's copy of the identifiers gets ``RandomState(514).normal(scale=σ_cf)`` noise
   (plus the generator's bias, 0.0).
5. Rows stay in the same order at both parties (record i is entity i), and the primary's rows
   are split with ``train_test_split(arange(n), test_size=0.2, random_state=0)`` and then
   ``train_test_split(train_val, test_size=0.1 / 0.8, random_state=0)``: 42,000 / 6,000 /
   12,000 for train / validation / test.

What is certain and what is inferred:

* Certain (read in the authors' code): every call and constant above; the 45 + 45 split of the
  shuffled columns; the noise on the secondary's identifiers only; the split calls.
* Inferred: the seed 512 and ``n_redundant = 0``, ``class_sep = 0.3`` come from the commented-out
  generator call in their ``train_syn_all.py``, which pickled the generator the experiments then
  load (``syn_cls_many2many_generator_noise_{σ}.pkl``); the pickles themselves are not public,
  so we cannot compare against them. ``num_features_per_party = [50, 50]`` with 5 common
  features gives the 95 generated columns. Their scripts never call ``scale``, so the features
  reach their models unscaled; vflink standardises each party's features on its training rows,
  which changes no information.

The authors' *training* settings for this data (raw features: ``model.standardize = false``;
FedSim's average merge gate; per-algorithm batch sizes and learning rates) are in
``examples/experiments/fedsim-reference.toml``; with the default z-scored features every
algorithm lands 2 to 3 points lower (docs/reproductions/fedsim.md).

Column names: the primary holds ``cf0..cf4`` (identifiers) and ``p0..p44``, the secondary
``cf0..cf4`` (noised) and ``s0..s44``, both with an exact key ``id`` (not used by soft linkage).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from sklearn.datasets import make_classification
from sklearn.model_selection import train_test_split

from vflink._checks import check_float, check_int, raise_if
from vflink.data.schema import PartySchema
from vflink.datasets._base import VFLDataset, register_dataset, table
from vflink.types import Task

__all__ = ["SklearnReferenceOptions", "make_sklearn_reference"]

KEY = "id"
LABEL = "y"
#: The authors' generator constants (``TwoPartyClsMany2ManyGenerator`` as called for FedSim).
N_FEATURES_PER_PARTY = 50
N_COMMON = 5
N_INFORMATIVE = 20
N_REDUNDANT = 0
N_CLUSTERS_PER_CLASS = 3
CLASS_SEP = 0.3
AUTHORS_SEED = 512


@dataclass(frozen=True, kw_only=True)
class SklearnReferenceOptions:
    """Options of ``sklearn-reference``; the defaults are the authors'.

    Attributes:
        sigma_cf: σ_cf, scale of the Gaussian noise on the secondary's identifiers.
        n_samples: records (60,000 in the paper; smaller values are for tests only).
        generator_seed: the authors' ``seed`` (512): ``make_classification`` uses it, the column
            shuffle ``seed + 1`` and the identifier noise ``seed + 2``. It is deliberately not
            the run's seed: the data are fixed, only training varies with the run seed.
        seed: the run's seed, which every run passes to its dataset; accepted and ignored
            here (see ``generator_seed``).
    """

    sigma_cf: float = 0.0
    n_samples: int = 60_000
    generator_seed: int = AUTHORS_SEED
    seed: int = 0

    def __post_init__(self) -> None:
        problems: list[str] = []
        check_float(problems, "sigma_cf", self.sigma_cf, min=0.0)
        check_int(problems, "n_samples", self.n_samples, min=10)
        check_int(problems, "generator_seed", self.generator_seed, min=0, max=2**32 - 3)
        raise_if(problems, "SklearnReferenceOptions")


def reference_arrays(options: SklearnReferenceOptions
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(x1, x2, y, noised_identifiers)`` exactly as the authors' ``get_parties`` returns them.

    ``x1`` is ``[45 primary features, 5 identifiers]``, ``x2`` is
    ``[5 noised identifiers, 45 secondary features]`` (the authors' column layout).
    """
    o = options
    seeds = (o.generator_seed, o.generator_seed + 1, o.generator_seed + 2)
    n_total = 2 * N_FEATURES_PER_PARTY - N_COMMON  # 95
    x, y = make_classification(n_samples=o.n_samples, n_features=n_total,
                               n_informative=N_INFORMATIVE, n_redundant=N_REDUNDANT,
                               n_clusters_per_class=N_CLUSTERS_PER_CLASS, class_sep=CLASS_SEP,
                               n_classes=2, shift=None, random_state=seeds[0])
    useful = x[:, :N_INFORMATIVE + N_REDUNDANT]
    noise = x[:, N_INFORMATIVE + N_REDUNDANT:]
    trained = np.concatenate([noise, useful[:, N_COMMON:]], axis=1)
    # The authors shuffle the columns in place through the transposed view; the same call on
    # the same layout gives the same permutation.
    np.random.RandomState(seeds[1]).shuffle(trained.T)
    half = trained.shape[1] // 2
    common = useful[:, :N_COMMON]
    noised = common.copy() + 0.0 + np.random.RandomState(seeds[2]).normal(
        scale=o.sigma_cf, size=common.shape)
    x1 = np.concatenate([trained[:, :half], common], axis=1)
    x2 = np.concatenate([noised, trained[:, half:]], axis=1)
    return x1, x2, np.asarray(y, dtype=np.int64), noised


def reference_splits(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The authors' ``split_data(val_rate=0.1, test_rate=0.2, seed=0)`` as sorted row arrays."""
    idx = np.arange(n)
    train_val, test = train_test_split(idx, test_size=0.2, random_state=0)
    train, val = train_test_split(train_val, test_size=0.1 / (1.0 - 0.2), random_state=0)
    return tuple(np.sort(p).astype(np.int64) for p in (train, val, test))  # type: ignore[return-value]


def make_sklearn_reference(options: SklearnReferenceOptions) -> VFLDataset:
    """Build ``sklearn-reference`` (see the module docstring)."""
    x1, x2, y, _ = reference_arrays(options)
    n = options.n_samples
    n_feat = N_FEATURES_PER_PARTY - N_COMMON
    ident = tuple(f"cf{i}" for i in range(N_COMMON))
    p_cols = tuple(f"p{i}" for i in range(n_feat))
    s_cols = tuple(f"s{i}" for i in range(n_feat))
    ids = np.array([f"r{i:05d}" for i in range(n)])
    primary = pd.DataFrame(np.hstack([x1[:, n_feat:], x1[:, :n_feat]]),
                           columns=[*ident, *p_cols])
    primary.insert(0, KEY, ids)
    primary[LABEL] = y
    secondary = pd.DataFrame(x2, columns=[*ident, *s_cols])
    secondary.insert(0, KEY, ids)
    name = "sklearn-reference"
    p_schema = PartySchema(name="primary", role="primary", key=(KEY,), identifiers=ident,
                           numeric=p_cols, label=LABEL, task=Task.BINARY)
    s_schema = PartySchema(name="secondary", role="secondary", key=(KEY,), identifiers=ident,
                           numeric=s_cols)
    description = (
        f"The FedSim authors' synthetic task, bit for bit: make_classification(random_state="
        f"{options.generator_seed}), {n} rows, 45 + 45 features, 5 identifiers with σ_cf = "
        f"{options.sigma_cf} noise at the secondary, rows in the same order, the authors' "
        f"train/validation/test split (train_test_split, random_state=0).")
    return VFLDataset(
        name=name, primary=table(p_schema, primary, name),
        secondaries=(table(s_schema, secondary, name),), description=description,
        true_secondary_index=(np.arange(n, dtype=np.int64),),
        splits=reference_splits(n))


register_dataset(
    "sklearn-reference", SklearnReferenceOptions, make_sklearn_reference,
    "The FedSim authors' own sklearn data (seed 512, class_sep 0.3), bit for bit, with their "
    "fixed 70/10/20 split")
