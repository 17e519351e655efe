"""The high-level, pure linkage API that the coordinator and the CLI call.

``link`` takes identifiers that are already extracted from the tables (and, for privacy, already
Bloom-encoded by the parties): float arrays, sequences of strings, or packed uint8 Bloom filters.
It validates them, optionally encodes both sides with one encoder, searches the top-K, and
returns a :class:`~vflink.linkage.soft.SoftLinkage`. No file or network I/O happens here.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from vflink.linkage.chunked import search_chunked
from vflink.linkage.encoding.base import Encoder
from vflink.linkage.search import METRICS, Neighbours, SearchOptions
from vflink.linkage.soft import LinkMode, SoftLinkage, soft_linkage
from vflink.linkage.validation import validate_identifiers
from vflink.types import Compute

__all__ = ["link", "search_neighbours"]

log = logging.getLogger(__name__)


def link(
    primary_ids: Any,
    secondary_ids: Any,
    *,
    metric: str,
    top_k: int,
    mode: LinkMode = "soft",
    tau: float | None = None,
    sigma: float | None = None,
    delta: float = 1e-5,
    encoder: Encoder | None = None,
    search: SearchOptions | None = None,
    rng: np.random.Generator | int | None = None,
    scale: tuple[float, float] | None = None,
    compute: Compute | None = None,
) -> SoftLinkage:
    """Link each primary record to its ``top_k`` nearest secondary records (FedSim §4.1).

    Args:
        primary_ids, secondary_ids: identifiers of each side (see module docstring).
        metric: ``"euclidean"``, ``"haversine"`` (lat/lon degrees → km), ``"levenshtein"`` or
            ``"hamming"`` (packed Bloom filters).
        top_k: K. ``mode="top1"`` (Top1Sim) and ``mode="exact"`` (Exact: exact matches only,
            the rest MISSING) need K = 1.
        tau: target greedy-attack success rate (Theorem 2); σ is derived from it.
        sigma: noise scale of Eq. 2 given directly (at most one of ``tau``/``sigma``).
        delta: δ at which Theorem 1's ε is reported.
        encoder: applied to both sides before searching (e.g. a
            :class:`~vflink.linkage.encoding.BloomEncoder` in a simulation where one process
            plays both parties).
        search: search options (exact/approximate, chunk size, threads...).
        rng: seed or Generator for the Eq. 2 noise (None: the secret source,
            :mod:`vflink.randomness`; a seed makes the noise reproducible, not private).
        scale: (μ0, σ0) of Eq. 1 to reuse (e.g. the training linkage's, at inference).
        compute: a compute engine: the search runs as primary chunks × secondary partitions
            on it (:func:`~vflink.linkage.chunked.search_chunked`, equal results ties aside);
            ``None`` searches in this process.
    """
    neighbours, n_secondary = search_neighbours(primary_ids, secondary_ids, metric=metric,
                                                top_k=top_k, encoder=encoder, search=search,
                                                compute=compute)
    return soft_linkage(neighbours, metric=metric, n_secondary=n_secondary, mode=mode, tau=tau,
                        sigma=sigma, delta=delta, rng=rng, scale=scale)


def search_neighbours(primary_ids: Any, secondary_ids: Any, *, metric: str, top_k: int,
                      encoder: Encoder | None = None, search: SearchOptions | None = None,
                      compute: Compute | None = None) -> tuple[Neighbours, int]:
    """The search of :func:`link` (its arguments): each primary record's ``top_k`` nearest
    secondary records and their distances, and the number of secondary records."""
    if encoder is not None:
        primary_ids = encoder.encode(primary_ids)
        secondary_ids = encoder.encode(secondary_ids)
    m = METRICS.get(metric)
    p, s = validate_identifiers(primary_ids, secondary_ids, metric=metric, top_k=top_k)
    if compute is None:
        neighbours = m.search(p, s, top_k, options=search)
    else:
        neighbours = search_chunked(metric, p, s, top_k, compute=compute, options=search)
    log.info("linked %d primary to %d secondary records with %s, K=%d", len(p), len(s), metric,
             top_k)
    return neighbours, len(s)
