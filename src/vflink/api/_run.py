"""``vflink.train`` and :class:`vflink.Run`: a training run and its run directory, from Python.

A thin layer over :func:`vflink.runner.train.run_training` (what ``vflink train`` runs),
:func:`vflink.runner.predict.predict_records` (``vflink predict``),
:func:`vflink.runner.attack.run_attack` (``vflink attack``) and
:func:`vflink.reporting.report.write_report` (``vflink report``): a run made here is the run
directory the commands make, and each command can read it.
"""

from __future__ import annotations

import copy
import os
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

from vflink.data.given import TableLike, read_table
from vflink.errors import ConfigError, RunError

if TYPE_CHECKING:
    import pandas as pd

    from vflink.attacks.base import AttackResult
    from vflink.data.table import PartyTable
    from vflink.runfiles.config import RunConfig
    from vflink.runfiles.inputs import Inputs
    from vflink.runfiles.results import RunResult

__all__ = ["ConfigLike", "Run", "audit", "train"]

#: A run configuration: the path of a TOML run file, a mapping with the same structure, or a
#: :class:`~vflink.RunConfig`.
ConfigLike: TypeAlias = "str | os.PathLike[str] | Mapping[str, Any] | RunConfig"

#: ``progress(stage, done, total)``, called as epochs finish.
ProgressFn = Callable[[str, int, int], None]

#: Stands for a party's ``path`` when its table is handed to :func:`train` in ``tables``.
IN_MEMORY = "<in-memory table {name!r}>"


def _read_json(directory: Path, name: str) -> Any:
    from vflink._files import read_json_file

    if not os.path.lexists(directory / name):
        raise RunError(f"{directory}: no {name}; is this a run directory written by "
                       "`vflink train` or vflink.train()?")
    return read_json_file(directory, name, error=RunError)


