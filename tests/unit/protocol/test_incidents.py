"""An internal error's trace is in a file its message names (docs/how-to/separate-hosts.md,
"Errors across the boundary"): the peer learns the file's name, a caller in the same process
its path, and the file exists and holds the trace."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from vflink.errors import VflinkError
from vflink.protocol import Hello
from vflink.protocol.boundary import boundary_error, incident_log, with_local_trace
from vflink.protocol.messages import Message
from vflink.transport import InProcessHub


class _Broken:
    def handle(self, sender: str, message: Message) -> Message:
        raise ZeroDivisionError("a planted bug at /srv/bank/secret.csv")


@pytest.fixture
def logs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("VFLINK_LOG_DIR", str(tmp_path / "logs"))
    return tmp_path / "logs"


def _incident(err: BaseException) -> str:
    found = re.search(r"incident ([0-9a-f]{12})\]", str(err))
    assert found is not None, str(err)
    return found.group(1)


def test_the_peer_learns_the_file_name_and_the_file_holds_the_trace(logs: Path) -> None:
    try:
        raise ZeroDivisionError("a planted bug at /srv/bank/secret.csv")
    except ZeroDivisionError as exc:
        public = boundary_error(exc, "bank", "forward")
    incident = _incident(public)
    path = incident_log(incident)
    assert path.parent == logs and path.is_file()
    text = path.read_text()
    assert "Traceback" in text and "a planted bug" in text and "'bank'" in text
    # across the boundary: the file's name, never a local path or the exception's text
    assert path.name in str(public)
    assert str(logs) not in str(public) and "secret" not in str(public)


def test_a_caller_in_this_process_gets_the_path(logs: Path) -> None:
    hub = InProcessHub()
    hub.register("bank", _Broken())
    with pytest.raises(VflinkError, match="internal error in party 'bank'") as info:
        hub.channel("primary").call("bank", Hello(party="primary", role="primary"))
    path = incident_log(_incident(info.value))
    assert str(path) in str(info.value) and path.is_file()
    assert "a planted bug" in path.read_text()
    assert with_local_trace(info.value) is info.value  # named once, not again per hop


def test_an_incident_of_another_machine_keeps_its_file_name(logs: Path) -> None:
    err = VflinkError("internal error in party 'bank' while handling forward [internal, "
                      "incident 0123456789ab]; the trace is in that party's log folder, in "
                      "vflink-incident-0123456789ab.log")
    assert with_local_trace(err) is err  # no such file here: the message stays as it is
