"""Union training is not a membership oracle: a hostile primary collects
every answer it can get from a secondary about UIDs it knows to be members (records the
secondary holds) and non-members, and a classifier of the two from those answers is at chance.

The secondary is a real SecondaryParty behind an in-process hub or a GrpcServer on loopback;
the primary runs PSU with it, then speaks UnionSetup / UnionForward / Backward directly (no
honest UnionPrimary): per-UID ``features = "none"`` probes, per-UID fit sets, evaluation asked
twice, training forwards asked twice at one model state and again after an update, the
embeddings themselves, and identical embeddings (duplicates), the one signal fea-sampling keeps
(its size is measured here and in the README).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch

from vflink.alignment._dh import key_bytes
from vflink.alignment.groups import get_group
from vflink.alignment.synthetic import assigned_rows
from vflink.data import PartySchema, PartyTable
from vflink.errors import PolicyViolation, VflinkError
from vflink.metrics.functional import auc
from vflink.models.spec import BottomSpec
from vflink.parties import SecondaryParty
from vflink.parties.policy import UNION_FEATURES, PartyPolicy
from vflink.parties.setalign import SetAlignmentDriver
from vflink.parties.union import uid_rows
from vflink.protocol import Ack, Backward, Embeddings
from vflink.protocol.messages import SaveState, UnionForward, UnionSetup
from vflink.transport import InProcessHub
from vflink.transport.grpc import GrpcChannel, GrpcServer, PeerAddress, create_dev_pki
from vflink.transport.grpc.tls import TlsConfig

N_MEMBERS, N_OUTSIDERS, N_BANK_ONLY = 120, 120, 120
SPEC = BottomSpec(hidden=(16,), out_dim=8, seed=5)
#: |AUC - 0.5| below this: 120 + 120 targets give a standard error of about 0.037 at chance
BAND = 0.12


def bank_table() -> PartyTable:
    rng = np.random.default_rng(0)
    n = N_MEMBERS + N_BANK_ONLY
    frame = pd.DataFrame({"id": [f"m{i}" for i in range(N_MEMBERS)]
                          + [f"b{i}" for i in range(N_BANK_ONLY)],
                          "x1": rng.normal(size=n), "x2": rng.normal(size=n),
                          "x3": rng.exponential(size=n)})
    schema = PartySchema(name="bank", role="secondary", key=("id",),
                         numeric=("x1", "x2", "x3"))
    return PartyTable.from_frame(schema, frame, "bank.csv")


def primary_keys() -> list[bytes]:
    frame = pd.DataFrame({"id": [f"m{i}" for i in range(N_MEMBERS)]
                          + [f"o{i}" for i in range(N_OUTSIDERS)]})
    return key_bytes(frame, ("id",))


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("pki")
    create_dev_pki(d, ["primary", "bank"])
    return d


class Setup:
    """The bank (secondary) after PSU with the primary, and the primary's view: its UIDs of
    members and non-members (which it knows here only because the test tells it)."""

    def __init__(self, channel: Any, bank: SecondaryParty) -> None:
        self.channel, self.bank = channel, bank
        mine = SetAlignmentDriver(primary_keys(), channel, get_group("ristretto255")).psu(
            "bank", session="psu")
        rows = uid_rows(mine)
        self.n_union = len(rows)
        uid_of_row = np.full(N_MEMBERS + N_OUTSIDERS, -1, dtype=np.int64)
        uid_of_row[rows[rows >= 0]] = np.flatnonzero(rows >= 0)
        self.members = uid_of_row[:N_MEMBERS]
        self.outsiders = uid_of_row[N_MEMBERS:]
        #: UIDs the primary lacks: certainly the bank's (PSU tells the primary which they are)
        self.bank_only = np.flatnonzero(rows < 0)
        self.targets = np.concatenate([self.members, self.outsiders])
        self.truth = np.r_[np.ones(N_MEMBERS), np.zeros(N_OUTSIDERS)]
        self.batch = 0

    def call(self, message: Any) -> Any:
        return self.channel.call("bank", message)

    def setup(self, features: str, fit: np.ndarray | None = None) -> Any:
        fit = np.arange(self.n_union, dtype=np.int64) if fit is None else fit
        return self.call(UnionSetup(session="psu", spec=SPEC, features=features,
                                    fit_uids=fit.astype(np.int64)))

    def forward(self, uids: np.ndarray, train: bool) -> tuple[int, np.ndarray]:
        self.batch += 1
        reply = self.call(UnionForward(batch_id=self.batch, uids=uids.astype(np.int64),
                                       train=train))
        assert isinstance(reply, Embeddings)
        assert np.array_equal(reply.inverse, np.arange(len(uids)))
        return self.batch, reply.embeddings.detach().numpy()[reply.inverse]


@pytest.fixture(params=["inprocess", "grpc"])
def connect(request: pytest.FixtureRequest, pki: Path
            ) -> Iterator[Callable[..., Setup]]:
    servers: list[GrpcServer] = []
    channels: list[GrpcChannel] = []

    def make(policy: PartyPolicy | None = None) -> Setup:
        hub = InProcessHub()
        bank = SecondaryParty(bank_table(), hub.channel("bank"), policy=policy)
        bank.roles = {"primary": "primary", "bank": "secondary"}
        hub.register("bank", bank)
        if request.param == "inprocess":
            return Setup(hub.channel("primary"), bank)
        server = GrpcServer("bank", bank, "127.0.0.1:0", TlsConfig.for_party(pki, "bank"),
                            {"primary", "bank"}).start()
        servers.append(server)
        channel = GrpcChannel("primary", {"bank": PeerAddress("127.0.0.1", server.port)},
                              TlsConfig.for_party(pki, "primary"))
        channels.append(channel)
        return Setup(channel, bank)

    yield make
    for c in channels:
        c.close()
    for s in servers:
        s.stop(grace=None)


def outcome(fn: Callable[[], Any]) -> str:
    """What the peer sees of one call: the reply's kind, or the error's class and text."""
    try:
        reply = fn()
    except VflinkError as exc:
        return f"{type(exc).__name__}: {exc}"
    return type(reply).__name__


def separation(truth: np.ndarray, score: np.ndarray) -> float:
    """How far from chance one score ranks members against non-members: |AUC - 0.5|
    (either orientation counts; a constant score is exactly at chance)."""
    if np.ptp(score) == 0:
        return 0.0
    return abs(auc(truth, score) - 0.5)


def classifier_separation(truth: np.ndarray, x: np.ndarray, groups: np.ndarray) -> float:
    """Logistic regression on all features, cross-validated (5 folds): |AUC - 0.5|.

    Rows with identical embeddings share a fold (``groups``): a filled UID and the record it
    copies carry opposite labels, and split across folds they pull the cross-validated AUC
    below 0.5 (about 0.38 here), which is the duplicates signal measured on its own below,
    not a difference of distributions."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import GroupKFold, cross_val_predict
    from sklearn.preprocessing import StandardScaler

    x = StandardScaler().fit_transform(x)
    p = cross_val_predict(LogisticRegression(max_iter=1000), x, truth, groups=groups,
                          cv=GroupKFold(5), method="predict_proba")[:, 1]
    return abs(auc(truth, p) - 0.5)


