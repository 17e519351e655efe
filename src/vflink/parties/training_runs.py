"""What a secondary keeps for one primary's training run, apart from every other run.

A served secondary may train with several primaries (a bank serving two federations) and each
primary may run several trainings. Each (primary, run) is one session of the ``training``
protocol (:data:`vflink.protocol.sessions.TRAINING`, keyed by the sender and the message's
``run``), and the session holds a :class:`TrainingRun`: the bottom model, its optimiser, the
fitted preprocessing and encoded features, the batches waiting for their gradient, the
snapshots and the run's embedding protection. No handler reads anything of another run, so a
second primary's setup never changes what the first computes, its training steps never move
the first's model, and its state verbs reach only its own states (a served party keeps each
peer's saved states in its own folder, :func:`peer_root`).

What one peer may make the party hold is bounded per peer, like its set sessions
(docs/security.md, "Limits per authenticated peer"): ``policy.max_training_runs`` runs (a new
run drops the peer's own least recently used one) and ``policy.max_training_bytes`` of memory
(:func:`model_bytes` and :func:`features_bytes` estimate a model before it is built; a run that
would not fit drops the peer's own older runs first, and is refused if it does not fit alone).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from vflink.data.featurestore import FeatureSource, InMemoryFeatures
from vflink.data.preprocess import Preprocessor
from vflink.errors import PolicyViolation
from vflink.models.spec import BottomSpec, bottom_parameters
from vflink.parties.privacy import EmbeddingProtection
from vflink.parties.recording import Recorder
from vflink.protocol.boundary import refuse
from vflink.protocol.names import check_name

__all__ = ["PEERS_DIR", "TrainingRun", "features_bytes", "model_bytes", "peer_root",
           "refuse_memory", "tensor_bytes"]

#: Where a served secondary keeps each peer's saved states: ``<state_dir>/peers/<peer>/``.
PEERS_DIR = "peers"

#: Tensors an optimiser keeps per parameter (Adam, AdamW and LAMB: two moments; SGD with
#: momentum: one buffer).
_OPTIMIZER_SLOTS = {"adam": 2, "adamw": 2, "lamb": 2, "sgd": 1}
_FLOAT_BYTES = 4


def peer_root(out_dir: Path, peer: str, *, per_peer: bool) -> Path:
    """The folder of ``peer``'s saved states: its own under ``peers/`` for a served party,
    else the party's directory itself (a party built for one run of one primary)."""
    if not per_peer:
        return out_dir
    return out_dir / PEERS_DIR / check_name(peer, "peer")


def model_bytes(spec: BottomSpec, n_inputs: int) -> int:
    """Memory of the bottom model ``spec`` builds on ``n_inputs`` features, with its optimiser
    state (float32 parameters, gradients and the optimiser's per-parameter tensors)."""
    n = bottom_parameters(spec, max(n_inputs, 1))
    return n * _FLOAT_BYTES * (2 + _OPTIMIZER_SLOTS.get(spec.optimizer, 2))


def features_bytes(n_rows: int, n_features: int, *, mapped: bool) -> int:
    """Anonymous memory of an encoded feature matrix (a mapped file's pages are the kernel's
    to drop, so they are not counted)."""
    return 0 if mapped else n_rows * max(n_features, 1) * _FLOAT_BYTES


def tensor_bytes(tree: Any) -> int:
    """Bytes of every tensor in a nested state (a model's or optimiser's ``state_dict``)."""
    if isinstance(tree, torch.Tensor):
        return int(tree.numel() * tree.element_size())
    if isinstance(tree, dict):
        return sum(tensor_bytes(v) for v in tree.values())
    if isinstance(tree, (list, tuple)):
        return sum(tensor_bytes(v) for v in tree)
    return 0


@dataclass(eq=False)
class TrainingRun:
    """One primary's (``peer``) training run ``run`` at a secondary: everything the training
    verbs read and write. Kept in the run's session; closed (its features released) when the
    session is dropped."""

    peer: str
    run: str
    protection: EmbeddingProtection
    preprocessor: Preprocessor
    spec: BottomSpec | None = None
    features: FeatureSource | None = None
    model: torch.nn.Module | None = None
    optimizer: torch.optim.Optimizer | None = None
    #: training forwards waiting for their Backward (batch id → the kept output)
    pending: dict[int, torch.Tensor] = field(default_factory=dict)
    pending_since: dict[int, float] = field(default_factory=dict)
    applied: set[int] = field(default_factory=set)
    snapshots: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: union training's per-session state (:class:`vflink.parties.union.UnionPeer`)
    union: Any = None
    #: what this run received, where the party records per run (a served party)
    recorder: Recorder | None = None
    #: the data fingerprint of the state last loaded (resuming tells whether data changed)
    loaded_data: str | None = None

    def nbytes(self) -> int:
        """Memory this run holds now: model, gradients and optimiser state, snapshots,
        features encoded in memory and pending outputs."""
        total = 0
        if self.model is not None:
            for p in self.model.parameters():
                total += 2 * p.numel() * p.element_size()  # the parameter and its gradient
        if self.optimizer is not None:
            total += tensor_bytes(self.optimizer.state_dict().get("state", {}))
        total += sum(tensor_bytes(s) for s in self.snapshots.values())
        if isinstance(self.features, InMemoryFeatures):
            total += int(self.features.features.numel() * self.features.features.element_size())
        total += sum(int(t.numel() * t.element_size()) for t in self.pending.values())
        return total

    def state_bytes(self) -> int:
        """Memory of one copy of the model's and optimiser's state (what a snapshot keeps)."""
        if self.model is None:
            return 0
        total = sum(p.numel() * p.element_size() for p in self.model.parameters())
        if self.optimizer is not None:
            total += tensor_bytes(self.optimizer.state_dict().get("state", {}))
        return int(total)

    def clear(self) -> None:
        """Forget the model and what hangs on it (a new model is about to be built)."""
        if self.features is not None:
            self.features.close()
        self.features = None
        self.model = None
        self.optimizer = None
        self.pending.clear()
        self.pending_since.clear()
        self.applied.clear()
        self.snapshots.clear()
        self.union = None

    def close(self) -> None:
        """The run's session was dropped: release everything it held."""
        self.clear()
        self.spec = None


def refuse_memory(party: str, peer: str, need: int, limit: int) -> PolicyViolation:
    """The refusal of a model (or snapshot) that does not fit the peer's memory alone."""
    return refuse(PolicyViolation,
                  f"party {party!r}: this would hold about {need:,} bytes of training state "
                  f"for {peer!r}, over its limit of {limit:,} (policy.max_training_bytes); "
                  "ask for a smaller model or fewer snapshots", code="limit.training-memory")
