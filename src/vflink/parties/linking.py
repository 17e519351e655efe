"""The data parties' side of alignment: keyed hashes and identifier encodings.

:class:`AlignmentInitiator` is what the primary runs to align its records with the secondaries
through a coordinator; the secondaries answer with the same encoding functions. Only digests or
encodings leave a data party: raw identifiers leave only with an explicit ``encoder="raw"`` or
``"string"`` spec, which the user must ask for (privacy off).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import numpy.typing as npt

from vflink.alignment.confirm import confirmation_tag, new_nonce, tag_matches
from vflink.alignment.exact import key_digests
from vflink.data.table import (
    bad_cells,
    has_column,
    is_arrow,
    missing_columns,
    numeric_column,
    report,
)
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
    encode_chunked,
    normalize_string,
)
from vflink.linkage.encoding.dates import DateBloomEncoder, date_parts
from vflink.linkage.fields import KEY_KINDS, Blocking, column_key_kind, key_kind, key_text
from vflink.parties.guard import check_alignment_view
from vflink.parties.policy import PartyPolicy
from vflink.protocol.channel import Channel
from vflink.protocol.messages import (
    Ack,
    AlignmentReady,
    AlignmentViews,
    BlockingKey,
    ConfirmKey,
    EncodingSpec,
    FetchKeyTags,
    FieldComparison,
    FieldEncoding,
    FieldEncodings,
    FieldLink,
    IdentifierEncodings,
    KeyDigests,
    KeyTag,
    KeyTags,
    MatchKeys,
    ShareEncodings,
    ShareFieldEncodings,
    ShareKeys,
    SoftLink,
)
from vflink.types import Alignment, Compute

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa

__all__ = ["AlignmentInitiator", "LinkField", "blocking_digests", "build_encoder",
           "check_declared", "encode_fields", "encode_identifiers", "exact_digests",
           "field_raw_values",
           "identifier_values", "secret_mismatch", "send_key_tag", "undeclared_columns",
           "uses_secret"]

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


def identifier_values(frame: pd.DataFrame | pa.Table, identifiers: Sequence[str], kind: str,
                      *, source: str = "table") -> npt.NDArray[np.float64] | list[str]:
    """The identifier columns as a float matrix (numeric) or one string per row (string).

    Several string columns are joined with a space (e.g. first and last name). ``frame``: a
    DataFrame, or a pyarrow Table of numeric identifiers
    (:func:`vflink.data.table.read_numeric_parquet`: integers and floats, a null as NaN, as
    pandas reads them).
    """
    if not identifiers:
        raise ConfigError(f"{source}: no identifier columns configured for linkage")
    if is_arrow(frame) and kind == "numeric" and all(has_column(frame, c) for c in identifiers):
        out = np.empty((len(frame), len(identifiers)), dtype=np.float64)
        for j, col in enumerate(identifiers):
            out[:, j] = numeric_column(frame, col)
        return out
    if is_arrow(frame):  # anything else of such a table: as pandas reads it
        frame = cast("pa.Table", frame).to_pandas()
    import pandas as pd

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
        if spec.kind == "date":  # keyed Bloom filters of date tokens
            return DateBloomEncoder(secret=secret, config=BloomConfig(**spec.params))  # type: ignore[arg-type]
        if spec.kind == "geo":  # keyed Bloom filters of places on the globe
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
                       secret: bytes | None, *, source: str = "table",
                       compute: Compute | None = None) -> npt.NDArray[Any] | tuple[str, ...]:
    kind = "numeric" if spec.kind == "geo" else spec.kind
    values = identifier_values(frame, identifiers, kind, source=source)
    if kind == "numeric" and isinstance(values, np.ndarray) and not np.isfinite(values).all():
        bad = np.argwhere(~np.isfinite(values))[0]
        raise DataError(f"{source}: identifier column {identifiers[int(bad[1])]!r} has a missing "
                        f"or infinite value at row {int(bad[0])}")
    # a map over chunks of rows on the party's own engine, if it has one
    encoded = encode_chunked(build_encoder(spec, secret), values, compute)
    return tuple(encoded) if isinstance(encoded, list) else np.asarray(encoded)


# --- several fields (docs/how-to/linkage.md) ---------------------------------------------------

#: Domain label of blocking-key digests: they can never equal an exact-key digest, a Bloom
#: filter's keyed hash or a key-confirmation tag made with the same secret.
_BLOCKING_LABEL = b"vflink-blocking-key-v1"


@dataclass(frozen=True)
class LinkField:
    """One field of a multi-field link as the primary drives it: its own columns ``on``, the
    secondaries' columns, the public encoding every data party applies, and how the coordinator
    compares the encodings."""

    on: tuple[str, ...]
    secondary_on: tuple[str, ...]
    spec: EncodingSpec
    comparison: FieldComparison


def undeclared_columns(declared: Sequence[str], fields: Sequence[FieldEncoding],
                       blocking: Sequence[BlockingKey]) -> list[str]:
    """Columns a field request names that are not among ``declared`` identifiers: a data party
    encodes only the columns its own schema declares as identifiers (what it agreed to release
    for linkage), whatever a request names."""
    asked = [c for f in fields for c in f.columns] + [c for b in blocking
                                                      for c in (b.column, *b.columns)]
    return sorted({c for c in asked if c not in set(declared)})


def check_declared(party: str, declared: Sequence[str], fields: Sequence[FieldEncoding],
                   blocking: Sequence[BlockingKey]) -> None:
    """:class:`ConfigError` unless every column of the request is a declared identifier."""
    undeclared = undeclared_columns(declared, fields, blocking)
    if undeclared:
        raise ConfigError(
            f"party {party!r} links only on the columns its schema declares as identifiers "
            f"({', '.join(declared) or 'none'}); the fields and blocking keys also name "
            f"{undeclared}: add them to that party's `identifiers`")


def field_raw_values(frame: pd.DataFrame, fields: Sequence[FieldEncoding], *,
                     source: str = "table") -> list[Any]:
    """Each field's values before encoding: normalised strings (``""`` when empty, a missing
    value that the coordinator leaves out of the pair's mean), or a finite float matrix.
    Raises :class:`DataError` naming ``source``, the field and the row of a missing number or
    of a coordinate outside [−90, 90] × [−180, 180]."""
    out: list[Any] = []
    problems: list[str] = []
    for f in fields:
        kind = "numeric" if f.spec.kind == "geo" else f.spec.kind
        values = identifier_values(frame, f.columns, "string" if kind == "date" else kind,
                                   source=source)
        if kind == "string":
            out.append([normalize_string(v) if v else "" for v in values])
            continue
        if kind == "date":
            texts = [str(v).strip() for v in values]
            bad_rows = [i for i, v in enumerate(texts) if v and date_parts(v) is None]
            if bad_rows:
                problems.append(f"field {list(f.columns)} is compared as a date, but row "
                                f"{bad_rows[0]} (line {bad_rows[0] + 2} of a CSV) holds "
                                f"{texts[bad_rows[0]]!r}; expected YYYYMMDD, YYYY-MM-DD or "
                                f"DD-MM-YYYY; {len(bad_rows)} row(s) in all")
            out.append(texts)
            continue
        x = np.asarray(values, dtype=np.float64)
        bad = ~np.isfinite(x).all(axis=1)
        if f.spec.kind == "geo" or f.spec.params.get("geo"):  # (lat, lon) in degrees
            bad |= ~((np.abs(x[:, 0]) <= 90) & (np.abs(x[:, 1]) <= 180))
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            problems.append(f"field {list(f.columns)} has a missing or invalid value at row {row} "
                            f"(line {row + 2} of a CSV); {int(bad.sum())} row(s) in all")
        out.append(x)
    if problems:
        raise report(source, problems)
    return out


def encode_fields(frame: pd.DataFrame, fields: Sequence[FieldEncoding], secret: bytes | None,
                  *, source: str = "table", raw: Sequence[Any] | None = None
                  ) -> tuple[tuple[str, ...], tuple[Any, ...]]:
    """Each field encoded as its spec says: keyed Bloom filters (q-grams for strings, geographic
    filters, FEDERAL numeric filters on the agreed range), or, only with an explicit raw
    spec, the normalised strings or floats. An empty string gets an all-zero filter (a
    missing value). Returns (encoder names, values) per field. ``raw``: the fields'
    :func:`field_raw_values`, when the caller has them (a model link hashes them too)."""
    if raw is None:
        raw = field_raw_values(frame, fields, source=source)
    encoders: list[str] = []
    values: list[Any] = []
    for f, x in zip(fields, raw, strict=True):
        spec = f.spec
        if spec.kind == "date":
            if spec.encoder == "string":
                values.append(tuple(x))
            elif spec.encoder == "bloom":
                values.append(build_encoder(spec, secret).encode(x))
            else:
                raise ConfigError(f"date fields are encoded as bloom or string, not "
                                  f"{spec.encoder!r}")
        elif spec.kind == "string":
            if spec.encoder == "string":
                values.append(tuple(x))
            elif spec.encoder == "bloom":
                width = BloomConfig(**spec.params).filter_bits // 8  # type: ignore[arg-type]
                enc = np.zeros((len(x), width), dtype=np.uint8)
                filled = [i for i, v in enumerate(x) if v]
                if filled:
                    enc[filled] = build_encoder(spec, secret).encode([x[i] for i in filled])
                values.append(enc)
            else:
                raise ConfigError(f"string fields are encoded as bloom or string, not "
                                  f"{spec.encoder!r}")
        elif spec.encoder in ("bloom", "raw"):
            values.append(np.asarray(build_encoder(spec, secret).encode(x)))
        else:
            raise ConfigError(f"numeric fields are encoded as bloom or raw, not {spec.encoder!r}")
        encoders.append(spec.encoder)
    return tuple(encoders), tuple(values)


#: Domain label of a field's exact-agreement hashes (a model link): never equal to a blocking
#: digest, a Bloom filter's hash or a confirmation tag made with the same secret.
_EXACT_LABEL = b"vflink-field-exact-v1"


def _keyed_digests(texts: Sequence[bytes], secret: bytes, label: bytes, size: int
                   ) -> npt.NDArray[np.uint8]:
    """HMAC-SHA256 under ``secret`` of ``label + text`` for each text, cut to ``size`` bytes
    (each distinct text hashed once); all zero for an empty text (no value)."""
    digests = np.zeros((len(texts), size), dtype=np.uint8)
    cache: dict[bytes, bytes] = {}
    for i, text in enumerate(texts):
        if not text:
            continue
        digest = cache.get(text)
        if digest is None:
            digest = cache[text] = hmac.digest(secret, label + text, hashlib.sha256)[:size]
        digests[i] = np.frombuffer(digest, dtype=np.uint8)
    return digests


def exact_digests(frame: pd.DataFrame, fields: Sequence[FieldEncoding], secret: bytes | None,
                  *, source: str = "table", raw: Sequence[Any] | None = None
                  ) -> tuple[npt.NDArray[np.uint8], ...]:
    """Per field, HMAC-SHA256 (first 16 bytes) under the data parties' secret of each record's
    normalised value: the normalised string, the date as YYYYMMDD, or the numbers' float64
    bytes; all zero for an empty value. Equal values give equal digests across the parties,
    so the coordinator sees exact agreement and how often each value occurs, not the value
    (a model link's ``exact`` level and term frequencies)."""
    if not isinstance(secret, (bytes, bytearray)) or len(secret) < 16:
        raise ConfigError("exact-agreement hashes are keyed: they need the data parties' "
                          "shared secret (at least 16 bytes)")
    if raw is None:
        raw = field_raw_values(frame, fields, source=source)
    out = []
    for position, (f, x) in enumerate(zip(fields, raw, strict=True)):
        label = _EXACT_LABEL + f"|{position}|".encode() + b"|"
        if isinstance(x, np.ndarray):
            texts = [row.tobytes() if np.isfinite(row).all() else b""
                     for row in np.asarray(x, dtype=np.float64)]
        elif f.spec.kind == "date":
            texts = [("".join(p)).encode() if (p := date_parts(v)) else b"" for v in x]
        else:
            texts = [v.encode("utf-8") for v in x]
        out.append(_keyed_digests(texts, bytes(secret), label, 16))
    return tuple(out)


def blocking_digests(frame: pd.DataFrame, blocking: Sequence[BlockingKey], secret: bytes | None,
                     *, source: str = "table") -> tuple[npt.NDArray[np.uint8], ...]:
    """Per blocking key, HMAC-SHA256 under the data parties' secret of each record's key
    (each column normalised as its ``kinds`` say, :func:`~vflink.linkage.fields.key_text`,
    cut to ``prefix`` characters), shape ``(n, 32)``;
    all zero for a record without a key. Like exact alignment's digests, the coordinator can
    tell which keys are equal, not read them."""
    if not blocking:
        return ()
    if not isinstance(secret, (bytes, bytearray)) or len(secret) < 16:
        raise ConfigError("blocking keys are sent as keyed digests: they need the data "
                          "parties' shared secret (at least 16 bytes)")
    missing = [c for b in blocking for c in (b.column, *b.columns) if c not in frame.columns]
    if missing:
        raise report(source, [missing_columns(frame, missing, "blocking column")])
    out = []
    normalised: dict[tuple[str, str], dict[Any, str]] = {}
    for position, key in enumerate(blocking):
        label = _BLOCKING_LABEL + f"|{position}|{key.prefix}|".encode()
        names = (key.column, *key.columns)
        kinds = tuple(key.kinds) or ("string",) * len(names)
        if len(kinds) != len(names) or any(k not in KEY_KINDS for k in kinds):
            raise ConfigError(f"blocking key {position}: `kinds` must name one of "
                              f"{', '.join(KEY_KINDS)} per column, got {list(key.kinds)}")
        parts = []
        for name in names:
            column = frame[name]
            parts.append(column.astype(object).where(column.notna(), "").tolist())
        texts = []
        # each distinct value normalised once per column and kind (names and dates repeat,
        # and a column serves several rules)
        seen = [normalised.setdefault((name, kind), {}) for name, kind in zip(names, kinds,
                                                                             strict=True)]
        for values in zip(*parts, strict=True):
            cut = []
            for value, kind, memo in zip(values, kinds, seen, strict=True):
                # the same normalised value as the field's encoding (dates parsed, strings
                # folded, phone numbers as digits), so that two spellings block together
                text = memo.get(value)
                if text is None:
                    text = memo[value] = key_text(value, kind)
                cut.append(text[:key.prefix] if key.prefix else text)
            # a combined rule's key is every column's value (unit separator between them);
            # a record missing any of them has no key (blocks nothing together)
            texts.append("\x1f".join(cut).encode() if all(cut) else b"")
        out.append(_keyed_digests(texts, bytes(secret), label, 32))
    return tuple(out)


def _key_kinds(frame: pd.DataFrame, fields: Sequence[FieldEncoding],
               columns: Sequence[str]) -> tuple[str, ...]:
    """How the primary normalises each column of a blocking rule when the caller did not
    say: as its field's values when the column is a field's (dates parsed, numbers
    canonical), else as its own values show (:func:`~vflink.linkage.fields.key_kind`)."""
    kinds = []
    for c in columns:
        spec = next((f.spec for f in fields if tuple(f.columns) == (c,)), None)
        shown = key_kind(frame[c].tolist()) if c in frame.columns else "string"
        kinds.append(column_key_kind(None if spec is None else spec.kind, shown))
    return tuple(kinds)


class AlignmentInitiator:
    """The primary's part of alignment: it asks the secondaries to send digests or encodings
    to the coordinator, asks the coordinator to match, and tells the secondaries to fetch their
    (similarity-free) view."""

    def __init__(self, name: str, frame: pd.DataFrame | pa.Table, channel: Channel, *,
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
        #: this party's compute engine (vflink.engine): its encoding runs as chunk tasks there
        self.compute: Compute | None = None

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
                                             v.secondary, dict(v.meta), v.match)
                      for v in views.views}
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
        digests = key_digests(self.frame, self.key, self._secret, who=self.source)
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
        """Fuzzy top-K soft linkage (FedSim §4.1) on encoded identifiers: every data party's
        encodings (:meth:`send_identifiers`), then the link (:meth:`request_soft_link`)."""
        self.send_identifiers(coordinator, spec, session=session)
        return self.request_soft_link(coordinator, metric=metric, top_k=top_k, mode=mode,
                                      tau=tau, sigma=sigma, delta=delta, session=session,
                                      scale=scale)

    def send_identifiers(self, coordinator: str, spec: EncodingSpec, *, session: str) -> None:
        """Every data party's encoded identifiers to the coordinator: ours, then each
        secondary's on our request (key confirmation first whenever the secret is used)."""
        self.policy.check_identifier_release(self.name, spec.encoder)  # our own release too
        if not uses_secret(spec):
            log.info("privacy is off: raw identifiers are sent to the coordinator "
                     "(encoder %r)", spec.encoder)
        elif self.secondaries:
            self.confirm_key(coordinator, session)
        values = encode_identifiers(self.frame, self.identifiers, spec, self._secret,
                                    compute=self.compute,
                                    source=self.source)
        self.channel.request(coordinator, IdentifierEncodings(
            session=session, encoder=spec.encoder, values=values), Ack)
        for name in self.secondaries:
            self.channel.request(name, ShareEncodings(session=session, coordinator=coordinator,
                                                      spec=spec), Ack)

    def request_soft_link(self, coordinator: str, *, metric: str, top_k: int,
                          mode: str = "soft", tau: float | None = None,
                          sigma: float | None = None, delta: float = 1e-5,
                          session: str = "soft", scale: tuple[float, float] | None = None,
                          similarities: bool = True) -> dict[str, Alignment]:
        """Ask the coordinator to link the encodings of ``session`` (top-K search, Eq. 1-2);
        the secondaries are then told to fetch their views. ``similarities=False``: our
        alignments come back without their similarities (a primary that reads them from the
        links it writes)."""
        views = self.channel.request(coordinator, SoftLink(
            session=session, secondaries=self.secondaries, metric=metric, top_k=top_k, mode=mode,
            tau=tau, sigma=sigma, delta=delta, scale=tuple(scale or ()),
            similarities=similarities), AlignmentViews)
        return self._finish(coordinator, session, views)

    def align_fields(self, coordinator: str, fields: Sequence[LinkField], *,
                     blocking: Sequence[Blocking] = (), top_k: int, mode: str = "soft",
                     tau: float | None = None, sigma: float | None = None,
                     delta: float = 1e-5, session: str = "soft",
                     scale: tuple[float, float] | None = None, model: str = "",
                     threshold: float = 0.5, one_to_one: str = "") -> dict[str, Alignment]:
        """Soft linkage on several fields, each with its own encoding, metric and weight, and
        optional blocking keys; Eq. 1-2 on the weighted distance as FedSim §4.1.

        Every data party encodes its own columns (keyed Bloom filters by default) and sends
        blocking keys only as keyed digests; key confirmation comes first whenever the secret
        is used. The secondaries are told their own columns (``secondary_on``); each encodes
        only columns its own schema declares as identifiers. ``model = "fellegi-sunter"``:
        every data party also sends each field's keyed hash of its normalised value, and the
        coordinator scores every candidate pair with a model it trains without labels and
        decides the matches (``threshold``, ``one_to_one``; :mod:`vflink.linkage.scoring`).
        """
        if not fields:
            raise ConfigError("a multi-field link needs at least one field")
        self.send_fields(coordinator,
                         tuple(FieldEncoding(columns=f.on, spec=f.spec) for f in fields),
                         tuple(FieldEncoding(columns=f.secondary_on, spec=f.spec)
                               for f in fields),
                         blocking=blocking, exact=bool(model), session=session)
        return self.request_field_link(
            coordinator, tuple(f.comparison for f in fields), blocking=len(blocking),
            top_k=top_k, mode=mode, tau=tau, sigma=sigma, delta=delta, session=session,
            scale=scale, model=model, threshold=threshold, one_to_one=one_to_one)

    def send_fields(self, coordinator: str, own: Sequence[FieldEncoding],
                    theirs: Sequence[FieldEncoding], *, blocking: Sequence[Blocking] = (),
                    exact: bool = False, session: str,
                    key_kinds: Sequence[Sequence[str]] = ()) -> None:
        """Every data party's field encodings to the coordinator: ``own`` (our columns and the
        public encoding of each field), then each secondary's (``theirs``: its columns, the
        same encodings) on our request; blocking keys as keyed digests (each rule's columns
        normalised as ``key_kinds[r]`` says, the same on every side; default: as strings),
        and with ``exact`` (a model link) each field's keyed hash of its normalised value."""
        kinds = ([tuple(k) for k in key_kinds] if key_kinds else
                 [_key_kinds(self.frame, own, b.columns) for b in blocking])
        if not own or len(own) != len(theirs):
            raise ConfigError("a multi-field link needs at least one field, the same on each "
                              "side")
        for f in own:
            self.policy.check_identifier_release(self.name, f.spec.encoder)  # our own too
        own_keys = tuple(BlockingKey(column=b.columns[0], prefix=b.prefix or 0,
                                     columns=b.columns[1:], kinds=k)
                         for b, k in zip(blocking, kinds, strict=True))
        if self.identifiers:
            check_declared(self.name, self.identifiers, own, own_keys)
        clear = [list(f.columns) for f in own if not uses_secret(f.spec)]
        if clear:
            log.info("privacy is off for field(s) %s: their raw values are sent to the "
                     "coordinator", clear)
        if (blocking or exact or len(clear) < len(own)) and self.secondaries:
            self.confirm_key(coordinator, session)  # before any use of the secret
        raw = field_raw_values(self.frame, own, source=self.source)  # read once, used twice
        encoders, values = encode_fields(self.frame, own, self._secret, source=self.source,
                                         raw=raw)
        keys = blocking_digests(self.frame, own_keys, self._secret, source=self.source)
        hashes = exact_digests(self.frame, own, self._secret, source=self.source,
                               raw=raw) if exact else ()
        self.channel.request(coordinator, FieldEncodings(
            session=session, encoders=encoders, values=values, keys=keys, exact=hashes), Ack)
        their_keys = tuple(BlockingKey(column=b.columns_s[0], prefix=b.prefix or 0,
                                       columns=b.columns_s[1:], kinds=k)
                           for b, k in zip(blocking, kinds, strict=True))
        for name in self.secondaries:
            self.channel.request(name, ShareFieldEncodings(
                session=session, coordinator=coordinator, fields=tuple(theirs),
                blocking=their_keys, exact=exact), Ack)

    def request_field_link(self, coordinator: str, comparisons: Sequence[FieldComparison], *,
                           blocking: int = 0, top_k: int, mode: str = "soft",
                           tau: float | None = None, sigma: float | None = None,
                           delta: float = 1e-5, session: str = "soft",
                           scale: tuple[float, float] | None = None, model: str = "",
                           threshold: float = 0.5, one_to_one: str = "",
                           cardinality: str = "",
                           rule_atoms: Sequence[Sequence[int]] = (),
                           similarities: bool = True) -> dict[str, Alignment]:
        """Ask the coordinator to link the field encodings of ``session``: how it compares each
        field (``comparisons``), the number of ``blocking`` keys sent, K, Eq. 1-2's noise and,
        for a model link, the model and its decisions; the secondaries then fetch their views.
        ``similarities``: as :meth:`request_soft_link`'s."""
        views = self.channel.request(coordinator, FieldLink(
            session=session, secondaries=self.secondaries, fields=tuple(comparisons),
            top_k=top_k, blocking=blocking, mode=mode, tau=tau, sigma=sigma, delta=delta,
            scale=tuple(scale or ()), model=model, threshold=threshold,
            one_to_one=one_to_one, cardinality=cardinality,
            rule_atoms=tuple(tuple(int(a) for a in r) for r in rule_atoms),
            similarities=similarities), AlignmentViews)
        return self._finish(coordinator, session, views)
