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

import hashlib
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import torch

from vflink.alignment import synthetic as syn
from vflink.data.featurestore import FeatureSource
from vflink.data.preprocess import Preprocessor
from vflink.data.table import PartyTable
from vflink.errors import ConfigError, PolicyViolation, ProtocolError
from vflink.models.mlp import build_mlp, build_optimizer, seeded_init
from vflink.models.spec import BottomSpec
from vflink.parties.guard import admit_forward, check_bottom_spec, check_embeddings
from vflink.parties.policy import PartyPolicy
from vflink.parties.privacy import EmbeddingProtection
from vflink.parties.recording import Recorder
from vflink.parties.setalign import SetAlignment
from vflink.parties.training_runs import TrainingRun
from vflink.privacy.label_protection import LabelProtection
from vflink.protocol.boundary import refuse
from vflink.protocol.channel import Channel
from vflink.protocol.messages import (
    Ack,
    Backward,
    Embeddings,
    SaveState,
    UnionForward,
    UnionSetup,
)
from vflink.protocol.sessions import Session, purpose_of
from vflink.randomness import NoiseSource, keyed_generator, party_secret, secret_generator

__all__ = ["BatchRecord", "UnionPeer", "UnionPrimary", "check_union_labels", "uid_rows"]

log = logging.getLogger(__name__)


def uid_rows(result: SetAlignment) -> npt.NDArray[np.int64]:
    """For each position in U, the party's own row, or -1 where it holds no record."""
    if result.method != "psu" or result.union is None or result.uid_index is None:
        raise ProtocolError("union training needs a finished PSU session")
    out = np.full(len(result.union), -1, dtype=np.int64)
    out[result.uid_index] = result.rows
    return out


_UNASSIGNED = -2


@dataclass
class _PeerUnion:
    rows: npt.NDArray[np.int64]
    #: the row that answers for each UID: our own where we hold the record, its fixed keyed
    #: source under fea-sampling, -1 where a synthetic embedding is drawn (gaussian/random)
    fill: npt.NDArray[np.int64]
    #: fea-sampling's keyed, balanced stand-ins, handed out in turn (``assign``)
    pool: npt.NDArray[np.int64]
    own_rows: npt.NDArray[np.int64]
    strategy: syn.FeatureStrategy | None
    #: fea-gaussian / fea-random draws (vflink.randomness: secret unless reproducible)
    generator: NoiseSource
    stats: syn.EmbeddingStats = field(default_factory=syn.EmbeddingStats)
    handed: int = 0

    def assign(self, uids: npt.NDArray[np.int64]) -> None:
        """Give each UID asked for the first time, that we lack, its stand-in for the session."""
        need = uids[self.fill[uids] == _UNASSIGNED]
        if need.size == 0:
            return
        first = np.unique(need, return_index=True)[1]
        new = need[np.sort(first)]  # in the order asked
        self.fill[new] = self.pool[self.handed:self.handed + len(new)]
        self.handed += len(new)


def _session_key(features: FeatureSource, session: str, seed: int, *,
                 secret: bytes | None = None) -> bytes:
    """This party's secret for the synthetic rows of one union-training session.

    Keyed by the party's long-lived ``secret`` (:func:`vflink.randomness.party_secret`, kept in
    its own state directory) and derived from the PSU session's purpose, the run seed and its
    own encoded table, so that the same stand-ins answer in every run of a session and seed (a
    peer comparing two runs' first answers cannot tell members from stand-ins) while nothing
    the peer holds or guesses predicts them: the run seed and the session come from the peer,
    and a table the peer knows (a public data set) must not be the only secret.

    Without ``secret`` (``[privacy] reproducible_noise``: not private) the key is derived from
    the table, the session and the seed only, so that a simulation repeats in one process and
    across hosts; a peer that knows the table regenerates it.
    """
    h = hashlib.blake2b(digest_size=32, person=b"vflink-union-v1",
                        key=secret if secret is not None else b"")
    # the session's purpose, not its per-run name: the same stand-ins in every run of this
    # seed, so that comparing two runs' first answers cannot tell members from stand-ins
    h.update(purpose_of(session).encode())
    h.update(int(seed).to_bytes(16, "little", signed=True))
    for chunk in features.chunks():  # the matrix's bytes in row order, a chunk at a time
        h.update(np.ascontiguousarray(chunk).tobytes())
    return h.digest()


