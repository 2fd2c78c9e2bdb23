"""Typed errors of the Tutti Agent app-server, each carrying its JSON-RPC code and message.

Messages that a driver may match on are the exact Codex 0.171 texts (PROVIDERS.md), so one
driver can classify both providers' rejections the same way."""

from __future__ import annotations

INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INTERNAL_ERROR = -32603


class AppServerError(Exception):
    """Base of every error the server turns into `{id, error: {code, message}}`."""

    code: int = INVALID_REQUEST

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def to_wire(self) -> dict[str, object]:
        return {"code": self.code, "message": self.message}


class InvalidParams(AppServerError):
    """A parameter is missing or has the wrong shape."""


class InvalidSessionId(AppServerError):
    def __init__(self, detail: str) -> None:
        super().__init__(f"invalid session id: {detail}")


class NoRolloutFound(AppServerError):
    def __init__(self, thread_id: str) -> None:
        super().__init__(f"no rollout found for thread id {thread_id}")
        self.thread_id = thread_id


class ThreadNotLoaded(AppServerError):
    def __init__(self, thread_id: str) -> None:
        super().__init__(f"thread not loaded: {thread_id}")


class ThreadNotFound(AppServerError):
    def __init__(self, thread_id: str) -> None:
        super().__init__(f"thread not found: {thread_id}")


class TurnNotFound(AppServerError):
    def __init__(self, turn_id: str) -> None:
        super().__init__(f"turn not found: {turn_id}")


class TurnInProgress(AppServerError):
    """ThroughTurn named a turn that has no persisted end yet."""

    def __init__(self, turn_id: str) -> None:
        super().__init__(f"lastTurnId '{turn_id}' identifies an in-progress turn")


class TurnStartMissing(AppServerError):
    """BeforeTurn named a turn that has no persisted start boundary (legacy history)."""

    def __init__(self, turn_id: str) -> None:
        super().__init__(f"beforeTurnId '{turn_id}' has no persisted start boundary")


class ThreadBusy(AppServerError):
    """One active turn per thread."""


class NoActiveTurn(AppServerError):
    def __init__(self) -> None:
        super().__init__("no active turn to interrupt")


class LineageError(AppServerError):
    """A Referenced rollout lineage cannot be resolved (cycle, missing file, id mismatch, ...).

    Rejected, never guessed: a child must not silently point at the wrong physical range."""

    def __init__(self, thread_id: str, detail: str) -> None:
        super().__init__(f"invalid paginated history lineage for {thread_id}: {detail}")
        self.thread_id = thread_id
        self.detail = detail


class RolloutCorrupt(AppServerError):
    """A rollout line other than a torn last line is not valid JSON or lacks its fields."""


class ThreadReserved(AppServerError):
    """Delete refused: a prepared fork still holds the source reservation."""

    def __init__(self, thread_id: str) -> None:
        super().__init__(f"cannot delete thread {thread_id}: a fork in progress still reserves it")


class ThreadReferenced(AppServerError):
    """Delete refused: a durable Referenced child reads its history from this rollout."""

    def __init__(self, thread_id: str) -> None:
        super().__init__(f"cannot delete thread {thread_id}: forked history still references it")


class ForkInitFailed(AppServerError):
    """The child could not be materialized; its partial rollout was discarded. A refusal
    (`-32600`): nothing of the fork is left, so a driver may answer the fork failed; an
    unexpected failure (`-32603`) may come after the child was written."""


class InternalError(AppServerError):
    """An unexpected failure, answered as `-32603 internal error: …` (a resume's deferred load
    keeps one to answer the next `turn/start` on that thread)."""

    code = INTERNAL_ERROR


class ModelError(Exception):
    """The model backend failed; the turn ends `failed` with this message."""


class RolloutUnwritten(Exception):
    """A turn's line could not be appended to its thread's rollout (a full disk, a failing
    one): the turn ends `failed` with this message, never left running."""

    def __init__(self, cause: OSError) -> None:
        super().__init__(f"tutti-agent could not write the thread's rollout: {cause}")
        self.message = str(self)
