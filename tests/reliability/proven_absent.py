"""The crash soak's end-state check of the Turns its kills left unbound with their start's fate
unknown (settled, not `completed`, no provider turn id, not host-only): once the daemon is
restarted, each such Session's next Turn starts cold, and its re-bind reads a *final* provider
history (no process of the killed daemon or worker is left). A Turn that history holds no turn
for must then be host-only (its Session forkable again); one it may hold stays unbound.

Judged from the provider's own thread (tutti-agent's rollout, read from the Session's home),
not from the re-bind's code: when every turn of the thread is a bound Turn's (without the Turn
the check ran, which the re-bind came before) and a Turn was bound before that re-bind (its
anchor: the history is the Session's own thread; a Turn the re-bind itself binds by content is
no anchor for the same pass, `actors.rebind.prove_absent`), nothing in the thread can be the
unbound Turn, so it must be marked; and a Turn marked host-only must have no thread turn beside
it that no bound Turn claims. A Turn whose Session had no anchor before the pass is `unanchored`:
the pass may have bound its first anchor, so the next cold start (`prove_by_next_turn` again,
after another restart) must mark it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

import apsw

from tests.support.daemon import WS, run_turn
from tests.support.homes import runtime_home
from transport.client import Client


def unanswered_unmarked(home: Path, sids: list[str]) -> dict[str, list[str]]:
    """`{session: [turn id]}` of `sids`' settled Turns that are not `completed`, unbound and
    not host-only (the store read alone)."""
    conn = apsw.Connection(str(home / "store.sqlite3"), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        out: dict[str, list[str]] = {}
        for sid in sids:
            rows = conn.execute(
                "SELECT turn_id FROM turns WHERE workspace_id = ? AND session_id = ?"
                " AND phase = 'settled' AND outcome <> 'completed'"
                " AND root_provider_turn_id IS NULL AND host_only = 0 ORDER BY sequence",
                (WS, sid),
            )
            turns = [str(r[0]) for r in rows]
            if turns:
                out[sid] = turns
        return out
    finally:
        conn.close()


def _turns(home: Path, sid: str) -> dict[str, tuple[str | None, int]]:
    """The Session's Turns: turn id → (provider turn id, host_only)."""
    conn = apsw.Connection(str(home / "store.sqlite3"), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        rows = conn.execute(
            "SELECT turn_id, root_provider_turn_id, host_only FROM turns"
            " WHERE workspace_id = ? AND session_id = ?",
            (WS, sid),
        )
        return {str(r[0]): (r[1], int(r[2])) for r in rows}
    finally:
        conn.close()


def _thread_turn_ids(home: Path, sid: str, thread_id: str) -> list[str] | None:
    """The turn ids of the Session's tutti-agent thread, in order (None: unreadable)."""
    from tutti_agent.store import ThreadStore

    try:
        thread = ThreadStore(runtime_home(home, WS, sid)).load(thread_id)
    except Exception:  # noqa: BLE001 - an unreadable thread proves nothing either way
        return None
    return [
        str(line.item.payload.get("turn_id"))
        for line in thread.lines
        if line.item.type == "event_msg" and line.item.payload.get("type") == "task_started"
    ]


def prove_by_next_turn(
    home: Path, c: Client, candidates: dict[str, list[str]], *, text: str = "after the chaos"
) -> tuple[Counter[str], list[str]]:
    """Runs one Turn (`text`) on each candidate Session of a freshly restarted daemon (its cold
    start re-binds first), then sorts each candidate Turn: `re-bound`, `host-only`,
    `unanchored` (nothing in the thread can be it, but no Turn of its Session was bound before
    the pass: the next pass must mark it) or `left` (the thread holds a turn that could be it).
    The violations: a Turn left unbound that its thread cannot hold (its Session anchored), a
    Turn marked host-only beside a thread turn no bound Turn claims (which could be it), and a
    Session whose Turn did not complete (the chaos is over and nothing is armed: its
    candidates would go unproven)."""
    tally: Counter[str] = Counter()
    violations: list[str] = []
    for sid, turn_ids in sorted(candidates.items()):
        status, body = c.call_raw("session.get", {"workspaceId": WS, "agentSessionId": sid})
        if status != 200:
            continue  # deleted meanwhile
        anchored = any(pid for pid, _ in _turns(home, sid).values())
        after = run_turn(c, sid, text)
        if after["outcome"] != "completed":
            violations.append(
                f"session {sid}: its Turn after the chaos ended {after['outcome']}"
                f" ({after.get('error')}), so its unbound Turns {turn_ids} are unproven"
            )
            continue
        # What the re-bind read, before the Turn it ran for: the Turns and the thread without
        # that Turn's own.
        mine = after["rootProviderTurnId"]
        turns = _turns(home, sid)
        bound = [pid for pid, _ in turns.values() if pid and pid != mine]
        thread = _thread_turn_ids(home, sid, str(body["session"]["providerSessionId"]))
        ids = None if thread is None else [pid for pid in thread if pid != mine]
        nothing_can_be_it = (
            ids is not None
            and bool(bound)
            and len(set(ids)) == len(ids)
            and len(set(bound)) == len(bound)
            and set(ids) == set(bound)
        )
        for turn_id in turn_ids:
            pid, host_only = turns[turn_id]
            if pid:
                tally["re-bound"] += 1
            elif host_only:
                tally["host-only"] += 1
                if ids is None or not set(ids) <= set(bound):
                    violations.append(
                        f"session {sid} turn {turn_id}: host-only, yet its thread holds a turn"
                        f" no bound Turn claims ({ids}; bound {bound}): it may be that Turn"
                    )
            elif nothing_can_be_it and not anchored:
                tally["unanchored"] += 1  # its next cold start has the anchor this one bound
            elif nothing_can_be_it:
                violations.append(
                    f"session {sid} turn {turn_id}: its thread holds no turn for it ({ids}),"
                    " yet its next cold start left it unbound and not host-only; the daemon's"
                    f" re-bind lines: {_rebind_lines(home, sid)}"
                )
            else:
                tally["left"] += 1
    return tally, violations


def prove_after_restarts(
    home: Path, sids: Sequence[str], restart: Callable[[], Client], passes: int = 2
) -> tuple[Counter[str], list[str]]:
    """`prove_by_next_turn` of `sids`' unanswered, unmarked Turns on a daemon `restart` (which
    stops the running one, if any, and returns a client of a new one) starts; again, on the
    Turns left, after a pass that left one `unanchored` (its next cold start has the anchor
    that pass bound), up to `passes` passes. The last pass's tally, and every violation; a
    Turn still unanchored after the last pass is one."""
    proven: Counter[str] = Counter()
    violations: list[str] = []
    for _ in range(passes):
        candidates = unanswered_unmarked(home, list(sids))
        if not candidates:
            break
        proven, found = prove_by_next_turn(home, restart(), candidates)
        violations += found
        if found or not proven["unanchored"]:
            break
    else:
        violations.append(f"Turns still unanchored after {passes} cold starts: {dict(proven)}")
    return proven, violations


def _rebind_lines(home: Path, sid: str, most: int = 8) -> list[str]:
    """The daemon log's last re-bind lines of Session `sid` (whether its history was final,
    what it bound, marked or left): what a violation above needs to be told from a history
    the daemon could not call final."""
    try:
        text = (home / "daemon.log").read_text(errors="replace")[-2_000_000:]
    except OSError:
        return []
    words = ("re-bound", "re-bind", "host-only", "left unbound")
    lines = [ln for ln in text.splitlines() if sid in ln and any(w in ln for w in words)]
    return lines[-most:]
