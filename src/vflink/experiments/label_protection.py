"""Tables and figures of the label-protection measurements (docs/how-to/label-protection.md).

``scripts/label_protection.py`` trains every point of an experiment file (a sweep over
``privacy.labels``, or over ``privacy.labels_total_epsilon`` × ``privacy.labels``) with
``[evaluation] record = true``, runs the label-inference attacks on each run, and appends one
line per run to a ``*-runs.jsonl`` file::

    {"dataset": "adult", "labels": "dp", "epsilon": 4.0, "seed": 0, "algorithm": "splitnn",
     "test": {"accuracy": ..., "auc": ...}, "best_epoch": 17, "seconds": 9.1,
     "attacks": {"label-norm": {"auc": 0.51}, ...}, "guarantee": {...}}

:func:`measure` is one point of that grid (one label mode × the attacks × one dataset × one
seed: whatever ``config`` says): it trains, runs each attack on the run and returns the line.
The other functions read those lines (pure: no training) and build the docs' Markdown tables
(mean ± std over seeds) and the privacy-utility figure.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from vflink.attacks import is_population_attack
from vflink.errors import ConfigError
from vflink.privacy.config import LABEL_MODES
from vflink.runfiles.config import EvaluationConfig, RunConfig
from vflink.runfiles.inputs import Inputs

__all__ = ["ATTACK_COLUMNS", "LABEL_ATTACKS", "WHITE_BOX_COLUMNS", "adjusting_table",
           "curve_table", "grid_table", "load_runs", "measure", "plot_curve", "point_name",
           "power_table", "protection_table", "run_key"]

#: the attacks of the tables, in column order, with their short headings
ATTACK_COLUMNS = (("label-norm", "norm"), ("label-direction", "direction"),
                  ("label-kmeans", "k-means"), ("label-spectral", "spectral"),
                  ("label-fcm", "FCM"), ("label-completion", "completion"))

#: the white-box label attacks (vflink.attacks.whitebox), with their short headings
WHITE_BOX_COLUMNS = (("label-noise-subtraction", "noise subtraction"),
                     ("label-epoch-average", "epoch average"), ("label-residual", "residual"))

#: protections in table order
MODES = LABEL_MODES

#: what an attack's result keeps in a runs line
_KEPT = ("auc", "accuracy", "auc_features_only", "accuracy_features_only", "majority",
         "auc_per_batch", "auc_per_record")


#: every label attack of the tables
LABEL_ATTACKS = tuple(name for name, _ in ATTACK_COLUMNS + WHITE_BOX_COLUMNS)


def measure(config: RunConfig, attacks: Sequence[str] = LABEL_ATTACKS, *,
            tables: Inputs | None = None,
            params: dict[str, dict[str, Any]] | None = None,
            out: Path | None = None) -> dict[str, Any]:
    """One point of the label-protection grid: train ``config`` (its label mode, dataset and
    seed) with every party recording what it received, run each of ``attacks`` on the run
    (``params``: an attack's parameters by name) and return one runs line: the test and
    validation metrics, the decision threshold, each attack's figures with the most AUC the
    protection's stated guarantee allows and whether it stayed within it, and the ledger's
    guarantee. The run directory is ``out`` (kept) or a scratch one (removed)."""
    from vflink.runner.attack import run_attack
    from vflink.runner.train import run_training

    config = config.replace(evaluation=EvaluationConfig(
        record=True, record_rows=max(config.evaluation.record_rows, 20_000)))
    scratch = Path(tempfile.mkdtemp(prefix="vflink-label-")) if out is None else None
    run_dir = Path(out) if out is not None else Path(str(scratch)) / "run"
    try:
        start = time.perf_counter()
        result = run_training(config, run_dir, tables=tables, overwrite=out is not None)
        seconds = time.perf_counter() - start
        figures: dict[str, Any] = {}
        for name in attacks:
            res = run_attack(run_dir, name, params=(params or {}).get(name), tables=tables)
            protection = res.details.get("protection") or {}
            figures[name] = {**{k: v for k, v in res.metrics.items() if k in _KEPT},
                             **{k: protection.get(k) for k in ("limit", "within_limit")
                                if k in protection}}
            if res.details.get("found") is not None:
                figures[name]["found"] = res.details["found"]["how"]
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
    privacy = config.privacy
    label = next((p for p in result.extra.get("protections", [])
                  if str(p.get("kind", "")).startswith("label-")), None)
    # the mode in force (the task's default where the run named none)
    mode = (str(label["kind"]).removeprefix("label-") if label is not None
            else privacy.labels or "off")
    labelled = mode in ("dp", "rr-prior")
    guarantee = {k: v for k, v in ((label or {}).get("guarantee") or {}).items()
                 if not isinstance(v, (dict, list, str))}
    denoise = ((label or {}).get("params") or {}).get("denoise")
    return {"dataset": config.data.dataset, "labels": mode,
            "default": privacy.labels is None,
            "epsilon": privacy.label_epsilon if labelled else None,
            "releases": privacy.label_releases if mode == "dp" else None,
            "power": privacy.marvell_power if mode == "marvell" else None,
            "denoise": denoise if mode == "dp" else None,
            "refit": privacy.label_refit if labelled else None,
            "embeddings": privacy.embeddings, "seed": config.seed,
            "algorithm": config.algorithm, "test": result.metrics["test"],
            "validation": result.metrics["validation"], "best_epoch": result.best_epoch,
            "decision": result.extra.get("decision"), "seconds": seconds,
            "attacks": figures, "guarantee": guarantee,
            "holds": _holds({"attacks": figures})}


def run_key(run: dict[str, Any]) -> tuple[Any, ...]:
    """What identifies a run of the measurements (one per seed of a point)."""
    return (run.get("dataset"), run.get("labels"), run.get("epsilon"), run.get("embeddings"),
            run.get("power"), run.get("algorithm"), int(run["seed"]), run.get("denoise"),
            run.get("releases"), bool(run.get("default")), run.get("refit"))


def load_runs(sources: Iterable[Path]) -> list[dict[str, Any]]:
    """The runs of ``.jsonl`` files (one per line), first occurrence of a run kept."""
    runs: list[dict[str, Any]] = []
    seen: set[tuple[Any, ...]] = set()
    for path in sources:
        if not Path(path).is_file():
            raise ConfigError(f"{path}: no such runs file (.jsonl, one run per line)")
        for line in Path(path).read_text(encoding="utf-8").splitlines():
            if not line.strip():
                continue
            run = json.loads(line)
            key = run_key(run)
            if key not in seen:
                seen.add(key)
                runs.append(run)
    return runs


def _values(runs: Sequence[dict[str, Any]], get: Any) -> np.ndarray:
    out = []
    for run in runs:
        try:
            value = get(run)
        except (KeyError, TypeError):
            value = None
        out.append(np.nan if value is None else float(value))
    return np.asarray(out, dtype=np.float64)


def _cell(values: np.ndarray, *, percent: bool = False, digits: int = 3) -> str:
    v = values[~np.isnan(values)]
    if v.size == 0:
        return "—"
    scale = 100.0 if percent else 1.0
    d = 1 if percent else digits
    return f"{scale * v.mean():.{d}f} ± {scale * v.std():.{d}f}"


def _holds(run: dict[str, Any]) -> bool:
    """Every attack but the population ones (:func:`~vflink.attacks.is_population_attack`:
    reported, never judged against a label guarantee) within its limit; recomputed, so that
    runs measured before completion stopped being judged read the same."""
    return all(f.get("within_limit") is not False
               for name, f in (run.get("attacks") or {}).items()
               if not is_population_attack(name))


def _attack_value(run: dict[str, Any], name: str) -> float | None:
    metrics = (run.get("attacks") or {}).get(name) or {}
    value = metrics.get("auc", metrics.get("accuracy"))
    return None if value is None else float(value)


def _model_auc(guarantee: dict[str, Any]) -> float | None:
    """Marvell's per-batch AUC figure of its two-Gaussian model (named ``leak_auc_bound_max``
    in runs measured before it stopped being stated as a bound)."""
    value = guarantee.get("model_auc_max", guarantee.get("leak_auc_bound_max"))
    return None if value is None else float(value)


def _guarantee(runs: Sequence[dict[str, Any]]) -> str:
    g = [r.get("guarantee") or {} for r in runs]
    mode = runs[0].get("labels")
    if mode == "dp":
        eps = _values(g, lambda x: x["epsilon"])
        sig = _values(g, lambda x: x["sigma"])
        m = _values(g, lambda x: x["max_releases"])
        return (f"(ε = {np.nanmax(eps):.2f}, δ = 1e-5), σ = {np.nanmean(sig):.2f}, "
                f"{int(np.nanmax(m))} releases")
    if mode == "rr-prior":
        return f"ε = {np.nanmax(_values(g, lambda x: x['epsilon'])):.2f} (pure)"
    if mode == "marvell":
        bound = _values(g, _model_auc)
        return f"none (model's figure {np.nanmax(bound):.3f} per batch)"
    return "none"


def protection_table(runs: Sequence[dict[str, Any]], *, epsilon: float = 4.0,
                     attacks: Sequence[tuple[str, str]] = ATTACK_COLUMNS) -> str:
    """Markdown: one row per protection (dp and rr-prior at ``epsilon``), columns test
    accuracy (%), its change against the unprotected run of the same seed, test AUC and each
    attack's AUC (mean ± std over seeds), and the guarantee."""
    points: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for run in runs:
        mode = str(run.get("labels"))
        if mode in ("dp", "rr-prior") and run.get("epsilon") != epsilon:
            continue
        points[mode].append(run)
    head = ["protection", "test accuracy (%)", "Δ accuracy (points)", "test AUC",
            *(h for _, h in attacks), "guarantee"]
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    off = {int(r["seed"]): r for r in points.get("off", [])}
    for mode in [m for m in MODES if m in points]:
        rs = points[mode]
        paired = [r for r in rs if int(r["seed"]) in off]
        delta = _values(paired, lambda r: r["test"]["accuracy"]) - _values(
            [off[int(r["seed"])] for r in paired], lambda r: r["test"]["accuracy"])
        cells = [mode, _cell(_values(rs, lambda r: r["test"]["accuracy"]), percent=True),
                 _cell(delta, percent=True) if mode != "off" else "",
                 _cell(_values(rs, lambda r: r["test"].get("auc")))]
        cells += [_cell(_values(rs, lambda r, n=name: _attack_value(r, n)))
                  for name, _ in attacks]
        cells.append(_guarantee(rs))
        lines.append("| " + " | ".join(cells) + " |")
    seeds = sorted({int(r["seed"]) for r in runs})
    lines += ["", f"Mean ± std over seeds {seeds}; Δ accuracy: against the unprotected run of "
                  f"the same seed; dp and rr-prior at labels_total_epsilon = {epsilon:g}. "
                  "Attack columns: AUC (0.5 = chance; read by the distance from 0.5, either "
                  "way)."]
    return "\n".join(lines)


