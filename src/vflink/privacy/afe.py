"""VFL-AFE's pure maths on a batch of embeddings (Mi et al. 2023, Algorithm 1).

Every function here is stateless; :class:`vflink.privacy.embedding_dp.EmbeddingDP` holds the
state (generator, release counts) and calls them in the order of Algorithm 1:

* line 6, Eq. 2: :func:`clip_norm` (each embedding to norm ≤ t);
* lines 7-8, Eqs. 3-5: :func:`sensitivity_estimate` (μh + k·σh of the batch's pairwise
  distances) and :func:`rescale` (by Δ̃/(2t), as printed; optionally capped, a departure);
* line 9: N(0, 4σ²t²), drawn by the party's noise source (:mod:`vflink.randomness`;
  :func:`gaussian_noise` draws it from a given generator, for simulations and attacks);
* line 16, Eq. 7: :func:`fuzzy_cmeans` on the gradients the secondary received;
* line 17, Eqs. 6 and 8: :func:`kl_regulariser` and :func:`contrastive_loss` (its sign is
  the text's, not the printed formula's: see there).
"""

from __future__ import annotations

import math

import torch

__all__ = [
    "clip_norm",
    "contrastive_loss",
    "fuzzy_cmeans",
    "gaussian_noise",
    "kl_regulariser",
    "normalize_to_sphere",
    "pairwise_distances",
    "rescale",
    "sensitivity_estimate",
]


def clip_norm(h: torch.Tensor, t: float) -> torch.Tensor:
    """Line 6 / Eq. 2: h_j / max(1, ‖h_j‖ / t); differentiable (the graph is kept)."""
    norms = torch.linalg.vector_norm(h, dim=-1, keepdim=True)
    return h / torch.clamp(norms / t, min=1.0)


def normalize_to_sphere(h: torch.Tensor, t: float) -> torch.Tensor:
    """Every embedding scaled to norm exactly t (``normalized``, a departure from VFL-AFE).

    Clipping (Eq. 2) bounds the sensitivity by the ball's diameter 2t whatever the norms; an
    embedding of norm below t pays the same noise for less signal. Scaling onto the sphere
    keeps the sensitivity at 2t and gives every record the whole radius from the first step
    (the direction carries the information; differentiable away from 0).
    """
    norms = torch.linalg.vector_norm(h, dim=-1, keepdim=True)
    return h * (t / torch.clamp(norms, min=1e-12))


def pairwise_distances(h: torch.Tensor, *, max_rows: int = 512,
                       generator: torch.Generator | None = None) -> torch.Tensor:
    """The distances d = {‖h_j − h_k‖}_{j<k} of Eq. 3 on at most ``max_rows`` rows.

    §3.2 estimates the distribution of d from a uniformly sampled mini-batch; a large evaluation
    batch is sub-sampled the same way (uniformly, with ``generator``) to keep the cost O(rows²).
    """
    n = h.shape[0]
    if n > max_rows:
        pick = torch.randperm(n, generator=generator)[:max_rows]
        h = h[pick]
    return torch.pdist(h)


def sensitivity_estimate(d: torch.Tensor, sigmas: float = 3.0) -> torch.Tensor:
    """Eq. 5: Δ̃_p2 = μh + σh·√2·erf⁻¹(2p2 − 1) = μh + k·σh with p2 = Φ(k) (k = 3: 0.9987)."""
    if d.numel() < 2:
        return torch.zeros((), dtype=d.dtype)
    return d.mean() + sigmas * d.std()


def rescale(h: torch.Tensor, t: float, delta_tilde: torch.Tensor | float, *,
            cap: bool = False) -> torch.Tensor:
    """Line 8 / Eq. 4: h_j / (Δ̃ / 2t), so the estimated largest distance becomes 2t.

    As printed, Eq. 4 divides by Δ̃ whatever its size: an estimate above the ball's diameter 2t
    (which Eq. 5's Gaussian μh + 3σh gives whenever the batch's distances are bounded and
    skewed or multimodal, as class-separated embeddings make them) *shrinks* the embeddings
    under the same noise. ``cap = True`` is a departure from the paper (``privacy.rescale_cap``):
    Δ̃ is capped at 2t, since after clipping no two embeddings are further apart than
    d(B) = 2t (§3.2), so rescaling never shrinks. A degenerate batch (Δ̃ ≈ 0: fewer than three
    rows, or all embeddings equal) is left as it is; dividing by ~0 would only blow up
    numerical noise.
    """
    dt = float(delta_tilde)
    if cap:
        dt = min(dt, 2.0 * t)
    if not math.isfinite(dt) or dt <= 1e-12:
        return h
    return h * (2.0 * t / dt)


def gaussian_noise(shape: tuple[int, ...], std: float,
                   generator: torch.Generator) -> torch.Tensor:
    """Line 9: N(0, std²) noise from a seeded generator (attacks' simulations; a party's own
    noise comes from :class:`vflink.randomness.NoiseSource`)."""
    return torch.randn(shape, generator=generator, dtype=torch.float32) * std


