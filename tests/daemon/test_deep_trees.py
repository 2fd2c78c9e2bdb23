"""Deep and wide fork trees answer through a real daemon: `session.lineage` of a 600-level chain
(read from the top it stops at `maxDepth` with a typed `depth` marker on the node to go on from,
and read from the leaf it lists all 600 ancestors) and of a Session with 5,000 forks (all listed,
or paged with `maxNodes` / `afterOrdinal` and a typed `nodes` marker). The trees are built
through the public store API (one real fork, replicated) before the daemon starts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench.fork_trees import build_tree
from storage.store import Store
from tests.daemon.test_fork_full_session import fork_latest
from tests.support.daemon import WS, DaemonProcess, create_session, run_turn
from transport.client import ApiError, Client

pytestmark = pytest.mark.timeout(120)


def lineage(c: Client, sid: str, **extra: Any) -> dict[str, Any]:
    return dict(c.call("session.lineage", {"workspaceId": WS, "agentSessionId": sid, **extra}))


def build(home: Path, shape: str, size: int) -> tuple[str, list[str]]:
    home.mkdir(parents=True)
    store = Store.open(home / "store.sqlite3")
    try:
        return build_tree(store, WS, shape, size)
    finally:
        store.close()


def levels(nodes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A chain's nodes from the top down (each has at most one child)."""
    out = []
    while nodes:
        (node,) = nodes
        out.append(node)
        nodes = node["children"]
    return out


def test_lineage_of_a_600_level_chain_answers_in_typed_pages(tmp_path: Path) -> None:
    root, forks = build(tmp_path / "home", "chain", 600)
    d = DaemonProcess(tmp_path / "home").start()
    try:
        c = d.client()
        top = lineage(c, root)
        down = levels(top["descendants"])
        assert [n["agentSessionId"] for n in down] == forks[:100]  # the default maxDepth
        assert all(n["ordinal"] == 1 for n in down)
        assert top["truncated"] == {
            "reason": "depth",
            "maxDepth": 100,
            "maxNodes": 10_000,
            "omittedChildren": 0,
            "ancestors": False,
        }
        assert down[-1]["truncated"] == {"reason": "depth", "omittedChildren": 1}
        assert all("truncated" not in n for n in down[:-1])

        # Going on from each cut node reaches the leaf; 300 levels fit in one reply.
        seen, at = [], root
        while True:
            page = lineage(c, at, maxDepth=300)
            chain = levels(page["descendants"])
            seen += [n["agentSessionId"] for n in chain]
            if page["truncated"] is None:
                break
            at = chain[-1]["agentSessionId"]
        assert seen == forks

        leaf = lineage(c, forks[-1])
        assert [a["agentSessionId"] for a in leaf["ancestors"]] == [*reversed(forks[:-1]), root]
        assert leaf["ancestors"][-1]["lineage"] is None
        assert leaf["descendants"] == [] and leaf["truncated"] is None

        # The bounds are checked: a typed 400, and the daemon goes on serving.
        for bad in ({"maxDepth": 0}, {"maxDepth": 301}, {"maxNodes": 10_001}, {"afterOrdinal": -1}):
            with pytest.raises(ApiError) as err:
                lineage(c, root, **bad)
            assert err.value.status == 400, bad
        assert lineage(c, forks[300], maxDepth=1)["truncated"]["reason"] == "depth"
        # `agenthost tree` draws the page and says where to go on.
        done = subprocess.run(
            [sys.executable, "-m", "agenthost.cli", "--home", str(d.home), "--workspace", WS]
            + ["tree", root],
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
        )
        assert done.returncode == 0, done.stderr
        assert f"1 more fork below: agenthost tree {forks[99]}" in done.stdout
    finally:
        d.stop()


def test_lineage_of_a_session_with_5000_forks_answers_and_pages(tmp_path: Path) -> None:
    root, forks = build(tmp_path / "home", "fan", 5000)
    d = DaemonProcess(tmp_path / "home").start()
    try:
        c = d.client()
        whole = lineage(c, root)
        assert [n["agentSessionId"] for n in whole["descendants"]] == forks
        assert [n["ordinal"] for n in whole["descendants"]] == list(range(1, 5001))
        assert whole["truncated"] is None
        assert lineage(c, forks[4321])["ancestors"][0]["agentSessionId"] == root

        pages, after = [], 0
        while True:
            page = lineage(c, root, maxNodes=1500, afterOrdinal=after)
            got = page["descendants"]
            pages.append(len(got))
            if page["truncated"] is None:
                break
            assert page["truncated"]["reason"] == "nodes"
            assert page["truncated"]["omittedChildren"] == 5000 - after - len(got)
            after = got[-1]["ordinal"]
        assert pages == [1500, 1500, 1500, 500]
    finally:
        d.stop()


@pytest.mark.long
@pytest.mark.timeout(1800)
def test_a_600_level_chain_of_latest_settled_forks_through_the_api(tmp_path: Path) -> None:
    """Every fork of the chain through the real saga and provider (each a fork of the child
    before), then the chain read from both ends."""
    d = DaemonProcess(tmp_path / "home").start()
    try:
        c = d.client(timeout=120)
        sid = str(create_session(c)["agentSessionId"])
        root, forks = sid, []
        assert run_turn(c, sid, "hello")["outcome"] == "completed"
        for _ in range(600):
            op = fork_latest(c, sid)
            assert op["status"] == "committed", op
            c.call("fork.acknowledge", {"workspaceId": WS, "operationId": op["operationId"]})
            sid = op["targetAgentSessionId"]
            forks.append(sid)
        leaf = lineage(c, sid)
        assert [a["agentSessionId"] for a in leaf["ancestors"]] == [*reversed(forks[:-1]), root]
        assert levels(lineage(c, root, maxDepth=300)["descendants"])[-1]["truncated"] == {
            "reason": "depth",
            "omittedChildren": 1,
        }
    finally:
        d.stop()
