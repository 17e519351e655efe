"""``vflink.link``: private fuzzy top-K soft linkage of two tables (FedSim §4.1), from Python.

A thin layer over :func:`vflink.runner.link.run_linkage` and
:func:`vflink.runner.field_link.run_field_linkage`, the functions ``vflink link`` runs: the same
tables and options give the same links. Imports neither torch nor scikit-learn.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vflink._checks import (
    check_choice,
    check_float,
    check_int,
    check_one_to_one,
    check_probability,
    from_table,
)
from vflink.api._tables import TableLike, columns_arg, read_table
from vflink.errors import ConfigError, DataError
from vflink.types import Compute

if TYPE_CHECKING:
    import numpy.typing as npt
    import pandas as pd

    from vflink.linkage import BloomConfig, GeoBloomConfig
    from vflink.linkage.fields import Blocking, FieldSpec
    from vflink.runner.link import LinkOutcome
    from vflink.types import Alignment

__all__ = ["Links", "link"]

METRICS = ("euclidean", "haversine", "hamming", "levenshtein")
MODES = ("soft", "top1", "exact")
SEARCHES = ("auto", "exact", "approximate")


@dataclass(frozen=True, eq=False)
class Links:
    """The result of :func:`link`: one row per (primary record, neighbour), and the figures.

    Attributes
    ----------
    summary : dict
        What ``vflink link`` writes to ``<out>.summary.json``: sizes, metric, privacy and
        encoding, Eq. 1's ``mu0``/``sigma0``, the noise ``sigma``, ``tau`` (Theorem 2),
        ``epsilon`` at ``delta`` (Theorem 1), the improvement estimates Δ (§4.3), bytes
        exchanged, skipped rows and ``phase_seconds``.
    outcome : vflink.runner.link.LinkOutcome
        The coordinator's :class:`~vflink.linkage.SoftLinkage` (``outcome.linkage``: n × K
        indices, distances, similarities) and the primary's view of it.
    path : pathlib.Path or None
        The links file written when ``out`` was given.
    """

    columns: Mapping[str, npt.NDArray[Any]] = field(repr=False)
    summary: dict[str, Any]
    outcome: LinkOutcome = field(repr=False)
    path: Path | None = None
    streamed: bool = False

    @functools.cached_property
    def frame(self) -> pd.DataFrame:
        """The links as a DataFrame, in the format of ``vflink link``'s output file.

        Columns ``primary_index`` and ``secondary_index`` (0-based row positions in the input
        tables), ``rank`` (0 = most similar), ``distance``, ``similarity`` (after noise), and
        ``primary_id`` / ``secondary_id`` when ``id`` / ``secondary_id`` were given.
        """
        import pandas as pd

        if self.streamed and self.path is not None:  # the links are in the file only
            if self.path.suffix.lower() == ".csv":
                return pd.read_csv(self.path)
            from vflink.data.parts import read_parts

            return read_parts(self.path).to_pandas()
        return pd.DataFrame(dict(self.columns))

    @property
    def alignment(self) -> Alignment:
        """The primary's :class:`~vflink.Alignment` (indices n × K and similarities)."""
        return self.outcome.alignment

    def __len__(self) -> int:
        if self.streamed:
            return int(self.summary["sizes"]["links"])
        return len(self.columns["rank"])

    def __repr__(self) -> str:
        s = self.summary
        return (f"Links({len(self)} links, K = {s.get('top_k')}, metric {s.get('metric')!r}, "
                f"privacy {s.get('privacy')!r}, epsilon {s.get('epsilon')!r})")

    def evaluate(self, truth: Any, *, points: int = 101) -> dict[str, Any]:
        """Measured quality against true pairs, beside the model's label-free estimate.

        ``truth``: a table (DataFrame or CSV/Parquet path) with columns ``primary_index`` and
        ``secondary_index`` (0-based rows), or ``primary_id`` and ``secondary_id`` (the
        ``id`` / ``secondary_id`` columns of the link), or a sequence of (primary row,
        secondary row) pairs. The chosen links are those with ``match`` (a model link) or of
        rank 0. Returns ``measured`` (precision, recall, F1 and counts), ``pr_curve``
        (precision and recall of "score ≥ s" over the links, the score being the match
        probability or the similarity) and, for a model link, ``estimated`` (the model's
        label-free precision, recall and F1 of the same decision).
        """
        from vflink.linkage.decisions import measure, pr_curve

        frame = self.frame
        rows, cols = _truth_pairs(truth, frame)
        chosen = frame[frame["match"]] if "match" in frame else frame[frame["rank"] == 0]
        out: dict[str, Any] = {
            "measured": measure(chosen["primary_index"].to_numpy(),
                                chosen["secondary_index"].to_numpy(), rows, cols)}
        score = "match_probability" if "match_probability" in frame else "similarity"
        out["pr_curve"] = {"score": score, **pr_curve(
            frame["primary_index"].to_numpy(), frame["secondary_index"].to_numpy(),
            frame[score].to_numpy(dtype=float), rows, cols, points=points)}
        model = self.summary.get("model")
        if model:
            out["estimated"] = dict(model["estimated"])
        return out


