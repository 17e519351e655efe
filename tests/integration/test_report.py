"""`vflink report`: one offline HTML page, rendered in a real headless Chromium."""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from vflink.cli.main import main
from vflink.reporting.experiment import markdown_table, plot_results
from vflink.runfiles.config import (
    AlignmentConfig,
    DataConfig,
    EvaluationConfig,
    RunConfig,
    TrainingConfig,
)
from vflink.runner.attack import run_attack
from vflink.runner.train import run_training

RUN_SECTIONS = ("summary", "configuration", "learning-curve", "metrics", "linkage",
                "communication", "privacy-ledger", "attacks")
#: elements a reader must see: the sections, the learning curve, the ledger and communication
VISIBLE = (*RUN_SECTIONS, "learning-curve-figure", "ledger-messages", "similarity-curve",
           "weight-gate")


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


@pytest.fixture(scope="module")
def soft_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("report") / "soft"
    config = RunConfig(seed=2, algorithm="fedsim",
                       data=DataConfig(dataset="sklearn-small", options={"n_samples": 600}),
                       alignment=AlignmentConfig(method="soft", metric="euclidean", top_k=3,
                                                 privacy="bloom", tau=0.99),
                       training=TrainingConfig(epochs=2, patience=2),
                       evaluation=EvaluationConfig(record=True))
    run_training(config, out)
    run_attack(out, "greedy-similarity")
    return out


def _external_urls(page: str) -> list[str]:
    return re.findall(r"(?:https?:|ftp:|//[a-z0-9.-]+\.[a-z]{2,})", page, flags=re.I)


def test_run_report_is_one_self_contained_file(soft_run: Path) -> None:
    out = soft_run.parent / "page.html"
    assert main(["report", str(soft_run), "--out", str(out)]) == 0
    page = out.read_text(encoding="utf-8")
    assert _external_urls(page) == []
    srcs = re.findall(r'src="([^"]*)"', page)
    assert srcs and all(s.startswith("data:image/png;base64,") for s in srcs)
    assert "<link" not in page and "<script" not in page
    for sid in RUN_SECTIONS:
        assert f'id="{sid}"' in page
    assert "greedy-similarity" in page  # the attack result
    assert "no meaningful differential-privacy guarantee" in page  # ε explained, not bare
    assert "identifier_encodings" in page and "bloom-filter" in page


def test_a_soft_links_counts_are_not_called_matches(soft_run: Path) -> None:
    """A soft link gives every record K neighbours whether or not it has a counterpart: the
    page says so, and says what is known about true matches (nothing, without an estimate)."""
    out = soft_run.parent / "soft-words.html"
    assert main(["report", str(soft_run), "--out", str(out)]) == 0
    page = " ".join(out.read_text(encoding="utf-8").split())
    assert "matched in" not in page and "primary records aligned" not in page
    assert "primary records is linked to its 3 nearest records in" in page
    assert "whether or not it has a counterpart" in page
    assert "how many of these links are true matches is not known" in page


def test_an_estimate_of_true_matches_is_slotted_in() -> None:
    from vflink.reporting.report import ESTIMATE_KEYS, _linkage_line

    model = {"model": "fellegi-sunter", "threshold": 0.5, "expected_matches": 1603.4,
             "estimated_precision": 0.91, "estimated_recall": 0.97, "estimated_f1": 0.94,
             "matched_fraction": 0.8}
    alignment = {"method": "soft", "top_k": 5, "metric": "hamming", "encoding": "bloom",
                 "tau": 0.05, "matched_fraction": {"shop": 1.0}, "model": model}
    assert set(ESTIMATE_KEYS) <= set(model)
    line = _linkage_line({"alignment": alignment, "sizes": {"primary_rows": 2000,
                                                            "aligned_rows": 2000}})
    assert "every one of 2,000 primary records is linked to its 5 nearest records" in line
    assert ("true matches, estimated without labels by the fellegi-sunter model: ≈ 1,603 of "
            "2,000 primary records (its decisions' precision 0.91, recall 0.97, estimated); "
            "it decided 80.0% of the primary records matched") in line, line
    assert "not known" not in line
    flat = {k: v for k, v in alignment.items() if k != "model"}
    line = _linkage_line({"alignment": {**flat, "estimated_matches": {"shop": 1200,
                                                                      "bank": 900.0}},
                          "sizes": {"primary_rows": 2000}})
    assert "≈ 1,200 in shop, ≈ 900 in bank of 2,000 primary records" in line
    exact = _linkage_line({"alignment": {"method": "exact", "matched_fraction": {"shop": 0.8}},
                           "sizes": {"primary_rows": 2000, "aligned_rows": 1600}})
    assert "1,600 of 2,000 primary records aligned (80.0% matched in shop)" in exact


