"""California housing linked to nearby places by latitude/longitude (no shared key).

The analogue of FedSim's *house* dataset (App. E: housing data linked to Airbnb listings "by
longitude and latitude", regression on the price): the primary party holds the 20,640 census
block groups of California (1990 census, Pace & Barry 1997) with the median house value as the
label; the secondary parties hold places around them, GeoNames populated places and/or
airports. A block and a town are *related*, not the same record, so there is no true match and
only soft (similarity-based) linkage applies, as for *house*, *taxi* and *hdb* in the paper.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vflink._checks import raise_if
from vflink.data.schema import PartySchema
from vflink.data.table import PartyTable
from vflink.datasets._base import (
    VFLDataset,
    as_str_tuple,
    check_max_rows,
    check_seed,
    read_shipped,
    register_dataset,
    seed_streams,
    table,
)
from vflink.types import Task

__all__ = ["CALIFORNIA_SECONDARIES", "CaliforniaHousingOptions", "load_california_housing"]

#: The secondary parties available to "california-housing".
CALIFORNIA_SECONDARIES = ("airports", "cities")
COORDS = ("latitude", "longitude")


@dataclass(frozen=True, kw_only=True)
class CaliforniaHousingOptions:
    """Options of "california-housing".

    Attributes:
        secondaries: which secondary parties to include, in order: ``"cities"`` (GeoNames
            places with ≥ 500 inhabitants) and/or ``"airports"``.
        max_rows: keep a random subset of this many housing rows (``None``: all 20,640).
        seed: seeds the row subset and the shuffling of the secondary tables.
    """

    secondaries: tuple[str, ...] = ("cities", "airports")
    max_rows: int | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "secondaries", as_str_tuple(self.secondaries))
        problems: list[str] = []
        s = self.secondaries
        if (not isinstance(s, tuple) or not s or len(set(s)) != len(s)
                or not set(s) <= set(CALIFORNIA_SECONDARIES)):
            problems.append(f"`secondaries` must be a non-empty list of distinct names from "
                            f"{', '.join(CALIFORNIA_SECONDARIES)}, got {s!r}")
        check_max_rows(problems, self.max_rows)
        check_seed(problems, self.seed)
        raise_if(problems, "CaliforniaHousingOptions")


def _housing(max_rows: int | None, rng: np.random.Generator, name: str) -> PartyTable:
    frame = read_shipped("california_housing.csv.gz")
    if max_rows is not None and max_rows < len(frame):
        frame = frame.iloc[np.sort(rng.choice(len(frame), size=max_rows, replace=False))]
    schema = PartySchema(
        name="housing", role="primary", identifiers=COORDS,
        numeric=("med_inc", "house_age", "ave_rooms", "ave_bedrms", "population", "ave_occup"),
        label="med_house_val", task=Task.REGRESSION)
    return table(schema, frame, name)


def _cities(rng: np.random.Generator, name: str) -> PartyTable:
    frame = read_shipped("california_cities.csv.gz")
    frame = frame.iloc[rng.permutation(len(frame))]
    frame = frame.assign(log_population=np.log10(frame["population"].clip(lower=1)))
    schema = PartySchema(name="cities", role="secondary", identifiers=COORDS,
                         numeric=("log_population", "n_alternate_names"))
    return table(schema, frame, name)


def _airports(rng: np.random.Generator, name: str) -> PartyTable:
    frame = read_shipped("california_airports.csv.gz", keep_default_na=False, na_values=[""],
                         dtype={"iata": str, "icao": str})
    frame = frame.iloc[rng.permutation(len(frame))]
    frame = frame.assign(
        has_iata=frame["iata"].notna().astype(np.float64),
        kind=np.where(frame["name"].str.endswith("Airport"), "airport", "airfield"),
    )
    schema = PartySchema(name="airports", role="secondary", identifiers=COORDS,
                         numeric=("elevation_ft", "has_iata"), categorical=("kind",))
    return table(schema, frame, name)


def load_california_housing(options: CaliforniaHousingOptions) -> VFLDataset:
    """Build "california-housing" (see the module docstring)."""
    name = "california-housing"
    rows_rng, shuffle_rng = seed_streams(options.seed, 2)
    builders = {"cities": _cities, "airports": _airports}
    secondaries = tuple(builders[s](shuffle_rng, name) for s in options.secondaries)
    description = (
        "California housing (1990 census block groups, Pace & Barry 1997; label: median house "
        "value in $100,000) linked by latitude/longitude to "
        + " and ".join({"cities": "GeoNames populated places (CC BY 4.0, geonames.org)",
                        "airports": "airports from airportsdata (MIT)"}[s]
                       for s in options.secondaries)
        + ". No shared key and no true matches: soft linkage only (FedSim's 'house' setting)."
    )
    return VFLDataset(name=name, primary=_housing(options.max_rows, rows_rng, name),
                      secondaries=secondaries, description=description)


register_dataset(
    "california-housing", CaliforniaHousingOptions, load_california_housing,
    "California housing (regression) linked by lat/lon to GeoNames places and airports")
