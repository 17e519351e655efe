"""The encode stage: each data party encodes its own identifiers (or fields) and only the
encodings reach the coordinator (FedSim §4.1; keyed Bloom filters by default, App. I).

``ENCODERS``:

* ``identifier``: one identifier (one or several columns) of the tables in memory. The
  identifiers are checked first where both tables are at hand, so an error names the file
  (empty ones stop the link, or with ``empty = "skip"`` are left out and counted); then the
  encoding (:func:`vflink.runner.encoding.encoding_for`), the parties
  (:class:`~vflink.runner.link.parties.LocalParties`) and their encodings to the coordinator;
* ``fields``: several fields, each with its own encoding
  (:func:`vflink.runner.encoding.field_encodings`), blocking keys as keyed digests of the
  same normalised values as the fields' (:func:`vflink.runner.encoding.blocking_plan`: dates
  parsed, strings folded, phone numbers as digits), and each field's keyed exact-agreement
  hashes for a model link;
* ``chunks``: the streamed link's: the secondary's encodings spilled to a scratch directory
  partition by partition, the primary's encoded chunk by chunk as the candidates stage asks
  for them (memory flat in the tables' size).
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from vflink.data.table import (
    has_column,
    is_arrow,
    numeric_column,
    report,
    show_value,
    take_rows,
)
from vflink.errors import ConfigError, DataError
from vflink.linkage import BloomConfig, SearchOptions
from vflink.linkage.encoding import encode_chunked
from vflink.linkage.validation import validate_identifiers
from vflink.parties.linking import build_encoder, field_raw_values, identifier_values
from vflink.protocol import FieldEncoding
from vflink.registry import Registry
from vflink.runner.encoding import (
    blocking_plan,
    describe_fields,
    encoding_for,
    federal_spec,
    field_encodings,
    fields_encoder,
    identifier_kind,
    resolve_fields,
)
from vflink.runner.link.context import LinkContext, Stage
from vflink.runner.link.parties import LocalParties
from vflink.runner.link.read import check_top_k
from vflink.runner.local import secret_with_source

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa

__all__ = ["ENCODERS"]

log = logging.getLogger(__name__)

ENCODERS: Registry[Stage] = Registry("link encoder")


def _secret(ctx: LinkContext, keyed: bool) -> bytes | None:
    """The data parties' shared secret when the encodings are keyed: the one given, else
    $VFLINK_SECRET, derived from the seed when unset (and said so), random without a seed:
    both data parties are in this process."""
    ctx.secret_source = "given" if ctx.secret is not None else ""
    if keyed and ctx.secret is None:
        ctx.secret, ctx.secret_source = secret_with_source("VFLINK_SECRET",
                                                           seed=ctx.settings.seed)
    return ctx.secret


# --- one identifier ----------------------------------------------------------------------------


@ENCODERS.register("identifier")
def encode_identifier(ctx: LinkContext) -> LinkContext:
    try:
        return _encode_identifier(ctx)
    except DataError as exc:
        # The pure layers name the side ("primary identifiers ..."); the user needs the file.
        text = str(exc)
        for side in (ctx.primary, ctx.secondary):
            if text.startswith(side.party) and not text.startswith(side.source):
                raise DataError(f"{side.source}: {text}") from None
        raise


def _encode_identifier(ctx: LinkContext) -> LinkContext:
    s, p, q = ctx.settings, ctx.primary, ctx.secondary
    metric = str(s.metric)
    p_frame, q_frame = p.frame, q.frame
    if p_frame is None or q_frame is None:  # pragma: no cover - the read stage's
        raise RuntimeError("the identifier encoder needs the whole tables")
    ctx.kind = kind = "string" if metric == "levenshtein" else (
        "numeric" if metric in ("euclidean", "haversine")
        else identifier_kind(p_frame, s.on, metric))
    p.keep = _check_empty(p_frame, s.on, kind, p.source, s.empty)
    q.keep = _check_empty(q_frame, s.secondary_on, kind, q.source, s.empty)
    if not (p.keep.all() and q.keep.all()):
        # Checked here, on the whole tables: the rows linked below are renumbered, and a bad
        # cell must be named by its row in the file, not by its renumbered row (the decide
        # stage puts the links back at the rows' positions).
        _check_kept(p_frame, s.on, kind, metric, p.source, p.keep)
        _check_kept(q_frame, s.secondary_on, kind, metric, q.source, q.keep)
        p_frame = take_rows(p_frame, p.keep)
        q_frame = take_rows(q_frame, q.keep)
        check_top_k(s.top_k, len(q_frame), q.source)
    if metric == "levenshtein":
        _warn_numbers_as_text(p_frame, s.on, p.source, q_frame, s.secondary_on, q.source)
    if metric in ("euclidean", "haversine", "levenshtein"):
        # Checked on the raw values here, where both tables are at hand: after Bloom encoding a
        # NaN coordinate or a latitude of 123° could no longer be told apart (in a deployment
        # each data party runs the same check on its own side).
        kind = "string" if metric == "levenshtein" else "numeric"
        validate_identifiers(
            identifier_values(p_frame, s.on, kind, source=p.source),
            identifier_values(q_frame, s.secondary_on, kind, source=q.source),
            metric=metric, top_k=s.top_k)
    spec, ctx.search_metric = encoding_for(metric, bloom=s.privacy == "bloom",
                                           sides=((p_frame, s.on), (q_frame, s.secondary_on)),
                                           bloom_config=s.bloom, geo_config=s.geo,
                                           sources=(p.source, q.source))
    ctx.encodings, ctx.encoder = (spec,), spec.encoder
    secret = _secret(ctx, spec.encoder == "bloom")
    ctx.parties = LocalParties.build(
        (p_frame, p.source, s.on), (q_frame, q.source, s.secondary_on), secret=secret,
        private=spec.encoder == "bloom", seed=s.seed,
        search=SearchOptions(mode=s.search),  # type: ignore[arg-type]
        compute=ctx.compute, transcript=ctx.transcript)
    ctx.cleanup.callback(ctx.parties.close)
    ctx.parties.send_identifiers(spec)
    return ctx


def _numbers(frame: pd.DataFrame, column: str) -> npt.NDArray[np.float64] | None:
    """The column's values as numbers when every present one is a number, else None."""
    import pandas as pd

    if column not in frame.columns:
        return None
    values = frame[column]
    present = values.notna() & (values.astype(str).str.strip() != "")
    if not present.any():
        return None
    x = pd.to_numeric(values[present], errors="coerce")
    return None if x.isna().any() else x.to_numpy(dtype=np.float64)


