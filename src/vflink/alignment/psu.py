"""Private set union (FLORIST Algorithm 1) as pure step functions, and the simulators of App. A.

Two parties, the active P_a (labels; vflink's primary) and the passive P_p (a secondary), hold
record-ID sets I_a and I_p hashed into a prime-order group. Each draws three secret exponents
(lines 1-2). The union is computed under two rounds of blinding (lines 3-10), and
separately each party learns the final blinded value of each of its own records (lines 11-12),
which is its position in the sorted UID list U. Every list that leaves a party is shuffled, so
neither party learns which of its records the other holds; each learns only |I_a|, |I_p| and
|I_a ∪ I_p| (Theorem 1, for parties that follow the protocol: App. A's simulators are for
honest-but-curious parties).

**Line 11 as vflink runs it.** In the paper P_a sends x^{s2} for its records in line 11, a list
the passive party cannot relate to anything it has seen: a primary that sent guessed IDs there
(or swapped its own records between lines 3 and 11) learned from U which guesses the secondary
holds. vflink's P_p instead raises the round-1 list it already received, ``I_a^{s1}`` in P_a's
(secret) order, to t1·t2·t3 and returns it in that order (:func:`line11_peer`); P_a, who knows
its order, finishes with s2·s3 (:func:`line11_finish`). Each record's final value is
x^{s1 s2 s3 t1 t2 t3} as in the paper, so honest results are unchanged; what P_a can learn
about is only what it committed to in line 3. P_p's view loses the list x^{s2} (S_p's line 13)
and gains nothing; P_a receives x^{s1 t1 t2 t3} instead of x^{s2 t1 t2 t3}, a value it maps to
the other with its own exponents, so S_a simulates it as k_i^{s1} instead of k_i^{s2} (line 16).
It also saves P_a |I_a| exponentiations. What a primary that deviates elsewhere can still learn
is in docs/security.md ("Threat model of the set protocols").

Line 12 (P_p's own records) keeps the paper's steps: the party that *owns* a record blinds it
with its second exponent, the peer raises it to the product of all three of its exponents, the
owner finishes with its first and third — :func:`blind_own`, :func:`raise_for_peer`,
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
    "line11_finish",
    "line11_peer",
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


def line11_peer(group: Group, a_s1t1: Elements, e: PsuExponents) -> Elements:
    """Line 11, P_p: the round-1 list it received, already raised to t1 (line 4) and kept in
    the order received, raised to t2·t3: x^{s1 t1 t2 t3}, in P_a's order of line 3."""
    return group.power(a_s1t1, group.combine(e.second, e.third))


def line11_finish(group: Group, received: Elements, e: PsuExponents) -> Elements:
    """Line 11, P_a: x^{s1 t1 t2 t3} raised to s2·s3, each record's final value (in the order
    of its line-3 list)."""
    return group.power(received, group.combine(e.second, e.third), check="x^{s1 t1 t2 t3}")


def blind_own(group: Group, own: Elements, e: PsuExponents) -> Elements:
    """Line 12, owner: x^{second} for each own record, in own order."""
    return group.power(own, e.second)


def raise_for_peer(group: Group, received: Elements, e: PsuExponents) -> Elements:
    """Line 12, peer: y^{first·second·third}, in the order received (validated in the same
    pass, :meth:`~vflink.alignment.groups.base.Group.power` with ``check``)."""
    return group.power(received, group.combine(e.first, e.second, e.third), check="x^{t2}")


def finish_own(group: Group, received: Elements, e: PsuExponents, uids: Elements,
               *, expected: int) -> PsuResult:
    """Line 12, owner: z^{first·third} per own record, located in U."""
    z = group.check(received, "x^{s1 s2 s3 t2}")
    if len(z) != expected:
        raise ProtocolError(f"expected {expected} elements for our records, got {len(z)}")
    final = group.power(z, group.combine(e.first, e.third), check="x^{s1 s2 s3 t2}")
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
    """Lines 10-12 one bucket at a time (memory bounded by a bucket): ``pairs`` yields, per
    bucket of equal leading bits in byte order, (the final union's elements, our final
    elements with their record rows). Sorted U is the buckets' sorted lists one after the
    other, so a record's index in U is its bucket's offset plus its rank in the bucket: the
    same result as :func:`line10` and :func:`finish_own` on whole lists."""
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
    and n_p - n_both fresh elements), ``union`` (line 11's K: |I_a ∪ I_p|), ``a_s1t123``
    (line 16, x^{s1 t1 t2 t3} as vflink runs line 11) and ``p_t2`` (line 18).
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
        "a_s1t123": group.random_elements(n_a),
        "p_t2": group.random_elements(n_p),
    }


def simulate_passive_view(group: Group, n_a: int, n_p: int, n_both: int
                          ) -> dict[str, Elements]:
    """What S_p (Algorithm 3) outputs as P_p's received messages.

    Keys: ``a_s1`` (line 3), ``p_s1t1`` (line 7), ``union_s123t1`` (line 9) and
    ``p_s123t2`` (line 17). As vflink runs line 11, P_p receives no x^{s2} (S_p's line 13):
    it raises the ``a_s1`` it already holds.
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
        "p_s123t2": group.random_elements(n_p),
    }
