"""A link's settings: what ``vflink.link``, ``vflink link`` and a ``[link]`` table give, checked
once, every problem at once, before any stage runs.

:meth:`LinkSettings.from_options` takes the Python API's arguments (the command line and the
run file reach it through :func:`vflink.api.link`, so all three build the same settings) and
returns a frozen :class:`LinkSettings`, from which :func:`vflink.runner.link.pipeline.build`
chooses every stage. Nothing here reads a table or writes a file.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vflink._checks import (
    check_bool,
    check_choice,
    check_float,
    check_int,
    check_one_to_one,
    check_probability,
    column_order_warning,
    from_table,
)
from vflink.data.given import columns_arg
from vflink.errors import ConfigError
from vflink.linkage.encoding import BloomConfig, GeoBloomConfig
from vflink.linkage.fields import FIELD_METRICS, Blocking, FieldSpec
from vflink.linkage.privacy import DEFAULT_TAU
from vflink.runner.encoding import resolve_privacy

__all__ = ["CARDINALITIES", "METRICS", "MODES", "SEARCHES", "LinkSettings", "ReadOptions",
           "model_problems", "noise_problems"]

METRICS = ("euclidean", "haversine", "hamming", "levenshtein")
#: ``vflink.linkage.fellegi_sunter.CARDINALITIES`` ("many-to-one": many primary records to
#: one secondary record)
CARDINALITIES = ("one-to-one", "many-to-one", "one-to-many", "many-to-many")
MODES = ("soft", "top1", "exact")
SEARCHES = ("auto", "exact", "approximate")


@dataclass(frozen=True, kw_only=True)
class ReadOptions:
    """How one party's table file is read (CSV only; a Parquet file says it itself)."""

    delimiter: str | None = None
    encoding: str | None = None
    decimal: str | None = None

    def as_dict(self) -> dict[str, str | None]:
        return {"delimiter": self.delimiter, "encoding": self.encoding, "decimal": self.decimal}


@dataclass(frozen=True, kw_only=True)
class LinkSettings:
    """Every option of a link, normalised and checked (see :func:`vflink.api.link` for each).

    ``on``/``secondary_on``/``metric``: a link of one identifier (``secondary_on`` defaults to
    the same names); ``fields`` (and ``blocking``):
    a multi-field link, decided by ``model`` when one is named (``threshold``, ``one_to_one``:
    ``"optimal"``, ``"greedy"`` or None; ``cardinality``, None to estimate it from the
    data). ``privacy`` is resolved (``"bloom"`` unless
    ``"off"`` was asked for); ``tau``/``sigma`` are as given (the decide stage applies the
    private default). ``read``: the primary's and the secondary's read options.
    """

    on: tuple[str, ...] = ()
    secondary_on: tuple[str, ...] = ()
    metric: str | None = None
    top_k: int = 10
    privacy: str = "bloom"
    mode: str = "soft"
    tau: float | None = None
    sigma: float | None = None
    delta: float = 1e-5
    seed: int | None = None
    search: str = "auto"
    empty: str = "error"
    id: str | None = None
    secondary_id: str | None = None
    fields: tuple[FieldSpec, ...] = ()
    blocking: tuple[Blocking, ...] = ()
    bloom: BloomConfig | None = None
    geo: GeoBloomConfig | None = None
    read: tuple[ReadOptions, ReadOptions] = (ReadOptions(), ReadOptions())
    out: Path | None = None
    overwrite: bool = False
    parts: bool | None = None
    stream: bool | None = None
    chunk_rows: int | None = None
    model: str | None = None
    threshold: float = 0.5
    one_to_one: str | None = None
    #: a model link's cardinality (:data:`CARDINALITIES`); None: estimated from the data
    cardinality: str | None = None
    view: str = "operator"
    #: draw the figures beside the links file (FedSim Figure 4, a model link's charts)
    charts: bool = False
    #: the primary's alignment with its float32 similarities (False: indices only, for a
    #: caller that reads the similarities from the links)
    alignment_similarities: bool = True

    def __post_init__(self) -> None:
        if self.on and not self.secondary_on:  # the same names on both sides
            object.__setattr__(self, "secondary_on", self.on)
        problems = _value_problems(self)
        if problems:
            raise ConfigError("; ".join(problems), problems)

    @property
    def kind(self) -> str:
        """``"fields"`` (a multi-field link, with or without a model) or ``"identifier"``."""
        return "fields" if self.fields else "identifier"

    @classmethod
    def from_options(cls, **options: Any) -> LinkSettings:
        """The settings of :func:`vflink.api.link`'s keyword arguments (its names and
        defaults), every problem of them in one :class:`ConfigError`."""
        return _from_options(**options)


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
           has_on: bool, has_fields: bool, problems: list[str]) -> None:
    """The value problems of the arguments, appended to ``problems``."""
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
    noise_problems(problems, tau=tau, sigma=sigma, delta=delta)
    check_float(problems, "resolution", resolution, min=0.0, min_exclusive=True,
                allow_none=True)
    if seed is not None:
        check_int(problems, "seed", seed, min=0)


