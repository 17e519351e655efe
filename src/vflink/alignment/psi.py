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

from collections.abc import Iterable
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
    out = group.power(group.validate(received, "blinded elements"), exponent)
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


def intersect_buckets(pairs: Iterable[tuple[Bucket, Bucket]], *, ordered: bool) -> PsiResult:
    """:func:`intersect` one hash bucket at a time (issue 22): ``pairs`` yields, per bucket of
    equal leading bits, (our doubly blinded elements with our record rows, theirs with
    anything). Equal elements share a bucket, so the union of the buckets' intersections is the
    intersection; the result is the same as :func:`intersect`'s (rows ascending)."""
    rows_parts: list[npt.NDArray[np.int64]] = []
    uid_parts: list[Elements] = []
    size = 0
    for (mine, mine_rows), (theirs, _) in pairs:
        ref = sorted_unique(theirs)
        if len(ref) != len(theirs):
            raise ProtocolError("the peer's list holds repeated elements")
        if len(sorted_unique(mine)) != len(mine):
            raise DataError("our own list holds repeated elements: set alignment needs unique "
                            "keys")
        hit = lookup(ref, mine, "own elements", missing_ok=True) >= 0
        size += int(hit.sum())
        if ordered:
            rows_parts.append(mine_rows[hit])
            uid_parts.append(mine[hit])
    if not ordered:
        return PsiResult(rows=None, uids=None, size=size)
    width = uid_parts[0].shape[1] if uid_parts else 0
    rows = np.concatenate(rows_parts) if rows_parts else np.empty(0, dtype=np.int64)
    uids = np.concatenate(uid_parts) if uid_parts else np.empty((0, width), dtype=np.uint8)
    sort = np.argsort(rows, kind="stable")
    return PsiResult(rows=rows[sort].astype(np.int64), uids=np.ascontiguousarray(uids[sort]),
                     size=size)
