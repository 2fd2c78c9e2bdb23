"""The tutti-agent driver inside a real worker process, driven through the supervisor: turns stream
as link events, a fork is accepted with its binding, and a worker killed at a worker failpoint
loses the fork request (delivery unknown) with at most one provider child."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from drv_helpers import TUTTI_BIN, EventLog, completed

from domain.turn_events import turn_event_from_wire
from drivers.binder import iter_rollouts
from drivers.errors import WorkerLost
from drivers.supervisor import WorkerSupervisor

P = "tutti-agent"


def start_source(sup: WorkerSupervisor, root: Path, log: EventLog) -> dict[str, Any]:
    # Read as the host reads at its end of the link.
    sup.set_event_sink(lambda provider, sid, event: log(sid, turn_event_from_wire(event)))
    home = root / "runtimes" / "ws" / "src" / "tutti-agent-home"
    started = sup.request(
        P,
        "session.start",
        {
            "agentSessionId": "ws/src",
            "home": str(home),
            "cwd": str(root),
            "settings": {},
            "model": None,
        },
        30,
    ).result(40)
    turns = []
    for i, text in enumerate(["one", "two"], 1):
        res = sup.request(
            P, "turn.start", {"agentSessionId": "ws/src", "turnId": f"T{i}", "text": text}, 30
        ).result(40)
        log.wait_for(completed(f"T{i}"))
        turns.append(res["providerTurnId"])
    return {"home": home, "started": started, "turns": turns}


def fork_params(src: dict[str, Any], root: Path, target: Path) -> dict[str, Any]:
    return {
        "source": {
            "agentSessionId": "ws/src",
            "providerSessionId": src["started"]["providerSessionId"],
            "home": str(src["home"]),
            "cwd": str(root),
        },
        "target": {"agentSessionId": "ws/child", "home": str(target)},
        "providerTurnIds": src["turns"],
        "title": "t (2)",
        "driverKind": "tutti-agent",
        "driverVersion": src["started"]["runtimeContext"]["driverVersion"],
    }


@pytest.mark.timeout(90)
def test_turn_events_and_fork_flow_through_the_worker(tmp_path: Path, run_dir: Path) -> None:
    log = EventLog()
    with WorkerSupervisor(run_dir, provider_config={P: {"command": TUTTI_BIN}}) as sup:
        src = start_source(sup, tmp_path, log)
        assert [e["type"] for e in log.of_turn("T1")][0] == "turn.started"
        assert {sid for sid, _ in log.events} == {"ws/src"}
        target = tmp_path / "runtimes" / "ws" / "child" / "tutti-agent-home"
        result = sup.request(P, "fork", fork_params(src, tmp_path, target), 60).result(70)
        assert result["disposition"] == "accepted", result
        assert result["child"]["providerTurnIds"] == src["turns"]
        assert result["binding"]["mode"] == "host_copy"
        assert len(list(iter_rollouts(target))) == 1


@pytest.mark.timeout(90)
@pytest.mark.parametrize(
    ("point", "children"),
    [
        ("worker.fork.before_provider_call", 0),
        ("worker.fork.after_provider_call", 1),
        ("worker.bind.before_copy", 1),
        ("worker.bind.after_copy", 1),
    ],
)
def test_worker_killed_at_a_fork_failpoint_loses_the_request_with_at_most_one_child(
    tmp_path: Path, run_dir: Path, point: str, children: int
) -> None:
    log = EventLog()
    with WorkerSupervisor(run_dir, provider_config={P: {"command": TUTTI_BIN}}) as sup:
        src = start_source(sup, tmp_path, log)
        sup.set_failpoints({point: "once:kill"})
        target = tmp_path / "target"
        with pytest.raises(WorkerLost):
            sup.request(P, "fork", fork_params(src, tmp_path, target), 60).result(70)
        rollouts = list(iter_rollouts(src["home"]))
        assert len(rollouts) == 1 + children
        copied = list(iter_rollouts(target))
        assert len(copied) == (1 if point == "worker.bind.after_copy" else 0)
        # The restarted worker serves again (the once: point is spent).
        assert sup.request(P, "worker.ping", {}, 30).result(40)["provider"] == P
