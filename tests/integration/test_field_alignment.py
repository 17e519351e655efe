"""[[alignment.fields]] in training runs: multi-field linkage through the real party protocol
(coordinator + data parties over a Channel), private by default, over both transports."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.helpers.links import linked
from tests.helpers.network import bank_federation
from tests.helpers.tables import places_frames
from vflink.data.schema import PartySchema
from vflink.data.table import PartyTable
from vflink.errors import ConfigError, PolicyViolation, ProtocolError
from vflink.parties import CoordinatorParty, SecondaryParty
from vflink.parties.policy import PartyPolicy
from vflink.privacy.config import PrivacyConfig
from vflink.protocol import (
    BlockingKey,
    EncodingSpec,
    FieldComparison,
    FieldEncoding,
    FieldEncodings,
    FieldLink,
    ShareFieldEncodings,
)
from vflink.runfiles.config import AlignmentConfig, DataConfig, RunConfig, TrainingConfig
from vflink.runfiles.inputs import Inputs, load_inputs
from vflink.runfiles.results import RunResult
from vflink.runner.federation import in_process
from vflink.runner.predict import predict_records
from vflink.runner.prepare import prepare
from vflink.runner.train import run_training
from vflink.transport import InProcessHub, Transcript

SECRET = "a-test-secret-shared-by-the-data-parties"
FIELDS = ({"on": ["name"], "secondary_on": ["title"], "metric": "token-set", "weight": 0.5},
          {"on": ["lat", "lon"], "metric": "haversine", "weight": 1.0})
BLOCKING = ({"on": "region", "secondary_on": "area"},)
PRIMARY = {"path": "primary.csv", "identifiers": ["name", "lat", "lon", "region"],
           "numeric": ["p0", "p1"], "label": "y", "task": "binary"}
BANK = {"path": "bank.csv", "identifiers": ["title", "lat", "lon", "area"],
        "numeric": ["s0", "s1", "s2", "s3"]}


def write_tables(tmp: Path, seed: int = 0) -> np.ndarray:
    primary, bank, truth = places_frames(seed=seed)
    tmp.mkdir(parents=True, exist_ok=True)
    primary.to_csv(tmp / "primary.csv", index=False)
    bank.to_csv(tmp / "bank.csv", index=False)
    return truth


def config(tmp: Path, *, algorithm: str = "fedsim", blocking: bool = True,
           **alignment: Any) -> RunConfig:
    parties = (PartySchema(name="primary", role="primary",
                           **{**PRIMARY, "path": tmp / "primary.csv"}),
               PartySchema(name="bank", role="secondary", **{**BANK, "path": tmp / "bank.csv"}))
    settings = {"method": "soft", "top_k": 3, "sigma": 0.05, "fields": FIELDS,
                "blocking": BLOCKING if blocking else (), **alignment}
    return RunConfig(seed=4, algorithm=algorithm, data=DataConfig(parties=parties),
                     alignment=AlignmentConfig(**settings),
                     training=TrainingConfig(epochs=2, patience=2, knn_batch_size=32),
                     # the same run over both transports: the seeded noise, behind the switch
                     privacy=PrivacyConfig(reproducible_noise=True))


# --- the same run over both transports --------------------------------------------------------


def train(tmp: Path, transport: str) -> RunResult:
    cfg = config(tmp)
    out = tmp / f"run-{transport}"
    if transport == "inprocess":
        return run_training(cfg, out)
    tables = {"primary": {**PRIMARY, "path": str(tmp / "primary.csv")},
              "bank": {**BANK, "path": str(tmp / "bank.csv")}}
    # σ = 0.05 is far from the coordinator's default τ ≤ 0.9999 on these close-together places
    with bank_federation(tmp / transport, seed=cfg.seed, tables=tables,
                         run_id=out.name) as federation:
        return run_training(cfg, out, tables=Inputs(load_inputs(cfg).primary, ()),
                            federation=federation)  # type: ignore[arg-type]


@pytest.mark.network
def test_fedsim_on_a_name_and_coordinates_gives_the_same_run_over_both_transports(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VFLINK_SECRET", SECRET)
    write_tables(tmp_path)
    local = train(tmp_path, "inprocess")
    remote = train(tmp_path, "grpc")
    for split in ("train", "validation", "test"):
        assert remote.metrics[split] == pytest.approx(local.metrics[split], rel=1e-6)
    assert remote.best_epoch == local.best_epoch
    assert remote.communication == local.communication
    summary = local.extra["alignment"]
    assert summary["encoding"] == "bloom" and summary["privacy"] == "bloom"
    assert summary["fields"] == ["0.5·token-set(name)", "1·haversine(lat,lon)"]
    assert "keyed digests" in summary["blocking"]
    assert [s["kind"] for s in summary["field_encoding_specs"]] == ["string", "geo"]
    kinds = {m["kind"] for m in summary["messages"]}
    assert {"field_encodings", "share_field_encodings", "field_link"} <= kinds
    assert "identifier_encodings" not in kinds
    # the primary's own traffic is the same (across hosts it sees only its own)
    assert remote.extra["alignment"]["messages"] == [
        m for m in summary["messages"] if "primary" in (m["sender"], m["receiver"])]
    assert local.metrics["test"]["auc"] > 0.7  # the secondary's features are used
    ledger = json.loads((local.out_dir / "privacy.json").read_text())  # type: ignore[operator]
    sent = {(m["kind"], m["sender"]): m["protection"] for m in ledger["messages"]}
    assert sent[("field_encodings", "primary")] == "bloom-filter"
    assert sent[("field_encodings", "bank")] == "bloom-filter"


# --- the same linkage as `vflink link --config` -----------------------------------------------


def test_training_alignment_equals_the_link_pipelines(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The coordinator of a training run computes the linkage of the link pipeline (the
    in-process `vflink link --config` path) on the same data, fields, blocking and secret."""
    monkeypatch.setenv("VFLINK_SECRET", SECRET)
    truth = write_tables(tmp_path)
    cfg = config(tmp_path)
    inputs = load_inputs(cfg)
    federation = in_process(inputs, cfg)
    prepared = prepare(cfg, inputs, federation=federation)
    trained = federation.parties["coordinator"].linkage("soft", "bank")
    a = cfg.alignment
    linkage = linked(inputs.primary.frame, inputs.secondaries[0].frame, fields=a.fields,
                     blocking=a.blocking, top_k=a.top_k, sigma=a.sigma, secret=SECRET.encode(),
                     seed=cfg.seed).linkage
    np.testing.assert_array_equal(trained.indices, linkage.indices)
    np.testing.assert_array_equal(trained.distances, linkage.distances)
    assert (trained.mu0, trained.sigma0, trained.sigma, trained.tau) == (
        linkage.mu0, linkage.sigma0, linkage.sigma, linkage.tau)
    # the alignment the primary trains on is the coordinator's, and it finds the true places
    topk = prepared.alignments["topk"]["bank"]
    np.testing.assert_array_equal(topk.secondary_index, trained.indices)
    assert float(np.mean(trained.indices[:, 0] == truth)) >= 0.95


