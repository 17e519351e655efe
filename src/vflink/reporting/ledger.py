"""Write a run's privacy ledger (``privacy.json``, schema in :mod:`vflink.privacy.ledger`).

Protections report their ledger entries in ``RunResult.extra["protections"]`` (a list of dicts
shaped like :meth:`Ledger.add_protection`'s arguments); this module turns a finished run into
the ledger file, so no protection writes files of its own.

On top of what protections report, the ledger lists every kind of message that crossed the
boundary (from the transport's per-kind counts: ``extra["alignment"]["messages"]`` for the
alignment stage, ``extra["messages"]`` for training), each with its protection and a plain
sentence, and the protections of the alignment itself (keyed hashes, Bloom filters, similarity
noise with FedSim's τ and ε).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vflink.linkage.privacy import describe_protection
from vflink.privacy.ledger import LEDGER_FILE, Ledger, explain_epsilon
from vflink.randomness import NOT_PRIVATE, REPRODUCIBLE, SECRET, SWITCH, describe

if TYPE_CHECKING:
    from vflink.runfiles.results import RunResult

__all__ = ["LABELS_IN_CLEAR", "WHITE_BOX_ATTACKS", "build_run_ledger",
           "explain_dictionary_limit", "explain_engine", "explain_tau", "label_verdict",
           "noise_sources", "privacy_summary", "write_run_ledger"]

#: The label attacks that use what a secondary knows of the code (``vflink.attacks.whitebox``):
#: a protection is not called holding before they were run.
WHITE_BOX_ATTACKS = ("label-noise-subtraction", "label-epoch-average", "label-residual")

#: The warning on the gradients a primary sends back with ``[privacy] labels = "off"``.
LABELS_IN_CLEAR = ("WARNING: gradients in clear: they reveal the primary's labels to the "
                   "secondary (its label-norm and label-direction attacks reach AUC 0.9 to 1.0 "
                   "on Adult and on an imbalanced task: docs/how-to/label-protection.md); set "
                   "[privacy] labels = \"dp\" (or \"marvell\") to protect them")

#: What each protocol message carries, when nothing protects it (ARCHITECTURE.md boundary table).
_CARRIES: dict[str, str] = {
    "hello": "control: party name, role and protocol version",
    "health": "control: a liveness request; the reply says only whether the party is busy",
    "ack": "control: an acknowledgement with small counters (rows received, features)",
    "share_keys": "control: a request to send keyed hashes to the coordinator",
    "match_keys": "control: a request to match keyed hashes",
    "share_encodings": "control: the encoding parameters every data party uses",
    "soft_link": "control: linkage parameters (metric, K, τ or σ)",
    "share_field_encodings": "control: each field's columns and encoding parameters, and the "
                             "blocking keys' columns",
    "field_link": "control: linkage parameters (each field's metric and weight, K, τ or σ; "
                  "a model link's levels, threshold and one-to-one rule)",
    "alignment_ready": "control: a request to fetch an alignment",
    "fetch_alignment": "control: a request for this party's view of an alignment",
    "alignment_view": "alignment indices only: the receiver learns which of its rows are linked "
                      "to a primary record",
    "setup_bottom": "control: model hyperparameters and the run's seed (weights' "
                    "initialisation, dropout masks)",
    "fit_preprocessing": "row numbers: the secondary learns which of its records are linked",
    "forward": "row numbers: the secondary learns which of its records are in each batch",
    "embeddings": "cut-layer embeddings in clear: the primary could try to invert them or "
                  "infer membership",
    "backward": LABELS_IN_CLEAR,
    "snapshot": "control: keep the current model", "restore": "control: restore a model",
    "save_state": "control: write this party's own state", "load_state": "control: load it",
    "confirm_key": "control: a fresh nonce for key confirmation (docs: how-to, "
                   "parties on separate hosts)",
    "fetch_key_tags": "control: a request for the other data parties' key-confirmation tags",
    "setup_privacy": "control: the public settings of the embedding protection (never a noise "
                     "seed)",
    "fetch_privacy_report": "control: a request for the secondary's ledger entries",
    "set_progress": "control: how far the primary has come computing a PSU/PSI list (it "
                    "keeps the session alive); no element",
    "privacy_report": "the secondary's ledger entries: its protections' public parameters and "
                      "guarantees",
    "engine_psi_open": "control: the PSI engine's run as the primary proposes it (protocol, set "
                       "size, number of key columns, whether its link uses TLS, its engine's "
                       "address) and a fresh key for the UIDs the two parties hash their keys "
                       "with; no key and no element of either set",
    "engine_psi_ready": "control: the secondary's set size, its engine's address and its "
                        "policy's limits",
    "engine_psi_status": "control: how far each party's engine has come; no element",
    "engine_psi_result": "the size of the intersection and a SHA-256 digest of its UIDs, "
                         "which both parties already learnt (with reveal = both only): the "
                         "secondary checks that the two engines' outputs agree",
    "union_setup": "union positions of the secondary's own training records, and model "
                   "hyperparameters: it learns how many of its records train, not which of the "
                   "primary's records exist (FLORIST §2.3)",
    "union_forward": "union positions in each batch: the secondary learns which positions of "
                     "the union train together, not whether the primary holds them (FLORIST "
                     "§2.3)",
}

#: Kinds that carry something protected by construction, whatever the run's settings:
#: (protection, sentence).
_BY_CONSTRUCTION: dict[str, tuple[str, str]] = {
    "key_tag": ("hmac-tag", "a key-confirmation tag, HMAC-SHA256 under the data parties' shared "
                            "secret: it shows the coordinator whether two parties hold the same "
                            "secret, never the secret"),
    "key_digests": ("keyed-hash", "keys as HMAC-SHA256 digests under the data parties' shared "
                                  "secret: the coordinator can tell equal keys apart from "
                                  "different ones, not read them"),
    "key_tags": ("hmac-tag", "the other data parties' key-confirmation tags, relayed: checked "
                             "under the receiver's own secret"),
    **dict.fromkeys(
        ("psu_round1", "psu_chunk", "psu_fetch", "psi_round1", "psi_chunk", "psi_fetch",
         "set_chunk"),
        ("dh-blinding", "shuffled lists of keys hashed to a group and raised to secret "
                        "exponents (FLORIST Algorithm 1, ECDH PSI): the receiver learns set "
                        "sizes, no key")),
}


def explain_tau(tau: float) -> str:
    """A plain sentence on FedSim's Theorem 2 bound τ."""
    if tau >= 1.0:
        return ("τ = 1: no noise on the similarities; an attacker who knows the scaling can "
                "recover every distance exactly")
    return (f"τ = {tau:.3g}: an attacker who maps a similarity back to a distance and guesses a "
            f"Bloom filter from it (FedSim's greedy attack) succeeds at most {tau:.2%} of the "
            "time per record")


