"""`HomeUses`: a delete's removal of a Session's runtime folder and the worker calls that may
start an app-server in it never overlap, on real threads."""

from __future__ import annotations

import threading

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