def _warn_numbers_as_text(p_frame: pd.DataFrame, on: Sequence[str], p_source: str,
                          q_frame: pd.DataFrame, s_on: Sequence[str], q_source: str) -> None:
    """Warn when Levenshtein compares numbers: it counts edits of their digits (12 and 21
    are one swap apart, 99 and 100 three edits), and two numeric columns whose values do not
    even overlap are most likely two different quantities."""
    for c, c_s in zip(on, s_on, strict=False):
        a, b = _numbers(p_frame, c), _numbers(q_frame, c_s)
        if a is None or b is None:
            continue
        lo_a, hi_a, lo_b, hi_b = a.min(), a.max(), b.min(), b.max()
        apart = hi_a < lo_b or hi_b < lo_a
        log.warning(
            "levenshtein compares %s:%s and %s:%s as text, by edits of their digits, but both "
            "hold numbers%s; compare numbers with metric = \"euclidean\"", p_source, c,
            q_source, c_s,
            f" whose ranges do not even overlap ([{lo_a:g}, {hi_a:g}] against [{lo_b:g}, "
            f"{hi_b:g}]): they look like two unrelated quantities" if apart else "")


def _blank(frame: pd.DataFrame | pa.Table, column: str) -> npt.NDArray[np.bool_]:
    if is_arrow(frame):  # numbers only (read_numeric_parquet): a null or a NaN is missing
        return np.isnan(numeric_column(frame, column))
    import pandas as pd

    values = frame[column]
    missing = values.isna().to_numpy()
    if values.dtype == object or pd.api.types.is_string_dtype(values):
        text = values.astype(object).where(~missing, "")
        missing = missing | np.asarray([not str(v).strip() for v in text], dtype=bool)
    return np.asarray(missing, dtype=bool)


def _check_empty(frame: pd.DataFrame | pa.Table, columns: Sequence[str], kind: str,
                 source: str, policy: str) -> npt.NDArray[np.bool_]:
    """Rows to keep under the empty-identifier policy (raises under ``"error"``).

    A numeric identifier is empty when any of its columns is missing; a string identifier
    when all its columns are blank (several string columns are joined, e.g. first and last
    name, so one blank part still leaves a name to compare).
    """
    present = [c for c in columns if has_column(frame, c)]
    if not present:
        return np.ones(len(frame), dtype=bool)
    blank = np.stack([_blank(frame, c) for c in present], axis=1)
    empty = blank.any(axis=1) if kind == "numeric" else blank.all(axis=1)
    if empty.any() and policy == "error":
        row = int(np.flatnonzero(empty)[0])
        column = present[int(np.flatnonzero(blank[row])[0])]
        raise DataError(
            f"{source}: identifier column {column!r} is empty at row {row} (line {row + 2} of a "
            f"CSV); {int(empty.sum())} row(s) have an empty identifier. Fill them in, or set "
            f"empty = \"skip\" (--empty skip) to link the other rows and leave these unlinked")
    return np.asarray(~empty, dtype=bool)


