"""The decide stage: which links the primary receives, with what similarity and noise.

``DECISIONS``:

* ``top-k``: each primary record's K best links, their similarities Eq. 1-normalised and
  Eq. 2-noised, σ from τ by Theorem 2 (the private default τ = 0.05 when identifiers are
  private and neither τ nor σ is given; exact-mode links carry no distance and get none);
* ``matches``: a model link's: the K best by match weight, its match first, each link's
  decision (probability ≥ ``threshold``, then ``one_to_one``), the similarities of the
  normalised, noised weights;
* ``chunks``: the streamed link's ``top-k``: the links normalised and noised chunk by chunk
  in row order from the coordinator's noise stream (the in-memory link's very draws), handed
  to the write stage as they are made.

In memory this stage sends the primary's one request (what the candidates, compare, model
and decide stages chose) to the coordinator, which finds, compares, scores and decides; the
seconds of the coordinator's own steps go to their stages. The links put back at their rows'
positions (records skipped for an empty identifier get none), their columns (the settings'
``view``, record ids) and the improvement estimate Δ (FedSim §4.3) are made here.
"""

from __future__ import annotations

import dataclasses
import logging
import zlib
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from vflink.errors import LinkageError
from vflink.linkage import SoftLinkage
from vflink.linkage.diagnostics import name_fields
from vflink.linkage.fields import Blocking, FieldSpec
from vflink.linkage.improvement import _PLOT_ROWS, improvement_estimates
from vflink.linkage.privacy import (
    DEFAULT_TAU,
    dp_epsilon,
    tau_for_sigma,
    tau_in_words,
    theorem1_delta_limit,
)
from vflink.linkage.soft import noise_scale
from vflink.protocol.sessions import purpose_of
from vflink.randomness import secret_generator
from vflink.registry import Registry
from vflink.runner.encoding import default_noise
from vflink.runner.link.context import LinkContext, Stage
from vflink.runner.link.outcome import linkage_columns
from vflink.runner.link.parties import SESSION
from vflink.types import MISSING

__all__ = ["DECISIONS", "name_model"]

log = logging.getLogger(__name__)

DECISIONS: Registry[Stage] = Registry("link decision")


def _noise(ctx: LinkContext) -> dict[str, Any]:
    """The request's noise: the given τ or σ, or the private default τ = 0.05 with no
    fallback σ: a link whose similarities cannot reach it is refused (:func:`_refused`)
    rather than released with a weaker τ nobody asked for."""
    s = ctx.settings
    tau, sigma = default_noise(s.tau, s.sigma, private=s.privacy == "bloom", mode=s.mode)
    if s.tau is None and s.sigma is None:
        sigma = None
    return {"mode": s.mode, "tau": tau, "sigma": sigma, "delta": s.delta}


def _defaulted(ctx: LinkContext) -> bool:
    s = ctx.settings
    return s.tau is None and s.sigma is None and s.privacy == "bloom" and s.mode != "exact"


def _refused(exc: LinkageError) -> LinkageError:
    """The private default's refusal, in words: what τ this link can give at best, what that
    means, and how to accept it explicitly."""
    return LinkageError(
        f"the private default noise (greedy-attack bound τ = {DEFAULT_TAU:g}, FedSim Theorem "
        f"2) cannot be held on this link: {exc}. Its similarities spread over too few steps "
        f"of that attack for any noise to bring its success rate down to {DEFAULT_TAU:g}; a τ "
        f"near 1 is almost no protection (the attacker then recovers a compared record's "
        f"encoding, its Bloom filter or a model link's comparison levels, from its similarity "
        f"about as often as without noise). Give an "
        f"explicit `tau` (--tau) that this link can reach to accept a weaker protection, "
        f"`sigma` (--sigma) for a noise scale, or tau = 1 to release the similarities without "
        f"noise")


@DECISIONS.register("top-k")
def top_k(ctx: LinkContext) -> LinkContext:
    ctx.request.update(_noise(ctx), similarities=ctx.settings.alignment_similarities)
    return _receive(ctx)


