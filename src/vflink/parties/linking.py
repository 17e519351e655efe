"""The data parties' side of alignment: keyed hashes and identifier encodings.

:class:`AlignmentInitiator` is what the primary runs to align its records with the secondaries
through a coordinator; the secondaries answer with the same encoding functions. Only digests or
encodings leave a data party: raw identifiers leave only with an explicit ``encoder="raw"`` or
``"string"`` spec, which the user must ask for (privacy off).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from vflink.alignment.confirm import confirmation_tag, new_nonce, tag_matches
from vflink.alignment.exact import key_digests
from vflink.data.table import bad_cells, missing_columns, report
from vflink.errors import ConfigError, DataError, ProtocolError
from vflink.linkage.encoding import (
    BloomConfig,
    BloomEncoder,
    Encoder,
    GeoBloomConfig,
    GeoBloomEncoder,
    NumericRange,
    RawEncoder,
    Standardization,
    StringEncoder,
)
from vflink.parties.guard import check_alignment_view
from vflink.parties.policy import PartyPolicy
from vflink.protocol.channel import Channel
from vflink.protocol.messages import (
    Ack,
    AlignmentReady,
    AlignmentViews,
    ConfirmKey,
    EncodingSpec,
    FetchKeyTags,
    IdentifierEncodings,
    KeyDigests,
    KeyTag,
    KeyTags,
    MatchKeys,
    ShareEncodings,
    ShareKeys,
    SoftLink,
)
from vflink.types import Alignment

__all__ = ["AlignmentInitiator", "build_encoder", "encode_identifiers", "identifier_values",
           "secret_mismatch", "send_key_tag", "uses_secret"]

log = logging.getLogger(__name__)


def uses_secret(spec: EncodingSpec) -> bool:
    """Does this encoding depend on the data parties' shared secret (keyed Bloom filters)?"""
    return spec.encoder == "bloom"


def send_key_tag(channel: Channel, coordinator: str, secret: bytes, *, party: str,
                 session: str, nonce: str) -> None:
    """Send ``party``'s key-confirmation tag (:mod:`vflink.alignment.confirm`) to the
    coordinator."""
    tag = confirmation_tag(secret, session=session, nonce=nonce, party=party)
    channel.request(coordinator, KeyTag(session=session, nonce=nonce, tag=tag), Ack)


def secret_mismatch(party: str, others: Sequence[str]) -> str:
    """The error text of a failed key confirmation, naming the parties involved."""
    names = ", ".join(repr(o) for o in others)
    return (f"key confirmation failed before alignment: the shared secrets of data parties "
            f"{party!r} and {names} differ (or the coordinator altered the confirmation tags). "
            "Every data party must hold the same secret (alignment.secret_env, $VFLINK_SECRET "
            "by default); the coordinator needs none")


def identifier_values(frame: pd.DataFrame, identifiers: Sequence[str], kind: str, *,
                      source: str = "table") -> npt.NDArray[np.float64] | list[str]:
    """The identifier columns as a float matrix (numeric) or one string per row (string).

    Several string columns are joined with a space (e.g. first and last name).
    """
    if not identifiers:
        raise ConfigError(f"{source}: no identifier columns configured for linkage")
    missing = [c for c in identifiers if c not in frame.columns]
    if missing:
        raise report(source, [missing_columns(frame, missing, "identifier column")])
    if kind == "numeric":
        out = np.empty((len(frame), len(identifiers)), dtype=np.float64)
        problems = []
        for j, col in enumerate(identifiers):
            values = pd.to_numeric(frame[col], errors="coerce")
            bad = values.isna().to_numpy() & frame[col].notna().to_numpy()
            if bad.any():
                problems.append(f"identifier column {col!r} must be numeric, "
                                f"{bad_cells(frame, bad, col)}")
                continue
            out[:, j] = values.to_numpy(dtype=np.float64, na_value=np.nan)
        if problems:
            raise report(source, problems)
        return out
    if kind == "string":
        parts = frame[list(identifiers)].astype(object)
        parts = parts.where(parts.notna(), "")
        return [" ".join(str(v) for v in row).strip()
                for row in parts.itertuples(index=False, name=None)]
    raise ConfigError(f"identifier kind must be 'numeric' or 'string', got {kind!r}")


def build_encoder(spec: EncodingSpec, secret: bytes | None) -> Encoder:
    if spec.encoder == "bloom":
        if secret is None:
            raise ConfigError("Bloom-filter encoding needs the data parties' shared secret")
        if spec.kind == "geo":  # keyed Bloom filters of places on the globe (issue 14)
            return GeoBloomEncoder(secret=secret, config=GeoBloomConfig(**spec.params))  # type: ignore[arg-type]
        ranges = NumericRange(low=spec.low, high=spec.high) if spec.kind == "numeric" else None
        return BloomEncoder(secret=secret, kind=spec.kind,  # type: ignore[arg-type]
                            config=BloomConfig(**spec.params), ranges=ranges)  # type: ignore[arg-type]
    if spec.encoder == "raw":
        std = Standardization(mean=spec.mean, scale=spec.scale) if spec.mean else None
        return RawEncoder(standardization=std)
    if spec.encoder == "string":
        return StringEncoder(normalize=bool(spec.params.get("normalize", True)))
    raise ConfigError(f"unknown encoder {spec.encoder!r}; valid names are: bloom, raw, string")


