"""Run PSU or PSI between two parties, in one process or with the secondary served elsewhere,
and write each party's ``row``/``uid`` table and a summary (``vflink align``).

PSI runs vflink's own Diffie-Hellman protocol (``protocol = "dh"``) or an OT-extension one
through the optional engine (``"rr22"``, ``"kkrt"``: :mod:`vflink.parties.setengine`)."""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from vflink._checks import column_order_warning
from vflink._files import table_format
from vflink.alignment._dh import as_rows, key_bytes
from vflink.alignment._spool import Buckets, Workdir, bucket_bits
from vflink.alignment.cost import OpCosts, crypto_bound_s, protocol_ops, sample_costs
from vflink.alignment.engine import EngineSettings, check_protocol, require_engine
from vflink.alignment.exact import check_keys_present, normalise_key
from vflink.alignment.groups import default_workers, get_group
from vflink.alignment.protocols import ENGINE_REVEALS
from vflink.alignment.psi import check_reveal
from vflink.data.batches import read_frame_header, scan_frame
from vflink.data.schema import PartySchema
from vflink.data.table import PartyTable, iter_parquet_columns
from vflink.errors import ConfigError, DataError
from vflink.parties import SecondaryParty
from vflink.parties.coordinator import CoordinatorParty
from vflink.parties.link_peer import LinkingPeer
from vflink.parties.linking import AlignmentInitiator
from vflink.parties.policy import PartyPolicy
from vflink.parties.setalign import (
    KeyBatches,
    SetAlignment,
    SetAlignmentDriver,
    write_set_alignment,
)
from vflink.parties.setengine import drive_engine_psi
from vflink.protocol.channel import Channel
from vflink.protocol.sessions import new_session_name
from vflink.runfiles.party import PartyConfig
from vflink.runfiles.rundir import write_json
from vflink.runner.encoding import encoding_summary
from vflink.runner.local import COORDINATOR, local_roles, secret_with_source
from vflink.transport import InProcessHub, TrafficCounter, Transcript
from vflink.types import Alignment, Compute

__all__ = ["METHODS", "AlignOutcome", "CostProbe", "ExactOutcome", "KeyFile",
           "align_exact_in_process", "align_in_process", "align_over_network", "bound_line",
           "engine_line", "engine_summary",
           "file_key_batches", "key_frame", "key_table", "run_cores", "run_set_alignment",
           "text_key_bytes", "write_outcome"]

METHODS = ("psu", "psi")

log = logging.getLogger(__name__)

StepProgress = Callable[[str, int, int], None]


@dataclass(frozen=True)
class AlignOutcome:
    method: str
    group: str
    primary: SetAlignment
    secondary: SetAlignment | None  # None when the secondary ran elsewhere
    seconds: float
    communication: dict[str, dict[str, int]]
    operations: int  # group operations done by the parties in this process
    reveal: str = "both"
    #: the run against its crypto bound (:meth:`CostProbe.bound`), when it was measured
    bound: dict[str, Any] | None = None
    #: the PSI protocol: "dh" (the group's), or the engine's "rr22"/"kkrt"
    protocol: str = "dh"

    @property
    def sizes(self) -> dict[str, int]:
        sizes = dict(self.primary.sizes)
        if self.secondary is not None:
            sizes.update({k: v for k, v in self.secondary.sizes.items() if k not in sizes})
        return sizes

    def summary(self, wall_s: float | None = None) -> dict[str, Any]:
        """The run's summary; an engine run's time is shared out against ``wall_s`` (the
        command's own time), default the run's."""
        out: dict[str, Any] = {"method": self.method, "group": self.group, "sizes": self.sizes,
               "seconds": round(self.seconds, 3), "bytes": {
                   k: v["bytes"] for k, v in self.communication.items()},
               "messages": {k: v["messages"] for k, v in self.communication.items()},
               "group_operations_here": self.operations}
        if self.bound is not None:
            out["crypto_bound"] = self.bound
        if self.protocol != "dh":
            out["protocol"] = self.protocol
            engine = engine_summary(self.primary, self.seconds if wall_s is None else wall_s)
            if self.secondary is not None and self.secondary.timings:
                engine["secondary_seconds"] = self.secondary.timings
            out["engine"] = engine
        return out


