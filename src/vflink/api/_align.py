"""``vflink.align``: exact-key alignment, private set intersection or private set union of two
tables, from Python.

A thin layer over :mod:`vflink.runner.align` (the functions ``vflink align`` runs for PSI and
PSU; exact keyed-hash alignment as a run's ``alignment.method = "exact"`` does it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vflink._checks import check_choice, check_int
from vflink.data.given import TableLike, columns_arg, read_table
from vflink.errors import ConfigError

if TYPE_CHECKING:
    import pandas as pd

    from vflink.data.table import PartyTable

__all__ = ["Matches", "align"]

METHODS = ("exact", "psi", "psu")
REVEAL = ("both", "primary", "secondary", "cardinality")


@dataclass(frozen=True, eq=False)
class Matches:
    """The result of :func:`align`.

    Attributes
    ----------
    method : str
        ``"exact"``, ``"psi"`` or ``"psu"``.
    primary, secondary : pandas.DataFrame
        Each party's own output. PSI/PSU: ``row`` (0-based row of its table) and ``uid`` (hex),
        the files ``vflink align`` writes (for PSI only the intersection rows; none for a party
        that learns only the size). Exact: ``row`` and, for the primary, ``secondary_row``.
    summary : dict
        Sizes, seconds, payload bytes and messages per direction (``vflink align``'s
        ``summary.json``).
    """

    method: str
    primary: pd.DataFrame = field(repr=False)
    secondary: pd.DataFrame = field(repr=False)
    summary: dict[str, Any]

    @property
    def pairs(self) -> pd.DataFrame:
        """``primary_row``/``secondary_row`` of the records both tables hold.

        Only this process, which holds both outputs, can draw this table: in a deployment
        neither party of PSU learns it (FLORIST's point).
        """
        import pandas as pd

        if self.method == "exact":
            kept = self.primary[self.primary["secondary_row"] >= 0]
            return pd.DataFrame({"primary_row": kept["row"].to_numpy(),
                                 "secondary_row": kept["secondary_row"].to_numpy()})
        merged = self.primary.merge(self.secondary, on="uid", suffixes=("_p", "_s"))
        return pd.DataFrame({"primary_row": merged["row_p"].to_numpy(),
                             "secondary_row": merged["row_s"].to_numpy()}
                            ).sort_values("primary_row", ignore_index=True)


def _key_table(value: Any, argument: str, on: Sequence[str], delimiter: str | None,
               encoding: str | None) -> PartyTable:
    """A key-only party table, keys as text (``007`` stays ``007``), as ``vflink align``
    reads it."""
    from vflink.runner.align import key_frame

    frame, source = read_table(value, argument=argument, text_columns=on, delimiter=delimiter,
                               encoding=encoding)
    return key_frame(frame, on, name=argument, source=source)


def align(primary: TableLike, secondary: TableLike, *, on: str | Sequence[str],
          secondary_on: str | Sequence[str] | None = None, method: str = "psu",
          group: str = "ristretto255", reveal: str = "both", workers: int | None = None,
          seed: int | None = None, delimiter: str | None = None, encoding: str | None = None,
          secondary_delimiter: str | None = None, secondary_encoding: str | None = None,
          out: str | Path | None = None, overwrite: bool = False) -> Matches:
    """Align two tables on exact key column(s) without pooling them.

    Parameters
    ----------
    primary, secondary : pandas.DataFrame or path
        The two tables (or CSV/Parquet paths); key columns are read as text.
    on : str or list of str
        The key column(s) of the primary.
    secondary_on : str or list of str, optional
        The secondary's key columns (default: ``on``).
    method : {"psu", "psi", "exact"}, default "psu"
        ``"psu"``: private set union (FLORIST Algorithm 1); both parties learn the union's
        UIDs and a UID per own record, never which of their records the other holds.
        ``"psi"``: ECDH private set intersection (``reveal`` says who learns it).
        ``"exact"``: keyed hashes (HMAC-SHA256 under the data parties' secret) matched by a
        coordinator, as a training run's ``alignment.method = "exact"``.
    group : {"ristretto255", "modp2048"}, default "ristretto255"
        PSI/PSU: the prime-order group (``modp2048`` is the paper's, ~60x slower).
    reveal : {"both", "primary", "secondary", "cardinality"}, default "both"
        PSI: who learns the intersection (``cardinality``: only its size).
    workers : int, optional
        PSI/PSU: threads for the exponentiations (default: every core).
    seed : int, optional
        Exact: derives the secret when ``$VFLINK_SECRET`` is unset (then not a secret).
    delimiter, encoding, secondary_delimiter, secondary_encoding : str, optional
        How to read CSV paths.
    out : str or path, optional
        PSI/PSU: also write ``primary.parquet``, ``secondary.parquet`` and ``summary.json``
        into this directory, as ``vflink align --out`` does.
    overwrite : bool, default False
        Replace those files if they exist.

    Returns
    -------
    Matches
        Each party's output (``.primary``, ``.secondary``), ``.pairs`` and ``.summary``.

    Raises
    ------
    ConfigError
        An unknown method, group or reveal, or an empty ``on``.
    DataError
        A key column is missing from a table.

    Examples
    --------
    >>> m = vflink.align(bank, shop, on="customer_id", method="psu")   # doctest: +SKIP
    >>> m.summary["sizes"]                                              # doctest: +SKIP
    """
    import pandas as pd

    problems: list[str] = []
    check_choice(problems, "method", method, METHODS)
    check_choice(problems, "group", group, ("ristretto255", "modp2048"))
    check_choice(problems, "reveal", reveal, REVEAL)
    if workers is not None:
        check_int(problems, "workers", workers, min=1)
    if seed is not None:
        check_int(problems, "seed", seed, min=0)
    if method == "exact" and out is not None:
        problems.append("`out` is for psi and psu (vflink align); an exact alignment's "
                        "pairs are in the result's `.pairs`")
    keys = sec_keys = None
    try:  # the columns' problems with the others, all at once
        keys = columns_arg("on", on)
        if keys is None:
            problems.append("`on` is required: the key column(s)")
    except ConfigError as exc:
        problems.extend(exc.problems or [str(exc)])
    try:
        sec_keys = columns_arg("secondary_on", secondary_on) or keys
    except ConfigError as exc:
        problems.extend(exc.problems or [str(exc)])
    if keys and sec_keys and len(sec_keys) != len(keys):
        problems.append(f"`on` names {len(keys)} column(s) but `secondary_on` names "
                        f"{len(sec_keys)}; each key column needs a counterpart")
    if problems or keys is None or sec_keys is None:
        raise ConfigError("; ".join(problems), problems)
    target = Path(out) if out is not None else None
    if target is not None and not overwrite:
        for name in ("primary.parquet", "secondary.parquet", "summary.json"):
            if (target / name).exists():
                raise ConfigError(f"{target / name}: output already exists; choose another "
                                  "`out` or pass overwrite=True to replace it")
    p_table = _key_table(primary, "primary", keys, delimiter, encoding)
    s_table = _key_table(secondary, "secondary", sec_keys, secondary_delimiter or delimiter,
                         secondary_encoding or encoding)
    if method == "exact":
        from vflink.runner.align import align_exact_in_process

        exact = align_exact_in_process(p_table, s_table, seed=seed)
        idx = exact.alignment.secondary_index[:, 0]
        rows = exact.alignment.primary_index
        primary_out = pd.DataFrame({"row": rows.astype("int64"),
                                    "secondary_row": idx.astype("int64")})
        secondary_out = pd.DataFrame({"row": sorted({int(i) for i in idx if i >= 0})},
                                     dtype="int64")
        return Matches("exact", primary_out, secondary_out, exact.summary())
    from vflink.runner.align import align_in_process, write_outcome

    outcome = align_in_process(p_table, s_table, method=method, group=group, reveal=reveal,
                               workers=workers)
    summary = (write_outcome(outcome, target) if target is not None else outcome.summary())
    theirs = outcome.secondary
    return Matches(method, outcome.primary.frame(),
                   theirs.frame() if theirs is not None else pd.DataFrame({"row": [], "uid": []}),
                   summary)