class UnionPeer:
    """The passive party's side of union training (a mixin for SecondaryParty).

    Union training must not be a membership oracle (FLORIST): whatever the peer asks, the
    answer for a UID we do not hold looks like the answer for one we hold.

    - Nothing we compute depends on which UIDs the peer names as training UIDs: preprocessing
      is fitted, and fea-sampling draws, on all our records in U (a peer-chosen fit set of one
      UID used to change the embeddings, or be refused, exactly when we held that UID).
    - fea-sampling fills each UID we lack with one of our records chosen once per session by a
      keyed permutation (:func:`vflink.alignment.synthetic.assigned_rows`), and every row of a
      batch, real or filled, goes through the same code: the bottom model and its ReLU. Asked
      twice, with or without a model update in between, a filled UID behaves exactly as the
      record it stands for (both are fixed points of the same function); a fresh draw per call
      made real rows the only fixed points.
    - ``features = "none"`` is accepted only when we hold every UID of U, which the PSU sizes
      already tell the peer (|B| = |U|); it used to refuse forwards exactly for UIDs we lack.
    - Training forwards waiting for their Backward are bounded (``policy.max_pending_batches``).

    What remains (docs/how-to/private-set-union.md): a filled UID's embedding equals that of
    the record it copies, so a peer that sees both at one model state sees a duplicate;
    fea-gaussian and fea-random draw embeddings off the real distribution (FLORIST Table 2: no
    privacy), so a party's default policy refuses them (``policy.union_features``).
    """

    name: str
    table: PartyTable
    device: torch.device
    policy: PartyPolicy
    protection: EmbeddingProtection
    #: the party's own ``[privacy] reproducible_noise`` (not private; default: secret)
    reproducible_noise: bool
    out_dir: Path | None

    def set_alignment_with(self, session: str, peer: str
                           ) -> SetAlignment | None: ...  # from SetAlignmentPeer

    if TYPE_CHECKING:  # from SecondaryParty and Party: the run of the message being handled
        def _run(self) -> TrainingRun: ...

        def _recorder(self, ctx: TrainingRun) -> Recorder | None: ...

        def _build(self, ctx: TrainingRun, spec: BottomSpec, pre: Preprocessor) -> None: ...

        def _fit_memory(self, ctx: TrainingRun, need: int, session: Session | None
                        ) -> None: ...

        def _planned(self, ctx: TrainingRun, spec: BottomSpec, pre: Preprocessor) -> int: ...

        @property
        def session(self) -> Session: ...

    def on_union_setup(self, sender: str, message: UnionSetup) -> Ack:
        # our own limits and protections decide, not the primary's request (as SetupBottom)
        check_bottom_spec(message.spec, len(self.table.column_names), party=self.name,
                          policy=self.policy)
        if message.features not in self.policy.union_features:
            # one answer whatever the UIDs: it depends on the request and our policy only
            raise refuse(PolicyViolation,
                         f"party {self.name!r} fills union training only with "
                         f"{', '.join(self.policy.union_features)} (its policy's "
                         f"union_features); {message.features!r} was asked for",
                         code="policy.union-features")
        if self.protection.own is not None:
            raise refuse(PolicyViolation,
                         f"party {self.name!r} protects its embeddings (its [privacy] section);"
                         " union training does not apply that protection, so it refuses to "
                         "train over the union", code="policy.embeddings")
        # only a PSU session this party finished with the sender: no alignment, no rows
        result = self.set_alignment_with(message.session, sender)
        if result is None:
            raise ProtocolError(f"party {self.name!r}: no finished PSU session "
                                f"{message.session!r}")
        rows = uid_rows(result)
        fit = np.asarray(message.fit_uids, dtype=np.int64)
        if fit.ndim != 1 or (fit.size and (fit.min() < 0 or fit.max() >= len(rows))):
            raise ProtocolError(f"party {self.name!r}: UIDs outside [0, {len(rows)})")
        held = rows >= 0
        if message.features == "none" and not held.all():
            # decided by |B| < |U|, which PSU told the peer (Theorem 1): no UID is singled out
            raise refuse(ProtocolError,
                         f"party {self.name!r}: features = \"none\" needs a party that holds "
                         f"every UID of the union, and PSU showed it holds {int(held.sum())} "
                         f"of {len(rows)}; name a synthetic feature strategy "
                         f"({', '.join(syn.FEATURE_STRATEGIES.names())})",
                         code="union.features-none")
        strategy = None if message.features == "none" else \
            syn.FEATURE_STRATEGIES.get(message.features)
        # all our records in U, not those among the peer's fit UIDs: see the class docstring
        own = np.unique(rows[held]).astype(np.int64)
        if own.size == 0:
            raise ProtocolError(f"party {self.name!r}: PSU session {message.session!r} has "
                                "none of our records")
        pre = Preprocessor(self.table.schema).fit(  # own rows only, gathered
            self.table.take(own, self.table.schema.features), np.arange(len(own)))
        ctx = self._run()
        ctx.clear()  # this run's previous model goes before the new one is counted
        self._fit_memory(ctx, self._planned(ctx, message.spec, pre), self.session)
        self._build(ctx, message.spec, pre)
        if ctx.features is None:
            raise ProtocolError(f"party {self.name!r}: no encoded features after setup")
        recorder = self._recorder(ctx)
        if recorder is not None:  # what it was told (white-box attacks try the seed)
            recorder.new_training()
            recorder.note("setup", sender, {"message": message.kind,
                                            "seed": int(message.spec.seed)})
        reproducible = self.reproducible_noise
        key = _session_key(ctx.features, message.session, message.spec.seed,
                           secret=None if reproducible else party_secret(self.out_dir))
        fill = rows.copy()
        pool = np.empty(0, dtype=np.int64)
        if strategy is not None and strategy.raw and not held.all():
            # handed out in the order UIDs are first asked for, not in U's order: U's order
            # comes from PSU's secret exponents, so a run would not repeat from its seed
            fill[~held] = _UNASSIGNED
            pool = syn.assigned_rows(own, int((~held).sum()),
                                     key if reproducible else keyed_generator(key, "stand-ins"))
        ctx.union = _PeerUnion(
            rows=rows, fill=fill, pool=pool, own_rows=own, strategy=strategy,
            generator=NoiseSource(seed=int.from_bytes(key[:8], "little") >> 1)
            if reproducible else NoiseSource())
        return Ack(info={"n_features": float(pre.n_features)})

    def on_union_forward(self, sender: str, message: UnionForward) -> Embeddings:
        ctx = self._run()
        state: _PeerUnion | None = ctx.union
        model, features = ctx.model, ctx.features
        if state is None or model is None or features is None:
            raise ProtocolError(f"party {self.name!r}: UnionForward before UnionSetup")
        uids = np.asarray(message.uids, dtype=np.int64)
        if uids.ndim != 1 or (uids.size and (uids.min() < 0 or uids.max() >= len(state.rows))):
            raise ProtocolError(f"party {self.name!r}: UIDs outside [0, {len(state.rows)})")
        if message.train:  # bounded: at most policy.max_pending_batches wait for a Backward
            admit_forward(ctx.pending, ctx.pending_since, message.batch_id,
                          party=self.name, policy=self.policy)
        state.assign(uids)
        rows = state.fill[uids]
        drawn = rows < 0  # only fea-gaussian / fea-random draw embeddings
        n_drawn = int(drawn.sum())
        model.train(message.train)
        with torch.set_grad_enabled(message.train):
            if n_drawn == 0:
                # real rows and fea-sampling's stand-ins: one path, one batch, one ReLU
                out = torch.relu(model(features.rows(rows).to(self.device)).cpu())
            else:
                real_out = torch.relu(model(features.rows(rows[~drawn]).to(self.device)).cpu())
                if state.strategy is not None and state.strategy.name == "fea-gaussian":
                    fake = syn.gaussian_embeddings(real_out, n_drawn, state.generator)
                else:
                    if message.train:
                        state.stats.update(real_out)
                    fake = syn.moving_average_embeddings(state.stats, n_drawn,
                                                         real_out.shape[1], state.generator)
                out = torch.zeros((len(rows), real_out.shape[1]), dtype=real_out.dtype)
                out[torch.from_numpy(np.flatnonzero(~drawn))] = real_out
                out[torch.from_numpy(np.flatnonzero(drawn))] = fake.to(real_out.dtype)
        if message.train:
            ctx.pending[message.batch_id] = out
            recorder = self._recorder(ctx)
            if recorder is not None:  # the gradient that comes back is row-aligned with these
                recorder.forward_rows(message.batch_id, uids)
        return Embeddings(batch_id=message.batch_id, embeddings=out.detach(),
                          inverse=np.arange(len(rows), dtype=np.int64))


