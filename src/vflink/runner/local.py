"""Secrets and roles of the parties a command builds in this process.

Kept apart from :mod:`vflink.runner.federation` (which builds training parties and imports
torch) so that ``vflink link`` loads only what linkage needs.
"""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
from collections.abc import Iterable

from vflink.errors import ConfigError

__all__ = ["COORDINATOR", "local_roles", "secret_with_source", "shared_secret"]

log = logging.getLogger(__name__)

COORDINATOR = "coordinator"

#: variables whose "not set" warning this process has already shown
_WARNED: set[str] = set()


def shared_secret(env: str, *, required: bool = False, seed: int | None = None) -> bytes:
    """The data parties' HMAC/Bloom secret from ``$env`` (see :func:`secret_with_source`)."""
    return secret_with_source(env, required=required, seed=seed)[0]


def secret_with_source(env: str, *, required: bool = False, seed: int | None = None
                       ) -> tuple[bytes, str]:
    """The data parties' HMAC/Bloom secret from ``$env``, and where it came from.

    Across hosts (``required``) it must be set. In-process every data party lives here and the
    coordinator never receives the secret, so when ``$env`` is unset the secret is derived from
    the run's ``seed``: runs with the same seed then link, and score, identically. A secret
    derived from a seed is not a secret, and the log and the run's summary say so. Without a
    seed a fresh random secret is drawn.
    """
    value = os.environ.get(env)
    if value:
        if len(value.encode()) < 16:
            raise ConfigError(f"the secret in ${env} must be at least 16 bytes")
        return value.encode(), f"${env}"
    if required:
        raise ConfigError(f"set ${env} to the secret the data parties share (≥ 16 bytes)")
    if seed is not None:
        # once per process and variable: `vflink demo` trains three runs and an experiment
        # dozens, each with the same warning, which buried the rest; the run's summary still
        # says it
        if env not in _WARNED:
            _WARNED.add(env)
            log.warning("$%s is not set: in-process runs derive their alignment secret from the "
                        "seed (%d here), so that they repeat; it is NOT a secret. Set $%s "
                        "across hosts.", env, seed, env)
        digest = hashlib.sha256(f"vflink/in-process-secret/v1/{int(seed)}".encode()).digest()
        return digest, f"derived from seed {seed} (not a secret: ${env} unset, in-process)"
    log.info("$%s is not set: using a random alignment secret for this in-process run", env)
    return secrets.token_bytes(32), f"random (${env} unset, in-process)"


def local_roles(primary: str, secondaries: Iterable[str]) -> dict[str, str]:
    """Every party's role when all of them are built in this process (``Party.roles``)."""
    return {primary: "primary", COORDINATOR: "coordinator",
            **dict.fromkeys(secondaries, "secondary")}
