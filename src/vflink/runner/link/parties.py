"""The parties of a link held in memory, all in this process: the primary (who asks), the
secondary and the coordinator, talking through an in-process hub, so that only what the
protocol allows crosses between them (ARCHITECTURE.md, boundary table).

The encode stage builds them and has each data party send its encodings; the decide stage
sends the primary's one request (what the candidates, compare, model and decide stages chose)
and reads the coordinator's linkage and the seconds of its own steps.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vflink.data.schema import PartySchema
from vflink.data.table import PartyTable
from vflink.linkage import SearchOptions, SoftLinkage
from vflink.linkage.fields import Blocking
from vflink.parties.coordinator import CoordinatorParty
from vflink.parties.link_peer import LinkingPeer
from vflink.parties.linking import AlignmentInitiator
from vflink.parties.policy import PartyPolicy
from vflink.protocol import EncodingSpec, FieldEncoding
from vflink.runner.local import COORDINATOR, local_roles
from vflink.transport import InProcessHub, Transcript
from vflink.types import Alignment, Compute

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa

__all__ = ["SESSION", "LocalParties"]

#: The coordination session of ``vflink link``
SESSION = "link"


def _unique(columns: Sequence[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(columns))


@dataclass
class LocalParties:
    """The hub, the coordinator, the secondary party and the primary's initiator of a link."""

    hub: InProcessHub
    coordinator: CoordinatorParty
    secondary: LinkingPeer
    initiator: AlignmentInitiator

    @classmethod
    def build(cls, primary: tuple[pd.DataFrame | pa.Table, str, Sequence[str]],
              secondary: tuple[pd.DataFrame | pa.Table, str, Sequence[str]], *,
              secret: bytes | None, private: bool, seed: int | None,
              search: SearchOptions | None = None,
              compute: Compute | None = None, transcript: Transcript | None = None
              ) -> LocalParties:
        """The parties of ``primary`` and ``secondary`` (each: frame, source, the columns it
        releases for linkage). Both tables are this user's: the settings are the explicit
        release choice (``private``: only keyed Bloom filters), and any K up to the
        secondary's rows (checked before any work) is theirs to ask."""
        hub = InProcessHub(transcript=transcript)
        policy = PartyPolicy.permissive(identifiers="bloom" if private else "any")
        policy = dataclasses.replace(policy, max_top_k=max(policy.max_top_k, len(secondary[0])))
        roles = local_roles("primary", ["secondary"])
        coordinator = CoordinatorParty(COORDINATOR, seed=seed, search=search, roles=roles,
                                       policy=policy)
        coordinator.compute = compute
        hub.register(COORDINATOR, coordinator)
        frame, source, columns = secondary
        schema = PartySchema(name="secondary", role="secondary", identifiers=_unique(columns))
        peer = LinkingPeer(PartyTable(schema, frame, source), hub.channel("secondary"),
                           secret=secret, roles=roles, policy=policy)
        peer.compute = compute
        hub.register("secondary", peer)
        frame, source, columns = primary
        initiator = AlignmentInitiator("primary", frame, hub.channel("primary"),
                                       secondaries=("secondary",), identifiers=_unique(columns),
                                       secret=secret, source=source, policy=policy)
        initiator.compute = compute
        return cls(hub, coordinator, peer, initiator)

    def send_identifiers(self, spec: EncodingSpec) -> None:
        """Each data party encodes its identifiers and sends them to the coordinator."""
        self.initiator.send_identifiers(COORDINATOR, spec, session=SESSION)

    def send_fields(self, own: Sequence[FieldEncoding], theirs: Sequence[FieldEncoding], *,
                    blocking: Sequence[Blocking], exact: bool,
                    key_kinds: Sequence[Sequence[str]] = ()) -> None:
        """Each data party encodes its fields (and blocking keys, each column normalised as
        ``key_kinds`` say, and exact-agreement hashes)."""
        self.initiator.send_fields(COORDINATOR, own, theirs, blocking=blocking, exact=exact,
                                   session=SESSION, key_kinds=key_kinds)

    def request(self, request: dict[str, Any]) -> Alignment:
        """The primary's request (a multi-field one when it names ``fields``): the
        coordinator links the encodings it holds; the primary's alignment comes back."""
        request = dict(request)
        fields = request.pop("fields", None)
        if fields is None:
            views = self.initiator.request_soft_link(COORDINATOR, session=SESSION, **request)
        else:
            views = self.initiator.request_field_link(COORDINATOR, fields, session=SESSION,
                                                      **request)
        return views["secondary"]

    def linkage(self) -> SoftLinkage:
        """The coordinator's linkage (raw distances and exact weights: coordinator-side)."""
        return self.coordinator.linkage(SESSION, "secondary")

    def seconds(self) -> dict[str, float]:
        """The seconds of the coordinator's own steps (candidates, model, decide)."""
        return self.coordinator.seconds(SESSION)

    def communication(self) -> dict[str, dict[str, int]]:
        return self.hub.counter.snapshot()

    def close(self) -> None:
        """The link is over: the hub forgets its parties (:meth:`InProcessHub.close`), so
        what only they hold goes as soon as the link's result is dropped."""
        self.hub.close()
