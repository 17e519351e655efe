"""``vflink privacy-budget --party-file party.toml``: a secondary's release counts, and their
reset by the party's own operator."""

from __future__ import annotations

import argparse
import getpass
import json
import os
from pathlib import Path
from typing import Any

__all__ = ["register", "run"]

HELP = """Show (or reset) how much of its privacy budget a party's data has spent.

A secondary that protects its embeddings (the [privacy] section of its party file) counts
every release of every record, per noise setting, in its own state directory
(`party.state_dir`/_privacy-budget/<data fingerprint>.json and its journal). The counts
belong to the data, not to a run: they survive new setups, sessions, runs against any primary
and restarts of `vflink serve`, and `privacy.budget` refuses any release that would take a
record past it, whatever a primary asks. Only this command resets them. A primary that
protects its labels ([privacy] labels = "dp" or "rr-prior" in the run file) counts each
label's releases the same way, in its party file's `party.state_dir` (default δ 1e-5).

Without options it prints, for the party's current data: records released, releases, and the
composed ε of each record (max and mean over released records, at δ of the party's [privacy]
section or `--delta`), computed with the same accountant as the run ledger.

--reset deletes the counts of the current data. The privacy already lost is NOT restored: a
reset only lets the party release its records again as if they had never been released. It
therefore needs --yes-i-understand, is logged as a WARNING (fingerprint, counts, operator,
time) and is appended to _privacy-budget/resets.jsonl. Stop `vflink serve` for this party
first: a running service keeps the counts in memory and writes them back at its next release.
"""


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "privacy-budget", help="show or reset a party's spent privacy budget (its own "
                               "release counts)",
        description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--party-file", "--config", dest="config", required=True, type=Path,
                   metavar="PARTY_TOML",
                   help="the party's own party file (a secondary's, as for vflink serve, or "
                        "the primary's)")
    p.add_argument("--delta", type=float, default=None,
                   help="δ at which to compose ε (default: the party's privacy.delta)")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.add_argument("--reset", action="store_true",
                   help="delete the release counts of the party's current data (needs "
                        "--yes-i-understand)")
    p.add_argument("--yes-i-understand", action="store_true",
                   help="confirm --reset: the privacy already spent is not restored")
    p.add_argument("--reason", default=None, help="why (kept in the reset log)")
    p.set_defaults(func=run)


def _operator() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no name for this uid
        user = f"uid {os.getuid()}"
    return f"{user}@{os.uname().nodename}"


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from vflink.data.fingerprint import frame_fingerprint
    from vflink.errors import ConfigError
    from vflink.privacy.budget import BUDGET_DIR, ReleaseBudget, budget_file, reset_budget
    from vflink.runfiles.party import load_party_config, party_table

    if args.yes_i_understand and not args.reset:
        raise ConfigError("--yes-i-understand only confirms --reset")
    if args.reset and not args.yes_i_understand:
        raise ConfigError(
            "--reset deletes the release counts of this party's data, so its records may be "
            "released again up to the whole budget; the privacy they already lost is not "
            "restored. Stop `vflink serve` for this party, then add --yes-i-understand to "
            "confirm (the reset is logged with your name)")
    config = load_party_config(args.config)
    if config.role not in ("secondary", "primary"):
        raise ConfigError(f"party file {args.config}: a secondary counts the releases of its "
                          "embeddings, a primary those of its labels ([privacy] labels); this "
                          f"party's role is {config.role!r}")
    if config.state_dir is None:
        raise ConfigError(f"party file {args.config}: `party.state_dir` is not set, so the "
                          "party keeps no release counts across runs")
    directory = config.state_dir / BUDGET_DIR
    table = party_table(config)
    fingerprint = frame_fingerprint(table.frame)
    console = Console()
    if args.reset:
        entry = reset_budget(directory, fingerprint, party=config.name, operator=_operator(),
                             reason=args.reason)
        if entry is None:
            console.print(f"party {config.name}: no release counts for its current data "
                          f"(fingerprint {fingerprint[:16]}…); nothing to reset",
                          highlight=False)
        else:
            console.print(f"party {config.name}: release counts of data {fingerprint[:16]}… "
                          f"reset ({entry['releases_total']} releases of "
                          f"{entry['records_released']} records forgotten); logged in "
                          f"{directory / 'resets.jsonl'}", highlight=False)
        return 0
    delta = args.delta
    if delta is None and config.role == "primary":  # its labels' δ comes with each run's file
        delta = 1e-5
    if delta is None:
        delta = config.privacy.delta if config.privacy is not None else 1e-2
    if not 0 < delta < 1:
        raise ConfigError(f"`--delta` must be in (0, 1), got {delta}")
    budget = ReleaseBudget.open(directory, fingerprint, len(table), party=config.name,
                                read_only=True)
    summary = budget.summary(delta)
    summary["file"] = str(budget_file(directory, fingerprint))
    summary["exists"] = Path(summary["file"]).exists()
    summary["budget"] = config.privacy.budget if config.privacy is not None else None
    others = sorted(p.stem for p in directory.glob("*.json") if p.stem != fingerprint) \
        if directory.is_dir() else []
    summary["other_fingerprints"] = others
    if args.json:
        console.print_json(json.dumps(summary))
        return 0
    console.print(f"party [bold]{config.name}[/], data fingerprint {fingerprint[:16]}…, "
                  f"{summary['records']} records", highlight=False)
    if not summary["exists"]:
        console.print("no releases recorded for this data", highlight=False)
    else:
        console.print(
            f"released: {summary['records_released']} records, {summary['releases_total']} "
            f"releases (at most {summary['max_releases']} of one record, "
            f"{summary['mean_releases']:.3g} on average)\n"
            f"composed ε at δ = {delta:g}: max {summary['epsilon_max']:.4g}, mean "
            f"{summary['epsilon_mean']:.4g} over released records"
            + (f"; budget ε = {summary['budget']:g}" if summary["budget"] is not None else ""),
            highlight=False)
        for s in summary["settings"]:
            mechanism = (f"randomized response over {s['buckets']} codes"
                         if s.get("buckets") else f"σ {s['sigma']:.4g}")
            console.print(f"  setting: mode {s['mode']}, ε {s['epsilon']} per release at "
                          f"δ {s['delta']}, {mechanism} ({s['calibration']})",
                          highlight=False)
    if others:
        console.print(f"counts of {len(others)} other data version(s) are kept in {directory}",
                      highlight=False)
    return 0
