"""A real `vflink serve` secondary keeps its privacy budget across setups and restarts, and only
its operator resets it (a hostile tester once got 44,055 releases per record against a budget
of 55 by repeating SetupBottom + FitPreprocessing, each setup zeroing the counts)."""

from __future__ import annotations

import json
import logging
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.helpers.network import start_process, stop_processes, write_party_files
from vflink.alignment._dh import key_bytes
from vflink.alignment.groups import get_group
from vflink.cli.main import main
from vflink.errors import VflinkError
from vflink.models.spec import BottomSpec
from vflink.parties.setalign import SetAlignmentDriver
from vflink.privacy.accounting import calibrate, max_releases_within
from vflink.protocol import (
    Ack,
    AlignmentReady,
    AlignmentView,
    Embeddings,
    FetchAlignment,
    FitPreprocessing,
    Forward,
    SetupBottom,
)
from vflink.protocol.sessions import new_session_name
from vflink.runfiles.party import load_party_config, party_table
from vflink.transport.grpc import GrpcChannel, TlsConfig

pytestmark = pytest.mark.network

OPTIONS: dict[str, object] = {"n_samples": 200, "seed": 3}
ALLOWED = max_releases_within(calibrate(2.0, 1e-2).sigma, 1e-2, 5.0)  # 3
ROWS = np.arange(16)


@pytest.fixture
def files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    monkeypatch.setenv("VFLINK_SECRET", "a-test-secret-shared-by-data-parties")
    files = write_party_files(tmp_path, dataset="sklearn-small", options=OPTIONS, seed=3)
    with files["secondary"].open("a") as f:  # the secondary's own protection and budget
        f.write('[privacy]\nembeddings = "vanilla"\nepsilon = 2.0\ndelta = 1e-2\n'
                'budget = 5.0\n')
    return files


@pytest.fixture
def serve(files: dict[str, Path], tmp_path: Path) -> Iterator[Callable[[], GrpcChannel]]:
    procs: list[subprocess.Popen[bytes]] = []

    def start() -> GrpcChannel:
        """(Re)start `vflink serve` for the secondary; the primary's channel to it."""
        for proc in procs:
            stop(proc)
        procs.append(start_process(files["secondary"], tmp_path / f"secondary-{len(procs)}.log"))
        config = load_party_config(files["primary"])
        return GrpcChannel("primary", config.addresses, TlsConfig.for_party(
            tmp_path / "certs", "primary"), deadline_s=30)

    def stop_all() -> None:
        for proc in procs:
            stop(proc)

    start.stop_all = stop_all  # type: ignore[attr-defined]
    yield start
    stop_all()


def stop(proc: subprocess.Popen[bytes]) -> None:
    stop_processes([proc], timeout=20)


def align(ch: GrpcChannel, files: dict[str, Path]) -> np.ndarray:
    """An honest alignment with the served secondary (ECDH PSI, then AlignmentReady): the rows
    it then serves to the primary (no alignment, no embeddings)."""
    primary = party_table(load_party_config(files["primary"]))
    keys = key_bytes(primary.frame, primary.schema.key, who="primary")
    session = new_session_name("psi")
    SetAlignmentDriver(keys, ch, get_group("ristretto255")).psi("secondary", session,
                                                                reveal="both")
    ch.request("secondary", AlignmentReady(session=session, coordinator="coordinator"), Ack)
    view = ch.request("secondary", FetchAlignment(session=session), AlignmentView)
    return np.sort(np.asarray(view.secondary_index, dtype=np.int64))


def attack(ch: GrpcChannel, rounds: int, files: dict[str, Path]) -> int:
    """Repeat the primary's setup after every refusal; the number of releases obtained."""
    got = 0
    aligned = align(ch, files)
    rows = aligned[:len(ROWS)]
    for r in range(rounds):
        ch.call("secondary", SetupBottom(spec=BottomSpec(hidden=(8,), out_dim=4, seed=r)))
        ch.call("secondary", FitPreprocessing(rows=aligned))
        for b in range(2):
            try:
                reply = ch.call("secondary", Forward(batch_id=100 * r + b, rows=rows,
                                                     train=False))
            except VflinkError as exc:
                assert "privacy.budget" in str(exc), exc
                continue
            assert isinstance(reply, Embeddings)
            got += 1
    return got


def budget_json(files: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> dict[str, object]:
    capsys.readouterr()
    assert main(["privacy-budget", "--party-file", str(files["secondary"]), "--json"]) == 0
    return json.loads(capsys.readouterr().out)  # type: ignore[no-any-return]


@pytest.mark.slow
def test_budget_survives_setups_and_restarts_and_only_the_operator_resets_it(
        files: dict[str, Path], serve: Callable[[], GrpcChannel],
        capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> None:
    start = serve
    with start() as ch:
        assert attack(ch, 4, files) == ALLOWED
    with start() as ch:  # a restarted service, a new session
        assert attack(ch, 3, files) == 0
    shown = budget_json(files, capsys)
    assert shown["max_releases"] == ALLOWED and shown["records_released"] == len(ROWS)
    assert shown["epsilon_max"] <= 5.0  # type: ignore[operator]
    assert shown["epsilon_max"] == pytest.approx(shown["epsilon_mean"])

    # a reset while the service runs is refused (it holds the counts and would write them
    # back): exit 2, nothing deleted
    assert main(["privacy-budget", "--party-file", str(files["secondary"]), "--reset",
                 "--yes-i-understand"]) == 2
    assert "running `vflink serve`" in " ".join(capsys.readouterr().err.split())
    assert budget_json(files, capsys)["max_releases"] == ALLOWED
    start.stop_all()  # type: ignore[attr-defined]
    # a reset needs the explicit flag (exit 2, nothing deleted)
    assert main(["privacy-budget", "--party-file", str(files["secondary"]), "--reset"]) == 2
    assert "--yes-i-understand" in capsys.readouterr().err
    assert budget_json(files, capsys)["max_releases"] == ALLOWED
    # with it: logged (a WARNING naming the fingerprint, the counts and who) and recorded
    with caplog.at_level(logging.WARNING, logger="vflink.privacy.budget"):
        assert main(["privacy-budget", "--party-file", str(files["secondary"]), "--reset",
                     "--yes-i-understand", "--reason", "new consent round"]) == 0
    (warning,) = [r for r in caplog.records if "RESET" in r.getMessage()]
    assert warning.levelno == logging.WARNING
    assert str(shown["fingerprint"]) in warning.getMessage()
    assert f"{ALLOWED * len(ROWS)} releases" in warning.getMessage()
    record = Path(str(shown["file"])).parent / "resets.jsonl"
    (line,) = record.read_text().splitlines()
    entry = json.loads(line)
    assert entry["releases_total"] == ALLOWED * len(ROWS)
    assert entry["reason"] == "new consent round" and entry["operator"]
    assert budget_json(files, capsys)["max_releases"] == 0
    with start() as ch:
        assert attack(ch, 3, files) == ALLOWED
