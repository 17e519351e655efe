"""Run PSU or PSI between two parties, in one process or with the secondary served elsewhere,
and write each party's ``row``/``uid`` table and a summary (``vflink align``)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from vflink.alignment._dh import key_bytes
from vflink.alignment.groups import get_group
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
from vflink.parties.setalign import SetAlignment, SetAlignmentDriver, write_set_alignment
from vflink.protocol.channel import Channel
from vflink.protocol.sessions import new_session_name
from vflink.runfiles.party import PartyConfig
from vflink.runfiles.rundir import write_json
from vflink.runner.encoding import encoding_summary
from vflink.runner.local import COORDINATOR, local_roles, secret_with_source
from vflink.transport import InProcessHub, TrafficCounter, Transcript
from vflink.types import Alignment, Compute

__all__ = ["METHODS", "AlignOutcome", "ExactOutcome", "align_exact_in_process",
           "align_in_process", "align_over_network", "key_frame", "key_table", "run_set_alignment",
           "write_outcome"]

METHODS = ("psu", "psi")

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

    def summary(self) -> dict[str, Any]:
        sizes = dict(self.primary.sizes)
        if self.secondary is not None:
            sizes.update({k: v for k, v in self.secondary.sizes.items() if k not in sizes})
        return {"method": self.method, "group": self.group, "sizes": sizes,
                "seconds": round(self.seconds, 3), "bytes": {
                    k: v["bytes"] for k, v in self.communication.items()},
                "messages": {k: v["messages"] for k, v in self.communication.items()},
                "group_operations_here": self.operations}


def key_table(path: Path, on: Sequence[str], *, name: str, delimiter: str | None = None,
              encoding: str | None = None) -> PartyTable:
    """A party table holding only the key columns, read as text (``007`` stays ``007``).

    Parquet is scanned for the key columns alone, in record batches (a wide table's other
    columns are never loaded), each batch converted to text as it arrives."""
    if Path(path).suffix.lower() == ".parquet" or Path(path).is_dir():
        parts = [b.astype("string").fillna("") for b in iter_parquet_columns(Path(path), on)]
        frame = (pd.concat(parts, ignore_index=True) if parts
                 else pd.DataFrame({c: pd.Series(dtype="string") for c in on}))
    else:  # a CSV in record batches too (issue 22), the key columns alone, as text
        header = read_frame_header(Path(path), delimiter=delimiter, encoding=encoding)
        frame = (pd.concat([b.frame for b in scan_frame(
            path, columns=on, text_columns=on, delimiter=delimiter, encoding=encoding)],
            ignore_index=True) if set(on) <= set(header) else pd.DataFrame(columns=header))
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


def _check(method: str, reveal: str) -> None:
    if method not in METHODS:
        raise ConfigError(f"`method` must be one of {', '.join(METHODS)}, got {method!r}")
    check_reveal(reveal)


def run_set_alignment(keys: Sequence[bytes], channel: Channel, peer: str, *, method: str,
                      group: str, reveal: str = "both", session: str | None = None,
                      workers: int | None = None, progress: StepProgress | None = None,
                      compute: Compute | None = None) -> tuple[SetAlignment, int]:
    """Drive PSU/PSI with ``peer`` over ``channel``; (own output, own group operations).
    With ``compute``, the group operations run in buckets on that engine (issue 22)."""
    _check(method, reveal)
    g = get_group(group, workers=workers, compute=compute)
    driver = SetAlignmentDriver(keys, channel, g, progress=progress)
    # a finished session is immutable: every run opens a new one (issue 19)
    name = session or new_session_name(method)
    out = driver.psu(peer, name) if method == "psu" else driver.psi(peer, name, reveal=reveal)
    return out, g.operations


def align_in_process(primary: PartyTable, secondary: PartyTable, *, method: str,
                     group: str = "ristretto255", reveal: str = "both",
                     workers: int | None = None, progress: StepProgress | None = None,
                     transcript: Transcript | None = None, compute: Compute | None = None
                     ) -> AlignOutcome:
    """Both parties in this process, talking through an in-process channel (both on
    ``compute``, this process's engine, when given)."""
    _check(method, reveal)
    keys = key_bytes(primary.frame, primary.schema.key, who=primary.source)
    counter = TrafficCounter()
    hub = InProcessHub(transcript=transcript, counter=counter)
    peer = SecondaryParty(secondary, hub.channel(secondary.name))
    peer.compute = compute
    hub.register(secondary.name, peer)
    start = time.perf_counter()
    mine, ops = run_set_alignment(keys, hub.channel(primary.name), secondary.name,
                                  method=method, group=group, reveal=reveal, workers=workers,
                                  progress=progress, compute=compute)
    seconds = time.perf_counter() - start
    theirs = peer.set_alignment(mine.session)
    return AlignOutcome(method, group, mine, theirs, seconds,
                        TrafficCounter.delta(counter.snapshot(), {}), ops)


def align_over_network(primary: PartyTable, config: PartyConfig, peer: str, *, method: str,
                       group: str = "ristretto255", reveal: str = "both",
                       workers: int | None = None, progress: StepProgress | None = None,
                       transcript: Transcript | None = None, compute: Compute | None = None
                       ) -> AlignOutcome:
    """The secondary ``peer`` is served elsewhere (``vflink serve``); we are the primary of
    ``config``. The secondary writes its own output into its state directory."""
    from vflink.transport.grpc import GrpcChannel, TlsConfig

    _check(method, reveal)
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
    keys = key_bytes(primary.frame, primary.schema.key, who=primary.source)
    start = time.perf_counter()
    try:
        mine, ops = run_set_alignment(keys, channel, peer, method=method, group=group,
                                      reveal=reveal, workers=workers, progress=progress,
                                      compute=compute)
    finally:
        channel.close()
    return AlignOutcome(method, group, mine, None, time.perf_counter() - start,
                        TrafficCounter.delta(counter.snapshot(), {}), ops)


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


def write_outcome(outcome: AlignOutcome, out: Path) -> dict[str, Any]:
    """``out/primary.parquet``, ``out/secondary.parquet`` (when held here), ``summary.json``."""
    out.mkdir(parents=True, exist_ok=True)
    for name, result in (("primary", outcome.primary), ("secondary", outcome.secondary)):
        if result is None:
            continue
        # a party that learns only the size writes an empty table
        write_set_alignment(result, out / f"{name}.parquet")
    summary = outcome.summary()
    write_json(out / "summary.json", summary)
    return summary
