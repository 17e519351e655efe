"""Batched Chaum–Pedersen (DLEQ) proofs: a list raised, element by element, to one committed
exponent.

In the Diffie–Hellman set protocols a party raises the other's elements to its secret exponent
and sends them back. Nothing in the values shows whether it used the same exponent for every
element, or the elements it was sent at all: a party that deviates there decides what the other
computes (in ECDH PSI, a primary that returns chosen values as ``p_ts`` decides which of the
secondary's rows it serves). A Chaum–Pedersen proof binds the answer to the exponent the party
committed to at the start of the session (``K = G^k``), without revealing it.

The statement for lists ``X`` and ``Y`` of equal length is ``Y_i = X_i^k`` for every ``i``. One
proof covers the whole list (RFC 9497 §2.2.1, ``ComputeComposites``): both sides derive 128-bit
coefficients ``c_i`` from a transcript hash, combine ``M = prod X_i^{c_i}`` and
``Z = prod Y_i^{c_i}``, and the proof shows ``log_G K = log_M Z``. If any ``Y_i`` differs from
``X_i^k``, ``Z = M^k`` holds for at most one value of the deviating coefficient per other choice,
so with probability at most ``2^-128`` over the hash. The proof itself is the Fiat–Shamir
version of the Chaum–Pedersen protocol (Chaum and Pedersen, CRYPTO '92): ``T1 = G^r``,
``T2 = M^r``, ``e = H(..., T1, T2)``, ``s = r - e·k``; the verifier recomputes
``T1 = G^s K^e`` and ``T2 = M^s Z^e``.

The transcript binds the group, a caller's context (session, list, chunk), the commitment and
both lists, so a proof replayed from another session, list or chunk, or over a list with one
element changed, swapped or moved, does not verify.

Pure maths (ARCHITECTURE.md): every multiplication is the group object's (libsodium for
ristretto255, GMP for the paper's modp2048 reference), and lists may be streamed in batches so a
proof over millions of elements never holds them all.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from vflink.alignment.groups import Elements, Group
from vflink.errors import ProtocolError

__all__ = [
    "COEFFICIENT_BYTES",
    "Pairs",
    "commit",
    "context",
    "prove",
    "prove_batches",
    "verify",
    "verify_batches",
]

#: Domain separation of every hash below (a proof of vflink's set protocols and nothing else).
_DOMAIN = b"vflink/dleq/v1\x00"
#: Coefficients of the batched statement: 128 bits, the soundness error of the batching.
COEFFICIENT_BYTES = 16
#: Coefficients are drawn in blocks of this many (one SHAKE-256 call per block).
_BLOCK = 4096

#: A list pair streamed in batches: called once per pass, it yields ``(X batch, Y batch)``.
Pairs = Callable[[], Iterable[tuple[Elements, Elements]]]


def _lp(data: bytes) -> bytes:
    """Length-prefixed bytes, so no two transcripts concatenate to the same string."""
    return len(data).to_bytes(8, "big") + data


def context(session: str, stream: str, index: int) -> bytes:
    """The caller's part of a transcript: which session, list and chunk a proof is about."""
    return (_lp(session.encode()) + _lp(stream.encode())
            + int(index).to_bytes(8, "big", signed=True))


def commit(group: Group, k: int) -> Elements:
    """``K = G^k``: the commitment a party sends before it raises anything with ``k``."""
    return group.power(group.generator(), k)


@dataclass
class _Digest:
    """Running hashes of the two lists and their length (the first pass of a proof)."""

    x: hashlib._Hash
    y: hashlib._Hash
    n: int = 0


def _scan(group: Group, pairs: Pairs) -> _Digest:
    d = _Digest(hashlib.sha512(), hashlib.sha512())
    for xs, ys in pairs():
        xs, ys = group.check(xs, "X"), group.check(ys, "Y")
        if len(xs) != len(ys):
            raise ProtocolError(f"a proof's lists differ in length ({len(xs)} and {len(ys)})")
        d.x.update(xs.tobytes())
        d.y.update(ys.tobytes())
        d.n += len(xs)
    return d


def _seed(group: Group, commitment: Elements, digest: _Digest, ctx: bytes) -> bytes:
    h = hashlib.sha512(_DOMAIN + b"seed")
    for part in (group.name.encode(), ctx, group.generator().tobytes(), commitment.tobytes(),
                 digest.n.to_bytes(8, "big"), digest.x.digest(), digest.y.digest()):
        h.update(_lp(part))
    return h.digest()