def duplicates(emb: np.ndarray) -> np.ndarray:
    """For each row, how many other rows carry exactly the same embedding."""
    _, inverse, counts = np.unique(emb, axis=0, return_inverse=True, return_counts=True)
    return counts[inverse.reshape(-1)] - 1


# --- the membership probes a hostile tester used, as regression tests ----------------------


@pytest.mark.network
def test_features_none_answers_alike_for_members_and_non_members(connect: Any) -> None:
    s = connect()
    seen: dict[int, set[str]] = {0: set(), 1: set()}
    for uid, member in zip(s.targets, s.truth):
        # a per-UID fit set and a per-UID forward: the hostile tester's probe
        setup = outcome(lambda uid=uid: s.setup("none", np.array([uid])))
        fwd = outcome(lambda uid=uid: s.forward(np.array([uid]), False))
        seen[int(member)].add(setup + " | " + fwd)
    assert seen[0] == seen[1] and len(seen[0]) == 1, seen
    (answer,) = seen[0]
    # refused from public sizes alone (|B| < |U| after PSU), the same text for every UID
    assert "union.features-none" in answer and "ProtocolError" in answer


@pytest.mark.network
def test_fea_sampling_evaluation_asked_twice_gives_fixed_points_for_everyone(
        connect: Any) -> None:
    s = connect()
    assert isinstance(s.setup("fea-sampling"), Ack)
    uids = np.concatenate([s.targets, s.bank_only])
    _, first = s.forward(s.targets, False)
    _, second = s.forward(s.targets[::-1], False)  # another batch, another order
    assert np.array_equal(first, second[::-1])
    _, alone = s.forward(s.targets[:1], False)  # a batch of one (float rounding of the
    assert np.allclose(alone[0], first[0], atol=1e-6)  # batch size, alike for every row)
    # training forwards at one model state answer as evaluation does, for everyone
    _, train = s.forward(uids, True)
    _, evaluation = s.forward(uids, False)
    assert np.allclose(train, evaluation, atol=1e-6)


