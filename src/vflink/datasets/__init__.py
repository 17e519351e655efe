"""Ready-made VFL datasets, loaded by name and fully offline.

>>> from vflink.datasets import load_dataset, dataset_names
>>> ds = load_dataset("sklearn-small", sigma_cf=0.1, seed=3)   # doctest: +SKIP
>>> ds.primary.schema.label, [t.name for t in ds.secondaries]  # doctest: +SKIP
('y', ['secondary'])

================== ================================================================ ==========
name               what                                                             linkage
================== ================================================================ ==========
sklearn            FedSim's synthetic data (§6.1, App. E Table 4): 60k rows,        exact key
                   50+50 features, 5 noisy float identifiers (σ_cf), binary         + floats
sklearn-small      the same, 6k rows, 10+10 features, 3 identifiers, easier         idem
sklearn-reference  the FedSim authors' own sklearn data, bit for bit (seed 512,       floats
                   class_sep 0.3), with their fixed train/validation/test split
california-housing housing (regression) + GeoNames places and/or airports           lat/lon
movies             CC0 Wikidata films: catalogue (critic rating) + reviews          title
imdb-movies        IMDb ggplot2movies (user-supplied file) + Wikidata films         title
adult              UCI Adult split by attributes (VFL-AFE), optional partial        exact key
                   overlap for PSU (FLORIST)
febrl              FEBRL 4 person records + synthetic features and label            strings
fashion-mnist      Fashion-MNIST halves (VFL-AFE): left + label vs right pixels      exact key
                   (Debian package dataset-fashion-mnist, not shipped)
kdd-protein        KDD Cup 2004 protein homology (0.89 % positives), FLORIST §3     exact key
================== ================================================================ ==========

Real tables ship under ``vflink/datasets/data/`` (see ``PROVENANCE.md`` there for sources,
licences and the extraction procedure); nothing is downloaded at run time.
"""

from __future__ import annotations

from vflink.datasets import adult as _adult  # noqa: F401  (registers "adult")
from vflink.datasets import california as _california  # noqa: F401
from vflink.datasets import fashion_mnist as _fashion_mnist  # noqa: F401
from vflink.datasets import febrl as _febrl  # noqa: F401
from vflink.datasets import kdd_protein as _kdd_protein  # noqa: F401
from vflink.datasets import movies as _movies  # noqa: F401
from vflink.datasets import sklearn_reference as _sklearn_reference  # noqa: F401
from vflink.datasets import synthetic as _synthetic  # noqa: F401
from vflink.datasets._base import (
    DATASETS,
    DatasetSpec,
    VFLDataset,
    dataset_names,
    load_dataset,
)
from vflink.datasets.adult import AdultOptions
from vflink.datasets.california import CaliforniaHousingOptions
from vflink.datasets.export import export_dataset
from vflink.datasets.febrl import FebrlOptions
from vflink.datasets.movies import ImdbMoviesOptions, MoviesOptions
from vflink.datasets.synthetic import SklearnOptions, make_sklearn

__all__ = [
    "AdultOptions",
    "CaliforniaHousingOptions",
    "DATASETS",
    "DatasetSpec",
    "FebrlOptions",
    "ImdbMoviesOptions",
    "MoviesOptions",
    "SklearnOptions",
    "VFLDataset",
    "dataset_names",
    "export_dataset",
    "load_dataset",
    "make_sklearn",
]