def _check_kept(frame: pd.DataFrame | pa.Table, columns: Sequence[str], kind: str,
                metric: str, source: str, keep: npt.NDArray[np.bool_]) -> None:
    """The checks of the numeric identifiers of the rows ``keep`` selects (non-numeric and
    infinite values, coordinates out of range), with every row named by its position in
    ``frame``: one :class:`DataError` listing every problem."""
    if kind != "numeric" or not all(has_column(frame, c) for c in columns):
        return  # strings need no more checks once the empty ones are skipped
    x = np.asarray(identifier_values(frame, columns, "numeric", source=source))
    problems: list[str] = []

    def first(mask: npt.NDArray[np.bool_], col: int, what: str) -> None:
        rows = np.flatnonzero(mask)
        if rows.size:
            row = int(rows[0])
            problems.append(f"identifier column {columns[col]!r} {what} at row {row} (line "
                            f"{row + 2} of a CSV), value {show_value(x[row, col])}; "
                            f"{rows.size} row(s) in all")

    for col in range(x.shape[1]):
        first(keep & np.isinf(x[:, col]), col, "holds an infinite value")
    if metric == "haversine" and x.shape[1] == 2:
        for col, name, limit in ((0, "latitude", 90.0), (1, "longitude", 180.0)):
            first(keep & np.isfinite(x[:, col]) & (np.abs(x[:, col]) > limit), col,
                  f"({name}) is outside [-{limit:g}, {limit:g}]")
    if problems:
        raise report(source, problems)


# --- several fields ----------------------------------------------------------------------------


@ENCODERS.register("fields")
def encode_fields(ctx: LinkContext) -> LinkContext:
    """Each field's encoding, checked on both tables (so an error names the file), then each
    data party's encodings, blocking-key digests and (a model link) exact-agreement hashes."""
    s, p, q = ctx.settings, ctx.primary, ctx.secondary
    if p.frame is None or q.frame is None:  # pragma: no cover - the read stage's
        raise RuntimeError("the fields encoder needs the whole tables")
    private = s.privacy == "bloom"
    ctx.fields = fields = resolve_fields(s.fields, p.frame)
    ctx.encodings = encodings = field_encodings(
        fields, private=private, primary=p.frame, secondary=q.frame, margin=0.01,
        bloom_config=s.bloom, geo_config=s.geo, sources=(p.source, q.source))
    ctx.encoder = fields_encoder(encodings)
    ctx.search_metric = describe_fields(fields, s.blocking)
    own = tuple(FieldEncoding(columns=f.on, spec=e) for f, e in zip(fields, encodings,
                                                                      strict=True))
    theirs = tuple(FieldEncoding(columns=f.columns_s, spec=e) for f, e in zip(fields, encodings,
                                                                             strict=True))
    # Checked here, where both tables are at hand, so that an error names the file (in a
    # deployment each data party runs the same checks on its own side).
    for side, mine, blocking in ((p, own, [c for b in s.blocking for c in b.columns]),
                                 (q, theirs, [c for b in s.blocking for c in b.columns_s])):
        frame = side.frame
        if frame is None:  # pragma: no cover - checked above
            raise RuntimeError("no table")
        field_raw_values(frame, mine, source=side.source)
        missing = [c for c in blocking if c not in frame.columns]
        if missing:
            raise DataError(f"{side.source}: unknown blocking column(s) {missing}; the table "
                            f"has: {', '.join(map(str, frame.columns[:20]))}")
    keyed = bool(s.blocking) or s.model is not None or any(e.encoder == "bloom"
                                                           for e in encodings)
    secret = _secret(ctx, keyed)
    if not keyed:
        ctx.secret_source = ""
    ctx.parties = LocalParties.build(
        (p.frame, p.source, [*(c for f in own for c in f.columns),
                             *(c for b in s.blocking for c in b.columns)]),
        (q.frame, q.source, [*(c for f in theirs for c in f.columns),
                             *(c for b in s.blocking for c in b.columns_s)]),
        secret=secret, private=all(e.encoder == "bloom" for e in encodings), seed=s.seed,
        transcript=ctx.transcript)
    ctx.cleanup.callback(ctx.parties.close)
    kinds, ctx.state["rule_atoms"] = blocking_plan(s.blocking, fields, encodings, p.frame,
                                                   q.frame)
    ctx.parties.send_fields(own, theirs, blocking=s.blocking, exact=s.model is not None,
                            key_kinds=kinds)
    return ctx


