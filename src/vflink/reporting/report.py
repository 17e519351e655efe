"""``vflink report``: one self-contained, offline HTML page for a run or an experiment.

Everything is inline: styles in a ``<style>`` element, figures as base64 ``data:`` PNGs drawn
with matplotlib's object API (no display), no script and no external URL, so the page opens
from a file, offline, and can be mailed as it is.

A run directory gives, first, a summary a reader sees without scrolling (task metric, linkage,
privacy and each attack's verdict, one line each), then the metrics and learning curve, the
attack results, the privacy ledger (data-carrying messages first, control messages folded), for
soft-linkage runs the sorted-similarity curve (FedSim Figure 4), Δ (§4.3) and the weight gate's
similarity → weight mapping (Figure 10, middle), communication per party and direction, and
the settings that applied to the run (paths relative to the run directory). An experiment
directory gives its tables (mean ± std over seeds) and its plot.
"""

from __future__ import annotations

import base64
import html
import io
import json
import logging
import math
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from vflink._files import atomic_write_text, check_directory, read_data_file, read_json_file
from vflink._typed import typed
from vflink.errors import DataError
from vflink.metrics.attacks import auc_verdict
from vflink.privacy.ledger import LEDGER_FILE, Ledger, explain_epsilon
from vflink.randomness import NOT_PRIVATE, REPRODUCIBLE, SWITCH
from vflink.reporting.ledger import explain_tau, label_verdict
from vflink.runfiles.results import METRICS_SCHEMA

__all__ = ["build_report", "write_report"]

log = logging.getLogger(__name__)

#: Largest plot.png inlined into a page.
_MAX_PLOT_BYTES = 32 * 1024 * 1024

_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0 auto;
       max-width: 1100px; padding: 1.5rem; color: #1d1d1f; background: #fff; }
h1 { font-size: 1.6rem; margin-bottom: .2rem; } h2 { border-bottom: 2px solid #e3e3e8;
     padding-bottom: .2rem; margin-top: 2rem; } h3 { margin-bottom: .3rem; }
