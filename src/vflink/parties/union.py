"""Training over the PSU union (FLORIST §2.3-2.4, App. D), as party state machines.

Both parties schedule mini-batches over positions in the sorted UID list U. The passive party
(:class:`UnionPeer`, mixed into :class:`~vflink.parties.SecondaryParty`) answers a
:class:`~vflink.protocol.messages.UnionForward` with one cut-layer embedding per requested UID:
its bottom model on its real record where it holds one, otherwise a synthetic row from the
configured strategy. As in FLORIST §3 and App. J the cut layer is the output of a ReLU layer
(the bottom model's last linear layer followed by a ReLU). The active party
(:class:`UnionPrimary`) feeds its real label where it holds the record and a synthetic label
otherwise, optionally shifts the logits (App. E-G), and returns the gradients with
:class:`~vflink.protocol.messages.Backward`. Neither party learns which UIDs the other holds
beyond what the embeddings and gradients reveal, which the spectral attack measures (App. C).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from vflink.alignment import synthetic as syn
from vflink.data.preprocess import Preprocessor
from vflink.data.table import PartyTable
from vflink.errors import PolicyViolation, ProtocolError
from vflink.models.mlp import build_mlp, build_optimizer, seeded_init
from vflink.models.spec import BottomSpec
from vflink.parties.guard import admit_forward, check_bottom_spec, check_embeddings
from vflink.parties.policy import PartyPolicy
from vflink.parties.privacy import EmbeddingProtection
from vflink.parties.setalign import SetAlignment
from vflink.protocol.boundary import refuse
from vflink.protocol.channel import Channel
from vflink.protocol.messages import (
    Ack,
    Backward,
    Embeddings,
    UnionForward,
    UnionSetup,
)

__all__ = ["BatchRecord", "UnionPeer", "UnionPrimary", "uid_rows"]

log = logging.getLogger(__name__)


def uid_rows(result: SetAlignment) -> npt.NDArray[np.int64]:
    """For each position in U, the party's own row, or -1 where it holds no record."""
    if result.method != "psu" or result.union is None or result.uid_index is None:
        raise ProtocolError("union training needs a finished PSU session")
    out = np.full(len(result.union), -1, dtype=np.int64)
    out[result.uid_index] = result.rows
    return out


@dataclass
class _PeerUnion:
    rows: npt.NDArray[np.int64]
    own_rows: npt.NDArray[np.int64]
    strategy: syn.FeatureStrategy | None
    rng: np.random.Generator
    generator: torch.Generator
    stats: syn.EmbeddingStats = field(default_factory=syn.EmbeddingStats)


