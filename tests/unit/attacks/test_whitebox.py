"""White-box label attacks on planted batches: the primary's own LabelProtection draws the
noise (seeded or from the secure source) on gradient rows g_i = (p_i − y_i)·J_i; the attacks
see only the rows, the order of the batch and the seeds a secondary would have received."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vflink.attacks import AttackView, get_attack
from vflink.attacks.whitebox import (
    Batch,
    Candidate,
    batches_of,
    brute_force_candidates,
    derived_label_seed,
    epoch_average_scores,
    find_seed,
    received_candidates,
    residual_scores,
    stream_seed,
    subtract_noise,
)
from vflink.errors import ConfigError, DataError
from vflink.metrics.functional import auc
from vflink.privacy.label_protection import LabelProtection
from vflink.types import Task

N, BATCH, WIDTH, EPOCHS = 600, 100, 8, 3


def planted_run(mode: str, *, seed: int | None, positive: float = 0.1,
                rng_seed: int = 0) -> tuple[AttackView, dict[str, np.ndarray], np.ndarray]:
    """EPOCHS epochs of N records in batches of BATCH, the rows a secondary receives under
    ``mode`` from LabelProtection itself, in the primary's order (shuffled per epoch); the
    secondary records each batch's unique rows sorted, with the requests' positions."""
    rng = np.random.default_rng(rng_seed)
    y = (rng.random(N) < positive).astype(np.int64)
    jac = rng.normal(size=WIDTH)
    own = 0.15 * rng.normal(size=(N, WIDTH))  # each record's Jacobian: a shared part and its own
    settings = {"mode": mode, "epsilon": 4.0, "delta": 1e-5, "seed": seed}  # None: secret
    protection = LabelProtection(settings, task=Task.BINARY, party="primary", n_rows=N,
                                 classes=2)
    protection.plan(np.arange(N), EPOCHS)
    grads, ids, batch, req_pos, req_ids, req_batch = [], [], [], [], [], []
    key = 0
    for _ in range(EPOCHS):
        for rows in np.array_split(rng.permutation(N), N // BATCH):
            p = 1 / (1 + np.exp(-rng.normal(-2.0, 0.5, size=len(rows))))
            z = torch.from_numpy(np.log(p / (1 - p)))[:, None]
            target = torch.from_numpy(y[rows].astype(np.float64))
            j = jac[None, :] + own[rows]
            if mode == "dp":
                g = protection.noisy_logit_gradient(z, target, rows).numpy()[:, 0]
                sent = g[:, None] * j / len(rows)
            else:
                clean = torch.from_numpy((p - y[rows])[:, None] * j / len(rows))
                sent = protection.perturb(clean, target).numpy()
            order = np.argsort(rows)  # the secondary's unique rows, sorted
            grads.append(sent[order])
            ids.append(rows[order])
            batch.append(np.full(len(rows), key))
            req_ids.append(rows)
            req_pos.append(np.searchsorted(rows[order], rows))
            req_batch.append(np.full(len(rows), key))
            key += 1
    extra = {"batch": np.concatenate(batch),
             "requests": {"positions": np.concatenate(req_pos), "ids": np.concatenate(req_ids),
                          "batch": np.concatenate(req_batch)}}
    view = AttackView(party="bank", role="secondary", ids=np.concatenate(ids),
                      gradients=np.concatenate(grads), extra=extra)
    return view, {"labels__rows": np.arange(N), "labels__values": y}, y


def _batches(view: AttackView) -> list[Batch]:
    return batches_of(view.gradients, view.ids, view.extra["batch"], view.extra["requests"])


@pytest.mark.parametrize("mode", ["dp", "marvell", "max-norm"])
def test_a_small_labels_seed_is_found_by_brute_force_and_the_labels_read(mode: str) -> None:
    view, truth, _ = planted_run(mode, seed=37)
    found = find_seed(_batches(view), brute_force_candidates(60), positions=1)
    assert found is not None and found.candidate.seed == 37
    result = get_attack("label-noise-subtraction", brute_force=60).evaluate(view, truth)
    assert result.details["found"]["seed"] == "37"
    assert result.metrics["auc"] >= (0.95 if mode != "max-norm" else 0.85)
    assert "regenerated the noise" in result.explanation


def test_the_seed_derived_from_a_received_one_is_found_without_brute_force() -> None:
    """SetupBottom carries the run seed + 1 (first secondary): the runner's derivation of the
    label seed from the run seed is the attacker's too."""
    run_seed = 123_456
    view, truth, _ = planted_run("dp", seed=derived_label_seed(run_seed))
    received = [{"peer": "primary", "message": "setup_bottom", "seed": run_seed + 1}]
    view = AttackView(**{**view.__dict__, "extra": {**view.extra, "received_seeds": received}})
    result = get_attack("label-noise-subtraction", brute_force=0).evaluate(view, truth)
    assert "run seed 123456" in result.details["found"]["how"]
    assert result.metrics["auc"] >= 0.95 and result.metrics["auc_per_batch"] >= 0.9


