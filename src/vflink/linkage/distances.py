"""Pairwise distance kernels between identifiers (the "comparison" step of PPRL, FedSim §2/§4.1).

Each function takes a batch of primary identifiers and a batch of secondary identifiers and
returns the full ``(len(a), len(b))`` float64 distance matrix. They are the plain references
that the brute-force searches in :mod:`vflink.linkage.search` are built on, and they are also
used to recompute exact float64 distances for the candidates an index returns.

FedSim uses Euclidean distance for numeric identifiers, Levenshtein for strings and Hamming for
Bloom filters (§6.1); haversine is added for latitude/longitude identifiers because Euclidean
distance on degrees is not a distance on the Earth.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

__all__ = [
    "EARTH_RADIUS_KM",
    "chord_to_km",
    "euclidean_distances",
    "hamming_distances",
    "haversine_distances",
    "haversine_paired",
    "latlon_to_unit",
    "levenshtein_distances",
]

#: Mean Earth radius (IUGG), used to turn great-circle angles into kilometres.
EARTH_RADIUS_KM = 6371.0088

FloatArray = npt.NDArray[np.float64]


def euclidean_distances(a: npt.ArrayLike, b: npt.ArrayLike) -> FloatArray:
    """Euclidean distances between rows of ``a`` (n, d) and ``b`` (m, d), float64, exact.

    Computed from differences rather than the ``|a|² + |b|² - 2ab`` expansion so that nearby
    points with large coordinates (e.g. latitude 39.9) keep their precision.
    """
    x = np.asarray(a, dtype=np.float64)
    y = np.asarray(b, dtype=np.float64)
    diff = x[:, None, :] - y[None, :, :]
    return np.asarray(np.sqrt(np.einsum("ijk,ijk->ij", diff, diff)), dtype=np.float64)


def haversine_distances(a: npt.ArrayLike, b: npt.ArrayLike) -> FloatArray:
    """Great-circle distances in kilometres between (lat, lon) rows given in degrees."""
    x = np.radians(np.asarray(a, dtype=np.float64))
    y = np.radians(np.asarray(b, dtype=np.float64))
    lat1, lon1 = x[:, 0:1], x[:, 1:2]
    lat2, lon2 = y[None, :, 0], y[None, :, 1]
    h = (np.sin((lat2 - lat1) / 2.0) ** 2
         + np.cos(lat1) * np.cos(lat2) * np.sin((lon2 - lon1) / 2.0) ** 2)
    return np.asarray(2.0 * EARTH_RADIUS_KM * np.arcsin(np.sqrt(np.clip(h, 0.0, 1.0))))


def haversine_paired(a: npt.ArrayLike, b: npt.ArrayLike) -> FloatArray:
    """Great-circle distances in kilometres between rows ``a[i]`` and ``b[i]`` ((lat, lon) in
    degrees): :func:`haversine_distances` for given pairs instead of every pair."""
    x = np.radians(np.asarray(a, dtype=np.float64))
    y = np.radians(np.asarray(b, dtype=np.float64))
    lat1, lon1, lat2, lon2 = x[:, 0], x[:, 1], y[:, 0], y[:, 1]
    h = (np.sin((lat2 - lat1) / 2.0) ** 2
         + np.cos(lat1) * np.cos(lat2) * np.sin((lon2 - lon1) / 2.0) ** 2)
    return np.asarray(2.0 * EARTH_RADIUS_KM * np.arcsin(np.sqrt(np.clip(h, 0.0, 1.0))))


def latlon_to_unit(latlon: npt.ArrayLike) -> FloatArray:
    """(lat, lon) degrees → 3-D unit vectors; chord length between them is monotone in the
    great-circle distance (``chord = 2 sin(θ/2)``), so Euclidean nearest neighbours on these
    vectors are exactly the haversine nearest neighbours."""
    r = np.radians(np.asarray(latlon, dtype=np.float64))
    lat, lon = r[:, 0], r[:, 1]
    return np.stack([np.cos(lat) * np.cos(lon), np.cos(lat) * np.sin(lon), np.sin(lat)], axis=1)


def chord_to_km(chord: npt.ArrayLike) -> FloatArray:
    """Chord length between unit vectors → great-circle distance in km (θ = 2 arcsin(c/2))."""
    c = np.clip(np.asarray(chord, dtype=np.float64) / 2.0, 0.0, 1.0)
    return np.asarray(2.0 * EARTH_RADIUS_KM * np.arcsin(c))


# Population count of every byte value: the plain reference must not depend on newer numpy
# helpers, and a 256-entry table is the classic way to count bits of packed uint8 filters.
_POPCOUNT = np.array([bin(i).count("1") for i in range(256)], dtype=np.uint16)


def hamming_distances(a: npt.ArrayLike, b: npt.ArrayLike) -> FloatArray:
    """Hamming distances between packed uint8 bit arrays ``a`` (n, B) and ``b`` (m, B)."""
    x = np.asarray(a, dtype=np.uint8)
    y = np.asarray(b, dtype=np.uint8)
    xor = np.bitwise_xor(x[:, None, :], y[None, :, :])
    return np.asarray(_POPCOUNT[xor].sum(axis=2, dtype=np.int64), dtype=np.float64)


def levenshtein_distances(a: Sequence[str], b: Sequence[str], *, workers: int = 1) -> FloatArray:
    """Levenshtein (unit-cost edit) distances between two lists of strings.

    rapidfuzz's bit-parallel implementation is used rather than a hand-written dynamic
    programme; tests check it against a textbook DP on small random strings.
    """
    from rapidfuzz import process
    from rapidfuzz.distance import Levenshtein

    if len(a) == 0 or len(b) == 0:
        return np.zeros((len(a), len(b)), dtype=np.float64)
    m = process.cdist(list(a), list(b), scorer=Levenshtein.distance, dtype=np.int32,
                      workers=workers)
    return np.asarray(m, dtype=np.float64)
