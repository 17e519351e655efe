"""Run configuration: frozen, validated dataclasses and the TOML experiment file.

A run file carries a ``version``; every problem in a file is reported at once (ARCHITECTURE.md,
convention 6). Relative data paths are resolved against the file's directory.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vflink._checks import (
    check_bool,
    check_choice,
    check_float,
    check_int,
    check_one_to_one,
    check_probability,
    from_table,
    raise_if,
    table_problems,
)
from vflink.alignment.protocols import PSI_PROTOCOLS
from vflink.data.featurestore import FEATURE_STORES
from vflink.data.schema import PartySchema
from vflink.engine import ComputeConfig  # the [compute] section
from vflink.errors import ConfigError, VflinkError
from vflink.metrics.functional import SELECTION, THRESHOLDS
from vflink.models.device import DEFAULT_DEVICE, DEVICES
from vflink.models.merge import AggregatorConfig
from vflink.models.spec import ACTIVATIONS, OPTIMIZERS, BottomSpec
from vflink.parties.policy import PartyPolicy
from vflink.parties.resources import TrainingResources
from vflink.privacy.config import PrivacyConfig  # the [privacy] section (VFL-AFE)
from vflink.runfiles.algorithms import algorithm_names

if TYPE_CHECKING:
    from vflink.linkage.fields import Blocking, FieldSpec

__all__ = [
    "ALGORITHMS",
    "CONFIG_VERSION",
    "AlignmentConfig",
    "DataConfig",
    "EvaluationConfig",
    "ModelConfig",
    "PrivacyConfig",
    "RunConfig",
    "TrainingConfig",
    "config_to_dict",
    "load_config",
    "parse_config",
]

from vflink.config import CONFIG_VERSION, read_toml  # noqa: E402

#: Training algorithms a run may name (FedSim §3 and §6.1; see ``vflink.runfiles.algorithms``).
ALGORITHMS = algorithm_names()
LINK_METRICS = ("euclidean", "haversine", "hamming", "levenshtein")
_METRIC_WITH_FIELDS = ("give either `alignment.metric` (one field: every party's `identifiers` "
                       "columns) or [[alignment.fields]] (each field with its own `metric`), "
                       "not both")


@dataclass(frozen=True, kw_only=True)
class DataConfig:
    """Where the parties' tables come from: a built-in dataset, or files with schemas."""

    dataset: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    parties: tuple[PartySchema, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "parties", tuple(self.parties))
        problems: list[str] = []
        if (self.dataset is None) == (not self.parties):
            problems.append("[data] needs exactly one of `dataset` (a built-in dataset name) or "
                            "[[data.parties]] tables")
        if self.parties:
            roles = [p.role for p in self.parties]
            if roles.count("primary") != 1:
                problems.append(f"[[data.parties]] needs exactly one primary party, got "
                                f"{roles.count('primary')}")
            names = [p.name for p in self.parties]
            if len(set(names)) != len(names):
                problems.append(f"party names must be unique, got {names}")
            if "coordinator" in names:
                problems.append("`coordinator` is reserved for the linkage coordinator")
            for p in self.parties:
                if p.path is None:
                    problems.append(f"party {p.name!r} needs a `path` to its table")
        raise_if(problems, "[data] section")


