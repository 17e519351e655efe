"""Private set union (FLORIST Algorithm 1) as pure step functions, and the simulators of App. A.

Two parties, the active P_a (labels; vflink's primary) and the passive P_p (a secondary), hold
record-ID sets I_a and I_p hashed into a prime-order group. Each draws three secret exponents
(lines 1-2). The union is computed under two rounds of blinding (lines 3-10), and
separately each party learns the final blinded value of each of its own records (lines 11-12),
which is its position in the sorted UID list U. Every list that leaves a party is shuffled, so
neither party learns which of its records the other holds; each learns only |I_a|, |I_p| and
|I_a ∪ I_p| (Theorem 1).

The party that *owns* a record in lines 11-12 follows the same three steps whichever side it is:
blind with its second exponent, the peer raises to the product of all three of its exponents,
the owner finishes with its first and third — :func:`blind_own`, :func:`raise_for_peer`,
:func:`finish_own`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from vflink.alignment._dh import lookup, secure_permutation, sorted_unique
from vflink.alignment.groups import Elements, Group
from vflink.errors import DataError, ProtocolError

__all__ = [
    "PsuExponents",
    "PsuResult",
    "blind_own",
    "finish_own",
    "line3",
    "lines4_5",
    "lines6_8",
    "line9",
    "line10",
    "locate_buckets",
    "raise_for_peer",
    "simulate_active_view",
    "simulate_passive_view",
]


@dataclass(frozen=True)
class PsuExponents:
    """One party's secret exponents (s1, s2, s3) or (t1, t2, t3) (Algorithm 1, lines 1-2)."""

    first: int
    second: int
    third: int

    @classmethod
    def draw(cls, group: Group) -> PsuExponents:
        return cls(group.random_exponent(), group.random_exponent(), group.random_exponent())

    def __repr__(self) -> str:  # never print secrets into logs
        return "PsuExponents(<secret>)"


@dataclass(frozen=True)
class PsuResult:
    """One party's output: the sorted UID list U and, for each own record, its index in U."""

    uids: Elements
    record_uid: npt.NDArray[np.int64]


def _shuffle(elements: Elements) -> Elements:
    return np.ascontiguousarray(elements[secure_permutation(len(elements))])


def line3(group: Group, own: Elements, e: PsuExponents) -> Elements:
    """P_a: I_a^{s1}, shuffled (sent to P_p)."""
    return _shuffle(group.power(own, e.first))


def lines4_5(group: Group, received: Elements, own: Elements, e: PsuExponents
             ) -> tuple[Elements, Elements]:
    """P_p: (I_a^{s1 t1} shuffled, I_p^{t1} shuffled), both sent to P_a."""
    a = group.power(received, e.first, check="I_a^s1")
    return _shuffle(a), _shuffle(group.power(own, e.first))


def lines6_8(group: Group, a_st: Elements, p_t: Elements, e: PsuExponents
             ) -> tuple[Elements, Elements]:
    """P_a: I_p^{s1 t1} shuffled (line 6, to P_p) and (I_a ∪ I_p)^{s1 s2 s3 t1} shuffled
    (lines 7-8, to P_p). The merge of line 7 is a set union: an ID in both sets has the same
    value x^{s1 t1} on both lists."""
    a_st = group.validate(a_st, "I_a^{s1 t1}")
    p_st = group.power(p_t, e.first, check="I_p^{t1}")
    union = sorted_unique(np.concatenate([a_st, p_st]))
    return _shuffle(p_st), _shuffle(group.power(union, group.combine(e.second, e.third)))


def line9(group: Group, union: Elements, e: PsuExponents) -> Elements:
    """P_p: (I_a ∪ I_p)^{s1 s2 s3 t1 t2 t3}, shuffled (to P_a)."""
    return _shuffle(group.power(union, group.combine(e.second, e.third),
                                check="(I_a ∪ I_p)^{s1 s2 s3 t1}"))


def line10(final: Elements, *, group: Group) -> Elements:
    """Both: sort the final list lexicographically to get U (duplicates mean a deviation)."""
    final = group.validate(final, "U")
    uids = sorted_unique(final)
    if len(uids) != len(final):
        raise ProtocolError("the union list holds repeated elements")
    return uids


def blind_own(group: Group, own: Elements, e: PsuExponents) -> Elements:
    """Lines 11-12, owner: x^{second} for each own record, in own order."""
    return group.power(own, e.second)


def raise_for_peer(group: Group, received: Elements, e: PsuExponents) -> Elements:
    """Lines 11-12, peer: y^{first·second·third}, in the order received."""
    return group.power(received, group.combine(e.first, e.second, e.third),
                       check="x^{s2} / x^{t2}")


