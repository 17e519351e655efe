"""An empirical audit of the label protection (``vflink audit``): canaries in one run.

Steinke, Nasr & Jagielski's one-run audit (NeurIPS 2023; the maths in
:mod:`vflink.attacks.audit`) on the primary's labels: ``canaries`` records of the primary get
a label drawn by a fair coin (from the operating system's randomness unless a seed is given),
the run trains once with every party recording what it received, and the attacking secondary
scores each canary from its own recording only:

* black-box (default): ``label-epoch-average``, each record's rows over every epoch on the
  class-mean direction (:mod:`vflink.attacks.whitebox`);
* white-box (``white_box``): ``label-noise-subtraction``, the primary's noise regenerated from
  every seed the secondary received and small seeds tried.

The auditor knows every label but the canaries' (label DP protects one label given all the
others), and uses the non-canary records' labels only to tell which way the scores run and
where to cut them (the best balanced accuracy on them). It guesses the canaries whose scores
lie furthest from that cut, counts the correct guesses and reports the empirical ε
lower bound with its Clopper–Pearson interval beside the ε the ledger claims. The result goes
to ``audit.json`` in the run directory and, as an attack named ``label-audit``, into its
ledger (the report lists it).
"""

from __future__ import annotations

import logging
import math
import secrets
import shutil
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from vflink._files import atomic_write_json
from vflink.attacks import AttackResult
from vflink.attacks.audit import audit_guesses
from vflink.attacks.limits import gdp_mu
from vflink.attacks.whitebox import LabelEpochAverageAttack, LabelNoiseSubtraction
from vflink.data.table import PartyTable
from vflink.errors import ConfigError
from vflink.metrics.functional import auc, choose_threshold
from vflink.privacy.ledger import LEDGER_FILE, Ledger
from vflink.runfiles.config import EvaluationConfig, RunConfig
from vflink.runfiles.inputs import Inputs, load_inputs
from vflink.runner.attack import label_protection_in_force, load_view
from vflink.runner.train import run_training
from vflink.types import Task

__all__ = ["AUDIT_FILE", "canary_inputs", "run_audit"]

log = logging.getLogger(__name__)

AUDIT_FILE = "audit.json"