def _truth_pairs(truth: Any, links: pd.DataFrame) -> tuple[Any, Any]:
    """(primary rows, secondary rows) of the true pairs (see :meth:`Links.evaluate`)."""
    import numpy as np
    import pandas as pd

    if isinstance(truth, (str, Path)):
        truth, _ = read_table(truth, argument="truth",
                              text_columns=("primary_id", "secondary_id"))
    if not isinstance(truth, pd.DataFrame):
        pairs = np.asarray(truth)
        if pairs.ndim != 2 or pairs.shape[1] != 2:
            raise DataError(f"truth must be a table or (primary row, secondary row) pairs, "
                            f"got an array of shape {pairs.shape}")
        return pairs[:, 0].astype(np.int64), pairs[:, 1].astype(np.int64)
    if {"primary_index", "secondary_index"} <= set(truth.columns):
        return (truth["primary_index"].to_numpy(dtype=np.int64),
                truth["secondary_index"].to_numpy(dtype=np.int64))
    if {"primary_id", "secondary_id"} <= set(truth.columns):
        missing = [c for c in ("primary_id", "secondary_id") if c not in links.columns]
        if missing:
            raise DataError(f"truth names records by primary_id/secondary_id, but the links have "
                            f"no {missing} column: link with `id` (and `secondary_id`)")
        p = dict(zip(links["primary_id"].astype(str), links["primary_index"], strict=False))
        s = dict(zip(links["secondary_id"].astype(str), links["secondary_index"], strict=False))
        rows, cols = [], []
        for k, (a, b) in enumerate(zip(truth["primary_id"].astype(str),
                                       truth["secondary_id"].astype(str), strict=True)):
            # a true pair whose record has no link at all counts as missed: a negative row
            # of its own never equals a link's
            rows.append(p.get(a, -1 - k))
            cols.append(s.get(b, -1 - k))
        return np.asarray(rows, dtype=np.int64), np.asarray(cols, dtype=np.int64)
    raise DataError("truth needs columns primary_index and secondary_index, or primary_id and "
                    f"secondary_id; it has: {', '.join(map(str, truth.columns[:20]))}")


def _config(cls: type, value: Any, argument: str) -> Any:
    """A linkage config object from itself or from a mapping of its fields."""
    if value is None or isinstance(value, cls):
        return value
    if not isinstance(value, Mapping):
        raise ConfigError(f"`{argument}` must be a {cls.__name__} or a mapping of its fields, "
                          f"got {value!r}")
    return from_table(cls, dict(value), f"`{argument}`")


def _specs(cls: type, values: Any, argument: str) -> list[Any]:
    """``fields`` / ``blocking``: specs, mappings of their fields (or a blocking column)."""
    if values is None:
        return []
    if isinstance(values, (str, Mapping)) or not isinstance(values, Sequence):
        values = [values]
    out: list[Any] = []
    problems: list[str] = []
    for i, value in enumerate(values):
        if isinstance(value, str) and argument == "blocking":
            value = {"on": value}
        try:
            out.append(_config(cls, value, f"{argument}[{i}]"))
        except ConfigError as exc:
            problems.extend(f"{argument}[{i}]: {p}" if not p.startswith(f"`{argument}")
                            else p for p in exc.problems)
    if problems:
        raise ConfigError("; ".join(problems), problems)
    return out