def _coefficients(seed: bytes, start: int, n: int) -> list[int]:
    """``c_start .. c_{start+n-1}``: each the same whichever batches a list is cut into."""
    out: list[int] = []
    i = start
    while len(out) < n:
        block, offset = divmod(i, _BLOCK)
        raw = hashlib.shake_256(_DOMAIN + b"coefficients" + seed
                                + block.to_bytes(8, "big")).digest(_BLOCK * COEFFICIENT_BYTES)
        take = min(_BLOCK - offset, n - len(out))
        words = np.frombuffer(raw, dtype=np.uint8).reshape(_BLOCK, COEFFICIENT_BYTES)
        out.extend(int.from_bytes(w.tobytes(), "big") for w in words[offset:offset + take])
        i += take
    return out


def _composite(group: Group, pairs: Pairs, seed: bytes, *, both: bool
               ) -> tuple[Elements, Elements | None]:
    """``M = prod X_i^{c_i}`` and (with ``both``) ``Z = prod Y_i^{c_i}``."""
    m, z = group.identity(), group.identity() if both else None
    at = 0
    for xs, ys in pairs():
        cs = _coefficients(seed, at, len(xs))
        at += len(xs)
        m = group.operate(m, group.combine_elements(xs, cs))
        if z is not None:
            z = group.operate(z, group.combine_elements(ys, cs))
    return m, z


def _challenge(group: Group, seed: bytes, m: Elements, z: Elements, t1: Elements,
               t2: Elements) -> int:
    h = hashlib.sha512(_DOMAIN + b"challenge")
    for part in (seed, m.tobytes(), z.tobytes(), t1.tobytes(), t2.tobytes()):
        h.update(_lp(part))
    return int.from_bytes(h.digest(), "big") % group.order


def _power(group: Group, element: Elements, exponent: int) -> Elements:
    # a combination of one term also takes the identity and a zero exponent (both occur only
    # with negligible probability, but a proof must never crash on them)
    return group.combine_elements(element, [exponent])


def prove_batches(group: Group, k: int, pairs: Pairs, *, ctx: bytes) -> bytes:
    """A proof that every ``Y_i = X_i^k`` for the lists ``pairs`` streams (two passes)."""
    commitment = commit(group, k)
    seed = _seed(group, commitment, _scan(group, pairs), ctx)
    m, _ = _composite(group, pairs, seed, both=False)
    z = _power(group, m, k)  # the prover knows k: one exponentiation, not a second combination
    r = group.random_exponent()
    e = _challenge(group, seed, m, z, _power(group, group.generator(), r), _power(group, m, r))
    s = (r - e * k) % group.order
    w = group.scalar_bytes
    return e.to_bytes(w, "big") + s.to_bytes(w, "big")


def verify_batches(group: Group, commitment: Elements, pairs: Pairs, proof: bytes, *,
                   ctx: bytes) -> bool:
    """Does ``proof`` show ``Y_i = X_i^k`` for every pair, with ``commitment = G^k``?"""
    w = group.scalar_bytes
    if not isinstance(proof, bytes) or len(proof) != 2 * w:
        return False
    e, s = int.from_bytes(proof[:w], "big"), int.from_bytes(proof[w:], "big")
    if e >= group.order or s >= group.order:
        return False
    commitment = group.check(commitment, "commitment")
    if len(commitment) != 1:
        return False
    seed = _seed(group, commitment, _scan(group, pairs), ctx)
    m, z = _composite(group, pairs, seed, both=True)
    if z is None:  # pragma: no cover - both=True
        return False
    g = group.generator()
    t1 = group.combine_elements(np.concatenate([g, commitment]), [s, e])
    t2 = group.combine_elements(np.concatenate([m, z]), [s, e])
    return _challenge(group, seed, m, z, t1, t2) == e


def prove(group: Group, k: int, xs: Elements, ys: Elements, *, ctx: bytes) -> bytes:
    """:func:`prove_batches` over two whole lists."""
    return prove_batches(group, k, lambda: [(xs, ys)], ctx=ctx)


def verify(group: Group, commitment: Elements, xs: Elements, ys: Elements, proof: bytes, *,
           ctx: bytes) -> bool:
    """:func:`verify_batches` over two whole lists."""
    return verify_batches(group, commitment, lambda: [(xs, ys)], proof, ctx=ctx)
