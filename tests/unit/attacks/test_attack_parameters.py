"""Every attack checks its parameters when it is built, with the project's messages: the
parameter, what was expected and the value given, all problems at once."""

from __future__ import annotations

from typing import Any

import pytest

from vflink.attacks import get_attack
from vflink.errors import ConfigError

CASES = [
    ("label-completion", {"known": 1}, ["`known` must be an int ≥ 2, got 1"]),
    ("label-completion", {"known": True, "seed": -1},
     ["`known` must be an int ≥ 2, got True", "`seed` must be an int ≥ 0, got -1"]),
    ("label-fcm", {"seed": 1.5}, ["`seed` must be an int ≥ 0, got 1.5"]),
    ("label-kmeans", {"seed": -2}, ["`seed` must be an int ≥ 0, got -2"]),
    ("spectral", {"target": "labels", "statistic": "median"},
     ["`target` must be one of embeddings, gradients, got 'labels'",
      "`statistic` must be one of outlier, two-cluster, got 'median'"]),
    ("inversion-decoder", {"epochs": 0}, ["`epochs` must be an int ≥ 1, got 0"]),
    ("membership-shadow", {"shadow_models": 0}, ["`shadow_models` must be an int ≥ 1, got 0"]),
]


@pytest.mark.parametrize("attack,params,problems", CASES)
def test_bad_parameters_are_refused_with_every_problem(attack: str, params: dict[str, Any],
                                                       problems: list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        get_attack(attack, **params)
    assert list(info.value.problems) == problems
    assert f"invalid --param of attack {attack!r}" in str(info.value)
    for problem in problems:
        assert problem in str(info.value)


@pytest.mark.parametrize("attack", sorted({c[0] for c in CASES}))
def test_the_defaults_are_valid(attack: str) -> None:
    assert get_attack(attack).name == attack
