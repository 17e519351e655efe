"""A secondary's embedding protection, as the party uses it (VFL-AFE; ARCHITECTURE.md conv. 4).

:class:`EmbeddingProtection` sits between the secondary's bottom model and the channel: the
party passes its raw cut-layer output through :meth:`~EmbeddingProtection.protect` and sends
what comes back; when the gradient returns it calls :meth:`~EmbeddingProtection.backward`. The
noise is added here, in the secondary's own process, so over any transport the primary only
ever receives clipped and noised embeddings. The secondary's settings are its own (the run
config in-process, its party file across hosts); a primary's :class:`SetupPrivacy` is checked
against them (:func:`vflink.privacy.embedding_dp.agree_settings`), and adopted only by a
secondary that has none.

Release counts belong to the party's data, not to a run or a session: one
:class:`~vflink.privacy.budget.ReleaseBudget` per party object, kept in the party's state
directory under its data fingerprint when it has one. Each training run of each primary has its
own protection (:meth:`EmbeddingProtection.for_run`: that primary's links, the run's training
rows, its own :class:`EmbeddingDP`), and every one counts on the *same* budget; a new
``SetupBottom``, ``SetupPrivacy``, ``LoadState``, session, run or process starts a new
:class:`EmbeddingDP` on it, so once a record's budget is spent no request of any primary
releases it again; only the party's operator resets it (``vflink privacy-budget --reset``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from vflink.errors import ConfigError, DataError, PrivacyBudgetExceeded
from vflink.privacy.budget import ReleaseBudget
from vflink.privacy.config import PrivacyConfig
from vflink.privacy.embedding_dp import EmbeddingDP, Observer, agree_settings
from vflink.privacy.randomized_response import CodeField
from vflink.protocol.boundary import refuse

__all__ = ["EmbeddingProtection"]


class EmbeddingProtection:
    """Pass-through when off; otherwise an :class:`EmbeddingDP` per training run, all of them
    counting on the data's one :class:`ReleaseBudget`.

    Args:
        budget_dir: where the release counts are kept (the party's state directory's
            ``_privacy-budget``); ``None``: in memory, for the life of this object.
        fingerprint: the data fingerprint naming the counts' file (called once, when the
            counts are first needed).
    """

    def __init__(self, party: str, n_rows: int, own: PrivacyConfig | None,
                 seed: int | None, *, budget_dir: Path | None = None,
                 fingerprint: Callable[[], str] | None = None) -> None:
        self.party = party
        self.n_rows = n_rows
        self.own = own if own is not None and own.enabled else None
        self._own_given = own is not None
        self.seed = seed if seed is not None else (own.seed if own is not None else None)
        self.dp: EmbeddingDP | None = None
        self._observer: Observer | None = None
        self._links = np.zeros(n_rows, dtype=np.int64)
        self._train_rows = np.zeros(0, dtype=np.int64)
        self._code_fields: tuple[CodeField, ...] | None = None
        self._budget_dir = budget_dir
        self._fingerprint = fingerprint
        self._budget: ReleaseBudget | None = None
        #: the party's protection a run's protection counts on (None: this is the party's)
        self._parent: EmbeddingProtection | None = None
        self.start()

    def for_run(self, links_per_row: npt.NDArray[np.int64] | None = None
                ) -> EmbeddingProtection:
        """One training run's protection: this party's settings, on this party's budget, with
        the links of the run's primary (``links_per_row``: how many of that primary's records
        link to each of this party's rows, from its alignment) and nothing else of another
        run (its training rows, fields, noise and counts)."""
        run = EmbeddingProtection.__new__(EmbeddingProtection)
        run.party, run.n_rows, run.own, run._own_given = (self.party, self.n_rows, self.own,
                                                          self._own_given)
        run.seed = self.seed
        run.dp = None
        run._observer = self._observer
        run._links = np.zeros(self.n_rows, dtype=np.int64)
        run._train_rows = np.zeros(0, dtype=np.int64)
        run._code_fields = None
        run._budget_dir, run._fingerprint, run._budget = None, None, None
        run._parent = self
        if links_per_row is not None:
            run.note_links(links_per_row)
        run.start()
        return run

    @property
    def budget(self) -> ReleaseBudget:
        """The release counts of this party's data (loaded from its file on first use)."""
        if self._parent is not None:
            return self._parent.budget
        if self._budget is None:
            if self._budget_dir is not None and self._fingerprint is not None:
                self._budget = ReleaseBudget.open(self._budget_dir, self._fingerprint(),
                                                  self.n_rows, party=self.party)
            else:
                self._budget = ReleaseBudget(self.n_rows, party=self.party)
        return self._budget

    @property
    def observer(self) -> Observer | None:
        """Local diagnostics of every training batch (:data:`vflink.privacy.embedding_dp.
        Observer`), in this process only: they never cross the boundary."""
        return self._observer

    @observer.setter
    def observer(self, observer: Observer | None) -> None:
        self._observer = observer
        if self.dp is not None:
            self.dp.observer = observer

    def _new(self, config: PrivacyConfig, classes: int | None) -> EmbeddingDP:
        dp = EmbeddingDP(config, party=self.party, n_rows=self.n_rows, seed=self.seed,
                         classes=classes, budget=self.budget)
        dp.note_links(self._links)
        dp.note_train_rows(self._train_rows)
        dp.code_fields = self._code_fields
        dp.observer = self._observer
        return dp

    def start(self) -> None:
        """A new training run: the party's own protection, counting this run's releases on
        top of every earlier release of the data (the budget is never reset here)."""
        self.dp = self._new(self.own, None) if self.own is not None else None

    def setup(self, settings: dict[str, Any], classes: int,
              plan: dict[str, Any] | None = None) -> dict[str, float]:
        """The primary announced the run's settings (and, budget first, its release plan):
        agree (or refuse), and start."""
        own = self.own if self._own_given else None
        if self._own_given and self.own is None:  # this party chose "off" explicitly
            own = PrivacyConfig(embeddings="off")
        try:
            config = agree_settings(own, settings, self.party)
        except ConfigError as exc:
            # public parameters only (the run's and this party's settings): safe to tell
            raise refuse(ConfigError, str(exc), code="privacy.settings") from None
        if not config.enabled:
            self.dp = None
            return {}
        self.dp = self._new(config, classes if classes >= 2 else None)
        if config.budget_first:
            try:
                self.dp.set_plan(plan or {})
            except ConfigError as exc:
                raise refuse(ConfigError, str(exc), code="privacy.plan") from None
            return {}  # σ follows from the plan and the training rows (FitPreprocessing)
        return {"sigma": self.dp.sigma, "noise_std": self.dp.noise_std}

    def note_train_rows(self, rows: npt.NDArray[np.int64]) -> None:
        """The records linked to training records (``FitPreprocessing``): their planned
        releases include the training passes."""
        self._train_rows = np.asarray(rows, dtype=np.int64).copy()
        if self.dp is not None:
            self.dp.note_train_rows(self._train_rows)

    @property
    def wants_code_fields(self) -> bool:
        """This run quantises rows with ``randomized-response`` (the layout is then needed)."""
        return self.dp is not None and self.dp.config.randomized_response

    def note_code_fields(self, fields: tuple[CodeField, ...] | None) -> None:
        """The preprocessed row's layout for the ``fields`` quantiser (after the fit)."""
        self._code_fields = fields
        if self.dp is not None:
            self.dp.code_fields = fields

    def note_links(self, links_per_row: npt.NDArray[np.int64]) -> None:
        """How many primary records link to each row, from the alignment (soft linkage: a row
        may serve many records): one count per row of this party's table."""
        counts = np.asarray(links_per_row, dtype=np.int64)
        if counts.shape != (self.n_rows,):
            raise DataError(f"party {self.party!r}: {counts.size} link counts for a table of "
                            f"{self.n_rows} rows")
        self._links = counts.copy()
        if self.dp is not None:
            self.dp.note_links(self._links)

    def protect(self, out: torch.Tensor, rows: npt.NDArray[np.int64],
                inputs: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(kept, sent)``: the tensor whose graph the backward pass uses, and what to send.
        ``inputs``: the bottom model's input rows (``randomized-response`` quantises them)."""
        if self.dp is None:
            return out, out.detach()
        try:
            return self.dp.release(out, rows, inputs)
        except PrivacyBudgetExceeded as exc:
            # the budget and the release count are public parameters: the primary may see them
            raise refuse(PrivacyBudgetExceeded, str(exc), code="privacy.budget") from None

    def backward(self, kept: torch.Tensor, grad: torch.Tensor) -> None:
        if self.dp is not None and (self.dp.config.release_once
                                    or self.dp.config.randomized_response):
            return  # the bottom model stays as released: its releases are cached
        extra = self.dp.local_loss(kept, grad) if self.dp is not None else None
        if extra is None or not extra.requires_grad:  # e.g. no confident soft labels
            kept.backward(grad)
        else:
            torch.autograd.backward([kept, extra], [grad, torch.ones_like(extra)])

    def report(self) -> tuple[dict[str, Any], ...]:
        return (self.dp.report(),) if self.dp is not None else ()

    def state_dict(self) -> dict[str, Any] | None:
        return self.dp.state_dict() if self.dp is not None else None

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        if state is None:
            return
        config = self.own if self.own is not None else PrivacyConfig.from_public(
            state["settings"])
        if config.public_settings() != state["settings"]:
            agree_settings(config, state["settings"], self.party)  # raises, naming the mismatch
        if self.dp is None or self.dp.config != config:
            self.dp = self._new(config, state.get("classes"))
        self.dp.load_state_dict(state)
