"""Evaluation-only outputs of a run: ground truth for attacks, the figures of a soft linkage
that the report draws, and the registry of a run's evaluations (``EVALUATIONS``: each adds its
part of ``RunResult.extra``; the training plans list theirs, :mod:`vflink.runner.plans`).

Ground truth (``RUN_DIR/evaluation/truth.npz`` + ``truth.json``) is what an attack is *scored*
against, never something a party had during the run: the labels behind the gradients a
secondary received, the true Hamming distances behind the similarities the primary received,
the secondary's Bloom filters, and the dataset's true matches where the dataset has them. It is
written by the runner, which in a simulation holds every table; across hosts the primary's
runner writes only what the primary itself can know (its labels per linked row).

The primary's own Bloom filters (its own data, which a greedy attacker uses) go to the primary's
own state directory (``models/<primary>/evaluation/own_encodings.npz``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from vflink._files import atomic_open, atomic_write_json
from vflink._typed import Obj, load_arrays, read_typed_json
from vflink.parties.linking import encode_identifiers
from vflink.parties.recording import RECORDING_DIR
from vflink.registry import Registry
from vflink.runfiles.config import RunConfig
from vflink.types import MISSING, Alignment

if TYPE_CHECKING:
    from vflink.parties import PrimaryParty
    from vflink.runner.context import Prepared, RunContext

__all__ = ["EVALUATIONS", "OWN_ENCODINGS", "TRUTH_DIR", "Evaluation", "linkage_figures",
           "read_truth", "save_truth", "write_truth"]

log = logging.getLogger(__name__)

TRUTH_DIR = "evaluation"
TRUTH_VERSION = 1
OWN_ENCODINGS = "own_encodings.npz"

#: ``evaluation(ctx) -> dict`` merged into ``RunResult.extra`` (in the plan's order)
Evaluation = Callable[["RunContext"], dict[str, Any]]
EVALUATIONS: Registry[Evaluation] = Registry("evaluation")


def _save_npz(path: Path, arrays: dict[str, npt.NDArray[Any]]) -> None:
    with atomic_open(path, "wb") as fh:
        np.savez_compressed(fh, **arrays)  # type: ignore[arg-type]


def _labels_by_secondary_row(alignment: Alignment, labels: npt.NDArray[Any], n_primary: int
                             ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """(secondary rows, label) for rows whose linked primary records all share one label."""
    dense = alignment.for_primary_rows(n_primary)
    prim = np.repeat(np.arange(n_primary), dense.shape[1])
    sec = dense.ravel()
    keep = sec != MISSING
    prim, sec = prim[keep], sec[keep]
    y = np.asarray(labels, dtype=np.int64)[prim]
    order = np.argsort(sec, kind="stable")
    sec, y = sec[order], y[order]
    rows, start = np.unique(sec, return_index=True)
    lo = np.minimum.reduceat(y, start) if len(y) else y
    hi = np.maximum.reduceat(y, start) if len(y) else y
    agree = lo == hi
    return rows[agree].astype(np.int64), lo[agree].astype(np.int64)


def _hamming(a: npt.NDArray[np.uint8], b: npt.NDArray[np.uint8]) -> npt.NDArray[np.int64]:
    return np.unpackbits(np.bitwise_xor(a, b), axis=-1).sum(axis=-1).astype(np.int64)


def write_truth(run_dir: Path, config: RunConfig, prepared: Prepared, primary: PrimaryParty,
                links: str, secret: bytes | None) -> Path:
    """Write ``run_dir/evaluation/truth.{npz,json}`` (evaluation-only) for a recorded run."""
    inputs = prepared.inputs
    n = len(inputs.primary)
    arrays: dict[str, npt.NDArray[Any]] = {}
    parties: dict[str, dict[str, Any]] = {}
    alignments = prepared.alignments.get(links, {})
    task = inputs.primary.schema.task
    if task is not None and task.is_classification and primary.model is not None:
        labels = primary.targets(np.arange(n))
        for name, alignment in alignments.items():
            rows, values = _labels_by_secondary_row(alignment, labels, n)
            arrays[f"labels__{name}__rows"] = rows
            arrays[f"labels__{name}__values"] = values
            parties.setdefault(name, {})["labels"] = int(len(rows))
    if inputs.truth is not None:
        for name, idx in inputs.truth.items():
            arrays[f"true_match__{name}"] = np.asarray(idx, dtype=np.int64)
            parties.setdefault(name, {})["true_match"] = True
    bloom = _bloom_truth(config, prepared, alignments, secret, arrays, run_dir, primary)
    return save_truth(run_dir, arrays, task=None if task is None else task.value,
                      parties=parties, bloom=bloom)


def save_truth(run_dir: Path, arrays: dict[str, npt.NDArray[Any]], *, task: str | None,
               parties: dict[str, dict[str, Any]], bloom: Any = None) -> Path:
    """Write ``arrays`` as ``run_dir/evaluation/truth.{npz,json}`` (atomically), with the
    manifest that says what they are: ``labels__<party>__rows`` (sorted) and
    ``labels__<party>__values`` are the primary's labels by the ids ``<party>`` knows its
    records by."""
    out = Path(run_dir) / TRUTH_DIR
    out.mkdir(parents=True, exist_ok=True)
    _save_npz(out / "truth.npz", arrays)
    manifest = {"version": TRUTH_VERSION, "evaluation_only": True,
                "note": "ground truth for scoring attacks (vflink attack); no party had it "
                        "during the run, and no party may use it",
                "task": task, "parties": parties, "bloom": bloom}
    atomic_write_json(out / "truth.json", manifest, indent=2, default=None)
    return out


def _bloom_truth(config: RunConfig, prepared: Prepared, alignments: dict[str, Alignment],
                 secret: bytes | None, arrays: dict[str, npt.NDArray[Any]], run_dir: Path,
                 primary: PrimaryParty) -> dict[str, Any] | None:
    """True Hamming distances of the released pairs and the anchor secondary's Bloom filters
    (in a simulation, where every table is here), and the primary's own filters; when there
    are none, ``{"missing": why}`` in the run's own terms (an attack that needs them says it)."""
    a_cfg = config.alignment
    inputs = prepared.inputs
    why = missing_bloom_truth(a_cfg.method, a_cfg.privacy, bool(a_cfg.fields),
                              secret is not None, bool(alignments))
    if why is not None:
        return {"missing": why}
    from vflink.runner.encoding import encoding_for

    p = inputs.primary
    sides = [(p.frame, p.schema.identifiers)]
    spec, _ = encoding_for(a_cfg.metric, bloom=True, sides=sides, margin=0.1)
    own = np.asarray(encode_identifiers(p.frame, p.schema.identifiers, spec, secret,
                                        source=p.source), dtype=np.uint8)
    if primary.out_dir is not None:
        own_dir = primary.out_dir / RECORDING_DIR
        own_dir.mkdir(parents=True, exist_ok=True)
        _save_npz(own_dir / OWN_ENCODINGS, {"filters": own})
    bits = int(own.shape[1] * 8)
    anchor = next(iter(alignments))
    table = next((t for t in inputs.secondaries if t.name == anchor), None)
    if table is None:  # across hosts: the secondary's filters are not here
        return {"bits": bits, "anchor": anchor, "secondary_filters": False,
                "missing": f"the secondary {anchor!r} ran on another host: its Bloom filters "
                           "are not in this run directory (every party must run in this "
                           "process)"}
    theirs = np.asarray(encode_identifiers(table.frame, table.schema.identifiers, spec, secret,
                                           source=table.source), dtype=np.uint8)
    dense = alignments[anchor].for_primary_rows(len(p))
    valid = dense != MISSING
    dist = np.full(dense.shape, np.nan)
    rows, cols = np.nonzero(valid)
    for start in range(0, len(rows), 65_536):  # bounded memory on large linkages
        r, c = rows[start:start + 65_536], cols[start:start + 65_536]
        dist[r, c] = _hamming(own[r], theirs[dense[r, c]])
    linked = np.unique(dense[valid])
    arrays[f"distances__{anchor}"] = dist
    arrays[f"filters__{anchor}__rows"] = linked.astype(np.int64)
    arrays[f"filters__{anchor}__values"] = theirs[linked]
    return {"bits": bits, "anchor": anchor, "secondary_filters": True,
            "encoding": {"encoder": spec.encoder, "kind": spec.kind, **spec.params}}