def finish_own(group: Group, received: Elements, e: PsuExponents, uids: Elements,
               *, expected: int) -> PsuResult:
    """Lines 11-12, owner: z^{first·third} per own record, located in U."""
    z = group.check(received, "x^{s2 t1 t2 t3} / x^{s1 s2 s3 t2}")
    if len(z) != expected:
        raise ProtocolError(f"expected {expected} elements for our records, got {len(z)}")
    final = group.power(z, group.combine(e.first, e.third),
                        check="x^{s2 t1 t2 t3} / x^{s1 s2 s3 t2}")
    return PsuResult(uids=uids, record_uid=lookup(uids, final, "own records in U"))


def bucket_union(union: Elements, mine: Elements) -> tuple[Elements, npt.NDArray[np.int64]]:
    """One bucket's sorted union elements and each of our elements' rank in them; a repeated
    element in either list, or one of ours missing from the union, is refused."""
    uids = sorted_unique(union)
    if len(uids) != len(union):
        raise ProtocolError("the union list holds repeated elements")
    if len(sorted_unique(mine)) != len(mine):
        raise DataError("our own list holds repeated elements: set alignment needs unique keys")
    return uids, lookup(uids, mine, "own records in U")


def locate_buckets(pairs: Iterable[tuple[tuple[Elements, npt.NDArray[np.int64]],
                                          tuple[Elements, npt.NDArray[np.int64]]]],
                   n_own: int, width: int) -> PsuResult:
    """Lines 10-12 one bucket at a time (issue 22): ``pairs`` yields, per bucket of equal
    leading bits in byte order, (the final union's elements, our final elements with their
    record rows). Sorted U is the buckets' sorted lists one after the other, so a record's
    index in U is its bucket's offset plus its rank in the bucket: the same result as
    :func:`line10` and :func:`finish_own` on whole lists."""
    parts: list[Elements] = []
    record_uid = np.full(n_own, -1, dtype=np.int64)
    offset = 0
    for (union, _), (mine, rows) in pairs:
        uids, rank = bucket_union(union, mine)
        record_uid[rows] = rank + offset
        offset += len(uids)
        parts.append(uids)
    if (record_uid < 0).any():
        raise ProtocolError(f"expected {n_own} elements for our records, got "
                            f"{int((record_uid >= 0).sum())}")
    uids = np.concatenate(parts) if parts else np.empty((0, width), dtype=np.uint8)
    return PsuResult(uids=np.ascontiguousarray(uids), record_uid=record_uid)


# --- the simulators of FLORIST App. A (Algorithms 2 and 3) ----------------------------------


def simulate_active_view(group: Group, n_a: int, n_p: int, n_both: int) -> dict[str, Elements]:
    """What S_a (Algorithm 2) outputs as P_a's received messages, from |I_a|, |I_p|, |I_a ∩ I_p|.

    Keys name the received lists: ``a_s1t1`` (line 4), ``p_t1`` (line 5: n_both of the g_i
    and n_p - n_both fresh elements), ``union`` (line 11's K: |I_a ∪ I_p|), ``a_s2t123``
    (line 16) and ``p_t2`` (line 18).
    """
    s1 = group.random_exponent()
    g = group.random_elements(n_a)
    h = group.random_elements(n_p - n_both)
    m = n_a + n_p - n_both
    k = group.random_elements(m)
    return {
        "a_s1t1": _shuffle(group.power(g, s1)) if n_a else group.empty(),
        "p_t1": _shuffle(np.concatenate([g[:n_both], h])),
        "union": line10(k, group=group) if m else group.empty(),
        "a_s2t123": group.random_elements(n_a),
        "p_t2": group.random_elements(n_p),
    }


def simulate_passive_view(group: Group, n_a: int, n_p: int, n_both: int
                          ) -> dict[str, Elements]:
    """What S_p (Algorithm 3) outputs as P_p's received messages.

    Keys: ``a_s1`` (line 3), ``p_s1t1`` (line 7), ``union_s123t1`` (line 9), ``a_s2``
    (line 13) and ``p_s123t2`` (line 17).
    """
    t1 = group.random_exponent()
    g = group.random_elements(n_a)
    h = group.random_elements(n_p - n_both)
    m = n_a + n_p - n_both
    k = group.random_elements(m)
    both = group.power(g[:n_both], t1) if n_both else group.empty()
    return {
        "a_s1": _shuffle(g),
        "p_s1t1": _shuffle(np.concatenate([both, h])),
        "union_s123t1": _shuffle(group.power(k, t1)) if m else group.empty(),
        "a_s2": group.random_elements(n_a),
        "p_s123t2": group.random_elements(n_p),
    }
