"""Every protection's draws, against a peer that holds the run's seeds and reads the code.

Each protection is built the way a run builds it (its seed from the run's config: ``None``
unless ``[privacy] reproducible_noise``), releases, and the peer rebuilds the generator from
every seed it holds (the run seed, the seeds the code derives from it, 0..N) and uses the
regenerated draws. Secret by default: nothing matches and the attack reads nothing; behind the
switch the same attack reads the labels or codes (the test can fail). The integration tests
(tests/integration/test_secret_noise.py) play the same peer on whole runs over both
transports.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from vflink.alignment import synthetic as syn
from vflink.privacy import randomized_response as rr
from vflink.privacy.config import PrivacyConfig
from vflink.privacy.embedding_dp import EmbeddingDP
from vflink.privacy.label_protection import LabelProtection, resolve_settings
from vflink.randomness import NoiseSource
from vflink.runfiles.config import DataConfig, RunConfig
from vflink.runner.federation import noise_seed
from vflink.runner.protections import label_settings
from vflink.types import Task

SEED = 5
SMALL = 2000
PLAN = {"epochs": 1, "train_batches": 1, "train_chunks": 1, "validation_chunks": 0,
        "test_chunks": 0}


def _config(reproducible: bool, **privacy: object) -> RunConfig:
    return RunConfig(seed=SEED, data=DataConfig(dataset="sklearn-small"),
                     privacy=PrivacyConfig(reproducible_noise=reproducible,
                                           **privacy))  # type: ignore[arg-type]


def _held_seeds(derived: int) -> list[int]:
    """What the peer tries: the run seed, the seed the code derives from it, 0..SMALL."""
    return [SEED, derived, *range(SMALL)]


def _label_seed() -> int:
    return int(np.random.SeedSequence([SEED, 0x1AB]).generate_state(1, np.uint64)[0] >> 1)


def _labels(reproducible: bool, mode: str, n: int, **privacy: object) -> LabelProtection:
    settings = resolve_settings(label_settings(_config(reproducible, labels=mode, **privacy)),
                                Task.BINARY)
    assert settings is not None
    return LabelProtection(settings, task=Task.BINARY, party="primary", n_rows=n, classes=2)


@pytest.mark.parametrize("reproducible", [False, True])
def test_marvells_draws_are_regenerated_only_when_seeded(reproducible: bool) -> None:
    """Marvell sends gᵢ + ν⁰ᵢ·a_y·u + ν⊥ᵢ·s_y (Li et al. §4): a peer that also knew the clean
    rows would find each row's noise along u proportional to its draw ν⁰ᵢ, and could subtract
    it; no seed it holds gives those draws unless the run seeded them."""
    n, d = 256, 16
    gen = torch.Generator().manual_seed(0)
    y = (torch.rand(n, generator=gen) < 0.3).float()
    g = torch.randn(n, d, generator=gen, dtype=torch.float64) * 0.1 + y[:, None].double()
    protection = _labels(reproducible, "marvell", n)
    assert protection.noise_kind == ("reproducible" if reproducible else "secret")
    noise = protection.perturb(g, y).double() - g
    # most of it lies along one direction, ν⁰ᵢ times a per-class amount (a₀ ≈ a₁ here)
    unit = torch.linalg.svd(noise, full_matrices=False)[2][0]
    along = (noise @ unit).numpy()
    matched = []
    for seed in _held_seeds(_label_seed()):
        first = torch.randn((n, d + 1), generator=torch.Generator().manual_seed(seed),
                            dtype=torch.float64)[:, 0].numpy()
        if abs(float(np.corrcoef(along, first)[0, 1])) > 0.99:
            matched.append(seed)
    assert matched == ([_label_seed()] if reproducible else [])


@pytest.mark.parametrize("reproducible", [False, True])
def test_max_norms_scale_draws_are_regenerated_only_when_seeded(reproducible: bool) -> None:
    """max-norm sends gᵢ·(1 + ξᵢσᵢ): a peer that also knew the clean rows would read each ξᵢ
    back; no seed it holds gives those ξ unless the run seeded them."""
    n = 64
    g = torch.rand(n, 4, generator=torch.Generator().manual_seed(1), dtype=torch.float64) + 0.1
    protection = _labels(reproducible, "max-norm", n)
    sent = protection.perturb(g, torch.zeros(n))
    norms2 = (g ** 2).sum(1)
    sigma = torch.sqrt(norms2.max() / norms2 - 1)
    keep = sigma > 1e-6
    xi = ((sent[:, 0] / g[:, 0] - 1) / torch.where(keep, sigma, 1.0))[keep]
    matched = [seed for seed in _held_seeds(_label_seed())
               if torch.allclose(torch.randn(n, generator=torch.Generator().manual_seed(seed),
                                             dtype=torch.float64)[keep], xi, atol=1e-6)]
    assert matched == ([_label_seed()] if reproducible else [])


@pytest.mark.parametrize("reproducible", [False, True])
def test_rr_priors_flips_are_undone_only_when_seeded(reproducible: bool) -> None:
    """rr-prior trains on labels randomised once, which its gradients show in clear; with the
    uniforms regenerated the peer knows which labels were flipped and undoes them."""
    n = 400
    y = (torch.rand(n, generator=torch.Generator().manual_seed(2)) < 0.4).long()
    protection = _labels(reproducible, "rr-prior", n, labels_total_epsilon=1.0)
    noisy = protection.randomize(y.clone(), np.arange(n)).numpy()
    keep = math.exp(1.0) / (math.exp(1.0) + 1.0)
    best = 0.0
    for seed in _held_seeds(_label_seed()):
        u = torch.rand((n, 2), generator=torch.Generator().manual_seed(seed),
                       dtype=torch.float64).numpy()[:, 0]
        guess = np.where(u < keep, noisy, 1 - noisy)
        best = max(best, float(np.mean(guess == y.numpy())))
    if reproducible:
        assert best == 1.0
    else:  # about the keep rate (0.73): the best of 2,000 guesses stays far from 1
        assert best < 0.85


@pytest.mark.parametrize("reproducible", [False, True])
def test_randomized_response_codes_are_read_only_when_seeded(reproducible: bool) -> None:
    """The primary receives each record's code once by k-ary randomized response; with the
    draws regenerated it knows which codes were kept (the true ones) without error."""
    n, bits = 1000, 3
    cfg = _config(reproducible, embeddings="randomized-response", total_epsilon=1.0,
                  delta=1e-5, code_bits=bits, labels="off")
    seed = noise_seed(cfg, 0)  # what the in-process federation gives secondary 0
    assert (seed is not None) is reproducible
    dp = EmbeddingDP(cfg.privacy, party="bank", n_rows=n, seed=seed)
    dp.note_links(np.ones(n, dtype=np.int64))
    dp.set_plan(PLAN)
    x = torch.randn(n, 4, generator=torch.Generator().manual_seed(3))
    sent = dp.release(torch.zeros(n, 2), np.arange(n), x)[1].argmax(1).numpy()
    truth = dp.quantise(x)
    k, eps = 2 ** bits, dp.calibration.epsilon if dp.calibration else 0.0
    keep = rr.keep_probability(eps, k)
    derived = noise_seed(_config(True, embeddings="randomized-response", total_epsilon=1.0,
                                 delta=1e-5, code_bits=bits, labels="off"), 0)
    assert derived is not None
    best = 0.0
    for candidate in _held_seeds(derived):
        u = torch.rand(n, generator=torch.Generator().manual_seed(candidate),
                       dtype=torch.float64).numpy()
        kept = u < keep
        best = max(best, float(np.mean(sent[kept] == truth[kept])))
    if reproducible:
        assert best == 1.0
    else:
        assert best < keep + 0.15


@pytest.mark.parametrize("reproducible", [False, True])
def test_union_trainings_synthetic_draws_come_from_the_spec_seed_only_when_seeded(
        reproducible: bool) -> None:
    """The active party's synthetic labels (label-random-pos) are drawn per batch; the peer
    receives the spec's seed in UnionSetup. Built as UnionPrimary builds its source."""
    spec_seed = SEED
    source = NoiseSource(seed=spec_seed * 104729 + 7) if reproducible else NoiseSource()
    ctx = syn.LabelContext(n=200, positive_rate=0.5, generator=source)
    labels = syn.LABEL_STRATEGIES.get("label-random-pos")(ctx).numpy()
    matched = []
    for seed in [spec_seed, spec_seed * 104729 + 7, *range(SMALL)]:
        guess = (torch.rand(200, generator=torch.Generator().manual_seed(seed)) < 0.5).float()
        if np.array_equal(guess.numpy(), labels):
            matched.append(seed)
    assert matched == ([spec_seed * 104729 + 7] if reproducible else [])