def missing_bloom_truth(method: str, privacy: str, fields: bool, secret: bool,
                        linked: bool) -> str | None:
    """Why a run has no true Hamming distances of its released pairs (what the greedy attack
    of FedSim §5.2 is scored against), in the run file's terms; None when it has them."""
    if method != "soft":
        return (f'the alignment is alignment.method = "{method}", not a soft linkage: no '
                'similarities were released (use method = "soft")')
    if privacy != "bloom":
        return (f'the identifiers were sent as alignment.privacy = "{privacy}", not as Bloom '
                'filters: there is no filter to recover (use privacy = "bloom")')
    if fields:
        return ("the alignment compares several fields ([[alignment.fields]]): each record has "
                "one Bloom filter per field and the released similarity mixes them, so there "
                "is no single filter per record to recover; link on one field (the parties' "
                "identifiers, without [[alignment.fields]]) to measure this attack")
    if not secret:
        return "the run had no alignment secret, so its Bloom filters cannot be rebuilt"
    if not linked:
        return "the run released no soft links"
    return None


def read_truth(run_dir: Path) -> tuple[dict[str, Any], dict[str, npt.NDArray[Any]]]:
    """The run's evaluation-only ground truth: (manifest, arrays); empty when none."""
    base = Path(run_dir) / TRUTH_DIR
    if not os.path.lexists(base / "truth.json"):
        return {}, {}
    # files of a run directory are data: regular files inside it, within limits
    manifest = read_typed_json(run_dir, f"{TRUTH_DIR}/truth.json", Obj())
    # numeric arrays only, each checked from its header (an object array is never unpickled)
    return manifest, load_arrays(run_dir, f"{TRUTH_DIR}/truth.npz")


