"""The small per-request costs of the Session row on a mutation's path (the performance work's
target 4): a Turn's Session touch builds the row it left without `dataclasses.replace`, and a
Session row is decoded without the standard library's JSON decoder — each pinned by a count,
with the value it gives unchanged."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import msgpack
import pytest

import storage.history
import storage.models
import storage.rows
from storage.models import Lineage, Session, SessionTouch
from storage.sqlite import dumps
from storage.store import Store

pytestmark = pytest.mark.timeout(60)


def _session() -> Session:
    """A Session whose every field differs from its default and from every other field."""
    return Session(
        workspace_id="ws",
        session_id="sid",
        kind="fork",
        provider="codex",
        provider_session_id="psid",
        title="title",
        cwd="/cwd",
        settings={"effort": "high"},
        runtime_context={"branch": "b"},
        model="model",
        pinned=True,
        deleted=False,
        goal="goal",
        active_turn_id=None,
        parent_session_id="parent",
        parent_turn_id="pturn",
        created_at_ms=11,
        updated_at_ms=12,
        lineage=Lineage("src", "st", "sid", "tt", "op", 13),
        rail_placement="rail",
        visibility="hidden",
        version=14,
    )


def _no_replace(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("dataclasses.replace on the touch's path")


@pytest.mark.parametrize("touch", [SessionTouch(15, 99, claimed="t1"), SessionTouch(15, 99)])
def test_touch_builds_the_row_without_replace(
    monkeypatch: pytest.MonkeyPatch, touch: SessionTouch
) -> None:
    """Every field but the three the touch sets is `base`'s (the same as `replace` gives), and
    `replace` is not called (the test fails with the `replace` the apply used before)."""
    base = _session()
    expected = dataclasses.replace(base, version=15, updated_at_ms=99, active_turn_id=touch.claimed)
    monkeypatch.setattr(dataclasses, "replace", _no_replace)
    monkeypatch.setattr(storage.models, "replace", _no_replace, raising=False)
    row = touch.apply(base)
    assert row == expected
    for f in dataclasses.fields(Session):
        assert getattr(row, f.name) is getattr(expected, f.name), f.name


def test_settled_touch_clears_the_active_turn(monkeypatch: pytest.MonkeyPatch) -> None:
    base = dataclasses.replace(_session(), active_turn_id="t1")
    monkeypatch.setattr(storage.models, "replace", _no_replace, raising=False)
    row = SessionTouch(15, 99, settled="t1").apply(base)
    assert row == dataclasses.replace(base, version=15, updated_at_ms=99, active_turn_id=None)


@pytest.mark.parametrize(
    ("settings", "runtime_context"),
    [({}, {}), ({"effort": "high", "n": [1, 2.5, None]}, {"branch": "é\u2028"})],
)
def test_session_row_decodes_without_the_standard_library(
    store: Store, ws: str, monkeypatch: pytest.MonkeyPatch, settings: Any, runtime_context: Any
) -> None:
    """A Session read back decodes its two JSON columns by `json_column` (orjson) or not at all
    (`{}`), never by `json.loads` (the test fails with the `loads` it used before), to the same
    values, a fresh dict each."""
    store.sessions.create_session(
        ws,
        session_id="s1",
        provider="codex",
        title="t",
        cwd="/cwd",
        settings=settings,
        runtime_context=runtime_context,
    )
    calls: list[str] = []
    real = json.loads

    def counting(text: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(text)
        return real(text, *args, **kwargs)

    monkeypatch.setattr(json, "loads", counting)
    first = store.sessions.get_session(ws, "s1")
    second = store.sessions.get_session(ws, "s1")
    assert calls == []
    assert first.settings == settings and first.runtime_context == runtime_context
    # What the wire carries of them is byte for byte what the standard library's decode gave.
    monkeypatch.setattr(json, "loads", real)
    for value in (settings, runtime_context):
        canonical = real(dumps(value))
        assert msgpack.packb(canonical, use_bin_type=True) == msgpack.packb(
            first.settings if value is settings else first.runtime_context, use_bin_type=True
        )
    assert first.settings is not second.settings
    assert first.runtime_context is not second.runtime_context


@pytest.mark.parametrize("payload", [None, {}, {"b": 1, "a": [1.5, "é"], "n": None}])
def test_appended_message_is_built_without_the_standard_library(
    store: Store, ws: str, monkeypatch: pytest.MonkeyPatch, payload: Any
) -> None:
    """The Message `append_message` returns (built, not read back) has its payload decoded
    from the stored text by `json_object`, not `json.loads` (the test fails with the `loads` it
    used before), and equals a fresh read of the row."""
    store.sessions.create_session(
        ws, session_id="s1", provider="codex", title="t", cwd="/cwd", settings={}
    )
    turn, _ = store.turns.claim_submit(ws, "s1", "r", "x")
    calls: list[str] = []
    real = json.loads

    def counting(text: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(text)
        return real(text, *args, **kwargs)

    monkeypatch.setattr(json, "loads", counting)
    monkeypatch.setattr(storage.history, "loads", counting, raising=False)
    message = store.history.append_message(
        ws, "s1", turn.turn_id, kind="assistant", text="hi", payload=payload
    )
    assert calls == []
    monkeypatch.setattr(json, "loads", real)
    assert message.payload == (payload or {})
    assert list(message.payload) == sorted(payload or {})  # the stored (canonical) text's order
    read = store.turns.get_turn(ws, "s1", turn.turn_id).messages
    assert [m for m in read if m.message_id == message.message_id] == [message]
