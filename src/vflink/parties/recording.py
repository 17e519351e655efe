"""What a party *received*, recorded in its own state directory for later attacks.

With ``[evaluation] record = true`` every party keeps a bounded sample of what crossed the
boundary towards it (docs/how-to/attacks-and-reports.md): the cut-layer embeddings at the
primary, the gradients at each secondary, the similarities at the primary, and the alignment
indices everywhere. The recorder only *observes* messages the party handles anyway; it never
sends anything, so a run's transcript is the same with and without it (tested).

A party writes its recording into its own directory only (``<state dir>/evaluation/``):
``received.npz`` (plain arrays, loaded with ``allow_pickle=False``) and ``received.json`` (a
versioned manifest). Nothing of another party's private data is ever stored here: only what
this party saw. Ground truth for scoring attacks lives elsewhere (the run's ``evaluation/``
directory, written by the runner).

Layout of ``received.npz``: for each stream ``(kind, peer)`` the arrays
``<kind>__<peer>__values`` and ``<kind>__<peer>__ids`` (and ``__batch`` for per-batch streams):

* ``embeddings``/secondary (primary side): rows are *secondary* row ids, one per unique row of a
  training batch, as the secondary answered (``Embeddings.inverse`` order).
* ``gradients``/primary (secondary side): the gradient for each unique row of a training batch.
* ``requests``/primary (secondary side): for each recorded gradient batch, the rows the
  training ``Forward`` asked for, in the order asked (ids, with repeats: one per (record, link)
  pair of the primary's batch) and, as values, each one's position among the batch's unique
  rows (the order of the gradient rows). A batch's noise is drawn in the primary's order, so
  an attack that regenerates it (:mod:`vflink.attacks.whitebox`) needs this order.
* ``similarities``/coordinator and ``indices``/coordinator: the ``(n, K)`` alignment as received
  (ids are the primary rows, or the secondary's view for a secondary).

The manifest's ``meta`` also keeps small facts received in control messages, e.g. the seed of
the ``SetupBottom`` spec (``setup__<peer>``): everything a peer sent is what a curious party
holds, and white-box attacks try every seed it received.
"""

from __future__ import annotations

import logging
import os
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from vflink._files import atomic_open, atomic_write_json
from vflink._typed import ANY, Int, MapOf, Obj, Str, load_arrays, read_typed_json
from vflink.errors import ConfigError, DataError

__all__ = ["RECORDING_DIR", "RECORDING_VERSION", "Recorder", "Recording", "read_recording"]

log = logging.getLogger(__name__)

RECORDING_VERSION = 1
#: sub-directory of a party's state directory that holds its recording
RECORDING_DIR = "evaluation"
_NPZ, _MANIFEST = "received.npz", "received.json"


@dataclass
class _Stream:
    values: list[npt.NDArray[Any]] = field(default_factory=list)
    ids: list[npt.NDArray[np.int64]] = field(default_factory=list)
    batch: list[npt.NDArray[np.int64]] = field(default_factory=list)
    rows: int = 0


