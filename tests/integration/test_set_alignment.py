"""PSU and PSI between parties over both transports, against plaintext set operations, and the
transcript contract: only shuffled lists of group elements, sized as App. A's simulators say."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers.network import free_port, served_in_threads
from vflink.alignment import psu
from vflink.alignment._dh import key_bytes
from vflink.alignment.groups import get_group
from vflink.cli.main import main
from vflink.data.schema import PartySchema
from vflink.data.table import PartyTable
from vflink.protocol.messages import Ack, Message
from vflink.runfiles.party import load_party_config
from vflink.runner.align import align_in_process, align_over_network, key_table
from vflink.transport import Transcript
from vflink.transport.grpc import create_dev_pki

GROUP_NAMES = ("ristretto255", "modp2048")


def table(keys: list[str], name: str) -> PartyTable:
    frame = pd.DataFrame({"id": pd.Series(keys, dtype="string")})
    return PartyTable(PartySchema(name=name, role="secondary", key=("id",)), frame, name)




def check_psu(ka: list[str], kp: list[str], a_frame: pd.DataFrame, p_frame: pd.DataFrame
              ) -> None:
    ua = dict(zip([ka[r] for r in a_frame["row"]], a_frame["uid"]))
    up = dict(zip([kp[r] for r in p_frame["row"]], p_frame["uid"]))
    assert len(ua) == len(ka) and len(up) == len(kp)
    assert len(set(ua.values()) | set(up.values())) == len(set(ka) | set(kp))
    for k in set(ka) & set(kp):
        assert ua[k] == up[k]
    assert not {ua[k] for k in set(ka) - set(kp)} & set(up.values())
    assert not {up[k] for k in set(kp) - set(ka)} & set(ua.values())


def check_psi(ka: list[str], kp: list[str], a_frame: pd.DataFrame, p_frame: pd.DataFrame
              ) -> None:
    both = set(ka) & set(kp)
    ua = dict(zip([ka[r] for r in a_frame["row"]], a_frame["uid"]))
    up = dict(zip([kp[r] for r in p_frame["row"]], p_frame["uid"]))
    assert set(ua) == both and set(up) == both
    assert ua == up


keys = st.lists(st.integers(0, 30).map(lambda i: f"k{i:03d}"), max_size=10, unique=True)
#: the primary aligns at least one record (a peer's n_a must be positive)
primary_keys = st.lists(st.integers(0, 30).map(lambda i: f"k{i:03d}"), min_size=1,
                        max_size=10, unique=True)


@pytest.mark.parametrize("group", GROUP_NAMES)
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(a=primary_keys, p=keys)
def test_in_process_matches_plaintext(group: str, a: list[str], p: list[str]) -> None:
    out = align_in_process(table(a, "primary"), table(p, "bank"), method="psu", group=group,
                           workers=1)
    assert out.secondary is not None
    check_psu(a, p, out.primary.frame(), out.secondary.frame())
    out = align_in_process(table(a, "primary"), table(p, "bank"), method="psi", group=group,
                           workers=1)
    assert out.secondary is not None
    check_psi(a, p, out.primary.frame(), out.secondary.frame())
    hidden = align_in_process(table(a, "primary"), table(p, "bank"), method="psi",
                              group=group, reveal="cardinality", workers=1)
    assert hidden.primary.size == len(set(a) & set(p)) and len(hidden.primary.rows) == 0


def _arrays(message: Message) -> dict[str, np.ndarray]:
    return {f.name: getattr(message, f.name) for f in dataclasses.fields(message)
            if isinstance(getattr(message, f.name), np.ndarray)}


@pytest.mark.parametrize("group", GROUP_NAMES)
def test_psu_transcript_is_what_the_simulators_produce(group: str) -> None:
    ka = [f"alice-{i}@example.org" for i in range(9)]
    kp = [f"alice-{i}@example.org" for i in range(5, 17)]
    transcript = Transcript()
    align_in_process(table(ka, "primary"), table(kp, "bank"), method="psu", group=group,
                     workers=1, transcript=transcript)
    g = get_group(group)
    n_a, n_p, n_both = len(ka), len(kp), 4
    sim_a = psu.simulate_active_view(g, n_a, n_p, n_both)   # what the primary receives
    sim_p = psu.simulate_passive_view(g, n_a, n_p, n_both)  # what the secondary receives
    received: dict[str, dict[str, int]] = {"primary": {}, "bank": {}}
    forbidden = [k.encode() for k in ka + kp]
    forbidden += [bytes(h) for h in g.hash_to_group(key_bytes(
        table(sorted(set(ka + kp)), "x").frame, ("id",)))]
    for record in transcript.records:
        m = record.message
        if isinstance(m, Ack):
            # the closing Acks carry nothing; the opening one the secondary's set size, the
            # chunk size it accepts and its policy's public figures only (the idle expiry and
            # the dictionary limit)
            assert m.info == {} or set(m.info) == {"n_p", "chunk_rows", "idle_s",
                                                   "guess_limit", "guess_window_s"}, m.info
            assert m.info.get("n_p", n_p) == n_p
            continue
        arrays = _arrays(m)
        others = {f.name for f in dataclasses.fields(m)} - set(arrays)
        # chunked lists: sizes, chunk positions and the list's name travel too
        assert others <= {"session", "group", "n_a", "chunk_rows", "stream", "index",
                          "total"}, others
        for arr in arrays.values():
            name = m.stream  # type: ignore[attr-defined]
            g.validate(arr, name)  # every row a group element
            assert len(np.unique(arr, axis=0)) == len(arr)
            blob = arr.tobytes()
            assert not any(f in blob for f in forbidden)  # no key text, no hash of one
            got = received[record.receiver if record.receiver != "primary" else "primary"]
            got[name] = got.get(name, 0) + len(arr)
    names_a = {"a_s1t1": "a_s1t1", "p_t1": "p_t1", "union": "union", "a_s1t123": "a_s1t123",
               "p_t2": "p_t2"}
    assert received["primary"] == {names_a[k]: len(v) for k, v in sim_a.items()}
    names_p = {"a_s1": "a_s1", "p_s1t1": "p_s1t1", "union_s123t1": "union_s123t1",
               "p_s123t2": "p_s123t2"}
    assert received["bank"] == {names_p[k]: len(v) for k, v in sim_p.items()}
    # shuffled: the first list is not in the primary's record order
    first = next(r.message for r in transcript.records if _arrays(r.message))
    assert not (_arrays(first)["elements"] == g.hash_to_group([k.encode() for k in ka])).all()


def _party_files(tmp: Path, secondary_csv: Path) -> tuple[Path, Path]:
    certs = tmp / "certs"
    create_dev_pki(certs, ["primary", "bank"])
    port = free_port()
    sec = tmp / "bank.toml"
    sec.write_text(
        f'version = 1\n[party]\nname = "bank"\nrole = "secondary"\nlisten = "127.0.0.1:{port}"\n'
        f'state_dir = "{tmp / "state"}"\ndeadline_s = 60\n'
        f'[party.table]\npath = "{secondary_csv}"\nkey = ["id"]\n'
        f'[peers.coordinator]\naddress = "127.0.0.1:{free_port()}"\nrole = "coordinator"\n'
        f'[security]\ntls_dir = "{certs}"\nallowed = ["primary"]\n')
    pri = tmp / "primary.toml"
    pri.write_text(
        f'version = 1\n[party]\nname = "primary"\nrole = "primary"\ndeadline_s = 120\n'
        f'[peers.bank]\naddress = "127.0.0.1:{port}"\nrole = "secondary"\n'
        f'[peers.coordinator]\naddress = "127.0.0.1:{free_port()}"\nrole = "coordinator"\n'
        f'[security]\ntls_dir = "{certs}"\n')
    return pri, sec


@pytest.mark.network
@pytest.mark.parametrize("group", GROUP_NAMES)
def test_over_grpc_with_party_files(group: str, tmp_path: Path,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VFLINK_SECRET", "not-used-by-psu-but-required-to-serve")
    rng = np.random.default_rng(1)
    ka = [f"{i:04d}" for i in rng.choice(60, 25, replace=False)]
    kp = [f"{i:04d}" for i in rng.choice(60, 30, replace=False)]
    pd.DataFrame({"id": kp, "x": np.arange(len(kp))}).to_csv(tmp_path / "bank.csv", index=False)
    pd.DataFrame({"id": ka}).to_csv(tmp_path / "mine.csv", index=False)
    pri, sec = _party_files(tmp_path, tmp_path / "bank.csv")
    primary = key_table(tmp_path / "mine.csv", ("id",), name="primary")
    local = {m: align_in_process(primary, key_table(tmp_path / "bank.csv", ("id",), name="bank"),
                                 method=m, group=group, workers=1) for m in ("psu", "psi")}
    seen: set[str] = set()
    with served_in_threads(sec):
        for method, check in (("psu", check_psu), ("psi", check_psi)):
            out = align_over_network(primary, load_party_config(pri), "bank", method=method,
                                     group=group, workers=1)
            # one file per session, named by the run's session: never rewritten by a peer
            seen.add(f"{out.primary.session}.parquet")
            theirs = pd.read_parquet(tmp_path / "state" / "alignments" / f"{out.primary.session}"
                                     ".parquet")
            check(ka, kp, out.primary.frame(), theirs)
            # the same payload bytes per direction as in-process
            assert out.communication == local[method].communication
        if group != "ristretto255":
            return  # the command's path is the group's own no more: once is enough
        # the CLI drives the served secondary from the primary's party file
        assert main(["align", "--method", "psu", "--primary", str(tmp_path / "mine.csv"),
                     "--on", "id", "--out", str(tmp_path / "cli"), "--party", str(pri),
                     "--group", group]) == 0
    (written,) = (p for p in (tmp_path / "state" / "alignments").glob("psu@*.parquet")
                  if p.name not in seen)
    theirs = pd.read_parquet(written)
    check_psu(ka, kp, pd.read_parquet(tmp_path / "cli" / "primary.parquet"), theirs)


def test_cli_in_process_keys_as_text(tmp_path: Path) -> None:
    # leading zeros survive: "007" and "7" are different keys
    pd.DataFrame({"id": ["007", "8", "x"], "v": [1, 2, 3]}).to_csv(tmp_path / "a.csv",
                                                                   index=False)
    pd.DataFrame({"id": ["7", "8", "y", "z"]}).to_parquet(tmp_path / "b.parquet")
    for method in ("psu", "psi"):
        out = tmp_path / method
        assert main(["align", "--method", method, "--primary", str(tmp_path / "a.csv"),
                     "--secondary", str(tmp_path / "b.parquet"), "--on", "id", "--out",
                     str(out)]) == 0
        a, b = pd.read_parquet(out / "primary.parquet"), pd.read_parquet(out / "secondary.parquet")
        summary = pd.read_json(out / "summary.json", typ="series")
        if method == "psu":
            check_psu(["007", "8", "x"], ["7", "8", "y", "z"], a, b)
            assert summary["sizes"]["union"] == 6
        else:
            assert list(a["row"]) == [1] and list(b["row"]) == [1]
            assert list(a["uid"]) == list(b["uid"])
        assert set(summary["bytes"]) == {"primary->secondary", "secondary->primary"}
