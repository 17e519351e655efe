"""Record linkage for VFL without a shared key (FedSim §4.1, §4.3, §5; App. I).

Stages, one module each (ARCHITECTURE.md, convention 9): :mod:`.encoding` (raw, string, Bloom) →
:mod:`.blocking` (length windows and LCS bounds for strings) → :mod:`.search` (top-K with
faiss / rapidfuzz, each with a brute-force reference) → :mod:`.soft` (Eq. 1 normalisation,
Eq. 2 noise) with the privacy formulas of :mod:`.privacy` (Theorems 1 and 2), and
:mod:`.improvement` (Δ, Figure 4).
:func:`link` runs them all. :mod:`.fields` links on several fields with their own metrics,
weights and blocking keys; :mod:`.encoding.geo` encodes places on the globe as keyed Bloom
filters, :mod:`.encoding.dates` dates as keyed filters of date tokens.

Linkage decisions: :mod:`.comparison` (per-field comparison levels), :mod:`.fellegi_sunter`
(the model, trained by EM without labels, term-frequency adjustment), :mod:`.scoring`
(candidate pairs from blocking rules, levels, training and scores), :mod:`.decisions`
(threshold, one-to-one assignment, clusters, label-free and measured quality) and
:mod:`.model_link` (a decided link as a :class:`SoftLinkage`). This package is an algorithm
layer: it does no I/O to peers.
"""

from __future__ import annotations

from vflink.linkage.api import link
from vflink.linkage.blocked import search_blocked
from vflink.linkage.chunked import merge_topk, search_chunked
from vflink.linkage.encoding import (
    BLOOM_FORMAT_VERSION,
    ENCODERS,
    BloomConfig,
    BloomEncoder,
    Encoder,
    GeoBloomConfig,
    GeoBloomEncoder,
    NumericRange,
    RawEncoder,
    Standardization,
    StringEncoder,
    bloom_geo,
    bloom_numeric,
    bloom_strings,
    make_encoder,
    normalize_string,
)
from vflink.linkage.improvement import (
    BASELINES,
    baseline_matches,
    improvement_estimate,
    improvement_estimates,
    improvement_per_record,
    plot_similarity_curve,
    scale_similarities,
)
from vflink.linkage.privacy import (
    DEFAULT_FALLBACK_SIGMA,
    DEFAULT_TAU,
    describe_protection,
    dp_epsilon,
    dp_sensitivity,
    sigma_for_tau,
    tau_for_sigma,
    tau_min,
    theorem1_delta_limit,
)
from vflink.linkage.search import (
    METRICS,
    Metric,
    Neighbours,
    SearchOptions,
    brute_euclidean,
    brute_hamming,
    brute_haversine,
    brute_levenshtein,
    recall_at_k,
    search_euclidean,
    search_hamming,
    search_haversine,
    search_levenshtein,
)
from vflink.linkage.soft import (
    SoftLinkage,
    normalize_similarities,
    perturb_similarities,
    soft_linkage,
)
from vflink.linkage.validation import validate_identifiers

__all__ = [
    "BASELINES",
    "BLOOM_FORMAT_VERSION",
    "DEFAULT_FALLBACK_SIGMA",
    "DEFAULT_TAU",
    "ENCODERS",
    "METRICS",
    "BloomConfig",
    "BloomEncoder",
    "Encoder",
    "GeoBloomConfig",
    "GeoBloomEncoder",
    "Metric",
    "Neighbours",
    "NumericRange",
    "RawEncoder",
    "SearchOptions",
    "SoftLinkage",
    "Standardization",
    "StringEncoder",
    "baseline_matches",
    "bloom_geo",
    "bloom_numeric",
    "bloom_strings",
    "brute_euclidean",
    "brute_hamming",
    "brute_haversine",
    "brute_levenshtein",
    "describe_protection",
    "dp_epsilon",
    "dp_sensitivity",
    "improvement_estimate",
    "improvement_estimates",
    "improvement_per_record",
    "link",
    "make_encoder",
    "merge_topk",
    "normalize_similarities",
    "normalize_string",
    "perturb_similarities",
    "plot_similarity_curve",
    "recall_at_k",
    "scale_similarities",
    "search_blocked",
    "search_chunked",
    "search_euclidean",
    "search_hamming",
    "search_haversine",
    "search_levenshtein",
    "sigma_for_tau",
    "soft_linkage",
    "tau_for_sigma",
    "tau_min",
    "theorem1_delta_limit",
    "validate_identifiers",
]