class Recorder:
    """Collects a bounded sample of what one party received.

    Args:
        max_rows: per-batch streams (embeddings, gradients) keep the rows of whole training
            batches until this many rows are held; later batches are counted but not kept.
            Early batches leak as much as late ones (Li et al., ICLR 2022, Fig. 2), and a
            prefix keeps the sample reproducible without any random draw.
    """

    def __init__(self, *, max_rows: int = 20_000) -> None:
        if not isinstance(max_rows, int) or max_rows < 1:
            raise ConfigError(f"`max_rows` must be an int ≥ 1, got {max_rows!r}")
        self.max_rows = max_rows
        self._streams: dict[tuple[str, str], _Stream] = defaultdict(_Stream)
        self._whole: dict[tuple[str, str], tuple[npt.NDArray[Any], npt.NDArray[np.int64]]] = {}
        self._pending: dict[int, tuple[npt.NDArray[np.int64], npt.NDArray[np.int64] | None]] = {}
        self._seen: dict[str, int] = defaultdict(int)
        self.meta: dict[str, Any] = {}
        self._dirty = False

    def for_run(self) -> Recorder:
        """A recorder for one training run of a party that trains with several primaries
        (its own batches), holding what this one recorded of the alignments so far."""
        run = Recorder(max_rows=self.max_rows)
        run._whole = dict(self._whole)
        run.meta = dict(self.meta)
        run._dirty = bool(run._whole)
        return run

    # --- what a party calls from its handlers ----------------------------------------------

    def new_training(self) -> None:
        """A new training starts (a served party lives through many runs): forget the previous
        run's batches; the latest alignment is kept (it arrives before the training)."""
        self._streams.clear()
        self._pending.clear()
        self._seen.clear()
        self._dirty = True

    def batch(self, kind: str, peer: str, batch_id: int, ids: npt.ArrayLike,
              values: Any) -> None:
        """One training batch of per-row values received from ``peer`` (rows ``ids``)."""
        arr = _numpy(values)
        idx = np.asarray(ids, dtype=np.int64).ravel()
        if arr.shape[0] != idx.shape[0]:
            raise DataError(f"recording {kind}: {arr.shape[0]} rows for {idx.shape[0]} ids")
        self._seen[kind] += int(idx.shape[0])
        stream = self._streams[(kind, peer)]
        if stream.rows >= self.max_rows:
            return
        stream.values.append(arr.copy())
        stream.ids.append(idx.copy())
        stream.batch.append(np.full(idx.shape[0], batch_id, dtype=np.int64))
        stream.rows += int(idx.shape[0])
        self._dirty = True

    def whole(self, kind: str, peer: str, ids: npt.ArrayLike, values: Any,
              meta: dict[str, Any] | None = None) -> None:
        """A whole array received once (an alignment's indices or similarities)."""
        self._whole[(kind, peer)] = (_numpy(values).copy(),
                                     np.asarray(ids, dtype=np.int64).ravel().copy())
        if meta:
            self.meta[f"{kind}__{peer}"] = {k: _plain(v) for k, v in meta.items()}
        self._dirty = True

    def note(self, kind: str, peer: str, info: dict[str, Any]) -> None:
        """Small facts received from ``peer`` in a control message (e.g. a spec's seed)."""
        self.meta[f"{kind}__{peer}"] = {k: _plain(v) for k, v in info.items()}
        self._dirty = True

    def forward_rows(self, batch_id: int, rows: npt.ArrayLike,
                     requested: npt.ArrayLike | None = None) -> None:
        """A secondary notes which of its rows a training batch covered (the gradient that comes
        back for this batch is row-aligned with them) and, ``requested``, the rows as the
        primary asked for them (in its order, with repeats)."""
        self._pending[batch_id] = (np.asarray(rows, dtype=np.int64).copy(),
                                   None if requested is None
                                   else np.asarray(requested, dtype=np.int64).copy())

    def gradients(self, peer: str, batch_id: int, grad: Any) -> None:
        pending = self._pending.pop(batch_id, None)
        if pending is None:
            return
        rows, requested = pending
        kept = self._streams[("gradients", peer)].rows < self.max_rows
        self.batch("gradients", peer, batch_id, rows, grad)
        if kept and requested is not None:  # the same batches as the gradients, uncapped
            stream = self._streams[("requests", peer)]
            stream.values.append(np.searchsorted(rows, requested).astype(np.int64))
            stream.ids.append(requested)
            stream.batch.append(np.full(requested.shape[0], batch_id, dtype=np.int64))
            stream.rows += int(requested.shape[0])

    # --- storage ------------------------------------------------------------------------

    def flush(self, state_dir: Path, *, party: str, role: str) -> Path | None:
        """Write the recording into ``state_dir/evaluation/`` (atomically); None if empty."""
        if not self._dirty and (Path(state_dir) / RECORDING_DIR / _MANIFEST).is_file():
            return None
        if not self._streams and not self._whole:
            return None
        out = Path(state_dir) / RECORDING_DIR
        out.mkdir(parents=True, exist_ok=True)
        arrays: dict[str, npt.NDArray[Any]] = {}
        streams = []
        for (kind, peer), s in sorted(self._streams.items()):
            if not s.values:
                continue
            key = f"{kind}__{peer}"
            arrays[f"{key}__values"] = np.concatenate(s.values, axis=0)
            arrays[f"{key}__ids"] = np.concatenate(s.ids)
            arrays[f"{key}__batch"] = np.concatenate(s.batch)
            streams.append({"kind": kind, "peer": peer, "rows": s.rows, "per_batch": True,
                            "batches": len(s.values)})
        for (kind, peer), (values, ids) in sorted(self._whole.items()):
            key = f"{kind}__{peer}"
            arrays[f"{key}__values"] = values
            arrays[f"{key}__ids"] = ids
            streams.append({"kind": kind, "peer": peer, "rows": int(values.shape[0]),
                            "per_batch": False})
        # never through a link or a planted temporary name (vflink._files)
        with atomic_open(out / _NPZ, "wb") as fh:
            np.savez_compressed(fh, **arrays)  # type: ignore[arg-type]
        manifest = {"version": RECORDING_VERSION, "party": party, "role": role,
                    "max_rows": self.max_rows, "rows_seen": dict(self._seen),
                    "streams": streams, "meta": self.meta,
                    "note": "what this party received; never another party's private data"}
        atomic_write_json(out / _MANIFEST, manifest, indent=2)
        self._dirty = False
        log.debug("%s: recorded %d streams into %s", party, len(streams), out)
        return out


