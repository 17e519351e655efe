"""Release counts that belong to a party's data, not to a run or a session.

A differential-privacy guarantee is about a record: every embedding of it that ever left the
party composes (VFL-AFE §3.1; :mod:`vflink.privacy.accounting`). Counting releases per run let a
primary restart the count at will (a new ``SetupBottom`` built fresh counts, so repeated setups
drew tens of thousands of noised releases of each record, whose mean is the un-noised
embedding). :class:`ReleaseBudget` holds the counts of one party's data: per record and per
noise setting, for as long as the data are the same (keyed by the data fingerprint,
:mod:`vflink.data.fingerprint`), across setups, sessions, runs and restarts of the service. Only
the party's own operator resets it (``vflink privacy-budget --reset``).

Settings that differ between runs (the party changed its ``[privacy]`` section, or adopted
another run's settings) are composed, not refused: each release is a Gaussian mechanism of
multiplier σ on one record, so a record's releases under several σ compose with the same PLD
accountant (:func:`~vflink.privacy.accounting.composed_epsilon_mixed`) and the budget check
counts all of them.

On disk (``<state_dir>/_privacy-budget/<fingerprint>.json``, version 1)::

    {"format": "vflink-privacy-budget", "version": 1, "party": "bank",
     "fingerprint": "<sha-256 of the table>", "n_rows": 3000, "streams": 2, "generation": 7,
     "settings": [{"sigma": 2.1, "failure": 0.0013, "epsilon": 2.0, "delta": 0.01,
                   "calibration": "analytic-gaussian", "mode": "afe"}],
     "counts": {"dtype": "<i8", "shape": [1, 3000], "base64": "..."},
     "updated": "2025-01-01T00:00:00+00:00"}

The folder's name starts with ``_``, which a peer's state file name never may
(:func:`vflink.parties.base.state_path`), so no ``SaveState`` from a peer can overwrite it.

A service that may release records holds the folder's lock (:class:`BudgetLock`, an exclusive
``flock`` on ``.service.lock`` that the system drops when the process ends, even by ``kill -9``):
it keeps the counts in memory and writes them back, so :func:`reset_budget` refuses while the
lock is held instead of being silently undone by the service's next write.

Write-ahead, and cheap: rewriting the whole file per batch costs O(records) (9 ms for 20,000
records on the shared test disk, more than a small training step), so each release batch is
*appended* to a journal ``<fingerprint>.<generation>.journal`` (its rows as uint32, with a
CRC) and handed to the operating system before the embeddings are returned; the journal is
forced to disk (fsync) at most once a second and folded into the JSON snapshot (written
atomically: temporary file, fsync, ``os.replace``; the snapshot names its generation, so a
journal it already holds is never replayed) when it grows, when a setting is new and when the
service opens the counts again. A crash of the service loses no release that was sent; a power
loss at most the last second's.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import re
import struct
import time
import zlib
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from vflink.errors import ConfigError, DataError, PrivacyBudgetExceeded

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None  # type: ignore[assignment]
from vflink.privacy.accounting import composed_epsilon, composed_epsilon_with_responses

__all__ = [
    "BUDGET_DIR",
    "BudgetLock",
    "BUDGET_FORMAT",
    "BUDGET_VERSION",
    "ReleaseBudget",
    "ReleaseSetting",
    "budget_file",
    "check_within",
    "reset_budget",
]

log = logging.getLogger(__name__)

BUDGET_FORMAT = "vflink-privacy-budget"
BUDGET_VERSION = 1
#: The folder under a party's state directory (unreachable by a peer's state file names).
BUDGET_DIR = "_privacy-budget"

_FINGERPRINT = re.compile(r"^[0-9a-f]{16,128}$")

#: one journal record: magic, setting index, number of rows, CRC-32 of the rows (uint32 each)
_RECORD = struct.Struct("<4sIII")
_MAGIC = b"VFR1"
#: distinct noise settings one data version may be released under: each adds a row of counts,
#: and a secondary without settings of its own adopts the primary's, which could otherwise grow
#: its memory and files without bound
MAX_SETTINGS = 64
#: the journal is folded into the snapshot past this size
_COMPACT_BYTES = 4 << 20
#: the journal is forced to disk at most this often (seconds)
_SYNC_EVERY_S = 1.0


@dataclass(frozen=True)
class ReleaseSetting:
    """The noise setting of a release: what composition needs (σ, and the per-release failure
    probability 1 − p1·p2 of rescaling's sensitivity estimate, 0 without rescaling), and the
    public settings that gave it, for people to read."""

    sigma: float
    failure: float = 0.0
    epsilon: float | None = None
    delta: float | None = None
    calibration: str | None = None
    mode: str | None = None
    #: k of a randomized-response release (its ε is ``epsilon``, pure: δ = 0, and
    #: ``sigma`` is 0); 0: a Gaussian release of multiplier ``sigma``
    buckets: int = 0

    @property
    def response(self) -> bool:
        """A k-ary randomized-response release (:mod:`vflink.privacy.randomized_response`)."""
        return self.buckets > 0

    @property
    def key(self) -> tuple[float, float] | tuple[str, int, float]:
        if self.response:
            return ("randomized-response", int(self.buckets), float(self.epsilon or 0.0))
        return (float(self.sigma), float(self.failure))


def budget_file(directory: Path, fingerprint: str) -> Path:
    """Where the counts of the data with ``fingerprint`` live under ``directory``."""
    if not _FINGERPRINT.match(fingerprint):
        raise ConfigError(f"not a data fingerprint: {fingerprint!r}")
    return Path(directory) / f"{fingerprint}.json"


def _write_atomic(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` or leave it as it was (one small function so a shared
    atomic writer can take its place)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


class ReleaseBudget:
    """Per-record release counts of one party's data, by noise setting.

    Args:
        n_rows: the number of records of the party.
        party: its name (for messages).
        fingerprint: the data fingerprint the counts belong to (``None`` in memory only).
        path: the file that holds them (``None``: kept for the life of this object only, e.g.
            an in-process party without a state directory).
    """

    def __init__(self, n_rows: int, *, party: str = "", fingerprint: str | None = None,
                 path: Path | None = None) -> None:
        self.n_rows = int(n_rows)
        self.party = party
        self.fingerprint = fingerprint
        self.path = path
        self.settings: list[ReleaseSetting] = []
        self.counts = np.zeros((0, self.n_rows), dtype=np.int64)
        #: noise streams handed out so far (a seeded party never reuses its noise, see
        #: :meth:`claim_stream`)
        self.streams = 0
        #: the snapshot's generation; releases since it are in its journal
        self.generation = 0
        self._journal_bytes = 0
        self._last_sync = 0.0

    # --- files ---------------------------------------------------------------------------------

    @classmethod
    def open(cls, directory: Path, fingerprint: str, n_rows: int, *, party: str = "",
             read_only: bool = False) -> ReleaseBudget:
        """The counts of the data ``fingerprint`` kept under ``directory`` (empty if none).

        The party opens them for writing: its journal is folded into a fresh snapshot at once.
        ``read_only`` (``vflink privacy-budget``) never writes, so it cannot disturb a service
        that is running on the same files.
        """
        path = budget_file(directory, fingerprint)
        budget = cls(n_rows, party=party, fingerprint=fingerprint, path=path)
        if path.exists():
            budget._load()
            if not read_only:
                budget.flush()  # a clean journal (a torn last record is dropped here)
                for stale in path.parent.glob(f"{fingerprint}.*.journal"):
                    if stale != budget._journal_path():
                        stale.unlink(missing_ok=True)
        if read_only:
            budget.path = None
        return budget

    def _journal_path(self, generation: int | None = None) -> Path:
        if self.path is None:
            raise ConfigError("release counts in memory have no journal")
        g = self.generation if generation is None else generation
        return self.path.with_name(f"{self.path.stem}.{g}.journal")

    def _replay(self, counts: npt.NDArray[np.int64]) -> None:
        """Add the releases of the current generation's journal to ``counts``."""
        journal = self._journal_path()
        if not journal.exists():
            return
        data = journal.read_bytes()
        pos = 0
        while pos < len(data):
            end = pos + _RECORD.size
            if end > len(data):
                break  # a torn last record: its write never completed, nothing was sent
            magic, index, n, crc = _RECORD.unpack_from(data, pos)
            if magic != _MAGIC or index >= counts.shape[0]:
                raise ValueError(f"journal {journal.name}: bad record at byte {pos}")
            payload = data[end:end + 4 * n]
            if len(payload) < 4 * n or zlib.crc32(payload) != crc:
                if end + 4 * n >= len(data):
                    break  # torn last record
                raise ValueError(f"journal {journal.name}: damaged record at byte {pos}")
            rows = np.frombuffer(payload, dtype="<u4").astype(np.int64)
            if rows.size and (rows.max() >= self.n_rows or np.unique(rows).size != rows.size):
                raise ValueError(f"journal {journal.name}: bad rows at byte {pos}")
            counts[index, rows] += 1
            pos = end + 4 * n

    def _load(self) -> None:
        path = self.path
        if path is None:
            return
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
            if doc.get("format") != BUDGET_FORMAT or doc.get("version") != BUDGET_VERSION:
                raise ValueError(f"format {doc.get('format')!r} version {doc.get('version')!r}, "
                                 f"expected {BUDGET_FORMAT!r} version {BUDGET_VERSION}")
            if doc.get("fingerprint") != self.fingerprint:
                raise ValueError("it belongs to other data (its fingerprint differs)")
            if int(doc["n_rows"]) != self.n_rows:
                raise ValueError(f"it counts {doc['n_rows']} records, the party has "
                                 f"{self.n_rows}")
            settings = [ReleaseSetting(**s) for s in doc["settings"]]
            c = doc["counts"]
            counts = np.frombuffer(base64.b64decode(c["base64"], validate=True),
                                   dtype=np.dtype(c["dtype"])).astype(np.int64)
            shape = (len(settings), self.n_rows)
            if tuple(c["shape"]) != shape or counts.size != shape[0] * shape[1]:
                raise ValueError(f"counts of shape {c['shape']}, expected {list(shape)}")
            counts = counts.reshape(shape).copy()
            if counts.size and counts.min() < 0:
                raise ValueError("negative release counts")
            self.generation = int(doc.get("generation", 0))
            self._replay(counts)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            # Fail closed: without its counts the party cannot know what it already released.
            raise DataError(f"party {self.party!r}: the privacy budget file {path} is unusable "
                            f"({exc}); nothing is released until it is repaired or the party's "
                            "operator resets it (`vflink privacy-budget --reset`)") from None
        self.settings = settings
        self.counts = counts
        self.streams = int(doc.get("streams", 0))

    def to_json(self) -> dict[str, Any]:
        counts = np.ascontiguousarray(self.counts, dtype="<i8")
        return {"format": BUDGET_FORMAT, "version": BUDGET_VERSION, "party": self.party,
                "fingerprint": self.fingerprint, "n_rows": self.n_rows,
                "streams": self.streams, "generation": self.generation,
                "settings": [asdict(s) for s in self.settings],
                "counts": {"dtype": "<i8", "shape": list(counts.shape),
                           "base64": base64.b64encode(counts.tobytes()).decode("ascii")},
                "updated": datetime.now(UTC).isoformat(timespec="seconds")}

    def flush(self) -> None:
        """Write every count to a new snapshot and drop the journal (no-op in memory)."""
        if self.path is None:
            return
        old = self._journal_path() if self.path.exists() else None
        self.generation += 1
        _write_atomic(self.path, (json.dumps(self.to_json()) + "\n").encode("utf-8"))
        if old is not None:  # the snapshot holds its releases now
            old.unlink(missing_ok=True)
        self._journal_bytes = 0

    def _append(self, index: int, rows: npt.NDArray[np.int64]) -> None:
        """Journal one release batch; the OS has it when this returns (see the module doc)."""
        if self.path is None:
            return
        if not self.path.exists() or self._journal_bytes > _COMPACT_BYTES:
            self.flush()
            return
        payload = np.asarray(rows, dtype="<u4").tobytes()
        record = _RECORD.pack(_MAGIC, index, len(rows), zlib.crc32(payload)) + payload
        with open(self._journal_path(), "ab") as fh:
            fh.write(record)
            fh.flush()
            now = time.monotonic()
            if now - self._last_sync >= _SYNC_EVERY_S:
                os.fsync(fh.fileno())
                self._last_sync = now
        self._journal_bytes += len(record)

    # --- counting ------------------------------------------------------------------------------

    def find(self, setting: ReleaseSetting) -> int | None:
        return next((i for i, s in enumerate(self.settings) if s.key == setting.key), None)

    def slot(self, setting: ReleaseSetting) -> int:
        """The row of ``counts`` for ``setting`` (added if new)."""
        i = self.find(setting)
        if i is not None:
            return i
        if len(self.settings) >= MAX_SETTINGS:
            raise PrivacyBudgetExceeded(
                f"party {self.party!r}: its data were already released under {MAX_SETTINGS} "
                "different noise settings; it releases them under no new one (its operator "
                "may reset the counts: `vflink privacy-budget --reset`)")
        self.settings.append(setting)
        self.counts = np.vstack([self.counts, np.zeros((1, self.n_rows), dtype=np.int64)])
        return len(self.settings) - 1

    def record(self, setting: ReleaseSetting, rows: npt.NDArray[np.int64]) -> None:
        """Count one release of each of ``rows`` (unique) and persist it before returning."""
        new = self.find(setting) is None
        i = self.slot(setting)
        self.counts[i, rows] += 1
        if new:  # the snapshot must name the setting before a journal record refers to it
            self.flush()
        else:
            self._append(i, rows)

    def merge(self, setting: ReleaseSetting, counts: npt.NDArray[np.int64]) -> None:
        """Releases known from elsewhere (a checkpoint): keep the larger count, never fewer."""
        counts = np.asarray(counts, dtype=np.int64)
        if counts.shape != (self.n_rows,):
            raise ConfigError(f"party {self.party!r}: release counts for {counts.size} records, "
                              f"the party has {self.n_rows}")
        i = self.slot(setting)
        merged = np.maximum(self.counts[i], counts)
        if not np.array_equal(merged, self.counts[i]):
            self.counts[i] = merged
            self.flush()

    def claim_stream(self) -> int:
        """A new noise stream number (0, 1, 2, ...), persisted: a party with a fixed noise seed
        must never send two different embeddings with the same noise (their difference would
        be noise-free), so each run of releases draws from its own stream."""
        k = self.streams
        self.streams += 1
        self.flush()
        return k

    def claim_stream_seed(self, seed: int, salt: int) -> int | None:
        """:meth:`claim_stream`, as the seed of that stream's generator: ``None`` for the first
        (a single run keeps its own seed and is reproducible), else one derived from
        (seed, salt, stream); ``salt`` keeps two kinds of noise of one seed apart."""
        k = self.claim_stream()
        if k == 0:
            return None
        seq = np.random.SeedSequence([seed, salt, k])
        return int(seq.generate_state(1, np.uint64)[0] >> 1)

    # --- figures -------------------------------------------------------------------------------

    @property
    def totals(self) -> npt.NDArray[np.int64]:
        """Releases per record, over every setting."""
        return self.counts.sum(axis=0) if self.settings else np.zeros(self.n_rows, np.int64)

    def others_released(self, setting: ReleaseSetting, rows: npt.NDArray[np.int64]) -> bool:
        """Whether any of ``rows`` was released under a setting other than ``setting``."""
        i = self.find(setting)
        return any(j != i and bool(self.counts[j, rows].any())
                   for j in range(len(self.settings)))

    def releases_of(self, row: int, plus: ReleaseSetting | None = None
                    ) -> tuple[tuple[float, int], ...]:
        """``(sigma, count)`` of record ``row``'s Gaussian releases (with one more release
        under ``plus``); its randomized responses are :meth:`responses_of`."""
        out: dict[float, int] = {}
        for j, s in enumerate(self.settings):
            if not s.response:
                out[s.sigma] = out.get(s.sigma, 0) + int(self.counts[j, row])
        if plus is not None and not plus.response:
            out[plus.sigma] = out.get(plus.sigma, 0) + 1
        return tuple(sorted((s, m) for s, m in out.items() if m > 0))

    def responses_of(self, row: int, plus: ReleaseSetting | None = None
                     ) -> tuple[tuple[tuple[int, float], int], ...]:
        """``((k, epsilon), count)`` of record ``row``'s randomized-response releases."""
        out: dict[tuple[int, float], int] = {}
        extra = [(plus, 1)] if plus is not None and plus.response else []
        for s, c in [(s, int(self.counts[j, row])) for j, s in enumerate(self.settings)] + extra:
            if s.response:
                key = (int(s.buckets), float(s.epsilon or 0.0))
                out[key] = out.get(key, 0) + c
        return tuple(sorted((key, m) for key, m in out.items() if m > 0))

    @property
    def has_responses(self) -> bool:
        """Whether any record was released by randomized response (then the Gaussian loss
        alone does not order the records: :meth:`epsilons` does)."""
        return any(s.response and bool(self.counts[j].any())
                   for j, s in enumerate(self.settings))

    def gaussian_loss(self, plus: ReleaseSetting | None = None) -> npt.NDArray[np.float64]:
        """Each record's Σ_k c_k / σ_k² over its Gaussian releases (with ``plus`` added once):
        the order of how much privacy the records spent (randomized responses left out)."""
        # The composition of Gaussian releases of multipliers σ_k is one Gaussian of multiplier
        # (Σ_k c_k / σ_k²)^(-1/2) (exact): ε at any δ grows with Σ_k c_k / σ_k², which orders
        # the records by how much of their privacy was spent.
        # (randomized responses are left out: see has_responses)
        sig = np.array([s.sigma if not s.response else np.inf for s in self.settings],
                       dtype=np.float64)
        loss = (self.counts / sig[:, None] ** 2).sum(axis=0) if self.settings else \
            np.zeros(self.n_rows)
        if plus is not None and not plus.response:
            loss = loss + 1.0 / plus.sigma ** 2
        return np.asarray(loss, dtype=np.float64)

    def worst(self, rows: npt.NDArray[np.int64], delta: float = 1e-5) -> int:
        """The record among ``rows`` whose releases so far cost the most privacy (at
        ``delta`` when randomized responses take part)."""
        rows = np.asarray(rows, dtype=np.int64)
        order = self.epsilons(delta) if self.has_responses else self.gaussian_loss()
        return int(rows[int(np.argmax(order[rows]))])

    def epsilon(self, row: int, delta: float, plus: ReleaseSetting | None = None) -> float:
        """The composed ε of record ``row`` at ``delta`` (after one more release under
        ``plus``)."""
        return composed_epsilon_with_responses(self.releases_of(row, plus),
                                               self.responses_of(row, plus), delta)

    def epsilons(self, delta: float) -> npt.NDArray[np.float64]:
        """The composed ε of every record at ``delta`` (one accountant call per distinct
        history)."""
        if not self.settings:
            return np.zeros(self.n_rows)
        histories, inverse = np.unique(self.counts.T, axis=0, return_inverse=True)
        eps = np.empty(len(histories))
        for h, counts in enumerate(histories):
            merged: dict[float, int] = {}
            responses: dict[tuple[int, float], int] = {}
            for s, m in zip(self.settings, counts):
                if s.response:
                    key = (int(s.buckets), float(s.epsilon or 0.0))
                    responses[key] = responses.get(key, 0) + int(m)
                else:
                    merged[s.sigma] = merged.get(s.sigma, 0) + int(m)
            eps[h] = composed_epsilon_with_responses(
                tuple(sorted(merged.items())), tuple(sorted(responses.items())), delta)
        return eps[np.asarray(inverse).reshape(-1)]

    def max_epsilon(self, delta: float) -> float:
        """The largest composed ε of any record at ``delta``."""
        if not self.settings or not self.counts.any():
            return 0.0
        if self.has_responses:
            return float(self.epsilons(delta).max(initial=0.0))
        return self.epsilon(int(np.argmax(self.gaussian_loss())), delta)

    def max_failure(self) -> float:
        """The largest Σ_k c_k·(1 − p1 p2)_k of any record: the union bound that rescaling's
        sensitivity estimate held at every release adds to the composed δ."""
        if not self.settings:
            return 0.0
        fail = np.array([s.failure for s in self.settings], dtype=np.float64)
        return float((self.counts * fail[:, None]).sum(axis=0).max(initial=0.0))

    def summary(self, delta: float) -> dict[str, Any]:
        """Figures for the party's operator (``vflink privacy-budget``)."""
        totals = self.totals
        released = totals > 0
        eps = self.epsilons(delta)
        return {"party": self.party, "fingerprint": self.fingerprint, "records": self.n_rows,
                "records_released": int(released.sum()), "releases_total": int(totals.sum()),
                "max_releases": int(totals.max(initial=0)),
                "mean_releases": float(totals[released].mean()) if released.any() else 0.0,
                "delta": delta, "epsilon_max": float(eps.max(initial=0.0)),
                "epsilon_mean": float(eps[released].mean()) if released.any() else 0.0,
                "settings": [asdict(s) for s in self.settings]}


def check_within(budget: ReleaseBudget, setting: ReleaseSetting, rows: npt.NDArray[np.int64], *,
                 limit: float | None, delta: float, allowed: int | None, who: str,
                 key: str) -> None:
    """Refuse (:class:`PrivacyBudgetExceeded`) one more release of ``rows`` under ``setting``
    when a record would pass ``limit`` (named by the setting ``key`` in the message).

    Every release the data ever had counts (the budget's counts, across setups, sessions, runs
    and restarts). Under one Gaussian setting the release count decides (``allowed``: the most
    releases within the limit); otherwise the releases of the record that spent the most are
    composed (PLD)."""
    if allowed is None or limit is None or rows.size == 0:
        return
    if not budget.others_released(setting, rows) and not setting.response:
        i = budget.find(setting)
        worst = (int(budget.counts[i, rows].max()) if i is not None else 0) + 1
        if worst <= allowed:
            return
        spent = composed_epsilon(setting.sigma, worst - 1, delta)
        would = composed_epsilon(setting.sigma, worst, delta)
        what = f"a record released {worst - 1} times"
    else:
        row = budget.worst(rows, delta)
        would = budget.epsilon(row, delta, plus=setting)
        if would <= limit:
            return
        spent = budget.epsilon(row, delta)
        n = int(budget.totals[row])
        what = f"a record released {n} times under {len(budget.releases_of(row))} settings"
    raise PrivacyBudgetExceeded(
        f"{who}: privacy budget ε = {limit:g} (`{key}`) reached: {what} (ε = {spent:.3g} at "
        f"δ = {delta:g}) would reach ε = {would:.3g} with one more release; training stops "
        "before that release")


class BudgetLock:
    """The lock a running service holds on a budget folder for its lifetime (see above)."""

    FILE = ".service.lock"

    def __init__(self, directory: Path) -> None:
        self.path = Path(directory) / self.FILE
        self._fh: Any = None

    def acquire(self) -> BudgetLock:
        """Take the lock, or raise ConfigError naming the process that holds it."""
        if fcntl is None:  # pragma: no cover - no flock on this system
            return self
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fh = open(self.path, "a+", encoding="ascii")  # noqa: SIM115 - held for the lifetime
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            fh.seek(0)
            holder = fh.read().strip() or "another process"
            fh.close()
            raise ConfigError(f"{self.path.parent}: the privacy budget is held by a running "
                              f"service (pid {holder}); one service per state directory"
                              ) from None
        fh.seek(0)
        fh.truncate()
        fh.write(str(os.getpid()))
        fh.flush()
        self._fh = fh
        return self

    def release(self) -> None:
        if self._fh is not None:
            self._fh.close()  # closing drops the flock
            self._fh = None

    @classmethod
    def holder(cls, directory: Path) -> str | None:
        """Who holds the lock of ``directory`` (a pid as text), or None when nobody does."""
        path = Path(directory) / cls.FILE
        if fcntl is None or not path.is_file():
            return None
        with open(path, "r+", encoding="ascii") as fh:
            try:
                fcntl.flock(fh.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
            except OSError:
                return fh.read().strip() or "another process"
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
        return None


def reset_budget(directory: Path, fingerprint: str, *, party: str, operator: str,
                 reason: str | None = None) -> dict[str, Any] | None:
    """Delete the release counts of the data ``fingerprint`` (the party operator's decision).

    Refused (ConfigError) while a service holds the folder's :class:`BudgetLock`: it keeps the
    counts in memory and would write them back. Logged as a WARNING (fingerprint, counts, who
    and when) and appended to ``<directory>/resets.jsonl``, so a reset is never silent. Returns
    what was deleted (``None`` when there were no counts).
    """
    holder = BudgetLock.holder(directory)
    if holder is not None:
        raise ConfigError(f"party {party!r}: a running `vflink serve` (pid {holder}) holds its "
                          "privacy budget and would write the counts back; stop it, then "
                          "reset")
    path = budget_file(directory, fingerprint)
    if not path.exists():
        return None
    when = datetime.now(UTC).isoformat(timespec="seconds")
    entry: dict[str, Any] = {"when": when, "operator": operator, "party": party,
                             "fingerprint": fingerprint, "reason": reason}
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        budget = ReleaseBudget.open(directory, fingerprint, int(doc["n_rows"]), party=party,
                                    read_only=True)
    except (DataError, ValueError, KeyError, TypeError) as exc:  # a damaged file: still reset
        entry.update(records_released=-1, releases_total=-1, max_releases=-1, settings=[],
                     unreadable=str(exc))
    else:
        totals = budget.totals
        entry.update(records_released=int((totals > 0).sum()),
                     releases_total=int(totals.sum()), max_releases=int(totals.max(initial=0)),
                     settings=[asdict(s) for s in budget.settings])
    log.warning("privacy budget RESET by %s at %s: party %r, data fingerprint %s: %d releases "
                "of %d records (at most %d of one record) are forgotten; their privacy loss is "
                "not", operator, when, party, fingerprint, entry["releases_total"],
                entry["records_released"], entry["max_releases"])
    with open(Path(directory) / "resets.jsonl", "a", encoding="utf-8") as fh:
        fh.write(json.dumps(entry) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    path.unlink()  # the snapshot first: a journal without its snapshot is never read
    for journal in Path(directory).glob(f"{fingerprint}.*.journal"):
        journal.unlink(missing_ok=True)
    return entry
