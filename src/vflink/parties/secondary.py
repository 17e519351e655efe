"""A secondary (passive) party: holds features, computes cut-layer embeddings on request.

Per batch it runs its bottom model once per *unique* requested row, sends the embeddings (not
the graph) and keeps the graph until the gradient for that batch comes back (FedSim Algorithm 1,
SplitNN part: the secondary's forward and backward around the primary's aggregation model).

Each primary's run trains its own model: every training verb works on the
:class:`~vflink.parties.training_runs.TrainingRun` of the message's sender and run (the
``training`` session it belongs to), never on another's; a served party keeps each peer's
saved states in that peer's own folder (``<state_dir>/peers/<peer>/``), so state names are
scoped to the peer that saved them.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from vflink.alignment._spool import sweep_stale
from vflink.data.featurestore import (
    ConstantFeatures,
    FeatureSource,
    encode_features,
    use_mmap,
)
from vflink.data.preprocess import Preprocessor
from vflink.data.table import PartyTable
from vflink.errors import PolicyViolation, ProtocolError, VflinkError
from vflink.models.cnn import build_bottom
from vflink.models.device import resolve_device
from vflink.models.mlp import build_optimizer, seeded_init
from vflink.models.spec import BottomSpec
from vflink.models.statefile import (
    StateFileError,
    load_state,
    read_state_header,
    remove_state,
    save_state,
    state_json_path,
)
from vflink.parties.base import state_path
from vflink.parties.guard import admit_forward, admit_snapshot, check_backward, check_bottom_spec
from vflink.parties.link_peer import LinkingPeer
from vflink.parties.policy import PartyPolicy
from vflink.parties.privacy import EmbeddingProtection
from vflink.parties.recording import Recorder
from vflink.parties.resources import TrainingResources
from vflink.parties.setalign import SPOOL_DIR, SetAlignmentPeer
from vflink.parties.setengine import EnginePsiPeer
from vflink.parties.training_runs import (
    TrainingRun,
    features_bytes,
    model_bytes,
    peer_root,
    refuse_memory,
)
from vflink.parties.union import UnionPeer
from vflink.privacy.budget import BUDGET_DIR
from vflink.privacy.config import PrivacyConfig
from vflink.privacy.randomized_response import CodeField
from vflink.protocol.boundary import refuse
from vflink.protocol.channel import Channel
from vflink.protocol.messages import (
    Ack,
    Backward,
    Embeddings,
    FetchPrivacyReport,
    FitPreprocessing,
    Forward,
    LoadState,
    PrivacyReport,
    Restore,
    SaveState,
    SetupBottom,
    SetupPrivacy,
    Snapshot,
)
from vflink.protocol.sessions import TRAINING, Session, run_key

__all__ = ["SecondaryParty"]

log = logging.getLogger(__name__)

#: Most classes a SetupPrivacy may announce: C of VFL-AFE Eq. 7 sizes the fuzzy c-means state.
MAX_CLASSES = 100_000
#: rows per read when counting the training rows' categories (``fields`` quantiser)
_COUNT_CHUNK = 65_536

_EPOCH_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
#: the session data key of a training run
_RUN = "training"


def _prune_checkpoints(latest: Path) -> None:
    """Keep the latest two per-epoch checkpoints: the primary's commit point refers to one of
    them even if it died between our write and its own."""
    m = _EPOCH_CHECKPOINT.match(latest.name)
    if m is None:
        return
    current = int(m.group(1))
    for old in latest.parent.glob("checkpoint-*.json"):
        mo = _EPOCH_CHECKPOINT.match(old.name[:-len(".json")])
        if mo is not None and int(mo.group(1)) < current - 1:
            remove_state(old.parent, mo.group(0))


class SecondaryParty(SetAlignmentPeer, EnginePsiPeer, UnionPeer, LinkingPeer):
    """A data party without labels.

    Args:
        table: the party's own validated table.
        channel: how this party reaches the coordinator.
        secret: the HMAC secret shared by the data parties (not the coordinator).
        out_dir: where this party writes its own model state.
        recorder: records what this party receives (``[evaluation] record``), for attacks.
        privacy: this party's own embedding protection (VFL-AFE), from the run config
            in-process or from its party file across hosts; see :mod:`vflink.parties.privacy`.
        privacy_seed: the embedding noise seed, only where the run or the party file asked for
            ``[privacy] reproducible_noise`` (not private); ``None``: secret noise
            (:mod:`vflink.randomness`).
        reproducible_noise: this party's protective draws are seeded (not private): the
            union training stand-ins too. Default: ``privacy.reproducible_noise``.
        resources: this party's own device and feature store (``[training]`` of its party
            file, or of the run file in-process); nothing of them reaches a peer.
        peer_dirs: keep each peer's saved states in its own folder,
            ``out_dir/peers/<peer>/`` (a served party, the default); ``False``: in ``out_dir``
            itself, for a party built for one run of one primary (a run directory's
            ``models/<party>/``), where a state another peer saved is still refused.
    """

    role = "secondary"

    def __init__(self, table: PartyTable, channel: Channel, *, secret: bytes | None = None,
                 out_dir: Path | None = None, recorder: Recorder | None = None,
                 privacy: PrivacyConfig | None = None, privacy_seed: int | None = None,
                 roles: Mapping[str, str] | None = None,
                 policy: PartyPolicy | None = None,
                 resources: TrainingResources | None = None,
                 reproducible_noise: bool | None = None,
                 peer_dirs: bool = True) -> None:
        super().__init__(table, channel, secret=secret, roles=roles, policy=policy,
                         recorder=recorder)
        self.out_dir = out_dir
        self.peer_dirs = peer_dirs
        self.reproducible_noise = bool(
            reproducible_noise if reproducible_noise is not None
            else privacy is not None and privacy.reproducible_noise)
        # finished set alignments are reloaded from disk when evicted or after a restart, and
        # a killed process's spools (blinded lists of a session) are removed when we start
        self.sessions.restore = self._restore_session
        if out_dir is not None:
            sweep_stale(Path(out_dir) / SPOOL_DIR)
        self.resources = resources or TrainingResources()
        # resolved here: "cuda" on a machine without CUDA fails when the party starts
        self.device = resolve_device(self.resources.device, party=table.name)
        self._fingerprint: str | None = None
        #: each primary's links per row of ours (from its alignment), for its runs' release
        #: accounting
        self._links: dict[str, npt.NDArray[np.intp]] = {}
        # release counts live with the data, in this party's own directory, and outlive runs;
        # each run's protection counts on them (EmbeddingProtection.for_run)
        self.protection = EmbeddingProtection(
            self.name, len(table), privacy, privacy_seed,
            budget_dir=None if out_dir is None else out_dir / BUDGET_DIR,
            fingerprint=lambda: self.data_fingerprint)

    @property
    def data_fingerprint(self) -> str:
        """Hash of this party's own table (computed here; only comparisons leave)."""
        if self._fingerprint is None:
            self._fingerprint = self.table.fingerprint()  # per batch if read so
        return self._fingerprint

    # --- each primary's runs ---------------------------------------------------------------

    def training_run(self, peer: str, run: str = "") -> TrainingRun | None:
        """``peer``'s training run ``run`` as this party holds it (None: none held)."""
        s = self.sessions.get(TRAINING.name, run_key(peer, run))
        return None if s is None else s.data.get(_RUN)

    def training_runs(self) -> list[TrainingRun]:
        """Every training run this party holds now, of every peer."""
        return [s.data[_RUN] for s in self.sessions.sessions(TRAINING.name) if _RUN in s.data]

    def _new_run(self, peer: str, run: str) -> TrainingRun:
        ctx = TrainingRun(peer=peer, run=run,
                          protection=self.protection.for_run(self._links.get(peer)),
                          preprocessor=Preprocessor(self.table.schema))
        if self.recorder is not None and self.peer_dirs:
            ctx.recorder = self.recorder.for_run()
        return ctx

    def _run(self) -> TrainingRun:
        """The run of the message being handled (made by its first message)."""
        s = self.session
        ctx: TrainingRun | None = s.data.get(_RUN)
        if ctx is None:
            run = s.name[len(s.opener) + 1:] if s.name != s.opener else ""
            ctx = s.data[_RUN] = self._new_run(s.opener, run)
        return ctx

    def _recorder(self, ctx: TrainingRun) -> Recorder | None:
        return ctx.recorder if ctx.recorder is not None else self.recorder

    def recording_of(self, peer: str, run: str = "") -> Recorder | None:
        """What this party recorded of ``peer``'s training run ``run`` (None: it does not
        record, or holds no such run)."""
        ctx = self.training_run(peer, run)
        return None if ctx is None else self._recorder(ctx)

    def _root(self, peer: str) -> Path | None:
        """Where ``peer``'s saved states live (None: this party keeps no files)."""
        if self.out_dir is None:
            return None
        return peer_root(self.out_dir, peer, per_peer=self.peer_dirs)

    def _fit_memory(self, ctx: TrainingRun, need: int, session: Session | None) -> None:
        """Make room for ``need`` more bytes of ``ctx``'s peer's training state: drop the
        peer's own least recently used other runs while the total is over
        ``policy.max_training_bytes``; refuse (before anything is built) if it still is."""
        limit = self.policy.max_training_bytes
        if need > limit:  # refused before any other run is dropped for it
            raise refuse_memory(self.name, ctx.peer, need, limit)
        while True:
            held = sum(r.nbytes() for r in self.training_runs()
                       if r.peer == ctx.peer and r is not ctx)
            if held + need <= limit:
                return
            if session is None or not self.sessions.evict(TRAINING.name, ctx.peer,
                                                          keep=session):
                raise refuse_memory(self.name, ctx.peer, held + need, limit)

    def _planned(self, ctx: TrainingRun, spec: BottomSpec, pre: Preprocessor) -> int:
        """Memory of the model ``spec`` on ``pre``'s features, with its encoded features."""
        mapped = pre.n_features > 0 and use_mmap(self.resources.feature_store, len(self.table))
        return model_bytes(spec, pre.n_features) + features_bytes(
            len(self.table), pre.n_features, mapped=mapped)

    # --- alignment: LinkingPeer (key confirmation, keys, encodings, the alignment view) -----

    def _note_links(self, counts: npt.NDArray[np.intp], peer: str) -> None:
        # the counts, not the alignment's n × K rows: all the accounting needs, and no copy of
        # the rows (113 MB at FedSim's house scale) kept for each primary
        self._links[peer] = counts
        for ctx in self.training_runs():
            if ctx.peer == peer:
                ctx.protection.note_links(counts)

    def on_setup_bottom(self, sender: str, message: SetupBottom) -> Ack:
        # a CNN views the party's numeric features as an image; an MLP's bound counts columns
        n_inputs = (len(self.table.schema.numeric) if message.spec.bottom == "cnn"
                    else len(self.table.column_names))
        check_bottom_spec(message.spec, n_inputs, party=self.name, policy=self.policy)
        ctx = self._run()
        ctx.spec = message.spec
        # a new training run; the data's release counts carry over (a primary must not be able
        # to reset them by repeating the setup)
        ctx.protection.start()
        recorder = self._recorder(ctx)
        if recorder is not None:
            recorder.new_training()
            # what this party was told: a white-box attack tries every seed it received
            recorder.note("setup", sender, {"message": message.kind,
                                            "seed": int(message.spec.seed)})
        return Ack()

    def on_setup_privacy(self, sender: str, message: SetupPrivacy) -> Ack:
        classes = message.classes
        if isinstance(classes, bool) or not isinstance(classes, int) \
                or not 0 <= classes <= MAX_CLASSES:
            raise refuse(ProtocolError, f"SetupPrivacy `classes` must be an int in [0, "
                                        f"{MAX_CLASSES}] (0: regression), got {classes!r}",
                         code="privacy.classes")
        return Ack(info=self._run().protection.setup(message.settings, message.classes,
                                                     dict(message.plan)))

    def on_fetch_privacy_report(self, sender: str, message: FetchPrivacyReport) -> PrivacyReport:
        return PrivacyReport(entries=self._run().protection.report())

    def _check_rows(self, rows: npt.NDArray[np.int64], what: str, sender: str
                    ) -> npt.NDArray[np.int64]:
        """``rows`` if every one is linked by the alignment this party completed with
        ``sender``; otherwise a refusal before any work (an unaligned secondary, a row
        outside the alignment or a request with no alignment gets nothing)."""
        served = self.served.get(sender)
        if served is None:
            raise refuse(ProtocolError, f"party {self.name!r}: training protocol: {what} "
                                        f"refused: no alignment with {sender!r} has been "
                                        "completed (send AlignmentReady after aligning)",
                         code="session.no-alignment")
        rows = np.asarray(rows, dtype=np.int64)
        if rows.ndim != 1:
            raise refuse(ProtocolError, f"party {self.name!r}: {what} rows must be 1-D",
                         code="rows.shape")
        if rows.size and (rows.min() < 0 or rows.max() >= len(self.table)):
            raise refuse(ProtocolError, f"party {self.name!r}: {what} rows outside "
                                        f"[0, {len(self.table)})", code="rows.range")
        if rows.size and not served[rows].all():
            # Only rows the coordinator linked may be used: the primary cannot probe others.
            raise refuse(ProtocolError, f"party {self.name!r}: {what} asks for rows that the "
                                        "alignment did not link", code="rows.unaligned")
        return rows

    def on_fit_preprocessing(self, sender: str, message: FitPreprocessing) -> Ack:
        ctx = self._run()
        if ctx.spec is None:
            raise ProtocolError(f"party {self.name!r}: FitPreprocessing before SetupBottom")
        rows = np.unique(self._check_rows(message.rows, "preprocessing", sender))
        # fitted on just the training rows, gathered (a table read in batches is never whole)
        pre = Preprocessor(self.table.schema, standardize=ctx.spec.standardize).fit(
            self.table.take(rows, self.table.schema.features), np.arange(len(rows)))
        ctx.clear()  # the previous model of this run goes before the new one is counted
        self._fit_memory(ctx, self._planned(ctx, ctx.spec, pre), self.session)
        ctx.protection.note_train_rows(rows)
        self._build(ctx, ctx.spec, pre)
        if ctx.protection.wants_code_fields:
            ctx.protection.note_code_fields(self._code_fields(ctx, pre, rows))
        return Ack(info={"n_features": float(pre.n_features)})

    def _code_fields(self, ctx: TrainingRun, pre: Preprocessor, rows: npt.NDArray[np.int64]
                     ) -> tuple[CodeField, ...] | None:
        """The ``fields`` quantiser's view of the encoded row: its columns, and each category's
        rank by frequency among the training ``rows`` (counted a chunk of rows at a time)."""
        columns = pre.columns()
        if not columns or ctx.features is None:
            return None
        sums = np.zeros(ctx.features.n_features, dtype=np.float64)
        for start in range(0, len(rows), _COUNT_CHUNK):
            sums += ctx.features.rows(rows[start:start + _COUNT_CHUNK]).double().sum(0).numpy()
        fields = []
        for start, width, categorical in columns:
            ranks = None
            if categorical:  # most frequent first; ties in the block's (sorted) order
                order = np.argsort(-sums[start:start + width], kind="stable")
                ranks = tuple(int(r) for r in np.argsort(order, kind="stable"))
            fields.append(CodeField(start, width, ranks))
        return tuple(fields)

    def _feature_dir(self, peer: str) -> Path | None:
        """Where a run of ``peer`` maps its encoded features (the peer's own folder)."""
        return None if self.out_dir is None else self._root(peer)

    def _build(self, ctx: TrainingRun, spec: BottomSpec, pre: Preprocessor) -> None:
        """Encode our rows with ``pre`` and build ``ctx``'s fresh bottom model and optimiser."""
        ctx.clear()
        ctx.spec = spec
        ctx.preprocessor = pre
        store = self.resources.feature_store
        # a party with no features still answers with an embedding (one zero feature)
        ctx.features = ConstantFeatures(len(self.table)) if pre.n_features == 0 else \
            encode_features(pre, self.table, store=store, directory=self._feature_dir(ctx.peer),
                            owner=self.name, fingerprint=self.data_fingerprint
                            if use_mmap(store, len(self.table)) else "")
        with seeded_init(spec.seed):  # built on the CPU: the same weights on every device
            model = build_bottom(spec, max(pre.n_features, 1))
        ctx.model = model.to(self.device)
        ctx.optimizer = build_optimizer(ctx.model.parameters(), spec)

    def _ready(self, ctx: TrainingRun) -> tuple[torch.nn.Module, FeatureSource]:
        if ctx.model is None or ctx.features is None:
            raise ProtocolError(f"party {self.name!r}: Forward before FitPreprocessing")
        return ctx.model, ctx.features

    def on_forward(self, sender: str, message: Forward) -> Embeddings:
        ctx = self._run()
        model, features = self._ready(ctx)
        rows = self._check_rows(message.rows, "forward", sender)
        if message.train:  # bounded: at most policy.max_pending_batches wait for a Backward
            admit_forward(ctx.pending, ctx.pending_since, message.batch_id,
                          party=self.name, policy=self.policy)
        unique, inverse = np.unique(rows, return_inverse=True)
        x = features.rows(unique).to(self.device)
        if message.train:
            if not model.training:  # train() walks every submodule: only on a change
                model.train()
            if ctx.spec is not None and ctx.spec.dropout > 0:
                # Dropout masks depend on (seed, batch id) only: reproducible, and the same in
                # every process layout and on every device (drawn on the CPU).
                with seeded_init(ctx.spec.seed * 1_000_003 + message.batch_id):
                    out = model(x)
            else:
                out = model(x)
            # back to the CPU before anything else (a differentiable copy: the gradient
            # returns to the device): protection and the message work on CPU tensors
            out = out.cpu()
            out, emb = ctx.protection.protect(out, unique, x.cpu())  # VFL-AFE Alg. 1 l. 6-9
            ctx.pending[message.batch_id] = out
            recorder = self._recorder(ctx)
            if recorder is not None:
                recorder.forward_rows(message.batch_id, unique, rows)
        else:
            if model.training:
                model.eval()
            with torch.no_grad():
                _, emb = ctx.protection.protect(model(x).cpu(), unique, x.cpu())
        return Embeddings(batch_id=message.batch_id, embeddings=emb,
                          inverse=inverse.astype(np.int64))

    def on_backward(self, sender: str, message: Backward) -> Ack:
        ctx = self._run()
        # shape and values are checked before the pending batch is consumed
        check_backward(ctx.pending, ctx.applied, message, party=self.name, policy=self.policy)
        if message.batch_id in ctx.applied:  # a retried call: already applied once
            return Ack(info={"duplicate": 1.0})
        out = ctx.pending.pop(message.batch_id, None)
        if out is None or ctx.optimizer is None:
            raise ProtocolError(f"party {self.name!r}: Backward for unknown batch "
                                f"{message.batch_id}")
        if tuple(message.grad.shape) != tuple(out.shape):
            raise ProtocolError(f"party {self.name!r}: gradient shape {tuple(message.grad.shape)}"
                                f" != embedding shape {tuple(out.shape)}")
        ctx.optimizer.zero_grad(set_to_none=True)
        # VFL-AFE Alg. 1 line 18: the received gradient plus the local α·L_KL + β·L_CL
        ctx.protection.backward(out, message.grad.to(out.dtype))
        ctx.optimizer.step()
        ctx.applied.add(message.batch_id)
        recorder = self._recorder(ctx)
        if recorder is not None:
            recorder.gradients(sender, message.batch_id, message.grad)
        return Ack()

    def _state(self, ctx: TrainingRun) -> dict[str, Any]:
        if ctx.model is None or ctx.optimizer is None:
            raise ProtocolError(f"party {self.name!r} has no model yet")
        return {"model": ctx.model.state_dict(), "optimizer": ctx.optimizer.state_dict()}

    def _full_state(self, ctx: TrainingRun) -> dict[str, Any]:
        """Everything needed to rebuild this run's model later: parameters, optimiser,
        fitted preprocessing and spec, and the peer it belongs to (a file for this party's
        own directory only)."""
        return {**self._state(ctx), "preprocessor": ctx.preprocessor.to_json(),
                "spec": dataclasses.asdict(ctx.spec) if ctx.spec else None,
                "applied": sorted(ctx.applied), "data": self.data_fingerprint,
                "privacy": ctx.protection.state_dict(), "owner": ctx.peer}

    def on_snapshot(self, sender: str, message: Snapshot) -> Ack:
        ctx = self._run()
        admit_snapshot(ctx.snapshots, message.tag, party=self.name, policy=self.policy)
        state = self._state(ctx)
        if message.tag not in ctx.snapshots:  # a new copy of the model: within the memory
            self._fit_memory(ctx, ctx.nbytes() + ctx.state_bytes(), self.session)
        ctx.snapshots[message.tag] = copy.deepcopy(state)
        return Ack()

    def on_restore(self, sender: str, message: Restore) -> Ack:
        ctx = self._run()
        state = ctx.snapshots.get(message.tag)
        if state is None:
            raise ProtocolError(f"party {self.name!r}: no snapshot {message.tag!r}")
        model = ctx.model
        optimizer = ctx.optimizer
        if model is None or optimizer is None:
            raise ProtocolError(f"party {self.name!r} has no model yet")
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        return Ack()

    def _refuse_unknown_state(self, name: str) -> ProtocolError:
        # the same answer for a state that does not exist and one another peer saved: a
        # peer learns nothing about the others' names
        return refuse(ProtocolError, f"party {self.name!r} holds no saved state {name!r} of "
                                     "yours", code="state.unknown")

    def _owner_of(self, root: Path, name: str) -> str | None:
        """The peer that saved state ``name`` under ``root`` (None: an older file without an
        owner, or none that can be read)."""
        try:
            header = read_state_header(root, name, kind="secondary")
        except StateFileError:
            return None
        owner = header.get("state", {}).get("owner") if isinstance(header.get("state"),
                                                                   dict) else None
        return owner if isinstance(owner, str) else None

    def on_save_state(self, sender: str, message: SaveState) -> Ack:
        ctx = self._run()
        root = self._root(sender)
        if root is None:  # a silent no-op would fail only later, at LoadState
            raise ProtocolError(f"party {self.name!r} has no state directory to save to")
        target = state_path(root, message.name, party=self.name)  # never outside the root
        if state_json_path(target.parent, target.name).exists():
            owner = self._owner_of(target.parent, target.name)
            if owner is not None and owner != sender:  # not this peer's to overwrite
                raise refuse(PolicyViolation, f"party {self.name!r}: the state name "
                                              f"{message.name!r} is taken; save under another",
                             code="state.taken")
        else:
            # a peer names the file: bound how many distinct states it can make us keep (disk)
            kept = sum(1 for _ in root.rglob("*.json")) if root.is_dir() else 0
            if kept >= self.policy.max_saved_states:
                raise refuse(PolicyViolation,
                             f"party {self.name!r} already keeps {kept} saved states for "
                             f"{sender!r} (its limit, policy.max_saved_states); save under an "
                             "existing name", code="limit.saved-states")
        # weights as safetensors, the rest as JSON, committed atomically (models/statefile.py)
        save_state(target.parent, target.name, self._full_state(ctx), kind="secondary")
        _prune_checkpoints(target)
        recorder = self._recorder(ctx)
        if recorder is not None:
            recorder.flush(target.parent, party=self.name, role=self.role)
        return Ack(info={"saved": 1.0})

    def on_load_state(self, sender: str, message: LoadState) -> Ack:
        ctx = self._run()
        root = self._root(sender)
        if root is None:
            raise ProtocolError(f"party {self.name!r} has no state directory to load from")
        path = state_path(root, message.name, party=self.name)
        if not state_json_path(path.parent, path.name).is_file() or \
                self._owner_of(path.parent, path.name) not in (None, sender):
            raise self._refuse_unknown_state(message.name)
        self._load_into(ctx, path, f"state {message.name!r} of party {self.name!r}",
                        session=self.session)
        # Only whether our data changed since the save crosses the boundary (never the hash):
        # the primary refuses to resume a run on changed data (vflink.runner.resume).
        changed = ctx.loaded_data != self.data_fingerprint
        return Ack(info={"n_features": float(ctx.preprocessor.n_features),
                         "data_changed": float(changed)})

    def _load_into(self, ctx: TrainingRun, path: Path, source: str, *,
                   session: Session | None) -> None:
        """Rebuild ``ctx`` from the state file at ``path`` (its memory checked first)."""
        # tensors from safetensors and the rest from JSON: nothing is unpickled
        try:
            state = load_state(path.parent, path.name, kind="secondary")
        except StateFileError as exc:
            # the peer learns which check failed, never this party's paths
            raise refuse(StateFileError, f"party {self.name!r}: saved {source}: {exc.reason}",
                         code="state-file", detail=str(exc)) from None
        try:
            spec = BottomSpec(**state["spec"])
            pre = Preprocessor.from_json(state["preprocessor"], self.table.schema, source=source)
            ctx.clear()
            self._fit_memory(ctx, self._planned(ctx, spec, pre), session)
            self._build(ctx, spec, pre)
            model, optimizer = ctx.model, ctx.optimizer
            if model is None or optimizer is None:
                raise ProtocolError(f"party {self.name!r}: failed to rebuild the model")
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
        except VflinkError:
            raise
        except (KeyError, TypeError, ValueError, RuntimeError) as exc:
            raise ProtocolError(f"party {self.name!r}: {source} does not fit this party's "
                                f"model ({type(exc).__name__})") from exc
        ctx.applied = set(state.get("applied", []))
        ctx.protection.load_state_dict(state.get("privacy"))
        data = state.get("data")
        ctx.loaded_data = data if isinstance(data, str) else None

    def load_saved(self, name: str, *, peer: str | None = None) -> TrainingRun:
        """This party's own saved state ``name`` as a run outside any session, for its
        operator's local tools (an attack on a run directory): from ``peer``'s folder, or the
        party's directory itself. Nothing crosses the boundary."""
        if self.out_dir is None:
            raise ProtocolError(f"party {self.name!r} has no state directory to load from")
        root = self.out_dir if peer is None else peer_root(self.out_dir, peer,
                                                           per_peer=self.peer_dirs)
        ctx = self._new_run(peer or self.name, "")
        self._load_into(ctx, state_path(root, name, party=self.name),
                        f"state {name!r} of party {self.name!r}", session=None)
        return ctx
