"""Every message that may cross the party boundary, as frozen dataclasses.

What may cross is a contract (ARCHITECTURE.md, "The party boundary is real"): during training
only cut-layer embeddings (secondary → primary) and their gradients (primary → secondary); during
alignment only keyed hashes or encodings (data party → coordinator) and alignment indices
(coordinator → parties; similarities to the primary only). Raw features, raw identifiers and
labels have no field to travel in. Wire conversion lives only in the transport's serde module.

Array fields hold ``numpy`` arrays (indices, digests) or ``torch`` tensors (embeddings and
gradients). The in-process transport passes them by reference.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import numpy.typing as npt

from vflink.models.spec import BottomSpec

if TYPE_CHECKING:
    import torch

__all__ = [
    "MESSAGE_TYPES",
    "PAYLOAD_TYPES",
    "PROTOCOL_VERSION",
    "Ack",
    "AlignmentReady",
    "AlignmentView",
    "AlignmentViews",
    "Backward",
    "BlockingKey",
    "ConfirmKey",
    "Embeddings",
    "EncodingSpec",
    "EnginePsiOpen",
    "EnginePsiReady",
    "EnginePsiResult",
    "EnginePsiStatus",
    "FetchAlignment",
    "FetchKeyTags",
    "FetchPrivacyReport",
    "FieldComparison",
    "FieldEncoding",
    "FieldEncodings",
    "FieldLink",
    "FitPreprocessing",
    "Forward",
    "Health",
    "Hello",
    "IdentifierEncodings",
    "KeyDigests",
    "KeyTag",
    "KeyTags",
    "LoadState",
    "MatchKeys",
    "Message",
    "PrivacyReport",
    "MAX_CHUNK_ROWS",
    "PsiChunk",
    "PsiFetch",
    "PsiRound1",
    "PsuChunk",
    "PsuFetch",
    "PsuRound1",
    "SetChunk",
    "SetProgress",
    "Restore",
    "SaveState",
    "SetupBottom",
    "SetupPrivacy",
    "ShareEncodings",
    "ShareFieldEncodings",
    "ShareKeys",
    "Snapshot",
    "SoftLink",
    "UnionForward",
    "UnionSetup",
    "payload_nbytes",
]

#: Bumped whenever a message changes shape; peers refuse a different major version.
#: 2: sessions, AlignmentView.primary; 3: chunked PSU/PSI; 4: PSU's line 11 raises the round-1
#: list, PSI's p_ts carries a proof, round 1 answers the chunk size; 5: training messages name
#: the primary's run, SetProgress keeps a set session alive while its driver computes
PROTOCOL_VERSION = 5


@dataclass(frozen=True, eq=False, repr=False)
class Message:
    """Base class of all protocol messages: frozen dataclasses whose ``==``, ``hash`` and
    ``repr`` are this class's, which compute what the dataclass's own would (the fields in
    order). The dataclass decorator compiles each method it makes from source; three fewer
    for each of the 51 messages made this module's import take 18 ms instead of 24 ms
    (measured), which every ``vflink link`` pays before its first stage."""

    kind: ClassVar[str] = "message"

    def _fields(self) -> tuple[str, ...]:
        cls: type = type(self)
        return _field_names(cls)

    def _values(self) -> tuple[Any, ...]:
        return tuple(getattr(self, name) for name in self._fields())

    def __eq__(self, other: object) -> bool:
        if other.__class__ is self.__class__:
            return self._values() == other._values()  # type: ignore[attr-defined]
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._values())

    def __repr__(self) -> str:
        shown = ", ".join(f"{name}={value!r}" for name, value
                          in zip(self._fields(), self._values(), strict=True))
        return f"{type(self).__qualname__}({shown})"


# --- lifecycle --------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False, repr=False)
class Hello(Message):
    """Opening handshake; the reply is a Hello from the peer."""

    kind: ClassVar[str] = "hello"
    party: str
    role: str
    version: int = PROTOCOL_VERSION


@dataclass(frozen=True, eq=False, repr=False)
class Health(Message):
    """Any allowed peer → a party: are you alive? The reply is an :class:`Ack` whose ``info``
    holds ``busy`` (1.0 while its handler works on a call), ``active`` (calls holding a slot:
    being received, worked on or waiting for the handler) and ``slots`` (calls it takes at
    once). A served party answers it at once, beside any long call, without touching party
    state."""

    kind: ClassVar[str] = "health"


@dataclass(frozen=True, eq=False, repr=False)
class Ack(Message):
    """Generic acknowledgement; ``info`` carries small public numbers (e.g. a feature count)."""

    kind: ClassVar[str] = "ack"
    info: dict[str, float] = field(default_factory=dict)


# --- key confirmation before any alignment (vflink.alignment.confirm) -------------------------


@dataclass(frozen=True, eq=False, repr=False)
class ConfirmKey(Message):
    """Primary → secondary: prove through ``coordinator`` that you hold the data parties'
    shared secret, before alignment ``session``.

    The reply is an :class:`Ack` whose ``info["confirmed"]`` is 1.0 when the primary's tag
    checked out. ``nonce`` is fresh per confirmation and travels directly, not through the
    coordinator, so the coordinator cannot replay tags of an earlier run.
    """

    kind: ClassVar[str] = "confirm_key"
    session: str
    nonce: str
    coordinator: str


@dataclass(frozen=True, eq=False, repr=False)
class KeyTag(Message):
    """Data party → coordinator: its key-confirmation tag, HMAC-SHA256 under the shared secret
    of (label, session, nonce, sender), shape ``(32,)`` uint8. Reveals nothing of the secret."""

    kind: ClassVar[str] = "key_tag"
    session: str
    nonce: str
    tag: npt.NDArray[np.uint8]


@dataclass(frozen=True, eq=False, repr=False)
class FetchKeyTags(Message):
    """Data party → coordinator: the tags of ``parties`` for (``session``, ``nonce``);
    reply :class:`KeyTags`."""

    kind: ClassVar[str] = "fetch_key_tags"
    session: str
    nonce: str
    parties: tuple[str, ...]


@dataclass(frozen=True, eq=False, repr=False)
class KeyTags(Message):
    """Coordinator → data party: ``tags[i]`` is the tag ``parties[i]`` sent, shape ``(n, 32)``."""

    kind: ClassVar[str] = "key_tags"
    session: str
    nonce: str
    parties: tuple[str, ...]
    tags: npt.NDArray[np.uint8]


# --- exact alignment through a coordinator ------------------------------------------------------


@dataclass(frozen=True, eq=False, repr=False)
class ShareKeys(Message):
    """Primary → secondary: send your keyed key hashes for ``session`` to ``coordinator``."""

    kind: ClassVar[str] = "share_keys"
    session: str
    coordinator: str


@dataclass(frozen=True, eq=False, repr=False)
class KeyDigests(Message):
    """Data party → coordinator: HMAC digests of its record keys, shape ``(n, 32)`` uint8.

    The coordinator does not hold the HMAC secret, so it can match equal digests but cannot
    recover or test guesses of the raw keys.
    """

    kind: ClassVar[str] = "key_digests"
    session: str
    digests: npt.NDArray[np.uint8]


@dataclass(frozen=True, eq=False, repr=False)
class MatchKeys(Message):
    """Primary → coordinator: match the digests of ``session``; reply :class:`AlignmentViews`."""

    kind: ClassVar[str] = "match_keys"
    session: str
    secondaries: tuple[str, ...]


@dataclass(frozen=True, eq=False, repr=False)
class AlignmentReady(Message):
    """Primary → secondary: the alignment of ``session`` is ready at ``coordinator``; fetch it."""

    kind: ClassVar[str] = "alignment_ready"
    session: str
    coordinator: str


@dataclass(frozen=True, eq=False, repr=False)
class FetchAlignment(Message):
    """Secondary → coordinator: my view of the alignment of ``session``."""

    kind: ClassVar[str] = "fetch_alignment"
    session: str


@dataclass(frozen=True, eq=False, repr=False)
class AlignmentView(Message):
    """An alignment as one party may see it: indices, and similarities for the primary only."""

    kind: ClassVar[str] = "alignment_view"
    session: str
    secondary: str
    primary_index: npt.NDArray[np.int64]
    secondary_index: npt.NDArray[np.int64]
    similarity: npt.NDArray[np.float32] | None = None
    meta: dict[str, float] = field(default_factory=dict)
    #: the party that linked the session (its primary): a secondary serves rows of this
    #: alignment to that party only
    primary: str = ""
    #: a model link's decisions (``n × K``; primary only): the link is a match (its match
    #: probability reached the threshold and, if asked, the one-to-one assignment kept it)
    match: npt.NDArray[np.bool_] | None = None


@dataclass(frozen=True, eq=False, repr=False)
class AlignmentViews(Message):
    """Coordinator → primary: one view per secondary party."""

    kind: ClassVar[str] = "alignment_views"
    views: tuple[AlignmentView, ...]


# --- fuzzy soft linkage through a coordinator (FedSim §4.1) ------------------------------------


@dataclass(frozen=True)
class EncodingSpec:
    """Public parameters of an identifier encoding, agreed by the data parties.

    ``encoder`` is a registered encoder name (``"raw"``, ``"string"``, ``"bloom"``); ``kind`` is
    ``"numeric"`` or ``"string"``; ``params`` holds Bloom-filter settings; ``low``/``high`` the
    agreed per-dimension range of numeric identifiers (Bloom centres) and ``mean``/``scale`` an
    agreed standardisation (raw). The Bloom secret is never part of it.
    """

    encoder: str
    kind: str
    params: dict[str, float | int | bool] = field(default_factory=dict)
    low: tuple[float, ...] = ()
    high: tuple[float, ...] = ()
    mean: tuple[float, ...] = ()
    scale: tuple[float, ...] = ()


@dataclass(frozen=True, eq=False, repr=False)
class ShareEncodings(Message):
    """Primary → secondary: encode your identifiers with ``spec`` and send them to
    ``coordinator`` for ``session``."""

    kind: ClassVar[str] = "share_encodings"
    session: str
    coordinator: str
    spec: EncodingSpec


@dataclass(frozen=True, eq=False, repr=False)
class IdentifierEncodings(Message):
    """Data party → coordinator: encoded identifiers, one row per record.

    Packed Bloom filters (uint8) by default; raw float vectors or strings only when the user
    turned privacy off explicitly.
    """

    kind: ClassVar[str] = "identifier_encodings"
    session: str
    encoder: str
    values: npt.NDArray[Any] | tuple[str, ...]


@dataclass(frozen=True, eq=False, repr=False)
class SoftLink(Message):
    """Primary → coordinator: link my records to each secondary's top-K (FedSim §4.1).

    The coordinator draws the Eq. 2 noise from its own generator: a primary that chose the noise
    seed could subtract the noise and undo the protection of Theorem 2.
    """

    kind: ClassVar[str] = "soft_link"
    session: str
    secondaries: tuple[str, ...]
    metric: str
    top_k: int
    mode: str = "soft"
    tau: float | None = None
    sigma: float | None = None
    delta: float = 1e-5
    scale: tuple[float, ...] = ()  # (μ0, σ0) of a training linkage to reuse at inference
    #: False: the primary's view comes back without its float32 similarities (indices, meta
    #: and matches only), for a primary that takes them from the links it writes instead
    similarities: bool = True


# --- multi-field soft linkage through a coordinator -------------------------------------------
# Each field has its own public encoding and comparison; blocking keys travel only as keyed
# digests. Column names go to the data parties (whose own schema decides whether they may be
# encoded), never to the coordinator.


@dataclass(frozen=True)
class FieldEncoding:
    """One field as the receiving data party encodes it: its own ``columns`` and the field's
    public encoding (keyed Bloom filters, or raw values only when privacy is off)."""

    columns: tuple[str, ...]
    spec: EncodingSpec


@dataclass(frozen=True)
class BlockingKey:
    """A blocking key as the receiving data party computes it: its own ``column``, normalised,
    cut to the first ``prefix`` characters (0: the whole value), then HMAC'd under the data
    parties' secret."""

    column: str
    prefix: int = 0
    #: further columns of a combined rule: the key is all the columns' values together
    columns: tuple[str, ...] = ()
    #: how each column (``column``, then ``columns``) is normalised before the cut and the
    #: HMAC (:data:`vflink.linkage.fields.KEY_KINDS`; empty: every column as a string)
    kinds: tuple[str, ...] = ()