def adjusting_table(runs: Sequence[dict[str, Any]]) -> str:
    """Markdown: what label protection does to VFL-AFE's distribution adjusting (+D): per label
    protection, test accuracy (%) with the embeddings' ``vanilla`` DP and with +D
    (``adjust``), +D's gain against vanilla on the same seed, and the fuzzy c-means attack's
    AUC with +D (how well +D's own clustering of the gradients finds the classes)."""
    def acc(run: dict[str, Any]) -> float:
        return float(run["test"]["accuracy"])

    def pick(mode: str, embeddings: str) -> dict[int, dict[str, Any]]:
        return {int(r["seed"]): r for r in runs
                if r.get("labels") == mode and r.get("embeddings") == embeddings}

    head = ["labels", "vanilla accuracy (%)", "+D accuracy (%)", "+D − vanilla (points)",
            "FCM attack AUC (+D)", "norm attack AUC (+D)"]
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for mode in [m for m in MODES if any(r.get("labels") == m for r in runs)]:
        vanilla, adjust = pick(mode, "vanilla"), pick(mode, "adjust")
        seeds = sorted(set(vanilla) & set(adjust))
        gain = _values([adjust[s] for s in seeds], acc) - _values([vanilla[s] for s in seeds],
                                                                   acc)
        lines.append("| " + " | ".join([
            mode, _cell(_values(list(vanilla.values()), acc), percent=True),
            _cell(_values(list(adjust.values()), acc), percent=True),
            _cell(gain, percent=True),
            _cell(_values(list(adjust.values()), lambda r: _attack_value(r, "label-fcm"))),
            _cell(_values(list(adjust.values()), lambda r: _attack_value(r, "label-norm")))])
            + " |")
    return "\n".join(lines)