def test_experiment_report_has_its_tables_and_plot(tmp_path: Path) -> None:
    stat = {"accuracy": {"mean": 0.81, "std": 0.01}, "auc": {"mean": 0.88, "std": 0.02}}
    results = {"name": "toy", "algorithms": ["solo", "fedsim"], "seeds": [0, 1],
               "sweep": {"key": None, "values": [None]}, "headline_metric": "accuracy",
               "summary": {"None": {"solo": stat, "fedsim": stat}},
               "runs": [{"algorithm": "solo", "seed": 0, "sweep": None,
                         "test": {"accuracy": 0.8}, "bytes": 0, "seconds": 1.0}]}
    (tmp_path / "results.json").write_text(json.dumps(results))
    (tmp_path / "results.md").write_text(markdown_table(results))
    plot_results(results, tmp_path / "plot.png")
    assert main(["report", str(tmp_path)]) == 0
    page = (tmp_path / "report.html").read_text(encoding="utf-8")
    assert 'id="results"' in page and 'id="experiment-plot"' in page
    assert "0.81 ± 0.01" in page and "fedsim" in page
    assert _external_urls(page) == []


def test_report_of_something_else_fails_cleanly(tmp_path: Path) -> None:
    assert main(["report", str(tmp_path)]) == 2  # a data error (README exit codes)


_PROBE = """<script>
window.addEventListener("load", function () {
  var out = {};
  %s.forEach(function (id) {
    var el = document.getElementById(id);
    if (!el) { out[id] = "missing"; return; }
    var st = getComputedStyle(el), r = el.getBoundingClientRect();
    var img = el.querySelector("img");
    out[id] = (st.display !== "none" && st.visibility !== "hidden" && r.width > 0 &&
               r.height > 0 && (!img || img.naturalWidth > 0)) ? "visible" : "hidden";
  });
  var pre = document.createElement("pre");
  pre.id = "probe-result";
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>"""


def _chrome(binary: str, profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [binary, "--headless", "--no-sandbox", "--disable-gpu",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           "--no-first-run", "--disable-extensions", f"--user-data-dir={profile}",
           "--enable-logging=stderr", "--v=0", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "HOME": str(profile)}, check=False)


def test_report_renders_in_headless_chromium(soft_run: Path, tmp_path: Path) -> None:
    binary = _chromium()
    if binary is None:
        pytest.skip("no Chromium installed (apt-get install chromium): the report's browser "
                    "test needs a real browser")
    page = soft_run / "report.html"
    assert main(["report", str(soft_run)]) == 0
    shot = tmp_path / "report.png"
    proc = _chrome(binary, tmp_path / "profile", "--window-size=1200,3000",
                   f"--screenshot={shot}", page.as_uri())
    assert shot.is_file(), proc.stderr[-2000:]
    head = shot.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", head[16:24])
    assert (width, height) == (1200, 3000)
    # the console check sees errors (a page with one is caught), so its silence means something
    bad = tmp_path / "bad.html"
    bad.write_text('<!DOCTYPE html><html><body><script>console.error("boom")</script></body>'
                   "</html>", encoding="utf-8")
    caught = _chrome(binary, tmp_path / "profile0", "--dump-dom", bad.as_uri())
    assert any(":CONSOLE" in line and "boom" in line for line in caught.stderr.splitlines())
    # the page has no script: any console message (an error, a blocked load) is a failure
    console = [line for line in proc.stderr.splitlines() if ":CONSOLE" in line]
    assert console == [], console
    # key sections present and visible: probe a copy of the page, read back its DOM
    probed = tmp_path / "probed.html"
    probed.write_text(page.read_text(encoding="utf-8").replace(
        "</body>", _PROBE % json.dumps(list(VISIBLE)) + "</body>"), encoding="utf-8")
    dom = _chrome(binary, tmp_path / "profile2", "--virtual-time-budget=5000", "--dump-dom",
                  probed.as_uri())
    match = re.search(r'<pre id="probe-result">(.*?)</pre>', dom.stdout, flags=re.S)
    assert match, dom.stderr[-2000:]
    seen = json.loads(match.group(1).replace("&quot;", '"'))
    assert seen == dict.fromkeys(VISIBLE, "visible")
    assert [line for line in dom.stderr.splitlines() if ":CONSOLE" in line] == []