@dataclass(frozen=True)
class FieldComparison:
    """How the coordinator compares one field: ``metric`` (``hamming`` = Dice distance of keyed
    Bloom filters; a raw metric only with privacy off), ``weight`` in the weighted mean, and
    ``scale`` of a raw numeric field (None: fitted by the coordinator)."""

    metric: str
    weight: float = 1.0
    scale: float | None = None
    #: a model link's comparison levels: similarity thresholds, highest first (empty: the
    #: defaults of ``kind``), and whether exact agreement is term-frequency adjusted
    levels: tuple[float, ...] = ()
    tf: bool = False
    kind: str = "string"


@dataclass(frozen=True, eq=False, repr=False)
class ShareFieldEncodings(Message):
    """Primary → secondary: encode your ``fields`` and ``blocking`` keys and send them to
    ``coordinator`` for ``session`` (:class:`FieldEncodings`)."""

    kind: ClassVar[str] = "share_field_encodings"
    session: str
    coordinator: str
    fields: tuple[FieldEncoding, ...]
    blocking: tuple[BlockingKey, ...] = ()
    #: also send each field's keyed hash of its normalised value (a model link's exact
    #: agreement and term frequencies)
    exact: bool = False


@dataclass(frozen=True, eq=False, repr=False)
class FieldEncodings(Message):
    """Data party → coordinator: per field, its encoder and one row per record (packed Bloom
    filters by default; floats or strings only with privacy off); per blocking key, ``(n, 32)``
    uint8 HMAC-SHA256 digests, all zero for a record without that key."""

    kind: ClassVar[str] = "field_encodings"
    session: str
    encoders: tuple[str, ...]
    values: tuple[npt.NDArray[Any] | tuple[str, ...], ...]
    keys: tuple[npt.NDArray[np.uint8], ...] = ()
    #: per field (when asked), ``(n, 16)`` uint8 keyed hashes of the normalised values, all
    #: zero for an empty value
    exact: tuple[npt.NDArray[np.uint8], ...] = ()