def power_table(runs: Sequence[dict[str, Any]]) -> str:
    """Markdown: one row per Marvell power s (the ``marvell`` runs), test accuracy (%), its
    change against the unprotected run of the same seed (the ``off`` runs among ``runs``), test
    AUC, the norm and direction attacks' AUC and the largest per-batch AUC figure of Marvell's
    two-Gaussian model (a model's figure, not a bound on the attacks)."""
    off = {int(r["seed"]): r for r in runs if r.get("labels") == "off"}
    powers = sorted({float(r["power"]) for r in runs
                     if r.get("labels") == "marvell" and r.get("power") is not None})
    head = ["s", "test accuracy (%)", "Δ accuracy (points)", "test AUC", "norm", "direction",
            "model AUC figure (max)"]
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for power in powers:
        rs = [r for r in runs if r.get("labels") == "marvell" and r.get("power") == power]
        paired = [r for r in rs if int(r["seed"]) in off]
        delta = _values(paired, lambda r: r["test"]["accuracy"]) - _values(
            [off[int(r["seed"])] for r in paired], lambda r: r["test"]["accuracy"])
        bound = _values(rs, lambda r: _model_auc(r["guarantee"]))
        lines.append("| " + " | ".join([
            f"{power:g}", _cell(_values(rs, lambda r: r["test"]["accuracy"]), percent=True),
            _cell(delta, percent=True), _cell(_values(rs, lambda r: r["test"].get("auc"))),
            _cell(_values(rs, lambda r: _attack_value(r, "label-norm"))),
            _cell(_values(rs, lambda r: _attack_value(r, "label-direction"))),
            f"{np.nanmax(bound):.3f}" if np.isfinite(bound).any() else "—"]) + " |")
    return "\n".join(lines)


