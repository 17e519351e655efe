"""modp2048: the paper's group, the quadratic residues QR(Z_p*) of the RFC 3526 2048-bit safe
prime, through gmpy2 (GMP). The reference twin of ristretto255 (ARCHITECTURE.md convention 8).

FLORIST Algorithm 1 works in QR(Z_p*) for a safe prime p = 2q + 1, a group of prime order q in
which DDH is believed hard (§2.3). A key is hashed to Z_p* (SHA-512 expanded with SHAKE-256 to
2048 + 128 bits, reduced mod p) and squared, which lands in QR(Z_p*). Elements travel as 256-byte
big-endian integers. GMP holds the GIL, so large batches use a process pool (each piece a
module-level task of :mod:`vflink.alignment.groups.base`, pickled to a worker).
"""

from __future__ import annotations

import hashlib
import multiprocessing
from concurrent.futures import Executor, ProcessPoolExecutor

import gmpy2
import numpy as np

from vflink.alignment.groups.base import Elements, Group

__all__ = ["RFC3526_2048", "Modp2048"]

#: RFC 3526 §3, the 2048-bit MODP group's prime p = 2^2048 - 2^1984 - 1 + 2^64 * (⌊2^1918 π⌋
#: + 124476); (p - 1) / 2 is prime.
RFC3526_2048 = int(
    "FFFFFFFFFFFFFFFFC90FDAA22168C234C4C6628B80DC1CD129024E088A67CC74020BBEA63B139B22514A0879"
    "8E3404DDEF9519B3CD3A431B302B0A6DF25F14374FE1356D6D51C245E485B576625E7EC6F44C42E9A637ED6B"
    "0BFF5CB6F406B7EDEE386BFB5A899FA5AE9F24117C4B1FE649286651ECE45B3DC2007CB8A163BF0598DA4836"
    "1C55D39A69163FA8FD24CF5F83655D23DCA3AD961C62F356208552BB9ED529077096966D670C354E4ABC9804"
    "F1746C08CA18217C32905E462E36CE3BE39E772C180E86039B2783A2EC07A28FB5C55DF06F4C52C9DE2BCBF6"
    "955817183995497CEA956AE515D2261898FA051015728E5A8AACAA68FFFFFFFFFFFFFFFF", 16)

_P = gmpy2.mpz(RFC3526_2048)
_Q = (RFC3526_2048 - 1) // 2
_BYTES = 256


def _power_rows(raw: bytes, exponent: int) -> bytes:
    """``x^e mod p`` per 256-byte row."""
    e = gmpy2.mpz(exponent)
    out = bytearray()
    for i in range(0, len(raw), _BYTES):
        x = gmpy2.mpz(int.from_bytes(raw[i:i + _BYTES], "big"))
        out += int(gmpy2.powmod(x, e, _P)).to_bytes(_BYTES, "big")
    return bytes(out)


def _power_array(elements: Elements, exponent: int) -> Elements:
    raw = _power_rows(elements.tobytes(), exponent)
    return np.frombuffer(raw, dtype=np.uint8).reshape(len(elements), _BYTES).copy()


class Modp2048(Group):
    name = "modp2048"
    element_bytes = _BYTES
    order = _Q
    parallel_threshold = 512
    chunk_rows = 32  # ~3.5 ms per 2048-bit exponentiation: ~0.1 s per chunk
    min_power_s = 1e-3

    def _hash_one(self, digest: bytes) -> bytes:
        wide = hashlib.shake_256(digest).digest(_BYTES + 16)  # 128 extra bits: negligible bias
        x = gmpy2.mpz(int.from_bytes(wide, "big")) % _P
        if x == 0:  # probability 2^-2048; keep the map total anyway
            x = gmpy2.mpz(2)
        return int(gmpy2.powmod(x, 2, _P)).to_bytes(_BYTES, "big")

    def _power_chunk(self, elements: Elements, exponent: int) -> Elements:
        return _power_array(elements, exponent)

    def _new_executor(self) -> Executor:
        # spawn, not fork: the parent may run gRPC threads, which fork does not survive
        return ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"))

    def _valid_chunk(self, elements: Elements) -> bool:
        # x ∈ QR(Z_p*) \ {1} iff 1 < x < p and the Legendre symbol (x/p) = 1
        for row in elements:
            x = gmpy2.mpz(int.from_bytes(row.tobytes(), "big"))
            if not 1 < x < _P or gmpy2.legendre(x, _P) != 1:
                return False
        return True
