"""`vflink serve` as a real process: refusals of bad peers, and clear errors for bad files."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.helpers.network import free_port, start_process
from vflink.cli.main import main
from vflink.errors import PeerUnavailable, ProtocolError, TransportError
from vflink.protocol import Hello
from vflink.transport.grpc import GrpcChannel, TlsConfig, create_dev_pki

pytestmark = pytest.mark.network


def test_service_refuses_foreign_ca_plaintext_and_unlisted_peers(tmp_path: Path) -> None:
    create_dev_pki(tmp_path / "ours", ["primary", "bank", "coordinator"])
    create_dev_pki(tmp_path / "theirs", ["primary"])
    port = free_port()
    party = tmp_path / "coordinator.toml"
    party.write_text(f'version = 1\n[party]\nname = "coordinator"\nrole = "coordinator"\n'
                     f'listen = "127.0.0.1:{port}"\n[security]\n'
                     f'tls_dir = "{tmp_path / "ours"}"\nallowed = ["primary"]\n')
    log = tmp_path / "coordinator.log"
    proc = start_process(party, log)
    address = {"coordinator": f"127.0.0.1:{port}"}
    hello = Hello(party="x", role="primary")
    try:
        good = GrpcChannel("primary", address, TlsConfig.for_party(tmp_path / "ours", "primary"),
                           deadline_s=10)
        assert isinstance(good.call("coordinator", Hello(party="primary", role="primary")),
                          Hello)
        good.close()
        # trusts our CA (so it accepts the server) but presents a certificate of another CA
        both = tmp_path / "both.pem"
        both.write_bytes((tmp_path / "ours" / "ca.pem").read_bytes()
                         + (tmp_path / "theirs" / "ca.pem").read_bytes())
        foreign = GrpcChannel("primary", address, TlsConfig(
            ca=both, cert=tmp_path / "theirs" / "primary.pem",
            key=tmp_path / "theirs" / "primary.key"), deadline_s=3)
        with pytest.raises(PeerUnavailable, match=f"127.0.0.1:{port}"):
            foreign.call("coordinator", hello)
        foreign.close()
        plain = GrpcChannel("primary", address, None, insecure=True, deadline_s=3)
        with pytest.raises(PeerUnavailable):
            plain.call("coordinator", hello)
        plain.close()
        unlisted = GrpcChannel("bank", address, TlsConfig.for_party(tmp_path / "ours", "bank"),
                               deadline_s=5)
        with pytest.raises((ProtocolError, TransportError), match="(?i)permission|not allowed"):
            unlisted.call("coordinator", Hello(party="bank", role="secondary"))
        unlisted.close()
    finally:
        proc.terminate()
        proc.wait(10)
    text = log.read_text()
    assert text.count("Handshake failed") >= 2, text  # the foreign CA and the plaintext client
    assert "bank" in text  # the refused, unlisted identity is named
    # gRPC's core log goes through vflink's logging: vflink's own line is
    # the first, and no raw core line ("W1124 14:49:56.48 31605 log.cc:102] ...") is left
    assert text.startswith("coordinator (coordinator) serving on"), text[:300]
    assert not re.search(r"^[IWEF]\d{4} [\d:.]+\s+\d+ \S+:\d+\]", text, flags=re.M), text
    assert "not suitable for production" not in text


def test_bad_party_file_is_reported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    party = tmp_path / "p.toml"
    party.write_text('version = 1\n[party]\nname = "bank"\nrole = "secondary"\n')
    assert main(["serve", "--config", str(party)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "party.listen" in err and "[party.table]" in err and "tls_dir" in err