def kl_regulariser(d: torch.Tensor, *, grid: int = 32, span: float = 4.0,
                   max_pairs: int = 2048, generator: torch.Generator | None = None
                   ) -> torch.Tensor:
    """Eq. 6 without α: D_KL(P(d) ‖ N(μh, σh²)).

    P(d) is the batch's empirical distribution of pairwise distances; we smooth it with a
    Gaussian kernel (Silverman's bandwidth) on a grid of standardised distances so the loss is
    differentiable, and compare it with the standard normal on the same grid. Standardising by
    μh and σh makes it scale-free, so rescaling does not change it. Above ``max_pairs``
    distances a uniform sample estimates it (a 128-row batch has 8,128; the kernel sum over all
    of them cost 14x the unprotected step, measured with benchmarks/privacy.py).
    """
    if d.numel() < 3:
        return torch.zeros((), dtype=d.dtype)
    if d.numel() > max_pairs:  # a uniform sample of the distances: the kernel sum is O(P·grid)
        d = d[torch.randperm(d.numel(), generator=generator)[:max_pairs]]
    mu, sd = d.mean(), d.std()
    if float(sd.detach()) <= 1e-12:
        return torch.zeros((), dtype=d.dtype)
    z = (d - mu) / sd
    g = torch.linspace(-span, span, grid, dtype=d.dtype)
    bw = 1.06 * float(d.numel()) ** -0.2
    p = torch.exp(-0.5 * ((g[:, None] - z[None, :]) / bw) ** 2).mean(dim=1) + 1e-12
    q = torch.exp(-0.5 * g**2) + 1e-12
    p = p / p.sum()
    q = q / q.sum()
    return (p * (p.log() - q.log())).sum()


def fuzzy_cmeans(x: torch.Tensor, clusters: int, *, fuzziness: float = 2.0, iters: int = 50,
                 tol: float = 1e-5, generator: torch.Generator | None = None) -> torch.Tensor:
    """Eq. 7: fuzzy c-means (Bezdek et al. 1984) memberships U (n, C); rows sum to 1.

    Hand-written (a dozen lines of the standard alternating updates) because no maintained
    fuzzy-clustering library is a dependency (scikit-fuzzy is not installed, and its random
    initialisation uses numpy's global state); we need a seeded generator and torch tensors.
    """
    x = x.detach().to(torch.float64)
    n = x.shape[0]
    c = min(clusters, n)
    if c < 2:
        return torch.ones(n, 1, dtype=torch.float64)
    u = torch.rand(n, c, generator=generator, dtype=torch.float64)
    u = u / u.sum(dim=1, keepdim=True)
    power = 2.0 / (fuzziness - 1.0)
    for _ in range(iters):
        um = u**fuzziness
        centres = (um.T @ x) / um.sum(dim=0)[:, None]
        dist = torch.cdist(x, centres).clamp_min(1e-12)
        # u_ij = 1 / Σ_k (d_ij / d_ik)^(2/(m-1)) = d_ij^(-p) / Σ_k d_ik^(-p), in O(n·C)
        inv = dist ** (-power)
        new = inv / inv.sum(dim=1, keepdim=True)
        change = float((new - u).abs().max())
        u = new
        if change < tol:
            break
    return u


def contrastive_loss(h: torch.Tensor, memberships: torch.Tensor, threshold: float
                     ) -> torch.Tensor:
    """Eq. 8 without β on the confident soft labels (Alg. 1 line 17).

    I_j = argmax_c U_jc and c_j = max_c U_jc (Eq. 7); pairs where both confidences reach the
    threshold c take part, with ω_jk = 1 when I_j = I_k. The loss is **minus**
    (1/n²) Σ (1 − ω_jk) ‖h_j − h_k‖, a departure from the printed sign: §3.3 and Figure 7 say the
    loss *enlarges* the distance between embeddings of different classes ("to encourage their
    inter-class discrepancy"), while minimising the printed Eq. 8 pulls them together. Taken
    literally it collapsed Adult's embeddings onto one point (largest distance 0.001·2t after
    20 epochs, test accuracy at the majority class; docs/reproductions/vfl-afe.md). The
    clipping bounds the negated loss (distances ≤ 2t before rescaling).
    """
    n = h.shape[0]
    if n < 2:
        return torch.zeros((), dtype=h.dtype)
    conf, ids = memberships.max(dim=1)
    keep = conf >= threshold
    if int(keep.sum()) < 2:
        return torch.zeros((), dtype=h.dtype)
    hk = h[keep]
    ik = ids[keep]
    dissimilar = (ik[:, None] != ik[None, :]).to(h.dtype)
    # sqrt of a clamped square: differentiable at zero distance (the diagonal)
    diff = hk[:, None, :] - hk[None, :, :]
    dist = torch.sqrt((diff**2).sum(dim=-1).clamp_min(1e-12))
    return -(dissimilar * dist).sum() / float(n * n)