def noise_problems(problems: list[str], *, tau: Any, sigma: Any, delta: Any) -> None:
    """The similarity-noise options (FedSim Eq. 2, Theorem 2), each problem starting with the
    option's name in backquotes (the command line puts where it was given there) and saying
    how to fix it: τ is a success rate in (0, 1] (1: no noise), σ ≥ 0 (0: no noise)."""

    def number(v: Any) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)

    if tau is not None and not (number(tau) and 0 < tau <= 1):
        problems.append(f"`tau`: the greedy-attack bound τ must be a number in (0, 1], got "
                        f"{tau!r}; e.g. tau = {DEFAULT_TAU:g} (the private default), or tau = 1 "
                        "for no noise")
    if sigma is not None and not (number(sigma) and sigma >= 0):
        problems.append(f"`sigma`: the noise scale σ must be a number ≥ 0, got {sigma!r}; e.g. "
                        "sigma = 0.1, or sigma = 0 for no noise")
    if not (number(delta) and 0 < delta < 1):
        problems.append(f"`delta`: δ must be a number in (0, 1), got {delta!r}; e.g. "
                        "delta = 1e-5")
    if tau is not None and sigma is not None:
        problems.append("`tau` and `sigma`: give at most one of `tau` and `sigma` (tau sets σ "
                        "through FedSim Theorem 2)")


def _value_problems(s: LinkSettings) -> list[str]:
    """The problems of settings built directly (``from_options`` reports its own first)."""
    problems: list[str] = []
    _check(metric=s.metric, top_k=s.top_k, privacy=s.privacy, mode=s.mode, tau=s.tau,
           sigma=s.sigma, delta=s.delta, seed=s.seed, search=s.search, empty=s.empty,
           resolution=None, has_on=bool(s.on), has_fields=bool(s.fields), problems=problems)
    check_probability(problems, "threshold", s.threshold)
    if s.one_to_one is not None:
        check_choice(problems, "one_to_one", s.one_to_one, ("optimal", "greedy"))
    model_problems(problems, model=s.model, mode=s.mode, cardinality=s.cardinality,
                   one_to_one=s.one_to_one, threshold=None, on=s.on if s.model else ())
    check_choice(problems, "view", s.view, ("operator", "primary"))
    check_bool(problems, "charts", s.charts)
    check_bool(problems, "alignment_similarities", s.alignment_similarities)
    return problems


def model_problems(problems: list[str], *, model: Any, mode: Any, cardinality: Any,
                   one_to_one: Any, threshold: Any, on: Sequence[str] | None) -> None:
    """The problems of a model link's options, in one wording for the API, the command line
    and a ``[link]`` file: an unknown model or cardinality; a ``threshold``, ``one_to_one`` or
    ``cardinality`` without a model (each decides among a model's matches); exact mode with a
    model; one-to-one decisions against a cardinality that is not; several ``on`` columns
    made one field."""
    if model is not None:
        check_choice(problems, "model", model, ("fellegi-sunter",))
    if cardinality is not None and cardinality not in CARDINALITIES:
        problems.append(f"`cardinality` must be one of {', '.join(CARDINALITIES)} (or left out "
                        f"to estimate it from the data), got {cardinality!r}")
    if model is None:
        given = [f"`{name}`" for name, value in (("threshold", threshold),
                                                  ("one_to_one", one_to_one),
                                                  ("cardinality", cardinality))
                 if value not in (None, False)]
        if given:
            problems.append(f"{' and '.join(given)} decide(s) among a model's matches, and this "
                            "link has no model: give model = \"fellegi-sunter\" (--model "
                            "fellegi-sunter), or drop them (a link without a model keeps each "
                            "record's top-K by similarity and decides nothing)")
        return
    if mode == "exact":
        problems.append("mode = \"exact\" keeps only identical identifiers, with no similarity "
                        "left to weigh, and a model link decides matches itself from each "
                        "field's agreement: drop `mode` (the model's matches are its \"exact\" "
                        "links), or drop `model`")
    if one_to_one not in (None, False) and cardinality not in (None, "one-to-one"):
        problems.append(f"`one_to_one` keeps at most one match per record on both sides, which "
                        f"contradicts cardinality = {cardinality!r}: drop one of them")
    if on is not None and len(on) > 1:
        problems.append(f"`on` names {len(on)} columns ({', '.join(on)}), which a model link "
                        "would compare as ONE field (their values joined), so the model could "
                        "not weigh each column's agreement: give one field per column "
                        f"(fields = [{', '.join(f'{{on = {c!r}}}' for c in on)}] in the API, "
                        "[[link.fields]] tables in a [link] file)")


