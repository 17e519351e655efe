"""Checks a party runs on what a peer sends, before anything touches its models or state.

Numbers are checked where they arrive: one NaN or 3e38 gradient used to make
every later embedding NaN, and a wrong-shape Backward used to consume its pending batch so that
the correct retry failed. Every check here runs before any state changes, and every refusal
carries a boundary message (:func:`vflink.protocol.boundary.refuse`) that names the check, never
a value.

Pending state is bounded: training forwards waiting for their gradient expire after
``policy.pending_ttl_s`` and at most ``policy.max_pending_batches`` are kept.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import MutableMapping
from typing import TYPE_CHECKING, Any

import numpy as np

from vflink._threads import extremes, in_pieces, pass_threads
from vflink.errors import ConfigError, PolicyViolation, ProtocolError
from vflink.models.spec import BottomSpec, bottom_parameters
from vflink.parties.policy import PartyPolicy
from vflink.protocol.boundary import refuse
from vflink.protocol.messages import AlignmentView, Backward, Embeddings
from vflink.protocol.names import check_name

if TYPE_CHECKING:
    import torch

__all__ = [
    "admit_forward",
    "admit_snapshot",
    "bottom_parameters",
    "check_alignment_view",
    "check_backward",
    "check_bottom_spec",
    "check_embeddings",
    "check_values",
]


def check_values(values: Any, *, party: str, what: str, max_abs: float,
                 allow_nan: bool = False) -> None:
    """Refuse non-finite values (NaN allowed only with ``allow_nan``) and magnitudes above
    ``max_abs`` in a tensor or array received from a peer (ProtocolError)."""
    # torch is loaded by whoever made a tensor; linkage checks numpy arrays without importing it
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(values, torch.Tensor):
        if values.is_complex():
            raise refuse(ProtocolError, f"party {party!r}: {what} must be real numbers",
                         code="value.dtype")
        arr = values.detach()
        if not arr.is_floating_point():
            return  # integers are finite; their range is checked by the caller's shapes
        nan = torch.isnan(arr)
        bad_nan = bool(nan.any()) and not allow_nan
        finite = torch.isfinite(arr) | nan
        too_big = bool((arr.abs() > max_abs).any())
        inf = not bool(finite.all())
    else:
        a = np.asarray(values)
        if not np.issubdtype(a.dtype, np.floating):
            return
        if a.size:
            # Two passes and no temporary when all is well (14 M similarities: a tenth of
            # the masked path's time): NaN and infinities show in the minimum or maximum
            lo, hi = map(float, extremes(a))
            if math.isfinite(lo) and math.isfinite(hi):
                if max(-lo, hi) > max_abs:
                    raise refuse(ProtocolError, f"party {party!r}: {what} holds values of "
                                                f"magnitude above {max_abs:g} (its policy's "
                                                "max_abs_value); refused before use",
                                 code="value.range")
                return
        nan_mask = np.isnan(a)
        bad_nan = bool(nan_mask.any()) and not allow_nan
        inf = bool(np.isinf(a).any())
        with np.errstate(invalid="ignore"):
            too_big = bool((np.abs(a[~nan_mask]) > max_abs).any())
    if bad_nan or inf:
        raise refuse(ProtocolError, f"party {party!r}: {what} holds non-finite values "
                                    "(NaN or infinity); refused before use", code="value.finite")
    if too_big:
        raise refuse(ProtocolError, f"party {party!r}: {what} holds values of magnitude above "
                                    f"{max_abs:g} (its policy's max_abs_value); refused before "
                                    "use", code="value.range")


def admit_forward(pending: MutableMapping[int, Any], since: MutableMapping[int, float],
                  batch_id: int, *, party: str, policy: PartyPolicy,
                  now: float | None = None) -> None:
    """Make room for a training forward of ``batch_id``: expire old pending batches, refuse
    when the limit is reached (PolicyViolation). Call before computing anything."""
    now = time.monotonic() if now is None else now
    for bid in list(pending):
        started = since.setdefault(bid, now)
        if now - started > policy.pending_ttl_s:
            pending.pop(bid, None)
            since.pop(bid, None)
    for bid in list(since):  # timestamps of batches applied or dropped elsewhere
        if bid not in pending:
            since.pop(bid)
    if batch_id in pending:  # a retried forward replaces its earlier self
        pending.pop(batch_id)
        since.pop(batch_id, None)
    if len(pending) >= policy.max_pending_batches:
        raise refuse(PolicyViolation,
                     f"party {party!r} already holds {len(pending)} training batches waiting "
                     f"for their Backward (its limit, policy.max_pending_batches); send the "
                     f"missing Backward messages or wait {policy.pending_ttl_s:g} s for them to "
                     "expire", code="limit.pending-batches")
    since[batch_id] = now


def check_backward(pending: MutableMapping[int, torch.Tensor], applied: set[int],
                   message: Backward, *, party: str, policy: PartyPolicy) -> None:
    """Everything a Backward must satisfy, checked before the pending batch is consumed, so a
    refused gradient leaves the batch in place and a correct retry applies exactly once."""
    import torch

    if message.batch_id in applied:
        return  # a retried call; the handler acknowledges it as a duplicate
    out = pending.get(message.batch_id)
    if out is None:
        raise refuse(ProtocolError, f"party {party!r} has no training batch "
                                    f"{message.batch_id} waiting for a gradient (never sent, "
                                    "expired or refused)", code="backward.unknown-batch")
    grad = message.grad
    if not isinstance(grad, torch.Tensor) or not grad.is_floating_point():
        raise refuse(ProtocolError, f"party {party!r}: the gradient of batch "
                                    f"{message.batch_id} must be a floating-point tensor",
                     code="backward.dtype")
    if tuple(grad.shape) != tuple(out.shape):
        raise refuse(ProtocolError, f"party {party!r}: the gradient of batch "
                                    f"{message.batch_id} has shape {tuple(grad.shape)}, its "
                                    f"embeddings have shape {tuple(out.shape)}; the batch is "
                                    "kept for a correct retry", code="backward.shape")
    check_values(grad, party=party, what=f"the gradient of batch {message.batch_id}",
                 max_abs=policy.max_abs_value)


def admit_snapshot(snapshots: MutableMapping[str, Any], tag: str, *, party: str,
                   policy: PartyPolicy) -> None:
    """Refuse an invalid snapshot tag (:func:`vflink.protocol.names.check_name`), or a new
    one beyond ``policy.max_snapshots`` (a known tag is replaced)."""
    check_name(tag, "snapshot", party=party)
    if tag not in snapshots and len(snapshots) >= policy.max_snapshots:
        raise refuse(PolicyViolation,
                     f"party {party!r} already keeps {len(snapshots)} snapshots (its limit, "
                     "policy.max_snapshots); reuse a tag", code="limit.snapshots")


def check_bottom_spec(spec: BottomSpec, n_inputs: int, *, party: str,
                      policy: PartyPolicy) -> None:
    """Refuse a bottom model larger than ``policy.max_model_parameters`` before building it
    (an MLP or a CNN; a CNN whose image shape does not fit the party's features is refused
    too, naming no value of the party's data)."""
    try:
        n = bottom_parameters(spec, n_inputs)
    except ConfigError:
        raise refuse(ConfigError, f"party {party!r}: the requested CNN bottom model's image "
                                  "shape does not fit this party's features",
                     code="model.image-shape") from None
    if n > policy.max_model_parameters:
        raise refuse(PolicyViolation,
                     f"party {party!r}: the requested bottom model has {n} parameters, over "
                     f"its limit of {policy.max_model_parameters} "
                     "(policy.max_model_parameters)", code="limit.model-size")


def check_embeddings(reply: Embeddings, *, requested: int, width: int | None, party: str,
                     peer: str, policy: PartyPolicy) -> None:
    """The primary's check of a secondary's embeddings before they enter its model."""
    import torch

    emb, inverse = reply.embeddings, np.asarray(reply.inverse)
    if not isinstance(emb, torch.Tensor) or emb.ndim != 2 or not emb.is_floating_point():
        raise ProtocolError(f"{peer!r} sent embeddings that are not a 2-D float tensor")
    if inverse.ndim != 1 or len(inverse) != requested:
        raise ProtocolError(f"{peer!r} sent an index map of {len(inverse)} rows for "
                            f"{requested} requested rows")
    if requested and (inverse.min() < 0 or inverse.max() >= emb.shape[0]):
        raise ProtocolError(f"{peer!r} sent an index map pointing outside its "
                            f"{emb.shape[0]} embeddings")
    if width is not None and emb.shape[1] != width:
        raise ProtocolError(f"{peer!r} sent embeddings of width {emb.shape[1]}, expected the "
                            f"agreed cut width {width}")
    check_values(emb, party=party, what=f"the embeddings from {peer!r}",
                 max_abs=policy.max_abs_value)


def check_alignment_view(view: AlignmentView, *, party: str, peer: str,
                         policy: PartyPolicy) -> None:
    """The primary's check of an alignment view from the coordinator: consistent shapes,
    finite similarities (NaN only where a link is missing), bounded magnitudes."""
    p, s = np.asarray(view.primary_index), np.asarray(view.secondary_index)
    if p.ndim != 1 or s.ndim not in (1, 2) or len(s) != len(p):
        raise ProtocolError(f"{peer!r} sent an alignment for {view.secondary!r} with "
                            f"inconsistent shapes {p.shape} and {s.shape}")
    flat = s.reshape(-1)
    lowest = (min(in_pieces(lambda r: flat[r].min(), flat.size, pass_threads(flat.size)))
              if flat.size else 0)
    if (p.size and p.min() < 0) or lowest < -1:
        raise ProtocolError(f"{peer!r} sent an alignment for {view.secondary!r} with negative "
                            "row indices")
    if view.similarity is not None:
        sim = np.asarray(view.similarity)
        if sim.shape != s.shape and sim.shape != (len(p),):
            raise ProtocolError(f"{peer!r} sent similarities of shape {sim.shape} for links "
                                f"of shape {s.shape}")
        # no link missing (no −1): the similarities are checked as they are, with no mask
        missing = (s == -1) if sim.shape == s.shape and lowest < 0 else None
        check_values(np.where(missing, 0.0, sim) if missing is not None and missing.any()
                     else sim, party=party,
                     what=f"the similarities from {peer!r}", max_abs=policy.max_abs_value)
    if view.match is not None and np.asarray(view.match).shape != s.shape:
        raise ProtocolError(f"{peer!r} sent match decisions of shape "
                            f"{np.asarray(view.match).shape} for links of shape {s.shape}")
