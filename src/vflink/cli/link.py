"""``vflink link``: private fuzzy top-K soft linkage of two tables (FedSim §4.1)."""

from __future__ import annotations

import argparse
import gc
import re
from pathlib import Path
from typing import Any

from vflink._checks import check_bool, from_table
from vflink.cli._compute import add_compute_args, compute_from_args
from vflink.config import read_toml
from vflink.errors import ConfigError, LinkageError

__all__ = ["register", "run"]

#: ``vflink.runner.encoding.LINK_METRICS``, spelt out so that `--help` does not import the linkage
#: stack (tests/integration/test_cli_docs.py checks that they agree).
LINK_METRICS = ("euclidean", "haversine", "hamming", "levenshtein")
#: ``vflink.runner.encoding.PRIVACY``, spelt out for the same reason.
PRIVACY = ("bloom", "off")
#: ``vflink.linkage.privacy.DEFAULT_TAU``, spelt out for the same reason (a test checks).
DEFAULT_TAU = 0.05

HELP = """Link every record of PRIMARY to its K most similar records of SECONDARY through a
coordinator, as FedSim §4.1 does: each data party encodes its identifier columns and sends only
the encodings; the coordinator finds the top-K, normalises the similarities (Eq. 1) and adds
Gaussian noise (Eq. 2) whose scale σ follows from the target greedy-attack success rate τ
(Theorem 2); it reports the (ε, δ) of Theorem 1 and the improvement estimate Δ (§4.3).

Privacy is on by default: identifiers leave the data parties only as keyed Bloom filters
(FedSim App. I) and are compared by Hamming distance, under the secret in $VFLINK_SECRET (derived
from --seed, and then not a secret, when unset; random without a seed). Raw identifiers are sent
to the coordinator only with an explicit --privacy off. The summary names the encoding used.
With privacy on and neither --tau nor --sigma, the similarities get the noise of the default
greedy-attack bound tau = 0.05 (FedSim Theorem 2; measured to cost FedSim no accuracy, see
docs/how-to/linkage.md); --tau 1 (or --sigma 0) releases them without noise. The summary states the
similarities' protection (σ, τ, ε at δ) in words.

Output (by extension: .csv or .parquet): one row per (primary record, neighbour) with
primary_index, secondary_index (0-based row positions in the input files), rank (0 = most
similar), distance and similarity (after noise), and primary_id / secondary_id with --id.
Records with an empty identifier stop the link (the error names the file, column and row)
unless --empty skip: then they keep their position, get no link, and are counted.
Next to it: <out>.summary.json and, with --charts, the sorted-similarity curve of FedSim
Figure 4 (<out>.similarity.png), drawn while the links are written.

Decisions (--model fellegi-sunter, or [link] model = "fellegi-sunter"): the coordinator scores
every candidate pair (those of the [[link.blocking]] rules; a rule may combine columns, on =
["surname", "postcode"]) with a Fellegi-Sunter model it trains without labels on the encodings
(per field: exact agreement from keyed hashes, close levels from the Bloom filters' Dice
similarity, u from random pairs, m and the prior by EM, term-frequency adjusted), and decides:
match probability >= --threshold (0.5), then --one-to-one. Fields need no metric or weight.
The EM and the decisions follow the link's --cardinality (one-to-one, many-to-one: the
primary holds duplicates, one-to-many, many-to-many), estimated from the data unless given;
the summary says which and why, and how many records have several near-certain counterparts.
The links gain match_weight, match_probability and match; the summary the m/u table and the
estimated precision, recall and F1 (no labels needed) with the conditions they rest on,
checked on the data (fields that do not separate matches or look swapped, blocking rules that
find nothing and what the rules miss, a poor fit): a figure that cannot be backed is left out
and the reason given. With --charts, <out>.model.png the match-weight histogram, the threshold
chart and one pair's waterfall. --truth FILE (primary_index, secondary_index or primary_id,
secondary_id) adds the measured precision, recall and F1. A model link's match weights rarely
reach the private default tau = 0.05: the run then stops and says the tau it can give; pass
--tau or --sigma to accept it.
The links file is the operator's view (it holds the coordinator's exact distance and weights,
labelled so in the summary's "columns" and the Parquet metadata); --view primary writes only
what the primary receives in a deployment.
"""