def _check(*, metric: str | None, top_k: Any, privacy: Any, mode: Any, tau: Any, sigma: Any,
           delta: Any, seed: Any, search: Any, empty: Any, resolution: Any,
           has_on: bool, has_fields: bool, problems: list[str] | None = None) -> None:
    """Every problem of the arguments at once (with ``problems`` found before), in one
    :class:`ConfigError`."""
    problems = list(problems or [])
    if has_fields:
        if has_on or metric is not None:
            problems.append("give either `fields` or `on`/`metric`, not both")
    else:
        if not has_on:
            problems.append("`on` is required: the identifier column(s) of the primary "
                            "(or give `fields`)")
        if metric is None:
            problems.append(f"`metric` is required: one of {', '.join(METRICS)}")
        else:
            check_choice(problems, "metric", metric, METRICS)
    check_int(problems, "top_k", top_k, min=1)
    if privacy is not None:
        check_choice(problems, "privacy", privacy, ("bloom", "off"))
    check_choice(problems, "mode", mode, MODES)
    check_choice(problems, "search", search, SEARCHES)
    check_choice(problems, "empty", empty, ("error", "skip"))
    # τ is a success rate in (0, 1] (1: no noise); σ ≥ 0 (0: no noise), FedSim Theorem 2
    check_float(problems, "tau", tau, min=0.0, max=1.0, min_exclusive=True, allow_none=True)
    check_float(problems, "sigma", sigma, min=0.0, allow_none=True)
    check_float(problems, "resolution", resolution, min=0.0, min_exclusive=True,
                allow_none=True)
    check_float(problems, "delta", delta, min=0.0, max=1.0, min_exclusive=True)
    if seed is not None:
        check_int(problems, "seed", seed, min=0)
    if tau is not None and sigma is not None:
        problems.append("give at most one of `tau` and `sigma`")
    if problems:
        raise ConfigError("; ".join(problems), problems)


def _ids(frame: pd.DataFrame, column: str | None, source: str, explicit: bool
         ) -> npt.NDArray[Any] | None:
    """A record-id column as text (``None`` when not asked for, or implicitly and absent)."""
    if column is None or (not explicit and column not in frame.columns):
        return None
    if column not in frame.columns:
        raise DataError(f"{source}: no record-id column {column!r}; the table has: "
                        f"{', '.join(map(str, frame.columns[:20]))}")
    return (frame[column].astype(object).where(frame[column].notna(), None)
            .map(lambda v: v if v is None else str(v)).to_numpy(dtype=object))