class _Table:
    """A secondary's encoded table as union training reads it (a public data set, say)."""

    def __init__(self, rows: np.ndarray) -> None:
        self.matrix = rows

    def chunks(self) -> list[np.ndarray]:
        return [self.matrix]


def test_union_stand_ins_are_keyed_by_the_partys_own_secret() -> None:
    """fea-sampling's stand-ins: a peer that knows the secondary's table (a public data set),
    the session and the spec's seed rebuilds the reproducible key and the assignment; the
    default key also mixes in the party's own secret, so the same knowledge predicts
    nothing."""
    from vflink.parties.union import _session_key
    from vflink.randomness import keyed_generator, party_secret

    table = _Table(np.arange(40, dtype=np.float32).reshape(20, 2))
    own = np.arange(20, dtype=np.int64)
    session, seed = "psu@0123456789ab", SEED
    peer_guess = syn.assigned_rows(own, 50, _session_key(table, session, seed))  # type: ignore[arg-type]
    seeded = syn.assigned_rows(own, 50, _session_key(table, session, seed))  # type: ignore[arg-type]
    assert np.array_equal(peer_guess, seeded)  # behind the switch: regenerated
    key = _session_key(table, session, seed, secret=party_secret(None))  # type: ignore[arg-type]
    secret = syn.assigned_rows(own, 50, keyed_generator(key, "stand-ins"))
    assert not np.array_equal(peer_guess, secret)
    # and stable across runs of the same session: the same party secret, the same stand-ins
    again = _session_key(table, "psu@ffffffffffff", seed, secret=party_secret(None))  # type: ignore[arg-type]
    assert np.array_equal(secret, syn.assigned_rows(own, 50, keyed_generator(again,
                                                                              "stand-ins")))