def _columns(text: str | list[str] | None) -> tuple[str, ...] | None:
    if text is None:
        return None
    if isinstance(text, list):
        return tuple(text)
    return tuple(c.strip() for c in text.split(",") if c.strip())


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "link", help="private fuzzy top-K soft linkage of two tables", description=HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", type=Path, help="TOML file with a [link] table of these options "
                   "(command-line flags win)")
    p.add_argument("--primary", type=Path, help="primary table (CSV, TSV, .csv.gz, Parquet)")
    p.add_argument("--secondary", type=Path, help="secondary table")
    p.add_argument("--on", help="identifier column(s) of the primary, comma-separated "
                   "(e.g. lat,lon or title)")
    p.add_argument("--secondary-on", help="identifier column(s) of the secondary "
                   "(default: the same names as --on)")
    p.add_argument("--metric", choices=LINK_METRICS,
                   help="distance: euclidean, haversine (lat,lon degrees → km), levenshtein, "
                   "hamming (Bloom filters)")
    p.add_argument("--privacy", choices=PRIVACY, default=None,
                   help="bloom (default): keyed Bloom filters reach the coordinator; off: RAW "
                   "identifiers reach the coordinator")
    p.add_argument("--bloom", action="store_true", default=None,
                   help="same as --privacy bloom (the default)")
    p.add_argument("--top-k", type=int, help="K neighbours per primary record")
    p.add_argument("--mode", choices=("soft", "top1", "exact"), default=None,
                   help="soft (default: top-K), top1 (Top1Sim, K=1), exact (exact matches only)")
    noise = p.add_mutually_exclusive_group()
    noise.add_argument("--tau", type=float, help="target success rate τ of the greedy attack "
                       "(Theorem 2); σ is derived from it (default with --privacy bloom: "
                       f"{DEFAULT_TAU:g}; --tau 1 adds no noise)")
    noise.add_argument("--sigma", type=float, help="noise scale σ of Eq. 2, given directly")
    p.add_argument("--delta", type=float, default=None, help="δ for the reported ε (1e-5)")
    p.add_argument("--search", choices=("auto", "exact", "approximate"), default=None,
                   help="top-K search: auto (default: exact, but a binary IVF for Bloom-filter "
                   "searches too large to compare every pair), exact, or approximate (IVF / "
                   "string bounds); an approximate search measures and reports its recall")
    p.add_argument("--approximate", action="store_true", default=None,
                   help="same as --search approximate")
    p.add_argument("--resolution", type=float, default=None,
                   help="numeric Bloom filters (FEDERAL, FedSim App. I): the distance, in the "
                   "identifiers' unit, that changes about one bit per dimension; the filter "
                   "length follows from it and the agreed range (default: 512 bits per "
                   "dimension). Places on the globe (haversine): see [link.geo] resolution_km")
    p.add_argument("--seed", type=int, default=None,
                   help="seed of the coordinator's noise: reproducible, NOT private (default: "
                   "secret noise from the OS)")
    p.add_argument("--empty", choices=("error", "skip"), default=None,
                   help="records with an empty identifier: error (default: stop, naming the "
                   "file, column and row) or skip (no link for them; the count is reported)")
    p.add_argument("--id", help="record-id column of the primary, copied into the links as "
                   "primary_id (read as text)")
    p.add_argument("--secondary-id", help="record-id column of the secondary, copied into the "
                   "links as secondary_id (default: the --id column, when the secondary has it)")
    p.add_argument("--delimiter", help="CSV delimiter of the input tables (default: detected "
                   "among , ; tab |; write tab as '\\t')")
    p.add_argument("--encoding", help="text encoding of the input CSVs (default: utf-8; e.g. "
                   "latin-1, cp1252)")
    p.add_argument("--decimal", help="decimal mark of numbers in the input CSVs: . (default) "
                   "or , (for 1,5)")
    p.add_argument("--secondary-delimiter", help="the secondary's CSV delimiter, when it differs "
                   "(default: --delimiter)")
    p.add_argument("--secondary-encoding", help="the secondary's text encoding, when it differs "
                   "(default: --encoding)")
    p.add_argument("--out", type=Path, help="output table (.csv or .parquet)")
    p.add_argument("--parts", action="store_true", default=None,
                   help="write a .parquet output as a partitioned dataset: a directory of "
                   "Parquet parts, written part by part (default: only above 10^7 links)")
    p.add_argument("--stream", action=argparse.BooleanOptionalAction, default=None,
                   help="stream the link: tables read, encoded and searched in chunks of "
                   "[compute] chunk_rows, links written chunk by chunk, memory flat in the "
                   "tables' size, the same output byte for byte (default: when a table has "
                   "more than 10^6 rows and the link can be streamed; --no-stream: never)")
    p.add_argument("--model", choices=("fellegi-sunter",), default=None,
                   help="decide matches with a Fellegi-Sunter model trained without labels on "
                   "the encodings (fields then need no metric or weight)")
    p.add_argument("--threshold", type=float, default=None,
                   help="a model link's match probability for a match (default 0.5)")
    p.add_argument("--one-to-one", choices=("optimal", "greedy"), default=None,
                   help="a model link's matches one-to-one, a decision step after the "
                   "threshold: optimal (largest total weight) or greedy (by decreasing weight)")
    p.add_argument("--cardinality", default=None,
                   choices=("one-to-one", "many-to-one", "one-to-many", "many-to-many"),
                   help="a model link's cardinality: which records have at most one match "
                   "(many-to-one: many primary records to one secondary record, i.e. the "
                   "primary holds duplicates); the model's posterior and decisions follow it "
                   "(default: estimated from the data; the summary says which and why)")
    p.add_argument("--view", choices=("operator", "primary"), default=None,
                   help="operator (default): every column, the coordinator's exact distance "
                   "and weights included; primary: only what the primary receives")
    p.add_argument("--truth", type=Path, default=None,
                   help="true pairs (CSV/Parquet: primary_index, secondary_index or primary_id, "
                   "secondary_id) to measure precision, recall and F1 beside the estimate")
    p.add_argument("--charts", action="store_true", default=None,
                   help="draw the figures beside the links, while they are written: "
                   "<out>.similarity.png (FedSim Figure 4) and, for a model link, "
                   "<out>.model.png (default: none)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing output (and its .summary.json and figures)")
    p.usage = ("%(prog)s --primary P --secondary S --on COLS --metric M --top-k K --out F "
               "[options]\n       %(prog)s --config FILE [options]  (a [link] table of the same)")
    add_compute_args(p)
    for action in p._actions:  # required, but may come from --config, so argparse can't enforce
        if action.dest in _REQUIRED:
            action.help = f"{action.help} [required: here or in --config]"
    p.set_defaults(func=run)