def test_run_report_compares_with_runs_of_the_same_data_beside_it(soft_run: Path) -> None:
    page = (soft_run.parent / "page2.html")
    # alone, no baselines table: one would only repeat the run's own metrics
    assert main(["report", str(soft_run), "--out", str(page)]) == 0
    assert 'class="baselines"' not in page.read_text(encoding="utf-8")
    sibling = soft_run.parent / "solo"
    sibling.mkdir(exist_ok=True)
    (sibling / "config.json").write_text((soft_run / "config.json").read_text())
    metrics = json.loads((soft_run / "metrics.json").read_text())
    metrics.update(algorithm="solo", metrics={"test": {"accuracy": 0.123456, "auc": 0.5}})
    (sibling / "metrics.json").write_text(json.dumps(metrics))
    try:
        assert main(["report", str(soft_run), "--out", str(page), "--overwrite"]) == 0
        text = page.read_text(encoding="utf-8")
        assert "fedsim (this run)" in text and "0.1235" in text
        assert "solo 0.1235" in _summary_text(text)  # and the summary names it
    finally:
        shutil.rmtree(sibling)


def _summary_text(page: str) -> str:
    match = re.search(r'<section id="summary">(.*?)</section>', page, flags=re.S)
    assert match, "no summary section"
    return re.sub(r"<[^>]+>", " ", match.group(1))


@pytest.fixture(scope="module")
def exact_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An exact-key run on the user's own CSV tables (absolute paths in its config)."""
    import numpy as np

    root = tmp_path_factory.mktemp("exact")
    rng = np.random.default_rng(0)
    n = 240
    x = rng.normal(size=(n, 4))
    y = (x[:, 0] + x[:, 2] > 0).astype(int)
    (root / "data").mkdir()
    (root / "data" / "hospital.csv").write_text(
        "id,a,b,label\n" + "".join(f"{i},{x[i, 0]:.4f},{x[i, 1]:.4f},{y[i]}\n"
                                    for i in range(n)), encoding="utf-8")
    (root / "data" / "bank.csv").write_text(
        "id,c,d\n" + "".join(f"{i},{x[i, 2]:.4f},{x[i, 3]:.4f}\n" for i in range(n)),
        encoding="utf-8")
    (root / "run.toml").write_text("""version = 1
seed = 1
algorithm = "splitnn"
[[data.parties]]
name = "hospital"
role = "primary"
path = "data/hospital.csv"
key = ["id"]
numeric = ["a", "b"]
label = "label"
task = "binary"
[[data.parties]]
name = "bank"
role = "secondary"
path = "data/bank.csv"
key = ["id"]
numeric = ["c", "d"]
[training]
epochs = 2
[evaluation]
record = true
""", encoding="utf-8")
    out = root / "runs" / "exact"
    assert main(["train", "--config", str(root / "run.toml"), "--out", str(out)]) == 0
    run_attack(out, "label-norm")
    assert main(["report", str(out)]) == 0
    return out


