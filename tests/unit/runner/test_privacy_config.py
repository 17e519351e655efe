"""The [privacy] section is validated like every other section (all problems at once)."""

from __future__ import annotations

from pathlib import Path

import pytest

from vflink.errors import ConfigError
from vflink.runfiles.config import PrivacyConfig, parse_config
from vflink.runner.protections import check_privacy_task
from vflink.types import Task


def test_defaults_are_off_and_paper_based() -> None:
    c = PrivacyConfig()
    assert not c.enabled and c.delta == 1e-2 and c.clip == 1.0 and c.rescale_sigmas == 3.0
    assert c.rescale_cap is False  # Eq. 4 as printed; the cap is an opt-in departure
    assert PrivacyConfig(embeddings="afe").rescale and PrivacyConfig(embeddings="afe").adjust
    assert not PrivacyConfig(embeddings="rescale").adjust
    assert not PrivacyConfig(embeddings="adjust").rescale


def test_every_problem_is_reported_at_once() -> None:
    with pytest.raises(ConfigError) as info:
        PrivacyConfig(embeddings="strong", epsilon=0, delta=1.5, clip=-1, alpha=-1,
                      fcm_clusters=1, fcm_threshold=0, budget=-2, reproducible_noise="yes",
                      rescale_cap="no")
    problems = "\n".join(info.value.problems)
    for name in ("embeddings", "epsilon", "delta", "clip", "alpha", "fcm_clusters",
                 "fcm_threshold", "budget", "reproducible_noise", "rescale_cap"):
        assert f"privacy.{name}" in problems
    assert len(info.value.problems) == 10


def test_budget_below_one_release_and_seeds_only_behind_the_switch() -> None:
    with pytest.raises(ConfigError, match="privacy.budget.*below the ε of a single release"):
        PrivacyConfig(embeddings="vanilla", epsilon=2.0, budget=1.0)
    # a seed makes the noise regenerable: only behind the one switch, said so
    for key in ("seed", "labels_seed"):
        with pytest.raises(ConfigError, match=f"privacy.{key}.*reproducible_noise = true"):
            PrivacyConfig(embeddings="vanilla", **{key: 3})
        assert getattr(PrivacyConfig(embeddings="vanilla", reproducible_noise=True,
                                     **{key: 3}), key) == 3


def test_the_retired_secure_rng_keys_say_what_to_write_instead() -> None:
    raw = {"version": 1, "data": {"dataset": "adult"},
           "privacy": {"embeddings": "afe", "secure_rng": True, "labels_secure_rng": False}}
    with pytest.raises(ConfigError) as info:
        parse_config(raw)
    text = "\n".join(info.value.problems)
    assert "`privacy.secure_rng` is gone: every protective draw is secret by default" in text
    assert "`privacy.labels_secure_rng` is gone" in text
    assert "unknown key" not in text  # named for what they were, not as typos


def test_parse_config_reads_the_section_and_rejects_unknown_keys() -> None:
    raw = {"version": 1, "data": {"dataset": "adult"},
           "privacy": {"embeddings": "afe", "epsilon": 2.0, "budget": 50.0}}
    config = parse_config(raw)
    assert config.privacy == PrivacyConfig(embeddings="afe", epsilon=2.0, budget=50.0)
    raw["privacy"] = {"embeddings": "afe", "epsilonn": 2.0, "clip": 0}
    raw["training"] = {"epochs": 0}
    with pytest.raises(ConfigError) as info:
        parse_config(raw)
    text = "\n".join(info.value.problems)
    assert "[privacy] has unknown key(s) ['epsilonn']" in text
    assert "training.epochs" in text  # other sections' problems in the same report


def test_adjust_needs_classification() -> None:
    check_privacy_task(PrivacyConfig(embeddings="rescale"), Task.REGRESSION)
    for mode in ("adjust", "afe"):
        with pytest.raises(ConfigError, match="distribution adjusting.*classification"):
            check_privacy_task(PrivacyConfig(embeddings=mode), Task.REGRESSION)


def test_a_party_file_may_carry_its_own_privacy_section(tmp_path: Path) -> None:
    from vflink.runfiles.party import load_party_config

    base = ('version = 1\n[party]\nname = "bank"\nrole = "secondary"\n'
            'listen = "127.0.0.1:1"\ndataset = "adult"\n[peers.coordinator]\n'
            'address = "127.0.0.1:2"\nrole = "coordinator"\n[security]\ninsecure = true\n')
    good = tmp_path / "good.toml"
    good.write_text(base + '[privacy]\nembeddings = "afe"\nepsilon = 4.0\n')
    assert load_party_config(good).privacy == PrivacyConfig(embeddings="afe", epsilon=4.0)
    seeded = tmp_path / "seeded.toml"  # its own seed, behind its own switch
    seeded.write_text(base + '[privacy]\nembeddings = "afe"\nepsilon = 4.0\nseed = 9\n'
                      'reproducible_noise = true\n')
    assert load_party_config(seeded).privacy == PrivacyConfig(
        embeddings="afe", epsilon=4.0, seed=9, reproducible_noise=True)
    unseeded = tmp_path / "unseeded.toml"
    unseeded.write_text(base + '[privacy]\nembeddings = "afe"\nreproducible_noise = true\n')
    with pytest.raises(ConfigError, match="needs its own `privacy.seed`"):
        load_party_config(unseeded)
    bad = tmp_path / "bad.toml"
    bad.write_text(base + '[privacy]\nembeddings = "max"\nclip = -1\n')
    with pytest.raises(ConfigError) as info:
        load_party_config(bad)
    assert any("privacy.embeddings" in p for p in info.value.problems)
    assert any("privacy.clip" in p for p in info.value.problems)


def test_a_coordinator_seed_needs_the_switch(tmp_path: Path) -> None:
    from vflink.runfiles.party import load_party_config

    base = ('version = 1\n[party]\nname = "coordinator"\nrole = "coordinator"\n'
            'listen = "127.0.0.1:1"\nseed = 4\n[security]\ninsecure = true\n')
    plain = tmp_path / "plain.toml"
    plain.write_text(base)
    with pytest.raises(ConfigError, match="party.seed.*secret unless"):
        load_party_config(plain)
    switched = tmp_path / "switched.toml"
    switched.write_text(base + "[privacy]\nreproducible_noise = true\n")
    assert load_party_config(switched).seed == 4