_REQUIRED = ("primary", "secondary", "on", "metric", "top_k", "out")


_KEYS = ("primary", "secondary", "on", "secondary_on", "metric", "bloom", "top_k", "mode", "tau",
         "sigma", "delta", "approximate", "search", "seed", "out", "privacy", "empty", "id",
         "secondary_id", "fields", "blocking", "geo", "bloom_filters", "resolution", "delimiter",
         "encoding", "secondary_delimiter", "secondary_encoding", "decimal", "parts", "stream",
         "model", "threshold", "one_to_one", "cardinality", "view", "truth", "charts")


#: What a [link] key must be that only a file can get wrong (a path, a flag, a column list)
#: or that only the command reads (CSV options); every other value is checked by the link's
#: own settings (vflink.runner.link.settings), in the words of the Python API.
_TEXT = ("primary", "secondary", "out", "id", "secondary_id", "truth")
_FLAGS = ("bloom", "approximate", "parts", "stream", "charts")


def _check_value(key: str, value: Any, problems: list[str]) -> None:
    """One problem (if any) for a [link] value of the wrong kind."""
    from vflink.data.schema import check_decimal, check_delimiter, check_encoding

    if key in _TEXT and not isinstance(value, (str, Path)):
        problems.append(f"`{key}` must be a string, got {value!r}")
    elif key in _FLAGS:
        check_bool(problems, key, value)
    elif key in ("on", "secondary_on") and not (
            isinstance(value, str) or (isinstance(value, list) and value
                                       and all(isinstance(v, str) for v in value))):
        problems.append(f"`{key}` must be a column name, \"a,b\" or a list of names, "
                        f"got {value!r}")
    elif key in ("delimiter", "secondary_delimiter"):
        check_delimiter(problems, key, value)
    elif key in ("encoding", "secondary_encoding"):
        check_encoding(problems, key, value)
    elif key == "decimal":
        check_decimal(problems, key, value)


