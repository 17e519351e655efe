"""The most an attack may reach under a protection's stated guarantee.

The functions live with the guarantees they read (:mod:`vflink.privacy.limits`, whose
docstring derives them); attacks judge their AUC against them through this module.
"""

from __future__ import annotations

from vflink.privacy.limits import dp_auc_ceiling, gdp_auc_ceiling, gdp_mu, leak

__all__ = ["dp_auc_ceiling", "gdp_auc_ceiling", "gdp_mu", "leak"]
