"""Linkage decisions end to end: a Fellegi–Sunter model trained by the coordinator on private
encodings, its matches, its label-free quality estimate against the measured one, what the
primary receives, and the same link over both transports."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

import vflink
from tests.helpers.network import bank_federation
from tests.helpers.tables import places_frames
from vflink.data.schema import PartySchema
from vflink.datasets._base import read_shipped
from vflink.errors import ConfigError
from vflink.privacy.config import PrivacyConfig
from vflink.protocol import FieldEncodings, FieldLink
from vflink.runfiles.config import AlignmentConfig, DataConfig, RunConfig, TrainingConfig
from vflink.runfiles.inputs import Inputs, load_inputs
from vflink.runner.prepare import prepare
from vflink.transport import Transcript
from vflink.types import MISSING

SECRET = "a-test-secret-shared-by-the-data-parties"
FIELDS = ("given_name", "surname", "street_number", "address_1", "suburb", "postcode",
          "state", "date_of_birth")
RULES = (["given_name", "surname"], ["surname", "date_of_birth"],
         ["given_name", "date_of_birth"], ["postcode", "street_number"])


@pytest.fixture(scope="module")
def febrl() -> tuple[pd.DataFrame, pd.DataFrame, np.ndarray]:
    """600 FEBRL4 originals and the duplicates of 300 of them plus 100 others' (whose
    originals are left out): half the primary records and a quarter of the secondary ones
    have no counterpart."""
    a = read_shipped("febrl4a.csv.gz", dtype=str, keep_default_na=False)
    b = read_shipped("febrl4b.csv.gz", dtype=str, keep_default_na=False)
    ea = a["rec_id"].str.extract(r"rec-(\d+)-org")[0].astype(int)
    eb = b["rec_id"].str.extract(r"rec-(\d+)-dup")[0].astype(int)
    rng = np.random.default_rng(11)
    people = rng.permutation(ea.to_numpy())
    kept_a = set(people[:600].tolist())
    kept_b = set(people[:300].tolist()) | set(people[600:700].tolist())
    primary = a[ea.isin(kept_a)].reset_index(drop=True)
    secondary = b[eb.isin(kept_b)].sample(frac=1.0, random_state=1).reset_index(drop=True)
    row_of = {e: i for i, e in enumerate(primary["rec_id"].str.extract(r"(\d+)")[0].astype(int))}
    sec_e = secondary["rec_id"].str.extract(r"(\d+)")[0].astype(int)
    truth = np.array([(row_of[e], j) for j, e in enumerate(sec_e) if e in row_of])
    return primary.drop(columns=["soc_sec_id"]), secondary.drop(columns=["soc_sec_id"]), truth


def test_a_model_link_decides_matches_without_labels(
        febrl: tuple[pd.DataFrame, pd.DataFrame, np.ndarray], tmp_path: Path) -> None:
    primary, secondary, truth = febrl
    out = tmp_path / "links.parquet"
    links = vflink.link(primary, secondary, fields=[{"on": [c]} for c in FIELDS],
                        blocking=[{"on": r} for r in RULES], model="fellegi-sunter",
                        one_to_one=True, top_k=3, seed=0, out=out, id="rec_id", sigma=0.5,
                        charts=True)
    quality = links.evaluate(truth)
    measured, estimated = quality["measured"], quality["estimated"]
    assert measured["precision"] >= 0.98 and measured["recall"] >= 0.92  # blocking: ~0.95
    assert abs(estimated["f1"] - measured["f1"]) <= 0.05  # known without labels
    frame = links.frame
    # one-to-one: no secondary record matched twice; a match is its record's rank 0
    matched = frame[frame["match"]]
    assert matched["secondary_index"].is_unique and matched["primary_index"].is_unique
    assert (matched["rank"] == 0).all()
    assert (frame.loc[frame["match"], "match_probability"] >= 0.5).all()
    # ids name the same pairs as indices
    by_id = links.evaluate(pd.DataFrame({
        "primary_id": primary["rec_id"].to_numpy()[truth[:, 0]],
        "secondary_id": secondary["rec_id"].to_numpy()[truth[:, 1]]}))
    assert by_id["measured"] == measured
    summary = json.loads(out.with_name(out.name + ".summary.json").read_text())
    model = summary["model"]
    assert {r["field"] for r in model["m_u"]} == set(FIELDS)  # named by column
    assert model["lambda"] < 0.01 and model["em_converged"]
    assert [r["rule"] for r in model["blocking_rules"]] == [" & ".join(r) for r in RULES]
    assert all(r["comparisons"] >= r["new_pairs"] for r in model["blocking_rules"])
    assert sum(r["new_pairs"] for r in model["blocking_rules"]) == model["candidate_pairs"]
    assert "date-token" in summary["fields_compared"][-1]
    assert summary["columns"]["distance"].startswith("coordinator only")
    assert out.with_name(out.name + ".model.png").stat().st_size > 0
    meta = pq.read_schema(out).metadata
    assert meta[b"vflink.view"] == b"operator"
    assert "coordinator only" in json.loads(meta[b"vflink.columns"])["match_weight"]


def test_the_primary_view_holds_only_what_the_primary_receives(
        febrl: tuple[pd.DataFrame, pd.DataFrame, np.ndarray]) -> None:
    primary, secondary, _ = febrl
    kw = dict(fields=[{"on": [c]} for c in FIELDS], blocking=[{"on": r} for r in RULES],
              model="fellegi-sunter", one_to_one="greedy", top_k=2, seed=0, sigma=0.5)
    operator = vflink.link(primary, secondary, **kw).frame  # type: ignore[arg-type]
    seen = vflink.link(primary, secondary, view="primary", **kw).frame  # type: ignore[arg-type]
    assert "distance" not in seen and "match_weight" not in seen
    pd.testing.assert_series_equal(seen["match"], operator["match"])
    pd.testing.assert_series_equal(seen["similarity"], operator["similarity"])
    # the primary's probability is a post-processing of the noised similarity: noisier than
    # the coordinator's, on the same side of 1/2 for most links
    agree = (seen["match_probability"] >= 0.5) == (operator["match_probability"] >= 0.5)
    assert agree.mean() > 0.8
    assert not np.allclose(seen["match_probability"], operator["match_probability"])


def test_what_reaches_the_coordinator_in_a_model_link(
        febrl: tuple[pd.DataFrame, pd.DataFrame, np.ndarray]) -> None:
    """Keyed Bloom filters, keyed exact-agreement hashes and blocking digests: no value."""
    from tests.helpers.links import linked
    from vflink.linkage.fields import Blocking, FieldSpec

    primary, secondary, _ = febrl
    transcript = Transcript()
    linked(primary, secondary, fields=[FieldSpec(on=(c,)) for c in FIELDS],
           blocking=[Blocking(on=tuple(r)) for r in RULES], top_k=1, model="fellegi-sunter",
           secret=SECRET.encode(), seed=0, transcript=transcript, sigma=0.5)
    sent = [r.message for r in transcript.records if isinstance(r.message, FieldEncodings)]
    assert len(sent) == 2
    for m in sent:
        assert all(v.dtype == np.uint8 for v in m.values)
        assert len(m.exact) == len(FIELDS) and all(h.shape[1] == 16 for h in m.exact)
    texts = {str(v) for c in FIELDS for v in primary[c]} - {""}
    for r in transcript.records:
        if r.receiver == "coordinator":
            for value in vars(r.message).values():
                assert not (isinstance(value, str) and value in texts)
    (request,) = [r.message for r in transcript.records if isinstance(r.message, FieldLink)]
    assert request.model == "fellegi-sunter" and request.blocking == len(RULES)
    # equal values, equal hashes across the parties (and only equal values)
    own, theirs = sent[0].exact[FIELDS.index("surname")], sent[1].exact[FIELDS.index("surname")]
    i = 0
    same = [j for j in range(len(secondary))
            if secondary["surname"][j].strip().lower() == primary["surname"][i].strip().lower()
            and primary["surname"][i].strip()]
    assert np.flatnonzero((theirs == own[i]).all(axis=1)).tolist() == same


def test_model_needs_fields_or_a_metric_and_checks_its_options(
        caplog: pytest.LogCaptureFixture) -> None:
    p, s, truth = places_frames(20, extra=5, seed=2)
    with pytest.raises(ConfigError, match="one_to_one"):
        vflink.link(p, s, on="name", secondary_on="title", metric="levenshtein", top_k=1,
                    one_to_one=True)  # a decision without a model
    with pytest.raises(ConfigError, match="threshold"):
        vflink.link(p, s, fields=[{"on": ["name"], "secondary_on": ["title"]}],
                    model="fellegi-sunter", threshold=1.5, top_k=1)
    with pytest.raises(ConfigError, match="metric"):
        vflink.link(p, s, fields=[{"on": ["name"], "secondary_on": ["title"]}], top_k=1)
    # one identifier: a one-field model link, which EM cannot split without labels (said)
    links = vflink.link(p, s, on="name", secondary_on="title", model="fellegi-sunter",
                        top_k=2, seed=1, one_to_one=True, sigma=0.5)
    assert "at least two fields" in caplog.text
    assert list(links.frame.columns[-3:]) == ["match_weight", "match_probability", "match"]
    # two fields of the same small tables: every true pair found, none else
    links = vflink.link(p, s, fields=[{"on": ["name"], "secondary_on": ["title"]},
                                      {"on": ["lat", "lon"], "metric": "haversine"}],
                        model="fellegi-sunter", top_k=2, seed=1, one_to_one=True, sigma=0.5)
    assert links.evaluate(np.stack([np.arange(20), truth], axis=1))["measured"]["f1"] == 1.0


# --- the same model link over both transports (a training run's alignment) --------------------

PLACES_FIELDS = ({"on": ["name"], "secondary_on": ["title"]},
                 {"on": ["lat", "lon"], "metric": "haversine"})
PRIMARY = {"path": "primary.csv", "identifiers": ["name", "lat", "lon", "region"],
           "numeric": ["p0", "p1"], "label": "y", "task": "binary"}
BANK = {"path": "bank.csv", "identifiers": ["title", "lat", "lon", "area"],
        "numeric": ["s0", "s1", "s2", "s3"]}


def _config(tmp: Path) -> RunConfig:
    parties = (PartySchema(name="primary", role="primary",
                           **{**PRIMARY, "path": tmp / "primary.csv"}),  # type: ignore[arg-type]
               PartySchema(name="bank", role="secondary",
                           **{**BANK, "path": tmp / "bank.csv"}))  # type: ignore[arg-type]
    return RunConfig(seed=4, algorithm="top1sim", data=DataConfig(parties=parties),
                     alignment=AlignmentConfig(
                         method="soft", top_k=3, sigma=0.05, fields=PLACES_FIELDS,
                         blocking=({"on": "region", "secondary_on": "area"},),
                         model="fellegi-sunter", one_to_one=True),
                     training=TrainingConfig(epochs=1, patience=1),
                     # compared over both transports: the seeded noise, behind the switch
                     privacy=PrivacyConfig(reproducible_noise=True))


def _aligned(tmp: Path, transport: str) -> tuple[object, dict[str, object]]:
    cfg = _config(tmp)
    if transport == "inprocess":
        prepared = prepare(cfg, algorithms=["top1sim", "exact", "fedsim"])
        return prepared.alignments, prepared.summary
    tables = {"primary": {**PRIMARY, "path": str(tmp / "primary.csv")},
              "bank": {**BANK, "path": str(tmp / "bank.csv")}}
    with bank_federation(tmp / transport, seed=cfg.seed, tables=tables,
                         run_id="t") as federation:
        prepared = prepare(cfg, Inputs(load_inputs(cfg).primary, ()),
                           algorithms=["top1sim", "exact", "fedsim"],
                           federation=federation)  # type: ignore[arg-type]
    return prepared.alignments, prepared.summary


@pytest.mark.network
def test_a_model_link_is_the_same_over_both_transports(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VFLINK_SECRET", SECRET)
    primary, bank, truth = places_frames(seed=3)
    primary.to_csv(tmp_path / "primary.csv", index=False)
    bank.to_csv(tmp_path / "bank.csv", index=False)
    local, summary = _aligned(tmp_path, "inprocess")
    remote, _ = _aligned(tmp_path, "grpc")
    for kind in ("topk", "top1", "exact"):
        a, b = local[kind]["bank"], remote[kind]["bank"]  # type: ignore[index]
        np.testing.assert_array_equal(a.secondary_index, b.secondary_index)
        if a.similarity is not None:
            np.testing.assert_array_equal(a.similarity, b.similarity)
        np.testing.assert_array_equal(a.match, b.match)
    topk = local["topk"]["bank"]  # type: ignore[index]
    exact = local["exact"]["bank"]  # type: ignore[index]
    # the exact-style links are the one-to-one matches, MISSING where there is none
    np.testing.assert_array_equal(exact.secondary_index[:, 0],
                                  np.where(topk.match[:, 0], topk.secondary_index[:, 0],
                                           MISSING))
    found = exact.secondary_index[:, 0]
    assert float(np.mean(found == truth)) >= 0.9
    assert summary["model"]["one_to_one"] == "optimal"  # type: ignore[index]
    assert 0.9 <= summary["model"]["estimated_precision"] <= 1.0  # type: ignore[index]
    # one rule (the region): how many matches lie in another region cannot be seen among
    # its own pairs, so no recall (nor F1) is released, rather than 1.0
    assert "estimated_f1" not in summary["model"]  # type: ignore[operator]


def test_link_command_with_a_model_and_truth(
        febrl: tuple[pd.DataFrame, pd.DataFrame, np.ndarray], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    from vflink.cli.main import main

    primary, secondary, truth = febrl
    primary.to_csv(tmp_path / "a.csv", index=False)
    secondary.to_csv(tmp_path / "b.csv", index=False)
    pd.DataFrame({"primary_id": primary["rec_id"].to_numpy()[truth[:, 0]],
                  "secondary_id": secondary["rec_id"].to_numpy()[truth[:, 1]]}).to_csv(
        tmp_path / "truth.csv", index=False)
    fields = "\n".join(f'[[link.fields]]\non = ["{c}"]' for c in FIELDS)
    rules = "\n".join(f"[[link.blocking]]\non = {json.dumps(r)}" for r in RULES)
    (tmp_path / "link.toml").write_text(
        f'[link]\nprimary = "a.csv"\nsecondary = "b.csv"\nout = "links.csv"\ntop_k = 1\n'
        f'model = "fellegi-sunter"\none_to_one = "optimal"\nid = "rec_id"\nseed = 0\n'
        f'sigma = 0.5\n'
        f'{fields}\n{rules}\n')
    code = main(["link", "--config", str(tmp_path / "link.toml"), "--truth",
                 str(tmp_path / "truth.csv")])
    out = capsys.readouterr().out
    assert code == 0
    assert "estimated (no labels)" in out and "measured (--truth)" in out
    assert "m/u table" in out and "given_name & surname" in out
    summary = json.loads((tmp_path / "links.csv.summary.json").read_text())
    measured, estimated = summary["quality"]["measured"], summary["model"]["estimated"]
    assert abs(measured["f1"] - estimated["f1"]) <= 0.05
    links = pd.read_csv(tmp_path / "links.csv")
    assert list(links.columns) == ["primary_index", "secondary_index", "rank", "distance",
                                   "similarity", "match_weight", "match_probability", "match",
                                   "primary_id", "secondary_id"]
    # a bad value in the file is named with the others, before any work
    (tmp_path / "bad.toml").write_text(
        '[link]\nprimary = "a.csv"\nsecondary = "b.csv"\nout = "x.csv"\ntop_k = 1\n'
        'model = "splink"\nthreshold = 2\none_to_one = "best"\n[[link.fields]]\non = ["surname"]\n')
    code = main(["link", "--config", str(tmp_path / "bad.toml")])
    err = " ".join(capsys.readouterr().err.split())
    assert code != 0
    assert "model" in err and "threshold" in err and "one_to_one" in err
    assert not (tmp_path / "x.csv").exists()


def test_three_parties_matches_chain_into_clusters(
        febrl: tuple[pd.DataFrame, pd.DataFrame, np.ndarray]) -> None:
    """FedSim App. C's chain with decisions: primary → first secondary (model, top-K) →
    second secondary (model, one link); a chain is a match when both links are, and the
    coordinator's summary counts the clusters of matched records across the three."""
    from vflink.data.table import PartyTable
    from vflink.linkage.fields import Blocking, FieldSpec
    from vflink.parties.coordinator import CoordinatorParty
    from vflink.parties.link_peer import LinkingPeer
    from vflink.parties.linking import AlignmentInitiator
    from vflink.parties.policy import PartyPolicy
    from vflink.runner.encoding import field_encodings, link_fields, resolve_fields
    from vflink.runner.local import local_roles
    from vflink.transport import InProcessHub

    primary, secondary, truth = febrl
    third = primary.sample(frac=0.8, random_state=2).reset_index(drop=True)  # a copy of A
    specs = resolve_fields([FieldSpec(on=(c,)) for c in FIELDS], primary)
    plan = link_fields(specs, field_encodings(specs, private=True, primary=primary))
    rules = [Blocking(on=tuple(r)) for r in RULES]
    hub = InProcessHub()
    roles = local_roles("primary", ["b", "c"])
    policy = PartyPolicy.permissive(identifiers="bloom")
    coordinator = CoordinatorParty("coordinator", seed=0, roles=roles, policy=policy)
    hub.register("coordinator", coordinator)
    for name, frame in (("b", secondary), ("c", third)):
        schema = PartySchema(name=name, role="secondary", identifiers=FIELDS)
        hub.register(name, LinkingPeer(PartyTable(schema, frame, name), hub.channel(name),
                                       secret=SECRET.encode(), roles=roles, policy=policy))
    initiator = AlignmentInitiator("primary", primary, hub.channel("primary"),
                                   secondaries=("b", "c"), identifiers=FIELDS,
                                   secret=SECRET.encode(), policy=policy)
    views = initiator.align_fields("coordinator", plan, blocking=rules, top_k=2, sigma=0.1,
                                   model="fellegi-sunter", one_to_one="optimal")
    b, c = views["b"], views["c"]
    assert b.match is not None and c.match is not None
    assert not (c.match & ~b.match).any()  # a chain needs its first link to be a match
    # the matched chains put each primary record with its own copy in c
    rows = np.flatnonzero(c.match[:, 0])
    ids = third["rec_id"].to_numpy()[c.secondary_index[rows, 0]]
    assert (ids == primary["rec_id"].to_numpy()[rows]).mean() >= 0.98
    clusters = coordinator.linkage("soft", "b").model["clusters"]
    assert clusters["parties"] == 3
    assert clusters["all_parties"] == len(rows)
    assert clusters["all_parties"] >= 0.7 * len(truth)


