"""Party identities: the development CA, loading TLS files, and the ``vflink certs`` command."""

from __future__ import annotations

import argparse
import datetime as dt
import os
import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from vflink.cli import certs
from vflink.errors import ConfigError
from vflink.transport.grpc import TlsConfig, create_dev_pki, load_tls


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("pki")
    create_dev_pki(d, ["primary", "bank"])
    create_dev_pki(d / "other", ["primary"])
    return d


def test_dev_pki_files_identities_and_modes(tmp_path: Path) -> None:
    written = create_dev_pki(tmp_path, ["primary", "bank", "coordinator"], days=3)
    assert sorted(p.name for p in written) == sorted(
        ["ca.pem", "ca.key", "primary.pem", "primary.key", "bank.pem", "bank.key",
         "coordinator.pem", "coordinator.key"])
    for path in written:
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode == (0o600 if path.suffix == ".key" else 0o644), path
    material = load_tls(TlsConfig.for_party(tmp_path, "bank"))
    assert material.identity == "bank"
    cert = x509.load_pem_x509_certificate(material.cert_pem)
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "bank"
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["bank"]
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert set(eku) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
    lifetime = cert.not_valid_after_utc - cert.not_valid_before_utc
    assert dt.timedelta(days=3) <= lifetime <= dt.timedelta(days=3, minutes=10)


def test_dev_pki_refuses_overwrite_and_bad_names(tmp_path: Path) -> None:
    create_dev_pki(tmp_path, ["primary"])
    before = (tmp_path / "ca.pem").read_bytes()
    with pytest.raises(ConfigError, match="refusing to overwrite.*ca.pem"):
        create_dev_pki(tmp_path, ["primary", "bank"])
    assert (tmp_path / "ca.pem").read_bytes() == before
    assert not (tmp_path / "bank.pem").exists()  # nothing written at all
    create_dev_pki(tmp_path, ["primary"], overwrite=True)
    assert (tmp_path / "ca.pem").read_bytes() != before
    for parties, error in [(["bank_a"], "cannot be a certificate identity"),
                           (["-x"], "DNS label"), (["a", "a"], "more than once: a"),
                           (["ca"], "cannot be called 'ca'"), ([], "at least one party")]:
        with pytest.raises(ConfigError, match=error):
            create_dev_pki(tmp_path / "new", parties)
    with pytest.raises(ConfigError, match="`days` must be an int >= 1"):
        create_dev_pki(tmp_path / "new", ["a"], days=0)


def test_load_tls_explains_each_problem(pki: Path, tmp_path: Path) -> None:
    ok = TlsConfig.for_party(pki, "primary")
    with pytest.raises(ConfigError, match="TLS CA certificate file .*nope.pem does not exist"):
        load_tls(TlsConfig(ca=pki / "nope.pem", cert=ok.cert, key=ok.key))
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    with pytest.raises(ConfigError, match="garbage.pem is not a PEM certificate"):
        load_tls(TlsConfig(ca=ok.ca, cert=garbage, key=ok.key))
    with pytest.raises(ConfigError, match="garbage.pem is not a PEM private key"):
        load_tls(TlsConfig(ca=ok.ca, cert=ok.cert, key=garbage))
    empty = tmp_path / "empty.pem"
    empty.write_text("")
    with pytest.raises(ConfigError, match="empty.pem is empty"):
        load_tls(TlsConfig(ca=empty, cert=ok.cert, key=ok.key))
    with pytest.raises(ConfigError, match="bank.key does not belong to the certificate"):
        load_tls(TlsConfig(ca=ok.ca, cert=ok.cert, key=pki / "bank.key"))
    with pytest.raises(ConfigError, match="was not issued by the CA"):
        load_tls(TlsConfig(ca=ok.ca, cert=pki / "other" / "primary.pem",
                           key=pki / "other" / "primary.key"))
    with pytest.raises(ConfigError, match="is not a regular file"):
        load_tls(TlsConfig(ca=tmp_path, cert=ok.cert, key=ok.key))
    if hasattr(os, "geteuid") and os.geteuid() != 0:  # root reads anything
        unreadable = tmp_path / "unreadable.key"
        unreadable.write_bytes(ok.key.read_bytes())
        unreadable.chmod(0)
        with pytest.raises(ConfigError, match="cannot be read"):
            load_tls(TlsConfig(ca=ok.ca, cert=ok.cert, key=unreadable))
    with pytest.raises(ConfigError, match="must be a path"):
        TlsConfig(ca=1, cert=ok.cert, key=ok.key)  # type: ignore[arg-type]


def test_load_tls_encrypted_key_and_inconsistent_identity(pki: Path, tmp_path: Path) -> None:
    ok = TlsConfig.for_party(pki, "primary")
    key = serialization.load_pem_private_key(ok.key.read_bytes(), password=None)
    locked = tmp_path / "locked.key"
    locked.write_bytes(key.private_bytes(  # type: ignore[union-attr]
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"secret")))
    with pytest.raises(ConfigError, match="locked.key is encrypted"):
        load_tls(TlsConfig(ca=ok.ca, cert=ok.cert, key=locked))

    # A certificate from the right CA whose CN is not among its DNS names cannot be pinned.
    ca_key = serialization.load_pem_private_key((pki / "ca.key").read_bytes(), password=None)
    ca_cert = x509.load_pem_x509_certificate((pki / "ca.pem").read_bytes())
    leaf = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "bank")]))
            .issuer_name(ca_cert.subject).public_key(leaf.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=1))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("primary")]), critical=False)
            .sign(ca_key, hashes.SHA256()))  # type: ignore[arg-type]
    (tmp_path / "odd.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "odd.key").write_bytes(leaf.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    (tmp_path / "odd.key").chmod(0o600)
    with pytest.raises(ConfigError, match="does not carry the party name as a DNS"):
        load_tls(TlsConfig(ca=ok.ca, cert=tmp_path / "odd.pem", key=tmp_path / "odd.key"))


def test_group_readable_key_is_a_warning(pki: Path, tmp_path: Path,
                                         caplog: pytest.LogCaptureFixture) -> None:
    ok = TlsConfig.for_party(pki, "bank")
    loose = tmp_path / "loose.key"
    loose.write_bytes(ok.key.read_bytes())
    loose.chmod(0o644)
    assert load_tls(TlsConfig(ca=ok.ca, cert=ok.cert, key=loose)).identity == "bank"
    assert "readable by other users" in caplog.text


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vflink")
    certs.register(parser.add_subparsers(dest="command", required=True))
    return parser


def test_certs_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "certs"
    args = _parser().parse_args(["certs", "--out", str(out), "--parties",
                                 "primary, bank,coordinator", "--days", "30"])
    assert args.func(args) == 0
    printed = capsys.readouterr().out
    for name in ("ca.pem", "ca.key", "primary.key", "bank.pem", "coordinator.key"):
        assert name in printed and (out / name).exists()
    assert "mode 0600" in printed
    assert load_tls(TlsConfig.for_party(out, "coordinator")).identity == "coordinator"
    with pytest.raises(ConfigError, match="refusing to overwrite"):
        args.func(args)
    args = _parser().parse_args(["certs", "--out", str(out), "--parties", "primary",
                                 "--overwrite"])
    assert args.func(args) == 0
    with pytest.raises(SystemExit):
        _parser().parse_args(["certs", "--out", str(out), "--parties", "a,,b"])