def link(primary: TableLike, secondary: TableLike, *,
         on: str | Sequence[str] | None = None,
         secondary_on: str | Sequence[str] | None = None,
         metric: str | None = None, top_k: int = 10, privacy: str | None = None,
         mode: str = "soft", tau: float | None = None, sigma: float | None = None,
         delta: float = 1e-5, seed: int | None = None, search: str = "auto",
         empty: str = "error", id: str | None = None, secondary_id: str | None = None,
         fields: Sequence[FieldSpec | Mapping[str, Any]] | None = None,
         blocking: Sequence[Blocking | Mapping[str, Any] | str] | None = None,
         bloom_filters: BloomConfig | Mapping[str, Any] | None = None,
         geo: GeoBloomConfig | Mapping[str, Any] | None = None,
         resolution: float | None = None, delimiter: str | None = None,
         encoding: str | None = None, decimal: str | None = None,
         secondary_delimiter: str | None = None, secondary_encoding: str | None = None,
         out: str | Path | None = None, overwrite: bool = False,
         compute: Compute | None = None, parts: bool | None = None,
         stream: bool | None = None, chunk_rows: int | None = None,
         model: str | None = None, threshold: float = 0.5, one_to_one: bool | str = False,
         view: str = "operator") -> Links:
    """Link every record of ``primary`` to its ``top_k`` most similar records of ``secondary``.

    Runs FedSim's soft linkage (§4.1) with the three parties in this process: each data party
    encodes its identifier columns and sends only the encodings to a coordinator, which finds
    the top-K, normalises the similarities (Eq. 1) and adds Gaussian noise (Eq. 2) whose scale
    follows from ``tau`` (Theorem 2) or is given as ``sigma``. The same as ``vflink link``.

    Parameters
    ----------
    primary, secondary : pandas.DataFrame or path
        The two tables, or paths of CSV, TSV, ``.csv.gz`` or Parquet files (string
        identifiers and ids are then read as text, so ``"007"`` keeps its zeros).
    on : str or list of str
        The primary's identifier column(s), e.g. ``["lat", "lon"]`` or ``"title"``.
    secondary_on : str or list of str, optional
        The secondary's identifier columns (default: the same names as ``on``).
    metric : str
        Distance between identifiers: ``"euclidean"``, ``"haversine"`` (latitude/longitude in
        degrees, km), ``"hamming"`` (Bloom filters) or ``"levenshtein"`` (strings). Required
        unless ``fields`` is given.
    top_k : int, default 10
        Neighbours kept per primary record (K ≥ 1).
    privacy : str, optional
        ``"bloom"`` (the default): identifiers reach the coordinator only as keyed Bloom
        filters (FedSim App. I). ``"off"``: RAW identifiers reach the coordinator.
    mode : {"soft", "top1", "exact"}, default "soft"
        Top-K soft links, only the best link (Top1Sim), or exact matches only.
    tau : float, optional
        Target success rate of the greedy attack (Theorem 2); the noise σ follows from it.
    sigma : float, optional
        The noise scale σ of Eq. 2, given directly (at most one of ``tau`` and ``sigma``).
    delta : float, default 1e-5
        δ of the reported (ε, δ) (Theorem 1).
    seed : int, optional
        Seed of the coordinator's noise and, when ``$VFLINK_SECRET`` is unset, of the Bloom
        filters' secret (then not a secret; the summary says so).
    search : {"auto", "exact", "approximate"}, default "auto"
        Top-K search; an approximate search measures and reports its recall.
    empty : {"error", "skip"}, default "error"
        Records with an empty identifier: stop naming the table, column and row, or leave
        them unlinked and count them in ``summary["skipped_rows"]``.
    id, secondary_id : str, optional
        Record-id columns copied into the links as ``primary_id`` / ``secondary_id``.
    fields : list of FieldSpec or mapping, optional
        Several fields, each with its own metric and weight (instead of ``on``/``metric``);
        mappings take the keys of ``[[link.fields]]``.
    blocking : list of Blocking, mapping or str, optional
        Blocking keys of a multi-field link (a column name, or ``{"on": ..., "prefix": 2}``).
    bloom_filters : BloomConfig or mapping, optional
        Bloom-filter parameters (``[link.bloom_filters]``).
    geo : GeoBloomConfig or mapping, optional
        Geographic Bloom-filter parameters (``[link.geo]``).
    resolution : float, optional
        Numeric Bloom filters: the distance that changes about one bit per dimension.
    delimiter, encoding, decimal, secondary_delimiter, secondary_encoding : str, optional
        How to read CSV paths (detected delimiter, UTF-8 and ``.`` by default).
    out : str or path, optional
        Also write the links (``.csv`` or ``.parquet``), ``<out>.summary.json`` and the
        sorted-similarity curve ``<out>.similarity.png``, as ``vflink link --out`` does.
    overwrite : bool, default False
        Replace existing output files instead of stopping.
    compute : Compute, optional
        An engine for the chunked stages (``vflink.engine``; see docs/how-to/scale-out.md):
        the search, the encodings. None runs them in this process, as before.
    parts : bool, optional
        Write a ``.parquet`` ``out`` as a partitioned dataset (a directory of Parquet parts,
        ``vflink.data.parts``); default: only above 10^7 links.
    stream : bool, optional
        Stream the link (``vflink.runner.link_stream``): the tables read in batches of the
        engine's ``chunk_rows``, encoded batch by batch, searched as primary chunks ×
        secondary partitions and the links written chunk by chunk to ``out``, so memory stays
        flat in the tables' size; the same file byte for byte. Default: when either table
        file has more than ``STREAM_ROWS`` (10^6) rows and the link can be streamed (one
        field, ``mode`` soft or top1, ``empty="error"``, no ids, not ``search="approximate"``,
        tables given as paths, ``out`` given). A streamed result holds no links in memory:
        ``.frame`` reads them back from ``out``.
    chunk_rows : int, optional
        Rows per chunk of a streamed link (default: ``compute.chunk_rows``, else 100,000):
        each process holds about one chunk and one secondary partition of this many rows.
    model : {"fellegi-sunter"}, optional
        Decide the links with a Fellegi–Sunter model that the coordinator trains without
        labels on the encodings (``vflink.linkage.model_link``): fields then need neither
        ``metric`` nor ``weight``; the links gain ``match_weight``, ``match_probability`` and
        ``match``, the summary the m/u table and the estimated precision, recall and F1.
    threshold : float, default 0.5
        A model link's match probability at and above which a link is a match.
    one_to_one : bool or {"optimal", "greedy"}, default False
        A model link's matches one-to-one (each record of either table matched at most
        once): ``True`` or ``"optimal"`` maximises the total match weight, ``"greedy"`` takes
        links by decreasing weight.
    view : {"operator", "primary"}, default "operator"
        Which columns the links hold: the operator's view (an operator who holds both tables
        and runs every party: also the coordinator's exact ``distance`` and
        ``match_weight``), or only what the primary receives in a deployment.

    Returns
    -------
    Links
        ``.frame`` (one row per link), ``.summary`` and ``.outcome``.

    Raises
    ------
    ConfigError
        An argument of the wrong kind or value, every problem named at once.
    DataError
        A table lacks a column, or an identifier is empty or not a number (the message names
        the table, the column and the row).

    Examples
    --------
    >>> import vflink
    >>> links = vflink.link("hospital.csv", "insurer.csv", on=["lat", "lon"],
    ...                     metric="haversine", top_k=5, seed=0)   # doctest: +SKIP
    >>> links.frame.head()                                           # doctest: +SKIP
    """
    from vflink.linkage import BloomConfig, GeoBloomConfig, SearchOptions
    from vflink.linkage.fields import Blocking, FieldSpec
    from vflink.runner.field_link import run_field_linkage
    from vflink.runner.link import LINK_COLUMNS_MODEL, linkage_columns, run_linkage

    found: list[str] = []  # every problem of the arguments, reported together

    def collect(build: Any, *args: Any) -> Any:
        try:
            return build(*args)
        except ConfigError as exc:
            found.extend(exc.problems or [str(exc)])
            return None

    on_cols = collect(columns_arg, "on", on)
    on_failed = on is not None and on_cols is None  # named already: not "required" too
    secondary_cols = collect(columns_arg, "secondary_on", secondary_on) or on_cols
    field_specs = collect(_specs, FieldSpec, fields, "fields") or []
    if model is not None:
        check_choice(found, "model", model, ("fellegi-sunter",))
    check_probability(found, "threshold", threshold)
    before = len(found)
    check_one_to_one(found, "one_to_one", one_to_one)
    if len(found) == before and one_to_one and model is None:
        found.append("`one_to_one` decides among a model's matches: give "
                     "model=\"fellegi-sunter\"")
    check_choice(found, "view", view, ("operator", "primary"))
    if model is not None and not field_specs and on_cols is not None:
        # one identifier: a one-field model link (the metric, if any, picks the comparison)
        field_specs = [FieldSpec(on=on_cols, secondary_on=secondary_cols or (),
                                 metric=None if metric in (None, "hamming") else metric)]
        on_cols, metric = None, None
    blocks = collect(_specs, Blocking, blocking, "blocking") or []
    if blocks and not field_specs:
        found.append("`blocking` needs `fields` (blocking keys restrict a multi-field link)")
    _check(metric=metric, top_k=top_k, privacy=privacy, mode=mode, tau=tau, sigma=sigma,
           delta=delta, seed=seed, search=search, empty=empty, resolution=resolution,
           has_on=on_cols is not None or on_failed, has_fields=bool(field_specs),
           problems=found)
    bloom_cfg = _config(BloomConfig, bloom_filters, "bloom_filters")
    if resolution is not None:
        bloom_cfg = (BloomConfig(resolution=resolution) if bloom_cfg is None
                     else dataclasses.replace(bloom_cfg, resolution=resolution))
    geo_cfg = _config(GeoBloomConfig, geo, "geo")
    target = None
    if out is not None:
        target = Path(out)
        if target.suffix.lower() not in (".csv", ".parquet"):
            raise ConfigError(f"`out` must end in .csv or .parquet, got {str(out)!r}")
        if not overwrite:
            for path in link_outputs(target):
                if path.exists():
                    raise ConfigError(f"{path}: output already exists; choose another `out` "
                                      "or pass overwrite=True to replace it")
    _warn_column_order(on_cols, secondary_cols, field_specs, blocks)
    phases: dict[str, float] = {}
    streamed = _streamed(stream, primary, secondary, out=target, compute=compute,
                         mode=mode, empty=empty, ids=bool(id or secondary_id),
                         fields=bool(field_specs), search=search)
    if streamed and target is not None:
        return _link_streamed(primary, secondary, target, on=on_cols or (),
                              secondary_on=secondary_cols, metric=str(metric), top_k=int(top_k),
                              privacy=privacy, mode=mode, tau=tau, sigma=sigma, delta=delta,
                              seed=seed, search=search, bloom_cfg=bloom_cfg, geo_cfg=geo_cfg,
                              read=({"delimiter": delimiter, "encoding": encoding,
                                     "decimal": decimal},
                                    {"delimiter": secondary_delimiter or delimiter,
                                     "encoding": secondary_encoding or encoding,
                                     "decimal": decimal}),
                              compute=compute, parts=parts, chunk_rows=chunk_rows)
    clock = time.perf_counter()
    # String identifiers and record ids are read as text: "19151111" stays a string and the
    # country code "NA" is not read as missing.
    as_text = metric == "levenshtein"
    p_text = [*(on_cols or () if as_text else ()),
              *(c for f in field_specs if f.kind == "string" for c in f.on),
              *(c for b in blocks for c in b.columns), *((id,) if id else ())]
    s_id = secondary_id or id
    s_text = [*(secondary_cols or () if as_text else ()),
              *(c for f in field_specs if f.kind == "string" for c in f.columns_s),
              *(c for b in blocks for c in b.columns_s), *((s_id,) if s_id else ())]
    p_frame, p_source = read_table(primary, argument="primary", text_columns=p_text,
                                   delimiter=delimiter, encoding=encoding, decimal=decimal)
    s_frame, s_source = read_table(secondary, argument="secondary", text_columns=s_text,
                                   delimiter=secondary_delimiter or delimiter,
                                   encoding=secondary_encoding or encoding, decimal=decimal)
    ids = (_ids(p_frame, id, p_source, True),
           _ids(s_frame, s_id, s_source, secondary_id is not None))
    phases["read"] = time.perf_counter() - clock
    common: dict[str, Any] = dict(
        top_k=int(top_k), privacy=privacy, mode=mode, tau=tau, sigma=sigma, delta=delta,
        seed=seed, primary_source=p_source, secondary_source=s_source, geo_config=geo_cfg,
        bloom_config=bloom_cfg)
    if field_specs:
        outcome = run_field_linkage(
            p_frame, s_frame, fields=field_specs, blocking=blocks, model=model,
            threshold=threshold, one_to_one=("optimal" if one_to_one is True
                                             else one_to_one or None), **common)
    else:
        outcome = run_linkage(p_frame, s_frame, on=on_cols or (), secondary_on=secondary_cols,
                              metric=str(metric),
                              search=SearchOptions(mode=search),  # type: ignore[arg-type]
                              empty=empty, compute=compute, **common)
    phases["link"] = outcome.seconds
    columns = linkage_columns(outcome.linkage, view=view)
    if ids[0] is not None:
        columns["primary_id"] = ids[0][columns["primary_index"]]
    if ids[1] is not None:
        columns["secondary_id"] = ids[1][columns["secondary_index"]]
    summary = outcome.summary()
    summary["view"] = view
    summary["columns"] = {c: LINK_COLUMNS_MODEL[c] for c in columns if c in LINK_COLUMNS_MODEL}
    if "primary_id" in columns or "secondary_id" in columns:
        summary["columns"].update({c: text for c, text in (
            ("primary_id", "primary: its own record id"),
            ("secondary_id", "operator only: the secondary's record id, read from its table"))
            if c in columns})
    if target is not None:
        _write(outcome, columns, target, phases, parts=parts, view=view)
    summary["phase_seconds"] = {k: round(v, 3) for k, v in phases.items()}
    if target is not None:
        from vflink._files import atomic_write_json

        atomic_write_json(link_outputs(target)[1], summary, indent=2, default=str)
    return Links(columns=columns, summary=summary, outcome=outcome, path=target)


