"""The secondary's side of alignment: key confirmation, keyed digests, identifier encodings and
the alignment view (FedSim §4.1 steps 1-2 from the data party's side).

:class:`LinkingPeer` is a complete party for linkage alone (``vflink link`` builds one per
secondary table) and the base of :class:`~vflink.parties.SecondaryParty`, which adds training.
It imports neither torch nor scikit-learn, so a link does not pay for them.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from vflink._threads import in_pieces, pass_threads
from vflink.alignment.confirm import tag_matches
from vflink.alignment.exact import key_digests
from vflink.data.table import PartyTable
from vflink.errors import PolicyViolation, ProtocolError
from vflink.linkage.fields import KEY_KINDS
from vflink.parties.base import Party
from vflink.parties.linking import (
    blocking_digests,
    encode_fields,
    encode_identifiers,
    exact_digests,
    field_raw_values,
    secret_mismatch,
    send_key_tag,
    undeclared_columns,
    uses_secret,
)
from vflink.parties.policy import PartyPolicy, check_coordinator
from vflink.protocol.boundary import refuse
from vflink.protocol.channel import Channel
from vflink.protocol.messages import (
    Ack,
    AlignmentReady,
    AlignmentView,
    ConfirmKey,
    FetchAlignment,
    FetchKeyTags,
    FieldEncodings,
    IdentifierEncodings,
    KeyDigests,
    KeyTags,
    ShareEncodings,
    ShareFieldEncodings,
    ShareKeys,
)
from vflink.types import MISSING

if TYPE_CHECKING:
    from vflink.parties.recording import Recorder

__all__ = ["LinkingPeer"]

log = logging.getLogger(__name__)

#: Most fields, and most blocking keys, one field request may name: each field is one more
#: encoding of the whole table, and the work one request causes must stay bounded.
MAX_FIELDS = 32


def _check_field_request(party: str, policy: PartyPolicy, message: ShareFieldEncodings) -> None:
    """Refuse a field request that is malformed or asks for more work than the limits."""
    if len(message.fields) > MAX_FIELDS or len(message.blocking) > MAX_FIELDS:
        raise refuse(PolicyViolation, f"party {party!r} encodes at most {MAX_FIELDS} fields and "
                                      f"{MAX_FIELDS} blocking keys per request; this one names "
                                      f"{len(message.fields)} and {len(message.blocking)}",
                     code="limit.fields")
    for key in message.blocking:
        if isinstance(key.prefix, bool) or not isinstance(key.prefix, int) or key.prefix < 0:
            raise refuse(ProtocolError, f"a blocking key's `prefix` must be an int >= 0 (0: the "
                                        f"whole value), got {key.prefix!r}",
                         code="blocking.prefix")
        if key.kinds and (len(key.kinds) != 1 + len(key.columns)
                          or any(k not in KEY_KINDS for k in key.kinds)):
            raise refuse(ProtocolError, f"a blocking key's `kinds` name one of "
                                        f"{', '.join(KEY_KINDS)} per column",
                         code="blocking.kinds")
    for f in message.fields:
        policy.check_encoding(party, f.spec)


class LinkingPeer(Party):
    """A data party without labels, as far as alignment goes.

    Args:
        table: the party's own validated table.
        channel: how this party reaches the coordinator.
        secret: the HMAC secret shared by the data parties (not the coordinator).
        recorder: records what this party receives, for attacks (training runs).
    """

    role = "secondary"

    def __init__(self, table: PartyTable, channel: Channel, *, secret: bytes | None = None,
                 roles: Mapping[str, str] | None = None, policy: PartyPolicy | None = None,
                 recorder: Recorder | None = None) -> None:
        super().__init__(table.name, roles=roles, policy=policy)
        self.recorder = recorder
        self.table = table
        self.channel = channel
        self._secret = secret
        #: per primary, which of our rows the alignment completed with it linked: the only
        #: rows we compute anything for on its behalf (no session, no embeddings)
        self.served: dict[str, npt.NDArray[np.bool_]] = {}

    @property
    def linked_rows(self) -> npt.NDArray[np.bool_] | None:
        """The rows served to the only primary there is (None before any alignment)."""
        if len(self.served) != 1:
            return None
        return next(iter(self.served.values()))

    def local_alignment_rows(self, session: str, peer: str) -> npt.NDArray[np.int64] | None:
        """Rows of an alignment held here rather than at the coordinator (PSI sessions of
        :class:`~vflink.parties.setalign.SetAlignmentPeer` run with ``peer``); none for
        linkage alone."""
        return None

    def on_confirm_key(self, sender: str, message: ConfirmKey) -> Ack:
        """Send our key-confirmation tag and check the sender's, both through the coordinator.

        A mismatch is logged here and reported in the reply (the primary raises one error
        naming every party whose secret differs); this party then refuses to align.
        """
        check_coordinator(self.name, self.roles, message.coordinator)
        if self._secret is None:
            raise ProtocolError(f"party {self.name!r} has no alignment secret configured")
        session, nonce = message.session, message.nonce
        send_key_tag(self.channel, message.coordinator, self._secret, party=self.name,
                     session=session, nonce=nonce)
        reply = self.channel.request(message.coordinator, FetchKeyTags(
            session=session, nonce=nonce, parties=(sender,)), KeyTags)
        ok = (reply.parties == (sender,) and len(reply.tags) == 1
              and tag_matches(self._secret, reply.tags[0], session=session, nonce=nonce,
                              party=sender))
        # remembered in the alignment session itself: only its opener may use it
        self.session.data["confirmed"] = ok
        if not ok:
            log.error("%s", secret_mismatch(self.name, [sender]))
        return Ack(info={"confirmed": float(ok)})

    def _require_confirmed(self, session: str) -> None:
        if not self.session.data.get("confirmed"):
            raise refuse(ProtocolError, f"party {self.name!r}: no successful key confirmation "
                                        f"for session {session!r}; it aligns only with parties "
                                        "proven to share its secret", code="key-confirmation")

    def on_share_keys(self, sender: str, message: ShareKeys) -> Ack:
        check_coordinator(self.name, self.roles, message.coordinator)
        if self._secret is None:
            raise ProtocolError(f"party {self.name!r} has no alignment secret configured")
        self._require_confirmed(message.session)
        digests = key_digests(self.table.select(self.table.schema.key), self.table.schema.key,
                              self._secret)  # key columns only (read per batch if so)
        self.channel.request(message.coordinator, KeyDigests(session=message.session,
                                                             digests=digests), Ack)
        return Ack(info={"rows": float(len(digests))})

    def on_share_encodings(self, sender: str, message: ShareEncodings) -> Ack:
        # Our own policy decides what leaves, not the primary's spec.
        self.policy.check_identifier_release(self.name, message.spec.encoder)
        self.policy.check_encoding(self.name, message.spec)  # bounded work, before any
        check_coordinator(self.name, self.roles, message.coordinator)
        if uses_secret(message.spec):
            self._require_confirmed(message.session)
        # the identifier columns only (a table read in batches is never read whole)
        values = encode_identifiers(self.table.select(self.table.schema.identifiers),
                                    self.table.schema.identifiers,
                                    message.spec, self._secret, source=self.table.source,
                                    compute=self.compute)
        self.channel.request(message.coordinator, IdentifierEncodings(
            session=message.session, encoder=message.spec.encoder, values=values), Ack)
        return Ack(info={"rows": float(len(values))})

    def on_share_field_encodings(self, sender: str, message: ShareFieldEncodings) -> Ack:
        """Encode the requested fields of our own identifier columns and send them, with the
        blocking keys as keyed digests, to the coordinator."""
        # Our own policy decides what leaves, not the primary's request: the
        # release form of every field, and only columns our schema declares as identifiers.
        for f in message.fields:
            self.policy.check_identifier_release(self.name, f.spec.encoder)
        check_coordinator(self.name, self.roles, message.coordinator)
        if not message.fields:
            raise refuse(ProtocolError, "a field request names no field", code="fields.empty")
        _check_field_request(self.name, self.policy, message)  # bounded work, before any
        undeclared = undeclared_columns(self.table.schema.identifiers, message.fields,
                                        message.blocking)
        if undeclared:
            # The peer learns which of the columns it named are refused (its own request),
            # not which columns we do declare; our log has those too.
            raise refuse(PolicyViolation, f"party {self.name!r} links only on columns it "
                         f"declares as identifiers, and not on {undeclared}",
                         code="policy.identifier-columns",
                         detail=f"declared identifiers: {list(self.table.schema.identifiers)}"
                                f"; refused: {undeclared}")
        if message.blocking or message.exact or any(uses_secret(f.spec)
                                                    for f in message.fields):
            if self._secret is None:
                raise ProtocolError(f"party {self.name!r} has no alignment secret configured")
            self._require_confirmed(message.session)  # before any use of the secret
        ids = self.table.select(self.table.schema.identifiers)  # fields ⊆ identifiers: above
        raw = field_raw_values(ids, message.fields, source=self.table.source)  # read once
        encoders, values = encode_fields(ids, message.fields, self._secret,
                                         source=self.table.source, raw=raw)
        keys = blocking_digests(ids, message.blocking, self._secret, source=self.table.source)
        exact = (exact_digests(ids, message.fields, self._secret, source=self.table.source,
                               raw=raw) if message.exact else ())
        self.channel.request(message.coordinator, FieldEncodings(
            session=message.session, encoders=encoders, values=values, keys=keys, exact=exact),
            Ack)
        return Ack(info={"rows": float(len(self.table))})

    def on_alignment_ready(self, sender: str, message: AlignmentReady) -> Ack:
        local = self.local_alignment_rows(message.session, sender)  # a PSI session of ours
        if local is not None:
            self.set_linked_rows(local, peer=sender)
            return Ack(info={"linked_rows": float(len(local))})
        check_coordinator(self.name, self.roles, message.coordinator)
        view = self.channel.request(message.coordinator, FetchAlignment(session=message.session),
                                    AlignmentView)
        if view.primary and view.primary != sender:
            # the coordinator linked this session for another primary: its rows are not the
            # sender's to ask for (served rows are bound to the alignment's primary)
            raise refuse(PolicyViolation, f"party {self.name!r}: session "
                                          f"{message.session!r} was aligned with another party",
                         code="session.bound")
        self.set_linked_rows(view.secondary_index, peer=sender)
        if self.recorder is not None:
            self.recorder.whole("indices", message.coordinator, view.primary_index,
                                view.secondary_index)
        return Ack(info={"linked_rows": float(self.served[sender].sum())})

    def set_linked_rows(self, secondary_index: npt.NDArray[np.int64], *, peer: str) -> None:
        """Remember which of our rows are linked with ``peer`` (a primary); its requests for
        other rows are refused, and a primary without such an alignment gets nothing."""
        idx = np.asarray(secondary_index, dtype=np.int64).ravel()
        rows = len(self.table)
        # one pass where every link is present (in pieces, one thread per core): bincount
        # refuses a negative row and grows past ``rows`` for a row beyond the table (no
        # minimum, maximum and scatter apart)
        counts: npt.NDArray[np.intp] | None
        try:
            pieces = in_pieces(lambda r: np.bincount(idx[r], minlength=rows), idx.size,
                               pass_threads(idx.size))
        except ValueError:  # negative rows: the missing links (−1) dropped, any other refused
            idx = idx[idx != MISSING]
            pieces = [np.bincount(idx, minlength=rows)] if not (idx < 0).any() else []
        counts = (sum(pieces[1:], pieces[0]) if pieces and all(len(c) == rows for c in pieces)
                  else None)
        if counts is None:
            raise ProtocolError(f"party {self.name!r}: alignment refers to rows outside "
                                f"[0, {rows})")
        self.served[peer] = counts > 0
        self._note_links(counts, peer)

    def _note_links(self, counts: npt.NDArray[np.intp], peer: str) -> None:
        """Hook for what ``peer``'s links mean to a subclass (a secondary's privacy accountant
        counts every link of a row as one more release of its embedding to that peer):
        ``counts``, the links of each of our rows (a fresh array, the hook's to keep)."""

