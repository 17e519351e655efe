"""vflink: vertical federated learning across organisations whose records share no clean key.

The public surface is re-exported here; see README.md for a tour and ARCHITECTURE.md for the
layers.
"""

from __future__ import annotations

__version__ = "0.1.0"

from vflink.data import PartySchema, PartyTable, load_table  # noqa: E402
from vflink.errors import (  # noqa: E402
    ConfigError,
    DataError,
    LinkageError,
    PeerUnavailable,
    PrivacyBudgetExceeded,
    ProtocolError,
    RunError,
    TransportError,
    UnknownNameError,
    VflinkError,
)
from vflink.types import MISSING, Alignment, Task  # noqa: E402

__all__ = [
    "MISSING",
    "Alignment",
    "ConfigError",
    "DataError",
    "LinkageError",
    "PartySchema",
    "PartyTable",
    "PeerUnavailable",
    "PrivacyBudgetExceeded",
    "ProtocolError",
    "RunError",
    "Task",
    "TransportError",
    "UnknownNameError",
    "VflinkError",
    "__version__",
    "load_table",
]
