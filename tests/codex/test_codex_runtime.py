"""The Codex driver's runtime against the real `codex app-server` 0.171.0: per-session homes and
config, turns → events, approvals as Interactions, interrupt, resume, idle stop, the version
gate from the `initialize` userAgent, and the launch-fingerprint attestation cache."""

from __future__ import annotations

import json
import os
import platform
import shutil
import threading
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
from codex_helpers import (
    EventLog,
    MakeDriver,
    calls,
    codex_bin,
    completed,
    fork_request,
    home_of,
    open_session,
    relayed,
    run_turns,
    start,
)
from tool_model import ToolModel

from domain.enums import DeliveryDisposition
from domain.errors import InvalidArgument, SessionBusy
from domain.procfs import end_all, processes_marked
from drivers.app_server.launch import launch_fingerprint
from drivers.codex.command import (
    _NATIVE_PACKAGES,
    PINNED_PREFIX,
    default_command,
    native_behind_npm_shim,
    resolve_command,
)
from drivers.codex.driver import create_driver as codex_driver
from drivers.failpoints import Failpoints
from drivers.runtime_marker import RUNTIME_VAR, WORKER_VAR
from drivers.versions import CODEX_GATE
from model_fakes.responses import ResponsesServer, last_user_text
from tests.support.left_processes import marker_of

pytestmark = [pytest.mark.codex, pytest.mark.timeout(120)]


# ------------------------------------------------------------------------- homes and turns


def test_session_gets_its_own_codex_home_config_and_private_home(
    make_driver: MakeDriver, log: EventLog, tmp_path: Path, model: ResponsesServer
) -> None:
    driver = make_driver()
    src = open_session(driver, log, tmp_path, texts=("one",))
    config = tomllib.loads((src.home / "config.toml").read_text())
    assert config["model"] == "mock-model"
    assert config["approval_policy"] == "never"
    provider = config["model_providers"][config["model_provider"]]
    assert provider["base_url"] == model.base_url and provider["wire_api"] == "responses"
    assert config["features"] == {"plugins": False, "shell_snapshot": False}
    pid = driver._sessions["src"].runtime.proc.pid  # type: ignore[union-attr]
    environ = dict(
        kv.split("=", 1) for kv in Path(f"/proc/{pid}/environ").read_text().split("\0") if "=" in kv
    )
    assert environ["CODEX_HOME"] == str(src.home)
    assert environ["HOME"] == str(src.home / ".home")
    assert environ["TMPDIR"] == str(src.home / ".tmp")
    assert [p.name for p in (src.home / "sessions").rglob("*.jsonl")] != []


def test_turn_streams_started_binding_items_and_completed(
    make_driver: MakeDriver, log: EventLog, tmp_path: Path
) -> None:
    driver = make_driver()
    src = open_session(driver, log, tmp_path, texts=("hello",))
    [turn_id] = {e["turnId"] for _, e in log.events}
    events = log.of_turn(turn_id)
    # The binding rides on `turn.started` (one event, one actor message): no `turn.binding`.
    assert events[0]["type"] == "turn.started"
    assert "turn.binding" not in {e["type"] for e in events}
    assert events[0]["providerTurnId"] == src.turns[0]
    assert json.loads(events[0]["bindingJson"]) == {
        "schemaVersion": 1,
        "threadId": src.thread_id,
        "providerTurnId": src.turns[0],
    }
    items = [(e["item"]["kind"], e["item"]["text"]) for e in events if e["type"] == "item"]
    assert items == [("assistant", "echo: hello")]  # the user's copy is not sent
    assert events[-1] == {
        "type": "turn.completed",
        "turnId": turn_id,
        "providerTurnId": src.turns[0],
        "outcome": "completed",
    }


def test_historical_session_resumes_its_thread_with_its_history(
    make_driver: MakeDriver, log: EventLog, tmp_path: Path, model: ResponsesServer
) -> None:
    driver = make_driver()
    src = open_session(driver, log, tmp_path, texts=("one", "two"))
    driver.close()
    fresh = make_driver()
    resumed = start(fresh, tmp_path, "src", thread_id=src.thread_id, context=src.context)
    assert resumed["providerSessionId"] == src.thread_id
    before = len(model.requests)
    run_turns(fresh, log, "src", ("three",))
    users = [t for r, t in _messages(model.requests[before]) if r == "user"]
    assert users[-3:] == ["one", "two", "three"]