@dataclass(frozen=True, eq=False, repr=False)
class FieldLink(Message):
    """Primary → coordinator: link my records to each secondary's top-K by the weighted field
    distance, then Eq. 1-2 as :class:`SoftLink`; ``blocking`` is the number of
    blocking keys every party sent (0: compare every pair)."""

    kind: ClassVar[str] = "field_link"
    session: str
    secondaries: tuple[str, ...]
    fields: tuple[FieldComparison, ...]
    top_k: int
    blocking: int = 0
    mode: str = "soft"
    tau: float | None = None
    sigma: float | None = None
    delta: float = 1e-5
    scale: tuple[float, ...] = ()  # (μ0, σ0) of a training linkage to reuse at inference
    #: ``"fellegi-sunter"``: score every candidate pair with a model trained without labels
    #: and decide matches (probability ≥ ``threshold``, then ``one_to_one``: ``"optimal"``,
    #: ``"greedy"`` or ``""`` for none); ``""``: the weighted field distance as before
    model: str = ""
    threshold: float = 0.5
    one_to_one: str = ""
    #: a model link's cardinality (``"one-to-one"``, ``"many-to-one"``, ``"one-to-many"``,
    #: ``"many-to-many"``); ``""``: the coordinator estimates it from the data
    cardinality: str = ""
    #: per blocking key, what its rule requires, column by column: a field's index when the
    #: column is that field's whole value, else a negative number (a column that is no field)
    #: — public structure, no value; it lets the coordinator estimate the rules' recall
    rule_atoms: tuple[tuple[int, ...], ...] = ()
    #: as :class:`SoftLink`'s: False, the primary's view without its float32 similarities
    similarities: bool = True