def engine_summary(result: SetAlignment, wall_s: float) -> dict[str, Any]:
    """What an engine run gave, and where its time went: the protocol itself (libpsi's online
    phase) against everything around it (the CSV files, libpsi's hash buckets and sorting,
    starting the engine and its link), as seconds and as a share of ``wall_s``."""
    t = dict(result.timings)
    csv = t.get("input_csv", 0.0) + t.get("engine_init", 0.0) + t.get("output", 0.0)
    sort = (t.get("engine_preprocess", 0.0) + t.get("engine_postprocess", 0.0)
            + t.get("engine_finalize", 0.0))
    start = t.get("engine_import", 0.0) + t.get("engine_link", 0.0)
    protocol = t.get("engine_online", 0.0)
    wall = max(float(wall_s), 1e-9)
    learns = {"both": "both parties learn the intersection (rows, and a UID per row)",
              "primary": "the primary learns the intersection; the secondary nothing more",
              "secondary": "the secondary learns the intersection; the primary nothing more"}
    return {**{k: v for k, v in result.engine.items()},
            "learns": "each party learns the other's set size; "
                      + learns.get(str(result.engine.get("reveal", "both")), ""),
            "security_note": "semi-honest only: a party that deviates inside the engine can "
                             "learn more than the intersection; against a deviating primary "
                             "use protocol \"dh\" (its answers carry proofs)",
            "seconds": t,
            "protocol_seconds": round(protocol, 3),
            "outside_protocol": {"csv": round(csv, 3), "buckets_and_sorting": round(sort, 3),
                                 "engine_start": round(start, 3),
                                 "other": round(max(0.0, wall - protocol - csv - sort - start),
                                                3)},
            "outside_protocol_share": round(1.0 - protocol / wall, 3)}


def engine_line(engine: dict[str, Any], wall_s: float) -> str:
    """An engine run's :func:`engine_summary` in a few words, for the command's last line."""
    out = engine["outside_protocol"]
    return (f"{engine.get('protocol')} (semi-honest): protocol "
            f"{engine['protocol_seconds']:.1f} s, {engine['outside_protocol_share']:.0%} of "
            f"{wall_s:.1f} s outside it (CSV {out['csv']:.1f} s, buckets and sorting "
            f"{out['buckets_and_sorting']:.1f} s, engine start {out['engine_start']:.1f} s)")


def run_cores(compute: Compute | None, workers: int | None = None) -> int:
    """The cores a set alignment's group operations use: the engine's workers, else the
    group's threads (``workers``, default every core), never more than this process may use."""
    if compute is not None:
        return max(1, int(compute.workers))
    cores = default_workers()
    return min(cores, max(1, int(workers))) if workers is not None else cores


class CostProbe:
    """A run of ``vflink align`` against its crypto bound (:mod:`vflink.alignment.cost`): the
    group's operation costs are sampled when the probe is made (before the run) and again in
    :meth:`bound` (after it), each a fraction of a second on one core through the group's
    own chunk functions; the bound uses their mean."""

    def __init__(self, group: str) -> None:
        self.group = get_group(group, workers=1)
        self.before = sample_costs(self.group)

    def bound(self, outcome: AlignOutcome, *, wall_s: float, cores: int) -> dict[str, Any]:
        """What the summary records: the bound, ``wall_s`` as a ratio to it, the operations
        per role and the costs per operation. When the secondary ran elsewhere its operations
        are costed at this machine's rates and ``cores`` (it is the peer's machine that does
        them: a bound for equal machines)."""
        after = sample_costs(self.group)
        costs = OpCosts.mean(self.before, after)
        sizes = outcome.sizes
        n_a, n_p = int(sizes["primary"]), int(sizes["secondary"])
        union = int(sizes["union"]) if outcome.method == "psu" else None
        both = int(sizes.get("intersection", 0)) if outcome.method == "psi" else 0
        ops = {role: protocol_ops(outcome.method, role, n_a=n_a, n_p=n_p, n_union=union,
                                  n_both=both, reveal=outcome.reveal)
               for role in ("primary", "secondary")}
        bound = crypto_bound_s(ops.values(), costs, cores)
        out: dict[str, Any] = {
            "seconds": round(bound, 6), "cores": cores, "wall_seconds": round(wall_s, 3),
            "ratio": round(wall_s / bound, 3) if bound > 0 else None,
            "us_per_operation": {"before": self.before.as_us(), "after": after.as_us(),
                                 "mean": costs.as_us()},
            "operations": {role: o.as_dict() for role, o in ops.items()}}
        if outcome.secondary is None:
            out["secondary_costed_as"] = "this machine's costs and cores"
        return out


