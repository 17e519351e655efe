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
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from vflink.alignment.exact import key_digests
from vflink.data.preprocess import Preprocessor
from vflink.data.table import PartyTable
from vflink.errors import ProtocolError
from vflink.models.mlp import build_mlp, build_optimizer, seeded_init
from vflink.models.spec import BottomSpec
from vflink.parties.base import Party, state_path
from vflink.parties.linking import encode_identifiers
from vflink.protocol.channel import Channel
from vflink.protocol.messages import (
    Ack,
    AlignmentReady,
    AlignmentView,
    Backward,
    Embeddings,
    FetchAlignment,
    FitPreprocessing,
    Forward,
    IdentifierEncodings,
    KeyDigests,
    LoadState,
    Restore,
    SaveState,
    SetupBottom,
    ShareEncodings,
    ShareKeys,
    Snapshot,
)
from vflink.types import MISSING

__all__ = ["SecondaryParty"]

log = logging.getLogger(__name__)

_EPOCH_CHECKPOINT = re.compile(r"^checkpoint-(\d+)\.pt$")


def _prune_checkpoints(latest: Path) -> None:
    """Keep the latest two per-epoch checkpoints: the primary's commit point refers to one of
    them even if it died between our write and its own."""
    m = _EPOCH_CHECKPOINT.match(latest.name)
    if m is None:
        return
    current = int(m.group(1))
    for old in latest.parent.glob("checkpoint-*.pt"):
        mo = _EPOCH_CHECKPOINT.match(old.name)
        if mo is not None and int(mo.group(1)) < current - 1:
            old.unlink(missing_ok=True)