def explain_dictionary_limit(party: str, limit: float, window_s: float) -> str:
    """The dictionary limit of a secondary's policy as one sentence (docs/security.md)."""
    span = (f"{window_s / 86400:g} day(s)" if window_s >= 86400 and window_s % 86400 == 0
            else f"{window_s:g} s")
    return (f"a primary that deviates from PSU or PSI (it blinds guessed identifiers as if "
            f"they were its records) learns, for each one, whether {party} holds it: "
            f"{party}'s policy bounds this at {int(limit):,} guessed identifiers per {span} "
            "(min(max_set_guesses, max_set_sessions x max_set_elements); an honest run tests "
            "only the primary's own records)")


def _set_limits(result: RunResult, alignment: dict[str, Any]) -> list[dict[str, Any]]:
    """Each secondary's dictionary limit as its PSU/PSI round 1 stated it."""
    florist = result.extra.get("florist", {}) or {}
    limits = alignment.get("set_limits") or florist.get("set_limits") or {}
    # the round that opens the session (the primary sends it: no message of the secondary's
    # changes its protection entry)
    opens = ("engine_psi_open" if alignment.get("engine") else
             "psi_round1" if alignment.get("set_limits") else "psu_round1")
    out = []
    for party, figures in sorted(dict(limits).items()):
        if not isinstance(figures, dict) or "guess_limit" not in figures:
            continue  # an older peer that did not say
        limit, window = float(figures["guess_limit"]), float(figures.get("guess_window_s",
                                                                          86400.0))
        out.append({"kind": "set-dictionary-limit", "party": str(party),
                    "applies_to": opens,
                    "params": {"guess_limit": int(limit), "window_s": window},
                    "guarantee": {"guesses_per_window": int(limit)},
                    "explanation": explain_dictionary_limit(str(party), limit, window)})
    return out


