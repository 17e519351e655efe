"""The schema of one party's table: which columns are keys, identifiers, features and label."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from vflink._checks import check_bool, check_choice, check_str_tuple, raise_if
from vflink.types import Task

__all__ = ["DELIMITERS", "ROLES", "PartySchema", "check_decimal", "check_delimiter",
           "check_encoding", "parse_delimiter"]

ROLES = ("primary", "secondary")

#: Delimiters a CSV file may use; detected among these when none is given.
DELIMITERS = (",", ";", "\t", "|")
#: How a delimiter may be spelt where a tab is hard to type (a shell, a TOML basic string).
_DELIMITER_NAMES = {"\\t": "\t", "tab": "\t", "comma": ",", "semicolon": ";", "pipe": "|"}


def parse_delimiter(value: object) -> str | None:
    """``value`` as a one-character delimiter (``"\\t"`` and ``"tab"`` mean a tab); ``None``
    when it is not one."""
    if not isinstance(value, str):
        return None
    value = _DELIMITER_NAMES.get(value.lower(), value)
    return value if len(value) == 1 and value not in "\"\r\n" else None


def check_delimiter(problems: list[str], name: str, value: object) -> None:
    """A delimiter option: one character such as ``","``, ``";"``, ``"\\t"`` or ``"|"``."""
    if value is not None and parse_delimiter(value) is None:
        problems.append(f"`{name}` must be one character such as \",\", \";\", \"\\t\" (tab) "
                        f"or \"|\", got {value!r}")


def check_decimal(problems: list[str], name: str, value: object) -> None:
    """A decimal mark: ``"."`` (the default) or ``","``."""
    if value is not None and value not in (".", ","):
        problems.append(f"`{name}` must be \".\" or \",\", got {value!r}")


def check_encoding(problems: list[str], name: str, value: object) -> None:
    """A text encoding Python knows (``"utf-8"``, ``"latin-1"``, ``"cp1252"``...)."""
    import codecs

    if value is None:
        return
    try:
        if not isinstance(value, str):
            raise LookupError(value)
        codecs.lookup(value)
    except LookupError:
        problems.append(f"`{name}` must be a text encoding such as \"utf-8\", \"latin-1\" or "
                        f"\"cp1252\", got {value!r}")


@dataclass(frozen=True, kw_only=True)
class PartySchema:
    """Describes a party's table.

    Attributes:
        name: the party's name (``"primary"``, ``"bank"``...), unique within a run.
        role: ``"primary"`` (holds the label) or ``"secondary"``.
        key: column(s) forming an exact record key, used by exact alignment (may be empty).
        identifiers: columns used for fuzzy linkage (coordinates, names, titles); never features.
        numeric: numeric feature columns.
        categorical: categorical feature columns.
        label: label column (primary only).
        task: learning task of the label (primary only).
        path: where the table is read from, if it comes from a file.
        identifiers_as_features: let identifier columns also be features (numeric or
            categorical); they then cross the boundary inside the embeddings as well.
        delimiter: the CSV file's delimiter; ``None`` detects it among ``, ; \\t |``.
        encoding: the CSV file's text encoding; ``None`` is UTF-8 (a byte-order mark is
            skipped).
        decimal: the CSV file's decimal mark, ``","`` for ``1,5``; ``None`` is ``"."``.
    """

    name: str
    role: str
    key: tuple[str, ...] = ()
    identifiers: tuple[str, ...] = ()
    numeric: tuple[str, ...] = ()
    categorical: tuple[str, ...] = ()
    label: str | None = None
    task: Task | None = None
    path: Path | None = None
    extra: dict[str, str] = field(default_factory=dict)
    identifiers_as_features: bool = False
    delimiter: str | None = None
    encoding: str | None = None
    decimal: str | None = None

    def __post_init__(self) -> None:
        for name in ("key", "identifiers", "numeric", "categorical"):
            v = getattr(self, name)
            if isinstance(v, (list, str)):
                object.__setattr__(self, name, (v,) if isinstance(v, str) else tuple(v))
        if self.path is not None and not isinstance(self.path, Path):
            object.__setattr__(self, "path", Path(self.path))
        problems: list[str] = []
        if not isinstance(self.name, str) or not self.name.isidentifier():
            problems.append(f"`name` must be a simple identifier, got {self.name!r}")
        check_choice(problems, "role", self.role, ROLES)
        for name in ("key", "identifiers", "numeric", "categorical"):
            check_str_tuple(problems, name, getattr(self, name))
        check_delimiter(problems, "delimiter", self.delimiter)
        if self.delimiter is not None and parse_delimiter(self.delimiter) is not None:
            object.__setattr__(self, "delimiter", parse_delimiter(self.delimiter))
        check_encoding(problems, "encoding", self.encoding)
        check_decimal(problems, "decimal", self.decimal)
        if self.role == "primary":
            if not self.label:
                problems.append("the primary party needs a `label` column")
            if self.task is None:
                problems.append("the primary party needs a `task` (binary, multiclass, regression)")
            else:
                try:
                    object.__setattr__(self, "task", Task.parse(self.task))
                except Exception as exc:  # ConfigError from Task.parse
                    problems.append(str(exc))
        elif self.role == "secondary":
            # A label on a secondary party is a data problem, reported by ``validate_frame``
            # as a DataError naming the file and column (labels never leave the primary).
            if self.task is not None:
                try:
                    object.__setattr__(self, "task", Task.parse(self.task))
                except Exception as exc:
                    problems.append(str(exc))
        cols = [*self.key, *self.identifiers, *self.numeric, *self.categorical]
        if self.label:
            cols.append(self.label)
        feats = [*self.numeric, *self.categorical]
        dup = sorted({c for c in feats if feats.count(c) > 1})
        if dup:
            problems.append(f"columns listed twice among features: {dup}")
        check_bool(problems, "identifiers_as_features", self.identifiers_as_features)
        # An identifier may also be a feature only when the user says so: its values then
        # cross the party boundary inside the embeddings too (the ledger notes it).
        shared = set() if self.identifiers_as_features is True else set(self.identifiers)
        overlap = sorted(set(feats) & ({self.label} | shared | set(self.key)))
        if overlap:
            hint = ("" if self.identifiers_as_features is True or not
                    set(overlap) & set(self.identifiers) else
                    "; set `identifiers_as_features = true` to use an identifier as a feature")
            problems.append(f"feature columns may not also be key/identifier/label: {overlap}"
                            + hint)
        raise_if(problems, f"schema for party {self.name!r}")

    @property
    def features(self) -> tuple[str, ...]:
        return (*self.numeric, *self.categorical)

    @property
    def columns(self) -> tuple[str, ...]:
        """Every column the schema names, in a stable order without repeats."""
        seen: dict[str, None] = {}
        for c in (*self.key, *self.identifiers, *self.numeric, *self.categorical):
            seen[c] = None
        if self.label:
            seen[self.label] = None
        return tuple(seen)