def _from_options(*, on: Any = None, secondary_on: Any = None, metric: str | None = None,
                  top_k: Any = 10, privacy: Any = None, mode: Any = "soft", tau: Any = None,
                  sigma: Any = None, delta: Any = 1e-5, seed: Any = None, search: Any = "auto",
                  empty: Any = "error", id: str | None = None, secondary_id: str | None = None,
                  fields: Any = None, blocking: Any = None, bloom_filters: Any = None,
                  geo: Any = None, resolution: Any = None, delimiter: str | None = None,
                  encoding: str | None = None, decimal: str | None = None,
                  secondary_delimiter: str | None = None,
                  secondary_encoding: str | None = None, out: Any = None,
                  overwrite: bool = False, parts: bool | None = None,
                  stream: bool | None = None, chunk_rows: int | None = None,
                  model: str | None = None, threshold: Any = None, one_to_one: Any = False,
                  cardinality: Any = None, view: Any = "operator",
                  charts: Any = False, alignment_similarities: Any = True) -> LinkSettings:
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
    if threshold is not None:
        check_probability(found, "threshold", threshold)
    before = len(found)
    check_one_to_one(found, "one_to_one", one_to_one)
    model_problems(found, model=model, mode=mode, cardinality=cardinality,
                   one_to_one=one_to_one if len(found) == before else None,
                   threshold=threshold,
                   on=on_cols if model is not None and not field_specs else None)
    check_choice(found, "view", view, ("operator", "primary"))
    check_bool(found, "charts", charts)
    check_bool(found, "alignment_similarities", alignment_similarities)
    if model is not None and not field_specs and on_cols is not None:
        # one identifier: a one-field model link (the metric, if any, picks the comparison)
        field_specs = [FieldSpec(on=on_cols, secondary_on=secondary_cols or (),
                                 metric=None if metric in (None, "hamming") else metric)]
        on_cols, secondary_cols, metric = None, None, None
    blocks = collect(_specs, Blocking, blocking, "blocking") or []
    if blocks and not field_specs:
        found.append("`blocking` needs `fields` (blocking keys restrict a multi-field link)")
    unset = [list(f.on) for f in field_specs if f.metric is None]
    if unset and model is None:
        found.append(f"field(s) {unset} need a `metric` (one of {', '.join(FIELD_METRICS)}), "
                     "unless model = \"fellegi-sunter\" chooses the comparison from the column")
    if on_cols is not None and secondary_cols is not None and len(on_cols) != len(
            secondary_cols):
        found.append(f"--on names {len(on_cols)} column(s) but --secondary-on names "
                     f"{len(secondary_cols)}; each primary identifier needs a counterpart")
    _check(metric=metric, top_k=top_k, privacy=privacy, mode=mode, tau=tau, sigma=sigma,
           delta=delta, seed=seed, search=search, empty=empty, resolution=resolution,
           has_on=on_cols is not None or on_failed, has_fields=bool(field_specs),
           problems=found)
    if found:
        raise ConfigError("; ".join(found), found)
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
    _warn_column_order(on_cols, secondary_cols, field_specs, blocks)
    return LinkSettings(
        on=on_cols or (), secondary_on=secondary_cols or (), metric=metric, top_k=int(top_k),
        privacy=resolve_privacy(privacy), mode=mode, tau=tau, sigma=sigma, delta=delta,
        seed=seed, search=search, empty=empty, id=id, secondary_id=secondary_id,
        fields=tuple(field_specs), blocking=tuple(blocks), bloom=bloom_cfg, geo=geo_cfg,
        read=(ReadOptions(delimiter=delimiter, encoding=encoding, decimal=decimal),
              ReadOptions(delimiter=secondary_delimiter or delimiter,
                          encoding=secondary_encoding or encoding, decimal=decimal)),
        out=target, overwrite=overwrite, parts=parts, stream=stream, chunk_rows=chunk_rows,
        model=model, threshold=0.5 if threshold is None else threshold,
        one_to_one="optimal" if one_to_one is True else one_to_one or None,
        cardinality=cardinality, view=view, charts=charts,
        alignment_similarities=alignment_similarities)


def _warn_column_order(on: Sequence[str] | None, secondary_on: Sequence[str] | None,
                       fields: Sequence[Any], blocking: Sequence[Any]) -> None:
    """Warn when the two sides name the same columns in another order (``--on lon,lat
    --secondary-on lat,lon``): the link pairs columns by position and would compare longitude
    with latitude without a word."""
    pairs = [(on or (), secondary_on or ())]
    pairs += [(f.on, f.columns_s) for f in fields]
    texts = [column_order_warning(a, b) for a, b in pairs]
    on_b = [b.on for b in blocking]
    texts.append(column_order_warning(on_b, [b.secondary_on or b.on for b in blocking],
                                      what="blocking"))
    for text in texts:
        if text is not None:
            logging.getLogger("vflink.api").warning("%s", text)
