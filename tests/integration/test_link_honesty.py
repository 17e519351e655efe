"""A model link that says when it is wrong: tables that are not one-to-one, estimates that
check their assumptions on the data, blocking on what the fields mean, a private default that
holds or refuses, and the silent mistakes refused in one wording by the API, the command and a
[link] file."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import vflink
from vflink.cli.main import main
from vflink.datasets._base import read_shipped
from vflink.errors import ConfigError, DataError, LinkageError
from vflink.linkage.decisions import measure

FIELDS = ("given_name", "surname", "street_number", "address_1", "suburb", "postcode",
          "state", "date_of_birth")
RULES = (["given_name", "surname"], ["surname", "date_of_birth"],
         ["given_name", "date_of_birth"], ["postcode", "street_number"],
         ["suburb", "address_1"], ["postcode", "surname"], ["date_of_birth", "suburb"],
         ["street_number", "address_1"])
KW = dict(fields=[{"on": [c]} for c in FIELDS], blocking=[{"on": r} for r in RULES],
          model="fellegi-sunter", top_k=3, seed=0, sigma=0.5)


@pytest.fixture(scope="module")
def febrl3() -> tuple[pd.DataFrame, pd.DataFrame, np.ndarray]:
    """FEBRL3's duplicates of 400 of its originals (one to five each) and those originals:
    (duplicates, originals, true (duplicate row, original row) pairs)."""
    d = read_shipped("febrl3.csv.gz", dtype=str, keep_default_na=False)
    entity = d["rec_id"].str.extract(r"rec-(\d+)-")[0].astype(int)
    org = d["rec_id"].str.endswith("-org")
    with_dups = sorted(set(entity[~org]))
    chosen = set(np.random.default_rng(3).choice(with_dups, 400, replace=False).tolist())
    keep = entity.isin(chosen)
    originals = d[keep & org].reset_index(drop=True)
    duplicates = d[keep & ~org].reset_index(drop=True)
    where = {e: i for i, e in enumerate(entity[keep & org])}
    truth = np.array([(i, where[e]) for i, e in enumerate(entity[keep & ~org])])
    return duplicates, originals, truth


@pytest.fixture(scope="module")
def febrl4() -> tuple[pd.DataFrame, pd.DataFrame, np.ndarray]:
    """600 FEBRL4 originals and their 600 duplicates, in another order."""
    a = read_shipped("febrl4a.csv.gz", dtype=str, keep_default_na=False).iloc[:600]
    b = read_shipped("febrl4b.csv.gz", dtype=str, keep_default_na=False)
    ea = a["rec_id"].str.extract(r"rec-(\d+)-")[0].astype(int)
    eb = b["rec_id"].str.extract(r"rec-(\d+)-")[0].astype(int)
    b = b[eb.isin(set(ea))].sample(frac=1.0, random_state=2).reset_index(drop=True)
    where = {e: i for i, e in enumerate(ea)}
    truth = np.array([(where[e], j) for j, e in
                      enumerate(b["rec_id"].str.extract(r"rec-(\d+)-")[0].astype(int))])
    return a.reset_index(drop=True), b, truth


def _measured(links: vflink.Links, truth: np.ndarray) -> dict[str, float]:
    chosen = links.frame[links.frame["match"]]
    return measure(chosen["primary_index"].to_numpy(), chosen["secondary_index"].to_numpy(),
                   truth[:, 0], truth[:, 1])


@pytest.mark.parametrize("way", ["many-to-one", "one-to-many"])
def test_duplicates_are_found_and_each_keeps_its_match_without_naming_the_cardinality(
        febrl3: tuple[pd.DataFrame, pd.DataFrame, np.ndarray], way: str) -> None:
    duplicates, originals, truth = febrl3
    a, b = (duplicates, originals) if way == "many-to-one" else (originals, duplicates)
    if way == "one-to-many":
        truth = truth[:, ::-1]
    links = vflink.link(a, b, **{**KW, "top_k": 6})  # type: ignore[arg-type]
    measured = _measured(links, truth)
    model = links.summary["model"]
    card = model["cardinality"]
    assert card["cardinality"] == way and not card["given"]
    side = "primary" if way == "many-to-one" else "secondary"
    assert f"the {side} holds duplicates" in card["why"]
    assert any(f"the {side} holds duplicates" in d for d in card["duplicates"])
    assert measured["f1"] >= 0.98
    est = model["estimated"]
    assert est["trusted"] and abs(est["f1"] - measured["f1"]) <= 0.05
    assert abs(est["recall"] - measured["recall"]) <= 0.05
    if way == "one-to-many":  # an original's duplicates beyond K links are said to be left out
        fewer = vflink.link(a, b, **{**KW, "top_k": 1})  # type: ignore[arg-type]
        warned = fewer.summary["model"]["diagnostics"]["warnings"]
        assert any("more matches than top_k = 1" in w for w in warned)
        assert abs(fewer.summary["model"]["estimated"]["f1"]
                   - _measured(fewer, truth)["f1"]) <= 0.05


def test_a_one_to_one_model_on_duplicated_tables_says_its_estimate_cannot_be_trusted(
        febrl3: tuple[pd.DataFrame, pd.DataFrame, np.ndarray]) -> None:
    """The failure this replaces: the one-to-one posterior splits each original's match
    among its duplicates, and the estimate, instead of a confident 0.9, is withheld."""
    duplicates, originals, truth = febrl3
    links = vflink.link(duplicates, originals, cardinality="one-to-one", **KW)  # type: ignore[arg-type]
    model = links.summary["model"]
    assert model["cardinality"]["cardinality"] == "one-to-one"
    assert model["cardinality"]["why"] == "given"
    assert _measured(links, truth)["f1"] < 0.8
    est = model["estimated"]
    assert not est["trusted"] and est["f1"] is None
    assert any("between 0.2 and 0.8" in r for r in est["reasons"])
    assert "estimated_f1" not in links.alignment.meta  # not released to the primary either


def test_a_many_to_many_link_has_clusters(
        febrl3: tuple[pd.DataFrame, pd.DataFrame, np.ndarray]) -> None:
    duplicates, _, _ = febrl3
    half = len(duplicates) // 2
    links = vflink.link(duplicates.iloc[:half], duplicates.iloc[half:].reset_index(drop=True),
                        cardinality="many-to-many", **KW)  # type: ignore[arg-type]
    clusters = links.summary["model"]["clusters"]
    table = links.clusters()
    assert len(table) == len(duplicates)
    sizes = table.groupby("cluster").size()
    assert int((sizes >= 2).sum()) == clusters["clusters"] > 0
    assert int(sizes.max()) == clusters["largest"]
    # every matched link joins its two records
    matched = links.frame[links.frame["match"]]
    cp = table[table["party"] == "primary"].set_index("index")["cluster"]
    cs = table[table["party"] == "secondary"].set_index("index")["cluster"]
    assert (cp[matched["primary_index"]].to_numpy()
            == cs[matched["secondary_index"]].to_numpy()).all()


def test_fields_paired_the_wrong_way_round_are_named_and_the_estimate_withheld(
        febrl4: tuple[pd.DataFrame, pd.DataFrame, np.ndarray],
        caplog: pytest.LogCaptureFixture) -> None:
    a, b, _ = febrl4
    fields = [{"on": "given_name", "secondary_on": "surname"},
              {"on": "surname", "secondary_on": "given_name"},
              *({"on": c} for c in FIELDS[2:])]
    with caplog.at_level(logging.WARNING):
        links = vflink.link(a, b, **{**KW, "fields": fields})  # type: ignore[arg-type]
    assert "fields given_name and surname look swapped" in caplog.text
    est = links.summary["model"]["estimated"]
    assert est["f1"] is None and any("look swapped" in r for r in est["reasons"])
    # the fields as paired: no such word
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        right = vflink.link(a, b, **KW)  # type: ignore[arg-type]
    assert "swapped" not in caplog.text and right.summary["model"]["estimated"]["trusted"]


def test_dates_written_differently_block_together(
        febrl4: tuple[pd.DataFrame, pd.DataFrame, np.ndarray]) -> None:
    a, b, truth = febrl4
    b = b.copy()
    b["date_of_birth"] = [f"{x[6:8]}/{x[4:6]}/{x[:4]}" if len(x) == 8 else x
                          for x in b["date_of_birth"]]
    links = vflink.link(a, b, **{**KW, "blocking": [{"on": "date_of_birth"}]})  # type: ignore[arg-type]
    rule = links.summary["model"]["blocking_rules"][0]
    assert rule["rule"] == "date_of_birth" and rule["comparisons"] > len(truth) // 2
    same = np.mean([a["date_of_birth"][i] == b["date_of_birth"][j].replace("/", "")[4:]
                    + b["date_of_birth"][j][3:5] + b["date_of_birth"][j][:2]
                    if b["date_of_birth"][j] else False for i, j in truth])
    assert _measured(links, truth)["recall"] >= same - 0.02
    # one rule on the date: how many matches have another date cannot be seen, and is said
    est = links.summary["model"]["estimated"]
    assert est["recall"] is None
    assert any("every blocking rule requires date_of_birth" in r for r in est["reasons"])


def test_a_rule_that_finds_nothing_is_named(
        febrl4: tuple[pd.DataFrame, pd.DataFrame, np.ndarray],
        caplog: pytest.LogCaptureFixture) -> None:
    a, b, _ = febrl4
    blocking = [*KW["blocking"], {"on": "given_name", "secondary_on": "postcode"}]  # type: ignore[misc]
    with caplog.at_level(logging.WARNING):
        vflink.link(a, b, **{**KW, "blocking": blocking})  # type: ignore[arg-type]
    assert "blocking rule given_name makes 0 comparisons" in caplog.text


def test_the_private_default_holds_or_refuses_saying_what_it_would_give(
        febrl4: tuple[pd.DataFrame, pd.DataFrame, np.ndarray],
        caplog: pytest.LogCaptureFixture, tmp_path: Path) -> None:
    a, b, _ = febrl4
    kw = {k: v for k, v in KW.items() if k != "sigma"}
    out = tmp_path / "links.csv"
    with pytest.raises(LinkageError) as refused:
        vflink.link(a, b, out=out, **kw)  # type: ignore[arg-type]
    text = str(refused.value)
    assert "private default noise (greedy-attack bound τ = 0.05" in text
    assert "choose tau ≥" in text and "almost no protection" in text
    assert not out.exists()  # nothing written
    feasible = float(text.split("choose tau ≥ ")[1].split(" ")[0])
    with caplog.at_level(logging.WARNING):
        links = vflink.link(a, b, tau=feasible, **kw)  # type: ignore[arg-type]
    assert links.summary["tau"] == pytest.approx(feasible, rel=1e-6)
    assert "the similarities' protection: τ =" in caplog.text


# --- the silent mistakes, refused in one wording -----------------------------------------------


def _file(tmp: Path, body: str) -> Path:
    pd.DataFrame({"name": ["anna", "bert"], "x": [1.0, 2.0], "y": [3.0, 4.0]}).to_csv(
        tmp / "p.csv", index=False)
    pd.DataFrame({"name": ["anna", "bart"], "x": [1.0, 2.5], "y": [3.0, 4.0]}).to_csv(
        tmp / "s.csv", index=False)
    path = tmp / "link.toml"
    path.write_text('[link]\nprimary = "p.csv"\nsecondary = "s.csv"\ntop_k = 1\n'
                    f'out = "l.csv"\n{body}\n')
    return path


@pytest.mark.parametrize(("api", "file", "flags", "said"), [
    ({"on": "x,y", "metric": "euclidean", "threshold": 0.9},
     'on = "x,y"\nmetric = "euclidean"\nthreshold = 0.9',
     ["--on", "x,y", "--metric", "euclidean", "--threshold", "0.9"],
     "`threshold` decide(s) among a model's matches, and this link has no model"),
    ({"on": "name", "model": "fellegi-sunter", "mode": "exact"},
     'on = "name"\nmodel = "fellegi-sunter"\nmode = "exact"',
     ["--on", "name", "--model", "fellegi-sunter", "--mode", "exact"],
     "mode = \"exact\" keeps only identical identifiers"),
    ({"on": "name,x,y", "model": "fellegi-sunter"},
     'on = "name,x,y"\nmodel = "fellegi-sunter"',
     ["--on", "name,x,y", "--model", "fellegi-sunter"],
     "`on` names 3 columns (name, x, y), which a model link would compare as ONE field"),
    ({"on": "name", "model": "fellegi-sunter", "cardinality": "one-to-few"},
     'on = "name"\nmodel = "fellegi-sunter"\ncardinality = "one-to-few"', None,
     "`cardinality` must be one of one-to-one, many-to-one, one-to-many, many-to-many"),
    ({"on": "name", "model": "fellegi-sunter", "cardinality": "many-to-one",
      "one_to_one": True},
     'on = "name"\nmodel = "fellegi-sunter"\ncardinality = "many-to-one"\none_to_one = true',
     ["--on", "name", "--model", "fellegi-sunter", "--cardinality", "many-to-one",
      "--one-to-one", "optimal"],
     "contradicts cardinality = 'many-to-one'"),
])
def test_mistakes_are_refused_alike_by_the_api_the_command_and_a_link_file(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], api: dict[str, object],
        file: str, flags: list[str] | None, said: str) -> None:
    path = _file(tmp_path, file)
    with pytest.raises(ConfigError) as info:
        vflink.link(tmp_path / "p.csv", tmp_path / "s.csv", top_k=1, **api)  # type: ignore[arg-type]
    assert said in str(info.value)
    assert main(["link", "--config", str(path)]) == 2
    assert said in " ".join(capsys.readouterr().err.split())
    if flags is not None:
        assert main(["link", "--primary", str(tmp_path / "p.csv"), "--secondary",
                     str(tmp_path / "s.csv"), "--top-k", "1", "--out",
                     str(tmp_path / "f.csv"), *flags]) == 2
        assert said in " ".join(capsys.readouterr().err.split())
    assert not (tmp_path / "l.csv").exists() and not (tmp_path / "f.csv").exists()


def test_truth_that_cannot_be_measured_is_refused(
        febrl4: tuple[pd.DataFrame, pd.DataFrame, np.ndarray], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    a, b, truth = febrl4
    links = vflink.link(a, b, **KW)  # type: ignore[arg-type]
    assert links.evaluate(truth)["measured"]["f1"] > 0.9
    with pytest.raises(DataError, match="truth holds no pair"):
        links.evaluate(np.zeros((0, 2), dtype=np.int64))
    with pytest.raises(DataError, match="truth holds no pair"):
        links.evaluate(pd.DataFrame({"primary_index": [], "secondary_index": []}))
    bad = np.vstack([truth, [[600, 3], [5, 900]]])
    with pytest.raises(DataError) as out_of_range:
        links.evaluate(bad)
    text = str(out_of_range.value)
    assert "primary_index is outside the primary table's 600 rows at row 600 (600)" in text
    assert "secondary_index is outside the secondary table's 600 rows at row 601 (900)" in text
    with pytest.raises(DataError, match="truth's columns look swapped"):
        links.evaluate(truth[:, ::-1])
    # the command refuses a --truth file out of range the same way, before writing a figure
    a.to_csv(tmp_path / "a.csv", index=False)
    b.to_csv(tmp_path / "b.csv", index=False)
    pd.DataFrame(bad, columns=["primary_index", "secondary_index"]).to_csv(
        tmp_path / "truth.csv", index=False)
    fields = "\n".join(f'[[link.fields]]\non = ["{c}"]' for c in FIELDS)
    rules = "\n".join(f"[[link.blocking]]\non = {json.dumps(r)}" for r in RULES)
    (tmp_path / "link.toml").write_text(
        '[link]\nprimary = "a.csv"\nsecondary = "b.csv"\nout = "links.csv"\ntop_k = 1\n'
        f'model = "fellegi-sunter"\nseed = 0\nsigma = 0.5\n{fields}\n{rules}\n')
    assert main(["link", "--config", str(tmp_path / "link.toml"), "--truth",
                 str(tmp_path / "truth.csv")]) != 0
    assert "outside the primary table's 600 rows" in capsys.readouterr().err


def test_levenshtein_between_numeric_columns_is_warned(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    p = pd.DataFrame({"price": [12, 15, 99, 40]})
    s = pd.DataFrame({"year": [1990, 2001, 2015, 1987, 2020]})
    with caplog.at_level(logging.WARNING):
        vflink.link(p, s, on="price", secondary_on="year", metric="levenshtein", top_k=1,
                    tau=1.0)
    assert "levenshtein compares" in caplog.text and "both hold numbers" in caplog.text
    assert "do not even overlap ([12, 99] against [1987, 2020])" in caplog.text


def test_a_streamed_link_in_the_primary_view_leaves_the_distance_out(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    for name, n in (("p", 40), ("s", 60)):
        pd.DataFrame({"x": rng.normal(size=n), "y": rng.normal(size=n)}).to_csv(
            tmp_path / f"{name}.csv", index=False)
    kw = dict(on="x,y", metric="euclidean", top_k=2, seed=0, tau=1.0, view="primary")
    streamed = vflink.link(tmp_path / "p.csv", tmp_path / "s.csv", stream=True,
                           out=tmp_path / "st.csv", **kw)  # type: ignore[arg-type]
    memory = vflink.link(tmp_path / "p.csv", tmp_path / "s.csv", stream=False,
                         out=tmp_path / "mem.csv", **kw)  # type: ignore[arg-type]
    assert list(pd.read_csv(tmp_path / "st.csv").columns) == [
        "primary_index", "secondary_index", "rank", "similarity"]
    assert (tmp_path / "st.csv").read_bytes() == (tmp_path / "mem.csv").read_bytes()
    assert streamed.summary["view"] == "primary" and "distance" not in streamed.summary["columns"]
    assert memory.summary["columns"] == streamed.summary["columns"]


def test_without_rules_the_nearest_candidates_are_taken_as_complete_only_when_said(
        febrl4: tuple[pd.DataFrame, pd.DataFrame, np.ndarray],
        monkeypatch: pytest.MonkeyPatch) -> None:
    from vflink.linkage import model_link

    a, b, truth = febrl4
    monkeypatch.setattr(model_link, "ALL_PAIRS", 1000)  # search each record's nearest
    links = vflink.link(a, b, **{**KW, "blocking": None})  # type: ignore[arg-type]
    model = links.summary["model"]
    assert model["candidate_pairs"] == 600 * 10
    recall = model["diagnostics"]["blocking_recall"]
    assert recall["recall"] == 1.0 and "each record's 10 nearest" in recall["reason"]
    assert abs(model["estimated"]["f1"] - _measured(links, truth)["f1"]) <= 0.05
