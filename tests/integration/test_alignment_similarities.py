"""A primary that asks for its alignment without the similarities (``vflink link``, whose
product is the links file): the same links, indices, matches and meta as with them, no
float32 copy made, over both transports."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

import vflink
from tests.helpers.network import bank_federation
from tests.helpers.tables import places_frames
from vflink.data.schema import PartySchema
from vflink.data.table import PartyTable
from vflink.errors import PolicyViolation
from vflink.linkage import soft
from vflink.parties.coordinator import CoordinatorParty
from vflink.parties.link_peer import LinkingPeer
from vflink.parties.linking import AlignmentInitiator
from vflink.parties.policy import DEFAULT_MAX_COMBINED_TAU, PartyPolicy
from vflink.protocol import AlignmentView
from vflink.runner.encoding import encoding_for
from vflink.runner.local import local_roles
from vflink.transport import InProcessHub, Transcript

SECRET = "a-test-secret-shared-by-the-data-parties"
ON = ("lat", "lon")


def _frames() -> tuple[pd.DataFrame, pd.DataFrame]:
    primary, bank, _ = places_frames(seed=5)
    return primary, bank


def _counting(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the float32 copies of Eq. 1's similarities that a linkage's alignment makes."""
    made: list[int] = []
    real = soft._eq1_float32

    def counted(d: np.ndarray, mu0: float, sigma0: float, out: np.ndarray) -> None:
        made.append(d.size)
        real(d, mu0, sigma0, out)

    monkeypatch.setattr(soft, "_eq1_float32", counted)
    return made


def _views(transcript: Transcript) -> list[AlignmentView]:
    return [v for r in transcript.records for v in getattr(r.message, "views", ())]


