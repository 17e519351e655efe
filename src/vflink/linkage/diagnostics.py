"""The conditions a label-free estimate rests on, checked on the data the coordinator holds.

A Fellegi–Sunter model's precision, recall and F1 without labels (:mod:`.decisions`) are only
as good as its assumptions (Winkler 1994 and Belin & Rubin 1995 on when EM's error rates can be
trusted; Enamorado, Fifield & Imai 2019 and Sadinle 2017 on estimating them): every field
compares like with like, the blocking rules find the matches, and the model fits. Each check
below is computed on what the coordinator already holds for the link (keyed Bloom filters,
keyed exact-agreement hashes, blocking digests, and the model's levels and posteriors), and
names what fails:

* :func:`field_separation`: a field whose agreement is no more frequent among the likely
  matches (posterior-weighted candidate pairs) than among random pairs adds nothing, and often
  means its two columns do not hold the same thing (FEBRL's given name paired with the
  surname: 2 % exact agreement among likely matches, 0.6 % among random pairs).
* :func:`swap_check`: a field whose primary column agrees better with *another* field's
  secondary column. Model-free: on the values' codes (equal codes = equal keyed Bloom filters,
  i.e. equal q-gram sets, or equal raw strings with privacy off), the record pairs that agree
  on two fields as paired are counted against those that agree on them crossed (f↔g), and,
  for each third field h, pairs agreeing on h and on f as paired against f crossed with g.
  *What it needs*: string and date fields are encoded under one key and one configuration, so
  the coordinator can already compare field i of the primary with field j of the secondary;
  nothing more is sent. (That cross-field comparability is a property of the encodings it
  holds, documented in docs/how-to/linkage.md; the check reveals no value.)
* :func:`blocking_recall`: the share of the true matches the OR-ed blocking rules can find,
  under the model's own assumption (fields independent given the match status): each field's
  exact agreement among the matches, P(E_f), is estimated on the candidate pairs found by rules
  that do not involve f (so a match's f is free to disagree there), and the rules' capture
  probability P(∪_r ∩_{f∈r} E_f) follows by enumerating the fields' agreement patterns. A
  rule that is not made of whole fields (a prefix, a column that is no field) is one event of
  its own, estimated on the pairs of the rules that share none of its columns. When every rule
  involves a column, how many matches disagree on it cannot be seen: the recall is then not
  estimated, and the reason says which column. Rules with no or few comparisons are named.
* :func:`fit_checks`: EM that did not converge, too few expected matches, or posterior mass
  that sits between 0.2 and 0.8 (the decisions then hinge on a calibration nothing checks):
  the estimate is then not given, only the reason.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["FEW_COMPARISONS", "blocking_recall", "capture_matrix", "cross_codes",
           "field_separation", "finite", "fit_checks", "name_fields", "swap_check",
           "uncertain_mass"]

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]

#: A field separates likely matches from random pairs when the total-variation distance of its
#: level distributions among them is at least this.
SEPARATION_MIN = 0.1
#: A blocking rule makes few comparisons below this share of the smaller table's records.
FEW_COMPARISONS = 0.01
#: Expected matches below this: no estimate.
MIN_EXPECTED = 10.0
#: Posterior mass between 0.2 and 0.8 above this share of the expected matches: no estimate.
UNCERTAIN_MAX = 0.15
#: Share of the expected matches on each record's K-th nearest candidate (a link without
#: blocking rules) up to which the matches beyond the K nearest are taken as none.
LAST_RANK_MAX = 0.001
#: Most agreement events enumerated exactly (2^k patterns) for the blocking recall.
_MAX_EVENTS = 18


def field_separation(levels: npt.NDArray[np.int8], random_levels: npt.NDArray[np.int8],
                     q: FloatArray, n_levels: Sequence[int], names: Sequence[str]
                     ) -> list[dict[str, Any]]:
    """Per field: the level distributions among the likely matches (candidate pairs weighted
    by their posterior q) and among random pairs, where the field is present on both sides;
    their total-variation distance (``separation``), the share agreeing at the field's top two
    levels in each (``agree_matches``, ``agree_random``), and ``separates`` (distance ≥
    :data:`SEPARATION_MIN` and more agreement among the matches than among random pairs)."""
    out: list[dict[str, Any]] = []
    qq = np.asarray(q, dtype=np.float64)
    for f, n in enumerate(n_levels):
        col, rnd = levels[:, f].astype(np.int64), random_levels[:, f].astype(np.int64)
        here, r_here = col >= 0, rnd >= 0
        mass = np.bincount(col[here], weights=qq[here], minlength=n)[:n]
        seen = np.bincount(rnd[r_here], minlength=n)[:n].astype(np.float64)
        if mass.sum() <= 0 or seen.sum() <= 0:
            out.append({"field": names[f], "separation": None, "separates": None})
            continue
        pm, pr = mass / mass.sum(), seen / seen.sum()
        top = slice(max(0, n - 2), n)
        agree_m, agree_r = float(pm[top].sum()), float(pr[top].sum())
        tv = 0.5 * float(np.abs(pm - pr).sum())
        out.append({"field": names[f], "separation": tv, "agree_matches": agree_m,
                    "agree_random": agree_r,
                    "separates": bool(tv >= SEPARATION_MIN and agree_m > agree_r)})
    return out


def _count_equal(keys_p: npt.NDArray[Any], keys_s: npt.NDArray[Any]) -> int:
    """Pairs (i, j) with keys_p[i] == keys_s[j] (rows of integer codes, −1 anywhere: no key)."""
    ok_p = (keys_p >= 0).all(axis=1)
    ok_s = (keys_s >= 0).all(axis=1)
    a, b = keys_p[ok_p].astype(np.int64), keys_s[ok_s].astype(np.int64)
    if not len(a) or not len(b):
        return 0
    both = np.concatenate([a, b])
    # one int64 per row (codes are below the rows' count, < 2^31): a 1-D unique, far faster
    # than np.unique over rows
    flat = both[:, 0].copy()
    for col in range(1, both.shape[1]):
        _, flat = np.unique(flat * (int(both[:, col].max()) + 1) + both[:, col],
                            return_inverse=True)
        flat = flat.ravel().astype(np.int64)
    _, inverse = np.unique(flat, return_inverse=True)
    inverse = inverse.ravel()
    n_codes = int(inverse.max()) + 1
    cp = np.bincount(inverse[:len(a)], minlength=n_codes)
    cs = np.bincount(inverse[len(a):], minlength=n_codes)
    return int((cp.astype(np.int64) * cs.astype(np.int64)).sum())


def swap_check(cross: Sequence[tuple[IntArray, IntArray] | None],
               exact: Sequence[tuple[IntArray, IntArray]], names: Sequence[str], *,
               n_records: int) -> list[dict[str, Any]]:
    """Fields whose primary column agrees better with another field's secondary column
    (module docstring). ``cross[f]``: field f's value codes on each side in a code space
    shared by the fields it can be compared with (None: comparable with none); ``exact[f]``:
    its exact-agreement codes (the anchors). A finding needs at least max(10, 1 % of
    ``n_records``) agreeing pairs and twice those of the fields as paired."""
    least = max(10, int(0.01 * n_records))
    comparable = [f for f, c in enumerate(cross) if c is not None]
    found: list[dict[str, Any]] = []
    flagged: set[tuple[int, int]] = set()
    for f, g in itertools.combinations(comparable, 2):
        cf, cg = cross[f], cross[g]
        if cf is None or cg is None:
            continue
        as_paired = _count_equal(np.stack([cf[0], cg[0]], 1), np.stack([cf[1], cg[1]], 1))
        crossed = _count_equal(np.stack([cf[0], cg[0]], 1), np.stack([cg[1], cf[1]], 1))
        if crossed >= least and crossed > 2 * as_paired:
            flagged.add((f, g))
            found.append({"fields": [names[f], names[g]], "as_paired": as_paired,
                          "crossed": crossed,
                          "text": f"fields {names[f]} and {names[g]} look swapped: {crossed:,} "
                                  f"record pairs agree exactly with the primary's "
                                  f"{names[f]} against the secondary's {names[g]} and the "
                                  f"primary's {names[g]} against the secondary's {names[f]}, "
                                  f"against {as_paired:,} with the fields as paired; check "
                                  f"their columns (`on` / `secondary_on`)"})
    for f in comparable:
        for g in comparable:
            if f == g or (min(f, g), max(f, g)) in flagged:
                continue
            cf, cg = cross[f], cross[g]
            if cf is None or cg is None:
                continue
            cur = alt = 0
            for h in range(len(exact)):
                if h in (f, g):
                    continue
                hp, hs = exact[h]
                cur += _count_equal(np.stack([hp, cf[0]], 1), np.stack([hs, cf[1]], 1))
                alt += _count_equal(np.stack([hp, cf[0]], 1), np.stack([hs, cg[1]], 1))
            if alt >= least and alt > 2 * cur:
                found.append({"fields": [names[f], names[g]], "as_paired": cur,
                              "crossed": alt,
                              "text": f"field {names[f]}: the primary's column agrees better "
                                      f"with the secondary's column of field {names[g]} "
                                      f"({alt:,} record pairs agreeing on another field "
                                      f"and on these, against {cur:,} as paired); check its "
                                      f"`secondary_on`"})
    return found


def capture_matrix(keys: Sequence[tuple[IntArray, IntArray]], rows: IntArray, cols: IntArray
                   ) -> BoolArray:
    """``(pairs, rules)``: whether each candidate pair shares rule r's key (codes ≥ 0)."""
    out = np.zeros((len(rows), len(keys)), dtype=bool)
    for r, (kp, ks) in enumerate(keys):
        a, b = kp[rows], ks[cols]
        out[:, r] = (a == b) & (a >= 0)
    return out