def canary_inputs(inputs: Inputs, canaries: int, rng: np.random.Generator
                  ) -> tuple[Inputs, npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """``inputs`` with ``canaries`` primary records' labels replaced by fair coin flips:
    (the new inputs, the canaries' primary rows, their bits)."""
    primary = inputs.primary
    schema = primary.schema
    if schema.label is None or schema.task is not Task.BINARY:
        raise ConfigError("the label audit needs a binary task at the primary (its canaries' "
                          "labels are fair coin flips)")
    n = len(primary)
    m = int(canaries)
    if not 2 <= m <= n // 2:
        raise ConfigError(f"`canaries` must be an int in [2, {n // 2}] (half the primary's "
                          f"{n} records: the others tell the auditor which way the scores "
                          f"run), got {canaries!r}")
    rows = np.sort(rng.choice(n, size=m, replace=False)).astype(np.int64)
    bits = rng.integers(0, 2, size=m).astype(np.int64)
    frame = primary.frame.copy()
    label = frame[schema.label]
    values = np.asarray(sorted(label.dropna().unique()))
    if len(values) != 2:
        raise ConfigError(f"the label audit needs two label values, got {len(values)}")
    col = label.to_numpy(copy=True)
    col[rows] = values[bits]
    frame[schema.label] = col
    table = PartyTable.from_frame(schema, frame, f"canaries({primary.source})")
    return Inputs(table, inputs.secondaries, inputs.truth, inputs.splits), rows, bits


def _secondary_rows(inputs: Inputs, party: str, primary_rows: npt.NDArray[np.int64]
                    ) -> npt.NDArray[np.int64]:
    """The secondary ``party``'s row holding the same exact key as each primary row (-1 when
    none, or when its key is not unique there)."""
    sec = next((t for t in inputs.secondaries if t.name == party), None)
    p_key, s_key = inputs.primary.schema.key, sec.schema.key if sec is not None else ()
    if sec is None or not p_key or len(p_key) != len(s_key):
        raise ConfigError("the label audit links its canaries by the exact key: it needs "
                          "alignment.method = \"exact\" and both parties' tables")
    left = inputs.primary.frame[list(p_key)].astype(str).agg("\x1f".join, axis=1)
    right = sec.frame[list(s_key)].astype(str).agg("\x1f".join, axis=1)
    counts = right.value_counts()
    where = {k: i for i, k in enumerate(right.tolist()) if counts[k] == 1}
    keys = left.iloc[primary_rows].tolist()
    return np.asarray([where.get(k, -1) for k in keys], dtype=np.int64)


def run_audit(config: RunConfig, *, canaries: int = 1000, white_box: bool = False,
              out: Path | None = None, tables: Inputs | None = None,
              confidence: float = 0.95, seed: int | None = None, overwrite: bool = False,
              party: str | None = None, attack_params: dict[str, Any] | None = None
              ) -> dict[str, Any]:
    """Train ``config`` once with ``canaries`` random-label canaries, audit its label
    protection from the attacking secondary's recording (module docstring) and return the
    figures; with ``out``, the run directory stays there with ``audit.json`` and the audit in
    its ledger. ``seed`` fixes the canaries (default: the operating system's randomness)."""
    if config.alignment.method != "exact":
        raise ConfigError("the label audit links its canaries by the exact key: set "
                          "alignment.method = \"exact\"")
    if not (isinstance(confidence, float) and 0.5 <= confidence < 1.0):
        raise ConfigError(f"`confidence` must be a number in [0.5, 1), got {confidence!r}")
    rng = np.random.default_rng(secrets.randbits(128) if seed is None else seed)
    inputs = tables if tables is not None else load_inputs(config)
    audited, rows, bits = canary_inputs(inputs, canaries, rng)
    # every batch of every epoch kept: the averaging attack reads them all
    keep = max(config.evaluation.record_rows,
               4 * len(audited.primary) * config.training.epochs)
    run_config = config.replace(evaluation=EvaluationConfig(record=True, record_rows=keep))
    scratch = None
    if out is None:
        scratch = Path(tempfile.mkdtemp(prefix="vflink-audit-"))
        out = scratch / "run"
    try:
        run_training(run_config, out, tables=audited, overwrite=overwrite)
        figures = _audit_run(Path(out), audited, rows, bits, white_box=white_box,
                             confidence=confidence, party=party,
                             attack_params=attack_params or {})
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
    return figures


def _audit_run(run_dir: Path, inputs: Inputs, rows: npt.NDArray[np.int64],
               bits: npt.NDArray[np.int64], *, white_box: bool, confidence: float,
               party: str | None, attack_params: dict[str, Any]) -> dict[str, Any]:
    view = load_view(run_dir, "secondary", party)
    attack = (LabelNoiseSubtraction(**attack_params) if white_box
              else LabelEpochAverageAttack(**attack_params))
    ids, scores, _, details = attack.record_scores(view)
    sec_rows = _secondary_rows(inputs, view.party, rows)
    position = {int(r): i for i, r in enumerate(ids.tolist())}
    trained = np.asarray([position.get(int(r), -1) for r in sec_rows], dtype=np.int64)
    seen = trained >= 0
    if seen.sum() < 2:
        raise ConfigError(f"only {int(seen.sum())} canaries were trained on and recorded by "
                          f"party {view.party!r}: give more canaries")
    # which way the scores run, from the records whose labels the auditor may use
    canary_ids = set(sec_rows[seen].tolist())
    labels = _labels_by_row(inputs, view.party)
    others = np.asarray([i for i, r in enumerate(ids.tolist())
                         if r not in canary_ids and r in labels], dtype=np.int64)
    y_others = np.asarray([labels[int(ids[i])] for i in others], dtype=np.int64)
    s = scores[trained[seen]]
    flipped, threshold = False, None
    if len(np.unique(y_others)) == 2:
        # which way the scores run and where to cut them, from the other records' labels
        # (label DP protects one label given every other)
        flipped = auc(y_others, scores[others]) < 0.5
        sign = -1.0 if flipped else 1.0
        threshold = choose_threshold(y_others, sign * scores[others], "balanced-accuracy")
        s = sign * s
    fig = audit_guesses(s, bits[seen], delta=_delta(run_dir), confidence=confidence,
                        threshold=threshold)
    ledger_path = run_dir / LEDGER_FILE
    ledger = Ledger.read(ledger_path)
    entry = label_protection_in_force(ledger)
    mode = "off" if entry is None else str(entry["kind"]).removeprefix("label-")
    g = (entry or {}).get("guarantee") or {}
    claimed = g.get("epsilon") if mode in ("dp", "rr-prior") else None
    claimed = float(claimed) if isinstance(claimed, (int, float)) else None
    holds = claimed is not None and fig.epsilon_lower <= claimed
    mu = None
    if mode == "dp" and isinstance(g.get("releases_of_worst_record"), list):
        mu = gdp_mu((float(a), int(b)) for a, b in g["releases_of_worst_record"])
    figures: dict[str, Any] = {
        "attack": attack.name, "white_box": white_box, "party": view.party, "mode": mode,
        "canaries": int(len(rows)), "canaries_trained": int(seen.sum()),
        "epsilon_claimed": claimed, "delta": _delta(run_dir),
        **{k: v for k, v in asdict(fig).items() if k != "canaries"},
        "scores_flipped": bool(flipped), "threshold": threshold, "gaussian_mu": mu,
        "holds": holds if claimed is not None else None,
        "attack_details": {k: v for k, v in details.items() if k != "received_seeds"}}
    figures["explanation"] = _explain(figures)
    figures = _plain(figures)
    atomic_write_json(run_dir / AUDIT_FILE, figures, indent=2)
    result = AttackResult(
        attack="label-audit", party=view.party,
        metrics={"epsilon_lower": fig.epsilon_lower,
                 **({} if claimed is None else {"epsilon_claimed": claimed}),
                 "accuracy": fig.accuracy, "guesses": float(fig.guesses),
                 "correct": float(fig.correct), "canaries": float(seen.sum())},
        explanation=figures["explanation"],
        params={"white_box": white_box, "confidence": confidence},
        details={"reference": "Steinke, Nasr & Jagielski, NeurIPS 2023 (one run, many "
                              "canaries); Clopper–Pearson interval",
                 "protection": {"mode": mode, "within_limit": bool(holds) if claimed
                                is not None else fig.epsilon_lower == 0.0,
                                "limit": claimed, "leak": fig.epsilon_lower,
                                "limit_words": "the claimed ε" if claimed is not None
                                else "no ε claimed"}})
    ledger.add_attack(result.to_json())
    ledger.write(ledger_path)
    log.info("%s", figures["explanation"])
    return figures


def _labels_by_row(inputs: Inputs, party: str) -> dict[int, int]:
    """Each secondary row's label (from the primary's table, by the exact key)."""
    primary = inputs.primary
    label = primary.schema.label or ""
    values = np.asarray(sorted(primary.frame[label].dropna().unique()))
    rows = np.arange(len(primary), dtype=np.int64)
    sec = _secondary_rows(inputs, party, rows)
    y = np.searchsorted(values, primary.frame[label].to_numpy())
    return {int(s): int(v) for s, v in zip(sec.tolist(), y.tolist(), strict=True) if s >= 0}


def _delta(run_dir: Path) -> float:
    entry = label_protection_in_force(Ledger.read(run_dir / LEDGER_FILE))
    g = (entry or {}).get("guarantee") or {}
    value = g.get("delta")
    return float(value) if isinstance(value, (int, float)) else 0.0


def _explain(f: dict[str, Any]) -> str:
    lo, hi = f["epsilon_interval"]
    base = (f"{f['correct']} of {f['guesses']} guesses right on {f['canaries_trained']} "
            f"canaries ({f['accuracy']:.1%}, Clopper–Pearson {f['confidence']:.0%}: "
            f"{f['accuracy_interval'][0]:.1%}–{f['accuracy_interval'][1]:.1%}, read as ε "
            f"{max(lo, 0.0):.2f}–{hi:.2f}) by {f['attack']}: empirical ε ≥ "
            f"{f['epsilon_lower']:.2f} at {f['confidence']:.0%} confidence")
    if f["epsilon_claimed"] is None:
        return base + f"; labels = {f['mode']} claims no ε"
    verdict = ("within the claim" if f["holds"] else "ABOVE the claim: the claimed ε is false "
               "against this attacker")
    return base + f", against a claimed ε = {f['epsilon_claimed']:.3g}: {verdict}"


def _plain(value: Any) -> Any:
    """JSON-ready: numpy scalars as Python numbers, an infinite bound as null."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (np.floating, np.integer)):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
