"""The Engine's session cache: the workspace's wire `Session` maps, filled from `session.list`
and from events and committed forks, never resurrected by a stale copy once removed.

Methods whose name ends in `_locked` expect the caller to hold the Engine's lock; the others
take it and notify listeners themselves.
"""

from __future__ import annotations

from client.engine.calls import WorkspaceCalls
from client.engine.changes import ChangeFeed
from client.engine.values import ChangeKind, EngineChange
from protocol.methods import SESSION_LIST, SessionListParams
from protocol.objects import Session


class SessionCache:
    """The sessions of one workspace as this client last saw them."""

    def __init__(self, feed: ChangeFeed, calls: WorkspaceCalls) -> None:
        self._feed = feed
        self._calls = calls
        self._sessions: dict[str, Session] = {}
        self._removed: set[str] = set()

    def session(self, session_id: str) -> Session | None:
        with self._feed.lock:
            value = self._sessions.get(session_id)
            return None if value is None else value.copy()

    def sessions(self) -> list[Session]:
        with self._feed.lock:
            return [s.copy() for s in self._sessions.values()]

    def load(self) -> list[Session]:
        """Fill the cache from `session.list` (every page)."""
        cursor: str | None = None
        loaded: list[Session] = []
        while True:
            params = SessionListParams(workspaceId=self._calls.workspace_id, limit=200)
            if cursor:
                params["cursor"] = cursor
            page = self._calls.request(SESSION_LIST, params)
            loaded.extend(page["sessions"])
            cursor = page.get("nextCursor")
            if not cursor:
                break
        for session in loaded:
            self.upsert(session)
        return loaded

    def upsert(self, session: Session) -> None:
        with self._feed.lock:
            self.upsert_locked(session)
        self._feed.flush()

    def upsert_locked(self, session: Session) -> None:
        sid = str(session.get("agentSessionId"))
        if sid in self._removed:
            return  # a stale copy (e.g. an operation's snapshot) must not resurrect it
        current = self._sessions.get(sid)
        if current is not None and int(current.get("updatedAtUnixMs") or 0) > int(
            session.get("updatedAtUnixMs") or 0
        ):
            return
        kept = session.copy()
        if session.get("settingsOmitted") and current is not None:
            # An event's Session carries settings past its bound as {} (`settingsOmitted`):
            # the settings this cache already holds are the Session's still (an omitted copy
            # held before stays omitted).
            kept["settings"] = current.get("settings", {})
            if not current.get("settingsOmitted"):
                del kept["settingsOmitted"]
        self._sessions[sid] = kept
        self._feed.publish(EngineChange(ChangeKind.SESSION, session_id=sid))

    def remove_locked(self, session_id: str) -> None:
        """A removal is final for this cache: later copies of the session are ignored."""
        self._removed.add(session_id)
        if self._sessions.pop(session_id, None) is not None:
            self._feed.publish(EngineChange(ChangeKind.SESSION, session_id=session_id))
