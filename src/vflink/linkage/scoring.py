"""Candidate pairs, their comparison levels and a trained Fellegi–Sunter model, end to end.

What the coordinator runs when a link asks for ``model = "fellegi-sunter"``, as pure functions
on the encodings it holds (no party, no protocol):

1. :func:`candidate_pairs`: the pairs that agree on at least one blocking rule (a rule is one
   keyed digest per record, of one column or of several columns together), with each rule's
   comparisons and the new pairs it added; without rules, the caller passes the top-K of a
   search instead.
2. :func:`pair_similarities`: per field, the similarity of the two encodings of each pair
   (Dice of keyed Bloom filters, or 1 − the field's own distance with privacy off).
3. :func:`value_codes`: per field, an integer code per record, equal exactly when the keyed
   hashes of the normalised values are equal (−1: missing); exact agreement and term
   frequencies come from these codes.
4. :func:`score`: levels (:mod:`.comparison`), u from random pairs, m and λ by EM under the
   link's cardinality (:mod:`.fellegi_sunter`; estimated from the data unless given: a first
   fit one-to-one, then, when a table shows duplicates, a second under the cardinality they
   imply), term-frequency adjustment, then each pair's match weight, per-field contributions
   and match probability (the posterior under that cardinality, which the decisions and the
   label-free estimates use).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from vflink.errors import ConfigError, LinkageError
from vflink.linkage.comparison import FieldComparator, bloom_dice, level_names, pair_levels
from vflink.linkage.distances import haversine_paired
from vflink.linkage.encoding.dates import set_dice, token_sets
from vflink.linkage.fellegi_sunter import (
    FSModel,
    estimate_cardinality,
    estimate_u,
    fit_em,
    match_weights,
    near_certain_counts,
    posterior,
    prior_matches,
    term_frequencies,
)

__all__ = ["MAX_CANDIDATES", "RANDOM_PAIRS", "Scored", "candidate_pairs", "pair_similarities",
           "random_pairs", "score", "value_codes"]

log = logging.getLogger(__name__)

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
#: Random pairs whose levels estimate u.
RANDOM_PAIRS = 1_000_000
#: Most candidate pairs a model link scores (blocking rules that keep more are refused).
MAX_CANDIDATES = 50_000_000


def value_codes(values_p: Any, values_s: Any) -> tuple[IntArray, IntArray]:
    """Per record an integer code, shared by both sides, equal exactly when the values are:
    rows of ``(n, b)`` uint8 digests (all zero: missing), or strings (``""``: missing), or
    float rows. Missing values get −1."""
    if isinstance(values_p, np.ndarray) and values_p.dtype == np.uint8:
        a = np.ascontiguousarray(np.concatenate([values_p, values_s]))
        missing = ~a.any(axis=1)
        keys = a.view(np.dtype((np.void, a.shape[1]))).ravel()
    elif isinstance(values_p, np.ndarray):
        a = np.ascontiguousarray(np.concatenate([values_p, values_s]), dtype=np.float64)
        missing = ~np.isfinite(a).all(axis=1)
        keys = a.view(np.dtype((np.void, a.dtype.itemsize * a.shape[1]))).ravel()
    else:
        texts = np.asarray([*values_p, *values_s], dtype=object)
        missing = np.asarray([not t for t in texts], dtype=bool)
        keys = texts.astype(str)
    _, inverse = np.unique(keys, return_inverse=True)
    codes = inverse.astype(np.int64).ravel()
    codes[missing] = -1
    return codes[:len(values_p)], codes[len(values_p):]


def candidate_pairs(keys_p: Sequence[Sequence[str]], keys_s: Sequence[Sequence[str]], *,
                    names: Sequence[str] = (), max_pairs: int = MAX_CANDIDATES
                    ) -> tuple[IntArray, IntArray, list[dict[str, Any]]]:
    """Pairs that share a non-empty key of at least one rule (rule r's keys: ``keys_p[r]``,
    ``keys_s[r]``), sorted by (row, col), and per rule its ``comparisons`` (pairs sharing its
    key) and ``new_pairs`` (those no earlier rule produced). Raises :class:`LinkageError`
    naming the rule when the pairs exceed ``max_pairs``."""
    stats: list[dict[str, Any]] = []
    seen = np.zeros(0, dtype=np.int64)
    total = 0
    for r, (kp, ks) in enumerate(zip(keys_p, keys_s, strict=True)):
        name = names[r] if r < len(names) else f"rule {r + 1}"
        values = np.asarray([*kp, *ks], dtype=object).astype(str)
        uniq, inverse = np.unique(values, return_inverse=True)
        inverse = inverse.astype(np.int64).ravel()
        empty = np.flatnonzero(uniq == "")
        cp, cs = inverse[:len(kp)], inverse[len(kp):]
        if empty.size:
            cp = np.where(cp == empty[0], -1, cp)
            cs = np.where(cs == empty[0], -1, cs)
        n_keys = len(uniq)
        count_p = np.bincount(cp[cp >= 0], minlength=n_keys)
        count_s = np.bincount(cs[cs >= 0], minlength=n_keys)
        comparisons = int((count_p * count_s).sum())
        total += comparisons
        if total > max_pairs:
            raise LinkageError(
                f"blocking rule {name!r} alone makes {comparisons:,} comparisons ({total:,} "
                f"with the rules before it); at most {max_pairs:,} are scored: combine it "
                f"with another column (on = [\"a\", \"b\"]) or use a prefix")
        # every (row, col) with the same key: rows grouped by key, cols grouped by key
        order_s = np.argsort(cs, kind="stable")
        start_s = np.searchsorted(cs[order_s], np.arange(n_keys))
        rows_with = np.flatnonzero(cp >= 0)
        per_row = count_s[cp[rows_with]]
        rows = np.repeat(rows_with, per_row)
        first = np.repeat(start_s[cp[rows_with]], per_row)
        offset = np.arange(len(rows)) - np.repeat(np.cumsum(per_row) - per_row, per_row)
        cols = order_s[first + offset]
        code = (rows.astype(np.int64) << 32) | cols.astype(np.int64)
        code = np.unique(code)
        new = np.setdiff1d(code, seen, assume_unique=True)
        stats.append({"rule": name, "comparisons": comparisons, "new_pairs": int(len(new))})
        seen = np.union1d(seen, new)
    pairs = seen
    return (pairs >> 32).astype(np.int64), (pairs & 0xFFFFFFFF).astype(np.int64), stats


def random_pairs(n_p: int, n_s: int, count: int, rng: np.random.Generator
                 ) -> tuple[IntArray, IntArray]:
    """``count`` pairs drawn uniformly (with replacement), or every pair when there are fewer."""
    if n_p * n_s <= count:
        rows, cols = np.divmod(np.arange(n_p * n_s, dtype=np.int64), n_s)
        return rows, cols
    return (rng.integers(0, n_p, size=count, dtype=np.int64),
            rng.integers(0, n_s, size=count, dtype=np.int64))


def pair_similarities(encoder: str, metric: str, a: Any, b: Any, rows: IntArray,
                      cols: IntArray, *, scale: float = 1.0
                      ) -> tuple[FloatArray, npt.NDArray[np.bool_]]:
    """Similarity in [0, 1] of each pair's two encodings of one field, and where either side
    is missing. ``encoder`` ``"bloom"``: Dice of the filters (an all-zero filter is missing);
    ``"string"``: 1 − the ``metric``'s normalised distance (``"date"``: token Dice); ``"raw"``:
    1 − d/(d + scale) of the Euclidean or haversine distance."""
    if encoder == "bloom":
        arr = np.asarray(a)
        brr = np.asarray(b)
        present_a = np.asarray(arr.any(axis=1), dtype=bool)
        present_b = np.asarray(brr.any(axis=1), dtype=bool)
        return bloom_dice(arr, brr, rows, cols), ~(present_a[rows] & present_b[cols])
    if encoder == "string":
        la = [a[int(i)] for i in rows]
        lb = [b[int(j)] for j in cols]
        missing = np.fromiter((not x or not y for x, y in zip(la, lb, strict=True)),
                              dtype=bool, count=len(la))
        if metric == "date":  # each record's tokens parsed once, not once per pair
            ta, tb = token_sets(a), token_sets(b)
            sim = np.fromiter((set_dice(ta[int(i)], tb[int(j)])
                               for i, j in zip(rows, cols, strict=True)),
                              dtype=np.float64, count=len(rows))
            return sim, missing
        from rapidfuzz import process

        from vflink.linkage.fields import _scorer  # the same scorers as the distances

        if metric == "exact":
            sim = np.asarray([x == y for x, y in zip(la, lb, strict=True)], dtype=np.float64)
        elif metric == "token-set":
            from rapidfuzz import fuzz

            sim = process.cpdist(la, lb, scorer=fuzz.token_set_ratio, dtype=np.float64) / 100
        else:
            sim = 1.0 - process.cpdist(la, lb, scorer=_scorer(metric), dtype=np.float64)
        return np.asarray(sim, dtype=np.float64), missing
    if encoder == "raw":
        x, y = np.asarray(a, dtype=np.float64)[rows], np.asarray(b, dtype=np.float64)[cols]
        if metric == "haversine":
            d = haversine_paired(x, y)
        else:
            d = np.sqrt(((x - y) ** 2).sum(axis=1))
        missing = np.asarray(~(np.isfinite(x).all(axis=1) & np.isfinite(y).all(axis=1)),
                             dtype=bool)
        return np.where(missing, 0.0, 1.0 - d / (d + scale)), missing
    raise ConfigError(f"unknown field encoder {encoder!r}; valid: bloom, raw, string")


@dataclass(frozen=True, eq=False)
class Scored:
    """Every candidate pair scored: rows and columns, the match weight, the match probability
    (the posterior under the link's cardinality) and per-field contributions, the levels, and
    the trained model (``model.extra["cardinality"]``: which cardinality, given or estimated,
    and why)."""

    rows: IntArray
    cols: IntArray
    weights: FloatArray
    #: each pair's posterior under the cardinality (:func:`~.fellegi_sunter.posterior`)
    probabilities: FloatArray
    contributions: FloatArray
    levels: npt.NDArray[np.int8]
    model: FSModel
    extra: dict[str, Any] = field(default_factory=dict)


#: Term-frequency adjustment applies where the values' frequencies are this skewed at least
#: (:func:`frequency_skew`): common surnames, cities, dates of birth, not near-unique codes.
TF_SKEW = 2.0


def frequency_skew(codes_p: IntArray, codes_s: IntArray) -> float:
    """D·Σ_v f(v)²: how much more often two random records agree than if the D distinct
    values were equally frequent (1 for equal frequencies; large when a few values are
    common). Where it is near 1, a value's frequency says nothing the level's u does not, and
    adjusting by it only adds the noise of small counts."""
    both = np.concatenate([codes_p, codes_s])
    both = both[both >= 0]
    if not len(both):
        return 1.0
    counts = np.unique(both, return_counts=True)[1].astype(np.float64)
    f = counts / counts.sum()
    return float(len(counts) * (f * f).sum())


def _levels(comparators: Sequence[FieldComparator], sims: Sequence[Any],
            rows: IntArray, cols: IntArray, codes: Sequence[tuple[IntArray, IntArray]]
            ) -> npt.NDArray[np.int8]:
    exact = [(cp[rows] == cs[cols]) & (cp[rows] >= 0) for cp, cs in codes]
    return pair_levels([s[0] for s in sims], exact, [s[1] for s in sims], comparators)


def score(comparators: Sequence[FieldComparator], fields: Sequence[tuple[str, str, Any, Any]],
          codes: Sequence[tuple[IntArray, IntArray]], rows: IntArray, cols: IntArray, *,
          rng: np.random.Generator, n_random: int = RANDOM_PAIRS,
          scales: Sequence[float] = (), cardinality: str | None = None) -> Scored:
    """Train the model on the candidate pairs (``rows``, ``cols``) and score them.

    ``fields[f]`` = (encoder, metric, primary values, secondary values) of field f,
    ``codes[f]`` its :func:`value_codes`; ``rng`` draws the random pairs that estimate u.
    ``cardinality``: the link's (:data:`~.fellegi_sunter.CARDINALITIES`), or None to estimate
    it (:func:`~.fellegi_sunter.estimate_cardinality` on a first fit one-to-one).
    """
    if not len(rows):
        raise LinkageError("no candidate pairs to score: the blocking rules put no primary "
                           "record with any secondary record")
    n_p, n_s = len(codes[0][0]), len(codes[0][1])
    n_levels = [c.n_levels for c in comparators]

    def sims_for(r: IntArray, c: IntArray) -> list[Any]:
        return [pair_similarities(enc, metric, a, b, r, c,
                                  scale=scales[f] if f < len(scales) else 1.0)
                for f, (enc, metric, a, b) in enumerate(fields)]

    rr, rc = random_pairs(n_p, n_s, n_random, rng)
    random_levels = _levels(comparators, sims_for(rr, rc), rr, rc, codes)
    u = estimate_u(random_levels, n_levels)
    candidate_sims = sims_for(rows, cols)
    levels = _levels(comparators, candidate_sims, rows, cols, codes)
    # EM over all n_P·n_S pairs under the cardinality's constraint (fit_em), those outside the
    # candidates counting as non-matches: λ is the prior of any pair, and a candidate that
    # agrees only on its blocking rule's fields keeps the weight those agreements have
    # between random records (blocking that keeps nearly every match loses little)
    names = [c.name for c in comparators]
    labels = [level_names(c.thresholds) for c in comparators]
    total = float(n_p) * float(n_s)
    first = cardinality or "one-to-one"
    model = fit_em(levels, n_levels, u, rows, cols, total_pairs=total,
                   lam=prior_matches(n_p, n_s, first) / total, names=names,
                   level_names=labels, cardinality=first)
    tf = _term_frequencies(comparators, codes, rows)
    chosen: dict[str, Any] = {"cardinality": first, "given": cardinality is not None}
    if cardinality is None:
        # the cardinality the data show, from the weights of the one-to-one fit; a second fit
        # under it when a table holds duplicates (m starts from the first fit's)
        estimated, why, counts = estimate_cardinality(rows, cols,
                                                      match_weights(model, levels, tf=tf)[0])
        chosen.update(cardinality=estimated, why=why, near_certain=counts)
        if estimated != first:
            model = fit_em(levels, n_levels, u, rows, cols, total_pairs=total,
                           lam=prior_matches(n_p, n_s, estimated) / total, m=model.m,
                           names=names, level_names=labels, cardinality=estimated)
    if not model.converged:
        log.warning("Fellegi–Sunter EM stopped after %d iterations without converging",
                    model.iterations)
    model.extra["tf_fields"] = [c.name for c, t in zip(comparators, tf, strict=True)
                                if t is not None]
    weights, contrib = match_weights(model, levels, tf=tf)
    if chosen["given"]:
        chosen["why"] = "given"
    # records with several near-certain counterparts under the final model: duplicates
    chosen["near_certain"] = near_certain_counts(rows, cols, weights)
    model.extra["cardinality"] = chosen
    return Scored(rows=rows, cols=cols, weights=weights,
                  probabilities=posterior(rows, cols, weights, chosen["cardinality"]),
                  contributions=contrib, levels=levels, model=model,
                  extra={"similarities": np.stack([s[0] for s in candidate_sims], axis=1
                                                  ).astype(np.float32),
                         "random_levels": random_levels})


def _term_frequencies(comparators: Sequence[FieldComparator],
                      codes: Sequence[tuple[IntArray, IntArray]], rows: IntArray
                      ) -> list[FloatArray | None]:
    """Per field, the agreeing value's frequency of each pair (None: not adjusted)."""
    tf: list[FloatArray | None] = []
    for comp, (cp, cs) in zip(comparators, codes, strict=True):
        if not comp.tf or frequency_skew(cp, cs) < TF_SKEW:
            tf.append(None)
            continue
        tf_p, _ = term_frequencies(cp, cs)
        # the agreeing value's frequency (on an exact agreement the two codes are equal)
        tf.append(np.asarray(tf_p[rows]))
    return tf