.lead { color: #555; margin-top: 0; }
table { border-collapse: collapse; margin: .6rem 0 1rem; font-size: .92rem; }
th, td { border: 1px solid #d5d5dc; padding: .3rem .55rem; text-align: left;
         vertical-align: top; }
th { background: #f3f3f7; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
figure { margin: .5rem 0 1rem; } figure img { max-width: 100%; border: 1px solid #e3e3e8; }
figcaption { color: #555; font-size: .88rem; }
.note { color: #555; font-size: .9rem; } .explain { color: #333; max-width: 42rem; }
.not-private { color: #a00; font-weight: bold; }
.badge { display: inline-block; padding: 0 .4rem; border-radius: .3rem; font-size: .82rem;
         background: #eef; } .badge.none { background: #fde8e8; }
#summary { background: #f7f7fa; border: 1px solid #e3e3e8; border-radius: .4rem;
           padding: .2rem 1rem .5rem; margin-top: 1rem; }
#summary h2 { margin-top: .6rem; border: 0; font-size: 1.15rem; }
#summary dl { display: grid; grid-template-columns: 6.5rem 1fr; gap: .35rem .8rem;
              margin: .3rem 0; }
#summary dt { font-weight: 600; } #summary dd { margin: 0; }
#summary ul { margin: 0; padding-left: 1.1rem; }
details summary { cursor: pointer; color: #333; margin: .3rem 0; }
"""


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _fmt(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return "—" if value is None else str(value).lower()
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if math.isnan(value):
            return "n/a"
        if math.isinf(value):
            return "∞"
        if value.is_integer() and abs(value) < 1e9:  # counts stored as floats: 20,000
            return f"{int(value):,}"
        return f"{value:.4g}"
    if isinstance(value, (list, tuple)):
        return ", ".join(_fmt(v) for v in value)
    return str(value)


def _table(head: Sequence[str], rows: Iterable[Sequence[Any]], *, cls: str = "") -> str:
    out = [f'<table class="{_e(cls)}"><thead><tr>'
           + "".join(f"<th>{_e(h)}</th>" for h in head) + "</tr></thead><tbody>"]
    for row in rows:
        cells = []
        for v in row:
            num = isinstance(v, (int, float)) and not isinstance(v, bool)
            cells.append(f'<td class="num">{_e(_fmt(v))}</td>' if num
                         else f"<td>{_e(_fmt(v))}</td>")
        out.append("<tr>" + "".join(cells) + "</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def _png(fig: Any) -> str:
    buf = io.BytesIO()
    # metadata: no "Software" entry (it names a web address), so nothing external is embedded
    fig.savefig(buf, format="png", metadata={"Software": None})
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _figure(src: str, alt: str, caption: str, fig_id: str) -> str:
    return (f'<figure id="{_e(fig_id)}"><img alt="{_e(alt)}" src="{src}">'
            f"<figcaption>{_e(caption)}</figcaption></figure>")


def _new_figure(width: float = 6.4, height: float = 3.4) -> Any:
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=100)


# --- run pages ------------------------------------------------------------------------------

def _algorithm_kind(name: Any) -> tuple[str, bool]:
    """(kind, uses K pairs) of a registered algorithm; ("vfl", False) for an unknown name
    (a run directory written by another version)."""
    from vflink.runfiles.algorithms import get_algorithm

    try:
        alg = get_algorithm(str(name))
    except Exception:  # noqa: BLE001 - any registry miss: show the settings of a plain VFL run
        return "vfl", False
    return alg.kind, alg.uses_k


#: the alignment settings each method reads (the others keep their defaults, unused)
_ALIGNMENT_KEYS: dict[str, tuple[str, ...]] = {
    "exact": ("method", "unmatched", "secret_env"),
    "psi": ("method", "protocol", "group", "unmatched"),
    "psu": ("method", "group", "alpha", "beta"),
    "soft": ("method", "unmatched", "metric", "top_k", "tau", "sigma", "delta", "privacy",
             "search", "pool", "fields", "blocking", "model", "threshold", "one_to_one",
             "secret_env"),
}


def _relative(path: Any, run_dir: Path) -> str:
    """A data path as seen from the run directory: the page may be mailed, and a local
    absolute path says nothing to its reader (and tells them the sender's directory layout)."""
    text = str(path)
    if not os.path.isabs(text):
        return text
    try:
        return os.path.relpath(text, start=run_dir.resolve())
    except ValueError:  # another drive (Windows): the file's name is what is left to say
        return Path(text).name


def _config_rows(config: dict[str, Any], run_dir: Path) -> list[tuple[str, Any]]:
    """The settings that applied to this run: alignment settings of its method only, model and
    training settings its algorithm reads, privacy and policy sections only when set."""
    data = config.get("data", {})
    kind, uses_k = _algorithm_kind(config.get("algorithm"))
    rows: list[tuple[str, Any]] = [("algorithm", config.get("algorithm")),
                                   ("seed", config.get("seed"))]
    if data.get("dataset"):
        rows.append(("dataset", data["dataset"]))
        if data.get("options"):
            opts = {k: _relative(v, run_dir) if k == "path" else v
                    for k, v in data["options"].items()}
            rows.append(("dataset options", json.dumps(opts, sort_keys=True)))
    for p in data.get("parties", []) or []:
        rows.append((f"party {p.get('name')}",
                     f"{p.get('role')}: {_relative(p.get('path'), run_dir)}"))
    alignment = dict(config.get("alignment") or {})
    method = str(alignment.get("method", "exact"))
    keys = _ALIGNMENT_KEYS.get(method, tuple(alignment))
    if method == "soft" and alignment.get("privacy") == "off":
        keys = tuple(k for k in keys if k != "secret_env")  # no filters: no secret keys them
    if method == "soft" and alignment.get("fields"):
        keys = tuple(k for k in keys if k != "metric")  # each field has its own
    sections: list[tuple[str, dict[str, Any], tuple[str, ...] | None]] = [
        ("alignment", alignment, keys)]
    model = dict(config.get("model") or {})
    model_keys = ["hidden", "top_hidden", "activation", "dropout", "standardize"]
    if kind not in ("solo", "combine"):
        model_keys.insert(1, "cut_dim")
    if uses_k:
        model_keys += ["pair_dim", "aggregator"]
    sections.append(("model", model, tuple(model_keys)))
    training = dict(config.get("training") or {})
    train_keys = [k for k in training if k != ("batch_size" if uses_k else "knn_batch_size")]
    sections.append(("training", training, tuple(train_keys)))
    evaluation = dict(config.get("evaluation") or {})
    sections.append(("evaluation", evaluation,
                     ("record", "record_rows") if evaluation.get("record") else ("record",)))
    privacy = dict(config.get("privacy") or {})
    # the labels' default (no `labels` key) is said in the summary, by what the run applied
    if privacy.get("embeddings", "off") != "off" or privacy.get("labels") not in (None, "off"):
        sections.append(("privacy", privacy, None))
    if config.get("policy"):
        sections.append(("policy", dict(config["policy"]), None))
    for section, values, wanted in sections:
        for key in wanted if wanted is not None else tuple(values):
            value = values.get(key)
            if value is None or value == [] or value == ():
                continue
            if isinstance(value, dict) or (isinstance(value, list) and any(
                    isinstance(v, (dict, list)) for v in value)):
                value = json.dumps(value, sort_keys=True)
            rows.append((f"{section}.{key}", value))
    return rows


def _learning_curve(metrics: dict[str, Any]) -> str:
    epochs = metrics.get("epochs", [])
    if not epochs:
        return '<p class="note">No epochs recorded.</p>'
    headline = metrics.get("headline_metric", "accuracy")
    fig = _new_figure()
    ax1 = fig.add_subplot()
    xs = [e["epoch"] for e in epochs]
    ax1.plot(xs, [e["train_loss"] for e in epochs], color="tab:blue", marker=".",
             label="train loss")
    ax1.set_xlabel("epoch")
    ax1.set_ylabel("train loss", color="tab:blue")
    ax2 = ax1.twinx()
    ax2.plot(xs, [e["validation"].get(headline, math.nan) for e in epochs], color="tab:orange",
             marker=".", label=f"validation {headline}")
    ax2.set_ylabel(f"validation {headline}", color="tab:orange")
    ax1.axvline(metrics.get("best_epoch", 0), color="grey", linestyle=":")
    from matplotlib.ticker import MaxNLocator

    ax1.xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.tight_layout()
    return _figure(_png(fig), "learning curve", f"Training loss and validation {headline} per "
                   f"epoch; dotted line: best epoch ({metrics.get('best_epoch')}), whose model "
                   "is kept.", "learning-curve-figure")


def _linkage(figures: dict[str, Any] | None, alignment: dict[str, Any]) -> str:
    if alignment.get("method") != "soft":
        return ('<p class="note">Exact alignment (keyed hashes): no similarities, so no '
                "similarity curve, Δ or weight gate.</p>")
    tau, eps = alignment.get("tau"), alignment.get("epsilon")
    parts = [_table(("figure", "value", "meaning"), [
        ("μ0", alignment.get("mu0"), "mean of the negative distances (Eq. 1)"),
        ("σ0", alignment.get("sigma0"), "their standard deviation (Eq. 1)"),
        ("σ", alignment.get("sigma"), "noise added to every similarity (Eq. 2)"),
        ("τ", alignment.get("tau"), "FedSim Theorem 2: " + explain_tau(float(tau))
         if tau is not None else "no noise bound"),
        ("ε", alignment.get("epsilon"), "FedSim Theorem 1: " + explain_epsilon(
            float(eps) if eps is not None else None, alignment.get("delta"))),
    ])]
    model = alignment.get("model")
    if model:
        parts.append("<h3>Linkage decisions (Fellegi–Sunter, trained without labels)</h3>")
        parts.append(_table(("figure", "value", "meaning"), [
            ("threshold", model.get("threshold"), "match probability of a match"),
            ("one-to-one", model.get("one_to_one") or "none", "each record matched at most "
                                                              "once"),
            ("λ", model.get("lambda"), "prior probability that two records match"),
            ("expected matches", model.get("expected_matches"), "Σ of the one-to-one "
                                                                "posteriors"),
            ("estimated precision", model.get("estimated_precision"), "no labels used"),
            ("estimated recall", model.get("estimated_recall", "not estimated"),
             "with the blocking rules' estimated recall; not estimated where the rules' "
             "recall or the model's fit cannot be checked"),
            ("estimated F1", model.get("estimated_f1", "not estimated"), "no labels used"),
            ("matched fraction", model.get("matched_fraction"), "primary records with a "
                                                                 "match"),
        ]))
        parts.append('<p class="explain">The coordinator trained the model on the encodings '
                     "and kept its m/u table; the primary received each link's decision, its "
                     "noised similarity (the normalised match weight) and these aggregates. "
                     "<code>vflink link --model fellegi-sunter</code> shows the m/u table, the "
                     "match-weight chart and one pair's waterfall.</p>")
    if not figures:
        parts.append('<p class="note">This run kept one link per record (K = 1): no curve.</p>')
        return "".join(parts)
    curve = figures["curve"]
    ks = list(range(1, int(figures["k"]) + 1))
    fig = _new_figure()
    ax = fig.add_subplot()
    ax.fill_between(ks, curve["p10"], curve["p90"], color="tab:blue", alpha=0.2,
                    label="10–90 % of records")
    ax.plot(ks, curve["mean"], color="tab:blue", marker="o", label="mean")
    ax.set_xlabel("rank k of the linked record")
    ax.set_ylabel("scaled similarity")
    ax.legend(fontsize="small")
    fig.tight_layout()
    parts.append(_figure(_png(fig), "similarity curve", "Each record's similarities to its K "
                         "linked records, scaled to [0, 1] per record and sorted (FedSim "
                         "Figure 4).", "similarity-curve"))
    delta = figures.get("delta", {})
    parts.append("<h3>Improvement estimate Δ (FedSim §4.3)</h3>")
    parts.append(_table(("baseline", "Δ"), [(k, v) for k, v in delta.items()]))
    parts.append('<p class="explain">Δ counts, per record, the information a baseline loses '
                 "(similar records it ignores) or blurs (weakly similar records it treats as "
                 "matches); the larger Δ, the more FedSim is expected to gain over it. Δ "
                 "against Exact needs the raw distances, which only the coordinator holds "
                 "(see <code>vflink link</code>).</p>")
    gate = figures.get("weight_gate")
    if gate:
        fig = _new_figure(5.2, 3.2)
        ax = fig.add_subplot()
        ax.plot(gate["similarity"], gate["weight"], color="tab:green")
        ax.set_xlabel("similarity s")
        ax.set_ylabel("weight w")
        fig.tight_layout()
        parts.append(_figure(_png(fig), "weight gate", "The weight gate's learned mapping "
                             "from similarity to weight (FedSim Figure 10, middle), over the "
                             "similarities of this run.", "weight-gate"))
    return "".join(parts)


def _communication(metrics: dict[str, Any]) -> str:
    total = metrics.get("communication_total", {}) or {}
    align = (metrics.get("alignment") or {}).get("communication", {}) or {}
    rows = []
    per_party: dict[str, list[int]] = {}
    for stage, table in (("alignment", align), ("training", total)):
        for direction, v in table.items():
            rows.append((stage, direction, v["messages"], v["bytes"]))
            sender, _, receiver = direction.partition("->")
            per_party.setdefault(sender, [0, 0])[0] += int(v["bytes"])
            per_party.setdefault(receiver, [0, 0])[1] += int(v["bytes"])
    if not rows:
        return '<p class="note">Nothing crossed a party boundary (a centralised baseline).</p>'
    return (_table(("stage", "direction", "messages", "bytes"), rows)
            + "<h3>Per party</h3>"
            + _table(("party", "bytes sent", "bytes received"),
                     [(p, s, r) for p, (s, r) in sorted(per_party.items())]))


def _is_control(message: dict[str, Any]) -> bool:
    return str(message.get("explanation", "")).startswith("control:")


def _ledger(ledger: Ledger | None) -> str:
    if ledger is None:
        return '<p class="note">No privacy ledger (privacy.json) in this run directory.</p>'
    head = ("stage", "message", "from", "to", "count", "bytes", "protection", "what it means")

    def rows(control: bool) -> list[tuple[Any, ...]]:
        return [(m["stage"], m["kind"], m["sender"], m["receiver"], m["count"], m["bytes"],
                 m["protection"], m["explanation"]) for m in ledger.messages
                if _is_control(m) == control]

    data, control = rows(False), rows(True)
    parts = ['<div id="ledger-messages">',
             "<h3>Messages that carry data</h3>",
             _table(head, data, cls="ledger") if data
             else '<p class="note">None: nothing but control messages crossed.</p>']
    if control:
        # control messages carry parameters and requests, no record's data: folded, not hidden
        parts.append(f"<details><summary>{len(control)} control messages (parameters and "
                     "requests, no record's data)</summary>"
                     + _table(head, control, cls="ledger") + "</details>")
    parts.append("</div>")
    if ledger.protections:
        parts.append("<h3>Protections</h3>")
        seeded = _seeded(ledger)
        if seeded:
            parts.append(f'<p class="not-private">{_e(NOT_PRIVATE.upper())}: the noise of '
                         f"{_e(', '.join(seeded))} was seeded ({_e(SWITCH)} = true): whoever "
                         "holds the seed regenerates it and subtracts it, so no figure below "
                         "protects anything against that party.</p>")
        elif any("noise" in (p.get("params") or {}) for p in ledger.protections):
            parts.append('<p class="note">Every noise below came from the secret source (a '
                         "ChaCha20 stream keyed by the operating system's random source); "
                         "no seed a peer holds regenerates it.</p>")
        parts.append(_table(("protection", "party", "applies to", "parameters", "guarantee",
                             "what it means"),
                            [(p["kind"], p["party"], p["applies_to"],
                              json.dumps(p.get("params", {}), sort_keys=True, default=str),
                              json.dumps(p.get("guarantee", {}), sort_keys=True, default=str),
                              p.get("explanation", "")) for p in ledger.protections]))
    return "".join(parts)


def _attack_verdict(attack: dict[str, Any]) -> str:
    """One line: the attack's verdict in words. An AUC is judged by its distance from 0.5 and
    direction (:func:`auc_verdict`), recomputed here so that a ledger written by an older
    version reads the same as a new one; other attacks give their own sentence."""
    metrics = attack.get("metrics") or {}
    value = metrics.get("auc")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        line = f"AUC {_fmt(float(value))}: {auc_verdict(float(value))}"
        protection = (attack.get("details") or {}).get("protection")
        if isinstance(protection, dict) and "within_limit" in protection \
                and protection["within_limit"] is None:
            line += "; not judged (no label guarantee bounds a population attack)"
        elif isinstance(protection, dict) and "within_limit" in protection:
            limit = protection.get("limit")
            line += ("; " + ("within" if protection["within_limit"] else "BEYOND")
                     + (f" the stated limit AUC ≤ {_fmt(_number(limit))}"
                        if isinstance(limit, (int, float)) else " chance (no limit stated)"))
        return line
    if "full_success" in metrics and "distance_success" in metrics:
        return (f"recovers the exact distance for {float(metrics['distance_success']):.1%} of "
                f"linked pairs (Theorem 2 bound τ = {_fmt(metrics.get('tau_bound'))}) and a "
                f"whole Bloom filter for {float(metrics['full_success']):.1%} of records")
    return str(attack.get("explanation", "")) or "; ".join(
        f"{k} = {_fmt(v)}" for k, v in metrics.items())


def _attacks(ledger: Ledger | None, run_dir: Path) -> str:
    attacks = ledger.attacks if ledger is not None else []
    if not attacks:
        return ('<p class="note">No attack has been run on this run yet: try '
                "<code>vflink attack --run RUN_DIR --attack label-norm</code> "
                "(<code>vflink attack --list</code> lists them).</p>")
    rows = []
    held = label_verdict(list(attacks))
    for a in attacks:
        metrics = "; ".join(f"{k} = {_fmt(v)}" for k, v in (a.get("metrics") or {}).items())
        rows.append((a.get("attack"), a.get("party"), _attack_verdict(a), metrics,
                     a.get("explanation", "")))
    return ((f'<p class="lead"><b>{_e(held)}</b></p>' if held else "")
            + _table(("attack", "attacker", "verdict", "figures", "what it means"), rows,
                     cls="attacks"))


# --- the summary at the top of a run page -----------------------------------------------------

def _task_line(metrics: dict[str, Any], siblings: list[tuple[str, dict[str, Any]]]) -> str:
    test = (metrics.get("metrics") or {}).get("test") or {}
    headline = metrics.get("headline_metric", "accuracy")
    if not test:
        return "no test metrics recorded"
    first = [headline] if headline in test else []
    figures = ", ".join(f"{k} {_fmt(test[k])}" for k in first + sorted(set(test) - set(first)))
    sizes = metrics.get("sizes") or {}
    line = f"{metrics.get('task')} task, test {figures}"
    if sizes.get("test"):
        line += f" on {_fmt(sizes['test'])} test records"
    others = [f"{alg} {_fmt(values.get(headline))}" for alg, values in siblings
              if values.get(headline) is not None]
    if others:
        line += f"; beside it (same data and seed): {', '.join(others)}"
    return line


def _linkage_line(metrics: dict[str, Any]) -> str:
    a = metrics.get("alignment") or {}
    sizes = metrics.get("sizes") or {}
    method = a.get("method")
    if not a:
        return "no alignment recorded"
    if method == "soft":
        what = (f"top-{_fmt(a.get('top_k'))} soft linkage on {a.get('metric', 'fields')} "
                f"distances ({a.get('encoding')} encodings to the coordinator)")
        noise = a.get("tau")
        what += (f", similarities noised to τ = {_fmt(noise)}" if noise is not None
                 else f", similarity noise σ = {_fmt(a.get('sigma'))}")
    elif method == "exact":
        what = f"exact keys as {a.get('encoding', 'keyed hashes')} digests through a coordinator"
    elif method in ("psi", "psu"):
        what = ("private set intersection" if method == "psi" else "private set union"
                ) + f" ({a.get('group', 'Diffie-Hellman')})"
    else:
        what = str(method)
    primary, aligned = sizes.get("primary_rows"), sizes.get("aligned_rows")
    matched = a.get("matched_fraction") or {}
    if method == "soft":
        what += "; " + _soft_links_line(a, primary, matched)
    else:
        if primary and aligned is not None:
            what += f"; {_fmt(aligned)} of {_fmt(primary)} primary records aligned"
        if matched:
            what += " (" + ", ".join(f"{v:.1%} matched in {k}" for k, v in matched.items()
                                     ) + ")"
    if a.get("secret") and "not a secret" in str(a["secret"]):
        what += f"; secret {a['secret']}"
    return what


#: Keys of a soft alignment's linkage model (``alignment.model`` of a run's metrics, e.g. the
#: Fellegi-Sunter model's) that estimate its true matches without labels: the expected number
#: of matched primary records, the estimated precision and recall of its decisions. A summary
#: without a model may carry ``estimated_matches`` (one count, or one per secondary) instead.
ESTIMATE_KEYS = ("expected_matches", "estimated_precision", "estimated_recall")


def _soft_links_line(a: dict[str, Any], primary: Any, linked: dict[str, Any]) -> str:
    """What a soft linkage's counts mean: every record is linked to its K nearest records
    whether or not it has a counterpart (FedSim §4.1), so "linked" says nothing of true
    matches; those are known only from an estimate, when the linkage has one."""
    k = _fmt(a.get("top_k"))
    n = _fmt(primary) if primary else "the"
    parts = []
    full = [name for name, v in linked.items() if isinstance(v, (int, float)) and v >= 1.0]
    if linked and len(full) == len(linked):
        parts.append(f"every one of {n} primary records is linked to its {k} nearest "
                     f"records in {', '.join(linked)} (a soft link gives each record K "
                     f"neighbours, whether or not it has a counterpart there)")
    else:
        shown = ", ".join(f"{v:.1%} in {name}" for name, v in linked.items()
                          if isinstance(v, (int, float)))
        parts.append(f"primary records linked to their {k} nearest records: {shown or 'n/a'} "
                     "(the others had an empty identifier or no candidate; a soft link "
                     "gives every other record K neighbours, whether or not it has a "
                     "counterpart)")
    model: dict[str, Any] = a["model"] if isinstance(a.get("model"), dict) else {}
    source = model or a
    raw = source.get("expected_matches", a.get("estimated_matches"))
    # per secondary ({name: count}) or one count; booleans and other values are not counts
    estimate: dict[str, float] = {
        str(name): float(v) for name, v in (raw.items() if isinstance(raw, dict) else
                                            [("", raw)])
        if isinstance(v, (int, float)) and not isinstance(v, bool)}
    if estimate:
        counts = ", ".join(f"≈ {round(v):,}" + (f" in {name}" if name else "")
                           for name, v in estimate.items())
        name = model.get("model") or model.get("name") or (
            a.get("model") if isinstance(a.get("model"), str) else None)
        extra = [f"{word} {_fmt(source[key])}" for key, word in
                 (("estimated_precision", "precision"), ("estimated_recall", "recall"))
                 if isinstance(source.get(key), (int, float))]
        line = (f"true matches, estimated without labels{f' by the {name} model' if name else ''}"
                f": {counts} of {n} primary records"
                + (f" (its decisions' {', '.join(extra)}, estimated)" if extra else ""))
        decided = model.get("matched_fraction")
        if isinstance(decided, (int, float)) and not isinstance(decided, bool):
            line += f"; it decided {decided:.1%} of the primary records matched"
        parts.append(line)
    else:
        parts.append("how many of these links are true matches is not known (no linkage "
                     "model estimated it; records without a counterpart are linked too)")
    return "; ".join(parts)


def _seeded(ledger: Ledger) -> list[str]:
    """The protections whose noise came from a reproducible (seeded) source."""
    return [f"{p.get('kind')} ({p.get('party')})" for p in ledger.protections
            if (p.get("params") or {}).get("noise") == REPRODUCIBLE]


def _privacy_line(ledger: Ledger | None) -> str:
    if ledger is None:
        return "no privacy ledger in this run directory"
    data = [m for m in ledger.messages if not _is_control(m)]
    clear = sorted({m["kind"] for m in data if m.get("protection") == "none"})
    protected = sorted({f"{m['kind']} ({m['protection']})" for m in data
                        if m.get("protection") != "none"})
    parts = []
    seeded = _seeded(ledger)
    if seeded:  # before any figure: the figures protect nothing against the seed's holder
        parts.append(f"{NOT_PRIVATE.upper()} ({', '.join(seeded)})")
    if protected:
        parts.append("protected: " + ", ".join(protected))
    if clear:
        parts.append("in clear: " + ", ".join(clear))
    parts.extend(_directions(ledger, data))
    dp = []
    for p in ledger.protections:
        if p.get("kind") == "embedding-dp" or str(p.get("kind", "")).startswith("label-"):
            continue  # said per direction above
        eps = (p.get("guarantee") or {}).get("epsilon")
        if isinstance(eps, (int, float)) and not isinstance(eps, bool):
            words = explain_epsilon(float(eps), (p.get("guarantee") or {}).get("delta"))
            dp.append(f"{p['kind']} {words.split(';')[0]}")
    if dp:
        parts.append("differential privacy: " + "; ".join(dp))
    return "; ".join(parts) if data or dp else "nothing but control messages crossed"


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        else None


def _directions(ledger: Ledger, data: list[dict[str, Any]]) -> list[str]:
    """Both directions' guarantees: the secondaries' embeddings, the primary's labels."""
    out = []
    emb = [p for p in ledger.protections if p.get("kind") == "embedding-dp"]
    if emb:
        out.append("embeddings (secondaries): " + ", ".join(
            f"{p['party']} ε = {_fmt(_number((p.get('guarantee') or {}).get('epsilon_total')))}"
            f" (δ = {_fmt(_number((p.get('guarantee') or {}).get('delta_total')))})"
            for p in emb))
    label = next((p for p in ledger.protections
                  if str(p.get("kind", "")).startswith("label-")), None)
    if label is not None:
        g = label.get("guarantee") or {}
        mode = str(label["kind"]).removeprefix("label-")
        if mode == "dp":
            what = f"dp ε = {_fmt(_number(g.get('epsilon')))} (δ = {_fmt(_number(g.get('delta')))})"
        elif mode == "rr-prior":
            what = f"rr-prior ε = {_fmt(_number(g.get('epsilon')))}"
        elif mode == "marvell":
            what = "marvell (no formal guarantee; its AUC figure is a model's, per batch)"
        else:
            what = f"{mode} (no formal guarantee)"
        out.append(f"labels ({label['party']}): {what}")
    elif any(m.get("kind") == "backward" for m in data):
        out.append("labels: NOT protected, the gradients sent back reveal them "
                   "(docs/how-to/label-protection.md)")
    return out


def _summary(metrics: dict[str, Any], ledger: Ledger | None,
             siblings: list[tuple[str, dict[str, Any]]], recorded: bool) -> str:
    attacks = ledger.attacks if ledger is not None else []
    held = label_verdict(list(attacks))
    if attacks:
        verdicts = ((f"<p><b>{_e(held)}</b></p>" if held else "") + "<ul>" + "".join(
            f"<li><b>{_e(a.get('attack'))}</b> by {_e(a.get('party'))}: "
            f"{_e(_attack_verdict(a))}</li>" for a in attacks) + "</ul>")
    elif recorded:
        verdicts = ("none run yet (<code>vflink attack --run RUN_DIR --attack "
                    "NAME</code>)")
    else:  # an attack reads what a party recorded: say how to get a run it can attack
        verdicts = ("none: this run recorded nothing to attack (train with "
                    "<code>[evaluation] record = true</code>)")
    lines = (("Task", _e(_task_line(metrics, siblings))),
             ("Linkage", _e(_linkage_line(metrics))),
             ("Privacy", _e(_privacy_line(ledger))),
             ("Attacks", verdicts))
    return ('<section id="summary"><h2>Summary</h2><dl>'
            + "".join(f"<dt>{t}</dt><dd>{body}</dd>" for t, body in lines)
            + "</dl></section>")


def _section(sid: str, title: str, body: str) -> str:
    return f'<section id="{_e(sid)}"><h2>{_e(title)}</h2>{body}</section>'


def _page(title: str, lead: str, sections: list[str]) -> str:
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>"
            f"<h1>{_e(title)}</h1><p class=\"lead\">{_e(lead)}</p>"
            + "".join(sections) + "</body></html>\n")


def _read_json(directory: Path, name: str | Path) -> Any:
    """A JSON object from a file of ``directory``: a regular file inside it, within size and
    nesting limits (a directory from elsewhere is data); a ``metrics.json`` also with
    the types the page uses (:data:`vflink.runfiles.results.METRICS_SCHEMA`)."""
    value = read_json_file(directory, name)
    if not isinstance(value, dict):
        raise DataError(f"{Path(directory) / name}: expected a JSON object, got "
                        f"{type(value).__name__}")
    if Path(name).name == "metrics.json":
        value = typed(value, METRICS_SCHEMA, source=str(Path(directory) / name))
    return value


def _exists(path: Path) -> bool:
    """Whether ``path`` exists, a dangling or planted link included (it is then refused when
    read, instead of silently skipped)."""
    return os.path.lexists(path)


def _siblings(run_dir: Path, config: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(algorithm, test metrics) of the other runs next to this one with the same data and
    seed, e.g. the solo / splitnn / combine runs of ``vflink demo``; never this run itself."""
    out = []
    here = run_dir.resolve()
    for sibling in sorted(run_dir.parent.iterdir()) if run_dir.parent.is_dir() else []:
        if sibling.resolve() == here:
            continue
        if not (sibling.is_dir() and _exists(sibling / "config.json")
                and _exists(sibling / "metrics.json")):
            continue  # not a run directory
        try:  # another run's files are not this report's: a bad one is skipped, not fatal
            other = _read_json(sibling, "config.json")
            result = _read_json(sibling, "metrics.json")
            test = (result.get("metrics") or {}).get("test", {})
            if not isinstance(test, dict):
                raise DataError(f"{sibling / 'metrics.json'}: metrics.test is not an object")
        except (DataError, AttributeError) as exc:
            log.warning("skipped the run beside this one at %s: %s", sibling,
                        exc if isinstance(exc, DataError) else "metrics.json has an "
                        "unexpected shape")
            continue
        if other.get("data") != config.get("data") or other.get("seed") != config.get("seed"):
            continue
        out.append((str(result.get("algorithm")), test))
    return out


def _baselines(metrics: dict[str, Any], siblings: list[tuple[str, dict[str, Any]]]) -> str:
    """This run's test metrics beside its siblings'; nothing when it has none (a table of the
    run alone would only repeat the metrics above)."""
    if not siblings:
        return ""
    test = (metrics.get("metrics") or {}).get("test") or {}
    names = sorted(test)
    rows = [(f"{metrics.get('algorithm')} (this run)", *[test.get(k) for k in names])]
    rows += [(alg, *[values.get(k) for k in names]) for alg, values in siblings]
    return ("<h3>Against the runs beside it (same data and seed)</h3>"
            + _table(("algorithm", *[f"test {n}" for n in names]), rows, cls="baselines"))


def _run_page(run_dir: Path) -> str:
    metrics = _read_json(run_dir, "metrics.json")
    config = _read_json(run_dir, "config.json")
    ledger = Ledger.read(run_dir / LEDGER_FILE) if _exists(run_dir / LEDGER_FILE) else None
    alignment = metrics.get("alignment", {}) or {}
    siblings = _siblings(run_dir, config)
    split_rows = [(split, *[values.get(k) for k in sorted(values)])
                  for split, values in metrics.get("metrics", {}).items()]
    names = sorted(next(iter(metrics.get("metrics", {}).values()), {}))
    sizes = metrics.get("sizes", {})
    metric_body = _table(("split", *names), split_rows)
    metric_body += _baselines(metrics, siblings)
    metric_body += "<h3>Sizes</h3>" + _table(("size", "value"), sorted(sizes.items()))
    title = f"vflink run: {metrics.get('algorithm')}"
    epochs = len(metrics.get("epochs") or [])
    lead = (f"{run_dir.name}: best epoch {metrics.get('best_epoch')} of {epochs}, "
            f"{_fmt(metrics.get('seconds'))} s")
    linkage_title = ("Soft linkage" if alignment.get("method") == "soft" else "Linkage")
    sections = [
        _summary(metrics, ledger, siblings,
                 bool((config.get("evaluation") or {}).get("record"))),
        _section("metrics", "Metrics", metric_body),
        _section("learning-curve", "Learning curve", _learning_curve(metrics)),
        _section("attacks", "Attack results", _attacks(ledger, run_dir)),
        _section("privacy-ledger", "Privacy ledger", _ledger(ledger)),
        _section("linkage", linkage_title, _linkage(metrics.get("linkage_figures"),
                                                   alignment)),
        _section("communication", "Communication", _communication(metrics)),
        _section("configuration", "Settings that applied",
                 _table(("setting", "value"), _config_rows(config, run_dir))),
    ]
    return _page(title, lead, sections)


# --- experiment pages -------------------------------------------------------------------------

def _experiment_page(exp_dir: Path) -> str:
    results = _read_json(exp_dir, "results.json")
    sweep = results.get("sweep", {})
    values = [str(v) for v in sweep.get("values", [])]
    algorithms = results.get("algorithms", [])
    parts = []
    first = results["summary"][values[0]][algorithms[0]] if values and algorithms else {}
    for metric in first:
        head = [f"{sweep.get('key')} = {v}" if sweep.get("key") else metric for v in values]
        rows = []
        for alg in algorithms:
            cells = []
            for v in values:
                stat = results["summary"][v][alg][metric]
                cells.append(f"{_fmt(stat['mean'])} ± {_fmt(stat['std'])}")
            rows.append((alg, *cells))
        parts.append(f"<h3>{_e(metric)}</h3>" + _table(("algorithm", *head), rows,
                                                        cls="results"))
    body = "".join(parts) or '<p class="note">No results.</p>'
    plot = exp_dir / "plot.png"
    figure = ""
    if _exists(plot):
        png = read_data_file(exp_dir, plot.name, max_bytes=_MAX_PLOT_BYTES)
        src = "data:image/png;base64," + base64.b64encode(png).decode("ascii")
        figure = _figure(src, "experiment plot", f"Test {results.get('headline_metric')} "
                         "per algorithm (mean ± std over seeds).", "experiment-plot")
    runs = [(r.get("algorithm"), r.get("seed"), r.get("sweep"),
             (r.get("test") or {}).get(results.get("headline_metric", "")), r.get("bytes"),
             r.get("seconds")) for r in results.get("runs", [])]
    sections = [
        _section("results", "Results (mean ± std over seeds)", body),
        _section("plot", "Plot", figure or '<p class="note">No plot.</p>'),
        _section("runs", "Runs", _table(("algorithm", "seed", "sweep", "test "
                                         + str(results.get("headline_metric")), "bytes",
                                         "seconds"), runs)),
    ]
    lead = f"seeds {results.get('seeds')}, algorithms {', '.join(algorithms)}"
    return _page(f"vflink experiment: {results.get('name')}", lead, sections)


def _comparison_page(demo_dir: Path) -> str:
    """``vflink demo``'s directory: its comparison table and each run's learning curve."""
    comparison = _read_json(demo_dir, "comparison.json")
    test = comparison.get("test", {})
    names = sorted(next(iter(test.values()), {}))
    sections = [_section("results", "Test metrics", _table(
        ("algorithm", *names), [(alg, *[m.get(n) for n in names]) for alg, m in test.items()],
        cls="results"))]
    for alg in test:
        metrics_file = Path(alg) / "metrics.json"
        if _exists(demo_dir / metrics_file):
            sections.append(_section(f"run-{alg}", f"{alg}: learning curve",
                                     _learning_curve(_read_json(demo_dir, metrics_file))))
    return _page(f"vflink demo: {comparison.get('dataset')}",
                 "Solo, SplitNN and Combine on the same data; open each run directory's own "
                 "report for its ledger", sections)


def build_report(directory: Path) -> str:
    """The HTML page for a run directory, an experiment directory or a demo directory."""
    directory = check_directory(directory, "a run, experiment or demo directory")
    if _exists(directory / "results.json"):
        return _experiment_page(directory)
    if _exists(directory / "comparison.json"):
        return _comparison_page(directory)
    if _exists(directory / "metrics.json"):
        return _run_page(directory)
    raise DataError(f"{directory}: neither a run directory (metrics.json) nor an experiment "
                    "directory (results.json)")


def write_report(directory: Path, out: Path | None = None) -> Path:
    """Write the page (default ``<directory>/report.html``) atomically; returns its path."""
    target = Path(out) if out is not None else Path(directory) / "report.html"
    page = build_report(directory)
    target.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(target, page)  # never through a link planted at the target
    return target
