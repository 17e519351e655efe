"""The primary (active) party: holds the labels and drives alignment and training.

Training follows FedSim Algorithm 1 without the gates, i.e. plain SplitNN: per batch each
secondary sends cut-layer embeddings of its linked rows, the primary runs its own bottom model
and the aggregation model, computes the loss, updates its parameters, and returns to each
secondary the gradient of the loss with respect to the embeddings it sent.

Those gradients carry the primary's labels; ``[privacy] labels`` protects them here, in the
primary's own process, before any gradient leaves it
(:class:`~vflink.privacy.label_protection.LabelProtection`): ``dp`` replaces the loss's backward
pass by the noisy per-record logit gradients, ``marvell`` and ``max-norm`` perturb each
secondary's per-slot gradient rows, ``rr-prior`` trains on labels randomised once.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from vflink.data.featurestore import FeatureSource, encode_features, use_mmap
from vflink.data.fingerprint import frame_fingerprint
from vflink.data.labels import LabelCodec
from vflink.data.preprocess import Preprocessor
from vflink.data.table import PartyTable
from vflink.errors import ConfigError, DataError, ProtocolError, VflinkError
from vflink.models.device import resolve_device
from vflink.models.merge import AggregatorConfig
from vflink.models.mlp import build_optimizer, seeded_init
from vflink.models.spec import BottomSpec
from vflink.models.splitnn import SplitNNPrimary
from vflink.models.statefile import load_state, save_state, state_json_path
from vflink.parties.base import Party
from vflink.parties.guard import check_embeddings
from vflink.parties.linking import AlignmentInitiator
from vflink.parties.policy import PartyPolicy
from vflink.parties.recording import Recorder
from vflink.parties.resources import TrainingResources
from vflink.privacy.budget import BUDGET_DIR, ReleaseBudget
from vflink.privacy.label_protection import LabelProtection, resolve_settings
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
from vflink.types import MISSING, Alignment, Task

__all__ = ["PrimaryParty", "TrainingPlan"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelInputs:
    """One evaluation chunk's model inputs: the primary's rows, its features, each
    secondary's embeddings (B, K, d_j), the similarities and the valid-slot mask."""

    rows: npt.NDArray[np.int64]
    x: torch.Tensor
    secondary: tuple[torch.Tensor, ...]
    sim: torch.Tensor
    mask: torch.Tensor


@dataclass(frozen=True, kw_only=True)
class TrainingPlan:
    """What the primary needs to set up training (all public hyperparameters).

    ``aggregator`` picks how the K linked pairs of a record are merged (``top1sim``: plain
    SplitNN on the top-1 link; ``fedsim``: FedSim's gates; see :mod:`vflink.models.merge`).
    """

    bottom: BottomSpec
    top_hidden: tuple[int, ...] = (100,)
    learn_missing: bool = False
    eval_batch_size: int = 4096
    aggregator: str = "top1sim"
    k: int = 1
    aggregator_config: AggregatorConfig | None = None
    pair_dim: int = 10
    #: public settings of the secondaries' embedding protection (VFL-AFE), None when off
    privacy: dict[str, Any] | None = None
    #: the primary's own protection of its labels (never announced), None when off
    labels: dict[str, Any] | None = None


@dataclass
class _Slots:
    """One secondary's embeddings of a training batch, one row per linked (record, k) pair
    (``gathered``, gradient retained), the unique row each came from (``inverse``) and the
    batch position of its record (``owners``)."""

    name: str
    gathered: torch.Tensor
    inverse: npt.NDArray[np.int64]
    owners: npt.NDArray[np.int64]

    def perturbed(self, protection: LabelProtection, labels: torch.Tensor,
                  unperturbed: torch.Tensor) -> torch.Tensor:
        """The gradient of the secondary's unique rows: each slot's row perturbed with its
        record's label, then summed per unique row (as the gather's backward pass sums)."""
        grad = self.gathered.grad
        if grad is None:
            return unperturbed
        rows = protection.perturb(grad.detach().cpu(), labels.cpu())
        out = torch.zeros_like(unperturbed)
        return out.index_add_(0, torch.from_numpy(self.inverse), rows.to(out.dtype))