# --- the streamed link -------------------------------------------------------------------------


@ENCODERS.register("chunks")
def encode_chunks(ctx: LinkContext) -> LinkContext:
    """The streamed link's encodings: the agreed encoding (a FEDERAL range from each party's
    min and max, App. I, as in memory), the secondary's partitions spilled to the scratch
    directory beside ``out``, the primary's chunks encoded as they are asked for."""
    import pandas as pd

    s, p, q = ctx.settings, ctx.primary.batches, ctx.secondary.batches
    if p is None or q is None or s.out is None:  # pragma: no cover - the read stage's
        raise RuntimeError("the chunks encoder needs the streamed reader")
    if s.mode not in ("soft", "top1"):
        raise ConfigError(f"a streamed link's `mode` must be soft or top1, got {s.mode!r}")
    if s.mode != "soft" and s.top_k != 1:
        raise ConfigError(f"mode {s.mode!r} links one secondary row per primary row; `top_k` "
                          f"must be 1, got {s.top_k}")
    private, metric, on, s_on = s.privacy == "bloom", str(s.metric), s.on, s.secondary_on
    if metric in ("euclidean", "haversine", "levenshtein"):
        kind = "string" if metric == "levenshtein" else "numeric"
    else:  # hamming: Bloom filters of whatever the columns hold, typed as the whole read types
        first = p.first(on)
        kind = "numeric" if all(pd.api.types.is_numeric_dtype(first[c]) for c in on) \
            else "string"
    ctx.kind = kind
    if kind == "numeric" and metric != "haversine" and (private or metric == "hamming"):
        # each data party's min and max: the agreed FEDERAL range (App. I), as in memory
        spec = federal_spec(s.bloom or BloomConfig(), [
            (p.ranges(on, metric), on, p.source), (q.ranges(s_on, metric), s_on, q.source)],
            margin=0.01)
        ctx.search_metric = "hamming"
    else:
        typed = pd.DataFrame({c: pd.Series([], dtype=float if kind == "numeric" else object)
                              for c in on})
        spec, ctx.search_metric = encoding_for(metric, bloom=private, sides=((typed, on),),
                                               bloom_config=s.bloom, geo_config=s.geo)
    ctx.encodings, ctx.encoder = (spec,), spec.encoder
    encoder = build_encoder(spec, _secret(ctx, spec.encoder == "bloom"))
    traffic = ctx.state["traffic"] = {
        "primary->coordinator": [0, 0], "secondary->coordinator": [0, 0],
        "coordinator->primary": [0, 0], "coordinator->secondary": [0, 0]}

    def encode(values: Any) -> Any:
        encoded = encode_chunked(encoder, values, ctx.compute)
        return np.asarray(encoded) if kind == "numeric" or isinstance(encoded, np.ndarray) \
            else np.array(list(encoded), dtype=str)

    s.out.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{s.out.name}.", suffix=".scratch",
                                    dir=s.out.parent))
    ctx.cleanup.callback(shutil.rmtree, scratch, ignore_errors=True)
    ctx.state["scratch"] = scratch
    # the secondary party: encodings only, spilled as partitions in the coordinator's scratch
    partitions: list[tuple[int, str]] = []
    n_secondary = 0
    batches = q.values(s_on, kind, metric)
    while True:
        with ctx.clock.stage("read"):
            batch = next(batches, None)
        if batch is None:
            break
        offset, values = batch
        enc = encode(values)
        path = scratch / f"s-{len(partitions):06d}.npy"
        np.save(path, enc, allow_pickle=False)
        partitions.append((offset, str(path)))
        traffic["secondary->coordinator"][0] += 1
        traffic["secondary->coordinator"][1] += int(enc.nbytes)
        n_secondary = offset + len(enc)
    ctx.state["partitions"], ctx.secondary.rows = tuple(partitions), n_secondary

    def primary_chunks() -> Iterator[Any]:
        """Each primary chunk's encodings, as the candidates stage asks for them (its
        reading counted for the read stage, its encoding for this one)."""
        batches = p.values(on, kind, metric)
        while True:
            with ctx.clock.stage("encode"):
                with ctx.clock.stage("read"):
                    batch = next(batches, None)
                if batch is None:
                    return
                enc = encode(batch[1])
                traffic["primary->coordinator"][0] += 1
                traffic["primary->coordinator"][1] += int(enc.nbytes)
            yield enc

    ctx.state["primary_chunks"] = primary_chunks()
    return ctx
