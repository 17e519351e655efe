"""A party's own configuration for runs across hosts (``vflink serve``, ``vflink train --party``).

::

    version = 1
    [party]
    name = "bank"                  # must match the certificate identity (a DNS label)
    role = "secondary"             # secondary | coordinator | primary
    listen = "127.0.0.1:50061"     # where a secondary or the coordinator serves
    state_dir = "state/bank"       # this party's checkpoints and models
    deadline_s = 60                # every call to a peer fails after this long
    seed = 0                       # coordinator only, with [privacy] reproducible_noise = true:
                                   # seeds its similarity noise (NOT private; default: secret)
    record = false                 # keep a sample of what this party receives (vflink attack)

    [party.table]                  # this party's data (like one [[data.parties]] entry)
    path = "bank.csv"
    key = ["id"]
    numeric = ["income"]
    # or: dataset = "sklearn-small" with [party.options]; the party takes its own table

    [peers.coordinator]            # parties this party calls
    address = "127.0.0.1:50060"
    role = "coordinator"

    [security]
    tls_dir = "certs"              # ca.pem, <name>.pem, <name>.key from `vflink certs`
    allowed = ["primary"]          # who may call this party (pinned certificate identities)
    insecure = false               # plaintext: local experiments only
    secret_env = "VFLINK_SECRET"   # the data parties' shared secret
    # roles of the callers that are not among [peers] (a secondary's one unlisted caller is
    # its primary; a coordinator should list them all):
    # roles = { primary = "primary", bank = "secondary" }

    [policy]                       # what this party releases and its limits (private defaults)
    identifiers = "bloom"          # "any" also releases raw identifiers (explicit opt-out)
    min_sigma = 0.0                # coordinator: smallest similarity noise σ it releases
    max_tau = 0.9999               # coordinator: largest greedy-attack bound τ (1 = no noise)
    max_pending_batches = 8        # see vflink.parties.policy.PartyPolicy for every key

    [compute]                      # where this party's chunked stages run; its
    engine = "ray"                 # cluster stays inside the party: never sent to a peer
    address = "local"              # "local" (start one here), "auto" or the head's host:port
    num_cpus = 4                   # CPUs of a cluster started here
    chunk_rows = 100000            # rows per task

    [psi]                          # the optional PSI engine's link (RR22, KKRT: `pip install
                                   # 'vflink[rr22]'`), each party its own; never from a peer
    listen = "127.0.0.1:50071"     # where this party's engine listens (both parties listen and
                                   # dial; mutual TLS from [security]'s certificates)
    advertise = "bank.example:50071"  # the address its peer dials (default: listen)
    connect_s = 30                 # how long the link tries to reach the peer
    # tls = true                   # default: mutual TLS unless security.insecure; false: a
                                   # plaintext engine link (a private network only); both
                                   # parties must agree (a mismatch is refused at once)

    [training]                     # where this party trains; never sent to a peer
    device = "cpu"                 # "cpu", "cuda" or "auto" (CUDA where there is one)
    feature_store = "auto"         # "memory", "mmap" (per batch from a mapped Arrow file) or
                                   # "auto" (mmap from 10^6 rows); results are the same

    [privacy]                      # secondary: its own embedding protection (VFL-AFE);
    embeddings = "afe"             # same keys as a run file's [privacy]; a run that expects
    epsilon = 2.0                  # other settings is refused
    reproducible_noise = false     # any role: true seeds this party's noise (with `seed`; a
                                   # coordinator: `party.seed`): NOT private, simulations only
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vflink._checks import check_choice, check_float, check_int, from_table, raise_if
from vflink.config import read_toml
from vflink.data.schema import PartySchema
from vflink.data.streamed import open_table
from vflink.data.table import PartyTable, load_table
from vflink.datasets import load_dataset
from vflink.engine import ComputeConfig
from vflink.errors import ConfigError
from vflink.parties.policy import ROLE_UNKNOWN, PartyPolicy
from vflink.parties.resources import TrainingResources
from vflink.privacy.config import PrivacyConfig

__all__ = ["PartyConfig", "PeerConfig", "PsiLinkConfig", "load_party_config", "party_roles",
           "party_table"]

ROLES = ("primary", "secondary", "coordinator")


@dataclass(frozen=True, kw_only=True)
class PeerConfig:
    name: str
    address: str
    role: str


@dataclass(frozen=True, kw_only=True)
class PsiLinkConfig:
    """``[psi]``: where this party's PSI engine listens, the address its peer dials, and how
    long the link tries to reach the peer (:mod:`vflink.alignment.engine`)."""

    listen: str
    advertise: str | None = None
    connect_s: float = 30.0
    #: mutual TLS on the engine's link: None follows [security] (TLS unless insecure)
    tls: bool | None = None

    def __post_init__(self) -> None:
        from vflink.alignment.engine import check_endpoints

        problems: list[str] = []
        if self.tls is not None and not isinstance(self.tls, bool):
            problems.append(f"psi.tls must be true or false, got {self.tls!r}")
        check_endpoints(problems, self.listen, self.advertise)
        check_float(problems, "psi.connect_s", self.connect_s, min=0.0, min_exclusive=True)
        raise_if(problems, "[psi] section")


@dataclass(frozen=True, kw_only=True)
class PartyConfig:
    name: str
    role: str
    listen: str | None = None
    state_dir: Path | None = None
    deadline_s: float = 60.0
    seed: int | None = None
    table: PartySchema | None = None
    dataset: str | None = None
    dataset_options: dict[str, Any] = field(default_factory=dict)
    peers: tuple[PeerConfig, ...] = ()
    tls_dir: Path | None = None
    allowed: tuple[str, ...] = ()
    insecure: bool = False
    secret_env: str = "VFLINK_SECRET"
    source: str = "party.toml"
    caller_roles: dict[str, str] = field(default_factory=dict)
    policy: PartyPolicy = field(default_factory=PartyPolicy)
    record: bool = False
    privacy: PrivacyConfig | None = None
    compute: ComputeConfig = field(default_factory=ComputeConfig)
    #: this party's device and feature store ([training]; unset: the defaults, or for the
    #: primary its run file's [training] keys)
    training: TrainingResources | None = None
    #: this party's PSI engine link ([psi]); None: it runs no engine PSI
    psi: PsiLinkConfig | None = None

    def __post_init__(self) -> None:
        problems: list[str] = []
        for caller, role in self.caller_roles.items():
            check_choice(problems, f"security.roles.{caller}", role, ROLES)
        unresolved = [a for a in self.allowed if a not in self._known_roles()]
        if self.role == "secondary" and len(unresolved) > 1:
            problems.append(f"a secondary that accepts calls from {unresolved} must say which "
                            "is its primary: `roles = { name = \"primary\", ... }` in "
                            "[security]")
        check_choice(problems, "party.role", self.role, ROLES)
        check_float(problems, "party.deadline_s", self.deadline_s, min=0.0, min_exclusive=True)
        reproducible = self.privacy is not None and self.privacy.reproducible_noise
        if self.seed is not None:
            check_int(problems, "party.seed", self.seed, min=0)
            if not reproducible:
                problems.append("`party.seed` seeds the coordinator's similarity noise, which "
                                "is secret unless `[privacy] reproducible_noise = true` (not "
                                "private: whoever knows the seed regenerates the noise); "
                                "remove it, or turn the switch on for a simulation")
        if (reproducible and self.role == "secondary" and self.privacy is not None
                and self.privacy.enabled and self.privacy.seed is None):
            problems.append("`[privacy] reproducible_noise = true` on a served secondary that "
                            "protects its embeddings needs its own `privacy.seed` (never one a "
                            "peer sends)")
        if self.role in ("secondary", "coordinator") and not self.listen:
            problems.append(f"a {self.role} party needs `party.listen` (host:port)")
        if self.role == "secondary" and self.table is None and self.dataset is None:
            problems.append("a secondary party needs [party.table] or `party.dataset`")
        if not self.insecure and self.tls_dir is None:
            problems.append("set `security.tls_dir` (certificates from `vflink certs`), or "
                            "`security.insecure = true` for a local plaintext experiment")
        if self.psi is not None and self.psi.tls and self.tls_dir is None:
            problems.append("`psi.tls = true` needs `security.tls_dir` (the engine's link uses "
                            "the party's certificates from `vflink certs`)")
        roles = [p.role for p in self.peers]
        if self.role == "primary" and roles.count("coordinator") != 1:
            problems.append("the primary needs exactly one peer with role = \"coordinator\"")
        if self.role == "secondary" and "coordinator" not in roles:
            problems.append("a secondary needs the coordinator among its [peers]")
        for peer in self.peers:
            check_choice(problems, f"peers.{peer.name}.role", peer.role, ROLES)
            if ":" not in peer.address:
                problems.append(f"peers.{peer.name}.address must be host:port, got "
                                f"{peer.address!r}")
        raise_if(problems, f"party file {self.source}")

    def _known_roles(self) -> dict[str, str]:
        return {**{p.name: p.role for p in self.peers}, **self.caller_roles,
                self.name: self.role}

    @property
    def roles(self) -> dict[str, str]:
        """Every party this one knows, with its role (see :func:`party_roles`)."""
        return party_roles(self)

    @property
    def coordinator(self) -> str | None:
        return next((p.name for p in self.peers if p.role == "coordinator"), None)

    @property
    def secondaries(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.peers if p.role == "secondary")

    @property
    def addresses(self) -> dict[str, str]:
        return {p.name: p.address for p in self.peers}


def load_party_config(path: Path) -> PartyConfig:
    """Read and validate a party file; relative paths are resolved against its directory."""
    path = Path(path)
    raw = read_toml(path, "party file")
    base = path.parent.resolve()
    problems: list[str] = []
    if raw.get("version") != 1:
        problems.append("the file needs `version = 1`")
    party = dict(raw.get("party", {}))
    security = dict(raw.get("security", {}))
    unknown = sorted(set(raw) - {"version", "party", "peers", "security", "policy",
                                  "privacy", "compute", "training", "psi"})
    if unknown:
        problems.append(f"unknown top-level key(s) {unknown}; known: party, peers, security, "
                        "policy, privacy, compute, training, psi")
    psi_link = None
    if "psi" in raw:
        try:
            psi_link = from_table(PsiLinkConfig, raw["psi"], "[psi]")
        except ConfigError as exc:
            problems.extend(exc.problems)
    compute = ComputeConfig()
    if "compute" in raw:
        try:
            compute = ComputeConfig.from_dict(raw["compute"])
        except ConfigError as exc:
            problems.extend(exc.problems)
    training = None
    if "training" in raw:
        try:
            training = TrainingResources.from_dict(raw["training"])
        except ConfigError as exc:
            problems.extend(exc.problems)
    policy = PartyPolicy()
    policy_raw = raw.get("policy", {})
    if not isinstance(policy_raw, dict):
        problems.append("[policy] must be a table")
    else:
        try:  # unknown keys (the known ones named, a typo guessed) and the values' checks
            policy = from_table(PartyPolicy, policy_raw, "[policy]")
        except ConfigError as exc:
            problems.extend(exc.problems)
    roles_raw = security.get("roles", {})
    if not isinstance(roles_raw, dict):
        problems.append("[security] roles must be a table of party name = role")
        roles_raw = {}
    privacy = None
    if "privacy" in raw:
        try:
            privacy = from_table(PrivacyConfig, raw["privacy"], "[privacy]")
        except ConfigError as exc:
            problems.extend(exc.problems)

    def resolve(p: Any) -> Path | None:
        if p is None:
            return None
        q = Path(p)
        return q if q.is_absolute() else base / q

    schema = None
    table_raw = party.pop("table", None)
    if table_raw is not None:
        t = dict(table_raw)
        t.setdefault("name", party.get("name", ""))
        t.setdefault("role", party.get("role", ""))
        if "path" in t:
            t["path"] = str(resolve(t["path"]))
        try:
            schema = from_table(PartySchema, t, "[party.table]")
        except ConfigError as exc:
            problems.extend(p if p.startswith("[party.table]") else f"[party.table]: {p}"
                            for p in exc.problems)
    peers = []
    for name, p in dict(raw.get("peers", {})).items():
        if not isinstance(p, dict) or "address" not in p or "role" not in p:
            problems.append(f"[peers.{name}] needs `address` and `role`")
            continue
        peers.append(PeerConfig(name=name, address=str(p["address"]), role=str(p["role"])))
    known_party = {"name", "role", "listen", "state_dir", "deadline_s", "seed", "dataset",
                   "options", "record"}
    extra = sorted(set(party) - known_party)
    if extra:
        problems.append(f"[party] has unknown key(s) {extra}; known: {sorted(known_party)}")
    extra = sorted(set(security) - {"tls_dir", "allowed", "insecure", "secret_env", "roles"})
    if extra:
        problems.append(f"[security] has unknown key(s) {extra}")
    if problems:
        raise_if(problems, f"party file {path}")
    try:
        return PartyConfig(
            name=str(party.get("name", "")), role=str(party.get("role", "")),
            listen=party.get("listen"), state_dir=resolve(party.get("state_dir")),
            deadline_s=float(party.get("deadline_s", 60.0)), seed=party.get("seed"),
            table=schema, dataset=party.get("dataset"),
            dataset_options=_resolve_path_option(dict(party.get("options", {})), base),
            peers=tuple(peers),
            tls_dir=resolve(security.get("tls_dir")),
            allowed=tuple(security.get("allowed", ())),
            insecure=bool(security.get("insecure", False)),
            secret_env=str(security.get("secret_env", "VFLINK_SECRET")), source=str(path),
            caller_roles={str(k): str(v) for k, v in roles_raw.items()}, policy=policy,
            record=bool(party.get("record", False)), privacy=privacy, compute=compute,
            training=training, psi=psi_link)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}", exc.problems) from None


def _resolve_path_option(options: dict[str, Any], base: Path) -> dict[str, Any]:
    """A dataset's own file (``options.path``) resolves against the party file."""
    if isinstance(options.get("path"), str):
        options["path"] = str((base / options["path"]).resolve())
    return options