def blocking_recall(rule_atoms: Sequence[Sequence[int]], captured: BoolArray,
                    agree: Sequence[BoolArray], q: FloatArray) -> dict[str, Any]:
    """The share of the matches the OR-ed rules can find (module docstring).

    ``rule_atoms[r]``: what rule r requires, per column: a field index ≥ 0 (the rule agrees
    exactly when that field's normalised value does), or a negative number for a column that
    is no whole field (the rule is then an event of its own, ``rule<r>``); ``captured``
    (:func:`capture_matrix`); ``agree[f]``: field f's exact agreement on each candidate pair;
    ``q``: the posteriors. Returns ``recall`` (None when it cannot be estimated, with
    ``reason``), and per event its estimated share of matches agreeing and the mass it was
    estimated on.
    """
    qq = np.asarray(q, dtype=np.float64)
    rules = [tuple(a) for a in rule_atoms]
    if not rules:
        return {"recall": 1.0, "reason": "no blocking rules: every pair is compared"}
    # events: a whole field, or a rule with a column that is no field (its own event)
    events: list[tuple[str, Any]] = []
    rule_events: list[list[int]] = []
    for r, atoms in enumerate(rules):
        if all(a >= 0 for a in atoms):
            ids = []
            for a in atoms:
                if ("field", a) not in events:
                    events.append(("field", a))
                ids.append(events.index(("field", a)))
            rule_events.append(ids)
        else:
            events.append(("rule", r))
            rule_events.append([len(events) - 1])
    if len(events) > _MAX_EVENTS:
        return {"recall": None, "reason": f"{len(events)} blocking columns are too many to "
                                          f"enumerate (at most {_MAX_EVENTS})"}

    def label(e: tuple[str, Any]) -> str:
        kind, x = e
        return f"field{x}" if kind == "field" else f"the key of rule{x}"

    estimates = []
    for e in events:
        kind, x = e
        involved = set(rules[x]) if kind == "rule" else {x}
        free = [r for r, atoms in enumerate(rules) if not involved & set(atoms)]
        ref = captured[:, free].any(axis=1) if free else np.zeros(len(qq), dtype=bool)
        mass = float(qq[ref].sum())
        if mass < MIN_EXPECTED:
            why = (f"every blocking rule requires {label(e)} to agree, so the true matches "
                   f"that disagree on it cannot be seen among the candidates" if not free else
                   f"the rules that do not involve {label(e)} find only {mass:.1f} expected "
                   f"matches, too few to tell how often true matches disagree on it")
            return {"recall": None, "event": label(e),
                    "reason": f"the blocking rules' recall cannot be estimated: {why}; add a "
                              f"rule that does not involve it"}
        hit = agree[x][ref] if kind == "field" else captured[ref, x]
        estimates.append({"event": label(e), "agree": float(qq[ref][hit].sum() / mass),
                          "estimated_on": mass})
    p = np.asarray([est["agree"] for est in estimates])
    k = len(events)
    patterns = (np.arange(2 ** k, dtype=np.int64)[:, None] >> np.arange(k)) & 1
    prob = np.prod(np.where(patterns == 1, p, 1.0 - p), axis=1)
    caught = np.zeros(len(patterns), dtype=bool)
    for ids in rule_events:
        caught |= patterns[:, ids].all(axis=1).astype(bool)
    recall = float(prob[caught].sum())
    return {"recall": recall, "events": estimates}


