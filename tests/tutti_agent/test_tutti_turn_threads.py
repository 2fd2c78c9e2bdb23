"""tutti-agent runs each Turn on a thread of its own while it runs, kept parked between Turns
(`tutti_agent.turns.TurnThreads`): a thread started per Turn was a `clone3`, a stack and a
bootstrap every Turn. Sequential Turns reuse one thread; Turns that overlap (one blocked on
an approval) each have their own, so none waits for another; a parked thread ends after its
idle time."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from tutti_agent.model import BuiltinModel
from tutti_agent.server import Connection
from tutti_agent.store import ThreadStore
from tutti_agent.turns import LiveThread, TurnThreads

pytestmark = pytest.mark.timeout(60)


class _Out:
    def __init__(self) -> None:
        self.text: list[str] = []

    def write(self, data: str) -> int:
        self.text.append(data)
        return len(data)

    def flush(self) -> None:
        pass


def _live(store: ThreadStore, thread_id: str, tmp: Any, conn: Connection) -> LiveThread:
    store.create_rollout(thread_id, {"id": thread_id, "cwd": str(tmp), "model": "m"}).close()
    history = store.load(thread_id)
    return LiveThread(store, history, store.open_writer(history), conn, BuiltinModel())


def _turn(live: LiveThread, text: str) -> None:
    _wire, starter = live.start_turn(text)
    starter()


def test_sequential_turns_run_on_one_thread(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    store = ThreadStore(tmp_path / "home")
    live = _live(store, "t-seq", tmp_path, Connection(_Out()))  # type: ignore[arg-type]
    _turn(live, "warm")
    assert live.wait_idle(30)
    started: list[str] = []
    real_start = threading.Thread.start

    def start(self: threading.Thread) -> None:
        started.append(self.name)
        real_start(self)

    monkeypatch.setattr(threading.Thread, "start", start)
    for i in range(5):
        _turn(live, f"turn {i}")
        assert live.wait_idle(30)
    # Without TurnThreads: five threads started, one per Turn.
    assert started == []
    live.close()


def test_overlapping_turns_each_run_on_a_thread_of_their_own(tmp_path: Any) -> None:
    store = ThreadStore(tmp_path / "home")
    out = _Out()
    conn = Connection(out)  # type: ignore[arg-type]
    waiting = _live(store, "t-wait", tmp_path, conn)
    other = _live(store, "t-other", tmp_path, conn)
    _turn(waiting, "/approve rm -rf nothing")  # blocks on the client's answer
    deadline = time.monotonic() + 10
    while not any("requestApproval" in line for line in out.text):
        assert time.monotonic() < deadline, "the approval was never asked"
        time.sleep(0.01)
    _turn(other, "hello")
    assert other.wait_idle(10), "a Turn waited for another Turn's thread"
    assert not waiting.wait_idle(0.05)
    waiting.interrupt(waiting.active.turn_id if waiting.active else "")
    assert waiting.wait_idle(10)
    waiting.close()
    other.close()


def test_a_parked_thread_ends_after_its_idle_time() -> None:
    pool = TurnThreads(idle_s=0.05)
    ran: list[str] = []
    done = threading.Event()

    def work() -> None:
        ran.append(threading.current_thread().name)
        done.set()

    pool.run(work, "turn-a")
    assert done.wait(5)
    done.clear()
    pool.run(work, "turn-b")  # parked (or about to be): the same thread, renamed
    assert done.wait(5)
    assert ran == ["turn-a", "turn-b"] and pool.started <= 2
    deadline = time.monotonic() + 5
    while any(t.name == "turn-b" for t in threading.enumerate()):
        assert time.monotonic() < deadline, "the parked thread did not end"
        time.sleep(0.02)
    started = pool.started
    done.clear()
    pool.run(work, "turn-c")
    assert done.wait(5) and pool.started == started + 1
