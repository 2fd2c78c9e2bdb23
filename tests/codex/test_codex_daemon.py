"""The whole fork saga through the daemon's socket with `provider: "codex"`: real daemon, real
codex worker, real `codex app-server` 0.171.0, the local ResponsesServer — commit, the child's
model input from its own home, fork of a fork, capability from the persisted attestation after
a restart, and a SIGKILL of the codex worker right after `thread/fork` (→ unknown, never
redispatched, exactly one child rollout in the source home)."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import uuid
from pathlib import Path
from typing import Any

import psutil
import pytest
from codex_helpers import codex_pids, conversation, write_config

from model_fakes.responses import ResponsesServer
from tests.daemon.test_fork_saga import fork, until_terminal
from tests.support.daemon import (
    WS,
    DaemonProcess,
    create_session,
    run_turn,
    settle,
    submit,
    timeline,
    wait_for,
)
from tests.support.homes import child_rollouts, rollouts, runtime_home
from transport.client import ApiError, Client

pytestmark = [pytest.mark.codex, pytest.mark.timeout(180)]

SENT = {"one", "two", "three", "four", "five", "after the crash"}


def codex_home(d: DaemonProcess, sid: str) -> Path:
    return runtime_home(d.home, WS, sid, "codex-home")


def codex_source(c: Client, cwd: Path) -> tuple[str, list[dict[str, Any]]]:
    cwd.mkdir(exist_ok=True)
    sid = create_session(c, provider="codex", title="codex", cwd=str(cwd))["agentSessionId"]
    turns = [run_turn(c, sid, text) for text in ("one", "two", "three")]
    assert [t["outcome"] for t in turns] == ["completed"] * 3, turns
    return sid, turns


def test_codex_fork_commits_and_the_child_sees_turns_one_and_two_from_its_own_home(
    codex_daemon: DaemonProcess, model: ResponsesServer, tmp_path: Path
) -> None:
    d = codex_daemon
    c = d.client()
    sid, turns = codex_source(c, tmp_path / "cwd")
    session = c.call("session.get", {"workspaceId": WS, "agentSessionId": sid})["session"]
    assert session["lifecycleCapabilities"]["forkThroughTurn"] is True
    assert all(t["providerForkBindingState"] == "bound" for t in turns)

    _, op = fork(c, sid, turns[1]["turnId"])
    op = until_terminal(c, op)
    assert op["status"] == "committed", op
    child = op["session"]
    child_sid = child["agentSessionId"]
    assert child["providerSessionId"] not in (None, "", session["providerSessionId"])
    assert len(timeline(c, child_sid)) == 2
    assert len(child_rollouts(codex_home(d, sid))) == 1
    # The child's home holds its own rollout and the ancestor it reads through.
    assert len(rollouts(codex_home(d, child_sid))) == 2

    # The source's home is gone: the child runs from its own home alone.
    c.call("session.delete", {"workspaceId": WS, "agentSessionId": sid})
    # Deleting stops the source's app-server and removes its home (runtimes/<ws>/<sid>/).
    wait_for(lambda: not codex_pids(codex_home(d, sid)))
    wait_for(lambda: not codex_home(d, sid).exists())
    n = len(model.requests)
    assert run_turn(c, child_sid, "four")["outcome"] == "completed"
    assert conversation(model.requests[n], SENT) == [
        ("user", "one"),
        ("assistant", "echo: one"),
        ("user", "two"),
        ("assistant", "echo: two"),
        ("user", "four"),
    ]

    # Fork of the fork, through its own turn.
    child_turns = timeline(c, child_sid)
    _, op2 = fork(c, child_sid, child_turns[-1]["turnId"])
    op2 = until_terminal(c, op2)
    assert op2["status"] == "committed", op2
    grandchild = op2["session"]["agentSessionId"]
    assert len(rollouts(codex_home(d, grandchild))) == 3
    n = len(model.requests)
    assert run_turn(c, grandchild, "five")["outcome"] == "completed"
    assert [t for r, t in conversation(model.requests[n], SENT) if r == "user"] == [
        "one",
        "two",
        "four",
        "five",
    ]


def test_capability_after_restart_comes_from_the_persisted_attestation_without_spawning(
    tmp_path: Path, model: ResponsesServer
) -> None:
    home = tmp_path / "home"
    write_config(home, model)
    d = DaemonProcess(home).start()
    try:
        c = d.client()
        sid = create_session(c, provider="codex", cwd=str(tmp_path))["agentSessionId"]
        run_turn(c, sid, "one")
        context_before = c.call("session.get", {"workspaceId": WS, "agentSessionId": sid})
    finally:
        d.stop()
    d2 = DaemonProcess(home).start()
    try:
        c2 = d2.client()
        session = c2.call("session.get", {"workspaceId": WS, "agentSessionId": sid})["session"]
        assert session == context_before["session"]
        assert session["lifecycleCapabilities"]["forkThroughTurn"] is True
        listed = c2.call("session.list", {"workspaceId": WS})["sessions"]
        assert [s["lifecycleCapabilities"]["forkThroughTurn"] for s in listed] == [True]
        # ... and started no provider runtime (the workers themselves start ahead, at ready).
        assert c2.call("host.status")["runtimes"].get("codex", {}).get("live", 0) == 0
        assert d2.proc is not None and not [
            p
            for p in psutil.Process(d2.proc.pid).children(recursive=True)
            if "app-server" in p.cmdline()
        ]
    finally:
        d2.stop()


def test_codex_worker_killed_after_thread_fork_is_unknown_with_exactly_one_child(
    codex_daemon: DaemonProcess, tmp_path: Path
) -> None:
    d = codex_daemon
    c = d.client()
    sid, turns = codex_source(c, tmp_path / "cwd")
    before = next(w for w in c.call("host.status")["workers"] if w["provider"] == "codex")
    c.call("debug.failpoints", {"points": {"worker.fork.after_provider_call": "once:kill"}})
    rid, target = str(uuid.uuid4()), str(uuid.uuid4())
    _, op = fork(c, sid, turns[1]["turnId"], request_id=rid, target=target)
    op = until_terminal(c, op)
    assert op["status"] == "unknown", op
    assert op["session"] is None
    after = next(w for w in c.call("host.status")["workers"] if w["provider"] == "codex")
    assert after["pid"] != before["pid"] or after["restarts"] > before["restarts"]
    # Killed right after thread/fork answered: the one child Codex wrote, in the source home
    # only (the binder never ran).
    assert len(child_rollouts(codex_home(d, sid))) == 1
    assert rollouts(codex_home(d, target)) == []
    # Never redispatched: a replay and a new identity on the same boundary both get the
    # unknown operation back, and Codex still holds exactly one child.
    _, replay = fork(c, sid, turns[1]["turnId"], request_id=rid, target=target)
    _, again = fork(c, sid, turns[1]["turnId"])
    assert replay["operationId"] == again["operationId"] == op["operationId"]
    assert again["status"] == "unknown"
    assert len(child_rollouts(codex_home(d, sid))) == 1
    # The source is usable again (fence released, worker restarted).
    assert run_turn(c, sid, "after the crash")["outcome"] == "completed"
    assert len(child_rollouts(codex_home(d, sid))) == 1


def test_a_killed_worker_takes_its_codex_app_servers_with_it(
    codex_daemon: DaemonProcess, model: ResponsesServer
) -> None:
    d = codex_daemon
    c = d.client()
    sid = create_session(c, provider="codex")["agentSessionId"]
    assert run_turn(c, sid, "one")["outcome"] == "completed"
    servers = codex_pids(codex_home(d, sid))
    assert servers, "the session's codex app-server is running"
    worker = next(w for w in c.call("host.status")["workers"] if w["provider"] == "codex")
    os.kill(worker["pid"], signal.SIGKILL)
    # Nothing of the dead worker may keep the thread's writer: a restarted one reopens it.
    wait_for(lambda: not any(_alive(p) for p in servers), timeout=5)
    assert run_turn(c, sid, "two")["outcome"] == "completed"


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split()[2]
    except OSError:
        return False
    return state != "Z"


def test_codex_copy_tampered_before_the_readability_proof_is_unknown_not_committed(
    codex_daemon: DaemonProcess, tmp_path: Path
) -> None:
    """The child is proven readable (in the worker) before `provider_accepted`: a
    copy damaged after the binder made it durable ends the fork `unknown`, no canonical child."""
    d = codex_daemon
    c = d.client()
    sid, turns = codex_source(c, tmp_path / "cwd")
    c.call("debug.failpoints", {"points": {"worker.bind.after_copy": "tamper"}})
    _, op = fork(c, sid, turns[1]["turnId"])
    op = until_terminal(c, op)
    assert op["status"] == "unknown", op
    assert op["session"] is None and "not readable" in op["error"]
    target = op["targetAgentSessionId"]
    assert len(child_rollouts(codex_home(d, sid))) == 1
    # The damaged copies stay where the binder wrote them; nothing was committed.
    assert all(len(p.read_bytes().splitlines()) == 1 for p in rollouts(codex_home(d, target)))
    with pytest.raises(ApiError):  # no canonical child exists
        c.call("session.get", {"workspaceId": WS, "agentSessionId": target})
    c.call("debug.failpoints", {"points": {"worker.bind.after_copy": "off"}})
    assert run_turn(c, sid, "after the crash")["outcome"] == "completed"


@pytest.mark.parametrize("action", ["abandon", "adopt"])
def test_a_resolve_of_an_unknown_codex_fork_leaves_the_source_heard(
    codex_daemon: DaemonProcess, tmp_path: Path, action: str
) -> None:
    """`fork.resolve` reads the child's lineage on the source's live app-server; that lineage
    holds the source thread itself, which it must not unsubscribe: the source's next Turn is
    heard (its reply, its end) and completes on the same server — it failed `model_timeout`
    after 32 s, Codex having run it unheard."""
    d = codex_daemon
    c = d.client()
    sid, turns = codex_source(c, tmp_path / "cwd")
    c.call("debug.failpoints", {"points": {"worker.fork.after_provider_call": "once:error"}})
    _, op = fork(c, sid, turns[1]["turnId"])
    op = until_terminal(c, op)
    assert op["status"] == "unknown", op
    params = {"workspaceId": WS, "operationId": op["operationId"], "action": action}
    c.call("fork.resolve", params | {"requestId": str(uuid.uuid4())})
    pids = codex_pids(codex_home(d, sid))
    turn = submit(c, sid, "after the resolve")
    done = settle(c, sid, turn["turnId"], timeout=20)
    assert done["outcome"] == "completed", done
    assert done["messages"][-1]["text"] == "echo: after the resolve"
    assert codex_pids(codex_home(d, sid)) == pids  # the same app-server ran it


def test_a_stopped_codex_app_server_fails_its_turn_provider_stopped(tmp_path: Path) -> None:
    """The model holds the Turn's reply; every process of the Session's `codex app-server`
    (the Node launcher and its native child) is SIGSTOPped: past `provider_stopped_seconds`
    the Turn fails `provider_stopped`, naming codex, and the next Turn runs on a new one."""
    gate = threading.Event()
    gate.set()
    with ResponsesServer(gate=gate, hold_after=1) as server:
        home = tmp_path / "home"
        write_config(home, server)
        with (home / "agenthost.toml").open("a") as f:
            f.write("[daemon]\nprovider_stopped_seconds = 1\n")
        d = DaemonProcess(home).start()
        pids: list[int] = []
        try:
            c = d.client()
            cwd = tmp_path / "cwd"
            cwd.mkdir()
            sid = create_session(c, provider="codex", cwd=str(cwd))["agentSessionId"]
            assert run_turn(c, sid, "warm")["outcome"] == "completed"
            gate.clear()
            turn = submit(c, sid, "held")
            wait_for(lambda: timeline(c, sid)[-1]["rootProviderTurnId"], 60)
            pids = codex_pids(codex_home(d, sid))
            assert pids
            for pid in pids:
                os.kill(pid, signal.SIGSTOP)
            done = settle(c, sid, turn["turnId"], timeout=60)
            assert done["outcome"] == "failed", done
            assert done["errorReason"] == "provider_stopped", done
            assert "the codex app-server (pid " in done["error"], done
            gate.set()
            after = run_turn(c, sid, "after")
            assert after["outcome"] == "completed", str(after.get("error"))
        finally:
            gate.set()
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            d.stop()
