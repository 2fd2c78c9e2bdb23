"""Provider-owned forks of Claude sessions through a settled Turn, against the real SDK + CLI:
child identity and bindings, model input after the fork, dispositions, one fork_session call."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from domain.enums import DeliveryDisposition
from domain.worker_messages import ForkRequest
from drivers.claude.fork import receipt_hash
from drivers.claude.homes import SpareHomes
from drivers.claude_transcript import decode_binding, encode_binding, parse_entries
from drivers.failpoints import Failpoints
from model_fakes.messages import model_input_texts
from tests.claude.conftest import ClaudeSession, Harness

pytestmark = [pytest.mark.claude, pytest.mark.timeout(120)]


def fork(harness: Harness, params: dict, driver=None):
    return (driver or harness.driver).fork(ForkRequest.from_wire(params))


def uuids_in(path: Path) -> set[str]:
    return {e.uuid for e in parse_entries(path.read_text())}


def test_fork_through_turn_two_gives_child_exactly_turns_one_and_two_with_remapped_uuids(
    harness: Harness, three_turns: ClaudeSession
) -> None:
    source_path = harness.transcript(three_turns)
    before = source_path.read_bytes()
    result = fork(harness, harness.fork_params(three_turns, "child-a", 2))
    assert result.disposition is DeliveryDisposition.ACCEPTED, result.error
    assert result.child is not None and result.binding is not None
    child_id = result.child.provider_session_id
    assert child_id != three_turns.provider_session_id
    assert result.child.forked_from_id == three_turns.provider_session_id
    assert len(result.child.provider_turn_ids) == 2
    source_uuids = uuids_in(source_path)
    assert not set(result.child.provider_turn_ids) & source_uuids  # every UUID remapped
    # The child's transcript lives in the child's own home, and only there.
    child_path = harness.transcript(
        ClaudeSession("x", child_id, harness.home("child-a"), harness.cwd)
    )
    assert child_path.is_file()
    assert not harness.transcript(three_turns, child_id).exists()
    # Bindings: one per forked source Turn, pointing into the child transcript.
    child_uuids = uuids_in(child_path)
    tb = result.binding.turn_bindings or {}
    assert list(tb) == [t for t, _ in three_turns.turns[:2]]
    for (_, binding), child_root in zip(tb.items(), result.child.provider_turn_ids, strict=True):
        assert binding["rootProviderTurnId"] == child_root
        assert decode_binding(binding["bindingJson"]) in child_uuids
    receipt = dict(result.binding.receipt)
    assert result.binding.mode.value == "provider_owned"
    body = {k: receipt[k] for k in receipt if k not in ("hash", "legacyCheckpoint")}
    assert receipt["hash"] == receipt_hash(body)
    assert receipt["sourceBoundaryTurnId"] == three_turns.turns[1][0]
    assert receipt["sourceCheckpointMessageId"] == decode_binding(three_turns.turns[1][1])
    # Forking never touches the source transcript.
    assert source_path.read_bytes() == before


def test_turn_on_the_child_sends_the_model_turns_one_and_two_and_not_three(
    harness: Harness, three_turns: ClaudeSession
) -> None:
    source_before = harness.transcript(three_turns).read_bytes()
    result = fork(harness, harness.fork_params(three_turns, "child-b", 2))
    assert result.disposition is DeliveryDisposition.ACCEPTED, result.error
    assert result.child is not None
    child = harness.start("child-b", provider_session_id=result.child.provider_session_id)
    n = len(harness.server.requests)
    _, completed = harness.turn(child, "four")
    assert completed["outcome"] == "completed"
    [body] = harness.server.requests[n:]
    assert model_input_texts(body) == [
        ("user", "one"),
        ("assistant", "echo: one"),
        ("user", "two"),
        ("assistant", "echo: two"),
        ("user", "four"),
    ]
    assert harness.transcript(three_turns).read_bytes() == source_before


def test_fork_of_the_fork_keeps_the_grandchild_bound_to_its_own_transcript(
    harness: Harness, three_turns: ClaudeSession
) -> None:
    first = fork(harness, harness.fork_params(three_turns, "child-c", 2))
    assert first.disposition is DeliveryDisposition.ACCEPTED and first.child and first.binding
    tb = first.binding.turn_bindings or {}
    child = ClaudeSession(
        "agent-child-c",
        first.child.provider_session_id,
        harness.home("child-c"),
        harness.cwd,
        turns=[(b["rootProviderTurnId"], b["bindingJson"]) for b in tb.values()],
    )
    second = fork(harness, harness.fork_params(child, "grandchild-c", 1))
    assert second.disposition is DeliveryDisposition.ACCEPTED, second.error
    assert second.child is not None
    assert second.child.forked_from_id == child.provider_session_id
    assert second.child.provider_turn_ids[0] not in {t for t, _ in child.turns}
    grandchild = harness.start("grandchild-c", provider_session_id=second.child.provider_session_id)
    n = len(harness.server.requests)
    harness.turn(grandchild, "after grandchild fork")
    assert model_input_texts(harness.server.requests[n]) == [
        ("user", "one"),
        ("assistant", "echo: one"),
        ("user", "after grandchild fork"),
    ]


def test_stale_source_resume_cursor_is_dropped_after_a_restart(
    harness: Harness, three_turns: ClaudeSession
) -> None:
    result = fork(harness, harness.fork_params(three_turns, "child-d", 1))
    assert result.disposition is DeliveryDisposition.ACCEPTED and result.child
    source_before = harness.transcript(three_turns).read_bytes()
    # A new driver is what a daemon/worker restart gives; the child inherited the source's
    # runtime context, whose resume cursor names the source session.
    restarted = harness.new_driver()
    try:
        stale = {"resumeCursor": {"resume": three_turns.provider_session_id}}
        child = harness.start(
            "child-d",
            driver=restarted,
            provider_session_id=result.child.provider_session_id,
            runtime_context=stale,
        )
        ctx = child.start_result["runtimeContext"]
        assert ctx["droppedResumeCursor"] == stale["resumeCursor"]
        assert ctx["resumeCursor"] == {"resume": result.child.provider_session_id}
        n = len(harness.server.requests)
        harness.turn(child, "child continues", driver=restarted)
    finally:
        restarted.close()
    assert model_input_texts(harness.server.requests[n])[:2] == [
        ("user", "one"),
        ("assistant", "echo: one"),
    ]
    assert ("user", "two") not in model_input_texts(harness.server.requests[n])
    assert harness.transcript(three_turns).read_bytes() == source_before


def test_unknown_source_session_is_not_started_and_creates_nothing(
    harness: Harness, three_turns: ClaudeSession
) -> None:
    params = harness.fork_params(three_turns, "child-e", 1)
    params["source"]["providerSessionId"] = str(uuid.uuid4())
    before = harness.all_transcripts()
    result = fork(harness, params)
    assert result.disposition is DeliveryDisposition.NOT_STARTED
    assert harness.all_transcripts() == before


def test_failpoint_before_the_call_is_not_started_with_zero_children(
    harness: Harness, three_turns: ClaudeSession
) -> None:
    driver = harness.new_driver(Failpoints({"worker.fork.before_provider_call": "error"}))
    try:
        before = harness.all_transcripts()
        result = fork(harness, harness.fork_params(three_turns, "child-f", 2), driver)
    finally:
        driver.close()
    assert result.disposition is DeliveryDisposition.NOT_STARTED
    assert harness.all_transcripts() == before


def test_failure_after_the_call_is_unknown_and_never_retried(
    harness: Harness, three_turns: ClaudeSession
) -> None:
    driver = harness.new_driver(Failpoints({"worker.fork.after_provider_call": "error"}))
    try:
        before = set(harness.all_transcripts())
        result = fork(harness, harness.fork_params(three_turns, "child-g", 2), driver)
    finally:
        driver.close()
    assert result.disposition is DeliveryDisposition.UNKNOWN
    assert result.child is not None  # the id is reported, but nothing is committed from it
    created = set(harness.all_transcripts()) - before
    assert len(created) == 1  # exactly one provider child: the driver did not call again
    assert created.pop().stem == result.child.provider_session_id


def test_unverifiable_child_placement_is_unknown(
    harness: Harness, three_turns: ClaudeSession
) -> None:
    params = harness.fork_params(three_turns, "child-h", 2)
    blocker = harness.home("child-h")
    blocker.parent.mkdir(parents=True, exist_ok=True)
    blocker.write_text("not a directory")  # the child's home cannot hold a transcript
    before = set(harness.all_transcripts())
    result = fork(harness, params)
    assert result.disposition is DeliveryDisposition.UNKNOWN
    assert len(set(harness.all_transcripts()) - before) == 1


def test_stale_checkpoint_is_recomputed_before_the_one_fork_session_call(
    harness: Harness, three_turns: ClaudeSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Law 1 (seed 000 §7): at most one provider fork call per operation. A bound checkpoint
    the transcript does not hold is replaced by the transcript's own checkpoint *before*
    `fork_session` is called — never by a second call after "Message … not found"."""
    import claude_agent_sdk

    real = claude_agent_sdk.fork_session
    cut_points: list[str | None] = []

    def counting(*args: object, **kwargs: object) -> object:
        cut_points.append(kwargs.get("up_to_message_id"))  # type: ignore[arg-type]
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(claude_agent_sdk, "fork_session", counting)
    stale = encode_binding(str(uuid.uuid4()))  # a checkpoint the transcript never held
    params = harness.fork_params(
        three_turns, "child-i", 2, bindings=[three_turns.turns[0][1], stale]
    )
    before = set(harness.all_transcripts())
    result = fork(harness, params)
    assert result.disposition is DeliveryDisposition.ACCEPTED, result.error
    assert result.binding is not None
    assert result.binding.receipt["sourceCheckpointMessageId"] != decode_binding(stale)
    assert cut_points == [result.binding.receipt["sourceCheckpointMessageId"]]
    assert len(set(harness.all_transcripts()) - before) == 1