@dataclass(frozen=True, eq=False)
class Run:
    """A finished training run: its directory, configuration and results.

    Made by :func:`train`, or by :meth:`Run.load` from any run directory (``vflink train``'s
    too). Every property reads the run directory, so attacks run later show in
    :attr:`privacy`.

    Attributes
    ----------
    path : pathlib.Path
        The run directory (``config.json``, ``metrics.json``, ``privacy.json``,
        ``learning_curve.png``, ``models/<party>/``).
    config : RunConfig
        The resolved configuration the run was trained with.
    result : vflink.runfiles.results.RunResult or None
        The in-memory result when the run was trained in this process (``None`` after
        :meth:`load`).
    """

    path: Path
    config: RunConfig = field(repr=False)
    result: RunResult | None = field(default=None, repr=False)
    tables: Inputs | None = field(default=None, repr=False)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Run:
        """Open a run directory written by :func:`train` or ``vflink train``.

        Raises
        ------
        RunError
            ``path`` is not a run directory (no ``config.json``) or a file in it is damaged.
        """
        from vflink._files import check_directory
        from vflink.runfiles.config import parse_config

        directory = check_directory(Path(path), "a run directory (vflink.train's out)",
                                    error=RunError)
        raw = _read_json(directory, "config.json")
        if not isinstance(raw, dict):
            raise RunError(f"{directory / 'config.json'}: expected a JSON object (a run's "
                           "configuration)")
        return cls(path=directory, config=parse_config(raw))

    @property
    def algorithm(self) -> str:
        """The algorithm trained (``"fedsim"``, ``"solo"``...)."""
        return self.config.algorithm

    @property
    def summary(self) -> dict[str, Any]:
        """The whole of ``metrics.json``: metrics, epochs, communication, sizes, alignment."""
        from vflink._typed import typed
        from vflink.runfiles.results import METRICS_SCHEMA

        data = _read_json(self.path, "metrics.json")
        if not isinstance(data, dict):
            raise RunError(f"{self.path / 'metrics.json'}: expected a JSON object")
        return typed(data, METRICS_SCHEMA, source=str(self.path / "metrics.json"),  # type: ignore[no-any-return]
                     error=RunError)

    @property
    def metrics(self) -> dict[str, dict[str, float]]:
        """Task metrics per split: ``run.metrics["test"]["accuracy"]`` (or ``rmse``...), at
        the best validation epoch."""
        return dict(self.summary["metrics"])

    @property
    def headline(self) -> str:
        """The name of the metric early stopping watched (accuracy, or RMSE for regression)."""
        return str(self.summary["headline_metric"])

    @property
    def history(self) -> pd.DataFrame:
        """One row per epoch: ``epoch``, ``train_loss``, ``validation_<metric>`` for each
        validation metric, ``seconds`` and ``bytes`` exchanged in that epoch."""
        import pandas as pd

        rows = []
        for record in self.summary.get("epochs", []):
            row: dict[str, Any] = {"epoch": record["epoch"], "train_loss": record["train_loss"]}
            row.update({f"validation_{k}": v for k, v in record["validation"].items()})
            row["seconds"] = record["seconds"]
            row["bytes"] = sum(v.get("bytes", 0) for v in record["communication"].values())
            rows.append(row)
        return pd.DataFrame(rows)

    @property
    def privacy(self) -> dict[str, Any]:
        """The privacy ledger (``privacy.json``): ``messages`` (what crossed the boundary and
        what protected it), ``protections`` (with their ε, δ, τ or σ) and ``attacks`` (every
        attack run on this run so far)."""
        from vflink.privacy.ledger import LEDGER_FILE, Ledger

        return Ledger.read(self.path / LEDGER_FILE).to_json()

    def predict(self, records: TableLike, *, tables: Mapping[str, Any] | None = None,
                delimiter: str | None = None, encoding: str | None = None,
                decimal: str | None = None) -> pd.DataFrame:
        """Predict new primary records, as ``vflink predict`` does.

        The records are linked to the secondaries' tables as in training, every party loads
        its saved model and the primary predicts.

        Parameters
        ----------
        records : pandas.DataFrame or path
            New records with the primary's columns (the label column is optional).
        tables : mapping of party name to DataFrame, optional
            The secondaries' tables, when the run was trained on in-memory tables and was
            reopened with :meth:`load` (a run made by :func:`train` in this process keeps
            them).
        delimiter, encoding, decimal : str, optional
            How to read a CSV path.

        Returns
        -------
        pandas.DataFrame
            ``row``, ``prediction`` (and ``probability`` columns for classification), and how
            well each row was linked (``best_similarity``/``low_similarity``, or
            ``matched``). ``frame.attrs["metrics"]`` holds the metrics when the records carry
            labels, ``frame.attrs["warnings"]`` the warnings.
        """
        from vflink.runner.predict import predict_records

        frame, source = read_table(records, argument="records", delimiter=delimiter,
                                   encoding=encoding, decimal=decimal)
        inputs = self.tables
        if tables is not None:
            inputs = _inputs(self.config, tables)
        elif inputs is None:
            _check_paths(self.config)
        result = predict_records(self.path, frame, source=source, tables=inputs)
        out = result.frame
        out.attrs["metrics"] = result.metrics
        out.attrs["warnings"] = list(result.warnings)
        return out

    def attack(self, name: str, *, party: str | None = None,
               **params: Any) -> AttackResult:
        """Run attack ``name`` on this run and append its result to the privacy ledger.

        The run must have been trained with ``evaluation.record = true``. ``vflink attack
        --list`` (or :func:`vflink.attacks.attack_names`) lists the attacks.

        Parameters
        ----------
        name : str
            The attack, e.g. ``"label-inference"``.
        party : str, optional
            The attacking party (default: the first party of the attack's role).
        **params
            The attack's parameters.

        Returns
        -------
        vflink.attacks.base.AttackResult
            ``.metrics`` (e.g. ``{"auc": 0.93}``) and a plain ``.explanation``.
        """
        from vflink.runner.attack import run_attack

        return run_attack(self.path, name, party=party, params=dict(params), tables=self.tables)

    def report(self, path: str | os.PathLike[str] | None = None, *,
               overwrite: bool = False) -> Path:
        """Write the run's self-contained offline HTML page (``vflink report``).

        Parameters
        ----------
        path : str or path, optional
            The HTML file (default: ``<run>/report.html``).
        overwrite : bool, default False
            Replace an existing file.

        Returns
        -------
        pathlib.Path
            The page written.
        """
        from vflink.reporting.report import write_report

        target = Path(path) if path is not None else self.path / "report.html"
        if target.exists() and not overwrite:
            raise ConfigError(f"{target}: output already exists; choose another `path` or "
                              "pass overwrite=True to replace it")
        return write_report(self.path, target)


