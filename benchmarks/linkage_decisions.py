"""Linkage decisions side by side: vflink's private Fellegi–Sunter link against Splink.

Both tools link the same two tables on the same fields with the same blocking rules, without
labels, and decide: match probability ≥ 0.5 (then, for the one-to-one cases, the optimal
one-to-one of :func:`vflink.linkage.decisions.optimal_one_to_one`, applied to Splink's
probabilities too so that the decision rule is the same). One JSON object per (case, tool) on
stdout: precision, recall and F1 at p ≥ 0.5 and after one-to-one, vflink's own decision and
its label-free estimate (with the cardinality it chose and why, its warnings, and the reasons
when it withholds the estimate), and the seconds to train and predict.

Cases (FEBRL4 and FEBRL3 are shipped):
  febrl4      FEBRL4 (5,000 × 5,000, every record has its match), without soc_sec_id
  unmatched   FEBRL4 with a seeded half of the B file dropped (5,000 × 2,500: half of the A
              records have no counterpart)
  sparse      FEBRL4 with 80 % of A and 80 % of B dropped independently (1,000 × 1,000, about
              200 true pairs: most records on both sides are unmatched)
  many-to-one FEBRL3's 3,000 duplicates (primary) linked to its 2,000 originals (secondary):
              one to five duplicates per original, so a secondary record has several matches
  one-to-many the same the other way round (originals → duplicates)
  swapped     FEBRL4 with the B file's given_name and surname columns exchanged (its names
              are in the wrong columns), linked on the same field names
  dates       FEBRL4 with the B file's dates of birth written DD/MM/YYYY (A: YYYYMMDD)

vflink is run as a user who does not name the cardinality: ``one_to_one=True`` on the three
FEBRL4 cases (the one-to-one decision the docs report), the default (no one-to-one step) on
the others. The similarities get σ = 0.5 (Eq. 2) explicitly: the private default τ = 0.05
cannot be reached by a model link's match weights (the run would refuse and say so); each
line reports the τ this gives.

Fields (both tools): given_name, surname, street_number, address_1, address_2, suburb,
postcode, state, date_of_birth. Blocking rules (OR-ed; AND within a rule): 14 pairs of
columns (RULES below), keeping 6,008 candidate pairs of FEBRL4 with 99.5 % of its true pairs.

vflink: ``vflink.link(..., model="fellegi-sunter")`` in private mode (keyed Bloom filters, keyed
hashes and blocking digests reach the coordinator); fields given without metric or weight. Its
seconds are the whole link: encoding, key confirmation, candidate pairs, u from 10^6 random
pairs, EM (twice when a table shows duplicates), diagnostics, decisions, noise. Splink 4
(DuckDB): u by random sampling (10^6 pairs), λ from deterministic rules, m by EM on two blocking
sessions (names; date of birth), then predict; its seconds run from the linker's creation to
the predictions (its FEBRL comparisons: a date of birth that does not parse as %Y%m%d is null).
Splink is an optional benchmark dependency (``pip install -e '.[bench]'``); a case is skipped
for it, and says so, when it is not installed.

  files       any two CSV tables and their true pairs (--files PRIMARY SECONDARY TRUTH, the
              truth's columns primary_id, secondary_id matching --id), linked on --fields
              (comma-separated, the same names in both tables) with every pair a candidate
              (no blocking; at most 2·10^6 pairs). Splink compares every field with
              JaroWinklerAtThresholds (0.9, 0.7), estimates λ from exact agreement on the
              first field (recall 0.7), u by random sampling, m by EM blocked on the first
              field and then on the second. Measured on the Fodor's-Zagat restaurant guides
              (331 × 533, 112 true pairs; not shipped) in docs/how-to/linkage.md.

Usage: python benchmarks/linkage_decisions.py [--case NAME|all] [--tool vflink|splink|both]
           [--seed 0]
       python benchmarks/linkage_decisions.py --files A.csv B.csv TRUTH.csv --id id
           --fields name,addr,city,phone,type [--tool ...]
"""

from __future__ import annotations

import argparse
import json
import logging
import resource
import sys
import time
from typing import Any

import numpy as np
import pandas as pd

FIELDS = ("given_name", "surname", "street_number", "address_1", "address_2", "suburb",
          "postcode", "state", "date_of_birth")
RULES = (("given_name", "surname"), ("surname", "date_of_birth"),
         ("given_name", "date_of_birth"), ("postcode", "street_number"),
         ("suburb", "address_1"), ("postcode", "surname"), ("postcode", "given_name"),
         ("date_of_birth", "suburb"), ("address_1", "address_2"),
         ("street_number", "address_1"), ("surname", "suburb"), ("given_name", "suburb"),
         ("date_of_birth", "postcode"), ("date_of_birth", "address_1"))
