"""Identifier encodings (the "encode" stage of record linkage), registered by name.

``"raw"`` → :class:`RawEncoder` (float vectors, optional shared standardisation),
``"string"`` → :class:`StringEncoder` (normalised strings),
``"bloom"`` → :class:`BloomEncoder` (FEDERAL Bloom filters, FedSim App. I),
``"geo-bloom"`` → :class:`GeoBloomEncoder` (keyed Bloom filters of places on the globe).
"""

from __future__ import annotations

from vflink.linkage.encoding.base import (
    ENCODERS,
    Encoder,
    encode_chunk,
    encode_chunked,
    make_encoder,
)
from vflink.linkage.encoding.bloom import (
    BLOOM_FORMAT_VERSION,
    BloomConfig,
    BloomEncoder,
    NumericRange,
    bloom_numeric,
    bloom_strings,
)
from vflink.linkage.encoding.geo import (
    GEO_FORMAT_VERSION,
    GeoBloomConfig,
    GeoBloomEncoder,
    bloom_geo,
)
from vflink.linkage.encoding.raw import RawEncoder, Standardization
from vflink.linkage.encoding.strings import StringEncoder, normalize_string

__all__ = [
    "encode_chunk",
    "encode_chunked",
    "BLOOM_FORMAT_VERSION",
    "ENCODERS",
    "GEO_FORMAT_VERSION",
    "BloomConfig",
    "BloomEncoder",
    "Encoder",
    "GeoBloomConfig",
    "GeoBloomEncoder",
    "NumericRange",
    "RawEncoder",
    "Standardization",
    "StringEncoder",
    "bloom_geo",
    "bloom_numeric",
    "bloom_strings",
    "make_encoder",
    "normalize_string",
]

ENCODERS.add("raw", RawEncoder)
ENCODERS.add("string", StringEncoder)
ENCODERS.add("bloom", BloomEncoder)
ENCODERS.add("geo-bloom", GeoBloomEncoder)
