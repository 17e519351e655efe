"""Per-party preprocessing, fitted on the party's own training rows only.

Numeric columns: median imputation with a missing-value indicator, then standardisation.
Categorical columns: a ``<missing>`` category, then one-hot with unknown categories ignored.
All statistics come from the rows passed to :meth:`Preprocessor.fit` (the training rows), so no
information from validation or test rows leaks into the features.
"""

from __future__ import annotations

import logging

import numpy as np
import numpy.typing as npt
import pandas as pd
from sklearn.compose import ColumnTransformer
from sklearn.impute import SimpleImputer
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import OneHotEncoder, StandardScaler

from vflink.data.schema import PartySchema
from vflink.errors import DataError

__all__ = ["MISSING_CATEGORY", "Preprocessor"]

log = logging.getLogger(__name__)

MISSING_CATEGORY = "<missing>"


class Preprocessor:
    """Encodes a party's feature columns as a float32 matrix."""

    def __init__(self, schema: PartySchema, *, max_categories: int = 64,
                 standardize: bool = True) -> None:
        self.schema = schema
        self.max_categories = max_categories
        #: False: numeric columns are imputed but not rescaled
        self.standardize = standardize
        self._transformer: ColumnTransformer | None = None
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
            self._transformer = None
            self.n_features = 0
            return self
        if rows.min() < 0 or rows.max() >= len(frame):
            raise DataError(f"party {self.schema.name!r}: training rows out of range "
                            f"[0, {len(frame)}) in preprocessing")
        if not self.schema.features:
            self._transformer = None
            self.n_features = 0
            return self
        steps: list[tuple[str, object, list[str]]] = []
        if self.schema.numeric:
            numeric = Pipeline([
                ("impute", SimpleImputer(strategy="median", add_indicator=True,
                                         keep_empty_features=True)),
                ("scale", StandardScaler() if getattr(self, "standardize", True)
                 else "passthrough"),
            ])
            steps.append(("numeric", numeric, list(self.schema.numeric)))
        if self.schema.categorical:
            onehot = OneHotEncoder(handle_unknown="infrequent_if_exist",
                                   max_categories=self.max_categories, sparse_output=False,
                                   dtype=np.float32)
            steps.append(("categorical", onehot, list(self.schema.categorical)))
        transformer = ColumnTransformer(steps, sparse_threshold=0.0)
        transformer.fit(self._inputs(frame.iloc[rows]))
        self._transformer = transformer
        self.n_features = int(sum(
            len(t.get_feature_names_out()) for _, t, _ in transformer.transformers_
            if t != "drop"
        ))
        return self

    def transform(self, frame: pd.DataFrame) -> npt.NDArray[np.float32]:
        if self._transformer is None:
            return np.zeros((len(frame), 0), dtype=np.float32)
        out = self._transformer.transform(self._inputs(frame))
        return np.ascontiguousarray(out, dtype=np.float32)
