"""Train a run in this process and attack what one secondary released (VFL-AFE §4.3).

:func:`train_and_attack` is what the reproduction (:mod:`vflink.experiments.afe_reproduction`) and
experiments call: it trains ``config`` with every party in this process, then, on the trained
parties,

* **membership inference** (Table 1): candidates are ``n_candidates`` training records
  (members) and as many test records (non-members); the attacker (the primary) sees the victim
  secondary's released embeddings and its own model's class probabilities on them, and trains
  shadow models on auxiliary records from the same distribution (every party's features, as
  the probabilities depend on all of them; Shokri et al.'s attacker holds such data) with the
  victim's public release mechanism, for as many epochs and with the batch size the run used
  (:class:`vflink.attacks.ShadowMembershipInference`);
* **model inversion** (Figure 10): a decoder trained on auxiliary records and their released
  embeddings (query access to the victim's bottom model, through its release) reconstructs the
  victim's features of test records from the embeddings the victim released for them
  (:class:`vflink.attacks.DecoderInversion`).

Queries go through the victim's own release (so a protected party's answers are noised); the
attack results are returned, and the caller may append them to the run's privacy ledger.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from vflink.attacks import AttackView, DecoderInversion, ShadowMembershipInference
from vflink.attacks._shadow import CodeBottom, Release
from vflink.data.table import PartyTable
from vflink.errors import ConfigError
from vflink.models.device import module_device
from vflink.parties import PrimaryParty, SecondaryParty
from vflink.parties.training_runs import TrainingRun
from vflink.protocol.messages import Embeddings, Forward
from vflink.runfiles.config import RunConfig
from vflink.runfiles.inputs import Inputs, load_inputs
from vflink.runfiles.results import RunResult
from vflink.runner.federation import (
    COORDINATOR,
    Federation,
    coordinator_seed,
    noise_seed,
    shared_secret,
)
from vflink.runner.train import run_training
from vflink.transport import InProcessHub, TrafficCounter
from vflink.types import MISSING

__all__ = ["AttackOutcome", "train_and_attack"]

log = logging.getLogger(__name__)


@dataclass
class AttackOutcome:
    result: RunResult
    membership: dict[str, Any] | None
    inversion: dict[str, Any] | None
    #: (truth, reconstruction) of the first inverted records, raw feature units
    examples: tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]] | None


def _federation(inputs: Inputs, config: RunConfig) -> tuple[Federation, dict[str, SecondaryParty]]:
    """Like ``federation.in_process``, keeping the secondaries so the attack can query them."""
    from vflink.linkage import SearchOptions
    from vflink.parties import CoordinatorParty

    secret = shared_secret(config.alignment.secret_env)
    counter = TrafficCounter()
    hub = InProcessHub(counter=counter)
    hub.register(COORDINATOR, CoordinatorParty(
        COORDINATOR, seed=coordinator_seed(config),
        search=SearchOptions(mode=config.alignment.search)))  # type: ignore[arg-type]
    parties = {}
    for j, table in enumerate(inputs.secondaries):
        parties[table.name] = SecondaryParty(table, hub.channel(table.name), secret=secret,
                                             privacy=config.privacy,
                                             privacy_seed=noise_seed(config, j))
        hub.register(table.name, parties[table.name])
    fed = Federation(channel=hub.channel(inputs.primary.name),
                     secondaries=tuple(t.name for t in inputs.secondaries),
                     coordinator=COORDINATOR, counter=counter, secret=secret)
    return fed, parties


def _release(victim: SecondaryParty, primary: str, rows: npt.NDArray[np.int64]
             ) -> npt.NDArray[np.float64]:
    """What the victim sends the primary for ``rows`` (one embedding per requested row)."""
    reply = victim.handle(primary, Forward(batch_id=10**9, rows=rows, train=False))
    if not isinstance(reply, Embeddings):
        raise ConfigError(f"{victim.name!r} did not answer with embeddings")
    return reply.embeddings[torch.from_numpy(reply.inverse)].double().numpy()


def _mechanism(config: RunConfig, victim: TrainingRun) -> dict[str, Any]:
    dp = victim.protection.dp
    if dp is None:
        return {}
    if config.privacy.randomized_response:
        eps = dp.calibration.epsilon if dp.calibration is not None else 0.0
        return {"response_k": config.privacy.codes, "response_epsilon": eps}
    return {"clip": config.privacy.clip, "noise_std": dp.noise_std,
            "rescale": config.privacy.rescale, "normalize": config.privacy.normalize}


def _code_bottom(victim: TrainingRun) -> CodeBottom | None:
    """``randomized-response``: the victim's fixed quantiser as a bottom model (public: the
    attacker is given its layout and seed, a worst case)."""
    dp = victim.protection.dp
    if dp is None or not dp.config.randomized_response:
        return None
    return CodeBottom(dp.quantise, dp.config.codes)


def train_and_attack(config: RunConfig, aux: Inputs, *, victim: str | None = None,
                     n_candidates: int = 1000, n_examples: int = 10, shadow_models: int = 4,
                     shadow_epochs: int | None = None, decoder_epochs: int = 60,
                     inputs: Inputs | None = None) -> AttackOutcome:
    """Train ``config`` in-process, then attack the secondary ``victim`` (default: the last).

    ``aux`` holds the attacker's auxiliary records (same parties and layout as the run, e.g.
    Fashion-MNIST's test images): the victim's features of them and their labels.
    """
    inputs = inputs or load_inputs(config)
    if aux.truth is None:
        raise ConfigError("the auxiliary dataset needs its true alignment")
    fed, parties = _federation(inputs, config)
    name = victim or inputs.secondaries[-1].name
    if name not in parties:
        raise ConfigError(f"no secondary {name!r}; secondaries: {sorted(parties)}")
    seen: dict[str, Any] = {}

    def after(primary: PrimaryParty, splits: tuple[npt.NDArray[np.int64], ...]) -> None:
        seen["primary"], seen["splits"] = primary, splits

    result = run_training(config, tables=inputs, federation=fed, after_training=after)
    primary: PrimaryParty = seen["primary"]
    train, _, test = seen["splits"]
    target = parties[name]
    rng = np.random.default_rng([config.seed, 4])
    links = primary.links[name][:, 0]
    train = train[links[train] != MISSING]
    test = test[links[test] != MISSING]
    n = min(n_candidates, len(train), len(test))
    members, others = rng.choice(train, n, replace=False), rng.choice(test, n, replace=False)
    cand = np.concatenate([members, others])
    # the victim's features of the auxiliary records, and their labels (attacker's knowledge)
    aux_table: PartyTable = next(t for t in aux.secondaries if t.name == name)
    aux_rows = aux.truth[name]
    keep = aux_rows != MISSING
    aux_frame = aux_table.frame.iloc[aux_rows[keep]]
    aux_x = aux_frame[list(aux_table.schema.numeric)].to_numpy(dtype=np.float32)
    aux_y = primary.codec.encode(aux.primary.frame[aux.primary.schema.label][keep]).numpy()
    # shadows see whole records: the primary's own features and every secondary's, aligned
    blocks = [aux.primary.frame[list(aux.primary.schema.numeric)].to_numpy(np.float32)[keep]]
    for table in aux.secondaries:
        idx = aux.truth[table.name][keep]
        if (idx == MISSING).any():
            raise ConfigError("the auxiliary records must be complete (every party's part)")
        blocks.append(table.frame[list(table.schema.numeric)].to_numpy(np.float32)[idx])
    shadow_x = np.concatenate(blocks, axis=1)
    trained = target.training_run(primary.name)  # the victim's model of this run
    if trained is None:
        raise ConfigError(f"{name!r} has no trained model")
    mechanism = _mechanism(config, trained)
    code_bottom = _code_bottom(trained)
    model, pre = trained.model, trained.preprocessor
    if code_bottom is not None:  # the shadows code the victim's (preprocessed) part
        shadow_x = pre.transform(aux_frame)
    emb = _release(target, primary.name, links[cand])
    membership = None
    if primary.task.is_classification:
        scores = primary.predict_scores(cand)
        posteriors = scores if scores.ndim == 2 else np.c_[1 - scores, scores]
        labels = primary.codec.encode(primary.labels.iloc[cand]).numpy().astype(np.int64)
        view = AttackView(party=primary.name, role="primary", embeddings=emb,
                          extra={"labels": labels, "posteriors": posteriors,
                                 "shadow_features": shadow_x, "shadow_labels": aux_y,
                                 "classes": posteriors.shape[1], "mechanism": mechanism,
                                 "shadow_bottom": code_bottom})
        attack = ShadowMembershipInference(
            shadow_models=shadow_models, epochs=shadow_epochs or config.training.epochs,
            batch_size=config.training.batch_size, seed=config.seed)
        membership = attack.evaluate(view, {"membership": np.r_[np.ones(n), np.zeros(n)]}
                                     ).to_json()
    # inversion: queries of the victim's bottom model on the auxiliary records, through its
    # public release mechanism; targets: the embeddings it released for test records
    if model is None:
        raise ConfigError(f"{name!r} has no trained model")
    with torch.no_grad():
        model.eval()
        bottom = code_bottom if code_bottom is not None else model
        queries = torch.from_numpy(pre.transform(aux_frame))
        raw = bottom(queries.to(module_device(bottom))).cpu()  # on the victim's device
    release = Release.from_extra({"mechanism": mechanism})
    aux_emb = release(raw, torch.Generator().manual_seed(config.seed)).double().numpy()
    truth_x = target.table.frame.iloc[links[others]][list(target.table.schema.numeric)
                                                     ].to_numpy(dtype=np.float64)
    sigmoid = bool(aux_x.size and aux_x.min() >= 0 and aux_x.max() <= 1)
    inverter = DecoderInversion(epochs=decoder_epochs, seed=config.seed,
                                output="sigmoid" if sigmoid else "linear")
    inv_view = AttackView(party=primary.name, role="primary", embeddings=emb[n:],
                          extra={"aux_features": aux_x, "aux_embeddings": aux_emb})
    recon = inverter.infer(inv_view)
    mse = float(np.mean((recon - truth_x) ** 2))
    baseline = float(np.mean((aux_x.mean(axis=0)[None, :] - truth_x) ** 2))
    inversion = {"attack": inverter.name, "party": primary.name,
                 "metrics": {"mse": mse, "baseline_mse": baseline, "mse_ratio": mse / baseline},
                 "params": {"epochs": decoder_epochs, "victim": name}}
    return AttackOutcome(result, membership, inversion,
                         (truth_x[:n_examples], recon[:n_examples]))
