"""A secondary (passive) party: holds features, computes cut-layer embeddings on request.

Per batch it runs its bottom model once per *unique* requested row, sends the embeddings (not
the graph) and keeps the graph until the gradient for that batch comes back (FedSim Algorithm 1,
SplitNN part: the secondary's forward and backward around the primary's aggregation model).
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

__all__ = ["SecondaryParty"]

log = logging.getLogger(__name__)

#: Most classes a SetupPrivacy may announce: C of VFL-AFE Eq. 7 sizes the fuzzy c-means state.
MAX_CLASSES = 100_000
#: rows per read when counting the training rows' categories (``fields`` quantiser)
_COUNT_CHUNK = 65_536

_EPOCH_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


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


class SecondaryParty(SetAlignmentPeer, UnionPeer, LinkingPeer):
    """A data party without labels.

    Args:
        table: the party's own validated table.
        channel: how this party reaches the coordinator.
        secret: the HMAC secret shared by the data parties (not the coordinator).
        out_dir: where this party writes its own model state.
        recorder: records what this party receives (``[evaluation] record``), for attacks.
        privacy: this party's own embedding protection (VFL-AFE), from the run config
            in-process or from its party file across hosts; see :mod:`vflink.parties.privacy`.
        privacy_seed: the noise seed (this party's own; ``None``: a fresh secret one).
        resources: this party's own device and feature store (``[training]`` of its party
            file, or of the run file in-process); nothing of them reaches a peer.
    """

    role = "secondary"

    def __init__(self, table: PartyTable, channel: Channel, *, secret: bytes | None = None,
                 out_dir: Path | None = None, recorder: Recorder | None = None,
                 privacy: PrivacyConfig | None = None, privacy_seed: int | None = None,
                 roles: Mapping[str, str] | None = None,
                 policy: PartyPolicy | None = None,
                 resources: TrainingResources | None = None) -> None:
        super().__init__(table, channel, secret=secret, roles=roles, policy=policy,
                         recorder=recorder)
        self.out_dir = out_dir
        # finished set alignments are reloaded from disk when evicted or after a restart, and
        # a killed process's spools (blinded lists of a session) are removed when we start
        self.sessions.restore = self._restore_session
        if out_dir is not None:
            sweep_stale(Path(out_dir) / SPOOL_DIR)
        self.resources = resources or TrainingResources()
        # resolved here: "cuda" on a machine without CUDA fails when the party starts
        self.device = resolve_device(self.resources.device, party=table.name)
        self.spec: BottomSpec | None = None
        self.preprocessor = Preprocessor(table.schema)
        #: the encoded features, read a batch of rows at a time (in memory or mapped)
        self.features: FeatureSource | None = None
        self.model: torch.nn.Module | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self._pending: dict[int, torch.Tensor] = {}
        self._pending_since: dict[int, float] = {}  # when each pending batch arrived (expiry)
        self._applied: set[int] = set()
        self._snapshots: dict[str, dict[str, Any]] = {}
        self._fingerprint: str | None = None
        # release counts live with the data, in this party's own directory, and outlive runs
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

    # --- alignment: LinkingPeer (key confirmation, keys, encodings, the alignment view) -----

    def _note_links(self, rows: npt.NDArray[np.int64]) -> None:
        self.protection.note_links(rows)

    def on_setup_bottom(self, sender: str, message: SetupBottom) -> Ack:
        # a CNN views the party's numeric features as an image; an MLP's bound counts columns
        n_inputs = (len(self.table.schema.numeric) if message.spec.bottom == "cnn"
                    else len(self.table.column_names))
        check_bottom_spec(message.spec, n_inputs, party=self.name, policy=self.policy)
        self.spec = message.spec
        # a new training run; the data's release counts carry over (a primary must not be able
        # to reset them by repeating the setup)
        self.protection.start()
        if self.recorder is not None:
            self.recorder.new_training()
            # what this party was told: a white-box attack tries every seed it received
            self.recorder.note("setup", sender, {"message": message.kind,
                                                 "seed": int(message.spec.seed)})
        return Ack()

    def on_setup_privacy(self, sender: str, message: SetupPrivacy) -> Ack:
        classes = message.classes
        if isinstance(classes, bool) or not isinstance(classes, int) \
                or not 0 <= classes <= MAX_CLASSES:
            raise refuse(ProtocolError, f"SetupPrivacy `classes` must be an int in [0, "
                                        f"{MAX_CLASSES}] (0: regression), got {classes!r}",
                         code="privacy.classes")
        return Ack(info=self.protection.setup(message.settings, message.classes,
                                              dict(message.plan)))

    def on_fetch_privacy_report(self, sender: str, message: FetchPrivacyReport) -> PrivacyReport:
        return PrivacyReport(entries=self.protection.report())

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
        if self.spec is None:
            raise ProtocolError(f"party {self.name!r}: FitPreprocessing before SetupBottom")
        rows = np.unique(self._check_rows(message.rows, "preprocessing", sender))
        self.protection.note_train_rows(rows)
        # fitted on just the training rows, gathered (a table read in batches is never whole)
        pre = Preprocessor(self.table.schema, standardize=self.spec.standardize).fit(
            self.table.take(rows, self.table.schema.features), np.arange(len(rows)))
        self._build(self.spec, pre)
        if self.protection.wants_code_fields:
            self.protection.note_code_fields(self._code_fields(pre, rows))
        return Ack(info={"n_features": float(pre.n_features)})

    def _code_fields(self, pre: Preprocessor, rows: npt.NDArray[np.int64]
                     ) -> tuple[CodeField, ...] | None:
        """The ``fields`` quantiser's view of the encoded row: its columns, and each category's
        rank by frequency among the training ``rows`` (counted a chunk of rows at a time)."""
        columns = pre.columns()
        if not columns or self.features is None:
            return None
        sums = np.zeros(self.features.n_features, dtype=np.float64)
        for start in range(0, len(rows), _COUNT_CHUNK):
            sums += self.features.rows(rows[start:start + _COUNT_CHUNK]).double().sum(0).numpy()
        fields = []
        for start, width, categorical in columns:
            ranks = None
            if categorical:  # most frequent first; ties in the block's (sorted) order
                order = np.argsort(-sums[start:start + width], kind="stable")
                ranks = tuple(int(r) for r in np.argsort(order, kind="stable"))
            fields.append(CodeField(start, width, ranks))
        return tuple(fields)

    def _build(self, spec: BottomSpec, pre: Preprocessor) -> None:
        """Encode our rows with ``pre`` and build a fresh bottom model and optimiser."""
        self.spec = spec
        self.preprocessor = pre
        if self.features is not None:
            self.features.close()
        store = self.resources.feature_store
        # a party with no features still answers with an embedding (one zero feature)
        self.features = ConstantFeatures(len(self.table)) if pre.n_features == 0 else \
            encode_features(pre, self.table, store=store, directory=self.out_dir,
                            owner=self.name, fingerprint=self.data_fingerprint
                            if use_mmap(store, len(self.table)) else "")
        with seeded_init(spec.seed):  # built on the CPU: the same weights on every device
            model = build_bottom(spec, max(pre.n_features, 1))
        self.model = model.to(self.device)
        self.optimizer = build_optimizer(self.model.parameters(), spec)
        self._pending.clear()
        self._applied.clear()

    def on_forward(self, sender: str, message: Forward) -> Embeddings:
        if self.model is None or self.features is None:
            raise ProtocolError(f"party {self.name!r}: Forward before FitPreprocessing")
        rows = self._check_rows(message.rows, "forward", sender)
        if message.train:  # bounded: at most policy.max_pending_batches wait for a Backward
            admit_forward(self._pending, self._pending_since, message.batch_id,
                          party=self.name, policy=self.policy)
        unique, inverse = np.unique(rows, return_inverse=True)
        x = self.features.rows(unique).to(self.device)
        if message.train:
            if not self.model.training:  # train() walks every submodule: only on a change
                self.model.train()
            if self.spec is not None and self.spec.dropout > 0:
                # Dropout masks depend on (seed, batch id) only: reproducible, and the same in
                # every process layout and on every device (drawn on the CPU).
                with seeded_init(self.spec.seed * 1_000_003 + message.batch_id):
                    out = self.model(x)
            else:
                out = self.model(x)
            # back to the CPU before anything else (a differentiable copy: the gradient
            # returns to the device): protection and the message work on CPU tensors
            out = out.cpu()
            out, emb = self.protection.protect(out, unique, x.cpu())  # VFL-AFE Alg. 1 l. 6-9
            self._pending[message.batch_id] = out
            if self.recorder is not None:
                self.recorder.forward_rows(message.batch_id, unique, rows)
        else:
            if self.model.training:
                self.model.eval()
            with torch.no_grad():
                _, emb = self.protection.protect(self.model(x).cpu(), unique, x.cpu())
        return Embeddings(batch_id=message.batch_id, embeddings=emb,
                          inverse=inverse.astype(np.int64))

    def on_backward(self, sender: str, message: Backward) -> Ack:
        # shape and values are checked before the pending batch is consumed
        check_backward(self._pending, self._applied, message, party=self.name,
                       policy=self.policy)
        if message.batch_id in self._applied:  # a retried call: already applied once
            return Ack(info={"duplicate": 1.0})
        out = self._pending.pop(message.batch_id, None)
        if out is None or self.optimizer is None:
            raise ProtocolError(f"party {self.name!r}: Backward for unknown batch "
                                f"{message.batch_id}")
        if tuple(message.grad.shape) != tuple(out.shape):
            raise ProtocolError(f"party {self.name!r}: gradient shape {tuple(message.grad.shape)}"
                                f" != embedding shape {tuple(out.shape)}")
        self.optimizer.zero_grad(set_to_none=True)
        # VFL-AFE Alg. 1 line 18: the received gradient plus the local α·L_KL + β·L_CL
        self.protection.backward(out, message.grad.to(out.dtype))
        self.optimizer.step()
        self._applied.add(message.batch_id)
        if self.recorder is not None:
            self.recorder.gradients(sender, message.batch_id, message.grad)
        return Ack()

    def _state(self) -> dict[str, Any]:
        if self.model is None or self.optimizer is None:
            raise ProtocolError(f"party {self.name!r} has no model yet")
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}

    def _full_state(self) -> dict[str, Any]:
        """Everything needed to rebuild this party's model later: parameters, optimiser,
        fitted preprocessing and spec (a file for this party's own directory only)."""
        return {**self._state(), "preprocessor": self.preprocessor.to_json(),
                "spec": dataclasses.asdict(self.spec) if self.spec else None,
                "applied": sorted(self._applied), "data": self.data_fingerprint,
                "privacy": self.protection.state_dict()}

    def on_snapshot(self, sender: str, message: Snapshot) -> Ack:
        admit_snapshot(self._snapshots, message.tag, party=self.name, policy=self.policy)
        self._snapshots[message.tag] = copy.deepcopy(self._state())
        return Ack()

    def on_restore(self, sender: str, message: Restore) -> Ack:
        state = self._snapshots.get(message.tag)
        if state is None:
            raise ProtocolError(f"party {self.name!r}: no snapshot {message.tag!r}")
        model = self.model
        optimizer = self.optimizer
        if model is None or optimizer is None:
            raise ProtocolError(f"party {self.name!r} has no model yet")
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        return Ack()

    def on_save_state(self, sender: str, message: SaveState) -> Ack:
        if self.out_dir is None:  # a silent no-op would fail only later, at LoadState
            raise ProtocolError(f"party {self.name!r} has no state directory to save to")
        target = state_path(self.out_dir, message.name)  # never outside our own directory
        if not state_json_path(target.parent, target.name).exists():
            # a peer names the file: bound how many distinct states it can make us keep (disk)
            kept = sum(1 for _ in self.out_dir.rglob("*.json"))
            if kept >= self.policy.max_saved_states:
                raise refuse(PolicyViolation,
                             f"party {self.name!r} already keeps {kept} saved states (its "
                             "limit, policy.max_saved_states); save under an existing name",
                             code="limit.saved-states")
        # weights as safetensors, the rest as JSON, committed atomically (models/statefile.py)
        save_state(target.parent, target.name, self._full_state(), kind="secondary")
        _prune_checkpoints(target)
        if self.recorder is not None:
            self.recorder.flush(target.parent, party=self.name, role=self.role)
        return Ack(info={"saved": 1.0})

    def on_load_state(self, sender: str, message: LoadState) -> Ack:
        if self.out_dir is None:
            raise ProtocolError(f"party {self.name!r} has no state directory to load from")
        path = state_path(self.out_dir, message.name)
        # tensors from safetensors and the rest from JSON: nothing is unpickled
        source = f"state {message.name!r} of party {self.name!r}"
        try:
            state = load_state(path.parent, path.name, kind="secondary")
        except StateFileError as exc:
            # the peer learns which check failed, never this party's paths
            raise refuse(StateFileError, f"party {self.name!r}: saved {source}: {exc.reason}",
                         code="state-file", detail=str(exc)) from None
        try:
            spec = BottomSpec(**state["spec"])
            pre = Preprocessor.from_json(state["preprocessor"], self.table.schema, source=source)
            self._build(spec, pre)
            model, optimizer = self.model, self.optimizer
            if model is None or optimizer is None:
                raise ProtocolError(f"party {self.name!r}: failed to rebuild the model")
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
        except VflinkError:
            raise
        except (KeyError, TypeError, ValueError, RuntimeError) as exc:
            raise ProtocolError(f"party {self.name!r}: {source} does not fit this party's "
                                f"model ({type(exc).__name__})") from exc
        self._applied = set(state.get("applied", []))
        self.protection.load_state_dict(state.get("privacy"))
        # Only whether our data changed since the save crosses the boundary (never the hash):
        # the primary refuses to resume a run on changed data (vflink.runner.resume).
        changed = state.get("data") != self.data_fingerprint
        return Ack(info={"n_features": float(self.preprocessor.n_features),
                         "data_changed": float(changed)})
