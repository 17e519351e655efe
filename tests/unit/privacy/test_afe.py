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
    # the check of issue 9: std(released − clipped-and-rescaled) = 2σt within 2 %
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


def test_secure_noise_has_the_right_scale_and_is_not_reproducible() -> None:
    a = afe.secure_gaussian_noise((50_000, 2), 1.5)
    b = afe.secure_gaussian_noise((50_000, 2), 1.5)
    assert float(a.std()) == pytest.approx(1.5, rel=0.02)
    assert not torch.equal(a, b)
    dp = EmbeddingDP(PrivacyConfig(embeddings="vanilla", secure_rng=True), party="s", n_rows=4)
    kept, released = dp.release(torch.zeros(4, 3), np.arange(4))
    assert not torch.equal(kept, released)


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
    # an estimate above the ball's diameter 2t never shrinks the embeddings
    torch.testing.assert_close(afe.rescale(h, 1.0, 3.5), h)
    # a degenerate batch is left alone
    same = torch.ones(5, 3)
    torch.testing.assert_close(afe.rescale(same, 1.0, afe.sensitivity_estimate(
        afe.pairwise_distances(same))), same)


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