def collect(s: Setup, features: str) -> dict[str, np.ndarray]:
    """Every answer-derived score per target UID that a hostile primary can get."""
    scores: dict[str, np.ndarray] = {}
    # per-UID fit sets: the setup's answer and a known bank UID's embedding afterwards
    ref = s.bank_only[:1]
    setup_out, ref_emb = [], []
    for uid in s.targets[::4]:
        setup_out.append(outcome(lambda uid=uid: s.setup(features, np.array([uid]))))
        ref_emb.append(s.forward(ref, False)[1][0])
    codes = {o: i for i, o in enumerate(sorted(set(setup_out)))}
    sub = s.truth[::4]
    scores["fit-set setup answer"] = np.array([codes[o] for o in setup_out], dtype=float)
    ref_arr = np.array(ref_emb)
    scores["fit-set reference embedding"] = np.abs(ref_arr - ref_arr[0]).sum(axis=1)
    # (these two are scored on every 4th target)
    s.setup(features)
    batches = np.array_split(np.random.default_rng(1).permutation(len(s.targets)), 4)
    e1 = np.zeros((len(s.targets), SPEC.out_dim))
    e2 = np.zeros_like(e1)
    t1 = np.zeros_like(e1)
    t2 = np.zeros_like(e1)
    t3 = np.zeros_like(e1)
    for b in batches:
        e1[b] = s.forward(s.targets[b], False)[1]
    for b in batches[::-1]:
        e2[b] = s.forward(s.targets[b], False)[1]
    # training forwards twice at one model state (both pending), then one update, then again
    pending = []
    for b in batches[:2]:
        bid, t1[b] = s.forward(s.targets[b], True)
        pending.append((bid, len(b)))
    for b in batches[:2]:
        t2[b] = s.forward(s.targets[b], True)[1]
    for b in batches[2:]:
        bid, t1[b] = s.forward(s.targets[b], True)
        t2[b] = t1[b]
    bid, n = pending[0]
    g = torch.from_numpy(np.random.default_rng(2).normal(size=(n, SPEC.out_dim)).astype(
        np.float32)) * 0.01
    assert isinstance(s.call(Backward(batch_id=bid, grad=g)), Ack)
    for b in batches:
        t3[b] = s.forward(s.targets[b], False)[1]
    scores["evaluation asked twice"] = np.abs(e1 - e2).sum(axis=1)
    scores["training asked twice"] = np.abs(t1 - t2).sum(axis=1)
    scores["change after one update"] = np.abs(t3 - e1).sum(axis=1)
    scores["norm"] = np.linalg.norm(e1, axis=1)
    scores["zeros"] = (e1 == 0).sum(axis=1).astype(float)
    scores["min coordinate"] = e1.min(axis=1)
    scores["_embedding"] = e1
    scores["_sub"] = sub
    return scores


def assert_at_chance(s: Setup, scores: dict[str, np.ndarray]) -> dict[str, float]:
    sub = scores.pop("_sub")
    emb = scores.pop("_embedding")
    measured = {}
    for name, score in scores.items():
        truth = sub if len(score) == len(sub) else s.truth
        measured[name] = separation(truth, score)
    singles = np.column_stack([v for v in scores.values() if len(v) == len(s.truth)])
    groups = np.unique(emb, axis=0, return_inverse=True)[1].reshape(-1)
    measured["logistic regression"] = classifier_separation(
        s.truth, np.column_stack([singles, emb]), groups)
    bad = {k: round(v + 0.5, 3) for k, v in measured.items() if v >= BAND}
    assert not bad, f"member/non-member AUC far from 0.5: {bad}"
    return measured


@pytest.mark.network
@pytest.mark.parametrize("features", ["fea-sampling", "none"])
def test_a_membership_classifier_from_the_answers_is_at_chance(connect: Any,
                                                               features: str) -> None:
    s = connect()
    if features == "none":
        # refused for every fit set alike; nothing else can be asked
        answers = {outcome(lambda uid=uid: s.setup("none", np.array([uid])))
                   for uid in s.targets}
        assert len(answers) == 1
        return
    assert_at_chance(s, collect(s, features))