def explain_engine(party: str, engine: dict[str, Any]) -> str:
    """What a PSI run through the engine gives, as one sentence (the ledger's)."""
    protocol = str(engine.get("protocol", "the engine"))
    reveal = str(engine.get("reveal", "both"))
    who = {"both": "both parties learn the intersection (its rows and a UID per row)",
           "primary": "the primary learns the intersection, the secondary only its own set",
           "secondary": "the secondary learns the intersection, the primary only its own set"
           }.get(reveal, "as agreed")
    tls = "mutual TLS from the parties' certificates" if engine.get("tls") else "plaintext"
    return (f"{protocol.upper()} private set intersection with {party} through SecretFlow's "
            f"engine, secure against a semi-honest peer ONLY: a party that deviates inside "
            f"the engine can learn more than the intersection, and the receiver can misreport "
            f"it; against a deviating primary use the DH PSI (protocol \"dh\"), whose "
            f"answers carry proofs. Each party learns the other's set size; {who}. The "
            f"engine's own link ({tls}) listened on {engine.get('listen', '?')} here and "
            f"dialed {engine.get('peer_address', '?')} ({party}'s engine)")


def _engine_entries(engines: dict[str, Any]) -> list[dict[str, Any]]:
    """One entry per secondary that ran PSI through the engine."""
    out = []
    for party, engine in sorted(engines.items()):
        if not isinstance(engine, dict):
            continue
        out.append({"kind": "psi-engine", "party": str(party), "applies_to": "engine_psi_open",
                    "params": {k: engine.get(k) for k in ("protocol", "reveal", "tls",
                                                           "listen", "peer_address")},
                    "guarantee": {"security": "semi-honest"},
                    "explanation": explain_engine(str(party), engine)})
    return out


def _protections(result: RunResult) -> list[dict[str, Any]]:
    """The alignment's own protections, from the run's alignment summary."""
    a = result.extra.get("alignment", {}) or {}
    method = a.get("method")
    out: list[dict[str, Any]] = _set_limits(result, a)
    if method == "psi" and isinstance(a.get("engine"), dict):
        out.extend(_engine_entries(a["engine"]))
    if method == "exact":
        out.append({"kind": "keyed-hash", "party": "data parties", "applies_to": "key_digests",
                    "params": {"hash": "HMAC-SHA256"}, "guarantee": {},
                    "explanation": "keys are sent as HMAC digests under a secret only the data "
                                   "parties share: the coordinator can tell which keys are "
                                   "equal, and how many each party has, but cannot read them"})
    if method == "soft":
        spec = dict(a.get("encoding_spec") or {})  # the public EncodingSpec of the run
        enc = {"encoder": spec.get("encoder", a.get("encoding")), "kind": spec.get("kind"),
               **dict(spec.get("params") or {})}
        fields = a.get("field_encoding_specs")
        if isinstance(fields, list):  # several fields: one encoding per field
            enc = {"encoder": a.get("encoding"), "fields": len(fields),
                   "kinds": ",".join(str(f.get("kind")) for f in fields)}
        applies_to = "field_encodings" if isinstance(fields, list) else "identifier_encodings"
        model = a.get("model")
        if enc.get("encoder") == "bloom":
            out.append({"kind": "bloom-filter", "party": "data parties",
                        "applies_to": applies_to, "params": enc, "guarantee": {},
                        "explanation": "identifiers are sent as keyed Bloom filters (FedSim App. "
                                       "I): the coordinator sees bit patterns and their Hamming "
                                       "distances, not the identifiers; this is no formal "
                                       "guarantee, similar records still look similar"
                                       + (_MODEL_HASHES if model else "")})
        sigma = a.get("sigma")
        eps = a.get("epsilon")
        delta = a.get("delta")
        tau = a.get("tau")
        if sigma is not None:
            eps_f = float(eps) if eps is not None else math.inf
            # first the protection in one plain sentence, then what each figure means
            sentence = describe_protection(float(sigma), None if tau is None else float(tau),
                                           eps_f, delta) + ". " + explain_epsilon(
                eps_f, delta) + "; " + (
                explain_tau(float(tau)) if tau is not None else "no τ bound")
            noise = str(a.get("noise") or SECRET)
            guarantee_private: dict[str, Any] = {}
            if noise == REPRODUCIBLE:
                sentence = f"{NOT_PRIVATE.upper()}: {describe(noise)}. Otherwise: " + sentence
                guarantee_private["private"] = False
            out.append({"kind": "similarity-noise", "party": "coordinator",
                        "applies_to": "alignment_views",
                        "params": {"noise": noise, "sigma": sigma, "mu0": a.get("mu0"),
                                   "sigma0": a.get("sigma0"), "top_k": a.get("top_k"),
                                   **({"resolution": a["resolution"]}
                                      if "resolution" in a else {})},
                        "guarantee": {"tau": tau, "epsilon": eps_f, "delta": delta,
                                      "theorem": "FedSim Theorem 1 (ε), Theorem 2 (τ)",
                                      **guarantee_private},
                        "explanation": sentence})
        if model:
            out.append({"kind": "linkage-model", "party": "coordinator",
                        "applies_to": "field_link", "params": dict(model), "guarantee": {},
                        "explanation": _MODEL_RELEASE})
    return out