@dataclass(frozen=True, kw_only=True)
class AlignmentConfig:
    """How records are aligned.

    ``method = "exact"``: keyed hashes of the key columns, matched by the coordinator;
    ``unmatched`` drops primary rows without a link, or keeps them with a learned "missing"
    embedding. ``method = "soft"``: FedSim §4.1 top-K soft linkage on the identifier columns
    with ``metric``, ``top_k``, and noise from ``tau`` (Theorem 2) or ``sigma`` (Eq. 2); with
    neither and ``privacy = "bloom"`` the private default τ = ``DEFAULT_TAU`` applies (see
    :meth:`noise`; ``tau = 1`` or ``sigma = 0`` opts out where the policy allows).
    ``privacy = "bloom"`` sends keyed Bloom filters to the coordinator (App. I); ``"off"``
    sends raw identifiers, and must be chosen explicitly. ``pool = "split"`` links each
    split's primary records only against the same split's secondary records (the FedSim
    authors' protocol on synthetic data; needs ground truth); ``"all"`` links against every
    record, as a deployment does (see ``vflink.runner.pools``).
    """

    method: str = "exact"
    unmatched: str = "drop"
    secret_env: str = "VFLINK_SECRET"
    metric: str = "euclidean"
    top_k: int = 10
    tau: float | None = None
    sigma: float | None = None
    delta: float = 1e-5
    privacy: str = "bloom"
    search: str = "auto"
    # FLORIST (psi | psu): the DH group, and for union-training simulations the fractions of
    # training records hidden from the secondary (α, synthetic features) and primary (β)
    group: str = "ristretto255"
    # psi: vflink's own DH PSI ("dh", with proofs), or an OT-extension PSI through the optional
    # engine ("rr22", "kkrt": `pip install 'vflink[rr22]'`; semi-honest only)
    protocol: str = "dh"
    alpha: float = 0.0
    beta: float = 0.0
    pool: str = "all"
    # Several fields, each with its own metric and weight, and blocking keys:
    # [[alignment.fields]] and [[alignment.blocking]] (vflink.linkage.fields)
    fields: tuple[FieldSpec, ...] = ()
    blocking: tuple[Blocking, ...] = ()
    # Decisions by a Fellegi-Sunter model the coordinator trains without labels
    # (vflink.linkage.model_link): FedSim's similarities become the protected match weights,
    # the top-1 and exact links the (one-to-one) matches
    model: str | None = None
    threshold: float = 0.5
    one_to_one: bool | str = False

    def __post_init__(self) -> None:
        problems: list[str] = []
        has_fields = bool(self.fields)  # given, even if an entry fails its own checks
        self._build_fields(problems)
        check_choice(problems, "alignment.method", self.method, ("exact", "soft", "psi", "psu"))
        check_choice(problems, "alignment.group", self.group, ("ristretto255", "modp2048"))
        check_choice(problems, "alignment.protocol", self.protocol, PSI_PROTOCOLS)
        if self.protocol != "dh" and self.method != "psi":
            problems.append(f"`alignment.protocol = {self.protocol!r}` is a PSI protocol: set "
                            f"`alignment.method = \"psi\"` (got {self.method!r})")
        check_float(problems, "alignment.alpha", self.alpha, min=0.0, max=0.99)
        check_float(problems, "alignment.beta", self.beta, min=0.0, max=0.99)
        check_choice(problems, "alignment.unmatched", self.unmatched, ("drop", "keep"))
        if not isinstance(self.secret_env, str) or not self.secret_env:
            problems.append("`alignment.secret_env` must name an environment variable")
        check_choice(problems, "alignment.metric", self.metric, LINK_METRICS)
        check_int(problems, "alignment.top_k", self.top_k, min=1)
        check_float(problems, "alignment.tau", self.tau, min=0.0, max=1.0, min_exclusive=True,
                    allow_none=True)
        check_float(problems, "alignment.sigma", self.sigma, min=0.0, allow_none=True)
        if self.tau is not None and self.sigma is not None:
            problems.append("give at most one of `alignment.tau` and `alignment.sigma`")
        check_float(problems, "alignment.delta", self.delta, min=0.0, max=1.0,
                    min_exclusive=True)
        check_choice(problems, "alignment.privacy", self.privacy, ("bloom", "off"))
        check_choice(problems, "alignment.search", self.search,
                     ("auto", "exact", "approximate"))
        check_choice(problems, "alignment.pool", self.pool, ("all", "split"))
        if self.pool == "split" and self.method != "soft":
            problems.append("`alignment.pool = \"split\"` needs `alignment.method = \"soft\"`")
        if has_fields and self.method != "soft":
            problems.append("[[alignment.fields]] link on several fields by soft linkage: set "
                            f"`alignment.method = \"soft\"` (got {self.method!r})")
        if has_fields and self.metric != "euclidean":
            problems.append(_METRIC_WITH_FIELDS)
        if self.blocking and not has_fields:
            problems.append("[[alignment.blocking]] needs [[alignment.fields]] (blocking keys "
                            "restrict a multi-field link)")
        if self.model is not None:
            check_choice(problems, "alignment.model", self.model, ("fellegi-sunter",))
            if not has_fields:
                problems.append("`alignment.model` decides a multi-field link: give "
                                "[[alignment.fields]] (a field needs no metric or weight)")
        elif has_fields and any(getattr(f, "metric", "") is None for f in self.fields):
            problems.append("every [[alignment.fields]] entry needs a `metric`, unless "
                            "`alignment.model = \"fellegi-sunter\"` chooses it from the column")
        check_probability(problems, "alignment.threshold", self.threshold)
        check_one_to_one(problems, "alignment.one_to_one", self.one_to_one)
        raise_if(problems, "[alignment] section")

    def noise(self, mode: str = "soft") -> tuple[float | None, float | None]:
        """The (tau, sigma) a soft link asks the coordinator for: the given ones, or, when the
        similarities are released privately (``privacy = "bloom"``) and neither is given, the
        private default τ (:data:`vflink.linkage.privacy.DEFAULT_TAU`, FedSim Theorem 2).
        ``mode = "exact"`` links carry no distance information and get no noise."""
        if (self.tau is None and self.sigma is None and self.privacy == "bloom"
                and mode != "exact"):
            from vflink.linkage.privacy import DEFAULT_FALLBACK_SIGMA, DEFAULT_TAU

            # both sent: σ follows from τ where the data reach it, else the fallback σ
            return DEFAULT_TAU, DEFAULT_FALLBACK_SIGMA
        return self.tau, self.sigma

    def _build_fields(self, problems: list[str]) -> None:
        """[[alignment.fields]] / [[alignment.blocking]] tables (or built specs) as frozen
        tuples of specs; every problem of every entry is collected."""
        if not self.fields and not self.blocking:
            object.__setattr__(self, "fields", ())
            object.__setattr__(self, "blocking", ())
            return
        from vflink.linkage.fields import Blocking, FieldSpec  # rapidfuzz/faiss: only if used

        for name, cls in (("fields", FieldSpec), ("blocking", Blocking)):
            entries = getattr(self, name)
            built: list[Any] = []
            if not isinstance(entries, (list, tuple)):
                problems.append(f"`alignment.{name}` must be an array of tables "
                                f"([[alignment.{name}]]), got {entries!r}")
                object.__setattr__(self, name, ())
                continue
            for i, entry in enumerate(entries):
                where = f"alignment.{name} #{i + 1}"
                if isinstance(entry, cls):
                    built.append(entry)
                    continue
                if cls is Blocking and isinstance(entry, str):  # blocking = ["postcode"]
                    entry = {"on": entry}
                if not isinstance(entry, dict):
                    problems.append(f"{where} must be a table, got {entry!r}")
                    continue
                try:  # unknown keys (the known ones named), missing ones, its checks
                    built.append(from_table(cls, entry, where))
                except ConfigError as exc:
                    problems.extend(p if p.startswith(where) else f"{where}: {p}"
                                    for p in exc.problems)
            object.__setattr__(self, name, tuple(built))


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """Model sizes; App. E keeps hidden sizes consistent across all VFL algorithms."""

    hidden: tuple[int, ...] = (100,)
    cut_dim: int = 16
    top_hidden: tuple[int, ...] = (100,)
    activation: str = "relu"
    dropout: float = 0.0
    pair_dim: int = 10
    aggregator: AggregatorConfig = field(default_factory=AggregatorConfig)
    standardize: bool = True  # z-score numeric features (False: raw, as the FedSim authors)
    #: every party's bottom model: "mlp" (``hidden``) or "cnn" (VFL-AFE's two-layer
    #: CNN is the default of ``channels`` / ``kernels``; ``image_shape`` = [C, H, W], one -1)
    bottom: str = "mlp"
    channels: tuple[int, ...] = (32, 64)
    kernels: tuple[int, ...] = (5, 5)
    image_shape: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "hidden", tuple(self.hidden))
        for name in ("channels", "kernels", "image_shape"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        object.__setattr__(self, "top_hidden", tuple(self.top_hidden))
        problems: list[str] = []
        if isinstance(self.aggregator, dict):
            try:
                object.__setattr__(self, "aggregator", from_table(
                    AggregatorConfig, self.aggregator, "[model.aggregator]"))
            except ConfigError as exc:
                problems.extend(p if p.startswith("[model.aggregator]") else
                                f"model.aggregator: {p}" for p in exc.problems)
        check_int(problems, "model.pair_dim", self.pair_dim, min=1)
        for name in ("hidden", "top_hidden"):
            for i, h in enumerate(getattr(self, name)):
                check_int(problems, f"model.{name}[{i}]", h, min=1)
        check_int(problems, "model.cut_dim", self.cut_dim, min=1)
        check_choice(problems, "model.activation", self.activation, ACTIVATIONS)
        check_float(problems, "model.dropout", self.dropout, min=0.0, max=0.95)
        check_bool(problems, "model.standardize", self.standardize)
        try:
            BottomSpec(bottom=self.bottom, channels=self.channels, kernels=self.kernels,
                       image_shape=self.image_shape)
        except ConfigError as exc:
            problems.extend("`model." + p[1:] if p.startswith("`") else f"model: {p}"
                            for p in exc.problems)
        raise_if(problems, "[model] section")


@dataclass(frozen=True, kw_only=True)
class TrainingConfig:
    """Optimisation and early stopping (App. E: stop at the best validation performance).

    ``select`` is what model selection and early stopping watch on the validation split:
    ``"auto"`` is AUC on a binary task (accuracy would keep a model that predicts only the
    majority class of a rare label), accuracy on a multi-class one, RMSE for regression; or
    ``"accuracy"``, ``"auc"``, ``"log-loss"``, ``"rmse"``, ``"r2"``. ``threshold`` is a
    binary task's decision threshold on P(positive), chosen on the validation split by its
    best ``"f1"`` or ``"balanced-accuracy"``, or a fixed probability; the run reports it and
    every split's figures at it (``metrics.json`` ``decision``); the task metrics (accuracy
    at 0.5, AUC) are as before.

    ``device`` and ``feature_store`` apply to the parties this run builds in its own process
    (a party across hosts sets its own in its party file's ``[training]``): see
    :class:`~vflink.parties.resources.TrainingResources`.
    """

    epochs: int = 30
    batch_size: int = 128
    knn_batch_size: int = 32
    optimizer: str = "adam"
    lr: float = 1e-3
    weight_decay: float = 1e-5
    patience: int = 5
    split: tuple[float, float, float] = (0.7, 0.1, 0.2)
    threads: int = 1
    device: str = DEFAULT_DEVICE
    feature_store: str = "auto"
    select: str = "auto"
    threshold: str | float = "f1"

    def __post_init__(self) -> None:
        object.__setattr__(self, "split", tuple(self.split))
        problems: list[str] = []
        check_int(problems, "training.epochs", self.epochs, min=1)
        check_int(problems, "training.batch_size", self.batch_size, min=1)
        check_int(problems, "training.knn_batch_size", self.knn_batch_size, min=1)
        check_choice(problems, "training.optimizer", self.optimizer, OPTIMIZERS)
        check_float(problems, "training.lr", self.lr, min=0.0, min_exclusive=True)
        check_float(problems, "training.weight_decay", self.weight_decay, min=0.0)
        check_int(problems, "training.patience", self.patience, min=1)
        check_int(problems, "training.threads", self.threads, min=1)
        check_choice(problems, "training.device", self.device, DEVICES)
        check_choice(problems, "training.feature_store", self.feature_store, FEATURE_STORES)
        check_choice(problems, "training.select", self.select, SELECTION)
        if isinstance(self.threshold, str):
            check_choice(problems, "training.threshold", self.threshold, THRESHOLDS)
        else:
            check_probability(problems, "training.threshold", self.threshold)
        split = self.split
        if (len(split) != 3 or not all(isinstance(v, (int, float)) and v > 0 for v in split)
                or abs(sum(split) - 1.0) > 1e-6):
            problems.append(f"`training.split` must be three positive fractions summing to 1 "
                            f"(train, validation, test), got {list(split)}")
        raise_if(problems, "[training] section")

    def resources(self) -> TrainingResources:
        """The device and feature store of the parties built in this process."""
        return TrainingResources(device=self.device, feature_store=self.feature_store)


@dataclass(frozen=True, kw_only=True)
class EvaluationConfig:
    """What a run keeps for measuring leakage afterwards (``vflink attack``).

    ``record = true``: every party stores in its own state directory a sample of what it
    received (embeddings, gradients, similarities, indices; at most ``record_rows`` rows of
    per-batch messages), and the run writes evaluation-only ground truth under
    ``evaluation/``. Recording sends nothing: the messages are the same either way.
    """

    record: bool = False
    record_rows: int = 20_000

    def __post_init__(self) -> None:
        problems: list[str] = []
        check_bool(problems, "evaluation.record", self.record)
        check_int(problems, "evaluation.record_rows", self.record_rows, min=1)
        raise_if(problems, "[evaluation] section")


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """A complete run: data, alignment, algorithm, model and training settings."""

    version: int = CONFIG_VERSION
    seed: int = 0
    algorithm: str = "splitnn"
    data: DataConfig
    alignment: AlignmentConfig = field(default_factory=AlignmentConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    #: the in-process parties' policy ([policy]); None: they release what [alignment] asks
    #: (the run file's author owns every party), see ``vflink.runner.federation``
    policy: PartyPolicy | None = None
    evaluation: EvaluationConfig = field(default_factory=EvaluationConfig)
    privacy: PrivacyConfig = field(default_factory=PrivacyConfig)
    #: where this run's chunked stages run ([compute]: engine, address, num_cpus, chunk_rows)
    compute: ComputeConfig = field(default_factory=ComputeConfig)

    def __post_init__(self) -> None:
        problems: list[str] = []
        if self.version != CONFIG_VERSION:
            problems.append(f"`version` must be {CONFIG_VERSION}, got {self.version!r}")
        check_int(problems, "seed", self.seed, min=0)
        check_choice(problems, "algorithm", self.algorithm, ALGORITHMS)
        problems.extend(_policy_conflicts(self.alignment, self.policy))
        raise_if(problems, "run configuration")

    def replace(self, **changes: Any) -> RunConfig:
        return dataclasses.replace(self, **changes)


def _policy_conflicts(alignment: AlignmentConfig, policy: PartyPolicy | None) -> list[str]:
    """What the in-process parties' [policy] would refuse of [alignment], found at load time."""
    if not isinstance(alignment, AlignmentConfig) or alignment.method != "soft":
        return []
    problems = []
    limit = (policy or PartyPolicy()).max_top_k  # the limits hold without a [policy] too
    if isinstance(alignment.top_k, int) and alignment.top_k > limit:
        raise_limit = ("raise it with [policy] max_top_k" if policy is not None else
                       "raise it with a [policy] section holding max_top_k (its other keys "
                       "then take the private defaults)")
        problems.append(f"alignment.top_k = {alignment.top_k} is more than the coordinator "
                        f"accepts (policy.max_top_k = {limit}): give top_k ≤ {limit} (FedSim "
                        f"uses K ≤ 100), or {raise_limit}")
    if policy is None:
        return problems
    if alignment.privacy == "off" and policy.identifiers != "any":
        problems.append('alignment.privacy = "off" sends raw identifiers, which [policy] '
                        'refuses; set policy.identifiers = "any" to opt out')
    tau, sigma = alignment.noise()
    if policy.requires_noise and (
            (tau is None and sigma is None)
            or (sigma is None and tau is not None and tau > policy.max_tau * (1 + 1e-9))
            or (tau is None and sigma is not None and (
                sigma < policy.min_sigma or (sigma == 0 and policy.max_tau < 1)))):
        asked = ("no noise" if tau is None and sigma is None else
                 f"tau = {tau:g}" if tau is not None else f"sigma = {sigma:g}")
        problems.append(f"[policy] requires noise on similarities (asked: {asked}): set "
                        f"alignment.tau (at most {policy.max_tau:g}) or alignment.sigma (at "
                        f"least {policy.min_sigma:g}), or leave both out for the private "
                        "default (privacy = \"bloom\")")
    return problems


_SECTIONS: dict[str, type] = {"alignment": AlignmentConfig, "model": ModelConfig,
                              "training": TrainingConfig, "evaluation": EvaluationConfig,
                              "privacy": PrivacyConfig, "compute": ComputeConfig}


def _build(cls: type, raw: Any, where: str, problems: list[str]) -> Any:
    """``cls`` from the table ``[where]``; its problems (unknown keys with the known ones and a
    guess for a typo, missing keys, the values' own checks) go to ``problems``."""
    found = table_problems(cls, raw, f"[{where}]")
    problems.extend(found)
    if not isinstance(raw, dict) or any("needs key" in p for p in found):
        return None
    known = {f.name for f in dataclasses.fields(cls)}
    try:  # the known keys are still checked, so that every problem is said at once
        return cls(**{k: v for k, v in raw.items() if k in known})
    except ConfigError as exc:  # named by its table: several parties have the same keys
        problems.extend(p if p.startswith(f"[{where}]") else f"[{where}]: {p}"
                        for p in exc.problems)
    return None


def _alignment_conflicts(section: dict[str, Any], problems: list[str]) -> dict[str, Any]:
    """[alignment] keys that contradict [[alignment.fields]], said plainly (and removed, so
    that they are not reported a second time as unknown keys)."""
    section = dict(section)
    for key in ("on", "secondary_on"):
        if key in section:
            section.pop(key)
            problems.append(
                f"`alignment.{key}` is not a setting: one field links on each party's "
                "`identifiers` columns; to name columns per field use [[alignment.fields]] "
                "with `on` (and `secondary_on` when the secondary names them differently)")
    if section.get("fields") and "metric" in section:
        section.pop("metric")
        problems.append(_METRIC_WITH_FIELDS)
    return section


def parse_config(raw: dict[str, Any], base_dir: Path | None = None) -> RunConfig:
    """Build a :class:`RunConfig` from parsed TOML, collecting every problem before raising."""
    problems: list[str] = []
    top_known = {"version", "seed", "algorithm", "data", "policy", *_SECTIONS}
    unknown = sorted(set(raw) - top_known)
    if unknown:
        problems.append(f"unknown top-level key(s) {unknown}; known: {sorted(top_known)}")
    if "version" not in raw:
        problems.append(f"the file needs `version = {CONFIG_VERSION}`")
    sections: dict[str, Any] = {}
    for name, cls in _SECTIONS.items():
        if name in raw:
            section = raw[name]
            if name == "alignment" and isinstance(section, dict):
                section = _alignment_conflicts(section, problems)
            sections[name] = _build(cls, section, name, problems)
    if raw.get("policy") is not None:  # config.json writes null when the file had none
        sections["policy"] = _build(PartyPolicy, raw["policy"], "policy", problems)
    data = None
    raw_data = raw.get("data")
    if raw_data is None:
        problems.append("the file needs a [data] section")
    elif not isinstance(raw_data, dict):
        problems.append("[data] must be a table")
    else:
        parties = []
        party_failed = False
        for i, p in enumerate(raw_data.get("parties", [])):
            if not isinstance(p, dict):
                problems.append(f"[[data.parties]] #{i + 1} must be a table")
                continue
            p = dict(p)
            if "path" in p and base_dir is not None and not Path(p["path"]).is_absolute():
                p["path"] = str(base_dir / p["path"])
            schema = _build(PartySchema, p, f"data.parties #{i + 1}", problems)
            if schema is not None:
                parties.append(schema)
            else:
                party_failed = True
        extra = sorted(set(raw_data) - {"dataset", "options", "parties"})
        if extra:
            problems.append(f"[data] has unknown key(s) {extra}; known: dataset, options, parties")
        options = dict(raw_data.get("options", {}))
        if isinstance(options.get("path"), str) and base_dir is not None:
            # a dataset's own file (e.g. imdb-movies) resolves against the run file, like
            # [[data.parties]] paths do
            options["path"] = str((base_dir / options["path"]).resolve())
        try:
            data = DataConfig(dataset=raw_data.get("dataset"), options=options,
                              parties=tuple(parties))
        except ConfigError as exc:
            # A party that failed its own checks is missing from ``parties``: counting roles
            # then would add a spurious "needs exactly one primary party" to its real problem.
            if not party_failed:
                problems.extend(exc.problems)
    top: dict[str, Any] = {k: raw[k] for k in ("version", "seed", "algorithm") if k in raw}
    if not problems:
        try:
            return RunConfig(data=data, **top, **sections)  # type: ignore[arg-type]
        except ConfigError as exc:
            problems.extend(exc.problems)
    else:  # still validate the top-level values, to report them together
        try:
            RunConfig(data=DataConfig(dataset="-"), **{k: v for k, v in top.items()})
        except ConfigError as exc:
            problems.extend(exc.problems)
        except VflinkError:
            pass
    raise_if(problems, "configuration")
    raise ConfigError("invalid configuration", problems)  # pragma: no cover


def load_config(path: Path) -> RunConfig:
    """Read and validate a TOML run file."""
    path = Path(path)
    raw = read_toml(path)
    try:
        return parse_config(raw, base_dir=path.parent.resolve())
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}", exc.problems) from None


def config_to_dict(config: RunConfig) -> dict[str, Any]:
    """A JSON/TOML-friendly dict of the resolved configuration."""

    def convert(v: Any) -> Any:
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            return {f.name: convert(getattr(v, f.name)) for f in dataclasses.fields(v)}
        if isinstance(v, (tuple, list)):
            return [convert(x) for x in v]
        if isinstance(v, dict):
            return {str(k): convert(x) for k, x in v.items()}
        if isinstance(v, Path):
            return str(v)
        if hasattr(v, "value"):  # enums
            return v.value
        return v

    out = convert(config)
    for party in (out.get("data") or {}).get("parties") or []:
        for name in ("delimiter", "encoding", "decimal"):  # defaults: as the file had them
            if party.get(name) is None:
                party.pop(name, None)
    alignment = out.get("alignment")
    if isinstance(alignment, dict):
        if alignment.get("fields"):
            alignment.pop("metric", None)  # each field has its own; parse_config refuses both
        for name in ("fields", "blocking"):  # as the file had them: an absent array stays absent
            if not alignment.get(name):
                alignment.pop(name, None)
    return out  # type: ignore[no-any-return]