def test_secret_noise_reads_nothing() -> None:
    for mode in ("dp", "marvell"):
        view, truth, _ = planted_run(mode, seed=None)
        result = get_attack("label-noise-subtraction", brute_force=200).evaluate(view, truth)
        assert result.details["found"] is None
        assert result.metrics["auc"] == 0.5 and "reads nothing" in result.explanation


def test_candidates_cover_the_received_seeds_their_runs_and_streams() -> None:
    seeds = {c.seed for c in received_candidates(
        [{"seed": 11, "message": "setup_bottom", "peer": "p"}], positions=3, streams=2)}
    for run in (11, 10, 9, 8):  # the seed itself, then run seed = seed − 1 − j
        assert derived_label_seed(run) in seeds and run in seeds
        assert stream_seed(derived_label_seed(run), 1) in seeds
    assert stream_seed(5, 0) == 5 and stream_seed(5, 1) != 5
    assert received_candidates([{"seed": True}, {"seed": "7"}]) == []
    assert [c.seed for c in brute_force_candidates(2)][::2] == [0, 1]


def test_epoch_averaging_beats_one_batch_against_fresh_noise() -> None:
    """max-norm's fresh noise per batch: one batch's projection reads little, the average of a
    record's rows over the epochs more."""
    view, _, y = planted_run("max-norm", seed=5, positive=0.2)
    batches = _batches(view)
    ids, scores, n = epoch_average_scores(batches)
    assert (n == EPOCHS).all() and np.array_equal(ids, np.arange(N))
    pooled = max(auc(y[ids], scores), 1 - auc(y[ids], scores))
    first = batches[0]
    centred = first.rows - first.rows.mean(0)
    one = centred @ np.linalg.svd(centred, full_matrices=False)[2][0]
    single = max(auc(y[first.ids], one), 1 - auc(y[first.ids], one))
    assert pooled > single and pooled > 0.85


def test_the_residual_detector_reads_noise_across_the_class_mean_direction() -> None:
    """What Marvell's model misses: across the class-mean direction one class spreads along
    one direction of its own (real gradient rows), the other gets isotropic noise of the same
    total variance (Marvell's perpendicular noise, to one class only). The per-coordinate
    variances match, as the two-Gaussian model asks; the norms' distributions do not."""
    rng = np.random.default_rng(3)
    batches, y_all = [], []
    for key in range(10):
        y = (rng.random(80) < 0.3).astype(np.int64)
        rows = np.zeros((80, 6))
        rows[:, 0] = np.where(y == 1, -1.0, 0.3) + 4.0 * rng.normal(size=80)  # along: noise
        spread = 1.0
        rows[:, 1] += np.where(y == 1, spread * rng.normal(size=80), 0.0)  # one direction
        iso = rng.normal(size=(80, 5)) * spread / np.sqrt(5)  # the same total variance
        rows[:, 1:] += np.where(y == 0, 1.0, 0.0)[:, None] * iso
        batches.append(Batch(key, rows, np.arange(80) + 80 * key, np.arange(80)))
        y_all.append(y)
    scores = np.concatenate(residual_scores(batches))
    value = auc(np.concatenate(y_all), scores)
    assert max(value, 1 - value) > 0.6  # chance: 0.5 ± 0.02 on these 800 rows


def test_recordings_checked_and_multiclass_refused() -> None:
    view, truth, _ = planted_run("dp", seed=1)
    bad = {**view.extra["requests"], "positions": view.extra["requests"]["positions"] + 1000}
    with pytest.raises(DataError, match="point outside"):
        batches_of(view.gradients, view.ids, view.extra["batch"], bad)
    # without requests (an older recording) every row counts as asked once, in id order
    plain = batches_of(view.gradients, view.ids, view.extra["batch"], None)
    assert plain[0].slots == BATCH and (plain[0].positions == np.arange(BATCH)).all()
    three = {"labels__rows": truth["labels__rows"], "labels__values": np.arange(N) % 3}
    with pytest.raises(ConfigError, match="binary labels"):
        get_attack("label-epoch-average").evaluate(view, three)
    with pytest.raises(ConfigError, match="brute_force"):
        get_attack("label-noise-subtraction", brute_force=-1)
    with pytest.raises(ConfigError, match="mode"):
        get_attack("label-noise-subtraction", mode="laplace")
    with pytest.raises(ConfigError, match="average_epochs"):
        get_attack("label-residual", average_epochs="yes")


def test_subtraction_with_a_wrong_seed_explains_nothing() -> None:
    view, _, _ = planted_run("dp", seed=99)
    assert find_seed(_batches(view), [Candidate(98, "a neighbour")]) is None
    found = find_seed(_batches(view), [Candidate(99, "right")])
    assert found is not None and found.mechanism == "dp"
    assert len(subtract_noise(_batches(view), found)) == EPOCHS * (N // BATCH)