def bound_line(bound: dict[str, Any]) -> str:
    """A :meth:`CostProbe.bound` in a few words, for the command's last line."""
    us, cores, ratio = bound["us_per_operation"]["mean"], bound["cores"], bound["ratio"]
    head = f"{ratio:.2f}× its crypto bound" if ratio is not None else "crypto bound"
    seconds = bound["seconds"]
    shown = f"{seconds:.1f}" if seconds >= 1 else f"{seconds:.2g}"
    return (f"{head} of {shown} s on {cores} core{'s' if cores != 1 else ''} "
            f"(µs per operation: exponentiation {us['power']:.1f}, checked "
            f"{us['power_checked']:.1f}, hash {us['hash']:.1f}, check {us['validate']:.1f})")


def key_table(path: Path, on: Sequence[str], *, name: str, delimiter: str | None = None,
              encoding: str | None = None) -> PartyTable:
    """A party table holding only the key columns, read as text (``007`` stays ``007``).

    Parquet is scanned for the key columns alone, in record batches (a wide table's other
    columns are never loaded), each batch converted to text as it arrives."""
    if table_format(path) == "parquet":  # from the bytes, as every table reader decides
        parts = [b.astype("string").fillna("") for b in iter_parquet_columns(Path(path), on)]
        frame = (pd.concat(parts, ignore_index=True) if parts
                 else pd.DataFrame({c: pd.Series(dtype="string") for c in on}))
    else:  # a CSV in record batches too, the key columns alone, as text
        header = read_frame_header(Path(path), delimiter=delimiter, encoding=encoding)
        frame = pd.DataFrame(columns=header)
        if set(on) <= set(header):
            batches = [b.frame for b in scan_frame(
                path, columns=on, text_columns=on, delimiter=delimiter, encoding=encoding)]
            if batches:  # a header alone is an empty table
                frame = pd.concat(batches, ignore_index=True)
    return key_frame(frame, on, name=name, source=str(path))


def key_frame(frame: pd.DataFrame, on: Sequence[str], *, name: str, source: str) -> PartyTable:
    """:func:`key_table` of a table already read (``source`` names it in errors)."""
    missing = [c for c in on if c not in frame.columns]
    if missing:
        raise DataError(f"{source}: key column(s) {missing} not found; columns: "
                        f"{list(frame.columns)[:20]}")
    frame = frame[list(on)].astype("string").fillna("")
    # key-only tables: the protocol's roles (P_a, P_p) are not the schema's label roles
    schema = PartySchema(name=name, role="secondary", key=tuple(on))
    return PartyTable(schema, frame.reset_index(drop=True), source)


@dataclass(frozen=True)
class KeyFile:
    """A party's key column(s) in a table file (CSV/TSV/.csv.gz, Parquet file or directory),
    read in batches while aligning instead of as a whole table (memory flat in its size)."""

    path: Path
    on: tuple[str, ...]
    name: str
    delimiter: str | None = None
    encoding: str | None = None

    def empty_table(self) -> PartyTable:
        """A key-only table of no rows: the party's schema without its data."""
        return key_frame(pd.DataFrame({c: pd.Series(dtype="string") for c in self.on}),
                         self.on, name=self.name, source=str(self.path))


def _key_text(kf: KeyFile, batch_rows: int) -> Iterator[pd.DataFrame]:
    """The key columns as text, ``batch_rows`` rows at a time (as :func:`key_table` reads
    them: Arrow/CSV text, missing values as empty text)."""
    path = Path(kf.path)
    if table_format(path) == "parquet":
        for b in iter_parquet_columns(path, kf.on, batch_rows=batch_rows):
            yield b.astype("string").fillna("")
        return
    header = read_frame_header(path, delimiter=kf.delimiter, encoding=kf.encoding)
    missing = [c for c in kf.on if c not in header]
    if missing:
        raise DataError(f"{path}: key column(s) {missing} not found; columns: {header[:20]}")
    for batch in scan_frame(path, columns=kf.on, text_columns=kf.on, delimiter=kf.delimiter,
                            encoding=kf.encoding, batch_rows=batch_rows):
        yield batch.frame


