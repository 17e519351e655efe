"""The one exception tree of vflink.

Every error that vflink raises on purpose derives from :class:`VflinkError`, so callers can
catch the whole family with one clause. Third-party errors (gRPC, faiss, pandas) are
translated at the boundary where they occur.

::

    VflinkError
    ├── ConfigError              invalid configuration value or file
    │   └── UnknownNameError     a registry lookup with an unknown name (lists the valid ones)
    ├── DataError                bad input data (names the file, column and an example row)
    ├── LinkageError             record linkage cannot proceed (e.g. unreachable τ)
    ├── ProtocolError            a peer sent an unexpected or malformed message
    ├── TransportError           the transport failed to deliver a message
    │   └── PeerUnavailable      a named peer cannot be reached within its deadline
    ├── PrivacyBudgetExceeded    a requested privacy level cannot be met or was spent
    ├── PolicyViolation          a peer asked for more than this party's own policy allows
    ├── Cancelled                work stopped: its caller gave up or its work limit passed
    └── RunError                 an experiment or run directory cannot be created or resumed
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = [
    "Cancelled",
    "ConfigError",
    "DataError",
    "LinkageError",
    "PeerUnavailable",
    "PolicyViolation",
    "PrivacyBudgetExceeded",
    "ProtocolError",
    "RunError",
    "TransportError",
    "UnknownNameError",
    "VflinkError",
]


class VflinkError(Exception):
    """Root of every error vflink raises on purpose."""


class ConfigError(VflinkError, ValueError):
    """A configuration value or file is invalid.

    ``problems`` holds every problem found, so a file with several mistakes is reported at once.
    """

    def __init__(self, message: str, problems: Iterable[str] = ()) -> None:
        self.problems: tuple[str, ...] = tuple(problems) or (message,)
        super().__init__(message)


class UnknownNameError(ConfigError, KeyError):
    """A registry was asked for a name it does not know."""

    def __init__(self, kind: str, name: str, valid: Iterable[str]) -> None:
        self.kind = kind
        self.name = name
        self.valid = tuple(sorted(valid))
        super().__init__(f"unknown {kind} {name!r}; valid names are: {', '.join(self.valid)}")

    def __str__(self) -> str:  # KeyError would otherwise repr() the message
        return str(self.args[0])


class DataError(VflinkError, ValueError):
    """Input data is unusable: missing file, unknown column, bad value, duplicate keys...

    ``problems`` holds every problem found (as for :class:`ConfigError`), so a table with
    several mistakes is reported at once.
    """

    def __init__(self, message: str, problems: Iterable[str] = ()) -> None:
        self.problems: tuple[str, ...] = tuple(problems) or (message,)
        super().__init__(message)


class LinkageError(VflinkError, ValueError):
    """Record linkage cannot proceed with the given inputs or parameters."""


class ProtocolError(VflinkError):
    """A peer sent a message that is unexpected, malformed or out of order."""


class TransportError(VflinkError):
    """A message could not be delivered."""


class PeerUnavailable(TransportError):
    """A named peer could not be reached within its deadline."""

    def __init__(self, peer: str, detail: str = "") -> None:
        self.peer = peer
        msg = f"peer {peer!r} is unavailable"
        super().__init__(f"{msg}: {detail}" if detail else msg)


class PrivacyBudgetExceeded(VflinkError):
    """A requested privacy guarantee cannot be met, or the budget has been spent."""


class RunError(VflinkError):
    """A run or experiment cannot be started, written or resumed."""


class PolicyViolation(VflinkError):
    """A peer asked for something this party's own policy does not allow: identifiers in a
    form it does not release, similarity noise below its minimum, a message the sender's role
    may not send, or more pending state than its limits allow."""


class Cancelled(VflinkError):
    """Work done on a caller's behalf was stopped before it finished: the caller gave up
    (cancelled the call, or its deadline passed), or the work outran its limit
    (:func:`vflink._cancel.checkpoint`). Nothing of it is applied."""
