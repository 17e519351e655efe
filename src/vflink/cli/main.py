"""``vflink`` command line: one module per command, each registering its own sub-parser.

Heavy libraries (torch, gRPC, faiss, matplotlib, pandas) are imported inside the commands that
use them, so ``vflink --help`` and every ``vflink COMMAND --help`` answer at once.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import signal
import sys
from collections.abc import Sequence
from types import FrameType
from typing import Any, NoReturn

from vflink import __version__
from vflink.cli._errors import EXIT_CODES_HELP, Terminated, report_failure

__all__ = ["main"]

#: Each command's name and the module (``vflink.cli.<module>``) that registers it, in the
#: order ``vflink --help`` lists them.
COMMAND_MODULES = {"train": "train", "link": "link", "experiment": "experiment",
                   "predict": "predict", "demo": "demo", "serve": "serve", "certs": "certs",
                   "align": "align", "attack": "attack", "audit": "audit", "report": "report",
                   "privacy-budget": "privacy_budget"}


def _command(argv: Sequence[str]) -> str | None:
    """The command a command line names (its first word that is not a global option), when
    it is one of :data:`COMMAND_MODULES`."""
    for word in argv:
        if word.startswith("-"):
            if word in ("-h", "--help", "--version"):
                return None
            continue  # -v, -vv, --verbose
        return word if word in COMMAND_MODULES else None
    return None


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The ``vflink`` parser; ``only``: with that command's sub-parser alone (a run of one
    command imports only its own module: ``vflink link`` does not load the attacks)."""
    parser = argparse.ArgumentParser(
        prog="vflink",
        description="Vertical federated learning across organisations whose records do not "
                    "share a clean key: private record linkage (exact keyed hashes, fuzzy top-K "
                    "soft linkage) and split learning (SplitNN, FedSim and baselines) across a "
                    "real party boundary, in one process or over gRPC with mutual TLS.",
        epilog="Run `vflink COMMAND --help` for the options of a command.\n\n" + EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"vflink {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="more log output (-v: info, -vv: debug, with the traces of "
                             "errors a party logged)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, module in COMMAND_MODULES.items():
        if only is None or name == only:
            importlib.import_module(f"vflink.cli.{module}").register(sub)
    return parser


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise Terminated


def main(argv: Sequence[str] | None = None, *, exit_after: bool = False) -> int:
    """Run the command ``argv`` (default: ``sys.argv[1:]``); its exit code. ``exit_after``:
    the process ends as soon as this returns (:func:`entry`), which a command may use to
    leave out the clean-up that only a longer-lived caller needs (``args.exit_after``)."""
    # OpenMP threads (faiss, torch) spin while they wait for work by default: on a machine whose
    # cores are busy with other work that turned a 1.6 s faiss index build into 7.5 s (2 cores,
    # measured). Sleeping waiters cost nothing measurable when the cores are free. Set before
    # the first OpenMP runtime is loaded; a value the user exported wins.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    # numpy's transparent-huge-page advice off (why: vflink._memory), read by numpy at its
    # import, which comes later (the commands import it); a value the user exported wins.
    os.environ.setdefault("NUMPY_MADVISE_HUGEPAGE", "0")
    words = sys.argv[1:] if argv is None else list(argv)
    if _command(words) in ONE_BLAS_THREAD and "numpy" not in sys.modules:
        # numpy's OpenBLAS starts a pool of threads as numpy loads, which spin waiting for
        # work: 0.1 s of CPU during a link's imports (perf: every sample in numpy's OpenBLAS
        # fell there), beside the thread that imports (ONE_BLAS_THREAD). A link multiplies no
        # matrices worth a second thread. Only where numpy is not loaded yet (this process's
        # own start); a value the user exported wins.
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    parser = build_parser(_command(words))
    args = parser.parse_args(words)
    args.exit_after = exit_after
    from rich.console import Console

    from vflink.cli._errors import console_log_handler

    err = Console(stderr=True)
    level = {0: logging.WARNING, 1: logging.INFO}.get(args.verbose, logging.DEBUG)
    handler = console_log_handler(err, show_traces=args.verbose >= 2)
    logging.basicConfig(level=level, format="%(message)s", handlers=[handler])
    # SIGTERM ends a command like Ctrl-C does (partial runs cleaned up or kept for --resume),
    # with a message and exit code 143; `vflink serve` installs its own graceful stop.
    previous: Any = None
    in_main = _is_main_thread()
    if in_main:
        previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        return int(args.func(args) or 0)
    except BaseException as exc:  # every failure becomes one message and an exit code
        if isinstance(exc, SystemExit):
            raise
        return report_failure(exc, err, handler, command=args.command)
    finally:
        if in_main:
            signal.signal(signal.SIGTERM, previous)


#: Commands whose process loads numpy's OpenBLAS with one thread (no pool: :func:`main`).
#: On 2 cores, `vflink link` at FedSim's house scale took 0.07-0.19 s less CPU with it
#: (medians of 8 to 10, alternately with the pool, 50 clusters and the house shape); its wall
#: time moved by -0.08 to +0.02 s, within the run-to-run noise.
ONE_BLAS_THREAD = frozenset({"link"})

#: Commands whose process, once the command is done, exits without the interpreter's teardown.
#: Clearing the modules of a link's process (pandas, numpy, scipy, pyarrow: 80,000 objects)
#: took 0.15-0.2 s after every link had been written, measured at FedSim's house scale; the
#: atexit handlers still run. Commands that train or serve keep the ordinary exit: their
#: libraries (torch, gRPC, Ray) may count on finalizers that only the teardown runs.
FAST_EXIT = frozenset({"link"})


def entry() -> NoReturn:
    """The ``vflink`` console script: :func:`main`, then the process's exit."""
    fast = _command(sys.argv[1:]) in FAST_EXIT
    code = main(exit_after=fast)
    if fast:
        exit_now(code)
    sys.exit(code)


def exit_now(code: int) -> NoReturn:
    """End the process with ``code`` the way the interpreter's exit begins, without clearing
    its modules: the threads' own exit hooks (a pool's idle workers stop) and every
    non-daemon thread joined (the old output of ``--overwrite``, deleted in a thread of its
    own, is gone when this returns), then every atexit handler (logging's flush among them),
    then stdout and stderr flushed. The ordinary ``sys.exit`` where this is not the main
    thread or this Python lacks ``threading._shutdown`` or ``atexit._run_exitfuncs``."""
    import atexit
    import threading

    run = getattr(atexit, "_run_exitfuncs", None)
    join = getattr(threading, "_shutdown", None)
    if run is None or join is None or threading.current_thread() is not threading.main_thread():
        sys.exit(code)
    join()  # what Python's own finalisation does first (then its atexit calls)
    run()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe (`| head`) or a closed stream
            pass
    os._exit(code)


def _is_main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


if __name__ == "__main__":
    entry()
