"""Parties on separate hosts: serving a secondary or the coordinator, and the primary's
federation of remote peers over gRPC with mutual TLS."""

from __future__ import annotations

import logging
import re
import signal
import threading
from collections.abc import Callable
from types import FrameType

from vflink.errors import ConfigError
from vflink.parties import CoordinatorParty, SecondaryParty
from vflink.parties.recording import Recorder
from vflink.privacy.budget import BUDGET_DIR, BudgetLock
from vflink.protocol import MessageHandler
from vflink.protocol.sessions import new_session_name
from vflink.runfiles.party import PartyConfig, party_table
from vflink.runner.compute import open_compute
from vflink.runner.federation import Federation, shared_secret
from vflink.transport import TrafficCounter, Transcript
from vflink.transport.grpc import GrpcChannel, GrpcServer, TlsConfig
from vflink.types import Compute

__all__ = ["network_federation", "serve"]

log = logging.getLogger(__name__)


def _tls(config: PartyConfig) -> TlsConfig | None:
    if config.insecure:
        return None
    if config.tls_dir is None:
        raise ConfigError("security.tls_dir is required unless security.insecure = true")
    return TlsConfig.for_party(config.tls_dir, config.name)


def _channel(config: PartyConfig, *, counter: TrafficCounter | None = None,
             transcript: Transcript | None = None) -> GrpcChannel:
    return GrpcChannel(config.name, config.addresses, _tls(config), insecure=config.insecure,
                       deadline_s=config.deadline_s, counter=counter, transcript=transcript)


def run_label(run_id: str) -> str:
    """``run_id`` (a run directory's name) as a name a secondary accepts in a state name and a
    run id (:mod:`vflink.protocol.names`): other characters become ``-``."""
    label = re.sub(r"[^A-Za-z0-9._-]", "-", run_id)[:100].lstrip("._-")
    return label or "run"


def network_federation(config: PartyConfig, *, run_id: str,
                       transcript: Transcript | None = None) -> Federation:
    """The primary's federation: its peers served elsewhere, reached over gRPC.

    The secondaries write this run's states as ``<run_id>/...`` in the primary's own folder
    of theirs, and keep its model apart from any other run's under a fresh ``run@<random>``
    (two runs of the same name, even at once, never share one)."""
    if config.role != "primary":
        raise ConfigError(f"party file {config.source}: `vflink train --party` needs the "
                          f"primary's party file, got role {config.role!r}")
    coordinator = config.coordinator
    if coordinator is None:
        raise ConfigError(f"{config.source}: no coordinator among [peers]")
    counter = TrafficCounter()
    channel = _channel(config, counter=counter, transcript=transcript)
    label = run_label(run_id)
    return Federation(channel=channel, secondaries=config.secondaries, coordinator=coordinator,
                      counter=counter, secret=shared_secret(config.secret_env, required=True),
                      state_prefix=f"{label}/", run=new_session_name("run"),
                      closer=channel.close, policy=config.policy,
                      secret_source=f"${config.secret_env}", state_dir=config.state_dir)


def build_handler(config: PartyConfig, *, compute: Compute | None = None) -> MessageHandler:
    # This party's own policy and its knowledge of who is who come from its own party file,
    # never from a peer: a peer cannot loosen the policy it is checked against.
    party: CoordinatorParty | SecondaryParty
    if config.role == "coordinator":
        party = CoordinatorParty(config.name, seed=config.seed, roles=config.roles,
                                 policy=config.policy)
    elif config.role == "secondary":
        table = party_table(config)
        party = SecondaryParty(table, _channel(config),
                               secret=shared_secret(config.secret_env, required=True),
                               out_dir=config.state_dir,
                               recorder=Recorder() if config.record else None,
                               privacy=config.privacy, roles=config.roles,
                               policy=config.policy, resources=config.training)
    else:
        raise ConfigError(f"{config.source}: `vflink serve` runs a secondary or the "
                          "coordinator; the primary drives runs with `vflink train --party`")
    # the party's own compute engine runs its chunked stages; it is never named to a peer
    party.compute = compute
    if isinstance(party, SecondaryParty):  # its own batches in PSU/PSI
        party.set_chunk_rows = config.compute.chunk_rows
    log.info("%s: policy %s; roles %s", config.name, config.policy, config.roles)
    if isinstance(party, SecondaryParty):
        # the figure a deviating primary can test against our set (docs/security.md)
        log.info("%s: dictionary limit per peer: %s", config.name,
                 config.policy.describe_dictionary_limit())
    return party


def serve(config: PartyConfig, *, ready: threading.Event | None = None,
          stop: threading.Event | None = None,
          on_ready: Callable[[str], None] | None = None) -> None:
    """Serve this party until SIGINT/SIGTERM (or ``stop`` is set); ``on_ready(address)``."""
    if config.listen is None:
        raise ConfigError(f"{config.source}: `party.listen` is required to serve")
    # a secondary's release counts live in memory while it serves: its operator's reset is
    # refused until it stops (vflink.privacy.budget.BudgetLock)
    lock = BudgetLock(config.state_dir / BUDGET_DIR).acquire() \
        if config.role == "secondary" and config.state_dir is not None else None
    try:
        with open_compute(config.compute) as compute:
            _serve(config, build_handler(config, compute=compute), config.listen, ready=ready,
                   stop=stop, on_ready=on_ready)
    finally:
        if lock is not None:
            lock.release()


def _serve(config: PartyConfig, handler: MessageHandler, listen: str, *,
           ready: threading.Event | None, stop: threading.Event | None,
           on_ready: Callable[[str], None] | None) -> None:
    policy = config.policy
    # every limit per authenticated peer: its share of the calls, a minimum arrival rate
    server = GrpcServer(config.name, handler, listen, _tls(config),
                        allowed_peers=set(config.allowed), insecure=config.insecure,
                        max_workers=policy.max_concurrent_calls,
                        peer_calls=policy.max_calls_per_peer or None,
                        receive_timeout_s=policy.receive_timeout_s,
                        min_receive_bytes_per_s=policy.min_receive_bytes_per_s)
    server.start()
    log.info("%s (%s) serving on %s; allowed peers: %s", config.name, config.role,
             server.address, ", ".join(config.allowed) or "none")
    if on_ready is not None:
        on_ready(server.address)
    stop = stop or threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
    if ready is not None:
        ready.set()
    try:
        stop.wait()
    finally:
        server.stop(grace=1.0)
        log.info("%s stopped", config.name)
