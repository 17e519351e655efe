"""Where the parties live, as the primary sees them: a channel, peer names, accounting.

``in_process`` builds the coordinator and the secondaries in this process behind an in-process
hub; the network variant (``vflink.runner.network``) connects to parties served elsewhere. The
training and linkage code above is the same for both.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from vflink.linkage import SearchOptions
from vflink.parties import CoordinatorParty, SecondaryParty
from vflink.parties.policy import PartyPolicy
from vflink.parties.recording import Recorder
from vflink.protocol import Channel
from vflink.protocol.sessions import new_session_name
from vflink.runfiles.config import RunConfig
from vflink.runfiles.inputs import Inputs
from vflink.runner.compute import current_compute
from vflink.runner.local import COORDINATOR, local_roles, secret_with_source, shared_secret
from vflink.runner.protections import coordinator_seed
from vflink.transport import InProcessHub, TrafficCounter, Transcript

__all__ = ["COORDINATOR", "Federation", "coordinator_seed", "in_process", "local_roles",
           "noise_seed",
           "recorder_for", "run_policy", "secret_with_source", "shared_secret"]

log = logging.getLogger(__name__)


def recorder_for(config: RunConfig) -> Recorder | None:
    """A recorder for one party when the run records (``[evaluation] record = true``)."""
    ev = config.evaluation
    return Recorder(max_rows=ev.record_rows) if ev.record else None


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
        run: the run's id in every training message (a served secondary keeps each run of
            each primary apart): ``run@<random>``, a fresh one per run.
        policy: the primary's own policy (what it releases, what it accepts).
        secret_source: where the secret came from (for the run's summary; never the secret).
        state_dir: the primary's own state directory across runs (label release counts).
    """

    channel: Channel
    secondaries: tuple[str, ...]
    coordinator: str
    counter: TrafficCounter
    secret: bytes
    state_prefix: str = ""
    run: str = ""
    closer: Callable[[], None] = field(default=lambda: None)
    policy: PartyPolicy = field(default_factory=PartyPolicy)
    secret_source: str = ""
    #: the party objects living in this process, by name (in-process federations only)
    parties: dict[str, Any] = field(default_factory=dict)
    #: the primary's own state directory across runs (its party file's ``state_dir``), where
    #: it keeps the release counts of its labels; ``None``: the run's directory
    state_dir: Path | None = None

    def close(self) -> None:
        self.closer()


def run_policy(config: RunConfig) -> PartyPolicy:
    """The policy of the parties a run builds in this process.

    A run file's ``[policy]`` section applies as written (keys left out take the private
    defaults). Without one, the file's author owns every party and its ``[alignment]`` is the
    explicit choice: ``privacy = "off"`` lets raw identifiers reach the in-process coordinator,
    and the noise is what ``tau``/``sigma`` ask for. Across hosts each party's own party file
    decides instead (``vflink.runfiles.party``).
    """
    if config.policy is not None:
        return config.policy
    return PartyPolicy.permissive(
        identifiers="any" if config.alignment.privacy == "off" else "bloom")


def noise_seed(config: RunConfig, j: int) -> int | None:
    """Secondary ``j``'s embedding-noise seed, only with ``[privacy] reproducible_noise`` (not
    private): from ``privacy.seed`` or the run seed, one stream per secondary. ``None``
    otherwise: each secondary's noise is secret (:mod:`vflink.randomness`)."""
    if not config.privacy.reproducible_noise:
        return None
    base = config.privacy.seed if config.privacy.seed is not None else config.seed
    return int(np.random.SeedSequence([base, 0xAFE, j]).generate_state(1, np.uint64)[0] >> 1)


def in_process(inputs: Inputs, config: RunConfig, *, transcript: Transcript | None = None,
               state_root: Path | None = None) -> Federation:
    """Coordinator and secondaries in this process; ``state_root/<party>`` holds their states."""
    secret, source = secret_with_source(config.alignment.secret_env, seed=config.seed)
    counter = TrafficCounter()
    hub = InProcessHub(transcript=transcript, counter=counter)
    search = SearchOptions(mode=config.alignment.search)  # type: ignore[arg-type]
    policy = run_policy(config)
    roles = local_roles(inputs.primary.name, [t.name for t in inputs.secondaries])
    coordinator = CoordinatorParty(COORDINATOR, seed=coordinator_seed(config), search=search,
                                   roles=roles, policy=policy)
    # one process plays every party: they share its engine (the run's [compute])
    compute = coordinator.compute = current_compute()
    hub.register(COORDINATOR, coordinator)
    parties: dict[str, Any] = {COORDINATOR: coordinator}
    for j, table in enumerate(inputs.secondaries):
        party = SecondaryParty(table, hub.channel(table.name), secret=secret,
                               out_dir=None if state_root is None else state_root / table.name,
                               recorder=recorder_for(config),
                               privacy=config.privacy, privacy_seed=noise_seed(config, j),
                               roles=roles, policy=policy,
                               resources=config.training.resources(),
                               peer_dirs=False)  # one run of one primary: its run directory
        party.compute = compute
        hub.register(table.name, party)
        parties[table.name] = party
    # a run id as across hosts (the secondaries here serve this run alone): the same messages
    # of the same size over both transports
    return Federation(channel=hub.channel(inputs.primary.name),
                      secondaries=tuple(t.name for t in inputs.secondaries),
                      coordinator=COORDINATOR, counter=counter, secret=secret, policy=policy,
                      secret_source=source, parties=parties, run=new_session_name("run"))
