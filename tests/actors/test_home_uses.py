"""`HomeUses`: a delete's removal of a Session's runtime folder and the worker calls that may
start an app-server in it never overlap, on real threads."""

from __future__ import annotations

import threading
import time

from actors.home_uses import HomeUses

KEY = ("ws", "s1")
OTHER = ("ws", "s2")


def test_a_removal_waits_until_no_call_uses_the_folder() -> None:
    uses = HomeUses()
    ran: list[str] = []
    uses.use([KEY, OTHER], lambda: ran.append("call"), lambda: ran.append("later"))
    assert ran == ["call"] and uses.in_use(KEY) == 1
    removed = threading.Event()
    remover = threading.Thread(target=uses.remove, args=(KEY, removed.set))
    remover.start()
    # The call is still in use: the removal has not run (and does not, however long).
    remover.join(0.5)
    assert remover.is_alive() and not removed.is_set()
    # Another folder's removal does not wait for it.
    other_removed = threading.Event()
    uses.done([OTHER])
    uses.remove(OTHER, other_removed.set)
    assert other_removed.is_set() and not removed.is_set()
    uses.done([KEY])
    remover.join(30)
    assert removed.is_set() and uses.in_use(KEY) == 0


def test_a_call_during_a_removal_runs_once_the_folder_is_gone() -> None:
    uses = HomeUses()
    inside, release = threading.Event(), threading.Event()
    order: list[str] = []

    def removal() -> None:
        inside.set()
        release.wait(30)
        order.append("removed")

    remover = threading.Thread(target=uses.remove, args=(KEY, removal))
    remover.start()
    assert inside.wait(30)
    later_ran = threading.Event()

    def later() -> None:
        order.append("later")
        later_ran.set()

    uses.use([OTHER, KEY], lambda: order.append("now"), later)
    assert order == [] and uses.in_use(OTHER) == 0  # neither run nor counted
    release.set()
    assert later_ran.wait(30)
    remover.join(30)
    assert order == ["removed", "later"]
    # Asked again (as the actor does from `later`), it runs and is counted.
    uses.use([OTHER, KEY], lambda: order.append("now"), later)
    assert order[-1] == "now" and uses.in_use(KEY) == 1


def test_a_call_after_the_removal_is_asked_for_waits_for_it_and_is_not_waited_for() -> None:
    uses = HomeUses()
    ran: list[str] = []
    uses.use([KEY], lambda: ran.append("first"), lambda: ran.append("first later"))
    removed = threading.Event()
    remover = threading.Thread(target=uses.remove, args=(KEY, removed.set))
    remover.start()
    deadline = time.monotonic() + 30
    while not uses.removals():  # asked for: it waits for the first call
        assert time.monotonic() < deadline, "the removal was never asked for"
        time.sleep(0.01)
    later_ran = threading.Event()
    uses.use([KEY], lambda: ran.append("second"), later_ran.set)
    # Held, not counted: the removal waits for the first call only.
    (removal,) = uses.removals()
    assert (removal.calls, removal.held) == (1, 1) and removal.waiting_s >= 0
    assert ran == ["first"] and not removed.is_set()
    uses.done([KEY])
    remover.join(30)
    assert removed.is_set() and later_ran.is_set() and ran == ["first"]
    assert uses.removals() == [] and uses.in_use(KEY) == 0