class UnionPeer:
    """The passive party's side of union training (a mixin for SecondaryParty)."""

    name: str
    table: PartyTable
    spec: BottomSpec | None
    preprocessor: Preprocessor
    features: torch.Tensor | None
    model: torch.nn.Module | None
    optimizer: torch.optim.Optimizer | None
    policy: PartyPolicy
    protection: EmbeddingProtection
    _pending: dict[int, torch.Tensor]
    _pending_since: dict[int, float]

    def set_alignment(self, session: str) -> SetAlignment | None: ...  # from SetAlignmentPeer

    def _build(self, spec: BottomSpec, pre: Preprocessor) -> None: ...  # from SecondaryParty

    def on_union_setup(self, sender: str, message: UnionSetup) -> Ack:
        # our own limits and protections decide, not the primary's request (as SetupBottom)
        check_bottom_spec(message.spec, len(self.table.frame.columns), party=self.name,
                          policy=self.policy)
        if self.protection.own is not None:
            raise refuse(PolicyViolation,
                         f"party {self.name!r} protects its embeddings (its [privacy] section);"
                         " union training does not apply that protection, so it refuses to "
                         "train over the union", code="policy.embeddings")
        result = self.set_alignment(message.session)
        if result is None:
            raise ProtocolError(f"party {self.name!r}: no finished PSU session "
                                f"{message.session!r}")
        rows = uid_rows(result)
        fit = np.asarray(message.fit_uids, dtype=np.int64)
        if fit.size and (fit.min() < 0 or fit.max() >= len(rows)):
            raise ProtocolError(f"party {self.name!r}: UIDs outside [0, {len(rows)})")
        own = np.unique(rows[fit][rows[fit] >= 0])
        if own.size == 0:
            raise ProtocolError(f"party {self.name!r}: none of the training UIDs is ours")
        strategy = None if message.features == "none" else \
            syn.FEATURE_STRATEGIES.get(message.features)
        pre = Preprocessor(self.table.schema).fit(self.table.frame, own)
        self._build(message.spec, pre)
        seed = message.spec.seed
        self.__dict__["_union_"] = _PeerUnion(
            rows=rows, own_rows=own.astype(np.int64), strategy=strategy,
            rng=np.random.default_rng([seed, 101]),
            generator=torch.Generator().manual_seed(seed * 7919 + 13))
        return Ack(info={"n_features": float(pre.n_features)})

    def on_union_forward(self, sender: str, message: UnionForward) -> Embeddings:
        state: _PeerUnion | None = self.__dict__.get("_union_")
        model, features = self.model, self.features
        if state is None or model is None or features is None:
            raise ProtocolError(f"party {self.name!r}: UnionForward before UnionSetup")
        uids = np.asarray(message.uids, dtype=np.int64)
        if uids.ndim != 1 or (uids.size and (uids.min() < 0 or uids.max() >= len(state.rows))):
            raise ProtocolError(f"party {self.name!r}: UIDs outside [0, {len(state.rows)})")
        rows = state.rows[uids]
        real = rows >= 0
        n_fake = int((~real).sum())
        if n_fake and state.strategy is None:
            raise ProtocolError(f"party {self.name!r}: asked for UIDs it does not hold with no "
                                "synthetic feature strategy")
        if message.train:  # bounded like any training forward (policy.max_pending_batches)
            admit_forward(self._pending, self._pending_since, message.batch_id,
                          party=self.name, policy=self.policy)
        model.train(message.train)
        with torch.set_grad_enabled(message.train):
            if state.strategy is None or state.strategy.raw or n_fake == 0:
                filled = rows.copy()
                if n_fake:  # fea-sampling: a random real record of ours per missing UID
                    filled[~real] = syn.sampled_rows(state.own_rows, n_fake, state.rng)
                out = torch.relu(model(features[torch.from_numpy(filled)]))
            else:
                real_out = torch.relu(model(features[torch.from_numpy(rows[real])]))
                if state.strategy.name == "fea-gaussian":
                    fake = syn.gaussian_embeddings(real_out, n_fake, state.generator)
                else:
                    if message.train:
                        state.stats.update(real_out)
                    fake = syn.moving_average_embeddings(state.stats, n_fake,
                                                         real_out.shape[1], state.generator)
                out = torch.zeros((len(rows), real_out.shape[1]), dtype=real_out.dtype)
                out[torch.from_numpy(np.flatnonzero(real))] = real_out
                out[torch.from_numpy(np.flatnonzero(~real))] = fake.to(real_out.dtype)
        if message.train:
            self._pending[message.batch_id] = out
        return Embeddings(batch_id=message.batch_id, embeddings=out.detach(),
                          inverse=np.arange(len(rows), dtype=np.int64))


@dataclass
class BatchRecord:
    """What crossed in one training batch, kept for the spectral attack (App. C): the
    gradients the passive party received, the embeddings the active one received, the labels
    used, and evaluation-only truth of which rows were synthetic on each side."""

    gradients: npt.NDArray[np.float32]
    embeddings: npt.NDArray[np.float32]
    labels: npt.NDArray[np.float32]
    synthetic_labels: npt.NDArray[np.bool_]
    uids: npt.NDArray[np.int64]