def resolve(args: argparse.Namespace) -> dict[str, Any]:
    """The link's options: the --config file's [link] table, then the flags on top. Every
    problem of the file and the flags is reported at once, in one :class:`ConfigError`."""
    opts: dict[str, Any] = {}
    problems: list[str] = []
    where = ""
    if args.config is not None:
        raw = read_toml(Path(args.config))
        table = raw.get("link", raw)
        where = f"{args.config}: "
        if not isinstance(table, dict):
            raise ConfigError(f"{args.config}: [link] must be a table, got {table!r}")
        unknown = sorted(set(table) - set(_KEYS) - {"version"})
        if unknown:
            import difflib

            guesses = [f"{c[0]!r} for {k!r}" for k in unknown
                       if (c := difflib.get_close_matches(k, _KEYS, n=1))]
            hint = f" (did you mean {', '.join(guesses)}?)" if guesses else ""
            problems.append(f"unknown key(s) {unknown}{hint}; known: {list(_KEYS)}")
        for key in sorted(set(table) & set(_KEYS)):
            _check_value(key, table[key], problems)
        base = Path(args.config).parent.resolve()  # messages then show the resolved path
        opts.update({k: v for k, v in table.items() if k in _KEYS})
        for key in ("primary", "secondary", "out", "truth"):
            if isinstance(opts.get(key), str) and not Path(opts[key]).is_absolute():
                opts[key] = base / opts[key]
    for key in _KEYS:
        value = getattr(args, key, None)
        if value is not None:
            opts[key] = value
            if key in ("delimiter", "secondary_delimiter", "encoding", "secondary_encoding",
                       "decimal"):
                _check_value(key, value, problems)  # not an argparse choice
    required = ("primary", "secondary", "top_k", "out") if opts.get("fields") else (
        ("primary", "secondary", "on", "top_k", "out") if opts.get("model") else
        ("primary", "secondary", "on", "metric", "top_k", "out"))
    problems.extend(f"--{k.replace('_', '-')} is required" for k in required
                    if opts.get(k) is None)
    if opts.get("fields"):
        _fields(opts, problems)
    privacy, bloom = opts.get("privacy"), opts.get("bloom")
    if privacy in PRIVACY and bloom is not None and (privacy == "bloom") != bool(bloom):
        problems.append(f"--bloom contradicts --privacy {privacy}; give one of them")
    out = opts.get("out")
    if isinstance(out, (str, Path)) and Path(out).suffix.lower() not in (".csv", ".parquet"):
        problems.append(f"--out must end in .csv or .parquet, got {str(out)!r}")
    for name, build in (("geo", lambda: _geo(opts.get("geo"))),
                        ("bloom_filters", lambda: _bloom(opts.get("bloom_filters"),
                                                         opts.get("resolution")))):
        try:
            build()
        except ConfigError as exc:
            problems.extend(p if p.startswith(f"[link.{name}]") else f"[link.{name}]: {p}"
                            for p in exc.problems)
    if not any(p.startswith(("fields", "blocking", "`fields`", "`blocking`"))
               for p in problems):
        # every value the API checks, checked by the API's own settings: the same words
        from vflink.runner.link.settings import LinkSettings

        try:
            LinkSettings.from_options(**_api_options(opts, check=True))
        except ConfigError as exc:
            problems.extend(_placed(p, args) for p in exc.problems
                            if not p.startswith("`on` is required")
                            and not p.startswith("`metric` is required")
                            and p not in problems)
    if problems:
        if where and len(problems) > 1:
            listing = "\n  - ".join(problems)
            raise ConfigError(f"{where.rstrip(': ')} ({len(problems)} problems):\n  - {listing}",
                              [where + p for p in problems])
        raise ConfigError(where + "; ".join(problems), [where + p for p in problems])
    return opts