def linkage_figures(similarity: npt.NDArray[np.floating[Any]] | None, model: Any = None
                    ) -> dict[str, Any] | None:
    """What the report draws for a soft linkage, from the similarities the primary holds.

    * the sorted-similarity curve of FedSim Figure 4: mean, 10th and 90th percentile of each
      record's k-th largest row-scaled similarity, per rank k;
    * Δ of §4.3 (Definition 1) against Top1Sim and AvgSim, on row-scaled similarities
      (:mod:`vflink.linkage.improvement`). Δ against Exact needs the raw distances, which only
      the coordinator has, so it is reported by ``vflink link``, not here;
    * the weight gate's learned similarity → weight mapping (FedSim Figure 10, middle), when
      ``model`` (the primary's trained model) has one, on a grid over the observed range.
    """
    if similarity is None or similarity.ndim != 2 or similarity.shape[1] < 2:
        return None
    from vflink.linkage.improvement import improvement_per_record, scale_similarities
    from vflink.models.merge import weight_curve

    s = np.asarray(similarity, dtype=np.float64)
    scaled = scale_similarities(s)
    valid = np.isfinite(s)
    ranked = -np.sort(-scaled, axis=1)  # each record's scaled similarities, largest first
    top1 = np.zeros_like(valid)
    top1[:, 0] = valid[:, 0]  # linkage order: the nearest record first (as the library does)
    curve = {"mean": ranked.mean(axis=0).tolist(),
             "p10": np.percentile(ranked, 10, axis=0).tolist(),
             "p90": np.percentile(ranked, 90, axis=0).tolist()}
    out: dict[str, Any] = {
        "k": int(s.shape[1]), "scale": "row", "curve": curve,
        "delta": {"top1sim": float(np.mean(improvement_per_record(scaled, top1))),
                  "avgsim": float(np.mean(improvement_per_record(scaled, valid)))}}
    gate = getattr(getattr(model, "aggregator", None), "sim_model", None)
    if gate is not None and valid.any():
        lo, hi = float(s[valid].min()), float(s[valid].max())
        grid = np.linspace(lo, hi, 101) if hi > lo else np.array([lo])
        out["weight_gate"] = {"similarity": grid.tolist(),
                              "weight": weight_curve(model.aggregator, grid).tolist()}
    return out