def test_legacy_turn_without_binding_forks_at_the_transcript_checkpoint(
    harness: Harness, three_turns: ClaudeSession
) -> None:
    params = harness.fork_params(three_turns, "child-j", 2, bindings=[None, None])
    result = fork(harness, params)
    assert result.disposition is DeliveryDisposition.ACCEPTED, result.error
    assert result.binding is not None and result.child is not None
    assert result.binding.receipt["legacyCheckpoint"] is True
    assert len(result.child.provider_turn_ids) == 2


def test_driver_version_changed_since_prepare_is_not_started(
    harness: Harness, three_turns: ClaudeSession
) -> None:
    params = harness.fork_params(three_turns, "child-k", 1)
    params["driverVersion"] = "0.2.188"
    before = harness.all_transcripts()
    assert fork(harness, params).disposition is DeliveryDisposition.NOT_STARTED
    assert harness.all_transcripts() == before


def test_accepted_result_crosses_the_wire_with_turn_bindings(
    harness: Harness, three_turns: ClaudeSession
) -> None:
    result = fork(harness, harness.fork_params(three_turns, "child-l", 1))
    wire = json.loads(json.dumps(result.to_wire()))
    assert wire["disposition"] == "accepted"
    assert wire["binding"]["mode"] == "provider_owned"
    assert list(wire["binding"]["turnBindings"]) == [three_turns.turns[0][0]]
    assert wire["child"]["forkedFromId"] == three_turns.provider_session_id