def _where(args: argparse.Namespace, key: str) -> str:
    """``--key`` when given on the command line, else ``file:line:column`` of ``key = ...`` in
    the --config file (the column of its value)."""
    if getattr(args, key, None) is not None or args.config is None:
        return f"--{key}"
    try:
        lines = Path(args.config).read_text(encoding="utf-8").splitlines()
    except OSError:
        return f"{args.config}: {key}"
    for number, line in enumerate(lines, start=1):
        match = re.match(rf"\s*{key}\s*=\s*", line)
        if match:
            return f"{args.config}:{number}:{match.end() + 1}: {key}"
    return f"{args.config}: {key}"


def _placed(problem: str, args: argparse.Namespace) -> str:
    """A settings problem about the noise with where its option was given (the flag, or the
    file's line and column) in place of its backquoted name."""
    if problem.startswith("`tau` and `sigma`:"):
        return f"{_where(args, 'tau')} and {_where(args, 'sigma')}:" + problem.split(":", 1)[1]
    for key in ("tau", "sigma", "delta"):
        if problem.startswith(f"`{key}`:"):
            return f"{_where(args, key)}:" + problem.split(":", 1)[1]
    return problem


def _api_options(opts: dict[str, Any], *, check: bool = False) -> dict[str, Any]:
    """The keyword arguments of :func:`vflink.link` from the resolved options (``check``:
    for the settings' checks only, before the tables and outputs are looked at)."""
    from vflink.runner.encoding import resolve_privacy

    fields, blocking = _fields(opts, []) if opts.get("fields") else ([], [])
    privacy = opts.get("privacy")
    if check:  # a contradiction with --bloom is the command's own problem, reported apart
        privacy = privacy if privacy in PRIVACY else None
    else:
        privacy = resolve_privacy(privacy, opts.get("bloom"))
    top_k = opts.get("top_k")
    return dict(
        on=_columns(opts.get("on")), secondary_on=_columns(opts.get("secondary_on")),
        metric=opts.get("metric"), top_k=10 if check and top_k is None else top_k,
        privacy=privacy, mode=opts.get("mode") or "soft", tau=opts.get("tau"),
        sigma=opts.get("sigma"),
        delta=1e-5 if opts.get("delta") is None else opts.get("delta"), seed=opts.get("seed"),
        search="approximate" if opts.get("approximate") else opts.get("search") or "auto",
        empty=opts.get("empty") or "error", id=opts.get("id"),
        secondary_id=opts.get("secondary_id"), fields=fields or None,
        blocking=blocking or None, delimiter=opts.get("delimiter"),
        encoding=opts.get("encoding"), decimal=opts.get("decimal"),
        secondary_delimiter=opts.get("secondary_delimiter"),
        secondary_encoding=opts.get("secondary_encoding"), parts=opts.get("parts"),
        stream=opts.get("stream"), model=opts.get("model"), threshold=opts.get("threshold"),
        one_to_one=opts.get("one_to_one") or False, cardinality=opts.get("cardinality"),
        view=opts.get("view") or "operator", charts=bool(opts.get("charts")))


def _file_compute(args: argparse.Namespace) -> Any:
    """The --config file's top-level [compute] table (where chunked stages run), if any."""
    if args.config is None:
        return None
    raw = read_toml(Path(args.config))
    if "compute" not in raw:
        return None
    from vflink.engine import ComputeConfig

    try:
        return ComputeConfig.from_dict(raw["compute"])
    except ConfigError as exc:
        raise ConfigError(f"{args.config}: {exc}", exc.problems) from None


