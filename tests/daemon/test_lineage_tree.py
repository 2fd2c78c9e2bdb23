"""`session.lineage` and `agenthost tree` through a real daemon: a three-level
fork tree whose middle node is deleted keeps its durable lineage on both sides."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from tests.daemon.test_fork_saga import fork, three_turn_source, until_terminal
from tests.support.daemon import WS, DaemonProcess, run_turn
from transport.client import ApiError, Client

pytestmark = pytest.mark.timeout(180)


def lineage(c: Client, sid: str) -> dict[str, Any]:
    return dict(c.call("session.lineage", {"workspaceId": WS, "agentSessionId": sid}))


def committed_fork(c: Client, sid: str, turn_id: str) -> dict[str, Any]:
    _, op = fork(c, sid, turn_id)
    op = until_terminal(c, op)
    assert op["status"] == "committed", op
    c.call("fork.acknowledge", {"workspaceId": WS, "operationId": op["operationId"]})
    return op


def assert_three_level_tree(
    c: Client, root: str, turns: list[dict[str, Any]], middle_text: str = "in the middle"
) -> tuple[str, str]:
    """Root forks twice (ordinals 1, 2), the first child forks once more after a Turn of its
    own, the middle node is deleted: `session.lineage` from the leaf and from the root keeps
    the deleted node's durable lineage on both sides. Returns (middle, leaf)."""
    first = committed_fork(c, root, turns[1]["turnId"])
    second = committed_fork(c, root, turns[0]["turnId"])
    middle = first["targetAgentSessionId"]
    middle_turn = run_turn(c, middle, middle_text)
    assert middle_turn["outcome"] == "completed", middle_turn
    leaf_op = committed_fork(c, middle, middle_turn["turnId"])
    leaf = leaf_op["targetAgentSessionId"]
    c.call("session.delete", {"workspaceId": WS, "agentSessionId": middle})

    up = lineage(c, leaf)
    assert up["session"]["agentSessionId"] == leaf
    assert [a["agentSessionId"] for a in up["ancestors"]] == [middle, root]
    deleted, top = up["ancestors"]
    assert deleted["session"] is None  # deleted, but its durable lineage stays
    assert deleted["lineage"]["sourceAgentSessionId"] == root
    assert deleted["lineage"]["sourceTurnId"] == turns[1]["turnId"]
    assert deleted["lineage"]["operationId"] == first["operationId"]
    assert top["session"]["agentSessionId"] == root and top["lineage"] is None
    assert up["descendants"] == []

    down = lineage(c, root)
    assert down["ancestors"] == []
    nodes = down["descendants"]
    assert [(n["agentSessionId"], n["ordinal"]) for n in nodes] == [
        (middle, 1),
        (second["targetAgentSessionId"], 2),
    ]
    assert nodes[0]["deleted"] is True and nodes[1]["deleted"] is False
    assert nodes[1]["title"] == second["session"]["title"]
    assert nodes[1]["children"] == []
    (child,) = nodes[0]["children"]
    assert child["agentSessionId"] == leaf and child["ordinal"] == 1
    assert child["lineage"]["sourceTurnId"] == middle_turn["turnId"]
    assert child["children"] == []
    # The leaf still runs on the provider with its deleted parent's history.
    assert run_turn(c, leaf, "the leaf speaks")["outcome"] == "completed"
    return middle, leaf


def test_three_level_tree_with_deleted_middle_node(daemon: DaemonProcess) -> None:
    c = daemon.client()
    root, turns = three_turn_source(c)
    middle, leaf = assert_three_level_tree(c, root, turns)
    second = lineage(c, root)["descendants"][1]["agentSessionId"]

    # A deleted Session itself is not found (typed 404); a garbage id is a typed 400.
    with pytest.raises(ApiError) as err:
        lineage(c, middle)
    assert err.value.status == 404
    with pytest.raises(ApiError) as err:
        c.call("session.lineage", {"workspaceId": WS, "agentSessionId": "nope"})
    assert err.value.status == 400

    # `agenthost tree` draws it.
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "agenthost.cli",
            "--home",
            str(daemon.home),
            "--workspace",
            WS,
            "tree",
            leaf,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith(root[:8])
    assert "(deleted)" in lines[1] and middle[:8] in lines[1]
    assert leaf[:8] in lines[2] and "this session" in lines[2]
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "agenthost.cli",
            "--home",
            str(daemon.home),
            "--workspace",
            WS,
            "tree",
            root,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stderr
    text = done.stdout
    assert f"#1 {middle[:8]}  (deleted)" in text
    assert f"#2 {second[:8]}" in text
    assert f"#1 {leaf[:8]}" in text