# --- nothing readable reaches the coordinator -------------------------------------------------


def _leaves(value: Any) -> list[Any]:
    """Every scalar, string and array inside a message (dataclasses and containers opened)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [x for f in dataclasses.fields(value) for x in _leaves(getattr(value, f.name))]
    if isinstance(value, (tuple, list)):
        return [x for v in value for x in _leaves(v)]
    if isinstance(value, dict):
        return [x for kv in value.items() for v in kv for x in _leaves(v)]
    return [value]


def test_under_the_private_default_no_identifier_or_blocking_text_reaches_the_coordinator(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VFLINK_SECRET", SECRET)
    write_tables(tmp_path)
    cfg = config(tmp_path, algorithm="avgsim")
    transcript = Transcript()
    prepare(cfg, transcript=transcript)
    inputs = load_inputs(cfg)
    p, s = inputs.primary.frame, inputs.secondaries[0].frame
    words = {w for v in (*p["name"], *s["title"]) for w in str(v).split()}
    texts = {*map(str, p["name"]), *map(str, s["title"]), *words,
             *map(str, p["region"]), *map(str, s["area"])}
    texts |= {t.lower() for t in texts}
    numbers = {*p["lat"], *p["lon"], *s["lat"], *s["lon"]}
    to_coordinator = [r.message for r in transcript.records if r.receiver == "coordinator"]
    kinds = {m.kind for m in to_coordinator}
    assert {"field_encodings", "field_link", "key_tag"} <= kinds
    for message in to_coordinator:
        for leaf in _leaves(message):
            if isinstance(leaf, np.ndarray):
                assert leaf.dtype == np.uint8, (message.kind, leaf.dtype)
            elif isinstance(leaf, str):
                assert leaf not in texts, (message.kind, leaf)
            elif isinstance(leaf, float):
                assert leaf not in numbers, (message.kind, leaf)
    sent = [m for m in to_coordinator if isinstance(m, FieldEncodings)]
    assert len(sent) == 2  # one per data party: two fields and one blocking key each
    for m in sent:
        assert m.encoders == ("bloom", "bloom")
        (keys,) = m.keys
        assert keys.shape[1] == 32 and keys.any(axis=1).all()
    # equal regions give equal digests across the parties, and only they do
    by_party = {r.sender: r.message for r in transcript.records
                if isinstance(r.message, FieldEncodings)}
    own, theirs = by_party["primary"].keys[0], by_party["bank"].keys[0]
    for i in (0, 1, 2):
        same = [j for j in range(len(s)) if s["area"][j] == p["region"][i]]
        match = np.flatnonzero((theirs == own[i]).all(axis=1)).tolist()
        assert match == same


def test_privacy_off_sends_raw_field_values_only_when_the_policy_allows(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VFLINK_SECRET", SECRET)
    write_tables(tmp_path)
    transcript = Transcript()
    off = prepare(config(tmp_path, algorithm="avgsim", privacy="off"), transcript=transcript)
    sent = [r.message for r in transcript.records if isinstance(r.message, FieldEncodings)]
    assert [m.encoders for m in sent] == [("string", "raw")] * 2
    assert off.summary["encoding"] == "raw" and "RAW" in off.summary["sent_to_coordinator"]
    for m in sent:  # the blocking keys stay digests
        assert m.keys[0].dtype == np.uint8 and m.keys[0].shape[1] == 32
    # a [policy] that keeps the private default refuses the run at load time...
    with pytest.raises(ConfigError, match="refuses"):
        config(tmp_path, privacy="off").replace(policy=PartyPolicy())
    # ...and a secondary whose own policy releases only Bloom filters refuses the request
    cfg = config(tmp_path, algorithm="avgsim", privacy="off")
    inputs = load_inputs(cfg)
    federation = in_process(inputs, cfg)
    federation.parties["bank"].policy = PartyPolicy()
    with pytest.raises(PolicyViolation, match="policy.identifiers"):
        prepare(cfg, inputs, federation=federation)


# --- each data party decides what it encodes, after key confirmation ---------------------------


def test_a_secondary_encodes_only_its_declared_identifiers_and_only_after_confirmation(
        tmp_path: Path) -> None:
    _, bank, _ = places_frames(60, extra=10, seed=1)
    schema = PartySchema(name="bank", role="secondary", identifiers=("title", "lat", "lon"),
                         numeric=("s0",))
    hub = InProcessHub()
    hub.register("coordinator", CoordinatorParty(roles={"primary": "primary",
                                                        "bank": "secondary",
                                                        "coordinator": "coordinator"}))
    roles = {"primary": "primary", "bank": "secondary", "coordinator": "coordinator"}
    hub.register("bank", SecondaryParty(PartyTable(schema, bank, "bank.csv"),
                                        hub.channel("bank"), secret=SECRET.encode(),
                                        roles=roles))
    channel = hub.channel("primary")
    bloom = EncodingSpec(encoder="bloom", kind="string", params={})
    with pytest.raises(PolicyViolation, match="s0"):  # a feature is not an identifier
        channel.call("bank", ShareFieldEncodings(
            session="s", coordinator="coordinator",
            fields=(FieldEncoding(columns=("s0",), spec=bloom),)))
    with pytest.raises(PolicyViolation, match="area"):  # nor an undeclared blocking column
        channel.call("bank", ShareFieldEncodings(
            session="s", coordinator="coordinator",
            fields=(FieldEncoding(columns=("title",), spec=bloom),),
            blocking=(BlockingKey(column="area"),)))
    with pytest.raises(ProtocolError, match="key confirmation"):
        channel.call("bank", ShareFieldEncodings(
            session="s", coordinator="coordinator",
            fields=(FieldEncoding(columns=("title",), spec=bloom),)))
    with pytest.raises(PolicyViolation, match="only to the coordinator"):
        channel.call("bank", ShareFieldEncodings(
            session="s", coordinator="primary",
            fields=(FieldEncoding(columns=("title",), spec=bloom),)))


def test_the_coordinator_refuses_inconsistent_or_mismatched_field_requests() -> None:
    roles = {"primary": "primary", "bank": "secondary", "coordinator": "coordinator"}
    coordinator = CoordinatorParty(roles=roles, policy=PartyPolicy.permissive())
    filters = np.zeros((4, 8), dtype=np.uint8)
    coordinator.handle("primary", FieldEncodings(session="s", encoders=("bloom",),
                                                 values=(filters,)))
    coordinator.handle("bank", FieldEncodings(session="s", encoders=("bloom",),
                                              values=(filters,)))
    with pytest.raises(ProtocolError, match="link.metric"):  # filters compare by Dice only
        coordinator.handle("primary", FieldLink(session="s", secondaries=("bank",),
                                                fields=(_comparison("levenshtein"),), top_k=2))
    with pytest.raises(ProtocolError, match="link.blocking"):
        coordinator.handle("primary", FieldLink(session="s", secondaries=("bank",),
                                                fields=(_comparison("hamming"),), top_k=2,
                                                blocking=1))
    with pytest.raises(ProtocolError, match="encodings.shape"):
        coordinator.handle("bank", FieldEncodings(session="t", encoders=("bloom",),
                                                  values=(filters,),
                                                  keys=(np.zeros((3, 32), np.uint8),)))
    with pytest.raises(ProtocolError, match="encodings.shape"):  # text is not a filter
        coordinator.handle("bank", FieldEncodings(session="t", encoders=("bloom",),
                                                  values=(("ann", "bob"),)))
    views = coordinator.handle("primary", FieldLink(session="s", secondaries=("bank",),
                                                    fields=(_comparison("hamming"),), top_k=2))
    assert len(views.views) == 1  # type: ignore[attr-defined]


def _comparison(metric: str) -> FieldComparison:
    return FieldComparison(metric=metric, weight=1.0)



# --- predicting new records links them with the training's field encodings ---------------------


def test_prediction_relinks_new_records_with_the_training_field_encodings(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VFLINK_SECRET", SECRET)
    write_tables(tmp_path)
    # a third field of plain numbers: FEDERAL filters on the primary's own range (+10 %)
    fields = (*FIELDS, {"on": ["lon"], "metric": "euclidean", "weight": 0.25})
    cfg = config(tmp_path, fields=fields, sigma=0.0)  # no noise: prediction relinks exactly
    run = tmp_path / "run"
    result = run_training(cfg, run)
    specs = result.extra["alignment"]["field_encoding_specs"]
    assert [s["kind"] for s in specs] == ["string", "geo", "numeric"]
    lon = load_inputs(cfg).primary.frame["lon"]
    width = lon.max() - lon.min()
    assert list(specs[2]["low"]) == [pytest.approx(lon.min() - 0.1 * width)]
    prepared = prepare(cfg)
    new = prepared.inputs.primary.frame.iloc[:30].drop(columns=["y"]).reset_index(drop=True)
    out = predict_records(run, new)
    best = prepared.alignments["base"]["bank"].similarity[:30, 0]
    np.testing.assert_allclose(out.frame["best_similarity"], best, rtol=1e-5)
    assert {"probability", "prediction"} <= set(out.frame)


def test_different_secrets_stop_a_field_link_before_any_encoding_leaves(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VFLINK_SECRET", SECRET)
    write_tables(tmp_path)
    cfg = config(tmp_path, algorithm="avgsim")
    inputs = load_inputs(cfg)
    transcript = Transcript()
    federation = in_process(inputs, cfg, transcript=transcript)
    federation.parties["bank"]._secret = b"the-bank-holds-another-secret-!!"
    with pytest.raises(ConfigError, match="secrets of data parties 'primary' and 'bank' differ"):
        prepare(cfg, inputs, federation=federation)
    kinds = {r.message.kind for r in transcript.records}
    assert "key_tag" in kinds and not kinds & {"field_encodings", "share_field_encodings"}


def test_two_secondaries_are_chained_on_the_same_fields(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """FedSim App. C with several fields: the second secondary is linked one-to-one to the
    first one's records, field by field, so both see the same places."""
    monkeypatch.setenv("VFLINK_SECRET", SECRET)
    truth = write_tables(tmp_path)
    cfg = config(tmp_path, algorithm="avgsim")
    inputs = load_inputs(cfg)
    (bank,) = inputs.secondaries
    tables = []
    for i, cols in enumerate((("s0", "s1"), ("s2", "s3"))):
        schema = PartySchema(name=f"bank{i}", role="secondary",
                             identifiers=bank.schema.identifiers, numeric=cols)
        tables.append(PartyTable(schema, bank.frame, f"bank{i}.csv"))
    prepared = prepare(cfg, Inputs(inputs.primary, tuple(tables)))
    first = prepared.alignments["topk"]["bank0"].secondary_index
    second = prepared.alignments["topk"]["bank1"].secondary_index
    np.testing.assert_array_equal(first, second)  # the same table: each place is its own hop
    assert float(np.mean(first[:, 0] == truth)) >= 0.95