def _key_lists(kf: KeyFile, batch_rows: int) -> Iterator[list[bytes]]:
    """Canonical key bytes (as :func:`~vflink.alignment._dh.key_bytes`), one batch at a time;
    an empty key is refused naming its row and column."""
    offset = 0
    for frame in _key_text(kf, batch_rows):
        check_keys_present(frame, kf.on, who=str(kf.path), offset=offset)
        offset += len(frame)
        yield text_key_bytes(frame, kf.on)


def text_key_bytes(frame: pd.DataFrame, on: Sequence[str]) -> list[bytes]:
    """:func:`~vflink.alignment.exact.normalise_key` of each row of text key columns, encoded:
    the same bytes as :func:`~vflink.alignment._dh.key_bytes`, from plain lists of the columns'
    values (ten times faster than rows of an Arrow-backed frame, a cost every pass over a
    large key file paid). A single text column's canonical key is its trimmed value."""
    cols = [frame[c].astype("string").fillna("").tolist() for c in on]
    if len(cols) == 1:
        return [v.strip().encode() for v in cols[0]]
    return [normalise_key(row).encode() for row in zip(*cols, strict=True)]


def file_key_batches(kf: KeyFile, *, chunk_rows: int, tmp_dir: Path | None = None
                     ) -> KeyBatches:
    """:class:`KeyBatches` reading ``kf`` from its file in batches of at most ``chunk_rows``.

    A first pass counts the keys and refuses duplicates as :func:`key_bytes` does (the same
    error, naming the first repeated row) without holding them: a 16-byte digest of each key
    goes to on-disk hash buckets of about ``chunk_rows``, checked one bucket at a time. Each
    protocol pass then reads the file again; nothing of the table stays in memory."""
    if not kf.on:
        raise DataError(f"{kf.path}: no key column(s) to align on")
    chunk_rows = max(1, int(chunk_rows))
    path = Path(kf.path)
    table_format(path)  # a missing file, or one that is no table, named before any work
    # the buckets are sized before the count is known: from the file's size (≥ 2 bytes a row)
    size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.is_dir() \
        else path.stat().st_size
    work = Workdir(tmp_dir, prefix="vflink-keys-")
    try:
        digests = Buckets(work.new("keys"), 16, bits=bucket_bits(max(1, size // 2), chunk_rows))
        n = 0
        for batch in _key_lists(kf, chunk_rows):
            d = np.frombuffer(b"".join(hashlib.blake2b(k, digest_size=16).digest()
                                       for k in batch), dtype=np.uint8).reshape(-1, 16)
            digests.add(d, np.arange(n, n + len(batch), dtype=np.int64))
            n += len(batch)
        first = -1  # the first row whose key an earlier row holds
        for e, rows in digests:
            if len(e) < 2:
                continue
            keys = as_rows(e)
            order = np.argsort(keys, kind="stable")  # rows were added ascending
            same = keys[order][1:] == keys[order][:-1]
            if same.any():
                later = rows[order][1:][same]
                first = int(later.min()) if first < 0 else min(first, int(later.min()))
    finally:
        work.close()
    if first >= 0:
        seen = 0
        for batch in _key_lists(kf, chunk_rows):
            if first < seen + len(batch):
                raise DataError(f"{kf.path}: duplicate key at row {first} "
                                f"({batch[first - seen][:40]!r}...); set alignment needs "
                                "unique keys")
            seen += len(batch)
    return KeyBatches(n, lambda size: _key_lists(kf, size))


def warn_key_order(primary: PartyTable | KeyFile, secondary: PartyTable | KeyFile) -> None:
    """Warn when the two sides name the same key columns in another order (a composite key
    ``last,first`` against ``first,last`` matches nothing, without an error)."""
    def keys(side: PartyTable | KeyFile) -> tuple[str, ...]:
        return side.on if isinstance(side, KeyFile) else side.schema.key

    text = column_order_warning(keys(primary), keys(secondary), what="key")
    if text is not None:
        log.warning("%s", text.replace("--secondary-on", "--secondary-on (or secondary_on)"))


def _check(method: str, reveal: str, protocol: str = "dh") -> None:
    if method not in METHODS:
        raise ConfigError(f"`method` must be one of {', '.join(METHODS)}, got {method!r}")
    check_reveal(reveal)
    check_protocol(protocol)
    if protocol != "dh":
        if method != "psi":
            raise ConfigError(f"`protocol` = {protocol!r} is a PSI protocol: the union (psu) "
                              "runs on vflink's own DH protocol only")
        if reveal not in ENGINE_REVEALS:
            raise ConfigError(f"`reveal` = {reveal!r} is not offered by the {protocol} engine "
                              f"(it offers {', '.join(ENGINE_REVEALS)}); the DH PSI "
                              "(protocol \"dh\") reveals only the size with cardinality")
        require_engine(protocol)


def run_set_alignment(keys: Sequence[bytes] | KeyBatches, channel: Channel, peer: str, *,
                      method: str, group: str, reveal: str = "both", session: str | None = None,
                      workers: int | None = None, progress: StepProgress | None = None,
                      compute: Compute | None = None, chunk_rows: int | None = None,
                      out: Path | None = None, protocol: str = "dh",
                      engine: EngineSettings | None = None, key_columns: int = 1
                      ) -> tuple[SetAlignment, int]:
    """Drive PSU/PSI with ``peer`` over ``channel``; (own output, own group operations).
    With ``compute``, the group operations run in buckets on that engine.
    ``chunk_rows``: elements per message (default: ``compute``'s, else 100,000); ``out``:
    stream the own output to that Parquet file instead of holding it. ``protocol``
    ``rr22``/``kkrt``: PSI through the engine on this party's link ``engine``, on keys joined
    from ``key_columns`` columns."""
    _check(method, reveal, protocol)
    g = get_group(group, workers=workers, compute=compute)
    driver = SetAlignmentDriver(keys, channel, g, progress=progress, chunk_rows=chunk_rows,
                                out=out)
    # a finished session is immutable: every run opens a new one
    name = session or new_session_name(method)
    if protocol != "dh":
        if engine is None:
            raise ConfigError(f"protocol {protocol!r} needs this party's engine link "
                              "(a [psi] section with `listen` in its party file)")
        return drive_engine_psi(driver, peer, name, protocol=protocol, reveal=reveal,
                                settings=engine, key_columns=key_columns), 0
    mine = driver.psu(peer, name) if method == "psu" else driver.psi(peer, name, reveal=reveal)
    return mine, g.operations


def _chunk(chunk_rows: int | None, compute: Compute | None) -> int:
    from vflink.engine.base import DEFAULT_CHUNK_ROWS

    if chunk_rows is not None:
        return int(chunk_rows)
    return int(compute.chunk_rows) if compute is not None else DEFAULT_CHUNK_ROWS


def _own_keys(source: PartyTable | KeyFile, chunk_rows: int) -> Sequence[bytes] | KeyBatches:
    if isinstance(source, KeyFile):
        return file_key_batches(source, chunk_rows=chunk_rows)
    return key_bytes(source.frame, source.schema.key, who=source.source)


def align_in_process(primary: PartyTable | KeyFile, secondary: PartyTable | KeyFile, *,
                     method: str, group: str = "ristretto255", reveal: str = "both",
                     workers: int | None = None, progress: StepProgress | None = None,
                     transcript: Transcript | None = None, compute: Compute | None = None,
                     chunk_rows: int | None = None, out: Path | None = None,
                     protocol: str = "dh") -> AlignOutcome:
    """Both parties in this process, talking through an in-process channel (both on
    ``compute``, this process's engine, when given).

    A :class:`KeyFile` is read in batches of ``chunk_rows`` (default: ``compute``'s,
    else 100,000; also the protocol's elements per message), and with ``out`` (a directory)
    both outputs are streamed to ``out/primary.parquet`` and ``out/secondary.parquet``
    instead of held: with both, this process's memory does not grow with the tables.

    ``protocol`` ``rr22``/``kkrt``: PSI through the engine, each party's link on loopback
    (a free port each, no TLS: both parties are this process)."""
    _check(method, reveal, protocol)
    warn_key_order(primary, secondary)
    for table in (primary, secondary):  # named here, where both tables are at hand
        if isinstance(table, PartyTable):
            check_keys_present(table.frame, table.schema.key, who=table.source)
    chunk = _chunk(chunk_rows, compute)
    keys = _own_keys(primary, chunk)
    counter = TrafficCounter()
    hub = InProcessHub(transcript=transcript, counter=counter)
    table = secondary.empty_table() if isinstance(secondary, KeyFile) else secondary
    peer = SecondaryParty(table, hub.channel(secondary.name))
    peer.compute = compute
    peer.set_chunk_rows = chunk
    peer.psi_engine = EngineSettings()  # loopback, a free port per run
    if isinstance(secondary, KeyFile):
        peer.set_keys = file_key_batches(secondary, chunk_rows=chunk)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        peer.set_out = lambda session: out / "secondary.parquet"
    hub.register(secondary.name, peer)
    start = time.perf_counter()
    mine, ops = run_set_alignment(keys, hub.channel(primary.name), secondary.name,
                                  method=method, group=group, reveal=reveal, workers=workers,
                                  progress=progress, compute=compute, chunk_rows=chunk,
                                  out=None if out is None else out / "primary.parquet",
                                  protocol=protocol, engine=EngineSettings(),
                                  key_columns=_key_columns(primary))
    seconds = time.perf_counter() - start
    theirs = peer.set_alignment(mine.session)
    return AlignOutcome(method, _group_name(group, protocol), mine, theirs, seconds,
                        TrafficCounter.delta(counter.snapshot(), {}), ops, reveal,
                        protocol=protocol)


def _key_columns(source: PartyTable | KeyFile) -> int:
    return len(source.on) if isinstance(source, KeyFile) else len(source.schema.key)


def _group_name(group: str, protocol: str) -> str:
    """What the summary names as the run's group: the DH group, or the engine's protocol."""
    return group if protocol == "dh" else protocol


def align_over_network(primary: PartyTable | KeyFile, config: PartyConfig, peer: str, *,
                       method: str, group: str = "ristretto255", reveal: str = "both",
                       workers: int | None = None, progress: StepProgress | None = None,
                       transcript: Transcript | None = None, compute: Compute | None = None,
                       chunk_rows: int | None = None, out: Path | None = None,
                       protocol: str = "dh") -> AlignOutcome:
    """The secondary ``peer`` is served elsewhere (``vflink serve``); we are the primary of
    ``config``. The secondary writes its own output into its state directory.

    ``chunk_rows`` (default: ``config``'s ``[compute] chunk_rows``) and ``out`` (a directory:
    the own output streamed to ``out/primary.parquet``) as for :func:`align_in_process`.
    ``protocol`` ``rr22``/``kkrt``: PSI through the engine on the link of ``config``'s
    ``[psi]`` section, mutual TLS from its certificates unless ``security.insecure``."""
    from vflink.runner.network import engine_settings
    from vflink.transport.grpc import GrpcChannel, TlsConfig

    _check(method, reveal, protocol)
    engine = None
    if protocol != "dh":
        config.policy.check_psi_protocol(config.name, protocol)  # our own policy too
        engine = engine_settings(config)
        if engine is None:
            raise ConfigError(f"{config.source}: protocol {protocol!r} runs the PSI engine, "
                              "whose link this party's file configures: add a [psi] section "
                              "with `listen = \"host:port\"` (a port of this host the peer "
                              "can reach)")
    if peer not in config.addresses:
        raise ConfigError(f"{config.source}: no peer {peer!r} (peers: "
                          f"{', '.join(config.addresses)})")
    tls = None
    if not config.insecure:
        if config.tls_dir is None:
            raise ConfigError("security.tls_dir is required unless security.insecure = true")
        tls = TlsConfig.for_party(config.tls_dir, config.name)
    counter = TrafficCounter()
    channel = GrpcChannel(config.name, config.addresses, tls, insecure=config.insecure,
                          deadline_s=config.deadline_s, counter=counter, transcript=transcript)
    chunk = int(chunk_rows) if chunk_rows is not None else int(config.compute.chunk_rows)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    try:
        keys = _own_keys(primary, chunk)
        mine, ops = run_set_alignment(keys, channel, peer, method=method, group=group,
                                      reveal=reveal, workers=workers, progress=progress,
                                      compute=compute, chunk_rows=chunk,
                                      out=None if out is None else out / "primary.parquet",
                                      protocol=protocol, engine=engine,
                                      key_columns=_key_columns(primary))
    finally:
        channel.close()
    return AlignOutcome(method, _group_name(group, protocol), mine, None,
                        time.perf_counter() - start,
                        TrafficCounter.delta(counter.snapshot(), {}), ops, reveal,
                        protocol=protocol)


@dataclass(frozen=True)
class ExactOutcome:
    """Exact alignment on keyed hashes (HMAC-SHA256) matched by a coordinator: the primary's
    :class:`~vflink.Alignment` (one secondary row per primary row, ``MISSING`` when none)."""

    alignment: Alignment
    seconds: float
    communication: dict[str, dict[str, int]]
    secret_source: str

    def summary(self) -> dict[str, Any]:
        matched = int((self.alignment.secondary_index[:, 0] >= 0).sum())
        return {"method": "exact", "sizes": {"primary": len(self.alignment.secondary_index),
                                             "matched": matched},
                "seconds": round(self.seconds, 3),
                "bytes": {k: v["bytes"] for k, v in self.communication.items()},
                "messages": {k: v["messages"] for k, v in self.communication.items()},
                **encoding_summary("hmac-sha256", self.secret_source)}


def align_exact_in_process(primary: PartyTable, secondary: PartyTable, *,
                           seed: int | None = None, secret: bytes | None = None,
                           secret_env: str = "VFLINK_SECRET",
                           transcript: Transcript | None = None) -> ExactOutcome:
    """Exact alignment as a run's ``alignment.method = "exact"`` does it, every party in this
    process: each data party hashes its key columns with HMAC under the shared secret (from
    ``$secret_env``, else derived from ``seed``, else random) and the coordinator matches the
    digests, which it cannot invert. Both tables' ``schema.key`` name the key columns."""
    start = time.perf_counter()
    warn_key_order(primary, secondary)
    for table in (primary, secondary):  # named here, where both tables are at hand
        check_keys_present(table.frame, table.schema.key, who=table.source)
    source = "given"
    if secret is None:
        secret, source = secret_with_source(secret_env, seed=seed)
    counter = TrafficCounter()
    hub = InProcessHub(transcript=transcript, counter=counter)
    roles = local_roles(primary.name, [secondary.name])
    policy = PartyPolicy.permissive()  # both tables are this user's
    coordinator = CoordinatorParty(COORDINATOR, seed=seed, roles=roles, policy=policy)
    hub.register(COORDINATOR, coordinator)
    peer = LinkingPeer(secondary, hub.channel(secondary.name), secret=secret, roles=roles,
                       policy=policy)
    hub.register(secondary.name, peer)
    initiator = AlignmentInitiator(primary.name, primary.frame, hub.channel(primary.name),
                                   secondaries=(secondary.name,), key=primary.schema.key,
                                   secret=secret, source=primary.source, policy=policy)
    alignment = initiator.align_exact(COORDINATOR, session=new_session_name("exact"))
    return ExactOutcome(alignment[secondary.name], time.perf_counter() - start,
                        TrafficCounter.delta(counter.snapshot(), {}), source)


def write_outcome(outcome: AlignOutcome, out: Path, *, wall_s: float | None = None
                  ) -> dict[str, Any]:
    """``out/primary.parquet``, ``out/secondary.parquet`` (when held here), ``summary.json``
    (an output already streamed to its file is left as it is); ``wall_s``: the command's own
    time, against which an engine run's time is shared out."""
    out.mkdir(parents=True, exist_ok=True)
    for name, result in (("primary", outcome.primary), ("secondary", outcome.secondary)):
        if result is None or result.path is not None:
            continue
        # a party that learns only the size writes an empty table
        write_set_alignment(result, out / f"{name}.parquet")
    summary = outcome.summary(wall_s)
    if wall_s is not None:  # the command's own time: engine start, key passes, outputs
        summary["command_seconds"] = round(wall_s, 3)
    write_json(out / "summary.json", summary)
    return summary
