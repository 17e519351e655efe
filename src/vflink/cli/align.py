"""``vflink align``: private set union (FLORIST Algorithm 1) or PSI (ECDH, or RR22/KKRT through
the optional engine) between two tables."""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path
from typing import Any

from vflink.cli._compute import add_compute_args, compute_from_args

__all__ = ["register", "run"]

HELP = """Align two tables on exact key column(s) without revealing more than the protocol's
output. Keys are read as text and hashed to a prime-order group; only shuffled lists of blinded
group elements cross between the parties (with --protocol rr22|kkrt: the engine's own messages).

  psu  private set union (FLORIST Algorithm 1): both parties get the sorted list of universal
       IDs (UIDs) of the union and a UID for each of their own records; neither learns which
       of its records the other holds (only |A|, |B| and |A ∪ B| leak).
  psi  private set intersection: the intersection rows and a shared UID for each
       (--reveal both|primary|secondary), or only its size (--reveal cardinality, dh only).
       --protocol dh (default): vflink's ECDH PSI, whose answers carry proofs against a
       deviating primary. --protocol rr22 or kkrt: OT-extension PSI (RR22, KKRT16) through
       SecretFlow's spu, an optional extra (pip install 'vflink[rr22]', Python 3.10/3.11;
       or $VFLINK_PSI_PYTHON naming the python of an environment with spu==0.9.5, where the
       engine's child process runs), an order of magnitude faster, secure against a
       semi-honest peer only. The peers agree on it in their authenticated session (a
       party's policy.psi_protocols may refuse it), then the engine runs its own link
       between the [psi] addresses of their party files, with mutual TLS from the same
       certificates; its files stay in the party's spool and are removed after the run.

Writes OUT/primary.parquet and OUT/secondary.parquet (columns `row`, the 0-based row position
in the input, and `uid`, hex; for psi only the intersection rows) and OUT/summary.json (sizes,
group, seconds, payload bytes per direction, and `crypto_bound`).

The crypto bound: the group's cost per operation (hash to the group, exponentiation, check of
a peer's element) is sampled on one core of this machine before and after the run (a fraction
of a second each), and the protocol's operations for these set sizes, per party, divided by
the cores used, give the least time the run could take; the summary and the last line report
the command's wall time as a ratio to it, with the costs, so that a figure from one machine
can be checked on another. With --party the secondary's operations are costed at this
machine's rates. With --party the secondary is not read here: it
is served elsewhere by `vflink serve` (its party file's [party.table] names its key columns) and
writes its own output into its state directory.

With an engine protocol the summary has no crypto bound; its `engine` entry says what the run
gives (semi-honest, what each side learns, the link's addresses) and where the time went: the
protocol itself against the CSV files, the engine's hash buckets and sorting, and its start.

Keys are read from the files in batches of --chunk-rows (default: [compute] chunk_rows of the
party file, else 100,000), which is also the protocol's elements per message, and the outputs
are written as they are computed: memory does not grow with the tables.
"""


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "align", help="private set union / intersection of two tables (FLORIST PSU, ECDH PSI)",
        description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--method", choices=("psu", "psi"), default="psu")
    p.add_argument("--protocol", choices=("dh", "rr22", "kkrt"), default="dh",
                   help="psi: dh (vflink's ECDH PSI, default), rr22 or kkrt (the optional "
                        "engine: pip install 'vflink[rr22]'; semi-honest only)")
    p.add_argument("--primary", type=Path, required=True,
                   help="primary table (CSV, TSV, .csv.gz, Parquet)")
    p.add_argument("--secondary", type=Path, help="secondary table (in-process run)")
    p.add_argument("--on", required=True, help="key column(s), comma-separated")
    p.add_argument("--secondary-on", help="the secondary's key column(s) (default: --on)")
    p.add_argument("--out", type=Path, required=True, help="output directory")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the output files of an existing --out directory")
    p.add_argument("--delimiter", help="CSV delimiter of the tables (default: detected among "
                   ", ; tab |; write tab as '\\t')")
    p.add_argument("--encoding", help="text encoding of the CSV tables (default: utf-8; e.g. "
                   "latin-1, cp1252)")
    p.add_argument("--secondary-delimiter", help="the secondary's CSV delimiter, when it "
                   "differs (default: --delimiter)")
    p.add_argument("--secondary-encoding", help="the secondary's text encoding, when it "
                   "differs (default: --encoding)")
    p.add_argument("--group", default="ristretto255",
                   help="ristretto255 (default, libsodium) or modp2048 (the paper's "
                        "QR(Z_p*) with the RFC 3526 prime; reference, ~60x slower)")
    p.add_argument("--reveal", default="both",
                   choices=("both", "primary", "secondary", "cardinality"),
                   help="psi: who learns the intersection (default both)")
    p.add_argument("--workers", type=int, help="threads/processes for exponentiation "
                   "(default: every core)")
    p.add_argument("--party", type=Path, help="the primary's party file: reach the secondary "
                   "served with `vflink serve` instead of reading --secondary here")
    p.add_argument("--peer", help="with --party: the secondary's name (default: the only one)")
    p.add_argument("--chunk-rows", type=int, help="keys per batch read and elements per "
                   "protocol message (default: [compute] chunk_rows of --party, else 100000; "
                   "at most 1048576)")
    add_compute_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # heavy imports here: `vflink --help` stays fast
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from vflink.cli._heap import keep_large_blocks_mapped
    from vflink.cli._outputs import refuse_existing
    from vflink.errors import ConfigError, DataError
    from vflink.protocol.messages import MAX_CHUNK_ROWS
    from vflink.runner.align import (
        CostProbe,
        KeyFile,
        align_in_process,
        align_over_network,
        bound_line,
        engine_line,
        run_cores,
        write_outcome,
    )
    from vflink.runner.compute import open_compute

    console = Console(stderr=True)
    on = tuple(c.strip() for c in args.on.split(",") if c.strip())
    sec_on = tuple(c.strip() for c in (args.secondary_on or args.on).split(",") if c.strip())
    if not on:
        raise ConfigError("--on needs at least one key column")
    missing = [f"{p.absolute()}: file not found" for p in (args.primary, args.secondary)
               if p is not None and not p.exists()]
    if missing:  # every input named at once, before any output or work (exit 2)
        raise DataError("; ".join(missing), missing)
    # the files this command writes into --out (the secondary's only when it is read here)
    written = ["primary.parquet", "summary.json"] + (
        ["secondary.parquet"] if args.party is None else [])
    refuse_existing(*(args.out / name for name in written), overwrite=args.overwrite)
    if args.chunk_rows is not None and not 1 <= args.chunk_rows <= MAX_CHUNK_ROWS:
        raise ConfigError(f"--chunk-rows must be in [1, {MAX_CHUNK_ROWS}], got "
                          f"{args.chunk_rows}")
    # read in batches while aligning (memory flat in table size), not here as whole tables
    primary = KeyFile(args.primary, on, "primary", args.delimiter, args.encoding)
    config = None
    if args.party is not None:
        from vflink.runfiles.party import load_party_config

        config = load_party_config(args.party)
    compute_config = compute_from_args(args, config.compute if config else None)
    if args.chunk_rows is not None:  # the engine's tasks too
        compute_config = dataclasses.replace(compute_config, chunk_rows=args.chunk_rows)
    chunk_rows = compute_config.chunk_rows
    keep_large_blocks_mapped()  # freed chunks go back to the system (see cli/_heap.py)
    engine = args.protocol != "dh"
    if engine and args.method != "psi":
        raise ConfigError(f"--protocol {args.protocol} is a PSI protocol: use --method psi")
    if engine:
        from vflink.alignment.engine import require_engine

        require_engine(args.protocol)  # the install command, before any work
    # the group's costs before the run (unknown names refused); an engine run has no group
    probe = None if engine else CostProbe(args.group)
    start = time.perf_counter()
    with open_compute(compute_config) as compute, \
            Progress(TextColumn("[bold]{task.description}"), BarColumn(),
                  TextColumn("{task.fields[stage]}"), TimeElapsedColumn(), console=console,
                  transient=True) as bar:
        task = bar.add_task(f"{args.method} ({args.protocol if engine else args.group})",
                            total=None, stage="")
        cores = run_cores(compute, args.workers)

        def progress(stage: str, done: int, total: int) -> None:
            bar.update(task, completed=done, total=total, stage=stage)

        kwargs: dict[str, Any] = {"method": args.method, "group": args.group,
                                  "reveal": args.reveal, "workers": args.workers,
                                  "progress": progress, "compute": compute,
                                  "chunk_rows": chunk_rows, "out": args.out,
                                  "protocol": args.protocol}
        if config is not None:
            peers = config.secondaries
            peer = args.peer or (peers[0] if len(peers) == 1 else None)
            if peer is None:
                raise ConfigError(f"--peer is needed: {args.party} names secondaries "
                                  f"{', '.join(peers) or 'none'}")
            outcome = align_over_network(primary, config, peer, **kwargs)
        else:
            if args.secondary is None:
                raise ConfigError("give --secondary (in-process) or --party (served secondary)")
            secondary = KeyFile(args.secondary, sec_on, "secondary",
                                args.secondary_delimiter or args.delimiter,
                                args.secondary_encoding or args.encoding)
            outcome = align_in_process(primary, secondary, **kwargs)
    # the command's own time: engine start and stop, key passes, protocol, outputs written
    wall = time.perf_counter() - start
    if probe is not None:
        outcome = dataclasses.replace(outcome,
                                      bound=probe.bound(outcome, wall_s=wall, cores=cores))
    summary = write_outcome(outcome, args.out, wall_s=wall)
    sizes = summary["sizes"]
    how = engine_line(summary["engine"], wall) if engine else \
        bound_line(summary["crypto_bound"])
    console.print(f"{args.method} with {args.protocol if engine else args.group}: " + ", ".join(
        f"{k} {v}" for k, v in sizes.items()) + f"; {wall:.1f} s, {how}; wrote {args.out}")
    return 0