def _messages(body: dict) -> list[tuple[str, str]]:
    from model_fakes.responses import model_input_texts

    return model_input_texts(body)


def test_idle_app_server_is_stopped_and_the_next_turn_resumes_it(
    make_driver: MakeDriver, log: EventLog, tmp_path: Path
) -> None:
    driver = make_driver(idle_timeout_s=0.3)
    open_session(driver, log, tmp_path, texts=("one",))
    proc = driver._sessions["src"].runtime.proc  # type: ignore[union-attr]
    deadline = threading.Event()
    for _ in range(200):
        if not proc.alive:
            break
        deadline.wait(0.05)
    assert not proc.alive
    run_turns(driver, log, "src", ("two",))


@pytest.fixture
def held_model() -> Iterator[tuple[ResponsesServer, threading.Event]]:
    release = threading.Event()

    def reply(body: dict) -> str:
        text = last_user_text(body)
        if text.startswith("/hold"):
            release.wait(60)  # released by the test or at teardown; never a timing assertion
        return f"echo: {text}"

    with ResponsesServer(reply) as server:
        yield server, release
        release.set()


def test_interrupt_ends_the_active_turn_and_a_second_turn_is_busy(
    held_model: tuple[ResponsesServer, threading.Event], log: EventLog, tmp_path: Path
) -> None:
    server, release = held_model
    driver = codex_driver(
        {"command": [codex_bin()], "model": "mock-model", "model_base_url": server.base_url},
        Failpoints(),
    )
    try:
        start(driver, tmp_path, "src")
        started = driver.start_turn({"agentSessionId": "src", "turnId": "H", "text": "/hold"}, log)
        with pytest.raises(SessionBusy):
            driver.start_turn({"agentSessionId": "src", "turnId": "B", "text": "no"}, log)
        # Right after turn/start: Codex has not made the turn active yet; still interrupted.
        driver.interrupt_turn(
            {"agentSessionId": "src", "providerTurnId": started["providerTurnId"]}
        )
        assert log.wait_for(completed("H"))["outcome"] == "interrupted"
    finally:
        release.set()
        driver.close()


@pytest.mark.parametrize("decision", ["approve", "decline"])
def test_on_request_policy_raises_an_approval_interaction_and_honours_the_answer(
    log: EventLog, tmp_path: Path, decision: str
) -> None:
    out = tmp_path / "written-by-codex"
    with ToolModel() as tool_model:
        driver = codex_driver(
            {
                "command": [codex_bin()],
                "model": "mock-model",
                "model_base_url": tool_model.base_url,
            },
            Failpoints(),
        )
        try:
            start(driver, tmp_path, "src", settings={"approvalPolicy": "on-request"})
            text = f"/run echo hi > {out}"
            driver.start_turn({"agentSessionId": "src", "turnId": "A", "text": text}, log)
            asked = log.wait_for(lambda e: e["type"] == "interaction.requested")
            assert asked["kind"] == "approval" and asked["turnId"] == "A"
            assert str(out) in asked["input"]["text"]
            driver.respond_interaction(
                {
                    "agentSessionId": "src",
                    "requestId": asked["requestId"],
                    "response": {"decision": decision},
                }
            )
            assert log.wait_for(completed("A"))["outcome"] == "completed"
        finally:
            driver.close()
    assert out.exists() is (decision == "approve")


def test_never_policy_runs_without_asking(log: EventLog, tmp_path: Path) -> None:
    with ToolModel() as tool_model:
        driver = codex_driver(
            {"command": [codex_bin()], "model_base_url": tool_model.base_url}, Failpoints()
        )
        try:
            start(driver, tmp_path, "src")
            driver.start_turn({"agentSessionId": "src", "turnId": "A", "text": "/run true"}, log)
            assert log.wait_for(completed("A"))["outcome"] == "completed"
        finally:
            driver.close()
    assert not any(e["type"] == "interaction.requested" for _, e in log.events)