def test_exact_run_page_shows_only_what_applies(exact_run: Path) -> None:
    """No local absolute path, no soft-linkage / DH-group settings on an
    exact-key run, every ledger row classified, a summary first with the attack verdict."""
    page = (exact_run / "report.html").read_text(encoding="utf-8")
    assert str(exact_run.parent.parent) not in page  # no absolute path of this machine
    assert "../../data/hospital.csv" in page and "../../data/bank.csv" in page
    settings = re.findall(r"<td>((?:alignment|model|training|privacy)\.[a-z_]+)</td>", page)
    assert "alignment.method" in settings and "alignment.secret_env" in settings
    for unused in ("alignment.metric", "alignment.top_k", "alignment.privacy",
                   "alignment.group", "alignment.search", "alignment.pool", "alignment.alpha",
                   "model.pair_dim", "model.aggregator", "training.knn_batch_size",
                   "privacy.embeddings"):
        assert unused not in settings, unused
    assert "not classified" not in page
    assert 'class="baselines"' not in page  # nothing beside it
    assert page.index('id="summary"') < page.index('id="metrics"')
    summary = _summary_text(page)
    for line in ("Task", "Linkage", "Privacy", "Attacks"):
        assert line in summary
    assert "test accuracy" in summary and "exact keys" in summary
    assert "label-norm" in summary and "AUC" in summary and "from chance" in summary
    assert "guessing" not in page


#: writes the summary's bounding box, as the browser laid it out, into the DOM
_BOX_PROBE = """<script>
window.addEventListener("load", function () {
  var el = document.getElementById("summary");
  var out = el ? el.getBoundingClientRect() : null;
  var pre = document.createElement("pre");
  pre.id = "box-result";
  pre.textContent = JSON.stringify(out && {top: out.top, bottom: out.bottom,
                                            width: window.innerWidth,
                                            height: window.innerHeight});
  document.body.appendChild(pre);
});
</script>"""


@pytest.mark.parametrize("which", ["exact", "soft"])
def test_summary_is_on_the_first_screen(which: str, exact_run: Path, soft_run: Path,
                                        tmp_path: Path) -> None:
    """At a 1280×800 window the whole summary (task, linkage, privacy, attack verdicts) is in
    the first screen, without scrolling: laid out by a real Chromium, box read from the DOM
    (before, the attack results sat below 4,000 pixels of page)."""
    binary = _chromium()
    if binary is None:
        pytest.skip("no Chromium installed (apt-get install chromium): the first-screen check "
                    "needs a real browser's layout")
    run = exact_run if which == "exact" else soft_run
    assert main(["report", str(run), "--out", str(tmp_path / "page.html")]) == 0
    probed = tmp_path / "probed.html"
    probed.write_text((tmp_path / "page.html").read_text(encoding="utf-8").replace(
        "</body>", _BOX_PROBE + "</body>"), encoding="utf-8")
    dom = _chrome(binary, tmp_path / "profile", "--window-size=1280,800",
                  "--virtual-time-budget=5000", "--dump-dom", probed.as_uri())
    match = re.search(r'<pre id="box-result">(.*?)</pre>', dom.stdout, flags=re.S)
    assert match, dom.stderr[-2000:]
    box = json.loads(match.group(1).replace("&quot;", '"'))
    assert box is not None, "no summary element"
    # the viewport of a 1280×800 window: the full width, its height less the browser's own
    # bars (headless Chromium keeps room for them: 650-720 px), so the check is stricter than 800
    assert box["width"] == 1280 and 600 <= box["height"] <= 800, box
    assert 0 <= box["top"] and box["bottom"] <= box["height"], box
    # and a screenshot of that first screen is a real 1280×800 image
    shot = tmp_path / "first.png"
    _chrome(binary, tmp_path / "profile2", "--window-size=1280,800", "--hide-scrollbars",
            f"--screenshot={shot}", (tmp_path / "page.html").as_uri())
    head = shot.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", head[16:24]) == (1280, 800)


def test_demo_directory_report(soft_run: Path, tmp_path: Path) -> None:
    (tmp_path / "fedsim").mkdir()
    (tmp_path / "fedsim" / "metrics.json").write_text((soft_run / "metrics.json").read_text())
    (tmp_path / "comparison.json").write_text(json.dumps({
        "dataset": "sklearn-small", "headline_metric": "accuracy",
        "test": {"solo": {"accuracy": 0.7, "auc": 0.8}, "fedsim": {"accuracy": 0.9, "auc": 0.95}}}))
    assert main(["report", str(tmp_path)]) == 0
    page = (tmp_path / "report.html").read_text(encoding="utf-8")
    assert 'id="results"' in page and 'id="run-fedsim"' in page and "data:image/png" in page
    assert _external_urls(page) == []