def uncertain_mass(q: FloatArray) -> float:
    """The share of Σ q carried by pairs whose posterior is between 0.2 and 0.8."""
    qq = np.asarray(q, dtype=np.float64)
    total = float(qq.sum())
    if total <= 0:
        return 0.0
    mid = (qq >= 0.2) & (qq <= 0.8)
    return float(qq[mid].sum() / total)


def fit_checks(*, converged: bool, iterations: int, q: FloatArray) -> list[str]:
    """Why the model's fit cannot carry an estimate (empty: none found)."""
    out = []
    expected = float(np.asarray(q).sum())
    if not converged:
        out.append(f"the EM did not converge in {iterations} iterations")
    if expected < MIN_EXPECTED:
        out.append(f"the model expects only {expected:.1f} matches among the candidates")
    share = uncertain_mass(q)
    if share > UNCERTAIN_MAX:
        out.append(f"{share:.0%} of the expected matches sit on pairs whose match probability "
                   f"is between 0.2 and 0.8 (at most {UNCERTAIN_MAX:.0%} for a trusted "
                   f"estimate): the model does not separate matches from non-matches there")
    return out


_FIELD = re.compile(r"\b(?:field|rule)(\d+)\b")


def name_fields(value: Any, names: dict[str, str]) -> Any:
    """``value`` (texts, lists and dicts of them) with each ``field<i>`` and ``rule<r>``
    replaced by its name in ``names``."""
    if isinstance(value, str):
        return _FIELD.sub(lambda m: names.get(m.group(0), m.group(0)), value)
    if isinstance(value, list):
        return [name_fields(v, names) for v in value]
    if isinstance(value, dict):
        return {k: name_fields(v, names) for k, v in value.items()}
    return value