def _in_memory(config: RunConfig) -> list[str]:
    """The parties whose tables were handed to :func:`train` in memory."""
    return [s.name for s in config.data.parties
            if s.path is not None and str(s.path).startswith("<in-memory table")]


def _check_paths(config: RunConfig) -> None:
    """A run trained on in-memory tables cannot reread them: say so, not "file not found"."""
    names = _in_memory(config)
    if names:
        shown = ", ".join(f"{n!r}: ..." for n in names)
        raise ConfigError(f"the run's parties {names} were trained on in-memory tables: pass "
                          f"them again, run.predict(records, tables={{{shown}}})")


def _inputs(config: RunConfig, tables: Mapping[str, Any]) -> Inputs:
    """The parties' tables from ``tables`` (DataFrames, paths or PartyTables by party name),
    checked against the schemas of ``config`` like files are."""
    from vflink.data.table import PartyTable, validate_frame
    from vflink.runfiles.inputs import Inputs

    if not isinstance(tables, Mapping):
        raise ConfigError(f"`tables` must map party names to DataFrames, got "
                          f"{type(tables).__name__}")
    if config.data.dataset is not None:
        raise ConfigError(f"`tables` needs [[data.parties]] schemas in the config; it names "
                          f"the built-in dataset {config.data.dataset!r}")
    schemas = {s.name: s for s in config.data.parties}
    unknown = sorted(set(tables) - set(schemas))
    if unknown:
        raise ConfigError(f"`tables` names party(ies) {unknown} the config does not have; "
                          f"its parties: {sorted(schemas)}")
    absent = [n for n in _in_memory(config) if n not in tables]
    if absent:
        raise ConfigError(f"`tables` lacks {absent}: the run was trained on in-memory tables "
                          "for them")
    built: dict[str, PartyTable] = {}
    for name, schema in schemas.items():
        value = tables.get(name)
        if value is None:
            from vflink.data.table import load_table

            built[name] = load_table(schema)
        elif isinstance(value, PartyTable):
            built[name] = value
        else:
            frame, source = read_table(value, argument=f"tables[{name!r}]",
                                       text_columns=schema.key, delimiter=schema.delimiter,
                                       encoding=schema.encoding, decimal=schema.decimal)
            built[name] = PartyTable(schema, validate_frame(frame, schema, source), source)
    primary = next(t for t in built.values() if t.schema.role == "primary")
    return Inputs(primary, tuple(t for t in built.values() if t.schema.role == "secondary"))


