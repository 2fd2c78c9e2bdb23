"""What a Claude fork reads and parses of the transcripts, counted: the bound checkpoint is
found in the source's bytes (no decode, no parse), and the child's lines are parsed by orjson
with the standard library only for what orjson refuses. No CLI: synthetic transcripts."""

from __future__ import annotations

import json
import sys
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest

import drivers.claude_transcript as transcript
from domain.worker_messages import ForkRequest
from drivers.claude.env import sdk_version
from drivers.claude.fork import ClaudeFork, holds_message
from drivers.claude_transcript import encode_binding, parse_entries, split_turns, transcript_path
from drivers.failpoints import Failpoints

pytestmark = [pytest.mark.claude, pytest.mark.timeout(60)]


def _entry(uuid_: str, type_: str, content: Any) -> dict[str, Any]:
    return {"type": type_, "uuid": uuid_, "message": {"role": type_, "content": content}}


def _source(tmp_path: Path) -> tuple[ForkRequest, str, str]:
    """A two-Turn source transcript under its home and a fork request through Turn 2."""
    sid, u1, a1, u2, a2 = (str(uuid.uuid4()) for _ in range(5))
    home, cwd = tmp_path / "source-home", tmp_path / "work"
    cwd.mkdir()
    path = transcript_path(home, str(cwd), sid)
    path.parent.mkdir(parents=True)
    lines = [
        _entry(u1, "user", "first"),
        _entry(a1, "assistant", [{"type": "text", "text": f'quoted \\"uuid\\":\\"{a2}\\"'}]),
        _entry(u2, "user", "second"),
        _entry(a2, "assistant", [{"type": "text", "text": "two"}]),
    ]
    path.write_text("".join(json.dumps(e, separators=(",", ":")) + "\n" for e in lines))
    request = ForkRequest.from_wire(
        {
            "source": {
                "agentSessionId": "source",
                "providerSessionId": sid,
                "home": str(home),
                "cwd": str(cwd),
            },
            "target": {"agentSessionId": "child", "home": str(tmp_path / "child-home")},
            "providerTurnIds": [u1, u2],
            "providerTurnBindings": [encode_binding(a1), encode_binding(a2)],
            "driverKind": "claude-code",
            "driverVersion": sdk_version(),
        }
    )
    return request, u2, a2