def curve_table(runs: Sequence[dict[str, Any]], modes: Sequence[str] = ("dp", "rr-prior")
                ) -> str:
    """Markdown: one row per (mode, figure), one column per label ε: test accuracy (%),
    test AUC, and the norm and direction attacks' AUC (mean ± std)."""
    eps = sorted({float(r["epsilon"]) for r in runs if r.get("labels") in modes
                  and r.get("epsilon") is not None})
    off = [r for r in runs if r.get("labels") == "off"]
    head = ["labels", "figure", *(f"ε = {e:g}" for e in eps), "off"]
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    figures = (("test accuracy (%)", lambda r: r["test"]["accuracy"], True),
               ("test AUC", lambda r: r["test"].get("auc"), False),
               ("norm attack AUC", lambda r: _attack_value(r, "label-norm"), False),
               ("direction attack AUC", lambda r: _attack_value(r, "label-direction"), False))
    for mode in modes:
        for title, get, percent in figures:
            cells = [mode, title]
            for e in eps:
                rs = [r for r in runs if r.get("labels") == mode and r.get("epsilon") == e]
                cells.append(_cell(_values(rs, get), percent=percent) if rs else "")
            cells.append(_cell(_values(off, get), percent=percent) if off else "")
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_curve(runs: Sequence[dict[str, Any]], path: Path, *, title: str,
               modes: Sequence[str] = ("dp", "rr-prior")) -> None:
    """Test AUC (left) and the norm / direction attacks' AUC (right) against the label ε (log
    scale), one line per mode (± std bars), the unprotected run as a dashed level."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10.0, 4.0))
    off = [r for r in runs if r.get("labels") == "off"]
    for ax, (getters, ylabel) in zip(
            (left, right),
            (([("test", lambda r: r["test"].get("auc"))], "test AUC"),
             ([("norm", lambda r: _attack_value(r, "label-norm")),
               ("direction", lambda r: _attack_value(r, "label-direction"))],
              "attack AUC (0.5 = chance)")), strict=True):
        for mode in modes:
            eps = sorted({float(r["epsilon"]) for r in runs if r.get("labels") == mode
                          and r.get("epsilon") is not None})
            if not eps:
                continue
            for name, get in getters:
                vals = [_values([r for r in runs if r.get("labels") == mode
                                 and r.get("epsilon") == e], get) for e in eps]
                label = mode if len(getters) == 1 else f"{mode}: {name}"
                ax.errorbar(eps, [np.nanmean(v) for v in vals], yerr=[np.nanstd(v) for v in vals],
                            marker="o", capsize=3, label=label)
        for _, get in getters:
            if off:
                ax.axhline(float(np.nanmean(_values(off, get))), linestyle="--", color="grey",
                           linewidth=1)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("labels_total_epsilon (δ = 1e-5 for dp)")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    right.axhspan(0.4, 0.6, color="tab:green", alpha=0.08)
    fig.suptitle(title + " (dashed: labels = off)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def point_name(run: dict[str, Any]) -> str:
    """A grid point's row name: the mode, its ε, and how ``dp`` used its releases."""
    mode = str(run.get("labels"))
    if mode in ("dp", "rr-prior") and run.get("epsilon") is not None:
        mode += f" ε={float(run['epsilon']):g}"
    if run.get("labels") == "dp" and run.get("denoise") == "none":
        mode += " (each release as drawn)"
    if run.get("labels") == "dp" and run.get("releases") is not None:
        mode += f", {int(run['releases'])} release{'s' if int(run['releases']) > 1 else ''}"
    if run.get("refit") is False:
        mode += " (no refit)"
    return f"default: {mode}" if run.get("default") else mode