#: What a Fellegi–Sunter link adds to what reaches the coordinator (the ledger's sentence).
_MODEL_HASHES = (
    "; for the Fellegi-Sunter model each field also travels as a keyed hash (HMAC-SHA256, "
    "16 bytes) of its normalised value: the coordinator sees which values are equal and how "
    "often each occurs (equal Bloom filters already show it for strings), never a value")
#: What the primary receives from a Fellegi-Sunter link, and how it is protected.
_MODEL_RELEASE = (
    "the coordinator trains the model and scores the candidate pairs on the encodings it "
    "holds; the primary receives the K best links per record, their similarities (the "
    "Eq. 1-normalised match weights with the Eq. 2 noise above, Theorem 2 on the weight's "
    "largest one-level step), the match probabilities it derives from them (a "
    "post-processing: no further loss), one decision bit per link (its exact probability "
    "reached the threshold and the one-to-one assignment kept it: it tells on which side "
    "of the threshold the exact weight lies) and aggregate estimates (expected matches, "
    "estimated precision, recall and F1, the prior); the m/u table stays with the "
    "coordinator")


def _message_protection(kind: str, sender: str, protections: list[dict[str, Any]],
                        alignment: dict[str, Any]) -> tuple[str, str]:
    for p in protections:
        party = p.get("party")
        if p.get("applies_to") == kind and party in (sender, "data parties", None):
            return str(p["kind"]), str(p.get("explanation", ""))
    if kind == "identifier_encodings":
        return "none", "raw identifiers in clear (privacy off): the coordinator reads them"
    if kind == "field_encodings":
        return "none", ("raw identifier values of some field in clear (privacy off): the "
                        "coordinator reads them; blocking keys only as keyed digests")
    if kind == "alignment_views":
        if alignment.get("method") == "soft":
            return "none", "indices and similarities without noise"
        return "none", ("alignment indices: the primary learns which of its records have a "
                        "counterpart, and the matched set's size")
    if kind in _BY_CONSTRUCTION:
        return _BY_CONSTRUCTION[kind]
    # a kind added to the protocol without a sentence here is caught by a test
    # (tests/unit/runner/test_run_ledger.py); a reader still gets something true
    return "none", _CARRIES.get(kind, "a protocol message without a description in this "
                                      "vflink version: treat its content as visible to the "
                                      "receiver")


def build_run_ledger(result: RunResult) -> Ledger:
    """The ledger of one finished run: every message kind that crossed the boundary, every
    protection (the alignment's own and those the run's parties reported)."""
    ledger = Ledger()
    reported = list(result.extra.get("protections", []) or [])
    alignment = result.extra.get("alignment", {}) or {}
    protections = _protections(result) + reported
    for entry in protections:
        ledger.add_protection(**entry)
    stages = (("alignment", alignment.get("messages", []) or []),
              ("training", result.extra.get("messages", []) or []))
    for stage, entries in stages:
        for m in entries:
            protection, sentence = _message_protection(str(m["kind"]), str(m["sender"]),
                                                       protections, alignment)
            ledger.add_message(kind=str(m["kind"]), sender=str(m["sender"]),
                               receiver=str(m["receiver"]), stage=stage,
                               count=int(m["messages"]), nbytes=int(m["bytes"]),
                               protection=protection, explanation=sentence)
    return ledger


def write_run_ledger(run_dir: Path, result: RunResult) -> Path:
    path = Path(run_dir) / LEDGER_FILE
    build_run_ledger(result).write(path)
    return path