def _fields(opts: dict[str, Any], problems: list[str]) -> tuple[list[Any], list[Any]]:
    """``[[link.fields]]`` and ``[[link.blocking]]`` of a link file, every problem collected."""
    from vflink.linkage.fields import Blocking, FieldSpec

    built: tuple[list[Any], list[Any]] = ([], [])
    for name, cls, out in (("fields", FieldSpec, built[0]), ("blocking", Blocking, built[1])):
        entries = opts.get(name) or []
        if not isinstance(entries, list):
            problems.append(f"`{name}` must be an array of tables ([[link.{name}]])")
            continue
        for i, entry in enumerate(entries):
            if cls is Blocking and isinstance(entry, str):  # blocking = ["postcode"]
                entry = {"on": entry}
            where = f"{name} #{i + 1}"
            try:  # unknown keys named with the known ones, every problem at once
                out.append(from_table(cls, entry, where))
            except ConfigError as exc:
                problems.extend(p if p.startswith(where) else f"{where}: {p}"
                                for p in exc.problems)
    if opts.get("on") or opts.get("metric"):
        problems.append("give either `fields` or --on/--metric, not both")
    return built


def _geo(table: Any) -> Any:
    """``[link.geo]``: parameters of the geographic Bloom filters (``GeoBloomConfig``)."""
    if table is None:
        return None
    from vflink.linkage import GeoBloomConfig

    return from_table(GeoBloomConfig, table, "[link.geo]")


def _bloom(table: Any, resolution: float | None) -> Any:
    """``[link.bloom_filters]`` (``BloomConfig``: n_centres, threshold, filter_bits, num_hashes,
    qgram, normalize, resolution) with ``--resolution`` on top."""
    if table is None and resolution is None:
        return None
    from vflink.linkage import BloomConfig

    if table is not None and not isinstance(table, dict):
        raise ConfigError(f"[link.bloom_filters] must be a table, got {table!r}")
    params = dict(table or {})
    if resolution is not None:
        params["resolution"] = resolution
    return from_table(BloomConfig, params, "[link.bloom_filters]")


def run(args: argparse.Namespace) -> int:
    # The cyclic garbage collector, run by allocation counts, walked every module object the
    # link's imports create, again and again: a tenth of the command's start. A link makes no
    # reference cycles worth collecting before it ends, so the collector waits until then.
    gc.disable()
    from vflink.cli._heap import keep_batch_blocks

    keep_batch_blocks()  # the search's batches reuse their pages (see cli/_heap.py)
    try:
        return _run(args)
    finally:
        # Turned back on, the collector would walk every object the link's imports made at
        # the next allocation (0.05 s at FedSim's house scale, measured between the summary
        # and the exit): where the process ends right after (vflink's own entry point), it
        # stays off; a caller that lives on (main() in-process) gets it back.
        if not getattr(args, "exit_after", False):
            gc.enable()


