"""``vflink audit --config run.toml``: an empirical audit of the label protection's ε."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

__all__ = ["register", "run"]

HELP = """Audit the primary's label protection empirically: one training run with canaries.

`--canaries` records of the primary get a label drawn by a fair coin (from the operating
system's randomness unless --canary-seed is given); the run trains once with every party
recording what it received; the first secondary (or --party) then scores each canary from its
own recording, and the auditor guesses the canaries it is most sure of (Steinke, Nasr &
Jagielski, NeurIPS 2023: one run, many canaries). It prints the empirical ε lower bound at
--confidence, with the Clopper-Pearson interval of the guesses' accuracy, beside the ε the
run's ledger claims: a lower bound above the claim proves the claim false.

The attacker is black-box by default (label-epoch-average: each record's gradient rows over
every epoch); --white-box makes it the party that read the code (label-noise-subtraction: the
primary's label noise regenerated from every seed the secondary received, small seeds tried).
The task must be binary and aligned by the exact key. The run directory (--out) keeps the run,
audit.json and the audit in its privacy ledger.
"""


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "audit", help="empirical ε lower bound of the label protection (canaries, one run)",
        description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, type=Path,
                   help="TOML run file (a binary task, alignment.method = \"exact\")")
    p.add_argument("--out", type=Path, default=None,
                   help="run directory to create (default: runs/<config name>-audit)")
    p.add_argument("--canaries", type=int, default=1000,
                   help="records whose labels are fair coin flips (default 1000; at most half "
                        "the primary's records)")
    p.add_argument("--white-box", action="store_true",
                   help="the attacker regenerates the label noise from the seeds it received "
                        "(label-noise-subtraction) instead of averaging over epochs")
    p.add_argument("--brute-force", type=int, default=None, metavar="N",
                   help="with --white-box: also try every labels_seed and run seed below N "
                        "(default 100000)")
    p.add_argument("--confidence", type=float, default=0.95,
                   help="confidence of the lower bound and of the interval (default 0.95)")
    p.add_argument("--canary-seed", type=int, default=None,
                   help="draw the canaries from this seed (reproducible audits); default: the "
                        "operating system's randomness")
    p.add_argument("--party", default=None, help="the attacking secondary (default: the first)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing run directory")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.markup import escape

    from vflink.errors import ConfigError
    from vflink.runfiles.config import load_config
    from vflink.runfiles.rundir import check_run_dir
    from vflink.runner.audit import run_audit

    if args.brute_force is not None and not args.white_box:
        raise ConfigError("--brute-force applies to the white-box attacker: add --white-box")
    config = load_config(args.config)
    out = args.out or Path("runs") / f"{args.config.stem}-audit"
    check_run_dir(out, overwrite=args.overwrite, resume=False)  # before any work
    params = {} if args.brute_force is None else {"brute_force": args.brute_force}
    console = Console()
    with console.status("training with canaries and auditing"):
        figures = run_audit(config, canaries=args.canaries, white_box=args.white_box, out=out,
                            confidence=args.confidence, seed=args.canary_seed,
                            overwrite=args.overwrite, party=args.party, attack_params=params)
    console.print(escape(figures["explanation"]), highlight=False)
    console.print(f"run directory: {out} (audit.json, privacy.json)", highlight=False)
    return 0
