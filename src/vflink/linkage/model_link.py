"""A multi-field link decided by a Fellegi–Sunter model: candidates → scores → decisions →
the top-K per primary record, with FedSim's Eq. 1–2 applied to the match weights.

What the primary receives (ARCHITECTURE.md, boundary table) stays a top-K alignment with
similarities, so every training plan consumes it unchanged:

* the K candidates of each primary record with the largest match weight, its match (if any)
  first;
* the similarity s = Eq. 1-normalised match weight + Eq. 2 noise, σ from τ by Theorem 2 on the
  weight's own step: the largest gap between two adjacent values one field's contribution can
  take (a greedy attacker who rounds a noised weight can at best recover the pair's comparison
  levels; a Bloom filter cannot be recovered from levels at all). The match probability the
  primary shows is the one-to-one posterior (:mod:`.fellegi_sunter`) of the de-normalised
  noised weights w̃ = μ0 + σ0·s of the links it received: a post-processing of s, protected as
  s is (Theorem 1's ε and Theorem 2's τ are unchanged by it);
* the decision ``match`` of each link, made by the coordinator on the exact model: one bit per
  link (whether its exact probability reached the threshold and the one-to-one assignment kept
  it);
* aggregate estimates of the link's quality (expected matches, precision, recall, F1 at the
  chosen threshold) and the model's λ; an estimate whose conditions fail on the data
  (:mod:`.diagnostics`) is not released, only that it is not.

The posterior and the decisions follow the link's cardinality (given, or estimated from the
data: :func:`~.fellegi_sunter.estimate_cardinality`); the summary says which and why, how many
records of each side have several near-certain counterparts (duplicates), and for a
many-to-many link its clusters (:func:`~.decisions.pair_clusters`).

The coordinator's own view (:class:`~vflink.linkage.soft.SoftLinkage`) also holds the exact
weights and probabilities, the m/u table, the estimated precision/recall/F1 at every threshold,
the per-rule blocking counts and the waterfall of one pair, for an operator who runs every
party (``vflink link``).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from vflink.errors import LinkageError
from vflink.linkage import diagnostics as dg
from vflink.linkage.comparison import FieldComparator
from vflink.linkage.decisions import decide, estimate_quality, pair_clusters, threshold_curve
from vflink.linkage.fellegi_sunter import CARDINALITIES
from vflink.linkage.scoring import Scored, random_pairs, score
from vflink.linkage.search import Neighbours
from vflink.linkage.soft import LinkMode, SoftLinkage, soft_linkage

__all__ = ["ALL_PAIRS", "MODELS", "model_linkage", "weight_resolution"]

log = logging.getLogger(__name__)

MODELS = ("fellegi-sunter",)
#: Without blocking rules every pair is a candidate up to this many pairs; above it, each
#: primary record's nearest records by the field distance are (a search).
ALL_PAIRS = 2_000_000

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


def weight_resolution(scored: Scored) -> float:
    """The weight's step for Theorem 2 (module docstring): the largest gap between two
    adjacent contributions one field takes over the candidate pairs (at least 1e-6)."""
    step = 0.0
    for f in range(scored.contributions.shape[1]):
        values = np.unique(np.round(scored.contributions[:, f], 9))
        if len(values) > 1:
            step = max(step, float(np.diff(values).max()))
    return max(step, 1e-6)


def _top_links(scored: Scored, matches: npt.NDArray[np.bool_], n: int, k: int
               ) -> tuple[IntArray, IntArray]:
    """(n, K) positions into the scored pairs: per primary record its match first, then its
    other candidates by decreasing weight; −1 where it has fewer than K."""
    rows = scored.rows
    order = np.lexsort((scored.cols, -scored.weights, ~matches, rows))
    r = rows[order]
    starts = np.searchsorted(r, np.arange(n))
    rank = np.arange(len(r)) - starts[r]
    keep = rank < k
    pos = np.full((n, k), -1, dtype=np.int64)
    pos[r[keep], rank[keep]] = order[keep]
    return pos, rank


def _waterfall(scored: Scored, i: int) -> dict[str, Any]:
    model = scored.model
    fields = []
    for f, name in enumerate(model.names):
        level = int(scored.levels[i, f])
        fields.append({"field": name,
                       "level": "missing" if level < 0 else model.levels[f][level],
                       "weight": float(scored.contributions[i, f])})
    return {"primary_index": int(scored.rows[i]), "secondary_index": int(scored.cols[i]),
            "prior": model.prior_weight, "fields": fields,
            "match_weight": float(scored.weights[i]),
            "match_probability": float(scored.probabilities[i])}


def model_linkage(comparators: Sequence[FieldComparator],
                  fields: Sequence[tuple[str, str, Any, Any]],
                  codes: Sequence[tuple[IntArray, IntArray]], *,
                  candidates: tuple[IntArray, IntArray], top_k: int, rng: np.random.Generator,
                  mode: LinkMode = "soft", tau: float | None = None,
                  sigma: float | None = None, delta: float = 1e-5,
                  scale: tuple[float, float] | None = None, threshold: float = 0.5,
                  one_to_one: str | None = None, field_weights: Sequence[float] = (),
                  scales: Sequence[float] = (), blocking: Sequence[dict[str, Any]] = (),
                  noise_rng: np.random.Generator | None = None,
                  cardinality: str | None = None, kinds: Sequence[str] = (),
                  rule_keys: Sequence[tuple[IntArray, IntArray]] = (),
                  rule_atoms: Sequence[Sequence[int]] = (),
                  candidate_ranks: IntArray | None = None) -> SoftLinkage:
    """Score the ``candidates`` (rows, cols) with a model trained on them, decide the matches
    and build the linkage (module docstring). ``rng`` draws the random pairs that estimate u;
    ``noise_rng`` (default ``rng``) the Eq. 2 noise. ``cardinality``: the link's, or None to
    estimate it. The checks of :mod:`.diagnostics` use ``kinds`` (each field's kind: string,
    date, numeric, geo), ``rule_keys`` (each blocking rule's key codes on both sides) and
    ``rule_atoms`` (what each rule requires: field indices, or negative numbers for columns
    that are no field); ``candidate_ranks``: when the candidates are each record's nearest by
    the field distance (not every pair, no rules), each one's rank among its record's."""
    rows, cols = candidates
    n_p, n_s = len(codes[0][0]), len(codes[0][1])
    if len(comparators) < 2:
        # one field's levels are a mixture that no label-free method can split into matches
        # and non-matches: EM needs independent fields to tell them apart
        log.warning("a Fellegi–Sunter model of one field cannot tell matches from non-matches "
                    "without labels; give at least two fields (it may find no match)")
    if n_s < 1 or n_p < 1:
        raise LinkageError("a model link needs records on both sides")
    scored = score(comparators, fields, codes, rows, cols, rng=rng, scales=scales,
                   cardinality=cardinality)
    matches = decide(rows, cols, scored.probabilities, scored.weights, threshold=threshold,
                     one_to_one=one_to_one)
    chosen_cardinality = scored.model.extra["cardinality"]["cardinality"]
    k = top_k
    pos, _ = _top_links(scored, matches, n_p, k)
    has = pos >= 0
    safe = np.where(has, pos, 0)
    indices = np.where(has, scored.cols[safe], -1)
    weights = np.where(has, scored.weights[safe], np.nan)
    neighbours = Neighbours(indices, -weights, exact=True,
                            resolution=weight_resolution(scored))
    linkage = soft_linkage(neighbours, metric="fellegi-sunter", n_secondary=n_s, mode=mode,
                           tau=tau, sigma=sigma, delta=delta,
                           rng=noise_rng if noise_rng is not None else rng, scale=scale)
    # the links' field distance: the weighted mean over present fields of 1 − similarity
    sims = scored.extra["similarities"]
    present = scored.levels >= 0
    w = np.asarray(field_weights or [1.0] * len(comparators), dtype=np.float64)
    num = ((1.0 - sims) * present * w).sum(axis=1)
    den = (present * w).sum(axis=1)
    pair_distance = np.where(den > 0, num / np.maximum(den, 1e-12), 1.0)
    distances = np.where(has, pair_distance[safe], np.nan)
    # the decisions released are those among each primary record's K links: a record with
    # more matches than K (one-to-many, many-to-many) keeps its K best, and the estimate is
    # of what is released
    in_links = np.zeros(len(matches), dtype=bool)
    in_links[pos[has]] = True
    beyond = matches & ~in_links
    chosen = estimate_quality(scored.probabilities, matches & in_links)
    checks = _diagnose(scored, fields, codes, kinds or ["string"] * len(comparators),
                       rule_keys, rule_atoms, blocking, n_p, n_s, candidate_ranks)
    if beyond.any():
        most = int(np.bincount(rows[matches]).max())
        checks["warnings"].append(
            f"{int(np.count_nonzero(np.bincount(rows[beyond])))} primary record(s) have more "
            f"matches than top_k = {k} (at most {most}): {int(beyond.sum())} match(es) are "
            f"beyond each record's {k} links and are left out of the links and the estimate; "
            f"give top_k ≥ {most} to keep them")
    chosen = _estimate(chosen, checks)
    curve = threshold_curve(rows, cols, scored.probabilities,
                            cardinality=chosen_cardinality)
    probable = np.flatnonzero(matches)
    example = (int(probable[np.argmin(scored.probabilities[probable])]) if len(probable)
               else int(np.argmax(scored.weights)))
    model = scored.model
    card = dict(model.extra["cardinality"])
    card["duplicates"] = _duplicates(card["near_certain"])
    # the cardinality as its number in CARDINALITIES (the primary's meta holds numbers): the
    # primary needs it to read its links' decisions and derive their probabilities
    released = {"expected_matches": chosen["expected_matches"], "lambda": model.lam,
                "threshold": threshold,
                "cardinality": float(CARDINALITIES.index(chosen_cardinality))}
    released.update({f"estimated_{k2}": chosen[k2] for k2 in ("precision", "recall", "f1")
                     if chosen[k2] is not None})
    summary: dict[str, Any] = {
        "name": "fellegi-sunter", "lambda": model.lam, "em_iterations": model.iterations,
        "em_converged": model.converged, "candidate_pairs": int(len(rows)),
        "threshold": threshold, "one_to_one": one_to_one or "none",
        "cardinality": card,
        "matches": int((matches & in_links).sum()),
        "matches_beyond_top_k": int(beyond.sum()), "m_u": model.table(),
        "estimated": chosen, "diagnostics": checks, "threshold_curve": curve,
        "waterfall": _waterfall(scored, example), "blocking_rules": list(blocking),
        "weight_histogram": _histogram(scored.weights, matches),
        "released": released,
    }
    if chosen_cardinality == "many-to-many":
        summary["clusters"] = _clusters(scored, n_p, n_s, threshold)
    return dataclasses.replace(
        linkage, distances=distances, match_weights=weights,
        match_probabilities=np.where(has, scored.probabilities[safe], np.nan),
        matches=np.where(has, matches[safe], False), model=summary)


def _diagnose(scored: Scored, fields: Sequence[tuple[str, str, Any, Any]],
              codes: Sequence[tuple[IntArray, IntArray]], kinds: Sequence[str],
              rule_keys: Sequence[tuple[IntArray, IntArray]],
              rule_atoms: Sequence[Sequence[int]], blocking: Sequence[dict[str, Any]],
              n_p: int, n_s: int, ranks: IntArray | None) -> dict[str, Any]:
    """The conditions of the label-free estimate, checked (:mod:`.diagnostics`): each
    field's separation, swapped fields, the blocking rules' counts and recall, the fit."""
    model, q = scored.model, scored.probabilities
    names = list(model.names)
    warnings: list[str] = []
    separation = dg.field_separation(scored.levels, scored.extra["random_levels"], q,
                                     [len(x) for x in model.m], names)
    for row in separation:
        if row["separates"] is False:
            warnings.append(
                f"field {row['field']} does not separate likely matches from random pairs: it "
                f"agrees on {row['agree_matches']:.1%} of the likely matches and "
                f"{row['agree_random']:.1%} of random pairs (its levels' distributions differ "
                f"by {row['separation']:.2f}); it adds no evidence, and its two columns may "
                f"not hold the same thing")
    swaps = dg.swap_check(dg.cross_codes(fields, kinds), codes, names,
                          n_records=min(n_p, n_s))
    warnings.extend(s["text"] for s in swaps)
    few = max(1, int(dg.FEW_COMPARISONS * min(n_p, n_s)))
    for r, rule in enumerate(blocking):
        if rule["comparisons"] < few:
            warnings.append(
                f"blocking rule rule{r} makes {rule['comparisons']:,} comparisons (fewer "
                f"than {few:,}): it finds (almost) no pair; are its columns written the same "
                f"way on both sides?")
    if rule_keys:
        agree = [(cp[scored.rows] == cs[scored.cols]) & (cp[scored.rows] >= 0)
                 for cp, cs in codes]
        # without atoms, each rule is an event of its own, named by the rule
        atoms = (rule_atoms if len(rule_atoms) == len(rule_keys)
                 else [[-1 - r] for r in range(len(rule_keys))])
        recall = dg.blocking_recall(atoms, dg.capture_matrix(rule_keys, scored.rows,
                                                             scored.cols),
                                    agree, q)
    elif ranks is not None:
        # each record's K nearest by the field distance: matches beyond the K-th are not
        # seen; when the K-th nearest carries almost none of the expected matches, fewer
        # still lie beyond it (their share falls with the rank)
        k_near = int(ranks.max()) + 1 if len(ranks) else 0
        last = float(q[ranks == k_near - 1].sum() / max(float(q.sum()), 1e-12))
        if last <= dg.LAST_RANK_MAX:
            recall = {"recall": 1.0, "reason": f"the candidates are each record's {k_near} "
                                               f"nearest; the {k_near}-th nearest carries "
                                               f"{last:.2%} of the expected matches, so few "
                                               f"lie beyond"}
        else:
            recall = {"recall": None,
                      "reason": f"the candidates are each record's {k_near} nearest by the "
                                f"field distance, and the {k_near}-th nearest still carries "
                                f"{last:.1%} of the expected matches: those beyond cannot be "
                                f"counted; add blocking rules (or a larger top_k)"}
    else:
        recall = {"recall": 1.0, "reason": "every pair is a candidate"}
    fit = dg.fit_checks(converged=model.converged, iterations=model.iterations, q=q)
    return {"fields": separation, "swaps": swaps, "blocking_recall": recall, "fit": fit,
            "warnings": warnings}


def _estimate(chosen: dict[str, float], checks: dict[str, Any]) -> dict[str, Any]:
    """The estimate as released: precision, recall, F1 with the blocking rules' recall
    (Σ q over the candidates divided by the rules' recall is the matches expected in all),
    or None where a condition fails, with ``trusted`` and the ``reasons``."""
    out: dict[str, Any] = dict(chosen)
    reasons = list(checks["fit"]) + [s["text"] for s in checks["swaps"]]
    recall = checks["blocking_recall"]
    tp = chosen["precision"] * chosen["chosen"]
    out["recall_among_candidates"] = chosen["recall"]
    out["blocking_recall"] = recall["recall"]
    if reasons:
        out.update(precision=None, recall=None, f1=None)
    elif recall["recall"] is None:
        out.update(recall=None, f1=None)
        reasons.append(recall["reason"])
    else:
        expected = chosen["expected_matches"] / max(recall["recall"], 1e-12)
        out["expected_matches_in_all"] = expected
        out["recall"] = tp / expected if expected > 0 else 1.0
        out["f1"] = (2.0 * tp / (chosen["chosen"] + expected)
                     if chosen["chosen"] + expected > 0 else 1.0)
    out["trusted"] = not reasons
    out["reasons"] = reasons
    return out


def _duplicates(counts: dict[str, int]) -> list[str]:
    """The near-certain counterparts in words: which side seems to hold duplicates."""
    out = []
    if counts["secondary_with_several"]:
        out.append(f"{counts['secondary_with_several']:,} secondary record(s) have several "
                   f"near-certain counterparts in the primary: the primary holds duplicates")
    if counts["primary_with_several"]:
        out.append(f"{counts['primary_with_several']:,} primary record(s) have several "
                   f"near-certain counterparts in the secondary: the secondary holds "
                   f"duplicates")
    return out


def _clusters(scored: Scored, n_p: int, n_s: int, threshold: float) -> dict[str, Any]:
    """A many-to-many link's clusters at the threshold: how many, their records, the largest."""
    ids_p, ids_s = pair_clusters(scored.rows, scored.cols, scored.probabilities, n_p, n_s,
                                 threshold=threshold)
    sizes = np.bincount(np.concatenate([ids_p, ids_s]))
    several = sizes[sizes >= 2]
    return {"threshold": threshold, "clusters": int(len(several)),
            "records_in_clusters": int(several.sum()),
            "largest": int(several.max()) if len(several) else 0}


def _histogram(weights: FloatArray, matches: npt.NDArray[np.bool_]) -> dict[str, list[float]]:
    """Counts of candidate pairs by match weight (1-bit bins), matched and not."""
    if not len(weights):
        return {"edges": [], "matched": [], "unmatched": []}
    lo, hi = np.floor(weights.min()), np.ceil(weights.max())
    edges = np.arange(lo, max(hi, lo + 1) + 1.0)
    return {"edges": edges.tolist(),
            "matched": np.histogram(weights[matches], edges)[0].astype(float).tolist(),
            "unmatched": np.histogram(weights[~matches], edges)[0].astype(float).tolist()}


def all_or_none(n_p: int, n_s: int) -> tuple[IntArray, IntArray] | None:
    """Every pair as a candidate when there are at most :data:`ALL_PAIRS`, else None."""
    if n_p * n_s > ALL_PAIRS:
        return None
    return random_pairs(n_p, n_s, n_p * n_s, np.random.default_rng(0))