@dataclass(frozen=True)
class Recording:
    """A party's recording as read back: ``get(kind, peer)`` → (values, ids, batch or None)."""

    party: str
    role: str
    manifest: dict[str, Any]
    arrays: dict[str, npt.NDArray[Any]]

    def streams(self, kind: str) -> list[str]:
        """Peers from which this party recorded ``kind``."""
        return [s["peer"] for s in self.manifest["streams"] if s["kind"] == kind]

    def get(self, kind: str, peer: str | None = None
            ) -> tuple[npt.NDArray[Any], npt.NDArray[np.int64], npt.NDArray[np.int64] | None]:
        peers = self.streams(kind)
        if not peers:
            raise DataError(f"party {self.party!r} recorded no {kind}")
        if peer is None:
            peer = peers[0]
        key = f"{kind}__{peer}"
        if f"{key}__values" not in self.arrays:
            raise DataError(f"party {self.party!r} recorded no {kind} from {peer!r}")
        return (self.arrays[f"{key}__values"], self.arrays[f"{key}__ids"],
                self.arrays.get(f"{key}__batch"))

    def meta(self, kind: str, peer: str) -> dict[str, Any]:
        return dict(self.manifest.get("meta", {}).get(f"{kind}__{peer}", {}))


def read_recording(state_dir: Path) -> Recording:
    """Read a party's recording from its state directory (no pickle)."""
    base = Path(state_dir) / RECORDING_DIR
    if not os.path.lexists(base / _MANIFEST):
        raise DataError(f"{base}: nothing recorded (run with [evaluation] record = true)")
    # regular files inside the recording's own folder, read once (no swap between a check
    # and the read), JSON within depth and size limits: a recording from elsewhere is data
    manifest = read_typed_json(base, _MANIFEST, _MANIFEST_SCHEMA)
    if manifest.get("version") != RECORDING_VERSION:
        raise DataError(f"{base / _MANIFEST}: recording version {manifest.get('version')!r}, "
                        f"expected {RECORDING_VERSION}")
    # numeric arrays only, each checked from its header (an object array is never unpickled)
    arrays = load_arrays(base, _NPZ)
    return Recording(str(manifest["party"]), str(manifest["role"]), manifest, arrays)


#: what a recording's manifest must hold before any of it is used
_MANIFEST_SCHEMA = Obj(required={"version": Int(), "party": Str(), "role": Str()},
                       optional={"meta": MapOf(MapOf(ANY))})


def _numpy(values: Any) -> npt.NDArray[Any]:
    if hasattr(values, "detach"):  # a torch tensor
        return np.asarray(values.detach().cpu().numpy())
    return np.asarray(values)


def _plain(v: Any) -> Any:
    if isinstance(v, (np.floating, np.integer)):
        return v.item()
    return v
