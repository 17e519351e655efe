"""Predictions for new primary records with a trained run (FedSim inference).

The new records are linked to the secondaries' data exactly as in training (keyed hashes, or
top-K soft linkage through a coordinator with the same metric, K and noise); every party loads
its own saved model from the run directory; the secondaries return embeddings of the linked rows
and the primary predicts.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from vflink._files import check_directory, read_json_file
from vflink._typed import typed
from vflink.data.table import PartyTable, missing_columns
from vflink.errors import ConfigError, DataError, RunError
from vflink.metrics.functional import evaluate
from vflink.parties import PrimaryParty, SecondaryParty
from vflink.protocol import EncodingSpec
from vflink.reporting.link_quality import link_columns, read_link_quality
from vflink.runfiles.algorithms import get_algorithm
from vflink.runfiles.config import RunConfig, parse_config
from vflink.runfiles.inputs import Inputs, load_inputs
from vflink.runfiles.results import METRICS_SCHEMA
from vflink.runner.federation import local_roles, run_policy
from vflink.runner.prepare import prepare
from vflink.transport import InProcessHub
from vflink.types import Task

__all__ = ["Predictions", "decision_threshold", "load_run_config", "predict_records"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Predictions:
    """Per-row predictions with their link columns; metrics if labels were given; warnings
    (e.g. how many rows were linked worse than nearly every training row)."""

    frame: pd.DataFrame
    metrics: dict[str, float] | None
    warnings: tuple[str, ...] = ()


def decision_threshold(run_dir: Path) -> float:
    """A binary run's decision threshold on P(positive), as training chose it on the
    validation split (``metrics.json`` ``decision``); 0.5 for a run written before."""
    raw = read_json_file(run_dir, "metrics.json", error=RunError)
    decision = raw.get("decision") if isinstance(raw, dict) else None
    if decision is None:
        return 0.5
    value = decision.get("threshold") if isinstance(decision, dict) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1:
        raise RunError(f"{Path(run_dir) / 'metrics.json'}: `decision.threshold` must be a "
                       f"probability in (0, 1), got {value!r}")
    return float(value)


def load_run_config(run_dir: Path) -> RunConfig:
    check_directory(run_dir, "a run directory (vflink train --out)", error=RunError)
    path = run_dir / "config.json"
    if not os.path.lexists(path):
        raise RunError(f"{run_dir}: not a run directory (no config.json); train one with "
                       "`vflink train`")
    raw = read_json_file(run_dir, "config.json", error=RunError)
    if not isinstance(raw, dict):
        raise RunError(f"{path}: expected a JSON object (a run's configuration)")
    return parse_config(raw)


def _training_alignment(run_dir: Path) -> dict[str, Any]:
    path = run_dir / "metrics.json"
    if not os.path.lexists(path):
        raise RunError(f"{run_dir}: no metrics.json; is the run complete?")
    raw = typed(read_json_file(run_dir, "metrics.json", error=RunError), METRICS_SCHEMA,
                source=str(path), error=RunError)
    alignment = raw.get("alignment", {}) if isinstance(raw, dict) else None
    if not isinstance(alignment, dict):
        raise RunError(f"{path}: expected a JSON object with an \"alignment\" object")
    return dict(alignment)


def _spec(raw: dict[str, Any]) -> EncodingSpec:
    fields = {**raw, **{k: tuple(raw.get(k, ())) for k in ("low", "high", "mean", "scale")}}
    return EncodingSpec(**fields)


def _training_encoding(trained_link: dict[str, Any]
                       ) -> EncodingSpec | tuple[EncodingSpec, ...] | None:
    """The identifier encoding of the training linkage (a Bloom filter's centres come from the
    training identifiers' range; new records must be encoded the same way), one per field
    for a multi-field linkage."""
    per_field = trained_link.get("field_encoding_specs")
    if isinstance(per_field, list) and all(isinstance(r, dict) for r in per_field):
        return tuple(_spec(r) for r in per_field)
    raw = trained_link.get("encoding_spec")
    if not isinstance(raw, dict):
        return None  # a run written before it was recorded: refit on the new records
    return _spec(raw)


def predict_records(run_dir: Path, records: pd.DataFrame, *, source: str = "input",
                    tables: Inputs | None = None) -> Predictions:
    """Predict ``records`` (rows in the primary's schema, label optional) with ``run_dir``.

    ``tables``: the parties' tables of the training run, when they are not the files its
    configuration names (a run trained on in-memory tables, :func:`vflink.train`)."""
    run_dir = Path(run_dir)
    config = load_run_config(run_dir)
    algorithm = get_algorithm(config.algorithm)
    if algorithm.kind == "combine":
        raise ConfigError("a Combine run is a centralised research baseline; it has no "
                          "party-wise model to predict with")
    trained = tables if tables is not None else load_inputs(config)
    schema = trained.primary.schema
    label = schema.label
    has_label = label is not None and label in records.columns
    # The label is optional here: name only the columns the model needs.
    needed = [c for c in schema.columns if c != label]
    missing = [c for c in needed if c not in records.columns]
    if missing:
        note = f" (the label {label!r} is optional)" if label is not None else ""
        raise DataError(f"{source} (party {schema.name!r}): "
                        f"{missing_columns(records, missing)}{note}")
    frame = records.reset_index(drop=True).copy()
    if not has_label and label is not None:
        # the model does not read the label; a placeholder keeps the table valid
        frame[label] = (trained.primary.frame[label].iloc[0] if schema.task is not Task.REGRESSION
                        else 0.0)
    new_primary = PartyTable.from_frame(schema, frame, source, training=False)
    secondaries = trained.secondaries if algorithm.kind == "vfl" else ()
    inputs = Inputs(new_primary, secondaries)
    models = run_dir / "models"
    if algorithm.kind == "vfl":
        # Keep every record (a new record without a link still gets a prediction) and link
        # with the training linkage's noise σ and Eq. 1 scale (μ0, σ0), so that similarities
        # mean what they meant in training.
        trained_link = _training_alignment(run_dir)
        changes: dict[str, Any] = {"unmatched": "keep"}
        scale = None
        encoding = None
        if config.alignment.method == "soft":
            changes.update(tau=None, sigma=float(trained_link.get("sigma") or 0.0))
            scale = (float(trained_link["mu0"]), float(trained_link["sigma0"]))
            encoding = _training_encoding(trained_link)
        config = config.replace(alignment=dataclasses.replace(config.alignment, **changes))
        prepared = prepare(config, inputs, algorithms=[algorithm.name], scale=scale,
                           encoding=encoding)
        alignments = prepared.alignments[algorithm.links]
    hub = InProcessHub()
    roles = local_roles(new_primary.name, [t.name for t in secondaries])
    for table in secondaries:
        party = SecondaryParty(table, hub.channel(table.name), out_dir=models / table.name,
                               roles=roles, policy=run_policy(config),
                               resources=config.training.resources(), peer_dirs=False)
        party.set_linked_rows(alignments[table.name].secondary_index, peer=new_primary.name)
        hub.register(table.name, party)
    primary = PrimaryParty(new_primary, hub.channel(new_primary.name),
                           secondaries=tuple(t.name for t in secondaries),
                           out_dir=models / new_primary.name,
                           resources=config.training.resources())
    if secondaries:
        primary.set_alignments(alignments)
    primary.load_states()
    rows = np.arange(len(new_primary), dtype=np.int64)
    scores = primary.predict_scores(rows)
    out = pd.DataFrame({"row": rows})
    task = primary.task
    if task is Task.REGRESSION:
        out["prediction"] = scores
    elif task is Task.BINARY:
        classes = primary.codec.classes
        out["probability"] = scores
        cut = decision_threshold(run_dir)  # the one chosen on validation in training
        out["prediction"] = pd.Series([classes[int(p >= cut)] for p in scores], dtype=object)
    else:
        classes = primary.codec.classes
        for j, c in enumerate(classes):
            out[f"probability_{c}"] = scores[:, j]
        out["prediction"] = pd.Series([classes[int(i)] for i in scores.argmax(axis=1)],
                                      dtype=object)
    warnings: list[str] = []
    if secondaries:
        links, warnings = link_columns(
            config.alignment.method, prepared.alignments["base"],
            tuple(t.name for t in secondaries), len(rows), read_link_quality(run_dir),
            exact=alignments if algorithm.links == "exact" else None)
        out = pd.concat([out, links], axis=1)
        for text in warnings:
            log.warning("%s", text)
    metrics = None
    if has_label:
        metrics = evaluate(task, primary.targets(rows), scores)
    return Predictions(out, metrics, tuple(warnings))