def _config(config: Any, tables: Mapping[str, Any] | None) -> tuple[RunConfig, str | None]:
    """The :class:`RunConfig` of ``config`` and, for a file, its stem (for the default
    run directory)."""
    from vflink.config import CONFIG_VERSION
    from vflink.runfiles.config import RunConfig, load_config, parse_config

    if isinstance(config, RunConfig):
        return config, None
    if isinstance(config, (str, os.PathLike)):
        path = Path(config)
        return load_config(path), path.stem
    if isinstance(config, Mapping):
        raw = copy.deepcopy(dict(config))
        raw.setdefault("version", CONFIG_VERSION)
        data = raw.get("data")
        if tables and isinstance(data, dict) and isinstance(data.get("parties"), list):
            names = [p.get("name") for p in data["parties"] if isinstance(p, dict)]
            unknown = sorted(set(tables) - set(names))
            if unknown:
                raise ConfigError(f"`tables` names party(ies) {unknown} the config does not "
                                  f"have; its parties: {names}")
            for party in data.get("parties") or []:
                if isinstance(party, dict) and party.get("name") in tables:
                    party.setdefault("path", IN_MEMORY.format(name=party["name"]))
        return parse_config(raw), None
    raise ConfigError(f"`config` must be the path of a TOML run file, a mapping or a "
                      f"RunConfig, got {type(config).__name__}")


def train(config: ConfigLike, tables: Mapping[str, Any] | None = None, *,
          out: str | os.PathLike[str] | None = None, algorithm: str | None = None,
          seed: int | None = None, overwrite: bool = False, resume: bool = False,
          party: str | os.PathLike[str] | None = None,
          progress: ProgressFn | None = None) -> Run:
    """Train one algorithm and write its run directory, as ``vflink train`` does.

    Alignment runs the real protocol (keyed hashes, soft linkage through a coordinator, or
    PSI/PSU), every party is built in this process (or reached over gRPC with ``party``) and
    they exchange only the messages the protocol allows.

    Parameters
    ----------
    config : path, mapping or RunConfig
        A TOML run file; a mapping with the same tables (``{"algorithm": "fedsim", "data":
        {...}, "alignment": {...}}``; ``version`` may be left out); or a
        :class:`~vflink.RunConfig` built with keyword arguments.
    tables : mapping of party name to DataFrame, path or PartyTable, optional
        The parties' tables, instead of the files their ``[[data.parties]]`` schemas name
        (in a mapping config their ``path`` may then be left out). Each is checked against
        its schema like a file.
    out : str or path, optional
        The run directory to create. Default: ``runs/<file stem>-<algorithm>`` for a run file
        (as ``vflink train``), a new temporary directory otherwise.
    algorithm : str, optional
        Overrides the config's ``algorithm``.
    seed : int, optional
        Overrides the config's ``seed``.
    overwrite : bool, default False
        Replace an existing run directory.
    resume : bool, default False
        Continue an interrupted run from its last epoch checkpoint.
    party : str or path, optional
        The primary's party file: train against secondaries and a coordinator served
        elsewhere (``vflink serve``) over gRPC with mutual TLS.
    progress : callable, optional
        ``progress(stage, done, total)``, called as epochs finish.

    Returns
    -------
    Run
        The finished run (``.metrics``, ``.history``, ``.privacy``, ``.predict``...).

    Raises
    ------
    ConfigError
        The configuration is invalid (every problem at once) or ``tables`` does not fit it.
    DataError
        A table does not match its schema (the message names the table, column and row).
    RunError
        ``out`` exists (without ``overwrite``), or there is nothing to resume.

    Examples
    --------
    >>> run = vflink.train("examples/splitnn.toml", out="runs/splitnn")   # doctest: +SKIP
    >>> run.metrics["test"]                                               # doctest: +SKIP
    """
    from vflink.runfiles.rundir import check_run_dir
    from vflink.runner.train import run_training

    run_config, stem = _config(config, tables)
    changes: dict[str, Any] = {}
    if algorithm is not None:
        changes["algorithm"] = algorithm
    if seed is not None:
        changes["seed"] = seed
    if changes:
        run_config = run_config.replace(**changes)
    if out is not None:
        target = Path(out)
    elif stem is not None:
        target = Path("runs") / f"{stem}-{run_config.algorithm}"
    else:
        target = Path(tempfile.mkdtemp(prefix=f"vflink-{run_config.algorithm}-")) / "run"
    check_run_dir(target, overwrite=overwrite, resume=resume)  # before any work
    inputs = _inputs(run_config, tables) if tables is not None else None
    federation = None
    if party is not None:
        from vflink.runfiles.inputs import Inputs, load_inputs
        from vflink.runfiles.party import load_party_config
        from vflink.runner.network import network_federation

        party_config = load_party_config(Path(party))
        loaded = inputs if inputs is not None else load_inputs(run_config)
        if loaded.primary.name != party_config.name:
            raise ConfigError(f"the run file's primary is {loaded.primary.name!r} but the "
                              f"party file is for {party_config.name!r}")
        inputs = Inputs(loaded.primary, ())  # the other parties' data stay with them
        federation = network_federation(party_config, run_id=target.name)
    try:
        result = run_training(run_config, target, overwrite=overwrite, progress=progress,
                              tables=inputs, federation=federation, resume=resume)
    finally:
        if federation is not None:
            federation.close()
    return Run(path=target, config=run_config, result=result,
               tables=inputs if party is None else None)