# --- split learning -------------------------------------------------------------------------


@dataclass(frozen=True, eq=False, repr=False)
class SetupBottom(Message):
    """Primary → secondary: build your bottom model with these (public) hyperparameters."""

    kind: ClassVar[str] = "setup_bottom"
    spec: BottomSpec
    #: the primary's run this message belongs to (its own key at the secondary; "": one run)
    run: str = ""


@dataclass(frozen=True, eq=False, repr=False)
class FitPreprocessing(Message):
    """Primary → secondary: fit your preprocessing on these rows of yours (the training rows).

    The reply is an :class:`Ack` whose ``info["n_features"]`` is the encoded width.
    """

    kind: ClassVar[str] = "fit_preprocessing"
    rows: npt.NDArray[np.int64]
    #: the primary's run this message belongs to (its own key at the secondary; "": one run)
    run: str = ""


@dataclass(frozen=True, eq=False, repr=False)
class Forward(Message):
    """Primary → secondary: compute cut-layer embeddings of these rows of yours.

    ``batch_id`` identifies the step, so that a retried call is not applied twice.
    """

    kind: ClassVar[str] = "forward"
    batch_id: int
    rows: npt.NDArray[np.int64]
    train: bool
    #: the primary's run this message belongs to (its own key at the secondary; "": one run)
    run: str = ""


