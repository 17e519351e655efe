"""``vflink.link``: private fuzzy top-K soft linkage of two tables (FedSim §4.1), from Python.

A thin layer over the link pipeline (:func:`vflink.runner.link.pipeline.run_link`), which
``vflink link`` and its ``[link]`` files run through this function: the same tables and
options give the same links. Imports neither torch nor scikit-learn.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vflink.data.given import TableLike, read_table
from vflink.errors import DataError
from vflink.types import Compute

if TYPE_CHECKING:
    import numpy.typing as npt
    import pandas as pd

    from vflink.linkage import BloomConfig, GeoBloomConfig
    from vflink.linkage.fields import Blocking, FieldSpec
    from vflink.runner.link.outcome import LinkOutcome
    from vflink.types import Alignment

__all__ = ["Links", "link"]

@dataclass(frozen=True, eq=False)
class Links:
    """The result of :func:`link`: one row per (primary record, neighbour), and the figures.

    Attributes
    ----------
    summary : dict
        What ``vflink link`` writes to ``<out>.summary.json``: sizes, metric, privacy and
        encoding, Eq. 1's ``mu0``/``sigma0``, the noise ``sigma``, ``tau`` (Theorem 2),
        ``epsilon`` at ``delta`` (Theorem 1), the improvement estimates Δ (§4.3), bytes
        exchanged, skipped rows, each stage's registry entry (``stages``) and seconds
        (``stage_seconds``: read, encode, candidates, compare, model, decide, write, charts)
        and the coarser ``phase_seconds``.
    outcome : vflink.runner.link.outcome.LinkOutcome
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
        """The primary's :class:`~vflink.Alignment` (indices n × K and similarities; no
        similarities for a link run with ``alignment_similarities=False``)."""
        return self.outcome.alignment

    def __len__(self) -> int:
        if self.streamed:
            return int(self.summary["sizes"]["links"])
        rows = getattr(self.columns, "rows", None)  # LinkColumns: without making a column
        return int(rows) if rows is not None else len(self.columns["rank"])

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
        label-free precision, recall and F1 of the same decision; None where a condition it
        rests on fails, with ``reasons``). Refused (:class:`~vflink.errors.DataError`): a
        truth with no pair (recall would read 1.0), rows outside the linked tables (named),
        or its two columns swapped (most true pairs are links when read the other way).
        """
        from vflink.linkage.decisions import measure, pr_curve

        frame = self.frame
        rows, cols, by_ids = _truth_pairs(truth, frame)
        chosen = frame[frame["match"]] if "match" in frame else frame[frame["rank"] == 0]
        # pairs named by ids map an id without a link to a negative row (counted as missed)
        _check_truth(rows, cols, chosen, self.summary.get("sizes", {}), by_ids=by_ids)
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


    def clusters(self, threshold: float | None = None) -> pd.DataFrame:
        """A model link's clusters: the connected components of the links whose match
        probability is at least ``threshold`` (default: the link's), over both tables'
        records, as Splink's ``cluster_pairwise_predictions_at_threshold`` makes them; one
        row per record (``party``: primary or secondary, ``index``: its row, ``cluster``).
        A record in no such link is its own cluster. Meant for many-to-many links (the
        summary's ``model.cardinality``), where a cluster may hold several records of each
        table."""
        import numpy as np
        import pandas as pd

        from vflink.errors import ConfigError
        from vflink.linkage.decisions import pair_clusters

        frame = self.frame
        if "match_probability" not in frame:
            raise ConfigError("clusters need a model link's match probabilities: link with "
                              "model=\"fellegi-sunter\"")
        model = self.summary.get("model", {})
        sizes = self.summary["sizes"]
        ids_p, ids_s = pair_clusters(
            frame["primary_index"].to_numpy(np.int64), frame["secondary_index"].to_numpy(np.int64),
            frame["match_probability"].to_numpy(float), int(sizes["primary_rows"]),
            int(sizes["secondary_rows"]),
            threshold=model.get("threshold", 0.5) if threshold is None else threshold)
        return pd.DataFrame({
            "party": ["primary"] * len(ids_p) + ["secondary"] * len(ids_s),
            "index": np.concatenate([np.arange(len(ids_p)), np.arange(len(ids_s))]),
            "cluster": np.concatenate([ids_p, ids_s])})


def _check_truth(rows: Any, cols: Any, chosen: pd.DataFrame, sizes: Mapping[str, Any], *,
                 by_ids: bool = False) -> None:
    """Refuse true pairs that cannot be measured: none at all (recall would read 1.0), rows
    outside the tables (named), or columns that look swapped (the primary's rows given as
    the secondary's: every pair would count as missed)."""
    import numpy as np

    if len(rows) == 0:
        raise DataError("truth holds no pair: precision, recall and F1 against it mean "
                        "nothing (recall would read 1.0); give the true pairs")
    n_p, n_s = sizes.get("primary_rows"), sizes.get("secondary_rows")
    problems = []
    for name, values, n, side in (("primary_index", rows, n_p, "primary"),
                                  ("secondary_index", cols, n_s, "secondary")):
        if n is None:
            continue
        bad = np.flatnonzero((values >= n) | ((values < 0) & (not by_ids)))
        if bad.size:
            shown = ", ".join(f"row {int(i)} ({int(values[i])})" for i in bad[:5])
            problems.append(f"{name} is outside the {side} table's {n:,} rows at {shown}"
                            f"{' …' if bad.size > 5 else ''}; {bad.size} pair(s) in all")
    if problems:
        swapped = (n_p is not None and n_s is not None and (cols < n_p).all()
                   and (rows < n_s).all() and (cols >= 0).all() and (rows >= 0).all())
        hint = (" (the columns look swapped: every primary_index fits the secondary table and "
                "every secondary_index the primary)" if swapped else "")
        raise DataError("truth: " + "; ".join(problems) + hint + "; rows are 0-based "
                        "positions in the linked tables")
    from vflink.linkage.decisions import _pair_codes

    found = np.isin(_pair_codes(rows, cols),
                    _pair_codes(chosen["primary_index"], chosen["secondary_index"])).sum()
    crossed = np.isin(_pair_codes(cols, rows),
                      _pair_codes(chosen["primary_index"], chosen["secondary_index"])).sum()
    if crossed >= 0.5 * len(rows) and crossed > 5 * max(found, 1):
        raise DataError(f"truth's columns look swapped: {crossed:,} of its {len(rows):,} pairs "
                        f"are links when read as (secondary_index, primary_index), {found:,} "
                        f"as given; give primary rows in primary_index and secondary rows in "
                        f"secondary_index")


def _truth_pairs(truth: Any, links: pd.DataFrame) -> tuple[Any, Any, bool]:
    """(primary rows, secondary rows) of the true pairs (see :meth:`Links.evaluate`), and
    whether they were named by record ids."""
    import numpy as np
    import pandas as pd

    if isinstance(truth, (str, Path)):
        truth, _ = read_table(truth, argument="truth",
                              text_columns=("primary_id", "secondary_id"))
    if not isinstance(truth, pd.DataFrame):
        pairs = np.asarray(truth)
        if pairs.size == 0:
            pairs = pairs.reshape(0, 2)
        if pairs.ndim != 2 or pairs.shape[1] != 2:
            raise DataError(f"truth must be a table or (primary row, secondary row) pairs, "
                            f"got an array of shape {pairs.shape}")
        if pairs.size == 0:
            return np.zeros(0, np.int64), np.zeros(0, np.int64), False
        return pairs[:, 0].astype(np.int64), pairs[:, 1].astype(np.int64), False
    if {"primary_index", "secondary_index"} <= set(truth.columns):
        return (truth["primary_index"].to_numpy(dtype=np.int64),
                truth["secondary_index"].to_numpy(dtype=np.int64), False)
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
        return np.asarray(rows, dtype=np.int64), np.asarray(cols, dtype=np.int64), True
    raise DataError("truth needs columns primary_index and secondary_index, or primary_id and "
                    f"secondary_id; it has: {', '.join(map(str, truth.columns[:20]))}")


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
         model: str | None = None, threshold: float | None = None,
         one_to_one: bool | str = False, cardinality: str | None = None,
         view: str = "operator", charts: bool = False,
         alignment_similarities: bool = True) -> Links:
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
        Default with ``privacy="bloom"``: 0.05; a link whose similarities cannot reach it
        (τ_min ≥ 0.05: a model link's match weights, a few short fields) stops with an error
        that gives the τ it can reach, and runs with that ``tau`` (or a ``sigma``) given.
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
        Also write the links (``.csv`` or ``.parquet``) and ``<out>.summary.json``, as
        ``vflink link --out`` does.
    overwrite : bool, default False
        Replace existing output files instead of stopping.
    compute : Compute, optional
        An engine for the chunked stages (``vflink.engine``; see docs/how-to/scale-out.md):
        the search, the encodings. None runs them in this process, as before.
    parts : bool, optional
        Write a ``.parquet`` ``out`` as a partitioned dataset (a directory of Parquet parts,
        ``vflink.data.parts``); default: only above 10^7 links.
    stream : bool, optional
        Stream the link (the pipeline's streamed reader, :mod:`vflink.runner.link.pipeline`):
        the tables read in batches of the engine's ``chunk_rows``, encoded batch by batch,
        searched as primary chunks × secondary partitions and the links written chunk by
        chunk to ``out``, so memory stays flat in the tables' size; the same file byte for
        byte. Default: when either table
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
    threshold : float, optional
        A model link's match probability at and above which a link is a match (default 0.5;
        refused without a model, which it would not change).
    one_to_one : bool or {"optimal", "greedy"}, default False
        A model link's matches one-to-one (each record of either table matched at most
        once), a decision step after the threshold: ``True`` or ``"optimal"`` maximises the
        total match weight, ``"greedy"`` takes links by decreasing weight.
    cardinality : {"one-to-one", "many-to-one", "one-to-many", "many-to-many"}, optional
        A model link's cardinality: which records have at most one match ("many-to-one":
        many primary records to one secondary record, the primary holds duplicates). The
        model's posterior and its decisions follow it. Default: estimated from the data
        (records with several near-certain counterparts), and the summary says which was
        chosen and why (``summary["model"]["cardinality"]``); a many-to-many link's clusters
        are in ``summary["model"]["clusters"]`` and :meth:`Links.clusters`.
    view : {"operator", "primary"}, default "operator"
        Which columns the links hold: the operator's view (an operator who holds both tables
        and runs every party: also the coordinator's exact ``distance`` and
        ``match_weight``), or only what the primary receives in a deployment.
    charts : bool, default False
        Also draw the figures beside ``out``, while the links are written: the
        sorted-similarity curve of FedSim Figure 4 (``<out>.similarity.png``) and, for a
        model link, its charts (``<out>.model.png``). Off by default: matplotlib and the
        drawing would otherwise be on every link's path.
    alignment_similarities : bool, default True
        Whether the primary's alignment (:attr:`Links.alignment`, what FedSim's training
        takes) carries its float32 similarities. False: the primary asks the coordinator for
        the indices only (``Links.alignment.similarity`` is None) and the similarities are
        in the links alone (``.frame``, ``out``), which spares a float32 copy of every one of
        them (56 MB for the 14.1 M links of FedSim's house scale); ``vflink link`` does so.

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
    # the arguments but the tables and the engine, as LinkSettings.from_options names them
    options = {k: v for k, v in locals().items() if k not in ("primary", "secondary", "compute")}
    from vflink.runner.link import pipeline
    from vflink.runner.link.settings import LinkSettings

    settings = LinkSettings.from_options(**options)  # every problem of the arguments at once
    ctx = pipeline.run_link(settings, primary, secondary, compute=compute)
    if ctx.outcome is None:  # pragma: no cover - the pipeline's
        raise RuntimeError("the link produced no outcome")
    return Links(columns=ctx.columns, summary=ctx.summary, outcome=ctx.outcome,
                 path=settings.out, streamed=ctx.streamed)
