"""Worker side of `fork.resolve` for the app-server drivers (Tutti Agent and Codex): find the
provider children an `unknown` fork may have left, adopt one with the same idempotent binder a
fork uses, or move them aside into a quarantine folder: `AppServerResolution`, the part of
`AppServerDriver` its `inspect_fork`, `adopt_fork` and `quarantine_fork` delegate to.

Never calls `thread/fork`.

A child "of this operation" is a rollout whose `session_meta` names the source as
`forked_from_id`, found in the source home (where `thread/fork` writes it) or the target home
(where the binder copies it), not claimed by another operation (`excludeChildIds`: the host
passes every provider child its other operations recorded), and attributed to it by its Turns
(`ResolveRequest.attributes`: the frozen prefix, or no other operation that could own it).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from domain.enums import DeliveryDisposition, ProviderStateBindingMode
from domain.worker_messages import (
    ForkBinding,
    ForkChild,
    ForkResult,
    ResolveAdopt,
    ResolvedChild,
    ResolveInspection,
    ResolveQuarantined,
    ResolveRequest,
)
from drivers.app_server.fork import prefix_problem
from drivers.app_server.runtimes import Runtimes
from drivers.app_server.state import Runtime, Sessions
from drivers.binder import ROLLOUT_DIRS, BinderError, RolloutBinder, iter_rollouts
from drivers.errors import DriverError
from drivers.failpoints import Failpoints
from drivers.quarantine import QUARANTINE_DIR, move_to_quarantine, quarantine_operation_id


def _meta(path: Path) -> Mapping[str, Any]:
    try:
        with path.open("rb") as f:
            first = json.loads(f.readline())
    except (OSError, ValueError):
        return {}
    payload = first.get("payload") if isinstance(first, Mapping) else None
    return payload if isinstance(payload, Mapping) else {}


def _child_rollouts(home: Path, source_id: str, exclude: set[str]) -> dict[str, list[Path]]:
    out: dict[str, list[Path]] = {}
    if not str(home) or not home.is_dir():
        return out
    for path in iter_rollouts(home):
        meta = _meta(path)
        child = str(meta.get("id") or "")
        if meta.get("forked_from_id") == source_id and child and child not in exclude:
            out.setdefault(child, []).append(path)
    return out


def _shows_prefix(turns: list[tuple[str, bool]] | str, prefix: list[str]) -> bool:
    """Whether Turns read as (id, in progress) are exactly the frozen prefix, none of them in
    progress (`prefix_problem`); False for a read that failed (its reason)."""
    return not isinstance(turns, str) and prefix_problem(turns, prefix) is None


def _params(request: ResolveRequest) -> tuple[Path, Path, str, list[str], set[str]]:
    source_home = Path(request.source.home)
    target_home = Path(request.target.home)
    source_id = request.source.provider_session_id
    prefix = list(request.provider_turn_ids)
    exclude = set(request.exclude_child_ids)
    if not source_home.is_absolute() or not target_home.is_absolute() or not source_id:
        raise DriverError("fork resolution needs absolute homes and the source thread id")
    return source_home, target_home, source_id, prefix, exclude


class AppServerResolution:
    """`fork.resolve` for one app-server provider, over the driver's app-servers (`Runtimes`),
    its live Sessions and its binder."""

    def __init__(
        self,
        runtimes: Runtimes,
        sessions: Sessions,
        binder: RolloutBinder,
        binding_mode: ProviderStateBindingMode,
        failpoints: Failpoints | None = None,
    ) -> None:
        self.failpoints = failpoints or Failpoints()
        self.runtimes = runtimes
        self.sessions = sessions
        self.binder = binder
        self.binding_mode = binding_mode

    def _turns_in(self, home: Path, thread_id: str) -> list[tuple[str, bool]] | str:
        """The thread's provider Turns as (id, in progress) read by an app-server on `home`
        alone (the live one of that home if any, else a transient one), or why not. A live one
        whose read fails is asked no more: a transient one reads it again (the live one may
        have been stopped and killed under the read, and an unread child is no evidence)."""
        # The home held throughout: a Session runtime starting meanwhile waits, and one that
        # started first is the live one read here (never a second writer of its thread).
        with self.runtimes.home(home):
            live = self.sessions.live_runtime_for_home(home)
            if live is not None:
                # The child's lineage holds the source thread the live Session runs on it:
                # loaded, never unsubscribed (its next Turn would run unheard).
                keep = self.sessions.thread_of_runtime(live)
                turns = self._read_turns(live, home, thread_id, keep)
                if isinstance(turns, list):
                    return turns
            try:
                runtime = self.runtimes.spawn(home, None)
            except Exception as exc:  # noqa: BLE001 - evidence, not a failure of the inspection
                return str(exc)
            try:
                return self._read_turns(runtime, home, thread_id, transient=True)
            finally:
                runtime.proc.close()

    def _read_turns(
        self,
        runtime: Runtime,
        home: Path,
        thread_id: str,
        keep: str | None = None,
        *,
        transient: bool = False,
    ) -> list[tuple[str, bool]] | str:
        try:
            # Codex loads a thread (and the ancestors it reads through) only once projected.
            # A transient's first thread resumed (its writer, until unsubscribed) is where a
            # test holds it (`worker.resolve.transient_loaded`).
            hold = self._hold if transient and self.failpoints.armed else None
            self.runtimes.load_lineage(runtime, home, thread_id, keep, hold)
            return [
                (str(t.get("id")), t.get("status") == "inProgress")
                for t in self.runtimes.history_turns(runtime, thread_id)
            ]
        except Exception as exc:  # noqa: BLE001
            return str(exc)

    def _hold(self) -> None:
        self.failpoints.hit("worker.resolve.transient_loaded")

    def inspect(self, request: ResolveRequest) -> ResolveInspection:
        source_home, target_home, source_id, prefix, exclude = _params(request)
        in_source = _child_rollouts(source_home, source_id, exclude)
        in_target = _child_rollouts(target_home, source_id, exclude)
        children = []
        for child in sorted(set(in_source) | set(in_target)):
            locations = [
                n for n, found in (("source", in_source), ("target", in_target)) if child in found
            ]
            # Read it where the provider wrote it (source home) or, failing that, the target's.
            turns = self._turns_in(source_home if child in in_source else target_home, child)
            ids = tuple(t for t, _ in turns) if isinstance(turns, list) else None
            if not request.attributes(ids):
                continue  # another operation's child (law 9): never this one's evidence
            own = self._turns_in(target_home, child) if child in in_target else "not in its home"
            children.append(
                ResolvedChild(
                    provider_session_id=child,
                    forked_from_id=source_id,
                    provider_turn_ids=ids or (),
                    read_error=None if isinstance(turns, list) else turns,
                    reports_read_error=True,
                    # Its Turns are the prefix and each has ended (none in progress), as a
                    # fork's own proof requires of the child it binds (`prefix_problem`).
                    turns_equal_prefix=_shows_prefix(turns, prefix),
                    reads_from_own_home=_shows_prefix(own, prefix),
                    locations=tuple(locations),
                )
            )
        quarantined = tuple(
            str(p)
            for home in (source_home, target_home)
            for p in sorted(
                (home / QUARANTINE_DIR / (request.operation_id or "-")).rglob("*.jsonl")
            )
        )
        return ResolveInspection(tuple(children), quarantined)

    def adopt(self, request: ResolveAdopt) -> ForkResult:
        """The idempotent binder on a verified child; answers like `fork` (`accepted` +
        evidence)."""
        source_home, target_home, source_id, prefix, exclude = _params(request.scope)
        child = request.child_id
        found = _child_rollouts(source_home, source_id, exclude)
        if child not in found and child not in _child_rollouts(target_home, source_id, exclude):
            raise DriverError(f"provider child {child!r} of this operation is not there")
        turns = self._turns_in(source_home if child in found else target_home, child)
        if not _shows_prefix(turns, prefix):
            problem = turns if isinstance(turns, str) else prefix_problem(turns, prefix)
            raise DriverError(
                f"provider child {child!r} does not show the frozen prefix: {problem}"
            )
        if child in found:
            try:
                receipt = self.binder.bind(source_home, target_home, child)
            except (BinderError, OSError) as exc:
                raise DriverError(f"provider-state binding failed: {exc}") from exc
            wire = receipt.to_wire()
        else:
            wire = {
                "childId": child,
                "sourceHome": str(source_home),
                "targetHome": str(target_home),
            }
        own = self._turns_in(target_home, child)
        if not _shows_prefix(own, prefix):
            problem = own if isinstance(own, str) else prefix_problem(own, prefix)
            raise DriverError(f"adopted child not readable from its own home: {problem}")
        wire["verifiedReadable"] = True
        wire["forkedFromId"] = source_id
        return ForkResult(
            DeliveryDisposition.ACCEPTED,
            child=ForkChild(child, source_id, tuple(prefix)),
            binding=ForkBinding(self.binding_mode, wire),
        )

    def quarantine(self, request: ResolveRequest) -> ResolveQuarantined:
        """Move the child rollouts the inspection attributed to this operation (`child_ids`)
        aside, never delete: `<home>/quarantine/<operationId>/<its relative path>`, atomically
        per file (rename on one filesystem). Any other child of the source stays where it is."""
        source_home, target_home, source_id, _, exclude = _params(request)
        op_id = quarantine_operation_id(request)
        wanted = set(request.child_ids)
        moved = []
        for home in (source_home, target_home):
            for child, paths in _child_rollouts(home, source_id, exclude).items():
                if child not in wanted:
                    continue
                for path in paths:
                    rel = path.relative_to(home)
                    if rel.parts[0] not in ROLLOUT_DIRS:
                        continue
                    moved.append(move_to_quarantine(home, op_id, path))
        return ResolveQuarantined(tuple(moved))