def finite(x: float | None) -> float | None:
    """``x`` when it is a finite number, else None."""
    return x if x is not None and math.isfinite(x) else None


def cross_codes(fields: Sequence[tuple[str, str, Any, Any]], kinds: Sequence[str]
                ) -> list[tuple[IntArray, IntArray] | None]:
    """Per field, its values' codes on each side in a code space shared with the fields it
    can be compared with (:func:`swap_check`): string or date fields of one encoder (keyed
    Bloom filters of one width, or raw strings); equal codes = equal filters or strings;
    −1 = missing. None for a field comparable with no other."""
    classes: dict[tuple[Any, ...], list[int]] = {}
    for f, ((enc, _, a, _b), kind) in enumerate(zip(fields, kinds, strict=True)):
        if kind not in ("string", "date") or enc not in ("bloom", "string"):
            continue
        width = np.asarray(a).shape[1] if enc == "bloom" else 0
        classes.setdefault((enc, kind, width), []).append(f)
    out: list[tuple[IntArray, IntArray] | None] = [None] * len(fields)
    for (enc, _, _), members in classes.items():
        if len(members) < 2:
            continue
        parts = [v for f in members for v in (fields[f][2], fields[f][3])]
        sizes = [len(v) for v in parts]
        if enc == "bloom":
            both = np.ascontiguousarray(np.concatenate([np.asarray(v) for v in parts]))
            missing = ~both.any(axis=1)
            keys = both.view(np.dtype((np.void, both.shape[1]))).ravel()
        else:
            texts = np.asarray([t for v in parts for t in v], dtype=object)
            missing = np.asarray([not t for t in texts], dtype=bool)
            keys = texts.astype(str)
        _, inverse = np.unique(keys, return_inverse=True)
        codes = inverse.astype(np.int64).ravel()
        codes[missing] = -1
        bounds = np.cumsum([0, *sizes])
        for k, f in enumerate(members):
            out[f] = (codes[bounds[2 * k]:bounds[2 * k + 1]],
                      codes[bounds[2 * k + 1]:bounds[2 * k + 2]])
    return out
