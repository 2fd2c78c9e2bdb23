"""`session.lineage`'s ancestors through a real daemon: each ancestor is carried as a whole
Session, settings included, and a fork child takes its source's settings, so a chain of forks
of a Session with settings of 900 KiB answered ~900 KiB per ancestor — up to 10,000 ancestors,
~9 GB built in the daemon for one reply (measured: 4 ancestors, a 3.7 MB reply). The
ancestors now carry their settings while those of the ancestors listed before (nearest first)
fit `LINEAGE_SETTINGS_CHARS` (~1 MiB); past it an ancestor's Session carries `settings: {}`
and `settingsOmitted: true`, as an event's does: `session.get` reads them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgpack
import pytest

from tests.daemon.test_fork_saga import fork, until_terminal
from tests.support.daemon import WS, DaemonProcess, create_session, run_turn
from transport.client import Client

pytestmark = pytest.mark.timeout(300)

SETTINGS = {"blob": "s" * (900 << 10)}
FORKS = 4


def _lineage(c: Client, sid: str) -> tuple[int, dict[str, Any]]:
    """The reply's size (msgpack, as it crossed the wire) and the reply."""
    answer = dict(c.call("session.lineage", {"workspaceId": WS, "agentSessionId": sid}))
    return len(msgpack.packb(answer, use_bin_type=True)), answer


def test_lineage_ancestors_carry_settings_only_within_the_reply_bound(tmp_path: Path) -> None:
    d = DaemonProcess(tmp_path / "home").start()
    try:
        c = d.client(timeout=60)
        chain = [create_session(c, settings=SETTINGS)["agentSessionId"]]
        for _ in range(FORKS):
            turn = run_turn(c, chain[-1], f"turn of {len(chain)}")
            op = until_terminal(c, fork(c, chain[-1], turn["turnId"])[1])
            assert op["status"] == "committed", op
            chain.append(op["targetAgentSessionId"])
        size, answer = _lineage(c, chain[-1])
        ancestors = answer["ancestors"]
        assert [a["agentSessionId"] for a in ancestors] == chain[-2::-1]
        assert size < 2 << 20, size
        # Nearest first: the first carries its settings whole, the rest say they left them out.
        assert ancestors[0]["session"]["settings"] == SETTINGS
        assert "settingsOmitted" not in ancestors[0]["session"]
        for ancestor in ancestors[1:]:
            assert ancestor["session"]["settings"] == {}, ancestor["agentSessionId"]
            assert ancestor["session"]["settingsOmitted"] is True
            aid = ancestor["agentSessionId"]
            got = c.call("session.get", {"workspaceId": WS, "agentSessionId": aid})
            assert got["session"]["settings"] == SETTINGS
            assert "settingsOmitted" not in got["session"]
        # The Session's own row stays whole.
        assert answer["session"]["settings"] == SETTINGS
    finally:
        d.stop()
