"""The "sklearn" synthetic dataset (FedSim §6.1, App. E Table 4)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.linear_model import LogisticRegression

from vflink.datasets import DATASETS, SklearnOptions, VFLDataset, load_dataset, make_sklearn
from vflink.errors import ConfigError
from vflink.types import Task


def small(**options: object) -> VFLDataset:
    return load_dataset("sklearn-small", **options)


def matched(ds: VFLDataset) -> tuple[np.ndarray, np.ndarray]:
    """Positions (primary rows, secondary rows) of the true matches."""
    truth = ds.true_secondary_index[0]  # type: ignore[index]
    rows = np.flatnonzero(truth >= 0)
    return rows, truth[rows]


def test_defaults_are_fedsim_table_4() -> None:
    defaults = DATASETS.get("sklearn").default_options()
    assert defaults["n_samples"] == 60_000
    assert defaults["n_primary_features"] == 50 and defaults["n_secondary_features"] == 50
    assert defaults["n_identifiers"] == 5 and defaults["n_classes"] == 2
    assert defaults["sigma_cf"] == 0.0 and defaults["secondary_signal"] is None


def test_full_size_shapes() -> None:
    ds = load_dataset("sklearn")
    assert len(ds.primary) == len(ds.secondary) == 60_000
    p, s = ds.primary.schema, ds.secondary.schema
    assert len(p.numeric) == len(s.numeric) == 50 and len(p.identifiers) == 5
    assert ds.primary.frame.shape == (60_000, 1 + 5 + 50 + 1)
    assert ds.secondary.frame.shape == (60_000, 1 + 5 + 50)


def test_small_preset_schema_and_columns() -> None:
    ds = small()
    p, s = ds.primary.schema, ds.secondary.schema
    assert (p.role, s.role) == ("primary", "secondary")
    assert p.key == s.key == ("id",)
    assert p.identifiers == s.identifiers == ("cf0", "cf1", "cf2")
    assert p.numeric == tuple(f"p{i}" for i in range(10))
    assert s.numeric == tuple(f"s{i}" for i in range(10))
    assert p.label == "y" and p.task is Task.BINARY and s.label is None
    assert list(ds.primary.frame.columns) == ["id", "cf0", "cf1", "cf2", *p.numeric, "y"]
    assert list(ds.secondary.frame.columns) == ["id", "cf0", "cf1", "cf2", *s.numeric]
    assert set(ds.primary.frame["y"].unique()) == {0, 1}
    assert ds.options["n_samples"] == 6_000 and ds.name == "sklearn-small"
    # identifiers are linkage columns, never training features (FedSim §6.1)
    assert not set(p.identifiers) & set(p.features)


def test_deterministic_by_seed() -> None:
    a, b, c = small(seed=7), small(seed=7), small(seed=8)
    pd.testing.assert_frame_equal(a.primary.frame, b.primary.frame)
    pd.testing.assert_frame_equal(a.secondary.frame, b.secondary.frame)
    np.testing.assert_array_equal(a.true_secondary_index[0], b.true_secondary_index[0])
    assert not a.primary.frame["p0"].equals(c.primary.frame["p0"])


def test_make_sklearn_accepts_options_object() -> None:
    ds = make_sklearn(SklearnOptions(n_samples=50, n_primary_features=2, n_secondary_features=2,
                                     n_identifiers=1, n_informative=2, n_redundant=0,
                                     n_clusters_per_class=1, seed=1))
    assert len(ds.primary) == 50 and ds.primary.schema.numeric == ("p0", "p1")


def test_no_noise_keeps_identifiers_and_keys_equal_for_true_matches() -> None:
    ds = small(sigma_cf=0.0)
    rows, sec_rows = matched(ds)
    assert len(rows) == len(ds.primary)  # overlap 1: every record at both parties
    cols = list(ds.primary.schema.identifiers)
    np.testing.assert_array_equal(ds.primary.frame[cols].to_numpy()[rows],
                                  ds.secondary.frame[cols].to_numpy()[sec_rows])
    np.testing.assert_array_equal(ds.primary.frame["id"].to_numpy()[rows],
                                  ds.secondary.frame["id"].to_numpy()[sec_rows])


@pytest.mark.parametrize("sigma", [0.05, 0.5])
def test_noise_has_the_requested_scale(sigma: float) -> None:
    clean, noisy = small(sigma_cf=0.0, seed=3), small(sigma_cf=sigma, seed=3)
    # Noise touches only the secondary's identifiers: everything else is the same draw.
    pd.testing.assert_frame_equal(clean.primary.frame, noisy.primary.frame)
    s_cols = list(noisy.secondary.schema.numeric)
    pd.testing.assert_frame_equal(clean.secondary.frame[s_cols], noisy.secondary.frame[s_cols])
    rows, sec_rows = matched(noisy)
    cols = list(noisy.primary.schema.identifiers)
    diff = (noisy.secondary.frame[cols].to_numpy()[sec_rows]
            - noisy.primary.frame[cols].to_numpy()[rows]).ravel()
    n = diff.size  # 18,000 draws of N(0, σ²)
    assert abs(diff.mean()) < 5 * sigma / np.sqrt(n)
    assert diff.std() == pytest.approx(sigma, rel=0.05)


def test_secondary_rows_are_shuffled_but_truth_recovers_matches() -> None:
    ds = small()
    truth = ds.true_secondary_index[0]
    assert sorted(truth.tolist()) == list(range(len(ds.secondary)))  # a permutation
    assert (truth == np.arange(len(truth))).mean() < 0.01  # order reveals nothing
    # the key column is not in primary order either
    assert not (ds.secondary.frame["id"].to_numpy() == ds.primary.frame["id"].to_numpy()).all()
    alignment = ds.true_alignment()
    assert alignment.k == 1 and len(alignment) == len(ds.primary)
    np.testing.assert_array_equal(alignment.secondary_index[:, 0], truth)


def _party_accuracy(ds: VFLDataset, table: str) -> float:
    """Accuracy of a linear model on one party's features alone (true alignment)."""
    rows, sec_rows = matched(ds)
    y = ds.primary.frame["y"].to_numpy()[rows]
    if table == "primary":
        x = ds.primary.frame[list(ds.primary.schema.numeric)].to_numpy()[rows]
    else:
        x = ds.secondary.frame[list(ds.secondary.schema.numeric)].to_numpy()[sec_rows]
    half = len(y) // 2
    model = LogisticRegression(max_iter=500).fit(x[:half], y[:half])
    return float(model.score(x[half:], y[half:]))