def check_union_labels(mode: str, strategy: syn.Strategy, *, default: bool = False) -> None:
    """Refuse a strategy whose synthetic labels a label guarantee cannot account for.

    ``label-neighbors`` gives each synthetic row the majority of the 3 nearest *real* labels
    of its batch (FLORIST §3.1 (4)), so one real label can set the synthetic label of every
    row of its batch whose neighbours include it: changing it moves its own logit gradient by
    Δ and up to m synthetic rows' by Δ each, an L2 sensitivity of √(1 + m)·Δ per batch, while
    the noise of ``dp`` is calibrated for Δ. Charging it at √(1 + m)·Δ would need noise
    √(1 + m) times larger on every row; ``dp`` refuses it instead. (``rr-prior`` is fine: the
    neighbours' labels are the randomised ones, so the synthetic labels are post-processing.)
    """
    if mode == "dp" and strategy.labels == "label-neighbors":
        which = ("the default label protection (`dp`: no `privacy.labels` key)" if default
                 else "`privacy.labels = \"dp\"`")
        raise ConfigError(
            f"{which} cannot train union strategy {strategy.name!r}: "
            "label-neighbors copies the majority of the 3 nearest real labels of a batch into "
            "its synthetic rows, so one real label can set the label of every synthetic row of "
            "its batch (sensitivity up to √(1 + m)·Δ for m synthetic rows), which the noise "
            "calibrated for one row (Δ) does not cover; use a strategy whose synthetic labels "
            "read no real label (label-majority, label-minority or label-random-pos, from a "
            "noisy rate of positives charged to the labels' budget, or label-random-pred), or "
            "`privacy.labels = \"rr-prior\"`")


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
        labels: the protection of our labels on the gradients we send (``[privacy] labels``),
            planned for ``epochs``; a synthetic label goes through it like a real one, and
            only our own records' releases are counted.
        device: where this party's own models run (``training.device``; default the CPU).
            What crosses to the peer stays on the CPU, and so do the synthetic labels (drawn
            from CPU generators, as on the CPU).
        reproducible_noise: seed the synthetic labels and our own stand-in rows from the
            model spec's seed (``[privacy] reproducible_noise``): NOT private, since the peer
            receives that seed; by default they are secret (:mod:`vflink.randomness`).
        run: this run's id, named in every training message (the peer keeps each run's
            model apart); ``""``: the primary's one run.
    """

    def __init__(self, table: PartyTable, channel: Channel, peer: str, result: SetAlignment,
                 *, strategy: syn.Strategy, calibration: syn.Calibration, spec: BottomSpec,
                 top_hidden: tuple[int, ...], fit_uids: npt.NDArray[np.int64],
                 session: str | None = None, policy: PartyPolicy | None = None,
                 labels: LabelProtection | None = None, epochs: int = 1,
                 device: torch.device | None = None, reproducible_noise: bool = False,
                 run: str = "") -> None:
        schema = table.schema
        self.device = device if device is not None else torch.device("cpu")
        if schema.label is None:
            raise ProtocolError("the active party needs a label column")
        self.channel, self.peer, self.strategy = channel, peer, strategy
        self.name = channel.name
        self.run = run
        self.policy = policy or PartyPolicy()
        self.width = spec.out_dim
        self.calibration = calibration
        self.rows = uid_rows(result)
        y = table.frame[schema.label].to_numpy(dtype=np.float32)
        own_fit = np.unique(self.rows[fit_uids][self.rows[fit_uids] >= 0])
        #: π, the rate of positives among our own training records: it fills the labels we
        #: lack and shifts the logits (App. E-G); under a label guarantee it is derived from
        #: protected releases only (``rate_protected``), never from the clean labels
        self.positive_rate = float(y[own_fit].mean()) if own_fit.size else 0.0
        self.y = torch.from_numpy(y)
        self.own_rows = own_fit.astype(np.int64)
        self.labels = labels
        #: the labels we train on (rr-prior: randomised once; ``y`` stays for evaluation)
        self.y_train = self.y
        self.rate_protected = labels is not None and labels.mode in ("dp", "rr-prior")
        if labels is not None:
            check_union_labels(labels.mode, strategy)
            if labels.mode == "dp":  # charged before the plan, whose σ leaves room for it
                self.positive_rate = labels.release_positive_rate(y[own_fit], self.own_rows)
            labels.plan(self.own_rows, epochs)
            if labels.mode == "rr-prior":
                self.y_train = labels.randomize(self.y, self.own_rows)
                self.positive_rate = labels.randomized_positive_rate()
        self.pre = Preprocessor(schema).fit(table.frame, own_fit) if schema.features else None
        self.x = torch.from_numpy(self.pre.transform(table.frame)) if self.pre else None
        # our own stand-in rows (fea-sampling, locally) and the synthetic labels: the peer
        # receives spec.seed, so they are seeded from it only when the run asked for
        # reproducible noise (not private); otherwise secret (vflink.randomness)
        if reproducible_noise:
            self.rng = np.random.default_rng([spec.seed, 202])
            self.generator = NoiseSource(seed=spec.seed * 104729 + 7)
        else:
            self.rng = secret_generator()
            self.generator = NoiseSource()
        # "none" only where nothing is hidden (baseline-full): the peer refuses it unless it
        # holds every UID. baseline-partial names its strategy's fill, which it never uses (it
        # asks only for the intersection), so that its requests look like any union run's.
        features = "none" if strategy.schedule == "full" else strategy.features
        ack = channel.request(peer, UnionSetup(session=session or result.session, spec=spec,
                                               features=features,
                                               fit_uids=fit_uids.astype(np.int64),
                                               run=run), Ack)
        del ack
        parts: dict[str, torch.nn.Module] = {}
        width = spec.out_dim
        with seeded_init(spec.seed + 1):
            if self.x is not None:
                parts["bottom"] = build_mlp(self.x.shape[1], spec.hidden, spec.out_dim,
                                            activation=spec.activation)
                width += spec.out_dim
            parts["top"] = build_mlp(width, top_hidden, 1, activation=spec.activation)
        self.model = torch.nn.ModuleDict(parts).to(self.device)  # built on the CPU, as always
        self.optimizer = build_optimizer(self.model.parameters(), spec)
        self.next_batch_id = 1
        self.records: list[BatchRecord] = []

    def _logits(self, uids: npt.NDArray[np.int64], emb: torch.Tensor) -> torch.Tensor:
        inputs = [emb.to(self.device)]  # a differentiable copy: the gradient reaches ``emb``
        if self.x is not None:
            rows = self.rows[uids].copy()
            missing = rows < 0
            if missing.any():  # our own gaps: a random own record (fea-sampling, locally)
                rows[missing] = syn.sampled_rows(self.own_rows, int(missing.sum()), self.rng)
            inputs.insert(0, self.model["bottom"](self.x[torch.from_numpy(rows)].to(
                self.device)))
        return self.model["top"](torch.cat(inputs, dim=1)).reshape(-1)

    def _forward(self, uids: npt.NDArray[np.int64], train: bool) -> torch.Tensor:
        batch_id = self.next_batch_id
        self.next_batch_id += 1
        reply = self.channel.request(self.peer, UnionForward(batch_id=batch_id, uids=uids,
                                                             train=train, run=self.run),
                                     Embeddings)
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
        y[torch.from_numpy(np.flatnonzero(held))] = self.y_train[torch.from_numpy(rows[held])]
        fake = ~held
        if fake.any():
            idx = torch.from_numpy(np.flatnonzero(fake))
            real_idx = torch.from_numpy(np.flatnonzero(held))
            ctx = syn.LabelContext(
                n=int(fake.sum()), positive_rate=self.positive_rate, generator=self.generator,
                probabilities=torch.sigmoid(logits.detach().cpu()[idx]),
                embeddings=emb.detach()[idx], real_embeddings=emb.detach()[real_idx],
                real_labels=y[real_idx], samples=self.strategy.label_samples)
            y[idx] = syn.LABEL_STRATEGIES.get(self.strategy.labels)(ctx)
        shift = self.strategy.calibration == "tr"
        loss_fn = self._shifted_loss if shift else \
            torch.nn.functional.binary_cross_entropy_with_logits
        protection = self.labels
        target = y.to(self.device)
        self.optimizer.zero_grad(set_to_none=True)
        if protection is not None and protection.mode == "dp":
            # noisy per-record logit gradients (a synthetic label's too), our own records'
            # releases counted; the shifted loss has no closed form: its sensitivity is measured
            noisy = protection.noisy_logit_gradient(logits, target, rows[held],
                                                    loss=self._shifted_loss if shift else None,
                                                    keys=rows)  # −1: a synthetic row
            loss = loss_fn(logits.detach(), target)
            logits.backward(noisy / len(uids))
        else:
            loss = loss_fn(logits, target)
            loss.backward()
        grad = emb.grad if emb.grad is not None else torch.zeros_like(emb)
        if protection is not None and protection.mode in ("marvell", "max-norm"):
            grad = protection.perturb(grad, y)
        self.channel.request(self.peer, Backward(batch_id=batch_id, grad=grad.detach(),
                                                 run=self.run), Ack)
        self.optimizer.step()
        if record:
            self.records.append(BatchRecord(
                gradients=grad.detach().numpy().copy(), embeddings=emb.detach().numpy().copy(),
                labels=y.numpy().copy(), synthetic_labels=fake.copy(), uids=uids.copy()))
        return float(loss.detach())

    def _shifted_loss(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """``-tr``: binary cross-entropy on the shifted probability a·σ(z) + b (App. E)."""
        p = syn.shift_for_training(torch.sigmoid(logits), self.calibration)
        return torch.nn.functional.binary_cross_entropy(p, y)

    def predict(self, uids: npt.NDArray[np.int64], *, batch_size: int = 4096
                ) -> npt.NDArray[np.float64]:
        """P(y = 1) per UID, with the ``-te`` shift applied when the strategy asks for it."""
        out: list[npt.NDArray[np.float64]] = []
        self.model.eval()
        for start in range(0, len(uids), batch_size):
            part = uids[start:start + batch_size]
            with torch.no_grad():
                logits = self._logits(part, self._forward(part, False))
            out.append(torch.sigmoid(logits).double().cpu().numpy())
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

    def save_peer_state(self, name: str) -> None:
        """Ask the peer to save its state of this run as ``name`` in its own folder (its
        model, and what it received when its own configuration records)."""
        self.channel.request(self.peer, SaveState(name=name, run=self.run), Ack)
