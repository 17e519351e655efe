"""PSI through the engine (RR22, KKRT16) with vflink's session in charge, over both transports.

The session layer (agreement, policy, TLS, status, failures, results, cleanup) runs here on a
stand-in engine that computes the intersection in plaintext (tests/helpers/engine.py), so it
is tested wherever vflink is; the tests marked ``rr22`` run SecretFlow's real engine and skip,
with the reason, where ``spu`` is not installed (CI installs it in an environment of its own
and runs ``pytest -m rr22`` there).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from tests.helpers.engine import (
    engine_party_files,
    fake_engine,
    leftovers,
    needs_spu,
)
from tests.helpers.network import served_in_threads
from vflink.alignment.engine import EngineSettings
from vflink.cli.main import main
from vflink.errors import ConfigError, PolicyViolation, ProtocolError, VflinkError
from vflink.parties import SecondaryParty
from vflink.parties.setalign import SetAlignmentDriver
from vflink.parties.setengine import drive_engine_psi
from vflink.protocol.messages import Ack, EnginePsiResult, EnginePsiStatus
from vflink.runfiles.party import load_party_config
from vflink.runner.align import AlignOutcome, align_in_process, align_over_network, key_table
from vflink.transport import InProcessHub, Transcript

TRANSPORTS = ("inprocess", "grpc")


@pytest.fixture(autouse=True)
def _secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VFLINK_SECRET", "engine-tests-do-not-use-this-secret")


def tables(tmp: Path, n: int = 300, seed: int = 0) -> tuple[Path, Path]:
    """Two key tables, half of each shared, rows in random order; keys with commas, quotes
    and spaces (the engine sees only hashes of them)."""
    rng = np.random.default_rng(seed)
    a = [f'id "{i}", x' for i in rng.permutation(n)]
    b = [f'id "{i}", x' for i in rng.permutation(np.arange(n // 2, n + n // 2))]
    pd.DataFrame({"id": a, "v": np.arange(n)}).to_csv(tmp / "mine.csv", index=False)
    pd.DataFrame({"id": b, "w": np.arange(n)}).to_csv(tmp / "bank.csv", index=False)
    return tmp / "mine.csv", tmp / "bank.csv"


def pairs(primary: pd.DataFrame, secondary: pd.DataFrame) -> set[tuple[int, int]]:
    m = primary.merge(secondary, on="uid", suffixes=("_p", "_s"))
    return set(zip(m["row_p"].astype(int), m["row_s"].astype(int)))


def dh_pairs(mine: Path, bank: Path) -> set[tuple[int, int]]:
    out = align_in_process(key_table(mine, ("id",), name="primary"),
                           key_table(bank, ("id",), name="bank"), method="psi", workers=1)
    assert out.secondary is not None
    return pairs(out.primary.frame(), out.secondary.frame())


def spools(tmp: Path) -> tuple[Path, Path]:
    return tmp / "state" / ".set-tmp", tmp / "primary-state" / ".set-tmp"


def run(transport: str, tmp: Path, protocol: str = "rr22", *, reveal: str = "both",
        transcript: Transcript | None = None, **files: Any
        ) -> tuple[AlignOutcome, pd.DataFrame]:
    """(the primary's outcome, the secondary's output) of one engine run."""
    mine, bank = tmp / "mine.csv", tmp / "bank.csv"
    primary = key_table(mine, ("id",), name="primary")
    if transport == "inprocess":
        out = align_in_process(primary, key_table(bank, ("id",), name="bank"), method="psi",
                               protocol=protocol, reveal=reveal, transcript=transcript)
        assert out.secondary is not None
        return out, out.secondary.frame()
    pri, sec = engine_party_files(tmp, bank, **files)
    with served_in_threads(sec):
        out = align_over_network(primary, load_party_config(pri), "bank", method="psi",
                                 protocol=protocol, reveal=reveal, transcript=transcript)
    theirs = tmp / "state" / "alignments" / f"{out.primary.session}.parquet"
    return out, (pd.read_parquet(theirs) if theirs.exists()
                 else pd.DataFrame({"row": [], "uid": []}))


# --- the session layer, on the stand-in engine ----------------------------------------------


@pytest.mark.network
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_the_engine_gives_the_dh_pairing_and_leaves_nothing(
        transport: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mine, bank = tables(tmp_path)
    expected = dh_pairs(mine, bank)
    transcript = Transcript()
    with fake_engine(monkeypatch):
        out, theirs = run(transport, tmp_path, transcript=transcript)
    assert pairs(out.primary.frame(), theirs) == expected
    assert out.primary.size == len(expected) and out.primary.known
    assert out.sizes == {"primary": 300, "secondary": 300, "intersection": 150}
    # the rows written through the DH PSI's writers: ascending rows, hex UIDs of 16 bytes
    assert list(out.primary.rows) == sorted(out.primary.rows)
    assert all(len(u) == 32 for u in theirs["uid"])
    summary = out.summary()
    engine = summary["engine"]
    assert summary["protocol"] == "rr22" and engine["security"] == "semi-honest"
    assert "set size" in engine["learns"] and "deviating primary" in engine["security_note"]
    assert engine["listen"].startswith("127.0.0.1:") and engine["peer_address"]
    assert engine["tls"] == (transport == "grpc")
    # no element of either set crossed vflink's channel: only the agreement and status
    kinds = {r.message.kind for r in transcript.records}
    assert kinds <= {"engine_psi_open", "engine_psi_ready", "engine_psi_status",
                     "engine_psi_result", "ack"}
    # nothing of the engine is left: its trace in /tmp, its workdirs in the spools
    assert leftovers(*spools(tmp_path)) == []


@pytest.mark.network
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_who_learns_the_intersection(transport: str, tmp_path: Path,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    tables(tmp_path, n=40)
    with fake_engine(monkeypatch):
        mine, theirs = run(transport, tmp_path, reveal="primary")
        assert mine.primary.known and mine.primary.size == 20 and len(theirs) == 0
        if transport == "inprocess":
            assert mine.secondary is not None and not mine.secondary.known
        told, theirs = run(transport, tmp_path, reveal="secondary")
        assert not told.primary.known and told.primary.size == -1
        assert len(told.primary.rows) == 0 and len(theirs) == 20
    with pytest.raises(ConfigError, match="cardinality"):
        run(transport, tmp_path, reveal="cardinality")
    assert leftovers(*spools(tmp_path)) == []


@pytest.mark.network
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_policy_that_refuses_the_protocol(transport: str, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    tables(tmp_path, n=20)
    with fake_engine(monkeypatch):
        if transport == "grpc":
            with pytest.raises(PolicyViolation) as exc:
                run(transport, tmp_path, secondary_policy='psi_protocols = ["dh"]')
            # the command says it in words, and writes nothing
            pri, sec = engine_party_files(tmp_path, tmp_path / "bank.csv",
                                          secondary_policy='psi_protocols = ["dh"]')
            capsys.readouterr()
            with served_in_threads(sec):
                code = main(["align", "--method", "psi", "--protocol", "rr22", "--primary",
                             str(tmp_path / "mine.csv"), "--on", "id", "--out",
                             str(tmp_path / "cli"), "--party", str(pri)])
            said = " ".join(capsys.readouterr().err.split())
            assert code != 0 and "does not run PSI with 'rr22'" in said, said
            assert "psi_protocols" in said and not (tmp_path / "cli" / "summary.json").exists()
            # nor does a primary whose own policy refuses it start anything
            pri.write_text(pri.read_text() + '[policy]\npsi_protocols = ["dh", "kkrt"]\n')
            with pytest.raises(PolicyViolation, match="party 'primary' does not run PSI"):
                align_over_network(key_table(tmp_path / "mine.csv", ("id",), name="primary"),
                                   load_party_config(pri), "bank", method="psi",
                                   protocol="rr22")
            # the DH PSI still runs with that party
            pri, sec = engine_party_files(tmp_path, tmp_path / "bank.csv",
                                          secondary_policy='psi_protocols = ["dh"]')
            with served_in_threads(sec):
                dh = align_over_network(key_table(tmp_path / "mine.csv", ("id",),
                                                  name="primary"), load_party_config(pri),
                                        "bank", method="psi", protocol="dh")
            assert dh.primary.size == 10
        else:
            hub = InProcessHub()
            peer = SecondaryParty(key_table(tmp_path / "bank.csv", ("id",), name="bank"),
                                  hub.channel("bank"))
            peer.policy = dataclass_replace(peer.policy, psi_protocols=("dh", "kkrt"))
            peer.psi_engine = EngineSettings()
            hub.register("bank", peer)
            driver = SetAlignmentDriver([b"a", b"b"], hub.channel("primary"),
                                        _group())
            with pytest.raises(PolicyViolation) as exc:
                drive_engine_psi(driver, "bank", "psi@t", protocol="rr22", reveal="both",
                                 settings=EngineSettings(), key_columns=1)
    text = str(exc.value)
    assert "does not run PSI with 'rr22'" in text and "psi_protocols" in text
    assert "[policy.psi-protocol]" in text
    assert leftovers(*spools(tmp_path)) == []


def dataclass_replace(obj: Any, **kw: Any) -> Any:
    import dataclasses

    return dataclasses.replace(obj, **kw)


def _group() -> Any:
    from vflink.alignment.groups import get_group

    return get_group("ristretto255", workers=1)


@pytest.mark.network
def test_a_tls_mismatch_is_refused_before_any_link(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    tables(tmp_path, n=20)
    started = time.monotonic()
    with fake_engine(monkeypatch), pytest.raises(PolicyViolation) as exc:
        run("grpc", tmp_path, secondary_tls=False)
    text = str(exc.value)
    assert "plaintext" in text and "mutual TLS" in text and "[engine.tls]" in text
    assert "no link was opened" in text
    assert time.monotonic() - started < 20  # not the engine's connect budget, many times over
    assert leftovers(*spools(tmp_path)) == []


@pytest.mark.network
@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("behaviour, match", [
    ("fail-rank1", r"party 'bank': its rr22 engine failed.*\[engine.failed\]"),
    ("link-fail", r"did not connect to the peer within .* TLS settings"),
    ("wrong-output", r"not the one this party's engine gave; no row is accepted"),
])
def test_a_failure_on_either_side_ends_both_and_cleans(
        transport: str, behaviour: str, match: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    tables(tmp_path, n=30)
    with fake_engine(monkeypatch, behaviour=behaviour), \
            pytest.raises(VflinkError, match=match):
        run(transport, tmp_path, connect_s=2) if transport == "grpc" else run(transport,
                                                                               tmp_path)
    time.sleep(0.5)  # the secondary's engine thread notices its session ended
    assert leftovers(*spools(tmp_path)) == []
    assert not list((tmp_path / "state" / "alignments").glob("*.parquet"))


@pytest.mark.network
def test_a_secondary_without_an_engine_link_says_what_to_configure(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tables(tmp_path, n=20)
    with fake_engine(monkeypatch), pytest.raises(PolicyViolation) as exc:
        run("grpc", tmp_path, secondary_psi=False)
    assert "no PSI engine link configured" in str(exc.value) and "[psi]" in str(exc.value)
    pri, _ = engine_party_files(tmp_path, tmp_path / "bank.csv", primary_psi=False)
    with fake_engine(monkeypatch), pytest.raises(ConfigError, match=r"add a \[psi\] section"):
        align_over_network(key_table(tmp_path / "mine.csv", ("id",), name="primary"),
                           load_party_config(pri), "bank", method="psi", protocol="rr22")


def test_without_the_extra_the_install_command_is_named(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from vflink.alignment import engine

    monkeypatch.setattr(engine, "engine_missing",
                        lambda: "SecretFlow's spu is not installed here: pip install "
                                "'vflink[rr22]' (its wheels exist for Python 3.10 and 3.11 "
                                "only)")
    mine, bank = tables(tmp_path, n=10)
    with pytest.raises(ConfigError, match=r"pip install 'vflink\[rr22\]'"):
        align_in_process(key_table(mine, ("id",), name="p"), key_table(bank, ("id",), name="b"),
                         method="psi", protocol="rr22")
    import vflink

    with pytest.raises(ConfigError, match=r"pip install 'vflink\[rr22\]'"):
        vflink.align(mine, bank, on="id", method="psi", protocol="kkrt")
    assert main(["align", "--method", "psi", "--protocol", "rr22", "--primary", str(mine),
                 "--secondary", str(bank), "--on", "id", "--out", str(tmp_path / "o")]) == 2
    assert not (tmp_path / "o" / "summary.json").exists()
    with pytest.raises(ConfigError, match="psu"):
        align_in_process(key_table(mine, ("id",), name="p"), key_table(bank, ("id",), name="b"),
                         method="psu", protocol="rr22")


def test_the_api_and_the_command_run_the_engine(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    import vflink

    mine, bank = tables(tmp_path, n=60)
    with fake_engine(monkeypatch):
        got = vflink.align(mine, bank, on="id", method="psi", protocol="kkrt",
                           out=tmp_path / "api")
    assert set(zip(got.pairs["primary_row"], got.pairs["secondary_row"])) == \
        dh_pairs(mine, bank)
    assert got.summary["protocol"] == "kkrt"
    assert got.summary["engine"]["security"] == "semi-honest"
    written = json.loads((tmp_path / "api" / "summary.json").read_text())
    assert written["engine"]["protocol"] == "kkrt"
    # the command: its own time, and the share of it outside the protocol
    with fake_engine(monkeypatch):
        assert main(["align", "--method", "psi", "--protocol", "rr22", "--primary", str(mine),
                     "--secondary", str(bank), "--on", "id", "--out",
                     str(tmp_path / "cli")]) == 0
    summary = json.loads((tmp_path / "cli" / "summary.json").read_text())
    assert summary["command_seconds"] > 0 and "crypto_bound" not in summary
    engine = summary["engine"]
    assert 0 <= engine["outside_protocol_share"] <= 1
    assert set(engine["outside_protocol"]) == {"csv", "buckets_and_sorting", "engine_start",
                                               "other"}
    cli = pd.read_parquet(tmp_path / "cli" / "primary.parquet")
    assert sorted(cli["row"]) == sorted(got.primary["row"])
    assert leftovers() == []


def test_the_session_declaration_orders_the_engine_messages(tmp_path: Path) -> None:
    """No status or result before the session opened; nothing after it finished."""
    hub = InProcessHub()
    peer = SecondaryParty(key_table(tables(tmp_path, n=10)[1], ("id",), name="bank"),
                          hub.channel("bank"))
    peer.psi_engine = EngineSettings()
    hub.register("bank", peer)
    channel = hub.channel("primary")
    for message in (EnginePsiStatus(session="psi@x", state="ready"),
                    EnginePsiResult(session="psi@x", size=1)):
        with pytest.raises(ProtocolError, match="engine_psi"):
            channel.request("bank", message, Ack)


@pytest.mark.network
def test_a_finished_engine_session_is_served_after_a_restart(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The secondary's result is a finished set session like the DH PSI's: on disk, reloaded
    by a restarted party, its rows fetched in UID order by the primary that ran it only."""
    mine, bank = tables(tmp_path, n=50)
    pri, sec = engine_party_files(tmp_path, bank)
    primary = key_table(mine, ("id",), name="primary")
    with fake_engine(monkeypatch):
        with served_in_threads(sec):
            out = align_over_network(primary, load_party_config(pri), "bank", method="psi",
                                     protocol="rr22")
        doc = json.loads((tmp_path / "state" / "alignments" /
                          f"{out.primary.session}.json").read_text())
        assert doc["protocol"] == "rr22" and doc["group"] == "rr22"
        with served_in_threads(sec):  # a new process' worth of party: reloaded from disk
            from vflink.runner.network import _channel

            channel = _channel(load_party_config(pri))
            try:
                driver = SetAlignmentDriver([], channel, _group())
                view = driver.fetch_rows("bank", out.primary.session)
            finally:
                channel.close()
    from vflink.parties.setalign import pair_by_uid

    own, theirs = pair_by_uid(out.primary, view.secondary_index)
    assert set(zip(own.tolist(), theirs.tolist())) == dh_pairs(mine, bank)