@pytest.mark.parametrize("privacy", ["off", "bloom"])
def test_the_api_without_alignment_similarities_links_the_same(
        privacy: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VFLINK_SECRET", SECRET)
    primary, bank = _frames()
    options = {"on": list(ON), "metric": "euclidean", "top_k": 3, "privacy": privacy,
               "seed": 4, **({"sigma": 0.1} if privacy == "bloom" else {})}
    whole = vflink.link(primary, bank, **options)
    made = _counting(monkeypatch)
    light = vflink.link(primary, bank, alignment_similarities=False, **options)
    assert made == []  # no float32 copy of the similarities (a noisy link's neither)
    pd.testing.assert_frame_equal(light.frame, whole.frame)
    assert light.alignment.similarity is None
    assert whole.alignment.similarity is not None
    np.testing.assert_array_equal(light.alignment.secondary_index,
                                  whole.alignment.secondary_index)
    assert light.alignment.meta == whole.alignment.meta  # μ0, σ0, σ, τ, ε: still the primary's
    assert light.summary["epsilon"] == whole.summary["epsilon"]


def test_the_option_is_refused_unless_true_or_false() -> None:
    with pytest.raises(vflink.ConfigError, match="`alignment_similarities` must be true or false"):
        vflink.link(pd.DataFrame({"x": [1.0]}), pd.DataFrame({"x": [1.0]}), on="x",
                    metric="euclidean", top_k=1, privacy="off", alignment_similarities="no")


def test_the_link_command_makes_no_float32_copy(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from vflink.cli.main import main

    monkeypatch.setenv("VFLINK_SECRET", SECRET)
    primary, bank = _frames()
    primary.to_parquet(tmp_path / "p.parquet")
    bank.to_parquet(tmp_path / "s.parquet")
    made = _counting(monkeypatch)
    out = tmp_path / "links.parquet"
    assert main(["link", "--primary", str(tmp_path / "p.parquet"), "--secondary",
                 str(tmp_path / "s.parquet"), "--on", "lat,lon", "--metric", "euclidean",
                 "--top-k", "3", "--privacy", "off", "--out", str(out)]) == 0
    assert made == []
    expected = vflink.link(primary, bank, on=list(ON), metric="euclidean", top_k=3,
                           privacy="off").frame
    got = pq.read_table(out).to_pandas()
    np.testing.assert_array_equal(got["secondary_index"], expected["secondary_index"])
    np.testing.assert_array_equal(got["similarity"], expected["similarity"])


def _in_process(primary: pd.DataFrame, bank: pd.DataFrame, transcript: Transcript,
                similarities: bool) -> dict[str, object]:
    return _soft(_parties(primary, bank, transcript), primary, similarities)


def _parties(primary: pd.DataFrame, bank: pd.DataFrame,
             transcript: Transcript | None = None,
             max_combined_tau: float = 1.0) -> AlignmentInitiator:
    hub = InProcessHub(transcript=transcript)
    roles = local_roles("primary", ["bank"])
    policy = PartyPolicy.permissive(identifiers="any")
    hub.register("coordinator", CoordinatorParty(
        "coordinator", seed=0, roles=roles,
        policy=dataclasses.replace(policy, max_combined_tau=max_combined_tau)))
    schema = PartySchema(name="bank", role="secondary", identifiers=ON)
    hub.register("bank", LinkingPeer(PartyTable(schema, bank, "bank"), hub.channel("bank"),
                                     secret=SECRET.encode(), roles=roles, policy=policy))
    return AlignmentInitiator("primary", primary, hub.channel("primary"),
                              secondaries=("bank",), identifiers=ON,
                              secret=SECRET.encode(), policy=policy)


def _soft(initiator: AlignmentInitiator, primary: pd.DataFrame,
          similarities: bool, sigma: float = 1.0) -> dict[str, object]:
    spec, metric = encoding_for("euclidean", bloom=True, sides=[(primary, ON)], margin=0.1)
    session = f"s-{similarities}"  # a linked session is immutable: one per request
    initiator.send_identifiers("coordinator", spec, session=session)
    return initiator.request_soft_link("coordinator", metric=metric, top_k=3, sigma=sigma,
                                       session=session, similarities=similarities)


def test_a_declined_view_is_still_charged_to_the_primary(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A primary that asks for its view without the similarities, then for them in another
    session, gets the second refused where two releases together would exceed the policy's
    combined τ: declining the view does not take the release off its noise budget (the
    similarities reach the operator's links all the same)."""
    monkeypatch.setenv("VFLINK_SECRET", SECRET)
    primary, bank = _frames()
    initiator = _parties(primary, bank, max_combined_tau=DEFAULT_MAX_COMBINED_TAU)
    _soft(initiator, primary, False, sigma=0.1)
    with pytest.raises(PolicyViolation, match="combined_noise|averaged"):
        _soft(initiator, primary, True, sigma=0.1)


@pytest.mark.network
def test_the_primary_view_without_similarities_over_both_transports(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The coordinator's answer to ``SoftLink(similarities=False)``: the primary's view with
    its indices, meta and matches and no similarities, the same over gRPC as in process
    (the flag travels); with ``True``, the similarities as before."""
    monkeypatch.setenv("VFLINK_SECRET", SECRET)
    primary, bank = _frames()
    got = {}
    for similarities in (True, False):
        transcript = Transcript()
        local = _in_process(primary, bank, transcript, similarities)["bank"]
        views = _views(transcript)
        assert len(views) == 1 and (views[0].similarity is None) is (not similarities)
        assert views[0].meta["sigma0"] > 0  # the primary still learns Eq. 1's scale
        got[("inprocess", similarities)] = local
    primary.to_csv(tmp_path / "primary.csv", index=False)
    bank.to_csv(tmp_path / "bank.csv", index=False)
    tables = {"primary": {"path": str(tmp_path / "primary.csv"), "identifiers": list(ON),
                          "numeric": ["p0"], "label": "y", "task": "binary"},
              "bank": {"path": str(tmp_path / "bank.csv"), "identifiers": list(ON),
                       "numeric": ["s0"]}}
    with bank_federation(tmp_path / "grpc", seed=0, tables=tables,
                         run_id="t") as federation:
        for similarities in (True, False):
            initiator = AlignmentInitiator(
                "primary", primary, federation.channel,  # type: ignore[attr-defined]
                secondaries=("bank",), identifiers=ON, secret=SECRET.encode(),
                policy=federation.policy)  # type: ignore[attr-defined]
            got[("grpc", similarities)] = _soft(initiator, primary, similarities)["bank"]
    for transport in ("inprocess", "grpc"):
        full, light = got[(transport, True)], got[(transport, False)]
        assert full.similarity is not None and light.similarity is None  # type: ignore[attr-defined]
        np.testing.assert_array_equal(light.secondary_index,  # type: ignore[attr-defined]
                                      full.secondary_index)  # type: ignore[attr-defined]
    np.testing.assert_array_equal(got[("grpc", False)].secondary_index,  # type: ignore[attr-defined]
                                  got[("inprocess", False)].secondary_index)  # type: ignore[attr-defined]
