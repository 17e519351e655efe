"""VFL-AFE's maths: clipping, the released noise, rescaling, KL, fuzzy c-means, Eq. 8."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vflink.privacy import afe
from vflink.privacy.config import PrivacyConfig
from vflink.privacy.embedding_dp import EmbeddingDP


@pytest.mark.parametrize("mode", ["vanilla", "rescale"])
def test_released_noise_is_2_sigma_t_over_100k_embeddings(mode: str) -> None:
    # std(released − clipped-and-rescaled) = σ times the sensitivity 2t, within 2 %
    t, n, d = 0.7, 100_000, 8
    dp = EmbeddingDP(PrivacyConfig(embeddings=mode, epsilon=2.0, delta=1e-2, clip=t),
                     party="s", n_rows=n, seed=5)
    gen = torch.Generator().manual_seed(0)
    out = torch.randn(n, d, generator=gen) * torch.rand(n, 1, generator=gen) * 3.0
    clipped = afe.clip_norm(out, t)
    assert float(torch.linalg.vector_norm(clipped, dim=1).max()) <= t * (1 + 1e-6)
    released_all, kept_all = [], []
    for start in range(0, n, 1000):  # batches, as in training
        rows = np.arange(start, start + 1000)
        kept, released = dp.release(out[start:start + 1000], rows)
        kept_all.append(kept.detach())
        released_all.append(released)
    residual = torch.cat(released_all) - torch.cat(kept_all)
    expected = 2 * dp.sigma * t
    assert float(residual.std()) == pytest.approx(expected, rel=0.02)
    assert abs(float(residual.mean())) < 0.01 * expected
    if mode == "vanilla":  # nothing but clipping before the noise
        torch.testing.assert_close(torch.cat(kept_all), clipped)
    assert dp.max_releases == 1 and dp.counts.sum() == n


def test_default_noise_is_secret_and_has_the_right_scale() -> None:
    # no seed: the secret source (vflink.randomness); two parties never draw the same noise
    dps = [EmbeddingDP(PrivacyConfig(embeddings="vanilla", epsilon=1.0), party="s",
                       n_rows=50_000) for _ in range(2)]
    assert all(dp.noise_kind == "secret" for dp in dps)
    out = [dp.release(torch.zeros(50_000, 2), np.arange(50_000))[1] for dp in dps]
    assert float(out[0].std()) == pytest.approx(dps[0].noise_std, rel=0.02)
    assert not torch.equal(out[0], out[1])


def test_clip_keeps_short_vectors_and_shortens_long_ones() -> None:
    h = torch.tensor([[0.3, 0.4], [3.0, 4.0]])
    torch.testing.assert_close(afe.clip_norm(h, 1.0), torch.tensor([[0.3, 0.4], [0.6, 0.8]]))


def test_rescale_maps_the_estimated_diameter_to_2t() -> None:
    gen = torch.Generator().manual_seed(1)
    h = afe.clip_norm(torch.randn(200, 4, generator=gen) * 0.05 + 0.2, 1.0)
    d = afe.pairwise_distances(h)
    assert d.numel() == 200 * 199 // 2
    est = afe.sensitivity_estimate(d, 3.0)
    assert float(est) == pytest.approx(float(d.mean() + 3 * d.std()))
    scaled = afe.rescale(h, 1.0, est)
    d2 = afe.pairwise_distances(scaled)
    assert float(afe.sensitivity_estimate(d2, 3.0)) == pytest.approx(2.0, rel=1e-5)
    # Eq. 4 as printed: an estimate above the ball's diameter 2t shrinks the embeddings ...
    torch.testing.assert_close(afe.rescale(h, 1.0, 3.5), h * (2.0 / 3.5))
    # ... unless capped at 2t (privacy.rescale_cap, a departure): then they stay as they are
    torch.testing.assert_close(afe.rescale(h, 1.0, 3.5, cap=True), h)
    torch.testing.assert_close(afe.rescale(h, 1.0, 0.5, cap=True), h * 4.0)
    # a degenerate batch is left alone
    same = torch.ones(5, 3)
    torch.testing.assert_close(afe.rescale(same, 1.0, afe.sensitivity_estimate(
        afe.pairwise_distances(same))), same)


def test_rescale_by_hand_on_three_points() -> None:
    # Eqs. 3-5 and line 8 by hand: points 0, (0.3, 0), (0, 0.4) (norms ≤ t = 1, so clipping
    # keeps them); distances 0.3, 0.4, 0.5: μh = 0.4, σh = 0.1 (n − 1 in the std), so
    # Δ̃ = μh + 3σh = 0.7 and every embedding is multiplied by 2t/Δ̃ = 2/0.7.
    h = torch.tensor([[0.0, 0.0], [0.3, 0.0], [0.0, 0.4]])
    z = afe.clip_norm(h, 1.0)
    est = afe.sensitivity_estimate(afe.pairwise_distances(z), 3.0)
    assert float(est) == pytest.approx(0.7, rel=1e-6)
    torch.testing.assert_close(afe.rescale(z, 1.0, est), h * (2.0 / 0.7))
    # two antipodal pairs (two classes on the sphere): after clipping to t = 1 the points are
    # ±e1 twice; distances 0, 0, 2, 2, 2, 2, so μh = 4/3, σh = √(16/15) and
    # Δ̃ = 4/3 + 3√(16/15) ≈ 4.43 > 2t: Eq. 4 as printed multiplies by 2/Δ̃ ≈ 0.45 (shrinks)
    two = torch.tensor([[5.0, 0.0], [3.0, 0.0], [-2.0, 0.0], [-9.0, 0.0]])
    z = afe.clip_norm(two, 1.0)
    torch.testing.assert_close(z, torch.tensor([[1.0, 0.0], [1.0, 0.0], [-1.0, 0.0], [-1.0, 0.0]]))
    dt = 4 / 3 + 3 * np.sqrt(16 / 15)
    est = afe.sensitivity_estimate(afe.pairwise_distances(z), 3.0)
    assert float(est) == pytest.approx(dt, rel=1e-6)
    torch.testing.assert_close(afe.rescale(z, 1.0, est), z * float(2 / dt))
    torch.testing.assert_close(afe.rescale(z, 1.0, est, cap=True), z)


def test_release_rescales_as_printed_or_capped() -> None:
    # the wrapper applies line 6 then line 8 (uncapped by default) before the noise
    h = torch.tensor([[0.0, 0.0], [0.3, 0.0], [0.0, 0.4]])
    for cap, factor in ((False, 2.0 / 0.7), (True, 2.0 / 0.7)):
        dp = EmbeddingDP(PrivacyConfig(embeddings="rescale", clip=1.0, rescale_cap=cap),
                         party="s", n_rows=3, seed=0)
        kept, _ = dp.release(h, np.arange(3))
        torch.testing.assert_close(kept, h * factor)
    two = torch.tensor([[5.0, 0.0], [3.0, 0.0], [-2.0, 0.0], [-9.0, 0.0]])
    dt = 4 / 3 + 3 * np.sqrt(16 / 15)  # as in test_rescale_by_hand_on_three_points
    clipped = torch.tensor([[1.0, 0.0], [1.0, 0.0], [-1.0, 0.0], [-1.0, 0.0]])
    for cap, factor in ((False, float(2 / dt)), (True, 1.0)):
        dp = EmbeddingDP(PrivacyConfig(embeddings="afe", clip=1.0, rescale_cap=cap),
                         party="s", n_rows=4, seed=0)
        kept, _ = dp.release(two, np.arange(4))
        torch.testing.assert_close(kept, clipped * factor)
        assert dp.report()["params"]["rescale_cap"] is cap


def test_kl_is_small_for_gaussian_distances_and_large_for_bimodal() -> None:
    gen = torch.Generator().manual_seed(2)
    gaussian = torch.randn(5000, generator=gen) + 10
    bimodal = torch.cat([torch.randn(2500, generator=gen) * 0.1, torch.randn(2500, generator=gen)
                         * 0.1 + 5])
    assert float(afe.kl_regulariser(gaussian)) < 0.05
    assert float(afe.kl_regulariser(bimodal)) > 0.3
    # differentiable
    x = bimodal.clone().requires_grad_(True)
    afe.kl_regulariser(x).backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()


def test_fuzzy_cmeans_recovers_separated_clusters() -> None:
    gen = torch.Generator().manual_seed(3)
    centres = torch.tensor([[0.0, 0.0], [5.0, 5.0], [-5.0, 5.0]])
    labels = torch.arange(3).repeat_interleave(40)
    x = centres[labels] + 0.3 * torch.randn(120, 2, generator=gen)
    u = afe.fuzzy_cmeans(x, 3, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(u.sum(dim=1), torch.ones(120, dtype=torch.float64))
    ids = u.argmax(dim=1)
    # purity 1: every true cluster maps to one found cluster, and they are distinct
    mapping = {int(ids[labels == k].mode().values) for k in range(3)}
    assert len(mapping) == 3
    for k in range(3):
        assert bool((ids[labels == k] == ids[labels == k][0]).all())
    assert float(u.max(dim=1).values.min()) > 0.8


def test_contrastive_loss_pushes_different_clusters_apart() -> None:
    h = torch.tensor([[0.1, 0.0], [0.0, 0.1], [0.2, 0.1], [0.1, 0.2]], requires_grad=True)
    u = torch.tensor([[0.9, 0.1], [0.95, 0.05], [0.1, 0.9], [0.5, 0.5]])  # last: not confident
    loss = afe.contrastive_loss(h, u, 0.7)
    # hand-computed: only pairs (0,2), (1,2) and their mirrors are dissimilar and confident
    hd = h.detach()
    d02 = float(torch.dist(hd[0], hd[2]))
    d12 = float(torch.dist(hd[1], hd[2]))
    assert float(loss.detach()) == pytest.approx(-2 * (d02 + d12) / 16, rel=1e-5)
    loss.backward()
    assert h.grad is not None
    stepped = (h - 0.1 * h.grad).detach()
    assert float(torch.dist(stepped[0], stepped[2])) > d02  # descent enlarges the distance
    assert float(h.grad[3].abs().sum()) == 0.0  # the unconfident row takes no part


def test_observer_sees_training_batches_only_and_the_report_never_does() -> None:
    # the 4-point batch of test_rescale_by_hand_on_three_points: all four are clipped, the
    # clipped batch spans the full diameter 2t, Δ̃/2t = dt/2 and the factor is 2/dt
    two = torch.tensor([[5.0, 0.0], [3.0, 0.0], [-2.0, 0.0], [-9.0, 0.0]])
    dt = 4 / 3 + 3 * np.sqrt(16 / 15)
    seen: list[tuple[str, dict[str, float]]] = []
    dp = EmbeddingDP(PrivacyConfig(embeddings="afe", clip=1.0), party="s", n_rows=4, seed=0,
                     classes=2)
    dp.observer = lambda event, figures: seen.append((event, figures))
    with torch.no_grad():  # an evaluation release: not observed
        dp.release(two, np.arange(4))
    assert seen == []
    out = two.clone().requires_grad_(True)
    kept, released = dp.release(out, np.arange(4))
    (event, figures), = seen
    assert event == "release"
    assert figures["clipped"] == 1.0 and figures["spread"] == pytest.approx(1.0)
    assert figures["estimate"] == pytest.approx(dt / 2, rel=1e-6)
    assert figures["factor"] == pytest.approx(2 / dt, rel=1e-6)
    grad = torch.tensor([[1.0, 0.0], [1.0, 0.1], [-1.0, 0.0], [-1.0, 0.1]])
    dp.local_loss(kept, grad)
    event, figures = seen[-1]
    assert event == "local_loss" and set(figures) == {"kl", "confident", "cl"}
    assert figures["confident"] == 1.0  # two tight clusters of gradients, memberships > 0.7
    text = repr(dp.report())
    assert "spread" not in text and "estimate" not in text and "confident" not in text