def test_a_stop_ends_the_background_process_codexs_shell_tool_left(
    log: EventLog, tmp_path: Path
) -> None:
    with ToolModel() as tool_model:
        driver = codex_driver(
            {"command": [codex_bin()], "model_base_url": tool_model.base_url}, Failpoints()
        )
        try:
            start(driver, tmp_path, "src", settings={"approvalPolicy": "on-request"})
            pid = driver.runtime_pid("src", str(home_of(tmp_path, "src")))
            assert pid is not None
            marker = marker_of(pid)
            # Codex ends its command's process group when the command ends: a session of its
            # own (`setsid`) is what outlives it.
            text = "/run setsid sleep 300 > /dev/null 2>&1 &"
            driver.start_turn({"agentSessionId": "src", "turnId": "A", "text": text}, log)
            asked = log.wait_for(lambda e: e["type"] == "interaction.requested")
            response = {"decision": "approve"}
            request = {"agentSessionId": "src", "requestId": asked["requestId"]}
            driver.respond_interaction({**request, "response": response})
            assert log.wait_for(completed("A"))["outcome"] == "completed"
            assert any(_command(p) == "sleep" for p in processes_marked(RUNTIME_VAR, {marker}))
            driver.stop_session({"agentSessionId": "src"})
            assert processes_marked(RUNTIME_VAR, {marker}) == []
        finally:
            driver.close()
            end_all(lambda: processes_marked(RUNTIME_VAR, {marker}), 2.0)  # a failed run's


def _command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def test_unknown_approval_policy_setting_is_an_invalid_argument(
    make_driver: MakeDriver, tmp_path: Path
) -> None:
    with pytest.raises(InvalidArgument) as err:
        start(make_driver(), tmp_path, "src", settings={"approvalPolicy": "untrusted"})
    assert err.value.params == {"field": "settings.approvalPolicy"}


# ------------------------------------------------------------------------- version gate


@pytest.mark.parametrize(
    ("user_agent", "supported"),
    [
        ("agenthost/0.171.0 (Debian 12.0.0; x86_64) xterm (agenthost; 0.1.0)", True),
        ("codex/0.171.0", True),
        ("codex-cli 0.171.0", True),
        ("codex/0.144.0 (Linux)", True),
        ("codex/0.171.0-alpha.3 (Linux)", True),
        ("codex/0.144.0-alpha.1 (Linux)", False),
        ("codex/0.143.9 (Linux)", False),
        ("tutti_agent/0.171.0 (Linux; x86_64)", False),
        ("tutti-agent/0.171.0", False),
        ("", False),
        ("codex", False),
    ],
)
def test_codex_gate_reads_the_version_after_the_brand(user_agent: str, supported: bool) -> None:
    assert CODEX_GATE.check(user_agent).fork_through_turn is supported


def test_attestation_of_the_pinned_binary_reports_codex_0_171_0(
    make_driver: MakeDriver, tmp_path: Path
) -> None:
    att = make_driver().attest({"home": str(tmp_path / "h"), "cwd": str(tmp_path)})
    assert att["driverKind"] == "codex"
    assert att["driverVersion"] == "0.171.0"
    # Codex echoes our clientInfo name as the brand.
    assert att["userAgent"].startswith("agenthost/0.171.0 ")
    assert att["bindingMode"] == "host_copy" and att["binderAvailable"] is True
    assert att["forkThroughTurn"] is True


@pytest.mark.parametrize(
    ("user_agent", "version", "supported"),
    [
        ("codex/0.144.0 (Linux)", "0.144.0", True),
        ("codex/0.143.9 (Linux)", "0.143.9", False),
        ("tutti_agent/0.171.0 (Linux; x86_64)", "0.171.0", False),
        ("", "", False),
    ],
)
def test_attestation_follows_the_user_agent_the_runtime_reports(
    make_driver: MakeDriver, tmp_path: Path, user_agent: str, version: str, supported: bool
) -> None:
    driver = make_driver(command=relayed(f"ua={user_agent}", tmp_path / "calls.jsonl"))
    att = driver.attest({"home": str(tmp_path / "h"), "cwd": str(tmp_path)})
    assert (att["driverVersion"], att["forkThroughTurn"]) == (version, supported)