@dataclass(frozen=True, eq=False, repr=False)
class Embeddings(Message):
    """Secondary → primary: one embedding per *unique* requested row, and the index map.

    ``embeddings[inverse]`` gives one embedding per requested row (ARCHITECTURE.md,
    "Performance principles": the secondary model runs once per unique row).
    """

    kind: ClassVar[str] = "embeddings"
    batch_id: int
    embeddings: torch.Tensor
    inverse: npt.NDArray[np.int64]


@dataclass(frozen=True, eq=False, repr=False)
class Backward(Message):
    """Primary → secondary: gradient of the loss w.r.t. the embeddings of ``batch_id``."""

    kind: ClassVar[str] = "backward"
    batch_id: int
    grad: torch.Tensor
    #: the primary's run this message belongs to (its own key at the secondary; "": one run)
    run: str = ""


@dataclass(frozen=True, eq=False, repr=False)
class Snapshot(Message):
    """Primary → secondary: remember your current parameters under ``tag`` (early stopping)."""

    kind: ClassVar[str] = "snapshot"
    tag: str
    #: the primary's run this message belongs to (its own key at the secondary; "": one run)
    run: str = ""


@dataclass(frozen=True, eq=False, repr=False)
class Restore(Message):
    """Primary → secondary: restore the parameters remembered under ``tag``."""

    kind: ClassVar[str] = "restore"
    tag: str
    #: the primary's run this message belongs to (its own key at the secondary; "": one run)
    run: str = ""


@dataclass(frozen=True, eq=False, repr=False)
class SaveState(Message):
    """Primary → secondary: write your model state into your own output directory as ``name``."""

    kind: ClassVar[str] = "save_state"
    name: str
    #: the primary's run this message belongs to (its own key at the secondary; "": one run)
    run: str = ""


@dataclass(frozen=True, eq=False, repr=False)
class LoadState(Message):
    """Primary → secondary: load your state ``name`` from your own output directory
    (prediction with a trained model, or resuming from a checkpoint)."""

    kind: ClassVar[str] = "load_state"
    name: str
    #: the primary's run this message belongs to (its own key at the secondary; "": one run)
    run: str = ""


# --- protection of what a secondary sends (VFL-AFE) ------------------------------------------


@dataclass(frozen=True, eq=False, repr=False)
class SetupPrivacy(Message):
    """Primary → secondary: the embedding protection the run expects (public settings only:
    mode, ε, δ, t, α, β, ...; never a noise seed) and the number of classes C of the task
    (VFL-AFE Eq. 7; 0 for regression). A secondary with its own settings refuses others.

    ``plan``: with ``total_epsilon`` (budget first), the run's release plan the
    secondary calibrates its noise for (``epochs``, ``train_batches``, ``train_chunks``,
    ``validation_chunks``, ``test_chunks``); empty otherwise. Releases beyond it are refused
    by the secondary's budget, so a primary gains nothing by announcing less."""

    kind: ClassVar[str] = "setup_privacy"
    settings: dict[str, str | float | int | bool | None]
    classes: int = 0
    plan: dict[str, int] = field(default_factory=dict)
    #: the primary's run this message belongs to (its own key at the secondary; "": one run)
    run: str = ""


@dataclass(frozen=True, eq=False, repr=False)
class FetchPrivacyReport(Message):
    """Primary → secondary: send your privacy-ledger entries for this run."""

    kind: ClassVar[str] = "fetch_privacy_report"
    #: the primary's run this message belongs to (its own key at the secondary; "": one run)
    run: str = ""


@dataclass(frozen=True, eq=False, repr=False)
class PrivacyReport(Message):
    """Secondary → primary: ledger entries (``Ledger.add_protection`` keyword arguments)."""

    kind: ClassVar[str] = "privacy_report"
    entries: tuple[dict[str, Any], ...] = ()


