"""Validation helpers shared by the frozen config dataclasses (ARCHITECTURE.md, convention 6).

Each helper appends a human-readable problem to a list instead of raising, so a config reports
all of its problems at once; :func:`raise_if` raises one :class:`ConfigError` carrying them all.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection, Sequence
from typing import Any, TypeVar

from vflink.errors import ConfigError

T = TypeVar("T")

__all__ = [
    "check_bool",
    "check_choice",
    "check_float",
    "check_int",
    "check_one_to_one",
    "check_probability",
    "check_str_tuple",
    "column_order_warning",
    "from_table",
    "raise_if",
    "table_problems",
]


def check_int(problems: list[str], name: str, value: object, *, min: int | None = None,
              max: int | None = None) -> None:
    ok = isinstance(value, int) and not isinstance(value, bool)
    if ok and min is not None and value < min:  # type: ignore[operator]
        ok = False
    if ok and max is not None and value > max:  # type: ignore[operator]
        ok = False
    if not ok:
        bounds = []
        if min is not None:
            bounds.append(f"≥ {min}")
        if max is not None:
            bounds.append(f"≤ {max}")
        problems.append(f"`{name}` must be an int {' and '.join(bounds)}, got {value!r}".replace(
            "an int  ,", "an int,"))


def check_float(problems: list[str], name: str, value: object, *, min: float | None = None,
                max: float | None = None, min_exclusive: bool = False,
                allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if ok and not math.isfinite(float(value)):  # type: ignore[arg-type]
        ok = False
    if ok and min is not None:
        v = float(value)  # type: ignore[arg-type]
        ok = v > min if min_exclusive else v >= min
    if ok and max is not None and float(value) > max:  # type: ignore[arg-type]
        ok = False
    if not ok:
        bounds = []
        if min is not None:
            bounds.append(f"{'>' if min_exclusive else '≥'} {min}")
        if max is not None:
            bounds.append(f"≤ {max}")
        suffix = (" " + " and ".join(bounds)) if bounds else ""
        problems.append(f"`{name}` must be a finite number{suffix}, got {value!r}")


def check_bool(problems: list[str], name: str, value: object) -> None:
    """A switch: true or false (not 0 or 1, nor a string)."""
    if not isinstance(value, bool):
        problems.append(f"`{name}` must be true or false, got {value!r}")


def check_choice(problems: list[str], name: str, value: object, choices: Collection[str]) -> None:
    if value not in choices:
        problems.append(f"`{name}` must be one of {', '.join(sorted(choices))}, got {value!r}")


def check_probability(problems: list[str], name: str, value: object) -> None:
    """A probability strictly inside (0, 1) (a decision threshold)."""
    if not (isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < 1):
        problems.append(f"`{name}` must be a probability in (0, 1), got {value!r}")


def check_one_to_one(problems: list[str], name: str, value: object) -> None:
    """A one-to-one choice: true, false, "optimal" or "greedy"."""
    if not (isinstance(value, bool) or value in ("optimal", "greedy")):
        problems.append(f"`{name}` must be true, false, \"optimal\" or \"greedy\", got "
                        f"{value!r}")


def check_str_tuple(problems: list[str], name: str, value: object) -> None:
    if not isinstance(value, tuple) or not all(isinstance(v, str) and v for v in value):
        problems.append(f"`{name}` must be a list of non-empty column names, got {value!r}")


def raise_if(problems: Sequence[str], what: str) -> None:
    if problems:
        if len(problems) == 1:
            raise ConfigError(f"invalid {what}: {problems[0]}", problems)
        listing = "\n  - ".join(problems)
        raise ConfigError(f"invalid {what} ({len(problems)} problems):\n  - {listing}", problems)


def from_table(cls: type[T], raw: Any, where: str, *, what: str | None = None) -> T:
    """The frozen config dataclass ``cls`` built from a TOML table (``where`` names it, e.g.
    ``[compute]``), with every problem at once: unknown keys (listing the known ones) and the
    dataclass's own validation."""
    problems = table_problems(cls, raw, where)
    if not any("needs key" in p or "must be a table" in p for p in problems):
        known = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        try:  # the known keys' own problems too, in the same error
            config = cls(**{k: v for k, v in raw.items() if k in known})
        except ConfigError as exc:
            problems.extend(exc.problems)
        except (TypeError, ValueError) as exc:  # a value of a kind its checks did not expect
            problems.append(f"{where}: a value of the wrong kind ({exc})")
        else:
            if not problems:
                return config
    raise_if(problems, what or f"{where} section")
    raise ConfigError(f"invalid {where} section", problems)  # pragma: no cover - raise_if did


def table_problems(cls: type, raw: Any, where: str) -> list[str]:
    """What keeps the table ``raw`` from building the config dataclass ``cls``: not a table,
    unknown keys (the known ones listed, the likeliest named for a typo), required keys left
    out. Empty when ``cls(**raw)`` may be called (its own validation then speaks).

    A key of an earlier version that ``cls`` lists in a ``RETIRED_KEYS`` mapping (key → what
    to write instead) is refused with that sentence rather than as unknown."""
    import difflib

    if not isinstance(raw, dict):
        return [f"{where} must be a table, got {type(raw).__name__}"]
    fields = [f for f in dataclasses.fields(cls) if f.init]  # type: ignore[arg-type]
    known = sorted(f.name for f in fields)
    retired: dict[str, str] = dict(getattr(cls, "RETIRED_KEYS", {}))
    problems = [retired[k] for k in sorted(map(str, raw)) if k in retired]
    unknown = sorted(map(str, set(raw) - set(known) - set(retired)))
    if unknown:
        guesses = [f"{c[0]!r} for {k!r}" for k in unknown
                   if (c := difflib.get_close_matches(k, known, n=1))]
        hint = f" (did you mean {', '.join(guesses)}?)" if guesses else ""
        problems.append(f"{where} has unknown key(s) {unknown}{hint}; known keys: "
                        f"{known or 'none'}")
    required = [f.name for f in fields if f.default is dataclasses.MISSING
                and f.default_factory is dataclasses.MISSING]
    missing = [k for k in required if k not in raw]
    if missing:
        problems.append(f"{where} needs key(s) {missing}; known keys: {known}")
    return problems


def column_order_warning(on: Sequence[str], secondary_on: Sequence[str], *,
                         what: str = "identifier") -> str | None:
    """A warning when the two sides name the same columns in another order (``lon,lat`` on
    one side, ``lat,lon`` on the other): columns are paired by position, so the link would
    compare one side's longitude with the other's latitude without a word. None otherwise."""
    on, secondary_on = [str(c) for c in on], [str(c) for c in secondary_on]
    moved = [c for i, c in enumerate(on)
             if c in secondary_on and i < len(secondary_on) and secondary_on[i] != c]
    if not moved:
        return None
    pairs = ", ".join(f"{a} ↔ {b}" for a, b in zip(on, secondary_on))
    return (f"the primary's {what} columns {on} and the secondary's {secondary_on} name the "
            f"same column(s) {moved} at other positions; columns are paired by position "
            f"({pairs}), so each is compared with another column. If that is not meant, give "
            f"both sides in the same order (e.g. --secondary-on {','.join(on)})")