class UnionPrimary:
    """The active party's side of union training.

    Args:
        table: the primary's table (label, optional features).
        channel: its channel; ``peer`` the passive party.
        result: its own PSU output.
        strategy: the named FLORIST strategy.
        calibration: the logits shift to apply (identity when the strategy has none).
        spec: public hyperparameters of the peer's bottom model (also used for ours).
        fit_uids: the training UIDs (positions in U).
        policy: this party's limits on what it accepts (values of received embeddings).
    """

    def __init__(self, table: PartyTable, channel: Channel, peer: str, result: SetAlignment,
                 *, strategy: syn.Strategy, calibration: syn.Calibration, spec: BottomSpec,
                 top_hidden: tuple[int, ...], fit_uids: npt.NDArray[np.int64],
                 session: str = "psu", policy: PartyPolicy | None = None) -> None:
        schema = table.schema
        if schema.label is None:
            raise ProtocolError("the active party needs a label column")
        self.channel, self.peer, self.strategy = channel, peer, strategy
        self.name = channel.name
        self.policy = policy or PartyPolicy()
        self.width = spec.out_dim
        self.calibration = calibration
        self.rows = uid_rows(result)
        y = table.frame[schema.label].to_numpy(dtype=np.float32)
        own_fit = np.unique(self.rows[fit_uids][self.rows[fit_uids] >= 0])
        self.positive_rate = float(y[own_fit].mean()) if own_fit.size else 0.0
        self.y = torch.from_numpy(y)
        self.own_rows = own_fit.astype(np.int64)
        self.pre = Preprocessor(schema).fit(table.frame, own_fit) if schema.features else None
        self.x = torch.from_numpy(self.pre.transform(table.frame)) if self.pre else None
        self.rng = np.random.default_rng([spec.seed, 202])
        self.generator = torch.Generator().manual_seed(spec.seed * 104729 + 7)
        ack = channel.request(peer, UnionSetup(session=session, spec=spec,
                                               features=strategy.features if strategy.schedule
                                               == "union" else "none",
                                               fit_uids=fit_uids.astype(np.int64)), Ack)
        del ack
        parts: dict[str, torch.nn.Module] = {}
        width = spec.out_dim
        with seeded_init(spec.seed + 1):
            if self.x is not None:
                parts["bottom"] = build_mlp(self.x.shape[1], spec.hidden, spec.out_dim,
                                            activation=spec.activation)
                width += spec.out_dim
            parts["top"] = build_mlp(width, top_hidden, 1, activation=spec.activation)
        self.model = torch.nn.ModuleDict(parts)
        self.optimizer = build_optimizer(self.model.parameters(), spec)
        self.next_batch_id = 1
        self.records: list[BatchRecord] = []

    def _logits(self, uids: npt.NDArray[np.int64], emb: torch.Tensor) -> torch.Tensor:
        inputs = [emb]
        if self.x is not None:
            rows = self.rows[uids].copy()
            missing = rows < 0
            if missing.any():  # our own gaps: a random own record (fea-sampling, locally)
                rows[missing] = syn.sampled_rows(self.own_rows, int(missing.sum()), self.rng)
            inputs.insert(0, self.model["bottom"](self.x[torch.from_numpy(rows)]))
        return self.model["top"](torch.cat(inputs, dim=1)).reshape(-1)

    def _forward(self, uids: npt.NDArray[np.int64], train: bool) -> torch.Tensor:
        batch_id = self.next_batch_id
        self.next_batch_id += 1
        reply = self.channel.request(self.peer, UnionForward(batch_id=batch_id, uids=uids,
                                                             train=train), Embeddings)
        if reply.batch_id != batch_id:
            raise ProtocolError(f"{self.peer!r} answered batch {reply.batch_id}; expected "
                                f"{batch_id}")
        # numbers are checked where they arrive, before they touch our model
        check_embeddings(reply, requested=len(uids), width=self.width, party=self.name,
                         peer=self.peer, policy=self.policy)
        return reply.embeddings.detach().float()[torch.from_numpy(reply.inverse)]

    def train_step(self, uids: npt.NDArray[np.int64], *, record: bool = False) -> float:
        batch_id = self.next_batch_id
        emb = self._forward(uids, True).detach().requires_grad_(True)
        self.model.train()
        logits = self._logits(uids, emb)
        rows = self.rows[uids]
        held = rows >= 0
        y = torch.zeros(len(uids))
        y[torch.from_numpy(np.flatnonzero(held))] = self.y[torch.from_numpy(rows[held])]
        fake = ~held
        if fake.any():
            idx = torch.from_numpy(np.flatnonzero(fake))
            real_idx = torch.from_numpy(np.flatnonzero(held))
            ctx = syn.LabelContext(
                n=int(fake.sum()), positive_rate=self.positive_rate, generator=self.generator,
                probabilities=torch.sigmoid(logits.detach()[idx]),
                embeddings=emb.detach()[idx], real_embeddings=emb.detach()[real_idx],
                real_labels=y[real_idx], samples=self.strategy.label_samples)
            y[idx] = syn.LABEL_STRATEGIES.get(self.strategy.labels)(ctx)
        if self.strategy.calibration == "tr":
            p = syn.shift_for_training(torch.sigmoid(logits), self.calibration)
            loss = torch.nn.functional.binary_cross_entropy(p, y)
        else:
            loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, y)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad = emb.grad if emb.grad is not None else torch.zeros_like(emb)
        self.channel.request(self.peer, Backward(batch_id=batch_id, grad=grad.detach()), Ack)
        self.optimizer.step()
        if record:
            self.records.append(BatchRecord(
                gradients=grad.detach().numpy().copy(), embeddings=emb.detach().numpy().copy(),
                labels=y.numpy().copy(), synthetic_labels=fake.copy(), uids=uids.copy()))
        return float(loss.detach())

    def predict(self, uids: npt.NDArray[np.int64], *, batch_size: int = 4096
                ) -> npt.NDArray[np.float64]:
        """P(y = 1) per UID, with the ``-te`` shift applied when the strategy asks for it."""
        out: list[npt.NDArray[np.float64]] = []
        self.model.eval()
        for start in range(0, len(uids), batch_size):
            part = uids[start:start + batch_size]
            with torch.no_grad():
                logits = self._logits(part, self._forward(part, False))
            out.append(torch.sigmoid(logits).double().numpy())
        p = np.concatenate(out) if out else np.empty(0)
        if self.strategy.calibration == "te":
            p = syn.shift_for_test(p, self.calibration)
        return p

    def labels_of(self, uids: npt.NDArray[np.int64]) -> npt.NDArray[np.float32]:
        rows = self.rows[uids]
        if (rows < 0).any():
            raise ProtocolError("evaluation UIDs must be records we hold")
        return self.y.numpy()[rows]

    def state(self) -> dict[str, Any]:
        return {"model": self.model.state_dict()}
