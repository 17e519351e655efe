"""The crypto bound: the operation counts per role against the groups' own counters in real
protocol runs, the checked exponentiation against a separate validation, the sampled costs."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import vflink.parties.setalign as setalign_module
import vflink.runner.align as align_module
from vflink.alignment.cost import (
    OPERATIONS,
    OpCosts,
    OpCounts,
    crypto_bound_s,
    protocol_ops,
    sample_costs,
)
from vflink.alignment.groups import Group, get_group
from vflink.data.schema import PartySchema
from vflink.data.table import PartyTable
from vflink.errors import ConfigError, ProtocolError
from vflink.runner.align import align_in_process


def _table(keys: list[str], name: str) -> PartyTable:
    frame = pd.DataFrame({"id": pd.Series(keys, dtype="string")})
    return PartyTable(PartySchema(name=name, role="secondary", key=("id",)), frame, name)


def _recording(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[Group]]:
    """Every group the driver (runner) and the answering party (setalign) make."""
    made: dict[str, list[Group]] = {"primary": [], "secondary": []}
    for role, module in (("primary", align_module), ("secondary", setalign_module)):
        def make(*args: Any, _role: str = role, **kwargs: Any) -> Group:
            g = get_group(*args, **kwargs)
            made[_role].append(g)
            return g
        monkeypatch.setattr(module, "get_group", make)
    return made


CASES = [("psu", "both"), ("psi", "both"), ("psi", "primary"), ("psi", "secondary"),
         ("psi", "cardinality")]


@pytest.mark.parametrize(("method", "reveal"), CASES)
@pytest.mark.parametrize("chunk_rows", [7, 100_000])
def test_counts_equal_what_each_party_did(monkeypatch: pytest.MonkeyPatch, method: str,
                                          reveal: str, chunk_rows: int) -> None:
    made = _recording(monkeypatch)
    ka = [f"k{i}" for i in range(40)]
    kp = [f"k{i}" for i in range(25, 55)]  # 15 shared: |U| = 55
    out = align_in_process(_table(ka, "primary"), _table(kp, "bank"), method=method,
                           reveal=reveal, workers=1, chunk_rows=chunk_rows)
    assert [len(v) for v in made.values()] == [1, 1]
    n_u = len(set(ka) | set(kp)) if method == "psu" else None
    for role, groups in made.items():
        want = protocol_ops(method, role, n_a=40, n_p=30, n_union=n_u, reveal=reveal)
        assert groups[0].counts == want.as_dict(), role
    if method == "psu":  # FLORIST Algorithm 1: 5|I_a| + 5|I_p| + 2|U| exponentiations
        total = protocol_ops("psu", "primary", n_a=40, n_p=30, n_union=55) + protocol_ops(
            "psu", "secondary", n_a=40, n_p=30, n_union=55)
        assert total.power + total.power_checked == 5 * 40 + 5 * 30 + 2 * 55
    assert out.operations == sum(made["primary"][0].counts[k] for k in ("hash", "power",
                                                                         "power_checked"))


def test_counts_refuse_impossible_sizes() -> None:
    with pytest.raises(ConfigError, match="union"):
        protocol_ops("psu", "primary", n_a=3, n_p=4, n_union=8)
    with pytest.raises(ConfigError, match="role"):
        protocol_ops("psi", "coordinator", n_a=3, n_p=4)
    with pytest.raises(ConfigError, match="method"):
        protocol_ops("exact", "primary", n_a=3, n_p=4)
    with pytest.raises(ConfigError, match="reveal"):
        protocol_ops("psi", "primary", n_a=3, n_p=4, reveal="nobody")


def test_bound_is_one_core_seconds_over_cores() -> None:
    costs = OpCosts(hash=10e-6, power=40e-6, power_checked=41e-6, validate=4e-6)
    ops = [OpCounts(hash=2, power=3), OpCounts(power_checked=5, validate=7)]
    one_core = 2 * 10e-6 + 3 * 40e-6 + 5 * 41e-6 + 7 * 4e-6
    assert crypto_bound_s(ops, costs, 2) == pytest.approx(one_core / 2)
    assert OpCosts.mean(costs, costs) == costs
    with pytest.raises(ConfigError):
        crypto_bound_s(ops, costs, 0)


@pytest.mark.parametrize("name", ["ristretto255", "modp2048"])
def test_sampled_costs_are_per_operation(name: str) -> None:
    costs = sample_costs(get_group(name, workers=1), budget_s=0.01)
    us = costs.as_us()
    assert set(us) == set(OPERATIONS) and all(v > 0 for v in us.values())
    # an exponentiation costs more than checking an element, in both groups
    assert costs.power > costs.validate


rows = st.lists(st.one_of(st.integers(0, 40), st.binary(min_size=32, max_size=32),
                          st.just(b"\0" * 32)), min_size=1, max_size=12)


@settings(max_examples=60, deadline=None)
@given(picks=rows)
def test_checked_power_refuses_exactly_what_validate_refuses(picks: list[Any]) -> None:
    """ristretto255 lets libsodium's exponentiation do the check: it must refuse the same rows
    as is_valid_point plus the identity (random bytes are mostly non-canonical)."""
    g = get_group("ristretto255", workers=1)
    valid = g.hash_to_group([b"k%d" % i for i in range(41)])
    x = np.stack([valid[p] if isinstance(p, int) else np.frombuffer(p, dtype=np.uint8)
                  for p in picks])
    e = g.random_exponent()
    try:
        g.validate(x, "x")
    except ProtocolError:
        with pytest.raises(ProtocolError, match="x: not every row"):
            g.power(x, e, check="x")
    else:
        np.testing.assert_array_equal(g.power(x, e, check="x"), g.power(x, e))


@pytest.mark.parametrize("name", ["ristretto255", "modp2048"])
@pytest.mark.parametrize("workers", [1, 2])
def test_checked_power_refuses_one_bad_row_in_a_large_batch(name: str, workers: int) -> None:
    g = get_group(name, workers=workers)
    g.parallel_threshold = 8  # the pool path on a small batch
    x = g.hash_to_group([b"k%d" % i for i in range(4 * g.chunk_rows + 3)])
    bad = x.copy()
    bad[len(x) // 2] = 0  # the identity, in a middle piece
    e = g.random_exponent()
    before = g.operations
    with pytest.raises(ProtocolError, match="peer rows: not every row"):
        g.power(bad, e, check="peer rows")
    assert g.operations == before  # nothing was counted (or returned)
    np.testing.assert_array_equal(g.power(x, e, check="peer rows"), g.power(x, e))
    g.close()
