"""alignment.pool = "split": each split is linked against its own records only (the FedSim
authors' protocol)."""

from __future__ import annotations

import numpy as np
import pytest

from vflink.errors import ConfigError
from vflink.protocol.sessions import purpose_of
from vflink.runfiles.config import AlignmentConfig, DataConfig, RunConfig
from vflink.runner.pools import run_splits
from vflink.runner.prepare import prepare

N, K = 400, 3


def _config(pool: str, dataset: str = "sklearn-reference") -> RunConfig:
    return RunConfig(
        algorithm="fedsim",
        data=DataConfig(dataset=dataset, options={"n_samples": N, "sigma_cf": 0.3}),
        alignment=AlignmentConfig(method="soft", metric="euclidean", top_k=K, privacy="off",
                                  sigma=0.0, pool=pool))


def _identifiers(frame):  # type: ignore[no-untyped-def]
    return frame[[f"cf{i}" for i in range(5)]].to_numpy()


def test_split_pool_matches_a_brute_force_top_k_within_each_split() -> None:
    prepared = prepare(_config("split"))
    inputs = prepared.inputs
    splits = run_splits(_config("split"), inputs, np.arange(N))
    assert inputs.splits is not None and all(
        np.array_equal(a, b) for a, b in zip(splits, inputs.splits, strict=True))
    links = prepared.alignments["topk"]["secondary"].for_primary_rows(N)
    p_ids, s_ids = _identifiers(inputs.primary.frame), _identifiers(inputs.secondaries[0].frame)
    for part in splits:
        pool = part  # rows in the same order: the true matches of a split are the same rows
        dist = np.linalg.norm(p_ids[part][:, None, :] - s_ids[pool][None, :, :], axis=2)
        oracle = pool[np.argsort(dist, axis=1, kind="stable")[:, :K]]
        np.testing.assert_array_equal(links[part], oracle)
    # the secondary may be asked only for rows that were linked
    top1 = prepared.alignments["top1"]["secondary"].for_primary_rows(N)
    np.testing.assert_array_equal(top1[:, 0], links[:, 0])


def test_all_pool_links_across_splits() -> None:
    prepared = prepare(_config("all"))
    links = prepared.alignments["topk"]["secondary"].for_primary_rows(N)
    splits = run_splits(_config("all"), prepared.inputs, np.arange(N))
    owner = np.empty(N, dtype=int)
    for i, part in enumerate(splits):
        owner[part] = i
    assert (owner[links] != owner[:, None]).any()


def test_split_pool_similarities_use_the_training_scale() -> None:
    prepared = prepare(_config("split"))
    al = prepared.alignments["topk"]["secondary"]
    assert al.similarity is not None and al.meta["pool_split"] == 1.0
    train = prepared.inputs.splits[0]  # type: ignore[index]
    sims = al.similarity[np.argsort(al.primary_index)][train]
    # Eq. 1 fitted on the training linkage: mean 0 and std 1 there
    assert sims.mean() == pytest.approx(0.0, abs=1e-5)
    assert sims.std() == pytest.approx(1.0, abs=1e-4)


def test_split_pool_needs_ground_truth_and_soft_linkage() -> None:
    with pytest.raises(ConfigError, match="pool"):
        AlignmentConfig(method="exact", pool="split")
    with pytest.raises(ConfigError, match="pool"):
        AlignmentConfig(method="soft", pool="nearby")


def test_split_pool_exact_links_identical_identifiers_within_the_split() -> None:
    config = RunConfig(
        algorithm="exact",
        data=DataConfig(dataset="sklearn-reference", options={"n_samples": N, "sigma_cf": 0.0}),
        alignment=AlignmentConfig(method="soft", top_k=K, privacy="off", sigma=0.0,
                                  pool="split"))
    prepared = prepare(config, algorithms=["exact", "fedsim"])
    assert purpose_of(prepared.sessions["exact"]) == "exact"  # named per run (never reused)
    exact = prepared.alignments["exact"]["secondary"].for_primary_rows(N)
    np.testing.assert_array_equal(exact[:, 0], np.arange(N))  # σ_cf = 0: each its own copy


def test_split_pool_top1_with_exact_identifiers_carries_the_flat_training_scale() -> None:
    # σ_cf = 0: every training top-1 distance is 0, so Eq. 1's fitted σ0 is 0. The other
    # splits reuse that scale (ρ = 0, no information) instead of the coordinator refusing it.
    config = RunConfig(
        algorithm="top1sim",
        data=DataConfig(dataset="sklearn-reference", options={"n_samples": N, "sigma_cf": 0.0}),
        alignment=AlignmentConfig(method="soft", metric="euclidean", top_k=K, privacy="off",
                                  sigma=0.0, pool="split"))
    prepared = prepare(config, algorithms=["top1sim"])
    al = prepared.alignments["top1"]["secondary"]
    n = len(prepared.inputs.primary)
    np.testing.assert_array_equal(al.for_primary_rows(n)[:, 0], np.arange(n))
    assert al.similarity is not None
    np.testing.assert_array_equal(al.similarity, 0.0)