def test_runtime_below_the_gate_is_not_started_without_any_fork_call(
    make_driver: MakeDriver, log: EventLog, tmp_path: Path
) -> None:
    calls_log = tmp_path / "calls.jsonl"
    driver = make_driver(command=relayed("ua=codex/0.143.9 (Linux)", calls_log))
    src = open_session(driver, log, tmp_path, texts=("one",))
    assert src.context["driverVersion"] == "0.143.9"
    result = driver.fork(fork_request(src, src.turns, home_of(tmp_path, "child")))
    assert result.disposition is DeliveryDisposition.NOT_STARTED
    assert calls(calls_log, "thread/fork") == []


def test_runtime_context_persists_kind_version_and_the_sessions_own_home(
    make_driver: MakeDriver, log: EventLog, tmp_path: Path
) -> None:
    src = open_session(make_driver(), log, tmp_path, texts=())
    assert src.context["driverKind"] == "codex"
    assert src.context["driverVersion"] == "0.171.0"
    assert src.context["codex"] == {"home": str(src.home), "threadId": src.thread_id}


# ------------------------------------------------------------------------- capability cache


def test_historical_attestation_is_cached_for_the_exact_launch_only(
    make_driver: MakeDriver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    driver = make_driver()
    params = {"home": str(tmp_path / "h"), "cwd": str(tmp_path)}
    first = driver.attest(params)
    assert driver.spawns == 1
    assert driver.attest(params) == first
    assert driver.spawns == 1  # the same launch: answered from the cache
    driver.attest({"home": str(tmp_path / "other"), "cwd": str(tmp_path)})
    assert driver.spawns == 2  # another home is another launch (its env differs)
    driver.attest({**params, "cwd": str(tmp_path / "h")})
    assert driver.spawns == 3  # another cwd too
    # The next worker incarnation's (its own AGENTHOST_WORKER marker) is the same launch.
    monkeypatch.setenv(WORKER_VAR, "a-successor")
    assert driver.attest(params) == first
    assert driver.spawns == 3


def test_live_runtime_attests_without_spawning(
    make_driver: MakeDriver, log: EventLog, tmp_path: Path
) -> None:
    driver = make_driver()
    src = open_session(driver, log, tmp_path, texts=())
    spawns = driver.spawns
    att = driver.attest({"home": str(src.home), "cwd": str(tmp_path)})
    assert att["driverVersion"] == "0.171.0" and driver.spawns == spawns


def _pinned_shim() -> Path:
    shim = PINNED_PREFIX / "node_modules" / ".bin" / "codex"
    env_shim = os.environ.get("AGENTHOST_CODEX_BIN")
    shim = Path(env_shim) if env_shim else shim
    if not shim.exists() or shutil.which("node") is None:
        pytest.fail(f"the npm install of Codex (with node) is required: {shim}")
    return shim


def test_npm_node_shim_is_a_wrapper_and_never_cached(
    make_driver: MakeDriver, tmp_path: Path
) -> None:
    shim = _pinned_shim()
    driver = make_driver(command=[str(shim)], resolve_native_binary=False)
    assert driver.command() == [str(shim), "app-server"]
    params = {"home": str(tmp_path / "h"), "cwd": str(tmp_path)}
    assert driver.attest(params)["driverVersion"] == "0.171.0"
    driver.attest(params)
    assert driver.spawns == 2


def test_configured_npm_shim_spawns_the_native_binary_behind_it(
    make_driver: MakeDriver, tmp_path: Path
) -> None:
    """No `node` in front of every Codex spawn. The configured wrapper is replaced
    by the platform binary it would `execve`, which is also an executable whose identity can
    be fingerprinted, so the attestation of an unchanged launch is reused."""
    shim = _pinned_shim()
    native = native_behind_npm_shim(str(shim))
    assert native is not None and "vendor" in native.parts
    driver = make_driver(command=[str(shim)])
    assert driver.command() == [str(native), "app-server"]
    params = {"home": str(tmp_path / "h"), "cwd": str(tmp_path)}
    assert driver.attest(params)["driverVersion"] == "0.171.0"
    driver.attest(params)
    assert driver.spawns == 1


def _fake_npm_install(root: Path, *, platform_binary: str | None) -> Path:
    """An npm layout with the real wrapper's shape; `platform_binary` places the platform
    package under that node_modules dir (relative to `root`)."""
    package = root / "node_modules" / "@openai" / "codex"
    (package / "bin").mkdir(parents=True)
    (package / "package.json").write_text(json.dumps({"name": "@openai/codex"}))
    (package / "bin" / "codex.js").write_text("#!/usr/bin/env node\n")
    (package / "bin" / "codex.js").chmod(0o755)
    (root / "node_modules" / ".bin").mkdir()
    shim = root / "node_modules" / ".bin" / "codex"
    shim.symlink_to("../@openai/codex/bin/codex.js")
    if platform_binary is not None:
        package_name, triple = _NATIVE_PACKAGES[(platform.system(), platform.machine())]
        target = root / platform_binary / "@openai" / package_name / "vendor" / triple / "bin"
        target.mkdir(parents=True)
        shutil.copy2("/bin/true", target / "codex")
    return shim


@pytest.mark.parametrize("where", ["node_modules", "node_modules/@openai/codex/node_modules", None])
def test_native_binary_is_found_where_the_wrapper_finds_it_else_the_wrapper_is_kept(
    tmp_path: Path, where: str | None
) -> None:
    shim = _fake_npm_install(tmp_path, platform_binary=where)
    resolved = resolve_command([str(shim), "--flag"])
    if where is None:
        assert resolved == [str(shim), "--flag"]  # no platform package: the wrapper stays
    else:
        assert Path(resolved[0]).is_relative_to(tmp_path / where) and resolved[1:] == ["--flag"]
    assert resolve_command([str(shim)], native=False) == [str(shim)]
    assert native_behind_npm_shim("/bin/true") is None


def test_launch_fingerprint_changes_with_the_executable_identity(tmp_path: Path) -> None:
    exe = tmp_path / "prog"
    shutil.copy2("/bin/true", exe)
    env = {"PATH": "/usr/bin:/bin", "CODEX_HOME": "/x"}
    first = launch_fingerprint([str(exe), "app-server"], "/", env)
    assert first is not None
    assert launch_fingerprint([str(exe), "app-server"], "/", env) == first
    assert launch_fingerprint([str(exe), "app-server"], "/", {**env, "X": "1"}) != first
    assert launch_fingerprint([str(exe), "app-server"], "/tmp", env) != first
    os.utime(exe, ns=(1_000_000_000, 1_000_000_000))
    assert launch_fingerprint([str(exe), "app-server"], "/", env) != first
    script = tmp_path / "wrapper"
    script.write_text('#!/bin/sh\nexec /bin/true "$@"\n')
    script.chmod(0o755)
    assert launch_fingerprint([str(script), "app-server"], "/", env) is None
    assert launch_fingerprint(["no-such-codex-here"], "/", env) is None


def test_default_command_prefers_the_pinned_native_binary() -> None:
    command = default_command()
    assert command == resolve_command(None)
    assert Path(command[0]).name == "codex"
    assert "vendor" in Path(command[0]).parts, command  # the native binary, not the node shim
    assert resolve_command("/opt/codex --flag") == ["/opt/codex", "--flag"]
    assert resolve_command(["/x/codex"]) == ["/x/codex"]


def test_fork_unsubscribes_the_child_from_the_source_server(
    make_driver: MakeDriver, log: EventLog, tmp_path: Path
) -> None:
    calls_log = tmp_path / "calls.jsonl"
    driver = make_driver(command=relayed("none", calls_log))
    src = open_session(driver, log, tmp_path, texts=("one",))
    result = driver.fork(fork_request(src, src.turns, home_of(tmp_path, "child")))
    assert result.disposition is DeliveryDisposition.ACCEPTED, result.error
    assert result.child is not None

    def unsubscribed_now() -> list[str]:
        return [c["params"]["threadId"] for c in calls(calls_log, "thread/unsubscribe")]

    # Sent without waiting for the answer: the relay logs it a moment later.
    deadline = time.monotonic() + 15
    while not unsubscribed_now() and time.monotonic() < deadline:
        time.sleep(0.02)
    unsubscribed = unsubscribed_now()
    # In the source's server (the readability proof reads the child's home in the worker,
    # so no server there loaded it).
    assert unsubscribed.count(result.child.provider_session_id) == 1
    # The live source Session keeps its own thread subscribed.
    assert src.thread_id not in unsubscribed
