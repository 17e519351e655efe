"""Party identities for mutual TLS: loading key material, and a development CA.

Every party holds a certificate signed by a CA that all parties of a federation trust. The
certificate *is* the party's identity: its subject common name and a DNS subject alternative
name both equal the party name (``"bank"``). The DNS SAN is what gRPC checks on the client side
(``grpc.ssl_target_name_override`` = the peer name), the CN/SAN pair is what the server checks
on every call (:mod:`vflink.transport.grpc.server`). One certificate serves a party as client
and as server, so it carries both the serverAuth and clientAuth extended key usages.

:func:`create_dev_pki` makes a throw-away CA and party certificates for experiments
(``vflink certs``); a real federation would have its certificates issued by an agreed CA.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import re
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from vflink._files import atomic_open
from vflink.errors import ConfigError

__all__ = [
    "CA_CERT",
    "CA_KEY",
    "TlsConfig",
    "TlsMaterial",
    "certificate_identity",
    "check_party_name",
    "create_dev_pki",
    "load_tls",
]

log = logging.getLogger(__name__)

CA_CERT = "ca.pem"
CA_KEY = "ca.key"

# Party names double as DNS names in certificates (the client pins the server's DNS SAN), so
# they must be valid DNS labels; gRPC's hostname check would silently fail on anything else.
_PARTY_NAME = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?$")
# Certificates start a little in the past: peers' clocks are never exactly in step.
_CLOCK_SKEW = dt.timedelta(minutes=5)


def check_party_name(name: str) -> str:
    """Return ``name`` if it can be a party identity in a certificate, else raise ConfigError."""
    if not isinstance(name, str) or not _PARTY_NAME.match(name):
        raise ConfigError(
            f"party name {name!r} cannot be a certificate identity: use 1-63 letters, digits "
            "or '-' (not at either end), as in a DNS label")
    return name


@dataclass(frozen=True)
class TlsConfig:
    """Where a party's TLS files are: the federation's CA, the party's certificate and key.

    Use :meth:`for_party` for the layout that ``vflink certs`` writes.
    """

    ca: Path
    cert: Path
    key: Path

    def __post_init__(self) -> None:
        for name in ("ca", "cert", "key"):
            value = getattr(self, name)
            if not isinstance(value, (str, os.PathLike)):
                raise ConfigError(f"TLS `{name}` must be a path, got {type(value).__name__}")
            object.__setattr__(self, name, Path(value))

    @classmethod
    def for_party(cls, directory: str | os.PathLike[str], party: str) -> TlsConfig:
        """``directory/ca.pem``, ``directory/<party>.pem`` and ``directory/<party>.key``."""
        d = Path(directory)
        return cls(ca=d / CA_CERT, cert=d / f"{party}.pem", key=d / f"{party}.key")


@dataclass(frozen=True)
class TlsMaterial:
    """Loaded and cross-checked TLS files; ``identity`` is the party named by the certificate."""

    ca_pem: bytes
    cert_pem: bytes
    key_pem: bytes
    identity: str


def _read(path: Path, what: str) -> bytes:
    if not path.exists():
        raise ConfigError(f"TLS {what} file {path} does not exist")
    if not path.is_file():
        raise ConfigError(f"TLS {what} file {path} is not a regular file")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"TLS {what} file {path} cannot be read: {exc.strerror or exc}") from exc
    if not data.strip():
        raise ConfigError(f"TLS {what} file {path} is empty")
    return data


def certificate_identity(cert: x509.Certificate) -> str:
    """The party name a certificate identifies: its CN, which must also be a DNS SAN.

    Raises ConfigError when the certificate does not name exactly one consistent party.
    """
    cns = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if len(cns) != 1:
        raise ConfigError(f"certificate {cert.subject.rfc4514_string()!r} must have exactly one "
                          f"common name (the party name), found {len(cns)}")
    cn = cns[0].value
    cn = cn.decode() if isinstance(cn, bytes) else cn
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        dns = san.get_values_for_type(x509.DNSName)
    except x509.ExtensionNotFound:
        dns = []
    if cn not in dns:
        raise ConfigError(f"certificate for {cn!r} does not carry the party name as a DNS "
                          f"subject alternative name (has {dns}); peers could not pin it")
    return cn


def _same_key(cert: x509.Certificate, key: object) -> bool:
    public = getattr(key, "public_key", None)
    if public is None:
        return False
    enc, fmt = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    return bool(public().public_bytes(enc, fmt) == cert.public_key().public_bytes(enc, fmt))


def load_tls(config: TlsConfig) -> TlsMaterial:
    """Read and cross-check a party's TLS files.

    Checks, each with its own ConfigError: files exist and are readable PEM; the key is not
    encrypted and belongs to the certificate; the certificate was issued by (one of) the CA
    certificate(s), is currently valid and names one party consistently (CN = DNS SAN).
    A key file readable by group or others only logs a warning: that is the operator's call.
    """
    ca_pem = _read(config.ca, "CA certificate")
    cert_pem = _read(config.cert, "certificate")
    key_pem = _read(config.key, "private key")
    try:
        cas = x509.load_pem_x509_certificates(ca_pem)
    except ValueError as exc:
        raise ConfigError(f"TLS CA file {config.ca} is not a PEM certificate: {exc}") from exc
    try:
        chain = x509.load_pem_x509_certificates(cert_pem)
    except ValueError as exc:
        raise ConfigError(f"TLS certificate file {config.cert} is not a PEM certificate: "
                          f"{exc}") from exc
    cert = chain[0]
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except TypeError as exc:  # raised for encrypted keys when no password is given
        raise ConfigError(f"TLS private key {config.key} is encrypted; vflink needs an "
                          "unencrypted key file (protect it with file permissions)") from exc
    except ValueError as exc:
        raise ConfigError(f"TLS private key file {config.key} is not a PEM private key: "
                          f"{exc}") from exc
    if not _same_key(cert, key):
        raise ConfigError(f"TLS private key {config.key} does not belong to the certificate "
                          f"{config.cert}")
    # The last certificate of the chain must come from a trusted CA (a chain may carry
    # intermediates; development certificates are issued directly by the CA).
    top = chain[-1]
    if not any(_issued_by(top, ca) for ca in cas):
        raise ConfigError(f"TLS certificate {config.cert} was not issued by the CA in "
                          f"{config.ca}")
    now = dt.datetime.now(dt.UTC)
    if not cert.not_valid_before_utc <= now <= cert.not_valid_after_utc:
        raise ConfigError(
            f"TLS certificate {config.cert} is not valid now: valid from "
            f"{cert.not_valid_before_utc:%Y-%m-%d %H:%M} to "
            f"{cert.not_valid_after_utc:%Y-%m-%d %H:%M} UTC")
    try:
        identity = check_party_name(certificate_identity(cert))
    except ConfigError as exc:
        raise ConfigError(f"TLS certificate {config.cert}: {exc}") from exc
    if os.name == "posix" and config.key.stat().st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        log.warning("TLS private key %s is readable by other users; chmod 600 it", config.key)
    return TlsMaterial(ca_pem=ca_pem, cert_pem=cert_pem, key_pem=key_pem, identity=identity)


def _issued_by(cert: x509.Certificate, ca: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


# --- development CA ---------------------------------------------------------------------------


def _new_key() -> ec.EllipticCurvePrivateKey:
    # P-256 ECDSA: fast to generate and to handshake with, supported by every TLS stack.
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _ca(days: int, now: dt.datetime) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = _new_key()
    name = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "vflink"),
                      x509.NameAttribute(NameOID.COMMON_NAME, "vflink development CA")])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _CLOCK_SKEW).not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(
            digital_signature=True, content_commitment=False, key_encipherment=False,
            data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
            encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                       critical=False)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def _party_cert(party: str, ca_key: ec.EllipticCurvePrivateKey, ca_cert: x509.Certificate,
                days: int, now: dt.datetime) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = _new_key()
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "vflink"),
                                 x509.NameAttribute(NameOID.COMMON_NAME, party)]))
        .issuer_name(ca_cert.subject).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _CLOCK_SKEW).not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(party)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(
            digital_signature=True, content_commitment=False, key_encipherment=False,
            data_encipherment=False, key_agreement=False, key_cert_sign=False, crl_sign=False,
            encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                              ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                       critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                       critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return key, cert


def _write(path: Path, data: bytes, mode: int) -> None:
    # Create with the final mode, so a private key is never readable by others, not even
    # briefly; fchmod as well so the mode is exact whatever the umask. The file is new (never
    # a link planted at ``path``) and renamed into place (vflink._files).
    with atomic_open(path, "wb", perms=mode) as f:
        os.fchmod(f.fileno(), mode)
        f.write(data)


def create_dev_pki(out: str | os.PathLike[str], parties: Sequence[str], *, days: int = 365,
                   overwrite: bool = False) -> list[Path]:
    """Create a development CA and one key/certificate pair per party in ``out``.

    Writes ``ca.pem``, ``ca.key`` and ``<party>.pem``/``<party>.key`` (keys mode 0600) and
    returns the paths written. Refuses (ConfigError, nothing written) when any of them exists
    unless ``overwrite``, when a party name cannot be a DNS name, or is given twice.
    """
    if isinstance(days, bool) or not isinstance(days, int) or days < 1:
        raise ConfigError(f"`days` must be an int >= 1, got {days!r}")
    names = list(parties)
    if not names:
        raise ConfigError("`parties` must name at least one party")
    problems: list[str] = []
    for name in names:
        try:
            check_party_name(name)
        except ConfigError as exc:
            problems.append(str(exc))
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        problems.append(f"party names given more than once: {', '.join(dupes)}")
    if "ca" in names:
        problems.append("a party cannot be called 'ca': its files would be the CA's")
    if problems:
        raise ConfigError("; ".join(problems), problems)
    directory = Path(out)
    if directory.exists() and not directory.is_dir():
        raise ConfigError(f"{directory} exists and is not a directory")
    targets = [directory / CA_CERT, directory / CA_KEY]
    for name in names:
        targets += [directory / f"{name}.pem", directory / f"{name}.key"]
    existing = [str(p) for p in targets if p.exists()]
    if existing and not overwrite:
        raise ConfigError(f"refusing to overwrite existing files (pass --overwrite): "
                          f"{', '.join(existing)}")
    try:
        directory.mkdir(parents=True, exist_ok=True)
        now = dt.datetime.now(dt.UTC)
        ca_key, ca_cert = _ca(days, now)
        _write(directory / CA_CERT, ca_cert.public_bytes(serialization.Encoding.PEM), 0o644)
        _write(directory / CA_KEY, _key_pem(ca_key), 0o600)
        for name in names:
            key, cert = _party_cert(name, ca_key, ca_cert, days, now)
            _write(directory / f"{name}.pem", cert.public_bytes(serialization.Encoding.PEM),
                   0o644)
            _write(directory / f"{name}.key", _key_pem(key), 0o600)
    except OSError as exc:
        raise ConfigError(f"cannot write certificates to {directory}: {exc}") from exc
    return targets


def party_material(name: str, tls: TlsConfig | None, *, insecure: bool,
                   what: str) -> TlsMaterial | None:
    """The TLS material of party ``name``'s ``what`` (channel/server), or None in explicit
    insecure mode; refuses a missing configuration and a certificate naming another party."""
    if tls is not None and insecure:
        raise ConfigError("pass either `tls` or `insecure=True`, not both")
    if tls is None:
        if not insecure:
            raise ConfigError(f"party {name!r}: the gRPC {what} needs a TLS configuration; "
                              "plaintext needs an explicit insecure=True (local experiments "
                              "only)")
        return None
    material = load_tls(tls)
    if material.identity != name:
        raise ConfigError(f"the certificate {tls.cert} identifies party "
                          f"{material.identity!r}, but this {what} is {name!r}")
    return material