def test_bound_checkpoint_is_found_in_the_source_bytes_without_decoding_or_parsing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    request, _, checkpoint = _source(tmp_path)
    decoded: list[Path] = []
    parsed: list[str] = []
    real_read_text = Path.read_text

    def read_text(self: Path, *args: Any, **kwargs: Any) -> str:
        decoded.append(self)
        return real_read_text(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", read_text)
    monkeypatch.setattr(transcript, "parse_entries", lambda text: parsed.append(text) or [])
    plan = ClaudeFork(Failpoints(), threading.Lock()).plan_fork(request)
    assert plan.checkpoint == checkpoint and not plan.legacy
    assert decoded == [] and parsed == []


def test_stale_binding_still_falls_back_to_the_transcripts_own_checkpoint(tmp_path: Path) -> None:
    request, root, checkpoint = _source(tmp_path)
    wire = request.to_wire()
    wire["providerTurnBindings"][-1] = encode_binding(str(uuid.uuid4()))
    plan = ClaudeFork(Failpoints(), threading.Lock()).plan_fork(ForkRequest.from_wire(wire))
    assert plan.checkpoint == checkpoint


def test_holds_message_matches_only_an_entrys_own_uuid_key_in_any_spacing() -> None:
    m = str(uuid.uuid4())
    assert holds_message(f'{{"type":"user","uuid":"{m}"}}\n'.encode(), m)
    assert holds_message(f'{{"type": "user", "uuid" : "{m}"}}\n'.encode(), m)
    # The same text inside a string value is escaped, so it is never an entry's uuid.
    escaped = json.dumps({"type": "user", "uuid": "x", "text": f'"uuid":"{m}"'}).encode()
    assert not holds_message(escaped, m)
    assert not holds_message(f'{{"parentUuid":"{m}"}}'.encode(), m)


def test_child_lines_are_parsed_by_orjson_and_the_standard_library_only_as_a_fallback(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[str] = []
    real_loads = json.loads

    def counted(line: str, *args: Any, **kwargs: Any) -> Any:
        calls.append(line)
        return real_loads(line, *args, **kwargs)

    monkeypatch.setattr(transcript.json, "loads", counted)
    clean = "\n".join(
        json.dumps(_entry(u, t, "x")) for u, t in (("u1", "user"), ("a1", "assistant"))
    )
    assert [e.uuid for e in parse_entries(clean)] == ["u1", "a1"]
    assert calls == []
    # orjson refuses NaN and a lone surrogate; the standard library reads both, as before.
    odd = "\n".join(
        [
            '{"type":"user","uuid":"u1","n":NaN,"message":{"role":"user","content":"x"}}',
            '{"type":"assistant","uuid":"a1","message":{"content":"\\ud800"}}',
            "{torn tail",
        ]
    )
    turns = split_turns(parse_entries(odd))
    assert [(t.root_uuid, t.checkpoint_uuid) for t in turns] == [("u1", "a1")]
    assert len(calls) == 3


def test_a_fork_resolves_its_cwds_project_directory_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import claude_agent_sdk

    request, root, _ = _source(tmp_path)
    resolved: list[str] = []
    real_key = claude_agent_sdk.project_key_for_directory

    def key(directory: Any = None) -> str:
        resolved.append(str(directory))
        return real_key(directory)

    # The driver's own lookups only: the SDK's helpers resolve through their module's names.
    monkeypatch.setattr(claude_agent_sdk, "project_key_for_directory", key)
    result = ClaudeFork(Failpoints(), threading.Lock()).fork(request)
    assert result.disposition.value == "accepted", result.error
    assert resolved == [request.source.cwd]
    assert result.child is not None
    child = transcript_path(
        request.target.home, request.source.cwd, result.child.provider_session_id
    )
    assert child.is_file()
    assert [t.root_forked_from for t in split_turns(parse_entries(child.read_text()))] == [
        request.provider_turn_ids[0],
        root,
    ]


def test_the_moves_directory_fsyncs_run_on_the_forks_own_thread_once_each(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    request, _, _ = _source(tmp_path)
    synced: list[tuple[int, str]] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append((threading.get_ident(), os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    forks = ClaudeFork(Failpoints(), threading.Lock())
    result = forks.fork(request)
    forks.after_answer()  # as the worker does once the answer has left
    forks.spares.drain()  # the next child's home, made after this fork on the spares' thread
    assert result.disposition.value == "accepted", result.error
    assert result.child is not None
    child = transcript_path(
        request.target.home, request.source.cwd, result.child.provider_session_id
    )
    spares = [(i, p) for i, p in synced if "/.claude-spare-" in p]
    assert spares and {i for i, _ in spares} != {threading.get_ident()}
    synced = [(i, p) for i, p in synced if "/.claude-spare-" not in p]
    home = Path(request.target.home)
    written_dir = Path(request.source.home) / "projects" / child.parent.name
    # The child file where the SDK wrote it, its new directory, each created directory's
    # parent, the source's directory: each once, all on this thread (no sync-thread round).
    expected = [
        str(written_dir / child.name),
        str(child.parent),
        str(child.parent.parent),
        str(home),
        str(home.parent),
        str(written_dir),
    ]
    assert sorted(path for _, path in synced) == sorted(expected)
    assert {ident for ident, _ in synced} == {threading.get_ident()}


def test_the_verification_parses_the_childs_bytes_without_a_decode_or_a_line_re_encode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    request, _, _ = _source(tmp_path)
    decoded: list[Path] = []
    guarded: list[str] = []
    real_read_text, real_guarded = Path.read_text, transcript.loads_as_stdlib

    def read_text(self: Path, *args: Any, **kwargs: Any) -> str:
        if sys._getframe(1).f_globals.get("__name__", "").startswith("drivers."):
            decoded.append(self)  # the driver's own reads (the SDK's are bare's too)
        return real_read_text(self, *args, **kwargs)

    def loads_as_stdlib(text: str) -> Any:
        guarded.append(text)
        return real_guarded(text)

    monkeypatch.setattr(Path, "read_text", read_text)
    monkeypatch.setattr(transcript, "loads_as_stdlib", loads_as_stdlib)
    result = ClaudeFork(Failpoints(), threading.Lock()).fork(request)
    assert result.disposition.value == "accepted", result.error
    assert result.child is not None
    assert result.binding is not None and len(result.binding.turn_bindings) == 2
    # The driver's own read of the child: its bytes, each line parsed by orjson as it is.
    assert decoded == []
    assert guarded == []


def test_parse_entry_bytes_reads_what_parse_entries_reads_and_a_line_separator_in_a_string(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[Any] = []
    real_loads = json.loads

    def counted(line: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(line)
        return real_loads(line, *args, **kwargs)

    monkeypatch.setattr(transcript.json, "loads", counted)
    lines = [
        '{"type":"user","uuid":"u1","n":NaN,"message":{"role":"user","content":"x"}}',
        '{"type":"assistant","uuid":"a1","big":123456789012345678901234567890,'
        '"message":{"content":"\\ud800"}}',
        '  {"type":"user","uuid":"u2","forkedFrom":{"messageUuid":"s2"},'
        '"message":{"role":"user","content":"two"}}  ',
        "",
        '{"type":"progress","uuid":"p1"}',
        '{"type":"assistant","uuid":"a2","isSidechain":true}',
        "{torn tail",
    ]
    text = "\n".join(lines)
    entries = transcript.parse_entry_bytes(text.encode())
    # The standard library only for the lines orjson refuses: NaN, the lone surrogate and
    # the integer beyond 64 bits (one line), the torn tail.
    assert len(calls) == 3
    assert entries == parse_entries(text)
    assert [(e.uuid, e.is_root_user, e.forked_from_uuid) for e in entries] == [
        ("u1", True, None),
        ("a1", False, None),
        ("u2", True, "s2"),
    ]
    # A U+2028 inside a string is not a line end of the transcript's.
    sep = '{"type":"user","uuid":"u3","message":{"role":"user","content":"a\u2028b"}}'
    assert [e.uuid for e in transcript.parse_entry_bytes(sep.encode())] == ["u3"]