CASES = ("febrl4", "unmatched", "sparse", "many-to-one", "one-to-many", "swapped", "dates")
#: The cases decided one-to-one (the others keep every match the cardinality allows).
ONE_TO_ONE_CASES = ("febrl4", "unmatched", "sparse")


def febrl3(reverse: bool) -> tuple[pd.DataFrame, pd.DataFrame, np.ndarray]:
    """FEBRL3's duplicates and originals (FIELDS only) and the true (row, row) pairs:
    duplicates → originals, or the reverse."""
    from vflink.datasets._base import read_shipped

    d = read_shipped("febrl3.csv.gz", dtype=str, keep_default_na=False)
    org = d["rec_id"].str.endswith("-org")
    entity = d["rec_id"].str.extract(r"rec-(\d+)-")[0].astype(int)
    originals, duplicates = d[org].reset_index(drop=True), d[~org].reset_index(drop=True)
    where = {e: i for i, e in enumerate(entity[org])}
    truth = np.array([(i, where[e]) for i, e in enumerate(entity[~org])], dtype=np.int64)
    if reverse:
        return originals[list(FIELDS)], duplicates[list(FIELDS)], truth[:, ::-1].copy()
    return duplicates[list(FIELDS)], originals[list(FIELDS)], truth


def tables(case: str, seed: int) -> tuple[pd.DataFrame, pd.DataFrame, np.ndarray]:
    """The two tables (FIELDS only, missing values as "") and the true (row A, row B) pairs."""
    from vflink.datasets._base import read_shipped

    if case in ("many-to-one", "one-to-many"):
        return febrl3(reverse=case == "one-to-many")
    a = read_shipped("febrl4a.csv.gz", dtype=str, keep_default_na=False)
    b = read_shipped("febrl4b.csv.gz", dtype=str, keep_default_na=False)
    rng = np.random.default_rng(seed)
    if case == "unmatched":
        b = b.iloc[np.sort(rng.choice(len(b), len(b) // 2, replace=False))]
    elif case == "sparse":
        a = a.iloc[np.sort(rng.choice(len(a), len(a) // 5, replace=False))]
        b = b.iloc[np.sort(rng.choice(len(b), len(b) // 5, replace=False))]
    elif case == "swapped":  # the B file's names in each other's columns
        b = b.rename(columns={"given_name": "surname", "surname": "given_name"})
    elif case == "dates":  # the B file's dates of birth written DD/MM/YYYY
        b = b.assign(date_of_birth=[f"{x[6:8]}/{x[4:6]}/{x[:4]}" if len(x) == 8 else x
                                    for x in b["date_of_birth"]])
    a, b = a.reset_index(drop=True), b.reset_index(drop=True)
    ea = a["rec_id"].str.extract(r"rec-(\d+)-org")[0].astype(int).to_numpy()
    eb = b["rec_id"].str.extract(r"rec-(\d+)-dup")[0].astype(int).to_numpy()
    where = {e: i for i, e in enumerate(ea)}
    truth = np.array([(where[e], j) for j, e in enumerate(eb) if e in where],
                     dtype=np.int64).reshape(-1, 2)
    return a[list(FIELDS)], b[list(FIELDS)], truth


def _scores(rows: np.ndarray, cols: np.ndarray, prob: np.ndarray, truth: np.ndarray
            ) -> dict[str, Any]:
    from vflink.linkage.decisions import decide, measure

    weights = np.log2(np.clip(prob, 1e-300, 1 - 1e-16) / np.clip(1 - prob, 1e-16, None))
    out: dict[str, Any] = {}
    for name, rule in (("threshold", None), ("one_to_one", "optimal")):
        chosen = decide(rows, cols, prob, weights, threshold=0.5, one_to_one=rule)
        m = measure(rows[chosen], cols[chosen], truth[:, 0], truth[:, 1])
        out[name] = {k: round(v, 4) for k, v in m.items()}
    return out


def file_tables(primary: str, secondary: str, truth_file: str, id_column: str,
                fields: tuple[str, ...]) -> tuple[pd.DataFrame, pd.DataFrame, np.ndarray]:
    """Two CSV tables (``fields`` only, missing values as "") and the true (row, row) pairs
    of the truth file (``primary_id``, ``secondary_id``, values of ``id_column``)."""
    a = pd.read_csv(primary, dtype=str, keep_default_na=False)
    b = pd.read_csv(secondary, dtype=str, keep_default_na=False)
    t = pd.read_csv(truth_file, dtype=str, keep_default_na=False)
    where_a = {v: i for i, v in enumerate(a[id_column])}
    where_b = {v: i for i, v in enumerate(b[id_column])}
    truth = np.array([(where_a[x], where_b[y]) for x, y in zip(t["primary_id"], t["secondary_id"])
                      if x in where_a and y in where_b], dtype=np.int64).reshape(-1, 2)
    return a[list(fields)], b[list(fields)], truth


def run_vflink(a: pd.DataFrame, b: pd.DataFrame, truth: np.ndarray, seed: int,
               fields: tuple[str, ...] = FIELDS,
               rules: tuple[tuple[str, ...], ...] | None = RULES,
               one_to_one: bool = True) -> dict[str, Any]:
    import vflink

    clock = time.perf_counter()
    # K = 6: an original of FEBRL3 has up to five duplicates, each a match to keep
    links = vflink.link(a, b, fields=[{"on": [c]} for c in fields],
                        blocking=[{"on": list(r)} for r in rules or ()],
                        model="fellegi-sunter", one_to_one=one_to_one, top_k=6, seed=seed,
                        sigma=0.5)
    seconds = time.perf_counter() - clock
    model = links.outcome.linkage.model
    frame = links.frame
    out = _scores(frame["primary_index"].to_numpy(), frame["secondary_index"].to_numpy(),
                  frame["match_probability"].to_numpy(), truth)
    chosen = frame[frame["match"]]
    from vflink.linkage.decisions import measure

    decided = measure(chosen["primary_index"].to_numpy(), chosen["secondary_index"].to_numpy(),
                      truth[:, 0], truth[:, 1])
    est = model["estimated"]
    return {"tool": "vflink", "seconds": round(seconds, 3), **out,
            "one_to_one": one_to_one,
            "decision": {k: round(v, 4) for k, v in decided.items()},
            "estimated": {k: round(v, 4) if isinstance(v, float) else v
                          for k, v in est.items()},
            "estimated_f1_error": (round(abs(est["f1"] - decided["f1"]), 4)
                                   if est["f1"] is not None else None),
            "cardinality": model["cardinality"]["cardinality"],
            "cardinality_why": model["cardinality"]["why"],
            "warnings": model["diagnostics"]["warnings"],
            "candidate_pairs": model["candidate_pairs"], "lambda": round(model["lambda"], 6),
            "privacy": links.summary["privacy"], "tau": round(links.summary["tau"], 4),
            "similarity_protection": links.summary["similarity_protection"]}


def _splink_files(a: pd.DataFrame, b: pd.DataFrame, fields: tuple[str, ...], seed: int
                  ) -> tuple[Any, Any]:
    """Splink's standard unsupervised recipe on any fields (module docstring, case files)."""
    import splink.comparison_library as cl
    from splink import SettingsCreator, block_on

    settings = SettingsCreator(
        link_type="link_only", unique_id_column_name="unique_id",
        comparisons=[cl.JaroWinklerAtThresholds(f) for f in fields],
        blocking_rules_to_generate_predictions=["1=1"],
        retain_intermediate_calculation_columns=False)

    def train(linker: Any) -> None:
        linker.training.estimate_probability_two_random_records_match(
            [block_on(fields[0])], recall=0.7)
        linker.training.estimate_u_using_random_sampling(max_pairs=1e6, seed=seed)
        for f in fields[:2]:
            linker.training.estimate_parameters_using_expectation_maximisation(block_on(f))
    return settings, train


def run_splink(a: pd.DataFrame, b: pd.DataFrame, truth: np.ndarray, seed: int,
               fields: tuple[str, ...] | None = None) -> dict[str, Any]:
    try:
        from splink import DuckDBAPI, Linker
    except ImportError:
        return {"tool": "splink", "skipped": "splink is not installed (pip install -e "
                                             "'.[bench]')"}
    logging.getLogger("splink").setLevel(logging.WARNING)

    def frame(t: pd.DataFrame, offset: int) -> pd.DataFrame:
        out = t.replace({"": None}).copy()
        out.insert(0, "unique_id", np.arange(len(t)) + offset)
        return out

    fa, fb = frame(a, 0), frame(b, 10**7)
    clock = time.perf_counter()
    try:
        if fields is not None:
            settings, train = _splink_files(a, b, fields, seed)
            linker = Linker([fa, fb], settings, db_api=DuckDBAPI())
            train(linker)
        else:
            linker = Linker([fa, fb], _febrl_settings(), db_api=DuckDBAPI())
            _febrl_train(linker, seed)
        pred = linker.inference.predict(threshold_match_probability=0.01).as_pandas_dataframe()
    except Exception as exc:  # a case Splink's recipe cannot run (reported, not hidden)
        return {"tool": "splink", "version": _version("splink"),
                "error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    seconds = time.perf_counter() - clock
    left = np.where(pred["unique_id_l"] < 10**7, pred["unique_id_l"], pred["unique_id_r"])
    right = np.where(pred["unique_id_l"] < 10**7, pred["unique_id_r"],
                     pred["unique_id_l"]) - 10**7
    out = _scores(left.astype(np.int64), right.astype(np.int64),
                  pred["match_probability"].to_numpy(dtype=float), truth)
    return {"tool": "splink", "version": _version("splink"), "seconds": round(seconds, 3),
            **out, "privacy": "off (plaintext)"}


def _febrl_settings() -> Any:
    import splink.comparison_library as cl
    from splink import SettingsCreator, block_on

    return SettingsCreator(
        link_type="link_only", unique_id_column_name="unique_id",
        comparisons=[
            cl.NameComparison("given_name").configure(term_frequency_adjustments=True),
            cl.NameComparison("surname").configure(term_frequency_adjustments=True),
            cl.ExactMatch("street_number").configure(term_frequency_adjustments=True),
            cl.LevenshteinAtThresholds("address_1", [1, 2]),
            cl.LevenshteinAtThresholds("address_2", [1, 2]),
            cl.LevenshteinAtThresholds("suburb", [1, 2]).configure(
                term_frequency_adjustments=True),
            cl.ExactMatch("postcode").configure(term_frequency_adjustments=True),
            cl.ExactMatch("state").configure(term_frequency_adjustments=True),
            cl.DateOfBirthComparison("date_of_birth", input_is_string=True,
                                     datetime_format="%Y%m%d"),
        ],
        blocking_rules_to_generate_predictions=[block_on(*r) for r in RULES],
        retain_intermediate_calculation_columns=False)


def _febrl_train(linker: Any, seed: int) -> None:
    from splink import block_on

    linker.training.estimate_probability_two_random_records_match(
        [block_on("given_name", "surname", "date_of_birth"),
         block_on("postcode", "street_number", "address_1")], recall=0.7)
    linker.training.estimate_u_using_random_sampling(max_pairs=1e6, seed=seed)
    linker.training.estimate_parameters_using_expectation_maximisation(
        block_on("given_name", "surname"))
    linker.training.estimate_parameters_using_expectation_maximisation(
        block_on("date_of_birth"))


def _version(name: str) -> str:
    from importlib.metadata import version

    return version(name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--case", choices=(*CASES, "all"), default="all")
    parser.add_argument("--tool", choices=("vflink", "splink", "both"), default="both")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--files", nargs=3, metavar=("PRIMARY", "SECONDARY", "TRUTH"),
                        help="case files: two CSV tables and their true pairs")
    parser.add_argument("--id", default="id", help="record-id column of --files tables")
    parser.add_argument("--fields", default="", help="--files: comma-separated fields")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    if args.files and not args.fields:
        parser.error("--files needs --fields")
    cases = ["files"] if args.files else CASES if args.case == "all" else [args.case]
    for case in cases:
        fields = tuple(f for f in args.fields.split(",") if f) if args.files else None
        if args.files:
            a, b, truth = file_tables(*args.files, args.id, fields or ())
        else:
            a, b, truth = tables(case, args.seed)
        sizes = {"case": case, "primary_rows": len(a), "secondary_rows": len(b),
                 "true_pairs": len(truth)}
        results = []
        if args.tool in ("splink", "both"):
            results.append(run_splink(a, b, truth, args.seed, fields))
        if args.tool in ("vflink", "both"):
            results.append(run_vflink(a, b, truth, args.seed, *(
                (fields, None) if fields else ()),
                one_to_one=case in (*ONE_TO_ONE_CASES, "files")))
        times = {r["tool"]: r.get("seconds") for r in results}
        for r in results:
            if r["tool"] == "vflink" and times.get("splink") and r.get("seconds"):
                r["seconds_ratio_vs_splink"] = round(r["seconds"] / times["splink"], 3)
            print(json.dumps({**sizes, **r,
                              "peak_rss_gib": round(resource.getrusage(
                                  resource.RUSAGE_SELF).ru_maxrss / 2**20, 3)}))
            sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