def _single_class(run: dict[str, Any]) -> bool:
    """Whether the run's model predicts one class only on the test split, at its decision
    threshold or at 1/2."""
    decision = run.get("decision") or {}
    shares = [(decision.get("test") or {}).get("predicted_positive"),
              (decision.get("predicted_positive_at_0.5") or {}).get("test")]
    return any(v is not None and float(v) in (0.0, 1.0) for v in shares)


def grid_table(runs: Sequence[dict[str, Any]], dataset: str,
               attacks: Sequence[tuple[str, str]] = ATTACK_COLUMNS + WHITE_BOX_COLUMNS) -> str:
    """Markdown, one dataset of the label-protection grid: one row per point (mode, ε, use of
    the releases), columns test AUC (mean ± std over seeds), its change against the
    unprotected run of the same seed, each attack's AUC (mean ± std) with the most its
    protection's stated guarantee allows in brackets (— : none stated, so only chance), the
    seeds in which every attack stayed within its limit, and the seeds whose model predicts
    one class (at its threshold or at 1/2)."""
    mine = [r for r in runs if r.get("dataset") == dataset]
    points: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for run in mine:
        points[point_name(run)].append(run)
    off = {int(r["seed"]): r for r in mine if r.get("labels") == "off"}
    head = ["labels", "test AUC", "Δ AUC", *(h for _, h in attacks), "holds", "one class"]
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    order: dict[Any, int] = {m: i for i, m in enumerate(MODES)}
    for name in sorted(points, key=lambda n: (order.get(points[n][0].get("labels"), 99),
                                              points[n][0].get("epsilon") or 0,
                                              str(points[n][0].get("denoise")),
                                              str(points[n][0].get("refit")))):
        rs = points[name]
        paired = [r for r in rs if int(r["seed"]) in off]
        delta = _values(paired, lambda r: r["test"]["auc"]) - _values(
            [off[int(r["seed"])] for r in paired], lambda r: r["test"]["auc"])
        cells = [name, _cell(_values(rs, lambda r: r["test"].get("auc"))),
                 _cell(delta) if rs[0].get("labels") != "off" else ""]
        for attack, _ in attacks:
            value = _cell(_values(rs, lambda r, a=attack: _attack_value(r, a)))
            limits = _values(rs, lambda r, a=attack: ((r.get("attacks") or {}).get(a) or {})
                             .get("limit"))
            limit = f"{np.nanmax(limits):.3f}" if np.isfinite(limits).any() else "—"
            if is_population_attack(attack):
                limit = "not judged"
            cells.append(f"{value} ({limit})" if value != "—" else value)
        cells.append(f"{sum(_holds(r) for r in rs)}/{len(rs)}")
        cells.append(f"{sum(_single_class(r) for r in rs)}/{len(rs)}")
        lines.append("| " + " | ".join(cells) + " |")
    seeds = sorted({int(r["seed"]) for r in mine})
    lines += ["", f"Mean ± std over seeds {seeds}; Δ AUC against the unprotected run of the "
                  "same seed. Attack columns: AUC (read by its distance from 0.5, either way) "
                  "and, in brackets, the most AUC the protection's stated guarantee allows "
                  "(—: none stated, so only chance ± 0.1 counts as holding); holds: seeds in "
                  "which every attack stayed within its limit (within twice its standard "
                  "error), completion apart (it reads the task from the features, which no "
                  "label guarantee bounds: reported, not judged); one class: seeds whose "
                  "model predicts a single class on the test split at its decision threshold "
                  "or at 1/2."]
    return "\n".join(lines)
