"""Attacks against finished runs: recording, ground truth, `vflink attack`, the ledger."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.helpers.imbalanced import imbalanced_inputs
from vflink.cli.main import main
from vflink.linkage.privacy import tau_for_sigma
from vflink.parties.recording import read_recording
from vflink.privacy.ledger import Ledger
from vflink.protocol import payload_nbytes
from vflink.protocol.sessions import purpose_of
from vflink.runfiles.config import (
    AlignmentConfig,
    DataConfig,
    EvaluationConfig,
    PrivacyConfig,
    RunConfig,
    TrainingConfig,
)
from vflink.runner.attack import run_attack
from vflink.runner.train import run_training
from vflink.transport import Transcript

RECORD = EvaluationConfig(record=True)


def splitnn_config(record: bool = True, epochs: int = 4) -> RunConfig:
    # the labels in clear: these tests measure the unprotected leak
    return RunConfig(seed=0, algorithm="splitnn", data=DataConfig(dataset="-"),
                     alignment=AlignmentConfig(method="exact"),
                     training=TrainingConfig(epochs=epochs, patience=epochs),
                     evaluation=EvaluationConfig(record=record),
                     privacy=PrivacyConfig(labels="off"))


def soft_config(**alignment: float) -> RunConfig:
    return RunConfig(seed=1, algorithm="fedsim",
                     data=DataConfig(dataset="sklearn-small", options={"n_samples": 600}),
                     alignment=AlignmentConfig(method="soft", metric="euclidean", top_k=3,
                                               privacy="bloom", **alignment),
                     training=TrainingConfig(epochs=2, patience=2), evaluation=RECORD)


@pytest.fixture(scope="module")
def splitnn_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("runs") / "splitnn"
    run_training(splitnn_config(), out, tables=imbalanced_inputs())
    return out


def test_each_party_records_only_what_it_received_in_its_own_directory(splitnn_run: Path
                                                                       ) -> None:
    primary = read_recording(splitnn_run / "models" / "primary")
    bank = read_recording(splitnn_run / "models" / "bank")
    assert primary.role == "primary" and bank.role == "secondary"
    assert {s["kind"] for s in primary.manifest["streams"]} == {"embeddings", "indices"}
    # the secondary also keeps the primary's order of each batch's rows (what it was asked)
    assert {s["kind"] for s in bank.manifest["streams"]} == {"gradients", "indices",
                                                             "requests"}
    grads, ids, batch = bank.get("gradients")
    emb, emb_ids, emb_batch = primary.get("embeddings")
    # what one side sent is what the other recorded: same rows, same batches, same shapes
    assert grads.shape == emb.shape and np.array_equal(ids, emb_ids)
    assert batch is not None and emb_batch is not None and np.array_equal(batch, emb_batch)
    # no labels (nor anything else of the primary's) in the secondary's directory
    assert not any("label" in k for k in bank.arrays)
    truth = json.loads((splitnn_run / "evaluation" / "truth.json").read_text())
    assert truth["evaluation_only"] is True and truth["parties"]["bank"]["labels"] > 0


def test_label_norm_attack_from_the_cli_reaches_high_auc(splitnn_run: Path,
                                                         capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    assert main(["attack", "--run", str(splitnn_run), "--attack", "label-norm"]) == 0
    printed = capsys.readouterr().out
    assert "auc" in printed
    ledger = Ledger.read(splitnn_run / "privacy.json")
    entry = [a for a in ledger.attacks if a["attack"] == "label-norm"][-1]
    assert entry["party"] == "bank"
    assert entry["metrics"]["auc"] >= 0.9  # Li et al.: norms leak labels of a skewed task
    assert f"{entry['metrics']['auc']:.3f}" in printed
    assert "AUC" in entry["explanation"]
    direction = run_attack(splitnn_run, "label-direction")
    assert direction.metrics["auc"] >= 0.9
    assert len(Ledger.read(splitnn_run / "privacy.json").attacks) == 2


def test_attack_list_and_errors(splitnn_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["attack", "--list"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    from vflink.attacks import ATTACKS

    assert [line.split()[0] for line in lines] == list(ATTACKS.names())  # one line each
    assert {"label-norm", "label-direction", "greedy-similarity"} <= set(ATTACKS.names())
    assert main(["attack", "--run", str(splitnn_run), "--attack", "nope"]) == 2
    # an exact-key SplitNN run has no similarities: a clear error, not a traceback
    assert main(["attack", "--run", str(splitnn_run), "--attack", "greedy-similarity"]) == 2
    assert "similarities" in capsys.readouterr().err


def test_ledger_lists_every_message_kind_with_counts_and_bytes(splitnn_run: Path) -> None:
    ledger = Ledger.read(splitnn_run / "privacy.json")
    metrics = json.loads((splitnn_run / "metrics.json").read_text())
    kinds = {(m["kind"], m["sender"], m["receiver"]) for m in ledger.messages}
    assert ("embeddings", "bank", "primary") in kinds
    assert ("backward", "primary", "bank") in kinds
    assert ("key_digests", "bank", "coordinator") in kinds
    digest = next(m for m in ledger.messages if m["kind"] == "key_digests")
    assert digest["protection"] == "keyed-hash"
    # training entries add up to the per-direction communication totals, plus the state
    # bookkeeping (save/load/snapshot/restore and their acks), which the ledger lists too but
    # the totals leave out (a resumed run does it differently)
    training = [m for m in ledger.messages if m["stage"] == "training"]
    bookkeeping = {"save_state", "load_state", "snapshot", "restore"}
    for direction, total in metrics["communication_total"].items():
        sender, receiver = direction.split("->")
        mine = [m for m in training if m["sender"] == sender and m["receiver"] == receiver]
        requests = sum(m["count"] for m in training if m["kind"] in bookkeeping
                       and {m["sender"], m["receiver"]} == {sender, receiver})
        assert sum(m["count"] for m in mine) == total["messages"] + requests
        assert sum(m["bytes"] for m in mine) >= total["bytes"]
    assert all(m["explanation"] for m in ledger.messages)


def _same(a: object, b: object) -> bool:
    """Deep equality of message contents (arrays, tensors, nested dataclasses)."""
    if dataclasses.is_dataclass(a) and not isinstance(a, type):
        # a run names its sessions ``purpose@<fresh id>`` on purpose (a finished session is
        # immutable, so every run opens new ones), and its training messages its own run
        # (``run@<fresh id>``, kept apart at a secondary): compare their purposes
        return type(a) is type(b) and all(
            purpose_of(getattr(a, f.name)) == purpose_of(getattr(b, f.name))
            if f.name in ("session", "run") else _same(getattr(a, f.name), getattr(b, f.name))
            for f in dataclasses.fields(a))
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and np.array_equal(a, b)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(
            _same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return a == b


def test_recording_adds_nothing_to_what_crosses_the_boundary(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VFLINK_SECRET", "a-test-secret-shared-by-data-parties")
    inputs = imbalanced_inputs(600)

    def transcript(record: bool) -> Transcript:
        t = Transcript()
        run_training(splitnn_config(record, epochs=2), tmp_path / f"r{record}", tables=inputs,
                     transcript=t)
        return t

    without, with_recording = transcript(False), transcript(True)
    assert [(r.sender, r.receiver, r.message.kind, payload_nbytes(r.message))
            for r in without.records] == [
        (r.sender, r.receiver, r.message.kind, payload_nbytes(r.message))
        for r in with_recording.records]
    # the same messages, value for value (the secret and every seed are fixed); key
    # confirmation uses a fresh nonce from the OS on purpose, so its tags differ run to run
    fresh = {"confirm_key", "key_tag", "fetch_key_tags", "key_tags"}
    assert all(_same(a.message, b.message)
               for a, b in zip(without.records, with_recording.records, strict=True)
               if a.message.kind not in fresh)
    assert (tmp_path / "rTrue" / "models" / "bank" / "evaluation" / "received.npz").is_file()
    assert not (tmp_path / "rFalse" / "models" / "bank" / "evaluation").exists()


@pytest.mark.parametrize("tau", [0.9, 0.99])
def test_greedy_attack_stays_within_the_tau_bound(tmp_path: Path, tau: float,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VFLINK_SECRET", "a-test-secret-shared-by-data-parties")
    out = tmp_path / "soft"
    run_training(soft_config(tau=tau), out)
    result = run_attack(out, "greedy-similarity", params={"taus": (0.9, 0.99, 0.999)})
    m = result.metrics
    assert m["tau_bound"] == pytest.approx(tau)
    assert m["tau_bound"] == pytest.approx(tau_for_sigma(m["sigma"], m["sigma0"]))
    # Theorem 2, plus sampling error (4 standard errors)
    assert m["distance_success"] <= tau + 4 * max(m["distance_success_stderr"], 1e-3)
    # the full attack (one pair per secondary record) is bounded by τ too (Theorem 2)
    full_se = math.sqrt(tau * (1 - tau) / m["targets"])
    assert m["full_success"] <= tau + 4 * max(full_se, 1e-3)
    sweep = result.details["sweep"]
    assert [s["tau"] for s in sweep] == [0.9, 0.99, 0.999]
    for s in sweep:
        assert s["distance_success"] <= s["tau"] + 4 * max(s["distance_success_stderr"], 1e-3)
    ledger = Ledger.read(out / "privacy.json")
    assert ledger.attacks[-1]["attack"] == "greedy-similarity"
    noise = next(p for p in ledger.protections if p["kind"] == "similarity-noise")
    assert noise["guarantee"]["tau"] == pytest.approx(tau)
    assert "no meaningful differential-privacy guarantee" in noise["explanation"]


def test_without_noise_the_distance_step_always_succeeds(tmp_path: Path) -> None:
    """σ = 0: the MAP distance is the true Hamming distance, for every pair (an oracle for the
    recording, the ground truth and the attack's maths together)."""
    out = tmp_path / "soft0"
    run_training(soft_config(sigma=0.0), out)
    result = run_attack(out, "greedy-similarity")
    assert result.metrics["distance_success"] == 1.0
    assert result.metrics["tau_bound"] == 1.0


@pytest.mark.network
def test_recording_across_hosts_equals_in_process(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A secondary served over gRPC (mutual TLS) records in its own state directory exactly
    what the in-process secondary records; the attack runs on that directory."""
    from tests.helpers.network import served_in_threads, write_party_files
    from vflink.runfiles.inputs import Inputs, load_inputs
    from vflink.runfiles.party import load_party_config
    from vflink.runner.network import network_federation

    monkeypatch.setenv("VFLINK_SECRET", "a-test-secret-shared-by-data-parties")
    options = {"n_samples": 600, "seed": 3}
    config = RunConfig(seed=3, algorithm="splitnn",
                       data=DataConfig(dataset="sklearn-small", options=dict(options)),
                       training=TrainingConfig(epochs=2, patience=2), evaluation=RECORD,
                       privacy=PrivacyConfig(reproducible_noise=True))  # the same records
    local = tmp_path / "local"
    run_training(config, local)
    files = write_party_files(tmp_path / "grpc", dataset="sklearn-small", options=options,
                              seed=3)
    sec = files["secondary"]
    sec.write_text(sec.read_text().replace('role = "secondary"\n',
                                           'role = "secondary"\nrecord = true\n', 1))
    remote = tmp_path / "remote"
    with served_in_threads(files["coordinator"], sec):
        federation = network_federation(load_party_config(files["primary"]), run_id="r1")
        try:
            primary = load_inputs(config).primary
            run_training(config, remote, tables=Inputs(primary, ()), federation=federation)
        finally:
            federation.close()
    # a served secondary keeps each primary's states (and recordings) in its own folder
    state = tmp_path / "grpc" / "state" / "secondary" / "peers" / "primary" / "r1"
    a, b = read_recording(local / "models" / "secondary"), read_recording(state)
    ga, ia, _ = a.get("gradients")
    gb, ib, _ = b.get("gradients")
    assert np.array_equal(ia, ib)
    np.testing.assert_allclose(ga, gb, rtol=1e-5, atol=1e-7)
    # the primary's order of each batch's rows and the seed it sent: the same record
    for got, want in zip(a.get("requests"), b.get("requests"), strict=True):
        assert got is not None and want is not None and np.array_equal(got, want)
    assert a.manifest["meta"]["setup__primary"] == b.manifest["meta"]["setup__primary"]
    # the primary's run directory holds the labels per linked row (evaluation-only truth)
    result = run_attack(state, "label-norm", truth_dir=remote)
    assert result.party == "secondary" and result.metrics["rows"] > 0
    assert Ledger.read(remote / "privacy.json").attacks[-1]["attack"] == "label-norm"
    # served, the secondary holds the same seed: the seeded label noise is regenerated
    white = run_attack(state, "label-noise-subtraction", truth_dir=remote,
                       params={"brute_force": 0})
    assert white.details["found"] is not None
    assert max(white.metrics["auc"], 1 - white.metrics["auc"]) >= 0.95  # balanced classes:
    # which side is positive is the one thing it cannot tell without a label