@pytest.mark.network
def test_fea_sampling_duplicates_reveal_what_the_readme_says(connect: Any) -> None:
    """The one signal fea-sampling keeps: a filled UID's embedding equals the one of the record
    it copies. Asked for all of U at one model state, a member is in a group of identical
    embeddings with probability q = min(1, n_fake / n_own) (balanced assignment), a non-member
    always: AUC = 1 - q/2 (here 120 fakes over 240 own records: 0.75)."""
    s = connect()
    s.setup("fea-sampling")
    every = np.arange(s.n_union, dtype=np.int64)
    _, emb = s.forward(every, False)
    dup = duplicates(emb)
    score = dup[s.targets]
    measured = auc(1 - s.truth, score)  # non-members have twins
    q = min(1.0, N_OUTSIDERS / (N_MEMBERS + N_BANK_ONLY))
    assert measured == pytest.approx(1 - q / 2, abs=0.08)
    # every non-member has exactly one twin: the balanced assignment uses no record twice here
    assert (dup[s.outsiders] == 1).all()


def test_assigned_rows_are_balanced_and_keyed() -> None:
    own = np.arange(10, 20, dtype=np.int64)
    a = assigned_rows(own, 25, b"k" * 32)
    assert np.array_equal(a, assigned_rows(own, 25, b"k" * 32))
    assert not np.array_equal(a, assigned_rows(own, 25, b"j" * 32))
    counts = np.bincount(a - 10, minlength=10)
    assert set(counts) == {2, 3} and counts.sum() == 25
    assert set(assigned_rows(own, 4, b"k" * 32)) <= set(own)
    assert len(assigned_rows(own, 0, b"k")) == 0


@pytest.mark.network
@pytest.mark.parametrize("features", ["fea-gaussian", "fea-random"])
def test_gaussian_and_random_fills_still_reveal_membership(connect: Any,
                                                          features: str) -> None:
    """FLORIST Table 2: no privacy. Their embeddings are drawn off the ReLU cut layer's
    distribution; one answer is enough (a negative coordinate is never real). README. So a
    secondary's default policy refuses them (the same refusal whatever the UIDs); a party
    that opts in (a reproduction) gets what the paper measured."""
    with pytest.raises(PolicyViolation, match="policy.union-features"):
        connect().setup(features)
    s = connect(PartyPolicy(union_features=UNION_FEATURES))
    s.setup(features)
    _, emb = s.forward(s.targets, True)  # fea-random's statistics come from training batches
    _, emb = s.forward(s.targets, True)
    assert separation(s.truth, -emb.min(axis=1)) > 0.35  # AUC above 0.85


def test_pending_union_batches_are_bounded() -> None:
    hub = InProcessHub()
    bank = SecondaryParty(bank_table(), hub.channel("bank"))
    hub.register("bank", bank)
    s = Setup(hub.channel("primary"), bank)
    s.setup("fea-sampling")
    for _ in range(bank.policy.max_pending_batches):
        s.forward(s.targets[:3], True)
    with pytest.raises(VflinkError, match="limit.pending-batches"):
        s.forward(s.targets[:3], True)
    s.forward(s.targets[:3], False)  # evaluation holds nothing


def test_states_saved_during_union_training_are_the_senders_own_and_bounded(
        tmp_path: Path) -> None:
    """SaveState is admitted in union training (a run's final state and its recording): the
    files go to the sender's own folder, their names are bounded by the secondary's policy,
    and a primary with no union run there saves nothing."""
    hub = InProcessHub()
    bank = SecondaryParty(bank_table(), hub.channel("bank"), out_dir=tmp_path,
                          policy=PartyPolicy(max_saved_states=2))
    bank.roles = {"primary": "primary", "other": "primary", "bank": "secondary"}
    hub.register("bank", bank)
    s = Setup(hub.channel("primary"), bank)
    s.setup("fea-sampling")
    batch, emb = s.forward(s.targets[:8], True)
    s.call(Backward(batch_id=batch, grad=torch.zeros(emb.shape)))
    for name in ("a", "b"):
        assert isinstance(s.call(SaveState(name=name)), Ack)
    with pytest.raises(PolicyViolation, match="limit.saved-states"):
        s.call(SaveState(name="c"))
    assert sorted(p.name for p in (tmp_path / "peers" / "primary").glob("*.json")) == [
        "a.json", "b.json"]
    with pytest.raises(VflinkError):
        hub.channel("other").call("bank", SaveState(name="a"))
    assert not (tmp_path / "peers" / "other").exists()