@DECISIONS.register("matches")
def matches(ctx: LinkContext) -> LinkContext:
    ctx.request.update(_noise(ctx), similarities=ctx.settings.alignment_similarities,
                       threshold=ctx.settings.threshold,
                       one_to_one=ctx.settings.one_to_one or "",
                       cardinality=ctx.settings.cardinality or "")
    return _receive(ctx)


def _receive(ctx: LinkContext) -> LinkContext:
    """Send the request; the coordinator's linkage, the primary's alignment, the figures."""
    s, parties = ctx.settings, ctx.parties
    if parties is None:  # pragma: no cover - the encode stage's
        raise RuntimeError("no parties to ask")
    try:
        ctx.alignment = parties.request(ctx.request)
    except LinkageError as exc:
        if _defaulted(ctx) and "unreachable" in str(exc):
            raise _refused(exc) from None
        raise
    ctx.clock.book(parties.seconds())
    linkage = parties.linkage()
    _warn_tau(ctx, linkage.tau)
    # Δ (FedSim §4.3) is estimated beside the write (context.estimate_improvement)
    ctx.improvement, ctx.improvement_of = {}, linkage if s.mode == "soft" else None
    ctx.communication = parties.communication()
    ctx.sizes = {"primary_rows": len(linkage), "secondary_rows": linkage.n_secondary,
                 "top_k": s.top_k}
    keep_p, keep_s = ctx.primary.keep, ctx.secondary.keep
    if keep_p is not None and keep_s is not None and not (keep_p.all() and keep_s.all()):
        linkage = _expand(ctx, linkage, keep_p, keep_s)
    if linkage.model:
        name_model(linkage.model, ctx.fields, s.blocking)
        _report_model(linkage.model, s)
    ctx.linkage = ctx.shown = linkage
    ctx.columns = columns = linkage_columns(linkage, view=s.view)
    ctx.sizes["links"] = columns.rows  # the links present (a skipped row's are missing)
    for side, name in ((ctx.primary, "primary_id"), (ctx.secondary, "secondary_id")):
        if side.ids is not None:
            columns.add_ids(name, side.ids)
    ctx.rows = columns.rows
    ctx.chunks = (columns,)
    return ctx


def _warn_tau(ctx: LinkContext, tau: float) -> None:
    """Say in words what a weak greedy-attack bound means, when noise was asked for (τ = 1,
    σ = 0 or exact mode are an explicit release without noise)."""
    s = ctx.settings
    if s.mode == "exact" or s.tau == 1 or s.sigma == 0 or (s.privacy != "bloom" and s.tau
                                                           is None and s.sigma is None):
        return
    if tau > DEFAULT_TAU * (1 + 1e-9):
        log.warning("the similarities' protection: %s", tau_in_words(tau))


def _expand(ctx: LinkContext, lk: SoftLinkage, keep_p: npt.NDArray[np.bool_],
            keep_s: npt.NDArray[np.bool_]) -> SoftLinkage:
    """Put a linkage of the non-empty rows back at the rows' original positions."""
    rows = np.flatnonzero(keep_p)
    cols = np.flatnonzero(keep_s)
    k = lk.k
    indices = np.full((len(keep_p), k), MISSING, dtype=np.int64)
    distances = np.full((len(keep_p), k), np.nan)
    similarities = np.full((len(keep_p), k), np.nan)
    valid = lk.indices >= 0
    indices[rows] = np.where(valid, cols[np.where(valid, lk.indices, 0)], MISSING)
    distances[rows] = lk.distances
    similarities[rows] = lk.similarities
    linkage = dataclasses.replace(lk, indices=indices, distances=distances,
                                  similarities=similarities, n_secondary=len(keep_s))
    ctx.skipped = {"primary": int((~keep_p).sum()), "secondary": int((~keep_s).sum())}
    log.info("skipped %d primary and %d secondary row(s) with an empty identifier",
             ctx.skipped["primary"], ctx.skipped["secondary"])
    ctx.sizes.update(primary_rows=len(keep_p), secondary_rows=len(keep_s))
    ctx.alignment = linkage.to_alignment(
        "secondary", include_similarity=ctx.settings.alignment_similarities)
    return linkage


