"""Both prime-order groups: hashing, exponent laws, encodings, validation of peer elements."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from vflink.alignment.groups import GROUPS, get_group
from vflink.alignment.groups.modp import RFC3526_2048
from vflink.errors import ProtocolError, UnknownNameError

NAMES = ("ristretto255", "modp2048")


def test_registry_names() -> None:
    assert set(GROUPS.names()) == set(NAMES)
    with pytest.raises(UnknownNameError, match="ristretto255"):
        get_group("p256")


@pytest.mark.parametrize("name", NAMES)
def test_hash_is_deterministic_and_distinct(name: str) -> None:
    g = get_group(name)
    x = g.hash_to_group([b"alice", b"bob", b"alice"])
    assert x.shape == (3, g.element_bytes) and x.dtype == np.uint8
    assert (x[0] == x[2]).all() and not (x[0] == x[1]).all()
    g.validate(x, "hashed")


@pytest.mark.parametrize("name", NAMES)
def test_exponents_commute_and_combine(name: str) -> None:
    g = get_group(name, workers=2)
    g.parallel_threshold = 4  # exercise the pool path on a small batch
    x = g.hash_to_group([str(i).encode() for i in range(9)])
    a, b = g.random_exponent(), g.random_exponent()
    ab = g.power(g.power(x, a), b)
    assert (ab == g.power(g.power(x, b), a)).all()
    assert (ab == g.power(x, g.combine(a, b))).all()
    assert (g.power(x, 1) == x).all()


def test_modp_matches_python_pow_and_is_a_quadratic_residue() -> None:
    g = get_group("modp2048")
    x = g.hash_to_group([b"k"])
    v = int.from_bytes(x[0].tobytes(), "big")
    assert pow(v, (RFC3526_2048 - 1) // 2, RFC3526_2048) == 1  # Euler: v ∈ QR(Z_p*)
    e = g.random_exponent()
    y = int.from_bytes(g.power(x, e)[0].tobytes(), "big")
    assert y == pow(v, e, RFC3526_2048)
    assert pow(y, g.order, RFC3526_2048) == 1  # order q


@pytest.mark.parametrize("name", NAMES)
def test_secret_exponents_are_fresh(name: str) -> None:
    g = get_group(name)
    draws = {g.random_exponent() for _ in range(20)}
    assert len(draws) == 20 and all(0 < d < g.order for d in draws)


@pytest.mark.parametrize("name", NAMES)
def test_invalid_peer_elements_are_refused(name: str) -> None:
    g = get_group(name)
    with pytest.raises(ProtocolError):
        g.validate(np.zeros((2, g.element_bytes), dtype=np.uint8), "peer")
    with pytest.raises(ProtocolError):
        g.validate(np.zeros((2, g.element_bytes + 1), dtype=np.uint8), "peer")
    bad = np.full((1, g.element_bytes), 0xFF, dtype=np.uint8)  # ≥ p, or a non-canonical point
    with pytest.raises(ProtocolError):
        g.validate(bad, "peer")


def test_the_ristretto_group_leaves_nothing_in_the_temporary_directory(tmp_path: Path) -> None:
    """rbcl writes its bundled libsodium to a temporary file it never removes; a process that
    imports the group removes it once loaded (the group still works)."""
    code = ("from vflink.alignment.groups import get_group\n"
            "g = get_group('ristretto255', workers=1)\n"
            "assert len(g.hash_to_group([b'a', b'b'])) == 2\n")
    done = subprocess.run([sys.executable, "-c", code],
                          env={**os.environ, "TMPDIR": str(tmp_path)},
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert list(tmp_path.iterdir()) == []