# --- private set union (FLORIST Algorithm 1) and ECDH PSI, primary ⇄ secondary ----------------
# Every list of group elements below is an ``(n, element_bytes)`` uint8 array, shuffled by its
# sender with secret randomness (or, for a party's own records, in a secret order only it
# knows). Nothing else travels apart from the session name, the group's name and, for PSI, who
# is to learn the intersection: no key text and no hash of one.


#: The most elements one chunk of a PSU/PSI list may hold, whatever ``chunk_rows`` a primary
#: asks for: 2^20 ristretto255 elements are 32 MiB, far under the transport's message cap.
MAX_CHUNK_ROWS = 1 << 20


@dataclass(frozen=True, eq=False, repr=False)
class PsuRound1(Message):
    """Primary (P_a) → secondary (P_p): open PSU (Algorithm 1) over ``n_a`` records (a
    positive number the secondary's policy allows), every list in chunks of at most
    ``chunk_rows`` elements (no round held whole in one message).

    The reply is an :class:`Ack` with ``info["n_p"]``, the secondary's record count, and
    ``info["chunk_rows"]``, the chunk size it accepts (at most the one asked for: its own work
    limit per message). The lists then travel in the order of Algorithm 1 as
    :class:`PsuChunk` (P_a → P_p: I_a^{s1}, line 3; I_p^{s1 t1}, line 6;
    (I_a ∪ I_p)^{s1 s2 s3 t1}, line 8; x^{s1 s2 s3 t2}, line 12) and :class:`PsuFetch`
    (P_p → P_a: I_a^{s1 t1}, line 4; I_p^{t1}, line 5; the final union, line 9;
    x^{s1 t1 t2 t3}, line 11 (the line-3 list raised, in its order); x^{t2}, line 12).
    """

    kind: ClassVar[str] = "psu_round1"
    session: str
    group: str
    n_a: int
    chunk_rows: int


@dataclass(frozen=True, eq=False, repr=False)
class PsuChunk(Message):
    """P_a → P_p: chunk ``index`` of the list ``stream`` (``total`` elements in all); the reply
    is an empty :class:`Ack`."""

    kind: ClassVar[str] = "psu_chunk"
    session: str
    stream: str
    index: int
    total: int
    elements: npt.NDArray[np.uint8]


@dataclass(frozen=True, eq=False, repr=False)
class PsuFetch(Message):
    """P_a → P_p: send chunk ``index`` of your list ``stream``; the reply is a
    :class:`SetChunk`."""

    kind: ClassVar[str] = "psu_fetch"
    session: str
    stream: str
    index: int


@dataclass(frozen=True, eq=False, repr=False)
class PsiRound1(Message):
    """Primary → secondary: open ECDH PSI over ``n_a`` records, every list in chunks of at
    most ``chunk_rows`` elements (no round held whole in one message).

    ``reveal`` says who learns the intersection (``both``, ``primary``, ``secondary``) or that
    only its size is to be known (``cardinality``). ``commitment`` is G^a, the primary's
    commitment to its exponent (:func:`vflink.alignment.proofs.commit`). The reply is an
    :class:`Ack` with ``info["n_p"]`` and ``info["chunk_rows"]`` (as for :class:`PsuRound1`).
    Then: :class:`PsiChunk` ``a_s`` (H(x)^a for the primary's records in its secret order);
    :class:`PsiFetch` ``a_st`` (H(x)^{ab}, in the order received if the primary is to learn the
    intersection, shuffled otherwise) and ``p_t`` (H(y)^b for the secondary's records,
    shuffled); and, when the secondary is to learn it, :class:`PsiChunk` ``p_ts`` (H(y)^{ba}
    in the order received), whose last chunk carries the proof that the elements matching
    ``a_st`` were raised with the committed exponent.
    """

    kind: ClassVar[str] = "psi_round1"
    session: str
    group: str
    reveal: str
    n_a: int
    chunk_rows: int
    commitment: bytes = b""


@dataclass(frozen=True, eq=False, repr=False)
class PsiChunk(Message):
    """Primary → secondary: chunk ``index`` of the list ``stream``; the reply is an Ack.
    ``proof``: on the last chunk of ``p_ts`` only, a batched Chaum–Pedersen proof
    (:mod:`vflink.alignment.proofs`)."""

    kind: ClassVar[str] = "psi_chunk"
    session: str
    stream: str
    index: int
    total: int
    elements: npt.NDArray[np.uint8]
    proof: bytes = b""


