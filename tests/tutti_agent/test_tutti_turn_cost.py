"""What a tutti-agent Turn costs its app-server: work per Turn that does
not grow with the thread. The model's input is kept as the rollout's writer appends, never read
back from the file on each Turn (the first one after a load reads it), and is still exactly
what a fresh read of the rollout gives."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from model_fakes.responses import ResponsesServer
from tests.tutti_agent.items import assistant_msg, user_msg
from tests.tutti_agent.storeutil import count_parses, write_root
from tutti_agent.history import model_context
from tutti_agent.model import Endpoint, ResponsesModel, TurnIO, request_body
from tutti_agent.rollout import RolloutItem, RolloutLine, RolloutWriter
from tutti_agent.store import ThreadStore
from tutti_agent.turns import LiveThread

pytestmark = pytest.mark.timeout(60)


class _Peer:
    def __init__(self) -> None:
        self.sent: list[tuple[str, Mapping[str, Any]]] = []

    def notify(self, method: str, params: Mapping[str, Any]) -> None:
        self.sent.append((method, params))

    def request(
        self, method: str, params: Mapping[str, Any], cancelled: threading.Event
    ) -> tuple[int | str, Mapping[str, Any] | None]:
        raise AssertionError("no server request expected")


class _SeeingModel:
    """Replies `seen <n>` and remembers the input it was given on each Turn."""

    name = "seeing"
    provider = "test"

    def __init__(self) -> None:
        self.inputs: list[list[Mapping[str, Any]]] = []

    def warm(self) -> None:
        pass

    def run(self, text: str, io: TurnIO) -> None:
        seen = io.model_input()
        self.inputs.append(seen)
        io.reasoning(f"thinking about {text}")
        io.tool_call("t", "{}", "ok")
        io.agent_message(f"seen {len(seen)}")


def _live(store: ThreadStore, thread_id: str, model: _SeeingModel) -> LiveThread:
    history = store.load(thread_id)
    return LiveThread(store, history, store.open_writer(history), _Peer(), model)


def _turn(live: LiveThread, text: str) -> None:
    _wire, starter = live.start_turn(text)
    starter()
    assert live.wait_idle(30)


def test_only_the_first_turn_reads_the_rollout_and_each_sees_what_a_fresh_read_gives(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = ThreadStore(tmp_path / "home")
    thread_id = write_root(store, [user_msg("before"), assistant_msg("answer")])
    model = _SeeingModel()
    live = _live(store, thread_id, model)
    parsed = count_parses(monkeypatch)
    for i in range(4):
        _turn(live, f"turn {i}")
    # The first Turn reads the file once (nothing is made at load: a fork's child may never
    # run a Turn); the next ones keep what they have as the writer appends.
    assert len(parsed) == 1, "each Turn read its rollout back to build the model's input"
    live.close()
    # Each Turn's input is the model context of the rollout as it stood when the model ran:
    # what a fresh reader (another process, a restart) rebuilds from the file.
    fresh = model_context(ThreadStore(tmp_path / "home").load(thread_id).items)
    assert all(seen == fresh[: len(seen)] for seen in model.inputs)
    # 2 lines before; the first Turn adds the environment context, each its user message before
    # the model runs, then its reasoning, call, output and reply.
    assert [len(seen) for seen in model.inputs] == [4, 9, 14, 19]
    assert len(fresh) == 23
    # Each input is a list of its own: a later Turn's lines do not show up in an earlier one.
    assert model.inputs[0] is not model.inputs[1]


def test_a_failed_append_makes_the_next_turn_read_the_rollout_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = ThreadStore(tmp_path / "home")
    thread_id = write_root(store, [user_msg("before"), assistant_msg("answer")])
    model = _SeeingModel()
    live = _live(store, thread_id, model)
    real_append = RolloutWriter.append
    fail = {"once": True}

    def flaky(self: RolloutWriter, item: RolloutItem) -> RolloutLine:
        line = real_append(self, item)  # on disk, yet the caller is told it failed
        if fail["once"] and item.payload.get("type") == "reasoning":
            fail["once"] = False
            raise OSError("fsync failed")
        return line

    monkeypatch.setattr(RolloutWriter, "append", flaky)
    _turn(live, "first")  # fails at its reasoning
    parsed = count_parses(monkeypatch)
    _turn(live, "second")
    assert parsed, "after a failed append the model's input must come from the file"
    live.close()
    second = model.inputs[-1]
    assert (
        second == model_context(ThreadStore(tmp_path / "home").load(thread_id).items)[: len(second)]
    )
    assert any(p.get("type") == "reasoning" for p in second)  # the line the failure wrote


class _InputIO:
    """A TurnIO giving the model `context` as its input, recording the reply."""

    def __init__(self, context: list[Mapping[str, Any]]) -> None:
        self.context = context
        self.cancelled = threading.Event()
        self.texts: list[str] = []

    def model_input(self) -> list[Mapping[str, Any]]:
        return self.context

    def on_cancel(self, callback: Callable[[], None]) -> None:
        pass

    def agent_message(self, text: str, item_id: str | None = None) -> None:
        self.texts.append(text)


def _user(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def test_the_request_body_is_encoded_by_orjson_and_by_the_standard_library_where_it_refuses(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The body holds the whole model context (it grows with the thread): orjson encodes it,
    the standard library's `json.dumps` only what orjson refuses, and the model gets the same
    JSON value either way."""
    import tutti_agent.model as model_module

    dumps: list[object] = []

    def counting(obj: Any, *args: Any, **kwargs: Any) -> str:
        dumps.append(obj)
        return json.dumps(obj, *args, **kwargs)

    # The model module's `json` only (the fake server in this process uses the real one).
    monkeypatch.setattr(model_module, "json", SimpleNamespace(dumps=counting, loads=json.loads))
    context = [_user(f'turn {i} héllo "quoted" \u2028') for i in range(50)]
    with ResponsesServer() as server:
        io = _InputIO(context)
        ResponsesModel(Endpoint(server.base_url)).run("hi", io)  # type: ignore[arg-type]
        assert io.texts and dumps == [], "the body went through json.dumps"
        assert server.requests[-1]["input"] == context
        # A lone surrogate orjson refuses: the standard library encodes that body, as before.
        odd = [_user("half a pair \ud800")]
        io = _InputIO(odd)
        ResponsesModel(Endpoint(server.base_url)).run("hi", io)  # type: ignore[arg-type]
        assert len(dumps) == 1 and server.requests[-1]["input"] == odd
    assert request_body({"a": "é"}) == b'{"a":"\xc3\xa9"}'