def _warn_column_order(on: Sequence[str] | None, secondary_on: Sequence[str] | None,
                       fields: Sequence[Any], blocking: Sequence[Any]) -> None:
    """Warn when the two sides name the same columns in another order (``--on lon,lat
    --secondary-on lat,lon``): the link pairs columns by position and would compare longitude
    with latitude without a word."""
    import logging

    from vflink._checks import column_order_warning

    pairs = [(on or (), secondary_on or ())]
    pairs += [(f.on, f.columns_s) for f in fields]
    texts = [column_order_warning(a, b) for a, b in pairs]
    on_b = [b.on for b in blocking]
    texts.append(column_order_warning(on_b, [b.secondary_on or b.on for b in blocking],
                                      what="blocking"))
    for text in texts:
        if text is not None:
            logging.getLogger("vflink.api").warning("%s", text)


#: Above this many rows in either table file, ``link`` streams when it can (``stream=None``).
STREAM_ROWS = 1_000_000


def _streamed(stream: bool | None, primary: Any, secondary: Any, *, out: Path | None,
              compute: Compute | None, **options: Any) -> bool:
    """Whether to stream (see ``link``'s ``stream``): a refusal is an error only when asked."""
    import os

    from vflink.runner.link_stream import stream_refusal, stream_wanted

    if stream is False:
        return False
    paths = all(isinstance(t, (str, os.PathLike)) for t in (primary, secondary))
    reason = stream_refusal(tables=paths, **options) or (
        None if out is not None else "a streamed link needs `out` (its links go to a file)")
    if reason is not None:
        if stream:
            raise ConfigError(f"`stream`: {reason}")
        return False
    return stream_wanted(stream, Path(primary), Path(secondary), threshold=STREAM_ROWS)