def _run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from vflink.api import link
    from vflink.runner.link.charts import link_outputs

    opts = resolve(args)
    if not opts.get("charts"):  # charts load matplotlib in a thread of their own
        from vflink.cli._imports import defer_numpy_extras

        defer_numpy_extras()
    from vflink.cli._outputs import refuse_existing
    from vflink.runner.compute import open_compute

    out = Path(opts["out"])
    refuse_existing(*link_outputs(out), overwrite=args.overwrite)
    console = Console()
    metric = opts.get("metric") or "fields"
    with console.status(f"linking {opts['primary']} with {opts['secondary']} "
                        f"({metric}, K = {opts['top_k']})"), \
            open_compute(config := compute_from_args(args, _file_compute(args))) as compute:
        try:
            links = link(
                Path(opts["primary"]), Path(opts["secondary"]), **_api_options(opts),
                bloom_filters=_bloom(opts.get("bloom_filters"), opts.get("resolution")),
                geo=_geo(opts.get("geo")), out=out, overwrite=True, compute=compute,
                chunk_rows=config.chunk_rows,
                # the command's product is the file, which holds the similarities: the
                # primary's in-memory alignment needs no float32 copy of them
                alignment_similarities=False)
        except LinkageError as exc:
            if "unreachable" not in str(exc) or opts.get("tau") is None:
                raise
            # name where the τ was given (the option or the file's line), as for other options
            raise LinkageError(f"{_where(args, 'tau')}: {exc}") from None
    outcome = links.outcome
    n_links = len(links)
    sizes = outcome.sizes
    table = Table(title=f"vflink link → {out}", show_header=False)
    lk = outcome.linkage
    rows: list[tuple[str, str]] = [
        ("sizes", f"{sizes['primary_rows']} primary × {sizes['secondary_rows']} secondary, "
                  f"K = {lk.k}, "
                  f"{n_links} links"),
        ("time", f"{outcome.seconds:.2f} s; by stage: " + ", ".join(
            f"{stage} {seconds:.2f}" for stage, seconds in
            links.summary.get("stage_seconds", {}).items() if seconds >= 0.005)),
        ("metric", f"{metric} (search: {outcome.search_metric}); privacy: "
                   f"{'Bloom filters' if outcome.privacy == 'bloom' else 'OFF (raw identifiers)'}"),
        ("μ0, σ0 (Eq. 1)", f"{lk.mu0:.6g}, {lk.sigma0:.6g}"),
        ("σ (Eq. 2)", f"{lk.sigma:.6g}"),
        ("τ (Theorem 2)", f"{lk.tau:.6g}"),
        ("ε at δ (Theorem 1)", f"{lk.epsilon:.6g} at δ = {lk.delta:g}"
                               + ("" if lk.epsilon_valid else " (δ outside Theorem 1's range)")),
        ("protection", outcome.protection()
         + (f"; Theorem 2 on the distance step {lk.resolution:.3g} (one Bloom-filter bit)"
            if lk.resolution != 1.0 else "")),
    ]
    skipped = outcome.skipped_rows
    if skipped["primary"] or skipped["secondary"]:
        rows.append(("skipped (empty identifier)",
                     f"{skipped['primary']} primary, {skipped['secondary']} secondary row(s); "
                     "they have no link"))
    if lk.recall is not None:
        rows.append(("recall@K", f"{lk.recall:.4f} (approximate search)"))
    for baseline, delta in outcome.improvement.items():
        rows.append((f"Δ vs {baseline} (§4.3)", f"{delta:.4f}"))
    model = lk.model
    if model:
        est = model["estimated"]
        rows.append(("model", f"Fellegi-Sunter on {model['candidate_pairs']} candidate pairs, "
                              f"λ = {model['lambda']:.4g}, EM {model['em_iterations']} "
                              f"iterations; {model['matches']} matches (p ≥ "
                              f"{model['threshold']:g}, one-to-one: {model['one_to_one']})"))
        card = model.get("cardinality", {})
        rows.append(("cardinality", f"{card.get('cardinality')} "
                                    f"({'given' if card.get('given') else card.get('why')})"))

        def shown(x: Any) -> str:
            return "not estimated" if x is None else f"{x:.4f}"

        rows.append(("estimated (no labels)",
                     f"precision {shown(est['precision'])}, recall {shown(est['recall'])}, F1 "
                     f"{shown(est['f1'])}; {est['expected_matches']:.1f} expected matches"
                     + ("" if est.get("trusted", True) else
                        "; " + "; ".join(est.get("reasons", [])))))
        for text in model.get("diagnostics", {}).get("warnings", []):
            rows.append(("warning", text))
        for rule in model.get("blocking_rules", []):
            rows.append((f"blocking {rule['rule']}", f"{rule['comparisons']} comparisons, "
                                                     f"{rule['new_pairs']} new pairs"))
    if opts.get("truth") is not None:
        from vflink._files import atomic_write_json

        quality = links.evaluate(Path(opts["truth"]))
        m = quality["measured"]
        rows.append(("measured (--truth)", f"precision {m['precision']:.4f}, recall "
                                           f"{m['recall']:.4f}, F1 {m['f1']:.4f}"))
        summary = dict(links.summary)
        summary["quality"] = quality
        atomic_write_json(link_outputs(out)[1], summary, indent=2, default=str)
        if model and opts.get("charts"):
            from vflink.reporting.plots import plot_link_model

            plot_link_model(model, link_outputs(out)[3], measured=quality)
    for name, text in rows:
        table.add_row(name, text)
    console.print(table)
    if model:
        mu = Table(title="m/u table (Fellegi-Sunter, learned without labels)")
        for col in ("field", "level", "m", "u", "weight (bits)"):
            mu.add_column(col)
        for r in model["m_u"]:
            mu.add_row(r["field"], r["level"], f"{r['m']:.4g}", f"{r['u']:.4g}",
                       f"{r['weight']:+.2f}")
        console.print(mu)
    return 0
