"""vflink: vertical federated learning across organisations whose records share no clean key.

The public surface is re-exported here; see README.md for a tour and ARCHITECTURE.md for the
layers.
"""

from __future__ import annotations

__version__ = "0.1.0"

from typing import TYPE_CHECKING, Any  # noqa: E402

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

if TYPE_CHECKING:
    from vflink.data import PartySchema, PartyTable, load_table
    from vflink.types import MISSING, Alignment, Task

# Imported on first use (PEP 562), so `import vflink` (and `vflink --help`) stays light:
# the data classes pull in pandas and scikit-learn.
_LAZY = {"PartySchema": "vflink.data", "PartyTable": "vflink.data", "load_table": "vflink.data",
         "MISSING": "vflink.types", "Alignment": "vflink.types", "Task": "vflink.types"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'vflink' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value

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
