"""Run an attack against a finished run directory (``vflink attack``).

The attacker's knowledge is what one party recorded in its own state directory
(``models/<party>/evaluation/``, :mod:`vflink.parties.recording`), loaded into an
:class:`~vflink.attacks.AttackView`; the attack is scored against the run's evaluation-only
ground truth (``evaluation/truth.npz``), and its result is appended to the run's privacy
ledger (``privacy.json``).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from vflink._files import (
    atomic_write_json,
    check_directory,
    check_regular_file,
    read_json_file,
)
from vflink._typed import Arr, load_arrays
from vflink.attacks import ATTACKS, AttackResult, AttackView, get_attack, is_population_attack
from vflink.attacks.limits import dp_auc_ceiling, gdp_auc_ceiling, gdp_mu, leak
from vflink.errors import ConfigError, DataError, VflinkError
from vflink.metrics.attacks import auc_stderr
from vflink.parties.recording import RECORDING_DIR, Recording, read_recording
from vflink.privacy.label_protection import DEFEATED_WITHIN
from vflink.privacy.ledger import LEDGER_FILE, Ledger
from vflink.runfiles.inputs import Inputs
from vflink.runner.evaluation import OWN_ENCODINGS, read_truth

__all__ = ["attack_lines", "label_protection_in_force", "load_view", "recorded_parties",
           "run_attack", "stated_limit", "truth_for", "with_label_verdict"]

log = logging.getLogger(__name__)


#: why a recorded party may still lack a field an attack needs
_WHY = {"similarities": "only soft linkage (alignment.method = \"soft\") sends similarities, "
                        "to the primary",
        "gradients": "a secondary receives gradients only when a VFL algorithm trains "
                     "(splitnn, fedsim, ...)",
        "embeddings": "the primary receives embeddings only when a VFL algorithm trains"}


def attack_lines() -> list[tuple[str, str, str]]:
    """(name, attacker role, one-line summary) of every registered attack."""
    return [(n, ATTACKS.get(n).role, ATTACKS.get(n).summary) for n in ATTACKS.names()]


def recorded_parties(run_dir: Path) -> dict[str, Path]:
    """Party name → state directory, for every party of the run that recorded something.

    ``run_dir`` is a run directory (``models/<party>/``), or one party's own state directory
    for a run across hosts (``<state_dir>/<run id>/``, where ``vflink serve`` wrote it).
    """
    own = Path(run_dir) / RECORDING_DIR / "received.json"
    if os.path.lexists(own):
        return {_read_recording(Path(run_dir), Path(run_dir)).party: Path(run_dir)}
    out = {}
    for manifest in sorted(Path(run_dir).glob(f"models/*/{RECORDING_DIR}/received.json")):
        party_dir = manifest.parent.parent
        out[party_dir.name] = party_dir
    return out


def _read_recording(run_dir: Path, directory: Path) -> Recording:
    """:func:`read_recording` of ``directory`` (``run_dir`` or a party's folder in it), once its
    files are checked: regular files inside ``run_dir``, the manifest a JSON object within
    size and depth limits (a run directory from elsewhere is data)."""
    base = directory.relative_to(run_dir) / RECORDING_DIR
    manifest = read_json_file(run_dir, base / "received.json")
    if not (isinstance(manifest, dict) and isinstance(manifest.get("party"), str)
            and isinstance(manifest.get("role"), str)
            and isinstance(manifest.get("streams"), list)
            and all(isinstance(s, dict) for s in manifest["streams"])
            and isinstance(manifest.get("meta", {}), dict)):
        raise DataError(f"{run_dir / base / 'received.json'}: expected a recording manifest "
                        "(a JSON object with \"party\", \"role\" and \"streams\")")
    check_regular_file(run_dir, base / "received.npz")
    return read_recording(directory)


def _pick(run_dir: Path, role: str, party: str | None) -> Recording:
    check_directory(run_dir, "a run directory (vflink train --out)")
    parties = recorded_parties(run_dir)
    if not parties:
        if not (Path(run_dir) / "metrics.json").is_file():
            raise DataError(f"{run_dir}: not a run directory (no metrics.json)")
        raise DataError(f"{run_dir}: no party recorded what it received; rerun with "
                        "[evaluation] record = true (Solo and Combine send nothing across a "
                        "party boundary: there is nothing to attack)")
    if party is not None:
        if party not in parties:
            raise ConfigError(f"party {party!r} recorded nothing in {run_dir}; parties with a "
                              f"recording: {', '.join(parties)}")
        rec = _read_recording(Path(run_dir), parties[party])
        if rec.role != role:
            raise ConfigError(f"this attack is run by a {role} party; {party!r} is the "
                              f"{rec.role}")
        return rec
    for directory in parties.values():
        rec = _read_recording(Path(run_dir), directory)
        if rec.role == role:
            return rec
    raise ConfigError(f"no {role} party recorded anything in {run_dir}")


def load_view(run_dir: Path, role: str, party: str | None = None) -> AttackView:
    """What one party (by name, or the first of ``role``) received, as an attack view."""
    rec = _pick(Path(run_dir), role, party)
    kw: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    if rec.role == "secondary":
        if rec.streams("gradients"):
            grads, ids, batch = rec.get("gradients")
            kw.update(gradients=grads, ids=ids)
            extra["batch"] = batch
            peer = extra["peer"] = rec.streams("gradients")[0]
            if peer in rec.streams("requests"):  # the primary's order of each batch's rows
                positions, asked, asked_batch = rec.get("requests", peer)
                extra["requests"] = {"positions": positions, "ids": asked,
                                     "batch": asked_batch}
        if rec.streams("indices"):
            kw["indices"] = rec.get("indices")[0]
            if kw["indices"].ndim == 2:  # K links per record (FedSim)
                extra["links"] = int(kw["indices"].shape[1])
        # every seed this party was sent (white-box attacks try them)
        extra["received_seeds"] = [
            {"peer": key.split("__", 1)[1], **{k: v for k, v in info.items()
                                              if k in ("message", "seed")}}
            for key, info in sorted(rec.manifest.get("meta", {}).items())
            if key.startswith("setup__") and isinstance(info, dict)]
    else:
        if rec.streams("embeddings"):
            emb, ids, batch = rec.get("embeddings")
            kw.update(embeddings=emb, ids=ids)
            extra["batch"] = batch
        if rec.streams("similarities"):
            peer = rec.streams("similarities")[0]
            sims, rows, _ = rec.get("similarities", peer)
            kw["similarities"] = sims
            kw["indices"] = rec.get("indices", peer)[0]
            extra.update(rec.meta("similarities", peer))
            extra["peer"] = peer
            extra["similarity_rows"] = rows
        base = recorded_parties(Path(run_dir))[rec.party]
        own = base / RECORDING_DIR / OWN_ENCODINGS
        if os.path.lexists(own):  # the primary's own Bloom filters: its own data
            data = load_arrays(base, f"{RECORDING_DIR}/{OWN_ENCODINGS}",
                               {"filters": Arr("u", 2)}, required=("filters",))
            extra["own_filters"] = data["filters"]
            extra["bits"] = int(data["filters"].shape[1] * 8)
    return AttackView(party=rec.party, role=rec.role, extra=extra, **kw)


def truth_for(arrays: dict[str, npt.NDArray[Any]], peer: str | None
              ) -> dict[str, npt.NDArray[Any]]:
    """The ground truth that concerns ``peer`` (the attacked or attacking secondary), with the
    peer's name dropped from the keys: ``labels__bank__rows`` → ``labels__rows``."""
    if peer is None:
        return {}
    tag = f"__{peer}"
    out = {}
    for key, value in arrays.items():
        if key.endswith(tag) or f"{tag}__" in key:
            out[key.replace(tag, "", 1)] = value
    return out


def run_attack(run_dir: Path, name: str, *, party: str | None = None,
               params: dict[str, Any] | None = None, out: Path | None = None,
               truth_dir: Path | None = None, overwrite: bool = False,
               tables: Inputs | None = None) -> AttackResult:
    """Run attack ``name`` on ``run_dir``; append the result to the run's ledger (and to
    ``out``). ``truth_dir``: the run directory with the ground truth and the ledger, when
    ``run_dir`` is one party's own state directory (runs across hosts). An existing result
    file in ``out`` is refused (before the attack runs or the ledger changes) unless
    ``overwrite``. ``tables``: the parties' tables of a run trained on tables given in memory
    (an attack that uses the attacker's own data, e.g. model completion, reads them)."""
    run_dir = Path(run_dir)
    home = Path(truth_dir) if truth_dir is not None else run_dir
    attack = get_attack(name, **(params or {}))
    view = load_view(run_dir, attack.role, party)
    missing = sorted(n for n in attack.needs if n in _WHY and getattr(view, n) is None)
    if missing:  # the run recorded, but never sent this kind of message
        raise ConfigError(f"attack {attack.name!r} needs {', '.join(missing)}, which party "
                          f"{view.party!r} never received in this run: "
                          + "; ".join(_WHY[n] for n in missing))
    if "features" in attack.needs and view.features is None and view.role == "secondary":
        view = _with_bottom_outputs(view, home, tables)
    view.require(attack.needs, attack.name)
    target = Path(out) / f"{name}-{view.party}.json" if out is not None else None
    if target is not None and target.exists() and not overwrite:
        raise ConfigError(f"{target}: output already exists; choose another --out or pass "
                          "--overwrite to replace it")
    manifest, arrays = read_truth(home)
    # A secondary's truth is about its own rows; the primary attacks the secondary it received
    # similarities about (the first secondary, FedSim App. C).
    peer = view.party if view.role == "secondary" else view.extra.get("peer")
    truth: dict[str, Any] = dict(truth_for(arrays, peer))
    bloom = manifest.get("bloom") if isinstance(manifest, dict) else None
    if isinstance(bloom, dict) and isinstance(bloom.get("missing"), str):
        truth["missing_distances"] = bloom["missing"]  # why the run has no true distances
    result = attack.evaluate(view, truth)
    ledger_path = home / LEDGER_FILE
    ledger = Ledger.read(ledger_path) if os.path.lexists(ledger_path) else Ledger()
    if name.startswith("label-"):
        records = None if view.ids is None else int(np.unique(np.asarray(view.ids)).size)
        result = with_label_verdict(result, ledger, records=records,
                                    population=is_population_attack(name))
    ledger.add_attack(result.to_json())
    ledger.write(ledger_path)
    if target is not None:
        target.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(target, result.to_json(), indent=2, default=float)
    log.info("%s on %s: %s", name, view.party, result.metrics)
    return result


def label_protection_in_force(ledger: Ledger) -> dict[str, Any] | None:
    """The run's protection of the labels on the gradients (its ledger entry), if any."""
    return next((p for p in ledger.protections
                 if p.get("applies_to") == "backward" and str(p.get("kind", "")).startswith(
                     "label-")), None)


def stated_limit(entry: dict[str, Any] | None) -> tuple[float | None, str, dict[str, Any]]:
    """The most AUC the label protection's stated guarantee allows any attack on one record's
    label, in words, and figures beside it: for (ε, δ)-label-DP the area under the ROC region
    (ε, δ) leaves (:func:`vflink.attacks.limits.dp_auc_ceiling`; the tighter Gaussian figure of
    the worst record's releases beside it), for rr-prior the same at δ = 0. ``None`` where the
    protection states no limit (off, Marvell, max-norm): then nothing beyond chance is
    promised, and only an attack within ``DEFEATED_WITHIN`` of chance counts as held."""
    if entry is None:
        return None, "no protection: nothing is promised", {}
    mode = str(entry.get("kind", "")).removeprefix("label-")
    g = entry.get("guarantee") or {}
    eps, delta = g.get("epsilon"), g.get("delta", 0.0)
    if mode in ("dp", "rr-prior") and isinstance(eps, (int, float)) and math.isfinite(eps):
        d = float(delta or 0.0) if mode == "dp" else 0.0
        limit = dp_auc_ceiling(float(eps), d)
        extra: dict[str, Any] = {}
        releases = g.get("releases_of_worst_record")
        if mode == "dp" and isinstance(releases, list) and releases:
            try:
                mu = gdp_mu((float(sig), int(m)) for sig, m in releases)
                extra = {"gaussian_mu": mu, "gaussian_limit": gdp_auc_ceiling(mu)}
            except (TypeError, ValueError):
                extra = {}
        words = (f"AUC ≤ {limit:.3f}, what (ε = {float(eps):.3g}"
                 + (f", δ = {d:g}" if d else "") + ") allows any test of one record's label")
        return limit, words, extra
    return None, {"marvell": "Marvell states no limit (its figure is a model's, per batch and "
                             "per row; see the ledger)",
                  "max-norm": "max-norm states no limit (a heuristic)"}.get(
        mode, f"{mode} states no limit"), {}


#: What a population attack is judged against: nothing (see :func:`with_label_verdict`).
POPULATION_WORDS = ("no label guarantee bounds this attack: it reads the task (what the "
                    "features and a few known labels predict of every record), not one "
                    "record's label from what was sent, and reads it from the features "
                    "alone too (auc_features_only); label DP protects each record's label, "
                    "not the task")


def with_label_verdict(result: AttackResult, ledger: Ledger, *,
                       records: int | None = None, population: bool = False) -> AttackResult:
    """``result`` with which label protection was in force, the most AUC its stated guarantee
    allows (:func:`stated_limit`) and whether the attack stayed within it: its leak
    max(AUC, 1 − AUC), less twice its standard error over the ``records`` attacked (Hanley &
    McNeil; a record's rows over the epochs are not independent draws), at most that limit,
    or, where none is stated, within ``DEFEATED_WITHIN`` of chance (either way: 0.4 is as
    leaky as 0.6). A multi-class accuracy is judged against always guessing the most frequent
    class. A ``population`` attack (model completion) is reported with its reading but not
    judged (``within_limit`` ``None``): no label guarantee states a limit on it."""
    entry = label_protection_in_force(ledger)
    mode = "off" if entry is None else str(entry["kind"]).removeprefix("label-")
    m = result.metrics
    if "auc" in m:
        value = float(m["auc"])
        gap = abs(value - 0.5)
        reading = f"AUC {value:.3f}, {gap:.3f} from chance"
        leak_value: float | None = leak(value)
    elif "accuracy" in m and "majority" in m:
        gap = float(m["accuracy"]) - float(m["majority"])
        reading = f"accuracy {float(m['accuracy']):.1%}, {gap:+.1%} over the majority class"
        leak_value = None
    else:
        return result
    defeated = bool(gap <= DEFEATED_WITHIN)
    limit, limit_words, figures = (None, POPULATION_WORDS, {}) if population \
        else stated_limit(entry)
    stderr = math.nan
    n = int(m.get("records", records or 0) or 0)
    rate = float(m.get("positive_rate", math.nan))
    if leak_value is not None and n > 0 and math.isfinite(rate):
        stderr = auc_stderr(leak_value, round(n * rate), n - round(n * rate))
    within: bool | None
    if population:
        within = None
    elif limit is not None and leak_value is not None and math.isfinite(leak_value):
        margin = 2.0 * stderr if math.isfinite(stderr) else 0.0
        within = bool(leak_value - margin <= limit)
    else:
        within = defeated
    guarantee = dict((entry or {}).get("guarantee") or {})
    what = {"off": "no label protection (the gradients were sent in clear)",
            "dp": f"labels = dp (ε = {guarantee.get('epsilon', float('nan')):.3g}, "
                  f"δ = {guarantee.get('delta', float('nan')):g})",
            "rr-prior": f"labels = rr-prior (ε = {guarantee.get('epsilon', float('nan')):.3g})",
            "marvell": "labels = marvell (no formal guarantee)",
            "max-norm": "labels = max-norm (no formal guarantee)"}.get(mode, f"labels = {mode}")
    spread = f" (± {stderr:.3f})" if math.isfinite(stderr) else ""
    if within is None:
        against = "so it is reported, not judged."
    elif within:
        against = f"the attack stays within it{spread}."
    elif limit is not None:
        against = (f"the attack goes BEYOND it, by more than twice its standard error{spread}."
                   if spread else "the attack goes BEYOND it.")
    else:
        against = "the attack reads beyond chance, which nothing stated covers."
    verdict = (f"Protection in force: {what}; "
               + (f"it defeats this attack ({reading}, within {DEFEATED_WITHIN:g})"
                  if defeated else f"it does not defeat this attack ({reading})")
               + f". Stated limit: {limit_words}; {against}")
    details = {**result.details, "protection": {
        "mode": mode, "defeated": defeated, "within": DEFEATED_WITHIN, "leak": leak_value,
        "leak_stderr": None if not math.isfinite(stderr) else stderr,
        "limit": limit, "limit_words": limit_words, "within_limit": within, **figures}}
    return dataclasses.replace(result, explanation=f"{result.explanation}. {verdict}",
                               details=details)


def _with_bottom_outputs(view: AttackView, run_dir: Path, tables: Inputs | None
                         ) -> AttackView:
    """The secondary's own trained bottom model's outputs for every one of its rows, and its
    preprocessed rows (what passive model completion builds on): from its saved final model
    and its own table, as the secondary itself would compute them."""
    import torch

    from vflink.parties import SecondaryParty
    from vflink.runfiles.inputs import load_inputs
    from vflink.runner.loop import FINAL
    from vflink.runner.predict import load_run_config
    from vflink.transport import InProcessHub

    state_dir = Path(run_dir) / "models" / view.party
    if tables is None:
        try:
            config = load_run_config(Path(run_dir))
            tables = load_inputs(config)
        except VflinkError as exc:
            raise ConfigError(f"the attack needs party {view.party!r}'s own table and saved "
                              f"model, and the run's tables could not be read again ({exc}); "
                              "for a run trained on tables in memory, attack it with "
                              "`Run.attack` (or pass `tables`)") from None
    table = next((t for t in tables.secondaries if t.name == view.party), None)
    if table is None or not state_dir.is_dir():
        raise ConfigError(f"the attack needs party {view.party!r}'s own table and saved model "
                          f"({state_dir}); across hosts, run it where that party keeps them")
    party = SecondaryParty(table, InProcessHub().channel(view.party), out_dir=state_dir,
                           peer_dirs=False)
    run = party.load_saved(FINAL)
    model, features = run.model, run.features
    if model is None or features is None:  # pragma: no cover - load_saved built them
        raise ConfigError(f"party {view.party!r}: no model in {state_dir}")
    model.eval()
    rows = np.arange(len(table), dtype=np.int64)
    outputs, raw = [], []
    with torch.no_grad():
        for start in range(0, len(rows), 4096):
            x = features.rows(rows[start:start + 4096])
            outputs.append(model(x.to(party.device)).cpu().double().numpy())
            raw.append(x.double().numpy())
    extra = {**view.extra, "feature_rows": rows, "raw_features": np.concatenate(raw)}
    return dataclasses.replace(view, features=np.concatenate(outputs), extra=extra)