def _link_streamed(primary: Any, secondary: Any, out: Path, *, search: str,
                   bloom_cfg: Any, geo_cfg: Any, compute: Compute | None,
                   parts: bool | None, chunk_rows: int | None, **options: Any) -> Links:
    """``link`` streamed (:func:`vflink.runner.link_stream.streamed_linkage`)."""
    from vflink._files import atomic_write_json
    from vflink.engine.base import DEFAULT_CHUNK_ROWS
    from vflink.linkage import SearchOptions
    from vflink.runner.link_stream import streamed_linkage

    outcome = streamed_linkage(
        Path(primary), Path(secondary), out=out, search=SearchOptions(mode=search),  # type: ignore[arg-type]
        bloom_config=bloom_cfg, geo_config=geo_cfg, compute=compute,
        chunk_rows=chunk_rows or (compute.chunk_rows if compute is not None
                                  else DEFAULT_CHUNK_ROWS),
        parts=parts, figure=link_outputs(out)[2], **options)
    summary = outcome.summary()
    summary["phase_seconds"] = {"link": round(outcome.seconds, 3)}
    atomic_write_json(link_outputs(out)[1], summary, indent=2, default=str)
    return Links(columns={}, summary=summary, outcome=outcome, path=out, streamed=True)


def link_outputs(out: Path) -> tuple[Path, Path, Path, Path]:
    """The links file, its summary, its similarity curve and a model link's charts."""
    return (out, out.with_name(out.name + ".summary.json"),
            out.with_name(out.name + ".similarity.png"), out.with_name(out.name + ".model.png"))


def _write(outcome: LinkOutcome, columns: dict[str, npt.NDArray[Any]], out: Path,
           phases: dict[str, float], *, parts: bool | None = None,
           view: str = "operator") -> None:
    """The links file, the sorted-similarity curve (FedSim Figure 4) and, for a model link,
    its charts (``<out>.model.png``), timed."""
    from vflink.linkage.improvement import plot_similarity_curve
    from vflink.runner.link import write_links

    clock = time.perf_counter()
    write_links(columns, out, parts=parts, view=view)
    phases["write"] = time.perf_counter() - clock
    clock = time.perf_counter()
    if outcome.linkage.mode == "soft" and outcome.linkage.k > 1:
        plot_similarity_curve(outcome.linkage, link_outputs(out)[2],
                              delta=outcome.improvement.get("avgsim"))
    if outcome.linkage.model:
        from vflink.reporting.plots import plot_link_model

        plot_link_model(outcome.linkage.model, link_outputs(out)[3])
    phases["figure"] = time.perf_counter() - clock
