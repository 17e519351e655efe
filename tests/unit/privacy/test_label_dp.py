"""Label DP at the logits: the gradient formulas, the noise against the accountant, the budget."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from dp_accounting import GaussianDpEvent
from dp_accounting.pld import PLDAccountant
from hypothesis import given, settings
from hypothesis import strategies as st

from vflink.alignment.synthetic import Calibration, shift_for_training
from vflink.data.labels import LabelCodec
from vflink.errors import ConfigError, PrivacyBudgetExceeded
from vflink.privacy import label_dp
from vflink.privacy.accounting import calibrate_total, composed_epsilon
from vflink.privacy.budget import ReleaseBudget
from vflink.privacy.config import PrivacyConfig
from vflink.privacy.label_protection import LabelProtection, check_label_task
from vflink.types import Task


def _codec(task: Task, classes: int = 3) -> LabelCodec:
    codec = LabelCodec(task)
    codec.classes = list(range(classes if task is Task.MULTICLASS else 2))
    return codec


@given(st.integers(min_value=1, max_value=20), st.integers(min_value=0, max_value=10_000),
       st.sampled_from([Task.BINARY, Task.MULTICLASS, Task.REGRESSION]))
@settings(max_examples=40, deadline=None)
def test_logit_gradient_is_the_codecs_loss_gradient_per_record(n: int, seed: int,
                                                               task: Task) -> None:
    """Oracle: autograd of LabelCodec.loss (a batch mean), times B."""
    g = torch.Generator().manual_seed(seed)
    width = 4 if task is Task.MULTICLASS else 1
    z = torch.randn(n, width, generator=g, dtype=torch.float64) * 2
    if task is Task.BINARY:
        y = torch.randint(0, 2, (n,), generator=g).double()
    elif task is Task.MULTICLASS:
        y = torch.randint(0, 4, (n,), generator=g)
    else:
        y = torch.randn(n, generator=g, dtype=torch.float64) * 0.2  # |2(z − y)| may pass C
    codec = _codec(task, 4)
    zz = z.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(codec.loss(zz, y) * n, zz)
    ours = label_dp.logit_gradient(task, z, y, clip=1e9)
    torch.testing.assert_close(ours, grad)
    if task is Task.REGRESSION:  # clipped to [−C, C]
        clipped = label_dp.logit_gradient(task, z, y, clip=0.5)
        torch.testing.assert_close(clipped, grad.clamp(-0.5, 0.5))


def test_sensitivity_is_the_largest_change_of_one_label() -> None:
    z = torch.randn(50, 1, dtype=torch.float64)
    ones, zeros = torch.ones(50), torch.zeros(50)
    diff = (label_dp.logit_gradient(Task.BINARY, z, ones)
            - label_dp.logit_gradient(Task.BINARY, z, zeros)).abs()
    assert torch.allclose(diff, torch.ones_like(diff))
    assert label_dp.sensitivity(Task.BINARY) == 1.0
    zc = torch.randn(10, 5, dtype=torch.float64)
    for a in range(5):
        for b in range(5):
            d = (label_dp.logit_gradient(Task.MULTICLASS, zc, torch.full((10,), a))
                 - label_dp.logit_gradient(Task.MULTICLASS, zc, torch.full((10,), b)))
            norms = torch.linalg.vector_norm(d, dim=1)
            expected = 0.0 if a == b else math.sqrt(2.0)
            assert torch.allclose(norms, torch.full_like(norms, expected))
    assert label_dp.sensitivity(Task.MULTICLASS) == pytest.approx(math.sqrt(2))
    zr = torch.randn(100, 1, dtype=torch.float64) * 5
    lo = label_dp.logit_gradient(Task.REGRESSION, zr, torch.full((100,), -50.0), clip=0.7)
    hi = label_dp.logit_gradient(Task.REGRESSION, zr, torch.full((100,), 50.0), clip=0.7)
    assert float((lo - hi).abs().max()) <= label_dp.sensitivity(Task.REGRESSION, 0.7) + 1e-12


def test_binary_sensitivity_of_a_shifted_loss_matches_its_formula() -> None:
    """FLORIST's -tr loss: BCE on D' = a·σ(z) + b; |g(1) − g(0)| = a·σ(1−σ)/(D'(1−D'))."""
    c = Calibration(0.6, 0.1)

    def loss(z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.binary_cross_entropy(
            shift_for_training(torch.sigmoid(z), c), y)

    z = torch.linspace(-4, 4, 33, dtype=torch.float64)
    s = torch.sigmoid(z)
    d = c.a * s + c.b
    expected = c.a * s * (1 - s) / (d * (1 - d))
    torch.testing.assert_close(label_dp.binary_sensitivity(loss, z).reshape(-1), expected)
    plain = label_dp.binary_sensitivity(torch.nn.functional.binary_cross_entropy_with_logits, z)
    torch.testing.assert_close(plain, torch.ones_like(plain))


def _protection(epsilon: float = 4.0, *, seed: int | None = 7, task: Task = Task.BINARY,
                n: int = 400, budget: ReleaseBudget | None = None, classes: int = 2,
                **extra: object) -> LabelProtection:
    settings_ = {**PrivacyConfig(labels="dp", labels_total_epsilon=epsilon,
                                 **extra).label_settings(), "seed": seed}  # type: ignore[arg-type]
    return LabelProtection(settings_, task=task, party="bank", n_rows=n, classes=classes,
                           budget=budget)


def test_sigma_comes_from_the_accountant_and_its_releases_compose_to_the_total() -> None:
    p = _protection(4.0)
    rows = np.arange(300)
    p.plan(rows, epochs=10)
    planned = label_dp.planned_label_releases(400, rows, 10)
    assert p.sigma == pytest.approx(calibrate_total(4.0, 1e-5, planned))
    # the checker's recomputation: dp-accounting's PLD, GaussianDpEvent(σ) composed 10 times
    accountant = PLDAccountant()
    accountant.compose(GaussianDpEvent(p.sigma), 10)
    assert accountant.get_epsilon(1e-5) <= 4.0
    assert composed_epsilon(p.sigma, 10, 1e-5) == pytest.approx(4.0, rel=1e-3)
    # composition of m Gaussians of multiplier σ is one of σ/√m (the accountant's own oracle)
    one = PLDAccountant()
    one.compose(GaussianDpEvent(p.sigma / math.sqrt(10)))
    assert one.get_epsilon(1e-5) == pytest.approx(accountant.get_epsilon(1e-5), rel=1e-3)


def test_the_noise_is_sigma_times_the_sensitivity_on_identity_logits() -> None:
    """A model whose logits are the identity of a known input: g̃ − (σ(z) − y) is the noise."""
    for task, classes, width in ((Task.BINARY, 2, 1), (Task.MULTICLASS, 3, 3)):
        p = _protection(2.0, task=task, classes=classes, n=20_000)
        rows = np.arange(20_000)
        p.plan(rows, epochs=1)
        z = torch.randn(20_000, width)
        y = (torch.randint(0, 2, (20_000,)).float() if task is Task.BINARY
             else torch.randint(0, 3, (20_000,)))
        p.noisy_logit_gradient(z, y, rows)
        assert p.last_release is not None  # the release itself, before the posterior's use
        noise = (p.last_release - label_dp.logit_gradient(task, z, y)).double()
        expected = p.sigma * label_dp.sensitivity(task)
        assert float(noise.std()) == pytest.approx(expected, rel=0.02)
        assert abs(float(noise.mean())) < 0.03 * expected
        assert p.report()["params"]["noise_std"] == pytest.approx(expected)


def test_releases_are_counted_and_refused_past_the_budget_before_any_noise() -> None:
    p = _protection(1.0)
    rows = np.arange(10)
    p.plan(rows, epochs=2)
    z, y = torch.zeros(10, 1), torch.ones(10)
    p.noisy_logit_gradient(z, y, rows)
    p.noisy_logit_gradient(z, y, rows)
    assert p.budget.totals[:10].tolist() == [2] * 10 and p.budget.totals[10:].sum() == 0
    state = p._noise.state()["torch"]
    with pytest.raises(PrivacyBudgetExceeded, match="labels_total_epsilon"):
        p.noisy_logit_gradient(z, y, rows[:3])
    assert p.budget.totals[:10].tolist() == [2] * 10  # nothing counted ...
    assert torch.equal(p._noise.state()["torch"], state)  # ... nor drawn
    entry = p.report()
    assert entry["kind"] == "label-dp" and entry["applies_to"] == "backward"
    g = entry["guarantee"]
    assert g["max_releases"] == 2 and g["epsilon"] <= 1.0 + 1e-9
    assert composed_epsilon(g["sigma"], g["max_releases"], g["delta"]) == pytest.approx(
        g["epsilon"])


def test_the_budget_outlives_the_run_and_a_second_run_pays_for_the_first(tmp_path) -> None:
    budget = ReleaseBudget.open(tmp_path, "ab" * 16, 50, party="bank")
    first = _protection(4.0, budget=budget, n=50)
    first.plan(np.arange(50), epochs=3)
    for _ in range(3):
        first.noisy_logit_gradient(torch.zeros(50, 1), torch.ones(50), np.arange(50))
    with pytest.raises(PrivacyBudgetExceeded):  # a fourth epoch would pass the total
        first.noisy_logit_gradient(torch.zeros(50, 1), torch.ones(50), np.arange(50))
    again = ReleaseBudget.open(tmp_path, "ab" * 16, 50, party="bank")  # a later run
    assert again.totals.tolist() == [3] * 50
    second = _protection(4.0, budget=again, n=50)
    second.plan(np.arange(50), epochs=3)  # what is left of ε: far more noise per release
    assert second.sigma is not None and first.sigma is not None
    assert second.sigma > 10 * first.sigma
    second.noisy_logit_gradient(torch.zeros(50, 1), torch.ones(50), np.arange(50))
    assert again.max_epsilon(1e-5) <= 4.0 + 1e-6


@pytest.mark.slow
def test_a_fixed_seed_never_repeats_its_noise_on_the_same_data() -> None:
    budget = ReleaseBudget(10, party="bank")
    draws = []
    for _ in range(2):
        p = _protection(8.0, budget=budget, n=10)
        p.plan(np.arange(10), epochs=1)
        draws.append(p.noisy_logit_gradient(torch.zeros(10, 1), torch.ones(10), np.arange(10)))
        budget = ReleaseBudget(10, party="bank")  # a fresh budget: the same stream again ...
        same = _protection(8.0, budget=budget, n=10)
        same.plan(np.arange(10), epochs=1)
        assert torch.equal(same.noisy_logit_gradient(torch.zeros(10, 1), torch.ones(10),
                                                     np.arange(10)), draws[0])
    shared = ReleaseBudget(10, party="bank")  # ... one budget: a new stream per run
    a, b = (_protection(8.0, budget=shared, n=10) for _ in range(2))
    for p in (a, b):
        p.plan(np.arange(5), epochs=1)
    ga = a.noisy_logit_gradient(torch.zeros(5, 1), torch.ones(5), np.arange(5))
    gb = b.noisy_logit_gradient(torch.zeros(5, 1), torch.ones(5), np.arange(5, 10))
    assert not torch.equal(ga, gb)


def test_secret_noise_by_default_and_the_settings_checks() -> None:
    p = _protection(4.0, seed=None)
    assert p.noise_kind == "secret"
    p.plan(np.arange(400), epochs=1)
    assert p.denoise == "posterior"  # secret noise on a binary task: the posterior's use
    p.noisy_logit_gradient(torch.zeros(400, 1), torch.zeros(400), np.arange(400))
    assert p.last_release is not None
    assert float(p.last_release.std()) == pytest.approx(p.sigma, rel=0.15)
    with pytest.raises(ConfigError) as err:
        PrivacyConfig(labels="nope", labels_marvell_power=2.0, labels_delta=1.0,
                      labels_clip=0.0)
    text = str(err.value)
    for key in ("privacy.labels`", "labels_marvell_power", "labels_delta", "labels_clip"):
        assert key in text  # every problem at once
    with pytest.raises(ConfigError, match="applies to"):
        PrivacyConfig(labels="marvell", labels_total_epsilon=4.0)
    with pytest.raises(ConfigError, match="binary"):
        check_label_task("marvell", Task.MULTICLASS)
    with pytest.raises(ConfigError, match="regression"):
        check_label_task("rr-prior", Task.REGRESSION)
    check_label_task("dp", Task.REGRESSION)
    assert "labels" not in PrivacyConfig(labels="dp").public_settings()  # never announced


def test_planned_releases_are_one_per_epoch_for_training_records() -> None:
    planned = label_dp.planned_label_releases(6, np.array([4, 1, 1]), 7)
    assert planned.tolist() == [0, 7, 0, 0, 7, 0]


def test_the_posterior_of_a_binary_label_is_the_closed_form_of_its_summed_releases() -> None:
    """Oracle: for BCE, record i's m releases g̃ = σ(z) − y + s·n give the log-likelihood ratio
    L = Σ [(g̃ − σ(z))² − (g̃ − σ(z) + 1)²]/(2s²) of y = 1 against y = 0, and the posterior mean
    gradient is σ(z) − σ(L) (uniform prior)."""
    gen = torch.Generator().manual_seed(3)
    n, m, s = 200, 6, 2.5
    y = torch.randint(0, 2, (n,), generator=gen).double()
    llr = torch.zeros(n, dtype=torch.float64)
    total = torch.zeros(n, 2, dtype=torch.float64)
    for _ in range(m):  # each release at its own logits, with its own noise
        z = torch.randn(n, 1, generator=gen, dtype=torch.float64)
        p = torch.sigmoid(z)[:, 0]
        g = p - y + s * torch.randn(n, generator=gen, dtype=torch.float64)
        llr += ((g - p) ** 2 - (g - p + 1) ** 2) / (2 * s ** 2)
        cands = label_dp.candidate_gradients(Task.BINARY, z)
        total += label_dp.release_log_likelihood(g[:, None], cands, s)
    torch.testing.assert_close(total[:, 1] - total[:, 0], llr)
    post = label_dp.posterior_gradient(cands, total)
    torch.testing.assert_close(post[:, 0], p - torch.sigmoid(llr))


def test_the_posterior_of_a_class_is_bayes_rule_over_the_classes() -> None:
    """Oracle: P(k | g̃) ∝ exp(−‖g̃ − g^(k)‖²/(2s²)) enumerated by hand for 3 classes."""
    gen = torch.Generator().manual_seed(5)
    z = torch.randn(40, 3, generator=gen, dtype=torch.float64)
    g = torch.randn(40, 3, generator=gen, dtype=torch.float64)
    cands = label_dp.candidate_gradients(Task.MULTICLASS, z)
    probs = torch.softmax(z, dim=1)
    weights = torch.stack([torch.exp(-((g - (probs - torch.eye(3, dtype=torch.float64)[k]))
                                       ** 2).sum(1) / (2 * 1.5 ** 2)) for k in range(3)], 1)
    weights /= weights.sum(1, keepdim=True)
    expected = probs - weights  # Σ_k P(k)(p − e_k) = p − P
    ll = label_dp.release_log_likelihood(g, cands, 1.5)
    torch.testing.assert_close(label_dp.posterior_gradient(cands, ll), expected)


def test_dp_trains_on_the_posterior_of_every_release_so_far_by_default() -> None:
    """With secret noise the primary back-propagates E[g | releases]: after enough releases
    it is the clean gradient's sign for almost every record; the release itself (what is
    counted and what the accountant covers) keeps its full noise; ``"none"`` uses it as drawn;
    reproducible noise keeps each release as drawn unless asked."""
    n, epochs = 2000, 40
    p = _protection(8.0, seed=None, n=n)
    assert p.denoise == "posterior"
    rows = np.arange(n)
    p.plan(rows, epochs=epochs)
    y = (torch.arange(n) % 2).float()
    z = torch.zeros(n, 1)
    for _ in range(epochs):
        out = p.noisy_logit_gradient(z, y, rows)
    clean = label_dp.logit_gradient(Task.BINARY, z, y)  # ±1/2
    agree = float(((out * clean) > 0).double().mean())
    # μ = √40/σ: the Bayes test of each label is right with probability Φ(μ/2)
    mu = math.sqrt(epochs) / float(p.sigma)
    assert agree == pytest.approx(float(torch.distributions.Normal(0, 1).cdf(
        torch.tensor(mu / 2))), abs=0.04)
    assert p.last_release is not None
    assert float((p.last_release - clean).std()) == pytest.approx(float(p.sigma), rel=0.05)
    assert (p.counts == epochs).all()
    plain = _protection(8.0, seed=None, n=n, labels_denoise="none")
    plain.plan(rows, epochs=1)
    out = plain.noisy_logit_gradient(z, y, rows)
    assert plain.last_release is not None
    assert torch.equal(out, plain.last_release.to(out.dtype))
    assert _protection(8.0, seed=7, n=n).denoise == "none"  # reproducible: as published
    with pytest.raises(ConfigError, match="labels_denoise"):
        _protection(8.0, seed=None, n=n, task=Task.REGRESSION, labels_denoise="posterior")
    with pytest.raises(ConfigError, match="applies to"):
        PrivacyConfig(labels="marvell", labels_denoise="posterior")


def test_labels_releases_releases_each_label_that_often_then_trains_on_its_posterior() -> None:
    """σ is calibrated for the releases, not the epochs; a record past them is not released
    again (not counted, no new evidence): the gradient is the posterior of what it had."""
    n, epochs = 300, 6
    p = _protection(4.0, seed=None, n=n, labels_releases=2)
    rows = np.arange(n)
    p.plan(rows, epochs=epochs)
    assert p.planned is not None and p.planned["releases_per_record"] == 2
    assert p.sigma == pytest.approx(calibrate_total(
        4.0, 1e-5, label_dp.planned_label_releases(n, rows, 2)))
    y = (torch.arange(n) % 2).float()
    z = torch.zeros(n, 1)
    outs = [p.noisy_logit_gradient(z, y, rows) for _ in range(epochs)]
    assert (p.counts == 2).all()
    assert all(p.budget.releases_of(r) == ((p.sigma, 2),) for r in (0, 1, n - 1))
    assert p.evidence is not None
    expected = label_dp.posterior_gradient(label_dp.candidate_gradients(Task.BINARY, z),
                                           torch.from_numpy(p.evidence))
    for out in outs[1:]:  # from the second release on: the posterior of both releases
        torch.testing.assert_close(out.double(), expected.double(), atol=1e-6, rtol=0)
    with pytest.raises(ConfigError, match="labels_releases"):
        PrivacyConfig(labels="dp", labels_denoise="none", labels_releases=1)
    with pytest.raises(ConfigError, match="labels_releases"):
        PrivacyConfig(labels="dp", labels_releases=0)


def test_the_default_protection_is_dp_once_per_label_through_the_posterior() -> None:
    """No ``labels`` key: dp at DEFAULT_PROTECTION_EPSILON (8), one release per label, the
    posterior (also under the reproducible switch); ``labels = "dp"`` named keeps ε = 4 and
    one release per epoch."""
    from vflink.privacy.config import (
        DEFAULT_LABELS_EPSILON,
        DEFAULT_PROTECTION_EPSILON,
        DEFAULT_PROTECTION_RELEASES,
    )
    from vflink.privacy.label_protection import resolve_settings

    assert (DEFAULT_PROTECTION_EPSILON, DEFAULT_PROTECTION_RELEASES) == (8.0, 1)
    for reproducible in (False, True):
        cfg = PrivacyConfig(reproducible_noise=reproducible)
        settings = resolve_settings(cfg.label_settings(), Task.BINARY)
        assert settings is not None and settings["mode"] == "dp"
        assert settings["epsilon"] == DEFAULT_PROTECTION_EPSILON
        assert settings["releases"] == DEFAULT_PROTECTION_RELEASES
        p = LabelProtection({**settings, "seed": 3 if reproducible else None}, task=Task.BINARY,
                            party="bank", n_rows=50, classes=2)
        assert p.denoise == "posterior"
        assert resolve_settings(cfg.label_settings(), Task.MULTICLASS) is None  # off
    named = PrivacyConfig(labels="dp").label_settings()
    assert named["epsilon"] == DEFAULT_LABELS_EPSILON == 4.0 and named["releases"] is None


def test_labels_refit_is_on_for_the_modes_that_train_on_protected_labels() -> None:
    """``labels_refit``: on by default (off under the reproducible switch, whose published
    figures had none), only where the primary's own model trained on protected labels, and
    the protection asks for it only then."""
    assert PrivacyConfig().label_settings()["refit"] is True
    assert PrivacyConfig(labels="dp").label_settings()["refit"] is True
    assert PrivacyConfig(reproducible_noise=True).label_settings()["refit"] is False
    assert PrivacyConfig(reproducible_noise=True, labels_refit=True).label_refit is True
    assert PrivacyConfig(labels="rr-prior", labels_refit=False).label_refit is False
    for mode in ("marvell", "max-norm", "off"):
        with pytest.raises(ConfigError, match="labels_refit"):
            PrivacyConfig(labels=mode, labels_refit=True)
        PrivacyConfig(labels=mode, labels_refit=False)  # saying no is always allowed
    with pytest.raises(ConfigError, match="true or false"):
        PrivacyConfig(labels="dp", labels_refit="yes")  # type: ignore[arg-type]
    for mode, wants in (("dp", True), ("rr-prior", True), ("marvell", False),
                        ("max-norm", False)):
        p = LabelProtection({"mode": mode, "refit": True}, task=Task.BINARY, party="bank",
                            n_rows=10, classes=2)
        assert p.wants_refit is wants and not p.refit_done
    p = LabelProtection({"mode": "dp", "refit": False}, task=Task.BINARY, party="bank",
                        n_rows=10, classes=2)
    assert not p.wants_refit
