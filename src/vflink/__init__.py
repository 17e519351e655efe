"""vflink: vertical federated learning across organisations whose records share no clean key.

The public surface is re-exported here; see the documentation site (``docs/``) for a tour and
ARCHITECTURE.md for the layers. The Python API (:mod:`vflink.api`):

>>> import vflink
>>> links = vflink.link(primary_df, secondary_df, on=["lat", "lon"],
...                     metric="haversine", top_k=5)             # doctest: +SKIP
>>> run = vflink.train("run.toml", out="runs/fedsim")           # doctest: +SKIP
>>> run.metrics["test"], run.privacy["protections"]            # doctest: +SKIP
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
    from vflink.api import Links, Matches, Run, align, audit, link, train
    from vflink.data import PartySchema, PartyTable, load_table
    from vflink.privacy.config import PrivacyConfig
    from vflink.runfiles.config import (
        AlignmentConfig,
        DataConfig,
        EvaluationConfig,
        ModelConfig,
        RunConfig,
        TrainingConfig,
    )
    from vflink.types import MISSING, Alignment, Task

# Imported on first use (PEP 562), so `import vflink` (and `vflink --help`) stays light:
# the data classes pull in pandas and scikit-learn, the run configuration torch; `vflink.link`
# loads neither torch nor scikit-learn.
_LAZY = {"PartySchema": "vflink.data", "PartyTable": "vflink.data", "load_table": "vflink.data",
         "MISSING": "vflink.types", "Alignment": "vflink.types", "Task": "vflink.types",
         **dict.fromkeys(("Links", "Matches", "Run", "align", "audit", "link", "train"),
                         "vflink.api"),
         **dict.fromkeys(("AlignmentConfig", "DataConfig", "EvaluationConfig", "ModelConfig",
                          "RunConfig", "TrainingConfig"), "vflink.runfiles.config"),
         "PrivacyConfig": "vflink.privacy.config"}


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
    "AlignmentConfig",
    "ConfigError",
    "DataConfig",
    "DataError",
    "EvaluationConfig",
    "LinkageError",
    "Links",
    "Matches",
    "ModelConfig",
    "PartySchema",
    "PartyTable",
    "PeerUnavailable",
    "PrivacyBudgetExceeded",
    "PrivacyConfig",
    "ProtocolError",
    "Run",
    "RunConfig",
    "RunError",
    "Task",
    "TrainingConfig",
    "TransportError",
    "UnknownNameError",
    "VflinkError",
    "__version__",
    "align",
    "audit",
    "link",
    "load_table",
    "train",
]