class PrimaryParty(Party):
    """The party that holds the labels.

    Args:
        table: the primary's validated table (with label and task).
        channel: how the primary reaches the secondaries and the coordinator.
        secondaries: names of the secondary parties, in a fixed order.
        secret: HMAC secret shared by the data parties (exact alignment).
        out_dir: where the primary writes its own model state.
        recorder: records what this party receives (``[evaluation] record``), for attacks.
        resources: this party's own device and feature store (``training.device``,
            ``training.feature_store``); embeddings and gradients cross as CPU tensors.
        budget_dir: where the release counts of its labels are kept (``[privacy] labels``),
            keyed by its data's fingerprint; default ``out_dir/_privacy-budget``, ``None``
            without ``out_dir``: in memory for this object's life.
        run: this run's id, named in every training message: a secondary keeps each run of
            each primary apart (its own model and states); ``""``: the primary's one run.
    """

    role = "primary"

    def __init__(self, table: PartyTable, channel: Channel, *, secondaries: Sequence[str] = (),
                 secret: bytes | None = None, out_dir: Path | None = None,
                 recorder: Recorder | None = None, roles: Mapping[str, str] | None = None,
                 policy: PartyPolicy | None = None,
                 resources: TrainingResources | None = None,
                 budget_dir: Path | None = None, run: str = "") -> None:
        super().__init__(table.name, roles=roles, policy=policy)
        self.run = run
        self.resources = resources or TrainingResources()
        self.device = resolve_device(self.resources.device, party=table.name)
        self.recorder = recorder
        schema = table.schema
        if schema.role != "primary" or schema.label is None or schema.task is None:
            raise ConfigError(f"party {table.name!r} is not a primary party with a label")
        self.table = table
        self.task: Task = schema.task
        self.channel = channel
        self.secondaries = tuple(secondaries)
        self._secret = secret
        self.out_dir = out_dir
        self.links: dict[str, npt.NDArray[np.int64]] = {}
        self.similarity: npt.NDArray[np.float32] | None = None
        self.model: SplitNNPrimary | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.codec = LabelCodec(self.task)
        #: the encoded features, read a batch of rows at a time (in memory or mapped)
        self._x: FeatureSource | None = None
        self._y: torch.Tensor | None = None
        self._plan: TrainingPlan | None = None
        self._dims: list[int] = []
        self.preprocessor = Preprocessor(table.schema)
        #: id of the next batch; batch ids let a secondary ignore a retried step
        self.next_batch_id = 1
        self._snapshots: dict[str, dict[str, Any]] = {}
        #: the protection of the labels on the gradients sent (``[privacy] labels``)
        self.label_protection: LabelProtection | None = None
        self._label_budget: ReleaseBudget | None = None
        self._budget_dir = budget_dir if budget_dir is not None else (
            None if out_dir is None else out_dir / BUDGET_DIR)

    @property
    def labels(self) -> Any:
        return self.table.frame[self.table.schema.label]

    # --- alignment ------------------------------------------------------------------------

    def initiator(self) -> AlignmentInitiator:
        """The alignment driver for this party's records (exact keys or soft linkage)."""
        schema = self.table.schema
        return AlignmentInitiator(self.name, self.table.frame, self.channel,
                                  secondaries=self.secondaries, key=schema.key,
                                  identifiers=schema.identifiers, secret=self._secret,
                                  source=self.table.source, policy=self.policy)

    def align_exact(self, coordinator: str, session: str = "exact") -> dict[str, Alignment]:
        """Exact-key alignment through ``coordinator`` with keyed hashes (HMAC).

        Only digests reach the coordinator; the coordinator returns indices to every party.
        """
        return self.initiator().align_exact(coordinator, session)

    def set_alignments(self, alignments: Mapping[str, Alignment], *, k: int | None = None
                       ) -> None:
        """Use these alignments (one per secondary) for training and prediction.

        ``k`` keeps the ``k`` most similar links of each record (all by default). The
        similarities of the first secondary's alignment drive the gates (the other secondaries
        are linked one-to-one to it, FedSim App. C).
        """
        missing = [s for s in self.secondaries if s not in alignments]
        if missing:
            raise ConfigError(f"no alignment for secondary parties {missing}")
        n = len(self.table)
        self.links = {s: alignments[s].for_primary_rows(n)[:, :k] for s in self.secondaries}
        self.similarity = None
        if self.secondaries:
            anchor = alignments[self.secondaries[0]]
            if anchor.similarity is not None:
                dense = np.zeros((n, anchor.k), dtype=np.float32)
                dense[anchor.primary_index] = anchor.similarity
                self.similarity = dense[:, :k]
        if self.recorder is not None:
            for s in self.secondaries:
                a = alignments[s]
                self.recorder.whole("indices", s, a.primary_index, a.secondary_index)
            first = alignments[self.secondaries[0]] if self.secondaries else None
            if first is not None and first.similarity is not None:
                self.recorder.whole("similarities", first.secondary, first.primary_index,
                                    first.similarity, meta=dict(first.meta))

    # --- training -------------------------------------------------------------------------

    def setup(self, plan: TrainingPlan, train_rows: npt.NDArray[np.int64], *,
              release_plan: Mapping[str, int] | None = None, epochs: int | None = None) -> None:
        """Fit preprocessing on the training rows of every party and build every model.

        ``release_plan``: the run's epochs, batches and evaluation passes, announced to the
        secondaries when their protection is budget first (``privacy.total_epsilon``).
        ``epochs``: the run's epochs, from which label DP plans its releases (one per epoch
        for each training record)."""
        train_rows = np.asarray(train_rows, dtype=np.int64)
        if self.secondaries and not self.links:
            raise ProtocolError("setup before alignment: call align_exact or set_alignments")
        pre = Preprocessor(self.table.schema, standardize=plan.bottom.standardize).fit(
            self.table.frame, train_rows)
        self.codec.fit(self.labels, train_rows)
        dims = []
        for j, name in enumerate(self.secondaries):
            spec = BottomSpec(**{**plan.bottom.__dict__, "seed": plan.bottom.seed + 1 + j})
            self.channel.request(name, SetupBottom(spec=spec, run=self.run), Ack)
            if plan.privacy is not None:
                classes = len(self.codec.classes) if self.task.is_classification else 0
                self.channel.request(name, SetupPrivacy(
                    settings=dict(plan.privacy), classes=classes,
                    plan={k: int(v) for k, v in (release_plan or {}).items()}, run=self.run), Ack)
            linked = self.links[name][train_rows].ravel()
            linked = np.unique(linked[linked != MISSING])
            self.channel.request(name, FitPreprocessing(rows=linked, run=self.run), Ack)
            dims.append(spec.out_dim)
        self._build(plan, pre, dims)
        self._start_labels(plan)
        if self.label_protection is not None:
            self.label_protection.plan(train_rows, int(epochs or 1))
            if self.label_protection.mode == "rr-prior" and self._y is not None:
                self._y = self.label_protection.randomize(self._y, train_rows)
        log.info("primary: %d features, %d secondaries (cut widths %s)", pre.n_features,
                 len(self.secondaries), dims)

    def _start_labels(self, plan: TrainingPlan) -> None:
        """A new training run's label protection, counting on the data's one budget."""
        settings = resolve_settings(plan.labels, self.task)  # the default: by the task
        if settings is None:
            self.label_protection = None
            return
        if self._label_budget is None:  # kept with the data, in our own directory
            n = len(self.table)
            self._label_budget = (
                ReleaseBudget.open(self._budget_dir, self.table.fingerprint(), n,
                                   party=self.name) if self._budget_dir is not None
                else ReleaseBudget(n, party=self.name))
        classes = len(self.codec.classes) if self.task.is_classification else 0
        self.label_protection = LabelProtection(settings, task=self.task, party=self.name,
                                                n_rows=len(self.table), classes=classes,
                                                budget=self._label_budget)

    def label_report(self) -> dict[str, Any] | None:
        """The label protection's ledger entry (``None`` when the labels are not protected)."""
        return None if self.label_protection is None else self.label_protection.report()

    def _build(self, plan: TrainingPlan, pre: Preprocessor, dims: list[int]) -> None:
        k = next(iter(self.links.values())).shape[1] if self.links else 1
        if plan.k != k:
            raise ConfigError(f"the plan expects K = {plan.k} links per record, the alignment "
                              f"has {k}")
        self._plan = plan
        self.preprocessor = pre
        self._dims = list(dims)
        if self._x is not None:
            self._x.close()
        frame, store = self.table.frame, self.resources.feature_store
        self._x = encode_features(
            pre, frame, store=store, directory=self.out_dir, owner=self.name,
            fingerprint=frame_fingerprint(frame)
            if pre.n_features and use_mmap(store, len(frame)) else "")
        self._y = self.codec.encode(self.labels)
        with seeded_init(plan.bottom.seed):  # built on the CPU: the same weights everywhere
            model = SplitNNPrimary(
                pre.n_features, plan.bottom, dims, plan.top_hidden, self.codec.out_dim,
                learn_missing=plan.learn_missing, aggregator=plan.aggregator, k=k,
                aggregator_config=plan.aggregator_config, pair_dim=plan.pair_dim)
        self.model = model.to(self.device)
        self.optimizer = build_optimizer(self.model.parameters(), plan.bottom)

    def _secondary_embeddings(self, rows: npt.NDArray[np.int64], batch_id: int, train: bool,
                              slots: list[_Slots] | None = None
                              ) -> tuple[list[torch.Tensor], list[tuple[str, torch.Tensor]],
                                         torch.Tensor, torch.Tensor]:
        """Embeddings (B, K, d_j) of every secondary for the linked rows of ``rows``, the leaves
        whose gradients go back, and the (B, K) similarities and valid-slot mask.

        ``slots``: filled, for training batches, with each secondary's per-slot rows (one per
        linked (record, k) pair, their gradient kept) for a protection that perturbs them."""
        model = self._require_model()
        plan = self._plan
        learn_missing = plan.learn_missing if plan is not None else False
        dev = self.device
        b = len(rows)
        k = next(iter(self.links.values())).shape[1] if self.links else 1
        valid = np.ones((b, k), dtype=bool)
        embeddings: list[torch.Tensor] = []
        leaves: list[tuple[str, torch.Tensor]] = []
        for j, name in enumerate(self.secondaries):
            links = self.links[name][rows]  # (B, K)
            present = links != MISSING
            if not learn_missing:
                valid &= present
            d = int(model.missing[j].shape[0]) if learn_missing else None
            if present.any():
                reply = self.channel.request(
                    name, Forward(batch_id=batch_id, rows=links[present], train=train,
                                  run=self.run),
                    Embeddings)
                if reply.batch_id != batch_id or len(reply.inverse) != int(present.sum()):
                    raise ProtocolError(f"{name!r} answered batch {reply.batch_id} with "
                                        f"{len(reply.inverse)} rows; expected batch {batch_id} "
                                        f"with {int(present.sum())}")
                # numbers are checked where they arrive, before they touch our model
                check_embeddings(reply, requested=int(present.sum()),
                                 width=self._dims[j] if j < len(self._dims) else None,
                                 party=self.name, peer=name, policy=self.policy)
                # A fresh leaf: the gradient stops here and travels back as a message, never
                # through an autograd graph that spans parties.
                leaf = reply.embeddings.detach().float()
                if train and self.recorder is not None:  # rows in the secondary's answer order
                    self.recorder.batch("embeddings", name, batch_id,
                                        np.unique(links[present]), leaf)
                if train:
                    leaf.requires_grad_(True)
                    leaves.append((name, leaf))
                # to our device after the gather: the leaf (and its gradient) stays on the CPU
                rows_emb = leaf[torch.from_numpy(reply.inverse)].to(dev)
                width = rows_emb.shape[1]
                if train and slots is not None:  # each slot inherits its record's label
                    rows_emb.retain_grad()
                    slots.append(_Slots(name, rows_emb, reply.inverse,
                                        np.nonzero(present)[0]))
            else:
                rows_emb = None
                width = d if d is not None else 1
            if present.all() and rows_emb is not None:
                emb = rows_emb.reshape(b, k, width)
            else:
                base = (model.missing[j].view(1, 1, -1).expand(b, k, -1) if d is not None
                        else torch.zeros(b, k, width, device=dev))
                mask_t = torch.from_numpy(present).to(dev)
                emb = base.clone() if rows_emb is not None else base
                if rows_emb is not None:
                    emb[mask_t] = rows_emb
            embeddings.append(emb)
        if self.similarity is not None:
            # a missing link (fewer candidates than K, e.g. after blocking) has NaN similarity;
            # its slot is masked by `valid`, and NaN·0 would still poison the gates
            sim = torch.nan_to_num(torch.from_numpy(self.similarity[rows]), nan=0.0).to(dev)
        else:
            sim = torch.ones(b, k, device=dev)
        return embeddings, leaves, sim, torch.from_numpy(valid).to(dev)

    def _new_batch_id(self) -> int:
        batch_id = self.next_batch_id
        self.next_batch_id += 1
        return batch_id

    def _require_model(self) -> SplitNNPrimary:
        if self.model is None or self._x is None or self.optimizer is None:
            raise ProtocolError("the primary party is not set up; call setup() first")
        return self.model

    def train_step(self, rows: npt.NDArray[np.int64]) -> float:
        model = self._require_model()
        y_all = self._y
        if y_all is None or self._x is None or self.optimizer is None:
            raise ProtocolError("the primary party is not set up")
        batch_id = self._new_batch_id()
        if not model.training:  # train() walks every submodule: only on a mode change
            model.train()
        protection = self.label_protection
        slots: list[_Slots] | None = (
            [] if protection is not None and protection.mode in ("marvell", "max-norm")
            else None)
        sec, leaves, sim, mask = self._secondary_embeddings(rows, batch_id, train=True,
                                                            slots=slots)
        idx = torch.from_numpy(rows)
        x = self._x.rows(rows).to(self.device)
        plan = self._plan
        if plan is not None and plan.bottom.dropout > 0:
            # dropout masks depend on (seed, batch id) only, as on the secondaries
            with seeded_init(plan.bottom.seed * 1_000_003 + batch_id):
                logits = model(x, sec, sim, mask)
        else:
            logits = model(x, sec, sim, mask)
        target = y_all[idx].to(self.device)
        if protection is not None and protection.mode == "dp":
            # the labels enter only here: the noisy per-record logit gradients drive our own
            # update and every gradient we send (post-processing); the budget is checked first
            noisy = protection.noisy_logit_gradient(logits, target, rows)
            loss = self.codec.loss(logits.detach(), target)  # reported, never back-propagated
            self.optimizer.zero_grad(set_to_none=True)
            logits.backward(noisy / len(rows))
        else:
            loss = self.codec.loss(logits, target)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
        self.optimizer.step()
        grads = {name: leaf.grad if leaf.grad is not None else torch.zeros_like(leaf)
                 for name, leaf in leaves}
        if slots is not None and protection is not None:
            for slot in slots:  # Marvell / max-norm on the rows of each (record, link) pair
                labels = y_all[idx[torch.from_numpy(slot.owners)]]
                grads[slot.name] = slot.perturbed(protection, labels, grads[slot.name])
        for name, _ in leaves:
            self.channel.request(name, Backward(batch_id=batch_id, grad=grads[name],
                                                run=self.run), Ack)
        return float(loss.detach())

    def privacy_reports(self) -> list[dict[str, Any]]:
        """Every secondary's privacy-ledger entries for this run (its own figures)."""
        entries: list[dict[str, Any]] = []
        for name in self.secondaries:
            reply = self.channel.request(name, FetchPrivacyReport(run=self.run), PrivacyReport)
            entries.extend(dict(e) for e in reply.entries)
        return entries

    def batches(self, rows: npt.NDArray[np.int64], batch_size: int,
                rng: np.random.Generator | None) -> Iterator[npt.NDArray[np.int64]]:
        order = rng.permutation(rows) if rng is not None else np.asarray(rows)
        for start in range(0, len(order), batch_size):
            yield order[start:start + batch_size]

    def predict_scores(self, rows: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
        """Scores (probabilities or predictions in label units) for the given primary rows."""
        return self.scores_of(self.evaluation_inputs(rows))

    def input_bytes(self, n_rows: int) -> int:
        """What :meth:`evaluation_inputs` of ``n_rows`` records holds in memory (float32)."""
        k = next(iter(self.links.values())).shape[1] if self.links else 1
        features = self.preprocessor.n_features if self.preprocessor is not None else 0
        return 4 * int(n_rows) * (int(features) + k * (sum(self._dims) + 2))

    def evaluation_inputs(self, rows: npt.NDArray[np.int64]) -> list[ModelInputs]:
        """The model's inputs for ``rows`` in evaluation chunks: one evaluation ``Forward`` to
        each secondary per chunk (no gradient goes back), as :meth:`predict_scores` sends."""
        model = self._require_model()
        if self._x is None or self._plan is None:
            raise ProtocolError("the primary party is not set up")
        if model.training:
            model.eval()
        out = []
        for chunk in self.batches(np.asarray(rows, dtype=np.int64), self._plan.eval_batch_size,
                                  None):
            batch_id = self._new_batch_id()
            with torch.no_grad():
                sec, _, sim, mask = self._secondary_embeddings(chunk, batch_id, train=False)
                x = self._x.rows(chunk).to(self.device)
            out.append(ModelInputs(chunk, x, tuple(sec), sim, mask))
        return out

    def scores_of(self, inputs: Sequence[ModelInputs]) -> npt.NDArray[np.float64]:
        """Scores of the model as it stands on inputs already gathered (no message)."""
        model = self._require_model()
        if model.training:
            model.eval()
        out = []
        with torch.no_grad():
            for part in inputs:
                out.append(self.codec.scores(model(part.x, list(part.secondary), part.sim,
                                                   part.mask).cpu()))
        if not out:
            return np.zeros((0,), dtype=np.float64)
        return np.concatenate(out, axis=0)

    def refit(self, train: Sequence[ModelInputs], validation: Sequence[ModelInputs], *,
              epochs: int, batch_size: int,
              score: Callable[[npt.NDArray[Any], npt.NDArray[np.float64]], float] | None,
              higher_is_better: bool = True) -> dict[str, Any]:
        """Refit the primary's own parameters (bottom, top, merge, head) on its clean training
        labels, over inputs already received (``train``, ``validation``: from
        :meth:`evaluation_inputs`); no message is sent. Starts from the model as it stands,
        trains up to ``epochs`` epochs of ``batch_size`` and keeps the epoch whose validation
        ``score`` is best, or the model as it was when none beats it (``score`` ``None``: the
        last epoch, as the training loop without a selection metric). Every epoch runs (no
        early stopping): it costs no message, and a small validation split's figure dips and
        recovers within a few epochs, which a patience would stop on."""
        model = self._require_model()
        plan, y_all = self._plan, self._y
        if plan is None or y_all is None:
            raise ProtocolError("the primary party is not set up")
        y_val = self.targets(np.concatenate([p.rows for p in validation])) \
            if validation else np.zeros(0)
        before = score(y_val, self.scores_of(validation)) if score is not None else None
        best, best_epoch = before, 0
        best_state = copy.deepcopy(model.state_dict())
        rows = np.concatenate([p.rows for p in train])
        x = torch.cat([p.x for p in train])
        secondary = [torch.cat([p.secondary[j] for p in train])
                     for j in range(len(train[0].secondary))]
        sim, mask = torch.cat([p.sim for p in train]), torch.cat([p.mask for p in train])
        target = y_all[torch.from_numpy(rows)].to(self.device)
        optimizer = build_optimizer(model.parameters(), plan.bottom)
        history: list[float] = []
        # shuffling and dropout from the run's seed: nothing here is sent or protective
        with seeded_init((plan.bottom.seed * 1_000_003 + 0x5EF17) % (1 << 63)):
            generator = torch.Generator().manual_seed(int(plan.bottom.seed))
            for epoch in range(1, int(epochs) + 1):
                model.train()
                order = torch.randperm(len(rows), generator=generator)
                for start in range(0, len(rows), int(batch_size)):
                    i = order[start:start + int(batch_size)]
                    logits = model(x[i], [e[i] for e in secondary], sim[i], mask[i])
                    loss = self.codec.loss(logits, target[i])
                    optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                    optimizer.step()
                if score is None:
                    best_epoch = epoch
                    continue
                value = float(score(y_val, self.scores_of(validation)))
                history.append(value)
                if best is None or (value > best if higher_is_better else value < best):
                    best, best_epoch = value, epoch
                    best_state = copy.deepcopy(model.state_dict())
        if score is not None:
            model.load_state_dict(best_state)
        model.eval()
        return {"epochs_run": int(epochs),
                "epoch_kept": best_epoch, "validation_before": before,
                "validation_after": best, "validation_history": history}

    def targets(self, rows: npt.NDArray[np.int64]) -> npt.NDArray[np.generic]:
        return self.codec.targets(self.labels.iloc[np.asarray(rows)])

    # --- state ----------------------------------------------------------------------------

    def _state(self) -> dict[str, Any]:
        model = self._require_model()
        return {"model": model.state_dict(),
                "optimizer": self.optimizer.state_dict() if self.optimizer else {}}

    def snapshot(self, tag: str) -> None:
        self._snapshots[tag] = copy.deepcopy(self._state())
        for name in self.secondaries:
            self.channel.request(name, Snapshot(tag=tag, run=self.run), Ack)

    def restore(self, tag: str) -> None:
        state = self._snapshots[tag]
        model = self._require_model()
        model.load_state_dict(state["model"])
        if self.optimizer is not None:
            self.optimizer.load_state_dict(state["optimizer"])
        for name in self.secondaries:
            self.channel.request(name, Restore(tag=tag, run=self.run), Ack)

    def _full_state(self) -> dict[str, Any]:
        plan = self._plan
        if plan is None:
            raise ProtocolError("the primary party is not set up")
        plan_dict = dataclasses.asdict(plan)
        extra = ({} if self.label_protection is None
                 else {"label_protection": self.label_protection.state_dict()})
        return {**self._state(), "preprocessor": self.preprocessor.to_json(),
                "label_codec": self.codec.to_json(), "plan": plan_dict,
                "dims": list(self._dims), "secondaries": list(self.secondaries), **extra}

    def save_states(self, name: str = "model", *, extra: dict[str, Any] | None = None,
                    secondary_name: str | None = None) -> None:
        """Every party writes its own model state into its own directory (atomically).

        The secondaries write first (as ``secondary_name``, default ``name``) and the primary
        last, so the primary's file is the commit point: a checkpoint it refers to is complete.
        A state is ``NAME.json`` plus ``NAME.<digest>.safetensors`` (``models/statefile.py``).
        """
        for sec in self.secondaries:
            self.channel.request(sec, SaveState(name=secondary_name or name, run=self.run), Ack)
        if self.out_dir is not None:
            save_state(self.out_dir, name, {**self._full_state(), **(extra or {}),
                                            "secondary_state": secondary_name or name},
                       kind="primary")
            if self.recorder is not None:
                self.recorder.flush(self.out_dir, party=self.name, role=self.role)

    def load_states(self, name: str = "model", *, same_data: bool = False) -> dict[str, Any]:
        """Load this party's saved state and ask every secondary to load its own.

        Alignments must be set first (they fix K). Returns the primary's state dict, whose
        extra entries (e.g. a training checkpoint's progress) the caller may use. With
        ``same_data`` (resuming a run) a secondary whose data changed since the save is an
        error; otherwise (predicting) it is only logged.
        """
        if self.out_dir is None:
            raise ConfigError("the primary party has no state directory to load from")
        # tensors from safetensors, the rest from versioned JSON: nothing is unpickled
        state = load_state(self.out_dir, name, kind="primary")
        source = str(state_json_path(self.out_dir, name))
        changed = []
        for sec in self.secondaries:
            ack = self.channel.request(sec, LoadState(name=state.get("secondary_state", name),
                                                          run=self.run),
                                       Ack)
            if ack.info.get("data_changed"):
                changed.append(sec)
        if changed and same_data:
            raise DataError("cannot resume: the data of " + ", ".join(
                f"party {s!r}" for s in changed) + " changed since the checkpoint")
        if changed:
            log.warning("the data of %s changed since the model was saved",
                        ", ".join(repr(s) for s in changed))
        try:
            plan_raw = dict(state["plan"])
            plan_raw["bottom"] = BottomSpec(**plan_raw["bottom"])
            if plan_raw.get("aggregator_config") is not None:
                plan_raw["aggregator_config"] = AggregatorConfig(
                    **plan_raw["aggregator_config"])
            codec = LabelCodec.from_json(state["label_codec"], source=source)
            pre = Preprocessor.from_json(state["preprocessor"], self.table.schema,
                                         source=source)
            self.codec = codec
            self._build(TrainingPlan(**plan_raw), pre, [int(d) for d in state["dims"]])
            model, optimizer = self._require_model(), self.optimizer
            model.load_state_dict(state["model"])
            if optimizer is not None and state.get("optimizer"):
                optimizer.load_state_dict(state["optimizer"])
            if same_data and state.get("label_protection") is not None:
                # a resumed run: its calibration, noise stream and randomised labels
                self._start_labels(self._plan or TrainingPlan(**plan_raw))
                if self.label_protection is not None:
                    self.label_protection.load_state_dict(state["label_protection"])
                    if self.label_protection.randomized is not None and self._y is not None:
                        self._y = self.label_protection.randomize(self._y, np.zeros(0, np.int64))
        except VflinkError:
            raise
        except (KeyError, TypeError, ValueError, RuntimeError) as exc:
            raise DataError(f"{source}: the saved state does not fit this party's model "
                            f"({type(exc).__name__}: {exc})") from None
        return state
