"""Key confirmation: the data parties prove to each other that they hold the same secret.

Exact alignment (HMAC of the keys) and Bloom-filter linkage (HMAC-keyed q-grams and centres)
silently go wrong when two data parties hold different secrets: no digest matches, or every
Bloom filter is noise, and training goes on with a useless alignment. So before any alignment,
every data party sends the coordinator a *tag*

    tag = HMAC-SHA256(secret, [label, session, nonce, party])

and the others recompute the tag they expect for that party under their own secret and compare
(in constant time). Equal tags mean equal secrets (HMAC is a PRF); the coordinator, which holds
no secret, learns nothing it could use to recover the secret or test guesses of identifiers.

Each input is there for a reason: ``label`` separates these tags from every other use of the
secret (key digests, Bloom hashing); ``party`` binds a tag to its sender, so the coordinator
cannot pass one party's tag off as another's (reflection); ``session`` and the fresh random
``nonce`` (chosen by the primary and sent to the secondaries directly, not through the
coordinator) bind it to this alignment, so a tag recorded in an earlier run cannot be replayed.
The fields are JSON-encoded, so no two different field tuples give the same input.
"""

from __future__ import annotations

import hashlib
import hmac
import json

import numpy as np
import numpy.typing as npt

from vflink.errors import ConfigError
from vflink.randomness import secret_bytes

__all__ = ["LABEL", "TAG_SIZE", "confirmation_tag", "new_nonce", "tag_matches"]

#: Domain-separation label of key-confirmation tags (versioned with the tag format).
LABEL = "vflink/key-confirmation/v1"
TAG_SIZE = 32  # SHA-256


def confirmation_tag(secret: bytes, *, session: str, nonce: str, party: str
                     ) -> npt.NDArray[np.uint8]:
    """``party``'s tag for alignment ``session`` and ``nonce`` under ``secret``, 32 bytes."""
    if not isinstance(secret, (bytes, bytearray)) or len(secret) < 16:
        raise ConfigError("the alignment secret must be at least 16 bytes")
    data = json.dumps([LABEL, session, nonce, party], ensure_ascii=False).encode()
    digest = hmac.new(bytes(secret), data, hashlib.sha256).digest()
    return np.frombuffer(digest, dtype=np.uint8).copy()


def tag_matches(secret: bytes, tag: npt.NDArray[np.uint8] | bytes, *, session: str, nonce: str,
                party: str) -> bool:
    """Does ``tag`` prove that ``party`` holds ``secret``? (constant-time comparison)"""
    got = bytes(np.asarray(tag, dtype=np.uint8).ravel()) if not isinstance(tag, bytes) else tag
    expected = bytes(confirmation_tag(secret, session=session, nonce=nonce, party=party))
    return hmac.compare_digest(expected, got)


def new_nonce() -> str:
    """A fresh 128-bit nonce from the OS's secure generator (hex)."""
    return secret_bytes(16).hex()
