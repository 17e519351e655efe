"""ECDH private set intersection on the same groups (Diffie-Hellman PSI, as in Buddhavarapu
et al. 2020 without the union part).

P_a sends H(x)^a for its records in a secret random order; P_b returns those raised to b (in
the same order if P_a is to learn the intersection, shuffled otherwise) and H(y)^b for its own
records, shuffled. P_a raises the latter to a: equal values H(x)^{ab} = H(y)^{ba} are the
intersection. If P_b is to learn it too, P_a returns H(y)^{ba} in the order received, which P_b
can map back to its records. Each party learns |I_a|, |I_b| and, depending on ``reveal``, the
intersection or only its size.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from vflink.alignment._dh import lookup, secure_permutation, sorted_unique
from vflink.alignment.groups import Elements, Group
from vflink.errors import ConfigError, DataError, ProtocolError

__all__ = ["REVEALS", "PsiResult", "Reveal", "blind", "check_reveal", "intersect",
           "intersect_buckets", "reblind"]

Reveal = Literal["both", "primary", "secondary", "cardinality"]
#: who learns the intersection: both parties, one of them (the other still learns its size),
#: or nobody (the primary learns only |I_a ∩ I_b|)
REVEALS: tuple[str, ...] = ("both", "primary", "secondary", "cardinality")


def check_reveal(reveal: str) -> Reveal:
    if reveal not in REVEALS:
        raise ConfigError(f"`reveal` must be one of {', '.join(REVEALS)}, got {reveal!r}")
    return reveal  # type: ignore[return-value]


@dataclass(frozen=True)
class PsiResult:
    """One party's output: which own records are in the intersection (ascending rows, or
    None when only the size is known), their shared identifiers, and the size."""

    rows: npt.NDArray[np.int64] | None
    uids: Elements | None
    size: int


def blind(group: Group, own: Elements, exponent: int
          ) -> tuple[Elements, npt.NDArray[np.int64]]:
    """Own elements to the exponent, in a secret random order; returns (sent, order) where
    ``sent[i]`` belongs to own record ``order[i]``."""
    order = secure_permutation(len(own))
    return group.power(own[order], exponent), order


def reblind(group: Group, received: Elements, exponent: int, *, keep_order: bool
            ) -> Elements:
    """The peer's blinded elements raised to our exponent, kept in order or shuffled."""
    out = group.power(received, exponent, check="blinded elements")
    return out if keep_order else np.ascontiguousarray(out[secure_permutation(len(out))])


def intersect(mine_double: Elements, order: npt.NDArray[np.int64], theirs_double: Elements,
              *, ordered: bool) -> PsiResult:
    """Our doubly blinded elements against theirs.

    ``mine_double[i]`` belongs to own record ``order[i]`` when ``ordered``; otherwise only the
    number of common elements can be known.
    """
    ref = sorted_unique(theirs_double)
    if len(ref) != len(theirs_double):
        raise ProtocolError("the peer's list holds repeated elements")
    hit = lookup(ref, mine_double, "own elements", missing_ok=True) >= 0
    size = int(hit.sum())
    if not ordered:
        return PsiResult(rows=None, uids=None, size=size)
    rows = order[hit]
    sort = np.argsort(rows, kind="stable")
    return PsiResult(rows=rows[sort].astype(np.int64),
                     uids=np.ascontiguousarray(mine_double[hit][sort]), size=size)


Bucket = tuple[Elements, npt.NDArray[np.int64]]


def bucket_hits(mine: Elements, theirs: Elements) -> npt.NDArray[np.bool_]:
    """Which of our doubly blinded elements in one bucket the peer's bucket holds; either list
    holding an element twice is refused (keys must be unique, and a peer's repeat is a
    protocol fault)."""
    ref = sorted_unique(theirs)
    if len(ref) != len(theirs):
        raise ProtocolError("the peer's list holds repeated elements")
    if len(sorted_unique(mine)) != len(mine):
        raise DataError("our own list holds repeated elements: set alignment needs unique keys")
    return lookup(ref, mine, "own elements", missing_ok=True) >= 0


def intersect_buckets(pairs: Callable[[], Iterable[tuple[Bucket, Bucket]]], *, n_rows: int,
                      ordered: bool) -> PsiResult:
    """:func:`intersect` one hash bucket at a time, so no round is held whole in memory.

    ``pairs()`` yields, per bucket of equal leading bits, (our doubly blinded elements with our
    record rows in ``[0, n_rows)``, theirs with anything); equal elements share a bucket, so
    the union of the buckets' intersections is the intersection. The buckets are read twice
    (once to mark our rows that hit, once to place their UIDs), so memory holds one bucket and
    the result, never all hits twice; the result is :func:`intersect`'s (rows ascending).
    """
    hit_rows = np.zeros(n_rows if ordered else 0, dtype=bool)
    size = 0
    width = 0
    for (mine, mine_rows), (theirs, _) in pairs():
        width = mine.shape[1]
        hit = bucket_hits(mine, theirs)
        size += int(hit.sum())
        if ordered:
            hit_rows[mine_rows[hit]] = True
    if not ordered:
        return PsiResult(rows=None, uids=None, size=size)
    rows = np.flatnonzero(hit_rows).astype(np.int64)  # ascending
    position = np.cumsum(hit_rows) - 1  # a hit row's index in ``rows``
    del hit_rows
    uids = np.empty((len(rows), width), dtype=np.uint8)
    for (mine, mine_rows), (theirs, _) in pairs():
        hit = lookup(sorted_unique(theirs), mine, "own elements", missing_ok=True) >= 0
        uids[position[mine_rows[hit]]] = mine[hit]
    return PsiResult(rows=rows, uids=uids, size=size)