def privacy_summary(result: RunResult) -> str:
    """One line on both directions of a run that trained across the boundary: the
    secondaries' embedding guarantee and the primary's labels (a warning when the gradients it
    sent back were in clear); empty for a run that sent no gradient."""
    messages = result.extra.get("messages", []) or []
    protections = list(result.extra.get("protections", []) or [])
    sent_back = any(m.get("kind") == "backward" for m in messages)
    parts = []
    for p in protections:
        g = p.get("guarantee") or {}
        if p.get("kind") == "embedding-dp":
            parts.append(f"embeddings of {p['party']}: ε = {g.get('epsilon_total', 0.0):.3g} "
                         f"(δ = {g.get('delta_total', 0.0):.0e})")
    label = next((p for p in protections if str(p.get("kind", "")).startswith("label-")),
                 None)
    if label is not None:
        g = label.get("guarantee") or {}
        mode = str(label["kind"]).removeprefix("label-")
        if "epsilon" in g:
            what = f"ε = {g['epsilon']:.3g}" + (f" (δ = {g['delta']:.0e})" if g.get("delta")
                                                else "")
        elif mode == "marvell":
            what = "no formal guarantee (the model's AUC figure is per batch and per row)"
        else:
            what = "no formal guarantee"
        if (g.get("refit") or {}).get("done"):  # the guarantee covers what was sent
            what += " on the gradients sent; its model refit on clean labels (not label-DP)"
        parts.append(f"labels of {label['party']}: {mode}, {what}")
    elif sent_back:
        parts.append("labels: " + LABELS_IN_CLEAR)
    alignment = result.extra.get("alignment", {}) or {}
    seeded = sorted({str(p.get("party")) for p in protections
                     if (p.get("params") or {}).get("noise") == REPRODUCIBLE}
                    | ({"coordinator"} if alignment.get("noise") == REPRODUCIBLE else set()))
    if seeded:  # first, so that nobody reads an ε without it
        parts.insert(0, f"{NOT_PRIVATE.upper()} ({', '.join(seeded)}: `{SWITCH} = true`)")
    elif parts and any("noise" in (p.get("params") or {}) for p in protections):
        parts.append("noise: secret (OS CSPRNG)")
    return ("privacy: " + "; ".join(parts)) if parts else ""


def label_verdict(attacks: list[dict[str, Any]]) -> str | None:
    """One sentence on the label protection against every label attack the ledger holds: it
    "holds within its stated limit" only when every one stayed within the limit its stated
    guarantee sets (``details.protection.within_limit``, written by ``vflink attack``), and
    only once the white-box attacks were among them; ``None`` when no label attack was run."""
    judged: list[tuple[str, dict[str, Any]]] = []
    for a in attacks:
        p = (a.get("details") or {}).get("protection")
        if isinstance(p, dict) and p.get("within_limit") is not None:  # None: not judged
            judged.append((str(a.get("attack")), p))
    if not judged:
        return None
    latest: dict[str, dict[str, Any]] = {}
    for name, p in judged:  # the latest result of each attack
        latest[name] = p
    mode = str(judged[-1][1].get("mode", "?"))
    beyond = [f"{name} (leak {_leak(p)})" for name, p in latest.items()
              if not p["within_limit"]]
    missing = [name for name in WHITE_BOX_ATTACKS if name not in latest]
    if mode == "off":
        return ("labels = off: not protected; " + (f"{len(beyond)} of {len(latest)} label "
                "attacks read them" if beyond else "no label attack run here reads them"))
    if beyond:
        return (f"labels = {mode}: does NOT hold within its stated limit: "
                + ", ".join(beyond) + " go beyond it")
    if missing:
        return (f"labels = {mode}: within its stated limit against the {len(latest)} label "
                f"attacks run, not yet established: run {', '.join(missing)}")
    return (f"labels = {mode}: holds within its stated limit against every label attack run "
            f"({', '.join(latest)})")


def _leak(protection: dict[str, Any]) -> str:
    value, limit = protection.get("leak"), protection.get("limit")
    if not isinstance(value, (int, float)):
        return "beyond chance"
    return f"{value:.3f}" + (f" > {limit:.3f}" if isinstance(limit, (int, float))
                             else ", no limit stated")


def noise_sources(protections: list[dict[str, Any]]) -> dict[str, str]:
    """Where each protection's noise came from, by ``kind/party`` (``"secret"`` or
    ``"reproducible"``): the report's and the summary's reading of the ledger."""
    return {f"{p.get('kind')}/{p.get('party')}": str((p.get("params") or {})["noise"])
            for p in protections if "noise" in (p.get("params") or {})}
