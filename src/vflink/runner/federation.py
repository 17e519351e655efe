"""Where the parties live, as the primary sees them: a channel, peer names, accounting.

``in_process`` builds the coordinator and the secondaries in this process behind an in-process
hub; the network variant (``vflink.runner.network``) connects to parties served elsewhere. The
training and linkage code above is the same for both.
"""

from __future__ import annotations

import logging
import os
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vflink.errors import ConfigError
from vflink.linkage import SearchOptions
from vflink.parties import CoordinatorParty, SecondaryParty
from vflink.protocol import Channel
from vflink.runner.config import RunConfig
from vflink.runner.inputs import Inputs
from vflink.transport import InProcessHub, TrafficCounter, Transcript

__all__ = ["COORDINATOR", "Federation", "in_process", "shared_secret"]

log = logging.getLogger(__name__)

COORDINATOR = "coordinator"


def shared_secret(env: str, *, required: bool = False) -> bytes:
    """The data parties' HMAC/Bloom secret from ``$env``.

    In-process, every data party lives here, so when ``$env`` is unset a fresh random secret is
    as good as a shared one (the coordinator never receives it). Across hosts it is required.
    """
    value = os.environ.get(env)
    if value:
        if len(value.encode()) < 16:
            raise ConfigError(f"the secret in ${env} must be at least 16 bytes")
        return value.encode()
    if required:
        raise ConfigError(f"set ${env} to the secret the data parties share (≥ 16 bytes)")
    log.info("$%s is not set: using a random alignment secret for this in-process run", env)
    return secrets.token_bytes(32)


@dataclass
class Federation:
    """The primary's connection to the other parties.

    Attributes:
        channel: the primary's channel (its name is the primary's party name).
        secondaries: secondary party names, in a fixed order.
        coordinator: the coordinator's party name.
        counter: messages and payload bytes per direction, shared by the whole run.
        secret: the data parties' shared secret (the primary is a data party).
        state_prefix: prefix of state file names the secondaries write (a run id across hosts).
    """

    channel: Channel
    secondaries: tuple[str, ...]
    coordinator: str
    counter: TrafficCounter
    secret: bytes
    state_prefix: str = ""
    closer: Callable[[], None] = field(default=lambda: None)
    #: the party objects living in this process, by name (in-process federations only)
    parties: dict[str, Any] = field(default_factory=dict)

    def close(self) -> None:
        self.closer()


def in_process(inputs: Inputs, config: RunConfig, *, transcript: Transcript | None = None,
               state_root: Path | None = None) -> Federation:
    """Coordinator and secondaries in this process; ``state_root/<party>`` holds their states."""
    secret = shared_secret(config.alignment.secret_env)
    counter = TrafficCounter()
    hub = InProcessHub(transcript=transcript, counter=counter)
    search = SearchOptions(mode=config.alignment.search)  # type: ignore[arg-type]
    parties: dict[str, Any] = {
        COORDINATOR: CoordinatorParty(COORDINATOR, seed=config.seed, search=search)}
    for table in inputs.secondaries:
        parties[table.name] = SecondaryParty(
            table, hub.channel(table.name), secret=secret,
            out_dir=None if state_root is None else state_root / table.name)
    for name, party in parties.items():
        hub.register(name, party)
    return Federation(channel=hub.channel(inputs.primary.name),
                      secondaries=tuple(t.name for t in inputs.secondaries),
                      coordinator=COORDINATOR, counter=counter, secret=secret, parties=parties)