@dataclass(frozen=True, eq=False, repr=False)
class PsiFetch(Message):
    """Primary → secondary: send chunk ``index`` of your list ``stream`` (a :class:`SetChunk`)."""

    kind: ClassVar[str] = "psi_fetch"
    session: str
    stream: str
    index: int


@dataclass(frozen=True, eq=False, repr=False)
class SetProgress(Message):
    """Primary → secondary: the primary is still computing the list ``stream`` of set session
    ``session`` (PSU or PSI) and has ``done`` of its elements.

    A driver computes a whole list (PSU lines 3 and 8: a secret shuffle needs every element)
    before it sends the first chunk, and works on each chunk it fetches; this message, sent
    meanwhile, keeps the session from expiring as idle. ``stream`` is one of the protocol's
    lists, ``done`` grows with every message of that list and stays within a few passes over
    the committed set sizes, and no session outlives the secondary's ``policy.max_session_s``
    however it is kept alive. The reply is an :class:`Ack`."""

    kind: ClassVar[str] = "set_progress"
    session: str
    stream: str
    done: int


@dataclass(frozen=True, eq=False, repr=False)
class SetChunk(Message):
    """Secondary → primary: one chunk of a PSU/PSI list, in reply to a fetch."""

    kind: ClassVar[str] = "set_chunk"
    stream: str
    index: int
    elements: npt.NDArray[np.uint8]


# --- PSI through an engine (RR22, KKRT16: vflink.alignment.engine), primary ⇄ secondary ------
# The engine runs its own link between the parties; these messages are how the two agree on it
# through their authenticated session first: the protocol, the run, the set sizes, the key, the
# addresses and the TLS settings. No element of either set travels here.


@dataclass(frozen=True, eq=False, repr=False)
class EnginePsiOpen(Message):
    """Primary → secondary: run PSI ``session`` with the engine's ``protocol`` (``rr22``,
    ``kkrt``) over ``n_a`` records keyed on ``key_columns`` columns; ``reveal`` says who
    learns the intersection (``both``, ``primary``, ``secondary``).

    ``uid_key`` (32 random bytes, fresh per session) keys the hash both parties feed the engine
    and keep as UIDs; ``tls`` says whether the primary runs the engine's link with mutual TLS
    (the secondary refuses a mismatch at once, before any link); ``address`` is where the
    primary's engine listens, from its own party file. The reply is an
    :class:`EnginePsiReady`."""

    kind: ClassVar[str] = "engine_psi_open"
    session: str
    protocol: str
    reveal: str
    n_a: int
    key_columns: int
    tls: bool
    address: str
    uid_key: bytes


@dataclass(frozen=True, eq=False, repr=False)
class EnginePsiReady(Message):
    """Secondary → primary: the engine run is accepted; ``address`` is where the secondary's
    engine listens (its own party file); ``info`` holds ``n_p`` (its set size), ``idle_s``
    (its session's idle expiry) and its dictionary limit (``guess_limit``,
    ``guess_window_s``), as PSI's round 1 answers them."""

    kind: ClassVar[str] = "engine_psi_ready"
    session: str
    address: str
    info: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True, eq=False, repr=False)
class EnginePsiStatus(Message):
    """Primary → secondary: how far the primary's side of engine session ``session`` is
    (``preparing`` its input, ``ready`` to start its engine, ``running``, ``done``,
    ``failed``); the reply is an :class:`Ack` whose ``info["state"]`` is the secondary's:
    0 preparing, 1 running (its engine started: the primary starts its own), 2 done. A failed
    engine on the secondary's side is an error naming why; a ``failed`` primary ends the
    session. The messages keep the session alive while the engines run."""

    kind: ClassVar[str] = "engine_psi_status"
    session: str
    state: str


@dataclass(frozen=True, eq=False, repr=False)
class EnginePsiResult(Message):
    """Primary → secondary: both engines finished. When both learn the intersection, ``size``
    and ``digest`` (:func:`vflink.alignment.engine.output_digest`) let the secondary check that
    the two outputs agree (else ``size = -1``, ``digest`` empty: neither learns more). The
    reply is an :class:`Ack`; the session is finished."""

    kind: ClassVar[str] = "engine_psi_result"
    session: str
    size: int
    digest: bytes = b""


