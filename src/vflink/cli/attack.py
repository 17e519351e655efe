"""``vflink attack``: run an attack against a finished run; ``--list`` shows the attacks."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from vflink.errors import ConfigError

__all__ = ["ATTACK_LINES", "register", "run"]

#: ``vflink.runner.attack.attack_lines()`` spelt out: (name, attacker role, summary) of every
#: registered attack, so that ``--list`` answers at once instead of importing every attack's
#: libraries (torch, scikit-learn, scipy: 4 s on an idle 2-core machine, 25 s on a busy one).
#: tests/integration/test_cli_docs.py checks that it equals the registry.
ATTACK_LINES: tuple[tuple[str, str, str], ...] = (
    ("greedy-similarity", "primary", "the primary maps noised similarities back to distances "
     "and Bloom filters (FedSim §5.2), next to the Theorem 2 bound τ"),
    ("inversion-decoder", "primary", "model inversion: a decoder trained on auxiliary samples "
     "and queries of the secondary's bottom model (Ye et al. 2022; VFL-AFE §4.3, Figure 10)"),
    ("label-completion", "secondary", "a secondary recovers the primary's labels from a few "
     "known labels and its own trained bottom model (Fu et al., USENIX Security 2022)"),
    ("label-direction", "secondary", "a secondary recovers the primary's binary labels from "
     "the directions of the gradients it receives (Li et al., ICLR 2022)"),
    ("label-epoch-average", "secondary", "a secondary averages each record's gradient rows "
     "over every epoch on the class-mean direction: fresh noise averages out"),
    ("label-fcm", "secondary", "a secondary recovers the primary's labels by fuzzy c-means "
     "clustering of each batch's gradient rows (VFL-AFE's +D)"),
    ("label-kmeans", "secondary", "a secondary recovers the primary's labels by k-means "
     "clustering of each batch's gradient rows"),
    ("label-noise-subtraction", "secondary", "a secondary regenerates the primary's label "
     "noise from every seed it received (and small seeds tried), subtracts it and reads the "
     "labels (white-box)"),
    ("label-norm", "secondary", "a secondary recovers the primary's binary labels from the "
     "norms of the gradients it receives (Li et al., ICLR 2022)"),
    ("label-residual", "secondary", "a secondary reads the labels from each gradient row's "
     "part perpendicular to the class-mean direction"),
    ("label-spectral", "secondary", "a secondary recovers the primary's labels by spectral "
     "clustering of each batch's gradient rows"),
    ("membership-shadow", "primary", "membership inference with shadow models (Shokri et al. "
     "2017) on released embeddings (VFL-AFE §4.3, Table 1)"),
    ("spectral", "either", "tell synthetic rows from real ones by their spectral signature"),
)

HELP = """Measure what an honest-but-curious party could still learn from a finished run.

The attack reads what one party recorded of what it received (the run must have been made with
[evaluation] record = true), is scored against the run's evaluation-only ground truth, and its
result is appended to the run's privacy ledger (privacy.json). `--list` shows every attack.

A label attack's AUC is printed beside the most AUC the label protection's stated guarantee
allows (for (ε, δ)-label-DP the ROC ceiling (ε, δ) implies); the last line says whether the
protection holds within its stated limit against every label attack run so far (the white-box
ones, label-noise-subtraction, label-epoch-average and label-residual, included).
"""


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "attack", help="run a privacy attack against a finished run", description=HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", type=Path, default=None, help="run directory from `vflink train`")
    p.add_argument("--attack", default=None, help="attack name (see --list)")
    p.add_argument("--party", default=None,
                   help="the attacking party (default: the first party of the attack's role)")
    p.add_argument("--out", type=Path, default=None,
                   help="also write the result as JSON into this directory "
                        "(ATTACK-PARTY.json)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing ATTACK-PARTY.json in --out")
    p.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                   help="an attack parameter (VALUE parsed as JSON when possible); repeatable")
    p.add_argument("--truth", type=Path, default=None,
                   help="run directory holding the ground truth and the ledger, when --run is "
                        "one party's own state directory (runs across hosts)")
    p.add_argument("--list", action="store_true", help="list the attacks, one line each")
    p.add_argument("--config", type=Path, default=None,
                   help="accepted for symmetry; the run directory's own files are used")
    p.set_defaults(func=run)


def _params(items: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--param must be KEY=VALUE, got {item!r}")
        try:
            out[key] = json.loads(value)
        except ValueError:
            out[key] = value
        if isinstance(out[key], list):
            out[key] = tuple(out[key])
    return out


def run(args: argparse.Namespace) -> int:
    console = Console()
    if args.list:
        width = max(len(name) for name, _, _ in ATTACK_LINES)
        for name, role, summary in ATTACK_LINES:
            console.print(f"{name:<{width}} ({role}) {escape(summary)}", highlight=False,
                          soft_wrap=True)  # one line per attack, whatever the terminal width
        return 0
    if args.run is None or args.attack is None:
        raise ConfigError("give --run RUN_DIR and --attack NAME (or --list)")
    from vflink.runner.attack import run_attack  # heavy imports only when used

    result = run_attack(args.run, args.attack, party=args.party, params=_params(args.param),
                        out=args.out, truth_dir=args.truth, overwrite=args.overwrite)
    table = Table(title=f"{result.attack} by {result.party}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, value in result.metrics.items():
        table.add_row(key, f"{value:.6g}")
    protection = result.details.get("protection") or {}
    if "within_limit" in protection:  # the AUC beside what the stated guarantee allows
        limit = protection.get("limit")
        table.add_row("stated limit (AUC)", "none" if limit is None else f"{limit:.6g}")
        table.add_row("within it", {True: "yes", False: "NO"}.get(protection["within_limit"],
                                                                 "not judged"))
    console.print(table)
    console.print(escape(result.explanation), highlight=False)
    ledger_path = (args.truth or args.run) / "privacy.json"
    console.print(f"appended to {ledger_path}", highlight=False)
    from vflink.privacy.ledger import Ledger
    from vflink.reporting.ledger import label_verdict

    held = label_verdict(list(Ledger.read(ledger_path).attacks))
    if held is not None:  # every label attack run so far, against its stated limit
        console.print(escape(held), highlight=False)
    return 0
