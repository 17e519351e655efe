"""The crypto bound of the set protocols: what PSU and ECDH PSI cannot do faster than.

Every group operation a protocol needs is counted per party and role (:func:`protocol_ops`), a
pure function of the set sizes; a machine's cost of each operation on one core is sampled
through the group's own chunk functions, the code every worker runs (:func:`sample_costs`);
the bound is the operations' one-core seconds divided by the cores the run uses
(:func:`crypto_bound_s`). A run's wall time divided by its bound says how much time went
elsewhere (reading keys, spooling to disk, messages, a cluster's start), and the per-operation
costs let a figure from one machine be checked on another.

The operations (:data:`OPERATIONS`):

* ``hash``: a record key hashed to the group (SHA-512, then the group's map);
* ``power``: an own element raised to a secret exponent;
* ``power_checked``: a peer's element validated and raised to a secret exponent (one pass:
  :meth:`~vflink.alignment.groups.Group.power` with ``check``);
* ``validate``: a peer's element checked without being exponentiated.

Counts follow the code of :mod:`vflink.parties.setalign` (a test runs both protocols and
compares the groups' own counters with these formulas).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, fields

from vflink.alignment.groups import Group
from vflink.alignment.psi import check_reveal
from vflink.errors import ConfigError

__all__ = ["OPERATIONS", "ROLES", "OpCosts", "OpCounts", "crypto_bound_s", "protocol_ops",
           "sample_costs"]

#: the group operations a set protocol is made of (see the module docstring)
OPERATIONS = ("hash", "power", "power_checked", "validate")
#: the driving party (the primary, FLORIST's active P_a) and the answering one (a secondary,
#: the passive P_p)
ROLES = ("primary", "secondary")


@dataclass(frozen=True, kw_only=True)
class OpCounts:
    """How many of each group operation one party does (or several, added)."""

    hash: int = 0
    power: int = 0
    power_checked: int = 0
    validate: int = 0

    def __add__(self, other: OpCounts) -> OpCounts:
        return OpCounts(**{f: getattr(self, f) + getattr(other, f) for f in OPERATIONS})

    def as_dict(self) -> dict[str, int]:
        return asdict(self)

    def one_core_s(self, costs: OpCosts) -> float:
        """Seconds these operations take on one core at ``costs``."""
        return sum(getattr(self, f) * getattr(costs, f) for f in OPERATIONS)


@dataclass(frozen=True, kw_only=True)
class OpCosts:
    """Seconds one operation of each kind takes on one core."""

    hash: float
    power: float
    power_checked: float
    validate: float

    @classmethod
    def mean(cls, *samples: OpCosts) -> OpCosts:
        if not samples:
            raise ConfigError("OpCosts.mean needs at least one sample")
        return cls(**{f.name: sum(getattr(s, f.name) for s in samples) / len(samples)
                      for f in fields(cls)})

    def as_us(self) -> dict[str, float]:
        """Microseconds per operation, rounded for a summary."""
        return {f: round(getattr(self, f) * 1e6, 2) for f in OPERATIONS}


def protocol_ops(method: str, role: str, *, n_a: int, n_p: int, n_union: int | None = None,
                 reveal: str = "both") -> OpCounts:
    """The group operations ``role`` does in one run of ``method`` with |I_a| = ``n_a`` (the
    primary's set), |I_p| = ``n_p`` and, for PSU, |I_a ∪ I_p| = ``n_union``.

    PSU (FLORIST Algorithm 1 as :mod:`vflink.parties.setalign` runs it), P_a: hashes its keys
    (line 3), raises them to s1 (line 3) and s2 (line 11) and the merged union to s2·s3
    (line 8); raises the peer's I_p^{t1} (line 6), x^{s2 t1 t2 t3} (line 12) and x^{t2}
    (line 11, for the peer) after checking them; checks I_a^{s1 t1} (line 7) and the final
    list U (line 10). P_p: hashes its keys, raises them to t1 (line 5) and t2 (line 11);
    raises I_a^{s1} (line 4), the blinded union (line 9), x^{s2} (line 11) and x^{s1 s2 s3
    t2} (line 12) after checking them; checks I_p^{s1 t1} (line 6). Together: 5|I_a| +
    5|I_p| + 2|U| exponentiations.

    ECDH PSI, P_a: hashes and blinds its keys, checks H(x)^{ab}, raises the peer's H(y)^b;
    P_p: hashes and blinds its keys, raises the peer's H(x)^a, and checks H(y)^{ba} when it
    learns the intersection (``reveal`` both or secondary).
    """
    if role not in ROLES:
        raise ConfigError(f"`role` must be one of {', '.join(ROLES)}, got {role!r}")
    if min(n_a, n_p) < 0:
        raise ConfigError(f"set sizes must be ≥ 0, got n_a={n_a}, n_p={n_p}")
    if method == "psu":
        if n_union is None or not max(n_a, n_p) <= n_union <= n_a + n_p:
            raise ConfigError(f"PSU's union size must be in [max(n_a, n_p), n_a + n_p], got "
                              f"{n_union} for n_a={n_a}, n_p={n_p}")
        if role == "primary":
            return OpCounts(hash=n_a, power=2 * n_a + n_union, power_checked=n_a + 2 * n_p,
                            validate=n_a + n_union)
        return OpCounts(hash=n_p, power=2 * n_p, power_checked=2 * n_a + n_p + n_union,
                        validate=n_p)
    if method == "psi":
        how = check_reveal(reveal)
        if role == "primary":
            return OpCounts(hash=n_a, power=n_a, power_checked=n_p, validate=n_a)
        return OpCounts(hash=n_p, power=n_p, power_checked=n_a,
                        validate=n_p if how in ("both", "secondary") else 0)
    raise ConfigError(f"`method` must be psu or psi, got {method!r}")


def crypto_bound_s(ops: Iterable[OpCounts], costs: OpCosts, cores: int) -> float:
    """The least wall time of ``ops`` (every party's, run one after the other as the protocol
    alternates) with ``cores`` cores busy all along."""
    if cores < 1:
        raise ConfigError(f"`cores` must be ≥ 1, got {cores}")
    return sum(o.one_core_s(costs) for o in ops) / cores


def _per_op(run: Callable[[], int], budget_s: float) -> float:
    """Seconds per operation of ``run`` (which does a batch and returns its size), repeated
    for at least ``budget_s`` and at least twice. Timed on this thread's CPU clock: the cost
    of the operation itself, not of other processes that share the cores at that moment
    (they show in the run's ratio to the bound instead, which assumes the cores are the
    run's)."""
    count, spent, calls = 0, 0.0, 0
    while calls < 2 or spent < budget_s:
        start = time.thread_time()
        count += run()
        spent += time.thread_time() - start
        calls += 1
    return spent / count


def sample_costs(group: Group, *, budget_s: float = 0.05) -> OpCosts:
    """Each operation's cost on one core, through ``group``'s own chunk functions (what each
    worker runs on a piece of a batch, in the calling thread), about ``budget_s`` per
    operation: a fraction of a second in all for ristretto255."""
    keys = [b"vflink-cost-sample-%d-" % i + secrets.token_bytes(8)
            for i in range(group.check_rows)]
    elements = group._hash_chunk(keys[:group.chunk_rows])
    exponent = group.random_exponent()

    def hashes() -> int:
        return len(group._hash_chunk(keys))

    def powers() -> int:
        return len(group._power_chunk(elements, exponent))

    def checked() -> int:
        out = group._power_checked_chunk(elements, exponent)
        if out is None:  # pragma: no cover - our own hashes are group elements
            raise ConfigError(f"{group.name}: sampled elements failed validation")
        return len(out)

    big = group._hash_chunk(keys)

    def valid() -> int:
        group._valid_chunk(big)
        return len(big)

    return OpCosts(hash=_per_op(hashes, budget_s), power=_per_op(powers, budget_s),
                   power_checked=_per_op(checked, budget_s), validate=_per_op(valid, budget_s))
