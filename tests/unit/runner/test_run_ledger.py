"""The run ledger: messages with protections and plain sentences; the [evaluation] section."""

from __future__ import annotations

import pytest

from vflink.errors import ConfigError
from vflink.reporting.ledger import build_run_ledger, explain_tau
from vflink.runfiles.config import parse_config
from vflink.runfiles.results import RunResult
from vflink.types import Task


def result(extra: dict) -> RunResult:  # type: ignore[type-arg]
    return RunResult(algorithm="fedsim", task=Task.BINARY, metrics={}, history=(),
                     best_epoch=1, communication={}, sizes={}, seconds=0.0, extra=extra)


def test_soft_linkage_ledger_explains_every_figure() -> None:
    alignment = {"method": "soft", "sigma": 0.4, "tau": 5.07e-5, "epsilon": 4e11,
                 "delta": 1e-5, "mu0": -1.0, "sigma0": 2.0, "top_k": 5,
                 "encoding": "bloom",
                 "encoding_spec": {"encoder": "bloom", "kind": "string",
                                   "params": {"filter_bits": 1024}},
                 "messages": [{"kind": "identifier_encodings", "sender": "bank",
                               "receiver": "coordinator", "messages": 1, "bytes": 100},
                              {"kind": "alignment_views", "sender": "coordinator",
                               "receiver": "primary", "messages": 1, "bytes": 50}]}
    embedding_dp = {"kind": "embedding-dp", "party": "bank", "applies_to": "embeddings",
                    "params": {"clip": 1.0}, "guarantee": {"epsilon": 3.0, "delta": 1e-5},
                    "explanation": "moderate"}
    ledger = build_run_ledger(result({
        "alignment": alignment, "protections": [embedding_dp],
        "messages": [{"kind": "embeddings", "sender": "bank", "receiver": "primary",
                      "messages": 7, "bytes": 700},
                     {"kind": "backward", "sender": "primary", "receiver": "bank",
                      "messages": 7, "bytes": 600}]}))
    by_kind = {m["kind"]: m for m in ledger.messages}
    assert by_kind["identifier_encodings"]["protection"] == "bloom-filter"
    assert by_kind["alignment_views"]["protection"] == "similarity-noise"
    assert "no meaningful differential-privacy guarantee" in \
        by_kind["alignment_views"]["explanation"]
    assert by_kind["embeddings"]["protection"] == "embedding-dp"
    assert by_kind["embeddings"]["stage"] == "training" and by_kind["embeddings"]["count"] == 7
    assert by_kind["backward"]["protection"] == "none"
    assert "labels" in by_kind["backward"]["explanation"]
    kinds = [p["kind"] for p in ledger.protections]
    assert kinds == ["bloom-filter", "similarity-noise", "embedding-dp"]


def test_explain_tau() -> None:
    assert "at most 0.01%" in explain_tau(1e-4)
    assert "no noise" in explain_tau(1.0)


def test_evaluation_section() -> None:
    base = {"version": 1, "data": {"dataset": "sklearn-small"}}
    assert parse_config({**base, "evaluation": {"record": True}}).evaluation.record is True
    assert parse_config(base).evaluation.record is False
    with pytest.raises(ConfigError) as exc:
        parse_config({**base, "evaluation": {"record": "yes", "record_rows": 0, "x": 1}})
    text = str(exc.value.problems)
    assert "record" in text and "record_rows" in text and "unknown" in text


@pytest.mark.parametrize("method", ["exact", "soft", "psi", "psu"])
def test_every_protocol_message_kind_is_classified(method: str) -> None:
    """No ledger row reads "not classified". Every kind the protocol defines,
    sent in any stage, gets a protection and a sentence of its own."""
    from vflink.protocol.messages import MESSAGE_TYPES

    kinds = sorted(MESSAGE_TYPES)
    messages = [{"kind": k, "sender": "primary", "receiver": "secondary", "messages": 1,
                 "bytes": 1} for k in kinds]
    ledger = build_run_ledger(result({"alignment": {"method": method, "messages": messages},
                                      "messages": messages}))
    assert len(ledger.messages) == 2 * len(kinds)
    for m in ledger.messages:
        assert m["explanation"], m["kind"]
        assert "not classified" not in m["explanation"], m["kind"]
        assert "without a description" not in m["explanation"], m["kind"]


def test_key_confirmation_and_set_rounds_are_protected_by_construction() -> None:
    msgs = [{"kind": k, "sender": "primary", "receiver": "coordinator", "messages": 1,
             "bytes": 32} for k in ("key_tag", "psu_round1", "set_chunk")]
    ledger = build_run_ledger(result({"alignment": {"method": "psu", "messages": msgs}}))
    assert {m["kind"]: m["protection"] for m in ledger.messages} == {
        "key_tag": "hmac-tag", "psu_round1": "dh-blinding", "set_chunk": "dh-blinding"}


def test_the_ledger_states_each_secondarys_dictionary_limit() -> None:
    """A PSI or PSU run's ledger says how many guessed identifiers a deviating primary can test
    against each secondary under the policy the secondary stated in round 1."""
    from vflink.parties.policy import PartyPolicy

    default = PartyPolicy()
    assert default.dictionary_limit == 20_000_000  # min(2·10⁷, 200 × 2·10⁶)
    alignment = {"method": "psi", "set_limits": {
        "bank": {"guess_limit": float(default.dictionary_limit), "guess_window_s": 86400.0},
        "old-bank": {}},  # a peer that did not say: no entry, no invented figure
        "messages": [{"kind": "psi_round1", "sender": "primary", "receiver": "bank",
                      "messages": 1, "bytes": 80}]}
    ledger = build_run_ledger(result({"alignment": alignment}))
    (entry,) = [p for p in ledger.protections if p["kind"] == "set-dictionary-limit"]
    assert entry["party"] == "bank" and entry["guarantee"] == {"guesses_per_window": 20_000_000}
    assert "20,000,000 guessed identifiers per 1 day(s)" in entry["explanation"]
    # the round-1 message keeps its own protection (the blinding)
    assert ledger.messages[0]["protection"] == "dh-blinding"
    florist = build_run_ledger(result({"florist": {"set_limits": {"bank": {
        "guess_limit": 1e6, "guess_window_s": 3600.0}}}}))
    (entry,) = florist.protections
    assert "1,000,000 guessed identifiers per 3600 s" in entry["explanation"]
    assert entry["applies_to"] == "psu_round1"