class SecondaryParty(Party):
    """A data party without labels.

    Args:
        table: the party's own validated table.
        channel: how this party reaches the coordinator.
        secret: the HMAC secret shared by the data parties (not the coordinator).
        out_dir: where this party writes its own model state.
    """

    role = "secondary"

    def __init__(self, table: PartyTable, channel: Channel, *, secret: bytes | None = None,
                 out_dir: Path | None = None) -> None:
        super().__init__(table.name)
        self.table = table
        self.channel = channel
        self._secret = secret
        self.out_dir = out_dir
        self.spec: BottomSpec | None = None
        self.preprocessor = Preprocessor(table.schema)
        self.linked_rows: npt.NDArray[np.bool_] | None = None
        self.features: torch.Tensor | None = None
        self.model: torch.nn.Module | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self._pending: dict[int, torch.Tensor] = {}
        self._applied: set[int] = set()
        self._snapshots: dict[str, dict[str, Any]] = {}

    # --- alignment ------------------------------------------------------------------------

    def on_share_keys(self, sender: str, message: ShareKeys) -> Ack:
        if self._secret is None:
            raise ProtocolError(f"party {self.name!r} has no alignment secret configured")
        digests = key_digests(self.table.frame, self.table.schema.key, self._secret)
        self.channel.request(message.coordinator, KeyDigests(session=message.session,
                                                             digests=digests), Ack)
        return Ack(info={"rows": float(len(digests))})

    def on_share_encodings(self, sender: str, message: ShareEncodings) -> Ack:
        values = encode_identifiers(self.table.frame, self.table.schema.identifiers,
                                    message.spec, self._secret, source=self.table.source)
        self.channel.request(message.coordinator, IdentifierEncodings(
            session=message.session, encoder=message.spec.encoder, values=values), Ack)
        return Ack(info={"rows": float(len(values))})

    def on_alignment_ready(self, sender: str, message: AlignmentReady) -> Ack:
        view = self.channel.request(message.coordinator, FetchAlignment(session=message.session),
                                    AlignmentView)
        self.set_linked_rows(view.secondary_index)
        return Ack(info={"linked_rows": float(self.linked_rows.sum())})  # type: ignore[union-attr]

    def set_linked_rows(self, secondary_index: npt.NDArray[np.int64]) -> None:
        """Remember which of our rows are linked; requests for other rows are refused."""
        idx = np.asarray(secondary_index).ravel()
        idx = idx[idx != MISSING]
        if idx.size and (idx.min() < 0 or idx.max() >= len(self.table)):
            raise ProtocolError(f"party {self.name!r}: alignment refers to rows outside "
                                f"[0, {len(self.table)})")
        mask = np.zeros(len(self.table), dtype=bool)
        mask[idx] = True
        self.linked_rows = mask

    # --- model ----------------------------------------------------------------------------

    def on_setup_bottom(self, sender: str, message: SetupBottom) -> Ack:
        self.spec = message.spec
        return Ack()

    def _check_rows(self, rows: npt.NDArray[np.int64], what: str) -> npt.NDArray[np.int64]:
        rows = np.asarray(rows, dtype=np.int64)
        if rows.ndim != 1:
            raise ProtocolError(f"party {self.name!r}: {what} rows must be 1-D")
        if rows.size and (rows.min() < 0 or rows.max() >= len(self.table)):
            raise ProtocolError(f"party {self.name!r}: {what} rows outside [0, {len(self.table)})")
        if self.linked_rows is not None and rows.size and not self.linked_rows[rows].all():
            # Only rows the coordinator linked may be used: the primary cannot probe others.
            raise ProtocolError(f"party {self.name!r}: {what} asks for rows that the alignment "
                                "did not link")
        return rows

    def on_fit_preprocessing(self, sender: str, message: FitPreprocessing) -> Ack:
        if self.spec is None:
            raise ProtocolError(f"party {self.name!r}: FitPreprocessing before SetupBottom")
        rows = np.unique(self._check_rows(message.rows, "preprocessing"))
        pre = Preprocessor(self.table.schema, standardize=self.spec.standardize).fit(
            self.table.frame, rows)
        self._build(self.spec, pre)
        return Ack(info={"n_features": float(pre.n_features)})

    def _build(self, spec: BottomSpec, pre: Preprocessor) -> None:
        """Encode our rows with ``pre`` and build a fresh bottom model and optimiser."""
        self.spec = spec
        self.preprocessor = pre
        self.features = torch.from_numpy(pre.transform(self.table.frame))
        if pre.n_features == 0:  # a party with no features still answers with an embedding
            self.features = torch.zeros(len(self.table), 1)
        with seeded_init(spec.seed):
            self.model = build_mlp(max(pre.n_features, 1), spec.hidden, spec.out_dim,
                                   activation=spec.activation, dropout=spec.dropout)
        self.optimizer = build_optimizer(self.model.parameters(), spec)
        self._pending.clear()
        self._applied.clear()

    def on_forward(self, sender: str, message: Forward) -> Embeddings:
        if self.model is None or self.features is None:
            raise ProtocolError(f"party {self.name!r}: Forward before FitPreprocessing")
        rows = self._check_rows(message.rows, "forward")
        unique, inverse = np.unique(rows, return_inverse=True)
        x = self.features[torch.from_numpy(unique)]
        if message.train:
            if not self.model.training:  # train() walks every submodule: only on a change
                self.model.train()
            if self.spec is not None and self.spec.dropout > 0:
                # Dropout masks depend on (seed, batch id) only: reproducible, and the same in
                # every process layout.
                with seeded_init(self.spec.seed * 1_000_003 + message.batch_id):
                    out = self.model(x)
            else:
                out = self.model(x)
            self._pending[message.batch_id] = out
            emb = out.detach()
        else:
            if self.model.training:
                self.model.eval()
            with torch.no_grad():
                emb = self.model(x)
        return Embeddings(batch_id=message.batch_id, embeddings=emb,
                          inverse=inverse.astype(np.int64))

    def on_backward(self, sender: str, message: Backward) -> Ack:
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
        out.backward(message.grad.to(out.dtype))
        self.optimizer.step()
        self._applied.add(message.batch_id)
        return Ack()

    def _state(self) -> dict[str, Any]:
        if self.model is None or self.optimizer is None:
            raise ProtocolError(f"party {self.name!r} has no model yet")
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}

    def _full_state(self) -> dict[str, Any]:
        """Everything needed to rebuild this party's model later: parameters, optimiser,
        fitted preprocessing and spec (a file for this party's own directory only)."""
        return {**self._state(), "preprocessor": self.preprocessor,
                "spec": dataclasses.asdict(self.spec) if self.spec else None,
                "applied": sorted(self._applied)}

    def on_snapshot(self, sender: str, message: Snapshot) -> Ack:
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
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(target.name + ".tmp")
        torch.save(self._full_state(), tmp)
        tmp.replace(target)  # atomic: a crash never leaves a half-written state file
        _prune_checkpoints(target)
        return Ack(info={"saved": 1.0})

    def on_load_state(self, sender: str, message: LoadState) -> Ack:
        if self.out_dir is None:
            raise ProtocolError(f"party {self.name!r} has no state directory to load from")
        path = state_path(self.out_dir, message.name)
        if not path.is_file():
            raise ProtocolError(f"party {self.name!r}: no saved state {path}")
        # Our own file, written by on_save_state: it holds the fitted preprocessing objects,
        # so it is loaded with pickle support (never load a state file from elsewhere).
        state = torch.load(path, weights_only=False)
        self._build(BottomSpec(**state["spec"]), state["preprocessor"])
        model, optimizer = self.model, self.optimizer
        if model is None or optimizer is None:
            raise ProtocolError(f"party {self.name!r}: failed to rebuild the model")
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        self._applied = set(state.get("applied", []))
        return Ack(info={"n_features": float(self.preprocessor.n_features)})