# --- training over the PSU union (FLORIST §2.3-2.4), primary ⇄ secondary -----------------------


@dataclass(frozen=True, eq=False, repr=False)
class UnionSetup(Message):
    """Primary → secondary: train over the UID list of PSU ``session``.

    Build your bottom model with ``spec`` and fill the UIDs you do not hold with the synthetic
    ``features`` strategy (``fea-sampling``, ``fea-gaussian``, ``fea-random``; ``none`` only
    when you hold every UID of U), if your policy serves it (``policy.union_features``). The
    secondary fits its preprocessing on all of its own records: a fit on the peer's
    ``fit_uids`` (positions in U) would answer differently for UIDs it holds (a membership
    oracle), so
    they are kept for the protocol's shape only. The reply is an :class:`Ack` with
    ``n_features``.
    """

    kind: ClassVar[str] = "union_setup"
    session: str
    spec: BottomSpec
    features: str
    fit_uids: npt.NDArray[np.int64]
    #: the primary's run this message belongs to (its own key at the secondary; "": one run)
    run: str = ""


@dataclass(frozen=True, eq=False, repr=False)
class UnionForward(Message):
    """Primary → secondary: cut-layer embeddings for these UIDs (positions in U), real where
    you hold the record and synthetic where you do not; the reply is :class:`Embeddings`."""

    kind: ClassVar[str] = "union_forward"
    batch_id: int
    uids: npt.NDArray[np.int64]
    train: bool
    #: the primary's run this message belongs to (its own key at the secondary; "": one run)
    run: str = ""


MESSAGE_TYPES: dict[str, type[Message]] = {
    cls.kind: cls
    for cls in (
        Hello, Health, Ack, ShareKeys, KeyDigests, MatchKeys, AlignmentReady, FetchAlignment,
        AlignmentView, AlignmentViews, ShareEncodings, IdentifierEncodings, SoftLink,
        SetupBottom,
        FitPreprocessing, Forward, Embeddings, Backward, Snapshot,
        Restore, SaveState, LoadState, ConfirmKey, KeyTag, FetchKeyTags, KeyTags,
        SetupPrivacy, FetchPrivacyReport, PrivacyReport,
        PsuRound1, PsuChunk, PsuFetch, PsiRound1, PsiChunk, PsiFetch, SetChunk, SetProgress,
        EnginePsiOpen, EnginePsiReady, EnginePsiStatus, EnginePsiResult,
        UnionSetup,
        UnionForward, ShareFieldEncodings,
        FieldEncodings, FieldLink,
    )
}


#: Non-message dataclasses that may travel inside messages (for the wire serde's allowlist).
PAYLOAD_TYPES: dict[str, type] = {
    "BottomSpec": BottomSpec, "EncodingSpec": EncodingSpec, "FieldEncoding": FieldEncoding,
    "BlockingKey": BlockingKey, "FieldComparison": FieldComparison}


@functools.cache
def _field_names(cls: type) -> tuple[str, ...]:
    # dataclasses.fields() on every message of every training step was a visible cost
    return tuple(f.name for f in dataclasses.fields(cls))


def _nbytes(value: Any) -> int:
    # torch is imported by whoever made a tensor; this module does not import it, so that
    # linkage (numpy arrays only) does not pay for it.
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        return int(value.numel() * value.element_size())
    if isinstance(value, np.ndarray):
        return int(value.nbytes)
    if isinstance(value, (bytes, bytearray)):
        return len(value)
    if isinstance(value, str):
        return len(value.encode())
    if isinstance(value, bool):
        return 1
    if isinstance(value, (int, float)):
        return 8
    if value is None:
        return 0
    if isinstance(value, Message) or dataclasses.is_dataclass(value):
        cls: type = type(value)
        return sum(_nbytes(getattr(value, name)) for name in _field_names(cls))
    if isinstance(value, dict):
        return sum(_nbytes(k) + _nbytes(v) for k, v in value.items())
    if isinstance(value, (tuple, list)):
        return sum(_nbytes(v) for v in value)
    return 0


def payload_nbytes(message: Message) -> int:
    """Payload size of a message: array/tensor bytes plus 8 per scalar and string lengths.

    Every transport counts this same figure, so communication accounting agrees between the
    in-process and network transports for the same run.
    """
    return _nbytes(message)