def party_roles(config: PartyConfig) -> dict[str, str]:
    """The role of every party this one knows: itself, its [peers], ``security.roles``, and
    the callers in ``allowed`` without a stated role: a secondary's single such caller is its
    primary; a coordinator's are data parties of unknown role (``"data"``), which may submit
    and may link only the sessions they opened (:class:`~vflink.parties.CoordinatorParty`)."""
    known = config._known_roles()
    unresolved = [a for a in config.allowed if a not in known]
    for caller in unresolved:
        if config.role == "secondary" and len(unresolved) == 1:
            known[caller] = "primary"
        else:
            known[caller] = ROLE_UNKNOWN
    return known


def party_table(config: PartyConfig) -> PartyTable:
    """This party's own table: from its file, or its part of a built-in dataset."""
    if config.table is not None:
        if config.role == "secondary":
            # a large table (or feature_store = "mmap") is read in record batches, never whole
            # so that its memory stays flat: its training reads it per batch into its mapped
            # feature file
            store = config.training.feature_store if config.training is not None else "auto"
            return open_table(config.table, store=store)
        return load_table(config.table)
    if config.dataset is None:
        raise ConfigError(f"party {config.name!r} has no data")
    ds = load_dataset(config.dataset, **config.dataset_options)
    for table in ds.parties:
        if table.name == config.name:
            return table
    raise ConfigError(f"dataset {config.dataset!r} has no party named {config.name!r}; its "
                      f"parties are {[t.name for t in ds.parties]}")
