"""A Turn its provider never got leaves its Session forkable, through the real daemon and a real
provider: a first Turn that fails before its `turn.start` is sent (the provider's program is
broken — here `/bin/false` — so its runtime's `session.start` fails; Claude Code's CLI, spawned
by `turn.start`, exits before it is handed the prompt or cannot be executed, and the worker
answers that the provider was never called) is settled `failed` and marked host-only (schema
v24); once the program works, a completed Turn forks, the fork's
provider prefix leaves the host-only Turn out, the child's transcript copies it (still
host-only) and the child runs a Turn of its own on a provider thread that holds exactly the
bound Turns."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import apsw
import pytest

from tests.daemon.test_fork_saga import fork, until_terminal
from tests.reliability.reliability_harness import provider_env, unwired_reason
from tests.support.daemon import WS, DaemonProcess, create_session, run_turn, timeline
from tests.support.invariants import assert_invariants, provider_children
from transport.client import EventSubscriber

pytestmark = pytest.mark.timeout(240)

# A program that is there (`session.create` checks that) but never starts a runtime.
_BROKEN = "/bin/false"
_CONFIG = {
    "tutti-agent": f'[providers.tutti-agent]\ncommand = "{_BROKEN}"\n',
    "codex": "",  # provider_env's own table, with the broken program (`commands`)
    "claude-code": "",  # the same, the broken program its `cli_path`
}


def host_only_marks(home: Path, sid: str) -> list[int]:
    """Each of the Session's Turns' `host_only` mark, in sequence order (the store read alone)."""
    conn = apsw.Connection(str(home / "store.sqlite3"), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        rows = conn.execute(
            "SELECT host_only FROM turns WHERE session_id = ? ORDER BY sequence", (sid,)
        )
        return [int(r[0]) for r in rows]
    finally:
        conn.close()


def settled_events(sub: EventSubscriber, turn_id: str) -> list[dict[str, Any]]:
    """The settled Turn of each `turn.updated` of `turn_id` heard, until none came for a while
    after the first."""
    heard: list[dict[str, Any]] = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        event = sub.next(timeout=1.0 if heard else 5.0)
        if event is None:
            if heard:
                break
            continue
        turn = event.get("turn") if event.get("type") == "turn.updated" else None
        if isinstance(turn, dict) and turn["turnId"] == turn_id and turn["phase"] == "settled":
            heard.append(turn)
    return heard


@pytest.mark.parametrize(
    ("provider", "broken"),
    [
        ("tutti-agent", _BROKEN),
        pytest.param("codex", _BROKEN, marks=pytest.mark.codex),
        # Claude Code's CLI is spawned by `turn.start` itself: one that exits before it is
        # handed the prompt, and one that cannot be executed at all, fail the start typed
        # (`ProviderNotCalled`), so the host knows the provider never got the Turn.
        pytest.param("claude-code", _BROKEN, marks=pytest.mark.claude, id="claude-code-exits"),
        pytest.param("claude-code", "", marks=pytest.mark.claude, id="claude-code-no-exec"),
    ],
)
def test_a_first_turn_never_sent_leaves_the_session_forkable(
    tmp_path: Path, provider: str, broken: str
) -> None:
    assert unwired_reason(provider) is None, unwired_reason(provider)
    home = tmp_path / "home"
    if not broken:
        # There and executable (`session.create` checks that), but its `exec` fails: its
        # interpreter does not exist.
        unrunnable = tmp_path / "claude-unrunnable"
        unrunnable.write_text(f"#!{tmp_path}/no-such-interpreter\n")
        unrunnable.chmod(0o755)
        broken = str(unrunnable)
    commands = {provider: broken} if provider != "tutti-agent" else {}
    with provider_env(provider, home, config=_CONFIG[provider], commands=commands) as cwd:
        d = DaemonProcess(home).start()
        sub = EventSubscriber(d.events, [WS])
        try:
            time.sleep(0.5)  # ZeroMQ slow joiner: let the subscription reach the PUB side
            c = d.client()
            sid = create_session(c, provider=provider, cwd=str(cwd))["agentSessionId"]
            lost = run_turn(c, sid, "before the program works")
            assert lost["outcome"] == "failed" and lost["rootProviderTurnId"] is None, lost
            # The wire says so (`session.timeline`'s Turn).
            assert lost["hostOnly"] is True, lost
            if provider == "claude-code":
                # The error names the CLI and what it did, not the SDK's bare exit text.
                assert "ProcessError" not in lost["error"], lost["error"]
                if broken == _BROKEN:
                    assert lost["error"] == (
                        "turn start failed: the Claude Code CLI (/bin/false) exited with code 1"
                        " before it read the prompt"
                    ), lost["error"]
                else:
                    assert f"the Claude Code CLI ({broken}) " in lost["error"], lost["error"]
            # So does its settling `turn.updated` event (the Turn its settlement carried).
            heard = settled_events(sub, lost["turnId"])
            assert heard and all(t["hostOnly"] is True for t in heard), heard
        finally:
            sub.close()
            d.stop()
    assert host_only_marks(home, sid) == [1]
    (home / "agenthost.toml").unlink(missing_ok=True)
    with provider_env(provider, home) as cwd:
        d = DaemonProcess(home).start()
        try:
            c = d.client()
            done = run_turn(c, sid, "now it is")
            assert done["outcome"] == "completed", done
            assert done["hostOnly"] is False, done
            assert [t["hostOnly"] for t in timeline(c, sid)] == [True, False]
            _, op = fork(c, sid, done["turnId"])
            op = until_terminal(c, op)
            assert op["status"] == "committed", op
            child = op["targetAgentSessionId"]
            copied = timeline(c, child)
            assert [t["sequence"] for t in copied] == [1, 2]
            assert copied[0]["outcome"] == "failed" and copied[0]["rootProviderTurnId"] is None
            assert host_only_marks(home, child) == [1, 0]
            assert [t["hostOnly"] for t in copied] == [True, False]
            # The child runs a Turn of its own on its provider thread.
            own = run_turn(c, child, "the child's own")
            assert own["outcome"] == "completed", own
            assert host_only_marks(home, child) == [1, 0, 0]
            assert own["hostOnly"] is False, own
            bound = [t["rootProviderTurnId"] for t in timeline(c, child)[1:]]
        finally:
            d.stop()
    # One provider child, whose thread holds exactly the bound Turns (the source's completed
    # one, then the child's own): nothing for the Turn its provider never got.
    children = {ch.child_id for ch in provider_children(home) if ch.provider == provider}
    assert len(children) == 1, children
    if provider == "tutti-agent":
        from tests.support.homes import runtime_home
        from tutti_agent.store import ThreadStore

        thread = ThreadStore(runtime_home(home, WS, child)).load(next(iter(children)))
        started = [
            str(line.item.payload.get("turn_id"))
            for line in thread.lines
            if line.item.type == "event_msg" and line.item.payload.get("type") == "task_started"
        ]
        assert started == bound, (started, bound)
    assert_invariants(home)


@pytest.mark.claude
def test_a_turn_never_sent_is_proven_though_the_killed_workers_parked_cli_was_still_exiting(
    tmp_path: Path,
) -> None:
    """A Claude worker killed before a Turn's start leaves the CLI it parked for the next Turn,
    SIGKILLed by its parent-death signal but alive a moment more (here: held frozen until a
    moment after the next Turn was submitted). The next Turn's cold start asks the new worker
    whether the history is final: it answered not final while that CLI was still there, so the
    never-sent Turn stayed unbound — the Session unforkable through it — until a later cold
    start. Now the worker waits a bounded moment for a process already exiting: the Turn is
    marked host-only at that cold start and the next fork commits."""
    from tests.claude.test_claude_stopped import cli_pids
    from tests.reliability.reliability_harness import worker_fired, worker_of
    from tests.support.daemon import settle, submit, wait_for
    from tests.support.freezer import freeze, freezer_group, thaw
    from tests.support.homes import runtime_home

    home = tmp_path / "home"
    point = "worker.turn.before_start"
    with provider_env("claude-code", home) as cwd, freezer_group() as group:
        d = DaemonProcess(home).start()
        try:
            c = d.client(timeout=60)
            sid = create_session(c, provider="claude-code", cwd=str(cwd))["agentSessionId"]
            assert run_turn(c, sid, "first")["outcome"] == "completed"
            # The CLI parked for the next Turn, held frozen: its parent-death SIGKILL stays
            # pending until it is thawed.
            parked = wait_for(lambda: cli_pids(runtime_home(home, WS, sid, "claude-config")), 30)
            freeze(group, parked)
            before = worker_of(d, "claude-code")
            assert before is not None
            c.call("debug.failpoints", {"points": {point: "once:kill"}})
            lost = submit(c, sid, "its worker dies before the start")
            wait_for(lambda: worker_fired(d, point), 60)
            wait_for(lambda: (worker_of(d, "claude-code") or before)["pid"] != before["pid"], 60)
            assert settle(c, sid, lost["turnId"])["outcome"] == "failed"
            assert cli_pids(runtime_home(home, WS, sid, "claude-config"))  # still there
            # The new worker's driver loaded (another Session's Turn), so the next Turn's cold
            # start (`session.start`, which spawns no CLI, then the history) asks at once; the
            # parked CLI exits a moment after.
            other = create_session(c, provider="claude-code", cwd=str(cwd))["agentSessionId"]
            assert run_turn(c, other, "the new worker's first")["outcome"] == "completed"
            thawing = threading.Timer(1.0, thaw, (group,))
            thawing.start()
            try:
                done = run_turn(c, sid, "after the kill")
            finally:
                thawing.join()
            assert done["outcome"] == "completed", done
            assert host_only_marks(home, sid) == [0, 1, 0]
            _, op = fork(c, sid, done["turnId"])
            op = until_terminal(c, op)
            assert op["status"] == "committed", op
            assert_invariants(home)
        finally:
            d.stop()