def name_model(model: dict[str, Any], fields: Sequence[FieldSpec],
               blocking: Sequence[Blocking]) -> None:
    """Name a model link's fields and blocking rules by their columns in its summary (the
    coordinator knows them by number only)."""
    names = {f"field{i}": ",".join(f.on) for i, f in enumerate(fields)}
    names.update({f"rule{r}": b.describe() for r, b in enumerate(blocking)})
    for row in model.get("m_u", []):
        row["field"] = names.get(row["field"], row["field"])
    for row in model.get("waterfall", {}).get("fields", []):
        row["field"] = names.get(row["field"], row["field"])
    for rule, b in zip(model.get("blocking_rules", []), blocking, strict=False):
        rule["rule"] = b.describe()
    for key in ("diagnostics", "estimated"):
        if key in model:
            model[key] = name_fields(model[key], names)


def _report_model(model: dict[str, Any], s: Any) -> None:
    """Say on the log what the operator must know of a model link: the cardinality in force
    and why, duplicates, every diagnostic warning, and an estimate that is not given."""
    card = model.get("cardinality", {})
    log.info("model link: cardinality %s (%s)", card.get("cardinality"), card.get("why"))
    if s.one_to_one and card.get("duplicates"):
        log.warning("one_to_one keeps at most one match per record, but %s: matches of the "
                    "duplicates are dropped (leave one_to_one out to keep them)",
                    "; ".join(card["duplicates"]))
    for text in model.get("diagnostics", {}).get("warnings", []):
        log.warning("%s", text)
    est = model.get("estimated", {})
    if not est.get("trusted", True):
        log.warning("the label-free estimate %s: %s",
                    "is not given" if est.get("precision") is None else
                    "gives precision only",
                    "; ".join(est.get("reasons", [])))


# --- the streamed link -------------------------------------------------------------------------


@DECISIONS.register("chunks")
def chunks(ctx: LinkContext) -> LinkContext:
    s = ctx.settings
    mu0, sigma0 = ctx.state["scale"]
    noise_args = _noise(ctx)
    try:
        noise = noise_scale(noise_args["tau"], noise_args["sigma"], sigma0)
    except LinkageError as exc:
        if _defaulted(ctx):
            raise _refused(exc) from None
        raise
    _warn_tau(ctx, tau_for_sigma(noise, sigma0))
    # the coordinator's noise stream for this session (CoordinatorParty._noise_rng)
    rng = (np.random.default_rng([s.seed, zlib.crc32(purpose_of(SESSION).encode())])
           if s.seed is not None else secret_generator())
    n_primary, n_secondary = ctx.primary.rows, ctx.secondary.rows
    ctx.sizes = {"primary_rows": n_primary, "secondary_rows": n_secondary, "top_k": s.top_k,
                 "links": n_primary * s.top_k}
    ctx.rows = n_primary * s.top_k
    empty = np.empty((0, s.top_k))
    ctx.linkage = _figures(ctx, empty.astype(np.int64), empty, empty, mu0, sigma0, noise,
                           n_primary=n_primary)
    ctx.alignment = ctx.linkage.to_alignment(
        "secondary", include_similarity=s.alignment_similarities)
    ctx.chunks = _links(ctx, mu0, sigma0, noise, rng)
    return ctx


