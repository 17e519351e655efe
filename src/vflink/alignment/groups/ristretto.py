"""ristretto255 through libsodium (rbcl's bindings): the fast default group.

Ristretto255 is a prime-order group built on Curve25519, in which DDH is believed hard as in the
paper's QR(Z_p*) (FLORIST §2.3); elements are 32 bytes against 256, and an exponentiation costs
a fraction of a 2048-bit modular one. Hashing uses ``crypto_core_ristretto255_from_hash`` on a
64-byte SHA-512 digest (the Elligator-based map of RFC 9496). rbcl's cffi calls release the GIL,
so a thread pool uses every core.

PyNaCl (1.6) does not expose libsodium's ristretto255 functions, hence rbcl, which bundles
libsodium and exposes exactly these.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

import numpy as np
import rbcl

from vflink.alignment.groups.base import Elements, Group

__all__ = ["Ristretto255"]


def _remove_rbcl_copy() -> None:
    """rbcl loads its bundled libsodium from a copy it writes to the temporary directory
    (``NamedTemporaryFile(delete=False)``) and never removes: 2.7 MB left in ``/tmp`` by every
    process that imports it. Once loaded, the file is no longer needed (the mapping outlives
    its name on POSIX; on Windows the removal fails and the file stays, as before)."""
    module = sys.modules.get("rbcl._sodium") or sys.modules.get("_sodium")
    path = getattr(module, "lib_path", None)
    if isinstance(path, str) and os.path.basename(path).startswith("tmp"):
        try:
            os.unlink(path)
        except OSError:
            pass


_remove_rbcl_copy()

#: The order of the ristretto255 group: 2^252 + 27742317777372353535851937790883648493.
ORDER = 2**252 + 27742317777372353535851937790883648493
#: The identity's canonical encoding (RFC 9496 §4.3.2: all zero bytes).
_IDENTITY = bytes(32)


class Ristretto255(Group):
    name = "ristretto255"
    element_bytes = 32
    order = ORDER

    def _hash_one(self, digest: bytes) -> bytes:
        return bytes(rbcl.crypto_core_ristretto255_from_hash(digest))

    def _power_chunk(self, elements: Elements, exponent: int) -> Elements:
        scalar = exponent.to_bytes(32, "little")
        mult = rbcl.crypto_scalarmult_ristretto255
        raw = b"".join(mult(scalar, row.tobytes()) for row in elements)
        return np.frombuffer(raw, dtype=np.uint8).reshape(len(elements), 32).copy()

    def _power_checked_chunk(self, elements: Elements, exponent: int) -> Elements | None:
        # libsodium's crypto_scalarmult_ristretto255 decodes its point first and fails (rbcl:
        # RuntimeError) on a non-canonical encoding, exactly where is_valid_point fails, and
        # on an identity result, which a non-zero exponent below the order gives only for the
        # identity: the same rows _valid_chunk refuses, at no extra cost (tested against it).
        try:
            return self._power_chunk(elements, exponent)
        except RuntimeError:
            return None

    def _valid_chunk(self, elements: Elements) -> bool:
        # is_valid_point accepts canonical encodings of group elements; the identity (all
        # zero) is refused separately, since x^e would then reveal nothing but be degenerate.
        valid = rbcl.crypto_core_ristretto255_is_valid_point
        return all(valid(row.tobytes()) for row in elements) and bool(
            np.all(elements.any(axis=1)))

    def _generator(self) -> bytes:
        return bytes(rbcl.crypto_scalarmult_ristretto255_base((1).to_bytes(32, "little")))

    def _identity(self) -> bytes:
        return _IDENTITY

    def _operate(self, a: bytes, b: bytes) -> bytes:
        return bytes(rbcl.crypto_core_ristretto255_add(a, b))

    def _combination_chunk(self, elements: Elements, scalars: Sequence[int]) -> bytes:
        mult = rbcl.crypto_scalarmult_ristretto255_allow_scalar_zero
        add = rbcl.crypto_core_ristretto255_add
        acc = _IDENTITY
        for row, c in zip(elements, scalars, strict=True):
            acc = add(acc, mult(int(c).to_bytes(32, "little"), row.tobytes()))
        return bytes(acc)