def test_a_training_run_on_decisions_reports_them(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VFLINK_SECRET", SECRET)
    primary, bank, _ = places_frames(seed=5)
    primary.to_csv(tmp_path / "primary.csv", index=False)
    bank.to_csv(tmp_path / "bank.csv", index=False)
    cfg = _config(tmp_path).replace(algorithm="fedsim")
    run = vflink.train(cfg, out=tmp_path / "run")
    alignment = run.result.extra["alignment"]
    assert alignment["model"]["one_to_one"] == "optimal"
    assert alignment["model"]["estimated_precision"] > 0.9
    ledger = json.loads((tmp_path / "run" / "privacy.json").read_text())
    kinds = {p["kind"] for p in ledger["protections"]}
    assert {"bloom-filter", "similarity-noise", "linkage-model"} <= kinds
    page = run.report(tmp_path / "report.html").read_text()
    assert "Linkage decisions" in page and "estimated F1" in page


@pytest.mark.parametrize(("threshold", "one_to_one", "bad"), [
    (1.5, True, "threshold"), (0.0, True, "threshold"), (True, True, "threshold"),
    (0.5, "best", "one_to_one"), (0.5, 1, "one_to_one")])
def test_threshold_and_one_to_one_refused_alike_by_the_api_and_the_run_file(
        threshold: object, one_to_one: object, bad: str) -> None:
    p, s, _ = places_frames(10, extra=2, seed=2)
    with pytest.raises(ConfigError) as api:
        vflink.link(p, s, fields=[{"on": ["name"], "secondary_on": ["title"]}],
                    model="fellegi-sunter", threshold=threshold, one_to_one=one_to_one,
                    top_k=1)
    with pytest.raises(ConfigError) as run_file:
        AlignmentConfig(method="soft", top_k=1, fields=PLACES_FIELDS, model="fellegi-sunter",
                        threshold=threshold, one_to_one=one_to_one)  # type: ignore[arg-type]
    said = f"`{bad}` must be " if bad == "threshold" else f"`{bad}` must be true, false"
    assert said in str(api.value)
    assert said.replace(f"`{bad}`", f"`alignment.{bad}`") in str(run_file.value)
