"""The provider-owned fork of a Claude Code session (seed 000 §7): the boundary's checkpoint
planned from the source transcript before any provider call, exactly one SDK `fork_session`,
the child's transcript moved crash-durably into the child's own home, and the child verified
from that home alone (identity, turn mapping, checkpoint) with a hashed receipt. Every
provider outcome is a `ForkResult` disposition. `ClaudeFork` is the Claude driver's fork
strategy; `drivers.claude.resolution` reuses its plan, placement and verification.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from domain.enums import DeliveryDisposition, ProviderStateBindingMode
from domain.worker_messages import ForkBinding, ForkChild, ForkRequest, ForkResult
from drivers.binder import fsync_dir, makedirs, tamper_with
from drivers.claude.env import (
    DRIVER_KIND,
    PRIVATE_HOME_DIR,
    RECEIPT_SCHEMA_VERSION,
    claude_config_env,
    sdk_version,
)
from drivers.claude.homes import SpareHomes
from drivers.claude.state import is_uuid
from drivers.claude_transcript import (
    decode_binding,
    encode_binding,
    legacy_checkpoint,
    parse_entry_bytes,
    split_turns,
    transcript_path,
)
from drivers.failpoints import Failpoints


@dataclass(slots=True)
class _ForkPlan:
    source_path: Path
    checkpoint: str
    legacy: bool
    child_dir: Path
    """Where the child's transcript is filed in the target home: its cwd's project directory,
    resolved once a fork (each resolution is a `realpath` of the cwd)."""
    first_missing: str | None = None
    """The highest directory of `child_dir`'s chain the move found missing (and made, or put
    a spare in its place): what a spare for the next fork like this one stands in for."""


class NotStarted(Exception):
    """A fork precondition failed before any provider call."""


class ClaudeFork:
    """`fork(request) -> ForkResult` through the SDK's `fork_session`."""

    def __init__(
        self, failpoints: Failpoints, env_lock: threading.Lock, spares: SpareHomes | None = None
    ) -> None:
        self._failpoints = failpoints
        # The next child's home made ahead, off the fork's path (`drivers.claude.homes`).
        self.spares = SpareHomes() if spares is None else spares
        # os.environ is process-wide and the SDK's session helpers read CLAUDE_CONFIG_DIR
        # from it: every helper call that needs a particular config dir holds this lock.
        self._env_lock = env_lock
        # The spare a fork used up, asked for by `after_answer` on the fork's own thread.
        self._after = threading.local()

    @contextlib.contextmanager
    def _config_env(self, config_dir: str, home: str) -> Iterator[None]:
        """Points the process env at one session's config dir for an in-process SDK helper."""
        with self._env_lock, claude_config_env(config_dir, home):
            yield

    def fork(self, request: ForkRequest) -> ForkResult:
        try:
            plan = self.plan_fork(request)
        except NotStarted as exc:
            return ForkResult.not_started(str(exc))
        try:
            self._failpoints.hit("worker.fork.before_provider_call")
        except Exception as exc:
            return ForkResult.not_started(f"before provider call: {exc}")
        # From here on the SDK may have written a child: every failure is `unknown`, and
        # nothing is ever retried (at most one provider fork call per operation, law 1).
        try:
            child_id = self.call_fork_session(request, plan)
        except Exception as exc:
            return ForkResult.unknown(f"fork_session failed: {type(exc).__name__}: {exc}")
        try:
            self._failpoints.hit("worker.fork.after_provider_call")
            self.relocate_child(request, plan, child_id)
            return self.verify_child(request, plan, child_id)
        except Exception as exc:
            return ForkResult.unknown(
                f"child {child_id} unverified: {type(exc).__name__}: {exc}",
                child=ForkChild(child_id, request.source.provider_session_id, ()),
            )
        finally:
            if plan.first_missing is not None:
                # The next fork's home like this one's, made on the spares' thread once this
                # fork's answer has left (`after_answer`): woken before, that thread took the
                # interpreter from the answer's encoding and send.
                self._after.pending = (plan.first_missing, os.fspath(plan.child_dir))

    def after_answer(self) -> None:
        """Asks for the spare home the fork just answered on this thread used up (if any)."""
        pending: tuple[str, str] | None = getattr(self._after, "pending", None)
        if pending is not None:
            self._after.pending = None
            self.spares.replenish(*pending)

    def plan_fork(self, request: ForkRequest) -> _ForkPlan:
        src, tgt = request.source, request.target
        if request.driver_kind and request.driver_kind != DRIVER_KIND:
            raise NotStarted(f"driver kind {request.driver_kind!r} is not {DRIVER_KIND}")
        if request.driver_version and request.driver_version != sdk_version():
            raise NotStarted(
                f"driver version changed: frozen {request.driver_version}, now {sdk_version()}"
            )
        if not is_uuid(src.provider_session_id):
            raise NotStarted(
                f"source provider session id is not a UUID: {src.provider_session_id!r}"
            )
        if not request.provider_turn_ids:
            raise NotStarted("no provider turn ids: the boundary is unbound")
        if not all(is_uuid(t) for t in request.provider_turn_ids):
            raise NotStarted("a provider turn id is not an observed Claude UUID")
        if not tgt.home or not src.home or not src.cwd:
            raise NotStarted("source home, source cwd and target home are required")
        if os.path.realpath(src.home) == os.path.realpath(tgt.home):
            raise NotStarted("the child needs its own home")
        source_path = transcript_path(src.home, src.cwd, src.provider_session_id)
        if not source_path.is_file():
            raise NotStarted(f"unknown session {src.provider_session_id}: no transcript")
        bindings = request.extra.get("providerTurnBindings") or []
        boundary_binding = bindings[-1] if len(bindings) == len(request.provider_turn_ids) else None
        checkpoint = decode_binding(boundary_binding if isinstance(boundary_binding, str) else None)
        legacy = checkpoint is None
        data = source_path.read_bytes()
        if checkpoint is not None and not holds_message(data, checkpoint):
            # Law 1: fork_session is called at most once per operation, so a checkpoint the
            # transcript does not hold is recomputed *before* that call, never after a refusal.
            checkpoint = None
        if checkpoint is None:
            # A Turn bound before bindings existed (or a stale binding): the transcript's own
            # checkpoint of the boundary Turn.
            text = data.decode("utf-8", errors="replace")
            checkpoint = legacy_checkpoint(text, request.provider_turn_ids[-1])
            if checkpoint is None:
                raise NotStarted("boundary turn is not a root user message of the transcript")
        # Filed under the child's own directory (a worktree fork's tree), where its turns run.
        child_cwd = tgt.cwd or src.cwd
        child_dir = (
            Path(tgt.home) / "projects" / source_path.parent.name
            if child_cwd == src.cwd
            else transcript_path(tgt.home, child_cwd, src.provider_session_id).parent
        )
        return _ForkPlan(source_path, checkpoint, legacy, child_dir)

    def call_fork_session(self, request: ForkRequest, plan: _ForkPlan) -> str:
        from claude_agent_sdk import fork_session

        src = request.source
        home = str(Path(src.home) / PRIVATE_HOME_DIR)
        title = request.title or None
        with self._config_env(src.home, home):
            # Exactly one call: any failure from here on (even the SDK's "Message … not
            # found") is `unknown` to the saga and is never retried (seed 000 §7, law 1).
            result = fork_session(
                src.provider_session_id,
                directory=src.cwd,
                up_to_message_id=plan.checkpoint,
                title=title,
            )
        return str(result.session_id)

    def relocate_child(self, request: ForkRequest, plan: _ForkPlan, child_id: str) -> None:
        """Moves the child transcript from the source's config dir into the child's own home.

        fork_session writes next to the source; the child must resume from its own home alone.
        Crash-durable, and a move, not a copy: the SDK's file is fsynced where it
        was written (the SDK does not), renamed into the target home (one filesystem: no bytes
        read or written, and after a crash the file is in exactly one of the two places), the
        target's directory and the parent of each directory created for it fsynced, then the
        source's. Across filesystems (EXDEV) it is copied — temp file, fsync, rename — and the
        source name unlinked after the target is durable. The target's missing directories are
        a spare home made ahead when one fits (`drivers.claude.homes`: one rename, only its
        parent's entry new), else made here.
        """
        written = plan.source_path.with_name(f"{child_id}.jsonl")
        dest = plan.child_dir / f"{child_id}.jsonl"
        # A spare home made ahead renamed into place (only its parent's entry new), else the
        # missing directories made here (each one's parent's entry new). Before the child's
        # file is moved: no transcript is ever in a spare.
        plan.first_missing, changed = self.spares.take(os.fspath(dest.parent))
        if changed is None:
            changed = makedirs(dest.parent)
        if os.path.lexists(dest):
            raise FileExistsError(f"child transcript already in target home: {dest}")
        # This move is Claude's provider-state binding: the same crash points as the host_copy
        # binder's copy (PROTOCOL.md), so every worker.bind.* cell of the crash matrix is reached.
        self._failpoints.hit("worker.bind.before_copy")
        fd = os.open(written, os.O_RDONLY | os.O_NOFOLLOW)
        try:
            os.fsync(fd)  # its bytes durable before any name of it in the target is
        finally:
            os.close(fd)
        moved = True
        try:
            os.rename(written, dest)
        except OSError as exc:
            if exc.errno != errno.EXDEV:
                raise
            _copy_durably(written, dest)
            moved = False
        # The rename's commit makes both directories' entries durable on a journaling file
        # system; each is still fsynced, as POSIX asks, and the created ones' parents once —
        # one after another on this thread: the first fsync commits the journal the others
        # then find committed, where a `sync_together` round handed five of six to the sync
        # threads (~120 `futex` calls a fork in hand-offs). After a move the source's
        # directory joins them: its entry is gone by the same rename.
        durable: list[Path | str] = [dest.parent, *changed]
        for directory in dict.fromkeys(
            os.fspath(d) for d in ([*durable, written.parent] if moved else durable)
        ):
            fsync_dir(directory)
        # Durable in the target home; `tamper` (tests) cuts it to its first line, as a lost or
        # damaged move would leave it, before `verify_child` reads it from there.
        self._failpoints.hit("worker.bind.after_copy", tamper=lambda: tamper_with((dest,)))
        if not moved:
            written.unlink()
            fsync_dir(written.parent)

    def verify_child(self, request: ForkRequest, plan: _ForkPlan, child_id: str) -> ForkResult:
        """Reads only the child (from the target home): identity, readability, turn mapping."""
        from claude_agent_sdk import get_session_info, get_session_messages

        src, tgt = request.source, request.target
        child = ForkChild(child_id, src.provider_session_id, ())
        if not is_uuid(child_id) or child_id == src.provider_session_id:
            return ForkResult.unknown(f"child id {child_id!r} is not a new UUID", child=child)
        child_cwd = tgt.cwd or src.cwd
        with self._config_env(tgt.home, str(Path(tgt.home) / PRIVATE_HOME_DIR)):
            info = get_session_info(child_id, directory=child_cwd)
            messages = get_session_messages(child_id, directory=child_cwd)
        if info is None or not messages:
            return ForkResult.unknown(
                f"child {child_id} is not readable from its home", child=child
            )
        data = (plan.child_dir / f"{child_id}.jsonl").read_bytes()
        turns = split_turns(parse_entry_bytes(data))
        roots_from = tuple(t.root_forked_from for t in turns)
        if roots_from != request.provider_turn_ids:
            return ForkResult.unknown(
                f"child turns map to {list(roots_from)}, "
                f"expected {list(request.provider_turn_ids)}",
                child=child,
            )
        boundary = turns[-1]
        if boundary.checkpoint_forked_from != plan.checkpoint:
            return ForkResult.unknown("child does not end at the source checkpoint", child=child)
        child = ForkChild(child_id, src.provider_session_id, tuple(t.root_uuid for t in turns))
        turn_bindings = {
            source_turn: {
                "rootProviderTurnId": t.root_uuid,
                "bindingJson": encode_binding(t.checkpoint_uuid),
            }
            for source_turn, t in zip(request.provider_turn_ids, turns, strict=True)
        }
        receipt_body = {
            "schemaVersion": RECEIPT_SCHEMA_VERSION,
            "sourceSessionId": src.provider_session_id,
            "childSessionId": child_id,
            "sourceBoundaryTurnId": request.provider_turn_ids[-1],
            "sourceCanonicalTurnId": request.source_turn_id,
            "childBoundaryTurnId": boundary.root_uuid,
            "sourceCheckpointMessageId": plan.checkpoint,
            "childCheckpointMessageId": boundary.checkpoint_uuid,
        }
        receipt = dict(receipt_body)
        receipt["hash"] = receipt_hash(receipt_body)
        receipt["legacyCheckpoint"] = plan.legacy
        return ForkResult(
            DeliveryDisposition.ACCEPTED,
            child=child,
            binding=ForkBinding(ProviderStateBindingMode.PROVIDER_OWNED, receipt, turn_bindings),
        )


def receipt_hash(body: Mapping[str, Any]) -> str:
    """sha256 over the canonical JSON of the receipt fields (sorted keys, no spaces)."""
    canonical = json.dumps(dict(body), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def _copy_durably(source: Path, dest: Path) -> None:
    """A copy of `source` at `dest` (temp file, fsync, rename; the caller fsyncs the dir)."""
    data = source.read_bytes()
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, dest)


def holds_message(data: bytes, message_uuid: str) -> bool:
    """Whether a transcript's bytes have an entry whose own `uuid` is `message_uuid` (a scan,
    no decode and no JSON parse: the fork's pre-check of a bound checkpoint). The CLI writes
    compact JSON, so the compact key is looked for first; any other spacing by the pattern."""
    uuid = message_uuid.encode()
    if b'"uuid":"' + uuid + b'"' in data:
        return True
    return re.search(rb'"uuid"\s*:\s*"' + re.escape(uuid) + rb'"', data) is not None
