"""Per-party preprocessing, fitted on the party's own training rows only.

Numeric columns: median imputation with a missing-value indicator, then standardisation.
Categorical columns: a ``<missing>`` category, then one-hot with unknown categories ignored.
All statistics come from the rows passed to :meth:`Preprocessor.fit` (the training rows), so no
information from validation or test rows leaks into the features.

scikit-learn fits the statistics; they are then kept as plain numbers (medians, means, scales,
category lists), applied with numpy, and saved as versioned JSON (:meth:`Preprocessor.to_json`),
so a saved model never needs pickle.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd
from sklearn.compose import ColumnTransformer
from sklearn.impute import SimpleImputer
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import OneHotEncoder, StandardScaler

from vflink.data.schema import PartySchema
from vflink.errors import DataError

__all__ = ["MISSING_CATEGORY", "PREPROCESSOR_VERSION", "Preprocessor"]

log = logging.getLogger(__name__)

MISSING_CATEGORY = "<missing>"

#: Version of :meth:`Preprocessor.to_json`'s format.
PREPROCESSOR_VERSION = 1
_FORMAT = "vflink-preprocessor"


@dataclass(frozen=True)
class _Fitted:
    """The fitted statistics (all that ``transform`` needs)."""

    medians: list[float]          # SimpleImputer.statistics_, one per numeric column
    indicators: list[int]         # numeric columns with a missing indicator (features_)
    mean: list[float]             # StandardScaler over [imputed numeric, indicators]
    scale: list[float]
    categories: list[list[str]]   # OneHotEncoder.categories_ per categorical column
    infrequent: list[list[str] | None]  # its infrequent_categories_ (max_categories)


class Preprocessor:
    """Encodes a party's feature columns as a float32 matrix."""

    def __init__(self, schema: PartySchema, *, max_categories: int = 64,
                 standardize: bool = True) -> None:
        self.schema = schema
        self.max_categories = max_categories
        #: False: numeric columns are imputed but not rescaled (the FedSim authors' raw features)
        self.standardize = standardize
        self._fitted: _Fitted | None = None
        self.n_features = 0

    def _categoricals(self, frame: pd.DataFrame) -> pd.DataFrame:
        cats = frame[list(self.schema.categorical)].astype(object)
        return cats.where(cats.notna(), MISSING_CATEGORY).astype(str)

    def _inputs(self, frame: pd.DataFrame) -> pd.DataFrame:
        parts = [frame[list(self.schema.numeric)].astype(np.float64)]
        if self.schema.categorical:
            parts.append(self._categoricals(frame))
        return pd.concat(parts, axis=1)

    def fit(self, frame: pd.DataFrame, rows: npt.NDArray[np.int64]) -> Preprocessor:
        rows = np.asarray(rows, dtype=np.int64)
        if rows.size == 0:
            # e.g. Exact linkage on noisy identifiers: no record of this party is linked to a
            # training row, so it contributes nothing and nothing may be fitted on other rows.
            log.warning("party %r: no linked training rows; its features are not used",
                        self.schema.name)
            self._fitted = None
            self.n_features = 0
            return self
        if rows.min() < 0 or rows.max() >= len(frame):
            raise DataError(f"party {self.schema.name!r}: training rows out of range "
                            f"[0, {len(frame)}) in preprocessing")
        if not self.schema.features:
            self._fitted = None
            self.n_features = 0
            return self
        steps: list[tuple[str, object, list[str]]] = []
        if self.schema.numeric:
            numeric = Pipeline([
                ("impute", SimpleImputer(strategy="median", add_indicator=True,
                                         keep_empty_features=True)),
                ("scale", StandardScaler() if self.standardize else "passthrough"),
            ])
            steps.append(("numeric", numeric, list(self.schema.numeric)))
        if self.schema.categorical:
            onehot = OneHotEncoder(handle_unknown="infrequent_if_exist",
                                   max_categories=self.max_categories, sparse_output=False,
                                   dtype=np.float32)
            steps.append(("categorical", onehot, list(self.schema.categorical)))
        transformer = ColumnTransformer(steps, sparse_threshold=0.0)
        transformer.fit(self._inputs(frame.iloc[rows]))
        fitted = transformer.named_transformers_
        medians: list[float] = []
        indicators: list[int] = []
        mean: list[float] = []
        scale: list[float] = []
        if self.schema.numeric:
            imputer, scaler = fitted["numeric"]["impute"], fitted["numeric"]["scale"]
            medians = [float(v) for v in imputer.statistics_]
            indicators = ([int(i) for i in imputer.indicator_.features_]
                          if imputer.indicator_ is not None else [])
            width = len(medians) + len(indicators)
            if self.standardize:
                mean = [float(v) for v in scaler.mean_]
                scale = [float(v) for v in scaler.scale_]
            else:  # identity: (x - 0) / 1
                mean, scale = [0.0] * width, [1.0] * width
        categories: list[list[str]] = []
        infrequent: list[list[str] | None] = []
        if self.schema.categorical:
            onehot = fitted["categorical"]
            categories = [[str(c) for c in cats] for cats in onehot.categories_]
            infrequent = [None if inf is None else [str(c) for c in inf]
                          for inf in onehot.infrequent_categories_]
        self._set(_Fitted(medians, indicators, mean, scale, categories, infrequent))
        return self

    def _set(self, fitted: _Fitted) -> None:
        self._fitted = fitted
        onehot = sum(len(c) - len(i or ()) + (i is not None)
                     for c, i in zip(fitted.categories, fitted.infrequent, strict=True))
        self.n_features = len(fitted.mean) + onehot

    def columns(self) -> list[tuple[int, int, bool]]:
        """The encoded row's layout, one entry per input column in schema order (numeric
        columns, then their missing-value indicators, then the categorical columns):
        ``(start, width, categorical)``, width 1 for a numeric column or an indicator and the
        one-hot block's width for a categorical column."""
        fitted = self._fitted
        if fitted is None:
            return []
        out = [(i, 1, False) for i in range(len(fitted.mean))]
        start = len(fitted.mean)
        for cats, inf in zip(fitted.categories, fitted.infrequent, strict=True):
            width = len(cats) - len(inf or ()) + (inf is not None)
            if width:
                out.append((start, width, True))
            start += width
        return out

    def transform(self, frame: pd.DataFrame) -> npt.NDArray[np.float32]:
        fitted = self._fitted
        if fitted is None:
            return np.zeros((len(frame), 0), dtype=np.float32)
        parts: list[npt.NDArray[Any]] = []
        if self.schema.numeric:
            # SimpleImputer(median, add_indicator) then StandardScaler, in float64 as there
            x = frame[list(self.schema.numeric)].to_numpy(dtype=np.float64, na_value=np.nan)
            missing = np.isnan(x)
            x = np.where(missing, np.asarray(fitted.medians, dtype=np.float64), x)
            z = np.hstack([x, missing[:, fitted.indicators].astype(np.float64)])
            z -= np.asarray(fitted.mean, dtype=np.float64)
            z /= np.asarray(fitted.scale, dtype=np.float64)
            parts.append(z)
        if self.schema.categorical:
            cats = self._categoricals(frame)
            for j, col in enumerate(self.schema.categorical):
                # OneHotEncoder(handle_unknown="infrequent_if_exist"): the frequent categories
                # in sorted order, then one column for the infrequent ones, which also takes
                # unknown values; without one, an unknown value is all zeros.
                inf = fitted.infrequent[j]
                frequent = [c for c in fitted.categories[j] if inf is None or c not in inf]
                width = len(frequent) + (inf is not None)
                lookup = {c: i for i, c in enumerate(frequent)}
                other = len(frequent) if inf is not None else -1
                idx = np.array([lookup.get(v, other) for v in cats[col].tolist()],
                               dtype=np.int64)
                block = np.zeros((len(frame), width), dtype=np.float32)
                hit = idx >= 0
                block[np.flatnonzero(hit), idx[hit]] = 1.0
                parts.append(block)
        out = np.hstack(parts) if parts else np.zeros((len(frame), 0))
        return np.ascontiguousarray(out, dtype=np.float32)

    def to_json(self) -> dict[str, Any]:
        """The fitted statistics as a versioned JSON-able dict (see :meth:`from_json`)."""
        fitted = self._fitted
        return {
            "format": _FORMAT, "version": PREPROCESSOR_VERSION,
            "numeric": list(self.schema.numeric), "categorical": list(self.schema.categorical),
            "max_categories": self.max_categories, "standardize": self.standardize,
            "fitted": None if fitted is None else {
                "medians": fitted.medians, "indicators": fitted.indicators,
                "mean": fitted.mean, "scale": fitted.scale, "categories": fitted.categories,
                "infrequent": fitted.infrequent},
        }

    @classmethod
    def from_json(cls, data: Any, schema: PartySchema, *, source: str = "state file"
                  ) -> Preprocessor:
        """Rebuild a fitted preprocessor for ``schema`` from :meth:`to_json`'s output.

        Raises :class:`DataError` naming ``source`` for another format version, a malformed
        dict, or columns that no longer match the party's schema.
        """
        if not isinstance(data, dict) or data.get("format") != _FORMAT:
            raise DataError(f"{source}: no fitted preprocessing of party {schema.name!r}")
        if data.get("version") != PREPROCESSOR_VERSION:
            raise DataError(f"{source}: preprocessing saved in format version "
                            f"{data.get('version')!r}; this vflink reads {PREPROCESSOR_VERSION}")
        saved = (list(data.get("numeric", [])), list(data.get("categorical", [])))
        if saved != (list(schema.numeric), list(schema.categorical)):
            raise DataError(f"{source}: preprocessing of party {schema.name!r} was fitted on "
                            f"numeric {saved[0]} and categorical {saved[1]}, but the party's "
                            f"table now has numeric {list(schema.numeric)} and categorical "
                            f"{list(schema.categorical)}")
        pre = cls(schema, max_categories=int(data.get("max_categories", 64)),
                  standardize=bool(data.get("standardize", True)))
        raw = data.get("fitted")
        if raw is None:
            return pre
        try:
            fitted = _Fitted(
                [float(v) for v in raw["medians"]], [int(i) for i in raw["indicators"]],
                [float(v) for v in raw["mean"]], [float(v) for v in raw["scale"]],
                [[str(c) for c in cats] for cats in raw["categories"]],
                [None if inf is None else [str(c) for c in inf] for inf in raw["infrequent"]])
        except (KeyError, TypeError, ValueError) as exc:
            raise DataError(f"{source}: malformed preprocessing of party {schema.name!r} "
                            f"({exc})") from None
        n_num, n_cat = len(schema.numeric), len(schema.categorical)
        if (len(fitted.medians) != n_num or len(fitted.mean) != len(fitted.scale)
                or len(fitted.mean) != n_num + len(fitted.indicators)
                or any(not 0 <= i < n_num for i in fitted.indicators)
                or len(fitted.categories) != n_cat or len(fitted.infrequent) != n_cat):
            raise DataError(f"{source}: malformed preprocessing of party {schema.name!r} "
                            "(sizes do not match its columns)")
        pre._set(fitted)
        return pre