def encode_identifiers(frame: pd.DataFrame, identifiers: Sequence[str], spec: EncodingSpec,
                       secret: bytes | None, *, source: str = "table"
                       ) -> npt.NDArray[Any] | tuple[str, ...]:
    kind = "numeric" if spec.kind == "geo" else spec.kind
    values = identifier_values(frame, identifiers, kind, source=source)
    if kind == "numeric" and isinstance(values, np.ndarray) and not np.isfinite(values).all():
        bad = np.argwhere(~np.isfinite(values))[0]
        raise DataError(f"{source}: identifier column {identifiers[int(bad[1])]!r} has a missing "
                        f"or infinite value at row {int(bad[0])}")
    encoded = build_encoder(spec, secret).encode(values)
    return tuple(encoded) if isinstance(encoded, list) else np.asarray(encoded)


class AlignmentInitiator:
    """The primary's part of alignment: it asks the secondaries to send digests or encodings
    to the coordinator, asks the coordinator to match, and tells the secondaries to fetch their
    (similarity-free) view."""

    def __init__(self, name: str, frame: pd.DataFrame, channel: Channel, *,
                 secondaries: Sequence[str], key: Sequence[str] = (),
                 identifiers: Sequence[str] = (), secret: bytes | None = None,
                 source: str = "table", policy: PartyPolicy | None = None) -> None:
        self.name = name
        self.frame = frame
        self.channel = channel
        self.secondaries = tuple(secondaries)
        self.key = tuple(key)
        self.identifiers = tuple(identifiers)
        self._secret = secret
        self.source = source
        self.policy = policy if policy is not None else PartyPolicy()

    def confirm_key(self, coordinator: str, session: str) -> None:
        """Key confirmation before alignment ``session`` (:mod:`vflink.alignment.confirm`).

        The primary sends its tag to the coordinator and asks every secondary to do the same
        and check the primary's; then it checks every secondary's. A mismatch raises a
        :class:`ConfigError` naming the parties whose secrets differ.
        """
        if self._secret is None:
            raise ConfigError("alignment with keyed hashes or Bloom filters needs the data "
                              "parties' shared secret (alignment.secret_env)")
        nonce = new_nonce()
        send_key_tag(self.channel, coordinator, self._secret, party=self.name, session=session,
                     nonce=nonce)
        refused = set()
        for name in self.secondaries:
            ack = self.channel.request(name, ConfirmKey(session=session, nonce=nonce,
                                                        coordinator=coordinator), Ack)
            if ack.info.get("confirmed") != 1.0:
                refused.add(name)
        reply = self.channel.request(coordinator, FetchKeyTags(
            session=session, nonce=nonce, parties=self.secondaries), KeyTags)
        tags = dict(zip(reply.parties, np.asarray(reply.tags), strict=True))
        mismatched = [name for name in self.secondaries
                      if name in refused or name not in tags
                      or not tag_matches(self._secret, tags[name], session=session, nonce=nonce,
                                         party=name)]
        if mismatched:
            raise ConfigError(secret_mismatch(self.name, mismatched))
        log.info("key confirmation: %s share %s's secret (session %r)",
                 ", ".join(self.secondaries), self.name, session)

    def _finish(self, coordinator: str, session: str, views: AlignmentViews
                ) -> dict[str, Alignment]:
        for v in views.views:  # numbers are checked where they arrive
            check_alignment_view(v, party=self.name, peer=coordinator, policy=self.policy)
        alignments = {v.secondary: Alignment(v.primary_index, v.secondary_index, v.similarity,
                                             v.secondary, dict(v.meta)) for v in views.views}
        for name in self.secondaries:
            if name not in alignments:
                raise ProtocolError(f"coordinator returned no alignment for {name!r}")
            self.channel.request(name, AlignmentReady(session=session, coordinator=coordinator),
                                 Ack)
        return alignments

    def align_exact(self, coordinator: str, session: str = "exact") -> dict[str, Alignment]:
        """Exact keys, hashed with HMAC under the data parties' secret; digests only leave."""
        if self._secret is None:
            raise ConfigError("exact alignment needs a shared secret (alignment.secret_env)")
        self.confirm_key(coordinator, session)
        digests = key_digests(self.frame, self.key, self._secret)
        self.channel.request(coordinator, KeyDigests(session=session, digests=digests), Ack)
        for name in self.secondaries:
            self.channel.request(name, ShareKeys(session=session, coordinator=coordinator), Ack)
        views = self.channel.request(
            coordinator, MatchKeys(session=session, secondaries=self.secondaries), AlignmentViews)
        return self._finish(coordinator, session, views)

    def align_soft(self, coordinator: str, spec: EncodingSpec, *, metric: str, top_k: int,
                   mode: str = "soft", tau: float | None = None, sigma: float | None = None,
                   delta: float = 1e-5, session: str = "soft",
                   scale: tuple[float, float] | None = None) -> dict[str, Alignment]:
        """Fuzzy top-K soft linkage (FedSim §4.1) on encoded identifiers."""
        self.policy.check_identifier_release(self.name, spec.encoder)  # our own release too
        if not uses_secret(spec):
            log.info("privacy is off: raw identifiers are sent to the coordinator "
                     "(encoder %r)", spec.encoder)
        elif self.secondaries:
            self.confirm_key(coordinator, session)
        values = encode_identifiers(self.frame, self.identifiers, spec, self._secret,
                                    source=self.source)
        self.channel.request(coordinator, IdentifierEncodings(
            session=session, encoder=spec.encoder, values=values), Ack)
        for name in self.secondaries:
            self.channel.request(name, ShareEncodings(session=session, coordinator=coordinator,
                                                      spec=spec), Ack)
        views = self.channel.request(coordinator, SoftLink(
            session=session, secondaries=self.secondaries, metric=metric, top_k=top_k, mode=mode,
            tau=tau, sigma=sigma, delta=delta, scale=tuple(scale or ())), AlignmentViews)
        return self._finish(coordinator, session, views)