def psi_run(protocol: str, epochs: int = 1) -> Any:
    from vflink.privacy.config import PrivacyConfig
    from vflink.runfiles.config import (
        AlignmentConfig,
        DataConfig,
        RunConfig,
        TrainingConfig,
    )

    return RunConfig(seed=3, algorithm="splitnn",
                     data=DataConfig(dataset="sklearn-small",
                                     options={"n_samples": 300, "sigma_cf": 0.1, "seed": 3}),
                     alignment=AlignmentConfig(method="psi", protocol=protocol),
                     training=TrainingConfig(epochs=epochs, patience=1),
                     privacy=PrivacyConfig())


def test_training_on_the_engine_aligns_as_the_dh_psi(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """``[alignment] method = "psi"`` with ``protocol = "rr22"``: the same alignment as the DH
    PSI's, and the run's summary and ledger say what the engine gives."""
    from vflink.reporting.ledger import build_run_ledger
    from vflink.runner.prepare import prepare
    from vflink.runner.train import run_training

    dh = prepare(psi_run("dh"))
    with fake_engine(monkeypatch):
        engine = prepare(psi_run("rr22"))
        result = run_training(psi_run("rr22"), tmp_path / "run")
    for name, a in dh.alignments["base"].items():
        assert (engine.alignments["base"][name].secondary_index == a.secondary_index).all()
    np.testing.assert_array_equal(engine.rows, dh.rows)
    summary = engine.summary
    assert summary["protocol"] == "rr22" and "semi-honest" in summary["group"]
    assert all(e["security"] == "semi-honest" for e in summary["engine"].values())
    ledger = build_run_ledger(result)
    (entry,) = [p for p in ledger.protections if p["kind"] == "psi-engine"]
    assert entry["guarantee"] == {"security": "semi-honest"}
    text = entry["explanation"]
    assert "semi-honest peer ONLY" in text and "protocol \"dh\"" in text
    assert "set size" in text and "listened on 127.0.0.1:" in text
    kinds = {m["kind"] for m in ledger.messages}
    assert {"engine_psi_open", "engine_psi_status", "engine_psi_result"} <= kinds
    assert all("not classified" not in m["explanation"] for m in ledger.messages)
    assert leftovers(*tmp_path.rglob(".set-tmp")) == []


# --- the real engine (SecretFlow spu): the rr22 job --------------------------------------------


@pytest.mark.rr22
@pytest.mark.network
@needs_spu
@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("protocol", ["rr22", "kkrt"])
def test_spu_gives_the_dh_pairing(transport: str, protocol: str, tmp_path: Path) -> None:
    mine, bank = tables(tmp_path, n=2000)
    out, theirs = run(transport, tmp_path, protocol)
    assert pairs(out.primary.frame(), theirs) == dh_pairs(mine, bank)
    engine = out.summary()["engine"]
    assert engine["protocol"] == protocol and engine["seconds"]["engine_online"] > 0
    assert engine["tls"] == (transport == "grpc")
    assert leftovers(*spools(tmp_path)) == []


@pytest.mark.rr22
@pytest.mark.network
@needs_spu
def test_spu_through_the_command_with_party_files(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    mine, bank = tables(tmp_path, n=3000)
    pri, sec = engine_party_files(tmp_path, bank)
    with served_in_threads(sec):
        assert main(["align", "--method", "psi", "--protocol", "rr22", "--primary", str(mine),
                     "--on", "id", "--out", str(tmp_path / "cli"), "--party", str(pri)]) == 0
    (written,) = (tmp_path / "state" / "alignments").glob("psi@*.parquet")
    got = pairs(pd.read_parquet(tmp_path / "cli" / "primary.parquet"), pd.read_parquet(written))
    assert got == dh_pairs(mine, bank)
    summary = json.loads((tmp_path / "cli" / "summary.json").read_text())
    assert summary["command_seconds"] > 0
    assert 0 < summary["engine"]["outside_protocol_share"] < 1
    assert leftovers(*spools(tmp_path)) == []
    refusing = tmp_path / "refusing"
    refusing.mkdir()
    pri, sec = engine_party_files(refusing, bank, secondary_policy='psi_protocols = ["dh"]')
    capsys.readouterr()
    with served_in_threads(sec):
        assert main(["align", "--method", "psi", "--protocol", "rr22", "--primary", str(mine),
                     "--on", "id", "--out", str(refusing / "cli"), "--party", str(pri)]) != 0
    said = " ".join(capsys.readouterr().err.split())
    assert "does not run PSI with 'rr22'" in said and "psi_protocols" in said, said
    assert leftovers(*spools(refusing)) == []


@pytest.mark.rr22
@pytest.mark.network
@needs_spu
def test_spu_tls_mismatch_fails_fast(tmp_path: Path) -> None:
    tables(tmp_path, n=100)
    started = time.monotonic()
    with pytest.raises(PolicyViolation, match=r"\[engine.tls\]"):
        run("grpc", tmp_path, secondary_tls=False)
    assert time.monotonic() - started < 10
    assert leftovers(*spools(tmp_path)) == []


@pytest.mark.rr22
@pytest.mark.network
@needs_spu
def test_spu_killed_party_leaves_nothing_after_the_sweep(tmp_path: Path) -> None:
    """A primary killed while its engine runs: its child dies with it, the secondary's
    session ends and its engine is stopped, and the next start sweeps the spools."""
    mine, bank = tables(tmp_path, n=200_000)
    pri, sec = engine_party_files(tmp_path, bank, deadline_s=5)
    with served_in_threads(sec):
        proc = subprocess.Popen(
            [sys.executable, "-m", "vflink.cli.main", "align", "--method", "psi", "--protocol",
             "rr22", "--primary", str(mine), "--on", "id", "--out", str(tmp_path / "cli"),
             "--party", str(pri)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            env={**os.environ})
        deadline = time.monotonic() + 60
        spool = tmp_path / "primary-state" / ".set-tmp"
        while time.monotonic() < deadline and not list(spool.glob("vflink-set-*/job.json")):
            time.sleep(0.05)
        time.sleep(1.0)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        time.sleep(8)  # the secondary's engine gives up within its deadline
    from vflink.alignment._spool import sweep_stale

    for folder in spools(tmp_path):
        sweep_stale(folder)
    assert leftovers(*spools(tmp_path)) == []