def test_secondary_signal_moves_informative_features() -> None:
    opts = dict(n_samples=3000, class_sep=1.5, n_clusters_per_class=1, seed=5)
    to_secondary = small(secondary_signal=1.0, **opts)
    to_primary = small(secondary_signal=0.0, **opts)
    # 8 informative features, at most 3 of them become identifiers; the rest fit either side.
    assert to_secondary.informative_features["primary"] == ()
    assert len(to_secondary.informative_features["secondary"]) >= 5
    assert to_primary.informative_features["secondary"] == ()
    assert (len(to_primary.informative_features["primary"])
            == len(to_secondary.informative_features["secondary"]))
    assert _party_accuracy(to_secondary, "secondary") > 0.8
    assert _party_accuracy(to_secondary, "primary") < 0.6
    assert _party_accuracy(to_primary, "primary") > 0.8
    assert _party_accuracy(to_primary, "secondary") < 0.6


def test_secondary_signal_respects_capacity() -> None:
    # 8 informative features but only 2 secondary slots: 2 go there, the rest stay primary.
    ds = small(n_secondary_features=2, n_identifiers=1, secondary_signal=1.0, seed=2)
    assert len(ds.informative_features["secondary"]) == 2
    informative = [*ds.informative_features["primary"], *ds.informative_features["secondary"]]
    assert len(informative) in (7, 8)  # one may have been drawn as the identifier


def test_partial_overlap() -> None:
    ds = small(overlap=0.5)
    truth = ds.true_secondary_index[0]
    assert len(ds.primary) == len(ds.secondary) == 4_500
    assert (truth >= 0).sum() == 3_000
    unmatched = ds.primary.frame["id"].to_numpy()[truth < 0]
    assert not set(unmatched) & set(ds.secondary.frame["id"])


def test_multiclass() -> None:
    ds = small(n_classes=3, n_samples=600)
    assert ds.primary.schema.task is Task.MULTICLASS
    assert set(ds.primary.frame["y"].unique()) == {0, 1, 2}


@settings(max_examples=15)
@given(n=st.integers(10, 200), n_p=st.integers(1, 6), n_s=st.integers(1, 6),
       n_id=st.integers(1, 4), overlap=st.floats(0.05, 1.0), seed=st.integers(0, 2**16),
       signal=st.one_of(st.none(), st.floats(0.0, 1.0)))
def test_shapes_and_truth_hold_for_any_sizes(n: int, n_p: int, n_s: int, n_id: int,
                                             overlap: float, seed: int,
                                             signal: float | None) -> None:
    ds = small(n_samples=n, n_primary_features=n_p, n_secondary_features=n_s,
               n_identifiers=n_id, n_informative=min(3, n_p + n_s + n_id), overlap=overlap,
               seed=seed, secondary_signal=signal, n_clusters_per_class=1)
    assert len(ds.primary.schema.numeric) == n_p and len(ds.secondary.schema.numeric) == n_s
    assert len(ds.primary.schema.identifiers) == n_id
    truth = ds.true_secondary_index[0]
    rows = np.flatnonzero(truth >= 0)
    assert len(np.unique(truth[rows])) == len(rows)
    np.testing.assert_array_equal(ds.primary.frame["id"].to_numpy()[rows],
                                  ds.secondary.frame["id"].to_numpy()[truth[rows]])
    assert len(ds.primary) + len(ds.secondary) - len(rows) == n


def test_bad_option_message() -> None:
    with pytest.raises(ConfigError, match="`n_samples` must be an int ≥ 10, got 0"):
        small(n_samples=0)


def test_every_bad_option_is_reported_at_once() -> None:
    with pytest.raises(ConfigError) as info:
        small(sigma_cf=-1.0, secondary_signal=1.5, overlap=0.0, seed=-3, class_sep=0)
    text = "\n".join(info.value.problems)
    for name in ("sigma_cf", "secondary_signal", "overlap", "seed", "class_sep"):
        assert f"`{name}`" in text, name
    assert "dataset 'sklearn-small'" in str(info.value)


def test_inconsistent_sizes_are_rejected() -> None:
    with pytest.raises(ConfigError, match="n_informative"):
        small(n_informative=30)
    with pytest.raises(ConfigError, match="n_clusters_per_class"):
        small(n_informative=1, n_classes=3)
    with pytest.raises(ConfigError, match="must be an int"):
        small(n_samples=True)


def test_options_object_validates_directly() -> None:
    with pytest.raises(ConfigError, match="invalid SklearnOptions"):
        SklearnOptions(n_identifiers=0)
