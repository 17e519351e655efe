"""Key confirmation before alignment: mismatched secrets stop the run, over both transports."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.helpers.network import served_in_threads, start_process, write_party_files
from tests.helpers.tables import split_secondary, two_party_tables
from vflink.alignment.confirm import confirmation_tag, tag_matches
from vflink.errors import ConfigError, ProtocolError
from vflink.parties import CoordinatorParty, SecondaryParty
from vflink.protocol import FetchKeyTags, KeyTags, ShareKeys
from vflink.runfiles.config import AlignmentConfig, DataConfig, RunConfig, TrainingConfig
from vflink.runfiles.inputs import Inputs, load_inputs
from vflink.runfiles.party import load_party_config
from vflink.runner.federation import Federation
from vflink.runner.network import network_federation
from vflink.runner.prepare import prepare
from vflink.runner.train import run_training
from vflink.transport import InProcessHub, TrafficCounter, Transcript

A = b"the-secret-of-the-data-parties-A"
B = b"another-secret-of-some-party--B!"
OPTIONS = {"n_samples": 300, "sigma_cf": 0.1, "seed": 3}
SOFT = AlignmentConfig(method="soft", metric="euclidean", top_k=3, privacy="bloom", tau=0.9999)


def soft_config(**changes: Any) -> RunConfig:
    return RunConfig(seed=3, algorithm="fedsim",
                     data=DataConfig(dataset="sklearn-small", options=dict(OPTIONS)),
                     alignment=SOFT, training=TrainingConfig(epochs=1, patience=1), **changes)


def federation(inputs: Inputs, secrets: dict[str, bytes],
               coordinator: CoordinatorParty | None = None,
               transcript: Transcript | None = None) -> Federation:
    """Every party in this process, each with its own secret."""
    counter = TrafficCounter()
    hub = InProcessHub(counter=counter, transcript=transcript)
    hub.register("coordinator", coordinator or CoordinatorParty("coordinator", seed=0))
    for t in inputs.secondaries:
        hub.register(t.name, SecondaryParty(t, hub.channel(t.name), secret=secrets[t.name]))
    return Federation(channel=hub.channel(inputs.primary.name),
                      secondaries=tuple(t.name for t in inputs.secondaries),
                      coordinator="coordinator", counter=counter,
                      secret=secrets[inputs.primary.name])


# --- the tag ----------------------------------------------------------------------------------


@given(secret=st.binary(min_size=16, max_size=40), other=st.binary(min_size=16, max_size=40),
       fields=st.tuples(st.text(max_size=8), st.text(max_size=8), st.text(max_size=8)),
       others=st.tuples(st.text(max_size=8), st.text(max_size=8), st.text(max_size=8)))
def test_a_tag_checks_out_only_for_the_same_secret_session_nonce_and_party(
        secret: bytes, other: bytes, fields: tuple[str, str, str],
        others: tuple[str, str, str]) -> None:
    session, nonce, party = fields
    tag = confirmation_tag(secret, session=session, nonce=nonce, party=party)
    assert tag.shape == (32,) and tag.dtype == np.uint8
    assert tag_matches(secret, tag, session=session, nonce=nonce, party=party)
    assert tag_matches(other, tag, session=session, nonce=nonce, party=party) == (other == secret)
    o_session, o_nonce, o_party = others
    for kw in ({"session": o_session, "nonce": nonce, "party": party},
               {"session": session, "nonce": o_nonce, "party": party},
               {"session": session, "nonce": nonce, "party": o_party}):
        assert tag_matches(secret, tag, **kw) == (tuple(kw.values()) == fields)


# --- in process -------------------------------------------------------------------------------


def test_exact_alignment_with_different_secrets_fails_naming_the_parties() -> None:
    primary, bank = two_party_tables(300, seed=0)
    inputs = split_secondary(Inputs(primary, (bank,)), parts=2)  # secondaries s0 and s1
    config = RunConfig(algorithm="splitnn", data=DataConfig(dataset="-"),
                       training=TrainingConfig(epochs=1))
    with pytest.raises(ConfigError, match="secrets") as info:
        prepare(config, inputs, federation=federation(
            inputs, {"primary": A, "s0": A, "s1": B}))
    text = str(info.value)
    assert "'primary'" in text and "'s1'" in text and "'s0'" not in text and "differ" in text
    # with equal secrets the same alignment goes through, and matches every row
    ok = prepare(config, inputs, federation=federation(inputs, {"primary": A, "s0": A, "s1": A}))
    assert ok.summary["matched_fraction"] == {"s0": 1.0, "s1": 1.0}


def test_bloom_linkage_with_different_secrets_fails_before_any_encoding_leaves() -> None:
    config = soft_config()
    inputs = load_inputs(config)
    transcript = Transcript()
    with pytest.raises(ConfigError, match="secrets of data parties 'primary' and 'secondary' "
                                          "differ"):
        prepare(config, inputs, federation=federation(
            inputs, {"primary": A, "secondary": B}, transcript=transcript))
    kinds = {r.message.kind for r in transcript.records}
    assert "identifier_encodings" not in kinds and "soft_link" not in kinds


def test_a_secondary_aligns_only_after_a_successful_confirmation() -> None:
    primary, bank = two_party_tables(50, seed=0)
    hub = InProcessHub()
    hub.register("coordinator", CoordinatorParty())
    hub.register("bank", SecondaryParty(bank, hub.channel("bank"), secret=A))
    with pytest.raises(ProtocolError, match="key confirmation"):
        hub.channel("primary").call("bank", ShareKeys(session="exact", coordinator="coordinator"))


class ReplayingCoordinator(CoordinatorParty):
    """Answers every tag request with the first tags it ever saw (a replay)."""

    def __init__(self) -> None:
        super().__init__("coordinator", seed=0)
        self.first: dict[str, np.ndarray] = {}

    def on_fetch_key_tags(self, sender: str, message: FetchKeyTags) -> KeyTags:
        reply = super().on_fetch_key_tags(sender, message)
        for party, tag in zip(reply.parties, reply.tags, strict=True):
            self.first.setdefault(party, tag)
        tags = np.stack([self.first[p] for p in reply.parties])
        return KeyTags(session=reply.session, nonce=reply.nonce, parties=reply.parties, tags=tags)


class ReflectingCoordinator(CoordinatorParty):
    """Hands the asker's own tag back as the other party's (a reflection)."""

    def on_fetch_key_tags(self, sender: str, message: FetchKeyTags) -> KeyTags:
        own = self._sessions[message.session].key_tags[(message.nonce, sender)]
        return KeyTags(session=message.session, nonce=message.nonce, parties=message.parties,
                       tags=np.stack([own for _ in message.parties]))


def test_a_coordinator_can_neither_replay_nor_reflect_tags() -> None:
    primary, bank = two_party_tables(200, seed=0)
    inputs = Inputs(primary, (bank,))
    config = RunConfig(algorithm="splitnn", data=DataConfig(dataset="-"),
                       training=TrainingConfig(epochs=1))
    replaying = ReplayingCoordinator()
    prepare(config, inputs, federation=federation(inputs, {"primary": A, "bank": A}, replaying))
    assert replaying.first  # it recorded valid tags of the first run...
    with pytest.raises(ConfigError, match="differ"):  # ...which do not pass for a new nonce
        prepare(config, inputs, federation=federation(inputs, {"primary": A, "bank": B},
                                                      replaying))
    with pytest.raises(ConfigError, match="differ"):  # equal secrets, but tags bound to sender
        prepare(config, inputs, federation=federation(inputs, {"primary": A, "bank": A},
                                                      ReflectingCoordinator()))


# --- over gRPC --------------------------------------------------------------------------------


@pytest.mark.network
def test_exact_alignment_with_different_secrets_over_grpc(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = RunConfig(seed=3, algorithm="splitnn",
                       data=DataConfig(dataset="sklearn-small", options=dict(OPTIONS)),
                       alignment=AlignmentConfig(method="exact"),
                       training=TrainingConfig(epochs=1))
    files = write_party_files(tmp_path, dataset="sklearn-small", options=OPTIONS, seed=3)
    monkeypatch.setenv("VFLINK_SECRET", B.decode())  # the secondary's, read when it starts
    with served_in_threads(files["coordinator"], files["secondary"]):
        monkeypatch.setenv("VFLINK_SECRET", A.decode())  # the primary's
        fed = network_federation(load_party_config(files["primary"]), run_id="mismatch")
        try:
            with pytest.raises(ConfigError, match="'primary' and 'secondary' differ"):
                run_training(config, tmp_path / "out",
                             tables=Inputs(load_inputs(config).primary, ()), federation=fed)
        finally:
            fed.close()
    assert not (tmp_path / "out").exists()


RUN = """version = 1
seed = 3
algorithm = "fedsim"
[data]
dataset = "sklearn-small"
[data.options]
n_samples = 300
sigma_cf = 0.1
seed = 3
[alignment]
method = "soft"
top_k = 3
tau = 0.9999
[training]
epochs = 1
"""


@pytest.mark.slow
@pytest.mark.network
def test_three_processes_with_different_secrets_exit_nonzero_naming_the_mismatch(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`vflink serve` × 2 and `vflink train --party` with another secret (Bloom linkage, the
    default privacy): the run stops with an error instead of training on noise."""
    files = write_party_files(tmp_path, dataset="sklearn-small", options=OPTIONS, seed=3)
    run = tmp_path / "run.toml"
    run.write_text(RUN)
    monkeypatch.setenv("VFLINK_SECRET", B.decode())
    procs = [start_process(files["coordinator"], tmp_path / "coordinator.log"),
             start_process(files["secondary"], tmp_path / "secondary.log")]
    try:
        env = {**os.environ, "VFLINK_SECRET": A.decode()}
        start = time.monotonic()
        out = subprocess.run([sys.executable, "-m", "vflink.cli.main", "train", "--config",
                              str(run), "--party", str(files["primary"]), "--out",
                              str(tmp_path / "out")], env=env, capture_output=True, text=True,
                             timeout=120)
        elapsed = time.monotonic() - start
    finally:
        for p in procs:
            p.terminate()
            p.wait(10)
    message = " ".join(out.stderr.split())
    assert out.returncode != 0, out.stdout
    assert "key confirmation failed" in message and "'primary' and 'secondary' differ" in message
    assert elapsed < 60  # well within the parties' deadlines: it fails at once
    assert not (tmp_path / "out").exists()
    # the secondary saw it too, and said so in its own log
    assert "differ" in (tmp_path / "secondary.log").read_text()