def test_child_transcript_is_moved_not_copied_and_its_new_directories_are_durable(
    harness: Harness, three_turns: ClaudeSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The child's transcript reaches its own home by a rename within the file
    system (the very file the SDK wrote, fsynced once), not read and rewritten; every
    directory the move created in the target home is fsynced (its parent's entry), and the
    source's directory once."""
    from drivers.claude_transcript import transcript_path
    from tests.support.fsyncs import counting_fsyncs

    driver = harness.driver
    written: dict[str, tuple[int, int]] = {}
    call = driver.forks.call_fork_session

    def recording(request, plan):  # type: ignore[no-untyped-def]
        child_id = call(request, plan)
        st = transcript_path(three_turns.home, str(harness.cwd), child_id).stat()
        written[child_id] = (st.st_dev, st.st_ino)
        return child_id

    monkeypatch.setattr(driver.forks, "call_fork_session", recording)
    # No home made ahead (`drivers.claude.homes`): the move makes every directory itself.
    spares = SpareHomes()
    monkeypatch.setattr(driver.forks, "spares", spares)
    with counting_fsyncs(monkeypatch) as log:
        result = fork(harness, harness.fork_params(three_turns, "child-move", 2))
        spares.close()  # the spare made after it, on the spares' thread, removed
    assert result.disposition is DeliveryDisposition.ACCEPTED, result.error
    assert result.child is not None
    child_id = result.child.provider_session_id
    dest = transcript_path(harness.home("child-move"), str(harness.cwd), child_id)
    st = dest.stat()
    assert (st.st_dev, st.st_ino) == written[child_id]  # the SDK's file itself
    assert st.st_nlink == 1  # and no longer in the source home
    assert log.count(dest) == 1
    home = harness.home("child-move")
    created = [p for p in [dest.parent, *dest.parent.parents] if home in [p, *p.parents]]
    for directory in [dest.parent, *(p.parent for p in created)]:
        assert log.count(directory) == 1, directory
    assert log.count(harness.transcript(three_turns).parent) == 1


def test_a_session_started_while_a_fork_reads_its_source_copies_the_persons_own_login(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With `use_user_login`, a Session's start copies the person's login into its own config
    dir. A fork points the process env at its source's config dir while it calls the SDK's
    in-process helpers (`ClaudeFork._config_env`); a Session started meanwhile (another of the
    worker's threads) still copies the person's login, never the source's older copy."""
    from drivers.claude.driver import ClaudeDriver
    from drivers.claude.env import PRIVATE_HOME_DIR, ClaudeDriverConfig

    person = tmp_path / "person"
    (person / ".claude").mkdir(parents=True)
    login = person / ".claude" / ".credentials.json"
    login.write_text('{"login": "first"}')
    monkeypatch.setenv("HOME", str(person))
    monkeypatch.delenv("CLAUDE_CONFIG_DIR", raising=False)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    driver = ClaudeDriver(ClaudeDriverConfig(use_user_login=True), Failpoints())

    def start(name: str) -> Path:
        home = tmp_path / "runtimes" / name / "claude-config"
        home.mkdir(parents=True)
        driver.start_session({"agentSessionId": name, "home": str(home), "cwd": str(cwd)})
        return home

    try:
        source = start("source")
        assert (source / ".credentials.json").read_text() == '{"login": "first"}'
        login.write_text('{"login": "again"}')  # the person logged in again
        with driver.forks._config_env(str(source), str(source / PRIVATE_HOME_DIR)):
            other = start("other")
    finally:
        driver.close()
    assert (other / ".credentials.json").read_text() == '{"login": "again"}'
    assert login.read_text() == '{"login": "again"}'  # the person's file never written