def audit(config: ConfigLike, tables: Mapping[str, Any] | None = None, *,
          canaries: int = 1000, white_box: bool = False,
          out: str | os.PathLike[str] | None = None, confidence: float = 0.95,
          canary_seed: int | None = None, brute_force: int | None = None,
          overwrite: bool = False) -> dict[str, Any]:
    """Audit a run's label protection empirically, as ``vflink audit`` does.

    Trains ``config`` once with ``canaries`` records whose label is a fair coin, plays the
    attacking secondary on what it received, and bounds ε from below with a Clopper–Pearson
    interval (Steinke, Nasr & Jagielski, *Privacy Auditing with One (1) Training Run*,
    NeurIPS 2023), beside the ε the run's ledger claims.

    Parameters
    ----------
    config : path, mapping or RunConfig
        As :func:`train`; its alignment must be ``"exact"`` (canaries are linked by key).
    tables : mapping of party name to DataFrame, path or PartyTable, optional
        As :func:`train`.
    canaries : int, default 1000
        Records of the training split whose label is replaced by a fair coin.
    white_box : bool, default False
        The attacker reads the code: noise subtraction from every seed it received (and small
        seeds tried), instead of epoch averaging.
    out : str or path, optional
        Keep the run directory there (with ``audit.json`` and the audit in its ledger).
    confidence : float, default 0.95
        Of the lower bound.
    canary_seed : int, optional
        Fixes the canaries (default: the operating system's randomness).
    brute_force : int, optional
        White-box only: try every small seed below this.
    overwrite : bool, default False
        Replace an existing ``out``.

    Returns
    -------
    dict
        ``epsilon_lower`` (the empirical lower bound), ``epsilon_claimed`` (the ledger's;
        ``None`` for a mode that claims none), ``holds`` (the bound within the claim), the
        guesses and the interval, and ``explanation`` in words.

    Raises
    ------
    ConfigError
        The configuration cannot be audited (no label protection to audit, not exact
        alignment, a bad ``confidence``) or ``brute_force`` without ``white_box``.

    Examples
    --------
    >>> vflink.audit("examples/splitnn.toml", canaries=500)["epsilon_lower"]  # doctest: +SKIP
    """
    from vflink.runfiles.rundir import check_run_dir
    from vflink.runner.audit import run_audit

    if brute_force is not None and not white_box:
        raise ConfigError("`brute_force` applies to the white-box attacker: add white_box=True")
    run_config, _ = _config(config, tables)
    target = None if out is None else Path(out)
    if target is not None:
        check_run_dir(target, overwrite=overwrite, resume=False)  # before any work
    inputs = _inputs(run_config, tables) if tables is not None else None
    params = {} if brute_force is None else {"brute_force": int(brute_force)}
    return run_audit(run_config, canaries=canaries, white_box=white_box, out=target,
                     tables=inputs, confidence=confidence, seed=canary_seed,
                     overwrite=overwrite, attack_params=params)