def _links(ctx: LinkContext, mu0: float, sigma0: float, noise: float,
           rng: np.random.Generator) -> Iterator[dict[str, Any]]:
    """The links of each spilled chunk, in row order: Eq. 1 with (μ0, σ0), Eq. 2's noise,
    as :func:`~vflink.linkage.soft.normalize_similarities` and
    :func:`~vflink.linkage.soft.perturb_similarities` make them; Δ (§4.3) summed per chunk
    and the rows Figure 4 draws (those the in-memory plot samples) kept as they pass. Made
    as the write stage asks for them, and counted for this stage."""
    traffic = ctx.state["traffic"]
    n_primary = ctx.primary.rows
    pick = (np.sort(np.random.default_rng(0).choice(n_primary, _PLOT_ROWS, replace=False))
            if n_primary > _PLOT_ROWS else None)
    sample: list[tuple[Any, Any, Any]] = []
    delta_sums: dict[str, float] = {}
    row = 0
    for path in ctx.state["raw"]:
        with ctx.clock.stage("decide"):
            links, n = _chunk(ctx, path, row, pick, mu0, sigma0, noise, rng, sample,
                              delta_sums)
        yield links
        row += n
    with ctx.clock.stage("decide"):
        ctx.improvement = {name: value / max(1, n_primary) for name, value in delta_sums.items()}
        ctx.shown = _figures(ctx, np.concatenate([r[0] for r in sample]),
                             np.concatenate([r[1] for r in sample]),
                             np.concatenate([r[2] for r in sample]), mu0, sigma0, noise)
        ctx.communication = {k: {"messages": v[0], "bytes": v[1]}
                             for k, v in sorted(traffic.items())}
    log.info("streamed link: %d × %d, %d primary chunks, %d secondary partitions",
             n_primary, ctx.secondary.rows, len(ctx.state["raw"]),
             len(ctx.state["partitions"]))


def _chunk(ctx: LinkContext, path: Any, row: int, pick: Any, mu0: float, sigma0: float,
           noise: float, rng: np.random.Generator, sample: list[tuple[Any, Any, Any]],
           delta_sums: dict[str, float]) -> tuple[dict[str, Any], int]:
    """The links of one spilled chunk whose first row is ``row``, and its number of rows."""
    s, traffic = ctx.settings, ctx.state["traffic"]
    with np.load(path) as r:
        dist, idx = r["distances"], r["indices"]
    n, k = dist.shape
    if sigma0 > 0.0:  # as normalize_similarities / perturb_similarities
        rho = -dist
        rho -= mu0
        rho /= sigma0
    else:
        rho = np.zeros_like(dist)
    if noise != 0.0:
        sim = rng.normal(0.0, noise, size=rho.shape)
        sim += rho
    else:
        sim = rho
    traffic["coordinator->primary"][0] += 1
    traffic["coordinator->primary"][1] += int(idx.nbytes + sim.nbytes)
    traffic["coordinator->secondary"][0] += 1
    traffic["coordinator->secondary"][1] += int(idx.nbytes)
    part = _figures(ctx, idx, dist, sim, mu0, sigma0, noise)
    if s.mode == "soft":
        for name, value in improvement_estimates(part).items():
            delta_sums[name] = delta_sums.get(name, 0.0) + value * n
    keep = (np.arange(n) if pick is None else pick[(pick >= row) & (pick < row + n)] - row)
    if keep.size:
        sample.append((idx[keep], dist[keep], sim[keep]))
    links = {"primary_index": np.repeat(np.arange(row, row + n, dtype=np.int64), k),
             "secondary_index": idx.astype(np.int64, copy=False).reshape(-1),
             "rank": np.tile(np.arange(k, dtype=np.int64), n),
             "distance": dist.astype(np.float64, copy=False).reshape(-1),
             "similarity": sim.astype(np.float64, copy=False).reshape(-1)}
    if s.view == "primary":  # the coordinator's exact distance stays with it
        del links["distance"]
    return links, n


def _figures(ctx: LinkContext, idx: Any, dist: Any, sim: Any, mu0: float, sigma0: float,
             noise: float, *, n_primary: int | None = None) -> SoftLinkage:
    """A :class:`SoftLinkage` of some rows with the whole linkage's figures (Theorems 1-2)."""
    s = ctx.settings
    n = len(idx) if n_primary is None else n_primary
    epsilon = dp_epsilon(noise, n, mu0, sigma0)
    return SoftLinkage(indices=idx, distances=dist, similarities=sim, mu0=mu0, sigma0=sigma0,
                       sigma=noise, tau=tau_for_sigma(noise, sigma0), epsilon=epsilon,
                       delta=float(s.delta), epsilon_valid=bool(s.delta < theorem1_delta_limit(
                           epsilon)), metric=ctx.search_metric, mode=s.mode,  # type: ignore[arg-type]
                       n_secondary=ctx.secondary.rows, exact_search=True)
